/*
 * The rendezvous's first exchange (auth.h has the macs): before anything
 * else on a connection, the node and the coordinator prove to each other
 * that they hold the cluster secret, or agree that neither has one.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cluster/auth.h"
#include "cluster/rendezvous_server.h"
#include "errors.h"
#include "node_protocol.h"
#include "serve/conn.h"
#include "support/settings.h"

void rdv_send_challenge(struct gs_conn *c, const uint8_t *nonce, bool has_secret)
{
	Gradsync__NodeChallenge ch = GRADSYNC__NODE_CHALLENGE__INIT;
	ch.nonce.data = (uint8_t *)nonce;
	ch.nonce.len = GS_AUTH_NONCE;
	ch.has_secret = has_secret;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE;
	m.node_challenge = &ch;
	gs_conn_send(c, &m);
}

int rdv_auth_refusal(const struct gs_settings *s, const Gradsync__NodeAuth *a, char *why, size_t n)
{
	bool mine = s->cluster_secret_len > 0;
	if (a->protocol_version != GS_NODE_PROTOCOL_VERSION) {
		snprintf(why, n, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
			 a->node_rank, a->protocol_version, GS_NODE_PROTOCOL_VERSION);
		return GS_EVERSION;
	}
	if (a->nonce.len != GS_AUTH_NONCE) {
		snprintf(why, n, "its NodeAuth nonce has %zu bytes; %d expected", a->nonce.len,
			 GS_AUTH_NONCE);
		return GS_EPROTO;
	}
	if (mine && !a->has_secret) {
		snprintf(why, n, "it has no cluster secret, but the coordinator has one (set the same --cluster-secret-file on every node)");
		return GS_EREFUSED;
	}
	if (!mine && a->has_secret) {
		snprintf(why, n, "it has a cluster secret, but the coordinator has none (set the same --cluster-secret-file on every node)");
		return GS_EREFUSED;
	}
	return GS_OK;
}

/* The peer holds the secret (or neither side has one): only now is it
 * told whether its rank fits the job. */
static bool rank_fits(struct gs_rdv_server *s, struct rdv_peer *p)
{
	if (p->rank < s->nodes)
		return true;
	rdv_refuse(p, GS_EREFUSED, "node rank %u is out of range for %u nodes", p->rank, s->nodes);
	return false;
}

/* The node's half of the nonces and what it claims; answered with the
 * coordinator's half, or refused for what would refuse it whatever job it
 * named (rdv_auth_refusal). */
static void handle_auth(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__NodeAuth *a)
{
	bool mine = s->settings->cluster_secret_len > 0;
	char why[256];
	p->rank = a->node_rank;
	p->has_rank = true;
	int code = rdv_auth_refusal(s->settings, a, why, sizeof(why));
	if (code != GS_OK) {
		rdv_refuse(p, code, "%s", why);
		return;
	}
	if (gs_auth_nonce(p->nonce) < 0) {
		rdv_refuse(p, GS_ESYSTEM, "the coordinator cannot draw a random nonce");
		return;
	}
	memcpy(p->node_nonce, a->nonce.data, GS_AUTH_NONCE);
	rdv_send_challenge(p->conn, p->nonce, mine);
	if (mine)
		p->state = PEER_CHALLENGED;
	else if (rank_fits(s, p)) /* neither side has a secret */
		rdv_authenticated(s, p);
}

/* The node's proof; a good one is answered with the coordinator's. */
static void handle_proof(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__NodeProof *pr)
{
	const struct gs_settings *set = s->settings;
	if (!gs_auth_check(set->cluster_secret, set->cluster_secret_len, GS_AUTH_NODE, set->job_id, p->rank,
			   p->node_nonce, p->nonce, pr->mac.data, pr->mac.len)) {
		rdv_refuse(p, GS_EREFUSED, RDV_SECRET_DIFFERS);
		return;
	}
	if (!rank_fits(s, p))
		return;
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

enum rdv_auth_step rdv_auth_next(enum peer_state state, const Gradsync__Message *m, int *code,
				 char *why, size_t n)
{
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_NODE_AUTH:
		if (state == PEER_NEW)
			return RDV_STEP_AUTH;
		*code = GS_EPROTO;
		snprintf(why, n, "NodeAuth sent twice");
		return RDV_STEP_REFUSE;
	case GRADSYNC__MESSAGE__BODY_NODE_PROOF:
		if (state == PEER_CHALLENGED)
			return RDV_STEP_PROOF;
		*code = GS_EPROTO;
		snprintf(why, n, "NodeProof before NodeAuth");
		return RDV_STEP_REFUSE;
	case GRADSYNC__MESSAGE__BODY_NODE_HELLO:
		if (m->node_hello->protocol_version != GS_NODE_PROTOCOL_VERSION) {
			*code = GS_EVERSION;
			snprintf(why, n, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
				 m->node_hello->node_rank, m->node_hello->protocol_version,
				 GS_NODE_PROTOCOL_VERSION);
			return RDV_STEP_REFUSE;
		}
		break;
	default:
		break;
	}
	*code = GS_EREFUSED;
	snprintf(why, n, "message %d before authenticating: the rendezvous serves nothing until a node has proven it holds the cluster secret (NodeAuth, NodeProof)",
		 (int)m->body_case);
	return RDV_STEP_REFUSE;
}

void rdv_authenticate(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__Message *m)
{
	char why[256];
	int code = GS_OK;
	switch (rdv_auth_next(p->state, m, &code, why, sizeof(why))) {
	case RDV_STEP_AUTH:
		handle_auth(s, p, m->node_auth);
		return;
	case RDV_STEP_PROOF:
		handle_proof(s, p, m->node_proof);
		return;
	case RDV_STEP_REFUSE:
		rdv_refuse(p, code, "%s", why);
		return;
	}
}
