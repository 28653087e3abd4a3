/*
 * The rendezvous client: one blocking TCP connection to the coordinator,
 * used from the worker thread only, every wait bounded by a deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "cluster/auth.h"
#include "cluster/liveness.h"
#include "cluster/rendezvous.h"
#include "errors.h"
#include "hostport.h"
#include "frame.h"
#include "node_protocol.h"
#include "support/log.h"
#include "support/settings.h"

#define NODE_MAX_FRAME (64u << 20)

struct gs_rdv_client {
	int fd;
	int cancel_fd;
	uint64_t generation;
	uint64_t incarnation;
	struct gs_frame_reader reader;
	int join_timeout_ms;
	uint32_t node_rank;
	/* Liveness (liveness.h), once authenticated: the waits below answer
	 * the coordinator's pings, ping it, and end when it falls silent. */
	bool pinging;
	uint64_t peer_timeout_s;
	int64_t last_rx_ms;
	int64_t next_ping_ms;
	uint64_t ping_seq;
	bool silent; /* the last wait ended because the coordinator was */
	/* While parked (gs_rdv_client_park), a thread of its own answers. */
	bool parked;
	pthread_t parker;
	int park_stop; /* an eventfd that ends it */
};

/* Of a monotonic clock (libuv's, as the loop's timers). */
static int64_t now_ms(void)
{
	return (int64_t)(uv_hrtime() / 1000000u);
}

/* Waits until fd is ready for events, the deadline passes (GS_ETIMEDOUT)
 * or the daemon is shutting down (GS_EABORTED). fd < 0: only waits. */
static int wait_for(int fd, short events, int cancel_fd, int64_t deadline)
{
	struct pollfd p[2] = { { cancel_fd, POLLIN, 0 }, { fd, events, 0 } };
	for (;;) {
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return GS_ETIMEDOUT;
		int n = poll(p, fd >= 0 ? 2 : 1, (int)(left > INT32_MAX ? INT32_MAX : left));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return GS_ESYSTEM;
		if (p[0].revents)
			return GS_EABORTED;
		if (n > 0)
			return GS_OK;
	}
}

