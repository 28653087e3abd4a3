/*
 * The model's pick among ring, recursive doubling and Rabenseifner
 * (gloo_choice.c), without Gloo or processes: the message counts against
 * hand-counted schedules, the bytes each rank sends, and the pick's shape (bands: doubling for the
 * smallest buffers, Rabenseifner, then the ring; each pick the fastest
 * prediction; the ring's band receding and doubling's narrowing as the
 * group grows).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/gloo/gloo_choice.h"

/* Bytes each rank sends, counted by hand from the schedules of a 1200-byte
 * buffer: the ring 2 (N - 1) / N of it; at 3 nodes, doubling's rank 0
 * exchanges with 1 (1200) and hands rank 2 the sum (1200), rank 1 sends
 * once, rank 2 hands its buffer over; Rabenseifner's rank 0 sends half and
 * half back (1200) plus the hand-back; at 8 nodes doubling sends the
 * buffer 3 times, Rabenseifner 600 + 300 + 150 twice. */
static void sent_bytes(void **state)
{
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RING, 1200, 0, 1), 0);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RING, 1200, 0, 2), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RING, 1200, 1, 3), 1600);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_DOUBLING, 1200, 0, 2), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RABENSEIFNER, 1200, 1, 2), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_DOUBLING, 1200, 0, 3), 2400);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_DOUBLING, 1200, 1, 3), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_DOUBLING, 1200, 2, 3), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RABENSEIFNER, 1200, 0, 3), 2400);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RABENSEIFNER, 1200, 1, 3), 1200);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_DOUBLING, 1200, 5, 8), 3600);
	assert_int_equal(gs_gloo_sent_bytes(GS_GLOO_ALGO_RABENSEIFNER, 1200, 5, 8), 2100);
}

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
	/* Halving and doubling back, plus the extra ranks' fold and hand-back. */
	assert_int_equal(gs_gloo_rabenseifner_steps(2), 2);
	assert_int_equal(gs_gloo_rabenseifner_steps(3), 4);
	assert_int_equal(gs_gloo_rabenseifner_steps(8), 6);
	assert_int_equal(gs_gloo_rabenseifner_steps(12), 8);
	assert_true(gs_gloo_predict_us(GS_GLOO_ALGO_RING, 1000, 1) == 0);
}

static void picks_are_bands(void **state)
{
	size_t prev_d = 0, prev_r = 0;
	for (int n = 2; n <= 4096; n *= 2) {
		size_t d = gs_gloo_doubling_below(n), r = gs_gloo_ring_above(n);
		print_message("%4d nodes: doubling up to %zu bytes, Rabenseifner up to %zu\n", n,
			      d, r);
		/* Small buffers are latency: doubling waits on the fewest messages. */
		assert_true(d > 1024);
		assert_true(r >= d && r < ((size_t)1 << 40));
		assert_int_equal(gs_gloo_pick(4, n), GS_GLOO_ALGO_DOUBLING);
		assert_int_equal(gs_gloo_pick(d, n), GS_GLOO_ALGO_DOUBLING);
		assert_int_not_equal(gs_gloo_pick(d + 1, n), GS_GLOO_ALGO_DOUBLING);
		assert_int_not_equal(gs_gloo_pick(r, n), GS_GLOO_ALGO_RING);
		assert_int_equal(gs_gloo_pick(r + 1, n), GS_GLOO_ALGO_RING);
		assert_int_equal(gs_gloo_pick(r * 4, n), GS_GLOO_ALGO_RING);
		if (r > d)
			assert_int_equal(gs_gloo_pick(d + (r - d) / 2, n), GS_GLOO_ALGO_RABENSEIFNER);
		/* Each pick is the fastest prediction. */
		static const size_t sizes[] = {4, 4096, 65536, 1 << 20, 4 << 20, 64 << 20};
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			enum gs_gloo_algo a = gs_gloo_pick(sizes[i], n);
			double t = gs_gloo_predict_us(a, sizes[i], n);
			assert_true(t <= gs_gloo_predict_us(GS_GLOO_ALGO_RING, sizes[i], n));
			assert_true(t <= gs_gloo_predict_us(GS_GLOO_ALGO_DOUBLING, sizes[i], n));
			assert_true(t <= gs_gloo_predict_us(GS_GLOO_ALGO_RABENSEIFNER, sizes[i], n));
		}
		/* From 8 nodes on the ring's band recedes as the group grows:
		 * its 2 (N - 1) latencies outgrow the others' log2 N ones (from 2
		 * to 4 they grow alike). Doubling's band narrows instead: its
		 * log2 N full copies of the bytes outgrow Rabenseifner's two. */
		if (n >= 8)
			assert_true(r >= prev_r);
		if (n >= 4)
			assert_true(d <= prev_d);
		prev_d = d;
		prev_r = r;
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
	    cmocka_unit_test(sent_bytes),
	    cmocka_unit_test(picks_are_bands),
	    cmocka_unit_test(names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
