/*
 * Bad input to a running gradsyncd: each case sends one broken or hostile
 * thing as local rank 1 and expects a clear Error naming it, then the end
 * of that connection. Throughout, a good trainer holds local rank 0; at the
 * end a good rank 1 joins and both run a step whose result is checked, so
 * the daemon and the other client must have gone on unharmed.
 */
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "frame.h"
#include "harness.h"

static struct gs_test_daemon daemon_;
static gs_client *rank0;
/* The job: local ranks 0 and 1 of this node. */
static struct harness_job job = { .local_size = { 2 } };

static const struct gs_tensor_spec good_layout[] = {
	{ "fc.bias", 1000, GS_FLOAT32, -1, 0 },
	{ "fc.weight", 5000, GS_FLOAT32, -1, 0 },
	{ "conv.weight", 300, GS_FLOAT32, -1, 0 },
};
#define NGOOD 3

static gs_client *good_trainer(uint32_t rank)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = daemon_.socket;
	o.local_rank = rank;
	gs_client *c;
	harness_job_setenv(&job, 0);
	int r = gs_connect(&o, &c);
	harness_clear_launch_env();
	if (r != GS_OK)
		fail_msg("connect: %s", gs_last_error(NULL));
	r = gs_register(c, good_layout, NGOOD);
	if (r != GS_OK)
		fail_msg("register: %s", gs_last_error(c));
	return c;
}

static int setup(void **state)
{
	(void)state;
	static const char *const args[] = { "--max-frame=65536", NULL };
	harness_job_daemon_start(&daemon_, &job, 0, args);
	rank0 = good_trainer(0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	gs_close(rank0);
	return harness_daemon_stop(&daemon_);
}

/* ---- Building raw registrations ---------------------------------------- */

static Gradsync__Message *register_msg(Gradsync__RegisterTensors *r,
				       Gradsync__Buffer *buf, Gradsync__Buffer **bufp,
				       Gradsync__TensorSpec *t, Gradsync__TensorSpec **tp,
				       size_t nt, uint64_t buffer_size)
{
	static Gradsync__Message m;
	gradsync__register_tensors__init(r);
	gradsync__buffer__init(buf);
	buf->size = buffer_size;
	*bufp = buf;
	r->n_buffers = 1;
	r->buffers = bufp;
	for (size_t i = 0; i < nt; i++)
		tp[i] = &t[i];
	r->n_tensors = nt;
	r->tensors = tp;
	r->last = true;
	gradsync__message__init(&m);
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = r;
	return &m;
}

static Gradsync__TensorSpec spec(const char *name, uint64_t count,
				 Gradsync__Dtype dtype, uint64_t offset)
{
	Gradsync__TensorSpec t = GRADSYNC__TENSOR_SPEC__INIT;
	t.name = (char *)name;
	t.count = count;
	t.dtype = dtype;
	t.offset = offset;
	return t;
}

/* Registers one buffer of buffer_size bytes backed by fd. */
static void register_raw(int sock, int fd, uint64_t buffer_size,
			 Gradsync__TensorSpec *t, size_t nt)
{
	Gradsync__RegisterTensors r;
	Gradsync__Buffer buf, *bufp;
	Gradsync__TensorSpec *tp[8];
	Gradsync__Message *m = register_msg(&r, &buf, &bufp, t, tp, nt, buffer_size);
	raw_send(sock, m, &fd, 1);
}

static void bad_registration(Gradsync__TensorSpec *t, size_t nt, size_t fd_size,
			     uint64_t claimed, bool sealed, int code, const char *text)
{
	int sock = raw_connect(daemon_.socket);
	raw_hello_job(sock, 1, &job);
	int fd = make_memfd(fd_size, sealed);
	register_raw(sock, fd, claimed, t, nt);
	close(fd);
	raw_expect_error(sock, code, text);
	close(sock);
}

/* ---- Cases ------------------------------------------------------------- */

static void non_float32_tensor(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT16, 0) };
	bad_registration(t, 1, 4096, 4096, true, GS_EDTYPE,
			 "tensor 'fc.bias' has dtype float16; only float32 is supported");
}

static void zero_length_tensor(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 0, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0) };
	bad_registration(t, 1, 4096, 4096, true, GS_EINVAL, "tensor 'fc.bias' has zero elements");
}

