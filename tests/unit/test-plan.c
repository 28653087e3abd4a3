/*
 * The bucket plan against the rule of backward_and_update_half, written out
 * case by case: each row gives the element counts in backpropagation order,
 * the threshold, and the buckets the original would all-reduce, in order.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backend/plan.h"

#define MAX_T 8
#define END UINT32_MAX

struct plan_case {
	const char *what;
	uint64_t threshold;
	uint32_t n;
	uint64_t counts[MAX_T];
	/* Buckets in launch order, each a list of tensor indices ended by END;
	 * a final END alone ends the table. */
	uint32_t buckets[2 * MAX_T + 1];
};

static const struct plan_case cases[] = {
	{ "empty layout", 100, 0, { 0 }, { END } },
	{ "one small tensor is flushed at the end", 100, 1, { 5 }, { 0, END, END } },
	{ "a tensor equal to the threshold stays pending", 100, 1, { 100 },
	  { 0, END, END } },
	{ "equal to the threshold, then one more element crosses it", 100, 3,
	  { 100, 1, 7 }, { 0, 1, END, 2, END, END } },
	{ "a tensor above the threshold goes alone", 100, 1, { 101 },
	  { 0, END, END } },
	{ "the crossing tensor belongs to the flushed group", 100, 3,
	  { 60, 50, 5 }, { 0, 1, END, 2, END, END } },
	{ "a large tensor in the middle does not flush the group", 100, 4,
	  { 40, 500, 40, 30 }, { 1, END, 0, 2, 3, END, END } },
	{ "two large tensors around a group that never crosses", 100, 5,
	  { 200, 10, 300, 10, 10 }, { 0, END, 2, END, 1, 3, 4, END, END } },
	{ "sum exactly at the threshold does not flush", 100, 3, { 50, 50, 1 },
	  { 0, 1, 2, END, END } },
	{ "group restarts from zero after a flush", 10, 6, { 6, 6, 6, 6, 4, 1 },
	  { 0, 1, END, 2, 3, END, 4, 5, END, END } },
	{ "threshold zero: every tensor crosses at once", 0, 3, { 1, 2, 3 },
	  { 0, END, 1, END, 2, END, END } },
};

static void check_case(const struct plan_case *c)
{
	struct gs_plan p;
	assert_int_equal(gs_plan_build(c->counts, c->n, c->threshold, &p), 0);

	uint32_t b = 0, k = 0;
	uint64_t largest = 0;
	while (c->buckets[k] != END) {
		assert_true(b < p.nbuckets);
		const struct gs_bucket *bk = &p.buckets[b];
		uint32_t m = 0;
		uint64_t elements = 0;
		for (; c->buckets[k] != END; k++, m++) {
			assert_true(m < bk->count);
			uint32_t t = c->buckets[k];
			assert_int_equal(p.members[bk->first + m], t);
			assert_int_equal(p.bucket_of[t], b);
			elements += c->counts[t];
		}
		assert_int_equal(m, bk->count);
		assert_int_equal(bk->elements, elements);
		if (elements > largest)
			largest = elements;
		k++;
		b++;
	}
	assert_int_equal(p.nbuckets, b);
	assert_int_equal(p.largest_bucket, largest);
	gs_plan_free(&p);
}

static void test_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		print_message("plan: %s\n", cases[i].what);
		check_case(&cases[i]);
	}
}

/* A bucket larger than the fusion buffer goes through it in chunks: the
 * spans of consecutive chunks must tile the bucket's members in order. */
static void test_chunks_tile_bucket(void **state)
{
	(void)state;
	const uint64_t counts[] = { 40, 500, 40, 30 };
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 4, 100, &p), 0);
	assert_int_equal(p.nbuckets, 2);

	/* Bucket 1 holds tensors 0, 2, 3 (110 elements); chunks of 32. */
	const uint32_t expect_tensor[] = { 0, 2, 3 };
	uint64_t seen[4] = { 0 };
	size_t member = 0;
	for (uint64_t start = 0; start < p.buckets[1].elements; start += 32) {
		struct gs_span spans[4];
		uint64_t len = p.buckets[1].elements - start;
		if (len > 32)
			len = 32;
		size_t n = gs_plan_chunk_spans(&p, counts, 1, start, len, spans, 4);
		uint64_t covered = 0;
		for (size_t s = 0; s < n; s++) {
			while (seen[expect_tensor[member]] ==
			       counts[expect_tensor[member]])
				member++;
			assert_int_equal(spans[s].tensor, expect_tensor[member]);
			assert_int_equal(spans[s].offset, seen[spans[s].tensor]);
			seen[spans[s].tensor] += spans[s].count;
			covered += spans[s].count;
		}
		assert_int_equal(covered, len);
	}
	assert_int_equal(seen[0], 40);
	assert_int_equal(seen[1], 0);
	assert_int_equal(seen[2], 40);
	assert_int_equal(seen[3], 30);

	/* The large tensor alone, bigger than any chunk. */
	struct gs_span span;
	assert_int_equal(gs_plan_chunk_spans(&p, counts, 0, 480, 32, &span, 1), 1);
	assert_int_equal(span.tensor, 1);
	assert_int_equal(span.offset, 480);
	assert_int_equal(span.count, 20);
	gs_plan_free(&p);
}

