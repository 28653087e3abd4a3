/*
 * Failures of the Gloo layer end in bounded, measured time with the right
 * code and a message that names what failed: a rank that never shows up, a
 * peer that stays connected but never joins the all-reduce, a peer killed
 * (SIGKILL) in the middle of a stream of all-reduces, and bad arguments;
 * recursive doubling's and Rabenseifner's waits end at the call's timeout,
 * a vote's small buffer included, where Gloo's classic halving-doubling
 * ends at the group's (the reason the daemon does not run it); and an
 * interrupt from another thread ends doubling's and Rabenseifner's waits
 * at once, naming why.
 * After a failure the handle refuses further work (GS_ESTATE) and can be
 * destroyed without hanging.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "file_store.h"
#include "backend/gloo/gloo_comm.h"
#include "clock.h"
#include "errors.h"
#include "ranks.h"

#define MSG_LEN 512
/* How late past its timeout an error may come on two busy cores. */
#define SLACK_MS 1500

/* What a rank measured, in memory shared with the parent. */
struct outcome {
	int rc;		     /* of the call under test */
	int rc_after;	     /* of one more all-reduce on the same handle */
	double start, end;   /* CLOCK_MONOTONIC ms around the call */
	volatile int rounds; /* all-reduces completed */
	char msg[MSG_LEN];
	char msg_after[MSG_LEN];
};

struct scenario {
	char *dir;
	int size;	     /* of the group, which may differ from the ranks forked */
	int timeout;	     /* ms */
	struct outcome *out; /* [rank] */
};

static struct scenario *scenario_new(int size, int timeout_ms)
{
	struct scenario *s = calloc(1, sizeof(*s));
	assert_non_null(s);
	s->dir = file_store_dir_create();
	assert_non_null(s->dir);
	s->size = size;
	s->timeout = timeout_ms;
	s->out = shared_alloc(RANKS_MAX * sizeof(*s->out));
	assert_non_null(s->out);
	return s;
}

static void scenario_free(struct scenario *s)
{
	file_store_dir_remove(s->dir);
	shared_free(s->out, RANKS_MAX * sizeof(*s->out));
	free(s);
}

static struct gs_gloo *join(struct scenario *s, int rank)
{
	struct gs_gloo_store_ops store = file_store(s->dir);
	struct outcome *o = &s->out[rank];
	struct gs_gloo *g = NULL;
	o->start = gs_now_ms();
	o->rc = gs_gloo_create(&store, rank, s->size, "127.0.0.1", s->timeout, &g, o->msg, MSG_LEN);
	o->end = gs_now_ms();
	return g;
}

/* ----------------------------------------------- a rank that never shows up */

static int lonely_rank(int rank, int nforked, void *arg)
{
	struct gs_gloo *g = join(arg, rank);
	gs_gloo_destroy(g);
	return 0;
}

static void missing_peer_times_out(void **state)
{
	struct scenario *s = scenario_new(2, 1000);
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 1, lonely_rank, s), 0);
	assert_int_equal(ranks_wait(&rk, 10000, status), 0);
	assert_int_equal(status[0], 0);

	struct outcome *o = &s->out[0];
	double took = o->end - o->start;
	print_message("missing peer: %s after %.0f ms: %s\n", gs_error_name(o->rc), took, o->msg);
	assert_int_equal(o->rc, GS_ETIMEDOUT);
	assert_true(took >= s->timeout - 50);
	assert_true(took <= s->timeout + SLACK_MS);
	assert_non_null(strstr(o->msg, "rank 1"));
	scenario_free(s);
}

/* ------------------------------------- a peer connected but never joining */