void gs_rdv_client_close(struct gs_rdv_client *c)
{
	if (!c)
		return;
	gs_rdv_client_unpark(c);
	gs_frame_reader_destroy(&c->reader);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

/* ---- Frames with deadlines ----------------------------------------------- */

static int send_msg(struct gs_rdv_client *c, const Gradsync__Message *m, int64_t deadline)
{
	uint8_t *buf;
	size_t len, off = 0;
	if (gs_frame_encode(m, &buf, &len) < 0)
		return GS_ENOMEM;
	int rc = GS_OK;
	while (off < len && rc == GS_OK) {
		ssize_t n = gs_frame_write_some(c->fd, buf + off, len - off, NULL, 0);
		if (n > 0) {
			off += (size_t)n;
		} else if (n == -EAGAIN) {
			rc = wait_for(c->fd, POLLOUT, c->cancel_fd, deadline);
		} else {
			rc = GS_EDISCONNECTED;
		}
	}
	free(buf);
	return rc;
}

/* Reads what the socket has. */
static int fill(struct gs_rdv_client *c)
{
	ssize_t n = gs_frame_reader_fill(&c->reader, c->fd);
	if (n > 0)
		c->last_rx_ms = now_ms();
	if (n == 0)
		return GS_EDISCONNECTED;
	if (n < 0 && n != -EAGAIN)
		return n == -EMSGSIZE ? GS_EPROTO : GS_EDISCONNECTED;
	return GS_OK;
}

/* ---- Liveness ------------------------------------------------------------ */

static int send_liveness(struct gs_rdv_client *c, bool pong, uint64_t seq, int64_t deadline)
{
	struct gs_liveness_msg lm;
	if (pong)
		gs_liveness_pong(&lm, seq);
	else
		gs_liveness_ping(&lm, seq);
	return send_msg(c, &lm.m, deadline);
}

/* Answers a Ping; a Pong needs nothing (its arrival was the point).
 * Returns 1 when m was either (and is freed), 0 for anything else, or the
 * failure to answer. */
static int take_liveness(struct gs_rdv_client *c, Gradsync__Message *m, int64_t deadline)
{
	int rc = 1;
	if (m->body_case == GRADSYNC__MESSAGE__BODY_PING)
		rc = send_liveness(c, true, m->ping->seq, deadline);
	else if (m->body_case != GRADSYNC__MESSAGE__BODY_PONG)
		return 0;
	gradsync__message__free_unpacked(m, NULL);
	return rc == GS_OK ? 1 : rc;
}

/* When a wait must stop to look at the coordinator's liveness. */
static int64_t next_wake(const struct gs_rdv_client *c, int64_t deadline)
{
	if (!c->pinging)
		return deadline;
	int64_t lost = c->last_rx_ms + (int64_t)c->peer_timeout_s * 1000;
	int64_t wake = c->next_ping_ms < lost ? c->next_ping_ms : lost;
	return wake < deadline ? wake : deadline;
}

/* Between frames: a coordinator silent for --peer-timeout is gone
 * (GS_EDISCONNECTED, silent); otherwise a Ping may be due. */
static int keep_alive(struct gs_rdv_client *c, int64_t deadline)
{
	int64_t now = now_ms();
	if (now - c->last_rx_ms >= (int64_t)c->peer_timeout_s * 1000) {
		c->silent = true;
		return GS_EDISCONNECTED;
	}
	if (now < c->next_ping_ms)
		return GS_OK;
	c->next_ping_ms = now + (int64_t)gs_ping_interval_ms(c->peer_timeout_s);
	return send_liveness(c, false, ++c->ping_seq, deadline);
}

static void start_pinging(struct gs_rdv_client *c)
{
	c->pinging = true;
	c->last_rx_ms = now_ms();
	c->next_ping_ms = c->last_rx_ms + (int64_t)gs_ping_interval_ms(c->peer_timeout_s);
}

/* Receives the next message that is not a Ping or Pong (those are dealt
 * with on the way); *out is the caller's to free. */
static int recv_msg(struct gs_rdv_client *c, int64_t deadline, Gradsync__Message **out)
{
	for (;;) {
		const uint8_t *payload;
		size_t len;
		int r = gs_frame_reader_next(&c->reader, &payload, &len);
		if (r < 0)
			return GS_EPROTO;
		if (r > 0) {
			int err = gs_frame_decode(payload, len, out);
			gs_frame_reader_consume(&c->reader);
			if (err < 0)
				return GS_EPROTO;
			int taken = take_liveness(c, *out, deadline);
			if (taken == 0)
				return GS_OK;
			if (taken < 0)
				return taken;
			continue;
		}
		int64_t wake = next_wake(c, deadline);
		int rc = wait_for(c->fd, POLLIN, c->cancel_fd, wake);
		if (rc == GS_ETIMEDOUT && wake < deadline)
			rc = keep_alive(c, deadline);
		else if (rc == GS_OK)
			rc = fill(c);
		if (rc != GS_OK)
			return rc;
	}
}

/* Waits for a message of kind `want`; an Error from the coordinator is
 * returned with its code and words. */
static int expect(struct gs_rdv_client *c, Gradsync__Message__BodyCase want,
		  int64_t deadline, Gradsync__Message **out, char *err, size_t n)
{
	Gradsync__Message *m;
	int rc = recv_msg(c, deadline, &m);
	if (rc == GS_ETIMEDOUT || rc == GS_EABORTED) {
		snprintf(err, n, rc == GS_EABORTED ? "shutting down" : "no answer from the coordinator in time");
		return rc;
	}
	if (rc == GS_EDISCONNECTED && c->silent) {
		snprintf(err, n, "the coordinator sent nothing for %llu s (--peer-timeout)",
			 (unsigned long long)c->peer_timeout_s);
		return rc;
	}
	if (rc != GS_OK) {
		snprintf(err, n, "the coordinator closed the connection or sent garbage (%s)",
			 gs_error_desc(rc));
		return rc;
	}
	if (m->body_case == GRADSYNC__MESSAGE__BODY_ERROR) {
		snprintf(err, n, "the coordinator refused node %u: %s", c->node_rank, m->error->message);
		rc = m->error->code ? m->error->code : GS_EREFUSED;
		gradsync__message__free_unpacked(m, NULL);
		return rc;
	}
	if (m->body_case != want) {
		snprintf(err, n, "unexpected message %d from the coordinator", (int)m->body_case);
		gradsync__message__free_unpacked(m, NULL);
		return GS_EPROTO;
	}
	*out = m;
	return GS_OK;
}

/* ---- Connecting ---------------------------------------------------------------- */

/* Connects fd to addr, waiting until the deadline (but a moment at least:
 * the last attempt comes at the deadline itself). Returns 0 or an errno. */
static int connect_by(int fd, const struct addrinfo *a, int cancel_fd, int64_t deadline)
{
	if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
		return 0;
	if (errno != EINPROGRESS)
		return errno;
	int64_t soonest = now_ms() + 200;
	int rc = wait_for(fd, POLLOUT, cancel_fd, deadline > soonest ? deadline : soonest);
	if (rc != GS_OK)
		return rc == GS_EABORTED ? ECANCELED : ETIMEDOUT;
	int err = 0;
	socklen_t len = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	return err;
}

/* One connection attempt to every address of the coordinator. Returns
 * the socket (non-blocking: every wait here is a poll with a deadline),
 * or -1 with why. */
static int try_connect(const char *host, const char *port, int cancel_fd, int64_t deadline,
		       char *why, size_t n)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(why, n, "%s", gai_strerror(rc));
		return -1;
	}
	int fd = -1;
	for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		int err = fd < 0 ? errno : connect_by(fd, a, cancel_fd, deadline);
		if (err) {
			snprintf(why, n, "%s", strerror(err));
			if (fd >= 0)
				close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	return fd;
}

