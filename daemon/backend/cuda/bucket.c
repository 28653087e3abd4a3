/*
 * A bucket on the CUDA backend, on the worker thread:
 *
 *   the host waits for the trainers' ready events to complete; each rank's
 *   stream: copy the bucket's tables, zero the counters, wait for the
 *   trainer's ready event; then per launch: pack (one kernel), all
 *   ranks' ncclAllReduce in one group, and only once the host has seen the
 *   all-reduce succeed, unpack (one kernel), so an aborted all-reduce never
 *   writes half a result; then record the trainer's done event and copy the
 *   counters back, and local rank 0's sums of squares (one per task, after
 *   its tables: norm_at), which the host adds in task order for the
 *   step's gradient norm.
 *
 * With several nodes a bucket of several launches is staged, as on the
 * host backend: each launch is packed and all-reduced in place in a
 * staging buffer that holds the whole bucket, and the unpacks run only
 * once every launch's all-reduce is through, so a peer lost between two
 * launches leaves every tensor of the bucket as its trainer wrote it.
 */
#include <stdio.h>

#include "backend/cuda/cuda_private.h"
#include "backend/cuda/kernels.h"
#include "errors.h"
#include "support/log.h"

/* Where the sums of squares of the bucket's tasks go in a rank's table
 * memory (device, and its pinned staging): after the tables, one double
 * per task of every launch in order. */
static size_t norm_at(const struct gs_cuda_bucket_plan *bp)
{
	return (bp->table_bytes + sizeof(double) - 1) / sizeof(double) * sizeof(double);
}

static uint32_t total_tasks(const struct gs_cuda_bucket_plan *bp)
{
	uint32_t n = 0;
	for (uint32_t l = 0; l < bp->nlaunches; l++)
		n += bp->launches[l].ntasks;
	return n;
}

static ncclDataType_t nccl_type(enum gs_wire w)
{
	switch (w) {
	case GS_WIRE_F16:
		return ncclFloat16;
	case GS_WIRE_BF16:
		return ncclBfloat16;
	default:
		return ncclFloat32;
	}
}

/* The tables live as long as the backend and only grow. Every bucket ends
 * with the streams drained, so nothing reads the old ones any more. */
static int reserve_tables(struct cuda_backend *cb, unsigned r, size_t bytes)
{
	struct cuda_rank *rk = &cb->rank[r];
	if (bytes <= rk->table_cap)
		return GS_OK;
	size_t cap = rk->table_cap ? rk->table_cap : 4096;
	while (cap < bytes)
		cap *= 2;
	cudaFree(rk->table);
	cudaFreeHost(rk->staging);
	rk->table = rk->staging = NULL;
	rk->table_cap = 0;
	cudaError_t e = cudaMalloc(&rk->table, cap);
	if (e == cudaSuccess)
		e = cudaHostAlloc(&rk->staging, cap, cudaHostAllocPortable);
	if (e != cudaSuccess)
		return cuda_error(cb, "allocating the bucket's tables", r, e);
	rk->table_cap = cap;
	return GS_OK;
}

/* Whether rank r's watch stream is there (made on first use). */
static cudaError_t watch_stream(struct cuda_rank *rk)
{
	if (rk->watch)
		return cudaSuccess;
	return cudaStreamCreateWithFlags(&rk->watch, cudaStreamNonBlocking);
}

/* Until the ready event completes: spins, then has the watch stream wait
 * on it with a wake-up behind, and sleeps until that comes. */
