/*
 * The host backend's fusion and staging buffers: sized by the job's bucket
 * plan (size_buffers), their bytes taken from the node's budget first, and
 * made at the next bucket, on the worker thread.
 *
 * Each is anonymous memory of its own (mmap), not the allocator's: it is
 * zero already, so nothing fills it, and its pages are made only as a
 * pack first writes them, by the thread that packs. Unmapped, it goes back
 * to the system at once; from malloc, a buffer under the allocator's
 * threshold would stay in its arena after the job went, and the daemon's
 * resident size would stay at its high-water mark.
 */
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/fusion_budget.h"
#include "backend/host/host_private.h"
#include "errors.h"

static size_t page_rounded(uint64_t bytes)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	return (size_t)((bytes + page - 1) / page * page);
}

/* A lane of `elements`: the widest wire dtype, a status after every
 * slice a chunk of that length can have (a head, then slices of at least
 * HOST_SLICE_ELEMENTS: agree_slice refuses shorter ones), and the produced
 * counts of a bucket of `members` after the head's. */
static size_t lane_bytes(uint64_t elements, uint64_t members)
{
	uint64_t slices = elements / HOST_SLICE_ELEMENTS + 2;
	return page_rounded((elements + slices * GS_CHUNK_STATUS_ELEMENTS + members) *
			    sizeof(float));
}

/* The most members a bucket of the plan has. */
static uint64_t most_members(const struct gs_plan *p)
{
	uint64_t most = 0;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		if (p->buckets[b].count > most)
			most = p->buckets[b].count;
	return most;
}

static size_t staging_bytes(const struct host_backend *h, uint64_t elements)
{
	return page_rounded(elements * gs_wire_size(h->base.wire));
}

static char *map_buffer(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void unmap_buffer(char **p, size_t bytes)
{
	if (*p)
		munmap(*p, bytes);
	*p = NULL;
}

int host_size_buffers(struct gs_backend *b, const struct gs_plan *p, char *err, size_t errlen)
{
	struct host_backend *h = (struct host_backend *)b;
	uint64_t elements = gs_plan_fusion_elements(p, b->fusion_elements);
	uint64_t staged = gs_plan_staged_elements(p, b->fusion_elements);
	/* The second lane packs the next bucket while one is exchanged with
	 * other nodes (overlap.c): a job of one node never has one. */
	unsigned lanes = h->overlap && h->job_nodes > 1 ? 2 : 1;
	uint64_t members = most_members(p);
	uint64_t bytes = lanes * (uint64_t)lane_bytes(elements, members) + staging_bytes(h, staged);
	int rc = gs_fusion_budget_resize(h->budget, &b->fusion_bytes, bytes, err, errlen);
	if (rc != GS_OK)
		return rc;
	h->want_elements = elements;
	h->want_staging = staged;
	h->want_members = members;
	h->want_lanes = lanes;
	return GS_OK;
}

char *host_lane_buffer(const struct host_backend *h)
{
	return map_buffer(lane_bytes(h->lane_elements, h->lane_members));
}

static void unmap_lanes(struct host_backend *h)
{
	for (int i = 0; i < 2; i++)
		unmap_buffer(&h->lane[i].wire, lane_bytes(h->lane_elements, h->lane_members));
}

int host_fit_buffers(struct host_backend *h)
{
	struct gs_backend *b = &h->base;
	if (h->want_elements == 0) {
		snprintf(b->error, sizeof(b->error), "the job's fusion buffers were never sized (no bucket plan)");
		return GS_ESTATE;
	}
	if (h->lane_elements != h->want_elements || h->lane_members != h->want_members) {
		host_drop_lanes(h);
		unmap_lanes(h);
		h->lane_elements = h->want_elements;
		h->lane_members = h->want_members;
	}
	if (h->staging && h->staging_elements != h->want_staging) {
		unmap_buffer(&h->staging, staging_bytes(h, h->staging_elements));
		h->staging_elements = 0;
	}
	if (!h->lane[0].wire)
		h->lane[0].wire = host_lane_buffer(h);
	if (!h->lane[0].wire) {
		snprintf(b->error, sizeof(b->error), "out of memory for the fusion buffer (%zu bytes)",
			 lane_bytes(h->lane_elements, h->lane_members));
		return GS_ENOMEM;
	}
	return GS_OK;
}

int host_ensure_staging(struct host_backend *h, uint64_t elements)
{
	if (elements <= h->staging_elements)
		return GS_OK;
	/* The plan's largest staged bucket at once, so that it is made once. */
	if (elements < h->want_staging)
		elements = h->want_staging;
	unmap_buffer(&h->staging, staging_bytes(h, h->staging_elements));
	h->staging_elements = 0;
	h->staging = map_buffer(staging_bytes(h, elements));
	if (!h->staging)
		return GS_ENOMEM;
	h->staging_elements = elements;
	return GS_OK;
}

void host_free_buffers(struct host_backend *h)
{
	unmap_lanes(h);
	unmap_buffer(&h->staging, staging_bytes(h, h->staging_elements));
	char why[8];
	gs_fusion_budget_resize(h->budget, &h->base.fusion_bytes, 0, why, sizeof(why));
}