static int connect_to(struct gs_rdv_client *c, const struct gs_settings *s, int64_t deadline,
		      char *err, size_t n)
{
	char host[256], port[32], why[128] = "no attempt";
	if (gs_parse_host_port(s->coordinator, host, sizeof(host), port, sizeof(port)) < 0) {
		snprintf(err, n, "the job's coordinator '%s' is not HOST:PORT", s->coordinator);
		return GS_EINVAL;
	}
	c->fd = try_connect(host, port, c->cancel_fd, deadline, why, sizeof(why));
	if (c->fd >= 0 && gs_tcp_liveness(c->fd, s->peer_timeout) < 0)
		gs_debug("rendezvous: cannot set TCP keepalive on the connection to the coordinator");
	if (c->fd >= 0)
		return GS_OK;
	snprintf(err, n, "the coordinator %s did not answer within %llu s (last attempt: %s)",
		 s->coordinator, (unsigned long long)s->join_timeout, why);
	return GS_ECONNECT;
}

/* ---- Attempts, retried ------------------------------------------------------- */

/* Worth another attempt: the coordinator cannot be reached yet, closed
 * the connection, or refused it for a passing reason (GS_EAGAIN: too many
 * connections authenticating, a rank being checked). Anything else it
 * says (another secret, version or settings; a rank another live daemon
 * holds) is final. A wait past the deadline ends the attempts anyway. */
static bool transient(int rc)
{
	return rc == GS_EAGAIN || rc == GS_ECONNECT || rc == GS_EDISCONNECTED ||
	       rc == GS_ETIMEDOUT;
}

