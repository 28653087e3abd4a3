/*
 * The host backend: gradients in sealed memfd shared memory, reduced by the
 * CPU's conversion kernels a bucket at a time on the worker thread. Each
 * chunk of a bucket (at most one fusion buffer) goes in three phases:
 *
 *   pack+sum: every local trainer's fp32 spans clipped, scaled, rounded to
 *     the wire dtype and summed (fp32, one rounding) into the one fusion
 *     buffer, in a single pass over the trainers' memory (gs_pack_sum);
 *   all-reduce: that buffer across nodes with Gloo, when there are several,
 *     in pipeline slices (see below), each followed by its
 *     status (chunk_status.h): whether some node lost a trainer's memory
 *     while it packed, and, in the bucket's first slice, the nodes' vote
 *     to go on with the step;
 *   unpack: widened, scaled and written into every trainer's spans.
 *
 * With several nodes a chunk of several slices is pipelined: the comm
 * thread all-reduces slice k while slice k + 1 is packed, so the
 * conversion hides behind the link. A bucket's first chunk begins with a
 * short head that carries the vote: its all-reduce alone waits for the
 * other nodes' trainers (--step-timeout), the rest is packed meanwhile and
 * goes with --peer-timeout, so a peer lost mid-bucket shows within that.
 * Slices after the head need a CPU to spare: the all-reduce's TCP copies
 * and wake-ups run on the CPU the pack holds, and each further all-reduce
 * costs a round trip. So node 0 offers the slice at join_group,
 * HOST_PIPE_SLICE_ELEMENTS where it may use two CPUs or more, else none
 * (the rest of a chunk goes in one all-reduce), and every node cuts alike.
 * The threads claim a slice in pieces (HOST_SLICE_ELEMENTS), so that a
 * node of several trainers packs it on several threads. The unpack waits for every slice: a
 * peer lost, a vote to abort or a lost pack at any slice stops the bucket
 * on every node at the same slice (the status is a sum every node reads),
 * and no tensor of it has been written. A bucket of one slice (the small
 * ones) goes as it did without the pipeline, on the worker thread alone.
 * Buckets overlap too: while bucket b is exchanged on the comm thread, the
 * next one, where the engine has it queued, is packed into a second lane
 * and its all-reduce queued behind b's; b is unpacked while it goes
 * (overlap.c). The engine still tells the trainers a bucket is done when
 * its reduce_bucket returns, so b's unpack never waits behind b + 1's
 * all-reduce.
 *
 * A bucket larger than one fusion buffer is staged: every chunk is packed
 * and all-reduced first, its result kept in a staging buffer, and only
 * when all chunks are through is the bucket unpacked. A peer lost between
 * two chunks, or a trainer's pages vanishing under a chunk's pack (on one
 * node as on several), then leaves the whole bucket holding the trainers'
 * own gradients, never part reduced (DESIGN.md, failure model). The
 * staging buffer holds the largest such bucket in the wire dtype.
 *
 * How the threads share a phase is told in slices.c, the comm thread in
 * comm.c; host_private.h lists the files.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/chunk_status.h"
#include "backend/gloo/gloo_comm.h"
#include "backend/host/host_private.h"
#include "backend/host/shm.h"
#include "backend/host/shm_guard.h"
#include "errors.h"
#include "number.h"

static struct host_backend *host(struct gs_backend *b)
{
	return (struct host_backend *)b;
}

static int host_import(struct gs_backend *b, const struct gs_buffer_desc *desc,
		       void **addr, char *err, size_t errlen)
{
	if (desc->kind != GS_BUFFER_MEMFD) {
		snprintf(err, errlen, "it is CUDA device memory, but this gradsyncd runs the host backend, which reduces shared memory (see --backend)");
		return GS_EBUFFER;
	}
	return gs_shm_map(desc->fd, desc->size, host(b)->allow_hugetlb, addr, err, errlen);
}

static void host_release(struct gs_backend *b, void *addr, uint64_t size)
{
	gs_shm_unmap(addr, size);
}

/* ---- A bucket ----------------------------------------------------------- */

/* The cut of a chunk of len elements of bucket `bucket`: with the nodes'
 * vote, its head is short, so that its all-reduce, which waits for every
 * node's trainers (the vote's timeout), carries little and the rest of the
 * chunk goes with --peer-timeout; the head's status carries the bucket's
 * produced counts too. */
