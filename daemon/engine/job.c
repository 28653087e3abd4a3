#include "engine/job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine/job_view.h"
#include "engine/ownership.h"
#include "engine/reduce.h"
#include "engine/state_events.h"
#include "engine/trainer.h"
#include "errors.h"
#include "escape.h"
#include "job_id.h"
#include "support/log.h"

static void on_reap_timer(uv_timer_t *timer)
{
	gs_job_reap(timer->data);
}

void gs_job_init(struct gs_job *j, const struct gs_engine_env *env)
{
	memset(j, 0, sizeof(*j));
	j->env = *env;
	j->id = env->settings->job_id;
	j->owner = env->settings->owner;
	uv_timer_init(env->loop, &j->stall_timer);
	j->stall_timer.data = j;
	uv_timer_init(env->loop, &j->failure_timer);
	j->failure_timer.data = j;
	uv_timer_init(env->loop, &j->reap_timer);
	j->reap_timer.data = j;
	uv_timer_init(env->loop, &j->state.timer);
	j->state.timer.data = j;
}

void gs_job_set_world(struct gs_job *j, const struct gs_world *w)
{
	double pre, post;
	j->world = *w;
	gs_settings_scales(j->env.settings, gs_job_world_size(j), &pre, &post);
	j->prescale = (float)pre;
	j->postscale = (float)post;
	if (w->group_ready)
		gs_state_group_ready(j);
}

static void clear_layout(struct gs_job *j)
{
	if (j->has_layout && j->world.nodes > 1)
		j->env.group.withdraw_layout(j->env.group.ctx);
	gs_layout_free(&j->layout);
	gs_plan_free(&j->plan);
	free(j->bucket_marks);
	j->bucket_marks = NULL;
	free(j->produced);
	j->produced = NULL;
	free(j->unproduced);
	j->unproduced = NULL;
	j->nunproduced = 0;
	j->has_layout = false;
	j->agreed = false;
	j->layout_hash = 0;
	memset(j->departed, 0, sizeof(j->departed));
}

/* The job's state layout (engine/state.c), fixed by its first trainer
 * that registers a state: the next job's may differ. */
static void clear_state_layout(struct gs_job *j)
{
	gs_layout_free(&j->state.layout);
	j->state.has_layout = false;
	j->state.layout_hash = 0;
}

void gs_job_destroy(struct gs_job *j)
{
	j->env.idle = NULL; /* nobody is left to tell */
	gs_job_reap(j);
	clear_layout(j);
	clear_state_layout(j);
}

void gs_job_close(struct gs_job *j)
{
	uv_close((uv_handle_t *)&j->stall_timer, NULL);
	uv_close((uv_handle_t *)&j->failure_timer, NULL);
	uv_close((uv_handle_t *)&j->reap_timer, NULL);
	uv_close((uv_handle_t *)&j->state.timer, NULL);
}

uint32_t gs_job_world_size(const struct gs_job *j)
{
	return j->world.world_size;
}

const char *const gs_job_state_names[GS_JOB_STATES] = {
	[GS_JOB_IDLE] = "idle",
	[GS_JOB_REGISTERING] = "registering",
	[GS_JOB_WAITING_FOR_TRAINERS] = "waiting for trainers",
	[GS_JOB_AGREEING] = "agreeing on the layout", /* with the other nodes */
	[GS_JOB_READY] = "ready",
	[GS_JOB_IN_STEP] = "in step",
	[GS_JOB_ABORTING] = "aborting step",
};

static enum gs_job_states state_of(const struct gs_job *j)
{
	if (j->aborting)
		return GS_JOB_ABORTING;
	if (j->in_step)
		return GS_JOB_IN_STEP;
	if (j->attached == 0)
		return GS_JOB_IDLE;
	if (j->has_layout && !j->agreed)
		return GS_JOB_AGREEING;
	if (j->attached < j->env.settings->local_size)
		return GS_JOB_WAITING_FOR_TRAINERS;
	return j->has_layout ? GS_JOB_READY : GS_JOB_REGISTERING;
}

const char *gs_job_state(const struct gs_job *j)
{
	return gs_job_state_names[state_of(j)];
}

