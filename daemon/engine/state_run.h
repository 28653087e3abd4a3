/*
 * One state broadcast as the worker thread runs it: what state_broadcast.c
 * (the node's collective, on the loop) hands to the worker, and what
 * state_nodes.c (the part between nodes) reads and writes there.
 */
#ifndef GS_STATE_RUN_H
#define GS_STATE_RUN_H

#include <stdint.h>

#include "engine/group_port.h"
#include "engine/job.h"
#include "support/worker.h"

struct state_run {
	struct gs_work work;
	struct gs_job *job;
	struct gs_trainer *trainers[GS_MAX_LOCAL]; /* by local rank */
	uint32_t local_size;
	bool has_source;     /* the source is one of this node's trainers */
	uint32_t source;     /* its local rank, if so */
	uint64_t source_rank; /* its global rank */
	uint32_t *tensors;   /* the indices copied */
	size_t ntensors;
	uint64_t bytes;      /* of each trainer */
	struct gs_world world; /* as the broadcast began */
	uint64_t start_ns;   /* the last local trainer asked */
	uint64_t duration_ns;
	uint32_t done;       /* tensors copied whole */
	int status;
	bool group_failed;   /* the collective between nodes broke the group */
	bool aborting;       /* this node's trainers failed it: tell the others */
	char error[512];
};

/* Copies tensor i of the source into every other local trainer's state
 * (from the local rank `from` of this node, which holds it). Worker
 * thread. Returns GS_OK or a GS_E* code with run->error. */
int gs_state_copy_local(struct state_run *run, uint32_t i, uint32_t from);

/* The broadcast between nodes (state_nodes.c): agrees with the other
 * nodes on the source, the state layout and the tensors, then sends or
 * takes every tensor. Worker thread. Sets run->status and run->error. */
void gs_state_nodes_run(struct state_run *run);
/* This node's trainers failed the broadcast before it began (run->status
 * and run->error say why): takes part in its first collective only, so
 * that the other nodes, which may be waiting in it, fail with the same
 * words at once. Worker thread. */
void gs_state_nodes_abort(struct state_run *run);

#endif
