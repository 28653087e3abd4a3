/*
 * The rendezvous between the daemons of a multi-node job, as torchrun's:
 * the job's node-rank-0 daemon serves it on its node port (on its event
 * loop);
 * every daemon, rank 0 included, joins it as a client and keeps the
 * connection for its life. Through it the daemons check that they agree
 * (protocol version, node count, node ranks, shared settings), learn each
 * node's trainer count, share a key-value store that builds the Gloo group,
 * and agree on each job's layout before its first step.
 *
 * The client side is blocking, with deadlines: it runs on the worker
 * thread, never on the event loop, which keeps serving trainers, status
 * queries and (on node 0) the rendezvous itself.
 */
#ifndef GS_RENDEZVOUS_H
#define GS_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "cluster/admission.h"
#include "engine/layout.h"
#include "gradsync.pb-c.h"
#include "support/log.h"

struct gs_server;
struct gs_rdv_server;
struct gs_settings;
struct node_port_job;


/* ---- The node port (loop thread) --------------------------------------- */

/* One listener for the rendezvous of every job whose node 0 this daemon
 * is, on --node-address and --node-port; a connection's NodeAuth names
 * its job (rendezvous_port.c). The port knows the servers; they know
 * nothing of it. */
struct gs_node_port {
	uv_loop_t *loop;
	const struct gs_settings *settings; /* the node's */
	struct gs_server *server; /* the local listener: its connection set and spare descriptor */
	int fd;
	uv_poll_t poll;
	uv_timer_t tick; /* held-back log lines; listening again after EMFILE */
	bool paused;
	struct gs_admission lobby; /* connections that have not yet named their job */
	struct gs_log_group quiet;
	struct node_port_job *served; /* the jobs it serves */
};

/* Listens; returns 0, or -errno having logged why. */
int gs_node_port_start(struct gs_node_port *np, uv_loop_t *loop,
		       const struct gs_settings *settings, struct gs_server *server);
/* Stops listening (shutdown); connections close with every other one. */
void gs_node_port_close(struct gs_node_port *np);
/* The rendezvous this port serves for job_id, or NULL. */
struct gs_rdv_server *gs_node_port_find(const struct gs_node_port *np, const char *job_id);

/* ---- Server (node rank 0 of a job, loop thread) ------------------------ */

/* Serves the rendezvous of the job of settings (its job id, node count,
 * shared settings) through np; its connections join the local
 * listener's connection set (serve/server.h). settings stay the caller's
 * and must outlive the server. Returns 0 with *out set, or -errno after
 * logging (-EEXIST: np serves that job already). */
int gs_node_port_serve(struct gs_node_port *np, const struct gs_settings *settings,
		       struct gs_rdv_server **out);
/* Stops serving s: closes its peers' connections (the other nodes learn
 * that node 0 has gone); the server is freed once its handles have
 * closed. NULL does nothing. */
void gs_node_port_unserve(struct gs_node_port *np, struct gs_rdv_server *s);

/* ---- Client (worker thread) -------------------------------------------- */

struct gs_rdv_client;

struct gs_node_info {
	uint32_t local_size;
	char host[256];
};

/* Connects to the coordinator, retrying with back-off until join_timeout,
 * says hello and waits until every node has joined. On success *out holds
 * the connection and nodes[0..nodes) what each node said. On failure err
 * says why (refused, with the coordinator's words, or timed out). Every
 * wait also ends, with GS_EABORTED, when cancel_fd becomes readable (the
 * daemon is shutting down). */
int gs_rdv_join(const struct gs_settings *s, const char *gloo_host, int cancel_fd,
		struct gs_node_info *nodes, struct gs_rdv_client **out,
		char *err, size_t errlen);
void gs_rdv_client_close(struct gs_rdv_client *c);

/* The shared key-value store, for Gloo's rendezvous (gloo_comm.h). */
int gs_rdv_store_set(void *client, const char *key, const void *value, size_t len);
int gs_rdv_store_get(void *client, const char *key, void **value, size_t *len,
		     int timeout_ms);

/* While the caller does something long that is not the rendezvous
 * (making NCCL communicators, waiting for the worker), a thread of its
 * own answers the coordinator's pings on c, so that this node is not
 * taken for lost meanwhile; nothing else may use c until
 * gs_rdv_client_unpark (gs_rdv_client_close unparks too). Returns GS_OK or
 * GS_ESYSTEM, when the pings go unanswered and the caller goes on. */
int gs_rdv_client_park(struct gs_rdv_client *c);
void gs_rdv_client_unpark(struct gs_rdv_client *c);

/* The generation of the group the NodeWelcome asked for. */
uint64_t gs_rdv_generation(const struct gs_rdv_client *c);
/* The coordinator's incarnation the NodeWelcome named (never 0). */
uint64_t gs_rdv_incarnation(const struct gs_rdv_client *c);

/* Hands the joined connection over to the event loop: returns its
 * descriptor (non-blocking now) and, in *pending, a malloc'd copy of any
 * bytes already read but not yet a message. Frees c. */
int gs_rdv_client_detach(struct gs_rdv_client *c, uint8_t **pending, size_t *len);

/* A connection to the coordinator for the store alone (rebuilding the
 * group while the loop keeps the node's connection). Retries until the
 * join timeout. */
int gs_rdv_store_connect(const struct gs_settings *s, int cancel_fd,
			 struct gs_rdv_client **out, char *err, size_t errlen);

#endif
