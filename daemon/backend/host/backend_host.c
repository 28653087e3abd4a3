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
 * Buckets do not overlap one another: the engine hands one bucket at a
 * time and tells the trainers it is done when reduce_bucket returns, so
 * the unpack of bucket b cannot wait behind the all-reduce of b + 1.
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
#include "backend/host/host_private.h"
#include "backend/host/shm.h"
#include "backend/host/shm_guard.h"
#include "errors.h"

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

/* The cut of a chunk of len elements: with the nodes' vote, its head is
 * short, so that its all-reduce, which waits for every node's trainers
 * (the vote's timeout), carries little and the rest of the chunk goes with
 * --peer-timeout. */
static struct host_cut chunk_cut(const struct host_backend *h, uint64_t len, bool vote)
{
	return (struct host_cut){ len, vote ? HOST_HEAD_ELEMENTS : 0, h->pslice };
}

static int ensure_span_room(struct host_backend *h, size_t members)
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

static int ensure_staging(struct host_backend *h, uint64_t elements)
{
	if (elements <= h->staging_elements)
		return GS_OK;
	size_t bytes = (elements * gs_wire_size(h->base.wire) + 63) & ~(size_t)63;
	char *s = aligned_alloc(64, bytes);
	if (!s)
		return GS_ENOMEM;
	free(h->staging);
	h->staging = s;
	h->staging_elements = elements;
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
 * status goes after it, and, in a pipeline, the comm thread may take it. */
void host_slice_packed(struct host_backend *h, uint32_t k)
{
	const struct host_phase *ph = &h->phase;
	size_t esize = gs_wire_size(h->base.wire);
	char *tail = host_cut_at(h, &ph->cut, ph->wire, ph->gap, k) +
		     host_cut_len(&ph->cut, k) * esize;
	gs_chunk_status_put(h->base.wire, tail, h->node_rank, lost_rank(ph->io),
			    k == 0 ? ph->vote : NULL);
	if (!ph->feed)
		return;
	pthread_mutex_lock(&h->comm.lock);
	h->comm.packed[k] = 1;
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

/* One chunk's pack+sum into the fusion buffer and, with several nodes, its
 * all-reduce, slice by slice, each with its status after it. A chunk of
 * several slices is pipelined: the comm thread all-reduces each slice as
 * soon as it is packed while the next is packed. */
static int reduce_chunk(struct host_backend *h, const struct gs_bucket_io *io, uint64_t start,
			const struct host_cut *cut)
{
	uint64_t len = cut->len;
	uint32_t slices = host_cut_slices(cut);
	bool feed = h->gloo && slices > 1 && host_comm_start(h);
	int first_timeout = start == 0 && io->vote ? io->vote_timeout_ms : h->gloo_timeout_ms;
	h->phase = (struct host_phase){ .io = io, .start = start, .len = len, .wire = h->fusion,
					.gap = h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0,
					.cut = *cut, .sliced = h->gloo && slices > 1, .feed = feed,
					.vote = start == 0 ? io->vote : NULL };
	gs_io_mark(io, GS_MARK_PACK, start, len);
	if (feed)
		host_comm_give(h, h->fusion, cut, first_timeout);
	host_run_phase(h);
	if (h->gloo && slices == 1)
		host_slice_packed(h, 0);
	int lost = lost_rank(io);
	note_lost(io, lost);
	gs_io_mark(io, GS_MARK_ALLREDUCE, start, len);
	struct gs_chunk_status st = { 0 };
	if (!h->gloo) { /* alone, this node's status is the sum */
		st = (struct gs_chunk_status){ lost >= 0, h->node_rank, (uint32_t)lost, { 0 } };
		return chunk_result(h, io, lost >= 0 ? GS_EBUFFER : GS_OK, &st);
	}
	int rc = GS_OK;
	if (feed)
		rc = host_comm_wait(h, &st);
	for (uint32_t k = 0; !feed && k < slices && rc == GS_OK; k++)
		rc = host_reduce_slice(h, h->fusion, cut, k,
				       k == 0 ? first_timeout : h->gloo_timeout_ms, &st);
	return chunk_result(h, io, rc, &st);
}

/* A node that aborts the step has no tensors to reduce: it takes part in
 * the bucket's first all-reduce only, the same number of elements as every
 * other node's first slice, with zeros and its vote. */
static int vote_only(struct host_backend *h, const struct gs_bucket_io *io)
{
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	struct host_cut cut = chunk_cut(h, gs_chunk_len(bk->elements, 0, h->base.fusion_elements),
					true);
	uint64_t n = host_cut_len(&cut, 0);
	size_t esize = gs_wire_size(h->base.wire);
	memset(h->fusion, 0, n * esize);
	gs_chunk_status_put(h->base.wire, (char *)h->fusion + n * esize, h->node_rank, -1, io->vote);
	struct gs_chunk_status st = { 0 };
	int rc = host_reduce_slice(h, h->fusion, &cut, 0, io->vote_timeout_ms, &st);
	return chunk_result(h, io, rc, &st);
}

/* Copies a reduced chunk's slices, without their statuses, to dst. */
static void copy_slices(struct host_backend *h, char *dst, const struct host_cut *cut,
			uint64_t gap)
{
	size_t esize = gs_wire_size(h->base.wire);
	for (uint32_t k = 0; k < host_cut_slices(cut); k++) {
		uint64_t n = host_cut_len(cut, k);
		memcpy(dst, host_cut_at(h, cut, h->fusion, gap, k), n * esize);
		dst += n * esize;
	}
}

/* Unpacks a chunk from wire, cut as it was reduced (gap 0: a staged
 * bucket's chunk, contiguous). */
static void unpack_chunk(struct host_backend *h, const struct gs_bucket_io *io, uint64_t start,
			 const struct host_cut *cut, char *wire, uint64_t gap)
{
	h->phase = (struct host_phase){ .io = io, .start = start, .len = cut->len, .unpack = true,
					.wire = wire, .gap = gap, .cut = *cut,
					.sliced = gap && host_cut_slices(cut) > 1 };
	host_run_phase(h);
}

static int check_bucket(struct host_backend *h, const struct gs_bucket_io *io, bool staged)
{
	struct gs_backend *b = &h->base;
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	if (io->nranks == 0 || io->nranks > GS_PACK_SUM_MAX_SOURCES) {
		snprintf(b->error, sizeof(b->error), "%u local ranks", io->nranks);
		return GS_EINVAL;
	}
	if (ensure_span_room(h, bk->count) != GS_OK ||
	    (staged && ensure_staging(h, bk->elements) != GS_OK)) {
		snprintf(b->error, sizeof(b->error), "out of memory for bucket %u (%llu elements)",
			 io->bucket, (unsigned long long)bk->elements);
		return GS_ENOMEM;
	}
	return GS_OK;
}

/* Chunk by chunk; a failed all-reduce, a lost pack or a vote to abort
 * stops the bucket before any of it is unpacked. Unstaged (one chunk), the
 * chunk is unpacked once all its slices are reduced. Staged, a chunk's
 * "unpack" in the trace is its copy into the staging buffer, and the
 * unpack of the whole bucket follows the last chunk. Pages that vanish
 * during the unpack take only their trainer's results (the guard put
 * anonymous memory there); the caller drops that trainer. */
static int host_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct host_backend *h = host(b);
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	size_t esize = gs_wire_size(b->wire);
	bool staged = bk->elements > b->fusion_elements;
	uint64_t gap = h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0;
	if (io->vote && !h->gloo) {
		snprintf(b->error, sizeof(b->error), "no group of nodes to vote in");
		return GS_ESTATE;
	}
	if (io->vote && io->vote->aborts)
		return vote_only(h, io);
	int rc = check_bucket(h, io, staged);
	if (rc != GS_OK)
		return rc;
	for (unsigned t = 0; t < h->nthreads; t++) {
		memset(h->thread[t].clipped, 0, io->nranks * sizeof(uint64_t));
		h->thread[t].nonfinite = 0;
	}
	/* At least one chunk, so that a vote goes even in an empty bucket. */
	uint64_t start = 0;
	do {
		uint64_t len = gs_chunk_len(bk->elements, start, b->fusion_elements);
		struct host_cut cut = chunk_cut(h, len, start == 0 && io->vote);
		rc = reduce_chunk(h, io, start, &cut);
		if (rc != GS_OK)
			break;
		gs_io_mark(io, GS_MARK_UNPACK, start, len);
		if (staged)
			copy_slices(h, h->staging + start * esize, &cut, gap);
		else
			unpack_chunk(h, io, start, &cut, h->fusion, gap);
		gs_io_mark(io, GS_MARK_DONE, start, len);
		start += b->fusion_elements;
	} while (start < bk->elements);
	for (start = 0; staged && rc == GS_OK && start < bk->elements; start += b->fusion_elements) {
		/* Contiguous in the staging buffer: one slice. */
		struct host_cut whole = { gs_chunk_len(bk->elements, start, b->fusion_elements), 0,
					  b->fusion_elements };
		unpack_chunk(h, io, start, &whole, h->staging + start * esize, 0);
	}
	if (rc == GS_OK)
		note_lost(io, lost_rank(io));
	for (unsigned t = 0; t < h->nthreads; t++) {
		for (unsigned r = 0; r < io->nranks; r++)
			io->clipped[r] += h->thread[t].clipped[r];
		*io->nonfinite += h->thread[t].nonfinite;
	}
	return rc;
}

/* ---- The group ---------------------------------------------------------- */

#define SLICE_KEY "host/pipeline-slice"

/* The pipeline slice node 0 offers: HOST_PIPE_SLICE_ELEMENTS where it has a CPU
 * to spare for the comm thread, else 0 (a chunk is one slice). With one
 * CPU the pack cannot overlap the all-reduce, whose TCP copies and wake-ups
 * need that CPU too, and every further all-reduce costs a round trip. */
static uint64_t offered_slice(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < 2)
		return 0;
	return HOST_PIPE_SLICE_ELEMENTS;
}

