/*
 * AVX-512 F/BW/VL kernels, 16 floats a vector, two vectors an iteration,
 * tails done with masked loads and stores. Every helper takes a lane mask:
 * the main loops pass the constant 0xffff, which the compiler folds into
 * plain unmasked instructions.
 *
 * fp16 uses VCVTPS2PH/VCVTPH2PS. bf16 deliberately does not use
 * VCVTNEPS2BF16 (AVX512_BF16): it flushes subnormal inputs to zero and so
 * disagrees with elementwise.h and the CUDA path; the integer rounding
 * below is exact and costs little next to the memory traffic.
 */
#include <immintrin.h>

#include "convert_impl.h"
#include "elementwise.h"

#define GS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define ALL ((__mmask16)0xffff)

/* Lanes [0, n) of 16, n < 16. */
static inline __mmask16 tail_mask(size_t n)
{
	return (__mmask16)((1u << n) - 1);
}

GS_ALWAYS_INLINE __mmask16 is_nan16(__m512i x)
{
	__m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));

	return _mm512_cmpgt_epu32_mask(ax, _mm512_set1_epi32(0x7f800000));
}

/* Sixteen bf16, widened and quieted. */
GS_ALWAYS_INLINE __m512 bf16_widen16(__m256i h)
{
	__m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);

	x = _mm512_mask_or_epi32(x, is_nan16(x), x,
				 _mm512_set1_epi32(0x400000));
	return _mm512_castsi512_ps(x);
}

/* gs_ew_f32_to_bf16 on sixteen lanes, narrowed to sixteen uint16. */
GS_ALWAYS_INLINE __m256i bf16_round16(__m512 f)
{
	__m512i x = _mm512_castps_si512(f);
	__m512i top = _mm512_srli_epi32(x, 16);
	__m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
		_mm512_and_si512(top, _mm512_set1_epi32(1)));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);

	r = _mm512_mask_or_epi32(r, is_nan16(x), top,
				 _mm512_set1_epi32(0x40));
	return _mm512_cvtepi32_epi16(r);
}

/* Lanes m of a wire buffer at element i, widened; other lanes zero. */
GS_ALWAYS_INLINE __m512 load16(enum gs_wire w, const void *src, size_t i,
			       __mmask16 m)
{
	const uint16_t *h = (const uint16_t *)src + i;

	switch (w) {
	case GS_WIRE_F16:
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h));
	case GS_WIRE_BF16:
		return bf16_widen16(_mm256_maskz_loadu_epi16(m, h));
	default:
		return _mm512_maskz_loadu_ps(m, (const float *)src + i);
	}
}

/* Rounds lanes m of x to the wire dtype at element i of dst. */
GS_ALWAYS_INLINE void store16(enum gs_wire w, void *dst, size_t i,
			      __mmask16 m, __m512 x)
{
	uint16_t *h = (uint16_t *)dst + i;

	switch (w) {
	case GS_WIRE_F16:
		_mm256_mask_storeu_epi16(h, m, _mm512_cvtps_ph(x, RNE));
		break;
	case GS_WIRE_BF16:
		_mm256_mask_storeu_epi16(h, m, bf16_round16(x));
		break;
	default:
		_mm512_mask_storeu_ps((float *)dst + i, m, x);
		break;
	}
}

/* ---------------------------------------------------------------- pack */

struct pack16 {
	__m512 c, negc, scale;
};

/* Clip lanes m (compare + blend: NaN fails both compares and passes) and
 * scale; adds the number of clipped lanes to *clipped. */
GS_ALWAYS_INLINE __m512 pack16_one(const struct pack16 *k, bool clip,
				   __m512 x, __mmask16 m, uint64_t *clipped)
{
	if (clip) {
		__mmask16 hi = _mm512_mask_cmp_ps_mask(m, x, k->c, _CMP_GT_OQ);
		__mmask16 lo = _mm512_mask_cmp_ps_mask(m, x, k->negc,
						       _CMP_LT_OQ);

		x = _mm512_mask_blend_ps(lo, x, k->negc);
		x = _mm512_mask_blend_ps(hi, x, k->c);
		*clipped += (unsigned)_mm_popcnt_u32((unsigned)(hi | lo));
	}
	return _mm512_mul_ps(x, k->scale);
}

GS_ALWAYS_INLINE void pack16_at(enum gs_wire w, bool clip,
				const struct pack16 *k, void *dst,
				const float *src, size_t i, __mmask16 m,
				uint64_t *clipped)
{
	__m512 x = _mm512_maskz_loadu_ps(m, src + i);

	store16(w, dst, i, m, pack16_one(k, clip, x, m, clipped));
}

