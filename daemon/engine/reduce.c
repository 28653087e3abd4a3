#include "engine/reduce.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine/trainer.h"
#include "errors.h"
#include "support/trace.h"

static void run_chunk(struct gs_bucket_run *run, uint64_t start, uint64_t len)
{
	struct gs_backend *b = run->backend;
	const struct gs_bucket *bk = &run->plan->buckets[run->bucket];
	size_t nspans = gs_plan_chunk_spans(run->plan, run->counts, run->bucket,
					    start, len, run->spans, bk->count);
	uint64_t ns[4] = { gs_now_ns(), 0, 0, 0 }; /* phase starts, for the trace */
	for (unsigned r = 0; r < run->nranks; r++)
		run->clipped[r] += b->ops->pack(b, r, run->tensors[r], run->spans,
						nspans, &run->pack[r]);
	ns[1] = gs_now_ns();
	int err = b->ops->allreduce(b, len);
	ns[2] = gs_now_ns();
	if (err != GS_OK) {
		run->status = err;
		snprintf(run->error, sizeof(run->error), "%s", b->error);
		gs_trace_chunk(run->trace, &run->traced, start, len, ns);
		return;
	}
	run->nonfinite += b->ops->unpack(b, (float *const *const *)run->tensors,
					 run->spans, nspans, run->postscale);
	/* The chunk-by-chunk unpack sums no squares: the step's norm is then
	 * unknown, and says so. */
	run->sumsq = NAN;
	ns[3] = gs_now_ns();
	gs_trace_chunk(run->trace, &run->traced, start, len, ns);
}

/* The backend's marks, turned into the trace's phases chunk by chunk. */
static void on_mark(const struct gs_bucket_io *io, int mark, uint64_t first, uint64_t len)
{
	struct gs_bucket_run *run = io->ctx;
	run->marked = true;
	run->mark_ns[mark] = gs_now_ns();
	run->mark_first = first;
	run->mark_len = len;
	if (mark == GS_MARK_DONE) {
		gs_trace_chunk(run->trace, &run->traced, first, len, run->mark_ns);
		memset(run->mark_ns, 0, sizeof(run->mark_ns));
	}
}

/* The nodes' summed vote stopped the step: why, in one wording whichever
 * way the vote went. */
static void describe_abort(struct gs_bucket_run *run, const struct gs_vote *v)
{
	run->status = GS_EABORTED;
	unsigned long long step = (unsigned long long)run->step_number;
	if (v->aborts > 1)
		snprintf(run->error, sizeof(run->error), "%u nodes aborted step %llu", v->aborts,
			 step);
	else if (v->reason == GS_ABORT_TRAINER_GONE)
		snprintf(run->error, sizeof(run->error),
			 "trainer local rank %u of node %u went away during step %llu", v->rank,
			 v->node, step);
	else if (v->reason == GS_ABORT_MEMORY)
		snprintf(run->error, sizeof(run->error),
			 "trainer local rank %u of node %u lost the pages of its shared memory while gradsyncd read it (SIGBUS) during step %llu",
			 v->rank, v->node, step);
	else if (v->reason == GS_ABORT_TIMEOUT)
		snprintf(run->error, sizeof(run->error),
			 "step %llu timed out on node %u waiting for gradients (its log names them)",
			 step, v->node);
	else
		snprintf(run->error, sizeof(run->error), "node %u aborted step %llu", v->node, step);
}

/* This node's vote on the bucket: go on, or abort with its reason. */
static void own_vote(struct gs_bucket_run *run)
{
	run->vote = (struct gs_vote){ 0 };
	if (run->abort_reason)
		run->vote = (struct gs_vote){ 1, run->node_rank, run->abort_rank,
					      (uint32_t)run->abort_reason };
}

static int vote_timeout_ms(const struct gs_bucket_run *run)
{
	const struct gs_settings *s = run->job->env.settings;
	return (int)((s->step_timeout + s->peer_timeout) * 1000);
}

static void bucket_work(struct gs_work *w);

/* The run the worker takes after this one, as the backend may start it
 * early: a bucket that reduces tensors, of a step not stopped here. */
static const struct gs_bucket_io *queued_next(const struct gs_bucket_io *io)
{
	struct gs_bucket_run *run = io->ctx;
	struct gs_work *w = run->job->env.worker ? gs_worker_next(run->job->env.worker) : NULL;
	if (!w || w->run != bucket_work)
		return NULL;
	struct gs_bucket_run *next = (struct gs_bucket_run *)w;
	if (next->job != run->job || next->abort_reason || !next->spans ||
	    run->job->worker_stopped_step == next->step)
		return NULL;
	return &next->io;
}