static struct host_cut chunk_cut(const struct host_backend *h, uint64_t len, bool vote,
				 const struct gs_bucket_io *io)
{
	uint64_t members = io->plan->buckets[io->bucket].count;
	return (struct host_cut){ len, vote ? HOST_HEAD_ELEMENTS : 0, h->pslice,
				  vote ? members : 0 };
}

int host_ensure_span_room(struct host_backend *h, size_t members)
{
	if (members <= h->span_room)
		return GS_OK;
	for (unsigned t = 0; t < HOST_MAX_THREADS; t++) {
		struct gs_span *s = realloc(h->thread[t].spans, members * sizeof(*s));
		if (!s)
			return GS_ENOMEM;
		h->thread[t].spans = s;
	}
	h->span_room = members;
	return GS_OK;
}

/* The first local rank with a tensor of the bucket in memory that lost
 * its pages (shm_guard.h), or -1. Such memory reads as zeros now: a sum
 * of it must not reach anyone's tensors. */
static int lost_rank(const struct gs_bucket_io *io)
{
	if (gs_shm_guard_lost_ranges() == 0)
		return -1;
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	for (unsigned r = 0; r < io->nranks; r++)
		for (uint32_t m = 0; m < bk->count; m++)
			if (gs_shm_guard_lost(io->tensors[r][io->plan->members[bk->first + m]]))
				return (int)r;
	return -1;
}

static void note_lost(const struct gs_bucket_io *io, int rank)
{
	if (rank >= 0 && io->lost)
		*io->lost = true;
}

/* Slice k of the pack+sum in h->phase is done (by whichever thread): its
 * status goes after it (the vote's, the produced counts too), and, in a
 * pipeline, the comm thread may take it. */
void host_slice_packed(struct host_backend *h, uint32_t k)
{
	const struct host_phase *ph = &h->phase;
	size_t esize = gs_wire_size(h->base.wire);
	char *tail = host_cut_at(h, &ph->cut, ph->wire, ph->gap, k) +
		     host_cut_len(&ph->cut, k) * esize;
	gs_chunk_status_put(h->base.wire, tail, h->node_rank, lost_rank(ph->io),
			    k == 0 ? ph->vote : NULL);
	if (k == 0 && ph->cut.extra)
		gs_chunk_produced_put(h->base.wire, tail + GS_CHUNK_STATUS_ELEMENTS * esize,
				      ph->io->plan, ph->io->bucket, ph->io->produced);
	if (!ph->feed)
		return;
	pthread_mutex_lock(&h->comm.lock);
	ph->lane->packed[k] = 1;
	pthread_cond_signal(&h->comm.wake);
	pthread_mutex_unlock(&h->comm.lock);
}

/* What stopped a chunk, for the caller: the vote's sum, or why no node
 * unpacks the bucket. */
static int chunk_result(struct host_backend *h, const struct gs_bucket_io *io, int rc,
			const struct gs_chunk_status *st)
{
	if (rc == GS_EABORTED && st->vote.aborts && io->vote)
		*io->vote = st->vote;
	else if (rc == GS_EBUFFER)
		gs_chunk_status_describe(st, io->bucket, h->base.error, sizeof(h->base.error));
	return rc;
}

/* One chunk's pack+sum into the lane's buffer, slice by slice, each with
 * its status after it (the lane's cut). With feed, the comm thread
 * all-reduces each slice as soon as it is packed, while the next is
 * packed. */
void host_pack_chunk(struct host_backend *h, const struct gs_bucket_io *io, uint64_t start,
		     struct host_lane *lane, bool feed)
{
	const struct host_cut *cut = &lane->cut;
	uint32_t slices = host_cut_slices(cut);
	h->phase = (struct host_phase){ .io = io, .start = start, .len = cut->len,
					.wire = lane->wire,
					.gap = h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0,
					.cut = *cut, .sliced = h->gloo && slices > 1, .feed = feed,
					.vote = start == 0 ? io->vote : NULL, .lane = lane,
					.in_pieces = h->one_cpu && lane->token };
	gs_io_mark(io, GS_MARK_PACK, start, cut->len);
	if (feed)
		host_comm_give(h, lane);
	host_run_phase(h);
	if (h->gloo && slices == 1)
		host_slice_packed(h, 0);
	lane->lost = lost_rank(io);
	note_lost(io, lane->lost);
	gs_io_mark(io, GS_MARK_ALLREDUCE, start, cut->len);
}

