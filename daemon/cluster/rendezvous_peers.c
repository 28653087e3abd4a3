/*
 * The rendezvous's connections: each accepted one is admitted (limits
 * first), given --auth-timeout to authenticate, and, when it closes,
 * forgotten with whatever it held.
 *
 * Until a peer has authenticated it is a stranger: it waits in the
 * server's admission queue (admission.h), of AUTH_MAX_PENDING, and what is
 * logged about it is limited (quiet), so that strangers holding
 * connections open, or opening them without end, can neither keep a node
 * out nor fill the log.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/liveness.h"
#include "cluster/rendezvous_server.h"
#include "errors.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/log.h"
#include "support/settings.h"

void rdv_refuse(struct rdv_peer *p, int code, const char *fmt, ...)
{
	struct gs_conn *c = p->conn;
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (c->log_group && p->has_rank)
		gs_log_grouped(c->log_group, GS_LOG_WARN, "rendezvous: refused node %u from %s: %s",
			       p->rank, c->addr, msg);
	else if (c->log_group)
		gs_log_grouped(c->log_group, GS_LOG_WARN, "rendezvous: refused a connection from %s: %s",
			       c->addr, msg);
	else
		gs_warn("rendezvous: refused node %u from %s: %s", p->rank, c->addr, msg);
	gs_conn_end(c, code, msg);
}

/* ---- Strangers, in the order they came ---------------------------------- */

static void on_auth_timeout(struct gs_admission_entry *e)
{
	struct rdv_peer *p = e->owner;
	/* GS_EAGAIN: a node this slow (stopped, or its network) may try again. */
	rdv_refuse(p, GS_EAGAIN, "did not authenticate within %llu s (--auth-timeout); try again",
		   (unsigned long long)p->server->settings->auth_timeout);
}

/* One of the peer's handles has closed: the record goes with the last. */
static void release(struct rdv_peer *p)
{
	if (--p->handles > 0)
		return;
	struct gs_rdv_server *s = p->server;
	free(p);
	rdv_server_unref(s);
}

static void admission_released(struct gs_admission_entry *e)
{
	release(e->owner);
}

void rdv_strangers_init(struct gs_rdv_server *s)
{
	gs_admission_init(&s->strangers, s->loop, AUTH_MAX_PENDING(s->nodes),
			  s->settings->auth_timeout * 1000, on_auth_timeout, admission_released);
}

/* Makes room for a newcomer from `from` (addr) when every slot is taken. */
static void evict(struct gs_rdv_server *s, const struct sockaddr_storage *from, const char *addr)
{
	struct gs_admission_entry *e = gs_admission_victim(&s->strangers, from);
	if (e)
		rdv_refuse(e->owner, GS_EAGAIN, "%u connections were authenticating at once; the oldest made room for a newer one (%s); try again",
			   s->strangers.count, addr);
}

/* ---- Liveness (liveness.h) ------------------------------------------------ */

static void ping(struct rdv_peer *p)
{
	struct gs_liveness_msg lm;
	gs_liveness_ping(&lm, ++p->ping_seq);
	gs_conn_send(p->conn, &lm.m);
}

/* Nothing came from p for --peer-timeout: it is treated as if it had
 * closed (rdv_peer_closed tells the other nodes, and its rank is free). */
static void drop_silent(struct rdv_peer *p, uint64_t silent_ms)
{
	struct gs_conn *c = p->conn;
	double s = (double)silent_ms / 1000.0;
	unsigned long long limit = (unsigned long long)p->server->settings->peer_timeout;
	if (p->node)
		gs_warn("rendezvous: node %u (%s) sent nothing for %.1f s (--peer-timeout %llu s): taking it as lost",
			p->rank, c->addr, s, limit);
	else
		gs_warn("rendezvous: a store connection of node %u (%s) sent nothing for %.1f s (--peer-timeout %llu s): closing it",
			p->rank, c->addr, s, limit);
	snprintf(p->gone, sizeof(p->gone),
		 "the coordinator heard nothing from it for %.1f s (--peer-timeout %llu s)", s, limit);
	char msg[200];
	snprintf(msg, sizeof(msg), "the coordinator heard nothing from node %u for %.1f s (--peer-timeout %llu s): it is taken as lost",
		 p->rank, s, limit);
	gs_conn_end(c, GS_ETIMEDOUT, msg);
}

