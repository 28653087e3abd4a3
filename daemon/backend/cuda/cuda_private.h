/*
 * What the CUDA backend's files share: its state, per local rank and
 * whole, and the calls between them. backend_cuda.c sets it up and tears
 * it down, bucket.c runs buckets (worker thread), imports.c opens and
 * closes trainers' handles (loop thread), copy.c copies trainers' state
 * (worker thread), comms.c makes and aborts the
 * NCCL communicators, wait.c waits on streams and communicators within
 * bounds and words their errors, usable.c says whether a GPU is usable.
 *
 * A local rank's GPU is bound when its first CUDA buffer comes (loop
 * thread): the GPU that buffer's PCI bus id names, where its stream and
 * counters are then made. Its fusion buffer is sized by the job's plan
 * (size_buffers, loop thread) and made at the next bucket, on the worker
 * thread. The worker reads a rank's state only in buckets, which need
 * every rank's trainer, so after that.
 * Not for use outside daemon/backend/cuda/.
 */
#ifndef GS_CUDA_PRIVATE_H
#define GS_CUDA_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/table.h"

#define MAX_RANKS 64
#define MAX_DEVICES 64 /* visible to the daemon: --gpus names these */
#define GS_NCCL_UID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
/* Kernels are built for sm_80 and sm_90 (plus PTX): Ampere or later. */
#define MIN_CC_MAJOR 8

typedef CUresult (*mem_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

/* A trainer's handle opened here: a base allocation, or its events. */
struct cuda_import {
	struct cuda_import *next;
	enum gs_buffer_kind kind;
	unsigned rank;
	unsigned refs;
	uint8_t handle[GS_CUDA_IPC_HANDLE_SIZE];
	void *ptr;
	uint64_t size;
	cudaEvent_t ring[GS_CUDA_READY_RING_MAX]; /* ready events: ring[0] alone if no ring */
	unsigned nring;
	cudaEvent_t done;
};

struct cuda_rank {
	bool bound;  /* its GPU is known and set up (the fields below) */
	int device;  /* the daemon's ordinal of it */
	char pci[32];
	cudaStream_t stream;
	ncclComm_t comm;
	void *fusion;                 /* fusion_elements of fp32 (want_elements once made) */
	uint64_t fusion_elements;
	unsigned long long *counters; /* device: clipped, non-finite */
	void *table, *staging;        /* device tables and their pinned source */
	size_t table_cap;
	void *stage;                  /* a staged bucket, in the wire dtype */
	size_t stage_bytes;
	/* The trainer's events (set on the loop thread, read on the worker). */
	_Atomic(struct cuda_import *) events;
	struct cuda_import *bucket_events; /* the ones this bucket waited on */
	cudaEvent_t bucket_ready;          /* the ready event it waits on */
	/* Waits on the trainer's ready event, so that a wake-up queued
	 * behind it tells the worker; made again after a wait timed out
	 * (a stuck event would hold every later wake-up). */
	cudaStream_t watch;
	cudaEvent_t drained; /* recorded where a wait on stream is to end */
};

struct cuda_backend {
	struct gs_backend base;
	unsigned n;
	struct cuda_rank rank[MAX_RANKS];
	struct cuda_wake *wake; /* the worker's wake-ups from every stream */
	unsigned long long *host_counters; /* pinned: 2 per rank */
	struct gs_cuda_bucket_plan plan;
	int timeout_ms;
	int join_timeout_ms;
	uint32_t nodes;
	bool allowed[MAX_DEVICES]; /* the GPUs --gpus names, or all */
	char gpus[256];            /* --gpus as given, for messages; "" all */
	/* The group's NCCL unique id and this node's place in it, from
	 * join_group: the communicators are made of it at the next bucket,
	 * once every local rank's GPU is known (have_uid then goes). */
	bool have_uid;
	uint8_t uid[GS_NCCL_UID_BYTES];
	uint32_t uid_rank_base, uid_world;
	uint64_t generation;
	uint32_t world; /* global ranks of the communicators */
	bool connected;
	bool broken;
	char broken_why[200];
	mem_range_fn mem_range;
	struct cuda_import *imports; /* loop thread only */
	/* The group's Gloo context and this node's rank in it (join_group;
	 * NULL once it is left): a trainer's state goes between nodes
	 * through it (broadcast_bytes), staged in state_stage, pinned host
	 * memory of STATE_STAGE_BYTES made at the first use (worker thread). */
	struct gs_gloo *gloo;
	uint32_t node_rank;
	void *state_stage;
	/* What size_buffers sized for the plan, in the node's budget: each
	 * rank's fusion buffer, and its staging buffer (0: none). */
	struct gs_fusion_budget *budget;
	uint64_t want_elements, want_stage_elements;
};

static inline struct cuda_backend *cuda(struct gs_backend *b)
{
	return (struct cuda_backend *)b;
}

/* backend_cuda.c: the backend, no GPU bound yet (the allow-list checked);
 * NULL with the reason in why. */
struct gs_backend *cuda_create(const struct gs_cuda_options *o, char *why, size_t n);
/* Binds local rank r to the daemon's device `device` (loop thread) and
 * sets up its stream and counters there. GS_OK, or a GS_E* code with the
 * reason in why. */
int cuda_bind_rank(struct cuda_backend *cb, unsigned r, int device, char *why, size_t n);
/* The backend's size_buffers. */
int cuda_size_buffers(struct gs_backend *b, const struct gs_plan *p, char *err, size_t errlen);

/* start.c: the backend's join_group: node 0's NCCL unique id shared
 * through the group's store (key "nccl/uid") and kept for the next
 * bucket, which makes the communicators; and the group's Gloo context,
 * for state. leave_group: the communicators aborted, the Gloo forgotten. */
int cuda_join_group(struct gs_backend *b, const struct gs_group_join *g, char *why, size_t n);
void cuda_leave_group(struct gs_backend *b);
/* At a bucket (worker thread), every local rank's GPU bound: the
 * communicators of the group joined last, or alone of this node's ranks,
 * when there are none yet. GS_OK when there are (or none can be made
 * until the nodes regroup: the bucket then says so); else the reason is in
 * cb->base.error. */
int cuda_make_comms(struct cuda_backend *cb);

/* bucket.c: the backend's reduce_bucket. */
int cuda_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io);

