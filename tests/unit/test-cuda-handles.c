/*
 * CUDA tensors over the wire, no GPU needed: libgradsync registers tensors
 * that live in a fake driver's allocations (test-cuda-fake-driver.c, found
 * by the library's dlopen as libcuda.so.1) with a fake gradsyncd on a
 * temporary socket, which keeps every frame. The frames must name each base
 * allocation once by its IPC handle, place each tensor at its offset, carry
 * the events' handles and no descriptors; and the daemon's parser
 * (buffer_desc.c) must read them back as the client meant. Also: events
 * recorded and waited on around a step, and each refusal with its reason.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/cuda/buffer_desc.h"
#include "frame.h"
#include "gradsync.h"
#include "test-cuda-fake-driver.h"

#define MAX_FRAMES 64

/* ---- A fake gradsyncd, on a thread ------------------------------------------ */

struct fake_daemon {
	char dir[64];
	char path[108];
	int listen_fd;
	pthread_t thread;
	const char *backend;
	int steps; /* steps to serve after the registration */
	/* What it saw (read by the test once the thread has ended). */
	Gradsync__Message *frames[MAX_FRAMES];
	size_t nframes;
	size_t tensors;
	size_t fds;
	size_t marked;
	uint32_t last_ready_event; /* of the last GradientsReady */
	bool protocol_error;
};