static void on_ping_tick(uv_timer_t *t)
{
	struct rdv_peer *p = t->data;
	uint64_t silent = gs_conn_silent_ms(p->conn);
	if (silent >= p->server->settings->peer_timeout * 1000)
		drop_silent(p, silent);
	else
		ping(p);
}

static void watch(struct rdv_peer *p)
{
	uint64_t every = gs_ping_interval_ms(p->server->settings->peer_timeout);
	uv_timer_start(&p->timer, on_ping_tick, every, every);
}

static void claim_refused(struct rdv_node *n);

void rdv_liveness(struct gs_rdv_server *s, struct rdv_peer *p, const Gradsync__Message *m)
{
	(void)s;
	if (m->body_case == GRADSYNC__MESSAGE__BODY_PING) {
		struct gs_liveness_msg lm;
		gs_liveness_pong(&lm, m->ping->seq);
		gs_conn_send(p->conn, &lm.m);
		return;
	}
	/* A Pong: its arrival was the point, unless it answers a probe. */
	struct rdv_node *n = p->node;
	if (n && n->claimant && n->probe_seq && m->pong->seq >= n->probe_seq)
		claim_refused(n);
}

/* ---- Second claims ----------------------------------------------------------
 * A daemon that says hello for a rank another connection holds is either a
 * mistake (two daemons whose trainers say the same node rank) or the holder's
 * successor, the holder having vanished without closing (power loss,
 * partition) and --peer-timeout not yet passed. The holder is pinged at
 * once: a Pong within gs_probe_ms refuses the claim for good; none, and
 * the holder is dropped as lost and the claimant takes its place. Either
 * way within a few seconds, never a refusal forever. */

static unsigned rank_of(const struct gs_rdv_server *s, const struct rdv_node *n)
{
	return (unsigned)(n - s->node);
}

static void end_claim(struct rdv_node *n)
{
	n->claimant->claim = NULL;
	n->claimant = NULL;
	n->probe_seq = 0;
}

static void claim_refused(struct rdv_node *n)
{
	struct rdv_peer *p = n->claimant;
	struct gs_rdv_server *s = p->server;
	end_claim(n);
	gs_conn_fail(p->conn, GS_EREFUSED, "node rank %u has already joined (%s); two daemons claim it",
		     rank_of(s, n), n->conn->addr);
}

static void on_probe_timeout(uv_timer_t *t)
{
	struct rdv_peer *p = t->data;
	struct gs_rdv_server *s = p->server;
	struct rdv_node *n = p->claim;
	if (!n || !n->conn)
		return; /* settled meanwhile */
	struct rdv_peer *holder = n->conn->owner;
	double waited = (double)gs_probe_ms(s->settings->peer_timeout) / 1000.0;
	gs_warn("rendezvous: node %u at %s did not answer within %.1f s while a daemon at %s claims its rank: taking it as lost",
		rank_of(s, n), holder->conn->addr, waited, p->conn->addr);
	snprintf(holder->gone, sizeof(holder->gone),
		 "it did not answer the coordinator within %.1f s when another daemon claimed its rank",
		 waited);
	char msg[200];
	snprintf(msg, sizeof(msg), "another daemon claims node rank %u and this one did not answer the coordinator within %.1f s: it is taken as lost",
		 rank_of(s, n), waited);
	/* Its closing grants the claim (rdv_claim_granted). */
	gs_conn_end(holder->conn, GS_ETIMEDOUT, msg);
}

void rdv_claim(struct gs_rdv_server *s, struct rdv_node *n, struct rdv_peer *p,
	       uint32_t local_size, const char *host)
{
	if (n->claimant) {
		gs_conn_fail(p->conn, GS_EAGAIN, "node rank %u is being checked: another daemon claims it too; try again",
			     rank_of(s, n));
		return;
	}
	struct rdv_peer *holder = n->conn->owner;
	n->claimant = p;
	n->claim_local_size = local_size;
	snprintf(n->claim_host, sizeof(n->claim_host), "%s", host);
	p->claim = n;
	n->probe_seq = holder->ping_seq + 1;
	uint64_t bound = gs_probe_ms(s->settings->peer_timeout);
	uv_timer_stop(&p->timer);
	uv_timer_start(&p->timer, on_probe_timeout, bound, 0);
	gs_info("rendezvous: a daemon at %s claims node rank %u, which %s holds: asking the holder whether it is alive (up to %.1f s)",
		p->conn->addr, rank_of(s, n), holder->conn->addr, (double)bound / 1000.0);
	/* Last: a holder whose socket fails now closes at once, which grants
	 * the claim (rdv_claim_granted). */
	ping(holder);
}

