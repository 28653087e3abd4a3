/*
 * The bucket plan: which tensors are reduced together, and in what order.
 * It follows backward_and_update_half exactly (DESIGN.md): a tensor larger
 * than the threshold is reduced on its own, at once; smaller ones join the
 * pending group, which is reduced when its element count exceeds the
 * threshold (the crossing tensor included) and at the end. A large tensor
 * does not flush the pending group. Every rank must build the same plan.
 */
#ifndef GS_PLAN_H
#define GS_PLAN_H

#include <stddef.h>
#include <stdint.h>

struct gs_bucket {
	uint32_t first;    /* index of its first member in gs_plan.members */
	uint32_t count;    /* members */
	uint64_t elements; /* sum of the members' element counts */
};

struct gs_plan {
	struct gs_bucket *buckets; /* in launch order */
	uint32_t nbuckets;
	uint32_t *members;   /* tensor indices, bucket after bucket */
	uint32_t *bucket_of; /* tensor index -> bucket index */
	uint32_t ntensors;
	uint64_t largest_bucket; /* elements */
};

/* Builds the plan of n tensors with the given element counts (in
 * registration, i.e. backpropagation, order). Returns 0 or -ENOMEM;
 * an empty layout gives an empty plan. */
int gs_plan_build(const uint64_t *counts, uint32_t n, uint64_t threshold,
		  struct gs_plan *out);
void gs_plan_free(struct gs_plan *p);

/* The elements a fusion buffer must hold for plan p, when no chunk may
 * pass `fusion` elements (the job's fusion buffer setting): its largest
 * bucket, at most `fusion`. A buffer of the setting's size would hold
 * nothing more, since every chunk is cut at `fusion` whatever the buffer. */
uint64_t gs_plan_fusion_elements(const struct gs_plan *p, uint64_t fusion);
/* The elements a staging buffer must hold for plan p (a bucket larger
 * than one fusion buffer is kept whole there until all its chunks are
 * reduced): its largest bucket where that passes `fusion`, else 0. */
uint64_t gs_plan_staged_elements(const struct gs_plan *p, uint64_t fusion);

/* A piece of one tensor: elements [offset, offset + count). */
struct gs_span {
	uint32_t tensor;
	uint64_t offset;
	uint64_t count;
};

/* Elements in the chunk of a bucket of `total` elements that begins at
 * `start`, when chunks hold at most `chunk` (one fusion buffer). */
static inline uint64_t gs_chunk_len(uint64_t total, uint64_t start, uint64_t chunk)
{
	return total - start < chunk ? total - start : chunk;
}

/* Splits elements [start, start + len) of a bucket (its members laid end to
 * end) into spans. Writes at most max spans and returns how many it wrote;
 * a chunk touches at most bucket.count spans. */
size_t gs_plan_chunk_spans(const struct gs_plan *p, const uint64_t *counts,
			   uint32_t bucket, uint64_t start, uint64_t len,
			   struct gs_span *spans, size_t max);

#endif
