/*
 * The host backend's pipeline between real processes: two ranks, each a
 * host backend of one or two local trainers joined to a Gloo group on loopback
 * (the pipeline slice rank 0 offers through the store: with one CPU here,
 * whole chunks), reduce a bucket of several pipeline slices (and one of several chunks
 * through a small fusion buffer) and a bucket of one slice. The expected
 * sums are the test's own (small integers, exact in every wire dtype).
 * Then one rank votes to abort in the bucket's data: both stop at that
 * bucket with the same summed vote, the other rank's tensors bit for bit
 * its own, and the next bucket goes through on both (the two issued the
 * same all-reduces). With overlap, bucket 1 is offered as the next
 * (gs_bucket_io.next) while bucket 0 runs: packed early and found again by
 * its token, right on both. After a bucket 0 aborted, both ranks go on
 * as the engine does, with the next step's bucket 0 and then bucket 1:
 * the early bucket 1 of the aborted step is refused, never all-reduced,
 * or it would meet the other rank's next bucket 0 and the two would fall
 * out of step. Every bucket reduced also sums its squares (the step's
 * gradient norm): the values are small integers, so the sum is exact in
 * any order and must equal the test's own sum of the reduced values,
 * however the chunks, slices and threads cut it. Last, a node 0 that
 * offers a pipeline slice the threads' claims would cut is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/gloo/gloo_comm.h"
#include "errors.h"
#include "file_store.h"
#include "ranks.h"

#define TIMEOUT_MS 20000
#define MAX_LOCAL 2
/* Bucket 0: four tensors, 1062151 elements (the crossing tensor flushes
 * it at the threshold): a head of 16384 and, where rank 0 has two CPUs,
 * slices of 1048576 (two trainers claim them in pieces of 262144); bucket
 * 1: one tensor of 5. */
#define NT 5
static const uint64_t counts[NT] = { 300000, 500000, 7, 262144, 5 };
#define THRESHOLD 1000000

struct setup {
	char *dir;
	enum gs_wire wire;
	uint64_t fusion;
	int abort_rank; /* votes to abort bucket 0; -1: none */
	unsigned local; /* trainers per node, 1 or 2 */
	bool overlap;   /* bucket 1 offered as bucket 0's next */
};

/* A small integer, different per node, trainer, tensor and element. */
static float value(int node, int local, int t, uint64_t i)
{
	return (float)((int)((node * 7 + local * 3 + t * 5 + i) % 16) - 8);
}

static float reduced(unsigned local, int t, uint64_t i)
{
	float s = 0;
	for (int n = 0; n < 2; n++)
		for (int l = 0; l < (int)local; l++)
			s += value(n, l, t, i);
	return s;
}

struct rank_state {
	struct gs_backend *b;
	unsigned local;
	struct gs_plan plan;
	float *tensors[MAX_LOCAL][NT];
	struct gs_pack_params pack[MAX_LOCAL];
	uint64_t clipped[MAX_LOCAL], nonfinite;
	struct gs_vote vote[2];
	double sumsq[2];
	float *const *tptr[MAX_LOCAL];
	/* Each bucket's, as the engine keeps a run's from its launch on. */
	struct gs_bucket_io io[2];
	bool overlap;
	unsigned step; /* tokens are the step's */
};

/* Bucket 1 is queued behind bucket 0, as the engine would say. */
static const struct gs_bucket_io *next_bucket(const struct gs_bucket_io *io)
{
	struct rank_state *s = io->ctx;
	return io->bucket == 0 && s->overlap ? &s->io[1] : NULL;
}

static void set_io(struct rank_state *s, uint32_t bucket, unsigned nranks, bool abort)
{
	s->vote[bucket] = (struct gs_vote){ 0 };
	if (abort)
		s->vote[bucket] = (struct gs_vote){ 1, 1, 1, 2 };
	s->tptr[0] = s->tensors[0];
	s->tptr[1] = s->tensors[1];
	s->sumsq[bucket] = 0;
	s->io[bucket] = (struct gs_bucket_io){
		.plan = &s->plan, .counts = counts, .bucket = bucket, .nranks = nranks,
		.tensors = s->tptr, .pack = s->pack, .postscale = 1.0f, .clipped = s->clipped,
		.nonfinite = &s->nonfinite, .ctx = s, .vote = &s->vote[bucket],
		.vote_timeout_ms = TIMEOUT_MS, .next = next_bucket, .token = s->step * 2 + bucket + 1,
		.sumsq = &s->sumsq[bucket],
	};
}

