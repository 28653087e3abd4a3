/*
 * AVX2 + F16C kernels, 8 floats a vector, two vectors an iteration.
 * Built with -mavx2 -mf16c; convert.c calls them only on CPUs that have
 * both. fp16 uses the CPU's own conversions (VCVTPS2PH with round to
 * nearest even, VCVTPH2PS), which agree bit for bit with elementwise.h;
 * bf16 is elementwise.h's integer rounding done on eight lanes at a time.
 * Tails go through the scalar loops, so they are elementwise.h itself.
 */
#include <immintrin.h>

#include "convert_impl.h"
#include "elementwise.h"

#define GS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Eight bf16 in the low halves of 32-bit lanes, widened and quieted. */
GS_ALWAYS_INLINE __m256 bf16_widen8(__m128i h)
{
	__m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
	__m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
	__m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));

	x = _mm256_or_si256(x, _mm256_and_si256(nan,
			     _mm256_set1_epi32(0x400000)));
	return _mm256_castsi256_ps(x);
}

/* gs_ew_f32_to_bf16 on eight lanes; the result in the low half of each
 * 32-bit lane. */
GS_ALWAYS_INLINE __m256i bf16_round8x32(__m256 f)
{
	__m256i x = _mm256_castps_si256(f);
	__m256i top = _mm256_srli_epi32(x, 16);
	__m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
	/* NaN: no rounding (it could carry into the exponent), quiet bit. */
	__m256i bias = _mm256_andnot_si256(nan, _mm256_add_epi32(
		_mm256_set1_epi32(0x7fff),
		_mm256_and_si256(top, _mm256_set1_epi32(1))));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);

	return _mm256_or_si256(r, _mm256_and_si256(nan,
			       _mm256_set1_epi32(0x40)));
}

GS_ALWAYS_INLINE __m128i bf16_round8(__m256 f)
{
	__m256i r = bf16_round8x32(f);

	/* Every lane fits in 16 bits, so unsigned saturation is a plain
	 * narrowing. */
	return _mm_packus_epi32(_mm256_castsi256_si128(r),
				_mm256_extracti128_si256(r, 1));
}

/* Sixteen at once: one in-lane pack, then one cross-lane permute. */
GS_ALWAYS_INLINE __m256i bf16_round16(__m256 a, __m256 b)
{
	__m256i r = _mm256_packus_epi32(bf16_round8x32(a), bf16_round8x32(b));

	return _mm256_permute4x64_epi64(r, 0xd8);
}

/* Eight elements of a wire buffer at element i, widened to fp32. */
GS_ALWAYS_INLINE __m256 load8(enum gs_wire w, const void *src, size_t i)
{
	switch (w) {
	case GS_WIRE_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128(
			(const __m128i *)((const uint16_t *)src + i)));
	case GS_WIRE_BF16:
		return bf16_widen8(_mm_loadu_si128(
			(const __m128i *)((const uint16_t *)src + i)));
	default:
		return _mm256_loadu_ps((const float *)src + i);
	}
}

/* Rounds eight floats to the wire dtype at element i of dst. */
GS_ALWAYS_INLINE void store8(enum gs_wire w, void *dst, size_t i, __m256 x)
{
	switch (w) {
	case GS_WIRE_F16:
		_mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
				 _mm256_cvtps_ph(x, RNE));
		break;
	case GS_WIRE_BF16:
		_mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
				 bf16_round8(x));
		break;
	default:
		_mm256_storeu_ps((float *)dst + i, x);
		break;
	}
}

/* Rounds sixteen floats to the wire dtype at element i of dst. */
GS_ALWAYS_INLINE void store16(enum gs_wire w, void *dst, size_t i, __m256 a,
			      __m256 b)
{
	if (w == GS_WIRE_BF16) {
		_mm256_storeu_si256((__m256i *)((uint16_t *)dst + i),
				    bf16_round16(a, b));
		return;
	}
	store8(w, dst, i, a);
	store8(w, dst, i + 8, b);
}

/* ---------------------------------------------------------------- pack */

struct pack8 {
	__m256 c, negc, scale, abs;
};

