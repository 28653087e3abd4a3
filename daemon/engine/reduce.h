/*
 * One bucket of one step on the worker thread: for each chunk that fits
 * the fusion buffers, pack every local rank's spans, all-reduce, and
 * unpack into every local rank's tensors. Everything it reads is captured
 * when the bucket launches, so the loop thread may go on meanwhile.
 */
#ifndef GS_REDUCE_H
#define GS_REDUCE_H

#include "backend/backend.h"
#include "engine/job.h"
#include "support/trace.h"
#include "support/worker.h"

/* Why a node votes to abort a step (sent to the other nodes as a number). */
enum gs_abort_reason {
	GS_ABORT_OTHER = 1,
	GS_ABORT_TRAINER_GONE = 2,
	GS_ABORT_TIMEOUT = 3,
	GS_ABORT_MEMORY = 4, /* a trainer's shared memory lost its pages (SIGBUS) */
};

struct gs_bucket_run {
	struct gs_work work;
	struct gs_job *job;
	struct gs_backend *backend;
	const struct gs_plan *plan;
	const uint64_t *counts;
	uint32_t bucket;
	uint64_t step;        /* the job's internal counter (job.h) */
	uint64_t step_number; /* as the trainers number it, for messages */
	/* Where the bucket's phases are recorded, and what they name. */
	struct gs_trace *trace;
	struct gs_trace_bucket traced;
	unsigned nranks;
	float **tensors[GS_MAX_LOCAL];
	struct gs_pack_params pack[GS_MAX_LOCAL];
	uint32_t ready_event[GS_MAX_LOCAL]; /* CUDA: see gs_bucket_io */
	uint8_t *produced; /* the job's, per tensor (job.h); NULL in a run that only votes */
	float postscale;
	struct gs_span *spans; /* room for one chunk's spans */
	/* With several nodes every bucket starts with a vote: a node that
	 * aborts the step takes part in the vote only, with its reason. The
	 * vote is a collective of its own, or, where the backend carries it
	 * (votes_in_data), rides in the bucket's first all-reduce; then vote
	 * holds this node's and, after, the nodes' sum. */
	uint32_t nodes, node_rank;
	int abort_reason; /* 0: go on */
	uint32_t abort_rank;
	struct gs_vote vote;
	/* The bucket as the backend's reduce_bucket takes it (run_whole): set
	 * up at launch, so that the run before this one may hand it to the
	 * backend early (gs_bucket_io.next). */
	struct gs_bucket_io io;
	/* For the trace: the step's first readiness and this launch, and the
	 * backend's marks of the chunk in progress (gs_io_mark). */
	uint64_t ready_ns, launch_ns;
	uint64_t mark_ns[4], mark_first, mark_len;
	bool marked;
	/* Results. */
	uint64_t clipped[GS_MAX_LOCAL];
	uint64_t nonfinite;
	double sumsq; /* of the bucket's reduced values (gs_bucket_io.sumsq) */
	bool lost; /* a trainer's memory here lost its pages (backend.h) */
	int status;
	char error[320];
};

/* A run that only votes to abort bucket `bucket` of the step. */
struct gs_bucket_run *gs_bucket_run_create_abort(struct gs_job *j, uint32_t bucket,
						 int reason, uint32_t rank);
void gs_bucket_run_free(struct gs_bucket_run *run);

#endif
