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
 * On a node of several trainers, the pack+sum and unpack phases of a large
 * chunk are cut into slices that up to one thread per local trainer (the
 * worker thread and helpers of this backend) claim one at a time: the
 * reduce does M times the memory traffic of one trainer, and the
 * trainers' own cores wait for it. Claiming, rather than a fixed share per
 * thread, keeps a thread the scheduler delays (other work on the machine)
 * from holding up the phase by more than one slice. Every element is
 * computed by the same kernels whichever thread does it, so the result
 * does not depend on the split.
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
#include "backend/host/shm.h"
#include "backend/host/shm_guard.h"
#include "errors.h"

/* Threads of one backend: the worker thread (0) and its helpers. */
#define HOST_MAX_THREADS 8
/* Elements of a slice: about 0.1 ms of work for two trainers here. */
#define HOST_SLICE_ELEMENTS 262144
/* Elements of a pipeline slice, as node 0 offers it: 2 MB of fp16, 17 ms
 * on a 1 Gbit/s link. Shorter slices measured slower here: every
 * all-reduce costs its round trips and wake-ups, which a loaded node pays
 * in milliseconds. */
#define HOST_PIPE_SLICE_ELEMENTS 1048576
/* The head of a bucket's first chunk, which carries the nodes' vote: short,
 * so that its all-reduce ends soon after the last node's trainers are
 * ready, while the rest of the chunk is packed. */
#define HOST_HEAD_ELEMENTS 16384

struct host_backend;

struct host_thread {
	struct host_backend *h;
	unsigned index;
	struct gs_span *spans; /* room for the largest bucket's members */
	/* Summed over the bucket's slices this thread did. */
	uint64_t clipped[GS_PACK_SUM_MAX_SOURCES];
	uint64_t nonfinite;
};

/* How a chunk of len elements is cut into pipeline slices: a head of
 * `head` elements first when it carries the nodes' vote (0: none), then
 * slices of `slice` elements. In the fusion buffer each slice is followed
 * by its status (gap elements). */
struct host_cut {
	uint64_t len, head, slice;
};

/* One phase of one chunk, written by the worker thread before it opens
 * the phase's slices to claims (and not changed until all are done). */
struct host_phase {
	const struct gs_bucket_io *io;
	uint64_t start, len; /* elements of the bucket */
	bool unpack;         /* unpack, or pack+sum */
	uint64_t slice;      /* elements per slice */
	char *wire;          /* the chunk's wire-dtype elements */
	/* With several nodes: status elements after every pipeline slice in
	 * wire (the phase's slices are then those), and, packing, this node's
	 * vote for slice 0's status (NULL: none); whether the chunk is several
	 * pipeline slices, the phase's slices then, and whether each packed
	 * slice goes to the comm thread at once. */
	uint64_t gap;
	struct host_cut cut;
	uint64_t unit; /* sliced: each slice is claimed in units of at most this */
	const struct gs_vote *vote;
	bool sliced, feed;
};

/* The communication thread: all-reduces a chunk's slices in order, each as
 * soon as it is packed, while the worker and helpers pack the next. Between
 * chunks it waits; reduce_bucket returns only when it does, so nothing
 * touches the group's Gloo context outside a bucket (join_group,
 * leave_group and the cluster's teardown find it idle). */
struct host_comm {
	pthread_t thread;
	bool started, stopping;
	pthread_mutex_t lock;
	pthread_cond_t wake;    /* for the comm thread: a chunk, a slice packed, stop */
	pthread_cond_t through; /* for the worker: the chunk is through */
	uint64_t given, finished; /* chunks handed over, and done with */
	char *wire;             /* the chunk: slices, each followed by its status */
	struct host_cut cut;
	uint32_t slices;
	uint8_t *packed;        /* [slice]: packed, its status written */
	int first_timeout_ms;   /* slice 0's wait: the vote's, in a bucket's first chunk */
	/* The chunk's result: GS_OK, or what stopped it (reduce_slice), and
	 * the summed status of its last slice all-reduced. */
	int rc;
	struct gs_chunk_status status;
};

