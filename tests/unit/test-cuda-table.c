/*
 * What the CUDA kernels are told to do, checked on the host: how a bucket
 * is cut into launches that fit the fusion buffer, and the pointer tables
 * each launch reads (an entry per span: tensor address, place in the fusion
 * buffer, length; a task per thread block). Worked examples by hand, then
 * random layouts against an independent element-by-element reference
 * built from the bucket plan's members.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/plan.h"
#include "backend/cuda/table.h"

/* Fake device addresses: tensor t at BASE(t), far apart. */
#define BASE(t) (UINT64_C(0x7f0000000000) + (uint64_t)(t) * (UINT64_C(1) << 32))

static float **fake_tensors(uint32_t n)
{
	float **t = calloc(n, sizeof(*t));
	assert_non_null(t);
	for (uint32_t i = 0; i < n; i++)
		t[i] = (float *)(uintptr_t)BASE(i);
	return t;
}

static const struct gs_cuda_entry *entries_of(const void *table, const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_entry *)((const char *)table + l->table_offset);
}

static const struct gs_cuda_task *tasks_of(const void *table, const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_task *)((const char *)table + gs_cuda_tasks_offset(l));
}

/* The kernels (kernels.cu) read these exact layouts. */
static void structs_have_the_kernels_layout(void **state)
{
	assert_int_equal(sizeof(struct gs_cuda_entry), 24);
	assert_int_equal(offsetof(struct gs_cuda_entry, ptr), 0);
	assert_int_equal(offsetof(struct gs_cuda_entry, offset), 8);
	assert_int_equal(offsetof(struct gs_cuda_entry, count), 16);
	assert_int_equal(sizeof(struct gs_cuda_task), 16);
	assert_int_equal(offsetof(struct gs_cuda_task, entry), 0);
	assert_int_equal(offsetof(struct gs_cuda_task, count), 4);
	assert_int_equal(offsetof(struct gs_cuda_task, start), 8);
}

/* Three tensors fused into one bucket that fits one launch. */
static void one_launch_per_bucket_that_fits(void **state)
{
	uint64_t counts[] = { 1000, 5000, 3 };
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 3, 1u << 20, &p), 0);
	assert_int_equal(p.nbuckets, 1);
	struct gs_cuda_bucket_plan bp = { 0 };
	assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, 0, 8192), 0);
	assert_int_equal(bp.nlaunches, 1);
	const struct gs_cuda_launch *l = &bp.launches[0];
	assert_int_equal(l->start, 0);
	assert_int_equal(l->elements, 6003);
	assert_int_equal(l->nspans, 3);
	assert_int_equal(l->ntasks, 4); /* 1000 | 4096 + 904 | 3 */
	assert_int_equal(l->table_offset, 0);
	assert_int_equal(gs_cuda_tasks_offset(l), 3 * 24);
	assert_int_equal(bp.table_bytes, 144); /* 72 + 64, to 16 bytes */

	float **t = fake_tensors(3);
	uint8_t *table = malloc(bp.table_bytes);
	memset(table, 0xa5, bp.table_bytes);
	gs_cuda_fill_tables(&bp, t, table);
	const struct gs_cuda_entry *e = entries_of(table, l);
	const struct gs_cuda_entry want_e[] = {
		{ BASE(0), 0, 1000 }, { BASE(1), 1000, 5000 }, { BASE(2), 6000, 3 },
	};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(e[i].ptr, want_e[i].ptr);
		assert_int_equal(e[i].offset, want_e[i].offset);
		assert_int_equal(e[i].count, want_e[i].count);
	}
	const struct gs_cuda_task *k = tasks_of(table, l);
	const struct gs_cuda_task want_k[] = {
		{ 0, 1000, 0 }, { 1, 4096, 0 }, { 1, 904, 4096 }, { 2, 3, 0 },
	};
	for (int i = 0; i < 4; i++) {
		assert_int_equal(k[i].entry, want_k[i].entry);
		assert_int_equal(k[i].count, want_k[i].count);
		assert_int_equal(k[i].start, want_k[i].start);
	}
	for (size_t b = 136; b < 144; b++)
		assert_int_equal(table[b], 0); /* no stale padding */
	free(table);
	free(t);
	gs_cuda_bucket_plan_free(&bp);
	gs_plan_free(&p);
}

/* A bucket of 15500 elements through a 4096-element fusion buffer: four
 * launches, the middle tensor cut across all of them. */
