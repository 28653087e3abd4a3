/*
 * CUDA tensors, for gradsyncd's cuda backend: each tensor as (base
 * allocation, offset), each allocation once with its IPC handle
 * (cuda_mem.h). Buffer 0 of the registration is the trainer's pair of
 * interprocess events: "ready", which the trainer records before marking
 * gradients ready and the daemon's stream waits on before reading them,
 * and "done", which the daemon records after writing the results and the
 * trainer's stream waits on (gs_cuda_stream_wait).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cuda_mem.h"

#define EVENTS_BUFFER 0

/* A tensor as sent, kept for gs_reconnect. */
struct cuda_tensor {
	char *name;
	uint64_t count;
	enum gs_dtype dtype;
	uint32_t buffer; /* allocation k is buffer k + 1 */
	uint64_t offset;
};

/* Ready events per trainer: a bucket's marks whose event has been recorded
 * again since (this many marks later) wait for the later record. */
#define GS_CUDA_READY_RING 32

struct gs__cuda {
	struct gs__cuda_mem mem; /* the tensors' device, context and allocations */
	const struct gs__cu *cu; /* mem.cu */
	/* The ready events, a ring: each gs_cuda_mark_ready records the next,
	 * so that the daemon waits for a bucket's own gradients, not for the
	 * latest ones (the host runs ahead of the GPU). ready[0] goes first
	 * and alone to a daemon that knows no ring. */
	void *ready[GS_CUDA_READY_RING], *done;
	gs__cu_ipc_handle ready_handle[GS_CUDA_READY_RING], done_handle;
	ProtobufCBinaryData ring[GS_CUDA_READY_RING]; /* the handles, for the frame */
	uint32_t next_ready;
	struct cuda_tensor *tensors;
	size_t ntensors;
};

static int driver_fail(struct gs_client *c, struct gs__cuda *g, int code, const char *what,
		       gs__cu_result r)
{
	return gs__cuda_mem_fail(c, &g->mem, code, what, r);
}

static int push(struct gs_client *c, struct gs__cuda *g)
{
	return gs__cuda_mem_push(c, &g->mem);
}

static void pop(struct gs__cuda *g)
{
	gs__cuda_mem_pop(&g->mem);
}

static void free_state(struct gs__cuda *g)
{
	if (!g)
		return;
	if ((g->ready[0] || g->done) && g->cu->ctx_push_current(g->mem.ctx) == GS_CU_SUCCESS) {
		for (size_t i = 0; i < GS_CUDA_READY_RING; i++)
			if (g->ready[i])
				g->cu->event_destroy(g->ready[i]);
		if (g->done)
			g->cu->event_destroy(g->done);
		pop(g);
	}
	for (size_t i = 0; i < g->ntensors; i++)
		free(g->tensors[i].name);
	free(g->tensors);
	gs__cuda_mem_free(&g->mem);
	free(g);
}

void gs__cuda_release(struct gs_client *c)
{
	free_state(c->cuda);
	c->cuda = NULL;
}

/* ---- Where each tensor lives ----------------------------------------------- */

static int check_spec(struct gs_client *c, const struct gs_cuda_tensor_spec *s, size_t i)
{
	size_t esize;
	int r = gs__check_tensor(c, i, s->name, s->dtype, s->count, &esize);
	if (r < 0)
		return r;
	if (!s->data || (uintptr_t)s->data % esize)
		return gs__fail(c, GS_EINVAL, "tensor '%s': device pointer %p is NULL or misaligned",
			       s->name, s->data);
	return GS_OK;
}

static int locate(struct gs_client *c, struct gs__cuda *g, const struct gs_cuda_tensor_spec *s,
		  size_t i)
{
	struct cuda_tensor *t = &g->tensors[i];
	uint32_t a = 0;
	int r = gs__cuda_mem_locate(c, &g->mem, i, s->name, s->data,
				    s->count * gs__dtype_size(s->dtype), &a, &t->offset);
	if (r < 0)
		return r;
	t->count = s->count;
	t->dtype = s->dtype;
	t->buffer = a + 1;
	t->name = strdup(s->name);
	return t->name ? GS_OK : gs__fail(c, GS_ENOMEM, "out of memory");
}

