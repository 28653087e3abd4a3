/*
 * The rendezvous server's own parts, shared by its files and by the node
 * port (rendezvous_port.c), which calls its functions but reads none of
 * its fields (rendezvous.h is what the rest of the daemon sees):
 *
 *   rendezvous_server.c  joining, the key-value store, layout agreement,
 *                        what an authenticated peer says
 *   rendezvous_peers.c   connections: admission, the authentication
 *                        deadline, closing
 *   rendezvous_auth.c    the secret exchange before anything else
 *
 * Names here start with rdv_: internal to the server, as libuv's uv__.
 */
#ifndef GS_RENDEZVOUS_SERVER_H
#define GS_RENDEZVOUS_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "cluster/admission.h"
#include "cluster/auth.h"
#include "engine/layout.h"
#include "gradsync.pb-c.h"
#include "support/log.h"

struct gs_conn;

struct gs_settings;

/* Layouts of large models exceed a trainer's frame limit. */
#define NODE_MAX_FRAME (64u << 20)
/* Until a peer has authenticated, its frames are small (NodeAuth,
 * NodeProof), and only so many such peers are held at once: room for
 * every node joining at the same moment, a few times over. Past that a
 * newcomer takes the place of an older one (admission.h), so that
 * strangers who hold connections open can delay a node but not keep it
 * out, and memory stays bounded. */
#define AUTH_MAX_FRAME 4096u
#define AUTH_MAX_PENDING(nodes) (4u * (nodes) + 64u)

enum peer_state { PEER_NEW, PEER_CHALLENGED, PEER_AUTHED };

/* One connection to the rendezvous: how far it has authenticated, and the
 * node it joined as (NULL: not yet, or a connection for the store alone). */
struct rdv_peer {
	struct gs_rdv_server *server;
	struct gs_conn *conn;
	/* Until it has authenticated: its place among the strangers, and its
	 * deadline (--auth-timeout). */
	struct gs_admission_entry admission;
	struct rdv_peer *all_prev, *all_next; /* every peer: gs_rdv_server.peers */
	struct rdv_node *node;
	enum peer_state state;
	bool has_rank;
	uint32_t rank; /* claimed in NodeAuth, bound into both proofs */
	uint8_t node_nonce[GS_AUTH_NONCE];
	uint8_t nonce[GS_AUTH_NONCE]; /* the coordinator's */
	/* Once it has authenticated: its pings, and the check that it is not
	 * silent; or a claim's probe (rdv_claim). */
	uv_timer_t timer;
	int handles; /* timer and admission's: the peer is freed with the last */
	uint64_t ping_seq; /* of the last Ping sent */
	struct rdv_node *claim; /* the node whose rank it claims (rdv_claim) */
	char gone[160];    /* why it was dropped, for the other nodes; "": it closed */
};

struct rdv_node {
	struct gs_conn *conn; /* NULL until joined, and after it leaves */
	bool welcomed;        /* is in the current Gloo group */
	uint32_t local_size;
	char host[256];
	bool has_job;         /* offered a layout, not withdrawn */
	struct gs_layout offer;
	uint64_t offer_round; /* 0: none pending */
	/* A second daemon's claim to the rank while conn holds it, held until
	 * the holder answers a Ping (the claim is refused) or has not within
	 * gs_probe_ms (the holder is dropped and the claimant joins). */
	struct rdv_peer *claimant;
	uint32_t claim_local_size;
	char claim_host[256];
	uint64_t probe_seq; /* the holder's Ping whose Pong settles it */
};

struct rdv_entry {
	struct rdv_entry *next;
	char *key;
	size_t len;
	uint8_t value[];
};

struct rdv_wait {
	struct rdv_wait *next;
	struct gs_conn *conn;
	char *key;
};

struct gs_rdv_server {
	uv_loop_t *loop;
	const struct gs_settings *settings; /* the job's */
	struct gs_server *server; /* the local listener: its connection set and spare descriptor */
	uv_timer_t tick; /* tells the counts of held-back lines (quiet) */
	bool stopped;    /* rdv_server_stop: its peers' closing is not news */
	/* tick and each peer: the server is freed with the last of them
	 * (rdv_server_unref). */
	int handles;
	uint32_t nodes, joined;
	struct gs_admission strangers; /* connections not yet authenticated */
	struct rdv_peer *peers;           /* every connection, to close them all */
	struct gs_log_group quiet;        /* lines about them */
	struct rdv_node *node;
	bool formed;          /* the group has been built once */
	uint64_t generation;  /* of the current group */
	uint64_t incarnation; /* drawn at start: this coordinator's store keys */
	bool has_agreed;      /* the job's layout, once every node agreed */
	struct gs_layout agreed;
	char shared_settings[512]; /* what every node must say alike */
	struct rdv_entry *store;
	struct rdv_wait *waits;
};