static void layout_differs(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = {
		spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0),
		spec("fc.weight", 4000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 4096),
		spec("conv.weight", 300, GRADSYNC__DTYPE__DTYPE_FLOAT32, 24576),
	};
	bad_registration(t, 3, 32768, 32768, true, GS_ELAYOUT,
			 "tensor 1 is 'fc.weight' (4000 elements) in local rank 1's layout but 'fc.weight' (5000 elements) in local rank 0's");
}

static void memfd_smaller_than_claimed(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0) };
	bad_registration(t, 1, 1000, 4096, true, GS_EBUFFER, "memfd holds 1000 bytes, 4096 claimed");
}

static void unsealed_memfd(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0) };
	bad_registration(t, 1, 4096, 4096, false, GS_EBUFFER, "not sealed against shrinking");
}

static void tensor_beyond_buffer(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 2048) };
	bad_registration(t, 1, 4096, 4096, true, GS_EBUFFER, "does not fit in buffer 0 of 4096 bytes");
}

static void absurd_count(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = {
		spec("fc.bias", UINT64_C(1) << 62, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0),
	};
	bad_registration(t, 1, 4096, 4096, true, GS_ELIMIT, "passes the limit of");
}

static void duplicate_name(void **state)
{
	(void)state;
	Gradsync__TensorSpec t[] = {
		spec("fc.bias", 10, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0),
		spec("fc.bias", 10, GRADSYNC__DTYPE__DTYPE_FLOAT32, 64),
	};
	bad_registration(t, 2, 4096, 4096, true, GS_EINVAL, "tensor name 'fc.bias' appears twice");
}

static void descriptor_not_a_memfd(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_hello_job(sock, 1, &job);
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0) };
	register_raw(sock, pipefd[0], 4096, t, 1);
	close(pipefd[0]);
	close(pipefd[1]);
	raw_expect_error(sock, GS_EBUFFER, "descriptor is not a memfd");
	close(sock);
}

static void buffers_without_descriptors(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_hello_job(sock, 1, &job);
	Gradsync__RegisterTensors r;
	Gradsync__Buffer buf, *bufp;
	Gradsync__TensorSpec t[] = { spec("fc.bias", 1000, GRADSYNC__DTYPE__DTYPE_FLOAT32, 0) };
	Gradsync__TensorSpec *tp[1];
	raw_send(sock, register_msg(&r, &buf, &bufp, t, tp, 1, 4096), NULL, 0);
	raw_expect_error(sock, GS_EPROTO, "lists 1 buffers but only 0 descriptors arrived");
	close(sock);
}

static void frame_longer_than_maximum(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_hello_job(sock, 1, &job);
	uint8_t hdr[4];
	gs_frame_put_len(hdr, 65537);
	raw_send_bytes(sock, hdr, sizeof(hdr));
	raw_expect_error(sock, GS_ELIMIT, "frame longer than the 65536-byte maximum");
	close(sock);
}

/* Before Hello a frame is small whatever --max-frame says: an unknown
 * client cannot make gradsyncd hold a trainer's largest frame. */
static void large_frame_before_hello(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	uint8_t hdr[4];
	gs_frame_put_len(hdr, 65537);
	raw_send_bytes(sock, hdr, sizeof(hdr));
	raw_expect_error(sock, GS_ELIMIT, "frame longer than 65536 bytes from a client that has not said Hello");
	close(sock);
}

static void garbage_bytes(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	uint8_t junk[4 + 64];
	gs_frame_put_len(junk, 64);
	uint32_t x = 2463534242u;
	for (size_t i = 4; i < sizeof(junk); i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		junk[i] = (uint8_t)(x | 0x80); /* unterminated varints: never valid */
	}
	raw_send_bytes(sock, junk, sizeof(junk));
	raw_expect_error(sock, GS_EPROTO, "frame of 64 bytes is not a valid message");
	close(sock);
}

static void wrong_protocol_version(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_send_hello(sock, 1, 99, "");
	raw_expect_error(sock, GS_EVERSION, "protocol version 99 is not supported");
	close(sock);
}

static void step_before_registration(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_hello_job(sock, 1, &job);
	Gradsync__BeginStep b = GRADSYNC__BEGIN_STEP__INIT;
	b.step = 1;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_BEGIN_STEP;
	m.begin_step = &b;
	raw_send(sock, &m, NULL, 0);
	raw_expect_error(sock, GS_ESTATE, "BeginStep before the tensors are registered");
	close(sock);
}