static gs__cu_result make_events(struct gs__cuda *g, const char **what)
{
	const struct gs__cu *cu = g->cu;
	unsigned flags = GS_CU_EVENT_DISABLE_TIMING | GS_CU_EVENT_INTERPROCESS;
	*what = "cuEventCreate";
	gs__cu_result r = cu->event_create(&g->ready[0], flags);
	if (r == GS_CU_SUCCESS)
		r = cu->event_create(&g->done, flags);
	for (size_t i = 1; i < GS_CUDA_READY_RING && r == GS_CU_SUCCESS; i++)
		r = cu->event_create(&g->ready[i], flags);
	if (r != GS_CU_SUCCESS)
		return r;
	*what = "cuIpcGetEventHandle";
	r = cu->ipc_get_event_handle(&g->done_handle, g->done);
	for (size_t i = 0; i < GS_CUDA_READY_RING && r == GS_CU_SUCCESS; i++) {
		r = cu->ipc_get_event_handle(&g->ready_handle[i], g->ready[i]);
		g->ring[i].len = sizeof(g->ready_handle[i]);
		g->ring[i].data = (uint8_t *)g->ready_handle[i].reserved;
	}
	return r;
}

/* The allocations' IPC handles, the device's PCI bus id and the events. */
static int make_handles(struct gs_client *c, struct gs__cuda *g)
{
	int r = gs__cuda_mem_handles(c, &g->mem);
	if (r == GS_OK)
		r = push(c, g);
	if (r < 0)
		return r;
	const char *what = "";
	gs__cu_result res = make_events(g, &what);
	pop(g);
	return res == GS_CU_SUCCESS ? GS_OK : driver_fail(c, g, GS_ESYSTEM, what, res);
}

/* ---- The RegisterTensors frames ------------------------------------------------- */

static Gradsync__Buffer events_buffer(struct gs__cuda *g)
{
	Gradsync__Buffer m = gs__cuda_mem_device_buffer(&g->mem);
	m.size = 0;
	m.cuda_ready_event.len = sizeof(g->ready_handle[0]);
	m.cuda_ready_event.data = (uint8_t *)g->ready_handle[0].reserved;
	m.n_cuda_ready_ring = GS_CUDA_READY_RING;
	m.cuda_ready_ring = g->ring;
	m.cuda_done_event.len = sizeof(g->done_handle);
	m.cuda_done_event.data = (uint8_t *)g->done_handle.reserved;
	return m;
}

static int send_registration(struct gs_client *c, struct gs__cuda *g)
{
	struct gs__reg_frames *f = gs__reg_frames_new(c, false);
	if (!f)
		return GS_ENOMEM;
	Gradsync__Buffer events = events_buffer(g);
	int r = gs__reg_frames_add(c, f, NULL, &events, -1);
	uint32_t sent = 1; /* buffers on their way: the events so far */
	for (size_t i = 0; i < g->ntensors && r == GS_OK; i++) {
		const struct cuda_tensor *ct = &g->tensors[i];
		Gradsync__TensorSpec t = GRADSYNC__TENSOR_SPEC__INIT;
		t.name = ct->name;
		t.count = ct->count;
		t.dtype = (Gradsync__Dtype)ct->dtype;
		t.buffer = ct->buffer;
		t.offset = ct->offset;
		Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
		bool new_buf = ct->buffer == sent;
		if (new_buf)
			buf = gs__cuda_mem_alloc_buffer(&g->mem, sent++ - 1);
		r = gs__reg_frames_add(c, f, &t, new_buf ? &buf : NULL, -1);
	}
	return gs__reg_frames_end(c, f, r);
}

int gs__cuda_register_again(struct gs_client *c)
{
	gs__doing(c, "registration");
	c->expect = GRADSYNC__MESSAGE__BODY_REGISTERED;
	int r = send_registration(c, c->cuda);
	if (r == GS_OK)
		r = gs__wait_registered(c, c->cuda->ntensors);
	return r;
}

/* ---- The API ------------------------------------------------------------------------ */

static int check_register(struct gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER)
		return gs__fail(c, GS_ESTATE, "gs_register_cuda needs a trainer connection");
	if (c->registered)
		return gs__fail(c, GS_ESTATE, "tensors are already registered on this connection");
	if (!specs || n == 0)
		return gs__fail(c, GS_EINVAL, "gs_register_cuda: no tensors");
	if (n > UINT32_MAX - 1)
		return gs__fail(c, GS_ELIMIT, "gs_register_cuda: %zu tensors", n);
	if (!c->backend || strcmp(c->backend, "cuda") != 0)
		return gs__fail(c, GS_ESTATE,
			       "gradsyncd runs the %s backend; CUDA tensors need its cuda backend (gradsyncd --backend cuda)",
			       c->backend ? c->backend : "unknown");
	for (size_t i = 0; i < n; i++) {
		r = check_spec(c, &specs[i], i);
		if (r < 0)
			return r;
	}
	return GS_OK;
}