static int stalling_pair(int rank, int size, void *arg)
{
	struct scenario *s = arg;
	struct outcome *o = &s->out[rank];
	struct gs_gloo *g = join(s, rank);
	if (!g)
		return 1;
	static uint16_t buf[100000];
	if (rank == 1) {
		/* Connected, but busy elsewhere until rank 0 has given up. */
		double give_up = gs_now_ms() + 4 * s->timeout;
		while (__atomic_load_n(&s->out[0].rc_after, __ATOMIC_ACQUIRE) == 0 &&
		       gs_now_ms() < give_up)
			nanosleep(&(struct timespec){0, 10000000}, NULL);
	} else {
		o->start = gs_now_ms();
		o->rc = gs_gloo_allreduce(g, GS_WIRE_F16, buf, 100000, s->timeout, o->msg, MSG_LEN);
		o->end = gs_now_ms();
		int rc = gs_gloo_allreduce(g, GS_WIRE_F16, buf, 100000, s->timeout, o->msg_after,
					   MSG_LEN);
		__atomic_store_n(&o->rc_after, rc, __ATOMIC_RELEASE);
	}
	gs_gloo_destroy(g);
	return 0;
}

static void stalled_peer_times_out(void **state)
{
	struct scenario *s = scenario_new(2, 1000);
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 2, stalling_pair, s), 0);
	assert_int_equal(ranks_wait(&rk, 20000, status), 0);
	assert_int_equal(status[0], 0);
	assert_int_equal(status[1], 0);

	struct outcome *o = &s->out[0];
	double took = o->end - o->start;
	print_message("stalled peer: %s after %.0f ms: %s\n", gs_error_name(o->rc), took, o->msg);
	assert_int_equal(o->rc, GS_ETIMEDOUT);
	assert_true(took >= s->timeout - 50);
	assert_true(took <= s->timeout + SLACK_MS);
	assert_non_null(strstr(o->msg, "100000 fp16 elements"));
	assert_int_equal(o->rc_after, GS_ESTATE);
	scenario_free(s);
}

/* ---------------------------------------------- a peer killed mid-stream */

#define STREAM (4u << 20) /* fp16 elements: 8 MB, several ring segments */

static int streaming_rank(int rank, int size, void *arg)
{
	struct scenario *s = arg;
	struct outcome *o = &s->out[rank];
	struct gs_gloo *g = join(s, rank);
	uint16_t *buf = calloc(STREAM, sizeof(*buf));
	if (!g || !buf)
		return 1;
	/* Until rank 1 is killed: the parent waits for three rounds first. */
	for (int i = 0; i < 100000; i++) {
		o->start = gs_now_ms();
		o->rc = gs_gloo_allreduce(g, GS_WIRE_F16, buf, STREAM, s->timeout, o->msg, MSG_LEN);
		o->end = gs_now_ms();
		if (o->rc < 0)
			break;
		o->rounds++;
	}
	o->rc_after =
	    gs_gloo_allreduce(g, GS_WIRE_F16, buf, STREAM, s->timeout, o->msg_after, MSG_LEN);
	gs_gloo_destroy(g);
	free(buf);
	return 0;
}

/* Usually Gloo sees the closed connection at once (GS_EDISCONNECTED). When
 * the peer dies while this rank's send to it is partly written, this Gloo
 * never wakes the waiting send (its Pair::signalException skips queued
 * unbound-buffer sends), and the error is the timeout: either way bounded. */
static void killed_peer_fails_in_time(void **state)
{
	struct scenario *s = scenario_new(2, 3000);
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 2, streaming_rank, s), 0);
	double deadline = gs_now_ms() + 20000;
	while (s->out[0].rounds < 3 && gs_now_ms() < deadline)
		nanosleep(&(struct timespec){0, 1000000}, NULL);
	int rounds = s->out[0].rounds;
	double killed = gs_now_ms();
	ranks_kill(&rk, 1);
	assert_int_equal(ranks_wait(&rk, s->timeout + 10000, status), 0);
	assert_int_equal(status[1], 128 + 9);
	assert_int_equal(status[0], 0);
	assert_true(rounds >= 3);

	struct outcome *o = &s->out[0];
	double took = o->end - killed;
	print_message("killed peer after %d rounds: %s %.0f ms after the kill: %s\n", o->rounds,
		      gs_error_name(o->rc), took, o->msg);
	assert_true(o->rc == GS_EDISCONNECTED || o->rc == GS_ETIMEDOUT);
	assert_true(took <= s->timeout + SLACK_MS);
	assert_non_null(strstr(o->msg, "4194304 fp16 elements"));
	assert_int_equal(o->rc_after, GS_ESTATE);
	print_message("then: %s\n", o->msg_after);
	scenario_free(s);
}