static int wait_event(struct cuda_backend *cb, unsigned r, uint64_t deadline)
{
	struct cuda_rank *rk = &cb->rank[r];
	struct cuda_wait wait = { 0 };
	bool armed = false;
	cudaError_t e;
	while ((e = cudaEventQuery(rk->bucket_ready)) == cudaErrorNotReady) {
		uint64_t now = cuda_now_ms();
		if (now > deadline) {
			snprintf(cb->base.error, sizeof(cb->base.error),
				 "local rank %u's gradients were not ready on its GPU within %d s (--peer-timeout): its GPU work is stuck, or it went away",
				 r, cb->timeout_ms / 1000);
			if (armed) { /* it stays stuck: a fresh one for later waits */
				cudaStreamDestroy(rk->watch);
				rk->watch = NULL;
			}
			return GS_ETIMEDOUT;
		}
		if (cuda_wait_spin(&wait))
			continue;
		if (!armed) {
			e = watch_stream(rk);
			if (e == cudaSuccess)
				e = cudaStreamWaitEvent(rk->watch, rk->bucket_ready, 0);
			if (e == cudaSuccess)
				e = cuda_wake_after(cb->wake, rk->watch);
			if (e != cudaSuccess)
				return cuda_error(cb, "watching the trainer's ready event", r, e);
			armed = true;
			continue; /* it may have completed meanwhile */
		}
		cuda_wake_sleep(cb->wake, -1, deadline + 1);
	}
	if (e != cudaSuccess)
		return cuda_error(cb, "waiting for the trainer's ready event", r, e);
	return GS_OK;
}

/* Until every trainer's ready event has completed, within --peer-timeout.
 * The host waits, not only the stream: NCCL kernels queued behind a
 * trainer's GPU work that never completes (a hung or killed trainer)
 * would make even ncclCommAbort wait for ever, as it synchronises NCCL's
 * stream, which follows ours. The trainer's own host never waits. */
static int wait_ready(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)cb->timeout_ms;
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		rk->bucket_events = atomic_load(&rk->events);
		if (!rk->bucket_events)
			continue;
		/* The entry the bucket's last mark recorded: later marks record
		 * others, so it waits for its own gradients only. */
		const struct cuda_import *ev = rk->bucket_events;
		rk->bucket_ready = ev->ring[io->ready_event ? io->ready_event[r] % ev->nring : 0];
		cudaSetDevice(rk->device);
		int rc = wait_event(cb, r, deadline);
		if (rc != GS_OK)
			return rc;
	}
	return GS_OK;
}

static int prepare(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	size_t bytes = cb->plan.table_bytes;
	size_t room = norm_at(&cb->plan) + total_tasks(&cb->plan) * sizeof(double);
	int rc = wait_ready(cb, io);
	for (unsigned r = 0; rc == GS_OK && r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		rc = reserve_tables(cb, r, room);
		if (rc != GS_OK)
			return rc;
		gs_cuda_fill_tables(&cb->plan, io->tensors[r], rk->staging);
		cudaError_t e = cudaMemcpyAsync(rk->table, rk->staging, bytes,
						cudaMemcpyHostToDevice, rk->stream);
		if (e == cudaSuccess)
			e = cudaMemsetAsync(rk->counters, 0, 2 * sizeof(*rk->counters), rk->stream);
		/* Complete already; the wait orders the pack after the trainer's
		 * writes on the GPU's side too. */
		if (e == cudaSuccess && rk->bucket_events)
			e = cudaStreamWaitEvent(rk->stream, rk->bucket_ready, 0);
		if (e != cudaSuccess)
			return cuda_error(cb, "starting the bucket", r, e);
	}
	return rc;
}

/* Rank r's fusion buffer as size_buffers sized it for the plan, made here
 * (on the worker thread, never zero-filled) the first time and again when
 * a new layout sized it anew. Every bucket ends with the streams drained,
 * so nothing uses the old buffer when it goes. */
static int fit_fusion(struct cuda_backend *cb, unsigned r)
{
	struct cuda_rank *rk = &cb->rank[r];
	if (rk->fusion && rk->fusion_elements == cb->want_elements)
		return GS_OK;
	cudaFree(rk->fusion);
	rk->fusion = NULL;
	rk->fusion_elements = 0;
	if (cb->want_elements == 0) {
		snprintf(cb->base.error, sizeof(cb->base.error),
			 "the job's fusion buffers were never sized (no bucket plan)");
		return GS_ESTATE;
	}
	cudaError_t e = cudaMalloc(&rk->fusion, cb->want_elements * sizeof(float));
	if (e != cudaSuccess)
		return cuda_error(cb, "allocating the fusion buffer", r, e);
	rk->fusion_elements = cb->want_elements;
	gs_info("cuda: local rank %u has a fusion buffer of %llu elements (%llu MiB) on GPU %s", r,
		(unsigned long long)rk->fusion_elements,
		(unsigned long long)(rk->fusion_elements * sizeof(float) >> 20), rk->pci);
	return GS_OK;
}