bool gs_job_active(const struct gs_job *j)
{
	return j->attached > 0 || j->has_layout || j->in_step;
}

bool gs_job_visible_to(const struct gs_job *j, uid_t uid, bool privileged)
{
	return privileged || gs_owner_admits(j->owner, j->env.settings->job_access, uid);
}

struct gs_trainer *gs_job_attach(struct gs_job *j, const struct gs_client *c,
				 const Gradsync__Hello *h)
{
	uint32_t size = j->env.settings->local_size;
	const char *id = h->job_id ? h->job_id : "";
	uid_t uid = c->uid;
	if (!gs_job_id_valid(id)) {
		gs_client_fail(c, GS_EINVAL, "job id must be at most %d printable ASCII characters",
			       GS_JOB_ID_MAX);
		return NULL;
	}
	/* Ownership first: another user's trainer learns nothing of the job,
	 * not even whether its view of it is right. */
	if (!gs_owner_admits(j->owner, j->env.settings->job_access, uid)) {
		gs_client_fail(c, GS_EREFUSED, "job '%s' belongs to another user: uid %u may not join it or learn about it (--job-access); use another job id",
			     id, (unsigned)uid);
		return NULL;
	}
	char why[GS_COORDINATOR_MAX * 2 + 160];
	if (gs_job_view_differs(j->env.settings, id, h, why, sizeof(why))) {
		gs_client_fail(c, GS_EREFUSED, "%s", why);
		return NULL;
	}
	if (h->local_rank >= size) {
		gs_client_fail(c, GS_EREFUSED, "job '%s': local rank %llu is out of range for the job's local size %u",
			     j->id, (unsigned long long)h->local_rank, size);
		return NULL;
	}
	struct gs_trainer *holder = j->slots[h->local_rank];
	if (holder) {
		/* Most often two jobs on one id: torchrun's is "none" unless
		 * --rdzv-id gives one. */
		gs_client_fail(c, GS_EREFUSED, "job '%s': local rank %llu is already taken by pid %d; if this trainer belongs to another job, give each job its own id (torchrun --rdzv-id, or GRADSYNC_JOB_ID)",
			     j->id, (unsigned long long)h->local_rank, (int)holder->pid);
		return NULL;
	}
	struct gs_trainer *t = gs_trainer_create(j, c, (uint32_t)h->local_rank);
	if (!t) {
		gs_client_fail(c, GS_ENOMEM, "out of memory accepting a trainer");
		return NULL;
	}
	j->slots[h->local_rank] = t;
	j->departed[h->local_rank].gone = false;
	j->attached++;
	gs_info("trainer pid %d uid %u joined job '%s' as local rank %u (%u of %u)",
		(int)t->pid, (unsigned)t->uid, j->id, t->rank, j->attached, size);
	return t;
}

/* ---- Ending a step ---------------------------------------------------- */

static void send_step_done(struct gs_job *j, struct gs_trainer *t, bool ok,
			   uint64_t duration, uint32_t buckets_done)
{
	/* Buckets complete in plan order: the first buckets_done are whole. */
	uint32_t ncompleted = 0;
	uint32_t *completed = NULL;
	if (!ok && buckets_done > 0) {
		const struct gs_bucket *last = &j->plan.buckets[buckets_done - 1];
		ncompleted = last->first + last->count;
		completed = j->plan.members;
	}
	Gradsync__StepStats stats = GRADSYNC__STEP_STATS__INIT;
	stats.buckets = buckets_done;
	stats.wire_bytes = j->step_wire_bytes;
	stats.clipped = t->clipped;
	stats.nonfinite = j->step_nonfinite;
	stats.duration_ns = duration;
	stats.grad_norm = ok ? sqrt(j->step_sumsq) : NAN;
	Gradsync__StepDone done = GRADSYNC__STEP_DONE__INIT;
	done.step = t->seq;
	done.status = ok ? GRADSYNC__STEP_STATUS__STEP_OK : GRADSYNC__STEP_STATUS__STEP_ABORTED;
	done.stats = &stats;
	done.message = ok ? "" : j->abort_reason;
	done.n_completed_tensors = ncompleted;
	done.completed_tensors = completed;
	/* Listed for the buckets that finished this step (finish_step). */
	if (ok || buckets_done > 0) {
		done.n_unproduced_tensors = j->nunproduced;
		done.unproduced_tensors = j->unproduced;
	}
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STEP_DONE;
	m.step_done = &done;
	gs_trainer_send(t, &m);
}

