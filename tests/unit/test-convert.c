/*
 * Conversion kernels against independent references: the CPU's own F16C
 * instructions for fp16, round-to-nearest decided in double arithmetic for
 * bf16, comparisons in double for clipping. Every check runs on each ISA
 * this CPU has (scalar, F16C, AVX-512), at odd lengths and unaligned
 * addresses so that the vector paths' tails run too, and a last test
 * checks that all ISAs give the same bits on the same random inputs.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cpuid.h>
#include <immintrin.h>

#include "convert.h"

#define F16C_REF __attribute__((target("f16c")))

/* Elements compared against a reference, reported at the end. */
static uint64_t nchecked;
/* What GRADSYNC_ISA=scalar (set in main before first use) selected. */
static enum gs_isa isa_from_env;

/* ------------------------------------------------------------- helpers */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t s)
{
	rng = s * 0x9e3779b97f4a7c15ull + 1;
}

/* xorshift64*: fixed seeds, so a failure reproduces. */
static uint64_t rnd(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static void *xmalloc(size_t size)
{
	void *p = malloc(size ? size : 1);

	assert_non_null(p);
	return p;
}

/* The fp16 references are the CPU's own instructions. */
static bool have_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* The ISAs to run: every one this CPU has. Prints the ones it lacks once,
 * so a run on a smaller CPU says what it did not cover. */
static bool use_isa(int isa)
{
	static bool told[3];

	if (gs_isa_force((enum gs_isa)isa))
		return true;
	if (!told[isa]) {
		print_message("  (ISA %s not supported here: skipped)\n",
			      gs_isa_name((enum gs_isa)isa));
		told[isa] = true;
	}
	return false;
}

#define FOR_EACH_ISA(isa) \
	for (int isa = GS_ISA_SCALAR; isa <= GS_ISA_AVX512; isa++) \
		if (use_isa(isa))

static bool wire_is_nan(enum gs_wire w, uint32_t v)
{
	switch (w) {
	case GS_WIRE_F16:
		return (v & 0x7fff) > 0x7c00;
	case GS_WIRE_BF16:
		return (v & 0x7fff) > 0x7f80;
	default:
		return (v & 0x7fffffff) > 0x7f800000;
	}
}

static uint32_t wire_get(enum gs_wire w, const void *buf, size_t i)
{
	if (w == GS_WIRE_F32)
		return ((const uint32_t *)buf)[i];
	return ((const uint16_t *)buf)[i];
}

/*
 * Compares n wire elements bit for bit; with loose_nan, any NaN matches
 * any NaN (where two NaNs meet in a sum, which payload survives depends on
 * operand order the compiler may swap). in, when given, is printed with
 * the first mismatch.
 */
static void check_wire(enum gs_wire w, const void *got, const void *want,
		       size_t n, bool loose_nan, const float *in,
		       const char *what, int isa)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t g = wire_get(w, got, i), e = wire_get(w, want, i);
		char input[64] = "";

		if (g == e || (loose_nan && wire_is_nan(w, g) &&
			       wire_is_nan(w, e)))
			continue;
		if (in)
			snprintf(input, sizeof(input), " (input 0x%08x = %a)",
				 f2u(in[i]), (double)in[i]);
		fail_msg("%s, %s, isa %s: element %zu of %zu: got 0x%x, want "
			 "0x%x%s", what, gs_wire_name(w),
			 gs_isa_name((enum gs_isa)isa), i, n, g, e, input);
	}
	nchecked += n;
}

/* ---------------------------------------------------------- references */

F16C_REF static uint16_t ref_f16(float x)
{
	__m128i h = _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT);

	return (uint16_t)_mm_extract_epi16(h, 0);
}

