#include "cluster/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "serve/conn.h"
#include "daemon.h"
#include "errors.h"
#include "engine/job.h"
#include "cluster/liveness.h"
#include "support/log.h"
#include "support/worker.h"
#ifdef GS_HAVE_GLOO
#include "backend/gloo/gloo_comm.h"
#endif
#ifdef GS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

/* ---- The Gloo group, built on the worker thread --------------------------- */

#ifdef GS_HAVE_GLOO
/* Store keys of one group generation of one coordinator's incarnation, so
 * that a rebuilt group never reads a departed one's addresses, nor one
 * built for a coordinator that has since restarted. */
struct prefixed_store {
	struct gs_rdv_client *rdv;
	char prefix[48];
};

static int prefixed_set(void *ctx, const char *key, const void *value, size_t len)
{
	struct prefixed_store *p = ctx;
	char k[256];
	snprintf(k, sizeof(k), "%s%s", p->prefix, key);
	return gs_rdv_store_set(p->rdv, k, value, len);
}

static int prefixed_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	struct prefixed_store *p = ctx;
	char k[256];
	snprintf(k, sizeof(k), "%s%s", p->prefix, key);
	return gs_rdv_store_get(p->rdv, k, value, len, timeout_ms);
}
#endif

/* The group of this generation (worker thread): with the cuda backend,
 * first the NCCL communicators (node 0's unique id shared through the
 * store), then the Gloo group, which every backend votes in. nodes are
 * the nodes as the coordinator welcomed them. */
static int build_group(struct gs_daemon *d, struct gs_rdv_client *rdv,
		       const struct gs_node_info *nodes, char *err, size_t n)
{
#ifdef GS_HAVE_GLOO
	struct gs_cluster *c = &d->cluster;
	const struct gs_settings *s = &d->settings;
	struct prefixed_store ps = { rdv, "" };
	snprintf(ps.prefix, sizeof(ps.prefix), "i%016llx/g%llu/",
		 (unsigned long long)c->incarnation, (unsigned long long)c->generation);
#ifdef GS_HAVE_CUDA
	int crc = gs_cuda_join(d->backend, rdv, ps.prefix, s, nodes, c->cancel_fd, err, n);
	if (crc != GS_OK)
		return crc;
#else
	(void)nodes;
#endif
	struct gs_gloo_store_ops store = { &ps, prefixed_set, prefixed_get };
	char why[400];
	int rc = gs_gloo_create(&store, (int)s->node_rank, (int)s->nodes,
				s->gloo_host[0] ? s->gloo_host : NULL,
				(int)(s->join_timeout * 1000), &c->gloo, why, sizeof(why));
	if (rc != GS_OK)
		snprintf(err, n, "building the Gloo group: %s", why);
	return rc;
#else
	(void)d;
	(void)rdv;
	(void)nodes;
	snprintf(err, n, "built without Gloo");
	return GS_EINVAL;
#endif
}

/* ---- Joining, on the worker thread ------------------------------------- */

struct join_work {
	struct gs_work work;
	struct gs_daemon *d;
	void (*ready)(struct gs_daemon *d, bool ok);
	int rc;
	char err[512];
};

static void join_run(struct gs_work *w)
{
	struct join_work *jw = (struct join_work *)w;
	struct gs_daemon *d = jw->d;
	struct gs_cluster *c = &d->cluster;
	const struct gs_settings *s = &d->settings;
	const char *host = s->gloo_host[0] ? s->gloo_host : NULL;
	jw->rc = gs_rdv_join(s, host ? host : "", c->cancel_fd, c->node, &c->rdv, jw->err,
			     sizeof(jw->err));
	if (jw->rc != GS_OK)
		return;
	c->generation = gs_rdv_generation(c->rdv);
	c->incarnation = gs_rdv_incarnation(c->rdv);
	jw->rc = build_group(d, c->rdv, c->node, jw->err, sizeof(jw->err));
}

/* ---- The coordinator's connection, on the loop -------------------------- */

static void start_regroup(struct gs_daemon *d, uint64_t generation);