/* The tensors of the step's finished buckets that no trainer of the job
 * produced: the buckets' runs left the nodes' verdict in j->produced. */
static void collect_unproduced(struct gs_job *j, uint32_t buckets_done)
{
	const struct gs_plan *p = &j->plan;
	uint32_t members = 0;
	if (buckets_done > 0)
		members = p->buckets[buckets_done - 1].first + p->buckets[buckets_done - 1].count;
	j->nunproduced = 0;
	for (uint32_t m = 0; m < members; m++)
		if (!j->produced[p->members[m]])
			j->unproduced[j->nunproduced++] = p->members[m];
}

static void finish_step(struct gs_job *j)
{
	struct gs_stats *st = &j->stats;
	bool ok = !j->aborting;
	uint64_t duration = j->step_start_ns ? gs_now_ns() - j->step_start_ns : 0;
	collect_unproduced(j, j->buckets_done);
	/* A registered trainer that had not begun the aborted step gets its
	 * abort when it does begin it: it must not start a step of its own
	 * that the others, a step ahead, would never join. */
	for (unsigned r = 0; !ok && r < GS_MAX_LOCAL; r++) {
		struct gs_trainer *t = j->slots[r];
		if (t && t->registered && !t->in_step)
			t->owes_abort = true;
	}
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		struct gs_trainer *t = j->slots[r];
		if (!t || !t->in_step)
			continue;
		send_step_done(j, t, ok, duration, j->buckets_done);
		st->elements_clipped += t->clipped;
		t->in_step = false;
		t->clipped = 0;
		if (ok)
			t->steps++;
		else
			t->aborted_seq = t->seq;
	}
	uv_timer_stop(&j->stall_timer);
	if (ok) {
		gs_stats_record_step(st, duration);
		st->last_step_end_ns = gs_now_ns();
		st->bytes_reduced += j->step_wire_bytes;
		st->nonfinite += j->step_nonfinite;
	} else {
		st->steps_aborted++;
	}
	j->in_step = false;
	j->aborting = false;
	j->next_launch = 0;
	j->buckets_done = 0;
	memset(j->bucket_marks, 0, j->plan.nbuckets * sizeof(*j->bucket_marks));
}

static void try_finish(struct gs_job *j)
{
	if (!j->in_step || j->inflight > 0)
		return;
	if (j->aborting || j->buckets_done == j->plan.nbuckets)
		finish_step(j);
}

static void abort_step(struct gs_job *j, const char *why, int reason, uint32_t rank)
{
	if (!j->in_step || j->aborting)
		return;
	j->aborting = true;
	/* Escaped as an Error is: it goes to every trainer of the job, and
	 * may name what a trainer or another node sent (a tensor's name). */
	gs_escape(why, j->abort_reason, sizeof(j->abort_reason));
	gs_warn("job '%s': step %llu aborted: %s", j->id, (unsigned long long)j->step_number, why);
	/* The other nodes wait in the next bucket's collective: take part in
	 * it with a vote to abort, so that they end the step at the same bucket
	 * instead of at a timeout. */
	if (reason && j->world.nodes > 1 && j->next_launch < j->plan.nbuckets) {
		struct gs_bucket_run *run = gs_bucket_run_create_abort(j, j->next_launch, reason, rank);
		if (run) {
			j->next_launch++;
			j->inflight++;
			gs_worker_submit(j->env.worker, &run->work);
		}
	}
	try_finish(j);
}

/* ---- Trainers leaving ------------------------------------------------- */

void gs_job_reap(struct gs_job *j)
{
	if (j->inflight > 0)
		return;
	while (j->retired) {
		struct gs_trainer *t = j->retired;
		j->retired = t->next_retired;
		gs_trainer_destroy(t);
	}
	/* The last trainer is gone: the next one may start another job. */
	if (j->attached == 0 && !j->in_step && j->has_layout) {
		gs_info("job '%s' ended: every trainer has left", j->id);
		clear_layout(j);
	}
	if (j->attached == 0 && j->state.has_layout)
		clear_state_layout(j);
	if (!gs_job_active(j) && j->env.idle)
		j->env.idle(j->env.idle_arg);
}

