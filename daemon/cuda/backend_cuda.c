/*
 * The CUDA backend. Everything that runs a bucket (reduce_bucket) runs on
 * the worker thread; importing and releasing trainers' handles run on the
 * loop thread, which alone touches the list of imports. A bucket goes:
 *
 *   the host waits for the trainers' ready events to complete; each rank's
 *   stream: copy the bucket's tables, zero the counters, wait for the
 *   trainer's ready event; then per launch: pack (one kernel), all
 *   ranks' ncclAllReduce in one group, and only once the host has seen the
 *   all-reduce succeed, unpack (one kernel), so an aborted all-reduce never
 *   writes half a result; then record the trainer's done event and copy the
 *   counters back.
 *
 * With several nodes a bucket of several launches is staged, as on the
 * host backend: each launch is packed and all-reduced in place in a
 * staging buffer that holds the whole bucket, and the unpacks run only
 * once every launch's all-reduce is through, so a peer lost between two
 * launches leaves every tensor of the bucket as its trainer wrote it.
 *
 * The host polls the streams and the communicators' async errors rather
 * than blocking, so a peer that stops or an NCCL error ends the wait within
 * --peer-timeout, and then every communicator is aborted (ncclCommAbort).
 */
#include "backend_cuda.h"

#include <dlfcn.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "gradsync.h"
#include "kernels.h"
#include "log.h"
#include "table.h"

_Static_assert(GS_NCCL_UID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");
_Static_assert(GS_CUDA_IPC_HANDLE_SIZE == sizeof(cudaIpcMemHandle_t), "IPC handle size");
_Static_assert(GS_CUDA_IPC_HANDLE_SIZE == sizeof(cudaIpcEventHandle_t), "IPC handle size");

#define MAX_RANKS 64
/* Kernels are built for sm_80 and sm_90 (plus PTX): Ampere or later. */
#define MIN_CC_MAJOR 8

typedef CUresult (*mem_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

/* A trainer's handle opened here: a base allocation, or its events. */
struct cuda_import {
	struct cuda_import *next;
	enum gs_buffer_kind kind;
	unsigned rank;
	unsigned refs;
	uint8_t handle[GS_CUDA_IPC_HANDLE_SIZE];
	void *ptr;
	uint64_t size;
	cudaEvent_t ready, done;
};

struct cuda_rank {
	int device;
	char pci[32];
	cudaStream_t stream;
	ncclComm_t comm;
	void *fusion;                 /* fusion_elements of fp32 at most */
	unsigned long long *counters; /* device: clipped, non-finite */
	void *table, *staging;        /* device tables and their pinned source */
	size_t table_cap;
	void *stage;                  /* a staged bucket, in the wire dtype */
	size_t stage_bytes;
	/* The trainer's events (set on the loop thread, read on the worker). */
	_Atomic(struct cuda_import *) events;
	struct cuda_import *bucket_events; /* the ones this bucket waited on */
};

struct cuda_backend {
	struct gs_backend base;
	unsigned n;
	struct cuda_rank rank[MAX_RANKS];
	unsigned long long *host_counters; /* pinned: 2 per rank */
	struct gs_cuda_bucket_plan plan;
	int timeout_ms;
	uint32_t world; /* global ranks of the communicators */
	bool connected;
	bool broken;
	char broken_why[200];
	mem_range_fn mem_range;
	struct cuda_import *imports; /* loop thread only */
};

static struct cuda_backend *cuda(struct gs_backend *b)
{
	return (struct cuda_backend *)b;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Spins briefly, then sleeps: a small bucket's all-reduce takes tens of
 * microseconds, a large one milliseconds. */
static void backoff(unsigned *spins)
{
	if ((*spins)++ < 200) {
		sched_yield();
		return;
	}
	struct timespec ts = { 0, 20000 };
	nanosleep(&ts, NULL);
}

static bool cancelled(int fd)
{
	struct pollfd p = { fd, POLLIN, 0 };
	return fd >= 0 && poll(&p, 1, 0) > 0;
}

/* ---- Is there a usable GPU? -------------------------------------------- */

static void driver_problem(char *why, size_t n)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(why, n, "the NVIDIA driver is missing (%s)", dlerror());
		return;
	}
	dlclose(lib);
	int drv = 0, rt = 0;
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	snprintf(why, n, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime of this build: update the driver",
		 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

bool gs_cuda_usable(unsigned local_size, char *why, size_t n)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e == cudaErrorInsufficientDriver) {
		driver_problem(why, n);
		return false;
	}
	if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");
		snprintf(why, n, "no CUDA device is visible%s%s%s", vis ? " (CUDA_VISIBLE_DEVICES=" : "",
			 vis ? vis : "", vis ? ")" : "");
		return false;
	}
	if (e != cudaSuccess) {
		snprintf(why, n, "the CUDA runtime cannot use the GPUs: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return false;
	}
	if ((unsigned)count < local_size) {
		snprintf(why, n, "--local-size %u needs one GPU per trainer, but %d %s visible",
			 local_size, count, count == 1 ? "is" : "are");
		return false;
	}
	for (unsigned r = 0; r < local_size; r++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, (int)r) != cudaSuccess)
			continue;
		if (p.major < MIN_CC_MAJOR) {
			snprintf(why, n, "GPU %u (%s) has compute capability %d.%d; the kernels of this build need %d.0 or later",
				 r, p.name, p.major, p.minor, MIN_CC_MAJOR);
			return false;
		}
	}
	return true;
}