static void on_node_lost(struct gs_daemon *d, const Gradsync__NodeLost *m)
{
	struct gs_cluster *c = &d->cluster;
	if (m->node_rank >= c->nodes)
		return;
	c->lost[m->node_rank] = true;
	c->group_ready = false;
	char why[320];
	snprintf(why, sizeof(why), "node %u went away: %s", m->node_rank,
		 m->reason ? m->reason : "");
	gs_warn("%s; steps wait until it returns", why);
	gs_job_peer_lost(&d->job, why);
}

static void coordinator_dispatch(struct gs_conn *conn, const Gradsync__Message *m)
{
	struct gs_daemon *d = conn->d;
	struct gs_liveness_msg lm;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_PING:
		gs_liveness_pong(&lm, m->ping->seq);
		gs_conn_send(conn, &lm.m);
		break;
	case GRADSYNC__MESSAGE__BODY_PONG:
		break; /* its arrival was the point */
	case GRADSYNC__MESSAGE__BODY_NODE_LOST:
		on_node_lost(d, m->node_lost);
		break;
	case GRADSYNC__MESSAGE__BODY_REGROUP:
		/* A group that failed on some node: the step in flight cannot
		 * finish on any node. */
		if (m->regroup->reason && m->regroup->reason[0])
			gs_job_peer_lost(&d->job, m->regroup->reason);
		start_regroup(d, m->regroup->generation);
		break;
	case GRADSYNC__MESSAGE__BODY_LAYOUT_VERDICT: {
		const Gradsync__LayoutVerdict *v = m->layout_verdict;
		if (v->round != d->cluster.agree_round)
			break; /* a verdict for an offer given up on */
		d->cluster.agree_round = 0;
		uv_timer_stop(&d->cluster.agree_timer);
		gs_job_layout_verdict(&d->job, v->round, v->agreed ? GS_OK : GS_ELAYOUT,
				      v->message);
		break;
	}
	case GRADSYNC__MESSAGE__BODY_ERROR:
		gs_error("the coordinator says: %s", m->error->message);
		break;
	default:
		gs_warn("unexpected message %d from the coordinator", (int)m->body_case);
	}
}

static void start_rejoin(struct gs_daemon *d);
static void drop_group(struct gs_daemon *d);

/* Node 0's daemon went away. Under systemd it is back within seconds,
 * knowing nothing of this job: the step in flight is aborted, trainers
 * stay, later steps wait, and this node joins the new coordinator as at
 * start. Node 0's own connection closes only when it stops. */
static void coordinator_closed(struct gs_conn *conn)
{
	struct gs_daemon *d = conn->d;
	struct gs_cluster *c = &d->cluster;
	c->conn = NULL;
	uv_timer_stop(&c->ping_timer);
	if (d->stopping)
		return;
	c->group_ready = false;
	if (c->node_rank == 0) {
		gs_error("lost this node's own connection to its rendezvous: several-node steps stop until gradsyncd is restarted");
		gs_job_peer_lost(&d->job, "node 0 lost its connection to its own rendezvous");
		return;
	}
	if (c->lost)
		c->lost[0] = true;
	char why[320];
	snprintf(why, sizeof(why), "node 0 (the coordinator) went away: the connection to its rendezvous at %.200s closed; steps wait until it is back",
		 d->settings.coordinator);
	gs_error("lost the connection to the coordinator (node 0) at %s: re-joining it when it is back (steps wait meanwhile, each up to --step-timeout)",
		 d->settings.coordinator);
	gs_job_peer_lost(&d->job, why);
	drop_group(d);
	start_rejoin(d);
}

/* A coordinator that sent nothing for --peer-timeout (a partition, a
 * proxy that stopped forwarding) is taken as gone, as if its connection
 * had closed: coordinator_closed re-joins it. */
