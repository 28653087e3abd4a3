/*
 * The state broadcast: a collective of the job's trainers. Each asks with
 * BroadcastState; once every local trainer has (with the same source and
 * tensors), the worker thread copies the source's bytes, tensor by tensor,
 * into every other local trainer's state, and each trainer is answered
 * with StateBroadcastDone. With several nodes, each node starts once its
 * own trainers have asked (and its group of nodes is ready), and the bytes
 * travel between nodes first (state_nodes.c). A trainer that does not ask
 * within --step-timeout, or one that leaves before the copy begins, fails
 * it for all, named. Once the copy has begun it ends: the trainers'
 * memory stays mapped until it does (the job counts it in flight), so a
 * receiver holds the source's bytes in every tensor even if the source
 * went meanwhile; only a failure between nodes can leave a receiver's
 * tensor partly copied (state_nodes.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine/job.h"
#include "engine/state.h"
#include "engine/state_run.h"
#include "engine/trainer.h"
#include "errors.h"
#include "support/log.h"

static void answer(struct gs_trainer *t, int status, const char *message, uint64_t bytes,
		   uint64_t duration_ns, uint32_t done)
{
	Gradsync__StateBroadcastDone d = GRADSYNC__STATE_BROADCAST_DONE__INIT;
	d.seq = t->state.seq;
	d.status = status;
	d.message = (char *)(message ? message : "");
	d.bytes = bytes;
	d.duration_ns = duration_ns;
	d.tensors_done = done;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STATE_BROADCAST_DONE;
	m.state_broadcast_done = &d;
	t->state.asked = false;
	free(t->state.tensors);
	t->state.tensors = NULL;
	t->state.ntensors = 0;
	gs_trainer_send(t, &m);
}

static void abort_run(struct gs_work *w)
{
	gs_state_nodes_abort((struct state_run *)w);
}

static void abort_done(struct gs_work *w)
{
	struct state_run *run = (struct state_run *)w;
	struct gs_job *j = run->job;
	j->inflight--;
	free(run);
	gs_job_reap(j);
}

/* With several nodes, the others may be waiting for this node in the
 * broadcast's first collective: tell them why it fails. */
static void tell_nodes(struct gs_job *j, int status, const char *why)
{
	if (j->world.nodes < 2 || !j->world.group_ready || !j->env.backend->ops->broadcast_bytes)
		return;
	struct state_run *run = calloc(1, sizeof(*run));
	if (!run)
		return; /* the others' wait ends at its own bound */
	run->work.run = abort_run;
	run->work.done = abort_done;
	run->job = j;
	run->world = j->world;
	run->aborting = true;
	run->status = status;
	snprintf(run->error, sizeof(run->error), "node %u: %s", j->world.node_rank, why);
	j->inflight++;
	gs_worker_submit(j->env.worker, &run->work);
}

/* Every trainer that asked gets status and why; nothing was copied. */
static void fail_all(struct gs_job *j, int status, const char *why)
{
	uv_timer_stop(&j->state.timer);
	gs_warn("job '%s': state broadcast failed: %s", j->id, why);
	tell_nodes(j, status, why);
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
		if (j->slots[r] && j->slots[r]->state.asked)
			answer(j->slots[r], status, why, 0, 0, 0);
}

/* ---- the copy, on the worker ------------------------------------------- */

static uint64_t tensor_bytes(const struct gs_job *j, uint32_t i)
{
	return j->state.layout.counts[i];
}

int gs_state_copy_local(struct state_run *run, uint32_t i, uint32_t from)
{
	struct gs_backend *b = run->job->env.backend;
	const struct gs_trainer *src = run->trainers[from];
	uint64_t n = tensor_bytes(run->job, i);
	for (unsigned r = 0; r < run->local_size; r++) {
		const struct gs_trainer *t = run->trainers[r];
		if (!t || r == from)
			continue;
		int rc = b->ops->copy_bytes(b, t->state.data[i], src->state.data[i], n);
		if (rc != GS_OK) {
			snprintf(run->error, sizeof(run->error),
				 "copying state tensor %u into local rank %u: %.150s", i, r, b->error);
			return rc;
		}
	}
	return GS_OK;
}

static void copy_run(struct gs_work *w)
{
	struct state_run *run = (struct state_run *)w;
	if (run->world.nodes > 1) {
		gs_state_nodes_run(run);
	} else {
		for (size_t k = 0; k < run->ntensors && run->status == GS_OK; k++) {
			run->status = gs_state_copy_local(run, run->tensors[k], run->source);
			if (run->status == GS_OK)
				run->done++;
		}
	}
	run->duration_ns = gs_now_ns() - run->start_ns;
}

static void try_start(struct gs_job *j);
static void on_timeout(uv_timer_t *timer);

/* The group's news of a lost node waits this long for a failed broadcast
 * (as a failed bucket waits, job.c). */
#define HOLD_MS 500

