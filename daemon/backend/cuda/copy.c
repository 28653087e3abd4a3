/*
 * A trainer's state, on the worker thread between steps. Within the node
 * (copy_bytes): one copy, device to device (across GPUs too: CUDA's
 * unified addressing finds both ends), queued on the stream of the local
 * rank whose GPU holds the destination, so it follows whatever that
 * rank's buckets queued there, and waited for within --peer-timeout, so
 * the trainers are answered only once their state holds the source's
 * bytes. Between nodes (broadcast_bytes): over the group's Gloo, as the
 * host backend does, host memory (the engine's headers and layouts)
 * straight and GPU memory through one pinned staging buffer, a chunk at
 * a time: the NCCL communicators are made for buckets, at the first one,
 * and take every local GPU to each collective.
 */
#include <stdio.h>

#include "backend/cuda/cuda_private.h"
#include "backend/gloo/gloo_comm.h"
#include "errors.h"

#define STATE_STAGE_BYTES ((size_t)4 << 20)

/* The bound local rank whose GPU holds p, or -1 (the reason in error). */
static int rank_of(struct cuda_backend *cb, const void *p)
{
	struct cudaPointerAttributes a;
	cudaError_t e = cudaPointerGetAttributes(&a, p);
	if (e != cudaSuccess) {
		snprintf(cb->base.error, sizeof(cb->base.error),
			 "cudaPointerGetAttributes of a trainer's state: %s (%s)",
			 cudaGetErrorString(e), cudaGetErrorName(e));
		cudaGetLastError();
		return -1;
	}
	for (unsigned r = 0; r < cb->n; r++)
		if (cb->rank[r].bound && cb->rank[r].device == a.device)
			return (int)r;
	snprintf(cb->base.error, sizeof(cb->base.error),
		 "a trainer's state at %p is on device %d, which no local rank here reduces on", p,
		 a.device);
	return -1;
}

int cuda_copy_bytes(struct gs_backend *b, void *dst, const void *src, uint64_t n)
{
	struct cuda_backend *cb = cuda(b);
	int r = rank_of(cb, dst);
	if (r < 0)
		return GS_EBUFFER;
	struct cuda_rank *rk = &cb->rank[r];
	cudaError_t e = cudaSetDevice(rk->device);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, rk->stream);
	if (e != cudaSuccess)
		return cuda_error(cb, "queueing a copy of a trainer's state (cudaMemcpyAsync)",
				  (unsigned)r, e);
	return cuda_wait_stream(cb, (unsigned)r, "copying a trainer's state");
}

/* ---- Between nodes ------------------------------------------------------------ */

static int stage_copy(struct cuda_backend *cb, unsigned r, void *dst, const void *src,
		      size_t n, enum cudaMemcpyKind kind)
{
	cudaError_t e = cudaSetDevice(cb->rank[r].device);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(dst, src, n, kind, cb->rank[r].stream);
	if (e != cudaSuccess)
		return cuda_error(cb, "staging a trainer's state (cudaMemcpyAsync)", r, e);
	return cuda_wait_stream(cb, r, "copying a trainer's state");
}

static int gloo_bcast(struct cuda_backend *cb, void *buf, size_t n, uint32_t root)
{
	return gs_gloo_broadcast(cb->gloo, buf, n, (int)root, cb->timeout_ms, cb->base.error,
				 sizeof(cb->base.error));
}

/* GPU memory of local rank r's GPU, through the staging buffer. */
static int bcast_device(struct cuda_backend *cb, unsigned r, char *buf, uint64_t n,
			uint32_t root)
{
	if (!cb->state_stage) {
		cudaError_t e = cudaHostAlloc(&cb->state_stage, STATE_STAGE_BYTES,
					      cudaHostAllocPortable);
		if (e != cudaSuccess) {
			cb->state_stage = NULL;
			return cuda_error(cb, "allocating pinned memory to stage state", r, e);
		}
	}
	bool sender = root == cb->node_rank;
	for (uint64_t off = 0; off < n; off += STATE_STAGE_BYTES) {
		size_t len = n - off < STATE_STAGE_BYTES ? (size_t)(n - off) : STATE_STAGE_BYTES;
		int rc = sender ? stage_copy(cb, r, cb->state_stage, buf + off, len,
					     cudaMemcpyDeviceToHost)
				: GS_OK;
		if (rc == GS_OK)
			rc = gloo_bcast(cb, cb->state_stage, len, root);
		if (rc == GS_OK && !sender)
			rc = stage_copy(cb, r, buf + off, cb->state_stage, len,
					cudaMemcpyHostToDevice);
		if (rc != GS_OK)
			return rc;
	}
	return GS_OK;
}

int cuda_broadcast_bytes(struct gs_backend *b, void *buf, uint64_t n, uint32_t root)
{
	struct cuda_backend *cb = cuda(b);
	if (!cb->gloo) {
		snprintf(b->error, sizeof(b->error), "no group of nodes to broadcast in");
		return GS_ESTATE;
	}
	struct cudaPointerAttributes a;
	cudaError_t e = cudaPointerGetAttributes(&a, buf);
	if (e != cudaSuccess) {
		snprintf(b->error, sizeof(b->error), "cudaPointerGetAttributes: %s (%s)",
			 cudaGetErrorString(e), cudaGetErrorName(e));
		cudaGetLastError();
		return GS_ESYSTEM;
	}
	int rc;
	if (a.type == cudaMemoryTypeDevice) {
		int r = rank_of(cb, buf);
		rc = r < 0 ? GS_EBUFFER : bcast_device(cb, (unsigned)r, buf, n, root);
	} else {
		rc = gloo_bcast(cb, buf, (size_t)n, root);
	}
	if (rc == GS_OK && root == cb->node_rank)
		atomic_fetch_add(&b->internode_bytes, n);
	return rc;
}
