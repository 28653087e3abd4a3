/*
 * The worker thread (daemon/support/worker.c) on a real loop: items run in
 * submission order, chains and single items alike, off the loop thread,
 * and come back to the loop thread in that order; a worker asleep wakes for
 * each submission; the worker and the threads it starts keep the daemon's
 * scheduling policy.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "support/worker.h"

#define ITEMS 64

struct item {
	struct gs_work work;
	struct fixture *f;
	unsigned index;
	int policy;	  /* the worker thread's, as the kernel says while it runs */
	int child_policy; /* a thread started by run, when asked */
	bool start_thread;
	bool off_loop;	  /* run did not run on the loop thread */
};

struct fixture {
	uv_loop_t loop;
	struct gs_worker worker;
	pthread_t loop_thread;
	struct item items[ITEMS];
	unsigned ran[ITEMS], nran; /* worker thread */
	unsigned done[ITEMS], ndone; /* loop thread */
	bool done_off_loop;
};

static void *report_policy(void *arg)
{
	*(int *)arg = sched_getscheduler(0);
	return NULL;
}

static void item_run(struct gs_work *w)
{
	struct item *it = (struct item *)w;
	it->off_loop = !pthread_equal(pthread_self(), it->f->loop_thread);
	it->policy = sched_getscheduler(0);
	if (it->start_thread) {
		pthread_t t;
		assert_int_equal(pthread_create(&t, NULL, report_policy, &it->child_policy), 0);
		pthread_join(t, NULL);
	}
	it->f->ran[it->f->nran++] = it->index;
}

static void item_done(struct gs_work *w)
{
	struct item *it = (struct item *)w;
	if (!pthread_equal(pthread_self(), it->f->loop_thread))
		it->f->done_off_loop = true;
	it->f->done[it->f->ndone++] = it->index;
}

static struct fixture *fixture_new(void)
{
	struct fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	f->loop_thread = pthread_self();
	for (unsigned i = 0; i < ITEMS; i++)
		f->items[i] = (struct item){ .work = { .run = item_run, .done = item_done },
					     .f = f, .index = i, .policy = -1,
					     .child_policy = -1 };
	assert_int_equal(gs_worker_start(&f->worker, &f->loop), 0);
	return f;
}

/* Runs the loop until n items are done, for 10 s at most. */
static void wait_done(struct fixture *f, unsigned n)
{
	for (int i = 0; i < 10000 && f->ndone < n; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	assert_int_equal(f->ndone, n);
}

static void fixture_free(struct fixture *f)
{
	gs_worker_stop(&f->worker);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	free(f);
}

/* Links items first .. first + n - 1 through next, in index order. */
static struct gs_work *chain(struct fixture *f, unsigned first, unsigned n)
{
	for (unsigned i = first; i + 1 < first + n; i++)
		f->items[i].work.next = &f->items[i + 1].work;
	return &f->items[first].work;
}

static void test_order(void **state)
{
	(void)state;
	struct fixture *f = fixture_new();
	/* A chain, single items, another chain, a chain of one, one more. */
	gs_worker_submit_chain(&f->worker, chain(f, 0, 20), 20);
	for (unsigned i = 20; i < 30; i++)
		gs_worker_submit(&f->worker, &f->items[i].work);
	gs_worker_submit_chain(&f->worker, chain(f, 30, 30), 30);
	gs_worker_submit_chain(&f->worker, NULL, 0);
	gs_worker_submit_chain(&f->worker, chain(f, 60, 1), 1);
	gs_worker_submit(&f->worker, &f->items[61].work);
	assert_int_equal(f->worker.inflight, 62);
	wait_done(f, 62);
	assert_int_equal(f->nran, 62);
	for (unsigned i = 0; i < 62; i++) {
		assert_int_equal(f->ran[i], i);
		assert_int_equal(f->done[i], i);
		assert_true(f->items[i].off_loop);
	}
	assert_false(f->done_off_loop);
	assert_int_equal(f->worker.inflight, 0);
	fixture_free(f);
}

/* Each submission finds the worker asleep: none may be missed. */
static void test_wakes_when_asleep(void **state)
{
	(void)state;
	struct fixture *f = fixture_new();
	for (unsigned i = 0; i < 20; i++) {
		nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
		if (i % 2)
			gs_worker_submit(&f->worker, &f->items[i].work);
		else
			gs_worker_submit_chain(&f->worker, chain(f, i, 1), 1);
		wait_done(f, i + 1);
	}
	for (unsigned i = 0; i < 20; i++)
		assert_int_equal(f->done[i], i);
	fixture_free(f);
}

/* The worker, and a thread it starts (as Gloo's device thread is), run
 * the policy of the daemon's loop thread: SCHED_BATCH would make each
 * wake-up wait behind a busy neighbour's slice (issue 25). */
static void test_daemon_policy(void **state)
{
	(void)state;
	struct fixture *f = fixture_new();
	int mine = sched_getscheduler(0);
	assert_int_not_equal(mine, SCHED_BATCH);
	for (unsigned i = 0; i < 3; i++)
		f->items[i].start_thread = true;
	gs_worker_submit_chain(&f->worker, chain(f, 0, 3), 3);
	wait_done(f, 3);
	for (unsigned i = 0; i < 3; i++) {
		assert_int_equal(f->items[i].policy, mine);
		assert_int_equal(f->items[i].child_policy, mine);
	}
	fixture_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_wakes_when_asleep),
		cmocka_unit_test(test_daemon_policy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
