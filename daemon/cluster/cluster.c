/*
 * A node's place in its job's group: joining at start, the coordinator's
 * connection (its pings, a node lost, a regroup, the layout's verdict),
 * the membership machine fed with what happens (membership.h), the group
 * rebuilt when every node is back, and the end. group.c builds the group,
 * rejoin.c joins a restarted coordinator, layout_agreement.c offers the
 * layout.
 */
#include "cluster/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/gloo/gloo_comm.h"
#include "cluster/cluster_private.h"
#include "cluster/liveness.h"
#include "cluster/membership.h"
#include "engine/job.h"
#include "errors.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/log.h"
#include "support/settings.h"
#include "support/worker.h"

/* ---- Joining, on the worker thread ------------------------------------- */

struct join_work {
	struct gs_work work;
	struct gs_cluster *c;
	void (*ready)(void *arg, int rc, const char *why);
	void *arg;
	uint64_t generation; /* of the group the coordinator welcomed us to */
	int rc;
	char err[512];
};

static void join_run(struct gs_work *w)
{
	struct join_work *jw = (struct join_work *)w;
	struct gs_cluster *c = jw->c;
	const struct gs_settings *s = c->settings;
	const char *host = s->gloo_host[0] ? s->gloo_host : NULL;
	jw->rc = gs_rdv_join(s, host ? host : "", c->cancel_fd, c->node, &c->rdv, jw->err,
			     sizeof(jw->err));
	if (jw->rc != GS_OK)
		return;
	jw->generation = gs_rdv_generation(c->rdv);
	c->incarnation = gs_rdv_incarnation(c->rdv);
	jw->rc = cluster_build_group(c, c->rdv, c->node, jw->generation, jw->err, sizeof(jw->err));
}

/* ---- The coordinator's connection, on the loop -------------------------- */

/* Feeds the membership machine (membership.h); the state it moved to, or
 * -1 when the event means nothing now (logged for debugging). */
int cluster_member_on(struct gs_cluster *c, enum gs_member_event e, uint32_t node,
		     uint64_t generation)
{
	struct gs_member_news news = { node, generation };
	enum gs_member_state from = c->member.state;
	int to = gs_membership_on(&c->member, e, &news);
	if (to < 0)
		gs_debug("job '%s': %s ignored while %s", c->settings->job_id,
			 gs_member_event_names[e], gs_member_state_names[from]);
	return to;
}

bool cluster_stopped(const struct gs_cluster *c)
{
	return c->member.state == GS_MEMBER_STOPPED;
}

static void start_regroup(struct gs_cluster *c, uint64_t generation);

/* The engine learns the world through its calls (engine/job.h). */
void cluster_tell_world(const struct gs_cluster *c)
{
	struct gs_world w = { c->nodes, c->node_rank, c->world_size, c->rank_base,
			      c->member.generation, gs_membership_ready(&c->member) };
	gs_job_set_world(c->job, &w);
}

static void on_node_lost(struct gs_cluster *c, const Gradsync__NodeLost *m)
{
	if (cluster_member_on(c, GS_MEMBER_NODE_LOST, m->node_rank, 0) < 0)
		return;
	char why[320];
	snprintf(why, sizeof(why), "node %u went away: %s", m->node_rank,
		 m->reason ? m->reason : "");
	gs_warn("%s; steps wait until it returns", why);
	cluster_interrupt_group(c, why);
	gs_job_peer_lost(c->job, why);
}

