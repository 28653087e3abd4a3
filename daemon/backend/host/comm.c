/*
 * The host backend's communication thread (struct host_comm): with several
 * nodes, it all-reduces a chunk's pipeline slices in order, each with its
 * status after it, as soon as the pack finishes it, while the worker
 * thread and helpers pack the next (backend_host.c's top comment), and
 * then the chunk of the next bucket packed early behind it (overlap.c). A
 * chunk the worker keeps (one slice, no next bucket, or any chunk when the
 * thread cannot start) and a node's vote alone go through
 * host_reduce_slice on the worker thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/chunk_status.h"
#include "backend/gloo/gloo_comm.h"
#include "backend/host/host_private.h"
#include "errors.h"

static int all_nodes(struct host_backend *h, void *buf, size_t n, int timeout_ms)
{
	struct gs_backend *b = &h->base;
	int rc = gs_gloo_allreduce(h->gloo, b->wire, buf, n, timeout_ms, b->error,
				   sizeof(b->error));
	if (rc != GS_OK)
		return rc;
	atomic_fetch_add(&b->internode_bytes, gs_gloo_call_sent_bytes(h->gloo, b->wire, n));
	return GS_OK;
}

/* All-reduces slice k of a cut chunk at wire, with its status (slice 0's
 * with the cut's extra: the produced counts), and reads the summed status
 * into *st. Returns GS_OK while the nodes go on; the
 * all-reduce's code when it failed; GS_EABORTED when a node voted to
 * abort, GS_EBUFFER when a node's pack lost memory. Every node reads the
 * same sum, so all stop after the same slice. */
int host_reduce_slice(struct host_backend *h, char *wire, const struct host_cut *cut,
		      uint32_t k, int timeout_ms, struct gs_chunk_status *st)
{
	size_t esize = gs_wire_size(h->base.wire);
	uint64_t n = host_cut_len(cut, k);
	char *at = host_cut_at(h, cut, wire, GS_CHUNK_STATUS_ELEMENTS, k);
	uint64_t tail = GS_CHUNK_STATUS_ELEMENTS + (k == 0 ? cut->extra : 0);
	int rc = all_nodes(h, at, n + tail, timeout_ms);
	if (rc != GS_OK)
		return rc;
	gs_chunk_status_get(h->base.wire, at + n * esize, st);
	if (st->vote.aborts)
		return GS_EABORTED;
	return st->lost_nodes ? GS_EBUFFER : GS_OK;
}

/* The lane's slices in order, each once it is packed; stops at the first
 * that fails or whose status stops the bucket. */
static void comm_chunk(struct host_backend *h, struct host_lane *lane)
{
	struct host_comm *c = &h->comm;
	uint32_t slices = host_cut_slices(&lane->cut);
	lane->rc = GS_OK;
	for (uint32_t k = 0; k < slices && lane->rc == GS_OK; k++) {
		while (!lane->packed[k] && !c->stopping)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping) {
			lane->rc = GS_EABORTED;
			snprintf(h->base.error, sizeof(h->base.error), "the backend is closing");
			break;
		}
		pthread_mutex_unlock(&c->lock);
		int rc = host_reduce_slice(h, lane->wire, &lane->cut, k,
					   k == 0 ? lane->first_timeout_ms : h->gloo_timeout_ms,
					   &lane->status);
		pthread_mutex_lock(&c->lock);
		lane->rc = rc;
	}
}

/* Chunks in the order given. One that fails refuses the one behind it:
 * every node stops at the failed bucket, so no node all-reduces the next
 * (the engine does not run it). */
static void *comm_main(void *arg)
{
	struct host_backend *h = arg;
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->stopping && c->queued == 0)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping)
			break;
		struct host_lane *lane = c->queue[0];
		lane->started = true;
		pthread_cond_broadcast(&c->through);
		comm_chunk(h, lane);
		lane->through = true;
		c->queue[0] = c->queue[1];
		c->queued--;
		if (lane->rc != GS_OK && c->queued) {
			struct host_lane *behind = c->queue[0];
			behind->started = behind->through = behind->refused = true;
			behind->rc = lane->rc;
			c->queued = 0;
		}
		pthread_cond_broadcast(&c->through);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Starts the thread at the first chunk that needs it; false when it cannot
 * start (the chunks then go in sequence on the worker thread). */
bool host_comm_start(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	if (!c->started)
		c->started = pthread_create(&c->thread, NULL, comm_main, h) == 0;
	if (c->started) /* named for traces (top -H, perf sched) */
		pthread_setname_np(c->thread, "gs-comm");
	return c->started;
}

/* Hands the lane's chunk to the comm thread, behind the one it has, if
 * any; its slices follow as the pack finishes each (host_slice_packed). */
void host_comm_give(struct host_backend *h, struct host_lane *lane)
{
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	memset(lane->packed, 0, host_cut_slices(&lane->cut));
	lane->started = lane->through = lane->refused = false;
	lane->rc = GS_OK;
	lane->status = (struct gs_chunk_status){ 0 };
	if (lane->after && lane->after->through && lane->after->rc != GS_OK) {
		/* The bucket before failed already: as in comm_main. */
		lane->started = lane->through = lane->refused = true;
		lane->rc = lane->after->rc;
	} else {
		c->queue[c->queued++] = lane;
		pthread_cond_signal(&c->wake);
	}
	pthread_mutex_unlock(&c->lock);
}

static void deadline_in(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

bool host_comm_wait(struct host_backend *h, struct host_lane *lane, bool started_only,
		    int timeout_ms)
{
	struct host_comm *c = &h->comm;
	struct timespec deadline;
	if (timeout_ms >= 0)
		deadline_in(&deadline, timeout_ms);
	pthread_mutex_lock(&c->lock);
	int rc = 0;
	while (!(started_only ? lane->started : lane->through) && rc != ETIMEDOUT)
		rc = timeout_ms < 0 ? pthread_cond_wait(&c->through, &c->lock)
				    : pthread_cond_timedwait(&c->through, &c->lock, &deadline);
	bool done = started_only ? lane->started : lane->through;
	pthread_mutex_unlock(&c->lock);
	return done;
}

void host_comm_stop(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	if (!c->started)
		return;
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_cond_signal(&c->wake);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	c->started = false;
}
