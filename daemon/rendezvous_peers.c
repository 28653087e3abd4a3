/*
 * The rendezvous's connections: each accepted one is admitted (limits
 * first), given a deadline to authenticate, and, when it closes, forgotten
 * with whatever it held.
 */
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "conn.h"
#include "daemon.h"
#include "gradsync.h"
#include "log.h"
#include "rendezvous_server.h"

void rdv_refuse(struct rdv_peer *p, int code, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->has_rank)
		gs_warn("rendezvous: refused node %u from %s: %s", p->rank, p->conn->addr, msg);
	else
		gs_warn("rendezvous: refused a connection from %s: %s", p->conn->addr, msg);
	gs_conn_end(p->conn, code, msg);
}

static void on_auth_timeout(uv_timer_t *t)
{
	struct rdv_peer *p = t->data;
	rdv_refuse(p, GS_ETIMEDOUT, "did not authenticate within %llu s (--join-timeout)",
	           (unsigned long long)p->conn->d->settings.join_timeout);
}

void rdv_authenticated(struct gs_rdv_server *s, struct rdv_peer *p)
{
	p->state = PEER_AUTHED;
	s->pending--;
	uv_timer_stop(&p->timer);
	p->conn->reader.max_frame = NODE_MAX_FRAME;
	gs_debug("rendezvous: %s authenticated as node %u", p->conn->addr, p->rank);
}

static void free_peer(uv_handle_t *h)
{
	free(h->data);
}

static void node_closed(struct gs_conn *c)
{
	struct gs_rdv_server *s = c->d->rdv_server;
	struct rdv_peer *p = c->owner;
	if (!p)
		return;
	/* The record goes with the connection; its timer is closed first. */
	uv_timer_stop(&p->timer);
	uv_close((uv_handle_t *)&p->timer, free_peer);
	if (!s)
		return; /* shutting down */
	if (p->state != PEER_AUTHED)
		s->pending--;
	else
		rdv_peer_closed(s, p);
}

static void format_addr(const struct sockaddr_storage *a, char *out, size_t n)
{
	char host[48], port[8]; /* INET6_ADDRSTRLEN, "65535" */
	if (getnameinfo((const struct sockaddr *)a, sizeof(*a), host, sizeof(host), port,
			sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		snprintf(out, n, "an unknown address");
	else if (a->ss_family == AF_INET6)
		snprintf(out, n, "[%s]:%s", host, port);
	else
		snprintf(out, n, "%s:%s", host, port);
}

/* Limits first, before anything is allocated; the peer's record and the
 * timer that bounds its authentication then come with the connection. */
void rdv_admit(struct gs_rdv_server *s, int fd, const struct sockaddr_storage *a)
{
	char addr[64];
	format_addr(a, addr, sizeof(addr));
	if (s->pending >= AUTH_MAX_PENDING(s->nodes)) {
		gs_warn("rendezvous: refused a connection from %s: %u connections are authenticating already",
			addr, s->pending);
		gs_conn_refuse(fd, GS_ELIMIT, "too many connections authenticating at once");
		return;
	}
	struct rdv_peer *p = calloc(1, sizeof(*p));
	if (!p) {
		gs_conn_refuse(fd, GS_ENOMEM, "out of memory");
		return;
	}
	struct gs_conn *c = gs_conn_create(s->d, fd, AUTH_MAX_FRAME, rdv_dispatch, node_closed);
	if (!c) {
		free(p);
		return;
	}
	c->role = GS_CONN_NODE;
	snprintf(c->addr, sizeof(c->addr), "%s", addr);
	p->conn = c;
	uv_timer_init(s->d->loop, &p->timer);
	p->timer.data = p;
	uv_timer_start(&p->timer, on_auth_timeout, s->d->settings.join_timeout * 1000, 0);
	c->owner = p;
	s->pending++;
	gs_debug("rendezvous: connection from %s", addr);
}