struct host_backend {
	struct gs_backend base;
	/* fusion_elements elements of the widest wire dtype, and a chunk's
	 * status after them. */
	void *fusion;
	char *staging; /* staged buckets' results */
	uint64_t staging_elements;
	struct gs_gloo *gloo; /* the group of nodes (join_group); NULL: none */
	int gloo_timeout_ms;
	uint32_t node_rank, nodes;
	bool allow_hugetlb;
	uint64_t claim_len; /* elements of a slice the threads claim */
	/* Elements of a pipeline slice, as node 0 chose it at join_group
	 * (agree_slice); fusion_elements: a chunk is one slice. */
	uint64_t pslice;
	struct host_comm comm;
	/* [slice] of a sliced pack: its units not yet packed. Room for the
	 * most slices a chunk can have (max_slices). */
	_Atomic uint32_t *left;
	uint32_t max_slices;

	struct host_thread thread[HOST_MAX_THREADS];
	size_t span_room; /* spans each thread has room for */
	struct host_phase phase;
	/* The claim word: round (24 bits), slices (20), next slice (20). A
	 * slice is claimed by a compare-and-swap of next while the round is
	 * the one the claimer was woken for. */
	_Atomic uint64_t claim;
	_Atomic uint32_t done; /* slices of the round finished */
	uint32_t round;        /* worker thread only */

	unsigned nthreads;
	pthread_t helper[HOST_MAX_THREADS];
	pthread_mutex_t lock;
	pthread_cond_t go, finished;
	uint32_t go_round; /* under lock: the round helpers are woken for */
	bool stopping;
};

static struct host_backend *host(struct gs_backend *b)
{
	return (struct host_backend *)b;
}

/* Slices of a cut chunk (at least one), where slice k begins, and its
 * length. */
static uint32_t cut_slices(const struct host_cut *c)
{
	if (c->head && c->len > c->head)
		return 1 + (uint32_t)((c->len - c->head + c->slice - 1) / c->slice);
	return c->len <= c->slice ? 1 : (uint32_t)((c->len + c->slice - 1) / c->slice);
}

static uint64_t cut_first(const struct host_cut *c, uint32_t k)
{
	uint64_t first = c->head && c->len > c->head ? (k ? c->head + (k - 1) * c->slice : 0)
						       : k * c->slice;
	return first < c->len ? first : c->len;
}