static void truncated_frame(void **state)
{
	(void)state;
	/* A header promising 100 bytes, 40 of them, then the end: the daemon
	 * drops the client and goes on (others_go_on checks). */
	int sock = raw_connect(daemon_.socket);
	uint8_t part[4 + 40] = { 0 };
	gs_frame_put_len(part, 100);
	raw_send_bytes(sock, part, sizeof(part));
	close(sock);
	harness_wait_for_text(daemon_.log, "closed mid-frame (44 bytes unread)", 30);
	assert_true(harness_daemon_alive(&daemon_));
}

static void unknown_message(void **state)
{
	(void)state;
	/* Field 99 is no message this daemon knows: the body is empty. */
	int sock = raw_connect(daemon_.socket);
	const uint8_t frame[] = { 3, 0, 0, 0, 0x98, 0x06, 0x01 };
	raw_send_bytes(sock, frame, sizeof(frame));
	raw_expect_error(sock, GS_EPROTO, "expected Hello, got an empty or unknown message");
	close(sock);
}

/* Another job is no intruder: it is served beside the one that holds
 * local rank 0, with a local rank 0 of its own. */
static void second_job_served_beside(void **state)
{
	(void)state;
	int sock = raw_connect(daemon_.socket);
	raw_send_hello(sock, 0, GS_PROTOCOL_VERSION, "another-job");
	Gradsync__Message *m = raw_recv(sock);
	assert_non_null(m);
	assert_int_equal(m->body_case, GRADSYNC__MESSAGE__BODY_WELCOME);
	assert_int_equal(m->welcome->world_size, 1);
	gradsync__message__free_unpacked(m, NULL);
	close(sock);
}

/* Most often another job on the same id (torchrun's default run id is
 * "none"): the refusal names the job, the rank and its holder (this
 * process), and says how to give each job its own id. */
static void rank_taken(void **state)
{
	(void)state;
	char want[256];
	snprintf(want, sizeof(want),
		 "job '': local rank 0 is already taken by pid %d; if this trainer belongs to another job, give each job its own id (torchrun --rdzv-id, or GRADSYNC_JOB_ID)",
		 (int)getpid());
	int sock = raw_connect(daemon_.socket);
	raw_send_hello_job(sock, 0, GS_PROTOCOL_VERSION, &job, 0);
	raw_expect_error(sock, GS_EREFUSED, want);
	close(sock);
}

/* ---- Numbers past their field's range ------------------------------------ */

/* An index that a 32-bit field would read as 0 (2^40) is refused, naming
 * it, rather than taken for the first tensor. */
static void huge_tensor_index(void **state)
{
	(void)state;
	gs_client *c = good_trainer(1);
	int sock = gs_fd(c);
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	assert_int_equal(gs_step_begin(c, &o), GS_OK);
	uint64_t idx[] = { UINT64_C(1) << 40 };
	Gradsync__GradientsReady r = GRADSYNC__GRADIENTS_READY__INIT;
	r.step = 1;
	r.n_tensors = 1;
	r.tensors = idx;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_GRADIENTS_READY;
	m.gradients_ready = &r;
	raw_send(sock, &m, NULL, 0);
	struct gs_step_result res;
	int rc = gs_step_wait(c, 10000, &res);
	print_message("  %s: %s\n", gs_err_name(rc), gs_last_error(c));
	assert_int_equal(rc, GS_EINVAL);
	assert_non_null(strstr(gs_last_error(c), "GradientsReady names tensor 1099511627776; 3 are registered"));
	gs_close(c);
	/* Rank 0 had not begun that step: it learns of its abort when it does. */
	assert_int_equal(gs_step_begin(rank0, &o), GS_OK);
	assert_int_equal(gs_step_wait(rank0, 10000, &res), GS_EABORTED);
	assert_non_null(strstr(gs_last_error(rank0), "trainer local rank 1"));
}

static void hello_with(uint64_t rank, uint64_t version, int code, const char *text)
{
	int sock = raw_connect(daemon_.socket);
	raw_send_hello(sock, rank, version, "");
	raw_expect_error(sock, code, text);
	close(sock);
}