/*
 * Clips and scales one vector; adds the number of clipped lanes to
 * *clipped. MAXPS/MINPS return their second operand when either is NaN,
 * so with x second a NaN passes through, and a NaN clip value clips
 * nothing, as in gs_ew_clip. (A negative clip value would differ: pack()
 * leaves that to the scalar path.) Two cheap ops instead of two blends,
 * which matters on CPUs where VBLENDVPS takes several uops.
 */
GS_ALWAYS_INLINE __m256 pack8_one(const struct pack8 *k, bool clip,
				  __m256 x, uint64_t *clipped)
{
	if (clip) {
		__m256 ax = _mm256_and_ps(x, k->abs);
		int m = _mm256_movemask_ps(_mm256_cmp_ps(ax, k->c,
							 _CMP_GT_OQ));

		x = _mm256_min_ps(k->c, _mm256_max_ps(k->negc, x));
		*clipped += (unsigned)_mm_popcnt_u32((unsigned)m);
	}
	return _mm256_mul_ps(x, k->scale);
}

GS_ALWAYS_INLINE uint64_t pack_loop(enum gs_wire w, bool clip, void *dst,
				    const float *src, size_t n,
				    const struct gs_pack_params *p)
{
	struct pack8 k = {
		.c = _mm256_set1_ps(p->clip_value),
		.negc = _mm256_set1_ps(-p->clip_value),
		.scale = _mm256_set1_ps(p->prescale),
		.abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)),
	};
	uint64_t clipped = 0;
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256 a = _mm256_loadu_ps(src + i);
		__m256 b = _mm256_loadu_ps(src + i + 8);

		a = pack8_one(&k, clip, a, &clipped);
		b = pack8_one(&k, clip, b, &clipped);
		store16(w, dst, i, a, b);
	}
	for (; i + 8 <= n; i += 8)
		store8(w, dst, i, pack8_one(&k, clip,
					    _mm256_loadu_ps(src + i),
					    &clipped));
	return clipped + gs_pack_scalar_from(w, dst, src, i, n, p);
}

static uint64_t pack(enum gs_wire w, void *dst, const float *src, size_t n,
		     const struct gs_pack_params *p)
{
	/* Meaningless, so not worth a vector path; see pack8_one. */
	if (p->clip && p->clip_value < 0)
		return gs_pack_scalar_from(w, dst, src, 0, n, p);
	switch (w) {
	case GS_WIRE_F16:
		return p->clip ? pack_loop(GS_WIRE_F16, true, dst, src, n, p)
			       : pack_loop(GS_WIRE_F16, false, dst, src, n, p);
	case GS_WIRE_BF16:
		return p->clip ? pack_loop(GS_WIRE_BF16, true, dst, src, n, p)
			       : pack_loop(GS_WIRE_BF16, false, dst, src, n, p);
	default:
		return p->clip ? pack_loop(GS_WIRE_F32, true, dst, src, n, p)
			       : pack_loop(GS_WIRE_F32, false, dst, src, n, p);
	}
}

/* -------------------------------------------------------------- reduce */

GS_ALWAYS_INLINE __m256 sum8(enum gs_wire w, const void *const *srcs,
			     size_t nsrc, size_t i)
{
	__m256 acc = load8(w, srcs[0], i);

	for (size_t k = 1; k < nsrc; k++)
		acc = _mm256_add_ps(acc, load8(w, srcs[k], i));
	return acc;
}

GS_ALWAYS_INLINE void reduce_loop(enum gs_wire w, void *dst,
				  const void *const *srcs, size_t nsrc,
				  size_t n)
{
	size_t i = 0;

	/* Each block reads all its inputs before storing, so dst may be
	 * srcs[0]. */
	for (; i + 8 <= n; i += 8)
		store8(w, dst, i, sum8(w, srcs, nsrc, i));
	gs_reduce_sum_scalar_from(w, dst, srcs, nsrc, i, n);
}

static void reduce_sum(enum gs_wire w, void *dst, const void *const *srcs,
		       size_t nsrc, size_t n)
{
	switch (w) {
	case GS_WIRE_F16:
		reduce_loop(GS_WIRE_F16, dst, srcs, nsrc, n);
		break;
	case GS_WIRE_BF16:
		reduce_loop(GS_WIRE_BF16, dst, srcs, nsrc, n);
		break;
	default:
		reduce_loop(GS_WIRE_F32, dst, srcs, nsrc, n);
		break;
	}
}