/* ---- Errors -------------------------------------------------------------- */

static int cuda_error(struct cuda_backend *cb, const char *what, unsigned r, cudaError_t e)
{
	snprintf(cb->base.error, sizeof(cb->base.error), "%s on local rank %u's GPU %d: %s (%s)",
		 what, r, cb->rank[r].device, cudaGetErrorString(e), cudaGetErrorName(e));
	cudaGetLastError(); /* clear it: this thread goes on */
	return GS_ESYSTEM;
}

/* After an all-reduce failed or timed out the communicators cannot be
 * trusted: abort them all, so no rank stays blocked in a collective. */
static void abort_comms(struct cuda_backend *cb, const char *why)
{
	for (unsigned r = 0; r < cb->n; r++) {
		if (cb->rank[r].comm)
			ncclCommAbort(cb->rank[r].comm);
		cb->rank[r].comm = NULL;
	}
	if (cb->connected && !cb->broken) {
		cb->broken = true;
		snprintf(cb->broken_why, sizeof(cb->broken_why), "%s", why);
	}
}

static int nccl_error(struct cuda_backend *cb, const char *what, unsigned r, ncclResult_t res)
{
	const char *detail = cb->rank[r].comm ? ncclGetLastError(cb->rank[r].comm) : "";
	snprintf(cb->base.error, sizeof(cb->base.error), "%s on local rank %u: %s%s%s", what, r,
		 ncclGetErrorString(res), detail && *detail ? ": " : "", detail ? detail : "");
	abort_comms(cb, cb->base.error);
	return GS_ESYSTEM;
}

/* ---- Waiting without blocking ---------------------------------------------- */

/* Until no communicator is ncclInProgress (after a non-blocking call). */
static int wait_comms(struct cuda_backend *cb, const char *what, int timeout_ms, int cancel_fd)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	unsigned spins = 0;
	for (;;) {
		bool busy = false;
		for (unsigned r = 0; r < cb->n; r++) {
			ncclResult_t st = ncclSuccess;
			ncclResult_t res = ncclCommGetAsyncError(cb->rank[r].comm, &st);
			if (res != ncclSuccess)
				return nccl_error(cb, what, r, res);
			if (st == ncclInProgress)
				busy = true;
			else if (st != ncclSuccess)
				return nccl_error(cb, what, r, st);
		}
		if (!busy)
			return GS_OK;
		if (now_ms() > deadline || cancelled(cancel_fd)) {
			snprintf(cb->base.error, sizeof(cb->base.error), "%s did not finish within %d s",
				 what, timeout_ms / 1000);
			abort_comms(cb, cb->base.error);
			return cancelled(cancel_fd) ? GS_EABORTED : GS_ETIMEDOUT;
		}
		backoff(&spins);
	}
}