/* Every node must cut its chunks alike, so node 0's choice goes to the
 * others through the group's store. Returns GS_OK or a GS_E* code with
 * err. */
static int agree_slice(struct host_backend *h, const struct gs_group_join *g, char *err,
		       size_t errlen)
{
	char text[24];
	uint64_t slice = offered_slice();
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
		char *end;
		slice = strtoull(text, &end, 10);
		/* The fusion buffer has room for the statuses of slices this long. */
		if (end == text || *end || (slice && slice < HOST_SLICE_ELEMENTS)) {
			snprintf(err, errlen, "node 0 offers a pipeline slice of '%s' elements; 0 or at least %u expected",
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
	h->gloo = NULL;
	h->gloo_timeout_ms = 0;
	h->node_rank = 0;
	h->nodes = 1;
}

uint64_t gs_backend_internode_bytes(const struct gs_backend *b)
{
	return atomic_load(&((struct gs_backend *)b)->internode_bytes);
}

static void host_destroy(struct gs_backend *b)
{
	struct host_backend *h = host(b);
	host_stop_helpers(h);
	host_comm_stop(h);
	pthread_mutex_destroy(&h->comm.lock);
	pthread_cond_destroy(&h->comm.wake);
	pthread_cond_destroy(&h->comm.through);
	free(h->comm.packed);
	free(h->left);
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->go);
	pthread_cond_destroy(&h->finished);
	for (unsigned t = 0; t < HOST_MAX_THREADS; t++)
		free(h->thread[t].spans);
	free(h->fusion);
	free(h->staging);
	free(h);
}

static const struct gs_backend_ops host_ops = {
	.import_buffer = host_import,
	.release_buffer = host_release,
	.reduce_bucket = host_reduce_bucket,
	.join_group = host_join_group,
	.leave_group = host_leave_group,
	.destroy = host_destroy,
};

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

struct gs_backend *gs_backend_host_create(unsigned local_size, enum gs_wire wire,
					  uint64_t fusion_elements, bool allow_hugetlb)
{
	if (local_size == 0 || local_size > GS_PACK_SUM_MAX_SOURCES)
		return NULL;
	struct host_backend *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->base.name = "host";
	h->base.ops = &host_ops;
	h->base.local_size = local_size;
	h->base.wire = wire;
	h->base.fusion_elements = fusion_elements;
	h->base.votes_in_data = true;
	h->allow_hugetlb = allow_hugetlb;
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
	h->comm.packed = calloc(h->max_slices, 1);
	h->left = calloc(h->max_slices, sizeof(*h->left));
	if (!h->comm.packed || !h->left)
		goto err;
	/* Sized for the widest wire dtype and a status after every slice,
	 * rounded to whole cache lines. */
	uint64_t statuses = (uint64_t)h->max_slices * GS_CHUNK_STATUS_ELEMENTS;
	size_t bytes = ((fusion_elements + statuses) * sizeof(float) + 63) & ~(size_t)63;
	h->fusion = aligned_alloc(64, bytes);
	if (!h->fusion)
		goto err;
	memset(h->fusion, 0, bytes);
	host_start_helpers(h, thread_count(local_size));
	return &h->base;
err:
	host_destroy(&h->base);
	return NULL;
}
