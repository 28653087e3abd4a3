/*
 * The CUDA backend: each local rank reduces on the GPU that holds its
 * tensors, found by the PCI bus id its trainer sends (the trainer's own
 * device numbering means nothing here), with a stream, a fusion buffer
 * and an NCCL communicator of its own, all driven from the worker thread. Trainers hand over CUDA IPC
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
	uint64_t fusion_elements; /* the job's fusion buffer setting: launches are cut at it */
	int peer_timeout_ms; /* one all-reduce may take this long, then the
				communicators are aborted */
	uint32_t nodes;      /* of the job: one makes its communicators alone */
	int join_timeout_ms; /* the longest making communicators may take */
	/* The GPUs trainers' tensors may be on: PCI bus ids, comma-separated
	 * ("0000:3b:00.0,0000:5e:00.0"; any form cudaDeviceGetByPCIBusId
	 * takes), each one this daemon sees; NULL, or a list naming none (""):
	 * every GPU it sees. */
	const char *gpus;
	struct gs_fusion_budget *budget; /* the node's (fusion_budget.h); NULL: no limit */
};

/* Whether this node can run the CUDA backend: at least one GPU it sees
 * (of those gpus names, as in gs_cuda_options; NULL: any) is usable. When
 * none is, why says so: the driver is missing or too old, no device is
 * visible, gpus names one it does not see, every one is too old for the
 * kernels. */
bool gs_cuda_usable(const char *gpus, char *why, size_t n);

/* The backend, no GPU set up yet: each local rank's is bound when its
 * trainer's first CUDA buffer comes, and the NCCL communicators are made
 * at the first bucket, once every rank's is known (alone: nodes 1; with
 * several nodes, of the group the backend's join_group joined). NULL with
 * the reason in why (gpus names a GPU this daemon does not see). */
struct gs_backend *gs_backend_cuda_open(const struct gs_cuda_options *o, char *why, size_t n);

#endif