/* Until every rank's stream has drained, watching the communicators. */
static int wait_streams(struct cuda_backend *cb, const char *what)
{
	uint64_t deadline = now_ms() + (uint64_t)cb->timeout_ms;
	unsigned spins = 0;
	for (;;) {
		bool busy = false;
		for (unsigned r = 0; r < cb->n; r++) {
			struct cuda_rank *rk = &cb->rank[r];
			cudaError_t e = cudaStreamQuery(rk->stream);
			if (e == cudaErrorNotReady) {
				busy = true;
			} else if (e != cudaSuccess) {
				int rc = cuda_error(cb, what, r, e);
				abort_comms(cb, cb->base.error);
				return rc;
			}
			ncclResult_t st = ncclSuccess;
			if (rk->comm && ncclCommGetAsyncError(rk->comm, &st) == ncclSuccess &&
			    st != ncclSuccess && st != ncclInProgress)
				return nccl_error(cb, what, r, st);
		}
		if (!busy)
			return GS_OK;
		if (now_ms() > deadline) {
			snprintf(cb->base.error, sizeof(cb->base.error),
				 "%s did not finish within %d s (--peer-timeout): a node or a trainer's GPU work is stuck",
				 what, cb->timeout_ms / 1000);
			abort_comms(cb, cb->base.error);
			return GS_ETIMEDOUT;
		}
		backoff(&spins);
	}
}

/* ---- A bucket -------------------------------------------------------------- */

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

/* Until every trainer's ready event has completed, within --peer-timeout.
 * The host waits, not only the stream: NCCL kernels queued behind a
 * trainer's GPU work that never completes (a hung or killed trainer)
 * would make even ncclCommAbort wait for ever, as it synchronises NCCL's
 * stream, which follows ours. The trainer's own host never waits. */
static int wait_ready(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	uint64_t deadline = now_ms() + (uint64_t)cb->timeout_ms;
	unsigned spins = 0;
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		rk->bucket_events = atomic_load(&rk->events);
		if (!rk->bucket_events)
			continue;
		cudaSetDevice(rk->device);
		cudaError_t e;
		while ((e = cudaEventQuery(rk->bucket_events->ready)) == cudaErrorNotReady) {
			if (now_ms() > deadline) {
				snprintf(cb->base.error, sizeof(cb->base.error),
					 "local rank %u's gradients were not ready on its GPU within %d s (--peer-timeout): its GPU work is stuck, or it went away",
					 r, cb->timeout_ms / 1000);
				return GS_ETIMEDOUT;
			}
			backoff(&spins);
		}
		if (e != cudaSuccess)
			return cuda_error(cb, "waiting for the trainer's ready event", r, e);
	}
	return GS_OK;
}

static int prepare(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
	size_t bytes = cb->plan.table_bytes;
	int rc = wait_ready(cb, io);
	for (unsigned r = 0; rc == GS_OK && r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		rc = reserve_tables(cb, r, bytes);
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
			e = cudaStreamWaitEvent(rk->stream, rk->bucket_events->ready, 0);
		if (e != cudaSuccess)
			return cuda_error(cb, "starting the bucket", r, e);
	}
	return rc;
}

/* A staged bucket's home on rank r's GPU: grown to the largest such
 * bucket, and kept. Every bucket ends with the streams drained, so
 * nothing uses the old buffer when it goes. */