static int send_msg(int fd, const Gradsync__Message *m)
{
	uint8_t *buf;
	size_t len, off = 0;
	if (gs_frame_encode(m, &buf, &len) < 0)
		return -1;
	while (off < len) {
		ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	free(buf);
	return off == len ? 0 : -1;
}

/* The next message, or NULL at the end of the stream. */
static Gradsync__Message *recv_msg(struct fake_daemon *fd_, int fd, struct gs_frame_reader *r)
{
	const uint8_t *payload;
	size_t len;
	while (gs_frame_reader_next(r, &payload, &len) == 0) {
		ssize_t n = gs_frame_reader_fill(r, fd);
		if (n == -EAGAIN) {
			struct pollfd p = { fd, POLLIN, 0 };
			poll(&p, 1, 10000); /* the reader never blocks */
			continue;
		}
		if (n <= 0)
			return NULL;
	}
	Gradsync__Message *m = gradsync__message__unpack(NULL, len, payload);
	gs_frame_reader_consume(r);
	fd_->fds += r->nfds;
	return m;
}

static void send_welcome(struct fake_daemon *f, int fd)
{
	Gradsync__Settings s = GRADSYNC__SETTINGS__INIT;
	s.threshold = 2097152;
	s.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_FP16;
	s.op = GRADSYNC__REDUCE_OP__OP_AVERAGE;
	s.predivide_factor = 1;
	s.fusion_buffer_elements = 4194304;
	Gradsync__Welcome w = GRADSYNC__WELCOME__INIT;
	w.protocol_version = GS_PROTOCOL_VERSION;
	w.world_size = 1;
	w.local_size = 1;
	w.nodes = 1;
	w.backend = (char *)f->backend;
	w.settings = &s;
	w.daemon_version = "fake";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_WELCOME;
	m.welcome = &w;
	send_msg(fd, &m);
}

static void serve_step(struct fake_daemon *f, int fd, struct gs_frame_reader *r)
{
	Gradsync__Message *m = recv_msg(f, fd, r);
	if (!m || m->body_case != GRADSYNC__MESSAGE__BODY_BEGIN_STEP) {
		f->protocol_error = m != NULL;
		if (m)
			gradsync__message__free_unpacked(m, NULL);
		return;
	}
	uint64_t step = m->begin_step->step;
	gradsync__message__free_unpacked(m, NULL);
	size_t marked = 0;
	while (marked < f->tensors && (m = recv_msg(f, fd, r))) {
		if (m->body_case == GRADSYNC__MESSAGE__BODY_GRADIENTS_READY) {
			marked += m->gradients_ready->n_tensors;
			f->last_ready_event = m->gradients_ready->ready_event;
		} else {
			f->protocol_error = true;
		}
		gradsync__message__free_unpacked(m, NULL);
	}
	f->marked += marked;
	Gradsync__StepStats stats = GRADSYNC__STEP_STATS__INIT;
	Gradsync__StepDone done = GRADSYNC__STEP_DONE__INIT;
	done.step = step;
	done.stats = &stats;
	done.message = "";
	Gradsync__Message out = GRADSYNC__MESSAGE__INIT;
	out.body_case = GRADSYNC__MESSAGE__BODY_STEP_DONE;
	out.step_done = &done;
	send_msg(fd, &out);
}

static void serve(struct fake_daemon *f, int fd)
{
	struct gs_frame_reader r;
	gs_frame_reader_init(&r, 16u << 20);
	Gradsync__Message *m = recv_msg(f, fd, &r);
	bool hello = m && m->body_case == GRADSYNC__MESSAGE__BODY_HELLO;
	if (m)
		gradsync__message__free_unpacked(m, NULL);
	if (hello)
		send_welcome(f, fd);
	bool last = false;
	while (hello && !last && (m = recv_msg(f, fd, &r))) {
		if (m->body_case != GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS ||
		    f->nframes == MAX_FRAMES) {
			f->protocol_error = true;
			gradsync__message__free_unpacked(m, NULL);
			break;
		}
		f->tensors += m->register_tensors->n_tensors;
		last = m->register_tensors->last;
		f->frames[f->nframes++] = m;
	}
	if (last) {
		Gradsync__Registered reg = GRADSYNC__REGISTERED__INIT;
		reg.tensors = (uint32_t)f->tensors;
		reg.buckets = 1;
		Gradsync__Message out = GRADSYNC__MESSAGE__INIT;
		out.body_case = GRADSYNC__MESSAGE__BODY_REGISTERED;
		out.registered = &reg;
		send_msg(fd, &out);
		for (int s = 0; s < f->steps; s++)
			serve_step(f, fd, &r);
	}
	/* Until the client hangs up. */
	while ((m = recv_msg(f, fd, &r)))
		gradsync__message__free_unpacked(m, NULL);
	gs_frame_reader_destroy(&r);
}

static void *daemon_main(void *arg)
{
	struct fake_daemon *f = arg;
	int fd = accept(f->listen_fd, NULL, NULL);
	if (fd >= 0) {
		serve(f, fd);
		close(fd);
	}
	return NULL;
}

static struct fake_daemon *daemon_start(const char *backend, int steps)
{
	struct fake_daemon *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->backend = backend;
	f->steps = steps;
	snprintf(f->dir, sizeof(f->dir), "/tmp/gs-cuda-test-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/gradsyncd.sock", f->dir);
	f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", f->path);
	assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	assert_int_equal(listen(f->listen_fd, 1), 0);
	assert_int_equal(pthread_create(&f->thread, NULL, daemon_main, f), 0);
	return f;
}

/* Joins the thread (the client must have closed by now) and cleans up. */
static void daemon_join(struct fake_daemon *f)
{
	pthread_join(f->thread, NULL);
	close(f->listen_fd);
	unlink(f->path);
	rmdir(f->dir);
}

static void daemon_free(struct fake_daemon *f)
{
	for (size_t i = 0; i < f->nframes; i++)
		gradsync__message__free_unpacked(f->frames[i], NULL);
	free(f);
}

static gs_client *connect_to(struct fake_daemon *f)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = f->path;
	o.local_rank = 0;
	o.job_id = "";
	o.timeout_ms = 5000;
	gs_client *c = NULL;
	int r = gs_connect(&o, &c);
	if (r != GS_OK)
		fail_msg("gs_connect: %s", gs_last_error(NULL));
	return c;
}