static void on_ping_timer(uv_timer_t *t)
{
	struct gs_daemon *d = t->data;
	struct gs_cluster *c = &d->cluster;
	if (!c->conn)
		return;
	uint64_t silent = gs_conn_silent_ms(c->conn);
	if (silent < d->settings.peer_timeout * 1000) {
		struct gs_liveness_msg lm;
		gs_liveness_ping(&lm, ++c->ping_seq);
		gs_conn_send(c->conn, &lm.m);
		return;
	}
	gs_error("the coordinator (node 0) at %s sent nothing for %.1f s (--peer-timeout %llu s): taking it as gone",
		 d->settings.coordinator, (double)silent / 1000.0,
		 (unsigned long long)d->settings.peer_timeout);
	gs_conn_close(c->conn);
}

static void start_pinging(struct gs_daemon *d, int fd)
{
	if (gs_tcp_liveness(fd, d->settings.peer_timeout) < 0)
		gs_debug("cannot set TCP keepalive on the connection to the coordinator");
	uint64_t every = gs_ping_interval_ms(d->settings.peer_timeout);
	uv_timer_start(&d->cluster.ping_timer, on_ping_timer, every, every);
}

static bool adopt_connection(struct gs_daemon *d, struct gs_rdv_client *rdv)
{
	struct gs_cluster *c = &d->cluster;
	uint8_t *pending;
	size_t len;
	int fd = gs_rdv_client_detach(rdv, &pending, &len);
	c->conn = gs_conn_create(d, fd, 64u << 20, coordinator_dispatch, coordinator_closed);
	if (c->conn) {
		c->conn->role = GS_CONN_NODE;
		snprintf(c->conn->addr, sizeof(c->conn->addr), "coordinator %.51s",
			 d->settings.coordinator);
		/* Bytes that came with the welcome are the start of what follows. */
		if (len > 0 && gs_frame_reader_prepend(&c->conn->reader, pending, len) < 0)
			gs_warn("dropped %zu bytes from the coordinator", len);
		start_pinging(d, fd);
	}
	free(pending);
	if (!c->lost)
		c->lost = calloc(c->nodes, sizeof(*c->lost));
	return c->conn != NULL && c->lost != NULL;
}

/* ---- Rebuilding the group when a node came back ---------------------------- */

/* Worker thread: the backend stops using the group before it goes; the
 * cuda backend's communicators, which include the node that went away,
 * are aborted (made again with the next group). */
static void drop_group_run(struct gs_daemon *d)
{
	struct gs_cluster *c = &d->cluster;
	gs_backend_host_attach_gloo(d->backend, NULL, 0);
#ifdef GS_HAVE_CUDA
	if (gs_backend_is_cuda(d->backend))
		gs_backend_cuda_disconnect(d->backend);
#endif
#ifdef GS_HAVE_GLOO
	gs_gloo_destroy(c->gloo);
#endif
	c->gloo = NULL;
}

struct regroup_work {
	struct gs_work work;
	struct gs_daemon *d;
	int rc;
	char err[512];
};

static void regroup_run(struct gs_work *w)
{
	struct regroup_work *rw = (struct regroup_work *)w;
	struct gs_daemon *d = rw->d;
	struct gs_cluster *c = &d->cluster;
	drop_group_run(d);
	struct gs_rdv_client *store;
	rw->rc = gs_rdv_store_connect(&d->settings, c->cancel_fd, &store, rw->err, sizeof(rw->err));
	if (rw->rc != GS_OK)
		return;
	rw->rc = build_group(d, store, c->node, rw->err, sizeof(rw->err));
	gs_rdv_client_close(store);
	if (rw->rc == GS_OK)
		gs_backend_host_attach_gloo(d->backend, c->gloo, (int)(d->settings.peer_timeout * 1000));
}

static void regroup_done(struct gs_work *w)
{
	struct regroup_work *rw = (struct regroup_work *)w;
	struct gs_daemon *d = rw->d;
	struct gs_cluster *c = &d->cluster;
	if (rw->rc == GS_OK) {
		memset(c->lost, 0, c->nodes * sizeof(*c->lost));
		c->group_ready = true;
		gs_info("the group of %u nodes is whole again (generation %llu)", c->nodes,
			(unsigned long long)c->generation);
		gs_job_resume(&d->job);
	} else if (!d->stopping) {
		gs_error("cannot rebuild the group of nodes: %s", rw->err);
	}
	free(rw);
}