static int reserve_stage(struct cuda_backend *cb, unsigned r, size_t bytes)
{
	struct cuda_rank *rk = &cb->rank[r];
	if (bytes <= rk->stage_bytes)
		return GS_OK;
	cudaFree(rk->stage);
	rk->stage = NULL;
	rk->stage_bytes = 0;
	cudaError_t e = cudaMalloc(&rk->stage, bytes);
	if (e != cudaSuccess)
		return cuda_error(cb, "allocating the staging buffer of a bucket larger than --fusion-buffer",
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
			return nccl_error(cb, "ncclAllReduce", r, res);
		}
	}
	ncclResult_t res = ncclGroupEnd();
	if (res != ncclSuccess && res != ncclInProgress)
		return nccl_error(cb, "ncclGroupEnd of the all-reduce", 0, res);
	return wait_comms(cb, "queueing the all-reduce", cb->timeout_ms, -1);
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
		rc = wait_streams(cb, "the all-reduce");
	/* What a ring over the world sends out of this node: the ring leaves
	 * each node once, carrying 2 (W - 1) / W of the buffer. NCCL may pick
	 * a tree; this is the estimate status and metrics show. */
	if (rc == GS_OK && cb->world > cb->n)
		atomic_fetch_add(&cb->base.internode_bytes,
				 2 * (cb->world - 1) * l->elements * gs_wire_size(cb->base.wire) /
					 cb->world);
	return rc;
}

/* Writes launch i's result back to the trainers' tensors. */
static int unpack_launch(struct cuda_backend *cb, const struct gs_bucket_io *io, uint32_t i,
			 bool staged)
{
	const struct gs_cuda_launch *l = &cb->plan.launches[i];
	gs_io_mark(io, GS_MARK_UNPACK, l->start, l->elements);
	for (unsigned r = 0; r < io->nranks; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		/* Every rank holds the same result: count its non-finite values once. */
		cudaError_t e = gs_cuda_launch_unpack(cb->base.wire, launch_entries(rk, l),
						      launch_tasks(rk, l), l->ntasks,
						      launch_buffer(cb, r, l, staged), io->postscale,
						      r == 0 ? &rk->counters[1] : NULL, rk->stream);
		if (e != cudaSuccess)
			return cuda_error(cb, "launching the unpack kernel", r, e);
	}
	if (i + 1 < cb->plan.nlaunches)
		gs_io_mark(io, GS_MARK_DONE, l->start, l->elements);
	return GS_OK;
}