GS_ALWAYS_INLINE uint64_t pack_loop(enum gs_wire w, bool clip, void *dst,
				    const float *src, size_t n,
				    const struct gs_pack_params *p)
{
	struct pack16 k = {
		.c = _mm512_set1_ps(p->clip_value),
		.negc = _mm512_set1_ps(-p->clip_value),
		.scale = _mm512_set1_ps(p->prescale),
	};
	uint64_t clipped = 0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		pack16_at(w, clip, &k, dst, src, i, ALL, &clipped);
		pack16_at(w, clip, &k, dst, src, i + 16, ALL, &clipped);
	}
	for (; i + 16 <= n; i += 16)
		pack16_at(w, clip, &k, dst, src, i, ALL, &clipped);
	if (i < n)
		pack16_at(w, clip, &k, dst, src, i, tail_mask(n - i),
			  &clipped);
	return clipped;
}

static uint64_t pack(enum gs_wire w, void *dst, const float *src, size_t n,
		     const struct gs_pack_params *p)
{
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

/* Reads all inputs of the block before the store, so dst may be srcs[0]. */
GS_ALWAYS_INLINE void reduce16_at(enum gs_wire w, void *dst,
				  const void *const *srcs, size_t nsrc,
				  size_t i, __mmask16 m)
{
	__m512 acc = load16(w, srcs[0], i, m);

	for (size_t k = 1; k < nsrc; k++)
		acc = _mm512_add_ps(acc, load16(w, srcs[k], i, m));
	store16(w, dst, i, m, acc);
}

GS_ALWAYS_INLINE void reduce_loop(enum gs_wire w, void *dst,
				  const void *const *srcs, size_t nsrc,
				  size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		reduce16_at(w, dst, srcs, nsrc, i, ALL);
	if (i < n)
		reduce16_at(w, dst, srcs, nsrc, i, tail_mask(n - i));
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

/* Widens, scales and stores lanes m to every destination; returns how
 * many of them are infinities or NaNs (exponent all ones). */
GS_ALWAYS_INLINE unsigned unpack16_at(enum gs_wire w, float *const *dsts,
				      size_t ndst, const void *src, size_t i,
				      __mmask16 m, __m512 s)
{
	__m512 y = _mm512_mul_ps(load16(w, src, i, m), s);
	__m512i e = _mm512_set1_epi32(0x7f800000);
	__m512i x = _mm512_and_si512(_mm512_castps_si512(y), e);

	for (size_t d = 0; d < ndst; d++)
		_mm512_mask_storeu_ps(dsts[d] + i, m, y);
	return (unsigned)_mm_popcnt_u32(_mm512_mask_cmpeq_epi32_mask(m, x, e));
}

/* unpack16_at on all lanes with streaming stores; every dsts[d] + i is
 * 64-byte aligned. */
GS_ALWAYS_INLINE unsigned unpack16_stream(enum gs_wire w, float *const *dsts,
					  size_t ndst, const void *src,
					  size_t i, __m512 s)
{
	__m512 y = _mm512_mul_ps(load16(w, src, i, ALL), s);
	__m512i e = _mm512_set1_epi32(0x7f800000);
	__m512i x = _mm512_and_si512(_mm512_castps_si512(y), e);

	for (size_t d = 0; d < ndst; d++)
		_mm512_stream_ps(dsts[d] + i, y);
	return (unsigned)_mm_popcnt_u32(_mm512_cmpeq_epi32_mask(x, e));
}

GS_ALWAYS_INLINE uint64_t unpack_loop(enum gs_wire w, float *const *dsts,
				      size_t ndst, const void *src, size_t n,
				      float postscale)
{
	__m512 s = _mm512_set1_ps(postscale);
	uint64_t nonfinite = 0;
	size_t i = 0, head;

	/* See GS_UNPACK_STREAM_MIN. */
	if (gs_unpack_streams(dsts, ndst, n, &head)) {
		if (head)
			nonfinite += unpack16_at(w, dsts, ndst, src, 0,
						 tail_mask(head), s);
		for (i = head; i + 16 <= n; i += 16)
			nonfinite += unpack16_stream(w, dsts, ndst, src, i, s);
		_mm_sfence();
	}
	for (; i + 32 <= n; i += 32) {
		nonfinite += unpack16_at(w, dsts, ndst, src, i, ALL, s);
		nonfinite += unpack16_at(w, dsts, ndst, src, i + 16, ALL, s);
	}
	for (; i + 16 <= n; i += 16)
		nonfinite += unpack16_at(w, dsts, ndst, src, i, ALL, s);
	if (i < n)
		nonfinite += unpack16_at(w, dsts, ndst, src, i,
					 tail_mask(n - i), s);
	return nonfinite;
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

/* Adds the squares of y's sixteen lanes, widened to fp64, to lanes 0-7
 * (lo) and 8-15 (hi) of a frame. */
GS_ALWAYS_INLINE void sq16_add(__m512 y, __m512d *lo, __m512d *hi)
{
	__m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
	__m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(
		_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));

	*lo = _mm512_add_pd(*lo, _mm512_mul_pd(a, a));
	*hi = _mm512_add_pd(*hi, _mm512_mul_pd(b, b));
}

/* Lanes m from element i: unpacked, stored, their squares added to the
 * frame (the other lanes add zero), in the lanes rot says (NULL: the
 * same); returns how many are not finite. */
GS_ALWAYS_INLINE unsigned norm16_at(enum gs_wire w, bool stream,
				    float *const *dsts, size_t ndst,
				    const void *src, size_t i, __mmask16 m,
				    __m512 s, const __m512i *rot, __m512d *lo,
				    __m512d *hi)
{
	__m512 y = _mm512_maskz_mov_ps(m, _mm512_mul_ps(load16(w, src, i, m),
							s));
	__m512i e = _mm512_set1_epi32(0x7f800000);
	__m512i x = _mm512_and_si512(_mm512_castps_si512(y), e);

	for (size_t d = 0; d < ndst; d++) {
		if (stream)
			_mm512_stream_ps(dsts[d] + i, y);
		else
			_mm512_mask_storeu_ps(dsts[d] + i, m, y);
	}
	sq16_add(rot ? _mm512_permutexvar_ps(*rot, y) : y, lo, hi);
	return (unsigned)_mm_popcnt_u32(_mm512_mask_cmpeq_epi32_mask(m, x, e));
}

/* A piece (convert_impl.h): where it streams, a head up to the cache line,
 * its lanes rotated into the frame (VPERMPS), then sixteen at a time,
 * then a masked tail. */
GS_ALWAYS_INLINE uint64_t unpack_norm_loop(enum gs_wire w, float *const *dsts,
					   size_t ndst, const void *src,
					   size_t from, size_t n,
					   float postscale, bool stream,
					   double *sumsq)
{
	_Alignas(64) double frame[GS_NORM_LANES];
	__m512 s = _mm512_set1_ps(postscale);
	__m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
	uint64_t nonfinite = 0;
	size_t i = from, head = 0;

	stream = stream && gs_unpack_alike(dsts, ndst, from, &head) &&
		 n - from >= head + 16;
	if (!stream)
		head = 0;
	if (head) {
		/* Piece element k < head goes to frame lane k + 16 - head:
		 * frame lane j takes vector lane (j + head) % 16. */
		__m512i rot = _mm512_and_si512(
			_mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11,
							  10, 9, 8, 7, 6, 5, 4,
							  3, 2, 1, 0),
					 _mm512_set1_epi32((int)head)),
			_mm512_set1_epi32(15));

		nonfinite += norm16_at(w, false, dsts, ndst, src, i,
				       tail_mask(head), s, &rot, &lo, &hi);
		i += head;
	}
	if (stream)
		for (; i + 16 <= n; i += 16)
			nonfinite += norm16_at(w, true, dsts, ndst, src, i,
					       ALL, s, NULL, &lo, &hi);
	for (; i + 16 <= n; i += 16)
		nonfinite += norm16_at(w, false, dsts, ndst, src, i, ALL, s,
				       NULL, &lo, &hi);
	if (i < n)
		nonfinite += norm16_at(w, false, dsts, ndst, src, i,
				       tail_mask(n - i), s, NULL, &lo, &hi);
	if (stream)
		_mm_sfence();
	_mm512_store_pd(frame, lo);
	_mm512_store_pd(frame + 8, hi);
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

/* Narrowing: fp32 source, wire destination. */
GS_ALWAYS_INLINE void narrow_loop(enum gs_wire w, uint16_t *dst,
				  const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		store16(w, dst, i, ALL, _mm512_loadu_ps(src + i));
	if (i < n) {
		__mmask16 m = tail_mask(n - i);

		store16(w, dst, i, m, _mm512_maskz_loadu_ps(m, src + i));
	}
}

/* Widening: wire source, fp32 destination. */
GS_ALWAYS_INLINE void widen_loop(enum gs_wire w, float *dst,
				 const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, load16(w, src, i, ALL));
	if (i < n) {
		__mmask16 m = tail_mask(n - i);

		_mm512_mask_storeu_ps(dst + i, m, load16(w, src, i, m));
	}
}

static void f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	narrow_loop(GS_WIRE_F16, dst, src, n);
}

static void f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	widen_loop(GS_WIRE_F16, dst, src, n);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	narrow_loop(GS_WIRE_BF16, dst, src, n);
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	widen_loop(GS_WIRE_BF16, dst, src, n);
}

const struct gs_convert_ops gs_convert_avx512 = {
	.pack = pack,
	.reduce_sum = reduce_sum,
	.unpack = unpack,
	.unpack_norm = unpack_norm,
	.f32_to_f16 = f32_to_f16,
	.f16_to_f32 = f16_to_f32,
	.f32_to_bf16 = f32_to_bf16,
	.bf16_to_f32 = bf16_to_f32,
};
