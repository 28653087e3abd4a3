/*
 * The node port: one TCP listener (--node-address, --node-port) for the
 * rendezvous of every job whose node 0 this daemon is. A connection's
 * first message, its NodeAuth, names the job; the connection then goes
 * to that job's rendezvous server, which authenticates it. A job whose
 * node 0 has no trainer here yet is answered "try again": the other
 * nodes retry until their --join-timeout. That answer comes only once the
 * peer has proven it holds the cluster secret: until then a NodeAuth
 * naming no job here is challenged exactly as one naming a job, so that
 * strangers cannot tell which job ids exist.
 */
#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/auth.h"
#include "cluster/liveness.h"
#include "cluster/rendezvous.h"
#include "cluster/rendezvous_server.h"
#include "errors.h"
#include "job_id.h"
#include "node_protocol.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/log.h"
#include "support/settings.h"

/* Connections that have not yet named their job, at once: past it a
 * newcomer takes an older one's place (admission.h), so that strangers
 * who hold connections open can delay a node but not keep it out. */
#define LOBBY_MAX 256

/* A job this port serves. */
struct node_port_job {
	struct node_port_job *next;
	const char *job_id; /* its settings', which outlive its server */
	struct gs_rdv_server *rdv;
};

/* A connection that has not yet named a job this port serves: its place
 * in the lobby, with its deadline (--auth-timeout); and, once it named
 * another job, the exchange that answers it as that job's would. */
struct lobby_peer {
	struct gs_node_port *port;
	struct gs_conn *conn;
	struct gs_admission_entry admission;
	enum peer_state state; /* PEER_CHALLENGED: it named a job that is not here */
	bool has_rank;         /* its NodeAuth claimed rank */
	uint32_t rank;
	char job_id[GS_JOB_ID_MAX + 1];
	uint8_t node_nonce[GS_AUTH_NONCE];
	uint8_t nonce[GS_AUTH_NONCE];
};

/* ---- The jobs served ------------------------------------------------------ */

struct gs_rdv_server *gs_node_port_find(const struct gs_node_port *np, const char *job_id)
{
	for (const struct node_port_job *j = np->served; j; j = j->next)
		if (strcmp(j->job_id, job_id) == 0)
			return j->rdv;
	return NULL;
}

int gs_node_port_serve(struct gs_node_port *np, const struct gs_settings *settings,
		       struct gs_rdv_server **out)
{
	if (gs_node_port_find(np, settings->job_id)) {
		gs_error("job '%s': this daemon already serves its rendezvous", settings->job_id);
		return -EEXIST;
	}
	struct node_port_job *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	int rc = rdv_server_start(np->loop, settings, np->server, &j->rdv);
	if (rc < 0) {
		free(j);
		return rc;
	}
	j->job_id = settings->job_id;
	j->next = np->served;
	np->served = j;
	*out = j->rdv;
	return 0;
}

void gs_node_port_unserve(struct gs_node_port *np, struct gs_rdv_server *s)
{
	if (!s)
		return;
	for (struct node_port_job **p = &np->served; *p; p = &(*p)->next) {
		if ((*p)->rdv == s) {
			struct node_port_job *j = *p;
			*p = j->next;
			free(j);
			break;
		}
	}
	rdv_server_stop(s);
}

/* ---- The lobby ------------------------------------------------------------ */

static void lobby_released(struct gs_admission_entry *e)
{
	free(e->owner);
}

/* The connection leaves the lobby (it named its job, or it closed): the
 * record goes once its deadline's timer has closed (lobby_released). */
static void leave(struct lobby_peer *lp)
{
	lp->conn->owner = NULL;
	gs_admission_remove(&lp->admission);
}

