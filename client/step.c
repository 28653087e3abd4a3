/*
 * A step from the trainer's side: begin, mark tensors ready in batches,
 * then wait or poll for the daemon's StepDone. The library numbers steps
 * from 1 and sends the number with every step message.
 */
#include <float.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* Indices per GradientsReady frame; a batch beyond it goes in several
 * frames, each far below the daemon's frame limit. */
#define MARK_MAX_INDICES 65536

static int check_trainer(struct gs_client *c)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER || !c->registered)
		return gs__fail(c, GS_ESTATE,
			       "no tensors are registered on this connection");
	return GS_OK;
}

static int send_begin(struct gs_client *c, const struct gs_step_options *o)
{
	Gradsync__BeginStep begin = GRADSYNC__BEGIN_STEP__INIT;
	begin.step = c->step;
	begin.clipping = o->clipping;
	begin.clip_value = o->clip_value;
	begin.bucket_events = o->bucket_events;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_BEGIN_STEP;
	m.begin_step = &begin;
	return gs__conn_send(c, &m, NULL, 0, GS_SEND_TIMEOUT_MS);
}

int gs_step_begin(gs_client *c, const struct gs_step_options *opts)
{
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_step_begin: NULL handle");
	gs__doing(c, "step %" PRIu64, c->step + 1);
	int r = check_trainer(c);
	if (r < 0)
		return r;
	if (c->step_state == GS_STEP_RUNNING)
		return gs__fail(c, GS_ESTATE, "step %" PRIu64 " is still in progress",
			       c->step);
	if (opts) {
		if (opts->size < offsetof(struct gs_step_options, clipping))
			return gs__fail(c, GS_EINVAL,
				       "gs_step_begin: options size %zu is too small; use GS_STEP_OPTIONS_INIT",
				       opts->size);
		memcpy(&o, opts, opts->size < sizeof(o) ? opts->size : sizeof(o));
	}
	if (o.clipping && !(o.clip_value > 0.0f && o.clip_value <= FLT_MAX))
		return gs__fail(c, GS_EINVAL,
			       "clip value %g must be positive and finite",
			       (double)o.clip_value);

	/* Running before the send: whatever arrives meanwhile is this step's. */
	c->step++;
	c->step_state = GS_STEP_RUNNING;
	c->buckets_done = 0;
	r = send_begin(c, &o);
	if (r < 0 && !c->dead) {
		c->step--;
		c->step_state = GS_STEP_IDLE;
	}
	return r;
}

/* Refuses the batch before anything is sent: an index out of range or
 * already marked in this step. */
static int check_indices(struct gs_client *c, const uint32_t *idx, size_t n)
{
	size_t i;
	for (i = 0; i < n; i++) {
		if (idx[i] >= c->ntensors) {
			gs__fail(c, GS_EINVAL,
				"tensor index %u is out of range (%zu registered)",
				idx[i], c->ntensors);
			goto err_unmark;
		}
		if (c->tensors[idx[i]].marked_step == c->step) {
			gs__fail(c, GS_EINVAL,
				"tensor %u is marked ready twice in step %" PRIu64,
				idx[i], c->step);
			goto err_unmark;
		}
		c->tensors[idx[i]].marked_step = c->step;
	}
	return GS_OK;

err_unmark:
	while (i-- > 0)
		c->tensors[idx[i]].marked_step = 0;
	return GS_EINVAL;
}

/* Indices go out as uint64 (the wire's type, so that the daemon can
 * refuse any value out of range instead of reading it truncated). */
static int send_ready(struct gs_client *c, const uint32_t *idx, size_t n, bool absent)
{
	uint64_t small[256];
	uint64_t *wide = n <= 256 ? small : malloc(n * sizeof(*wide));
	if (!wide)
		return gs__fail(c, GS_ENOMEM, "out of memory marking %zu tensors ready", n);
	for (size_t i = 0; i < n; i++)
		wide[i] = idx[i];
	Gradsync__GradientsReady ready = GRADSYNC__GRADIENTS_READY__INIT;
	ready.step = c->step;
	ready.n_tensors = n;
	ready.tensors = wide;
	ready.ready_event = c->ready_event;
	ready.absent = absent;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_GRADIENTS_READY;
	m.gradients_ready = &ready;
	int r = gs__conn_send(c, &m, NULL, 0, GS_SEND_TIMEOUT_MS);
	if (wide != small)
		free(wide);
	return r;
}

