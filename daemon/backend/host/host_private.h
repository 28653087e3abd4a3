/*
 * What the host backend's files share (nothing outside
 * daemon/backend/host/ includes this header). The files, one job each:
 *
 *   backend_host.c: a bucket, chunk by chunk (pack+sum, all-reduce,
 *     unpack, the staging of a large bucket), the group of nodes (the
 *     pipeline slice node 0 offers), create and destroy, the ops table;
 *     its top comment tells how a chunk goes through the other two;
 *   slices.c: one slice of a chunk packed or unpacked, and a phase's
 *     slices claimed by the worker thread and its helpers;
 *   comm.c: the communication thread, which all-reduces a chunk's packed
 *     slices across nodes while the next ones are packed, and a bucket
 *     packed early behind the one before it;
 *   overlap.c: the next bucket packed while this one is exchanged;
 *   buffers.c: the fusion and staging buffers, sized by the plan.
 */
#ifndef GS_HOST_PRIVATE_H
#define GS_HOST_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/chunk_status.h"

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
/* A bucket of fewer elements goes to the comm thread, so that the next
 * can be packed meanwhile, only where it is cut in slices anyway: its
 * exchange is too short to hide a pack behind, and the hand-over costs a
 * wake-up. 128 KiB of fp16, about 0.1 ms at 10 Gbit/s. */
#define HOST_OVERLAP_MIN_ELEMENTS 65536
/* How often the worker looks for a next bucket queued while it waits for
 * this one's exchange. */
#define HOST_NEXT_POLL_MS 1
/* An unpack's sum of squares is kept in gs_unpack_norm's blocks, counted
 * from the start of the chunk; every piece a thread claims starts at a
 * block's edge, so no block is shared by two threads and the sums do not
 * depend on the split (slices.c). */
_Static_assert(HOST_SLICE_ELEMENTS % GS_NORM_BLOCK == 0, "claims cut blocks");
_Static_assert(HOST_HEAD_ELEMENTS % GS_NORM_BLOCK == 0, "the head cuts a block");
/* The claim word's fields (struct host_backend's claim). */
#define ROUND_MASK 0xffffffu
#define SLICE_MASK 0xfffffu

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
 * by its status (gap elements); the first slice's, where it carries the
 * vote, by `extra` more: the bucket's produced counts (chunk_status.h). */
struct host_cut {
	uint64_t len, head, slice;
	uint64_t extra;
};

/* A fusion buffer and the chunk in it, from its pack until its unpack is
 * done: a bucket's chunk, or the next bucket's, packed early (token). The
 * backend has two, so that the next bucket is packed while this one is
 * exchanged. */
struct host_lane {
	char *wire; /* the chunk: slices, each followed by its status */
	struct host_cut cut;
	int first_timeout_ms; /* slice 0's wait: the vote's, in a bucket's first chunk */
	bool held;            /* from its pack until its bucket is done with it */
	uint64_t token;       /* packed early: the bucket's (gs_bucket_io.token) */
	int lost;             /* at its pack: lost_rank, -1 when none */
	uint64_t clipped[GS_PACK_SUM_MAX_SOURCES]; /* packed early: by its pack */
	/* Under comm.lock, once given to the comm thread. */
	uint8_t *packed; /* [slice]: packed, its status written */
	bool started, through;
	bool refused; /* through without an all-reduce: the chunk before failed */
	struct host_lane *after; /* packed early: the lane of the bucket before */
	/* The chunk's result: GS_OK, or what stopped it (host_reduce_slice),
	 * and the summed status of its last slice all-reduced. */
	int rc;
	struct gs_chunk_status status;
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
	struct host_lane *lane; /* packing: where the comm thread hears of slices */
	/* Unpacking, where the bucket wants its sum of squares (io->sumsq):
	 * [block] of the chunk, zeroed before the phase (h->norm_blocks). */
	double *blocks;
	/* On a node of one CPU, while another bucket is exchanged: the phase
	 * goes in pieces (HOST_SLICE_ELEMENTS), each handed on as it is done.
	 * No thread yields between them: a yield hands the CPU to whatever
	 * else is runnable, a busy neighbour too, for its whole slice. The
	 * threads that carry the exchange sleep until a piece or the network
	 * wakes them, and a woken sleeper preempts the packer at once. */
	bool in_pieces;
};

/* The communication thread: all-reduces the chunks given to it in order
 * (at most two: this bucket's, and the next one's packed early), each
 * slice as soon as it is packed, while the worker and helpers pack the
 * next. A chunk that fails ends the queue: the one behind it is refused,
 * not all-reduced, as every node stops at the same bucket. Between chunks
 * it waits. The only chunk it may hold when reduce_bucket returns is the
 * next bucket's, which the worker runs next; join_group, leave_group and
 * destroy wait until it is idle (host_drop_lanes), so nothing touches the
 * group's Gloo context outside a bucket. */
struct host_comm {
	pthread_t thread;
	bool started, stopping;
	pthread_mutex_t lock;
	pthread_cond_t wake;    /* for the comm thread: a chunk, a slice packed, stop */
	pthread_cond_t through; /* for the worker: a chunk started, or is through */
	struct host_lane *queue[2];
	unsigned queued;
};