/* Which of the bucket's tensors any node produced, from the summed counts
 * after the lane's head status (a chunk that carried the vote). */
static void read_produced(struct host_backend *h, const struct gs_bucket_io *io,
			  const struct host_lane *lane)
{
	if (!lane->cut.extra || !io->produced)
		return;
	size_t esize = gs_wire_size(h->base.wire);
	const char *at = host_cut_at(h, &lane->cut, lane->wire, GS_CHUNK_STATUS_ELEMENTS, 0) +
			 (host_cut_len(&lane->cut, 0) + GS_CHUNK_STATUS_ELEMENTS) * esize;
	gs_chunk_produced_get(h->base.wire, at, io->plan, io->bucket, io->produced);
}

/* The packed chunk in the lane across nodes: waited for on the comm
 * thread (fed), or all-reduced here slice by slice. */
static int exchange_chunk(struct host_backend *h, const struct gs_bucket_io *io,
			  struct host_lane *lane, bool fed)
{
	struct gs_chunk_status st = { 0 };
	if (!h->gloo) { /* alone, this node's status is the sum */
		st = (struct gs_chunk_status){ lane->lost >= 0, h->node_rank, (uint32_t)lane->lost,
					       { 0 } };
		return chunk_result(h, io, lane->lost >= 0 ? GS_EBUFFER : GS_OK, &st);
	}
	int rc = GS_OK;
	if (fed) {
		host_comm_wait(h, lane, false, -1);
		rc = lane->rc;
		st = lane->status;
	}
	for (uint32_t k = 0; !fed && k < host_cut_slices(&lane->cut) && rc == GS_OK; k++)
		rc = host_reduce_slice(h, lane->wire, &lane->cut, k,
				       k == 0 ? lane->first_timeout_ms : h->gloo_timeout_ms, &st);
	if (rc == GS_OK)
		read_produced(h, io, lane);
	return chunk_result(h, io, rc, &st);
}

/* Sets the lane up for a chunk of the bucket from start, len elements
 * long: its cut, and its first slice's wait; held, not packed early. */
void host_lane_for(struct host_backend *h, struct host_lane *lane,
		     const struct gs_bucket_io *io, uint64_t start, uint64_t len)
{
	bool vote = start == 0 && io->vote;
	lane->cut = chunk_cut(h, len, vote, io);
	lane->first_timeout_ms = vote ? io->vote_timeout_ms : h->gloo_timeout_ms;
	lane->held = true;
	lane->token = 0;
	lane->after = NULL;
}

/* A node that aborts the step has no tensors to reduce: it takes part in
 * the bucket's first all-reduce only, the same number of elements as every
 * other node's first slice, with zeros, its vote and no tensor produced. */
static int vote_only(struct host_backend *h, const struct gs_bucket_io *io)
{
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	struct host_cut cut = chunk_cut(h, gs_chunk_len(bk->elements, 0, h->base.fusion_elements),
					true, io);
	uint64_t n = host_cut_len(&cut, 0);
	size_t esize = gs_wire_size(h->base.wire);
	char *wire = h->lane[0].wire;
	memset(wire, 0, (n + GS_CHUNK_STATUS_ELEMENTS + cut.extra) * esize);
	gs_chunk_status_put(h->base.wire, wire + n * esize, h->node_rank, -1, io->vote);
	struct gs_chunk_status st = { 0 };
	int rc = host_reduce_slice(h, wire, &cut, 0, io->vote_timeout_ms, &st);
	return chunk_result(h, io, rc, &st);
}

/* Copies a reduced chunk's slices, without their statuses, to dst. */
static void copy_slices(struct host_backend *h, char *dst, const struct host_lane *lane,
			uint64_t gap)
{
	size_t esize = gs_wire_size(h->base.wire);
	const struct host_cut *cut = &lane->cut;
	for (uint32_t k = 0; k < host_cut_slices(cut); k++) {
		uint64_t n = host_cut_len(cut, k);
		memcpy(dst, host_cut_at(h, cut, lane->wire, gap, k), n * esize);
		dst += n * esize;
	}
}

/* Unpacks a chunk from wire, cut as it was reduced (gap 0: a staged
 * bucket's chunk, contiguous). */
