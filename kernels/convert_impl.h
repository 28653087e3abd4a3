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
	/* Elements [from, n) of an unpack, one piece of gs_unpack_norm: the
	 * sum of their squares in *sumsq. stream: the whole call is long
	 * enough to stream its stores (GS_UNPACK_STREAM_MIN), so the piece
	 * streams where the destinations allow. */
	uint64_t (*unpack_norm)(enum gs_wire w, float *const *dsts,
				size_t ndst, const void *src, size_t from,
				size_t n, float postscale, bool stream,
				double *sumsq);
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
 * A piece's sum of squares (gs_unpack_norm) in 16 lanes. A vector path
 * that begins its piece with a head of h elements, up to the destinations'
 * cache line, keeps its lanes in a frame rotated by h: piece element k in
 * frame lane (k + 16 - h) % 16, so that its vectors start at frame lane 0.
 * gs_unpack_lanes_from is the scalar loop over [from, n) adding element
 * from's square to frame[lane], the next one's to the lane after, and so
 * on (a head, a tail); gs_norm_lanes turns a frame rotated by h into the
 * piece's sum, by the fixed order convert.h states.
 */
#define GS_NORM_LANES 16
uint64_t gs_unpack_lanes_from(enum gs_wire w, float *const *dsts, size_t ndst,
			      const void *src, size_t from, size_t n,
			      float postscale, double *frame, size_t lane);

static inline double gs_norm_lanes(const double *frame, size_t h)
{
	double l[GS_NORM_LANES];

	for (size_t c = 0; c < GS_NORM_LANES; c++)
		l[c] = frame[(c + GS_NORM_LANES - h) % GS_NORM_LANES];
	for (size_t half = GS_NORM_LANES / 2; half > 0; half /= 2)
		for (size_t j = 0; j < half; j++)
			l[j] += l[j + half];
	return l[0];
}

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

/* Whether element `from` of every destination sits at the same offset in
 * its cache line, and if so, how many elements (*head) precede the next
 * cache-line boundary of dsts[0] + from. */
static inline bool gs_unpack_alike(float *const *dsts, size_t ndst,
				   size_t from, size_t *head)
{
	uintptr_t a = (uintptr_t)(dsts[0] + from) & 63;

	if (a & 3)
		return false;
	for (size_t d = 1; d < ndst; d++)
		if (((uintptr_t)(dsts[d] + from) & 63) != a)
			return false;
	*head = ((64 - a) & 63) / sizeof(float);
	return true;
}

/* Whether an unpack of n elements into dsts streams, and if so, how many
 * elements (*head) precede the first cache-line boundary of dsts[0]. */
static inline bool gs_unpack_streams(float *const *dsts, size_t ndst, size_t n,
				     size_t *head)
{
	return n >= GS_UNPACK_STREAM_MIN && gs_unpack_alike(dsts, ndst, 0, head);
}

#endif
