/*
 * gs_gloo_allreduce between 2 and 5 real processes on loopback, through the
 * C-callback store backed by files, for every wire dtype at 1, 1000 and
 * 1048577 elements, each rank with its own inputs: as the daemon calls it
 * (the model picks ring or doubling by size) and by each algorithm named
 * (Gloo's ring, our recursive doubling, Gloo's classic halving-doubling).
 *
 * Each result is checked against an independent reference (wire_ref.h):
 * Gloo's ring adds the ranks' values one hop at a time, rounding to the wire
 * dtype after each hop, in an order of ranks that depends on where the
 * element falls in the ring. So every element must equal that chain of
 * roundings for some order of the ranks (exactly, bit for bit), and lie
 * within `ranks` half-ulps of the exact sum. Recursive doubling adds in a
 * fixed tree instead (extra ranks folded into the first ones, then pairs
 * r, r ^ 1, then r ^ 2...), so its elements must equal that tree's
 * roundings; halving-doubling adds by the same tree where the group is a
 * power of two, and as a chain (its blocks) where it is not. All ranks must
 * end with the same bits. For fp16, Gloo's own float16 sum must give the same bits as the
 * vectorised one, as both round once per hop; a NaN shows which of the two
 * actually ran. Also: a group of one, ranks that leave at once, and
 * gs_gloo_broadcast from every rank.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "file_store.h"
#include "backend/gloo/gloo_comm.h"
#include "errors.h"
#include "ranks.h"
#include "wire_ref.h"

/* Generous: two busy cores may run several such groups at once. */
#define TIMEOUT_MS 20000
#define MSG_LEN 512

static const size_t sizes[] = {1, 1000, 1048577};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define TOTAL (1 + 1000 + 1048577)
#define BIG 1048577

/* What the parent hands every rank, in memory shared with the children. */
struct group {
	const struct wire_fmt *f;
	int algo;	      /* GS_GLOO_ALGO_AUTO: gs_gloo_allreduce */
	int *ran;	      /* [NSIZES]: the algorithm rank 0 ran for each size */
	char *dir;
	char *results;	      /* [rank][TOTAL] wire elements */
	char *gloo_results;   /* [rank][BIG]: fp16 with Gloo's own sum */
	char (*msg)[MSG_LEN]; /* [rank]: why a rank failed */
	size_t bytes;	      /* of the shared mapping */
};

/* ------------------------------------------------------------ one rank */

static void fill_inputs(const struct wire_fmt *f, int rank, size_t n, void *buf)
{
	for (size_t i = 0; i < n; i++)
		wire_store(f, buf, i, wire_input(f, rank, i, n));
}

/* The largest buffer again, summed by Gloo's float16 operator+. */
static int gloo_sum_f16(struct group *gr, struct gs_gloo *g, int rank)
{
	void *buf = gr->gloo_results + (size_t)rank * BIG * 2;
	fill_inputs(gr->f, rank, BIG, buf);
	return gs_gloo_allreduce_with(g, GS_WIRE_F16, buf, BIG, GS_GLOO_SUM_GLOO, TIMEOUT_MS,
				      gr->msg[rank], MSG_LEN);
}

static int rank_main(int rank, int size, void *arg)
{
	struct group *gr = arg;
	struct gs_gloo_store_ops store = file_store(gr->dir);
	struct gs_gloo *g;
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, gr->msg[rank],
			   MSG_LEN) < 0)
		return 1;
	char *out = gr->results + (size_t)rank * TOTAL * gr->f->size;
	int rc = 0;
	for (size_t s = 0; s < NSIZES && rc == 0; s++) {
		fill_inputs(gr->f, rank, sizes[s], out);
		int r = gr->algo == GS_GLOO_ALGO_AUTO
				? gs_gloo_allreduce(g, gr->f->wire, out, sizes[s], TIMEOUT_MS,
						    gr->msg[rank], MSG_LEN)
				: gs_gloo_allreduce_algo(g, gr->f->wire, out, sizes[s], gr->algo,
							 TIMEOUT_MS, gr->msg[rank], MSG_LEN);
		if (r < 0)
			rc = 2;
		if (rank == 0)
			gr->ran[s] = gr->algo == GS_GLOO_ALGO_AUTO
					     ? (int)gs_gloo_choice(g, gr->f->wire, sizes[s])
					     : gr->algo;
		out += sizes[s] * gr->f->size;
	}
	if (rc == 0 && gr->algo == GS_GLOO_ALGO_AUTO && gr->f->wire == GS_WIRE_F16 &&
	    gloo_sum_f16(gr, g, rank) < 0)
		rc = 3;
	gs_gloo_destroy(g);
	return rc;
}