static void lobby_refuse(struct lobby_peer *lp, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Logs why (grouped: strangers may be many), tells the peer the same
 * words and closes the connection. */
static void lobby_refuse(struct lobby_peer *lp, int code, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	struct gs_conn *c = lp->conn;
	/* Once it claimed a rank in a NodeAuth, named as a job's rendezvous
	 * names such a peer. */
	if (lp->has_rank)
		gs_log_grouped(&lp->port->quiet, GS_LOG_WARN, "rendezvous: refused node %u from %s: %s",
			       lp->rank, c->addr, msg);
	else
		gs_log_grouped(&lp->port->quiet, GS_LOG_WARN, "rendezvous: refused a connection from %s: %s",
			       c->addr, msg);
	gs_conn_end(c, code, msg);
}

static void lobby_closed(struct gs_conn *c)
{
	if (c->owner)
		leave(c->owner);
}

static void on_lobby_timeout(struct gs_admission_entry *e)
{
	struct lobby_peer *lp = e->owner;
	/* GS_EAGAIN: a node this slow (stopped, or its network) may try again. */
	lobby_refuse(lp, GS_EAGAIN, "did not authenticate within %llu s (--auth-timeout); try again",
		     (unsigned long long)lp->port->settings->auth_timeout);
}

/* The peer named a job this port does not serve. It gets what a job's
 * rendezvous gives (rendezvous_auth.c): the same refusals, or a challenge;
 * without a secret there is nothing to prove, and it is told at once. */
static void no_such_job_auth(struct lobby_peer *lp, const Gradsync__NodeAuth *a)
{
	const struct gs_settings *s = lp->port->settings;
	char why[256];
	lp->rank = a->node_rank;
	lp->has_rank = true;
	int code = rdv_auth_refusal(s, a, why, sizeof(why));
	if (code != GS_OK) {
		lobby_refuse(lp, code, "%s", why);
		return;
	}
	/* Not a job id at all: no job could have it. */
	if (!gs_job_id_valid(a->job_id ? a->job_id : "")) {
		lobby_refuse(lp, GS_EINVAL, "a job id is at most %d printable ASCII characters",
			     GS_JOB_ID_MAX);
		return;
	}
	if (s->cluster_secret_len == 0) {
		lobby_refuse(lp, GS_EAGAIN, "no job '%.63s' has its node 0 on this daemon (yet); try again",
			     a->job_id ? a->job_id : "");
		return;
	}
	if (gs_auth_nonce(lp->nonce) < 0) {
		lobby_refuse(lp, GS_ESYSTEM, "the coordinator cannot draw a random nonce");
		return;
	}
	snprintf(lp->job_id, sizeof(lp->job_id), "%s", a->job_id ? a->job_id : "");
	memcpy(lp->node_nonce, a->nonce.data, GS_AUTH_NONCE);
	lp->state = PEER_CHALLENGED;
	rdv_send_challenge(lp->conn, lp->nonce, true);
}

/* Its proof, for the job it named: only one that checks out learns that
 * the job is not here. */
static void no_such_job_proof(struct lobby_peer *lp, const Gradsync__NodeProof *pr)
{
	const struct gs_settings *s = lp->port->settings;
	if (!gs_auth_check(s->cluster_secret, s->cluster_secret_len, GS_AUTH_NODE, lp->job_id, lp->rank,
			   lp->node_nonce, lp->nonce, pr->mac.data, pr->mac.len)) {
		lobby_refuse(lp, GS_EREFUSED, RDV_SECRET_DIFFERS);
		return;
	}
	lobby_refuse(lp, GS_EAGAIN, "no job '%.63s' has its node 0 on this daemon (yet); try again",
		     lp->job_id);
}

static void challenged_dispatch(struct lobby_peer *lp, const Gradsync__Message *m)
{
	char why[256];
	int code = GS_OK;
	if (rdv_auth_next(lp->state, m, &code, why, sizeof(why)) == RDV_STEP_PROOF)
		no_such_job_proof(lp, m->node_proof);
	else
		lobby_refuse(lp, code, "%s", why);
}

static void lobby_dispatch(struct gs_conn *c, const Gradsync__Message *m)
{
	struct lobby_peer *lp = c->owner;
	if (!lp)
		return; /* refused, closing */
	if (lp->state == PEER_CHALLENGED) {
		challenged_dispatch(lp, m);
		return;
	}
	/* Another protocol version is named as such, whatever it sent. */
	uint32_t version = m->body_case == GRADSYNC__MESSAGE__BODY_NODE_AUTH ? m->node_auth->protocol_version
			 : m->body_case == GRADSYNC__MESSAGE__BODY_NODE_HELLO ? m->node_hello->protocol_version
			 : GS_NODE_PROTOCOL_VERSION;
	uint32_t rank = m->body_case == GRADSYNC__MESSAGE__BODY_NODE_AUTH ? m->node_auth->node_rank
		      : m->body_case == GRADSYNC__MESSAGE__BODY_NODE_HELLO ? m->node_hello->node_rank : 0;
	if (version != GS_NODE_PROTOCOL_VERSION) {
		lobby_refuse(lp, GS_EVERSION, "node %u speaks protocol version %u; the coordinator (node 0) speaks %d",
			     rank, version, GS_NODE_PROTOCOL_VERSION);
		return;
	}
	if (m->body_case != GRADSYNC__MESSAGE__BODY_NODE_AUTH) {
		lobby_refuse(lp, GS_EREFUSED, "message %d before authenticating: the rendezvous serves nothing until a node has named its job and proven it holds the cluster secret (NodeAuth, NodeProof)",
			     (int)m->body_case);
		return;
	}
	struct gs_node_port *np = lp->port;
	const char *id = m->node_auth->job_id ? m->node_auth->job_id : "";
	struct gs_rdv_server *s = gs_node_port_find(np, id);
	if (!s) {
		/* Its node 0's trainers may not have come yet. */
		no_such_job_auth(lp, m->node_auth);
		return;
	}
	struct sockaddr_storage from = lp->admission.from;
	leave(lp);
	struct rdv_peer *p = rdv_adopt(s, c, &from);
	if (p)
		rdv_authenticate(s, p, m);
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

static void admit(struct gs_node_port *np, int fd, const struct sockaddr_storage *a)
{
	char addr[64];
	format_addr(a, addr, sizeof(addr));
	struct gs_admission_entry *victim = gs_admission_victim(&np->lobby, a);
	if (victim)
		lobby_refuse(victim->owner, GS_EAGAIN, "%u connections had not named their job; the oldest made room for a newer one (%s); try again",
			     np->lobby.count, addr);
	struct lobby_peer *lp = calloc(1, sizeof(*lp));
	if (!lp) {
		gs_conn_refuse(fd, GS_EAGAIN, "out of memory; try again");
		return;
	}
	if (gs_tcp_liveness(fd, np->settings->peer_timeout) < 0)
		gs_debug("node port: cannot set TCP keepalive on the connection from %s", addr);
	struct gs_conn *c = gs_conn_create(np->server->conns, fd, AUTH_MAX_FRAME, lobby_dispatch,
					   lobby_closed);
	if (!c) {
		free(lp);
		return;
	}
	lp->port = np;
	lp->conn = c;
	c->owner = lp;
	c->role = GS_CONN_NODE;
	c->log_group = &np->quiet;
	snprintf(c->addr, sizeof(c->addr), "%s", addr);
	/* The victim's refusal made room: only one that kept its connection
	 * would leave none. */
	if (gs_admission_add(&np->lobby, &lp->admission, a, lp) < 0) {
		c->owner = NULL;
		free(lp);
		gs_conn_end(c, GS_EAGAIN, "too many connections have not named their job; try again");
		return;
	}
	gs_debug("rendezvous: connection from %s", addr);
}

static void on_accept(uv_poll_t *p, int status, int events)
{
	struct gs_node_port *np = p->data;
	(void)events;
	if (status < 0)
		return;
	for (int i = 0; i < 16; i++) {
		struct sockaddr_storage a;
		/* Out of descriptors, a node is told to come back later. */
		int fd = gs_server_accept(np->server, np->fd, &a, GS_EAGAIN);
		if (fd == -EMFILE) {
			/* Not even the reserve: on_tick listens again. */
			uv_poll_stop(&np->poll);
			np->paused = true;
		}
		if (fd < 0)
			return;
		admit(np, fd, &a);
	}
}

/* Every window of the log limit: the count of lines held back, and
 * listening again after descriptors ran out. */
static void on_tick(uv_timer_t *t)
{
	struct gs_node_port *np = t->data;
	gs_log_group_flush(&np->quiet, GS_LOG_WARN);
	if (np->paused) {
		np->paused = false;
		uv_poll_start(&np->poll, UV_READABLE, on_accept);
	}
}

static int listen_on(const char *host, uint32_t port)
{
	char service[16];
	snprintf(service, sizeof(service), "%u", port);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
	struct addrinfo *res;
	int rc = getaddrinfo(host[0] ? host : NULL, service, &hints, &res);
	if (rc != 0) {
		gs_error("--node-address '%s' --node-port %u: %s", host, port, gai_strerror(rc));
		return -EINVAL;
	}
	int fd = -1, err = 0;
	for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 64) < 0) {
			err = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		gs_error("cannot listen for other nodes on --node-address '%s' --node-port %u: %s",
			 host[0] ? host : "(every address)", port, strerror(err));
	return fd < 0 ? -err : fd;
}

int gs_node_port_start(struct gs_node_port *np, uv_loop_t *loop,
		       const struct gs_settings *settings, struct gs_server *server)
{
	memset(np, 0, sizeof(*np));
	np->loop = loop;
	np->settings = settings;
	np->server = server;
	np->quiet.what = "connections to the node port";
	gs_admission_init(&np->lobby, loop, LOBBY_MAX, settings->auth_timeout * 1000,
			  on_lobby_timeout, lobby_released);
	np->fd = listen_on(settings->node_address, settings->node_port);
	if (np->fd < 0)
		return np->fd;
	uv_poll_init(loop, &np->poll, np->fd);
	np->poll.data = np;
	uv_poll_start(&np->poll, UV_READABLE, on_accept);
	uv_timer_init(loop, &np->tick);
	np->tick.data = np;
	uv_timer_start(&np->tick, on_tick, GS_LOG_GROUP_WINDOW_MS, GS_LOG_GROUP_WINDOW_MS);
	gs_info("listening for other nodes on %s port %u",
		settings->node_address[0] ? settings->node_address : "every address",
		settings->node_port);
	return 0;
}

void gs_node_port_close(struct gs_node_port *np)
{
	if (!np->poll.loop)
		return;
	uv_poll_stop(&np->poll);
	close(np->fd);
	np->fd = -1;
	uv_close((uv_handle_t *)&np->poll, NULL);
	uv_close((uv_handle_t *)&np->tick, NULL);
	gs_log_group_flush(&np->quiet, GS_LOG_WARN);
}