/* A registered trainer is gone and none has taken its place: the step in
 * progress cannot complete, so it ends now rather than at --step-timeout,
 * naming the trainer. */
static void abort_for_departed(struct gs_job *j)
{
	if (!j->in_step || j->aborting)
		return;
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		const struct gs_departure *g = &j->departed[r];
		if (!g->gone || j->slots[r])
			continue;
		char why[200];
		snprintf(why, sizeof(why), "trainer local rank %u (pid %d) of node %u went away after its step %llu; no step can complete until a trainer takes its place",
			 r, (int)g->pid, j->world.node_rank, (unsigned long long)g->last_step);
		abort_step(j, why, GS_ABORT_TRAINER_GONE, r);
		return;
	}
}

void gs_job_detach(struct gs_job *j, struct gs_trainer *t)
{
	if (j->slots[t->rank] == t) {
		j->slots[t->rank] = NULL;
		j->attached--;
		if (t->registered)
			j->departed[t->rank] = (struct gs_departure){ true, t->pid, t->seq };
	}
	gs_info("trainer pid %d (local rank %u) left job '%s'", (int)t->pid,
		t->rank, j->id);
	/* Once every bucket has launched, the step can still finish: the
	 * buckets read the trainer's memory, which stays mapped until then. */
	if (j->in_step && t->in_step && j->next_launch < j->plan.nbuckets) {
		char why[200];
		snprintf(why, sizeof(why), "trainer local rank %u (pid %d) of node %u went away during step %llu",
			 t->rank, (int)t->pid, j->world.node_rank, (unsigned long long)j->step_number);
		abort_step(j, why, GS_ABORT_TRAINER_GONE, t->rank);
	} else if (!t->in_step) {
		abort_for_departed(j);
	}
	t->next_retired = j->retired;
	j->retired = t;
	/* Freed from the loop once no bucket reads its memory; never inside
	 * the callback that found it gone. */
	uv_timer_start(&j->reap_timer, on_reap_timer, 0, 0);
}

/* ---- Layout ------------------------------------------------------------ */

/* The backend's fusion buffers, sized by the new plan within the node's
 * budget: no bucket runs while the job has no layout. */
static int size_buffers(struct gs_job *j, char *why, size_t n)
{
	struct gs_backend *b = j->env.backend;
	char err[300];
	if (!b->ops->size_buffers)
		return GS_OK;
	int rc = b->ops->size_buffers(b, &j->plan, err, sizeof(err));
	if (rc != GS_OK)
		snprintf(why, n, "job '%s': %s", j->id, err);
	return rc;
}

int gs_job_adopt_layout(struct gs_job *j, struct gs_trainer *t, char *why, size_t n)
{
	if (j->has_layout) {
		char mine[32], owner[32], diff[384];
		snprintf(mine, sizeof(mine), "local rank %u", t->rank);
		snprintf(owner, sizeof(owner), "local rank %u", j->layout_rank);
		if (gs_layout_compare(&t->layout, mine, &j->layout, owner, diff, sizeof(diff))) {
			snprintf(why, n, "layout differs from the job's: %s", diff);
			return GS_ELAYOUT;
		}
		return GS_OK;
	}
	if (gs_layout_copy(&j->layout, &t->layout) < 0 ||
	    gs_plan_build(j->layout.counts, j->layout.n, j->env.settings->threshold, &j->plan) < 0 ||
	    !(j->bucket_marks = calloc(j->plan.nbuckets, sizeof(*j->bucket_marks))) ||
	    !(j->produced = calloc(j->layout.n ? j->layout.n : 1, sizeof(*j->produced))) ||
	    !(j->unproduced = calloc(j->layout.n ? j->layout.n : 1, sizeof(*j->unproduced)))) {
		clear_layout(j);
		snprintf(why, n, "out of memory building the bucket plan");
		return GS_ENOMEM;
	}
	int rc = size_buffers(j, why, n);
	if (rc != GS_OK) {
		clear_layout(j);
		return rc;
	}
	j->has_layout = true;
	j->layout_rank = t->rank;
	j->layout_hash = gs_layout_hash(&j->layout);
	j->agreed = j->world.nodes == 1;
	if (!j->agreed) {
		j->layout_round++;
		if (j->env.group.agree_layout(j->env.group.ctx, j->layout_round, &j->layout,
					      j->layout_hash) != GS_OK) {
			clear_layout(j);
			snprintf(why, n, "the connection to the other nodes is gone");
			return GS_EDISCONNECTED;
		}
	}
	gs_info("job '%s': %u tensors in %u buckets (threshold %llu, largest bucket %llu elements), fusion buffers of %llu bytes, layout hash %016llx",
		j->id, j->layout.n, j->plan.nbuckets,
		(unsigned long long)j->env.settings->threshold,
		(unsigned long long)j->plan.largest_bucket,
		(unsigned long long)j->env.backend->fusion_bytes,
		(unsigned long long)j->layout_hash);
	return GS_OK;
}

