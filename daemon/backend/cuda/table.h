/*
 * The work of the CUDA pack and unpack kernels, planned on the host. A
 * bucket is cut into launches that each fit the fusion buffer (one launch
 * when the bucket does), and each launch is described by a table the
 * kernels read from device memory: an entry per span (where the tensor's
 * elements are, where they go in the fusion buffer, how many), then a task
 * per thread block (which entry, which of its elements). Plain C, so the
 * layout is tested without a GPU; kernels.cu reads these same structs.
 */
#ifndef GS_CUDA_TABLE_H
#define GS_CUDA_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements one thread block handles at most. */
#define GS_CUDA_TASK_ELEMENTS 4096u
/* Each launch's table starts at a multiple of this many bytes. */
#define GS_CUDA_TABLE_ALIGN 16u

/* One span of one tensor: 24 bytes. */
struct gs_cuda_entry {
	uint64_t ptr;    /* device address of the span's first element (fp32) */
	uint64_t offset; /* its first element in the fusion buffer */
	uint64_t count;  /* elements */
};

/* One thread block's share of an entry: 16 bytes. */
struct gs_cuda_task {
	uint32_t entry;
	uint32_t count;  /* elements, at most GS_CUDA_TASK_ELEMENTS */
	uint64_t start;  /* first element within the entry */
};

struct gs_cuda_launch {
	uint64_t start;      /* first element of the bucket it covers */
	uint64_t elements;   /* at most the fusion buffer's */
	uint32_t first_span; /* into gs_cuda_bucket_plan.spans */
	uint32_t nspans;
	uint32_t ntasks;     /* thread blocks */
	size_t table_offset; /* bytes into the bucket's table: entries, then tasks */
};

/* A bucket's launches. Its arrays are kept and reused from bucket to
 * bucket; zero-initialise before first use. */
struct gs_cuda_bucket_plan {
	struct gs_cuda_launch *launches;
	uint32_t nlaunches;
	struct gs_span *spans;
	uint32_t nspans;
	size_t table_bytes; /* one rank's tables of every launch, back to back */
	size_t launch_cap, span_cap;
};

/* Plans bucket `bucket` of p (element counts `counts`) through fusion
 * buffers of fusion_elements. Returns 0 or -ENOMEM (-EINVAL for a zero
 * fusion size). */
int gs_cuda_plan_bucket(struct gs_cuda_bucket_plan *bp, const struct gs_plan *p,
			const uint64_t *counts, uint32_t bucket, uint64_t fusion_elements);
void gs_cuda_bucket_plan_free(struct gs_cuda_bucket_plan *bp);

/* Where launch l's tasks start in the bucket's table. */
size_t gs_cuda_tasks_offset(const struct gs_cuda_launch *l);

/* Writes one local rank's tables for every launch into table
 * (bp->table_bytes bytes); tensors are that rank's tensor base addresses
 * (device addresses), indexed by tensor. */
void gs_cuda_fill_tables(const struct gs_cuda_bucket_plan *bp, float *const *tensors,
			 void *table);

/* Takes the elements out of every task of launch l, in one rank's table
 * as gs_cuda_fill_tables wrote it, whose span is of a tensor no trainer
 * produced (produced, by tensor; NULL: all were), so that the unpack
 * kernel leaves those tensors as they are. Returns whether it changed a
 * task. */
bool gs_cuda_skip_unproduced(const struct gs_cuda_bucket_plan *bp, const struct gs_cuda_launch *l,
			     const uint8_t *produced, void *table);

#ifdef __cplusplus
}
#endif

#endif
