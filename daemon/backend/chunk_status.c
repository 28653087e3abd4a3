#include "backend/chunk_status.h"

#include <math.h>
#include <stdio.h>

void gs_chunk_status_put(enum gs_wire w, void *tail, uint32_t node, int rank)
{
	float v[GS_CHUNK_STATUS_ELEMENTS] = { 0, 0, 0, 0 };
	if (rank >= 0) {
		v[0] = 1;
		v[1] = (float)(node / 32);
		v[2] = (float)(node % 32);
		v[3] = (float)rank;
	}
	gs_pack(w, tail, v, GS_CHUNK_STATUS_ELEMENTS, NULL);
}

void gs_chunk_status_get(enum gs_wire w, const void *tail, struct gs_chunk_status *out)
{
	float v[GS_CHUNK_STATUS_ELEMENTS];
	float *dst = v;
	gs_unpack(w, &dst, 1, tail, GS_CHUNK_STATUS_ELEMENTS, 1.0f);
	out->lost_nodes = 0;
	out->node = out->rank = 0;
	if (v[0] == 0)
		return;
	/* Anything but a clean zero is a loss, even what is no count. */
	out->lost_nodes = v[0] >= 1 && v[0] <= 1024 ? (unsigned)lrintf(v[0]) : GS_CHUNK_LOST_UNKNOWN;
	if (out->lost_nodes == 1) {
		out->node = (uint32_t)lrintf(v[1]) * 32 + (uint32_t)lrintf(v[2]);
		out->rank = (uint32_t)lrintf(v[3]);
	}
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
