/*
 * Scalar kernels: the reference path, the fallback on CPUs without F16C,
 * and the tails of the vector paths. Each loop is elementwise.h applied
 * element by element; the wire dtype is a compile-time constant inside
 * each loop (always_inline + a switch) so the per-element switch vanishes.
 */
#include "convert_impl.h"
#include "elementwise.h"

#define GS_ALWAYS_INLINE static inline __attribute__((always_inline))

GS_ALWAYS_INLINE uint64_t pack_loop(enum gs_wire w, void *dst,
				    const float *src, size_t from, size_t n,
				    const struct gs_pack_params *p)
{
	/* A local copy: stores through dst cannot then alias the params. */
	struct gs_pack_params q = *p;
	uint64_t clipped = 0;
	size_t i;

	for (i = from; i < n; i++)
		clipped += gs_ew_pack_one(w, dst, i, src[i], &q);
	return clipped;
}

uint64_t gs_pack_scalar_from(enum gs_wire w, void *dst, const float *src,
			     size_t from, size_t n,
			     const struct gs_pack_params *p)
{
	switch (w) {
	case GS_WIRE_F16:
		return pack_loop(GS_WIRE_F16, dst, src, from, n, p);
	case GS_WIRE_BF16:
		return pack_loop(GS_WIRE_BF16, dst, src, from, n, p);
	default:
		return pack_loop(GS_WIRE_F32, dst, src, from, n, p);
	}
}

GS_ALWAYS_INLINE void reduce_loop(enum gs_wire w, void *dst,
				  const void *const *srcs, size_t nsrc,
				  size_t from, size_t n)
{
	size_t i, k;

	for (i = from; i < n; i++) {
		float acc = gs_ew_load(w, srcs[0], i);

		for (k = 1; k < nsrc; k++)
			acc += gs_ew_load(w, srcs[k], i);
		gs_ew_store(w, dst, i, acc);
	}
}

/* nsrc >= 1; the caller handles the empty sum. */
void gs_reduce_sum_scalar_from(enum gs_wire w, void *dst,
			       const void *const *srcs, size_t nsrc,
			       size_t from, size_t n)
{
	switch (w) {
	case GS_WIRE_F16:
		reduce_loop(GS_WIRE_F16, dst, srcs, nsrc, from, n);
		break;
	case GS_WIRE_BF16:
		reduce_loop(GS_WIRE_BF16, dst, srcs, nsrc, from, n);
		break;
	default:
		reduce_loop(GS_WIRE_F32, dst, srcs, nsrc, from, n);
		break;
	}
}

GS_ALWAYS_INLINE uint64_t unpack_loop(enum gs_wire w, float *const *dsts,
				      size_t ndst, const void *src,
				      size_t from, size_t n, float postscale)
{
	uint64_t nonfinite = 0;
	size_t i, d;

	for (i = from; i < n; i++) {
		float y = gs_ew_unpack_one(w, src, i, postscale);

		nonfinite += gs_ew_nonfinite(y);
		for (d = 0; d < ndst; d++)
			dsts[d][i] = y;
	}
	return nonfinite;
}

uint64_t gs_unpack_scalar_from(enum gs_wire w, float *const *dsts,
			       size_t ndst, const void *src, size_t from,
			       size_t n, float postscale)
{
	switch (w) {
	case GS_WIRE_F16:
		return unpack_loop(GS_WIRE_F16, dsts, ndst, src, from, n,
				   postscale);
	case GS_WIRE_BF16:
		return unpack_loop(GS_WIRE_BF16, dsts, ndst, src, from, n,
				   postscale);
	default:
		return unpack_loop(GS_WIRE_F32, dsts, ndst, src, from, n,
				   postscale);
	}
}

GS_ALWAYS_INLINE uint64_t lanes_loop(enum gs_wire w, float *const *dsts,
				     size_t ndst, const void *src, size_t from,
				     size_t n, float postscale, double *frame,
				     size_t lane)
{
	uint64_t nonfinite = 0;
	size_t i, d;

	for (i = from; i < n; i++) {
		float y = gs_ew_unpack_one(w, src, i, postscale);

		nonfinite += gs_ew_nonfinite(y);
		frame[lane] += (double)y * (double)y;
		lane = (lane + 1) % GS_NORM_LANES;
		for (d = 0; d < ndst; d++)
			dsts[d][i] = y;
	}
	return nonfinite;
}

uint64_t gs_unpack_lanes_from(enum gs_wire w, float *const *dsts, size_t ndst,
			      const void *src, size_t from, size_t n,
			      float postscale, double *frame, size_t lane)
{
	switch (w) {
	case GS_WIRE_F16:
		return lanes_loop(GS_WIRE_F16, dsts, ndst, src, from, n,
				  postscale, frame, lane);
	case GS_WIRE_BF16:
		return lanes_loop(GS_WIRE_BF16, dsts, ndst, src, from, n,
				  postscale, frame, lane);
	default:
		return lanes_loop(GS_WIRE_F32, dsts, ndst, src, from, n,
				  postscale, frame, lane);
	}
}

static uint64_t pack(enum gs_wire w, void *dst, const float *src, size_t n,
		     const struct gs_pack_params *p)
{
	return gs_pack_scalar_from(w, dst, src, 0, n, p);
}

static void reduce_sum(enum gs_wire w, void *dst, const void *const *srcs,
		       size_t nsrc, size_t n)
{
	gs_reduce_sum_scalar_from(w, dst, srcs, nsrc, 0, n);
}

static uint64_t unpack(enum gs_wire w, float *const *dsts, size_t ndst,
		       const void *src, size_t n, float postscale)
{
	return gs_unpack_scalar_from(w, dsts, ndst, src, 0, n, postscale);
}

/* The reference order itself: no head, so the frame is not rotated. */
static uint64_t unpack_norm(enum gs_wire w, float *const *dsts, size_t ndst,
			    const void *src, size_t from, size_t n,
			    float postscale, bool stream, double *sumsq)
{
	double frame[GS_NORM_LANES] = { 0 };
	uint64_t nonfinite;

	(void)stream;
	nonfinite = gs_unpack_lanes_from(w, dsts, ndst, src, from, n,
					 postscale, frame, 0);
	*sumsq = gs_norm_lanes(frame, 0);
	return nonfinite;
}

static void f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = gs_ew_f32_to_f16(src[i]);
}

static void f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = gs_ew_f16_to_f32(src[i]);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = gs_ew_f32_to_bf16(src[i]);
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = gs_ew_bf16_to_f32(src[i]);
}

const struct gs_convert_ops gs_convert_scalar = {
	.pack = pack,
	.reduce_sum = reduce_sum,
	.unpack = unpack,
	.unpack_norm = unpack_norm,
	.f32_to_f16 = f32_to_f16,
	.f16_to_f32 = f16_to_f32,
	.f32_to_bf16 = f32_to_bf16,
	.bf16_to_f32 = bf16_to_f32,
};
