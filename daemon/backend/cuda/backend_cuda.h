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

struct gs_cuda_options {
	unsigned local_size;
	enum gs_wire wire;
	uint64_t fusion_elements;
	int peer_timeout_ms; /* one all-reduce may take this long, then the
				communicators are aborted */
	uint32_t nodes;      /* of the job: one makes its communicators at once */
	int join_timeout_ms; /* the longest making communicators may take */
};

/* Whether this node can run the CUDA backend with one GPU per local rank.
 * When it cannot, why says so: the driver is missing or too old, no
 * device is visible, too few devices, a device too old for the kernels. */
bool gs_cuda_usable(unsigned local_size, char *why, size_t n);

/* Sets up every local rank's GPU (stream, fusion buffer) and, on a node
 * alone (nodes 1), its NCCL communicators; with several nodes they come
 * with the group (the backend's join_group). NULL with the reason in why. */
struct gs_backend *gs_backend_cuda_open(const struct gs_cuda_options *o, char *why, size_t n);

#endif
