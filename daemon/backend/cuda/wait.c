/*
 * Waiting on the GPUs without blocking: the host polls the streams and the
 * communicators' async errors, so a peer that stops or an NCCL error ends
 * the wait within --peer-timeout, and then every communicator is aborted
 * (ncclCommAbort). And the words of CUDA and NCCL errors.
 */
#include <poll.h>
#include <stdio.h>
#include <time.h>

#include "backend/cuda/cuda_private.h"
#include "clock.h"
#include "errors.h"

uint64_t cuda_now_ms(void)
{
	return gs_now_ns() / 1000000;
}

/* A small bucket's all-reduce takes tens of microseconds, a large one
 * milliseconds: spin SPIN_NS first, then sleep, a little longer each time
 * up to SLEEP_MAX_NS. Never sched_yield: on a core a busy neighbour
 * shares, a yield hands it the CPU for its whole slice, where a sleeper
 * woken by its timer preempts it at once. */
#define SPIN_NS 20000
#define SLEEP_MIN_NS 10000
#define SLEEP_MAX_NS 200000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

void cuda_backoff(struct cuda_backoff *b)
{
	uint64_t now = gs_now_ns();
	if (b->since == 0)
		b->since = now;
	if (now - b->since < SPIN_NS) {
		for (int i = 0; i < 64; i++)
			cpu_relax();
		return;
	}
	b->sleep_ns = b->sleep_ns ? b->sleep_ns * 2 : SLEEP_MIN_NS;
	if (b->sleep_ns > SLEEP_MAX_NS)
		b->sleep_ns = SLEEP_MAX_NS;
	struct timespec ts = { 0, (long)b->sleep_ns };
	nanosleep(&ts, NULL);
}

static bool cancelled(int fd)
{
	struct pollfd p = { fd, POLLIN, 0 };
	return fd >= 0 && poll(&p, 1, 0) > 0;
}

/* ---- Errors -------------------------------------------------------------- */

int cuda_error(struct cuda_backend *cb, const char *what, unsigned r, cudaError_t e)
{
	snprintf(cb->base.error, sizeof(cb->base.error), "%s on local rank %u's GPU %d: %s (%s)",
		 what, r, cb->rank[r].device, cudaGetErrorString(e), cudaGetErrorName(e));
	cudaGetLastError(); /* clear it: this thread goes on */
	return GS_ESYSTEM;
}

/* After an all-reduce failed or timed out the communicators cannot be
 * trusted: abort them all, so no rank stays blocked in a collective. */
void cuda_abort_comms(struct cuda_backend *cb, const char *why)
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

int cuda_nccl_error(struct cuda_backend *cb, const char *what, unsigned r, ncclResult_t res)
{
	const char *detail = cb->rank[r].comm ? ncclGetLastError(cb->rank[r].comm) : "";
	snprintf(cb->base.error, sizeof(cb->base.error), "%s on local rank %u: %s%s%s", what, r,
		 ncclGetErrorString(res), detail && *detail ? ": " : "", detail ? detail : "");
	cuda_abort_comms(cb, cb->base.error);
	return GS_ESYSTEM;
}

/* ---- Waiting without blocking ---------------------------------------------- */

/* Until no communicator is ncclInProgress (after a non-blocking call). */
int cuda_wait_comms(struct cuda_backend *cb, const char *what, int timeout_ms, int cancel_fd)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)timeout_ms;
	struct cuda_backoff backoff = { 0 };
	for (;;) {
		bool busy = false;
		for (unsigned r = 0; r < cb->n; r++) {
			ncclResult_t st = ncclSuccess;
			ncclResult_t res = ncclCommGetAsyncError(cb->rank[r].comm, &st);
			if (res != ncclSuccess)
				return cuda_nccl_error(cb, what, r, res);
			if (st == ncclInProgress)
				busy = true;
			else if (st != ncclSuccess)
				return cuda_nccl_error(cb, what, r, st);
		}
		if (!busy)
			return GS_OK;
		if (cuda_now_ms() > deadline || cancelled(cancel_fd)) {
			snprintf(cb->base.error, sizeof(cb->base.error), "%s did not finish within %d s",
				 what, timeout_ms / 1000);
			cuda_abort_comms(cb, cb->base.error);
			return cancelled(cancel_fd) ? GS_EABORTED : GS_ETIMEDOUT;
		}
		cuda_backoff(&backoff);
	}
}

/* Until every rank's stream has drained, watching the communicators. */
int cuda_wait_streams(struct cuda_backend *cb, const char *what)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)cb->timeout_ms;
	struct cuda_backoff backoff = { 0 };
	for (;;) {
		bool busy = false;
		for (unsigned r = 0; r < cb->n; r++) {
			struct cuda_rank *rk = &cb->rank[r];
			cudaError_t e = cudaStreamQuery(rk->stream);
			if (e == cudaErrorNotReady) {
				busy = true;
			} else if (e != cudaSuccess) {
				int rc = cuda_error(cb, what, r, e);
				cuda_abort_comms(cb, cb->base.error);
				return rc;
			}
			ncclResult_t st = ncclSuccess;
			if (rk->comm && ncclCommGetAsyncError(rk->comm, &st) == ncclSuccess &&
			    st != ncclSuccess && st != ncclInProgress)
				return cuda_nccl_error(cb, what, r, st);
		}
		if (!busy)
			return GS_OK;
		if (cuda_now_ms() > deadline) {
			snprintf(cb->base.error, sizeof(cb->base.error),
				 "%s did not finish within %d s (--peer-timeout): a node or a trainer's GPU work is stuck",
				 what, cb->timeout_ms / 1000);
			cuda_abort_comms(cb, cb->base.error);
			return GS_ETIMEDOUT;
		}
		cuda_backoff(&backoff);
	}
}