F16C_REF static float ref_f16_to_f32(uint16_t h)
{
	return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

F16C_REF static void ref_f16_n(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = ref_f16(src[i]);
}

/*
 * fp32 -> bf16 without the kernels' integer trick: the two candidates
 * (truncated, and one bf16 ulp further from zero) and the nearer of them
 * decided by subtracting in double, which is exact here; ties go to the
 * even candidate. Above the largest finite bf16 the upper candidate is
 * 2^128, i.e. infinity, as IEEE rounding defines overflow. NaN: quieted,
 * sign and top payload bits kept (the documented contract).
 */
static uint16_t ref_bf16(float x)
{
	uint32_t u = f2u(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint16_t lo = (uint16_t)((u & 0x7fffffff) >> 16);
	double dx, dlo, dhi, below, above;

	if (isnan(x))
		return (uint16_t)((u >> 16) | 0x40);
	if (isinf(x))
		return sign | 0x7f80;
	dx = fabs((double)x);
	dlo = fabs((double)u2f((uint32_t)lo << 16));
	dhi = lo == 0x7f7f ? ldexp(1.0, 128) :
			     fabs((double)u2f((uint32_t)(lo + 1) << 16));
	below = dx - dlo;
	above = dhi - dx;
	if (below < above || (below == above && !(lo & 1)))
		return sign | lo;
	return sign | (uint16_t)(lo + 1);
}

/* bf16 -> fp32 from its fields, not by shifting. */
static float ref_bf16_to_f32(uint16_t b)
{
	int e = (b >> 7) & 0xff, m = b & 0x7f;
	double v;

	if (e == 0xff && m)
		return u2f((uint32_t)(b | 0x40) << 16);
	if (e == 0xff)
		v = INFINITY;
	else if (e == 0)
		v = ldexp(m, -126 - 7);
	else
		v = ldexp(128 + m, e - 127 - 7);
	return (float)((b & 0x8000) ? -v : v);
}

static void ref_bf16_n(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = ref_bf16(src[i]);
}

F16C_REF static float ref_widen(enum gs_wire w, const void *src, size_t i)
{
	switch (w) {
	case GS_WIRE_F16:
		return ref_f16_to_f32(((const uint16_t *)src)[i]);
	case GS_WIRE_BF16:
		return ref_bf16_to_f32(((const uint16_t *)src)[i]);
	default:
		return ((const float *)src)[i];
	}
}

F16C_REF static void ref_round(enum gs_wire w, void *dst, size_t i, float x)
{
	switch (w) {
	case GS_WIRE_F16:
		((uint16_t *)dst)[i] = ref_f16(x);
		break;
	case GS_WIRE_BF16:
		((uint16_t *)dst)[i] = ref_bf16(x);
		break;
	default:
		((float *)dst)[i] = x;
		break;
	}
}

/* Clipping decided in double; then the fp32 multiply and the rounding. */
static uint64_t ref_pack(enum gs_wire w, void *dst, const float *src,
			 size_t n, const struct gs_pack_params *p)
{
	uint64_t clipped = 0;

	for (size_t i = 0; i < n; i++) {
		double dx = src[i], dc = p->clip_value;
		float y = src[i];

		if (p->clip && dx > dc) {
			y = p->clip_value;
			clipped++;
		} else if (p->clip && dx < -dc) {
			y = -p->clip_value;
			clipped++;
		}
		ref_round(w, dst, i, y * p->prescale);
	}
	return clipped;
}

/* ------------------------------------------------------------ the tests */

static void test_names(void **state)
{
	assert_int_equal(gs_wire_size(GS_WIRE_F16), 2);
	assert_int_equal(gs_wire_size(GS_WIRE_BF16), 2);
	assert_int_equal(gs_wire_size(GS_WIRE_F32), 4);
	assert_int_equal(gs_wire_size((enum gs_wire)0), 0);
	assert_string_equal(gs_wire_name(GS_WIRE_F16), "fp16");
	assert_string_equal(gs_wire_name(GS_WIRE_BF16), "bf16");
	assert_string_equal(gs_wire_name(GS_WIRE_F32), "fp32");
	assert_string_equal(gs_isa_name(GS_ISA_SCALAR), "scalar");
	assert_string_equal(gs_isa_name(GS_ISA_F16C), "f16c");
	assert_string_equal(gs_isa_name(GS_ISA_AVX512), "avx512");
	/* Forcing something that does not exist changes nothing. */
	assert_true(gs_isa_force(GS_ISA_SCALAR));
	assert_false(gs_isa_force((enum gs_isa)7));
	assert_int_equal(gs_isa_active(), GS_ISA_SCALAR);
	assert_true(gs_isa_force(gs_isa_detect()));
	assert_int_equal(gs_isa_active(), gs_isa_detect());
	assert_int_equal(isa_from_env, GS_ISA_SCALAR);
}

/* The corners convert.h promises: no params means a plain cast, the empty
 * sum is zero, nothing happens for n == 0 or an unknown wire dtype. */
static void test_edges(void **state)
{
	float in[5] = { 1.0f, -2.5f, 1e30f, NAN, 0.0f }, out[5];
	uint16_t h[5] = { 0x1234, 0x1234, 0x1234, 0x1234, 0x1234 };
	const void *srcs[1] = { in };
	float *dsts[1] = { out };

	FOR_EACH_ISA(isa) {
		assert_int_equal(gs_pack(GS_WIRE_F32, out, in, 5, NULL), 0);
		assert_memory_equal(out, in, sizeof(in));
		gs_reduce_sum(GS_WIRE_F16, h, srcs, 0, 3);
		assert_int_equal(h[0] | h[1] | h[2], 0);
		assert_int_equal(h[3], 0x1234);
		assert_int_equal(gs_pack(GS_WIRE_F16, h, in, 0, NULL), 0);
		assert_int_equal(gs_unpack(GS_WIRE_F16, dsts, 1, h, 0, 1.0f),
				 0);
		assert_int_equal(gs_pack((enum gs_wire)9, h, in, 5, NULL), 0);
		assert_int_equal(gs_unpack((enum gs_wire)9, dsts, 1, h, 5,
					   1.0f), 0);
		assert_int_equal(h[3], 0x1234);
		assert_memory_equal(out, in, sizeof(in));
	}
}

/* Every fp16 bit pattern, widened, against VCVTPH2PS. */
static void test_f16_to_f32_all(void **state)
{
	size_t n = 65536;
	uint16_t *h;
	float *want, *got;

	if (!have_f16c())
		skip();
	h = xmalloc(n * sizeof(*h));
	want = xmalloc(n * sizeof(*want));
	got = xmalloc(n * sizeof(*got));
	for (size_t i = 0; i < n; i++) {
		h[i] = (uint16_t)i;
		want[i] = ref_f16_to_f32(h[i]);
	}
	FOR_EACH_ISA(isa) {
		gs_f16_to_f32(got, h, n);
		check_wire(GS_WIRE_F32, got, want, n, false, NULL,
			   "f16_to_f32", isa);
		/* Odd length from an odd address: tails and misalignment. */
		gs_f16_to_f32(got + 1, h + 1, n - 1);
		check_wire(GS_WIRE_F32, got + 1, want + 1, n - 1, false, NULL,
			   "f16_to_f32 +1", isa);
	}
	free(h);
	free(want);
	free(got);
}

/* Appends x and its two fp32 neighbours. */
static size_t push3(float *v, size_t k, float x)
{
	v[k++] = x;
	v[k++] = nextafterf(x, INFINITY);
	v[k++] = nextafterf(x, -INFINITY);
	return k;
}

static const uint32_t special_bits[] = {
	0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infs */
	0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, /* NaNs */
	0x7fffffff, 0xffffffff, 0x7fa00000, 0x7f802000,
	0x7f801fff, 0x7fbfffff, 0x7fc01000, 0xffe00001,
	0x00000001, 0x80000001, 0x007fffff, 0x807fffff, /* subnormals */
	0x00400000, 0x00000100, 0x00800000, 0x7f7fffff, /* min/max */
	0x7f7f8000, 0x7f7f7fff, 0x7f7f8001, 0xff7f8000, /* bf16 overflow */
	0x33000000, 0x33000001, 0x32ffffff, 0x33800000, /* fp16 2^-25.. */
	0x387fe000, 0x387ff000, 0x38800000, 0x387fffff, /* fp16 min normal */
};

/* fp32 -> fp16 inputs: every fp16 value, every tie between neighbours,
 * each with its fp32 neighbours, the specials, fp32 subnormals and a
 * large random sample. Returns the count. */
F16C_REF static size_t f16_inputs(float *v, size_t nrandom)
{
	size_t k = 0;

	for (uint32_t h = 0; h < 0x7c00; h++) {
		float a = ref_f16_to_f32((uint16_t)h);
		/* h + 1 == 0x7c00 is infinity: the tie is 65520. */
		double b = h + 1 < 0x7c00 ?
			   (double)ref_f16_to_f32((uint16_t)(h + 1)) : 65536.0;
		float tie = (float)(((double)a + b) / 2);

		k = push3(v, k, a);
		k = push3(v, k, -a);
		k = push3(v, k, tie);
		k = push3(v, k, -tie);
	}
	for (size_t i = 0; i < sizeof(special_bits) / 4; i++)
		k = push3(v, k, u2f(special_bits[i]));
	k = push3(v, k, 65504.0f);
	k = push3(v, k, 65520.0f);
	k = push3(v, k, -65520.0f);
	k = push3(v, k, 65536.0f);
	for (int i = 0; i < 4096; i++)
		v[k++] = u2f((uint32_t)(rnd() & 0x807fffff));
	for (size_t i = 0; i < nrandom; i++)
		v[k++] = u2f((uint32_t)rnd());
	return k;
}

#define NRANDOM (16u << 20)
#define NFIXED (0x7c00 * 12 + 4096 + 256)

static void test_f32_to_f16(void **state)
{
	uint16_t *want, *got;
	float *in;
	size_t n;

	if (!have_f16c())
		skip();
	in = xmalloc((NFIXED + NRANDOM) * sizeof(*in));
	rng_seed(1);
	n = f16_inputs(in, NRANDOM);
	/* Odd, so that every vector path has a tail. */
	n -= !(n & 1);
	want = xmalloc(n * sizeof(*want));
	got = xmalloc(n * sizeof(*got));
	ref_f16_n(want, in, n);
	/* The reference itself: 65520 overflows, 65519.996 does not. */
	assert_int_equal(ref_f16(65520.0f), 0x7c00);
	assert_int_equal(ref_f16(nextafterf(65520.0f, 0)), 0x7bff);
	FOR_EACH_ISA(isa) {
		memset(got, 0, n * sizeof(*got));
		gs_f32_to_f16(got, in, n);
		check_wire(GS_WIRE_F16, got, want, n, false, in,
			   "f32_to_f16", isa);
		gs_f32_to_f16(got + 1, in + 1, n - 1);
		check_wire(GS_WIRE_F16, got + 1, want + 1, n - 1, false,
			   in + 1, "f32_to_f16 +1", isa);
	}
	free(in);
	free(want);
	free(got);
}

/* fp32 -> bf16 inputs: every bf16 value, the tie above each, each with
 * its fp32 neighbours, the specials, subnormals and a random sample. */
static size_t bf16_inputs(float *v, size_t nrandom)
{
	size_t k = 0;

	for (uint32_t b = 0; b < 0x10000; b++) {
		if ((b & 0x7fff) > 0x7f80)
			continue;
		k = push3(v, k, u2f(b << 16));
		if ((b & 0x7fff) < 0x7f80)
			k = push3(v, k, u2f((b << 16) | 0x8000));
	}
	for (size_t i = 0; i < sizeof(special_bits) / 4; i++)
		k = push3(v, k, u2f(special_bits[i]));
	for (int i = 0; i < 4096; i++)
		v[k++] = u2f((uint32_t)(rnd() & 0x807fffff));
	for (size_t i = 0; i < nrandom; i++)
		v[k++] = u2f((uint32_t)rnd());
	return k;
}

static void test_f32_to_bf16(void **state)
{
	float *in = xmalloc((0x10000 * 6 + 4096 + 256 + NRANDOM) *
			    sizeof(*in));
	uint16_t *want, *got;
	size_t n;

	rng_seed(2);
	n = bf16_inputs(in, NRANDOM);
	n -= !(n & 1);
	want = xmalloc(n * sizeof(*want));
	got = xmalloc(n * sizeof(*got));
	ref_bf16_n(want, in, n);
	/* The reference itself, on known answers. */
	assert_int_equal(ref_bf16(u2f(0x7f7f7fff)), 0x7f7f);
	assert_int_equal(ref_bf16(u2f(0x7f7f8000)), 0x7f80);
	assert_int_equal(ref_bf16(u2f(0x3f808000)), 0x3f80);
	assert_int_equal(ref_bf16(u2f(0x3f818000)), 0x3f82);
	assert_int_equal(ref_bf16(u2f(0x00008001)), 0x0001);
	assert_int_equal(ref_bf16(u2f(0x80008000)), 0x8000);
	FOR_EACH_ISA(isa) {
		memset(got, 0, n * sizeof(*got));
		gs_f32_to_bf16(got, in, n);
		check_wire(GS_WIRE_BF16, got, want, n, false, in,
			   "f32_to_bf16", isa);
		gs_f32_to_bf16(got + 1, in + 1, n - 1);
		check_wire(GS_WIRE_BF16, got + 1, want + 1, n - 1, false,
			   in + 1, "f32_to_bf16 +1", isa);
	}
	free(in);
	free(want);
	free(got);
}

static void test_bf16_to_f32_all(void **state)
{
	size_t n = 65536;
	uint16_t *b = xmalloc(n * sizeof(*b));
	float *want = xmalloc(n * sizeof(*want));
	float *got = xmalloc(n * sizeof(*got));

	for (size_t i = 0; i < n; i++) {
		b[i] = (uint16_t)i;
		want[i] = ref_bf16_to_f32(b[i]);
	}
	FOR_EACH_ISA(isa) {
		gs_bf16_to_f32(got, b, n);
		check_wire(GS_WIRE_F32, got, want, n, false, NULL,
			   "bf16_to_f32", isa);
		gs_bf16_to_f32(got + 1, b + 1, n - 1);
		check_wire(GS_WIRE_F32, got + 1, want + 1, n - 1, false, NULL,
			   "bf16_to_f32 +1", isa);
	}
	free(b);
	free(want);
	free(got);
}

static const enum gs_wire wires[] = { GS_WIRE_F16, GS_WIRE_BF16,
				      GS_WIRE_F32 };
#define NWIRES (sizeof(wires) / sizeof(wires[0]))

/* Gradient-like values with the specials mixed in. */
static float rnd_gradient(void)
{
	uint64_t r = rnd();

	switch (r % 16) {
	case 0:
		return u2f((uint32_t)(r >> 32));
	case 1:
		return u2f(special_bits[(r >> 8) % (sizeof(special_bits) / 4)]);
	case 2:
		return (r >> 8) & 1 ? 100.0f : -100.0f;
	default:
		return ldexpf((float)((int32_t)(r >> 32)) / 0x1p31f,
			      (int)((r >> 8) % 40) - 30);
	}
}

static const struct gs_pack_params pack_cases[] = {
	{ .prescale = 1.0f },
	{ .prescale = 0.125f },
	{ .prescale = 1.0f / 3.0f, .clip = true, .clip_value = 100.0f },
	{ .prescale = 1.0f, .clip = true, .clip_value = 1.5f },
	{ .prescale = 1e-3f, .clip = true, .clip_value = 0.1f },
	{ .prescale = 1.0f, .clip = true, .clip_value = 0.0f },
	{ .prescale = 1.0f, .clip = true, .clip_value = -0.0f },
	{ .prescale = 2.0f, .clip = true, .clip_value = INFINITY },
	/* Meaningless settings, but every ISA must still agree. */
	{ .prescale = 1.0f, .clip = true, .clip_value = NAN },
	{ .prescale = 1.0f, .clip = true, .clip_value = -1.0f },
};

static void test_pack(void **state)
{
	size_t n = 100003, wsz;
	float *in;
	void *want, *got;

	if (!have_f16c())
		skip();
	in = xmalloc((n + 1) * sizeof(*in));
	want = xmalloc(n * 4);
	got = xmalloc((n + 1) * 4);
	rng_seed(3);
	for (size_t i = 0; i < n + 1; i++)
		in[i] = rnd_gradient();
	for (size_t c = 0; c < sizeof(pack_cases) / sizeof(*pack_cases); c++) {
		const struct gs_pack_params *p = &pack_cases[c];

		for (size_t k = 0; k < NWIRES; k++) {
			enum gs_wire w = wires[k];
			uint64_t nclip = ref_pack(w, want, in + 1, n, p);

			wsz = gs_wire_size(w);
			FOR_EACH_ISA(isa) {
				/* Unaligned source and destination. */
				char *dst = (char *)got + wsz;

				memset(got, 0, (n + 1) * 4);
				assert_int_equal(gs_pack(w, dst, in + 1, n, p),
						 nclip);
				check_wire(w, dst, want, n, false, in + 1,
					   "pack", isa);
			}
		}
	}
	free(in);
	free(want);
	free(got);
}

/* Hand-computed answers: NaN stays NaN and is not counted, infinities are
 * clipped like any large value. */
static void test_pack_clip_specials(void **state)
{
	static const float x[] = { NAN, -NAN, INFINITY, -INFINITY, 150.0f,
				   -150.0f, 100.0f, -100.0f, 50.0f };
	static const float y[] = { NAN, -NAN, 50.0f, -50.0f, 50.0f, -50.0f,
				   50.0f, -50.0f, 25.0f };
	struct gs_pack_params p = {
		.prescale = 0.5f, .clip = true, .clip_value = 100.0f,
	};
	enum { REP = 13, N = 9 * REP };
	float in[N], out[N];
	uint16_t h[N];

	for (int i = 0; i < N; i++)
		in[i] = x[i % 9];
	FOR_EACH_ISA(isa) {
		assert_int_equal(gs_pack(GS_WIRE_F32, out, in, N, &p), 4 * REP);
		for (int i = 0; i < N; i++) {
			if (isnan(y[i % 9])) {
				assert_true(isnan(out[i]));
				assert_int_equal(!!signbit(out[i]),
						 !!signbit(y[i % 9]));
			} else {
				assert_true(out[i] == y[i % 9]);
			}
		}
		assert_int_equal(gs_pack(GS_WIRE_F16, h, in, N, &p), 4 * REP);
		assert_int_equal(h[0], 0x7e00);
		assert_int_equal(h[1], 0xfe00);
		assert_int_equal(h[2], 0x5240); /* 50 */
		assert_int_equal(h[3], 0xd240);
		assert_int_equal(gs_pack(GS_WIRE_BF16, h, in, N, &p), 4 * REP);
		assert_int_equal(h[0], 0x7fc0);
		assert_int_equal(h[1], 0xffc0);
		assert_int_equal(h[2], 0x4248); /* 50 */
		assert_int_equal(h[3], 0xc248);
		/* Not clipping counts nothing and lets infinity through. */
		p.clip = false;
		assert_int_equal(gs_pack(GS_WIRE_F32, out, in, N, &p), 0);
		assert_true(isinf(out[2]) && out[2] > 0);
		p.clip = true;
		nchecked += 4 * N;
	}
}

/* Random wire bit patterns, so NaN, infinity and overflow all occur;
 * about half are kept to a modest range so that sums mean something. */
static void fill_wire(enum gs_wire w, void *buf, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t r = rnd();
		uint32_t v = (uint32_t)(r >> 32);

		if (r & 1)
			v = (v & 0x83ffffff) | 0x3c000000; /* [2^-7, 2) */
		if (w == GS_WIRE_F32)
			((uint32_t *)buf)[i] = v;
		else
			((uint16_t *)buf)[i] = (uint16_t)(v >> 16);
	}
}

static void ref_reduce(enum gs_wire w, void *dst, const void *const *srcs,
		       size_t nsrc, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float acc = ref_widen(w, srcs[0], i);

		for (size_t k = 1; k < nsrc; k++)
			acc += ref_widen(w, srcs[k], i);
		ref_round(w, dst, i, acc);
	}
}