static int finish(struct cuda_backend *cb, const struct gs_bucket_io *io)
{
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
		if (e != cudaSuccess)
			return cuda_error(cb, "ending the bucket", r, e);
	}
	int rc = wait_streams(cb, "unpacking");
	if (rc != GS_OK)
		return rc;
	const struct gs_cuda_launch *last = &cb->plan.launches[cb->plan.nlaunches - 1];
	gs_io_mark(io, GS_MARK_DONE, last->start, last->elements);
	for (unsigned r = 0; r < io->nranks; r++)
		io->clipped[r] += cb->host_counters[2 * r];
	*io->nonfinite += cb->host_counters[1];
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
	for (unsigned r = 0; staged && rc == GS_OK && r < io->nranks; r++) {
		cudaSetDevice(cb->rank[r].device);
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

static int reconnect_alone(struct cuda_backend *cb);

static int cuda_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct cuda_backend *cb = cuda(b);
	if (cb->broken && cb->world == cb->n && reconnect_alone(cb) != GS_OK)
		return GS_ESYSTEM;
	if (cb->broken) {
		snprintf(b->error, sizeof(b->error),
			 "NCCL communicators aborted after: %.100s; rebuilt once a lost node is back (if none was lost, restart gradsyncd on every node)",
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
	int rc = run_bucket(cb, io);
	if (rc != GS_OK)
		abort_comms(cb, b->error);
	return rc;
}

/* ---- Trainers' handles (loop thread) -------------------------------------- */

static struct cuda_import *find_handle(struct cuda_backend *cb, const uint8_t *handle)
{
	for (struct cuda_import *im = cb->imports; im; im = im->next)
		if (im->kind == GS_BUFFER_CUDA && !memcmp(im->handle, handle, sizeof(im->handle)))
			return im;
	return NULL;
}

static int check_device(struct cuda_backend *cb, const struct gs_buffer_desc *d, char *err,
			size_t n)
{
	if (d->rank >= cb->n) {
		snprintf(err, n, "local rank %u has no GPU here", d->rank);
		return GS_EINVAL;
	}
	const struct cuda_rank *rk = &cb->rank[d->rank];
	if (!d->pci_bus_id[0] || !strcasecmp(d->pci_bus_id, rk->pci))
		return GS_OK;
	snprintf(err, n, "it is on GPU %s (the trainer's device %d), but local rank %u reduces on GPU %s (device %d here): run local rank r on the node's GPU r",
		 d->pci_bus_id, (int)d->device, d->rank, rk->pci, rk->device);
	return GS_EBUFFER;
}

/* The allocation must be at least as large as the trainer says, or a
 * tensor could reach past it into other memory of this process. */
static int check_range(struct cuda_backend *cb, void *ptr, uint64_t size, char *err, size_t n)
{
	CUdeviceptr base = 0;
	size_t have = 0;
	if (!cb->mem_range)
		return GS_OK;
	CUresult res = cb->mem_range(&base, &have, (CUdeviceptr)(uintptr_t)ptr);
	if (res != CUDA_SUCCESS) {
		gs_warn("cuda: cuMemGetAddressRange of an imported allocation failed (%d); its size is taken on trust",
			(int)res);
		return GS_OK;
	}
	if (base == (CUdeviceptr)(uintptr_t)ptr && have >= size)
		return GS_OK;
	snprintf(err, n, "the trainer says its allocation has %llu bytes, but the one its handle opens has %zu",
		 (unsigned long long)size, have);
	return GS_EBUFFER;
}

static int import_memory(struct cuda_backend *cb, const struct gs_buffer_desc *d, void **addr,
			 char *err, size_t n)
{
	struct cuda_import *im = find_handle(cb, d->handle);
	if (im) {
		if (im->rank != d->rank || d->size > im->size) {
			snprintf(err, n, "its allocation is already registered by local rank %u with %llu bytes",
				 im->rank, (unsigned long long)im->size);
			return GS_EBUFFER;
		}
		im->refs++;
		*addr = im->ptr;
		return GS_OK;
	}
	const struct cuda_rank *rk = &cb->rank[d->rank];
	cudaSetDevice(rk->device);
	cudaIpcMemHandle_t h;
	memcpy(&h, d->handle, sizeof(h));
	void *ptr = NULL;
	cudaError_t e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, n, "cannot open its CUDA IPC handle: %s (is the trainer on this node, and the allocation still alive?)",
			 cudaGetErrorString(e));
		return GS_EBUFFER;
	}
	int rc = check_range(cb, ptr, d->size, err, n);
	im = rc == GS_OK ? calloc(1, sizeof(*im)) : NULL;
	if (!im) {
		cudaIpcCloseMemHandle(ptr);
		if (rc == GS_OK)
			snprintf(err, n, "out of memory");
		return rc == GS_OK ? GS_ENOMEM : rc;
	}
	im->kind = GS_BUFFER_CUDA;
	im->rank = d->rank;
	im->refs = 1;
	memcpy(im->handle, d->handle, sizeof(im->handle));
	im->ptr = ptr;
	im->size = d->size;
	im->next = cb->imports;
	cb->imports = im;
	*addr = ptr;
	return GS_OK;
}

