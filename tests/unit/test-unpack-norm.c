/*
 * gs_unpack_norm: the unpack's values and non-finite count are gs_unpack's
 * (test-convert checks those against the CPU's own conversions), and the
 * sums of squares are the ones convert.h defines, recomputed here from the
 * unpacked values in plain C: blocks of GS_NORM_BLOCK, pieces summed in 16
 * lanes and then pairwise. Every ISA this CPU has must give those bits, at
 * every offset of a cache line (the vector paths' streaming heads), with
 * one to three destinations, for every wire dtype; and the sums must agree
 * with a plain fp64 sum to fp64 rounding. Non-finite results make the sum
 * inf or NaN as the fp64 norm of the values would be.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"

static const enum gs_wire wires[] = { GS_WIRE_F16, GS_WIRE_BF16, GS_WIRE_F32 };
#define NWIRES (sizeof(wires) / sizeof(wires[0]))

/* Blocks a case may touch, with room either side that must stay zero. */
#define NBLOCKS 16
#define GUARD 16

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* xorshift64*: fixed seeds, so a failure reproduces. */
static uint64_t rnd(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

static bool use_isa(int isa)
{
	if (gs_isa_force((enum gs_isa)isa))
		return true;
	print_message("  (ISA %s not supported here: skipped)\n", gs_isa_name((enum gs_isa)isa));
	return false;
}

#define FOR_EACH_ISA(isa) \
	for (int isa = GS_ISA_SCALAR; isa <= GS_ISA_AVX512; isa++) \
		if (use_isa(isa))

static void *xmalloc(size_t size)
{
	void *p = aligned_alloc(64, (size + 63) & ~(size_t)63);

	assert_non_null(p);
	return p;
}

/* n gradient-like values, in [-2, 2) times 2^(-8..7), rounded to the
 * wire dtype. */
static void fill(enum gs_wire w, void *wire, size_t n)
{
	float *x = xmalloc(n * sizeof(float) + 1);

	for (size_t i = 0; i < n; i++) {
		uint64_t r = rnd();

		x[i] = ldexpf((float)((int32_t)(r >> 40) - (1 << 23)) * 0x1p-22f,
			      (int)(r % 16) - 8);
	}
	if (w == GS_WIRE_F16)
		gs_f32_to_f16(wire, x, n);
	else if (w == GS_WIRE_BF16)
		gs_f32_to_bf16(wire, x, n);
	else
		memcpy(wire, x, n * sizeof(float));
	free(x);
}

/* convert.h's order, written out: element k of the piece in lane k % 16,
 * each lane in order of k, then the lanes pairwise. */
static double ref_piece(const float *y, size_t n)
{
	double lane[16] = { 0 };

	for (size_t k = 0; k < n; k++)
		lane[k % 16] += (double)y[k] * (double)y[k];
	for (size_t half = 8; half > 0; half /= 2)
		for (size_t j = 0; j < half; j++)
			lane[j] += lane[j + half];
	return lane[0];
}

/* The blocks of one call: its values y (elements first, ...). */
static void ref_blocks(const float *y, size_t n, uint64_t first, double *blocks)
{
	for (size_t i = 0; i < n;) {
		uint64_t at = first + i;
		size_t len = GS_NORM_BLOCK - at % GS_NORM_BLOCK;

		if (len > n - i)
			len = n - i;
		blocks[at / GS_NORM_BLOCK] += ref_piece(y + i, len);
		i += len;
	}
}

static uint64_t bits(double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof(u));
	return u;
}

struct norm_case {
	enum gs_wire w;
	size_t n;
	uint64_t first;
	size_t ndst;
	size_t off;   /* floats past a cache line where destination 0 starts */
	bool mixed;   /* destination 1 at another offset: no streaming */
};

/* One call on the active ISA against gs_unpack's values and ref_blocks. */
static void check_case(const struct norm_case *c, const void *src, float **buf, int isa)
{
	float *want = xmalloc(c->n * sizeof(float) + 1), *dsts[3];
	double got[NBLOCKS + 2 * GUARD] = { 0 }, ref[NBLOCKS + 2 * GUARD] = { 0 };
	uint64_t nonfinite = gs_unpack(c->w, &want, 1, src, c->n, 0.25f);

	for (size_t d = 0; d < c->ndst; d++)
		dsts[d] = buf[d] + c->off + (c->mixed && d == 1 ? 3 : 0);
	assert_true((c->first + c->n) / GS_NORM_BLOCK < NBLOCKS);
	assert_int_equal(gs_unpack_norm(c->w, dsts, c->ndst, src, c->n, 0.25f, c->first,
					got + GUARD), nonfinite);
	ref_blocks(want, c->n, c->first, ref + GUARD);
	for (size_t d = 0; d < c->ndst; d++)
		assert_memory_equal(dsts[d], want, c->n * sizeof(float));
	double plain = 0, sum = 0;
	for (size_t i = 0; i < c->n; i++)
		plain += (double)want[i] * want[i];
	for (size_t b = 0; b < NBLOCKS + 2 * GUARD; b++) {
		if (bits(got[b]) != bits(ref[b]))
			fail_msg("%s, isa %s, n %zu, first %llu, %zu destinations at +%zu%s: block %zd is %a, want %a",
				 gs_wire_name(c->w), gs_isa_name((enum gs_isa)isa), c->n,
				 (unsigned long long)c->first, c->ndst, c->off,
				 c->mixed ? " (mixed)" : "", (ptrdiff_t)b - GUARD, got[b], ref[b]);
		sum += got[b];
	}
	/* Both orders err by at most n units of fp64 rounding. */
	assert_true(fabs(sum - plain) <= (double)c->n * 0x1p-52 * plain);
	free(want);
}