/* Local rank 2^32 is not rank 0, protocol version 2^32 + 1 is not 1. */
static void huge_hello_numbers(void **state)
{
	(void)state;
	hello_with(UINT64_C(1) << 32, GS_PROTOCOL_VERSION, GS_EREFUSED,
		   "local rank 4294967296 is out of range");
	hello_with(1, (UINT64_C(1) << 32) + GS_PROTOCOL_VERSION, GS_EVERSION,
		   "protocol version 4294967297 is not supported");
}

/* An enum travels as a 32-bit number: role 2^32 + 2 would read as 2
 * (control). Whatever the field, a frame whose numbers lost bits no longer
 * encodes to its own length, and is refused. */
static void huge_enum(void **state)
{
	(void)state;
	static const uint8_t frame[] = {
		12, 0, 0, 0,                      /* length */
		0x0a, 10,                         /* Message.hello, 10 bytes */
		0x08, GS_PROTOCOL_VERSION,        /* protocol_version */
		0x10, 0x82, 0x80, 0x80, 0x80, 0x10, /* role = 2^32 + 2 */
		0x18, 0x01,                       /* local_rank = 1 */
	};
	int sock = raw_connect(daemon_.socket);
	raw_send_bytes(sock, frame, sizeof(frame));
	raw_expect_error(sock, GS_EPROTO, "does not encode back to itself");
	close(sock);
}

/* The good trainers: inputs a_r[i] = (r + 1) * (i % 7 - 3) / 8, so the
 * average over two ranks is exactly 1.5 * (i % 7 - 3) / 8 in fp16. */
static void fill(gs_client *c, int rank)
{
	for (size_t t = 0; t < NGOOD; t++) {
		float *p = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < good_layout[t].count; i++)
			p[i] = (float)(rank + 1) * (float)((int)(i % 7) - 3) / 8.0f;
	}
}

static void others_go_on(void **state)
{
	(void)state;
	assert_true(harness_daemon_alive(&daemon_));
	gs_client *rank1 = good_trainer(1);
	gs_client *c[2] = { rank0, rank1 };
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	const uint32_t order[NGOOD] = { 0, 1, 2 };
	for (int r = 0; r < 2; r++) {
		fill(c[r], r);
		assert_int_equal(gs_step_begin(c[r], &o), GS_OK);
		assert_int_equal(gs_mark_ready(c[r], order, NGOOD), GS_OK);
	}
	for (int r = 0; r < 2; r++) {
		struct gs_step_result res;
		int rc = gs_step_wait(c[r], 30000, &res);
		if (rc != GS_OK)
			fail_msg("rank %d: %s", r, gs_last_error(c[r]));
		assert_int_equal(res.nonfinite, 0);
		for (size_t t = 0; t < NGOOD; t++) {
			const float *p = gs_tensor_data(c[r], t);
			for (uint64_t i = 0; i < good_layout[t].count; i++) {
				double want = 1.5 * ((int)(i % 7) - 3) / 8.0;
				if (p[i] != (float)want)
					fail_msg("rank %d tensor %zu [%llu] = %g, want %g", r, t,
						 (unsigned long long)i, (double)p[i], want);
			}
		}
	}
	gs_close(rank1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(non_float32_tensor),
		cmocka_unit_test(zero_length_tensor),
		cmocka_unit_test(layout_differs),
		cmocka_unit_test(memfd_smaller_than_claimed),
		cmocka_unit_test(unsealed_memfd),
		cmocka_unit_test(tensor_beyond_buffer),
		cmocka_unit_test(absurd_count),
		cmocka_unit_test(duplicate_name),
		cmocka_unit_test(descriptor_not_a_memfd),
		cmocka_unit_test(buffers_without_descriptors),
		cmocka_unit_test(frame_longer_than_maximum),
		cmocka_unit_test(large_frame_before_hello),
		cmocka_unit_test(garbage_bytes),
		cmocka_unit_test(wrong_protocol_version),
		cmocka_unit_test(step_before_registration),
		cmocka_unit_test(rank_taken),
		cmocka_unit_test(truncated_frame),
		cmocka_unit_test(unknown_message),
		cmocka_unit_test(huge_tensor_index),
		cmocka_unit_test(huge_hello_numbers),
		cmocka_unit_test(huge_enum),
		cmocka_unit_test(second_job_served_beside),
		cmocka_unit_test(others_go_on),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