/* ------------------------------------ one algorithm, a stalled or killed peer */

/* What the algorithms' scenarios add: which one, of how many fp32
 * elements, the call's timeout, and the rank that stalls. */
struct algo_case {
	struct scenario *s;
	int algo;
	size_t count;
	int call_timeout; /* ms */
	int stall;
	int interrupt_ms; /* > 0: another thread of rank 0 interrupts it then */
};

struct interrupter {
	struct gs_gloo *g;
	int after_ms;
};

static void *interrupt_later(void *arg)
{
	struct interrupter *i = arg;
	nanosleep(&(struct timespec){i->after_ms / 1000, (i->after_ms % 1000) * 1000000L}, NULL);
	gs_gloo_interrupt(i->g, "node 1 went away (the test says)");
	return NULL;
}

/* Every rank but c->stall calls once, then once more on the same handle;
 * the stalled one is connected but busy until rank 0 has given up. With
 * c->interrupt_ms, another thread of rank 0 interrupts its call, as the
 * daemon does when its liveness finds a node gone. */
static int stalling_rank(int rank, int size, void *arg)
{
	struct algo_case *c = arg;
	struct scenario *s = c->s;
	struct outcome *o = &s->out[rank];
	struct gs_gloo *g = join(s, rank);
	float *buf = calloc(c->count, sizeof(*buf));
	if (!g || !buf)
		return 1;
	if (rank == c->stall) {
		double give_up = gs_now_ms() + 4 * (s->timeout + c->call_timeout);
		while (__atomic_load_n(&s->out[0].rc_after, __ATOMIC_ACQUIRE) == 0 &&
		       gs_now_ms() < give_up)
			nanosleep(&(struct timespec){0, 10000000}, NULL);
	} else {
		struct interrupter i = {g, c->interrupt_ms};
		pthread_t t;
		bool interrupting = rank == 0 && c->interrupt_ms > 0;
		if (interrupting && pthread_create(&t, NULL, interrupt_later, &i) != 0)
			return 1;
		o->start = gs_now_ms();
		o->rc = gs_gloo_allreduce_algo(g, GS_WIRE_F32, buf, c->count, c->algo,
					       c->call_timeout, o->msg, MSG_LEN);
		o->end = gs_now_ms();
		if (interrupting)
			pthread_join(t, NULL);
		int rc = gs_gloo_allreduce_algo(g, GS_WIRE_F32, buf, c->count, c->algo,
						c->call_timeout, o->msg_after, MSG_LEN);
		__atomic_store_n(&o->rc_after, rc, __ATOMIC_RELEASE);
	}
	gs_gloo_destroy(g);
	free(buf);
	return 0;
}

/* Runs c with `size` ranks; returns how long rank 0's call took, in ms. */
static double run_stalled(struct algo_case *c, int size)
{
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, size, stalling_rank, c), 0);
	assert_int_equal(ranks_wait(&rk, 20000 + 4 * (c->s->timeout + c->call_timeout), status),
			 0);
	for (int r = 0; r < size; r++)
		assert_int_equal(status[r], 0);
	struct outcome *o = &c->s->out[0];
	print_message("%s, rank %d of %d stalled: %s after %.0f ms (call's timeout %d ms, "
		      "group's %d ms): %s\n",
		      gs_gloo_algo_name(c->algo), c->stall, size, gs_error_name(o->rc),
		      o->end - o->start, c->call_timeout, c->s->timeout, o->msg);
	assert_int_equal(o->rc, GS_ETIMEDOUT);
	assert_int_equal(o->rc_after, GS_ESTATE);
	return o->end - o->start;
}

/* A vote's few floats by doubling in a group of three, whose extra rank
 * (2, folded into rank 0) stalls: rank 0 gives up at the call's timeout,
 * well before the group's. */
