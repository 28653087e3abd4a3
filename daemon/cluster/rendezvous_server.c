/*
 * The rendezvous server, run by the node-rank-0 daemon on its event loop.
 * Node connections reuse conn.c (framing, write queue); this file owns what
 * an authenticated node says: joining, the key-value store and layout
 * agreement (rendezvous_server.h names the other parts).
 */
#include <errno.h>
#include <stdbool.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/rendezvous_server.h"
#include "engine/job.h"
#include "engine/ownership.h"
#include "errors.h"
#include "escape.h"
#include "hostport.h"
#include "node_protocol.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/log.h"
#include "support/settings.h"

static void send_msg(struct gs_conn *c, Gradsync__Message *m)
{
	gs_conn_send(c, m);
}

static struct rdv_node *node_of(struct gs_conn *c)
{
	struct rdv_peer *p = c->owner;
	return p ? p->node : NULL;
}

/* ---- Joining ------------------------------------------------------------ */

static void broadcast(struct gs_rdv_server *s, Gradsync__Message *m, const struct rdv_node *except)
{
	for (uint32_t r = 0; r < s->nodes; r++)
		if (s->node[r].conn && &s->node[r] != except)
			send_msg(s->node[r].conn, m);
}

/* Every node is here. The first time, all of them are welcomed; after a
 * node came back, it is welcomed and the others rebuild the group. */
static void welcome_all(struct gs_rdv_server *s)
{
	Gradsync__NodeInfo *info = calloc(s->nodes, sizeof(*info));
	Gradsync__NodeInfo **ptrs = calloc(s->nodes, sizeof(*ptrs));
	if (!info || !ptrs) {
		free(info);
		free(ptrs);
		gs_error("rendezvous: out of memory welcoming %u nodes", s->nodes);
		return;
	}
	for (uint32_t r = 0; r < s->nodes; r++) {
		gradsync__node_info__init(&info[r]);
		info[r].node_rank = r;
		info[r].local_size = s->node[r].local_size;
		info[r].host = s->node[r].host;
		ptrs[r] = &info[r];
	}
	if (s->formed)
		s->generation++;
	Gradsync__NodeWelcome w = GRADSYNC__NODE_WELCOME__INIT;
	w.n_nodes = s->nodes;
	w.nodes = ptrs;
	w.generation = s->generation;
	w.incarnation = s->incarnation;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_WELCOME;
	m.node_welcome = &w;
	Gradsync__Regroup g = GRADSYNC__REGROUP__INIT;
	g.generation = s->generation;
	Gradsync__Message rm = GRADSYNC__MESSAGE__INIT;
	rm.body_case = GRADSYNC__MESSAGE__BODY_REGROUP;
	rm.regroup = &g;
	for (uint32_t r = 0; r < s->nodes; r++) {
		send_msg(s->node[r].conn, s->node[r].welcomed ? &rm : &m);
		s->node[r].welcomed = true;
	}
	free(info);
	free(ptrs);
	if (s->formed)
		gs_info("rendezvous: every node is back: rebuilding the group (generation %llu) of job '%s'",
			(unsigned long long)s->generation, s->settings->job_id);
	else
		gs_info("rendezvous: all %u nodes have joined job '%s'", s->nodes, s->settings->job_id);
	s->formed = true;
}

void rdv_join(struct gs_rdv_server *s, struct rdv_node *n, struct rdv_peer *p,
	      uint32_t local_size, const char *host)
{
	n->conn = p->conn;
	n->local_size = local_size;
	snprintf(n->host, sizeof(n->host), "%s", host);
	p->node = n;
	s->joined++;
	gs_info("rendezvous: node %u joined from %s (%u trainers), %u of %u of job '%s'",
		(unsigned)(n - s->node), p->conn->addr, local_size, s->joined, s->nodes,
		s->settings->job_id);
	if (s->joined == s->nodes)
		welcome_all(s);
}

/* Everything that makes a hello wrong whoever holds its rank is refused
 * first; a rank that is held is then a second claim (rdv_claim). */