static void buckets_larger_than_one_launch(void **state)
{
	uint64_t counts[] = { 3000, 10000, 2500 };
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 3, 1u << 20, &p), 0);
	struct gs_cuda_bucket_plan bp = { 0 };
	assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, 0, 4096), 0);
	assert_int_equal(bp.nlaunches, 4);
	const struct {
		uint64_t start, elements;
		uint32_t nspans;
	} want_l[] = { { 0, 4096, 2 }, { 4096, 4096, 1 }, { 8192, 4096, 1 }, { 12288, 3212, 2 } };
	/* (tensor, element offset in the tensor, count) per span. */
	const struct gs_span want_s[] = {
		{ 0, 0, 3000 }, { 1, 0, 1096 }, { 1, 1096, 4096 }, { 1, 5192, 4096 },
		{ 1, 9288, 712 }, { 2, 0, 2500 },
	};
	float **t = fake_tensors(3);
	uint8_t *table = malloc(bp.table_bytes);
	gs_cuda_fill_tables(&bp, t, table);
	size_t s = 0, prev_end = 0;
	for (uint32_t i = 0; i < 4; i++) {
		const struct gs_cuda_launch *l = &bp.launches[i];
		assert_int_equal(l->start, want_l[i].start);
		assert_int_equal(l->elements, want_l[i].elements);
		assert_int_equal(l->nspans, want_l[i].nspans);
		assert_int_equal(l->table_offset % GS_CUDA_TABLE_ALIGN, 0);
		assert_true(l->table_offset >= prev_end);
		const struct gs_cuda_entry *e = entries_of(table, l);
		uint64_t fusion = 0;
		for (uint32_t j = 0; j < l->nspans; j++, s++) {
			assert_int_equal(e[j].ptr, BASE(want_s[s].tensor) + 4 * want_s[s].offset);
			assert_int_equal(e[j].offset, fusion); /* each launch fills from 0 */
			assert_int_equal(e[j].count, want_s[s].count);
			fusion += e[j].count;
		}
		assert_int_equal(fusion, l->elements);
		prev_end = gs_cuda_tasks_offset(l) + l->ntasks * sizeof(struct gs_cuda_task);
	}
	assert_int_equal(s, 6);
	assert_true(prev_end <= bp.table_bytes);
	free(table);
	free(t);
	gs_cuda_bucket_plan_free(&bp);
	gs_plan_free(&p);
}

/* Element k of a bucket (its members end to end) is element ref_el[k] of
 * tensor ref_t[k]: built from the plan's members alone. */
static void reference(const struct gs_plan *p, const uint64_t *counts, uint32_t bucket,
		      uint32_t *ref_t, uint64_t *ref_el)
{
	const struct gs_bucket *bk = &p->buckets[bucket];
	uint64_t k = 0;
	for (uint32_t m = 0; m < bk->count; m++) {
		uint32_t t = p->members[bk->first + m];
		for (uint64_t i = 0; i < counts[t]; i++, k++) {
			ref_t[k] = t;
			ref_el[k] = i;
		}
	}
	assert_int_equal(k, bk->elements);
}

/* Every element of the bucket is packed exactly once, by exactly one
 * task, from the right tensor element to the right fusion position. */
static void check_bucket(const struct gs_plan *p, const uint64_t *counts, uint32_t bucket,
			 uint64_t fusion, float **tensors, uint32_t ntensors)
{
	struct gs_cuda_bucket_plan bp = { 0 };
	assert_int_equal(gs_cuda_plan_bucket(&bp, p, counts, bucket, fusion), 0);
	uint64_t total = p->buckets[bucket].elements;
	uint32_t *ref_t = malloc(total * sizeof(*ref_t));
	uint64_t *ref_el = malloc(total * sizeof(*ref_el));
	uint8_t *seen = calloc(total, 1);
	reference(p, counts, bucket, ref_t, ref_el);
	uint8_t *table = malloc(bp.table_bytes);
	gs_cuda_fill_tables(&bp, tensors, table);
	assert_int_equal(bp.nlaunches, (total + fusion - 1) / fusion);
	uint64_t next = 0;
	for (uint32_t i = 0; i < bp.nlaunches; i++) {
		const struct gs_cuda_launch *l = &bp.launches[i];
		assert_int_equal(l->start, next);
		assert_true(l->elements > 0 && l->elements <= fusion);
		next += l->elements;
		const struct gs_cuda_entry *e = entries_of(table, l);
		const struct gs_cuda_task *k = tasks_of(table, l);
		for (uint32_t j = 0; j < l->ntasks; j++) {
			assert_true(k[j].entry < l->nspans);
			assert_true(k[j].count > 0 && k[j].count <= GS_CUDA_TASK_ELEMENTS);
			const struct gs_cuda_entry *en = &e[k[j].entry];
			assert_true(k[j].start + k[j].count <= en->count);
			for (uint64_t x = 0; x < k[j].count; x++) {
				uint64_t pos = l->start + en->offset + k[j].start + x;
				assert_true(en->offset + k[j].start + x < l->elements);
				assert_true(pos < total);
				assert_int_equal(seen[pos], 0);
				seen[pos] = 1;
				uint64_t addr = en->ptr + 4 * (k[j].start + x);
				uint32_t t = ref_t[pos];
				assert_true(t < ntensors);
				assert_int_equal(addr, BASE(t) + 4 * ref_el[pos]);
			}
		}
	}
	assert_int_equal(next, total);
	for (uint64_t i = 0; i < total; i++)
		assert_int_equal(seen[i], 1);
	free(table);
	free(seen);
	free(ref_el);
	free(ref_t);
	gs_cuda_bucket_plan_free(&bp);
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void random_layouts_match_the_reference(void **state)
{
	uint64_t seed = 0x9e3779b97f4a7c15u;
	for (int round = 0; round < 40; round++) {
		uint32_t n = 1 + (uint32_t)(rnd(&seed) % 60);
		uint64_t *counts = calloc(n, sizeof(*counts));
		for (uint32_t i = 0; i < n; i++) {
			/* Mostly small, some above the threshold, some huge. */
			uint64_t r = rnd(&seed) % 100;
			counts[i] = 1 + rnd(&seed) % (r < 70 ? 300 : r < 95 ? 9000 : 40000);
		}
		uint64_t threshold = 1 + rnd(&seed) % 12000;
		uint64_t fusion = 1024 + rnd(&seed) % 9000;
		struct gs_plan p;
		assert_int_equal(gs_plan_build(counts, n, threshold, &p), 0);
		float **t = fake_tensors(n);
		for (uint32_t b = 0; b < p.nbuckets; b++)
			check_bucket(&p, counts, b, fusion, t, n);
		free(t);
		gs_plan_free(&p);
		free(counts);
	}
}

/* The arrays are kept between buckets; a smaller bucket after a larger
 * one is planned afresh, not appended. */
static void reuses_its_arrays(void **state)
{
	uint64_t counts[] = { 50000, 10, 20 };
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 3, 1000, &p), 0);
	assert_int_equal(p.nbuckets, 2);
	struct gs_cuda_bucket_plan bp = { 0 };
	assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, 0, 4096), 0);
	assert_int_equal(bp.nlaunches, 13);
	size_t cap = bp.launch_cap;
	assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, 1, 4096), 0);
	assert_int_equal(bp.nlaunches, 1);
	assert_int_equal(bp.nspans, 2);
	assert_int_equal(bp.launches[0].elements, 30);
	assert_int_equal(bp.launch_cap, cap);
	assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, 1, 0), -EINVAL);
	gs_cuda_bucket_plan_free(&bp);
	gs_plan_free(&p);
}