static struct gs_rdv_client *new_client(const struct gs_settings *s, int cancel_fd)
{
	struct gs_rdv_client *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->fd = -1;
	c->join_timeout_ms = (int)(s->join_timeout * 1000 > INT32_MAX ? INT32_MAX : s->join_timeout * 1000);
	c->cancel_fd = cancel_fd;
	c->node_rank = s->node_rank;
	c->peer_timeout_s = s->peer_timeout;
	c->park_stop = -1;
	gs_frame_reader_init(&c->reader, NODE_MAX_FRAME);
	return c;
}

typedef int (*attempt_fn)(struct gs_rdv_client *c, void *ctx, int64_t deadline, char *err,
			  size_t n);

/* Says, in err, that the failure it holds lasted through every attempt. */
static void note_attempts(char *err, size_t n, unsigned tries, const struct gs_settings *s)
{
	size_t k = strlen(err);
	if (tries > 1 && k + 1 < n)
		snprintf(err + k, n - k, " (%u attempts within --join-timeout, %llu s)", tries,
			 (unsigned long long)s->join_timeout);
}

/* Runs attempt on a fresh connection, again with back-off (50 ms doubling
 * to 1 s) while it fails for a passing reason, until it succeeds, fails
 * for good, the deadline passes or the daemon shuts down. */
static int retry(const struct gs_settings *s, int cancel_fd, int64_t deadline, attempt_fn attempt,
		 void *ctx, struct gs_rdv_client **out, char *err, size_t n)
{
	int delay_ms = 50;
	for (unsigned tries = 1;; tries++) {
		struct gs_rdv_client *c = new_client(s, cancel_fd);
		int rc = c ? attempt(c, ctx, deadline, err, n) : GS_ENOMEM;
		if (rc == GS_OK) {
			*out = c;
			return GS_OK;
		}
		gs_rdv_client_close(c);
		if (!c)
			snprintf(err, n, "out of memory");
		int64_t now = now_ms();
		if (!transient(rc) || now >= deadline) {
			note_attempts(err, n, tries, s);
			return rc;
		}
		if (tries == 1 && rc != GS_ECONNECT)
			gs_info("node %u: %s; trying again until --join-timeout", s->node_rank, err);
		int64_t wake = now + delay_ms < deadline ? now + delay_ms : deadline;
		if (wait_for(-1, 0, cancel_fd, wake) == GS_EABORTED) {
			snprintf(err, n, "shutting down");
			return GS_EABORTED;
		}
		delay_ms = delay_ms * 2 > 1000 ? 1000 : delay_ms * 2;
	}
}

/* ---- Authentication (auth.h) ----------------------------------------------- */

static int send_proof(struct gs_rdv_client *c, const struct gs_settings *s,
		      const uint8_t *nn, const uint8_t *cn, int64_t deadline)
{
	uint8_t mac[GS_AUTH_MAC];
	if (gs_auth_mac(s->cluster_secret, s->cluster_secret_len, GS_AUTH_NODE, s->job_id, s->node_rank,
			nn, cn, mac) < 0)
		return GS_ESYSTEM;
	Gradsync__NodeProof p = GRADSYNC__NODE_PROOF__INIT;
	p.mac.data = mac;
	p.mac.len = sizeof(mac);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &p;
	return send_msg(c, &m, deadline);
}

/* This node proves it holds the cluster secret, and the coordinator that
 * it does, before anything else is said; without a secret on either side
 * the exchange only checks that both agree there is none. */