static int reduce(struct rank_state *s, uint32_t bucket, unsigned nranks, bool abort)
{
	set_io(s, bucket, nranks, abort);
	if (bucket == 0)
		set_io(s, 1, s->local, false); /* queued behind it */
	return s->b->ops->reduce_bucket(s->b, &s->io[bucket]);
}

/* 0 when bucket `bucket`'s sum of squares is that of the reduced values
 * (exact: small integers), and every tensor of it holds the reduced sum
 * (want_reduced) or, bit for bit, this rank's own values. */
static int check_bucket(struct rank_state *s, int rank, uint32_t bucket, bool want_reduced)
{
	const struct gs_bucket *bk = &s->plan.buckets[bucket];
	double sumsq = 0;
	for (uint32_t m = 0; want_reduced && m < bk->count; m++) {
		int t = (int)s->plan.members[bk->first + m];
		for (uint64_t i = 0; i < counts[t]; i++)
			sumsq += (double)reduced(s->local, t, i) * reduced(s->local, t, i);
	}
	if (want_reduced && s->sumsq[bucket] != sumsq) {
		fprintf(stderr, "rank %d: bucket %u's sum of squares is %.17g, want %.17g\n", rank,
			bucket, s->sumsq[bucket], sumsq);
		return 1;
	}
	for (uint32_t m = 0; m < bk->count; m++) {
		int t = (int)s->plan.members[bk->first + m];
		for (int l = 0; l < (int)s->local; l++)
			for (uint64_t i = 0; i < counts[t]; i++) {
				float want = want_reduced ? reduced(s->local, t, i) : value(rank, l, t, i);
				if (s->tensors[l][t][i] != want) {
					fprintf(stderr, "rank %d: tensor %d of trainer %d, element %llu is %g, want %g\n",
						rank, t, l, (unsigned long long)i,
						(double)s->tensors[l][t][i], (double)want);
					return 1;
				}
			}
	}
	return 0;
}

/* The group's store for join_group: the test's file store, whose keys
 * hold no '/'. */
static int kv_set(void *ctx, const char *key, const void *value, size_t len)
{
	char k[128];
	snprintf(k, sizeof(k), "%s", key);
	for (char *c = k; *c; c++)
		*c = *c == '/' ? '_' : *c;
	struct gs_gloo_store_ops *st = ctx;
	return st->set(st->ctx, k, value, len);
}

static int kv_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	char k[128];
	snprintf(k, sizeof(k), "%s", key);
	for (char *c = k; *c; c++)
		*c = *c == '/' ? '_' : *c;
	struct gs_gloo_store_ops *st = ctx;
	return st->get(st->ctx, k, value, len, timeout_ms);
}