static void coordinator_dispatch(struct gs_conn *conn, const Gradsync__Message *m)
{
	struct gs_cluster *c = conn->owner;
	struct gs_liveness_msg lm;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_PING:
		gs_liveness_pong(&lm, m->ping->seq);
		gs_conn_send(conn, &lm.m);
		break;
	case GRADSYNC__MESSAGE__BODY_PONG:
		break; /* its arrival was the point */
	case GRADSYNC__MESSAGE__BODY_NODE_LOST:
		on_node_lost(c, m->node_lost);
		break;
	case GRADSYNC__MESSAGE__BODY_REGROUP:
		/* A group that failed on some node: the step in flight cannot
		 * finish on any node. */
		if (m->regroup->reason && m->regroup->reason[0]) {
			cluster_interrupt_group(c, m->regroup->reason);
			gs_job_peer_lost(c->job, m->regroup->reason);
		}
		start_regroup(c, m->regroup->generation);
		break;
	case GRADSYNC__MESSAGE__BODY_LAYOUT_VERDICT: {
		const Gradsync__LayoutVerdict *v = m->layout_verdict;
		if (v->round != c->agree_round)
			break; /* a verdict for an offer given up on */
		c->agree_round = 0;
		uv_timer_stop(&c->agree_timer);
		gs_job_layout_verdict(c->job, v->round, v->agreed ? GS_OK : GS_ELAYOUT,
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


/* Node 0's daemon went away. Under systemd it is back within seconds,
 * knowing nothing of this job: the step in flight is aborted, trainers
 * stay, later steps wait, and this node joins the new coordinator as at
 * start. Node 0's own connection closes only when it stops. */
static void coordinator_closed(struct gs_conn *conn)
{
	struct gs_cluster *c = conn->owner;
	c->conn = NULL;
	uv_timer_stop(&c->ping_timer);
	if (cluster_member_on(c, GS_MEMBER_COORDINATOR_LOST, 0, 0) < 0)
		return; /* stopping */
	if (c->node_rank == 0) {
		gs_error("lost this node's own connection to its rendezvous: several-node steps stop until gradsyncd is restarted");
		cluster_interrupt_group(c, "node 0 lost its connection to its own rendezvous");
		gs_job_peer_lost(c->job, "node 0 lost its connection to its own rendezvous");
		return;
	}
	/* In a partition, on_ping_timer's verdict (silent) races TCP's own
	 * (conn->error: nothing acknowledged for --peer-timeout, by
	 * TCP_USER_TIMEOUT); a reset is TCP's too. Each is named. */
	char how[64];
	if (c->coordinator_silent_ms)
		snprintf(how, sizeof(how), "it sent nothing for %.1f s",
			 (double)c->coordinator_silent_ms / 1000.0);
	else
		snprintf(how, sizeof(how), "%s", conn->error ? strerror(conn->error) : "it closed");
	c->coordinator_silent_ms = 0;
	char why[320];
	snprintf(why, sizeof(why), "node 0 (the coordinator) went away: the connection to its rendezvous at %.128s was lost (%.48s); steps wait until it is back",
		 c->settings->coordinator, how);
	gs_error("lost the connection to the coordinator (node 0) at %s (%s, --peer-timeout %llu s): taking it as gone, re-joining it when it is back (steps wait meanwhile, each up to --step-timeout)",
		 c->settings->coordinator, how, (unsigned long long)c->settings->peer_timeout);
	cluster_interrupt_group(c, why);
	gs_job_peer_lost(c->job, why);
	cluster_drop_group(c);
	cluster_start_rejoin(c);
}

/* A coordinator that sent nothing for --peer-timeout (a partition, a
 * proxy that stopped forwarding) is taken as gone, as if its connection
 * had closed: coordinator_closed re-joins it. */
static void on_ping_timer(uv_timer_t *t)
{
	struct gs_cluster *c = t->data;
	if (!c->conn)
		return;
	uint64_t silent = gs_conn_silent_ms(c->conn);
	if (silent < c->settings->peer_timeout * 1000) {
		struct gs_liveness_msg lm;
		gs_liveness_ping(&lm, ++c->ping_seq);
		gs_conn_send(c->conn, &lm.m);
		return;
	}
	c->coordinator_silent_ms = silent; /* coordinator_closed says so */
	gs_conn_close(c->conn);
}

static void start_pinging(struct gs_cluster *c, int fd)
{
	if (gs_tcp_liveness(fd, c->settings->peer_timeout) < 0)
		gs_debug("cannot set TCP keepalive on the connection to the coordinator");
	uint64_t every = gs_ping_interval_ms(c->settings->peer_timeout);
	uv_timer_start(&c->ping_timer, on_ping_timer, every, every);
}

bool cluster_adopt_connection(struct gs_cluster *c, struct gs_rdv_client *rdv)
{
	uint8_t *pending;
	size_t len;
	int fd = gs_rdv_client_detach(rdv, &pending, &len);
	c->conn = gs_conn_create(c->server->conns, fd, 64u << 20, coordinator_dispatch, coordinator_closed);
	if (c->conn) {
		c->conn->role = GS_CONN_NODE;
		c->conn->owner = c;
		snprintf(c->conn->addr, sizeof(c->conn->addr), "coordinator %.51s",
			 c->settings->coordinator);
		/* Bytes that came with the welcome are the start of what follows. */
		if (len > 0 && gs_frame_reader_prepend(&c->conn->reader, pending, len) < 0)
			gs_warn("dropped %zu bytes from the coordinator", len);
		start_pinging(c, fd);
	}
	free(pending);
	return c->conn != NULL;
}

/* ---- Rebuilding the group when a node came back ---------------------------- */


struct regroup_work {
	struct gs_work work;
	struct gs_cluster *c;
	uint64_t generation;
	int rc;
	char err[512];
};

static void regroup_run(struct gs_work *w)
{
	struct regroup_work *rw = (struct regroup_work *)w;
	struct gs_cluster *c = rw->c;
	cluster_drop_group_run(c);
	struct gs_rdv_client *store;
	rw->rc = gs_rdv_store_connect(c->settings, c->cancel_fd, &store, rw->err, sizeof(rw->err));
	if (rw->rc != GS_OK)
		return;
	rw->rc = cluster_build_group(c, store, c->node, rw->generation, rw->err, sizeof(rw->err));
	gs_rdv_client_close(store);
}

static void regroup_done(struct gs_work *w)
{
	struct regroup_work *rw = (struct regroup_work *)w;
	struct gs_cluster *c = rw->c;
	if (rw->rc == GS_OK && cluster_member_on(c, GS_MEMBER_BUILT, 0, rw->generation) >= 0) {
		gs_info("the group of %u nodes is whole again (generation %llu)", c->nodes,
			(unsigned long long)rw->generation);
		gs_job_resume(c->job, rw->generation);
	} else if (rw->rc != GS_OK && cluster_member_on(c, GS_MEMBER_BUILD_FAILED, 0, rw->generation) >= 0) {
		gs_error("cannot rebuild the group of nodes: %s", rw->err);
	}
	free(rw);
}

static void start_regroup(struct gs_cluster *c, uint64_t generation)
{
	if (cluster_member_on(c, GS_MEMBER_REGROUP, 0, generation) < 0)
		return;
	gs_job_regrouping(c->job);
	struct regroup_work *rw = calloc(1, sizeof(*rw));
	if (!rw) {
		gs_error("out of memory rebuilding the group");
		return;
	}
	rw->work.run = regroup_run;
	rw->work.done = regroup_done;
	rw->c = c;
	rw->generation = generation;
	gs_info("every node is back: rebuilding the group (generation %llu)",
		(unsigned long long)generation);
	gs_worker_submit(c->worker, &rw->work);
}

void cluster_count_world(struct gs_cluster *c)
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


static void join_done(struct gs_work *w)
{
	struct join_work *jw = (struct join_work *)w;
	struct gs_cluster *c = jw->c;
	bool ok = jw->rc == GS_OK;
	if (ok && cluster_member_on(c, GS_MEMBER_JOINED, 0, jw->generation) < 0) {
		/* Joined just as the job or the daemon ended: nobody is left
		 * to serve. */
		gs_rdv_client_close(c->rdv);
		c->rdv = NULL;
		jw->rc = GS_EABORTED;
		ok = false;
	}
	if (!ok)
		cluster_member_on(c, GS_MEMBER_JOIN_FAILED, 0, 0);
	if (ok) {
		cluster_count_world(c);
		gs_info("job '%s': joined as node %u of %u: %u trainers in all, this node's are global ranks %u to %u",
			c->settings->job_id, c->node_rank, c->nodes, c->world_size, c->rank_base,
			c->rank_base + c->settings->local_size - 1);
		ok = cluster_adopt_connection(c, c->rdv);
		c->rdv = NULL;
		cluster_tell_world(c);
	} else if (jw->rc == GS_EABORTED) {
		gs_info("job '%s': node %u stopped joining (the job or the daemon ends)",
			c->settings->job_id, c->node_rank);
	} else {
		gs_error("job '%s': node %u cannot join the job: %s", c->settings->job_id,
			 c->node_rank, jw->err);
	}
	if (!ok && !jw->err[0])
		snprintf(jw->err, sizeof(jw->err), "cannot keep the connection to the rendezvous");
	void (*ready)(void *, int, const char *) = jw->ready;
	void *arg = jw->arg;
	char why[sizeof(jw->err)];
	snprintf(why, sizeof(why), "%s", ok ? "" : jw->err);
	int rc = ok ? GS_OK : jw->rc != GS_OK ? jw->rc : GS_EDISCONNECTED;
	free(jw);
	ready(arg, rc, why);
}

void gs_cluster_init(struct gs_cluster *c, const struct gs_cluster_parts *parts)
{
	*c = (struct gs_cluster){
		.loop = parts->loop,
		.settings = parts->settings,
		.backend = parts->backend,
		.worker = parts->worker,
		.job = parts->job,
		.server = parts->server,
		.port = parts->port,
		.cancel_fd = -1,
	};
	pthread_mutex_init(&c->gloo_lock, NULL);
}

int gs_cluster_start(struct gs_cluster *c, void (*ready)(void *arg, int rc, const char *why),
		     void *arg)
{
	const struct gs_settings *s = c->settings;
	c->nodes = s->nodes;
	c->node_rank = s->node_rank;
	c->node = calloc(s->nodes, sizeof(*c->node));
	c->lost = calloc(s->nodes, sizeof(*c->lost));
	c->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!c->node || !c->lost || c->cancel_fd < 0)
		return GS_ENOMEM;
	gs_membership_init(&c->member, s->nodes, s->node_rank, c->lost);
	uv_timer_init(c->loop, &c->agree_timer);
	c->agree_timer.data = c;
	uv_timer_init(c->loop, &c->ping_timer);
	c->ping_timer.data = c;
	if (s->nodes == 1) {
		c->node[0].local_size = s->local_size;
		c->world_size = s->local_size;
		cluster_member_on(c, GS_MEMBER_JOINED, 0, 0);
		cluster_tell_world(c);
		ready(arg, GS_OK, "");
		return GS_OK;
	}
	if (!gs_gloo_available()) {
		gs_error("job '%s' has %u nodes: this gradsyncd was built without Gloo, which several nodes need",
			 s->job_id, s->nodes);
		return GS_EINVAL;
	}
	if (s->cluster_secret_len == 0)
		gs_warn("the rendezvous at %s is unauthenticated: anyone who reaches it can join as a node or read and overwrite its store; set --cluster-secret-file (GRADSYNC_CLUSTER_SECRET_FILE) on every node",
			s->coordinator);
	if (s->node_rank == 0 &&
	    gs_node_port_serve(c->port, s, &c->rdv_server) < 0)
		return GS_ESYSTEM;
	struct join_work *jw = calloc(1, sizeof(*jw));
	if (!jw)
		return GS_ENOMEM;
	jw->work.run = join_run;
	jw->work.done = join_done;
	jw->c = c;
	jw->ready = ready;
	jw->arg = arg;
	gs_info("job '%s': node %u of %u joining the rendezvous at %s (up to %llu s)", s->job_id,
		s->node_rank, s->nodes, s->coordinator, (unsigned long long)s->join_timeout);
	gs_worker_submit(c->worker, &jw->work);
	return GS_OK;
}

void gs_cluster_cancel(struct gs_cluster *c)
{
	uint64_t one = 1;
	cluster_member_on(c, GS_MEMBER_STOP, 0, 0);
	if (c->cancel_fd >= 0 && write(c->cancel_fd, &one, sizeof(one)) < 0)
		gs_warn("cannot signal the cluster's waits to end");
	/* A vote the worker waits in (an aborting trainer's, say) would
	 * hold the shutdown for --step-timeout. */
	cluster_interrupt_group(c, "gradsyncd is shutting down");
	if (c->rejoiner_started) {
		c->rejoiner_started = false;
		gs_worker_stop(&c->rejoiner);
	}
}

void gs_cluster_close(struct gs_cluster *c)
{
	/* The job may end long before the daemon: its connections go now,
	 * and so does a collective its worker still waits in. */
	cluster_interrupt_group(c, "the job ended on this node");
	if (c->conn)
		gs_conn_close(c->conn);
	gs_node_port_unserve(c->port, c->rdv_server);
	c->rdv_server = NULL;
	if (c->agree_timer.loop)
		uv_close((uv_handle_t *)&c->agree_timer, NULL);
	if (c->ping_timer.loop)
		uv_close((uv_handle_t *)&c->ping_timer, NULL);
}

void gs_cluster_destroy(struct gs_cluster *c)
{
	if (c->cancel_fd >= 0)
		close(c->cancel_fd);
	c->cancel_fd = -1;
	cluster_set_gloo(c, NULL);
	gs_rdv_client_close(c->rdv);
	c->rdv = NULL;
	free(c->node);
	c->node = NULL;
	free(c->lost);
	c->lost = NULL;
}


int gs_cluster_vote(void *cluster, float *v, size_t n, char *err, size_t errlen)
{
	struct gs_cluster *c = cluster;
	/* A node votes once its trainers are ready with the bucket, so a vote
	 * waits for the slowest node's trainers, which --step-timeout bounds
	 * on that node (it then votes to abort, naming them); a trainer late
	 * past --peer-timeout must not break the group. A peer that dies
	 * fails the vote at once (its connections close). */
	const struct gs_settings *s = c->settings;
	int timeout_ms = (int)((s->step_timeout + s->peer_timeout) * 1000);
	if (c->gloo)
		return gs_gloo_allreduce(c->gloo, GS_WIRE_F32, v, n, timeout_ms, err, errlen);
	snprintf(err, errlen, "no group of nodes to vote in");
	return GS_ESTATE;
}

void gs_cluster_request_regroup(void *cluster, uint64_t generation, const char *why)
{
	struct gs_cluster *c = cluster;
	if (c->nodes == 1 || cluster_member_on(c, GS_MEMBER_GROUP_FAILED, 0, generation) < 0)
		return;
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

const char *const gs_peer_state_names[GS_PEER_STATES] = {
	[GS_PEER_THIS_NODE] = "this node",
	[GS_PEER_JOINING] = "joining",
	[GS_PEER_JOINED] = "joined",
	[GS_PEER_REGROUPING] = "regrouping",
	[GS_PEER_LOST] = "lost",
};

static enum gs_peer_states peer_state(const struct gs_cluster *c, uint32_t rank)
{
	if (rank == c->node_rank)
		return GS_PEER_THIS_NODE;
	if (c->member.state == GS_MEMBER_JOINING || c->member.state == GS_MEMBER_FAILED)
		return GS_PEER_JOINING;
	if (gs_membership_lost(&c->member, rank))
		return GS_PEER_LOST;
	return gs_membership_ready(&c->member) ? GS_PEER_JOINED : GS_PEER_REGROUPING;
}

bool gs_cluster_peer_up(const struct gs_cluster *c, uint32_t rank)
{
	enum gs_peer_states s = peer_state(c, rank);
	return s != GS_PEER_JOINING && s != GS_PEER_LOST;
}

const char *gs_cluster_peer_state(const struct gs_cluster *c, uint32_t rank)
{
	return gs_peer_state_names[peer_state(c, rank)];
}