/* The buffers and tensors of every frame, in order. */
static size_t all_buffers(const struct fake_daemon *f, const Gradsync__Buffer **out, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < f->nframes; i++)
		for (size_t b = 0; b < f->frames[i]->register_tensors->n_buffers && n < max; b++)
			out[n++] = f->frames[i]->register_tensors->buffers[b];
	return n;
}

static const Gradsync__TensorSpec *tensor_at(const struct fake_daemon *f, size_t index)
{
	for (size_t i = 0; i < f->nframes; i++) {
		const Gradsync__RegisterTensors *r = f->frames[i]->register_tensors;
		if (index < r->n_tensors)
			return r->tensors[index];
		index -= r->n_tensors;
	}
	return NULL;
}

static const struct fake_cuda_handle *handle_of(const ProtobufCBinaryData *d)
{
	assert_int_equal(d->len, sizeof(struct fake_cuda_handle));
	return (const struct fake_cuda_handle *)d->data;
}

static int setup(void **state)
{
	fake_cuda_reset();
	return 0;
}

/* ---- Tests ---------------------------------------------------------------------- */

/* Five tensors in three allocations, as a caching allocator places them. */
static void registers_base_allocations_and_offsets(void **state)
{
	uint64_t a = fake_cuda_alloc(20u << 20, 0, 0);
	uint64_t b = fake_cuda_alloc(2u << 20, 0, 0);
	uint64_t c3 = fake_cuda_alloc(4u << 20, 0, 0);
	struct gs_cuda_tensor_spec specs[] = {
		{ "conv1.weight", 1000, GS_FLOAT32, (void *)(uintptr_t)a },
		{ "bn1.weight", 64, GS_FLOAT32, (void *)(uintptr_t)(a + 4096) },
		{ "fc.weight", 2048, GS_FLOAT32, (void *)(uintptr_t)(b + 256) },
		{ "bn1.bias", 64, GS_FLOAT32, (void *)(uintptr_t)(a + 8192) },
		{ "fc.bias", 10, GS_FLOAT32, (void *)(uintptr_t)(c3 + (1u << 20)) },
	};
	struct fake_daemon *f = daemon_start("cuda", 0);
	gs_client *c = connect_to(f);
	int r = gs_register_cuda(c, specs, 5);
	if (r != GS_OK)
		fail_msg("gs_register_cuda: %s", gs_last_error(c));
	assert_int_equal(gs_tensor_count(c), 5);
	for (size_t i = 0; i < 5; i++)
		assert_ptr_equal(gs_tensor_data(c, i), specs[i].data);
	gs_close(c);
	daemon_join(f);

	assert_false(f->protocol_error);
	assert_int_equal(f->fds, 0); /* CUDA buffers carry no descriptors */
	const Gradsync__Buffer *bufs[8];
	assert_int_equal(all_buffers(f, bufs, 8), 4);
	/* Buffer 0: the events, then each allocation once, by first use. */
	uint64_t bases[] = { a, b, c3 }, sizes[] = { 20u << 20, 2u << 20, 4u << 20 };
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(bufs[i]->device, 0);
		assert_string_equal(bufs[i]->pci_bus_id, "0000:10:00.0");
	}
	assert_int_equal(bufs[0]->size, 0);
	assert_int_equal(bufs[0]->cuda_ipc_handle.len, 0);
	const struct fake_cuda_handle *ready = handle_of(&bufs[0]->cuda_ready_event);
	const struct fake_cuda_handle *done = handle_of(&bufs[0]->cuda_done_event);
	assert_memory_equal(ready->magic, "FAKEEVT", 8);
	assert_memory_equal(done->magic, "FAKEEVT", 8);
	assert_true(ready->base_or_id != done->base_or_id);
	/* Interprocess events without timing, as cudaIpcGetEventHandle needs. */
	assert_int_equal(fake_cuda_event(ready->base_or_id)->flags, 0x6);
	/* The ring of ready events: the ready event first, each one apart. */
	size_t nring = bufs[0]->n_cuda_ready_ring;
	assert_true(nring >= 2 && nring <= GS_CUDA_READY_RING_MAX);
	assert_memory_equal(bufs[0]->cuda_ready_ring[0].data, bufs[0]->cuda_ready_event.data, 64);
	for (size_t i = 1; i < nring; i++) {
		const struct fake_cuda_handle *h = handle_of(&bufs[0]->cuda_ready_ring[i]);
		assert_memory_equal(h->magic, "FAKEEVT", 8);
		assert_true(h->base_or_id != ready->base_or_id && h->base_or_id != done->base_or_id);
		assert_int_equal(fake_cuda_event(h->base_or_id)->flags, 0x6);
		assert_true(h->base_or_id != handle_of(&bufs[0]->cuda_ready_ring[i - 1])->base_or_id);
	}
	for (size_t i = 1; i < 4; i++) {
		const struct fake_cuda_handle *h = handle_of(&bufs[i]->cuda_ipc_handle);
		assert_memory_equal(h->magic, "FAKEIPC", 8);
		assert_int_equal(h->base_or_id, bases[i - 1]);
		assert_int_equal(bufs[i]->size, sizes[i - 1]);
		assert_int_equal(bufs[i]->cuda_ready_event.len, 0);
	}
	uint32_t want_buf[] = { 1, 1, 2, 1, 3 };
	uint64_t want_off[] = { 0, 4096, 256, 8192, 1u << 20 };
	for (size_t i = 0; i < 5; i++) {
		const Gradsync__TensorSpec *t = tensor_at(f, i);
		assert_non_null(t);
		assert_string_equal(t->name, specs[i].name);
		assert_int_equal(t->count, specs[i].count);
		assert_int_equal(t->dtype, GRADSYNC__DTYPE__DTYPE_FLOAT32);
		assert_int_equal(t->buffer, want_buf[i]);
		assert_int_equal(t->offset, want_off[i]);
	}
	assert_true(f->frames[f->nframes - 1]->register_tensors->last);

	/* The daemon reads them back as meant. */
	struct gs_buffer_desc d;
	char err[256];
	assert_int_equal(gs_buffer_kind_of(bufs[0]), GS_BUFFER_CUDA_EVENTS);
	assert_int_equal(gs_buffer_desc_parse(bufs[0], 3, -1, &d, err, sizeof(err)), GS_OK);
	assert_int_equal(d.kind, GS_BUFFER_CUDA_EVENTS);
	assert_int_equal(d.rank, 3);
	assert_ptr_equal(d.ready_event, bufs[0]->cuda_ready_event.data);
	assert_ptr_equal(d.done_event, bufs[0]->cuda_done_event.data);
	assert_int_equal(d.nring, nring);
	for (size_t i = 0; i < nring; i++)
		assert_ptr_equal(d.ready_ring[i], bufs[0]->cuda_ready_ring[i].data);
	for (size_t i = 1; i < 4; i++) {
		assert_int_equal(gs_buffer_kind_of(bufs[i]), GS_BUFFER_CUDA);
		assert_int_equal(gs_buffer_desc_parse(bufs[i], 0, -1, &d, err, sizeof(err)), GS_OK);
		assert_int_equal(d.kind, GS_BUFFER_CUDA);
		assert_int_equal(d.size, sizes[i - 1]);
		assert_int_equal(d.device, 0);
		assert_string_equal(d.pci_bus_id, "0000:10:00.0");
		assert_memory_equal(d.handle, bufs[i]->cuda_ipc_handle.data, GS_CUDA_IPC_HANDLE_SIZE);
	}
	/* Closing destroyed every event, in their context. */
	assert_int_equal(fake_cuda_event(done->base_or_id)->destroyed, 1);
	for (size_t i = 0; i < nring; i++)
		assert_int_equal(fake_cuda_event(handle_of(&bufs[0]->cuda_ready_ring[i])->base_or_id)->destroyed, 1);
	assert_int_equal(fake_cuda_ctx_depth(), 0);
	daemon_free(f);
}

