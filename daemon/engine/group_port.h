/*
 * The step engine's way to the other nodes of the job, owned by the engine
 * and filled in by whoever runs the node group (the cluster) at start, as
 * libseat's seat listener is filled in by its user. The engine calls these
 * and nothing else of the group; what the group learns (a node lost, the
 * group whole again, the nodes' verdict on a layout) it tells the engine
 * through the calls of job.h: gs_job_set_world, gs_job_peer_lost,
 * gs_job_regrouping, gs_job_resume and gs_job_layout_verdict.
 *
 * Threads: vote runs on the worker thread (inside a bucket's run, before
 * its collective); every other call on the loop thread. With one node the
 * engine calls none of them.
 */
#ifndef GS_GROUP_PORT_H
#define GS_GROUP_PORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gs_layout;

struct gs_group_port {
	void *ctx; /* the implementation's, passed back to each call */
	/* Offers the job's layout (its hash and its names and counts) as this
	 * node's round `round` to the other nodes. The verdict, or a timeout,
	 * reaches gs_job_layout_verdict on the loop later. Returns GS_OK, or a
	 * GS_E* code when it cannot be offered (the group is gone). The layout
	 * stays the caller's; it does not change until the round ends. */
	int (*agree_layout)(void *ctx, uint64_t round, const struct gs_layout *layout,
			    uint64_t hash);
	/* The job has ended: its layout no longer binds the other nodes. */
	void (*withdraw_layout)(void *ctx);
	/* The group of `generation` failed on this node though no node went
	 * away: asks for a new one; steps wait until gs_job_resume. Nothing if
	 * the group has been rebuilt since. */
	void (*request_regroup)(void *ctx, uint64_t generation, const char *why);
	/* Worker thread. Sums v[0..n) over every node (fp32, in place): each
	 * node's vote whether to go on with a bucket. Returns GS_OK, or a GS_E*
	 * code with err. */
	int (*vote)(void *ctx, float *v, size_t n, char *err, size_t errlen);
};

/* What the engine knows of the group of nodes, as the group tells it. */
struct gs_world {
	uint32_t nodes;
	uint32_t node_rank;
	uint32_t world_size;  /* trainers of all nodes */
	uint32_t rank_base;   /* global rank of this node's local rank 0 */
	uint64_t generation;  /* of the group the collectives run in */
	bool group_ready;     /* the group works: buckets may launch */
};

#endif
