/*
 * The rendezvous's first exchange (auth.h has the macs): before anything
 * else on a connection, the node and the coordinator prove to each other
 * that they hold the cluster secret, or agree that neither has one.
 */
#include <stdbool.h>
#include <string.h>

#include "cluster/auth.h"
#include "cluster/rendezvous_server.h"
#include "errors.h"
#include "node_protocol.h"
#include "serve/conn.h"
#include "support/settings.h"

static void send_challenge(struct rdv_peer *p, bool has_secret)
{
	Gradsync__NodeChallenge ch = GRADSYNC__NODE_CHALLENGE__INIT;
	ch.nonce.data = p->nonce;
	ch.nonce.len = GS_AUTH_NONCE;
	ch.has_secret = has_secret;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE;
	m.node_challenge = &ch;
	gs_conn_send(p->conn, &m);
}

/* The node's half of the nonces and what it claims; answered with the
 * coordinator's half, or refused. */
static void handle_auth(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__NodeAuth *a)
{
	const struct gs_settings *set = s->settings;
	bool mine = set->cluster_secret_len > 0;
	if (a->protocol_version != GS_NODE_PROTOCOL_VERSION) {
		rdv_refuse(p, GS_EVERSION, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
		           a->node_rank, a->protocol_version, GS_NODE_PROTOCOL_VERSION);
		return;
	}
	if (a->node_rank >= s->nodes) {
		rdv_refuse(p, GS_EREFUSED, "node rank %u is out of range for %u nodes", a->node_rank, s->nodes);
		return;
	}
	p->rank = a->node_rank;
	p->has_rank = true;
	if (a->nonce.len != GS_AUTH_NONCE) {
		rdv_refuse(p, GS_EPROTO, "its NodeAuth nonce has %zu bytes; %d expected", a->nonce.len,
		           GS_AUTH_NONCE);
		return;
	}
	if (mine && !a->has_secret) {
		rdv_refuse(p, GS_EREFUSED, "it has no cluster secret, but the coordinator has one (set the same --cluster-secret-file on every node)");
		return;
	}
	if (!mine && a->has_secret) {
		rdv_refuse(p, GS_EREFUSED, "it has a cluster secret, but the coordinator has none (set the same --cluster-secret-file on every node)");
		return;
	}
	if (gs_auth_nonce(p->nonce) < 0) {
		rdv_refuse(p, GS_ESYSTEM, "the coordinator cannot draw a random nonce");
		return;
	}
	memcpy(p->node_nonce, a->nonce.data, GS_AUTH_NONCE);
	send_challenge(p, mine);
	if (mine)
		p->state = PEER_CHALLENGED;
	else
		rdv_authenticated(s, p); /* neither side has a secret */
}

/* The node's proof; a good one is answered with the coordinator's. */
static void handle_proof(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__NodeProof *pr)
{
	const struct gs_settings *set = s->settings;
	if (!gs_auth_check(set->cluster_secret, set->cluster_secret_len, GS_AUTH_NODE, set->job_id, p->rank,
			   p->node_nonce, p->nonce, pr->mac.data, pr->mac.len)) {
		rdv_refuse(p, GS_EREFUSED, "cluster secret differs (check --cluster-secret-file on every node)");
		return;
	}
	uint8_t mac[GS_AUTH_MAC];
	if (gs_auth_mac(set->cluster_secret, set->cluster_secret_len, GS_AUTH_COORDINATOR, set->job_id,
			p->rank,
			p->node_nonce, p->nonce, mac) < 0) {
		rdv_refuse(p, GS_ESYSTEM, "the coordinator cannot compute its proof (libcrypto failed)");
		return;
	}
	Gradsync__NodeProof mine = GRADSYNC__NODE_PROOF__INIT;
	mine.mac.data = mac;
	mine.mac.len = sizeof(mac);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &mine;
	gs_conn_send(p->conn, &m);
	rdv_authenticated(s, p);
}

/* Before a peer has authenticated, only the exchange itself is served. A
 * NodeHello of another protocol version (a daemon from before this
 * exchange, or after it) still gets the version's own message. */
void rdv_authenticate(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__Message *m)
{
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_NODE_AUTH:
		if (p->state == PEER_NEW)
			handle_auth(s, p, m->node_auth);
		else
			rdv_refuse(p, GS_EPROTO, "NodeAuth sent twice");
		return;
	case GRADSYNC__MESSAGE__BODY_NODE_PROOF:
		if (p->state == PEER_CHALLENGED)
			handle_proof(s, p, m->node_proof);
		else
			rdv_refuse(p, GS_EPROTO, "NodeProof before NodeAuth");
		return;
	case GRADSYNC__MESSAGE__BODY_NODE_HELLO:
		if (m->node_hello->protocol_version != GS_NODE_PROTOCOL_VERSION) {
			rdv_refuse(p, GS_EVERSION, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
			           m->node_hello->node_rank, m->node_hello->protocol_version,
			           GS_NODE_PROTOCOL_VERSION);
			return;
		}
		break;
	default:
		break;
	}
	rdv_refuse(p, GS_EREFUSED, "message %d before authenticating: the rendezvous serves nothing until a node has proven it holds the cluster secret (NodeAuth, NodeProof)",
	           (int)m->body_case);
}