static int prepare(struct gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n,
		   struct gs__cuda **out)
{
	struct gs__cuda *g = calloc(1, sizeof(*g));
	if (!g)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	*out = g;
	int r = gs__cuda_mem_init(c, &g->mem, n);
	if (r < 0)
		return r;
	g->cu = g->mem.cu;
	g->tensors = calloc(n, sizeof(*g->tensors));
	if (!g->tensors)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	g->ntensors = n;
	for (size_t i = 0; i < n; i++) {
		r = locate(c, g, &specs[i], i);
		if (r < 0)
			return r;
	}
	return make_handles(c, g);
}

static int adopt_tensors(struct gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n)
{
	c->tensors = calloc(n, sizeof(*c->tensors));
	c->reduced = calloc(n, sizeof(*c->reduced));
	if (!c->tensors || !c->reduced)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		c->tensors[i].data = specs[i].data;
		c->tensors[i].count = specs[i].count;
	}
	c->ntensors = n;
	return GS_OK;
}

int gs_register_cuda(gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_register_cuda: NULL handle");
	gs__doing(c, "registration");
	int r = check_register(c, specs, n);
	if (r < 0)
		return r;
	struct gs__cuda *g = NULL;
	r = prepare(c, specs, n, &g);
	if (r == GS_OK)
		r = adopt_tensors(c, specs, n);
	c->cuda = g; /* from here on, released with the tensors */
	if (r < 0)
		goto err_release;
	/* An Error may answer any frame: expect the reply from the first. */
	c->expect = GRADSYNC__MESSAGE__BODY_REGISTERED;
	r = send_registration(c, g);
	if (r == GS_OK)
		r = gs__wait_registered(c, n);
	if (r < 0)
		goto err_session;
	c->registered = true;
	return GS_OK;

err_session:
	/* The daemon holds part of a registration that cannot go on. */
	gs__end_session(c, r);
err_release:
	c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
	gs__tensors_release(c);
	return r;
}

static struct gs__cuda *cuda_of(struct gs_client *c, const char *fn)
{
	if (!c) {
		gs__fail(NULL, GS_EINVAL, "%s: NULL handle", fn);
		return NULL;
	}
	if (c->cuda && c->registered)
		return c->cuda;
	gs__fail(c, GS_ESTATE, "%s: no CUDA tensors are registered on this connection (gs_register_cuda)",
		fn);
	return NULL;
}

/* gs_cuda_mark_ready and gs_cuda_mark_absent (absent, fn): the next ready
 * event recorded on stream, then the marks that name it. */
static int cuda_mark(gs_client *c, const uint32_t *indices, size_t n, void *stream, bool absent,
		     const char *fn)
{
	struct gs__cuda *g = cuda_of(c, fn);
	if (!g)
		return c ? GS_ESTATE : GS_EINVAL;
	int r = push(c, g);
	if (r < 0)
		return r;
	uint32_t e = g->next_ready % GS_CUDA_READY_RING;
	gs__cu_result res = g->cu->event_record(g->ready[e], stream);
	pop(g);
	if (res != GS_CU_SUCCESS)
		return driver_fail(c, g, GS_ESYSTEM, "recording the ready event (cuEventRecord)", res);
	g->next_ready++;
	c->ready_event = e;
	r = absent ? gs_mark_absent(c, indices, n) : gs_mark_ready(c, indices, n);
	c->ready_event = 0;
	return r;
}

int gs_cuda_mark_ready(gs_client *c, const uint32_t *indices, size_t n, void *stream)
{
	return cuda_mark(c, indices, n, stream, false, "gs_cuda_mark_ready");
}

int gs_cuda_mark_absent(gs_client *c, const uint32_t *indices, size_t n, void *stream)
{
	return cuda_mark(c, indices, n, stream, true, "gs_cuda_mark_absent");
}

int gs_cuda_stream_wait(gs_client *c, void *stream)
{
	struct gs__cuda *g = cuda_of(c, "gs_cuda_stream_wait");
	if (!g)
		return c ? GS_ESTATE : GS_EINVAL;
	int r = push(c, g);
	if (r < 0)
		return r;
	gs__cu_result res = g->cu->stream_wait_event(stream, g->done, 0);
	pop(g);
	if (res != GS_CU_SUCCESS)
		return driver_fail(c, g, GS_ESYSTEM, "waiting for gradsyncd's done event (cuStreamWaitEvent)",
				   res);
	return GS_OK;
}
