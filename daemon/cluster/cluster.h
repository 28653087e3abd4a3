/*
 * The daemon's place among the nodes of a job: joining the rendezvous and
 * building the Gloo group at start (on the worker thread, so the loop of
 * node 0 keeps serving the rendezvous), and agreeing on each job's layout
 * with the other nodes before its first step. A node other than 0 whose
 * coordinator went away joins its successor, builds a new group with it
 * and offers it the job's layout again. With --nodes 1 there is
 * nothing to join and every call here completes at once.
 */
#ifndef GS_CLUSTER_H
#define GS_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/rendezvous.h"
#include "support/worker.h"

struct gs_daemon;
struct gs_gloo;

struct gs_cluster {
	uint32_t nodes;
	uint32_t node_rank;
	uint32_t world_size;  /* trainers of all nodes */
	uint32_t rank_base;   /* global rank of this node's local rank 0 */
	struct gs_node_info *node; /* by node rank */
	struct gs_rdv_client *rdv; /* worker thread only */
	struct gs_gloo *gloo;
	bool joined;
	int cancel_fd; /* an eventfd: readable once the daemon shuts down */
	/* After joining, the loop holds the connection to the coordinator. */
	struct gs_conn *conn;
	bool group_ready;     /* the Gloo group works: buckets may launch */
	bool *lost;           /* by node rank: its daemon went away */
	uint64_t generation;  /* of the Gloo group */
	uint64_t incarnation; /* of the coordinator that welcomed this node */
	/* Node 0 went away: a thread of its own joins its successor, with
	 * the back-off of the start, while the worker stays free for the
	 * votes that end steps. */
	bool rejoining;
	bool rejoiner_started;
	struct gs_worker rejoiner;
	uv_timer_t agree_timer; /* bounds a layout agreement */
	/* Pings the coordinator on conn and takes --peer-timeout of silence
	 * as its loss (liveness.h). */
	uv_timer_t ping_timer;
	uint64_t ping_seq;
	uint64_t agree_round; /* the offer waiting for its verdict, 0: none */
};

/* Starts joining (node 0 also starts serving the rendezvous). ready runs on
 * the loop when the node has joined (ok) or failed (the reason logged). */
int gs_cluster_start(struct gs_daemon *d, void (*ready)(struct gs_daemon *d, bool ok));
/* Ends any wait on the other nodes (shutdown), and joins the thread that
 * re-joins a restarted coordinator. */
void gs_cluster_cancel(struct gs_daemon *d);
void gs_cluster_destroy(struct gs_daemon *d);

/* Offers the job's layout (round-th of this node) to the other nodes; the
 * verdict, or a timeout after --join-timeout, reaches gs_job_layout_verdict
 * on the loop. */
int gs_cluster_agree_layout(struct gs_daemon *d, uint64_t round);
/* The node's job has ended: its layout no longer binds the others. */
void gs_cluster_withdraw_layout(struct gs_daemon *d);

/* Sums v[0..n) over all nodes (fp32, in place) through the Gloo group;
 * worker thread. Returns GS_OK or a GS_E* code with err. */
int gs_cluster_vote(struct gs_daemon *d, float *v, size_t n, char *err, size_t errlen);

/* The group of `generation` failed on this node though no node went away:
 * asks the coordinator for a new one (every node builds it, as after a
 * node's return); steps wait meanwhile. Nothing if the group has been
 * rebuilt since. */
void gs_cluster_request_regroup(struct gs_daemon *d, uint64_t generation, const char *why);

/* The state of node `rank` as this daemon knows it, for status. */
const char *gs_cluster_peer_state(const struct gs_cluster *c, uint32_t rank);

#endif