/* The ready event is recorded on the trainer's stream before the marks go
 * out; the trainer's stream waits on the done event after the step. */
static void events_order_a_step(void **state)
{
	uint64_t a = fake_cuda_alloc(1u << 20, 0, 0);
	struct gs_cuda_tensor_spec specs[] = {
		{ "w", 1024, GS_FLOAT32, (void *)(uintptr_t)a },
		{ "b", 16, GS_FLOAT32, (void *)(uintptr_t)(a + 4096) },
	};
	struct fake_daemon *f = daemon_start("cuda", 1);
	gs_client *c = connect_to(f);
	assert_int_equal(gs_register_cuda(c, specs, 2), GS_OK);
	const struct fake_cuda_event *ready = fake_cuda_event(1), *done = fake_cuda_event(2);
	assert_non_null(ready);
	assert_non_null(done);
	/* Before the step: nothing to wait for on the wrong handle. */
	assert_int_equal(gs_cuda_stream_wait(NULL, NULL), GS_EINVAL);

	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	assert_int_equal(gs_step_begin(c, &so), GS_OK);
	uint32_t first = 1, second = 0;
	void *stream = (void *)(uintptr_t)0x5100;
	assert_int_equal(gs_cuda_mark_ready(c, &first, 1, stream), GS_OK);
	assert_int_equal(ready->records, 1);
	assert_ptr_equal(ready->last_record_stream, stream);
	/* The next mark records the ring's next event (3: after ready and
	 * done), and says so, so that the daemon waits for each mark's own. */
	assert_int_equal(gs_cuda_mark_ready(c, &second, 1, stream), GS_OK);
	assert_int_equal(ready->records, 1);
	assert_int_equal(fake_cuda_event(3)->records, 1);
	assert_ptr_equal(fake_cuda_event(3)->last_record_stream, stream);
	struct gs_step_result res;
	if (gs_step_wait(c, 5000, &res) != GS_OK)
		fail_msg("gs_step_wait: %s", gs_last_error(c));
	assert_int_equal(done->waits, 0);
	void *optimizer = (void *)(uintptr_t)0x5200;
	assert_int_equal(gs_cuda_stream_wait(c, optimizer), GS_OK);
	assert_int_equal(done->waits, 1);
	assert_ptr_equal(done->last_wait_stream, optimizer);
	assert_int_equal(done->records, 0); /* the daemon's to record */
	assert_int_equal(fake_cuda_ctx_depth(), 0);
	gs_close(c);
	daemon_join(f);
	assert_false(f->protocol_error);
	assert_int_equal(f->marked, 2);
	assert_int_equal(f->last_ready_event, 1); /* the second mark's */
	daemon_free(f);
}

