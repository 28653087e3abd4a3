/*
 * The host backend's buckets overlapped: while bucket b is exchanged on the
 * comm thread, the worker packs bucket b + 1 into the other lane and gives
 * it to the comm thread behind b, so that b + 1's all-reduce starts as
 * soon as b's ends, and b is unpacked meanwhile. The engine offers b + 1
 * only when it is already queued to run next (gs_bucket_io.next), and it
 * then runs at once: reduce_bucket finds its lane by its token and goes
 * on from its exchange.
 *
 * Nothing of b + 1 reaches a trainer before its own reduce_bucket: the
 * pack only reads the trainers' gradients. Where b fails (a node lost, a
 * vote to abort, memory lost), the comm thread refuses b + 1 without an
 * all-reduce, as every node stops at b, and the engine does not run it;
 * its lane is dropped at the next bucket, or when the group changes.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/host/host_private.h"
#include "errors.h"

/* Whether the next bucket can be packed early: one chunk, tensors to
 * reduce, and the room for it (a second lane in the node's budget). */
static bool can_pack_early(struct host_backend *h, const struct gs_bucket_io *n,
			   struct host_lane *lane)
{
	const struct gs_bucket *bk = &n->plan->buckets[n->bucket];
	if (h->want_lanes < 2 || n->nranks == 0 || n->nranks > GS_PACK_SUM_MAX_SOURCES || (n->vote && n->vote->aborts) ||
	    bk->elements > h->base.fusion_elements)
		return false;
	if (host_ensure_span_room(h, bk->count) != GS_OK)
		return false;
	if (!lane->wire)
		lane->wire = host_lane_buffer(h);
	return lane->wire != NULL;
}

static void pack_early(struct host_backend *h, const struct gs_bucket_io *n,
		       struct host_lane *behind, struct host_lane *lane)
{
	host_lane_for(h, lane, n, 0, n->plan->buckets[n->bucket].elements);
	lane->token = n->token;
	lane->after = behind;
	memset(lane->clipped, 0, sizeof(lane->clipped));
	host_pack_chunk(h, n, 0, lane, true);
	host_take_clipped(h, n->nranks, lane->clipped);
	atomic_fetch_add(&h->base.overlapped_buckets, 1);
}

void host_pack_next_meanwhile(struct host_backend *h, const struct gs_bucket_io *io,
			      struct host_lane *lane)
{
	struct host_lane *other = &h->lane[lane == &h->lane[0] ? 1 : 0];
	if (other->held)
		return;
	/* On a node of one CPU the comm thread starts the exchange first:
	 * the pack then runs while it waits for the other nodes. */
	host_comm_wait(h, lane, true, -1);
	/* The next bucket may be queued while this one is exchanged. */
	do {
		const struct gs_bucket_io *n = io->next(io);
		if (n) {
			if (can_pack_early(h, n, other))
				pack_early(h, n, lane, other);
			return;
		}
	} while (!host_comm_wait(h, lane, false, HOST_NEXT_POLL_MS));
}

/* A held lane that is not io's: once the comm thread is through it (at
 * once where it was refused), it goes. */
static void drop_lane(struct host_backend *h, struct host_lane *lane)
{
	if (lane->token)
		host_comm_wait(h, lane, false, -1);
	lane->held = false;
	lane->token = 0;
}

struct host_lane *host_take_lane(struct host_backend *h, const struct gs_bucket_io *io)
{
	struct host_lane *found = NULL;
	for (int i = 0; i < 2; i++) {
		struct host_lane *lane = &h->lane[i];
		if (!lane->held)
			continue;
		bool mine = io->token && lane->token == io->token;
		if (mine) {
			pthread_mutex_lock(&h->comm.lock);
			mine = !lane->refused;
			pthread_mutex_unlock(&h->comm.lock);
		}
		if (mine)
			found = lane;
		else
			drop_lane(h, lane);
	}
	return found;
}

void host_drop_lanes(struct host_backend *h)
{
	for (int i = 0; i < 2; i++)
		if (h->lane[i].held)
			drop_lane(h, &h->lane[i]);
}