static void test_reduce_sum(void **state)
{
	enum { NSRC = 4 };
	size_t n = 100003;
	void *buf[NSRC], *want, *got, *alias;

	if (!have_f16c())
		skip();
	want = xmalloc(n * 4);
	got = xmalloc(n * 4);
	alias = xmalloc((n + 1) * 4);
	rng_seed(4);
	for (size_t k = 0; k < NSRC; k++)
		buf[k] = xmalloc((n + 1) * 4);
	for (size_t j = 0; j < NWIRES; j++) {
		enum gs_wire w = wires[j];
		size_t wsz = gs_wire_size(w);
		const void *srcs[NSRC], *asrcs[NSRC];

		for (size_t k = 0; k < NSRC; k++) {
			fill_wire(w, buf[k], n + 1);
			/* Odd addresses for some of the sources. */
			srcs[k] = (char *)buf[k] + (k & 1) * wsz;
		}
		for (size_t nsrc = 1; nsrc <= NSRC; nsrc++) {
			ref_reduce(w, want, srcs, nsrc, n);
			FOR_EACH_ISA(isa) {
				gs_reduce_sum(w, got, srcs, nsrc, n);
				check_wire(w, got, want, n, true, NULL,
					   "reduce_sum", isa);
				/* In place: dst is srcs[0]. */
				memcpy(asrcs, srcs, sizeof(srcs));
				memcpy(alias, srcs[0], n * wsz);
				asrcs[0] = alias;
				gs_reduce_sum(w, alias, asrcs, nsrc, n);
				check_wire(w, alias, want, n, true, NULL,
					   "reduce_sum in place", isa);
			}
		}
	}
	for (size_t k = 0; k < NSRC; k++)
		free(buf[k]);
	free(want);
	free(got);
	free(alias);
}