/* Lengths around the vector widths, the block and the streaming
 * threshold, at starts inside and at the edge of a block. */
static void test_unpack_norm_order(void **state)
{
	static const size_t sizes[] = { 1, 15, 16, 17, 33, 1000, 16384, 16385, 65536, 100003 };
	static const uint64_t firsts[] = { 0, 5, 16383, 3 * 16384 + 7 };
	size_t most = 100003;
	void *src = xmalloc(most * 4);
	float *buf[3];
	(void)state;

	for (size_t d = 0; d < 3; d++)
		buf[d] = xmalloc((most + 64) * sizeof(float));
	for (size_t j = 0; j < NWIRES; j++) {
		fill(wires[j], src, most);
		for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
			for (size_t f = 0; f < sizeof(firsts) / sizeof(*firsts); f++) {
				for (size_t off = 0; off < 16; off += sizes[z] >= 65536 ? 1 : 5) {
					for (size_t ndst = 1; ndst <= 3; ndst++) {
						struct norm_case c = { wires[j], sizes[z], firsts[f], ndst,
								       off, ndst > 1 && off == 5 };
						FOR_EACH_ISA(isa)
							check_case(&c, src, buf, isa);
					}
				}
			}
		}
	}
	for (size_t d = 0; d < 3; d++)
		free(buf[d]);
	free(src);
}

/* A call cut at block boundaries adds the same pieces to the same blocks
 * as one call; this is what lets threads share an unpack. */
static void test_unpack_norm_split(void **state)
{
	size_t n = 5 * GS_NORM_BLOCK + 100;
	uint16_t *src = xmalloc(n * 2);
	float *dst = xmalloc(n * sizeof(float));
	double whole[NBLOCKS] = { 0 }, parts[NBLOCKS] = { 0 };
	(void)state;

	fill(GS_WIRE_F16, src, n);
	gs_unpack_norm(GS_WIRE_F16, &dst, 1, src, n, 0.5f, 0, whole);
	for (size_t at = 0; at < n; at += 2 * GS_NORM_BLOCK) {
		size_t len = n - at < 2 * GS_NORM_BLOCK ? n - at : 2 * GS_NORM_BLOCK;
		float *d = dst + at;

		gs_unpack_norm(GS_WIRE_F16, &d, 1, src + at, len, 0.5f, at, parts);
	}
	assert_memory_equal(whole, parts, sizeof(whole));
	free(src);
	free(dst);
}

/* Non-finite results: inf makes the sum inf, NaN (with or without inf)
 * NaN; squares are fp64, so fp32 values whose squares overflow or
 * underflow fp32 still count (1e30, 1e-40). */
static void test_unpack_norm_specials(void **state)
{
	size_t n = 40000;
	float *src = xmalloc(n * sizeof(float)), *dst = xmalloc(n * sizeof(float));
	(void)state;

	FOR_EACH_ISA(isa) {
		for (int c = 0; c < 4; c++) {
			double blocks[4] = { 0 };

			for (size_t i = 0; i < n; i++)
				src[i] = 0.0f;
			if (c == 0) {
				src[20000] = 1e30f;
				src[35000] = 1e-40f;
			}
			if (c == 1 || c == 3)
				src[16384 + 9] = INFINITY;
			if (c == 2 || c == 3)
				src[16384 + 11] = NAN;
			uint64_t nf = gs_unpack_norm(GS_WIRE_F32, &dst, 1, src, n, 1.0f, 0, blocks);
			assert_int_equal(nf, c == 0 ? 0 : c == 3 ? 2 : 1);
			if (c == 0) {
				assert_true(blocks[1] == (double)1e30f * (double)1e30f);
				assert_true(blocks[2] == (double)1e-40f * (double)1e-40f);
				assert_true(blocks[1] > 1e59 && isfinite(blocks[1]) && blocks[2] > 0);
			} else {
				if (c == 1)
					assert_true(isinf(blocks[1]) && blocks[1] > 0);
				else
					assert_true(isnan(blocks[1]));
				assert_true(blocks[2] == 0);
			}
			assert_true(blocks[0] == 0);
		}
	}
	free(src);
	free(dst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unpack_norm_order),
		cmocka_unit_test(test_unpack_norm_split),
		cmocka_unit_test(test_unpack_norm_specials),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