static int import_events(struct cuda_backend *cb, const struct gs_buffer_desc *d, void **addr,
			 char *err, size_t n)
{
	struct cuda_rank *rk = &cb->rank[d->rank];
	struct cuda_import *im = calloc(1, sizeof(*im));
	if (!im) {
		snprintf(err, n, "out of memory");
		return GS_ENOMEM;
	}
	cudaSetDevice(rk->device);
	cudaIpcEventHandle_t ready, done;
	memcpy(&ready, d->ready_event, sizeof(ready));
	memcpy(&done, d->done_event, sizeof(done));
	cudaError_t e = cudaIpcOpenEventHandle(&im->ready, ready);
	if (e == cudaSuccess) {
		e = cudaIpcOpenEventHandle(&im->done, done);
		if (e != cudaSuccess)
			cudaEventDestroy(im->ready);
	}
	if (e != cudaSuccess) {
		cudaGetLastError();
		free(im);
		snprintf(err, n, "cannot open its CUDA IPC events: %s (were they created with cudaEventInterprocess?)",
			 cudaGetErrorString(e));
		return GS_EBUFFER;
	}
	im->kind = GS_BUFFER_CUDA_EVENTS;
	im->rank = d->rank;
	im->refs = 1;
	im->next = cb->imports;
	cb->imports = im;
	atomic_store(&rk->events, im);
	*addr = im;
	return GS_OK;
}

static int cuda_import(struct gs_backend *b, const struct gs_buffer_desc *d, void **addr,
		       char *err, size_t n)
{
	struct cuda_backend *cb = cuda(b);
	if (d->kind == GS_BUFFER_MEMFD) {
		snprintf(err, n, "it is shared memory, but this gradsyncd runs the cuda backend, which reduces GPU memory: register CUDA tensors (gs_register_cuda)");
		return GS_EBUFFER;
	}
	int rc = check_device(cb, d, err, n);
	if (rc != GS_OK)
		return rc;
	if (d->kind == GS_BUFFER_CUDA_EVENTS)
		return import_events(cb, d, addr, err, n);
	return import_memory(cb, d, addr, err, n);
}

static void close_import(struct cuda_backend *cb, struct cuda_import *im)
{
	struct cuda_rank *rk = &cb->rank[im->rank];
	cudaSetDevice(rk->device);
	if (im->kind == GS_BUFFER_CUDA_EVENTS) {
		struct cuda_import *mine = im;
		atomic_compare_exchange_strong(&rk->events, &mine, NULL);
		cudaEventDestroy(im->ready);
		cudaEventDestroy(im->done);
	} else {
		cudaIpcCloseMemHandle(im->ptr);
	}
	free(im);
}

static void cuda_release(struct gs_backend *b, void *addr, uint64_t size)
{
	struct cuda_backend *cb = cuda(b);
	for (struct cuda_import **p = &cb->imports; *p; p = &(*p)->next) {
		struct cuda_import *im = *p;
		bool match = im->kind == GS_BUFFER_CUDA_EVENTS ? (void *)im == addr : im->ptr == addr;
		if (!match)
			continue;
		if (--im->refs == 0) {
			*p = im->next;
			close_import(cb, im);
		}
		return;
	}
}

/* ---- Set-up and tear-down ------------------------------------------------------ */

/* Whether every stream has drained within timeout_ms (shutting down). */
static bool streams_drained(struct cuda_backend *cb, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	unsigned spins = 0;
	for (unsigned r = 0; r < cb->n; r++) {
		while (cb->rank[r].stream && cudaStreamQuery(cb->rank[r].stream) == cudaErrorNotReady) {
			if (now_ms() > deadline)
				return false;
			backoff(&spins);
		}
	}
	return true;
}

#define SHUTDOWN_DRAIN_MS 5000

static void cuda_destroy(struct gs_backend *b)
{
	struct cuda_backend *cb = cuda(b);
	/* Abort rather than destroy: shutting down must not wait for peers.
	 * Trainers' memory and events are closed, and buffers freed, only
	 * once nothing queued can touch them; else they are left to the
	 * process's exit. */
	gs_backend_cuda_disconnect(b);
	if (!streams_drained(cb, SHUTDOWN_DRAIN_MS)) {
		gs_warn("cuda: GPU work still queued after %d s at shutdown: leaving the trainers' mappings to the exit",
			SHUTDOWN_DRAIN_MS / 1000);
		return;
	}
	while (cb->imports) {
		struct cuda_import *im = cb->imports;
		cb->imports = im->next;
		close_import(cb, im);
	}
	for (unsigned r = 0; r < cb->n; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		cudaSetDevice(rk->device);
		cudaFree(rk->fusion);
		cudaFree(rk->counters);
		cudaFree(rk->table);
		cudaFreeHost(rk->staging);
		cudaFree(rk->stage);
		if (rk->stream)
			cudaStreamDestroy(rk->stream);
	}
	cudaFreeHost(cb->host_counters);
	gs_cuda_bucket_plan_free(&cb->plan);
	free(cb);
}

