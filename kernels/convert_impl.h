/*
 * Internal to kernels/: one table of kernels per ISA. Each table lives in
 * its own file, compiled with that ISA's target flags, so the vector code
 * can only run after convert.c has checked the CPU for it.
 */
#ifndef GS_CONVERT_IMPL_H
#define GS_CONVERT_IMPL_H

#include "convert.h"

struct gs_convert_ops {
	uint64_t (*pack)(enum gs_wire w, void *dst, const float *src,
			 size_t n, const struct gs_pack_params *p);
	void (*reduce_sum)(enum gs_wire w, void *dst,
			   const void *const *srcs, size_t nsrc, size_t n);
	uint64_t (*unpack)(enum gs_wire w, float *const *dsts, size_t ndst,
			   const void *src, size_t n, float postscale);
	void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
	void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
	void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
	void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
};

extern const struct gs_convert_ops gs_convert_scalar;
extern const struct gs_convert_ops gs_convert_f16c;
extern const struct gs_convert_ops gs_convert_avx512;

/*
 * Scalar loops over [from, n), shared by the vector paths for their tails
 * so that a tail computes exactly what the scalar path would.
 */
uint64_t gs_pack_scalar_from(enum gs_wire w, void *dst, const float *src,
			     size_t from, size_t n,
			     const struct gs_pack_params *p);
void gs_reduce_sum_scalar_from(enum gs_wire w, void *dst,
			       const void *const *srcs, size_t nsrc,
			       size_t from, size_t n);
uint64_t gs_unpack_scalar_from(enum gs_wire w, float *const *dsts,
			       size_t ndst, const void *src, size_t from,
			       size_t n, float postscale);

#endif
