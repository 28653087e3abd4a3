/*
 * The status that rides at the end of every all-reduce of the host
 * backend: a few wire-dtype elements after the gradients that say whether
 * the nodes go on with the bucket. Two things stop it:
 *
 *   a lost pack: a trainer's memory vanished while a node packed the
 *     slice (a SIGBUS the fault guard caught, shm_guard.h);
 *   a vote to abort the step (the engine's, carried in the bucket's first
 *     all-reduce instead of a collective of its own): a node whose step
 *     ended takes part in that one all-reduce with zeros and its vote.
 *
 * The sum tells every node, in the same collective and so in lockstep,
 * whether any node stops; then no node unpacks the bucket, and no node
 * issues another all-reduce of it. Every element is a small integer
 * (below 64), which fp16, bf16 and fp32 hold exactly, and a sum of them is
 * exact while it stays below 256 (bf16); past that, a nonzero count stays
 * nonzero, which is all the decision needs.
 *
 * The status that carries the vote (the head's, in a bucket's first
 * chunk) goes on with one element per member of the bucket, in plan
 * order: 1 where a trainer of the node produced that tensor this step
 * (gs_bucket_io.produced). Summed, it is nonzero where any node's trainer
 * did, and a sum of ones never rounds to zero in any wire dtype.
 */
#ifndef GS_CHUNK_STATUS_H
#define GS_CHUNK_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "convert.h"

/* Elements after the gradients: lost (0 or 1), its node rank / 32, node
 * rank % 32, local rank; then abort (0 or 1), its node rank / 32, node
 * rank % 32, local rank, reason. */
#define GS_CHUNK_STATUS_ELEMENTS 9

#define GS_CHUNK_LOST_UNKNOWN 0xffffffffu /* lost, but the sum is no count */

struct gs_chunk_status {
	unsigned lost_nodes; /* nodes whose pack lost memory (0: the pack is good) */
	uint32_t node, rank; /* which, when lost_nodes is 1 */
	struct gs_vote vote; /* the nodes' votes, summed */
};

/* Writes this node's status to tail (GS_CHUNK_STATUS_ELEMENTS elements of
 * wire dtype w): lost local rank `rank` (rank < 0: nothing lost), and its
 * vote (NULL or no aborts: go on). */
void gs_chunk_status_put(enum gs_wire w, void *tail, uint32_t node, int rank,
			 const struct gs_vote *vote);
/* Reads the summed status back. */
void gs_chunk_status_get(enum gs_wire w, const void *tail, struct gs_chunk_status *out);
/* Whether the summed status stops the bucket on every node. */
bool gs_chunk_status_stops(const struct gs_chunk_status *s);
/* Writes the bucket's produced counts (its member count of elements of
 * wire dtype w) to at: 1 for each member the node's trainers produced
 * (produced NULL: every member), else 0. */
void gs_chunk_produced_put(enum gs_wire w, void *at, const struct gs_plan *p, uint32_t bucket,
			   const uint8_t *produced);
/* Reads the summed counts back into produced, by tensor: whether any
 * node's trainer produced each member of the bucket. */
void gs_chunk_produced_get(enum gs_wire w, const void *at, const struct gs_plan *p,
			   uint32_t bucket, uint8_t *produced);
/* Why bucket `bucket` was not unpacked after a lost pack, naming the node
 * and local rank. (A vote's reason is the engine's to word.) */
void gs_chunk_status_describe(const struct gs_chunk_status *s, uint32_t bucket, char *out,
			      size_t n);

#endif
