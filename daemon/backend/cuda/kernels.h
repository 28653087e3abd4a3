/*
 * The CUDA backend's kernels, callable from C: one launch packs a launch's
 * worth of a bucket (gather, clip, scale, round to the wire dtype) into the
 * fusion buffer, one unpacks it (widen, scale, count non-finite values,
 * scatter), both driven by the device tables of table.h. The per-element
 * arithmetic is elementwise.h's, as in the host kernels, so both backends
 * give the same bits.
 */
#ifndef GS_CUDA_KERNELS_H
#define GS_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/table.h"
#include "convert.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of both kernels. */
#define GS_CUDA_BLOCK_THREADS 256

/* Packs the entries' elements into fusion (wire dtype w) on stream s, one
 * block per task; adds the number of clipped elements to *clipped (device
 * memory; NULL: not counted). Returns the launch's cudaError_t. */
cudaError_t gs_cuda_launch_pack(enum gs_wire w, const struct gs_cuda_entry *entries,
				const struct gs_cuda_task *tasks, uint32_t ntasks,
				void *fusion, struct gs_pack_params p,
				unsigned long long *clipped, cudaStream_t s);

/* Writes widen(fusion[i]) * postscale back to the entries' elements on
 * stream s; adds the number of non-finite results to *nonfinite (device
 * memory; NULL: not counted). With sumsq (device memory, ntasks doubles;
 * NULL: none), block b writes sumsq[b], the sum of the squares of its
 * task's results in fp64, in a fixed order so that it is the same bits on
 * every GPU and run (GS_CUDA_NORM_ORDER). */
cudaError_t gs_cuda_launch_unpack(enum gs_wire w, const struct gs_cuda_entry *entries,
				  const struct gs_cuda_task *tasks, uint32_t ntasks,
				  const void *fusion, float postscale,
				  unsigned long long *nonfinite, double *sumsq, cudaStream_t s);

/*
 * GS_CUDA_NORM_ORDER, a task's sum of squares: thread j of the block adds
 * the squares (fp32 results widened to fp64, so exact) of elements j,
 * j + GS_CUDA_BLOCK_THREADS, ... in that order; then the threads' sums
 * are halved pairwise, j += j + 128 for j < 128, then j + 64, ..., j + 1.
 * An inf result makes it inf, a NaN NaN. The backend adds the tasks in
 * order (launch by launch), and tests/cuda-emu's kernels do the same.
 */

#ifdef __cplusplus
}
#endif

#endif
