/*
 * The model's pick between ring and recursive doubling (gloo_choice.c),
 * without Gloo or processes: the message counts against hand-counted
 * schedules, and the pick's shape (doubling below one crossover per group
 * size, ring above, the crossover growing with the group from 4 nodes on).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/gloo/gloo_choice.h"

/* Counted by hand from the schedules in gloo_doubling.cc: 3 nodes fold
 * rank 2 into rank 0 (1), exchange 0-1 (1), hand back (1); 6 nodes fold
 * 4 and 5 into 0 and 1, exchange twice, hand back. */
static void message_counts(void **state)
{
	static const int doubling[][2] = {{1, 0}, {2, 1}, {3, 3}, {4, 2}, {5, 4}, {6, 4},
					  {7, 4}, {8, 3}, {9, 5}, {16, 4}, {4096, 12}};
	for (size_t i = 0; i < sizeof(doubling) / sizeof(doubling[0]); i++)
		assert_int_equal(gs_gloo_doubling_steps(doubling[i][0]), doubling[i][1]);
	assert_int_equal(gs_gloo_ring_steps(1), 0);
	assert_int_equal(gs_gloo_ring_steps(2), 2);
	assert_int_equal(gs_gloo_ring_steps(16), 30);
	assert_true(gs_gloo_predict_us(GS_GLOO_ALGO_RING, 1000, 1) == 0);
}

static void pick_has_one_crossover(void **state)
{
	size_t prev = 0;
	for (int n = 2; n <= 4096; n *= 2) {
		size_t below = gs_gloo_doubling_below(n);
		print_message("%4d nodes: doubling up to %zu bytes\n", n, below);
		/* Small buffers are latency: doubling waits on fewer messages. */
		assert_true(below > 4096);
		assert_true(below < ((size_t)1 << 40));
		assert_int_equal(gs_gloo_pick(4, n), GS_GLOO_ALGO_DOUBLING);
		assert_int_equal(gs_gloo_pick(below, n), GS_GLOO_ALGO_DOUBLING);
		assert_int_equal(gs_gloo_pick(below + 1, n), GS_GLOO_ALGO_RING);
		assert_int_equal(gs_gloo_pick(below * 4, n), GS_GLOO_ALGO_RING);
		/* The pick is the faster prediction. */
		assert_true(gs_gloo_predict_us(GS_GLOO_ALGO_DOUBLING, below, n) <
			    gs_gloo_predict_us(GS_GLOO_ALGO_RING, below, n));
		/* From 4 nodes on, the ring's 2 (N - 1) latencies outgrow
		 * doubling's log2 N extra copies of the bytes (from 2 to 4 the
		 * two grow alike, and the crossover may dip). */
		if (n >= 8)
			assert_true(below >= prev);
		prev = below;
	}
	/* A group of one has nothing to send: the ring, trivially. */
	assert_int_equal(gs_gloo_pick(4, 1), GS_GLOO_ALGO_RING);
	assert_int_equal(gs_gloo_doubling_below(1), 0);
}

static void names(void **state)
{
	assert_string_equal(gs_gloo_algo_name(GS_GLOO_ALGO_RING), "ring");
	assert_string_equal(gs_gloo_algo_name(GS_GLOO_ALGO_DOUBLING), "doubling");
	assert_string_equal(gs_gloo_algo_name(GS_GLOO_ALGO_HALVING_DOUBLING), "halving-doubling");
	assert_string_equal(gs_gloo_algo_name(42), "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(message_counts),
	    cmocka_unit_test(pick_has_one_crossover),
	    cmocka_unit_test(names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