static void doubling_stalled_peer_times_out(void **state)
{
	struct algo_case c = {scenario_new(3, 8000), GS_GLOO_ALGO_DOUBLING, 16, 1000, 2, 0};
	double took = run_stalled(&c, 3);
	assert_true(took >= c.call_timeout - 50);
	assert_true(took <= c.call_timeout + SLACK_MS);
	assert_non_null(strstr(c.s->out[0].msg, "doubling all-reduce of 16 fp32 elements"));
	scenario_free(c.s);
}

/* Rabenseifner's halving between four ranks, rank 1 (rank 0's first
 * partner) stalled: rank 0 gives up at the call's timeout, well before the
 * group's. (A rank that waits on a rank that gave up sees its connections
 * close instead, GS_EDISCONNECTED, at about the same time.) */
static void rabenseifner_stalled_peer_times_out(void **state)
{
	struct algo_case c = {scenario_new(4, 8000), GS_GLOO_ALGO_RABENSEIFNER, 100000, 1000, 1, 0};
	double took = run_stalled(&c, 4);
	assert_true(took >= c.call_timeout - 50);
	assert_true(took <= c.call_timeout + SLACK_MS);
	assert_non_null(strstr(c.s->out[0].msg, "rabenseifner all-reduce of 100000 fp32"));
	scenario_free(c.s);
}

/* Gloo's classic halving-doubling waits with each pair's timeout, fixed
 * at connection from the group's: the call's longer one is not heeded. */
static void halving_doubling_waits_the_group_timeout(void **state)
{
	struct algo_case c = {scenario_new(2, 1000), GS_GLOO_ALGO_HALVING_DOUBLING, 1000, 8000, 1, 0};
	double took = run_stalled(&c, 2);
	assert_true(took >= c.s->timeout - 50);
	assert_true(took <= c.s->timeout + SLACK_MS);
	scenario_free(c.s);
}

/* A stream of small doubling all-reduces (a vote's size) between four
 * ranks, one killed in the middle: rank 0 fails within the timeout. */
static int small_stream_rank(int rank, int size, void *arg)
{
	struct scenario *s = arg;
	struct outcome *o = &s->out[rank];
	struct gs_gloo *g = join(s, rank);
	float buf[16] = {0};
	if (!g)
		return 1;
	for (int i = 0; i < 10000000; i++) {
		o->start = gs_now_ms();
		o->rc = gs_gloo_allreduce_algo(g, GS_WIRE_F32, buf, 16, GS_GLOO_ALGO_DOUBLING,
					       s->timeout, o->msg, MSG_LEN);
		o->end = gs_now_ms();
		if (o->rc < 0)
			break;
		o->rounds++;
	}
	gs_gloo_destroy(g);
	return 0;
}

static void doubling_killed_peer_fails_in_time(void **state)
{
	struct scenario *s = scenario_new(4, 3000);
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 4, small_stream_rank, s), 0);
	double deadline = gs_now_ms() + 20000;
	while (s->out[0].rounds < 100 && gs_now_ms() < deadline)
		nanosleep(&(struct timespec){0, 1000000}, NULL);
	int rounds = s->out[0].rounds;
	double killed = gs_now_ms();
	ranks_kill(&rk, 3);
	assert_int_equal(ranks_wait(&rk, s->timeout + 10000, status), 0);
	assert_int_equal(status[3], 128 + 9);
	assert_true(rounds >= 100);
	for (int r = 0; r < 3; r++) {
		struct outcome *o = &s->out[r];
		double took = o->end - killed;
		print_message("doubling, rank 3 of 4 killed after %d rounds: rank %d %s %.0f ms "
			      "after the kill: %s\n",
			      rounds, r, gs_error_name(o->rc), took, o->msg);
		assert_int_equal(status[r], 0);
		assert_true(o->rc == GS_EDISCONNECTED || o->rc == GS_ETIMEDOUT);
		assert_true(took <= s->timeout + SLACK_MS);
	}
	scenario_free(s);
}

/* ------------------------------------------- an interrupt from another thread */