/* The daemon's runs, numbered so that a backend tells them apart even
 * where a freed run's memory is reused. */
static _Atomic uint64_t run_tokens;

/* The run's bucket as reduce_bucket takes it; its vote (zero: go on) rides
 * in the data where the backend carries it. */
static void set_io(struct gs_bucket_run *run)
{
	bool in_data = run->nodes > 1 && run->backend->votes_in_data;
	run->io = (struct gs_bucket_io){
		run->plan, run->counts, run->bucket, run->nranks,
		(float *const *const *)run->tensors, run->pack, run->postscale,
		run->clipped, &run->nonfinite, on_mark, run, run->ready_event,
		&run->lost, in_data ? &run->vote : NULL, in_data ? vote_timeout_ms(run) : 0,
		run->nodes > 1 ? queued_next : NULL, atomic_fetch_add(&run_tokens, 1) + 1,
		run->produced,
		&run->sumsq,
	};
}

/* A backend that reduces a bucket at once (CUDA: one kernel launch per
 * bucket, chunked only where the bucket passes the fusion buffer). */
static void run_whole(struct gs_bucket_run *run)
{
	struct gs_backend *b = run->backend;
	bool in_data = run->io.vote != NULL;
	if (in_data)
		own_vote(run);
	uint64_t start = gs_now_ns();
	int err = b->ops->reduce_bucket(b, &run->io);
	if (err == GS_EABORTED && in_data && run->vote.aborts)
		describe_abort(run, &run->vote);
	else if (err != GS_OK) {
		run->status = err;
		snprintf(run->error, sizeof(run->error), "%s", b->error);
	}
	if (run->mark_ns[0]) { /* a chunk that failed: the phase it failed in ends now */
		int m = 1;
		while (m < 3 && run->mark_ns[m])
			m++;
		run->mark_ns[m] = gs_now_ns();
		gs_trace_chunk(run->trace, &run->traced, run->mark_first, run->mark_len, run->mark_ns);
	} else if (!run->marked)
		gs_trace_whole(run->trace, &run->traced, start, gs_now_ns(), run->status == GS_OK);
}

/* The vote's elements: its four, then, per member of the bucket, 1 where
 * one of this node's trainers produced it (a run that only votes: 0). */
static float *vote_elements(const struct gs_bucket_run *run, const struct gs_bucket *bk)
{
	float *v = calloc(4 + (size_t)bk->count, sizeof(*v));
	if (!v)
		return NULL;
	v[0] = (float)run->vote.aborts;
	v[1] = (float)run->vote.node;
	v[2] = (float)run->vote.rank;
	v[3] = (float)run->vote.reason;
	for (uint32_t m = 0; run->produced && m < bk->count; m++)
		v[4 + m] = run->produced[run->plan->members[bk->first + m]] ? 1.0f : 0.0f;
	return v;
}

/* Every node says whether it goes on with this bucket; one vote to abort
 * ends the step on all nodes at the same bucket. With it goes which of
 * the bucket's tensors the node's trainers produced: a tensor is produced
 * where any node's count is. The vote is an fp32 sum, exact for these
 * small integers. */
static void vote(struct gs_bucket_run *run)
{
	own_vote(run);
	const struct gs_bucket *bk = &run->plan->buckets[run->bucket];
	float *v = vote_elements(run, bk);
	if (!v) {
		run->status = GS_ENOMEM;
		snprintf(run->error, sizeof(run->error), "out of memory voting on bucket %u",
			 run->bucket);
		return;
	}
	char err[256];
	const struct gs_group_port *g = &run->job->env.group;
	int rc = g->vote(g->ctx, v, 4 + (size_t)bk->count, err, sizeof(err));
	if (rc != GS_OK) {
		run->status = rc;
		snprintf(run->error, sizeof(run->error), "%s", err);
		free(v);
		return;
	}
	struct gs_vote sum = { (uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2], (uint32_t)v[3] };
	if (sum.aborts)
		describe_abort(run, &sum);
	for (uint32_t m = 0; run->produced && !sum.aborts && m < bk->count; m++)
		run->produced[run->plan->members[bk->first + m]] = v[4 + m] != 0.0f;
	free(v);
}

/* A node that aborts, where the vote rides in the data: the bucket's
 * first all-reduce with its vote and no tensors. */