/* The fused pack and local sum against the independent references of
 * both steps: every source packed on its own (ref_pack, each source with
 * its own parameters), then summed (ref_reduce). */
static void test_pack_sum(void **state)
{
	enum { NSRC = 5 };
	size_t n = 100003;
	size_t npc = sizeof(pack_cases) / sizeof(*pack_cases);
	float *in[NSRC];
	void *packed[NSRC], *want, *got;

	if (!have_f16c())
		skip();
	want = xmalloc(n * 4);
	got = xmalloc((n + 1) * 4);
	rng_seed(7);
	for (size_t k = 0; k < NSRC; k++) {
		in[k] = xmalloc((n + 1) * sizeof(float));
		packed[k] = xmalloc(n * 4);
		for (size_t i = 0; i < n + 1; i++)
			in[k][i] = rnd_gradient();
	}
	for (size_t j = 0; j < NWIRES; j++) {
		enum gs_wire w = wires[j];
		size_t wsz = gs_wire_size(w);

		for (size_t nsrc = 1; nsrc <= NSRC; nsrc++) {
			const float *srcs[NSRC];
			struct gs_pack_params p[NSRC];
			uint64_t want_clip[NSRC];

			for (size_t k = 0; k < nsrc; k++) {
				/* Odd addresses for some sources, and each
				 * source its own clipping and scale. */
				srcs[k] = in[k] + (k & 1);
				p[k] = pack_cases[(j + nsrc + k) % npc];
				want_clip[k] = ref_pack(w, packed[k], srcs[k], n, &p[k]);
			}
			ref_reduce(w, want, (const void *const *)packed, nsrc, n);
			FOR_EACH_ISA(isa) {
				uint64_t clip[NSRC] = { 0 };
				char *dst = (char *)got + wsz; /* unaligned */

				assert_int_equal(gs_pack_sum(w, dst, srcs, nsrc, n, p,
							     clip), 0);
				check_wire(w, dst, want, n, nsrc > 1, NULL,
					   "pack_sum", isa);
				for (size_t k = 0; k < nsrc; k++)
					assert_int_equal(clip[k], want_clip[k]);
			}
		}
	}
	/* Too many sources: refused, nothing written. */
	const float *many[GS_PACK_SUM_MAX_SOURCES + 1];
	for (size_t k = 0; k <= GS_PACK_SUM_MAX_SOURCES; k++)
		many[k] = in[0];
	memset(got, 0x5a, 4);
	assert_int_equal(gs_pack_sum(GS_WIRE_F16, got, many,
				     GS_PACK_SUM_MAX_SOURCES + 1, 2, NULL, NULL), -1);
	assert_int_equal(((unsigned char *)got)[0], 0x5a);
	for (size_t k = 0; k < NSRC; k++) {
		free(in[k]);
		free(packed[k]);
	}
	free(want);
	free(got);
}

