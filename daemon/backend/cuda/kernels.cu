/*
 * Pack and unpack over a table of spans: block b does task b, its threads
 * stride over the task's elements (coalesced), and the block's count of
 * clipped or non-finite elements goes to the counter in one atomic add.
 * The wire dtype is a template parameter, so the per-element switch of
 * elementwise.h folds away.
 */
#include "backend/cuda/kernels.h"

#include "elementwise.h"

namespace {

/*
 * x86's multiply, which the host kernels use, returns a NaN operand
 * quieted, with its sign and payload; a GPU's returns its one canonical
 * NaN. The kernels do as the host does, so NaNs too are bit for bit the
 * same: a NaN skips the multiply and is passed on quieted.
 */
__device__ __forceinline__ bool is_nan(float x)
{
	return (gs_ew_bits(x) & 0x7fffffffu) > 0x7f800000u;
}

__device__ __forceinline__ float quiet(float x)
{
	return gs_ew_float(gs_ew_bits(x) | 0x400000u);
}

/* Sums v over the block; thread 0 gets the total. */
__device__ unsigned block_sum(unsigned v)
{
	__shared__ unsigned warp_sums[GS_CUDA_BLOCK_THREADS / 32];
	for (int off = 16; off > 0; off /= 2)
		v += __shfl_down_sync(0xffffffffu, v, off);
	unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	if (lane == 0)
		warp_sums[warp] = v;
	__syncthreads();
	unsigned total = 0;
	if (threadIdx.x == 0)
		for (unsigned w = 0; w < GS_CUDA_BLOCK_THREADS / 32; w++)
			total += warp_sums[w];
	return total;
}

template <int W>
__global__ void __launch_bounds__(GS_CUDA_BLOCK_THREADS)
pack_kernel(const gs_cuda_entry *entries, const gs_cuda_task *tasks, void *fusion,
	    gs_pack_params p, unsigned long long *clipped)
{
	const gs_cuda_task t = tasks[blockIdx.x];
	const gs_cuda_entry e = entries[t.entry];
	const float *src = reinterpret_cast<const float *>(e.ptr) + t.start;
	size_t base = e.offset + t.start;
	unsigned n = 0;
	for (unsigned i = threadIdx.x; i < t.count; i += blockDim.x) {
		float x = src[i];
		if (is_nan(x)) /* never clipped: NaN compares false */
			gs_ew_store(static_cast<gs_wire>(W), fusion, base + i, quiet(x));
		else
			n += gs_ew_pack_one(static_cast<gs_wire>(W), fusion, base + i, x, &p);
	}
	if (clipped) {
		n = block_sum(n);
		if (threadIdx.x == 0 && n)
			atomicAdd(clipped, static_cast<unsigned long long>(n));
	}
}

/* Thread 0 gets the block's sum of v, halved pairwise in a fixed order
 * (GS_CUDA_NORM_ORDER), never in the order threads happen to finish. */
__device__ double block_sum_fixed(double v)
{
	__shared__ double sums[GS_CUDA_BLOCK_THREADS];
	sums[threadIdx.x] = v;
	for (unsigned half = GS_CUDA_BLOCK_THREADS / 2; half > 0; half /= 2) {
		__syncthreads();
		if (threadIdx.x < half)
			sums[threadIdx.x] += sums[threadIdx.x + half];
	}
	return sums[0];
}

template <int W>
__global__ void __launch_bounds__(GS_CUDA_BLOCK_THREADS)
unpack_kernel(const gs_cuda_entry *entries, const gs_cuda_task *tasks, const void *fusion,
	      float postscale, unsigned long long *nonfinite, double *sumsq)
{
	const gs_cuda_task t = tasks[blockIdx.x];
	const gs_cuda_entry e = entries[t.entry];
	float *dst = reinterpret_cast<float *>(e.ptr) + t.start;
	size_t base = e.offset + t.start;
	unsigned n = 0;
	double sq = 0;
	for (unsigned i = threadIdx.x; i < t.count; i += blockDim.x) {
		float y = gs_ew_unpack_one(static_cast<gs_wire>(W), fusion, base + i, postscale);
		if (is_nan(y))
			y = quiet(gs_ew_load(static_cast<gs_wire>(W), fusion, base + i));
		dst[i] = y;
		n += gs_ew_nonfinite(y);
		sq += static_cast<double>(y) * static_cast<double>(y);
	}
	if (sumsq) {
		sq = block_sum_fixed(sq);
		if (threadIdx.x == 0)
			sumsq[blockIdx.x] = sq;
	}
	if (nonfinite) {
		n = block_sum(n);
		if (threadIdx.x == 0 && n)
			atomicAdd(nonfinite, static_cast<unsigned long long>(n));
	}
}

} // namespace

extern "C" cudaError_t gs_cuda_launch_pack(enum gs_wire w, const struct gs_cuda_entry *entries,
					   const struct gs_cuda_task *tasks, uint32_t ntasks,
					   void *fusion, struct gs_pack_params p,
					   unsigned long long *clipped, cudaStream_t s)
{
	if (ntasks == 0)
		return cudaSuccess;
	dim3 grid(ntasks), block(GS_CUDA_BLOCK_THREADS);
	switch (w) {
	case GS_WIRE_F16:
		pack_kernel<GS_WIRE_F16><<<grid, block, 0, s>>>(entries, tasks, fusion, p, clipped);
		break;
	case GS_WIRE_BF16:
		pack_kernel<GS_WIRE_BF16><<<grid, block, 0, s>>>(entries, tasks, fusion, p, clipped);
		break;
	case GS_WIRE_F32:
		pack_kernel<GS_WIRE_F32><<<grid, block, 0, s>>>(entries, tasks, fusion, p, clipped);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t gs_cuda_launch_unpack(enum gs_wire w, const struct gs_cuda_entry *entries,
					     const struct gs_cuda_task *tasks, uint32_t ntasks,
					     const void *fusion, float postscale,
					     unsigned long long *nonfinite, double *sumsq,
					     cudaStream_t s)
{
	if (ntasks == 0)
		return cudaSuccess;
	dim3 grid(ntasks), block(GS_CUDA_BLOCK_THREADS);
	switch (w) {
	case GS_WIRE_F16:
		unpack_kernel<GS_WIRE_F16><<<grid, block, 0, s>>>(entries, tasks, fusion, postscale, nonfinite,
								sumsq);
		break;
	case GS_WIRE_BF16:
		unpack_kernel<GS_WIRE_BF16><<<grid, block, 0, s>>>(entries, tasks, fusion, postscale, nonfinite,
								sumsq);
		break;
	case GS_WIRE_F32:
		unpack_kernel<GS_WIRE_F32><<<grid, block, 0, s>>>(entries, tasks, fusion, postscale, nonfinite,
								sumsq);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}