struct host_backend {
	struct gs_backend base;
	/* Each: lane_elements elements of the widest wire dtype, and a
	 * status after every slice (buffers.c). lane[0]'s buffer is made at
	 * the first bucket, lane[1]'s at the first bucket packed early. */
	struct host_lane lane[2];
	uint64_t lane_elements;
	uint64_t lane_members; /* room for the produced counts of a bucket this long */
	bool overlap; /* pack the next bucket early (GRADSYNCD_BUCKET_OVERLAP) */
	bool one_cpu; /* this process may use one CPU only (at create) */
	char *staging; /* staged buckets' results */
	uint64_t staging_elements;
	/* What size_buffers sized for the plan, in the node's budget: the
	 * lanes' elements, the staging buffer's (0: none), the most members
	 * of a bucket (their produced counts ride with the vote) and how many
	 * lanes (2 where the next bucket may be packed early). */
	uint64_t want_elements, want_staging, want_members;
	unsigned want_lanes;
	struct gs_fusion_budget *budget;
	uint32_t job_nodes; /* the job's node count (gs_host_options) */
	struct gs_gloo *gloo; /* the group of nodes (join_group); NULL: none */
	int gloo_timeout_ms;
	uint32_t node_rank, nodes;
	bool allow_hugetlb;
	uint64_t claim_len; /* elements of a slice the threads claim */
	double *norm_blocks; /* a chunk's unpack's sums (host_phase.blocks) */
	size_t max_norm_blocks;
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

/* Slices of a cut chunk (at least one), where slice k begins, and its
 * length. */
static inline uint32_t host_cut_slices(const struct host_cut *c)
{
	if (c->head && c->len > c->head)
		return 1 + (uint32_t)((c->len - c->head + c->slice - 1) / c->slice);
	return c->len <= c->slice ? 1 : (uint32_t)((c->len + c->slice - 1) / c->slice);
}

static inline uint64_t host_cut_first(const struct host_cut *c, uint32_t k)
{
	uint64_t first = c->head && c->len > c->head ? (k ? c->head + (k - 1) * c->slice : 0)
						       : k * c->slice;
	return first < c->len ? first : c->len;
}

static inline uint64_t host_cut_len(const struct host_cut *c, uint32_t k)
{
	return (k + 1 < host_cut_slices(c) ? host_cut_first(c, k + 1) : c->len) -
	       host_cut_first(c, k);
}

/* The status elements before slice k, with gap after each slice (0: the
 * chunk is contiguous) and the first one's extra. */
static inline uint64_t host_cut_statuses(const struct host_cut *c, uint64_t gap, uint32_t k)
{
	return gap && k ? k * gap + c->extra : 0;
}

/* Where slice k starts in wire, which keeps gap status elements after
 * each slice. */
static inline char *host_cut_at(const struct host_backend *h, const struct host_cut *c,
				 char *wire, uint64_t gap, uint32_t k)
{
	return wire + (host_cut_first(c, k) + host_cut_statuses(c, gap, k)) *
			      gs_wire_size(h->base.wire);
}

/* slices.c: runs h->phase to its end; starts and stops the helpers. */
void host_run_phase(struct host_backend *h);
void host_start_helpers(struct host_backend *h, unsigned want);
void host_stop_helpers(struct host_backend *h);

/* comm.c: one slice all-reduced on the calling thread; the comm thread
 * started, given a lane's chunk, waited for, and stopped. */
int host_reduce_slice(struct host_backend *h, char *wire, const struct host_cut *cut,
		      uint32_t k, int timeout_ms, struct gs_chunk_status *st);
bool host_comm_start(struct host_backend *h);
void host_comm_give(struct host_backend *h, struct host_lane *lane);
/* Waits until the comm thread is through the lane (started too, with
 * started_only), at most timeout_ms (-1: without end); whether it is. */
bool host_comm_wait(struct host_backend *h, struct host_lane *lane, bool started_only,
		    int timeout_ms);
void host_comm_stop(struct host_backend *h);

/* backend_host.c: slice k of the pack+sum is packed (by whichever thread);
 * one chunk packed into a lane (feed: given to the comm thread first). */
void host_slice_packed(struct host_backend *h, uint32_t k);
void host_pack_chunk(struct host_backend *h, const struct gs_bucket_io *io, uint64_t start,
		     struct host_lane *lane, bool feed);
/* Room in every thread's spans for a bucket of `members` tensors: GS_OK
 * or GS_ENOMEM. */
int host_ensure_span_room(struct host_backend *h, size_t members);
void host_lane_for(struct host_backend *h, struct host_lane *lane,
		   const struct gs_bucket_io *io, uint64_t start, uint64_t len);

/* buffers.c: the backend's size_buffers; at a bucket (worker thread), the
 * buffers made as size_buffers sized them (GS_OK, or a GS_E* code with
 * the reason in base.error); a lane's fusion buffer of lane_elements, or
 * NULL; room in the staging buffer for a bucket of `elements` (GS_OK or
 * GS_ENOMEM); every buffer unmapped and its bytes given back. */
int host_size_buffers(struct gs_backend *b, const struct gs_plan *p, char *err, size_t errlen);
int host_fit_buffers(struct host_backend *h);
char *host_lane_buffer(const struct host_backend *h);
int host_ensure_staging(struct host_backend *h, uint64_t elements);
void host_free_buffers(struct host_backend *h);

/* overlap.c: while lane's bucket (io) is exchanged on the comm thread,
 * the next bucket packed into the other lane and given to the comm thread
 * behind it; the lane packed early for io, if any (every other lane
 * dropped); every lane dropped once the comm thread is idle. */
void host_pack_next_meanwhile(struct host_backend *h, const struct gs_bucket_io *io,
			      struct host_lane *lane);
struct host_lane *host_take_lane(struct host_backend *h, const struct gs_bucket_io *io);
void host_drop_lanes(struct host_backend *h);
/* The clip counts of the threads' packs since the last call, added to
 * clipped[rank] and reset. */
void host_take_clipped(struct host_backend *h, unsigned nranks, uint64_t *clipped);

#endif