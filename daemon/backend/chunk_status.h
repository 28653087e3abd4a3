/*
 * The status that rides at the end of every chunk's all-reduce in the host
 * backend: a few wire-dtype elements after the gradients, which each node
 * sets when a trainer's memory vanished while it packed the chunk (a SIGBUS
 * the fault guard caught, shm_guard.h). The sum tells every node, in the
 * same collective and so in lockstep, whether any node's pack is bad; then
 * no node unpacks the chunk's bucket. Every element is a small integer
 * (below 64), which fp16, bf16 and fp32 hold exactly, and a sum of them is
 * exact while it stays below 256 (bf16); past that, a nonzero count stays
 * nonzero, which is all the decision needs.
 */
#ifndef GS_CHUNK_STATUS_H
#define GS_CHUNK_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"

/* Elements after a chunk's gradients: lost (0 or 1), node rank / 32, node
 * rank % 32, local rank. */
#define GS_CHUNK_STATUS_ELEMENTS 4

#define GS_CHUNK_LOST_UNKNOWN 0xffffffffu /* lost, but the sum is no count */

struct gs_chunk_status {
	unsigned lost_nodes; /* nodes whose pack lost memory (0: the chunk is good) */
	uint32_t node, rank; /* which, when lost_nodes is 1 */
};

/* Writes this node's status to tail (GS_CHUNK_STATUS_ELEMENTS elements of
 * wire dtype w): lost local rank `rank` (rank < 0: nothing lost). */
void gs_chunk_status_put(enum gs_wire w, void *tail, uint32_t node, int rank);
/* Reads the summed status back. */
void gs_chunk_status_get(enum gs_wire w, const void *tail, struct gs_chunk_status *out);
/* Why bucket `bucket` was not unpacked, naming the node and local rank. */
void gs_chunk_status_describe(const struct gs_chunk_status *s, uint32_t bucket, char *out,
			      size_t n);

#endif