/* Rank 0 calls with a long timeout (a vote's: --step-timeout plus
 * --peer-timeout) while rank 1 stalls, and is interrupted 300 ms in: the
 * call ends then, not at its 60 s timeout, naming why; the handle then
 * refuses further work. */
static void run_interrupted(int algo, size_t count)
{
	struct algo_case c = {scenario_new(2, 8000), algo, count, 60000, 1, 300};
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 2, stalling_rank, &c), 0);
	assert_int_equal(ranks_wait(&rk, 30000, status), 0);
	assert_int_equal(status[0], 0);
	assert_int_equal(status[1], 0);
	struct outcome *o = &c.s->out[0];
	print_message("%s, interrupted 300 ms in: %s after %.0f ms (call's timeout %d ms): %s\n",
		      gs_gloo_algo_name(algo), gs_error_name(o->rc), o->end - o->start,
		      c.call_timeout, o->msg);
	assert_int_equal(o->rc, GS_EDISCONNECTED);
	assert_true(o->end - o->start <= 300 + SLACK_MS);
	assert_non_null(strstr(o->msg, "node 1 went away (the test says)"));
	assert_int_equal(o->rc_after, GS_ESTATE);
	scenario_free(c.s);
}

static void interrupt_ends_a_doubling_wait(void **state)
{
	run_interrupted(GS_GLOO_ALGO_DOUBLING, 16);
}

static void interrupt_ends_a_rabenseifner_wait(void **state)
{
	run_interrupted(GS_GLOO_ALGO_RABENSEIFNER, 100000);
}

/* ---------------------------------------------------------- bad arguments */

static int never_set(void *ctx, const char *key, const void *value, size_t len)
{
	return GS_ESYSTEM;
}

static int never_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	return GS_ESYSTEM;
}

static void bad_arguments(void **state)
{
	struct gs_gloo_store_ops store = {NULL, never_set, never_get};
	struct gs_gloo_store_ops half = {NULL, never_set, NULL};
	struct gs_gloo *g = (struct gs_gloo *)&store;
	char err[MSG_LEN];
	assert_int_equal(gs_gloo_create(NULL, 0, 1, "127.0.0.1", 1000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_create(&half, 0, 1, "127.0.0.1", 1000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_create(&store, 2, 2, "127.0.0.1", 1000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_create(&store, -1, 2, "127.0.0.1", 1000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_create(&store, 0, 0, "127.0.0.1", 1000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_create(&store, 0, 2, "127.0.0.1", 0, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_non_null(strstr(err, "invalid arguments"));
	assert_int_equal(gs_gloo_allreduce(NULL, GS_WIRE_F16, err, 1, 0, err, sizeof(err)),
			 GS_EINVAL);
}

/* A store that fails is reported with its own code and the key. */
static void failing_store(void **state)
{
	struct gs_gloo_store_ops store = {NULL, never_set, never_get};
	struct gs_gloo *g = NULL;
	char err[MSG_LEN];
	int rc = gs_gloo_create(&store, 0, 2, "127.0.0.1", 1000, &g, err, sizeof(err));
	print_message("failing store: %s: %s\n", gs_error_name(rc), err);
	assert_int_equal(rc, GS_ESYSTEM);
	assert_null(g);
	assert_non_null(strstr(err, "store"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(missing_peer_times_out),
	    cmocka_unit_test(stalled_peer_times_out),
	    cmocka_unit_test(killed_peer_fails_in_time),
	    cmocka_unit_test(doubling_stalled_peer_times_out),
	    cmocka_unit_test(rabenseifner_stalled_peer_times_out),
	    cmocka_unit_test(halving_doubling_waits_the_group_timeout),
	    cmocka_unit_test(doubling_killed_peer_fails_in_time),
	    cmocka_unit_test(interrupt_ends_a_doubling_wait),
	    cmocka_unit_test(interrupt_ends_a_rabenseifner_wait),
	    /* In this process, after every fork: they start Gloo threads. */
	    cmocka_unit_test(bad_arguments),
	    cmocka_unit_test(failing_store),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
