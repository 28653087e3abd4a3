/*
 * The compute worker: one thread that runs work items in submission order
 * (so buckets reduce in plan order) and hands each back to the event loop
 * when it is done. It runs under the daemon's own policy (SCHED_OTHER
 * unless an operator chose otherwise): woken, it preempts a busy
 * neighbour at once, as a thread that sleeps most of the time earns. The
 * loop thread never packs, reduces or unpacks, so it answers status
 * queries while a bucket is being reduced.
 */
#ifndef GS_WORKER_H
#define GS_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <uv.h>

struct gs_work {
	struct gs_work *next;
	void (*run)(struct gs_work *w);  /* on the worker thread */
	void (*done)(struct gs_work *w); /* on the loop thread, after run */
};

struct gs_worker {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct gs_work *todo_head, *todo_tail;
	struct gs_work *done_head, *done_tail;
	uv_async_t async;
	bool stopping;
	bool sleeping; /* the thread waits on wake; under lock */
	unsigned inflight; /* submitted, done not yet called; loop thread only */
};

int gs_worker_start(struct gs_worker *w, uv_loop_t *loop);
/* Queues w; its done callback runs on the loop thread later. */
void gs_worker_submit(struct gs_worker *w, struct gs_work *work);
/* Queues the n items that follow one another from first through their
 * next links, in that order, waking the thread once for them all. */
void gs_worker_submit_chain(struct gs_worker *w, struct gs_work *first, unsigned n);
/* The item the thread runs after the one it runs now, or NULL; only from
 * an item's run, on the worker thread. Items leave the queue only when
 * this thread takes them, so the one returned stays queued, and is the
 * next to run, until the calling item is done. */
struct gs_work *gs_worker_next(struct gs_worker *w);
/* Finishes queued work, joins the thread, calls the remaining done
 * callbacks and closes the async handle. */
void gs_worker_stop(struct gs_worker *w);

#endif
