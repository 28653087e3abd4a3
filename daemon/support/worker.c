#include "support/worker.h"

#include <errno.h>
#include <stddef.h>

/* Appends the chain first .. last (linked through next) to a list. */
static void append(struct gs_work **head, struct gs_work **tail, struct gs_work *first,
		   struct gs_work *last)
{
	last->next = NULL;
	if (*tail)
		(*tail)->next = first;
	else
		*head = first;
	*tail = last;
}

/* The wake-ups (the condition variable's, the async handle's) are sent
 * after the lock is released: a thread woken while the lock is held would
 * run only to block on it. */
static void *worker_main(void *arg)
{
	struct gs_worker *w = arg;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->todo_head && !w->stopping) {
			w->sleeping = true;
			pthread_cond_wait(&w->wake, &w->lock);
			w->sleeping = false;
		}
		struct gs_work *work = w->todo_head;
		if (!work)
			break; /* stopping, and nothing left to do */
		w->todo_head = work->next;
		if (!w->todo_head)
			w->todo_tail = NULL;
		pthread_mutex_unlock(&w->lock);

		work->run(work);

		pthread_mutex_lock(&w->lock);
		/* The loop is told once for all items done until it drains
		 * them: only the first done item since its last drain sends. */
		bool tell = !w->done_head;
		append(&w->done_head, &w->done_tail, work, work);
		if (tell) {
			pthread_mutex_unlock(&w->lock);
			uv_async_send(&w->async);
			pthread_mutex_lock(&w->lock);
		}
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

static void drain_done(struct gs_worker *w)
{
	pthread_mutex_lock(&w->lock);
	struct gs_work *work = w->done_head;
	w->done_head = w->done_tail = NULL;
	pthread_mutex_unlock(&w->lock);
	while (work) {
		struct gs_work *next = work->next;
		w->inflight--;
		work->done(work);
		work = next;
	}
}

static void on_async(uv_async_t *a)
{
	drain_done(a->data);
}

int gs_worker_start(struct gs_worker *w, uv_loop_t *loop)
{
	*w = (struct gs_worker){ 0 };
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	int r = uv_async_init(loop, &w->async, on_async);
	if (r < 0)
		return r;
	w->async.data = w;
	r = pthread_create(&w->thread, NULL, worker_main, w);
	if (r != 0) {
		uv_close((uv_handle_t *)&w->async, NULL);
		return -r;
	}
	/* Named for traces (top -H, perf sched); the threads it starts,
	 * Gloo's among them, inherit the name. */
	pthread_setname_np(w->thread, "gs-worker");
	return 0;
}

void gs_worker_submit_chain(struct gs_worker *w, struct gs_work *first, unsigned n)
{
	if (n == 0)
		return;
	struct gs_work *last = first;
	for (unsigned i = 1; i < n; i++)
		last = last->next;
	w->inflight += n;
	pthread_mutex_lock(&w->lock);
	append(&w->todo_head, &w->todo_tail, first, last);
	/* A worker that is not asleep looks at the list before it sleeps. */
	bool wake = w->sleeping;
	pthread_mutex_unlock(&w->lock);
	if (wake)
		pthread_cond_signal(&w->wake);
}

void gs_worker_submit(struct gs_worker *w, struct gs_work *work)
{
	gs_worker_submit_chain(w, work, 1);
}

struct gs_work *gs_worker_next(struct gs_worker *w)
{
	pthread_mutex_lock(&w->lock);
	struct gs_work *next = w->todo_head;
	pthread_mutex_unlock(&w->lock);
	return next;
}

void gs_worker_stop(struct gs_worker *w)
{
	pthread_mutex_lock(&w->lock);
	w->stopping = true;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	drain_done(w);
	uv_close((uv_handle_t *)&w->async, NULL);
}