/* gs_mark_ready and gs_mark_absent (fn): one GradientsReady per batch. */
static int mark(gs_client *c, const uint32_t *indices, size_t n, bool absent, const char *fn)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "%s: NULL handle", fn);
	gs__doing(c, "step %" PRIu64, c->step);
	int r = check_trainer(c);
	if (r < 0)
		return r;
	/* The daemon may end a step early, aborting it for a peer. */
	if (c->step_state == GS_STEP_DONE && c->result.status == GS_EABORTED)
		return gs__fail(c, GS_EABORTED, "step %" PRIu64 " aborted: %s",
			       c->step, c->step_message);
	if (c->step_state != GS_STEP_RUNNING)
		return gs__fail(c, GS_ESTATE, "%s outside a step: call gs_step_begin first", fn);
	if (n == 0)
		return GS_OK;
	if (!indices)
		return gs__fail(c, GS_EINVAL, "%s: indices is NULL", fn);
	r = check_indices(c, indices, n);
	for (size_t i = 0; absent && r == GS_OK && i < n; i++)
		c->tensors[indices[i]].absent_step = c->step;
	for (size_t off = 0; off < n && r == GS_OK; off += MARK_MAX_INDICES) {
		size_t chunk = n - off < MARK_MAX_INDICES ? n - off : MARK_MAX_INDICES;
		r = send_ready(c, indices + off, chunk, absent);
		/* Part of the batch went: the daemon and we now disagree. */
		if (r < 0 && off > 0)
			gs__end_session(c, r);
	}
	return r;
}

int gs_mark_ready(gs_client *c, const uint32_t *indices, size_t n)
{
	return mark(c, indices, n, false, "gs_mark_ready");
}

int gs_mark_absent(gs_client *c, const uint32_t *indices, size_t n)
{
	return mark(c, indices, n, true, "gs_mark_absent");
}

static bool step_finished(const struct gs_client *c)
{
	return c->step_state != GS_STEP_RUNNING;
}

/* size: the bytes of *out, which callers built against an older header
 * have fewer of (RESULT_SIZE_0). */
static int collect(struct gs_client *c, struct gs_step_result *out, size_t size)
{
	c->step_state = GS_STEP_IDLE;
	if (out)
		memcpy(out, &c->result, size);
	if (c->result.status == GS_EABORTED)
		return gs__fail(c, GS_EABORTED, "step %" PRIu64 " aborted: %s",
			       c->result.step, c->step_message);
	return GS_OK;
}

static int wait_step(struct gs_client *c, int timeout_ms,
		     struct gs_step_result *out, size_t size)
{
	gs__doing(c, "step %" PRIu64, c->step);
	/* A result that arrived before the session ended is still good. */
	if (c->step_state == GS_STEP_DONE)
		return collect(c, out, size);
	int r = check_trainer(c);
	if (r < 0)
		return r;
	if (c->step_state != GS_STEP_RUNNING)
		return gs__fail(c, GS_ESTATE, "no step is in progress");
	r = gs__conn_pump(c, step_finished, timeout_ms);
	return r < 0 ? r : collect(c, out, size);
}

static int step_wait(gs_client *c, int timeout_ms, struct gs_step_result *out, size_t size)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_step_wait: NULL handle");
	return wait_step(c, timeout_ms, out, size);
}

static int step_poll(gs_client *c, struct gs_step_result *out, size_t size)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_step_poll: NULL handle");
	int r = wait_step(c, 0, out, size);
	if (r == GS_ETIMEDOUT)
		return gs__fail(c, GS_EAGAIN, "step %" PRIu64 " is still running",
			       c->step);
	return r;
}

/*
 * gs_step_wait and gs_step_poll in two versions (libgradsync.map): a
 * caller built against a header before grad_norm was bound to GRADSYNC_0
 * and allocated the struct without it, so that version fills the fields
 * up to grad_norm only; GRADSYNC_0.1, the default that new callers bind
 * to, fills the whole struct. The names of the versions themselves are
 * local (the map's "local: *").
 */
#define RESULT_SIZE_0 offsetof(struct gs_step_result, grad_norm)

GS_EXTERN __attribute__((symver("gs_step_wait@GRADSYNC_0"))) int
step_wait_0(gs_client *c, int timeout_ms, struct gs_step_result *out);
GS_EXTERN __attribute__((symver("gs_step_poll@GRADSYNC_0"))) int
step_poll_0(gs_client *c, struct gs_step_result *out);
GS_EXTERN __attribute__((symver("gs_step_wait@@GRADSYNC_0.1"))) int
step_wait_1(gs_client *c, int timeout_ms, struct gs_step_result *out);
GS_EXTERN __attribute__((symver("gs_step_poll@@GRADSYNC_0.1"))) int
step_poll_1(gs_client *c, struct gs_step_result *out);

int step_wait_0(gs_client *c, int timeout_ms, struct gs_step_result *out)
{
	return step_wait(c, timeout_ms, out, RESULT_SIZE_0);
}

int step_poll_0(gs_client *c, struct gs_step_result *out)
{
	return step_poll(c, out, RESULT_SIZE_0);
}

int step_wait_1(gs_client *c, int timeout_ms, struct gs_step_result *out)
{
	return step_wait(c, timeout_ms, out, sizeof(*out));
}

int step_poll_1(gs_client *c, struct gs_step_result *out)
{
	return step_poll(c, out, sizeof(*out));
}

uint32_t gs_buckets_done(const gs_client *c)
{
	return c ? c->buckets_done : 0;
}