/* A staged bucket's home on rank r's GPU: the plan's largest staged
 * bucket (size_buffers), made at the first such bucket and kept until a
 * new layout sizes it anew. */
static int reserve_stage(struct cuda_backend *cb, unsigned r, size_t bytes)
{
	struct cuda_rank *rk = &cb->rank[r];
	size_t want = cb->want_stage_elements * gs_wire_size(cb->base.wire);
	if (bytes <= rk->stage_bytes && rk->stage_bytes <= want)
		return GS_OK;
	if (bytes < want)
		bytes = want;
	cudaFree(rk->stage);
	rk->stage = NULL;
	rk->stage_bytes = 0;
	cudaError_t e = cudaMalloc(&rk->stage, bytes);
	if (e != cudaSuccess)
		return cuda_error(cb, "allocating the staging buffer of a bucket larger than the fusion buffer",
				  r, e);
	rk->stage_bytes = bytes;
	gs_info("cuda: local rank %u stages buckets larger than the fusion buffer in %zu MiB", r,
		bytes >> 20);
	return GS_OK;
}

/* Where launch l is packed and all-reduced on rank r: the fusion buffer,
 * or its place in the staged bucket. */
static void *launch_buffer(struct cuda_backend *cb, unsigned r, const struct gs_cuda_launch *l,
			   bool staged)
{
	if (!staged)
		return cb->rank[r].fusion;
	return (char *)cb->rank[r].stage + l->start * gs_wire_size(cb->base.wire);
}

static const struct gs_cuda_entry *launch_entries(const struct cuda_rank *rk,
						  const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_entry *)((const char *)rk->table + l->table_offset);
}

static const struct gs_cuda_task *launch_tasks(const struct cuda_rank *rk,
					       const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_task *)((const char *)rk->table + gs_cuda_tasks_offset(l));
}

static int allreduce(struct cuda_backend *cb, const struct gs_cuda_launch *l, bool staged)
{
	ncclDataType_t type = nccl_type(cb->base.wire);
	ncclGroupStart();
	for (unsigned r = 0; r < cb->n; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		void *buf = launch_buffer(cb, r, l, staged);
		cudaSetDevice(rk->device);
		ncclResult_t res = ncclAllReduce(buf, buf, l->elements, type, ncclSum, rk->comm,
						 rk->stream);
		if (res != ncclSuccess && res != ncclInProgress) {
			ncclGroupEnd();
			return cuda_nccl_error(cb, "ncclAllReduce", r, res);
		}
	}
	ncclResult_t res = ncclGroupEnd();
	if (res != ncclSuccess && res != ncclInProgress)
		return cuda_nccl_error(cb, "ncclGroupEnd of the all-reduce", 0, res);
	return cuda_wait_comms(cb, "queueing the all-reduce", cb->timeout_ms, -1);
}

/* Packs launch i on every rank and all-reduces it; returns once the host
 * has seen the all-reduce succeed (or fail). */
static int reduce_launch(struct cuda_backend *cb, const struct gs_bucket_io *io, uint32_t i,
			 bool staged)
{
	const struct gs_cuda_launch *l = &cb->plan.launches[i];
	/* The marks (trace, metrics) are host times: when each phase is
	 * queued, and when the host has seen the all-reduce and the last
	 * launch's unpack finish. */
	gs_io_mark(io, GS_MARK_PACK, l->start, l->elements);
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		cudaError_t e = gs_cuda_launch_pack(cb->base.wire, launch_entries(rk, l),
						    launch_tasks(rk, l), l->ntasks,
						    launch_buffer(cb, r, l, staged), io->pack[r],
						    &rk->counters[0], rk->stream);
		if (e != cudaSuccess)
			return cuda_error(cb, "launching the pack kernel", r, e);
	}
	gs_io_mark(io, GS_MARK_ALLREDUCE, l->start, l->elements);
	int rc = allreduce(cb, l, staged);
	if (rc == GS_OK)
		rc = cuda_wait_streams(cb, "the all-reduce");
	/* What a ring over the world sends out of this node: the ring leaves
	 * each node once, carrying 2 (W - 1) / W of the buffer. NCCL may pick
	 * a tree; this is the estimate status and metrics show. */
	if (rc == GS_OK && cb->world > cb->n)
		atomic_fetch_add(&cb->base.internode_bytes,
				 2 * (cb->world - 1) * l->elements * gs_wire_size(cb->base.wire) /
					 cb->world);
	return rc;
}