/* --------------------------------------------------------- the reference */

/* All orders of p ranks (p <= 4), by Heap's algorithm. */
static int permutations(int p, int perms[][4])
{
	int a[4] = {0}, c[4] = {0}, n = 0;
	for (int i = 0; i < p; i++)
		a[i] = i;
	memcpy(perms[n++], a, sizeof(a));
	for (int i = 1; i < p;) {
		if (c[i] < i) {
			int j = i % 2 ? c[i] : 0, t = a[j];
			a[j] = a[i];
			a[i] = t;
			memcpy(perms[n++], a, sizeof(a));
			c[i]++;
			i = 1;
		} else {
			c[i++] = 0;
		}
	}
	return n;
}

/* Whether got is x[o0] + x[o1] + ..., rounded after each addition, for some
 * order o of the p values. */
static bool some_order_gives(const struct wire_fmt *f, const double *x, int p, double got)
{
	int perms[24][4];
	assert_true(p <= 4); /* 4! orders at most */
	int n = permutations(p, perms);
	for (int k = 0; k < n; k++) {
		double acc = x[perms[k][0]];
		for (int j = 1; j < p; j++)
			acc = wire_round(f, acc + x[perms[k][j]]);
		if (acc == got)
			return true;
	}
	return false;
}

/* Recursive doubling's sum of the p values: with q the largest power of two
 * <= p, value r >= q is added into r - q, then each of the first q adds
 * its partner r ^ 1, r ^ 2, ..., rounding after each addition. */
static double doubling_tree(const struct wire_fmt *f, const double *x, int p)
{
	double v[RANKS_MAX], w[RANKS_MAX];
	int q = 1;
	while (q * 2 <= p)
		q *= 2;
	memcpy(v, x, (size_t)p * sizeof(*v));
	for (int r = q; r < p; r++)
		v[r - q] = wire_round(f, v[r - q] + v[r]);
	for (int mask = 1; mask < q; mask <<= 1) {
		for (int r = 0; r < q; r++)
			w[r] = wire_round(f, v[r] + v[r ^ mask]);
		memcpy(v, w, (size_t)q * sizeof(*v));
	}
	return v[0];
}

/* Whether got is what algo gives for the values x of p ranks. */
static bool algo_gives(const struct wire_fmt *f, int algo, const double *x, int p, double got)
{
	bool pow2 = (p & (p - 1)) == 0;
	switch (algo) {
	case GS_GLOO_ALGO_DOUBLING:
	case GS_GLOO_ALGO_RABENSEIFNER:
		return got == doubling_tree(f, x, p);
	case GS_GLOO_ALGO_HALVING_DOUBLING:
		return pow2 ? got == doubling_tree(f, x, p) : some_order_gives(f, x, p, got);
	default:
		return some_order_gives(f, x, p, got);
	}
}

/* Checks n results of rank 0 at out, summed by algo, against the inputs of
 * every rank; returns the number of wrong elements, printing the first few. */
static size_t check_values(const struct wire_fmt *f, int algo, int p, size_t n, const void *out)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		double x[RANKS_MAX], sum = 0, mag = 0;
		for (int r = 0; r < p; r++) {
			x[r] = wire_decode(f, wire_input(f, r, i, n));
			sum += x[r];
			mag += fabs(x[r]);
		}
		double got = wire_decode(f, wire_load(f, out, i));
		bool close = fabs(got - sum) <= p * 0.5 * wire_ulp(f, mag);
		if (close && algo_gives(f, algo, x, p, got))
			continue;
		if (bad++ < 5)
			print_error("%s %s n=%zu element %zu: got %.9g, exact sum %.9g (%s)\n",
				    gs_gloo_algo_name(algo), gs_wire_name(f->wire), n, i, got, sum,
				    close ? "not the algorithm's order of additions" : "too far");
	}
	return bad;
}