/* ---- rendezvous_peers.c ----------------------------------------------- */

/* The strangers' queue: AUTH_MAX_PENDING(s->nodes) of them, each given
 * --auth-timeout. */
void rdv_strangers_init(struct gs_rdv_server *s);

/* Takes over a connection from the node port (rendezvous_port.c) whose
 * first message, a NodeAuth, named s's job; makes room first, by the
 * limit on connections not yet authenticated. The caller then hands that
 * message to rdv_authenticate. Returns the peer, or NULL having closed
 * the connection. */
struct rdv_peer *rdv_adopt(struct gs_rdv_server *s, struct gs_conn *c,
			   const struct sockaddr_storage *a);
/* Closes every peer's connection (the server stops). */
void rdv_close_peers(struct gs_rdv_server *s);
/* Logs why a peer is turned away, with its address, tells it the same
 * words and closes the connection. */
void rdv_refuse(struct rdv_peer *p, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The peer has proven itself: it may say anything now, and is pinged. */
void rdv_authenticated(struct gs_rdv_server *s, struct rdv_peer *p);
/* A Ping or a Pong from an authenticated peer. */
void rdv_liveness(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__Message *m);
/* p says hello for node n's rank, which another connection holds: the
 * holder is asked whether it is alive, and the claim waits (bounded). */
void rdv_claim(struct gs_rdv_server *s, struct rdv_node *n, struct rdv_peer *p,
	       uint32_t local_size, const char *host);
/* p is going: a claim it made goes with it. */
void rdv_claim_withdrawn(struct rdv_peer *p);
/* n's holder has gone: a daemon that claimed n's rank joins as it. */
void rdv_claim_granted(struct gs_rdv_server *s, struct rdv_node *n);

/* ---- rendezvous_auth.c ------------------------------------------------ */

/* What a peer says before it has authenticated. */
void rdv_authenticate(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__Message *m);

/* Before a peer has authenticated, only the exchange itself is served:
 * what m is, said in state: the next step of it, or a refusal (*code and
 * why). A NodeHello of another protocol version (a daemon from before the
 * exchange, or after it) still gets the version's own message. */
enum rdv_auth_step { RDV_STEP_AUTH, RDV_STEP_PROOF, RDV_STEP_REFUSE };
enum rdv_auth_step rdv_auth_next(enum peer_state state, const Gradsync__Message *m, int *code,
				 char *why, size_t n);

/* What refuses a NodeAuth whatever job it names (another protocol
 * version, a malformed nonce, a secret on one side only), by the node's
 * settings s: GS_OK, or a GS_E* code with why. The node port refuses a
 * NodeAuth for a job it does not serve by the same words, so that until a
 * peer has proven the secret both are answered alike. */
int rdv_auth_refusal(const struct gs_settings *s, const Gradsync__NodeAuth *a, char *why, size_t n);
/* Sends the coordinator's half of the nonces (GS_AUTH_NONCE bytes). */
void rdv_send_challenge(struct gs_conn *c, const uint8_t *nonce, bool has_secret);
/* A proof that does not check out, in the words both kinds of peer get. */
#define RDV_SECRET_DIFFERS "cluster secret differs (check --cluster-secret-file on every node)"

/* ---- rendezvous_server.c ---------------------------------------------- */

/* Serves the rendezvous of the job of settings (its job id, node count,
 * shared settings); the node port (gs_node_port_serve) hands it the
 * connections that name the job, through rdv_adopt. Its connections join
 * the local listener's connection set (serve/server.h). settings stay the
 * caller's and must outlive the server. Returns 0 with *out set, or
 * -errno after logging. */
int rdv_server_start(uv_loop_t *loop, const struct gs_settings *settings,
		     struct gs_server *server, struct gs_rdv_server **out);
/* Stops serving: closes its peers' connections; the server is freed once
 * its handles have closed. */
void rdv_server_stop(struct gs_rdv_server *s);

/* Every message of a node connection (conn.c's dispatch). */
void rdv_dispatch(struct gs_conn *c, const Gradsync__Message *m);
/* A handle of the server's, or a peer's timer, has closed: the server is
 * freed with the last. */
void rdv_server_unref(struct gs_rdv_server *s);
/* An authenticated peer's connection has closed: its waits go, and the
 * node it joined as is free again, which the other nodes are told. */
void rdv_peer_closed(struct gs_rdv_server *s, struct rdv_peer *p);
/* p joins as node n (its hello said local_size trainers and host). */
void rdv_join(struct gs_rdv_server *s, struct rdv_node *n, struct rdv_peer *p,
	      uint32_t local_size, const char *host);

#endif