static void start_regroup(struct gs_daemon *d, uint64_t generation)
{
	struct regroup_work *rw = calloc(1, sizeof(*rw));
	if (!rw) {
		gs_error("out of memory rebuilding the group");
		return;
	}
	d->cluster.generation = generation;
	d->cluster.group_ready = false;
	rw->work.run = regroup_run;
	rw->work.done = regroup_done;
	rw->d = d;
	gs_info("every node is back: rebuilding the group (generation %llu)",
		(unsigned long long)generation);
	gs_worker_submit(&d->worker, &rw->work);
}

static void count_world(struct gs_cluster *c)
{
	c->world_size = 0;
	c->rank_base = 0;
	for (uint32_t r = 0; r < c->nodes; r++) {
		if (r < c->node_rank)
			c->rank_base += c->node[r].local_size;
		c->world_size += c->node[r].local_size;
	}
}

/* ---- Re-joining a restarted coordinator ------------------------------------ */

/* A coordinator down for long is named at most once a minute, with the
 * failures since; the attempts themselves go on while the daemon runs. */
#define REJOIN_LOG_MS 60000
#define REJOIN_PAUSE_MS 1000

struct drop_work {
	struct gs_work work;
	struct gs_daemon *d;
};

static void drop_run(struct gs_work *w)
{
	drop_group_run(((struct drop_work *)w)->d);
}

static void drop_done(struct gs_work *w)
{
	free(w);
}

/* The group includes node 0, which is gone: votes fail at once instead of
 * in a collective with it, and the backend no longer uses it. */
static void drop_group(struct gs_daemon *d)
{
	struct drop_work *dw = calloc(1, sizeof(*dw));
	if (!dw)
		return; /* the group is dropped when it is rebuilt */
	dw->work.run = drop_run;
	dw->work.done = drop_done;
	dw->d = d;
	gs_worker_submit(&d->worker, &dw->work);
}

struct rejoin_work {
	struct gs_work work;
	struct gs_daemon *d;
	struct gs_node_info *node; /* as the new coordinator welcomed them */
	struct gs_rdv_client *rdv;
	int rc;
	char err[512];
};

static void rejoin_free(struct rejoin_work *rw)
{
	gs_rdv_client_close(rw->rdv);
	free(rw->node);
	free(rw);
}

/* Waits a moment between attempts; false once the daemon is stopping. */
static bool pause_between(int cancel_fd)
{
	struct pollfd p = { cancel_fd, POLLIN, 0 };
	int n;
	while ((n = poll(&p, 1, REJOIN_PAUSE_MS)) < 0 && errno == EINTR)
		;
	return n == 0;
}

/* On the rejoiner's thread: joins as at start (back-off, each attempt
 * bounded by --join-timeout) until the new coordinator has welcomed every
 * node, or the daemon stops. */
static void rejoin_run(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_daemon *d = rw->d;
	const struct gs_settings *s = &d->settings;
	const char *host = s->gloo_host[0] ? s->gloo_host : "";
	unsigned failures = 0;
	uint64_t logged_ns = 0;
	for (;;) {
		rw->rc = gs_rdv_join(s, host, d->cluster.cancel_fd, rw->node, &rw->rdv, rw->err,
				     sizeof(rw->err));
		if (rw->rc == GS_OK || rw->rc == GS_EABORTED)
			return;
		failures++;
		uint64_t now = gs_now_ns();
		if (failures == 1 || now - logged_ns >= REJOIN_LOG_MS * 1000000ull) {
			gs_warn("cannot re-join the coordinator (node 0) yet (%u attempts): %s; trying again",
				failures, rw->err);
			logged_ns = now;
		}
		if (!pause_between(d->cluster.cancel_fd)) {
			rw->rc = GS_EABORTED;
			return;
		}
	}
}

/* On the worker: the group of the new coordinator's incarnation. */
static void rebuild_run(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_daemon *d = rw->d;
	struct gs_cluster *c = &d->cluster;
	gs_rdv_client_unpark(rw->rdv);
	drop_group_run(d);
	c->generation = gs_rdv_generation(rw->rdv);
	c->incarnation = gs_rdv_incarnation(rw->rdv);
	rw->rc = build_group(d, rw->rdv, rw->node, rw->err, sizeof(rw->err));
	if (rw->rc == GS_OK)
		gs_backend_host_attach_gloo(d->backend, c->gloo, (int)(d->settings.peer_timeout * 1000));
}