/* ---------------------------------------------------------------- parent */

static void run_algo(enum gs_wire wire, int p, int algo)
{
	struct group gr = {.f = wire_fmt(wire), .algo = algo};
	size_t res = (size_t)p * TOTAL * 4, gloo = (size_t)p * BIG * 2;
	size_t msgs = (size_t)p * MSG_LEN, head = 64; /* ran[] first, aligned */
	gr.bytes = head + res + gloo + msgs;
	char *shared = shared_alloc(gr.bytes);
	assert_non_null(shared);
	gr.ran = (int *)shared;
	gr.results = shared + head;
	gr.gloo_results = gr.results + res;
	gr.msg = (char(*)[MSG_LEN])(gr.results + res + gloo);
	gr.dir = file_store_dir_create();
	assert_non_null(gr.dir);

	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, p, rank_main, &gr), 0);
	int overran = ranks_wait(&rk, 3 * TIMEOUT_MS, status);
	file_store_dir_remove(gr.dir);
	for (int r = 0; r < p; r++)
		if (status[r] != 0)
			print_error("rank %d: status %d: %s\n", r, status[r], gr.msg[r]);
	assert_int_equal(overran, 0);
	for (int r = 0; r < p; r++)
		assert_int_equal(status[r], 0);

	/* Every rank holds the same bits... */
	size_t esize = gr.f->size;
	for (int r = 1; r < p; r++)
		assert_memory_equal(gr.results, gr.results + (size_t)r * TOTAL * esize,
				    TOTAL * esize);
	/* ...and they are right. */
	const char *out = gr.results;
	for (size_t s = 0; s < NSIZES; s++) {
		print_message("%d ranks, %s, %zu elements: %s\n", p, gs_wire_name(wire), sizes[s],
			      gs_gloo_algo_name(gr.ran[s]));
		/* What ran is what was asked, or the model's pick. */
		int want = algo != GS_GLOO_ALGO_AUTO ? algo : (int)gs_gloo_pick(sizes[s] * esize, p);
		assert_int_equal(gr.ran[s], want);
		assert_int_equal(check_values(gr.f, gr.ran[s], p, sizes[s], out), 0);
		out += sizes[s] * esize;
	}
	if (wire == GS_WIRE_F16 && algo == GS_GLOO_ALGO_AUTO) {
		const char *ours = gr.results + (TOTAL - BIG) * esize;
		for (int r = 0; r < p; r++)
			assert_memory_equal(ours, gr.gloo_results + (size_t)r * BIG * 2, BIG * 2);
	}
	shared_free(shared, gr.bytes);
}

static void run_group(enum gs_wire wire, int p)
{
	run_algo(wire, p, GS_GLOO_ALGO_AUTO);
}

static void two_ranks_fp16(void **state)
{
	run_group(GS_WIRE_F16, 2);
}

static void two_ranks_bf16(void **state)
{
	run_group(GS_WIRE_BF16, 2);
}

static void two_ranks_fp32(void **state)
{
	run_group(GS_WIRE_F32, 2);
}

static void three_ranks_fp16(void **state)
{
	run_group(GS_WIRE_F16, 3);
}

static void three_ranks_bf16(void **state)
{
	run_group(GS_WIRE_BF16, 3);
}

static void three_ranks_fp32(void **state)
{
	run_group(GS_WIRE_F32, 3);
}

/* Each algorithm by name: a power of two, and groups with extra ranks. */
static void doubling_fp16(void **state)
{
	for (int p = 2; p <= 5; p++)
		run_algo(GS_WIRE_F16, p, GS_GLOO_ALGO_DOUBLING);
}

static void doubling_bf16_fp32(void **state)
{
	run_algo(GS_WIRE_BF16, 3, GS_GLOO_ALGO_DOUBLING);
	run_algo(GS_WIRE_F32, 4, GS_GLOO_ALGO_DOUBLING);
	run_algo(GS_WIRE_F32, 5, GS_GLOO_ALGO_DOUBLING);
}

/* Halving then doubling adds in doubling's tree, so the same reference;
 * 1 element over up to 5 ranks leaves most ranks' halves empty. */
