/*
 * Internal to kernels/: one table of kernels per ISA. Each table lives in
 * its own file, compiled with that ISA's target flags, so the vector code
 * can only run after convert.c has checked the CPU for it.
 */
#ifndef GS_CONVERT_IMPL_H
#define GS_CONVERT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

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

/*
 * Large unpacks write their destinations with streaming (non-temporal)
 * stores: a reduced bucket goes back into trainer memory that nothing on
 * this core reads again soon, and ordinary stores would first read every
 * destination line into the cache (read for ownership), a third more
 * memory traffic per destination. Measured in bench/ (RESULTS.md): the
 * daemon's unpack, to trainer buffers that are not in cache, takes about
 * half the time. Below GS_UNPACK_STREAM_MIN elements (256 KiB a
 * destination) ordinary stores keep small tensors cached for the trainer.
 * Streaming needs every destination at the same offset in a cache line;
 * the vector paths store a head with ordinary stores up to the line, then
 * stream, then fence (SFENCE), so the results are visible to whoever the
 * caller tells next. Values are the same bits either way.
 */
#define GS_UNPACK_STREAM_MIN 65536

/* Whether an unpack of n elements into dsts streams, and if so, how many
 * elements (*head) precede the first cache-line boundary of dsts[0]. */
static inline bool gs_unpack_streams(float *const *dsts, size_t ndst, size_t n,
				     size_t *head)
{
	uintptr_t a = (uintptr_t)dsts[0] & 63;

	if (n < GS_UNPACK_STREAM_MIN || (a & 3))
		return false;
	for (size_t d = 1; d < ndst; d++)
		if (((uintptr_t)dsts[d] & 63) != a)
			return false;
	*head = ((64 - a) & 63) / sizeof(float);
	return true;
}

#endif