/* A tensor no trainer produced is not unpacked: its tasks in launch l's
 * table lose their elements, in the host's copy (whose upload the host saw
 * complete when it waited for the all-reduce) and then on the GPU, queued
 * behind the pack that read them. */
static int skip_unproduced(struct cuda_backend *cb, const struct gs_bucket_io *io,
			   const struct gs_cuda_launch *l)
{
	size_t at = gs_cuda_tasks_offset(l);
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		if (!gs_cuda_skip_unproduced(&cb->plan, l, io->produced, rk->staging))
			return GS_OK; /* the same tasks on every rank */
		cudaSetDevice(rk->device);
		cudaError_t e = cudaMemcpyAsync((char *)rk->table + at, (char *)rk->staging + at,
						l->ntasks * sizeof(struct gs_cuda_task),
						cudaMemcpyHostToDevice, rk->stream);
		if (e != cudaSuccess)
			return cuda_error(cb, "leaving unproduced tensors out of the unpack", r, e);
	}
	return GS_OK;
}

/* Where launch i's sums of squares go on rank 0 (norm_at), or NULL when
 * the bucket wants none. */
static double *launch_sumsq(struct cuda_backend *cb, const struct gs_bucket_io *io, uint32_t i)
{
	if (!io->sumsq)
		return NULL;
	uint32_t before = 0;
	for (uint32_t l = 0; l < i; l++)
		before += cb->plan.launches[l].ntasks;
	return (double *)((char *)cb->rank[0].table + norm_at(&cb->plan)) + before;
}

/* Writes launch i's result back to the trainers' tensors. */
static int unpack_launch(struct cuda_backend *cb, const struct gs_bucket_io *io, uint32_t i,
			 bool staged)
{
	const struct gs_cuda_launch *l = &cb->plan.launches[i];
	double *sumsq = launch_sumsq(cb, io, i);
	gs_io_mark(io, GS_MARK_UNPACK, l->start, l->elements);
	int rc = skip_unproduced(cb, io, l);
	if (rc != GS_OK)
		return rc;
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		/* Every rank holds the same result: count its non-finite values
		 * and sum its squares once. */
		cudaError_t e = gs_cuda_launch_unpack(cb->base.wire, launch_entries(rk, l),
						      launch_tasks(rk, l), l->ntasks,
						      launch_buffer(cb, r, l, staged), io->postscale,
						      r == 0 ? &rk->counters[1] : NULL,
						      r == 0 ? sumsq : NULL, rk->stream);
		if (e != cudaSuccess)
			return cuda_error(cb, "launching the unpack kernel", r, e);
	}
	if (i + 1 < cb->plan.nlaunches)
		gs_io_mark(io, GS_MARK_DONE, l->start, l->elements);
	return GS_OK;
}

/* The bucket's sum of squares: rank 0's task sums, copied back by
 * finish, added in task order. */
static double tasks_sumsq(const struct cuda_backend *cb)
{
	const double *at = (const double *)((const char *)cb->rank[0].staging + norm_at(&cb->plan));
	uint32_t n = total_tasks(&cb->plan);
	double sum = 0;
	for (uint32_t k = 0; k < n; k++)
		sum += at[k];
	return sum;
}