/* Random sizes around the default threshold: a group never holds more than
 * the threshold before its crossing tensor, and every group but the final
 * flush crosses it. */
static void test_groups_cross_threshold(void **state)
{
	(void)state;
	uint64_t counts[64];
	uint64_t x = 88172645463325252ull;
	for (int i = 0; i < 64; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		counts[i] = 1 + x % 3000000;
	}
	const uint64_t threshold = 2097152;
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 64, threshold, &p), 0);
	uint32_t used = 0;
	for (uint32_t b = 0; b < p.nbuckets; b++) {
		const struct gs_bucket *bk = &p.buckets[b];
		used += bk->count;
		if (bk->count == 1 && counts[p.members[bk->first]] > threshold)
			continue;
		uint32_t last = p.members[bk->first + bk->count - 1];
		assert_true(bk->elements - counts[last] <= threshold);
		/* Only the final flush may stay at or under the threshold. */
		if (b + 1 < p.nbuckets)
			assert_true(bk->elements > threshold);
	}
	assert_int_equal(used, 64);
	gs_plan_free(&p);
}

/* What a job's fusion and staging buffers must hold, by the plan: rows of
 * counts, threshold and fusion buffer setting, with the sizes worked out
 * by hand from the rule (the largest bucket the original reduces, at most
 * the setting; staged only when a bucket passes it). */
struct size_case {
	const char *what;
	uint64_t threshold, fusion;
	uint32_t n;
	uint64_t counts[MAX_T];
	uint64_t fusion_elements, staged_elements;
};

static const struct size_case size_cases[] = {
	{ "a small layout needs much less than the setting", 100, 4096, 3, { 5, 6, 7 }, 18, 0 },
	{ "the largest group, not the sum of the layout", 100, 4096, 4, { 60, 50, 70, 40 }, 110, 0 },
	{ "a large tensor alone is the largest bucket", 100, 4096, 3, { 10, 1000, 10 }, 1000, 0 },
	{ "a bucket equal to the setting is not staged", 100, 1000, 2, { 1000, 3 }, 1000, 0 },
	{ "one element more is staged, the buffer the setting", 100, 1000, 2, { 1001, 3 }, 1000,
	  1001 },
	{ "the largest of several staged buckets", 100, 500, 4, { 700, 20, 900, 600 }, 500, 900 },
	{ "the default setting against a ResNet-sized bucket", 2097152, 4194304, 2,
	  { 2359296, 792576 }, 2359296, 0 },
};

static void test_buffer_sizes(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(size_cases) / sizeof(size_cases[0]); i++) {
		const struct size_case *c = &size_cases[i];
		struct gs_plan p;
		print_message("%s\n", c->what);
		assert_int_equal(gs_plan_build(c->counts, c->n, c->threshold, &p), 0);
		assert_int_equal(gs_plan_fusion_elements(&p, c->fusion), c->fusion_elements);
		assert_int_equal(gs_plan_staged_elements(&p, c->fusion), c->staged_elements);
		gs_plan_free(&p);
	}
}

/* Random layouts: every chunk of every bucket, cut at the setting as the
 * backends cut them, fits in the fusion buffer, and one fills it (it is
 * no larger than it must be); the staging buffer holds every bucket that
 * is cut, and one fills it. */
static void test_buffers_hold_every_chunk(void **state)
{
	(void)state;
	uint64_t x = 2463534242ull;
	for (int round = 0; round < 200; round++) {
		uint64_t counts[MAX_T];
		for (int i = 0; i < MAX_T; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			counts[i] = 1 + x % 5000;
		}
		uint64_t threshold = 1 + x % 3000, fusion = 1024 + x % 4096;
		struct gs_plan p;
		assert_int_equal(gs_plan_build(counts, MAX_T, threshold, &p), 0);
		uint64_t cap = gs_plan_fusion_elements(&p, fusion);
		uint64_t staged = gs_plan_staged_elements(&p, fusion);
		uint64_t widest_chunk = 0, widest_cut = 0;
		for (uint32_t b = 0; b < p.nbuckets; b++) {
			uint64_t total = p.buckets[b].elements;
			for (uint64_t start = 0; start < total; start += fusion) {
				uint64_t len = gs_chunk_len(total, start, fusion);
				assert_true(len <= cap);
				widest_chunk = len > widest_chunk ? len : widest_chunk;
			}
			if (total > fusion)
				widest_cut = total > widest_cut ? total : widest_cut;
		}
		assert_int_equal(widest_chunk, cap);
		assert_int_equal(widest_cut, staged);
		gs_plan_free(&p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_chunks_tile_bucket),
		cmocka_unit_test(test_groups_cross_threshold),
		cmocka_unit_test(test_buffer_sizes),
		cmocka_unit_test(test_buffers_hold_every_chunk),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
