/*
 * Per-element arithmetic of the conversion kernels: clip, scale, round to
 * the wire dtype and back. The host kernels (scalar, F16C, AVX-512) and the
 * CUDA kernels all implement exactly this, so every path gives the same
 * bits; the vector paths use the CPU's conversion instructions where those
 * agree with it, and the unit tests check that they do.
 *
 * Everything here is integer arithmetic or a single IEEE operation (one
 * multiply, one add), so the result does not depend on the compiler, on
 * FMA contraction (the project builds with -ffp-contract=off) or on the
 * host/device split. One exception: which NaN comes out of an operation on
 * a NaN. The x86 multiply passes the input NaN's bits on, a GPU returns its
 * own canonical NaN; daemon/backend/cuda/kernels.cu copies the host's behaviour
 * explicitly, and the tests compare NaNs as NaNs.
 */
#ifndef GS_ELEMENTWISE_H
#define GS_ELEMENTWISE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "convert.h"

#ifdef __CUDACC__
#define GS_HD __host__ __device__
#else
#define GS_HD
#endif

GS_HD static inline uint32_t gs_ew_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

GS_HD static inline float gs_ew_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

GS_HD static inline bool gs_ew_nonfinite(float f)
{
	return (gs_ew_bits(f) & 0x7f800000u) == 0x7f800000u;
}

/*
 * fp32 magnitude below 2^-14, the smallest normal fp16: the result is a
 * multiple of 2^-24, rounded to nearest even in integer arithmetic so that
 * a DAZ/FTZ floating-point mode cannot change it.
 */
GS_HD static inline uint32_t gs_ew_f16_subnormal(uint32_t ax)
{
	uint32_t shift, mant, r, rem, half;

	/* At most 2^-25 (a tie with zero, which is even): zero. */
	if (ax <= 0x33000000u)
		return 0;
	/* value = mant * 2^(e - 150), in units of 2^-24: mant >> (126 - e). */
	shift = 126 - (ax >> 23);
	mant = (ax & 0x7fffffu) | 0x800000u;
	r = mant >> shift;
	rem = mant & ((1u << shift) - 1);
	half = 1u << (shift - 1);
	if (rem > half || (rem == half && (r & 1)))
		r++;
	/* r == 0x400 is the smallest normal, which this encoding already is. */
	return r;
}

/*
 * fp32 -> fp16, round to nearest even, as VCVTPS2PH with imm8 = 0 does:
 * subnormals kept, overflow to infinity, NaN quieted with its sign and the
 * top nine bits of its payload.
 */
GS_HD static inline uint16_t gs_ew_f32_to_f16(float f)
{
	uint32_t x = gs_ew_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;
	uint32_t m;

	if (ax > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
	/* 65520 is halfway between 65504 (odd) and 2^16: it and all above
	 * round to infinity. */
	if (ax >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u)
		return (uint16_t)(sign | gs_ew_f16_subnormal(ax));
	/* Rebias the exponent (127 -> 15) and round the 13 dropped bits; a
	 * carry out of the mantissa correctly bumps the exponent. */
	m = ax - 0x38000000u;
	m += 0xfffu + ((m >> 13) & 1);
	return (uint16_t)(sign | (m >> 13));
}

/* fp16 -> fp32, exact; a signalling NaN is quieted as VCVTPH2PS does. */
GS_HD static inline float gs_ew_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0x1f)
		return gs_ew_float(sign | 0x7f800000u | (m << 13) |
				   (m ? 0x400000u : 0));
	if (e == 0) {
		/* m * 2^-24 is exact and a normal fp32, so no FP mode
		 * (DAZ, FTZ, rounding) can touch it. */
		float v = (float)m * 5.9604644775390625e-8f; /* 2^-24 */

		return gs_ew_float(sign | gs_ew_bits(v));
	}
	return gs_ew_float(sign | ((e + 112) << 23) | (m << 13));
}

/*
 * fp32 -> bf16, round to nearest even: adding 0x7fff plus the lowest kept
 * bit carries into the kept half exactly when the dropped half is above
 * the tie, or at the tie with an odd kept half. Finite values carry into
 * infinity when they should; NaN must not (it could become infinity), so
 * it is truncated and quieted instead.
 */
GS_HD static inline uint16_t gs_ew_f32_to_bf16(float f)
{
	uint32_t x = gs_ew_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* bf16 -> fp32 is a shift; a signalling NaN is quieted, as for fp16. */
GS_HD static inline float gs_ew_bf16_to_f32(uint16_t b)
{
	uint32_t x = b;

	if ((x & 0x7fffu) > 0x7f80u)
		x |= 0x40u;
	return gs_ew_float(x << 16);
}

/* Both comparisons are false for NaN, so NaN passes through unclipped. */
GS_HD static inline bool gs_ew_clipped(float x, float c)
{
	return x > c || x < -c;
}

GS_HD static inline float gs_ew_clip(float x, float c)
{
	return x > c ? c : (x < -c ? -c : x);
}

/* Element i of a wire buffer, widened to fp32. */
GS_HD static inline float gs_ew_load(enum gs_wire w, const void *src,
				     size_t i)
{
	switch (w) {
	case GS_WIRE_F16:
		return gs_ew_f16_to_f32(((const uint16_t *)src)[i]);
	case GS_WIRE_BF16:
		return gs_ew_bf16_to_f32(((const uint16_t *)src)[i]);
	default:
		return ((const float *)src)[i];
	}
}

/* Rounds x to the wire dtype into element i of dst. */
GS_HD static inline void gs_ew_store(enum gs_wire w, void *dst, size_t i,
				     float x)
{
	switch (w) {
	case GS_WIRE_F16:
		((uint16_t *)dst)[i] = gs_ew_f32_to_f16(x);
		break;
	case GS_WIRE_BF16:
		((uint16_t *)dst)[i] = gs_ew_f32_to_bf16(x);
		break;
	default:
		((float *)dst)[i] = x;
		break;
	}
}

/*
 * dst[i] = round_wire(clip(x) * prescale). Returns whether x was clipped.
 * Clipping happens on the trainer's fp32 value, before any scaling, as in
 * the original training loop.
 */
GS_HD static inline bool gs_ew_pack_one(enum gs_wire w, void *dst, size_t i,
					float x,
					const struct gs_pack_params *p)
{
	bool clipped = false;

	if (p->clip) {
		clipped = gs_ew_clipped(x, p->clip_value);
		x = gs_ew_clip(x, p->clip_value);
	}
	gs_ew_store(w, dst, i, x * p->prescale);
	return clipped;
}

/* widen(src[i]) * postscale, in fp32. */
GS_HD static inline float gs_ew_unpack_one(enum gs_wire w, const void *src,
					   size_t i, float postscale)
{
	return gs_ew_load(w, src, i) * postscale;
}

#endif
