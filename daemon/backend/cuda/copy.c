/*
 * A trainer's state, copied between trainers' GPU memory (the backend's
 * copy_bytes), on the worker thread between steps: one copy, device to
 * device (across GPUs too: CUDA's unified addressing finds both ends),
 * queued on the stream of the local rank whose GPU holds the destination,
 * so it follows whatever that rank's buckets queued there, and waited for
 * within --peer-timeout, so the trainers are answered only once their
 * state holds the source's bytes.
 */
#include <stdio.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"

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

/* Until rank r's stream has drained, within --peer-timeout. */
static int wait_stream(struct cuda_backend *cb, unsigned r)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)cb->timeout_ms;
	unsigned spins = 0;
	for (;;) {
		cudaError_t e = cudaStreamQuery(cb->rank[r].stream);
		if (e == cudaSuccess)
			return GS_OK;
		if (e != cudaErrorNotReady)
			return cuda_error(cb, "copying a trainer's state", r, e);
		if (cuda_now_ms() > deadline) {
			snprintf(cb->base.error, sizeof(cb->base.error),
				 "copying a trainer's state on local rank %u's GPU %d did not finish within %d s (--peer-timeout)",
				 r, cb->rank[r].device, cb->timeout_ms / 1000);
			return GS_ETIMEDOUT;
		}
		cuda_backoff(&spins);
	}
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
	return wait_stream(cb, (unsigned)r);
}