static void unpack_chunk(struct host_backend *h, const struct gs_bucket_io *io, uint64_t start,
			 const struct host_cut *cut, char *wire, uint64_t gap)
{
	/* A lane with a token holds the next bucket, packed early: its
	 * exchange goes on beside this unpack. */
	bool beside = h->lane[0].token || h->lane[1].token;
	size_t nblocks = (size_t)((cut->len + GS_NORM_BLOCK - 1) / GS_NORM_BLOCK);
	h->phase = (struct host_phase){ .io = io, .start = start, .len = cut->len, .unpack = true,
					.wire = wire, .gap = gap, .cut = *cut,
					.sliced = gap && host_cut_slices(cut) > 1,
					.blocks = io->sumsq ? h->norm_blocks : NULL,
					.in_pieces = h->one_cpu && beside };
	if (io->sumsq)
		memset(h->norm_blocks, 0, nblocks * sizeof(double));
	host_run_phase(h);
	/* The chunk's blocks in order, then the chunks in order. */
	double sum = 0;
	for (size_t k = 0; io->sumsq && k < nblocks; k++)
		sum += h->norm_blocks[k];
	if (io->sumsq)
		*io->sumsq += sum;
}

/* Room for the sums of squares of a chunk of the bucket's unpack: its
 * length at most the bucket's or a fusion buffer's. GS_OK or GS_ENOMEM. */
static int ensure_norm_blocks(struct host_backend *h, const struct gs_bucket_io *io)
{
	uint64_t elements = io->plan->buckets[io->bucket].elements;
	if (elements > h->base.fusion_elements)
		elements = h->base.fusion_elements;
	size_t want = (size_t)((elements + GS_NORM_BLOCK - 1) / GS_NORM_BLOCK);
	if (!io->sumsq || want <= h->max_norm_blocks)
		return GS_OK;
	double *blocks = realloc(h->norm_blocks, want * sizeof(double));
	if (!blocks)
		return GS_ENOMEM;
	h->norm_blocks = blocks;
	h->max_norm_blocks = want;
	return GS_OK;
}

static int check_bucket(struct host_backend *h, const struct gs_bucket_io *io, bool staged)
{
	struct gs_backend *b = &h->base;
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	if (io->nranks == 0 || io->nranks > GS_PACK_SUM_MAX_SOURCES) {
		snprintf(b->error, sizeof(b->error), "%u local ranks", io->nranks);
		return GS_EINVAL;
	}
	if (host_ensure_span_room(h, bk->count) != GS_OK || ensure_norm_blocks(h, io) != GS_OK ||
	    (staged && host_ensure_staging(h, bk->elements) != GS_OK)) {
		snprintf(b->error, sizeof(b->error), "out of memory for bucket %u (%llu elements)",
			 io->bucket, (unsigned long long)bk->elements);
		return GS_ENOMEM;
	}
	return GS_OK;
}

/* A bucket of one chunk, packed early into `lane` while the bucket before
 * it was exchanged (overlap.c), or now (lane NULL). While it is exchanged
 * on the comm thread, the next bucket is packed; the chunk is unpacked
 * once all its slices are reduced. */
static int reduce_unstaged(struct host_backend *h, const struct gs_bucket_io *io,
			   struct host_lane *lane)
{
	uint64_t len = io->plan->buckets[io->bucket].elements;
	bool overlap = h->overlap && io->next && len >= HOST_OVERLAP_MIN_ELEMENTS;
	bool fed = lane != NULL;
	if (lane) {
		lane->token = 0; /* found: an early lane now only while the next's */
		for (unsigned r = 0; r < io->nranks; r++)
			io->clipped[r] += lane->clipped[r];
		note_lost(io, lane->lost);
	} else {
		lane = &h->lane[0];
		host_lane_for(h, lane, io, 0, len);
		fed = h->gloo && (host_cut_slices(&lane->cut) > 1 || overlap) && host_comm_start(h);
		host_pack_chunk(h, io, 0, lane, fed);
		host_take_clipped(h, io->nranks, io->clipped);
	}
	if (fed && overlap)
		host_pack_next_meanwhile(h, io, lane);
	int rc = exchange_chunk(h, io, lane, fed);
	if (rc == GS_OK) {
		gs_io_mark(io, GS_MARK_UNPACK, 0, len);
		unpack_chunk(h, io, 0, &lane->cut, lane->wire, h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0);
		gs_io_mark(io, GS_MARK_DONE, 0, len);
	}
	lane->held = false;
	return rc;
}

