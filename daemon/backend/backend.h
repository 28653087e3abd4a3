/*
 * The interface between the step engine and the place gradients live. The
 * engine knows buckets and spans; a backend does the four things that touch
 * memory: import a trainer's buffer handle, pack a chunk of a bucket into a
 * local rank's fusion buffer (gather, clip, scale, cast), all-reduce the
 * packed buffers, and unpack the result into every local rank's tensors
 * (cast, scale, count non-finite values, scatter). pack, allreduce and
 * unpack run on the worker thread, one chunk at a time; a backend that
 * does a whole bucket at once (the CUDA backend: one kernel launch per
 * bucket, not per tensor; the host backend: pack, all-reduce and unpack
 * overlapped on threads of its own) provides reduce_bucket instead. With
 * several nodes, a backend joins their group and leaves it through its ops
 * too (join_group, leave_group), so that nothing above names a backend.
 */
#ifndef GS_BACKEND_H
#define GS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/plan.h"
#include "convert.h"

struct gs_backend;

/* What a trainer's buffer is, as its RegisterTensors frame says. */
enum gs_buffer_kind {
	GS_BUFFER_MEMFD,       /* sealed memfd shared memory (host backend) */
	GS_BUFFER_CUDA,        /* a device allocation's CUDA IPC handle */
	GS_BUFFER_CUDA_EVENTS, /* the trainer's CUDA IPC events; holds no tensor */
};

#define GS_CUDA_IPC_HANDLE_SIZE 64 /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define GS_CUDA_READY_RING_MAX 64  /* a trainer's ready events, at most */

/* The nodes' vote on a bucket, summed: how many nodes abort the step
 * (0: all go on) and, when one does, which (node rank, and the local rank
 * its reason names) and why (a number of the engine's). */
struct gs_vote {
	uint32_t aborts;
	uint32_t node, rank, reason;
};

struct gs_buffer_desc {
	enum gs_buffer_kind kind;
	uint32_t rank;       /* local rank of the trainer that hands it over */
	uint64_t size;       /* bytes, as the trainer claims */
	int fd;              /* GS_BUFFER_MEMFD; stays the caller's */
	int32_t device;      /* CUDA: the trainer's device ordinal */
	const char *pci_bus_id; /* CUDA: that device's PCI bus id, or "" */
	const uint8_t *handle;  /* GS_BUFFER_CUDA: GS_CUDA_IPC_HANDLE_SIZE bytes */
	const uint8_t *ready_event, *done_event; /* GS_BUFFER_CUDA_EVENTS: likewise */
	const uint8_t *ready_ring[GS_CUDA_READY_RING_MAX]; /* and its ready events' ring */
	size_t nring;                                       /* 0: ready_event alone */
};

/* One bucket for reduce_bucket: what the chunk-by-chunk path reads, and
 * where the results go (added to). */
struct gs_bucket_io {
	const struct gs_plan *plan;
	const uint64_t *counts;
	uint32_t bucket;
	unsigned nranks;
	float *const *const *tensors;       /* [rank][tensor] base pointers */
	const struct gs_pack_params *pack;  /* [rank] */
	float postscale;
	uint64_t *clipped;                  /* [rank] */
	uint64_t *nonfinite;
	/* Optional, for the trace and the metrics: the backend marks when each
	 * chunk's pack, all-reduce and unpack begin and when the chunk is done
	 * (gs_io_mark); ctx is the caller's. */
	void (*mark)(const struct gs_bucket_io *io, int mark, uint64_t first, uint64_t len);
	void *ctx;
	/* CUDA: [rank] the entry of the trainer's ready ring that the
	 * bucket's last mark recorded; NULL: entry 0. */
	const uint32_t *ready_event;
	/* Host: set when the memory of one of this node's trainers lost its
	 * pages while the bucket read or wrote it (shm_guard.h); the caller
	 * then finds whose and drops it. */
	bool *lost;
	/* With several nodes, where the backend votes in the data
	 * (gs_backend.votes_in_data): this node's vote on the bucket, and
	 * where the sum over the nodes goes; NULL: no vote. A node that votes
	 * to abort has no tensors (nranks 0): it takes part in the bucket's
	 * first all-reduce only. The backend returns GS_EABORTED when the
	 * sum has an abort, before it unpacks anything of the bucket. */
	struct gs_vote *vote;
	int vote_timeout_ms; /* the first all-reduce's wait, for the slowest node's trainers */
	/* Optional, with several nodes: the bucket the worker runs right after
	 * this one, where it is already queued and reduces tensors (not a
	 * vote to abort); NULL when there is none now. A backend may pack it
	 * and queue its all-reduce behind this bucket's while this one is
	 * exchanged, and finds that work again when reduce_bucket is called
	 * for it, by its token; it writes nothing of it to the trainers
	 * before then. Worker thread only. */
	const struct gs_bucket_io *(*next)(const struct gs_bucket_io *io);
	uint64_t token; /* this bucket's run's, unique in the daemon */
	/* Indexed by tensor: whether it was produced this step, by one of
	 * this node's trainers as the bucket comes in and, with several nodes,
	 * by any node's once the vote is summed: the backend that carries the
	 * vote in the data (votes_in_data) carries a count per member of the
	 * bucket with it and writes the verdict here before it unpacks. A
	 * tensor that no trainer produced is not unpacked: every trainer's
	 * memory of it stays as it was. NULL: every tensor was produced. */
	uint8_t *produced;
	/* Optional: where the backend adds the sum of the squares of the
	 * bucket's reduced values, as the trainers' tensors hold them, for
	 * the step's gradient norm. It sums in fp64 in an order fixed by the
	 * bucket's layout (gs_unpack_norm's blocks of its chunks, in order),
	 * never by how its threads share the work, so every node gets the
	 * same bits. NULL: not wanted. */
	double *sumsq;
};

