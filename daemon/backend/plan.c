#include "backend/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void add_bucket(struct gs_plan *p, uint32_t first, uint32_t count,
		       uint64_t elements)
{
	p->buckets[p->nbuckets++] = (struct gs_bucket){ first, count, elements };
	if (elements > p->largest_bucket)
		p->largest_bucket = elements;
}

/* Moves the pending group to the members array as one bucket. */
static void flush_group(struct gs_plan *p, uint32_t *nmembers,
			const uint32_t *group, uint32_t ngroup, uint64_t acc)
{
	if (ngroup == 0)
		return;
	memcpy(p->members + *nmembers, group, ngroup * sizeof(*group));
	add_bucket(p, *nmembers, ngroup, acc);
	*nmembers += ngroup;
}

int gs_plan_build(const uint64_t *counts, uint32_t n, uint64_t threshold,
		  struct gs_plan *out)
{
	memset(out, 0, sizeof(*out));
	/* Every bucket holds at least one tensor: n buckets at most. */
	size_t slots = n ? n : 1;
	out->buckets = calloc(slots, sizeof(*out->buckets));
	out->members = calloc(slots, sizeof(*out->members));
	out->bucket_of = calloc(slots, sizeof(*out->bucket_of));
	uint32_t *group = calloc(slots, sizeof(*group));
	if (!out->buckets || !out->members || !out->bucket_of || !group)
		goto err_alloc;
	out->ntensors = n;

	uint32_t nmembers = 0, ngroup = 0;
	uint64_t acc = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (counts[i] > threshold) {
			out->members[nmembers] = i;
			add_bucket(out, nmembers++, 1, counts[i]);
			continue;
		}
		group[ngroup++] = i;
		acc += counts[i];
		if (acc > threshold) {
			flush_group(out, &nmembers, group, ngroup, acc);
			ngroup = 0;
			acc = 0;
		}
	}
	flush_group(out, &nmembers, group, ngroup, acc);
	free(group);

	for (uint32_t b = 0; b < out->nbuckets; b++) {
		const struct gs_bucket *bk = &out->buckets[b];
		for (uint32_t m = 0; m < bk->count; m++)
			out->bucket_of[out->members[bk->first + m]] = b;
	}
	return 0;

err_alloc:
	free(group);
	gs_plan_free(out);
	return -ENOMEM;
}

void gs_plan_free(struct gs_plan *p)
{
	free(p->buckets);
	free(p->members);
	free(p->bucket_of);
	memset(p, 0, sizeof(*p));
}

uint64_t gs_plan_fusion_elements(const struct gs_plan *p, uint64_t fusion)
{
	return p->largest_bucket < fusion ? p->largest_bucket : fusion;
}

uint64_t gs_plan_staged_elements(const struct gs_plan *p, uint64_t fusion)
{
	return p->largest_bucket > fusion ? p->largest_bucket : 0;
}

size_t gs_plan_chunk_spans(const struct gs_plan *p, const uint64_t *counts,
			   uint32_t bucket, uint64_t start, uint64_t len,
			   struct gs_span *spans, size_t max)
{
	const struct gs_bucket *bk = &p->buckets[bucket];
	size_t n = 0;
	uint64_t pos = 0; /* bucket element where the current member starts */
	for (uint32_t m = 0; m < bk->count && len > 0 && n < max; m++) {
		uint32_t t = p->members[bk->first + m];
		uint64_t end = pos + counts[t];
		if (start < end) {
			uint64_t off = start - pos;
			uint64_t take = counts[t] - off;
			if (take > len)
				take = len;
			spans[n++] = (struct gs_span){ t, off, take };
			start += take;
			len -= take;
		}
		pos = end;
	}
	return n;
}