void gs_job_layout_verdict(struct gs_job *j, uint64_t round, int rc, const char *why)
{
	if (rc == GS_OK && round == j->layout_round && j->has_layout) {
		j->agreed = true;
		for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
			if (j->slots[r] && j->slots[r]->layout_checked && !j->slots[r]->registered)
				gs_trainer_send_registered(j->slots[r]);
	} else {
		gs_warn("job '%s': the nodes do not agree on the layout: %s", j->id, why);
		/* Every trainer of this node that registered it goes. */
		for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
			if (j->slots[r] && j->slots[r]->layout_checked)
				gs_trainer_fail(j->slots[r], rc, "%s", why);
		/* Trainers that come later start a new round. */
		if (j->inflight == 0)
			clear_layout(j);
	}
	gs_job_reap(j);
}

/* ---- A step that waits too long ------------------------------------------ */

/* Appends to out what the next bucket waits for, rank by rank. */
static void describe_missing(const struct gs_job *j, char *out, size_t n)
{
	size_t k = 0;
	uint32_t b = j->next_launch;
	out[0] = '\0';
	if (b >= j->plan.nbuckets) {
		snprintf(out, n, "every bucket has launched; the last is still being reduced");
		return;
	}
	const struct gs_bucket *bk = &j->plan.buckets[b];
	for (unsigned r = 0; r < j->env.settings->local_size && k + 1 < n; r++) {
		const struct gs_trainer *t = j->slots[r];
		const char *sep = k ? "; " : "";
		if (!t) {
			k += (size_t)snprintf(out + k, n - k, "%slocal rank %u is not connected", sep, r);
			continue;
		}
		if (!t->in_step) {
			k += (size_t)snprintf(out + k, n - k, "%slocal rank %u (pid %d) has not begun the step",
					      sep, r, (int)t->pid);
			continue;
		}
		unsigned missing = 0;
		for (uint32_t m = 0; m < bk->count; m++) {
			uint32_t idx = j->plan.members[bk->first + m];
			if (t->marked[idx] == j->step)
				continue;
			if (missing == 0)
				k += (size_t)snprintf(out + k, n - k, "%slocal rank %u (pid %d) did not mark",
						      sep, r, (int)t->pid);
			if (missing < 3 && k < n)
				k += (size_t)snprintf(out + k, n - k, "%s '%s'", missing ? "," : "",
						      t->layout.names[idx]);
			missing++;
		}
		if (missing > 3 && k < n)
			k += (size_t)snprintf(out + k, n - k, " and %u more", missing - 3);
		if (missing > 0 && k < n)
			k += (size_t)snprintf(out + k, n - k, " of bucket %u", b);
	}
	if (k == 0 && !j->world.group_ready)
		snprintf(out, n, "every trainer here is ready, but a node went away and the group of nodes is not whole again");
}

/* The stall timer first fires at the warning, or at the timeout when that
 * comes first (a --step-timeout below --stall-warning has no warning). */
static uint64_t first_stall_ms(const struct gs_settings *s)
{
	uint64_t first = s->stall_warning < s->step_timeout ? s->stall_warning : s->step_timeout;
	return first * 1000;
}

