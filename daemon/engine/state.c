/*
 * Registering a trainer's state: RegisterState frames of buffers and
 * tensors, checked as the gradients' are (trainer.c) but of any dtype and
 * counted in bytes, and a state layout that every trainer of the node
 * shares. See state.h.
 */
#include "engine/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/job.h"
#include "engine/trainer.h"
#include "errors.h"
#include "support/log.h"

/* ---- tensors ----------------------------------------------------------- */

static bool known_dtype(Gradsync__Dtype d)
{
	return strcmp(gs_dtype_name(d), "unspecified") != 0;
}

static int check_tensor(struct gs_trainer *t, const Gradsync__StateTensor *ts)
{
	const struct gs_settings *s = t->job->env.settings;
	const struct gs_trainer_state *st = &t->state;
	uint32_t index = st->layout.n;
	const char *name = ts->name ? ts->name : "";
	const char *fail = NULL;
	int code = GS_EINVAL;
	char why[400];
	if (name[0] == '\0' || strlen(name) > GS_MAX_NAME)
		snprintf(why, sizeof(why), "state tensor %u: name must have 1 to %d bytes", index,
			 GS_MAX_NAME), fail = why;
	else if (gs_name_has_control_char(name))
		snprintf(why, sizeof(why), "state tensor %u: name holds a control character", index),
			fail = why;
	else if (!known_dtype(ts->dtype))
		snprintf(why, sizeof(why), "state tensor '%s' has no known dtype (%d)", name,
			 (int)ts->dtype), fail = why;
	else if (ts->bytes == 0)
		snprintf(why, sizeof(why), "state tensor '%s' has no bytes", name), fail = why;
	else if (index >= s->max_tensors)
		snprintf(why, sizeof(why), "more than %llu state tensors (--max-tensors)",
			 (unsigned long long)s->max_tensors), fail = why, code = GS_ELIMIT;
	else if (ts->bytes > s->max_bytes - st->bytes)
		snprintf(why, sizeof(why), "state tensor '%s' (%llu bytes) passes the limit of %llu registered state bytes (--max-bytes)",
			 name, (unsigned long long)ts->bytes, (unsigned long long)s->max_bytes),
			fail = why, code = GS_ELIMIT;
	else if (ts->buffer >= st->nbuffers)
		snprintf(why, sizeof(why), "state tensor '%s' names buffer %llu; only %u registered",
			 name, (unsigned long long)ts->buffer, st->nbuffers), fail = why;
	else if (ts->offset > st->buffers[ts->buffer].size ||
		 ts->bytes > st->buffers[ts->buffer].size - ts->offset)
		snprintf(why, sizeof(why), "state tensor '%s' (%llu bytes at offset %llu) does not fit in buffer %llu of %llu bytes",
			 name, (unsigned long long)ts->bytes, (unsigned long long)ts->offset,
			 (unsigned long long)ts->buffer,
			 (unsigned long long)st->buffers[ts->buffer].size), fail = why;
	if (!fail)
		return 0;
	gs_trainer_fail(t, code, "%s", fail);
	return -1;
}

static int add_tensor(struct gs_trainer_state *st, const Gradsync__StateTensor *ts)
{
	uint32_t i = st->layout.n;
	char name[GS_MAX_NAME + 32];
	snprintf(name, sizeof(name), "%s (%s)", ts->name, gs_dtype_name(ts->dtype));
	if (gs_layout_add(&st->layout, name, ts->bytes) < 0)
		return -1;
	if ((i & (i - 1)) == 0) { /* grow the side arrays at powers of two */
		size_t cap = i ? 2 * (size_t)i : 1;
		uint32_t *tb = realloc(st->tensor_buffer, cap * sizeof(*tb));
		if (tb)
			st->tensor_buffer = tb;
		uint64_t *to = realloc(st->tensor_offset, cap * sizeof(*to));
		if (to)
			st->tensor_offset = to;
		if (!tb || !to)
			return -1;
	}
	st->tensor_buffer[i] = (uint32_t)ts->buffer;
	st->tensor_offset[i] = ts->offset;
	st->bytes += ts->bytes;
	return 0;
}

/* ---- the job's state layout ------------------------------------------- */