/* Many tensors over many allocations: several frames, none over the
 * per-frame limits, every tensor's buffer sent with it or before. */
static void splits_large_registrations_into_frames(void **state)
{
	enum { NALLOC = 150, NTENSOR = 3000 };
	static struct gs_cuda_tensor_spec specs[NTENSOR];
	static char names[NTENSOR][16];
	uint64_t bases[NALLOC];
	for (int i = 0; i < NALLOC; i++)
		bases[i] = fake_cuda_alloc(1u << 20, 1, 0);
	for (int i = 0; i < NTENSOR; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		specs[i] = (struct gs_cuda_tensor_spec){
			names[i], 32, GS_FLOAT32,
			(void *)(uintptr_t)(bases[i % NALLOC] + (uint64_t)(i / NALLOC) * 128),
		};
	}
	struct fake_daemon *f = daemon_start("cuda", 0);
	gs_client *c = connect_to(f);
	if (gs_register_cuda(c, specs, NTENSOR) != GS_OK)
		fail_msg("gs_register_cuda: %s", gs_last_error(c));
	gs_close(c);
	daemon_join(f);
	assert_false(f->protocol_error);
	assert_true(f->nframes >= 3);
	size_t buffers = 0, tensors = 0;
	for (size_t i = 0; i < f->nframes; i++) {
		const Gradsync__RegisterTensors *r = f->frames[i]->register_tensors;
		assert_true(r->n_buffers <= GS_FRAME_MAX_FDS);
		assert_true(r->n_tensors <= 1024);
		assert_int_equal(r->last, i + 1 == f->nframes);
		buffers += r->n_buffers;
		for (size_t t = 0; t < r->n_tensors; t++) {
			assert_true(r->tensors[t]->buffer < buffers);
			assert_int_equal(r->tensors[t]->buffer, (tensors % NALLOC) + 1);
			assert_int_equal(r->tensors[t]->offset, (tensors / NALLOC) * 128);
			tensors++;
		}
	}
	assert_int_equal(buffers, NALLOC + 1);
	assert_int_equal(tensors, NTENSOR);
	const Gradsync__Buffer *bufs[NALLOC + 1];
	all_buffers(f, bufs, NALLOC + 1);
	assert_string_equal(bufs[5]->pci_bus_id, "0000:11:00.0");
	assert_int_equal(bufs[5]->device, 1);
	daemon_free(f);
}

