#include "backend/cuda/table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct gs_cuda_entry) == 24, "kernels.cu reads 24-byte entries");
_Static_assert(sizeof(struct gs_cuda_task) == 16, "kernels.cu reads 16-byte tasks");

static uint64_t tasks_of(uint64_t count)
{
	return (count + GS_CUDA_TASK_ELEMENTS - 1) / GS_CUDA_TASK_ELEMENTS;
}

static int reserve(void **arr, size_t *cap, size_t want, size_t size)
{
	if (want <= *cap)
		return 0;
	void *grown = realloc(*arr, want * size);
	if (!grown)
		return -ENOMEM;
	*arr = grown;
	*cap = want;
	return 0;
}

int gs_cuda_plan_bucket(struct gs_cuda_bucket_plan *bp, const struct gs_plan *p,
			const uint64_t *counts, uint32_t bucket, uint64_t fusion_elements)
{
	if (fusion_elements == 0)
		return -EINVAL;
	const struct gs_bucket *bk = &p->buckets[bucket];
	uint64_t nlaunches = (bk->elements + fusion_elements - 1) / fusion_elements;
	/* Every cut between launches splits at most one tensor in two. */
	size_t max_spans = bk->count + (nlaunches ? nlaunches - 1 : 0);
	if (reserve((void **)&bp->launches, &bp->launch_cap, nlaunches ? nlaunches : 1,
		    sizeof(*bp->launches)) < 0 ||
	    reserve((void **)&bp->spans, &bp->span_cap, max_spans ? max_spans : 1,
		    sizeof(*bp->spans)) < 0)
		return -ENOMEM;
	bp->nlaunches = 0;
	bp->nspans = 0;
	bp->table_bytes = 0;
	for (uint64_t start = 0; start < bk->elements; start += fusion_elements) {
		uint64_t len = gs_chunk_len(bk->elements, start, fusion_elements);
		struct gs_cuda_launch *l = &bp->launches[bp->nlaunches++];
		l->start = start;
		l->elements = len;
		l->first_span = bp->nspans;
		l->nspans = (uint32_t)gs_plan_chunk_spans(p, counts, bucket, start, len,
							  bp->spans + bp->nspans,
							  max_spans - bp->nspans);
		bp->nspans += l->nspans;
		uint64_t ntasks = 0;
		for (uint32_t s = 0; s < l->nspans; s++)
			ntasks += tasks_of(bp->spans[l->first_span + s].count);
		l->ntasks = (uint32_t)ntasks;
		l->table_offset = bp->table_bytes;
		bp->table_bytes = gs_cuda_tasks_offset(l) + ntasks * sizeof(struct gs_cuda_task);
		bp->table_bytes = (bp->table_bytes + GS_CUDA_TABLE_ALIGN - 1) &
				  ~(size_t)(GS_CUDA_TABLE_ALIGN - 1);
	}
	return 0;
}

void gs_cuda_bucket_plan_free(struct gs_cuda_bucket_plan *bp)
{
	free(bp->launches);
	free(bp->spans);
	memset(bp, 0, sizeof(*bp));
}

size_t gs_cuda_tasks_offset(const struct gs_cuda_launch *l)
{
	return l->table_offset + l->nspans * sizeof(struct gs_cuda_entry);
}

static void fill_launch(const struct gs_cuda_bucket_plan *bp, const struct gs_cuda_launch *l,
			float *const *tensors, char *table)
{
	struct gs_cuda_entry *entries = (struct gs_cuda_entry *)(table + l->table_offset);
	struct gs_cuda_task *tasks = (struct gs_cuda_task *)(table + gs_cuda_tasks_offset(l));
	uint64_t offset = 0;
	uint32_t t = 0;
	for (uint32_t e = 0; e < l->nspans; e++) {
		const struct gs_span *s = &bp->spans[l->first_span + e];
		entries[e].ptr = (uint64_t)(uintptr_t)tensors[s->tensor] + s->offset * sizeof(float);
		entries[e].offset = offset;
		entries[e].count = s->count;
		offset += s->count;
		for (uint64_t start = 0; start < s->count; start += GS_CUDA_TASK_ELEMENTS) {
			uint64_t n = s->count - start;
			tasks[t].entry = e;
			tasks[t].count = (uint32_t)(n < GS_CUDA_TASK_ELEMENTS ? n : GS_CUDA_TASK_ELEMENTS);
			tasks[t].start = start;
			t++;
		}
	}
}

void gs_cuda_fill_tables(const struct gs_cuda_bucket_plan *bp, float *const *tensors,
			 void *table)
{
	memset(table, 0, bp->table_bytes); /* the padding too: no stale bytes */
	for (uint32_t l = 0; l < bp->nlaunches; l++)
		fill_launch(bp, &bp->launches[l], tensors, table);
}

bool gs_cuda_skip_unproduced(const struct gs_cuda_bucket_plan *bp, const struct gs_cuda_launch *l,
			     const uint8_t *produced, void *table)
{
	if (!produced)
		return false;
	struct gs_cuda_task *tasks = (struct gs_cuda_task *)((char *)table + gs_cuda_tasks_offset(l));
	bool changed = false;
	for (uint32_t t = 0; t < l->ntasks; t++) {
		const struct gs_span *s = &bp->spans[l->first_span + tasks[t].entry];
		if (!produced[s->tensor] && tasks[t].count) {
			tasks[t].count = 0;
			changed = true;
		}
	}
	return changed;
}