static void on_stall(uv_timer_t *timer)
{
	struct gs_job *j = timer->data;
	const struct gs_settings *s = j->env.settings;
	char missing[512], why[700];
	describe_missing(j, missing, sizeof(missing));
	if (!j->stall_warned && s->stall_warning < s->step_timeout) {
		j->stall_warned = true;
		gs_warn("job '%s': step %llu has waited %llu s: %s", j->id, (unsigned long long)j->step_number,
			(unsigned long long)s->stall_warning, missing);
		uv_timer_start(timer, on_stall, (s->step_timeout - s->stall_warning) * 1000, 0);
		return;
	}
	if (j->next_launch >= j->plan.nbuckets)
		return; /* in the collectives: --peer-timeout bounds those */
	snprintf(why, sizeof(why), "step %llu timed out after %llu s (--step-timeout) on node %u: %s",
		 (unsigned long long)j->step_number, (unsigned long long)s->step_timeout,
		 j->world.node_rank, missing);
	abort_step(j, why, GS_ABORT_TIMEOUT, 0);
}

/* ---- The step ---------------------------------------------------------- */

void gs_job_begin_step(struct gs_trainer *t, const Gradsync__BeginStep *b)
{
	struct gs_job *j = t->job;
	if (!t->registered) {
		gs_trainer_fail(t, GS_ESTATE, "BeginStep before the tensors are registered");
		return;
	}
	if (t->in_step) {
		gs_trainer_fail(t, GS_ESTATE, "BeginStep for step %llu while step %llu is in progress",
			     (unsigned long long)b->step, (unsigned long long)t->seq);
		return;
	}
	if (b->step != t->seq + 1) {
		gs_trainer_fail(t, GS_EPROTO, "BeginStep numbers step %llu; expected %llu",
			     (unsigned long long)b->step, (unsigned long long)t->seq + 1);
		return;
	}
	if (b->clipping && !(b->clip_value > 0 && isfinite(b->clip_value))) {
		gs_trainer_fail(t, GS_EINVAL, "clip value %g must be positive and finite",
			     (double)b->clip_value);
		return;
	}
	t->seq = b->step;
	if (t->owes_abort) {
		/* Nothing of this step was reduced: its buffers are its own. */
		t->owes_abort = false;
		t->aborted_seq = t->seq;
		send_step_done(j, t, false, 0, 0);
		return;
	}
	t->in_step = true;
	t->clipped = 0;
	t->bucket_events = b->bucket_events;
	t->pack = (struct gs_pack_params){ j->prescale, b->clipping, b->clip_value };
	if (!j->in_step) {
		j->in_step = true;
		j->step++;
		j->step_number = t->seq;
		j->step_start_ns = 0;
		j->step_nonfinite = 0;
		j->step_sumsq = 0;
		j->step_wire_bytes = 0;
		j->stall_warned = false;
		memset(j->produced, 0, j->layout.n * sizeof(*j->produced));
		uv_timer_start(&j->stall_timer, on_stall, first_stall_ms(j->env.settings), 0);
	}
	abort_for_departed(j);
}

static void launch_ready(struct gs_job *j)
{
	uint32_t size = j->env.settings->local_size;
	/* A node is gone: buckets wait until the group is whole again (or the
	 * step times out), rather than fail one after another. */
	if (!j->world.group_ready)
		return;
	/* The buckets that are ready together go to the worker as one chain,
	 * in plan order: one wake-up for them all, and the worker has them
	 * all before it runs the first. */
	struct gs_work *first = NULL, **link = &first;
	unsigned n = 0;
	while (!j->aborting && j->next_launch < j->plan.nbuckets) {
		uint32_t b = j->next_launch;
		if (j->bucket_marks[b] < size * j->plan.buckets[b].count)
			break;
		struct gs_bucket_run *run = gs_bucket_run_create(j, b);
		if (!run) {
			/* The abort's vote takes the next bucket: the chain
			 * before it goes first. */
			gs_worker_submit_chain(j->env.worker, first, n);
			abort_step(j, "out of memory launching a bucket", GS_ABORT_OTHER, 0);
			return;
		}
		j->next_launch++;
		j->inflight++;
		*link = &run->work;
		link = &run->work.next;
		n++;
	}
	gs_worker_submit_chain(j->env.worker, first, n);
}

