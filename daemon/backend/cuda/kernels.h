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
 * memory; NULL: not counted). */
cudaError_t gs_cuda_launch_unpack(enum gs_wire w, const struct gs_cuda_entry *entries,
				  const struct gs_cuda_task *tasks, uint32_t ntasks,
				  const void *fusion, float postscale,
				  unsigned long long *nonfinite, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