static void rabenseifner_all_dtypes(void **state)
{
	for (int p = 2; p <= 5; p++)
		run_algo(GS_WIRE_F16, p, GS_GLOO_ALGO_RABENSEIFNER);
	run_algo(GS_WIRE_BF16, 3, GS_GLOO_ALGO_RABENSEIFNER);
	run_algo(GS_WIRE_F32, 4, GS_GLOO_ALGO_RABENSEIFNER);
	run_algo(GS_WIRE_F32, 5, GS_GLOO_ALGO_RABENSEIFNER);
}

static void ring_four_ranks(void **state)
{
	run_algo(GS_WIRE_F16, 4, GS_GLOO_ALGO_RING);
	run_algo(GS_WIRE_F32, 4, GS_GLOO_ALGO_RING);
}

static void halving_doubling(void **state)
{
	run_algo(GS_WIRE_F16, 3, GS_GLOO_ALGO_HALVING_DOUBLING);
	run_algo(GS_WIRE_F16, 4, GS_GLOO_ALGO_HALVING_DOUBLING);
	run_algo(GS_WIRE_BF16, 4, GS_GLOO_ALGO_HALVING_DOUBLING);
	run_algo(GS_WIRE_F32, 3, GS_GLOO_ALGO_HALVING_DOUBLING);
}

/* ---------------------------------------- which sum ran, and group setup */

/* Gloo's float16 turns every NaN into 0x7fff; the kernels keep a NaN's sign
 * and payload. So a NaN in the input tells which function summed. */
#define NAN_AT 7
#define NAN_IN 0xfe55 /* negative quiet NaN with a payload */

static int nan_rank(int rank, int size, void *arg)
{
	uint16_t *got = arg; /* [rank][2]: ours, Gloo's */
	struct gs_gloo_store_ops store = file_store((char *)(got + 2 * RANKS_MAX));
	struct gs_gloo *g;
	char err[MSG_LEN];
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, err, sizeof(err)) < 0)
		return 1;
	uint16_t buf[1000];
	int rc = 0;
	for (int k = 0; k < 2 && rc == 0; k++) {
		for (size_t i = 0; i < 1000; i++)
			buf[i] = 0x3c00; /* 1.0 */
		if (rank == 0)
			buf[NAN_AT] = NAN_IN;
		if (gs_gloo_allreduce_with(g, GS_WIRE_F16, buf, 1000,
					   k ? GS_GLOO_SUM_GLOO : GS_GLOO_SUM_KERNELS, TIMEOUT_MS,
					   err, sizeof(err)) < 0)
			rc = 2;
		got[2 * rank + k] = buf[NAN_AT];
	}
	gs_gloo_destroy(g);
	return rc;
}

static void vectorised_sum_is_used(void **state)
{
	size_t bytes = 2 * RANKS_MAX * sizeof(uint16_t) + 4096;
	uint16_t *got = shared_alloc(bytes);
	assert_non_null(got);
	char *dir = file_store_dir_create();
	assert_non_null(dir);
	strcpy((char *)(got + 2 * RANKS_MAX), dir);

	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 2, nan_rank, got), 0);
	assert_int_equal(ranks_wait(&rk, 3 * TIMEOUT_MS, status), 0);
	file_store_dir_remove(dir);
	assert_int_equal(status[0], 0);
	assert_int_equal(status[1], 0);
	for (int r = 0; r < 2; r++) {
		print_message("rank %d: NaN %#x + 1.0: kernels %#x, Gloo's float16 %#x\n", r,
			      NAN_IN, got[2 * r], got[2 * r + 1]);
		assert_true((got[2 * r] & 0x7c00) == 0x7c00 && (got[2 * r] & 0x3ff) != 0);
		assert_int_not_equal(got[2 * r], 0x7fff);
		assert_int_equal(got[2 * r + 1], 0x7fff);
	}
	shared_free(got, bytes);
}

/* A rank may leave as soon as it has joined: gs_gloo_create ends with a
 * barrier, so no peer is still connecting to it. */
static int join_and_leave(int rank, int size, void *arg)
{
	struct gs_gloo_store_ops store = file_store(arg);
	struct gs_gloo *g;
	char err[MSG_LEN];
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, err, sizeof(err)) < 0) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return 1;
	}
	gs_gloo_destroy(g);
	return 0;
}