static const float postscales[] = { 1.0f, 0.125f, 1.0f / 3.0f, 1e36f,
				    3e38f };

static void test_unpack(void **state)
{
	enum { NDST = 3 };
	size_t n = 100003;
	float *want, *dst[NDST];
	void *src;

	if (!have_f16c())
		skip();
	src = xmalloc((n + 1) * 4);
	want = xmalloc(n * sizeof(float));
	rng_seed(5);
	for (size_t d = 0; d < NDST; d++)
		dst[d] = xmalloc((n + 1) * sizeof(float));
	for (size_t j = 0; j < NWIRES; j++) {
		enum gs_wire w = wires[j];
		const char *s = (char *)src + gs_wire_size(w);

		fill_wire(w, src, n + 1);
		for (size_t c = 0; c < sizeof(postscales) / 4; c++) {
			uint64_t bad = 0;

			for (size_t i = 0; i < n; i++) {
				want[i] = ref_widen(w, s, i) * postscales[c];
				bad += !isfinite(want[i]);
			}
			FOR_EACH_ISA(isa) {
				for (size_t ndst = 1; ndst <= NDST; ndst += 2) {
					float *d1[NDST] = { dst[0] + 1,
							    dst[1], dst[2] };

					assert_int_equal(gs_unpack(w, d1, ndst,
						s, n, postscales[c]), bad);
					for (size_t d = 0; d < ndst; d++)
						check_wire(GS_WIRE_F32, d1[d],
							   want, n, false,
							   NULL, "unpack",
							   isa);
				}
			}
		}
	}
	for (size_t d = 0; d < NDST; d++)
		free(dst[d]);
	free(src);
	free(want);
}