static int rank_main(int rank, int size, void *arg)
{
	const struct setup *su = arg;
	struct rank_state s = { 0 };
	char err[256];
	struct gs_gloo_store_ops store = file_store(su->dir);
	struct gs_gloo *g = NULL;
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, err, sizeof(err)) != GS_OK) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return 2;
	}
	s.local = su->local;
	s.overlap = su->overlap;
	const struct gs_host_options o = { .local_size = s.local, .wire = su->wire,
					   .fusion_elements = su->fusion, .nodes = (uint32_t)size };
	s.b = gs_backend_host_create(&o);
	if (!s.b || gs_plan_build(counts, NT, THRESHOLD, &s.plan) != 0 || s.plan.nbuckets != 2 ||
	    s.b->ops->size_buffers(s.b, &s.plan, err, sizeof(err)) != GS_OK)
		return 3;
	struct gs_kv kv = { .ctx = &store, .set = kv_set, .get = kv_get };
	struct gs_group_join join = { .node_rank = (uint32_t)rank, .nodes = (uint32_t)size,
				      .join_timeout_ms = TIMEOUT_MS, .peer_timeout_ms = TIMEOUT_MS,
				      .kv = &kv, .gloo = g };
	if (s.b->ops->join_group(s.b, &join, err, sizeof(err)) != GS_OK || !s.b->votes_in_data) {
		fprintf(stderr, "rank %d: join_group: %s\n", rank, err);
		return 4;
	}
	for (int l = 0; l < (int)s.local; l++) {
		s.pack[l] = (struct gs_pack_params){ .prescale = 1.0f };
		for (int t = 0; t < NT; t++) {
			s.tensors[l][t] = malloc(counts[t] * sizeof(float));
			if (!s.tensors[l][t])
				return 5;
			for (uint64_t i = 0; i < counts[t]; i++)
				s.tensors[l][t][i] = value(rank, l, t, i);
		}
	}
	int rc;
	if (su->abort_rank < 0) {
		if ((rc = reduce(&s, 0, s.local, false)) != GS_OK) {
			fprintf(stderr, "rank %d: bucket 0: %d %s\n", rank, rc, s.b->error);
			return 6;
		}
		if (check_bucket(&s, rank, 0, true))
			return 7;
	} else {
		bool mine = rank == su->abort_rank;
		rc = reduce(&s, 0, mine ? 0 : s.local, mine);
		if (rc != GS_EABORTED) {
			fprintf(stderr, "rank %d: bucket 0 gave %d, want GS_EABORTED\n", rank, rc);
			return 8;
		}
		const struct gs_vote *v = &s.vote[0];
		if (v->aborts != 1 || v->node != (uint32_t)su->abort_rank || v->rank != 1 ||
		    v->reason != 2) {
			fprintf(stderr, "rank %d: summed vote %u %u %u %u\n", rank, v->aborts,
				v->node, v->rank, v->reason);
			return 9;
		}
		if (check_bucket(&s, rank, 0, false))
			return 10;
		/* The next step, on both. */
		s.step++;
		if ((rc = reduce(&s, 0, s.local, false)) != GS_OK) {
			fprintf(stderr, "rank %d: bucket 0 of the next step: %d %s\n", rank, rc,
				s.b->error);
			return 14;
		}
		if (check_bucket(&s, rank, 0, true))
			return 15;
	}
	/* Bucket 1 packed early behind each bucket 0 that reduced tensors
	 * here. */
	uint64_t early = gs_backend_overlapped_buckets(s.b);
	unsigned reducing = (su->abort_rank != rank) + (su->abort_rank >= 0);
	if (early != (su->overlap ? reducing : 0)) {
		fprintf(stderr, "rank %d: %llu buckets packed early\n", rank, (unsigned long long)early);
		return 13;
	}
	/* The run of bucket 1 as launched (its token): taken from its lane
	 * where it was packed early, packed again where that was refused. */
	if ((rc = s.b->ops->reduce_bucket(s.b, &s.io[1])) != GS_OK) {
		fprintf(stderr, "rank %d: bucket 1: %d %s\n", rank, rc, s.b->error);
		return 11;
	}
	if (check_bucket(&s, rank, 1, true))
		return 12;
	s.b->ops->leave_group(s.b);
	s.b->ops->destroy(s.b);
	gs_gloo_destroy(g);
	gs_plan_free(&s.plan);
	for (int l = 0; l < (int)s.local; l++)
		for (int t = 0; t < NT; t++)
			free(s.tensors[l][t]);
	return 0;
}

static void run_overlap(enum gs_wire wire, uint64_t fusion, int abort_rank, unsigned local,
			bool overlap)
{
	struct setup su = { file_store_dir_create(), wire, fusion, abort_rank, local, overlap };
	assert_non_null(su.dir);
	struct ranks rk;
	int status[2];
	assert_int_equal(ranks_start(&rk, 2, rank_main, &su), 0);
	int overran = ranks_wait(&rk, 3 * TIMEOUT_MS, status);
	file_store_dir_remove(su.dir);
	assert_int_equal(overran, 0);
	assert_int_equal(status[0], 0);
	assert_int_equal(status[1], 0);
}

static void run(enum gs_wire wire, uint64_t fusion, int abort_rank, unsigned local)
{
	run_overlap(wire, fusion, abort_rank, local, false);
}