static int authenticate(struct gs_rdv_client *c, const struct gs_settings *s, int64_t deadline,
			char *err, size_t n)
{
	bool mine = s->cluster_secret_len > 0;
	uint8_t nn[GS_AUTH_NONCE], cn[GS_AUTH_NONCE];
	if (gs_auth_nonce(nn) < 0) {
		snprintf(err, n, "cannot draw a random nonce");
		return GS_ESYSTEM;
	}
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = GS_NODE_PROTOCOL_VERSION;
	a.node_rank = s->node_rank;
	a.nonce.data = nn;
	a.nonce.len = sizeof(nn);
	a.has_secret = mine;
	a.job_id = (char *)s->job_id;
	Gradsync__Message am = GRADSYNC__MESSAGE__INIT;
	am.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	am.node_auth = &a;
	int rc = send_msg(c, &am, deadline);
	if (rc != GS_OK) {
		snprintf(err, n, "cannot reach the coordinator: %s", gs_error_desc(rc));
		return rc;
	}
	Gradsync__Message *m;
	rc = expect(c, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE, deadline, &m, err, n);
	if (rc != GS_OK)
		return rc;
	const Gradsync__NodeChallenge *ch = m->node_challenge;
	bool theirs = ch->has_secret, good = ch->nonce.len == GS_AUTH_NONCE;
	if (good)
		memcpy(cn, ch->nonce.data, GS_AUTH_NONCE);
	gradsync__message__free_unpacked(m, NULL);
	/* The coordinator refuses a mismatch itself; one that does not is not
	 * to be trusted either. */
	if (!good) {
		snprintf(err, n, "the coordinator's challenge is malformed");
		return GS_EPROTO;
	}
	if (mine != theirs) {
		snprintf(err, n, "node %u %s a cluster secret, but the coordinator %s (set the same --cluster-secret-file on every node)",
			 s->node_rank, mine ? "has" : "has no", mine ? "has none" : "has one");
		return GS_EREFUSED;
	}
	if (!mine)
		return GS_OK;
	rc = send_proof(c, s, nn, cn, deadline);
	if (rc != GS_OK) {
		snprintf(err, n, "cannot send this node's proof to the coordinator: %s", gs_error_desc(rc));
		return rc;
	}
	rc = expect(c, GRADSYNC__MESSAGE__BODY_NODE_PROOF, deadline, &m, err, n);
	if (rc != GS_OK)
		return rc;
	bool ok = gs_auth_check(s->cluster_secret, s->cluster_secret_len, GS_AUTH_COORDINATOR, s->job_id,
				s->node_rank, nn, cn, m->node_proof->mac.data, m->node_proof->mac.len);
	gradsync__message__free_unpacked(m, NULL);
	if (!ok) {
		snprintf(err, n, "the coordinator at %s could not prove it holds the cluster secret: its secret differs, or it is not the coordinator (check --cluster-secret-file on every node)",
			 s->coordinator);
		return GS_EREFUSED;
	}
	return GS_OK;
}

/* One attempt at a connection to the coordinator that has authenticated
 * (ctx: the settings). */
static int open_attempt(struct gs_rdv_client *c, void *ctx, int64_t deadline, char *err,
			size_t n)
{
	const struct gs_settings *s = ctx;
	int rc = connect_to(c, s, deadline, err, n);
	if (rc == GS_OK)
		rc = authenticate(c, s, deadline, err, n);
	if (rc == GS_OK)
		start_pinging(c);
	if (rc == GS_ETIMEDOUT)
		snprintf(err, n, "the coordinator %s did not answer the authentication within %llu s (--join-timeout)",
			 s->coordinator, (unsigned long long)s->join_timeout);
	return rc;
}

static int say_hello(struct gs_rdv_client *c, const struct gs_settings *s,
		     const char *gloo_host, int64_t deadline)
{
	char shared[512];
	gs_settings_shared_text(s, shared, sizeof(shared));
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = GS_NODE_PROTOCOL_VERSION;
	h.node_rank = s->node_rank;
	h.nodes = s->nodes;
	h.local_size = s->local_size;
	h.settings = shared;
	h.host = (char *)gloo_host;
	h.owner_uid = (uint32_t)s->owner;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	return send_msg(c, &m, deadline);
}

