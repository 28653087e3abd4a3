#include "reduce.h"

#include <stdlib.h>

#include "daemon.h"
#include "gradsync.h"
#include "trainer.h"

static void run_chunk(struct gs_bucket_run *run, uint64_t start, uint64_t len)
{
	struct gs_backend *b = run->backend;
	const struct gs_bucket *bk = &run->plan->buckets[run->bucket];
	size_t nspans = gs_plan_chunk_spans(run->plan, run->counts, run->bucket,
					    start, len, run->spans, bk->count);
	for (unsigned r = 0; r < run->nranks; r++)
		run->clipped[r] += b->ops->pack(b, r, run->tensors[r], run->spans,
						nspans, &run->pack[r]);
	int err = b->ops->allreduce(b, len);
	if (err != GS_OK) {
		run->status = err;
		return;
	}
	run->nonfinite += b->ops->unpack(b, (float *const *const *)run->tensors,
					 run->spans, nspans, run->postscale);
}

static void bucket_work(struct gs_work *w)
{
	struct gs_bucket_run *run = (struct gs_bucket_run *)w;
	uint64_t total = run->plan->buckets[run->bucket].elements;
	uint64_t chunk = run->backend->fusion_elements;
	/* A failed chunk stops the bucket: later chunks keep the trainers'
	 * own gradients, and the step reports the bucket as not done. */
	for (uint64_t start = 0; start < total && run->status == GS_OK; start += chunk)
		run_chunk(run, start, total - start < chunk ? total - start : chunk);
}

static void bucket_done(struct gs_work *w)
{
	struct gs_bucket_run *run = (struct gs_bucket_run *)w;
	gs_job_bucket_finished(run->job, run);
}

struct gs_bucket_run *gs_bucket_run_create(struct gs_job *j, uint32_t bucket)
{
	struct gs_bucket_run *run = calloc(1, sizeof(*run));
	if (!run)
		return NULL;
	const struct gs_bucket *bk = &j->plan.buckets[bucket];
	run->spans = calloc(bk->count, sizeof(*run->spans));
	if (!run->spans) {
		free(run);
		return NULL;
	}
	run->work.run = bucket_work;
	run->work.done = bucket_done;
	run->job = j;
	run->backend = j->d->backend;
	run->plan = &j->plan;
	run->counts = j->layout.counts;
	run->bucket = bucket;
	run->step = j->step;
	run->nranks = j->d->settings.local_size;
	run->postscale = j->postscale;
	for (unsigned r = 0; r < run->nranks; r++) {
		struct gs_trainer *t = j->slots[r];
		run->tensors[r] = t->tensors;
		run->pack[r] = t->pack;
	}
	return run;
}

void gs_bucket_run_free(struct gs_bucket_run *run)
{
	free(run->spans);
	free(run);
}