static int finish(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	size_t at = norm_at(&cb->plan), norm_bytes = total_tasks(&cb->plan) * sizeof(double);
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		cudaError_t e = cudaSuccess;
		if (rk->bucket_events)
			e = cudaEventRecord(rk->bucket_events->done, rk->stream);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(&cb->host_counters[2 * r], rk->counters,
					    2 * sizeof(*rk->counters), cudaMemcpyDeviceToHost,
					    rk->stream);
		if (e == cudaSuccess && r == 0 && io->sumsq && norm_bytes)
			e = cudaMemcpyAsync((char *)rk->staging + at, (char *)rk->table + at,
					    norm_bytes, cudaMemcpyDeviceToHost, rk->stream);
		if (e != cudaSuccess)
			return cuda_error(cb, "ending the bucket", r, e);
	}
	int rc = cuda_wait_streams(cb, "unpacking");
	if (rc != GS_OK)
		return rc;
	const struct gs_cuda_launch *last = &cb->plan.launches[cb->plan.nlaunches - 1];
	gs_io_mark(io, GS_MARK_DONE, last->start, last->elements);
	for (unsigned r = 0; r < io->nranks; r++)
		io->clipped[r] += cb->host_counters[2 * r];
	*io->nonfinite += cb->host_counters[1];
	if (io->sumsq)
		*io->sumsq += tasks_sumsq(cb);
	return GS_OK;
}

/* Staged (several nodes, several launches), the unpacks wait for the last
 * all-reduce; else each follows its own. A failed launch stops the
 * bucket: unpacked launches hold the result, the rest keep the trainers'
 * own gradients (all of them, staged). */
static int run_bucket(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	if (gs_cuda_plan_bucket(&cb->plan, io->plan, io->counts, io->bucket,
				cb->base.fusion_elements) < 0) {
		snprintf(cb->base.error, sizeof(cb->base.error), "out of memory planning bucket %u",
			 io->bucket);
		return GS_ENOMEM;
	}
	bool staged = cb->world > cb->n && cb->plan.nlaunches > 1;
	size_t stage_bytes = io->plan->buckets[io->bucket].elements * gs_wire_size(cb->base.wire);
	int rc = GS_OK;
	for (unsigned r = 0; rc == GS_OK && r < io->nranks; r++) {
		cudaSetDevice(cb->rank[r].device);
		rc = fit_fusion(cb, r);
		if (rc == GS_OK && staged)
			rc = reserve_stage(cb, r, stage_bytes);
	}
	if (rc == GS_OK)
		rc = prepare(cb, io);
	for (uint32_t l = 0; rc == GS_OK && l < cb->plan.nlaunches; l++) {
		rc = reduce_launch(cb, io, l, staged);
		if (rc == GS_OK && !staged)
			rc = unpack_launch(cb, io, l, false);
	}
	for (uint32_t l = 0; staged && rc == GS_OK && l < cb->plan.nlaunches; l++)
		rc = unpack_launch(cb, io, l, true);
	if (rc == GS_OK)
		rc = finish(cb, io);
	return rc;
}

int cuda_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct cuda_backend *cb = cuda(b);
	for (unsigned r = 0; r < cb->n; r++) {
		if (!cb->rank[r].bound) {
			snprintf(b->error, sizeof(b->error),
				 "local rank %u has no GPU yet: its trainer registered no CUDA tensors", r);
			return GS_ESTATE;
		}
	}
	/* The communicators are made here, the first time and again after a
	 * failure alone; with several nodes, once per group. */
	int rc = cuda_make_comms(cb);
	if (rc != GS_OK)
		return rc == GS_ETIMEDOUT ? rc : GS_ESYSTEM;
	if (cb->broken) {
		snprintf(b->error, sizeof(b->error),
			 "NCCL communicators aborted after: %.150s; they are made again when the nodes regroup",
			 cb->broken_why);
		return GS_ESYSTEM;
	}
	if (!cb->connected || io->nranks != cb->n) {
		snprintf(b->error, sizeof(b->error),
			 "the NCCL communicators are not set up (a node went away; they are rebuilt when it is back)");
		return GS_ESTATE;
	}
	/* NCCL pairs collectives by their order: a node that left this
	 * bucket's all-reduce out (a failed launch, a trainer not ready)
	 * would meet its peers in the wrong one. */
	rc = run_bucket(cb, io);
	if (rc != GS_OK)
		cuda_abort_comms(cb, b->error);
	return rc;
}