static int read_welcome(const Gradsync__NodeWelcome *w, const struct gs_settings *s,
			struct gs_node_info *nodes, char *err, size_t n)
{
	if (w->incarnation == 0) {
		snprintf(err, n, "the coordinator's welcome names no incarnation: it runs an older gradsyncd (run the same version on every node)");
		return GS_EPROTO;
	}
	if (w->n_nodes != s->nodes) {
		snprintf(err, n, "the coordinator welcomed %zu nodes; %u expected", w->n_nodes, s->nodes);
		return GS_EPROTO;
	}
	for (size_t r = 0; r < w->n_nodes; r++) {
		const Gradsync__NodeInfo *ni = w->nodes[r];
		char why[160];
		if (ni->node_rank != r || ni->local_size == 0 || ni->local_size > 64 ||
		    (ni->host[0] && gs_host_check(ni->host, why, sizeof(why)) < 0)) {
			snprintf(err, n, "the coordinator's node list is malformed at node %zu", r);
			return GS_EPROTO;
		}
		nodes[r].local_size = ni->local_size;
		snprintf(nodes[r].host, sizeof(nodes[r].host), "%s", ni->host);
	}
	return GS_OK;
}

struct join_ctx {
	const struct gs_settings *s;
	const char *gloo_host;
	struct gs_node_info *nodes;
};

/* One attempt at joining: a connection that has authenticated, the
 * hello, and the wait for every node's. */
static int join_attempt(struct gs_rdv_client *c, void *ctx, int64_t deadline, char *err, size_t n)
{
	const struct join_ctx *j = ctx;
	const struct gs_settings *s = j->s;
	int rc = open_attempt(c, (void *)s, deadline, err, n);
	if (rc != GS_OK)
		return rc;
	Gradsync__Message *m = NULL;
	rc = say_hello(c, s, j->gloo_host, deadline);
	if (rc == GS_OK)
		rc = expect(c, GRADSYNC__MESSAGE__BODY_NODE_WELCOME, deadline, &m, err, n);
	else
		snprintf(err, n, "cannot send hello to the coordinator: %s", gs_error_desc(rc));
	if (rc == GS_ETIMEDOUT)
		snprintf(err, n, "not every node joined within %llu s (--join-timeout)",
			 (unsigned long long)s->join_timeout);
	if (rc == GS_OK) {
		rc = read_welcome(m->node_welcome, s, j->nodes, err, n);
		c->generation = m->node_welcome->generation;
		c->incarnation = m->node_welcome->incarnation;
	}
	if (m)
		gradsync__message__free_unpacked(m, NULL);
	return rc;
}

int gs_rdv_join(const struct gs_settings *s, const char *gloo_host, int cancel_fd,
		struct gs_node_info *nodes, struct gs_rdv_client **out,
		char *err, size_t errlen)
{
	int64_t deadline = now_ms() + (int64_t)s->join_timeout * 1000;
	struct join_ctx j = { s, gloo_host, nodes };
	return retry(s, cancel_fd, deadline, join_attempt, &j, out, err, errlen);
}

/* ---- The store ---------------------------------------------------------------- */

int gs_rdv_store_set(void *client, const char *key, const void *value, size_t len)
{
	struct gs_rdv_client *c = client;
	Gradsync__StoreSet set = GRADSYNC__STORE_SET__INIT;
	set.key = (char *)key;
	set.value.data = (uint8_t *)value;
	set.value.len = len;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_SET;
	m.store_set = &set;
	return send_msg(c, &m, now_ms() + c->join_timeout_ms);
}

int gs_rdv_store_get(void *client, const char *key, void **value, size_t *len,
		     int timeout_ms)
{
	struct gs_rdv_client *c = client;
	int64_t deadline = now_ms() + timeout_ms;
	Gradsync__StoreGet get = GRADSYNC__STORE_GET__INIT;
	get.key = (char *)key;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_GET;
	m.store_get = &get;
	int rc = send_msg(c, &m, deadline);
	if (rc != GS_OK)
		return rc;
	char err[256];
	Gradsync__Message *r;
	rc = expect(c, GRADSYNC__MESSAGE__BODY_STORE_VALUE, deadline, &r, err, sizeof(err));
	if (rc != GS_OK)
		return rc;
	*len = r->store_value->value.len;
	*value = malloc(*len ? *len : 1);
	if (*value && *len > 0) /* an empty value's data may be NULL */
		memcpy(*value, r->store_value->value.data, *len);
	gradsync__message__free_unpacked(r, NULL);
	return *value ? GS_OK : GS_ENOMEM;
}