static void finish_copy(struct state_run *run)
{
	struct gs_job *j = run->job;
	j->inflight--;
	j->state.running = false;
	if (run->status != GS_OK && j->state.lost_why[0] && !strstr(run->error, j->state.lost_why)) {
		size_t len = strlen(run->error);
		snprintf(run->error + len, sizeof(run->error) - len, " (%s)", j->state.lost_why);
	}
	if (run->status == GS_OK)
		gs_info("job '%s': state broadcast from global rank %" PRIu64 ": %" PRIu64
			" bytes into each trainer of %u nodes in %.3f ms",
			j->id, run->source_rank, run->bytes, run->world.nodes,
			(double)run->duration_ns / 1e6);
	else
		gs_warn("job '%s': state broadcast failed after %u tensors: %s", j->id, run->done,
			run->error);
	/* The group's collectives broke with every node there: the nodes
	 * build a new one. */
	if (run->group_failed && !j->state.lost_why[0])
		j->env.group.request_regroup(j->env.group.ctx, run->world.generation, run->error);
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		struct gs_trainer *t = run->trainers[r];
		if (t && t->state.asked)
			answer(t, run->status, run->error, run->bytes, run->duration_ns, run->done);
	}
	free(run->tensors);
	free(run);
	/* A trainer that took a leaver's place may have asked meanwhile. */
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		if (j->slots[r] && j->slots[r]->state.asked) {
			uv_timer_start(&j->state.timer, on_timeout,
				       j->env.settings->step_timeout * 1000, 0);
			try_start(j);
			break;
		}
	}
	gs_job_reap(j);
}

static void on_hold(uv_timer_t *timer)
{
	struct gs_job *j = timer->data;
	struct state_run *run = j->state.held;
	j->state.held = NULL;
	if (run)
		finish_copy(run);
}

static void copy_done(struct gs_work *w)
{
	struct state_run *run = (struct state_run *)w;
	struct gs_job *j = run->job;
	if (run->group_failed && !j->state.lost_why[0]) {
		j->state.held = run;
		uv_timer_start(&j->state.timer, on_hold, HOLD_MS, 0);
		return;
	}
	finish_copy(run);
}

void gs_state_peer_lost(struct gs_job *j, const char *why)
{
	snprintf(j->state.lost_why, sizeof(j->state.lost_why), "%s", why);
	struct state_run *run = j->state.held;
	if (!run)
		return;
	uv_timer_stop(&j->state.timer);
	j->state.held = NULL;
	finish_copy(run);
}

/* ---- the collective ----------------------------------------------------- */

/* The asked tensors of t, as indices (all of them when it named none). */
static bool same_request(const struct gs_trainer *a, const struct gs_trainer *b)
{
	return a->state.source == b->state.source && a->state.ntensors == b->state.ntensors &&
	       (a->state.ntensors == 0 ||
		memcmp(a->state.tensors, b->state.tensors,
		       a->state.ntensors * sizeof(*a->state.tensors)) == 0);
}

static int start_copy(struct gs_job *j, const struct gs_trainer *first)
{
	struct state_run *run = calloc(1, sizeof(*run));
	size_t n = first->state.ntensors ? first->state.ntensors : j->state.layout.n;
	uint32_t *idx = run ? calloc(n, sizeof(*idx)) : NULL;
	if (!idx) {
		free(run);
		return GS_ENOMEM;
	}
	for (size_t k = 0; k < n; k++) {
		idx[k] = first->state.ntensors ? first->state.tensors[k] : (uint32_t)k;
		run->bytes += tensor_bytes(j, idx[k]);
	}
	run->work.run = copy_run;
	run->work.done = copy_done;
	run->job = j;
	run->tensors = idx;
	run->ntensors = n;
	run->world = j->world;
	run->source_rank = first->state.source;
	run->local_size = j->env.settings->local_size;
	run->has_source = first->state.source >= j->world.rank_base &&
			  first->state.source - j->world.rank_base < run->local_size;
	run->source = run->has_source ? (uint32_t)(first->state.source - j->world.rank_base) : 0;
	run->start_ns = gs_now_ns();
	j->state.lost_why[0] = '\0';
	for (unsigned r = 0; r < run->local_size; r++)
		run->trainers[r] = j->slots[r];
	uv_timer_stop(&j->state.timer);
	j->state.running = true;
	j->inflight++;
	gs_worker_submit(j->env.worker, &run->work);
	return GS_OK;
}

/* Starts the copy once every local trainer has asked alike. */
static void try_start(struct gs_job *j)
{
	const struct gs_trainer *first = NULL;
	for (unsigned r = 0; r < j->env.settings->local_size; r++) {
		const struct gs_trainer *t = j->slots[r];
		if (!t || !t->state.asked)
			return;
		if (!first) {
			first = t;
		} else if (!same_request(first, t)) {
			char why[200];
			snprintf(why, sizeof(why), "local ranks %u and %u asked for different state broadcasts (source %" PRIu64 " and %" PRIu64 ", or other tensors)",
				 first->rank, t->rank, first->state.source, t->state.source);
			fail_all(j, GS_EINVAL, why);
			return;
		}
	}
	/* With several nodes the copy needs their group: it starts when the
	 * group is ready (gs_state_group_ready), within the same timeout. */
	if (first && j->world.nodes > 1 && !j->world.group_ready)
		return;
	if (first && start_copy(j, first) != GS_OK)
		fail_all(j, GS_ENOMEM, "out of memory starting the state broadcast");
}