/* -------------------------------------------------------------- unpack */

/* Lanes whose exponent is all ones: infinities and NaNs. */
GS_ALWAYS_INLINE unsigned nonfinite8(__m256 y)
{
	__m256i e = _mm256_set1_epi32(0x7f800000);
	__m256i x = _mm256_and_si256(_mm256_castps_si256(y), e);

	return (unsigned)_mm_popcnt_u32((unsigned)_mm256_movemask_ps(
		_mm256_castsi256_ps(_mm256_cmpeq_epi32(x, e))));
}

GS_ALWAYS_INLINE void store_all8(float *const *dsts, size_t ndst, size_t i,
				 __m256 y)
{
	for (size_t d = 0; d < ndst; d++)
		_mm256_storeu_ps(dsts[d] + i, y);
}

GS_ALWAYS_INLINE uint64_t unpack_loop(enum gs_wire w, float *const *dsts,
				      size_t ndst, const void *src, size_t n,
				      float postscale)
{
	__m256 s = _mm256_set1_ps(postscale);
	uint64_t nonfinite = 0;
	size_t i = 0, head;

	/* See GS_UNPACK_STREAM_MIN: a head up to the cache line, then
	 * streaming stores. */
	if (gs_unpack_streams(dsts, ndst, n, &head)) {
		nonfinite += gs_unpack_scalar_from(w, dsts, ndst, src, 0, head,
						   postscale);
		for (i = head; i + 8 <= n; i += 8) {
			__m256 a = _mm256_mul_ps(load8(w, src, i), s);

			nonfinite += nonfinite8(a);
			for (size_t d = 0; d < ndst; d++)
				_mm256_stream_ps(dsts[d] + i, a);
		}
		_mm_sfence();
	}
	for (; i + 16 <= n; i += 16) {
		__m256 a = _mm256_mul_ps(load8(w, src, i), s);
		__m256 b = _mm256_mul_ps(load8(w, src, i + 8), s);

		nonfinite += nonfinite8(a) + nonfinite8(b);
		store_all8(dsts, ndst, i, a);
		store_all8(dsts, ndst, i + 8, b);
	}
	for (; i + 8 <= n; i += 8) {
		__m256 a = _mm256_mul_ps(load8(w, src, i), s);

		nonfinite += nonfinite8(a);
		store_all8(dsts, ndst, i, a);
	}
	return nonfinite + gs_unpack_scalar_from(w, dsts, ndst, src, i, n,
						 postscale);
}

static uint64_t unpack(enum gs_wire w, float *const *dsts, size_t ndst,
		       const void *src, size_t n, float postscale)
{
	switch (w) {
	case GS_WIRE_F16:
		return unpack_loop(GS_WIRE_F16, dsts, ndst, src, n, postscale);
	case GS_WIRE_BF16:
		return unpack_loop(GS_WIRE_BF16, dsts, ndst, src, n,
				   postscale);
	default:
		return unpack_loop(GS_WIRE_F32, dsts, ndst, src, n, postscale);
	}
}

/* ---------------------------------------------------------- unpack + norm */

/* Adds the squares of y's eight lanes, widened to fp64, to lanes 0-3 (lo)
 * and 4-7 (hi) of a frame. */
GS_ALWAYS_INLINE void sq8_add(__m256 y, __m256d *lo, __m256d *hi)
{
	__m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
	__m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));

	*lo = _mm256_add_pd(*lo, _mm256_mul_pd(a, a));
	*hi = _mm256_add_pd(*hi, _mm256_mul_pd(b, b));
}

/* Sixteen elements from i: unpacked, stored, their squares added to the
 * frame's four quarters; returns how many are not finite. */