static void vote_in_data(struct gs_bucket_run *run)
{
	struct gs_backend *b = run->backend;
	own_vote(run);
	struct gs_bucket_io io = {
		.plan = run->plan, .counts = run->counts, .bucket = run->bucket,
		.vote = &run->vote, .vote_timeout_ms = vote_timeout_ms(run),
	};
	int rc = b->ops->reduce_bucket(b, &io);
	if (rc == GS_EABORTED && run->vote.aborts)
		describe_abort(run, &run->vote);
	else {
		run->status = rc == GS_OK ? GS_EABORTED : rc;
		snprintf(run->error, sizeof(run->error), "%s", b->error);
	}
}

static void bucket_work(struct gs_work *w)
{
	struct gs_bucket_run *run = (struct gs_bucket_run *)w;
	struct gs_job *j = run->job;
	if (j->worker_stopped_step == run->step) {
		run->status = GS_EABORTED;
		snprintf(run->error, sizeof(run->error), "step %llu was aborted",
			 (unsigned long long)run->step_number);
		return;
	}
	bool in_data = run->nodes > 1 && run->backend->votes_in_data;
	if (run->nodes > 1 && !in_data)
		vote(run);
	else if (in_data && run->abort_reason)
		vote_in_data(run);
	if (run->abort_reason && run->status == GS_OK)
		run->status = GS_EABORTED;
	if (run->status != GS_OK) {
		j->worker_stopped_step = run->step;
		return;
	}
	uint64_t total = run->plan->buckets[run->bucket].elements;
	uint64_t chunk = run->backend->fusion_elements;
	gs_trace_bucket_start(run->trace, &run->traced, run->ready_ns, run->launch_ns, gs_now_ns());
	/* A failed chunk stops the bucket: later chunks keep the trainers'
	 * own gradients, and the step reports the bucket as not done. */
	if (run->backend->ops->reduce_bucket)
		run_whole(run);
	else
		for (uint64_t start = 0; start < total && run->status == GS_OK; start += chunk)
			run_chunk(run, start, gs_chunk_len(total, start, chunk));
	if (run->status != GS_OK)
		j->worker_stopped_step = run->step;
}

static void bucket_done(struct gs_work *w)
{
	struct gs_bucket_run *run = (struct gs_bucket_run *)w;
	gs_job_bucket_finished(run->job, run);
}

/* What every run of bucket `bucket` of the job's current step knows. */
static struct gs_bucket_run *run_alloc(struct gs_job *j, uint32_t bucket)
{
	struct gs_bucket_run *run = calloc(1, sizeof(*run));
	if (!run)
		return NULL;
	run->work.run = bucket_work;
	run->work.done = bucket_done;
	run->job = j;
	run->backend = j->env.backend;
	run->trace = j->env.trace;
	run->plan = &j->plan;
	run->counts = j->layout.counts;
	run->bucket = bucket;
	run->step = j->step;
	run->step_number = j->step_number;
	run->traced = (struct gs_trace_bucket){ j->step_number, bucket,
						j->plan.buckets[bucket].elements,
						run->backend->fusion_elements, j->owner };
	run->nodes = j->world.nodes;
	run->node_rank = j->world.node_rank;
	return run;
}

struct gs_bucket_run *gs_bucket_run_create(struct gs_job *j, uint32_t bucket)
{
	struct gs_bucket_run *run = run_alloc(j, bucket);
	if (!run)
		return NULL;
	const struct gs_bucket *bk = &j->plan.buckets[bucket];
	run->spans = calloc(bk->count, sizeof(*run->spans));
	if (!run->spans) {
		free(run);
		return NULL;
	}
	run->nranks = j->env.settings->local_size;
	run->postscale = j->postscale;
	run->produced = j->produced;
	run->ready_ns = j->step_start_ns;
	run->launch_ns = gs_now_ns();
	for (unsigned r = 0; r < run->nranks; r++) {
		struct gs_trainer *t = j->slots[r];
		run->tensors[r] = t->tensors;
		run->pack[r] = t->pack;
		run->ready_event[r] = t->bucket_event ? t->bucket_event[bucket] : 0;
	}
	set_io(run);
	return run;
}

struct gs_bucket_run *gs_bucket_run_create_abort(struct gs_job *j, uint32_t bucket,
						 int reason, uint32_t rank)
{
	struct gs_bucket_run *run = run_alloc(j, bucket);
	if (!run)
		return NULL;
	run->abort_reason = reason;
	run->abort_rank = rank;
	return run;
}

void gs_bucket_run_free(struct gs_bucket_run *run)
{
	free(run->spans);
	free(run);
}