static void handle_hello(struct gs_rdv_server *s, struct gs_conn *c, const Gradsync__NodeHello *h)
{
	struct rdv_peer *p = c->owner;
	if (h->node_rank != p->rank) {
		gs_conn_fail(c, GS_EREFUSED, "NodeHello says node rank %u but the connection authenticated as node %u",
			     h->node_rank, p->rank);
		return;
	}
	if (h->protocol_version != GS_NODE_PROTOCOL_VERSION) {
		gs_conn_fail(c, GS_EVERSION, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
			     h->node_rank, h->protocol_version, GS_NODE_PROTOCOL_VERSION);
		return;
	}
	/* Node 0 decides whose the job is: a node whose job another user
	 * began joins only as that user's trainer would join here, and
	 * learns nothing of the job (its shape, its settings) first. */
	if (!gs_owner_admits(s->settings->owner, s->settings->job_access, h->owner_uid)) {
		gs_warn("rendezvous: job '%s': node %u's job is uid %u's, node 0's is uid %u's (--job-access %s)",
			s->settings->job_id, h->node_rank, h->owner_uid, (unsigned)s->settings->owner,
			s->settings->job_access == GS_JOB_ACCESS_ANY ? "any" : "owner");
		gs_conn_fail(c, GS_EREFUSED, "job '%s' belongs to another user on node 0: node %u's trainers (uid %u) may not join it (--job-access on node 0); a job's trainers run as one user on every node",
			     s->settings->job_id, h->node_rank, h->owner_uid);
		return;
	}
	if (h->nodes != s->nodes) {
		gs_conn_fail(c, GS_EREFUSED, "job '%s': node %u's trainers say node count %u, node 0's say %u",
			     s->settings->job_id, h->node_rank, h->nodes, s->nodes);
		return;
	}
	if (h->node_rank >= s->nodes) {
		gs_conn_fail(c, GS_EREFUSED, "node rank %u is out of range for %u nodes",
			     h->node_rank, s->nodes);
		return;
	}
	if (strcmp(h->settings, s->shared_settings) != 0) {
		gs_conn_fail(c, GS_EREFUSED, "job '%s': node %u's trainers say '%s', node 0's say '%s'",
			     s->settings->job_id, h->node_rank, h->settings, s->shared_settings);
		return;
	}
	if (h->local_size == 0 || h->local_size > GS_MAX_LOCAL) {
		gs_conn_fail(c, GS_EREFUSED, "node %u has %u trainers; 1 to %d allowed",
			     h->node_rank, h->local_size, GS_MAX_LOCAL);
		return;
	}
	/* Its host goes to every node and into status: a host alone, as the
	 * node's --node-address had to be (or none). */
	const char *host = h->host ? h->host : "";
	char why[160];
	if (host[0] && gs_host_check(host, why, sizeof(why)) < 0) {
		gs_conn_fail(c, GS_EINVAL, "node %u's NodeHello host (its --node-address) '%.64s%s' is not a host name or address: it %s",
			     h->node_rank, host, strlen(host) > 64 ? "..." : "", why);
		return;
	}
	struct rdv_node *n = &s->node[h->node_rank];
	if (n->conn)
		rdv_claim(s, n, p, h->local_size, host);
	else
		rdv_join(s, n, p, h->local_size, host);
}

/* ---- The key-value store ------------------------------------------------ */