/* Large unpacks take the streaming-store path when every destination sits
 * at the same offset in a cache line: each offset of a line, sizes on both
 * sides of the threshold, one to three destinations, and destinations at
 * different offsets (no streaming); the floats around each destination must
 * stay untouched. */
static void test_unpack_stream(void **state)
{
	enum { NDST = 3, GUARD = 16 };
	static const size_t sizes[] = { 65535, 65536, 100003 };
	size_t most = 100003;
	float *want, *buf[NDST];
	void *src;

	if (!have_f16c())
		skip();
	src = xmalloc(most * 2);
	want = xmalloc(most * sizeof(float));
	for (size_t d = 0; d < NDST; d++)
		buf[d] = aligned_alloc(64, ((most + 2 * GUARD + 64) * sizeof(float) + 63) & ~(size_t)63);
	rng_seed(6);
	fill_wire(GS_WIRE_F16, src, most);
	for (size_t i = 0; i < most; i++)
		want[i] = ref_widen(GS_WIRE_F16, src, i) * 0.25f;
	for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
		size_t n = sizes[z];
		uint64_t bad = 0;

		for (size_t i = 0; i < n; i++)
			bad += !isfinite(want[i]);
		for (size_t off = 0; off < 16; off++) {
			for (size_t ndst = 1; ndst <= NDST; ndst++) {
				for (int mixed = 0; mixed < 2; mixed++) {
					float *d[NDST];

					for (size_t k = 0; k < ndst; k++)
						d[k] = buf[k] + GUARD + off +
						       (mixed && k == 1 ? 3 : 0);
					FOR_EACH_ISA(isa) {
						for (size_t k = 0; k < ndst; k++)
							memset(buf[k], 0xff, (most + 2 * GUARD + 64) * 4);
						assert_int_equal(gs_unpack(GS_WIRE_F16, d, ndst,
									   src, n, 0.25f),
								 bad);
						for (size_t k = 0; k < ndst; k++) {
							check_wire(GS_WIRE_F32, d[k], want, n, false,
								   NULL, "unpack (streaming)", isa);
							for (size_t g = 1; g <= GUARD; g++) {
								assert_int_equal(f2u(d[k][-(ptrdiff_t)g]),
										 0xffffffffu);
								assert_int_equal(f2u(d[k][n - 1 + g]),
										 0xffffffffu);
							}
						}
					}
				}
			}
		}
	}
	for (size_t d = 0; d < NDST; d++)
		free(buf[d]);
	free(src);
	free(want);
}

