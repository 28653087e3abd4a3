/*
 * The CUDA backend: local rank r reduces on the node's GPU r, with a
 * stream, a fusion buffer and (once joined) an NCCL communicator of its
 * own, all driven from the worker thread. Trainers hand over CUDA IPC
 * handles of their gradients' base allocations, opened once each, and a
 * pair of IPC events: the daemon's stream waits on the trainer's "ready"
 * event before packing and records its "done" event after unpacking, so
 * neither host waits for the other's GPU.
 */
#ifndef GS_BACKEND_CUDA_H
#define GS_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct gs_node_info;
struct gs_rdv_client;
struct gs_settings;

#define GS_NCCL_UID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

struct gs_cuda_options {
	unsigned local_size;
	enum gs_wire wire;
	uint64_t fusion_elements;
	int peer_timeout_ms; /* one all-reduce may take this long, then the
				communicators are aborted */
};

/* Whether this node can run the CUDA backend with one GPU per local rank.
 * When it cannot, why says so: the driver is missing or too old, no
 * device is visible, too few devices, a device too old for the kernels. */
bool gs_cuda_usable(unsigned local_size, char *why, size_t n);

/* Sets up every local rank's GPU (stream, fusion buffer); communicators
 * come with gs_backend_cuda_connect. NULL with the reason in why. */
struct gs_backend *gs_backend_cuda_create(const struct gs_cuda_options *o, char *why,
					  size_t n);
bool gs_backend_is_cuda(const struct gs_backend *b);

/* A fresh NCCL unique id, made by node rank 0 and shared by the rendezvous. */
int gs_cuda_nccl_uid(uint8_t uid[GS_NCCL_UID_BYTES], char *why, size_t n);

/* Creates one communicator per local GPU, global ranks rank_base + r of
 * world, in one group call and non-blocking (aborting any it had before),
 * and waits up to timeout_ms
 * for them (less if cancel_fd, when >= 0, becomes readable). On failure
 * every communicator is aborted and why says what went wrong. */
int gs_backend_cuda_connect(struct gs_backend *b, const uint8_t uid[GS_NCCL_UID_BYTES],
			    uint32_t rank_base, uint32_t world, int timeout_ms, int cancel_fd,
			    char *why, size_t n);

/* Aborts the communicators (a node went away, or they are to be made
 * again): buckets fail with GS_ESTATE until gs_backend_cuda_connect. */
void gs_backend_cuda_disconnect(struct gs_backend *b);

/* The backend for these settings: created, and with --nodes 1 connected
 * (several nodes connect in gs_cuda_join). NULL with the reason in why. */
struct gs_backend *gs_backend_cuda_open(const struct gs_settings *s, char *why, size_t n);

/* Several nodes, while joining or regrouping (worker thread): checks that
 * every node runs this backend, shares node 0's NCCL unique id through
 * the rendezvous store (keys "<prefix>backend/<node>", "<prefix>nccl/uid";
 * the prefix names the group, so a regroup never reads an old id) and
 * connects. A host-backend node only says which backend it runs. Returns
 * GS_OK or a GS_E* code with why. */
int gs_cuda_join(struct gs_backend *b, struct gs_rdv_client *rdv, const char *prefix,
		 const struct gs_settings *s, const struct gs_node_info *nodes, int cancel_fd,
		 char *why, size_t n);

#endif