void rdv_claim_withdrawn(struct rdv_peer *p)
{
	if (p->claim)
		end_claim(p->claim);
}

void rdv_claim_granted(struct gs_rdv_server *s, struct rdv_node *n)
{
	struct rdv_peer *p = n->claimant;
	if (!p)
		return;
	end_claim(n);
	uv_timer_stop(&p->timer);
	watch(p);
	rdv_join(s, n, p, n->claim_local_size, n->claim_host);
}

/* ---- Admission and authentication ---------------------------------------- */

void rdv_authenticated(struct gs_rdv_server *s, struct rdv_peer *p)
{
	(void)s;
	p->state = PEER_AUTHED;
	gs_admission_remove(&p->admission);
	p->conn->reader.max_frame = NODE_MAX_FRAME;
	p->conn->log_group = NULL;
	watch(p);
	gs_debug("rendezvous: %s authenticated as node %u", p->conn->addr, p->rank);
}

static void timer_closed(uv_handle_t *h)
{
	release(h->data);
}

static void unlist_all(struct gs_rdv_server *s, struct rdv_peer *p)
{
	if (p->all_prev)
		p->all_prev->all_next = p->all_next;
	else
		s->peers = p->all_next;
	if (p->all_next)
		p->all_next->all_prev = p->all_prev;
	p->all_prev = p->all_next = NULL;
}

/* TCP gave up on p's connection (nothing acknowledged for --peer-timeout,
 * or no route): a partition, like drop_silent's, which it races. */
static void note_failed(struct rdv_peer *p, int error)
{
	unsigned long long limit = (unsigned long long)p->server->settings->peer_timeout;
	if (p->node)
		gs_warn("rendezvous: node %u (%s): its connection failed: %s (--peer-timeout %llu s): taking it as lost",
			p->rank, p->conn->addr, strerror(error), limit);
	snprintf(p->gone, sizeof(p->gone),
		 "its connection to the coordinator failed: %s (--peer-timeout %llu s)",
		 strerror(error), limit);
}

static void node_closed(struct gs_conn *c)
{
	struct rdv_peer *p = c->owner;
	if (!p)
		return;
	struct gs_rdv_server *s = p->server;
	/* The record goes with the connection, once its handles have closed. */
	uv_timer_stop(&p->timer);
	uv_close((uv_handle_t *)&p->timer, timer_closed);
	gs_admission_remove(&p->admission);
	unlist_all(s, p);
	if (s->stopped)
		return; /* shutting down */
	if (p->state == PEER_AUTHED) {
		if (c->error && !p->gone[0])
			note_failed(p, c->error);
		rdv_peer_closed(s, p);
	}
}

void rdv_close_peers(struct gs_rdv_server *s)
{
	while (s->peers)
		gs_conn_close(s->peers->conn); /* node_closed unlists it */
}

/* Limits first; the peer's record, and its place among the strangers
 * with the deadline of its authentication, then come with the
 * connection. */
struct rdv_peer *rdv_adopt(struct gs_rdv_server *s, struct gs_conn *c,
			   const struct sockaddr_storage *a)
{
	evict(s, a, c->addr);
	struct rdv_peer *p = calloc(1, sizeof(*p));
	if (!p) {
		gs_conn_fail(c, GS_EAGAIN, "out of memory; try again");
		return NULL;
	}
	/* evict made room: only a refusal that kept its peer would leave none. */
	if (gs_admission_add(&s->strangers, &p->admission, a, p) < 0) {
		free(p);
		gs_conn_fail(c, GS_EAGAIN, "too many connections authenticating at once; try again");
		return NULL;
	}
	c->dispatch = rdv_dispatch;
	c->closed = node_closed;
	c->role = GS_CONN_NODE;
	c->log_group = &s->quiet;
	p->server = s;
	p->conn = c;
	uv_timer_init(s->loop, &p->timer);
	p->timer.data = p;
	p->handles = 2; /* timer, admission's */
	s->handles++;   /* until release */
	c->owner = p;
	p->all_next = s->peers;
	if (s->peers)
		s->peers->all_prev = p;
	s->peers = p;
	return p;
}
