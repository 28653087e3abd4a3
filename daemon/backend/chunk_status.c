#include "backend/chunk_status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void gs_chunk_status_put(enum gs_wire w, void *tail, uint32_t node, int rank,
			 const struct gs_vote *vote)
{
	float v[GS_CHUNK_STATUS_ELEMENTS];
	memset(v, 0, sizeof(v));
	if (rank >= 0) {
		v[0] = 1;
		v[1] = (float)(node / 32);
		v[2] = (float)(node % 32);
		v[3] = (float)rank;
	}
	if (vote && vote->aborts) {
		v[4] = 1;
		v[5] = (float)(node / 32);
		v[6] = (float)(node % 32);
		v[7] = (float)vote->rank;
		v[8] = (float)vote->reason;
	}
	gs_pack(w, tail, v, GS_CHUNK_STATUS_ELEMENTS, NULL);
}

/* A summed count: anything but a clean zero is at least one, even what is
 * no count. */
static unsigned count_of(float v)
{
	if (v == 0)
		return 0;
	return v >= 1 && v <= 1024 ? (unsigned)lrintf(v) : GS_CHUNK_LOST_UNKNOWN;
}

void gs_chunk_status_get(enum gs_wire w, const void *tail, struct gs_chunk_status *out)
{
	float v[GS_CHUNK_STATUS_ELEMENTS];
	float *dst = v;
	gs_unpack(w, &dst, 1, tail, GS_CHUNK_STATUS_ELEMENTS, 1.0f);
	memset(out, 0, sizeof(*out));
	out->lost_nodes = count_of(v[0]);
	if (out->lost_nodes == 1) {
		out->node = (uint32_t)lrintf(v[1]) * 32 + (uint32_t)lrintf(v[2]);
		out->rank = (uint32_t)lrintf(v[3]);
	}
	out->vote.aborts = count_of(v[4]);
	if (out->vote.aborts == 1) {
		out->vote.node = (uint32_t)lrintf(v[5]) * 32 + (uint32_t)lrintf(v[6]);
		out->vote.rank = (uint32_t)lrintf(v[7]);
		out->vote.reason = (uint32_t)lrintf(v[8]);
	}
}

/* Members converted at a time, on the stack. */
#define PRODUCED_BATCH 256

void gs_chunk_produced_put(enum gs_wire w, void *at, const struct gs_plan *p, uint32_t bucket,
			   const uint8_t *produced)
{
	const struct gs_bucket *bk = &p->buckets[bucket];
	float v[PRODUCED_BATCH];
	char *dst = at;
	for (uint32_t done = 0; done < bk->count;) {
		uint32_t n = bk->count - done < PRODUCED_BATCH ? bk->count - done : PRODUCED_BATCH;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t t = p->members[bk->first + done + i];
			v[i] = !produced || produced[t] ? 1.0f : 0.0f;
		}
		gs_pack(w, dst, v, n, NULL);
		dst += n * gs_wire_size(w);
		done += n;
	}
}

void gs_chunk_produced_get(enum gs_wire w, const void *at, const struct gs_plan *p,
			   uint32_t bucket, uint8_t *produced)
{
	const struct gs_bucket *bk = &p->buckets[bucket];
	float v[PRODUCED_BATCH];
	float *dst = v;
	const char *src = at;
	for (uint32_t done = 0; done < bk->count;) {
		uint32_t n = bk->count - done < PRODUCED_BATCH ? bk->count - done : PRODUCED_BATCH;
		gs_unpack(w, &dst, 1, src, n, 1.0f);
		for (uint32_t i = 0; i < n; i++)
			produced[p->members[bk->first + done + i]] = v[i] != 0.0f;
		src += n * gs_wire_size(w);
		done += n;
	}
}

bool gs_chunk_status_stops(const struct gs_chunk_status *s)
{
	return s->lost_nodes != 0 || s->vote.aborts != 0;
}

void gs_chunk_status_describe(const struct gs_chunk_status *s, uint32_t bucket, char *out,
			      size_t n)
{
	if (s->lost_nodes == 1)
		snprintf(out, n, "trainer local rank %u of node %u lost the pages of its shared memory while gradsyncd read it (SIGBUS); no node unpacked bucket %u",
			 s->rank, s->node, bucket);
	else if (s->lost_nodes == GS_CHUNK_LOST_UNKNOWN)
		snprintf(out, n, "a trainer's shared memory lost its pages while gradsyncd read it (SIGBUS), on a node the status does not name; no node unpacked bucket %u",
			 bucket);
	else
		snprintf(out, n, "trainers of %u nodes lost the pages of their shared memory while gradsyncd read them (SIGBUS); no node unpacked bucket %u",
			 s->lost_nodes, bucket);
}