static void reannounce_layout(struct gs_daemon *d);

static void rebuild_done(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_daemon *d = rw->d;
	struct gs_cluster *c = &d->cluster;
	if (d->stopping) {
		rejoin_free(rw);
		return;
	}
	if (rw->rc != GS_OK) {
		/* Closing the connection tells the coordinator; it welcomes
		 * every node again once this one is back. */
		gs_error("cannot build the group with the restarted coordinator: %s; re-joining",
			 rw->err);
		rejoin_free(rw);
		c->rejoining = false;
		start_rejoin(d);
		return;
	}
	uint32_t world = c->world_size;
	memcpy(c->node, rw->node, c->nodes * sizeof(*c->node));
	count_world(c);
	if (c->world_size != world) {
		gs_warn("node 0 came back with %u trainers: %u in all, %u before", c->node[0].local_size,
			c->world_size, world);
		gs_job_set_world(&d->job);
	}
	struct gs_rdv_client *rdv = rw->rdv;
	rw->rdv = NULL;
	rejoin_free(rw);
	c->rejoining = false;
	if (!adopt_connection(d, rdv)) {
		gs_error("out of memory adopting the connection to the coordinator");
		return;
	}
	memset(c->lost, 0, c->nodes * sizeof(*c->lost));
	c->group_ready = true;
	gs_info("re-joined the coordinator (node 0, incarnation %016llx): the group of %u nodes is whole again",
		(unsigned long long)c->incarnation, c->nodes);
	reannounce_layout(d);
	gs_job_resume(&d->job);
}

static void rejoin_done(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_daemon *d = rw->d;
	if (rw->rc != GS_OK || d->stopping) {
		d->cluster.rejoining = false;
		rejoin_free(rw);
		return;
	}
	gs_info("the coordinator (node 0) is back and every node has joined it: rebuilding the group");
	/* The worker may be busy a while: the coordinator's pings are
	 * answered meanwhile, or it would take this node for lost. */
	if (gs_rdv_client_park(rw->rdv) != GS_OK)
		gs_warn("cannot start a thread to answer the coordinator's pings while the group is rebuilt");
	rw->work.run = rebuild_run;
	rw->work.done = rebuild_done;
	gs_worker_submit(&d->worker, &rw->work);
}

static void start_rejoin(struct gs_daemon *d)
{
	struct gs_cluster *c = &d->cluster;
	if (c->rejoining)
		return;
	if (!c->rejoiner_started) {
		int r = gs_worker_start(&c->rejoiner, d->loop);
		if (r < 0) {
			gs_error("cannot start the thread that re-joins the coordinator: %s", strerror(-r));
			return;
		}
		c->rejoiner_started = true;
	}
	struct rejoin_work *rw = calloc(1, sizeof(*rw));
	if (rw)
		rw->node = calloc(c->nodes, sizeof(*rw->node));
	if (!rw || !rw->node) {
		free(rw);
		gs_error("out of memory re-joining the coordinator");
		return;
	}
	rw->work.run = rejoin_run;
	rw->work.done = rejoin_done;
	rw->d = d;
	c->rejoining = true;
	gs_info("node %u: re-joining the rendezvous at %s (each attempt up to %llu s, until it answers)",
		c->node_rank, d->settings.coordinator, (unsigned long long)d->settings.join_timeout);
	gs_worker_submit(&c->rejoiner, &rw->work);
}