static uint64_t cut_len(const struct host_cut *c, uint32_t k)
{
	return (k + 1 < cut_slices(c) ? cut_first(c, k + 1) : c->len) - cut_first(c, k);
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

/* ---- One slice of a chunk -------------------------------------------- */

static void slice_pack(struct host_backend *h, struct host_thread *t, const struct gs_span *sp,
		       size_t nspans, char *dst)
{
	const struct gs_bucket_io *io = h->phase.io;
	size_t esize = gs_wire_size(h->base.wire);
	const float *srcs[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < io->nranks; r++)
			srcs[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		gs_pack_sum(h->base.wire, dst, srcs, io->nranks, sp[i].count, io->pack,
			    t->clipped);
		dst += sp[i].count * esize;
	}
}

static void slice_unpack(struct host_backend *h, struct host_thread *t,
			 const struct gs_span *sp, size_t nspans, const char *src)
{
	const struct gs_bucket_io *io = h->phase.io;
	size_t esize = gs_wire_size(h->base.wire);
	float *dsts[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < io->nranks; r++)
			dsts[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		t->nonfinite += gs_unpack(h->base.wire, dsts, io->nranks, src, sp[i].count,
					  io->postscale);
		src += sp[i].count * esize;
	}
}

/* A sliced phase is claimed in units: each slice in pieces of at most
 * ph->unit elements, so that the threads share a slice as they share an
 * unsliced chunk. Unit i of the phase is a piece of slice *k. */
static uint32_t units_in(const struct host_phase *ph, uint32_t k)
{
	uint64_t n = cut_len(&ph->cut, k);
	return n <= ph->unit ? 1 : (uint32_t)((n + ph->unit - 1) / ph->unit);
}

static void unit_at(const struct host_phase *ph, uint32_t i, uint32_t *k, uint64_t *first,
		    uint64_t *n)
{
	uint32_t s = 0, u;
	while (i >= (u = units_in(ph, s))) {
		i -= u;
		s++;
	}
	uint64_t begin = cut_first(&ph->cut, s), end = begin + cut_len(&ph->cut, s);
	*k = s;
	*first = begin + i * ph->unit;
	*n = end - *first < ph->unit ? end - *first : ph->unit;
}

/* Elements [first, first + n) of the chunk in the current phase, its
 * slice k: in a sliced phase, pipeline slice k, after k statuses. */
static void run_slice(struct host_backend *h, struct host_thread *t, uint32_t k, uint64_t first,
		      uint64_t n)
{
	const struct host_phase *ph = &h->phase;
	const struct gs_bucket_io *io = ph->io;
	size_t nspans = gs_plan_chunk_spans(io->plan, io->counts, io->bucket, ph->start + first, n,
					    t->spans, h->span_room);
	uint64_t statuses = ph->sliced ? k * ph->gap : 0;
	char *at = ph->wire + (first + statuses) * gs_wire_size(h->base.wire);
	if (ph->unpack)
		slice_unpack(h, t, t->spans, nspans, at);
	else
		slice_pack(h, t, t->spans, nspans, at);
}

static void slice_packed(struct host_backend *h, uint32_t k);

/* ---- Claiming slices ---------------------------------------------------- */

#define ROUND_MASK 0xffffffu
#define SLICE_MASK 0xfffffu

static uint64_t claim_word(uint32_t round, uint32_t slices, uint32_t next)
{
	return (uint64_t)round << 40 | (uint64_t)slices << 20 | next;
}

/* Claims the next slice of `round` into *slice (and its round's slice
 * count into *slices); false when none is left or the round is over. */
static bool claim_slice(struct host_backend *h, uint32_t round, uint32_t *slice, uint32_t *slices)
{
	uint64_t v = atomic_load(&h->claim);
	for (;;) {
		uint32_t r = (uint32_t)(v >> 40), total = (v >> 20) & SLICE_MASK, next = v & SLICE_MASK;
		if (r != round || next >= total)
			return false;
		if (atomic_compare_exchange_weak(&h->claim, &v, v + 1)) {
			*slice = next;
			*slices = total;
			return true;
		}
	}
}

/* Does slices of `round` while there are any; the thread that finishes the
 * round's last slice wakes the worker if it waits. */
static void work_round(struct host_backend *h, struct host_thread *t, uint32_t round)
{
	uint32_t slice, slices;
	while (claim_slice(h, round, &slice, &slices)) {
		const struct host_phase *ph = &h->phase;
		if (ph->sliced) {
			uint32_t k;
			uint64_t first, n;
			unit_at(ph, slice, &k, &first, &n);
			run_slice(h, t, k, first, n);
			/* The thread that packs a slice's last unit gives it on. */
			if (!ph->unpack && atomic_fetch_sub(&h->left[k], 1) == 1)
				slice_packed(h, k);
		} else {
			uint64_t first = slice * ph->slice;
			run_slice(h, t, 0, first,
				  ph->len - first < ph->slice ? ph->len - first : ph->slice);
		}
		if (atomic_fetch_add(&h->done, 1) + 1 == slices && t->index != 0) {
			pthread_mutex_lock(&h->lock);
			pthread_cond_signal(&h->finished);
			pthread_mutex_unlock(&h->lock);
		}
	}
}

static void *helper_main(void *arg)
{
	struct host_thread *t = arg;
	struct host_backend *h = t->h;
	uint32_t seen = 0;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		while (h->go_round == seen && !h->stopping)
			pthread_cond_wait(&h->go, &h->lock);
		if (h->stopping)
			break;
		seen = h->go_round;
		pthread_mutex_unlock(&h->lock);
		work_round(h, t, seen);
		pthread_mutex_lock(&h->lock);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Runs h->phase to its end: in one piece on this thread, or in slices that
 * this thread and the helpers claim. */
static void run_phase(struct host_backend *h)
{
	uint64_t len = h->phase.len, size = len;
	if (h->nthreads > 1 && len > h->claim_len)
		size = h->claim_len;
	uint32_t slices = len ? (uint32_t)((len + size - 1) / size) : 0;
	struct host_phase *ph = &h->phase;
	/* A sliced chunk in units: one thread packs each slice whole, to give
	 * it on as soon as it is packed; several share it in pieces. */
	if (ph->sliced) {
		ph->unit = h->nthreads > 1 ? h->claim_len : UINT64_MAX;
		slices = 0;
		for (uint32_t k = 0; k < cut_slices(&ph->cut); k++) {
			atomic_store(&h->left[k], units_in(ph, k));
			slices += units_in(ph, k);
		}
	}
	ph->slice = size;
	/* Rounds run 1 .. ROUND_MASK: the helpers start having seen round 0. */
	h->round = h->round % ROUND_MASK + 1;
	atomic_store(&h->done, 0);
	atomic_store(&h->claim, claim_word(h->round, slices, 0));
	if (slices > 1) {
		pthread_mutex_lock(&h->lock);
		h->go_round = h->round;
		pthread_cond_broadcast(&h->go);
		pthread_mutex_unlock(&h->lock);
	}
	work_round(h, &h->thread[0], h->round);
	if (slices > 1) {
		pthread_mutex_lock(&h->lock);
		while (atomic_load(&h->done) < slices)
			pthread_cond_wait(&h->finished, &h->lock);
		pthread_mutex_unlock(&h->lock);
	}
}

static void stop_helpers(struct host_backend *h)
{
	pthread_mutex_lock(&h->lock);
	h->stopping = true;
	pthread_cond_broadcast(&h->go);
	pthread_mutex_unlock(&h->lock);
	for (unsigned t = 1; t < h->nthreads; t++)
		pthread_join(h->helper[t], NULL);
	h->nthreads = 1;
}

/* Starts want - 1 helpers (fewer if thread creation fails: the slices then
 * go to fewer threads). */
static void start_helpers(struct host_backend *h, unsigned want)
{
	h->nthreads = 1;
	for (unsigned t = 1; t < want; t++) {
		if (pthread_create(&h->helper[t], NULL, helper_main, &h->thread[t]) != 0)
			break;
		h->nthreads++;
	}
}

/* ---- The communication thread ----------------------------------------- */

/* Where slice k starts in wire, which keeps gap status elements after
 * each slice. */
static char *cut_at(const struct host_backend *h, const struct host_cut *c, char *wire,
		    uint64_t gap, uint32_t k)
{
	return wire + (cut_first(c, k) + k * gap) * gs_wire_size(h->base.wire);
}

static int all_nodes(struct host_backend *h, void *buf, size_t n, int timeout_ms)
{
	struct gs_backend *b = &h->base;
	int rc = gs_gloo_allreduce(h->gloo, b->wire, buf, n, timeout_ms, b->error,
				   sizeof(b->error));
	if (rc != GS_OK)
		return rc;
	/* A ring all-reduce sends 2 (N - 1) / N of the buffer. */
	uint64_t nodes = h->nodes;
	atomic_fetch_add(&b->internode_bytes, 2 * (nodes - 1) * n * gs_wire_size(b->wire) / nodes);
	return GS_OK;
}

/* All-reduces slice k of a cut chunk at wire, with its status, and reads
 * the summed status into *st. Returns GS_OK while the nodes go on; the
 * all-reduce's code when it failed; GS_EABORTED when a node voted to
 * abort, GS_EBUFFER when a node's pack lost memory. Every node reads the
 * same sum, so all stop after the same slice. */
static int reduce_slice(struct host_backend *h, char *wire, const struct host_cut *cut, uint32_t k,
			int timeout_ms, struct gs_chunk_status *st)
{
	size_t esize = gs_wire_size(h->base.wire);
	uint64_t n = cut_len(cut, k);
	char *at = cut_at(h, cut, wire, GS_CHUNK_STATUS_ELEMENTS, k);
	int rc = all_nodes(h, at, n + GS_CHUNK_STATUS_ELEMENTS, timeout_ms);
	if (rc != GS_OK)
		return rc;
	gs_chunk_status_get(h->base.wire, at + n * esize, st);
	if (st->vote.aborts)
		return GS_EABORTED;
	return st->lost_nodes ? GS_EBUFFER : GS_OK;
}

/* The chunk's slices in order, each once it is packed; stops at the first
 * that fails or whose status stops the bucket. */
static void comm_chunk(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	c->rc = GS_OK;
	for (uint32_t k = 0; k < c->slices && c->rc == GS_OK; k++) {
		while (!c->packed[k] && !c->stopping)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping) {
			c->rc = GS_EABORTED;
			snprintf(h->base.error, sizeof(h->base.error), "the backend is closing");
			break;
		}
		pthread_mutex_unlock(&c->lock);
		c->rc = reduce_slice(h, c->wire, &c->cut, k, k == 0 ? c->first_timeout_ms
								      : h->gloo_timeout_ms,
				     &c->status);
		pthread_mutex_lock(&c->lock);
	}
}

static void *comm_main(void *arg)
{
	struct host_backend *h = arg;
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->stopping && c->finished == c->given)
			pthread_cond_wait(&c->wake, &c->lock);
		if (c->stopping)
			break;
		comm_chunk(h);
		c->finished = c->given;
		pthread_cond_signal(&c->through);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Starts the thread at the first chunk that needs it; false when it cannot
 * start (the chunks then go in sequence on the worker thread). */
static bool comm_start(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	if (!c->started)
		c->started = pthread_create(&c->thread, NULL, comm_main, h) == 0;
	return c->started;
}

/* Hands the chunk at wire to the comm thread; its slices follow as the
 * pack finishes each (slice_packed). The thread is idle here. */
static void comm_give(struct host_backend *h, char *wire, const struct host_cut *cut,
		      int first_timeout_ms)
{
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	c->wire = wire;
	c->cut = *cut;
	c->slices = cut_slices(cut);
	c->first_timeout_ms = first_timeout_ms;
	memset(c->packed, 0, c->slices);
	c->given++;
	pthread_cond_signal(&c->wake);
	pthread_mutex_unlock(&c->lock);
}

/* Waits until the comm thread is through the chunk; its result. */
static int comm_wait(struct host_backend *h, struct gs_chunk_status *st)
{
	struct host_comm *c = &h->comm;
	pthread_mutex_lock(&c->lock);
	while (c->finished != c->given)
		pthread_cond_wait(&c->through, &c->lock);
	int rc = c->rc;
	*st = c->status;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static void comm_stop(struct host_backend *h)
{
	struct host_comm *c = &h->comm;
	if (!c->started)
		return;
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_cond_signal(&c->wake);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	c->started = false;
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
static void slice_packed(struct host_backend *h, uint32_t k)
{
	const struct host_phase *ph = &h->phase;
	size_t esize = gs_wire_size(h->base.wire);
	char *tail = cut_at(h, &ph->cut, ph->wire, ph->gap, k) + cut_len(&ph->cut, k) * esize;
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
	uint32_t slices = cut_slices(cut);
	bool feed = h->gloo && slices > 1 && comm_start(h);
	int first_timeout = start == 0 && io->vote ? io->vote_timeout_ms : h->gloo_timeout_ms;
	h->phase = (struct host_phase){ .io = io, .start = start, .len = len, .wire = h->fusion,
					.gap = h->gloo ? GS_CHUNK_STATUS_ELEMENTS : 0,
					.cut = *cut, .sliced = h->gloo && slices > 1, .feed = feed,
					.vote = start == 0 ? io->vote : NULL };
	gs_io_mark(io, GS_MARK_PACK, start, len);
	if (feed)
		comm_give(h, h->fusion, cut, first_timeout);
	run_phase(h);
	if (h->gloo && slices == 1)
		slice_packed(h, 0);
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
		rc = comm_wait(h, &st);
	for (uint32_t k = 0; !feed && k < slices && rc == GS_OK; k++)
		rc = reduce_slice(h, h->fusion, cut, k, k == 0 ? first_timeout : h->gloo_timeout_ms,
				  &st);
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
	uint64_t n = cut_len(&cut, 0);
	size_t esize = gs_wire_size(h->base.wire);
	memset(h->fusion, 0, n * esize);
	gs_chunk_status_put(h->base.wire, (char *)h->fusion + n * esize, h->node_rank, -1, io->vote);
	struct gs_chunk_status st = { 0 };
	int rc = reduce_slice(h, h->fusion, &cut, 0, io->vote_timeout_ms, &st);
	return chunk_result(h, io, rc, &st);
}

/* Copies a reduced chunk's slices, without their statuses, to dst. */
static void copy_slices(struct host_backend *h, char *dst, const struct host_cut *cut,
			uint64_t gap)
{
	size_t esize = gs_wire_size(h->base.wire);
	for (uint32_t k = 0; k < cut_slices(cut); k++) {
		uint64_t n = cut_len(cut, k);
		memcpy(dst, cut_at(h, cut, h->fusion, gap, k), n * esize);
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
					.sliced = gap && cut_slices(cut) > 1 };
	run_phase(h);
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
	stop_helpers(h);
	comm_stop(h);
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
	start_helpers(h, thread_count(local_size));
	return &h->base;
err:
	host_destroy(&h->base);
	return NULL;
}