static void leave_right_after_create(void **state)
{
	for (int round = 0; round < 5; round++) {
		char *dir = file_store_dir_create();
		assert_non_null(dir);
		struct ranks rk;
		int status[RANKS_MAX];
		assert_int_equal(ranks_start(&rk, 3, join_and_leave, dir), 0);
		assert_int_equal(ranks_wait(&rk, 3 * TIMEOUT_MS, status), 0);
		file_store_dir_remove(dir);
		for (int r = 0; r < 3; r++)
			assert_int_equal(status[r], 0);
	}
}

/* gs_gloo_broadcast (a trainer's state between nodes): from each rank in
 * turn, of sizes that are no multiple of anything, every rank ends with
 * the root's bytes, which each computes itself; a bad root is refused. */
static uint8_t bcast_byte(int root, size_t i)
{
	return (uint8_t)((i * 2654435761u) >> 13 ^ (unsigned)root * 77u);
}

static int bcast_rank(int rank, int size, void *arg)
{
	struct gs_gloo_store_ops store = file_store(arg);
	struct gs_gloo *g;
	char err[MSG_LEN];
	static const size_t lens[] = { 1, 4097, 3000001 };
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, err, sizeof(err)) < 0) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return 1;
	}
	uint8_t *buf = malloc(lens[2]);
	int bad = !buf;
	for (int root = 0; root < size && !bad; root++)
		for (size_t k = 0; k < 3 && !bad; k++) {
			for (size_t i = 0; i < lens[k]; i++)
				buf[i] = rank == root ? bcast_byte(root, i) : (uint8_t)~bcast_byte(root, i);
			if (gs_gloo_broadcast(g, buf, lens[k], root, 0, err, sizeof(err)) != GS_OK) {
				fprintf(stderr, "rank %d: %s\n", rank, err);
				bad = 1;
			}
			for (size_t i = 0; i < lens[k] && !bad; i++)
				if (buf[i] != bcast_byte(root, i)) {
					fprintf(stderr, "rank %d: byte %zu of %zu from root %d is wrong\n",
						rank, i, lens[k], root);
					bad = 1;
				}
		}
	if (!bad && gs_gloo_broadcast(g, buf, 8, size, 0, err, sizeof(err)) != GS_EINVAL) {
		fprintf(stderr, "rank %d: root %d was not refused\n", rank, size);
		bad = 1;
	}
	free(buf);
	gs_gloo_destroy(g);
	return bad;
}

static void broadcast_from_every_rank(void **state)
{
	char *dir = file_store_dir_create();
	assert_non_null(dir);
	struct ranks rk;
	int status[RANKS_MAX];
	assert_int_equal(ranks_start(&rk, 3, bcast_rank, dir), 0);
	assert_int_equal(ranks_wait(&rk, 6 * TIMEOUT_MS, status), 0);
	file_store_dir_remove(dir);
	for (int r = 0; r < 3; r++)
		assert_int_equal(status[r], 0);
}

/* A group of one needs no peer: the sum is the input. Also the arguments
 * all-reduce refuses, which need a live group to reach. Runs in this
 * process, so it comes after every test that forks. */