enum gs_chunk_mark { GS_MARK_PACK, GS_MARK_ALLREDUCE, GS_MARK_UNPACK, GS_MARK_DONE };

static inline void gs_io_mark(const struct gs_bucket_io *io, enum gs_chunk_mark m,
			      uint64_t first, uint64_t len)
{
	if (io->mark)
		io->mark(io, m, first, len);
}

/* ---- The group of nodes, as a backend joins it ---------------------------- */

/* A key-value store every node of the group shares (the cluster backs it
 * by its rendezvous): how a backend agrees on its own transport with the
 * other nodes. The keys are the backend's choice ("nccl/uid"); the store
 * is the group's own, so a group rebuilt later never reads a value left
 * for an earlier one. Only the thread running join_group calls it. */
struct gs_kv {
	void *ctx;
	/* Stores a copy of len bytes under key. Returns GS_OK or a GS_E* code. */
	int (*set)(void *ctx, const char *key, const void *value, size_t len);
	/* Waits until key exists, at most timeout_ms. On GS_OK *value is a
	 * malloc'd copy, the caller's to free, and *len its size; GS_ETIMEDOUT
	 * when the key did not appear, another GS_E* code on other failures. */
	int (*get)(void *ctx, const char *key, void **value, size_t *len, int timeout_ms);
	/* Optional, in pairs: around a long wait that is not the store
	 * (making communicators, which waits for every node's), park keeps
	 * this node's place in the group (the cluster answers the
	 * coordinator's pings meanwhile, or it would take the node for lost);
	 * the store is not used again until unpark. */
	void (*park)(void *ctx);
	void (*unpark)(void *ctx);
};

struct gs_gloo;

/* The group of nodes this node is in, as join_group sees it. Every node's
 * backend said its name (gs_backend.name) first, and the cluster checked
 * that they all run the same backend. */
struct gs_group_join {
	uint32_t node_rank;  /* this node's, 0 to nodes - 1 */
	uint32_t nodes;
	uint32_t rank_base;  /* global rank of this node's local rank 0 */
	uint32_t world_size; /* trainers of every node together */
	uint64_t generation; /* of the group: each rebuild makes a new one */
	int join_timeout_ms; /* the longest a wait on the other nodes takes while joining */
	int peer_timeout_ms; /* the longest one collective with them may take */
	int cancel_fd;       /* readable once the daemon shuts down: waits end (GS_EABORTED) */
	const struct gs_kv *kv;
	/* The group's Gloo context (backend/gloo/gloo_comm.h): the nodes'
	 * votes go through it; the host backend sums its buckets through it
	 * too. The cluster's: valid until leave_group. */
	struct gs_gloo *gloo;
};