static struct rdv_entry *lookup(struct gs_rdv_server *s, const char *key)
{
	for (struct rdv_entry *e = s->store; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

static void send_value(struct gs_conn *c, const struct rdv_entry *e)
{
	Gradsync__StoreValue v = GRADSYNC__STORE_VALUE__INIT;
	v.key = e->key;
	v.value.data = (uint8_t *)e->value;
	v.value.len = e->len;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_VALUE;
	m.store_value = &v;
	send_msg(c, &m);
}

static void drop_key(struct gs_rdv_server *s, const char *key)
{
	for (struct rdv_entry **e = &s->store; *e; e = &(*e)->next) {
		if (strcmp((*e)->key, key) == 0) {
			struct rdv_entry *old = *e;
			*e = old->next;
			free(old->key);
			free(old);
			return;
		}
	}
}

static void handle_set(struct gs_rdv_server *s, struct gs_conn *c, const Gradsync__StoreSet *set)
{
	/* A node that comes back sets its keys again: the newest value wins
	 * (Gloo's keys carry the group generation, so they never collide). */
	drop_key(s, set->key);
	struct rdv_entry *e = malloc(sizeof(*e) + set->value.len);
	char *key = strdup(set->key);
	if (!e || !key) {
		free(e);
		free(key);
		gs_conn_fail(c, GS_ENOMEM, "out of memory storing key '%s'", set->key);
		return;
	}
	e->key = key;
	e->len = set->value.len;
	if (e->len > 0) /* an empty value's data may be NULL */
		memcpy(e->value, set->value.data, e->len);
	e->next = s->store;
	s->store = e;
	for (struct rdv_wait **w = &s->waits; *w;) {
		if (strcmp((*w)->key, key) != 0) {
			w = &(*w)->next;
			continue;
		}
		struct rdv_wait *done = *w;
		*w = done->next;
		send_value(done->conn, e);
		free(done->key);
		free(done);
	}
}

static void handle_get(struct gs_rdv_server *s, struct gs_conn *c, const Gradsync__StoreGet *get)
{
	struct rdv_entry *e = lookup(s, get->key);
	if (e) {
		send_value(c, e);
		return;
	}
	struct rdv_wait *w = calloc(1, sizeof(*w));
	if (!w || !(w->key = strdup(get->key))) {
		free(w);
		gs_conn_fail(c, GS_ENOMEM, "out of memory waiting for key '%s'", get->key);
		return;
	}
	w->conn = c;
	w->next = s->waits;
	s->waits = w;
}

/* ---- Layout agreement ---------------------------------------------------- */

static void send_verdict(struct rdv_node *n, const char *why)
{
	Gradsync__LayoutVerdict v = GRADSYNC__LAYOUT_VERDICT__INIT;
	v.round = n->offer_round;
	v.agreed = why == NULL;
	/* It may name a node's tensors: escaped, as an Error would be. */
	char safe[GS_ESCAPED_SIZE(512)];
	v.message = (char *)gs_escape(why ? why : "", safe, sizeof(safe));
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_LAYOUT_VERDICT;
	m.layout_verdict = &v;
	send_msg(n->conn, &m);
	gs_layout_free(&n->offer);
	n->offer_round = 0;
}

static void verdict_all(struct gs_rdv_server *s, const char *why)
{
	for (uint32_t r = 0; r < s->nodes; r++)
		send_verdict(&s->node[r], why);
}

/* Every node has offered a layout: compare each with node 0's. */
static void judge_round(struct gs_rdv_server *s)
{
	for (uint32_t r = 1; r < s->nodes; r++) {
		char mine[32], ref[32], diff[400], why[512];
		snprintf(mine, sizeof(mine), "node %u", r);
		snprintf(ref, sizeof(ref), "node 0");
		if (gs_layout_compare(&s->node[r].offer, mine, &s->node[0].offer, ref,
				      diff, sizeof(diff))) {
			snprintf(why, sizeof(why), "layouts differ between node 0 and node %u: %s", r, diff);
			gs_warn("rendezvous: %s", why);
			verdict_all(s, why);
			return;
		}
	}
	gs_info("rendezvous: all %u nodes registered the same layout for job '%s'", s->nodes,
		s->settings->job_id);
	if (gs_layout_copy(&s->agreed, &s->node[0].offer) == 0)
		s->has_agreed = true;
	verdict_all(s, NULL);
}

/* A node whose trainers came back after the job's layout was agreed. */
static void judge_late(struct gs_rdv_server *s, struct rdv_node *n)
{
	char mine[32], diff[400], why[512];
	snprintf(mine, sizeof(mine), "node %ld", (long)(n - s->node));
	if (gs_layout_compare(&n->offer, mine, &s->agreed, "the job", diff, sizeof(diff))) {
		snprintf(why, sizeof(why), "layouts differ between %s and the job's other nodes: %s",
			 mine, diff);
		gs_warn("rendezvous: %s", why);
		send_verdict(n, why);
		return;
	}
	send_verdict(n, NULL);
}

static void withdraw(struct gs_rdv_server *s, struct rdv_node *n)
{
	n->has_job = false;
	n->offer_round = 0;
	gs_layout_free(&n->offer);
	for (uint32_t r = 0; r < s->nodes; r++)
		if (s->node[r].has_job)
			return;
	/* Every node's job has ended: the next job may have another layout. */
	gs_layout_free(&s->agreed);
	s->has_agreed = false;
}

static void handle_offer(struct gs_rdv_server *s, struct gs_conn *c, const Gradsync__LayoutOffer *o)
{
	struct rdv_node *n = node_of(c);
	if (o->withdraw) {
		withdraw(s, n);
		return;
	}
	if (o->n_names != o->n_counts || o->round == 0 || n->offer_round) {
		gs_conn_fail(c, GS_EPROTO, "malformed or repeated LayoutOffer");
		return;
	}
	gs_layout_free(&n->offer);
	for (size_t i = 0; i < o->n_names; i++) {
		if (gs_layout_add(&n->offer, o->names[i], o->counts[i]) < 0) {
			gs_conn_fail(c, GS_ENOMEM, "out of memory reading a layout offer");
			return;
		}
	}
	n->offer_round = o->round;
	n->has_job = true;
	if (s->has_agreed) {
		judge_late(s, n);
		return;
	}
	for (uint32_t r = 0; r < s->nodes; r++)
		if (!s->node[r].conn || !s->node[r].offer_round)
			return;
	judge_round(s);
}

/* A node's group failed with every node still here: every node builds a
 * new one, of the next generation. One regroup answers every request made
 * for the failed generation. */
static void handle_regroup_request(struct gs_rdv_server *s, struct gs_conn *c,
				   const Gradsync__RegroupRequest *r)
{
	uint32_t rank = (uint32_t)(node_of(c) - s->node);
	if (r->generation != s->generation || !s->formed) {
		gs_debug("rendezvous: node %u asks to rebuild generation %llu; the group is at %llu",
			 rank, (unsigned long long)r->generation, (unsigned long long)s->generation);
		return;
	}
	for (uint32_t n = 0; n < s->nodes; n++)
		if (!s->node[n].conn)
			return; /* its return rebuilds the group */
	s->generation++;
	gs_warn("rendezvous: node %u's group failed (%.256s): rebuilding the group (generation %llu)",
		rank, r->reason ? r->reason : "", (unsigned long long)s->generation);
	char why[320], safe[GS_ESCAPED_SIZE(320)];
	snprintf(why, sizeof(why), "the group of nodes failed on node %u (%.256s); it is being rebuilt",
		 rank, r->reason ? r->reason : "");
	/* The node's reason goes to every node: escaped, as an Error would be. */
	Gradsync__Regroup g = GRADSYNC__REGROUP__INIT;
	g.generation = s->generation;
	g.reason = (char *)gs_escape(why, safe, sizeof(safe));
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGROUP;
	m.regroup = &g;
	broadcast(s, &m, NULL);
}

/* ---- Connections ----------------------------------------------------------- */

void rdv_dispatch(struct gs_conn *c, const Gradsync__Message *m)
{
	struct rdv_peer *p = c->owner;
	if (!p || p->server->stopped)
		return; /* shutting down */
	struct gs_rdv_server *s = p->server;
	if (p->state != PEER_AUTHED) {
		rdv_authenticate(s, p, m);
		return;
	}
	if (m->body_case == GRADSYNC__MESSAGE__BODY_PING ||
	    m->body_case == GRADSYNC__MESSAGE__BODY_PONG) {
		rdv_liveness(s, p, m);
		return;
	}
	/* A connection of its own may use the store without joining: a
	 * node's worker rebuilds the group on one. */
	bool store = m->body_case == GRADSYNC__MESSAGE__BODY_STORE_SET ||
		     m->body_case == GRADSYNC__MESSAGE__BODY_STORE_GET;
	if (!p->node && !store && m->body_case != GRADSYNC__MESSAGE__BODY_NODE_HELLO) {
		gs_conn_fail(c, GS_EPROTO, "expected NodeHello first");
		return;
	}
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_NODE_HELLO:
		if (p->node)
			gs_conn_fail(c, GS_EPROTO, "NodeHello sent twice");
		else
			handle_hello(s, c, m->node_hello);
		break;
	case GRADSYNC__MESSAGE__BODY_STORE_SET:
		handle_set(s, c, m->store_set);
		break;
	case GRADSYNC__MESSAGE__BODY_STORE_GET:
		handle_get(s, c, m->store_get);
		break;
	case GRADSYNC__MESSAGE__BODY_LAYOUT_OFFER:
		handle_offer(s, c, m->layout_offer);
		break;
	case GRADSYNC__MESSAGE__BODY_REGROUP_REQUEST:
		handle_regroup_request(s, c, m->regroup_request);
		break;
	default:
		gs_conn_fail(c, GS_EPROTO, "unexpected message %d on the rendezvous", (int)m->body_case);
	}
}

/* Its waits go with it, and the node it joined as is free again. */
void rdv_peer_closed(struct gs_rdv_server *s, struct rdv_peer *p)
{
	struct gs_conn *c = p->conn;
	for (struct rdv_wait **w = &s->waits; *w;) {
		struct rdv_wait *x = *w;
		if (x->conn == c) {
			*w = x->next;
			free(x->key);
			free(x);
		} else {
			w = &x->next;
		}
	}
	rdv_claim_withdrawn(p);
	struct rdv_node *n = p->node;
	if (!n)
		return;
	bool was_in_group = n->welcomed;
	n->conn = NULL;
	n->welcomed = false;
	withdraw(s, n);
	s->joined--;
	long rank = (long)(n - s->node);
	gs_warn("rendezvous: node %ld left job '%s'", rank, s->settings->job_id);
	if (was_in_group) {
		Gradsync__NodeLost lost = GRADSYNC__NODE_LOST__INIT;
		lost.node_rank = (uint32_t)rank;
		lost.reason = p->gone[0] ? p->gone
			    : "its daemon stopped or lost its connection to the coordinator";
		Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
		m.body_case = GRADSYNC__MESSAGE__BODY_NODE_LOST;
		m.node_lost = &lost;
		broadcast(s, &m, n);
	}
	/* A daemon that claimed the rank while this one held it takes it. */
	rdv_claim_granted(s, n);
}

/* A restarted coordinator knows nothing of its predecessor's groups: its
 * store keys must not be mistaken for that one's, which nodes that were
 * building a group when it went away may still write. */
static int draw_incarnation(uint64_t *out)
{
	do {
		if (getrandom(out, sizeof(*out), 0) != (ssize_t)sizeof(*out)) {
			gs_error("cannot draw the rendezvous's incarnation id: %s", strerror(errno));
			return -errno;
		}
	} while (*out == 0);
	return 0;
}

/* Every window of the log limit: the count of lines it held back. */
static void on_tick(uv_timer_t *t)
{
	struct gs_rdv_server *s = t->data;
	gs_log_group_flush(&s->quiet, GS_LOG_WARN);
}

int rdv_server_start(uv_loop_t *loop, const struct gs_settings *settings,
		     struct gs_server *server, struct gs_rdv_server **out)
{
	struct gs_rdv_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->loop = loop;
	s->settings = settings;
	s->server = server;
	s->nodes = settings->nodes;
	s->node = calloc(s->nodes, sizeof(*s->node));
	s->quiet.what = "unauthenticated connections to the rendezvous";
	rdv_strangers_init(s);
	gs_settings_shared_text(settings, s->shared_settings, sizeof(s->shared_settings));
	int err = !s->node ? -ENOMEM : draw_incarnation(&s->incarnation) < 0 ? -EIO : 0;
	if (err < 0) {
		free(s->node);
		free(s);
		return err;
	}
	uv_timer_init(loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, on_tick, GS_LOG_GROUP_WINDOW_MS, GS_LOG_GROUP_WINDOW_MS);
	s->handles = 1;
	*out = s;
	gs_info("job '%s': serving the rendezvous of its %u nodes on port %u (incarnation %016llx)",
		settings->job_id, s->nodes, settings->node_port,
		(unsigned long long)s->incarnation);
	return 0;
}

void rdv_server_unref(struct gs_rdv_server *s)
{
	if (--s->handles > 0)
		return;
	gs_log_group_flush(&s->quiet, GS_LOG_WARN);
	while (s->store) {
		struct rdv_entry *e = s->store;
		s->store = e->next;
		free(e->key);
		free(e);
	}
	for (uint32_t r = 0; r < s->nodes; r++)
		gs_layout_free(&s->node[r].offer);
	gs_layout_free(&s->agreed);
	free(s->node);
	free(s);
}

static void free_server(uv_handle_t *h)
{
	rdv_server_unref(h->data);
}

void rdv_server_stop(struct gs_rdv_server *s)
{
	/* Its peers' connections are closed with it: the other nodes learn
	 * that the job's node 0 has gone. */
	s->stopped = true;
	rdv_close_peers(s);
	uv_close((uv_handle_t *)&s->tick, free_server);
}