/* A bucket larger than the fusion buffer, chunk by chunk into the staging
 * buffer (the top comment), then unpacked from there. */
static int reduce_staged(struct host_backend *h, const struct gs_bucket_io *io)
{
	struct gs_backend *b = &h->base;
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	size_t esize = gs_wire_size(b->wire);
	struct host_lane *lane = &h->lane[0];
	int rc = GS_OK;
	for (uint64_t start = 0; start < bk->elements; start += b->fusion_elements) {
		uint64_t len = gs_chunk_len(bk->elements, start, b->fusion_elements);
		host_lane_for(h, lane, io, start, len);
		bool fed = h->gloo && host_cut_slices(&lane->cut) > 1 && host_comm_start(h);
		host_pack_chunk(h, io, start, lane, fed);
		rc = exchange_chunk(h, io, lane, fed);
		if (rc != GS_OK)
			break;
		gs_io_mark(io, GS_MARK_UNPACK, start, len);
		copy_slices(h, h->staging + start * esize, lane, h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0);
		gs_io_mark(io, GS_MARK_DONE, start, len);
	}
	lane->held = false;
	for (uint64_t start = 0; rc == GS_OK && start < bk->elements; start += b->fusion_elements) {
		/* Contiguous in the staging buffer: one slice. */
		struct host_cut whole = { gs_chunk_len(bk->elements, start, b->fusion_elements), 0,
					  b->fusion_elements, 0 };
		unpack_chunk(h, io, start, &whole, h->staging + start * esize, 0);
	}
	return rc;
}

/* A failed all-reduce, a lost pack or a vote to abort stops the bucket
 * before any of it is unpacked. Pages that vanish during the unpack take
 * only their trainer's results (the guard put anonymous memory there); the
 * caller drops that trainer. */
static int host_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct host_backend *h = host(b);
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	bool staged = bk->elements > b->fusion_elements;
	if (io->vote && !h->gloo) {
		snprintf(b->error, sizeof(b->error), "no group of nodes to vote in");
		return GS_ESTATE;
	}
	int rc = host_fit_buffers(h);
	if (rc != GS_OK)
		return rc;
	/* Whatever was packed early for a bucket that did not run goes. */
	struct host_lane *early = host_take_lane(h, io);
	if (io->vote && io->vote->aborts)
		return vote_only(h, io);
	rc = check_bucket(h, io, staged);
	if (rc != GS_OK) {
		host_drop_lanes(h);
		return rc;
	}
	for (unsigned t = 0; t < h->nthreads; t++)
		h->thread[t].nonfinite = 0;
	/* An empty bucket goes as one chunk, so that its vote goes. */
	rc = staged ? reduce_staged(h, io) : reduce_unstaged(h, io, early);
	if (rc == GS_OK)
		note_lost(io, lost_rank(io));
	host_take_clipped(h, io->nranks, io->clipped);
	for (unsigned t = 0; t < h->nthreads; t++)
		*io->nonfinite += h->thread[t].nonfinite;
	return rc;
}

void host_take_clipped(struct host_backend *h, unsigned nranks, uint64_t *clipped)
{
	for (unsigned t = 0; t < h->nthreads; t++)
		for (unsigned r = 0; r < nranks; r++) {
			clipped[r] += h->thread[t].clipped[r];
			h->thread[t].clipped[r] = 0;
		}
}

/* ---- The group ---------------------------------------------------------- */

#define SLICE_KEY "host/pipeline-slice"

/* The pipeline slice node 0 offers: HOST_PIPE_SLICE_ELEMENTS where it has a CPU
 * to spare for the comm thread, else 0 (a chunk is one slice). With one
 * CPU the pack cannot overlap the all-reduce, whose TCP copies and wake-ups
 * need that CPU too, and every further all-reduce costs a round trip. */
static uint64_t offered_slice(const struct host_backend *h)
{
	return h->one_cpu ? 0 : HOST_PIPE_SLICE_ELEMENTS;
}

/* Every node must cut its chunks alike, so node 0's choice goes to the
 * others through the group's store. Returns GS_OK or a GS_E* code with
 * err. */