/* ---- Parked: pings answered by a thread of its own ------------------------ */

/* Answers every Ping among the whole frames buffered and takes it out,
 * leaving the other frames, in their order, for the next recv_msg. */
static void answer_buffered_pings(struct gs_rdv_client *c)
{
	struct gs_frame_reader *r = &c->reader;
	size_t off = 0;
	while (r->len - off >= GS_FRAME_HEADER_SIZE) {
		size_t len = gs_frame_get_len(r->buf + off);
		size_t whole = GS_FRAME_HEADER_SIZE + len;
		if (len > r->max_frame || r->len - off < whole)
			return;
		Gradsync__Message *m =
			gradsync__message__unpack(NULL, len, r->buf + off + GS_FRAME_HEADER_SIZE);
		bool ping = m && m->body_case == GRADSYNC__MESSAGE__BODY_PING;
		uint64_t seq = ping ? m->ping->seq : 0;
		if (m)
			gradsync__message__free_unpacked(m, NULL);
		if (!ping) {
			off += whole;
			continue;
		}
		memmove(r->buf + off, r->buf + off + whole, r->len - off - whole);
		r->len -= whole;
		send_liveness(c, true, seq, now_ms() + (int64_t)c->peer_timeout_s * 1000);
	}
}

static void *park_run(void *arg)
{
	struct gs_rdv_client *c = arg;
	struct pollfd p[2] = { { c->park_stop, POLLIN, 0 }, { c->fd, POLLIN, 0 } };
	bool open = true;
	for (;;) {
		int n = poll(p, open ? 2 : 1, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || p[0].revents)
			return NULL;
		/* The end of the stream, or an error, is met again by the
		 * next recv_msg; here it only ends the reading. */
		if (fill(c) == GS_OK)
			answer_buffered_pings(c);
		else
			open = false;
	}
}

int gs_rdv_client_park(struct gs_rdv_client *c)
{
	c->park_stop = eventfd(0, EFD_CLOEXEC);
	if (c->park_stop < 0)
		return GS_ESYSTEM;
	if (pthread_create(&c->parker, NULL, park_run, c) != 0) {
		close(c->park_stop);
		c->park_stop = -1;
		return GS_ESYSTEM;
	}
	pthread_setname_np(c->parker, "gs-park");
	c->parked = true;
	return GS_OK;
}

void gs_rdv_client_unpark(struct gs_rdv_client *c)
{
	if (!c->parked)
		return;
	uint64_t one = 1;
	if (write(c->park_stop, &one, sizeof(one)) < 0)
		gs_warn("cannot stop the thread that answers the coordinator's pings");
	pthread_join(c->parker, NULL);
	close(c->park_stop);
	c->park_stop = -1;
	c->parked = false;
}

/* ---- Handing over --------------------------------------------------------------- */

uint64_t gs_rdv_generation(const struct gs_rdv_client *c)
{
	return c->generation;
}

uint64_t gs_rdv_incarnation(const struct gs_rdv_client *c)
{
	return c->incarnation;
}

int gs_rdv_client_detach(struct gs_rdv_client *c, uint8_t **pending, size_t *len)
{
	gs_rdv_client_unpark(c);
	int fd = c->fd;
	*pending = NULL;
	*len = c->reader.len;
	if (*len > 0 && (*pending = malloc(*len)) != NULL)
		memcpy(*pending, c->reader.buf, *len);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	c->fd = -1;
	gs_rdv_client_close(c);
	return fd;
}

int gs_rdv_store_connect(const struct gs_settings *s, int cancel_fd,
			 struct gs_rdv_client **out, char *err, size_t errlen)
{
	int64_t deadline = now_ms() + (int64_t)s->join_timeout * 1000;
	return retry(s, cancel_fd, deadline, open_attempt, (void *)s, out, err, errlen);
}