/* Registering the specs as gradients, or (as_state) as a state of the
 * same bytes, must be refused with code and text. */
static bool as_state;

static int register_specs(gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n)
{
	if (!as_state)
		return gs_register_cuda(c, specs, n);
	struct gs_cuda_state_spec st[4];
	assert_true(n <= 4);
	for (size_t i = 0; i < n; i++)
		st[i] = (struct gs_cuda_state_spec){ specs[i].name, specs[i].count * 4,
						     specs[i].dtype, specs[i].data };
	return gs_register_state_cuda(c, st, n);
}

static void expect_refused(struct gs_cuda_tensor_spec *specs, size_t n, const char *backend,
			   int code, const char *text)
{
	struct fake_daemon *f = daemon_start(backend, 0);
	gs_client *c = connect_to(f);
	int r = register_specs(c, specs, n);
	if (r != code || !strstr(gs_last_error(c), text))
		fail_msg("expected %s with '%s', got %s: %s", gs_err_name(code), text,
			 gs_err_name(r), gs_last_error(c));
	assert_int_equal(gs_tensor_count(c), 0);
	assert_int_equal(gs_state_count(c), 0);
	assert_int_equal(fake_cuda_ctx_depth(), 0);
	gs_close(c);
	daemon_join(f);
	assert_int_equal(f->nframes, 0); /* refused before anything went out */
	daemon_free(f);
}

static void refuses_what_cuda_ipc_cannot_share(void **state)
{
	uint64_t a = fake_cuda_alloc(1u << 20, 0, 0);
	uint64_t vmm = fake_cuda_alloc(1u << 20, 0, FAKE_CUDA_NOT_IPC);
	uint64_t other = fake_cuda_alloc(1u << 20, 1, 0);
	static float host[16];
	struct gs_cuda_tensor_spec s[2] = {
		{ "w", 16, GS_FLOAT32, host },
	};
	expect_refused(s, 1, "cuda", GS_EBUFFER, "is not CUDA device memory");
	s[0].data = (void *)(uintptr_t)vmm;
	expect_refused(s, 1, "cuda", GS_EBUFFER, "cannot export");
	s[0].data = (void *)(uintptr_t)(a + (1u << 20) - 32);
	expect_refused(s, 1, "cuda", GS_EBUFFER, "runs past the end of its allocation");
	s[0].data = (void *)(uintptr_t)a;
	s[1] = (struct gs_cuda_tensor_spec){ "b", 16, GS_FLOAT32, (void *)(uintptr_t)other };
	expect_refused(s, 2, "cuda", GS_EINVAL, "register one GPU's tensors per connection");
	s[0].data = (void *)(uintptr_t)(a + 2);
	expect_refused(s, 1, "cuda", GS_EINVAL, "misaligned");
	s[0].data = (void *)(uintptr_t)a;
	expect_refused(s, 1, "host", GS_ESTATE, "runs the host backend");
}