static const struct gs_backend_ops cuda_ops = {
	.import_buffer = cuda_import,
	.release_buffer = cuda_release,
	.reduce_bucket = cuda_reduce_bucket,
	.destroy = cuda_destroy,
};

bool gs_backend_is_cuda(const struct gs_backend *b)
{
	return b && b->ops == &cuda_ops;
}

static int setup_rank(struct cuda_backend *cb, unsigned r, char *why, size_t n)
{
	struct cuda_rank *rk = &cb->rank[r];
	struct cudaDeviceProp p;
	rk->device = (int)r;
	cudaError_t e = cudaSetDevice(rk->device);
	if (e == cudaSuccess)
		e = cudaGetDeviceProperties(&p, rk->device);
	if (e == cudaSuccess)
		e = cudaDeviceGetPCIBusId(rk->pci, sizeof(rk->pci), rk->device);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaMalloc(&rk->fusion, cb->base.fusion_elements * sizeof(float));
	if (e == cudaSuccess)
		e = cudaMalloc((void **)&rk->counters, 2 * sizeof(*rk->counters));
	if (e != cudaSuccess) {
		snprintf(why, n, "setting up GPU %u: %s (%s)", r, cudaGetErrorString(e),
			 cudaGetErrorName(e));
		cudaGetLastError();
		return GS_ESYSTEM;
	}
	gs_info("cuda: local rank %u on GPU %d, %s (%s, compute capability %d.%d), fusion buffer of %llu MiB",
		r, rk->device, p.name, rk->pci, p.major, p.minor,
		(unsigned long long)(cb->base.fusion_elements * sizeof(float) >> 20));
	return GS_OK;
}

struct gs_backend *gs_backend_cuda_create(const struct gs_cuda_options *o, char *why, size_t n)
{
	if (o->local_size == 0 || o->local_size > MAX_RANKS) {
		snprintf(why, n, "--local-size %u is out of range", o->local_size);
		return NULL;
	}
	struct cuda_backend *cb = calloc(1, sizeof(*cb));
	if (!cb) {
		snprintf(why, n, "out of memory");
		return NULL;
	}
	cb->base.name = "cuda";
	cb->base.ops = &cuda_ops;
	cb->base.local_size = o->local_size;
	cb->base.wire = o->wire;
	cb->base.fusion_elements = o->fusion_elements;
	cb->n = o->local_size;
	cb->timeout_ms = o->peer_timeout_ms;
	for (unsigned r = 0; r < cb->n; r++) {
		if (setup_rank(cb, r, why, n) != GS_OK)
			goto err;
	}
	cudaError_t e = cudaHostAlloc((void **)&cb->host_counters,
				      2 * cb->n * sizeof(*cb->host_counters), cudaHostAllocPortable);
	if (e != cudaSuccess) {
		snprintf(why, n, "allocating pinned memory: %s", cudaGetErrorString(e));
		goto err;
	}
	enum cudaDriverEntryPointQueryResult found;
	if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&cb->mem_range,
					     12000, cudaEnableDefault, &found) != cudaSuccess ||
	    found != cudaDriverEntryPointSuccess) {
		cb->mem_range = NULL;
		gs_warn("cuda: cuMemGetAddressRange is not available; trainers' allocation sizes are taken on trust");
	}
	return &cb->base;
err:
	cuda_destroy(&cb->base);
	return NULL;
}

/* ---- Communicators ----------------------------------------------------------------- */

