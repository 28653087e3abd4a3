/*
 * Host conversion kernels: pack (clip, scale, round to the wire dtype),
 * reduce (sum wire buffers, accumulating in fp32, rounding once), unpack
 * (widen, scale, count non-finite values, and, for the norm, sum the
 * squares of the results). Each has a scalar path and
 * vectorised paths (F16C + AVX2, AVX-512) chosen once at run time from the
 * CPU's features; all paths give bit-identical results, and the per-element
 * arithmetic they implement is the one in elementwise.h.
 */
#ifndef GS_CONVERT_H
#define GS_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum gs_wire {
	GS_WIRE_F16 = 1,
	GS_WIRE_BF16 = 2,
	GS_WIRE_F32 = 3,
};

/* Bytes per element on the wire. */
size_t gs_wire_size(enum gs_wire w);
const char *gs_wire_name(enum gs_wire w);

enum gs_isa {
	GS_ISA_SCALAR = 0,
	GS_ISA_F16C = 1,   /* AVX2 + F16C */
	GS_ISA_AVX512 = 2, /* AVX-512 F/BW/VL (+ F16C) */
};

/* The best ISA this CPU supports. */
enum gs_isa gs_isa_detect(void);
/* The ISA the kernels use now (detected at first use unless forced). */
enum gs_isa gs_isa_active(void);
const char *gs_isa_name(enum gs_isa isa);
/* Forces an ISA (tests, benchmarks). Returns false, changing nothing, when
 * the CPU lacks it. */
bool gs_isa_force(enum gs_isa isa);

struct gs_pack_params {
	float prescale;   /* multiply after clipping, before the cast */
	bool clip;
	float clip_value; /* clip to [-clip_value, clip_value]; NaN stays NaN */
};

/* dst[i] = round_wire(clip(src[i]) * prescale) for i < n; dst holds n wire
 * elements. Returns the number of elements whose magnitude exceeded
 * clip_value (0 when not clipping). p NULL: no clipping, prescale 1. An
 * unknown wire dtype does nothing and returns 0. */
uint64_t gs_pack(enum gs_wire w, void *dst, const float *src, size_t n,
		 const struct gs_pack_params *p);

/* dst[i] = round_wire(sum over k < nsrc of widen(srcs[k][i])), summing in
 * fp32 in order k = 0, 1, ...; dst may alias srcs[0]. nsrc == 0 writes
 * zeros. */
void gs_reduce_sum(enum gs_wire w, void *dst, const void *const *srcs,
		   size_t nsrc, size_t n);

/* Packs nsrc fp32 sources and sums them in one pass: bit for bit what
 * gs_pack of each source into a buffer of its own followed by gs_reduce_sum
 * of those buffers gives, i.e. dst[i] = round_wire(sum over k < nsrc of
 * widen(round_wire(clip_k(srcs[k][i]) * prescale_k))), summing in fp32 in
 * order k = 0, 1, ..., but reading each source once and writing only dst
 * (the packed sources live in a small cache-resident tile). p[k] are
 * source k's parameters (p NULL: no clipping, prescale 1, for all);
 * clipped[k] (when clipped is not NULL) is increased by the number of
 * elements of source k that were clipped. dst must not overlap a source.
 * nsrc == 0 writes zeros. Returns 0, or -1 (changing nothing) for an
 * unknown wire dtype or more than GS_PACK_SUM_MAX_SOURCES sources. */
#define GS_PACK_SUM_MAX_SOURCES 64
int gs_pack_sum(enum gs_wire w, void *dst, const float *const *srcs,
		size_t nsrc, size_t n, const struct gs_pack_params *p,
		uint64_t *clipped);

/* For every d < ndst: dsts[d][i] = widen(src[i]) * postscale, i < n.
 * Returns how many of the n results are not finite (counted once, not per
 * destination). From 65536 elements on, the vector paths write with
 * streaming stores that bypass the cache, then fence (see convert_impl.h):
 * the destinations are not in this core's cache afterwards. */
uint64_t gs_unpack(enum gs_wire w, float *const *dsts, size_t ndst,
		   const void *src, size_t n, float postscale);

/* Elements of a block of gs_unpack_norm's sequence. */
#define GS_NORM_BLOCK 16384

/*
 * gs_unpack, and the squares of its results summed in fp64, for the L2
 * norm of the reduced gradient. The n results are elements first, ...,
 * first + n - 1 of a sequence cut into blocks of GS_NORM_BLOCK elements;
 * the sum of the squares of those in block b is added to blocks[b].
 *
 * The sum of one call's elements in one block (a piece) is the same bits
 * whatever the ISA and wherever the destinations are: piece element k
 * goes to lane k % 16, each of the 16 lanes adds its squares in order of
 * k (the square of an fp32 value is exact in fp64), and the lanes are
 * then added pairwise, lane j and j + 8, then j and j + 4, j + 2, j + 1.
 * An infinite result makes the sum infinite, a NaN makes it NaN. So every
 * caller that makes the same calls and adds the blocks in the same order
 * gets the same sum.
 */
uint64_t gs_unpack_norm(enum gs_wire w, float *const *dsts, size_t ndst,
			const void *src, size_t n, float postscale,
			uint64_t first, double *blocks);

/* Plain conversions, round to nearest even, subnormals kept, NaN kept NaN
 * (quieted), infinities kept. */
void gs_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void gs_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void gs_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void gs_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