/* The same refusals for a state in CUDA memory (gs_register_state_cuda),
 * which finds its allocations with the gradients' code. */
static void state_refuses_what_cuda_ipc_cannot_share(void **state)
{
	as_state = true;
	refuses_what_cuda_ipc_cannot_share(state);
	as_state = false;
}

static void needs_cuda_registration(void **state)
{
	struct fake_daemon *f = daemon_start("cuda", 0);
	gs_client *c = connect_to(f);
	uint32_t i = 0;
	assert_int_equal(gs_cuda_mark_ready(c, &i, 1, NULL), GS_ESTATE);
	assert_non_null(strstr(gs_last_error(c), "gs_register_cuda"));
	assert_int_equal(gs_cuda_stream_wait(c, NULL), GS_ESTATE);
	gs_close(c);
	daemon_join(f);
	daemon_free(f);
}

/* The daemon's side: what a Buffer must look like to be a CUDA one. */
static void daemon_checks_buffers(void **state)
{
	uint8_t h[65] = { 0 };
	struct gs_buffer_desc d;
	char err[256];
	Gradsync__Buffer m = GRADSYNC__BUFFER__INIT;
	m.size = 4096;
	assert_int_equal(gs_buffer_kind_of(&m), GS_BUFFER_MEMFD);
	assert_int_equal(gs_buffer_desc_parse(&m, 1, 17, &d, err, sizeof(err)), GS_OK);
	assert_int_equal(d.kind, GS_BUFFER_MEMFD);
	assert_int_equal(d.fd, 17);
	assert_int_equal(d.size, 4096);

	m.cuda_ipc_handle = (ProtobufCBinaryData){ 63, h };
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "has 63 bytes; a CUDA IPC handle has 64"));
	m.cuda_ipc_handle.len = 64;
	m.device = -1;
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "CUDA device -1"));
	m.device = 0;
	m.pci_bus_id = "0000:3b:00.0 \n";
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	m.pci_bus_id = "0000:3b:00.0";
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_OK);
	m.cuda_ready_event = (ProtobufCBinaryData){ 64, h };
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "both a CUDA memory handle and events"));
	m.size = 0;
	m.cuda_ready_event.len = 0;
	assert_int_equal(gs_buffer_desc_parse(&m, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "0 bytes"));

	Gradsync__Buffer ev = GRADSYNC__BUFFER__INIT;
	ev.cuda_ready_event = (ProtobufCBinaryData){ 64, h };
	ev.cuda_done_event = (ProtobufCBinaryData){ 64, h };
	assert_int_equal(gs_buffer_desc_parse(&ev, 0, -1, &d, err, sizeof(err)), GS_OK);
	ev.size = 8;
	assert_int_equal(gs_buffer_desc_parse(&ev, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "must be 0"));
	ev.size = 0;
	ev.cuda_done_event.len = 0;
	assert_int_equal(gs_buffer_kind_of(&ev), GS_BUFFER_CUDA_EVENTS);
	assert_int_equal(gs_buffer_desc_parse(&ev, 0, -1, &d, err, sizeof(err)), GS_EINVAL);
	assert_non_null(strstr(err, "done event has 0 bytes"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(registers_base_allocations_and_offsets, setup),
		cmocka_unit_test_setup(events_order_a_step, setup),
		cmocka_unit_test_setup(splits_large_registrations_into_frames, setup),
		cmocka_unit_test_setup(refuses_what_cuda_ipc_cannot_share, setup),
		cmocka_unit_test_setup(state_refuses_what_cuda_ipc_cannot_share, setup),
		cmocka_unit_test_setup(needs_cuda_registration, setup),
		cmocka_unit_test(daemon_checks_buffers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
