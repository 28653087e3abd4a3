/*
 * Waiting on the GPUs: the host spins a little, then sleeps until a
 * wake-up queued behind the stream's work (wake.c), looking at the
 * communicators' async errors meanwhile, so a peer that stops or an NCCL
 * error ends the wait within --peer-timeout, and then every communicator
 * is aborted (ncclCommAbort). And the words of CUDA and NCCL errors.
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

/* A small bucket's all-reduce takes tens of microseconds: spin SPIN_NS
 * first, then sleep until a wake-up (wake.c), or, where nothing can wake
 * us (NCCL's non-blocking calls), a little longer each time up to
 * SLEEP_MAX_NS. Never sched_yield: on a core a busy neighbour shares, a
 * yield hands it the CPU for its whole slice, where a sleeper woken by an
 * eventfd or its timer preempts it at once. While asleep on a stream, look
 * at the communicators' errors every ERRORS_MS: NCCL reports a dead peer
 * there, not on the stream. */
#define SPIN_NS 20000
#define SLEEP_MIN_NS 10000
#define SLEEP_MAX_NS 200000
#define ERRORS_MS 100

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

bool cuda_wait_spin(struct cuda_wait *w)
{
	uint64_t now = gs_now_ns();
	if (w->since == 0)
		w->since = now;
	if (now - w->since >= SPIN_NS)
		return false;
	for (int i = 0; i < 64; i++)
		cpu_relax();
	return true;
}

void cuda_wait_pause(struct cuda_wait *w)
{
	if (cuda_wait_spin(w))
		return;
	w->sleep_ns = w->sleep_ns ? w->sleep_ns * 2 : SLEEP_MIN_NS;
	if (w->sleep_ns > SLEEP_MAX_NS)
		w->sleep_ns = SLEEP_MAX_NS;
	struct timespec ts = { 0, (long)w->sleep_ns };
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

/* ---- Waiting ------------------------------------------------------------ */

/* Until no communicator is ncclInProgress (after a non-blocking call).
 * NCCL gives nothing to sleep on here: cuda_wait_pause polls. */
int cuda_wait_comms(struct cuda_backend *cb, const char *what, int timeout_ms, int cancel_fd)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)timeout_ms;
	struct cuda_wait wait = { 0 };
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
		cuda_wait_pause(&wait);
	}
}

/* Whether rank r's stream is still busy: its own query, or once a wait
 * queued a wake-up, the query of the event recorded before it (the
 * stream's query counts the wake-up's host function too, which may still
 * be running when it has woken us). An error of its stream or its
 * communicator is worded in cb->base.error (rc). */
static bool stream_busy(struct cuda_backend *cb, unsigned r, bool armed, const char *what,
			int *rc)
{
	struct cuda_rank *rk = &cb->rank[r];
	if (!rk->stream) /* not set up: nothing queued */
		return false;
	cudaError_t e = armed ? cudaEventQuery(rk->drained) : cudaStreamQuery(rk->stream);
	if (e != cudaSuccess && e != cudaErrorNotReady) {
		*rc = cuda_error(cb, what, r, e);
		cuda_abort_comms(cb, cb->base.error);
		return false;
	}
	ncclResult_t st = ncclSuccess;
	if (rk->comm && ncclCommGetAsyncError(rk->comm, &st) == ncclSuccess && st != ncclSuccess &&
	    st != ncclInProgress) {
		*rc = cuda_nccl_error(cb, what, r, st);
		return false;
	}
	return e == cudaErrorNotReady;
}

/* Records rank r's drained event behind the work queued so far, and a
 * wake-up behind that. */
static cudaError_t arm(struct cuda_backend *cb, unsigned r)
{
	struct cuda_rank *rk = &cb->rank[r];
	cudaError_t e = cudaSetDevice(rk->device);
	if (e == cudaSuccess && !rk->drained)
		e = cudaEventCreateWithFlags(&rk->drained, cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = cudaEventRecord(rk->drained, rk->stream);
	if (e == cudaSuccess)
		e = cuda_wake_after(cb->wake, rk->stream);
	return e;
}

/* Until the streams of local ranks [lo, hi) have drained, within
 * timeout_ms, watching the communicators: spins, then queues a wake-up
 * behind each busy stream's work and sleeps until it comes. */
static int wait_streams(struct cuda_backend *cb, const char *what, unsigned lo, unsigned hi,
			int timeout_ms)
{
	uint64_t deadline = cuda_now_ms() + (uint64_t)timeout_ms;
	struct cuda_wait wait = { 0 };
	bool armed = false;
	for (;;) {
		bool busy[MAX_RANKS] = { false }, any = false;
		for (unsigned r = lo; r < hi; r++) {
			int rc = GS_OK;
			busy[r] = stream_busy(cb, r, armed, what, &rc);
			if (rc != GS_OK)
				return rc;
			any |= busy[r];
		}
		if (!any)
			return GS_OK;
		uint64_t now = cuda_now_ms();
		if (now > deadline) {
			snprintf(cb->base.error, sizeof(cb->base.error),
				 "%s did not finish within %d s%s: a node or a trainer's GPU work is stuck",
				 what, timeout_ms / 1000,
				 timeout_ms == cb->timeout_ms ? " (--peer-timeout)" : "");
			cuda_abort_comms(cb, cb->base.error);
			return GS_ETIMEDOUT;
		}
		if (cuda_wait_spin(&wait))
			continue;
		if (!armed) {
			/* Every stream, so that each is looked at the same way;
			 * then look again: they may have drained meanwhile. */
			for (unsigned r = lo; r < hi; r++) {
				cudaError_t e = cb->rank[r].stream ? arm(cb, r) : cudaSuccess;
				if (e != cudaSuccess) {
					int rc = cuda_error(cb, "queueing a wake-up", r, e);
					cuda_abort_comms(cb, cb->base.error);
					return rc;
				}
			}
			armed = true;
			continue;
		}
		cuda_wake_sleep(cb->wake, -1, now + ERRORS_MS < deadline ? now + ERRORS_MS : deadline + 1);
	}
}

int cuda_wait_streams(struct cuda_backend *cb, const char *what)
{
	return wait_streams(cb, what, 0, cb->n, cb->timeout_ms);
}

int cuda_wait_streams_within(struct cuda_backend *cb, const char *what, int timeout_ms)
{
	return wait_streams(cb, what, 0, cb->n, timeout_ms);
}

int cuda_wait_stream(struct cuda_backend *cb, unsigned r, const char *what)
{
	return wait_streams(cb, what, r, r + 1, cb->timeout_ms);
}
