/*
 * The CUDA backend: setting up each local rank's GPU (stream, counters)
 * once its trainer's first buffer says which it is, sizing the fusion
 * buffers by the job's plan, and tearing it all down. The rest is in the
 * files cuda_private.h names.
 */
#include "backend/cuda/backend_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "backend/fusion_budget.h"
#include "errors.h"
#include "support/log.h"

_Static_assert(GS_NCCL_UID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");
_Static_assert(GS_CUDA_IPC_HANDLE_SIZE == sizeof(cudaIpcMemHandle_t), "IPC handle size");
_Static_assert(GS_CUDA_IPC_HANDLE_SIZE == sizeof(cudaIpcEventHandle_t), "IPC handle size");

/* Whether every stream has drained within timeout_ms (shutting down). */
static bool streams_drained(struct cuda_backend *cb, int timeout_ms)
{
	return cuda_wait_streams_within(cb, "draining the streams at shutdown", timeout_ms) == GS_OK;
}

#define SHUTDOWN_DRAIN_MS 5000

static void cuda_destroy(struct gs_backend *b)
{
	struct cuda_backend *cb = cuda(b);
	/* Abort rather than destroy: shutting down must not wait for peers.
	 * Trainers' memory and events are closed, and buffers freed, only
	 * once nothing queued can touch them; else they are left to the
	 * process's exit. */
	cuda_disconnect(b);
	if (!streams_drained(cb, SHUTDOWN_DRAIN_MS)) {
		gs_warn("cuda: GPU work still queued after %d s at shutdown: leaving the trainers' mappings to the exit",
			SHUTDOWN_DRAIN_MS / 1000);
		return;
	}
	while (cb->imports) {
		struct cuda_import *im = cb->imports;
		cb->imports = im->next;
		cuda_close_import(cb, im);
	}
	for (unsigned r = 0; r < cb->n; r++) {
		struct cuda_rank *rk = &cb->rank[r];
		if (!rk->bound)
			continue;
		cudaSetDevice(rk->device);
		cudaFree(rk->fusion);
		cudaFree(rk->counters);
		cudaFree(rk->table);
		cudaFreeHost(rk->staging);
		cudaFree(rk->stage);
		if (rk->stream)
			cudaStreamDestroy(rk->stream);
		if (rk->watch)
			cudaStreamDestroy(rk->watch);
		if (rk->drained)
			cudaEventDestroy(rk->drained);
	}
	cuda_wake_free(cb->wake);
	cudaFreeHost(cb->host_counters);
	cudaFreeHost(cb->state_stage);
	gs_cuda_bucket_plan_free(&cb->plan);
	char why[8];
	gs_fusion_budget_resize(cb->budget, &b->fusion_bytes, 0, why, sizeof(why));
	free(cb);
}

int cuda_size_buffers(struct gs_backend *b, const struct gs_plan *p, char *err, size_t errlen)
{
	struct cuda_backend *cb = cuda(b);
	uint64_t elements = gs_plan_fusion_elements(p, b->fusion_elements);
	/* Only a bucket of several launches between nodes is staged (bucket.c). */
	uint64_t staged = cb->nodes > 1 ? gs_plan_staged_elements(p, b->fusion_elements) : 0;
	uint64_t bytes = cb->n * (elements * sizeof(float) + staged * gs_wire_size(b->wire));
	int rc = gs_fusion_budget_resize(cb->budget, &b->fusion_bytes, bytes, err, errlen);
	if (rc != GS_OK)
		return rc;
	cb->want_elements = elements;
	cb->want_stage_elements = staged;
	return GS_OK;
}

static const struct gs_backend_ops cuda_ops = {
	.size_buffers = cuda_size_buffers,
	.import_buffer = cuda_import_buffer,
	.release_buffer = cuda_release_buffer,
	.copy_bytes = cuda_copy_bytes,
	.broadcast_bytes = cuda_broadcast_bytes,
	.reduce_bucket = cuda_reduce_bucket,
	.join_group = cuda_join_group,
	.leave_group = cuda_leave_group,
	.destroy = cuda_destroy,
};

int cuda_bind_rank(struct cuda_backend *cb, unsigned r, int device, char *why, size_t n)
{
	struct cuda_rank *rk = &cb->rank[r];
	struct cudaDeviceProp p;
	cudaError_t e = cudaSetDevice(device);
	if (e == cudaSuccess)
		e = cudaGetDeviceProperties(&p, device);
	if (e == cudaSuccess)
		e = cudaDeviceGetPCIBusId(rk->pci, sizeof(rk->pci), device);
	if (e == cudaSuccess && p.major < MIN_CC_MAJOR) {
		snprintf(why, n, "it is on GPU %s (%s), of compute capability %d.%d: the kernels of this build need %d.0 or later",
			 rk->pci, p.name, p.major, p.minor, MIN_CC_MAJOR);
		return GS_EBUFFER;
	}
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaMalloc((void **)&rk->counters, 2 * sizeof(*rk->counters));
	if (e != cudaSuccess) {
		snprintf(why, n, "setting up GPU %s (device %d here) for local rank %u: %s (%s)",
			 rk->pci, device, r, cudaGetErrorString(e), cudaGetErrorName(e));
		cudaGetLastError();
		if (rk->stream)
			cudaStreamDestroy(rk->stream);
		rk->stream = NULL;
		return GS_ESYSTEM;
	}
	rk->device = device;
	rk->bound = true;
	gs_info("cuda: local rank %u on GPU %s (device %d here, %s, compute capability %d.%d)",
		r, rk->pci, device, p.name, p.major, p.minor);
	return GS_OK;
}

struct gs_backend *cuda_create(const struct gs_cuda_options *o, char *why, size_t n)
{
	if (o->local_size == 0 || o->local_size > MAX_RANKS) {
		snprintf(why, n, "local size %u is out of range", o->local_size);
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
	cb->join_timeout_ms = o->join_timeout_ms;
	cb->nodes = o->nodes;
	cb->budget = o->budget;
	snprintf(cb->gpus, sizeof(cb->gpus), "%s", o->gpus ? o->gpus : "");
	if (cuda_parse_gpus(o->gpus, cb->allowed, why, n) != GS_OK)
		goto err;
	cb->wake = cuda_wake_new();
	if (!cb->wake) {
		snprintf(why, n, "making the GPU's wake-up eventfd: %s", strerror(errno));
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