static int agree_slice(struct host_backend *h, const struct gs_group_join *g, char *err,
		       size_t errlen)
{
	char text[24];
	uint64_t slice = offered_slice(h);
	if (!g->kv) /* no store: every node takes whole chunks */
		slice = 0;
	else if (g->node_rank == 0) {
		int n = snprintf(text, sizeof(text), "%llu", (unsigned long long)slice);
		int rc = g->kv->set(g->kv->ctx, SLICE_KEY, text, (size_t)n);
		if (rc != GS_OK) {
			snprintf(err, errlen, "offering the pipeline slice (store key %s) failed: %s",
				 SLICE_KEY, gs_error_desc(rc));
			return rc;
		}
	} else {
		void *value = NULL;
		size_t len = 0;
		int rc = g->kv->get(g->kv->ctx, SLICE_KEY, &value, &len, g->join_timeout_ms);
		if (rc != GS_OK) {
			snprintf(err, errlen, "node 0's pipeline slice (store key %s) did not come: %s",
				 SLICE_KEY, gs_error_desc(rc));
			return rc;
		}
		len = len < sizeof(text) - 1 ? len : sizeof(text) - 1;
		memcpy(text, value, len);
		text[len] = '\0';
		free(value);
		/* The fusion buffer has room for the statuses of slices this long. */
		/* Its slices start where the threads' claims do (host_private.h). */
		if (gs_parse_uint(text, 0, UINT64_MAX, &slice) < 0 ||
		    (slice && slice < HOST_SLICE_ELEMENTS) || slice % HOST_SLICE_ELEMENTS) {
			snprintf(err, errlen, "node 0 offers a pipeline slice of '%s' elements; 0 or a multiple of %u expected",
				 text, HOST_SLICE_ELEMENTS);
			return GS_EPROTO;
		}
	}
	h->pslice = slice && slice < h->base.fusion_elements ? slice : h->base.fusion_elements;
	return GS_OK;
}

/* From now on the all-reduce also sums across nodes through the group's
 * Gloo context (after the local reduce), waiting at most --peer-timeout,
 * in the pipeline slices node 0 chose. */
static int host_join_group(struct gs_backend *b, const struct gs_group_join *g, char *err,
			   size_t errlen)
{
	struct host_backend *h = host(b);
	host_drop_lanes(h);
	int rc = agree_slice(h, g, err, errlen);
	if (rc != GS_OK)
		return rc;
	h->gloo = g->gloo;
	h->gloo_timeout_ms = g->peer_timeout_ms;
	h->node_rank = g->node_rank;
	h->nodes = g->nodes;
	return GS_OK;
}

static void host_leave_group(struct gs_backend *b)
{
	struct host_backend *h = host(b);
	host_drop_lanes(h);
	h->gloo = NULL;
	h->gloo_timeout_ms = 0;
	h->node_rank = 0;
	h->nodes = 1;
}

uint64_t gs_backend_internode_bytes(const struct gs_backend *b)
{
	return atomic_load(&((struct gs_backend *)b)->internode_bytes);
}

uint64_t gs_backend_overlapped_buckets(const struct gs_backend *b)
{
	return atomic_load(&((struct gs_backend *)b)->overlapped_buckets);
}

static void host_destroy(struct gs_backend *b)
{
	struct host_backend *h = host(b);
	host_drop_lanes(h);
	host_stop_helpers(h);
	host_comm_stop(h);
	pthread_mutex_destroy(&h->comm.lock);
	pthread_cond_destroy(&h->comm.wake);
	pthread_cond_destroy(&h->comm.through);
	for (int i = 0; i < 2; i++)
		free(h->lane[i].packed);
	host_free_buffers(h);
	free(h->norm_blocks);
	free(h->left);
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->go);
	pthread_cond_destroy(&h->finished);
	for (unsigned t = 0; t < HOST_MAX_THREADS; t++)
		free(h->thread[t].spans);
	free(h);
}

/* A trainer's state is plain shared memory here. */
static int host_copy_bytes(struct gs_backend *b, void *dst, const void *src, uint64_t n)
{
	(void)b;
	memcpy(dst, src, n);
	return GS_OK;
}

/* Between nodes, a state's bytes go straight from and into the trainers'
 * shared memory through the group's Gloo broadcast: no staging. */
