/*
 * Wake-ups from the GPU. A host function queued on a stream (the CUDA
 * runtime's cudaLaunchHostFunc) writes to an eventfd when the stream gets
 * there, so a thread that waits for GPU work sleeps in poll(2) until then,
 * where a poll loop would wake every few hundred microseconds, or, on a
 * core a busy neighbour shares, wait behind its time slice.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backend/cuda/cuda_private.h"
#include "support/log.h"

struct cuda_wake {
	int fd; /* eventfd: readable once a host function has run */
	/* Host functions queued and not yet run: while any is, the wake-up
	 * must outlive the backend (a stream stuck behind a dead trainer's
	 * event may run it much later, or never). */
	_Atomic unsigned pending;
};

struct cuda_wake *cuda_wake_new(void)
{
	struct cuda_wake *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->fd < 0) {
		free(w);
		return NULL;
	}
	return w;
}

void cuda_wake_free(struct cuda_wake *w)
{
	if (!w)
		return;
	unsigned left = atomic_load(&w->pending);
	if (left) {
		/* Freed (or its fd closed and reused) it would be written to
		 * by whatever runs later: left to the process's exit. */
		gs_warn("cuda: %u wake-up(s) still queued on stuck streams: kept until exit", left);
		return;
	}
	close(w->fd);
	free(w);
}

/* Runs on the CUDA runtime's own thread; it may call no CUDA function. */
static void CUDART_CB wake_up(void *arg)
{
	struct cuda_wake *w = arg;
	uint64_t one = 1;
	ssize_t n = write(w->fd, &one, sizeof(one));
	(void)n; /* EAGAIN only when the count is full: readable anyway */
	atomic_fetch_sub(&w->pending, 1);
}

cudaError_t cuda_wake_after(struct cuda_wake *w, cudaStream_t stream)
{
	atomic_fetch_add(&w->pending, 1);
	cudaError_t e = cudaLaunchHostFunc(stream, wake_up, w);
	if (e != cudaSuccess)
		atomic_fetch_sub(&w->pending, 1);
	return e;
}

void cuda_wake_sleep(struct cuda_wake *w, int cancel_fd, uint64_t until_ms)
{
	uint64_t now = cuda_now_ms();
	if (now >= until_ms)
		return;
	uint64_t left = until_ms - now;
	struct pollfd p[2] = { { w->fd, POLLIN, 0 }, { cancel_fd, POLLIN, 0 } };
	int rc = poll(p, cancel_fd >= 0 ? 2 : 1, left > INT32_MAX ? INT32_MAX : (int)left);
	if (rc > 0 && (p[0].revents & POLLIN)) {
		uint64_t count;
		ssize_t n = read(w->fd, &count, sizeof(count)); /* zero it for the next */
		(void)n;
	}
}