/* Names the local ranks that have not asked. */
static void describe_missing(const struct gs_job *j, char *out, size_t n)
{
	size_t len = 0;
	out[0] = '\0';
	for (unsigned r = 0; r < j->env.settings->local_size && len < n; r++) {
		const struct gs_trainer *t = j->slots[r];
		if (t && t->state.asked)
			continue;
		len += (size_t)snprintf(out + len, n - len, "%slocal rank %u%s", len ? ", " : "", r,
					!t ? " (no trainer)" : !t->state.checked ? " (no state registered)" : "");
	}
}

static void on_timeout(uv_timer_t *timer)
{
	struct gs_job *j = timer->data;
	char missing[200], why[400];
	describe_missing(j, missing, sizeof(missing));
	snprintf(why, sizeof(why), "job '%s': state broadcast: %s did not ask for it within %llu s (--step-timeout)",
		 j->id, missing, (unsigned long long)j->env.settings->step_timeout);
	fail_all(j, GS_ETIMEDOUT, why);
}

/* Whether t may ask now; answers it otherwise. */
static bool may_ask(struct gs_trainer *t, const Gradsync__BroadcastState *b)
{
	struct gs_job *j = t->job;
	const struct gs_world *w = &j->world;
	char why[300];
	int code = GS_OK;
	if (t->state.asked) {
		gs_trainer_fail(t, GS_EPROTO, "BroadcastState %" PRIu64 " while its broadcast %" PRIu64 " is unanswered",
				b->seq, t->state.seq);
		return false;
	}
	if (!t->state.checked)
		code = GS_ESTATE, snprintf(why, sizeof(why), "no state is registered on this connection");
	else if (t->in_step)
		code = GS_ESTATE, snprintf(why, sizeof(why), "step %" PRIu64 " is in progress: broadcast the state between steps", t->seq);
	else if (w->nodes > 1 && !j->env.backend->ops->broadcast_bytes)
		code = GS_ESTATE, snprintf(why, sizeof(why), "job '%s' spans %u nodes: the %s backend broadcasts state within a node only",
					   j->id, w->nodes, j->env.backend->name);
	else if (b->source >= gs_job_world_size(j))
		code = GS_EINVAL, snprintf(why, sizeof(why), "source %" PRIu64 " is no trainer of job '%s' (global ranks 0 to %u)",
					   b->source, j->id, gs_job_world_size(j) - 1);
	for (size_t k = 0; code == GS_OK && k < b->n_tensors; k++)
		if (b->tensors[k] >= j->state.layout.n || (k > 0 && b->tensors[k] <= b->tensors[k - 1]))
			code = GS_EINVAL, snprintf(why, sizeof(why), "state tensor index %u is out of range (%u registered) or out of order",
						   b->tensors[k], j->state.layout.n);
	if (code == GS_OK)
		return true;
	t->state.seq = b->seq;
	answer(t, code, why, 0, 0, 0);
	return false;
}

void gs_state_broadcast_ask(struct gs_trainer *t, const Gradsync__BroadcastState *b)
{
	struct gs_job *j = t->job;
	if (!may_ask(t, b))
		return;
	struct gs_trainer_state *st = &t->state;
	if (b->n_tensors) {
		st->tensors = malloc(b->n_tensors * sizeof(*st->tensors));
		if (!st->tensors) {
			gs_trainer_fail(t, GS_ENOMEM, "out of memory asking for a state broadcast");
			return;
		}
		memcpy(st->tensors, b->tensors, b->n_tensors * sizeof(*st->tensors));
	}
	st->ntensors = b->n_tensors;
	st->asked = true;
	st->seq = b->seq;
	st->source = b->source;
	if (!uv_is_active((uv_handle_t *)&j->state.timer) && !j->state.running)
		uv_timer_start(&j->state.timer, on_timeout, j->env.settings->step_timeout * 1000, 0);
	if (!j->state.running)
		try_start(j);
}

void gs_state_trainer_left(struct gs_job *j, struct gs_trainer *t)
{
	if (j->state.running || !uv_is_active((uv_handle_t *)&j->state.timer))
		return;
	char why[300];
	snprintf(why, sizeof(why), "job '%s': trainer local rank %u (pid %d) went away before the state broadcast began; no state was copied",
		 j->id, t->rank, (int)t->pid);
	t->state.asked = false;
	fail_all(j, GS_EABORTED, why);
}

void gs_state_group_ready(struct gs_job *j)
{
	if (!j->state.running && uv_is_active((uv_handle_t *)&j->state.timer))
		try_start(j);
}