/* One kernel output of the cross-ISA comparison. */
struct seg {
	enum gs_wire w;
	bool loose_nan;
	size_t off, n;
	const char *what;
};

#define NSEG 32

static size_t add_seg(struct seg *sg, size_t *nseg, size_t off,
		      enum gs_wire w, size_t n, bool loose, const char *what)
{
	sg[(*nseg)++] = (struct seg){ w, loose, off, n, what };
	return off + n;
}

/*
 * Runs every kernel on the active ISA into out[], laid out the same way
 * for each ISA (one float slot per element, counts stored as values), and
 * describes each output in sg[]. Returns the number of segments.
 */
static size_t run_all(float *out, struct seg *sg, const float *in,
		      void *const *wsrc, size_t n)
{
	struct gs_pack_params p = {
		.prescale = 0.37f, .clip = true, .clip_value = 3.0f,
	};
	size_t k = 0, nseg = 0;

	for (size_t j = 0; j < NWIRES; j++) {
		enum gs_wire w = wires[j];
		const void *const *srcs = (const void *const *)(wsrc + 4 * j);
		float *dsts[3] = { out + k, out + k + n, out + k + 2 * n };

		out[k + 3 * n] = (float)gs_unpack(w, dsts, 3, srcs[0], n,
						   1.7f);
		k = add_seg(sg, &nseg, k, GS_WIRE_F32, 3 * n + 1, false,
			    "unpack");
		for (int clip = 0; clip < 2; clip++) {
			p.clip = clip;
			out[k + n] = (float)gs_pack(w, out + k, in, n, &p);
			k = add_seg(sg, &nseg, k, w, n, false, "pack");
			k = add_seg(sg, &nseg, k, GS_WIRE_F32, 1, false,
				    "pack count");
		}
		for (size_t nsrc = 1; nsrc <= 4; nsrc++) {
			gs_reduce_sum(w, out + k, srcs, nsrc, n);
			k = add_seg(sg, &nseg, k, w, n, true, "reduce_sum");
		}
	}
	gs_f32_to_f16((uint16_t *)(out + k), in, n);
	k = add_seg(sg, &nseg, k, GS_WIRE_F16, n, false, "f32_to_f16");
	gs_f32_to_bf16((uint16_t *)(out + k), in, n);
	k = add_seg(sg, &nseg, k, GS_WIRE_BF16, n, false, "f32_to_bf16");
	gs_f16_to_f32(out + k, wsrc[0], n);
	k = add_seg(sg, &nseg, k, GS_WIRE_F32, n, false, "f16_to_f32");
	gs_bf16_to_f32(out + k, wsrc[4], n);
	add_seg(sg, &nseg, k, GS_WIRE_F32, n, false, "bf16_to_f32");
	assert_true(nseg <= NSEG);
	return nseg;
}