static int host_broadcast_bytes(struct gs_backend *b, void *buf, uint64_t n, uint32_t root)
{
	struct host_backend *h = host(b);
	if (!h->gloo) {
		snprintf(b->error, sizeof(b->error), "no group of nodes to broadcast in");
		return GS_ESTATE;
	}
	int rc = gs_gloo_broadcast(h->gloo, buf, n, (int)root, h->gloo_timeout_ms, b->error,
				   sizeof(b->error));
	if (rc == GS_OK && root == h->node_rank)
		atomic_fetch_add(&b->internode_bytes, n);
	return rc;
}

static const struct gs_backend_ops host_ops = {
	.size_buffers = host_size_buffers,
	.import_buffer = host_import,
	.release_buffer = host_release,
	.copy_bytes = host_copy_bytes,
	.broadcast_bytes = host_broadcast_bytes,
	.reduce_bucket = host_reduce_bucket,
	.join_group = host_join_group,
	.leave_group = host_leave_group,
	.destroy = host_destroy,
};

/* Whether to pack the next bucket while this one is exchanged: where the
 * process may use two CPUs or more. On one, the pack takes the CPU that
 * the exchange's TCP work and Gloo's threads need: on this project's
 * cluster bench it gained 4% where the link bound (2 Gbit/s) and lost
 * 5-7% where the CPU did (10 and 25 Gbit/s). GRADSYNCD_BUCKET_OVERLAP=1
 * or 0 decides instead, for benchmarks. */
static bool overlap_wanted(bool one_cpu)
{
	const char *env = getenv("GRADSYNCD_BUCKET_OVERLAP");
	if (env && strcmp(env, "1") == 0)
		return true;
	if (env && strcmp(env, "0") == 0)
		return false;
	return !one_cpu;
}

/* One thread per local trainer, as many as the CPUs allow, at most
 * HOST_MAX_THREADS. */
static unsigned thread_count(unsigned local_size)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = local_size;
	if (cpus > 0 && (unsigned long)cpus < n)
		n = (unsigned)cpus;
	return n < 1 ? 1 : n > HOST_MAX_THREADS ? HOST_MAX_THREADS : n;
}

struct gs_backend *gs_backend_host_create(const struct gs_host_options *o)
{
	unsigned local_size = o->local_size;
	uint64_t fusion_elements = o->fusion_elements;
	if (local_size == 0 || local_size > GS_PACK_SUM_MAX_SOURCES || fusion_elements == 0)
		return NULL;
	struct host_backend *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->base.name = "host";
	h->base.ops = &host_ops;
	h->base.local_size = local_size;
	h->base.wire = o->wire;
	h->base.fusion_elements = fusion_elements;
	h->base.votes_in_data = true;
	h->allow_hugetlb = o->allow_hugetlb;
	h->job_nodes = o->nodes;
	h->budget = o->budget;
	/* A slice is claimed by its index, below 2^20 (a fusion buffer past
	 * 2^38 elements takes longer slices). */
	h->claim_len = HOST_SLICE_ELEMENTS;
	while (fusion_elements / h->claim_len >= SLICE_MASK)
		h->claim_len *= 2;
	h->pslice = fusion_elements;
	h->nodes = 1;
	h->nthreads = 1;
	for (unsigned t = 0; t < HOST_MAX_THREADS; t++)
		h->thread[t] = (struct host_thread){ .h = h, .index = t };
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->go, NULL);
	pthread_cond_init(&h->finished, NULL);
	pthread_mutex_init(&h->comm.lock, NULL);
	pthread_cond_init(&h->comm.wake, NULL);
	pthread_cond_init(&h->comm.through, NULL);
	/* Slices of at least HOST_SLICE_ELEMENTS after a head (agree_slice
	 * refuses shorter ones). */
	h->max_slices = (uint32_t)(fusion_elements / HOST_SLICE_ELEMENTS + 2);
	h->lane[0].packed = calloc(h->max_slices, 1);
	h->lane[1].packed = calloc(h->max_slices, 1);
	h->left = calloc(h->max_slices, sizeof(*h->left));
	if (!h->lane[0].packed || !h->lane[1].packed || !h->left)
		goto err;
	/* One unless the process may be seen to use two or more. */
	cpu_set_t cpus;
	h->one_cpu = sched_getaffinity(0, sizeof(cpus), &cpus) != 0 || CPU_COUNT(&cpus) < 2;
	h->overlap = overlap_wanted(h->one_cpu);
	host_start_helpers(h, thread_count(local_size));
	return &h->base;
err:
	host_destroy(&h->base);
	return NULL;
}
