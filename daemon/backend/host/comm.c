/*
 * The host backend's communication thread (struct host_comm): with several
 * nodes, it all-reduces a chunk's pipeline slices in order, each with its
 * status after it, as soon as the pack finishes it, while the worker
 * thread and helpers pack the next (backend_host.c's top comment). A chunk
 * of one slice (or any chunk, when the thread cannot start) and a node's
 * vote alone go through host_reduce_slice on the worker thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* All-reduces slice k of a cut chunk at wire, with its status, and reads
 * the summed status into *st. Returns GS_OK while the nodes go on; the
 * all-reduce's code when it failed; GS_EABORTED when a node voted to
 * abort, GS_EBUFFER when a node's pack lost memory. Every node reads the
 * same sum, so all stop after the same slice. */
int host_reduce_slice(struct host_backend *h, char *wire, const struct host_cut *cut,
		      uint32_t k, int timeout_ms, struct gs_chunk_status *st)
{
	size_t esize = gs_wire_size(h->base.wire);
	uint64_t n = host_cut_len(cut, k);
	char *at = host_cut_at(h, cut, wire, GS_CHUNK_STATUS_ELEMENTS, k);
	int rc = all_nodes(h, at, n + GS_CHUNK_STATUS_ELEMENTS, timeout_ms);
	if (rc != GS_OK)
		return rc;
	gs_chunk_status_get(h->base.wire, at + n * esize, st);
	if (st->vote.aborts)
		return GS_EABORTED;
	return st->lost_nodes ? GS_EBUFFER : GS_OK;
}

/* The chunk's slices in order, each once it is packed; stops at the first
 * that fails or whose status stops the bucket. */
static void comm_chunk(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	c->rc = GS_OK;
	for (uint32_t k = 0; k < c->slices && c->rc == GS_OK; k++) {
		while (!c->packed[k] && !c->stopping)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping) {
			c->rc = GS_EABORTED;
			snprintf(h->base.error, sizeof(h->base.error), "the backend is closing");
			break;
		}
		pthread_mutex_unlock(&c->lock);
		c->rc = host_reduce_slice(h, c->wire, &c->cut, k,
					  k == 0 ? c->first_timeout_ms : h->gloo_timeout_ms,
					  &c->status);
		pthread_mutex_lock(&c->lock);
	}
}

static void *comm_main(void *arg)
{
	struct host_backend *h = arg;
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->stopping && c->finished == c->given)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping)
			break;
		comm_chunk(h);
		c->finished = c->given;
		pthread_cond_signal(&c->through);
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
	return c->started;
}

/* Hands the chunk at wire to the comm thread; its slices follow as the
 * pack finishes each (host_slice_packed). The thread is idle here. */
void host_comm_give(struct host_backend *h, char *wire, const struct host_cut *cut,
		    int first_timeout_ms)
{
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	c->wire = wire;
	c->cut = *cut;
	c->slices = host_cut_slices(cut);
	c->first_timeout_ms = first_timeout_ms;
	memset(c->packed, 0, c->slices);
	c->given++;
	pthread_cond_signal(&c->wake);
	pthread_mutex_unlock(&c->lock);
}

/* Waits until the comm thread is through the chunk; its result. */
int host_comm_wait(struct host_backend *h, struct gs_chunk_status *st)
{
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	while (c->finished != c->given)
		pthread_cond_wait(&c->through, &c->lock);
	int rc = c->rc;
	*st = c->status;
	pthread_mutex_unlock(&c->lock);
	return rc;
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
