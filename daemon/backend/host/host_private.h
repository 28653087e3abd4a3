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
 *     slices across nodes while the next ones are packed.
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
	/* The chunk's result: GS_OK, or what stopped it (host_reduce_slice), and
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

/* Where slice k starts in wire, which keeps gap status elements after
 * each slice. */
static inline char *host_cut_at(const struct host_backend *h, const struct host_cut *c,
				 char *wire, uint64_t gap, uint32_t k)
{
	return wire + (host_cut_first(c, k) + k * gap) * gs_wire_size(h->base.wire);
}

/* slices.c: runs h->phase to its end; starts and stops the helpers. */
void host_run_phase(struct host_backend *h);
void host_start_helpers(struct host_backend *h, unsigned want);
void host_stop_helpers(struct host_backend *h);

/* comm.c: one slice all-reduced on the calling thread; the comm thread
 * started, given a chunk, waited for, and stopped. */
int host_reduce_slice(struct host_backend *h, char *wire, const struct host_cut *cut,
		      uint32_t k, int timeout_ms, struct gs_chunk_status *st);
bool host_comm_start(struct host_backend *h);
void host_comm_give(struct host_backend *h, char *wire, const struct host_cut *cut,
		    int first_timeout_ms);
int host_comm_wait(struct host_backend *h, struct gs_chunk_status *st);
void host_comm_stop(struct host_backend *h);

/* backend_host.c: slice k of the pack+sum is packed (by whichever thread). */
void host_slice_packed(struct host_backend *h, uint32_t k);

#endif