static void pipelined_fp16(void **state)
{
	(void)state;
	run(GS_WIRE_F16, 4194304, -1, 2);
}

static void pipelined_bf16(void **state)
{
	(void)state;
	run(GS_WIRE_BF16, 4194304, -1, 1);
}

static void pipelined_fp32(void **state)
{
	(void)state;
	run(GS_WIRE_F32, 4194304, -1, 2);
}

/* Bucket 0 through a fusion buffer of 600000: two chunks, three slices
 * and two. */
static void pipelined_staged(void **state)
{
	(void)state;
	run(GS_WIRE_F16, 600000, -1, 1);
}

static void vote_in_data_rank_1(void **state)
{
	(void)state;
	run(GS_WIRE_F16, 4194304, 1, 1);
}

static void vote_in_data_rank_0_staged(void **state)
{
	(void)state;
	run(GS_WIRE_BF16, 600000, 0, 2);
}

/* Bucket 1 packed while bucket 0 is exchanged, in each wire dtype. */
static void overlapped_fp16(void **state)
{
	(void)state;
	run_overlap(GS_WIRE_F16, 4194304, -1, 2, true);
}

static void overlapped_bf16(void **state)
{
	(void)state;
	run_overlap(GS_WIRE_BF16, 4194304, -1, 1, true);
}

static void overlapped_fp32(void **state)
{
	(void)state;
	run_overlap(GS_WIRE_F32, 4194304, -1, 2, true);
}

/* Rank 1 votes to abort bucket 0 while rank 0 has bucket 1 packed behind
 * it: refused there, and bucket 1 then goes once on both. */
static void overlapped_behind_an_abort(void **state)
{
	(void)state;
	run_overlap(GS_WIRE_F16, 4194304, 1, 1, true);
}

/* The store of a node 0 that offers `slice`, to node 1's join_group. */
static int offer_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	(void)key;
	(void)timeout_ms;
	*value = strdup(ctx);
	*len = strlen(ctx);
	return *value ? GS_OK : GS_ENOMEM;
}

static int join_offered(const char *slice, char *err, size_t errlen)
{
	const struct gs_host_options o = { .local_size = 1, .wire = GS_WIRE_F16,
					   .fusion_elements = 4194304, .nodes = 2 };
	struct gs_backend *b = gs_backend_host_create(&o);
	assert_non_null(b);
	struct gs_kv kv = { .ctx = (void *)slice, .get = offer_get };
	struct gs_group_join join = { .node_rank = 1, .nodes = 2, .join_timeout_ms = TIMEOUT_MS,
				      .peer_timeout_ms = TIMEOUT_MS, .kv = &kv };
	int rc = b->ops->join_group(b, &join, err, errlen);
	if (rc == GS_OK)
		b->ops->leave_group(b);
	b->ops->destroy(b);
	return rc;
}

/* The threads claim pieces of 262144 elements, and each piece must start
 * at an edge of the norm's blocks: a slice that is not a multiple of a
 * claim is refused, naming it; one that is goes. */
static void refuses_a_slice_that_cuts_claims(void **state)
{
	(void)state;
	char err[256] = "";
	assert_int_equal(join_offered("300000", err, sizeof(err)), GS_EPROTO);
	assert_non_null(strstr(err, "'300000' elements; 0 or a multiple of 262144 expected"));
	assert_int_equal(join_offered("2097152", err, sizeof(err)), GS_OK);
}

int main(void)
{
	/* Buckets overlap whatever CPUs this test may use (by default a
	 * backend of one CPU does not). */
	setenv("GRADSYNCD_BUCKET_OVERLAP", "1", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pipelined_fp16),
		cmocka_unit_test(pipelined_bf16),
		cmocka_unit_test(pipelined_fp32),
		cmocka_unit_test(pipelined_staged),
		cmocka_unit_test(vote_in_data_rank_1),
		cmocka_unit_test(vote_in_data_rank_0_staged),
		cmocka_unit_test(overlapped_fp16),
		cmocka_unit_test(overlapped_bf16),
		cmocka_unit_test(overlapped_fp32),
		cmocka_unit_test(overlapped_behind_an_abort),
		cmocka_unit_test(refuses_a_slice_that_cuts_claims),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