GS_ALWAYS_INLINE unsigned norm16(enum gs_wire w, bool stream,
				 float *const *dsts, size_t ndst,
				 const void *src, size_t i, __m256 s,
				 __m256d *q)
{
	__m256 a = _mm256_mul_ps(load8(w, src, i), s);
	__m256 b = _mm256_mul_ps(load8(w, src, i + 8), s);

	for (size_t d = 0; stream && d < ndst; d++) {
		_mm256_stream_ps(dsts[d] + i, a);
		_mm256_stream_ps(dsts[d] + i + 8, b);
	}
	if (!stream) {
		store_all8(dsts, ndst, i, a);
		store_all8(dsts, ndst, i + 8, b);
	}
	sq8_add(a, &q[0], &q[1]);
	sq8_add(b, &q[2], &q[3]);
	return nonfinite8(a) + nonfinite8(b);
}

/* A piece (convert_impl.h): where it streams, a head up to the cache line
 * (frame rotated by its length), then sixteen at a time, then a tail. */
GS_ALWAYS_INLINE uint64_t unpack_norm_loop(enum gs_wire w, float *const *dsts,
					   size_t ndst, const void *src,
					   size_t from, size_t n,
					   float postscale, bool stream,
					   double *sumsq)
{
	_Alignas(32) double frame[GS_NORM_LANES] = { 0 };
	__m256 s = _mm256_set1_ps(postscale);
	__m256d q[4];
	uint64_t nonfinite = 0;
	size_t i = from, head = 0;

	stream = stream && gs_unpack_alike(dsts, ndst, from, &head) &&
		 n - from >= head + 16;
	if (!stream)
		head = 0;
	nonfinite += gs_unpack_lanes_from(w, dsts, ndst, src, i, i + head,
					  postscale, frame,
					  (GS_NORM_LANES - head) % GS_NORM_LANES);
	i += head;
	for (int k = 0; k < 4; k++)
		q[k] = _mm256_load_pd(frame + 4 * k);
	if (stream)
		for (; i + 16 <= n; i += 16)
			nonfinite += norm16(w, true, dsts, ndst, src, i, s, q);
	for (; i + 16 <= n; i += 16)
		nonfinite += norm16(w, false, dsts, ndst, src, i, s, q);
	for (int k = 0; k < 4; k++)
		_mm256_store_pd(frame + 4 * k, q[k]);
	nonfinite += gs_unpack_lanes_from(w, dsts, ndst, src, i, n, postscale,
					  frame, (i - from - head) % GS_NORM_LANES);
	if (stream)
		_mm_sfence();
	*sumsq = gs_norm_lanes(frame, head);
	return nonfinite;
}

static uint64_t unpack_norm(enum gs_wire w, float *const *dsts, size_t ndst,
			    const void *src, size_t from, size_t n,
			    float postscale, bool stream, double *sumsq)
{
	switch (w) {
	case GS_WIRE_F16:
		return unpack_norm_loop(GS_WIRE_F16, dsts, ndst, src, from, n,
					postscale, stream, sumsq);
	case GS_WIRE_BF16:
		return unpack_norm_loop(GS_WIRE_BF16, dsts, ndst, src, from, n,
					postscale, stream, sumsq);
	default:
		return unpack_norm_loop(GS_WIRE_F32, dsts, ndst, src, from, n,
					postscale, stream, sumsq);
	}
}

/* ---------------------------------------------------- plain conversions */

static void f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		store8(GS_WIRE_F16, dst, i, _mm256_loadu_ps(src + i));
	for (; i < n; i++)
		dst[i] = gs_ew_f32_to_f16(src[i]);
}

static void f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, load8(GS_WIRE_F16, src, i));
	for (; i < n; i++)
		dst[i] = gs_ew_f16_to_f32(src[i]);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		store8(GS_WIRE_BF16, dst, i, _mm256_loadu_ps(src + i));
	for (; i < n; i++)
		dst[i] = gs_ew_f32_to_bf16(src[i]);
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, load8(GS_WIRE_BF16, src, i));
	for (; i < n; i++)
		dst[i] = gs_ew_bf16_to_f32(src[i]);
}

const struct gs_convert_ops gs_convert_f16c = {
	.pack = pack,
	.reduce_sum = reduce_sum,
	.unpack = unpack,
	.unpack_norm = unpack_norm,
	.f32_to_f16 = f32_to_f16,
	.f16_to_f32 = f16_to_f32,
	.f32_to_bf16 = f32_to_bf16,
	.bf16_to_f32 = bf16_to_f32,
};