void gs_job_regrouping(struct gs_job *j)
{
	j->world.group_ready = false;
}

void gs_job_resume(struct gs_job *j, uint64_t generation)
{
	j->world.generation = generation;
	j->world.group_ready = true;
	if (j->in_step)
		launch_ready(j);
	gs_state_group_ready(j);
}

/* A node went away: the step in progress cannot finish. A bucket whose
 * collective failed just before this news is held a moment for it (see
 * gs_job_bucket_finished), so that the step names the node. */
void gs_job_peer_lost(struct gs_job *j, const char *why)
{
	j->world.group_ready = false;
	gs_state_peer_lost(j, why);
	if (j->holding_failure) {
		uv_timer_stop(&j->failure_timer);
		j->holding_failure = false;
		j->inflight--;
		if (j->failure_renames)
			j->aborting = false;
		abort_step(j, why, 0, 0);
		try_finish(j);
		gs_job_reap(j);
		return;
	}
	abort_step(j, why, 0, 0);
}

/* No node went away: the collective failed with every node there (one
 * stalled past --peer-timeout, the network broke). The group is broken
 * for good on this node, so the nodes build a new one. */
static void on_failure_timer(uv_timer_t *timer)
{
	struct gs_job *j = timer->data;
	if (!j->holding_failure)
		return;
	/* The group is down from now on, if it is still the one that failed. */
	if (j->world.group_ready && j->world.generation == j->failure_generation)
		j->world.group_ready = false;
	j->env.group.request_regroup(j->env.group.ctx, j->failure_generation, j->failure_why);
	j->holding_failure = false;
	j->inflight--;
	try_finish(j);
	gs_job_reap(j);
}

void gs_job_mark_ready(struct gs_trainer *t, const Gradsync__GradientsReady *r)
{
	struct gs_job *j = t->job;
	/* Marks already on their way when the daemon aborted the step. */
	if (!t->in_step && r->step == t->seq && t->aborted_seq == t->seq)
		return;
	if (!t->in_step) {
		gs_trainer_fail(t, GS_ESTATE, "GradientsReady outside a step (BeginStep first)");
		return;
	}
	if (r->step != t->seq) {
		gs_trainer_fail(t, GS_EPROTO, "GradientsReady for step %llu during step %llu",
			     (unsigned long long)r->step, (unsigned long long)t->seq);
		return;
	}
	if (!t->bucket_event)
		t->bucket_event = calloc(j->plan.nbuckets ? j->plan.nbuckets : 1,
					 sizeof(*t->bucket_event));
	if (!t->bucket_event) {
		gs_trainer_fail(t, GS_ENOMEM, "out of memory noting ready events");
		return;
	}
	if (r->ready_event > UINT32_MAX) {
		gs_trainer_fail(t, GS_EINVAL, "GradientsReady names ready event %llu; events are numbered below 2^32",
			     (unsigned long long)r->ready_event);
		return;
	}
	for (size_t i = 0; i < r->n_tensors; i++) {
		if (r->tensors[i] >= t->layout.n) {
			gs_trainer_fail(t, GS_EINVAL, "GradientsReady names tensor %llu; %u are registered",
				     (unsigned long long)r->tensors[i], t->layout.n);
			return;
		}
		uint32_t idx = (uint32_t)r->tensors[i];
		if (t->marked[idx] == j->step) {
			gs_trainer_fail(t, GS_EPROTO, "tensor '%s' marked ready twice in one step",
				     t->layout.names[idx]);
			return;
		}
		t->marked[idx] = j->step;
		if (!r->absent)
			j->produced[idx] = 1;
		j->bucket_marks[j->plan.bucket_of[idx]]++;
		t->bucket_event[j->plan.bucket_of[idx]] = (uint32_t)r->ready_event;
	}
	if (j->step_start_ns == 0)
		j->step_start_ns = gs_now_ns();
	launch_ready(j);
}