struct gs_backend_ops {
	/* Optional: the job's bucket plan is known (its layout registered, or
	 * registered anew after its trainers left): sizes the fusion buffers
	 * by it. Each holds the plan's largest bucket, at most fusion_elements
	 * (gs_plan_fusion_elements); where the backend stages a bucket larger
	 * than that, a staging buffer holds the largest (gs_plan_staged_elements).
	 * Their bytes are taken from the node's budget (fusion_budget.h) here,
	 * on the loop thread while no bucket runs; the memory itself is made
	 * at the next bucket, on the worker thread, and not zero-filled. The
	 * job's buffers before this call hold nothing. Returns GS_OK, or
	 * GS_ELIMIT with the budget's reason in err (the buffers are as they
	 * were). NULL: the backend sizes nothing (a test's). */
	int (*size_buffers)(struct gs_backend *b, const struct gs_plan *p, char *err,
			    size_t errlen);
	/* Validates a trainer's buffer and makes it usable here (maps a
	 * memfd, opens a CUDA IPC handle); *addr is where its bytes are (for
	 * CUDA, a device address). On failure writes a reason naming what is
	 * wrong to err and returns a GS_E* code. */
	int (*import_buffer)(struct gs_backend *b, const struct gs_buffer_desc *desc,
			     void **addr, char *err, size_t errlen);
	void (*release_buffer)(struct gs_backend *b, void *addr, uint64_t size);
	/* Optional: copies n raw bytes between two imported buffers' memory
	 * (a trainer's state, engine/state.h), on the worker thread. Returns
	 * GS_OK or a GS_E* code with the reason in error. NULL: the backend
	 * cannot hold a trainer's state. */
	int (*copy_bytes)(struct gs_backend *b, void *dst, const void *src, uint64_t n);
	/* Optional, with several nodes: copies n raw bytes at buf on node
	 * `root` into buf on every other node of the group (a trainer's
	 * state between nodes), on the worker thread, between steps. Every
	 * node calls it with the same root and n, in the same order. Returns
	 * GS_OK or a GS_E* code with the reason in error; after a failure a
	 * receiver's buf holds some of the root's bytes and the group is
	 * broken (the caller asks for a new one). NULL: state stays on its
	 * node. */
	int (*broadcast_bytes)(struct gs_backend *b, void *buf, uint64_t n, uint32_t root);
	/* Optional: reduces a whole bucket, every chunk of it (pack, all-reduce,
	 * unpack). When set, the per-chunk calls below are not used. Returns 0
	 * or a GS_E* code with the reason in error: GS_EBUFFER when a
	 * trainer's memory (here or on another node) lost its pages while it
	 * was packed, and so no node unpacked the bucket; GS_EABORTED when
	 * the nodes' vote (io->vote) stopped it. */
	int (*reduce_bucket)(struct gs_backend *b, const struct gs_bucket_io *io);
	/* Packs spans of local rank `rank` (tensor base pointers `tensors`)
	 * into its fusion buffer, back to back. Returns elements clipped. */
	uint64_t (*pack)(struct gs_backend *b, unsigned rank,
			 float *const *tensors, const struct gs_span *spans,
			 size_t nspans, const struct gs_pack_params *p);
	/* Sums the first n elements of the packed buffers of all local ranks
	 * (and, later, of all nodes). Returns 0 or a GS_E* code. */
	int (*allreduce)(struct gs_backend *b, size_t n);
	/* Writes the reduced elements, scaled, into the spans of every local
	 * rank (tensors[rank] are its base pointers). Returns the number of
	 * non-finite results. */
	uint64_t (*unpack)(struct gs_backend *b, float *const *const *tensors,
			   const struct gs_span *spans, size_t nspans,
			   float postscale);
	/* Optional: this node is in the group of nodes g describes (joined at
	 * start, or rebuilt after a node went away or came back): makes what
	 * the backend reduces across nodes with, or what it needs to (the
	 * CUDA backend: node 0's NCCL unique id shared through g->kv, of
	 * which its communicators are made at the next bucket; the host
	 * backend: sums through g->gloo). Runs on a thread of the
	 * cluster's while no bucket runs (the worker thread, or one that
	 * keeps it free). Returns GS_OK, or a GS_E* code with the reason in
	 * err (GS_EABORTED when g->cancel_fd ended a wait). NULL: the backend
	 * needs nothing but what every node shares anyway. */
	int (*join_group)(struct gs_backend *b, const struct gs_group_join *g, char *err,
			  size_t errlen);
	/* Optional: the group is gone (a node went away, or it is to be
	 * rebuilt): stop using it, on the worker thread. Buckets that need
	 * the other nodes fail until the next join_group. */
	void (*leave_group)(struct gs_backend *b);
	void (*destroy)(struct gs_backend *b);
};

struct gs_backend {
	const char *name;
	const struct gs_backend_ops *ops;
	unsigned local_size;
	enum gs_wire wire;
	/* The job's fusion buffer setting: no chunk is longer. A fusion
	 * buffer holds the plan's largest bucket, at most this (size_buffers). */
	uint64_t fusion_elements;
	/* Bytes its fusion and staging buffers hold in the node's budget, as
	 * size_buffers sized them (loop thread). */
	uint64_t fusion_bytes;
	/* The nodes' vote on each bucket rides in its first all-reduce
	 * (gs_bucket_io.vote), rather than the engine's collective of its own. */
	bool votes_in_data;
	_Atomic uint64_t internode_bytes;
	/* Buckets packed while the one before them was exchanged
	 * (gs_bucket_io.next). */
	_Atomic uint64_t overlapped_buckets;
	char error[256]; /* why the last allreduce failed (worker thread) */
};

struct gs_fusion_budget;

struct gs_host_options {
	unsigned local_size;
	enum gs_wire wire;
	uint64_t fusion_elements; /* the job's fusion buffer setting: chunks are cut at it */
	bool allow_hugetlb;       /* accept huge-page memfds (--allow-hugetlb) */
	uint32_t nodes;           /* of the job: with several, a second buffer overlaps buckets */
	struct gs_fusion_budget *budget; /* the node's; NULL: no limit */
};

/* The host backend: sealed memfd shared memory and the CPU's conversion
 * kernels. It has no fusion buffer until size_buffers. Returns NULL when
 * out of memory. */
struct gs_backend *gs_backend_host_create(const struct gs_host_options *o);

/* Bytes this node has sent to other nodes in all-reduces (worker thread
 * writes, anyone reads). */
uint64_t gs_backend_internode_bytes(const struct gs_backend *b);
/* Buckets this node packed while the bucket before them was exchanged. */
uint64_t gs_backend_overlapped_buckets(const struct gs_backend *b);

#endif