/* imports.c: the backend's import_buffer and release_buffer, and closing
 * one import (at shutdown). */
int cuda_import_buffer(struct gs_backend *b, const struct gs_buffer_desc *d, void **addr,
		       char *err, size_t n);
void cuda_release_buffer(struct gs_backend *b, void *addr, uint64_t size);
void cuda_close_import(struct cuda_backend *cb, struct cuda_import *im);

/* copy.c: the backend's copy_bytes (a trainer's state, device to device)
 * and broadcast_bytes (between nodes, over the group's Gloo). */
int cuda_copy_bytes(struct gs_backend *b, void *dst, const void *src, uint64_t n);
int cuda_broadcast_bytes(struct gs_backend *b, void *buf, uint64_t n, uint32_t root);

/* comms.c */
/* A fresh NCCL unique id, made by node rank 0 and shared with the others. */
int cuda_nccl_uid(uint8_t uid[GS_NCCL_UID_BYTES], char *why, size_t n);
/* Creates one communicator per local GPU, global ranks rank_base + r of
 * world, in one group call and non-blocking (aborting any it had before),
 * and waits up to timeout_ms for them (less if cancel_fd, when >= 0,
 * becomes readable). On failure every communicator is aborted and why says
 * what went wrong. */
int cuda_connect(struct gs_backend *b, const uint8_t uid[GS_NCCL_UID_BYTES], uint32_t rank_base,
		 uint32_t world, int timeout_ms, int cancel_fd, char *why, size_t n);
/* Aborts the communicators (the backend's leave_group: a node went away,
 * or they are to be made again): buckets fail with GS_ESTATE until
 * cuda_connect. */
void cuda_disconnect(struct gs_backend *b);
/* Alone (one node), the communicators made with a fresh unique id: the
 * first time, or again after a failure aborted them, once the streams
 * have drained. */
int cuda_connect_alone(struct cuda_backend *cb);

/* usable.c: which of the daemon's devices gpus (gs_cuda_options) names.
 * GS_OK, or GS_EINVAL with why when it names a GPU the daemon does not see. */
int cuda_parse_gpus(const char *gpus, bool allowed[MAX_DEVICES], char *why, size_t n);

/* wait.c */
uint64_t cuda_now_ms(void);
/* One wait for the GPU: it spins briefly first (cuda_wait_spin says
 * whether it still does), then sleeps. Zeroed before each wait. */
struct cuda_wait {
	uint64_t since;    /* when the wait began (ns) */
	uint64_t sleep_ns; /* the last sleep of cuda_wait_pause */
};
/* Spins a little and returns true while the wait's first microseconds
 * last; false after. */
bool cuda_wait_spin(struct cuda_wait *w);
/* Spins, then sleeps a little longer each time (to a bound): only where
 * nothing can wake the waiter (NCCL's non-blocking calls). */
void cuda_wait_pause(struct cuda_wait *w);
/* Words a CUDA error on local rank r in cb->base.error; GS_ESYSTEM. */
int cuda_error(struct cuda_backend *cb, const char *what, unsigned r, cudaError_t e);
/* Words an NCCL error, aborts every communicator; GS_ESYSTEM. */
int cuda_nccl_error(struct cuda_backend *cb, const char *what, unsigned r, ncclResult_t res);
/* Aborts every communicator; once connected, the backend is broken (why). */
void cuda_abort_comms(struct cuda_backend *cb, const char *why);
/* Until no communicator is ncclInProgress, within timeout_ms (or until
 * cancel_fd, when >= 0, is readable); on failure the communicators are
 * aborted. */
int cuda_wait_comms(struct cuda_backend *cb, const char *what, int timeout_ms, int cancel_fd);
/* Until every rank's stream has drained, within --peer-timeout, watching
 * the communicators' errors. */
int cuda_wait_streams(struct cuda_backend *cb, const char *what);
/* The same within timeout_ms (shutting down, say). */
int cuda_wait_streams_within(struct cuda_backend *cb, const char *what, int timeout_ms);
/* The same for local rank r's stream alone. */
int cuda_wait_stream(struct cuda_backend *cb, unsigned r, const char *what);

/* wake.c: a wake-up from the GPU, an eventfd that a host function queued
 * on a stream writes to once the stream gets there. */
struct cuda_wake;
struct cuda_wake *cuda_wake_new(void);
/* Frees it, unless a wake-up is still queued on a stuck stream: then it
 * is left to the process's exit. */
void cuda_wake_free(struct cuda_wake *w);
/* Queues a wake-up behind the work queued on stream so far. */
cudaError_t cuda_wake_after(struct cuda_wake *w, cudaStream_t stream);
/* Sleeps until a wake-up came (since the last sleep), cancel_fd (when
 * >= 0) is readable, or cuda_now_ms() reaches until_ms. */
void cuda_wake_sleep(struct cuda_wake *w, int cancel_fd, uint64_t until_ms);

#endif