static void join_done(struct gs_work *w)
{
	struct join_work *jw = (struct join_work *)w;
	struct gs_daemon *d = jw->d;
	struct gs_cluster *c = &d->cluster;
	bool ok = jw->rc == GS_OK;
	if (ok) {
		count_world(c);
		c->joined = true;
		c->group_ready = true;
		gs_info("joined as node %u of %u: %u trainers in all, this node's are global ranks %u to %u",
			c->node_rank, c->nodes, c->world_size, c->rank_base,
			c->rank_base + d->settings.local_size - 1);
		ok = adopt_connection(d, c->rdv);
		c->rdv = NULL;
	} else if (jw->rc == GS_EABORTED) {
		gs_info("node %u stopped joining: shutting down", c->node_rank);
	} else {
		gs_error("node %u cannot join the job: %s", c->node_rank, jw->err);
	}
	void (*ready)(struct gs_daemon *, bool) = jw->ready;
	free(jw);
	ready(d, ok);
}

int gs_cluster_start(struct gs_daemon *d, void (*ready)(struct gs_daemon *d, bool ok))
{
	struct gs_cluster *c = &d->cluster;
	const struct gs_settings *s = &d->settings;
	c->nodes = s->nodes;
	c->node_rank = s->node_rank;
	c->node = calloc(s->nodes, sizeof(*c->node));
	c->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!c->node || c->cancel_fd < 0)
		return GS_ENOMEM;
	uv_timer_init(d->loop, &c->agree_timer);
	c->agree_timer.data = d;
	uv_timer_init(d->loop, &c->ping_timer);
	c->ping_timer.data = d;
	if (s->nodes == 1) {
		c->node[0].local_size = s->local_size;
		c->world_size = s->local_size;
		c->joined = true;
		c->group_ready = true;
		ready(d, true);
		return GS_OK;
	}
#ifndef GS_HAVE_GLOO
	gs_error("--nodes %u: this gradsyncd was built without Gloo, which several nodes need",
		 s->nodes);
	return GS_EINVAL;
#endif
	if (s->cluster_secret_len == 0)
		gs_warn("the rendezvous at %s is unauthenticated: anyone who reaches it can join as a node or read and overwrite its store; set --cluster-secret-file (GRADSYNC_CLUSTER_SECRET_FILE) on every node",
			s->coordinator);
	if (s->node_rank == 0 && gs_rdv_server_start(d) < 0)
		return GS_ESYSTEM;
	struct join_work *jw = calloc(1, sizeof(*jw));
	if (!jw)
		return GS_ENOMEM;
	jw->work.run = join_run;
	jw->work.done = join_done;
	jw->d = d;
	jw->ready = ready;
	gs_info("node %u of %u: joining the rendezvous at %s (up to %llu s)", s->node_rank,
		s->nodes, s->coordinator, (unsigned long long)s->join_timeout);
	gs_worker_submit(&d->worker, &jw->work);
	return GS_OK;
}

void gs_cluster_cancel(struct gs_daemon *d)
{
	uint64_t one = 1;
	if (d->cluster.cancel_fd >= 0 && write(d->cluster.cancel_fd, &one, sizeof(one)) < 0)
		gs_warn("cannot signal the cluster's waits to end");
	if (d->cluster.rejoiner_started) {
		d->cluster.rejoiner_started = false;
		gs_worker_stop(&d->cluster.rejoiner);
	}
}

void gs_cluster_destroy(struct gs_daemon *d)
{
	struct gs_cluster *c = &d->cluster;
	if (c->cancel_fd >= 0)
		close(c->cancel_fd);
	c->cancel_fd = -1;
#ifdef GS_HAVE_GLOO
	gs_gloo_destroy(c->gloo);
#endif
	c->gloo = NULL;
	gs_rdv_client_close(c->rdv);
	c->rdv = NULL;
	free(c->node);
	c->node = NULL;
	free(c->lost);
	c->lost = NULL;
}

/* ---- Layout agreement ---------------------------------------------------- */

static void send_offer(struct gs_daemon *d, Gradsync__LayoutOffer *o)
{
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_LAYOUT_OFFER;
	m.layout_offer = o;
	gs_conn_send(d->cluster.conn, &m);
}

static void on_agree_timeout(uv_timer_t *t)
{
	struct gs_daemon *d = t->data;
	uint64_t round = d->cluster.agree_round;
	d->cluster.agree_round = 0;
	char why[160];
	snprintf(why, sizeof(why), "not every node registered its trainers' layout within %llu s (--join-timeout)",
		 (unsigned long long)d->settings.join_timeout);
	gs_job_layout_verdict(&d->job, round, GS_ETIMEDOUT, why);
}