/* The first trainer's layout becomes the job's; the others must match. */
static int adopt_layout(struct gs_job *j, struct gs_trainer *t, char *why, size_t n)
{
	struct gs_job_state *js = &j->state;
	if (js->has_layout) {
		char mine[32], owner[32], diff[384];
		snprintf(mine, sizeof(mine), "local rank %u", t->rank);
		snprintf(owner, sizeof(owner), "local rank %u", js->layout_rank);
		if (gs_layout_compare(&t->state.layout, mine, &js->layout, owner, diff, sizeof(diff))) {
			snprintf(why, n, "state layout differs from the job's: %s", diff);
			return GS_ELAYOUT;
		}
		return GS_OK;
	}
	if (gs_layout_copy(&js->layout, &t->state.layout) < 0) {
		snprintf(why, n, "out of memory keeping the state layout");
		return GS_ENOMEM;
	}
	js->has_layout = true;
	js->layout_rank = t->rank;
	js->layout_hash = gs_layout_hash(&js->layout);
	return GS_OK;
}

static void send_registered(struct gs_trainer *t)
{
	t->state.checked = true;
	Gradsync__StateRegistered reg = GRADSYNC__STATE_REGISTERED__INIT;
	reg.tensors = t->state.layout.n;
	reg.bytes = t->state.bytes;
	reg.layout_hash = t->job->state.layout_hash;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STATE_REGISTERED;
	m.state_registered = &reg;
	gs_trainer_send(t, &m);
}

/* The whole state is here: resolve pointers, check it against the job. */
static void finish(struct gs_trainer *t)
{
	struct gs_trainer_state *st = &t->state;
	uint32_t n = st->layout.n, a, b;
	if (n == 0) {
		gs_trainer_fail(t, GS_EINVAL, "state registration lists no tensors");
		return;
	}
	if (gs_layout_find_duplicate(&st->layout, &a, &b) == 1) {
		gs_trainer_fail(t, GS_EINVAL, "state tensor '%s' appears twice (tensors %u and %u)",
				st->layout.names[a], a, b);
		return;
	}
	st->data = calloc(n, sizeof(*st->data));
	if (!st->data) {
		gs_trainer_fail(t, GS_ENOMEM, "out of memory registering %u state tensors", n);
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		st->data[i] = (char *)st->buffers[st->tensor_buffer[i]].addr + st->tensor_offset[i];
	char why[512];
	int err = adopt_layout(t->job, t, why, sizeof(why));
	if (err != GS_OK) {
		gs_trainer_fail(t, err, "%s", why);
		return;
	}
	gs_info("trainer %s registered a state of %u tensors (%llu bytes) in %u buffers",
		t->client.ops->name(t->client.ctx), n, (unsigned long long)st->bytes, st->nbuffers);
	send_registered(t);
}

void gs_state_register(struct gs_trainer *t, const Gradsync__RegisterState *r)
{
	struct gs_trainer_state *st = &t->state;
	if (st->checked) {
		gs_trainer_fail(t, GS_ESTATE, "state is already registered on this connection");
		return;
	}
	if (!t->job->env.backend->ops->copy_bytes) {
		gs_trainer_fail(t, GS_ESTATE, "the %s backend cannot hold a trainer's state",
				t->job->env.backend->name);
		return;
	}
	/* Events would replace the gradients' (the backend keeps one pair
	 * per trainer): a state is memory only. */
	for (size_t i = 0; i < r->n_buffers; i++) {
		if (r->buffers[i]->cuda_ready_event.len || r->buffers[i]->cuda_done_event.len) {
			gs_trainer_fail(t, GS_EINVAL, "RegisterState buffer %zu carries CUDA events; a state's buffers hold memory only",
					st->nbuffers + i);
			return;
		}
	}
	if (gs_trainer_import_buffers(t, "RegisterState", r->buffers, r->n_buffers, &st->buffers,
				      &st->nbuffers) < 0)
		return;
	for (size_t i = 0; i < r->n_tensors; i++) {
		if (check_tensor(t, r->tensors[i]) < 0)
			return;
		if (add_tensor(st, r->tensors[i]) < 0) {
			gs_trainer_fail(t, GS_ENOMEM, "out of memory registering state tensors");
			return;
		}
	}
	if (r->last)
		finish(t);
}