static void send_bucket_done(struct gs_job *j, const struct gs_bucket_run *run)
{
	const struct gs_bucket *bk = &j->plan.buckets[run->bucket];
	Gradsync__BucketDone done = GRADSYNC__BUCKET_DONE__INIT;
	done.bucket = run->bucket;
	done.n_tensors = bk->count;
	done.tensors = &j->plan.members[bk->first];
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_BUCKET_DONE;
	m.bucket_done = &done;
	for (unsigned r = 0; r < run->nranks; r++) {
		struct gs_trainer *t = j->slots[r];
		if (t && t->in_step && t->bucket_events) {
			done.step = t->seq;
			gs_trainer_send(t, &m);
		}
	}
}

/* A bucket found memory of this node's trainers that lost its pages (the
 * fault guard caught a SIGBUS there). Each such trainer fails alone; the
 * step, which cannot be whole without it, is aborted naming it, unless
 * every bucket has launched and its results are whole (as when a trainer
 * goes away then). A failed bucket stopped every node already (the chunk
 * status); otherwise the next bucket's vote carries the abort. */
static void drop_lost_trainers(struct gs_job *j, const struct gs_bucket_run *run)
{
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		struct gs_trainer *t = j->slots[r];
		int i = t && t->client.ctx ? gs_trainer_lost_buffer(t) : -1;
		if (i < 0)
			continue;
		char why[300];
		snprintf(why, sizeof(why), "trainer local rank %u (pid %d) of node %u lost the pages of its buffer %d while gradsyncd read it (SIGBUS) during step %llu",
			 r, (int)t->pid, j->world.node_rank, i, (unsigned long long)j->step_number);
		/* Its step ends with the Error below, not with a StepDone. */
		t->in_step = false;
		if (run->status != GS_OK || j->next_launch < j->plan.nbuckets)
			abort_step(j, why, run->status == GS_OK ? GS_ABORT_MEMORY : 0, r);
		gs_trainer_fail(t, GS_EBUFFER, "buffer %d (%llu bytes) lost its pages while gradsyncd was reading it (SIGBUS): a hole punched in a huge-page memfd whose pool then ran out, or a memory error; this trainer's step %llu fails and it must register again",
			     i, (unsigned long long)t->buffers[i].size, (unsigned long long)t->seq);
	}
}

void gs_job_bucket_finished(struct gs_job *j, struct gs_bucket_run *run)
{
	j->inflight--;
	if (run->lost)
		drop_lost_trainers(j, run);
	if (run->status != GS_OK) {
		/* A lost pack (GS_EBUFFER) failed the bucket on every node
		 * alike, its group whole; anything else is the collective's. */
		bool collective = run->status != GS_EABORTED && run->status != GS_EBUFFER;
		char why[400];
		if (!collective)
			snprintf(why, sizeof(why), "%s", run->error);
		else
			snprintf(why, sizeof(why), "all-reduce of bucket %u failed: %s",
				 run->bucket, run->error[0] ? run->error : gs_error_desc(run->status));
		bool first = !j->aborting;
		abort_step(j, why, 0, 0);
		/* A peer's death shows here first, as a broken connection; the
		 * coordinator's word naming the node follows within moments (and
		 * names the step's abort, if this failure was its first cause).
		 * Without that word, the group failed with every node there. */
		if (collective && j->world.nodes > 1 &&
		    j->world.group_ready && !j->holding_failure) {
			j->holding_failure = true;
			j->failure_renames = first;
			j->failure_generation = j->world.generation;
			snprintf(j->failure_why, sizeof(j->failure_why), "%.199s", why);
			j->inflight++;
			uv_timer_start(&j->failure_timer, on_failure_timer, 500, 0);
		}
	} else {
		/* Complete even if the step was aborted meanwhile: its results
		 * are in the trainers' buffers, and the step says so. */
		j->buckets_done++;
		j->step_nonfinite += run->nonfinite;
		j->step_sumsq += run->sumsq;
		j->step_wire_bytes += j->plan.buckets[run->bucket].elements *
				      gs_wire_size(j->env.backend->wire);
		for (unsigned r = 0; r < run->nranks; r++) {
			struct gs_trainer *t = j->slots[r];
			if (t && t->tensors == run->tensors[r])
				t->clipped += run->clipped[r];
		}
		send_bucket_done(j, run);
	}
	gs_bucket_run_free(run);
	try_finish(j);
	gs_job_reap(j);
}