static void test_isas_identical(void **state)
{
	size_t n = 100003, cap = 40 * n, nseg;
	float *in = xmalloc(n * sizeof(*in));
	float *ref = xmalloc(cap * sizeof(*ref));
	float *out = xmalloc(cap * sizeof(*out));
	struct seg sg[NSEG];
	void *wbuf[12];

	rng_seed(6);
	for (size_t i = 0; i < n; i++)
		in[i] = rnd_gradient();
	for (size_t j = 0; j < 12; j++) {
		wbuf[j] = xmalloc(n * 4);
		fill_wire(wires[j / 4], wbuf[j], n);
	}
	FOR_EACH_ISA(isa) {
		float *o = isa == GS_ISA_SCALAR ? ref : out;

		memset(o, 0, cap * sizeof(*o));
		nseg = run_all(o, sg, in, wbuf, n);
		assert_true(sg[nseg - 1].off + n <= cap);
		if (o == ref)
			continue;
		for (size_t i = 0; i < nseg; i++)
			check_wire(sg[i].w, out + sg[i].off, ref + sg[i].off,
				   sg[i].n, sg[i].loose_nan, NULL, sg[i].what,
				   isa);
	}
	for (size_t j = 0; j < 12; j++)
		free(wbuf[j]);
	free(in);
	free(ref);
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_edges),
		cmocka_unit_test(test_f16_to_f32_all),
		cmocka_unit_test(test_f32_to_f16),
		cmocka_unit_test(test_bf16_to_f32_all),
		cmocka_unit_test(test_f32_to_bf16),
		cmocka_unit_test(test_pack),
		cmocka_unit_test(test_pack_clip_specials),
		cmocka_unit_test(test_reduce_sum),
		cmocka_unit_test(test_pack_sum),
		cmocka_unit_test(test_unpack),
		cmocka_unit_test(test_unpack_stream),
		cmocka_unit_test(test_isas_identical),
	};
	int r;

	/* The first use of the kernels reads GRADSYNC_ISA; test_names checks
	 * it was honoured. */
	setenv("GRADSYNC_ISA", "scalar", 1);
	isa_from_env = gs_isa_active();
	r = cmocka_run_group_tests(tests, NULL, NULL);
	print_message("%llu elements compared\n",
		      (unsigned long long)nchecked);
	return r;
}