static void world_of_one(void **state)
{
	char *dir = file_store_dir_create();
	assert_non_null(dir);
	struct gs_gloo_store_ops store = file_store(dir);
	struct gs_gloo *g;
	char err[MSG_LEN];
	assert_int_equal(gs_gloo_create(&store, 0, 1, NULL, 5000, &g, err, sizeof(err)), GS_OK);
	assert_int_equal(gs_gloo_rank(g), 0);
	assert_int_equal(gs_gloo_size(g), 1);

	const struct wire_fmt *f = wire_fmt(GS_WIRE_F16);
	uint16_t buf[1000], in[1000];
	for (size_t i = 0; i < 1000; i++)
		wire_store(f, in, i, wire_input(f, 0, i, 1000));
	memcpy(buf, in, sizeof(buf));
	assert_int_equal(gs_gloo_allreduce(g, GS_WIRE_F16, buf, 1000, 0, err, sizeof(err)), GS_OK);
	assert_memory_equal(buf, in, sizeof(buf));

	assert_int_equal(gs_gloo_allreduce(g, GS_WIRE_F16, NULL, 0, 0, err, sizeof(err)), GS_OK);
	assert_int_equal(gs_gloo_allreduce(g, GS_WIRE_F16, NULL, 4, 0, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(gs_gloo_allreduce(g, (enum gs_wire)9, buf, 4, 0, err, sizeof(err)),
			 GS_EINVAL);
	assert_int_equal(
	    gs_gloo_allreduce_with(g, GS_WIRE_BF16, buf, 4, GS_GLOO_SUM_GLOO, 0, err, sizeof(err)),
	    GS_EINVAL);
	assert_non_null(strstr(err, "no sum"));
	assert_int_equal(gs_gloo_allreduce_with(g, GS_WIRE_F16, buf, 4, (enum gs_gloo_sum)5, 0, err,
						sizeof(err)),
			 GS_EINVAL);
	gs_gloo_destroy(g);
	file_store_dir_remove(dir);
}

/* GRADSYNCD_GLOO_ALGO fixes what the daemon's all-reduce runs (benchmarks'
 * baselines), and a value it does not know is refused, naming it. */
static void algorithm_from_environment(void **state)
{
	char *dir = file_store_dir_create();
	assert_non_null(dir);
	struct gs_gloo_store_ops store = file_store(dir);
	struct gs_gloo *g;
	char err[MSG_LEN];
	setenv("GRADSYNCD_GLOO_ALGO", "ring", 1);
	assert_int_equal(gs_gloo_create(&store, 0, 1, NULL, 5000, &g, err, sizeof(err)), GS_OK);
	assert_int_equal(gs_gloo_choice(g, GS_WIRE_F32, 1), GS_GLOO_ALGO_RING);
	gs_gloo_destroy(g);
	setenv("GRADSYNCD_GLOO_ALGO", "bcube", 1);
	assert_int_equal(gs_gloo_create(&store, 0, 1, NULL, 5000, &g, err, sizeof(err)),
			 GS_EINVAL);
	assert_non_null(strstr(err, "GRADSYNCD_GLOO_ALGO is 'bcube'"));
	unsetenv("GRADSYNCD_GLOO_ALGO");
	assert_int_equal(gs_gloo_create(&store, 0, 1, NULL, 5000, &g, err, sizeof(err)), GS_OK);
	assert_int_equal(gs_gloo_choice(g, GS_WIRE_F32, 1), gs_gloo_pick(4, 1));
	gs_gloo_destroy(g);
	file_store_dir_remove(dir);
}

/* The reference itself: the chains of a hand-made case in fp16. 1 + 2^-11
 * is a tie that rounds to even (1); 2^-11 + 2^-11 first makes 2^-10, which
 * then survives: the order of hops shows in the bits. */
static void reference_orders(void **state)
{
	const struct wire_fmt *f = wire_fmt(GS_WIRE_F16);
	double x[3] = {1.0, ldexp(1, -11), ldexp(1, -11)};
	assert_true(wire_round(f, 1.0 + ldexp(1, -11)) == 1.0);
	assert_true(some_order_gives(f, x, 3, 1.0));
	assert_true(some_order_gives(f, x, 3, 1.0 + ldexp(1, -10)));
	assert_false(some_order_gives(f, x, 3, 1.0 + ldexp(1, -9)));
	assert_true(wire_decode(f, 0x3c00) == 1.0);
	assert_true(wire_decode(f, 0x0001) == ldexp(1, -24));
	assert_true(wire_decode(wire_fmt(GS_WIRE_BF16), 0xc040) == -3.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(reference_orders),		cmocka_unit_test(two_ranks_fp16),
	    cmocka_unit_test(two_ranks_bf16),		cmocka_unit_test(two_ranks_fp32),
	    cmocka_unit_test(three_ranks_fp16),		cmocka_unit_test(three_ranks_bf16),
	    cmocka_unit_test(three_ranks_fp32),		cmocka_unit_test(doubling_fp16),
	    cmocka_unit_test(doubling_bf16_fp32),	cmocka_unit_test(rabenseifner_all_dtypes),
	    cmocka_unit_test(ring_four_ranks),
	    cmocka_unit_test(halving_doubling),		cmocka_unit_test(vectorised_sum_is_used),
	    cmocka_unit_test(leave_right_after_create), cmocka_unit_test(broadcast_from_every_rank),
	    cmocka_unit_test(world_of_one),
	    cmocka_unit_test(algorithm_from_environment),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