/* The tensor whose span an entry is, from its fake device address. */
static uint32_t tensor_at(uint64_t addr)
{
	return (uint32_t)((addr - BASE(0)) >> 32);
}

/* A tensor no trainer produced leaves the unpack: every task of its spans
 * has no elements left, in every launch, and every other task is as
 * gs_cuda_fill_tables wrote it; a launch with nothing to take out is
 * reported unchanged. */
static void unproduced_tensors_leave_the_unpack(void **state)
{
	uint64_t seed = 0x243f6a8885a308d3u;
	for (int round = 0; round < 20; round++) {
		uint32_t n = 1 + (uint32_t)(rnd(&seed) % 60);
		uint64_t *counts = calloc(n, sizeof(*counts));
		uint8_t *produced = calloc(n, 1);
		for (uint32_t i = 0; i < n; i++) {
			counts[i] = 1 + rnd(&seed) % (i % 4 ? 300 : 9000);
			produced[i] = rnd(&seed) % 3 != 0;
		}
		struct gs_plan p;
		assert_int_equal(gs_plan_build(counts, n, 1 + rnd(&seed) % 12000, &p), 0);
		float **t = fake_tensors(n);
		for (uint32_t b = 0; b < p.nbuckets; b++) {
			struct gs_cuda_bucket_plan bp = { 0 };
			assert_int_equal(gs_cuda_plan_bucket(&bp, &p, counts, b, 4096), 0);
			uint8_t *table = malloc(bp.table_bytes), *was = malloc(bp.table_bytes);
			gs_cuda_fill_tables(&bp, t, table);
			memcpy(was, table, bp.table_bytes);
			for (uint32_t i = 0; i < bp.nlaunches; i++) {
				const struct gs_cuda_launch *l = &bp.launches[i];
				assert_false(gs_cuda_skip_unproduced(&bp, l, NULL, table));
				bool changed = gs_cuda_skip_unproduced(&bp, l, produced, table);
				bool any = false;
				const struct gs_cuda_entry *e = entries_of(was, l);
				const struct gs_cuda_task *k0 = tasks_of(was, l), *k = tasks_of(table, l);
				for (uint32_t j = 0; j < l->ntasks; j++) {
					bool out = !produced[tensor_at(e[k0[j].entry].ptr)];
					any |= out;
					assert_int_equal(k[j].entry, k0[j].entry);
					assert_int_equal(k[j].start, k0[j].start);
					assert_int_equal(k[j].count, out ? 0 : k0[j].count);
				}
				assert_int_equal(changed, any);
				assert_false(gs_cuda_skip_unproduced(&bp, l, produced, table));
			}
			free(was);
			free(table);
			gs_cuda_bucket_plan_free(&bp);
		}
		free(t);
		gs_plan_free(&p);
		free(produced);
		free(counts);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(structs_have_the_kernels_layout),
		cmocka_unit_test(one_launch_per_bucket_that_fits),
		cmocka_unit_test(buckets_larger_than_one_launch),
		cmocka_unit_test(random_layouts_match_the_reference),
		cmocka_unit_test(reuses_its_arrays),
		cmocka_unit_test(unproduced_tensors_leave_the_unpack),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