int gs_cuda_nccl_uid(uint8_t uid[GS_NCCL_UID_BYTES], char *why, size_t n)
{
	ncclUniqueId id;
	ncclResult_t res = ncclGetUniqueId(&id);
	if (res != ncclSuccess) {
		snprintf(why, n, "ncclGetUniqueId: %s", ncclGetErrorString(res));
		return GS_ESYSTEM;
	}
	memcpy(uid, id.internal, GS_NCCL_UID_BYTES);
	return GS_OK;
}

int gs_backend_cuda_connect(struct gs_backend *b, const uint8_t uid[GS_NCCL_UID_BYTES],
			    uint32_t rank_base, uint32_t world, int timeout_ms, int cancel_fd,
			    char *why, size_t n)
{
	struct cuda_backend *cb = cuda(b);
	gs_backend_cuda_disconnect(b);
	ncclUniqueId id;
	memcpy(id.internal, uid, GS_NCCL_UID_BYTES);
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	config.blocking = 0; /* so a stuck collective can be aborted */
	int rc = GS_OK;
	unsigned failed = 0;
	ncclResult_t res = ncclSuccess;
	ncclGroupStart();
	for (unsigned r = 0; r < cb->n; r++) {
		cudaSetDevice(cb->rank[r].device);
		res = ncclCommInitRankConfig(&cb->rank[r].comm, (int)world, id,
					     (int)(rank_base + r), &config);
		if (res != ncclSuccess && res != ncclInProgress) {
			failed = r;
			break;
		}
	}
	/* The group ends before any abort: aborting inside it would make the
	 * others' creation blocking. */
	ncclResult_t end = ncclGroupEnd();
	if (res != ncclSuccess && res != ncclInProgress)
		rc = nccl_error(cb, "ncclCommInitRankConfig", failed, res);
	else if (end != ncclSuccess && end != ncclInProgress)
		rc = nccl_error(cb, "ncclGroupEnd of the communicators' creation", 0, end);
	if (rc == GS_OK)
		rc = wait_comms(cb, "creating the NCCL communicators", timeout_ms, cancel_fd);
	if (rc != GS_OK) {
		snprintf(why, n, "%s", b->error);
		abort_comms(cb, why);
		return rc;
	}
	cb->connected = true;
	cb->world = world;
	gs_info("cuda: %u NCCL communicators ready, global ranks %u to %u of %u", cb->n, rank_base,
		rank_base + cb->n - 1, world);
	return GS_OK;
}

void gs_backend_cuda_disconnect(struct gs_backend *b)
{
	struct cuda_backend *cb = cuda(b);
	for (unsigned r = 0; r < cb->n; r++) {
		if (cb->rank[r].comm)
			ncclCommAbort(cb->rank[r].comm);
		cb->rank[r].comm = NULL;
	}
	cb->connected = false;
	cb->broken = false;
}

/* Alone (one node), the communicators an all-reduce failure aborted are
 * rebuilt at the next bucket with a fresh unique id, once the streams
 * have drained the aborted work: the daemon need not be restarted. */
static int reconnect_alone(struct cuda_backend *cb)
{
	char why[sizeof(cb->base.error)];
	int rc = wait_streams(cb, "draining the aborted all-reduce");
	if (rc == GS_OK) {
		gs_warn("cuda: rebuilding the NCCL communicators aborted after: %s", cb->broken_why);
		uint8_t uid[GS_NCCL_UID_BYTES];
		rc = gs_cuda_nccl_uid(uid, why, sizeof(why));
		if (rc == GS_OK)
			rc = gs_backend_cuda_connect(&cb->base, uid, 0, cb->n, cb->timeout_ms, -1, why,
						     sizeof(why));
	} else {
		snprintf(why, sizeof(why), "%s", cb->base.error);
	}
	if (rc != GS_OK)
		snprintf(cb->base.error, sizeof(cb->base.error),
			 "cannot rebuild the NCCL communicators aborted after: %.80s: %.110s",
			 cb->broken_why, why);
	return rc;
}
