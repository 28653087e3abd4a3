/*
 * One bucket of one step on the worker thread: for each chunk that fits
 * the fusion buffers, pack every local rank's spans, all-reduce, and
 * unpack into every local rank's tensors. Everything it reads is captured
 * when the bucket launches, so the loop thread may go on meanwhile.
 */
#ifndef GS_REDUCE_H
#define GS_REDUCE_H

#include "backend.h"
#include "job.h"
#include "worker.h"

struct gs_bucket_run {
	struct gs_work work;
	struct gs_job *job;
	struct gs_backend *backend;
	const struct gs_plan *plan;
	const uint64_t *counts;
	uint32_t bucket;
	uint64_t step;
	unsigned nranks;
	float **tensors[GS_MAX_LOCAL];
	struct gs_pack_params pack[GS_MAX_LOCAL];
	float postscale;
	struct gs_span *spans; /* room for one chunk's spans */
	/* Results. */
	uint64_t clipped[GS_MAX_LOCAL];
	uint64_t nonfinite;
	int status;
};

void gs_bucket_run_free(struct gs_bucket_run *run);

#endif