/* Offers the job's layout as round `round`; a verdict not come within
 * --join-timeout fails the trainers that wait for it (timed). */
static void offer_layout(struct gs_daemon *d, uint64_t round, bool timed)
{
	struct gs_cluster *c = &d->cluster;
	const struct gs_job *j = &d->job;
	c->agree_round = round;
	if (timed)
		uv_timer_start(&c->agree_timer, on_agree_timeout, d->settings.join_timeout * 1000, 0);
	if (!c->conn)
		return; /* re-joining: offered once the coordinator is back */
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.round = round;
	o.hash = j->layout_hash;
	o.n_names = j->layout.n;
	o.names = j->layout.names;
	o.n_counts = j->layout.n;
	o.counts = j->layout.counts;
	send_offer(d, &o);
}

int gs_cluster_agree_layout(struct gs_daemon *d, uint64_t round)
{
	struct gs_cluster *c = &d->cluster;
	if (!c->conn && !c->rejoining)
		return GS_EDISCONNECTED;
	offer_layout(d, round, true);
	return GS_OK;
}

/* A restarted coordinator knows no layout: this node's job offers its own
 * again, to be compared with what node 0's restarted trainers register.
 * Trainers already registered are not timed out waiting for that. */
static void reannounce_layout(struct gs_daemon *d)
{
	struct gs_job *j = &d->job;
	if (!j->has_layout)
		return;
	j->layout_round++;
	gs_info("job '%s': offering its layout to the restarted coordinator", j->id);
	offer_layout(d, j->layout_round, !j->agreed);
}

void gs_cluster_withdraw_layout(struct gs_daemon *d)
{
	struct gs_cluster *c = &d->cluster;
	if (c->nodes == 1)
		return;
	c->agree_round = 0;
	uv_timer_stop(&c->agree_timer);
	if (!c->conn)
		return; /* a restarted coordinator knows no layout to withdraw */
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.withdraw = true;
	send_offer(d, &o);
}

int gs_cluster_vote(struct gs_daemon *d, float *v, size_t n, char *err, size_t errlen)
{
#ifdef GS_HAVE_GLOO
	/* A node votes once its trainers are ready with the bucket, so a vote
	 * waits for the slowest node's trainers, which --step-timeout bounds
	 * on that node (it then votes to abort, naming them); a trainer late
	 * past --peer-timeout must not break the group. A peer that dies
	 * fails the vote at once (its connections close). */
	const struct gs_settings *s = &d->settings;
	int timeout_ms = (int)((s->step_timeout + s->peer_timeout) * 1000);
	if (d->cluster.gloo)
		return gs_gloo_allreduce(d->cluster.gloo, GS_WIRE_F32, v, n, timeout_ms, err,
					 errlen);
#endif
	snprintf(err, errlen, "no group of nodes to vote in");
	return GS_ESTATE;
}

void gs_cluster_request_regroup(struct gs_daemon *d, uint64_t generation, const char *why)
{
	struct gs_cluster *c = &d->cluster;
	if (c->nodes == 1 || generation != c->generation || !c->group_ready)
		return;
	c->group_ready = false;
	gs_warn("the group of nodes failed with every node still there (%s): asking the coordinator to rebuild it; steps wait",
		why);
	if (!c->conn)
		return; /* re-joining: the new coordinator's group is new anyway */
	Gradsync__RegroupRequest r = GRADSYNC__REGROUP_REQUEST__INIT;
	r.generation = generation;
	r.reason = (char *)why;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGROUP_REQUEST;
	m.regroup_request = &r;
	gs_conn_send(c->conn, &m);
}

const char *gs_cluster_peer_state(const struct gs_daemon *d, uint32_t rank)
{
	const struct gs_cluster *c = &d->cluster;
	if (rank == c->node_rank)
		return "this node";
	if (!c->joined)
		return "joining";
	if (c->lost && c->lost[rank])
		return "lost";
	return c->group_ready ? "joined" : "regrouping";
}
