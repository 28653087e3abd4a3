/*
 * The daemon's place among the nodes of a job: joining the rendezvous and
 * building the group at start (on the worker thread, so the loop of node
 * 0 keeps serving the rendezvous), and agreeing on each job's layout with
 * the other nodes before its first step. A node other than 0 whose
 * coordinator went away joins its successor, builds a new group with it
 * and offers it the job's layout again. With --nodes 1 there is nothing
 * to join and every call here completes at once.
 *
 * The group is the cluster's Gloo context, in which the nodes vote, and
 * whatever the backend makes of it through its join_group op (backend.h),
 * for which the cluster lends it a key-value store over the rendezvous.
 * The cluster sits above the engine: it tells the job of verdicts, peers
 * lost and groups rebuilt by calling it, and the four calls the engine
 * makes of it (agree_layout, withdraw_layout, request_regroup, vote) take
 * the cluster as an untyped first argument, to fill the engine's group
 * port with as they are.
 */
#ifndef GS_CLUSTER_H
#define GS_CLUSTER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/membership.h"
#include "cluster/rendezvous.h"
#include "support/worker.h"

struct gs_backend;

struct gs_gloo;
struct gs_job;
struct gs_layout;
struct gs_settings;

/* What the cluster works with; none of it is the cluster's to free. */
struct gs_cluster_parts {
	uv_loop_t *loop;
	const struct gs_settings *settings;
	struct gs_backend *backend; /* joins and leaves each group through its ops */
	struct gs_worker *worker;   /* builds the group, runs the votes */
	struct gs_job *job;         /* told of verdicts, peers lost, groups rebuilt */
	/* The local listener: its connection set (gs_conn_create) holds the
	 * coordinator's connection and node 0's rendezvous peers, and its
	 * spare descriptor refuses a peer when descriptors run out. */
	struct gs_server *server;
	struct gs_node_port *port; /* serves the rendezvous when this node is the job's node 0 */
};

struct gs_cluster {
	uv_loop_t *loop;
	const struct gs_settings *settings;
	struct gs_backend *backend;
	struct gs_worker *worker;
	struct gs_job *job;
	struct gs_server *server; /* the local listener: its connection set and spare descriptor */
	struct gs_node_port *port;
	struct gs_rdv_server *rdv_server; /* node rank 0 only */

	uint32_t nodes;
	uint32_t node_rank;
	uint32_t world_size;  /* trainers of all nodes */
	uint32_t rank_base;   /* global rank of this node's local rank 0 */
	struct gs_node_info *node; /* by node rank */
	struct gs_rdv_client *rdv; /* worker thread only */
	/* Made and dropped by the worker thread; the loop thread reaches it
	 * only to interrupt it (a node gone), under gloo_lock. */
	struct gs_gloo *gloo;
	pthread_mutex_t gloo_lock;
	/* Where this node stands in the group (membership.h): the loop's
	 * to change, through the events it sees. */
	struct gs_membership member;
	int cancel_fd; /* an eventfd: readable once the daemon shuts down */
	/* After joining, the loop holds the connection to the coordinator. */
	struct gs_conn *conn;
	bool *lost;           /* by node rank, member's: its daemon went away */
	uint64_t incarnation; /* of the coordinator that welcomed this node */
	/* Node 0 went away: a thread of its own joins its successor, with
	 * the back-off of the start, while the worker stays free for the
	 * votes that end steps. */
	bool rejoiner_started;
	struct gs_worker rejoiner;
	uv_timer_t agree_timer; /* bounds a layout agreement */
	/* Pings the coordinator on conn and takes --peer-timeout of silence
	 * as its loss (liveness.h). */
	uv_timer_t ping_timer;
	uint64_t ping_seq;
	/* Set by the ping timer as it drops a silent coordinator: how long it
	 * had been silent, for the close's log line; 0: not dropped for that. */
	uint64_t coordinator_silent_ms;
	uint64_t agree_round; /* the offer waiting for its verdict, 0: none */
};

/* Sets c up with the daemon's parts; nothing is joined yet. */
void gs_cluster_init(struct gs_cluster *c, const struct gs_cluster_parts *parts);

/* Starts joining (node 0 also starts serving the rendezvous). ready(arg,
 * rc, why) runs on the loop when the node has joined (GS_OK) or failed
 * (a GS_E* code, why says how; also logged); at once for a job of one
 * node. Returns GS_OK, or a GS_E* code (logged) when the join could not
 * start. */
int gs_cluster_start(struct gs_cluster *c, void (*ready)(void *arg, int rc, const char *why),
		     void *arg);
/* The daemon shuts down: what completes from now on is not acted upon,
 * any wait on the other nodes ends, and the thread that re-joins a
 * restarted coordinator is joined. First in the shutdown, before any
 * connection is closed. */
void gs_cluster_cancel(struct gs_cluster *c);
/* Stops the rendezvous server (node 0) and closes the cluster's handles,
 * once every connection has closed and the job with them. */
void gs_cluster_close(struct gs_cluster *c);
/* Frees what the cluster made, once the loop has run dry. */
void gs_cluster_destroy(struct gs_cluster *c);

/* ---- What the engine asks of the node group (its group port) ------------- */

/* Offers the job's layout (of this hash; round-th of this node) to the
 * other nodes; the verdict, or a timeout after --join-timeout, reaches
 * gs_job_layout_verdict on the loop. layout stays the caller's and must
 * not change until then. cluster: a struct gs_cluster. Returns GS_OK, or
 * GS_EDISCONNECTED when there is no coordinator to ask. */
int gs_cluster_agree_layout(void *cluster, uint64_t round, const struct gs_layout *layout,
			    uint64_t hash);
/* The node's job has ended: its layout no longer binds the others.
 * Nothing once the cluster is cancelled (shutting down). */
void gs_cluster_withdraw_layout(void *cluster);

/* Sums v[0..n) over all nodes (fp32, in place) through the Gloo group;
 * worker thread. Returns GS_OK or a GS_E* code with err. */
int gs_cluster_vote(void *cluster, float *v, size_t n, char *err, size_t errlen);

/* The group of `generation` failed on this node though no node went away:
 * asks the coordinator for a new one (every node builds it, as after a
 * node's return); steps wait meanwhile. Nothing if the group has been
 * rebuilt since. */
void gs_cluster_request_regroup(void *cluster, uint64_t generation, const char *why);

/* The state of a node of the job as this daemon knows it, as status
 * names it: each name fits the char[32] of the public API's struct
 * gs_peer_status (tests/unit/test-state-names.c checks). */
enum gs_peer_states {
	GS_PEER_THIS_NODE,
	GS_PEER_JOINING,
	GS_PEER_JOINED,
	GS_PEER_REGROUPING,
	GS_PEER_LOST,
	GS_PEER_STATES
};
extern const char *const gs_peer_state_names[GS_PEER_STATES];
/* Node `rank`'s, one of gs_peer_state_names. */
const char *gs_cluster_peer_state(const struct gs_cluster *c, uint32_t rank);
/* Whether node `rank` is up as far as this daemon knows: this node, or
 * one that joined and is not lost. */
bool gs_cluster_peer_up(const struct gs_cluster *c, uint32_t rank);

#endif
