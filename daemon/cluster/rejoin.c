/*
 * Joining a restarted coordinator: node 0's daemon went away (under
 * systemd it is back within seconds, knowing nothing of the job). A thread
 * of its own joins its successor with the back-off of the start, so that
 * the worker stays free for the votes that end steps; then the worker
 * builds the new group, the loop adopts the connection and the job offers
 * its layout again.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cluster/cluster_private.h"
#include "engine/job.h"
#include "errors.h"
#include "support/log.h"
#include "support/settings.h"
#include "support/worker.h"

/* A coordinator down for long is named at most once a minute, with the
 * failures since; the attempts themselves go on while the daemon runs. */
#define REJOIN_LOG_MS 60000
#define REJOIN_PAUSE_MS 1000

struct rejoin_work {
	struct gs_work work;
	struct gs_cluster *c;
	struct gs_node_info *node; /* as the new coordinator welcomed them */
	struct gs_rdv_client *rdv;
	uint64_t generation; /* of the new coordinator's group */
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
	struct gs_cluster *c = rw->c;
	const struct gs_settings *s = c->settings;
	const char *host = s->gloo_host[0] ? s->gloo_host : "";
	unsigned failures = 0;
	uint64_t logged_ns = 0;
	for (;;) {
		rw->rc = gs_rdv_join(s, host, c->cancel_fd, rw->node, &rw->rdv, rw->err,
				     sizeof(rw->err));
		if (rw->rc == GS_OK || rw->rc == GS_EABORTED)
			return;
		failures++;
		uint64_t now = uv_hrtime();
		if (failures == 1 || now - logged_ns >= REJOIN_LOG_MS * 1000000ull) {
			gs_warn("cannot re-join the coordinator (node 0) yet (%u attempts): %s; trying again",
				failures, rw->err);
			logged_ns = now;
		}
		if (!pause_between(c->cancel_fd)) {
			rw->rc = GS_EABORTED;
			return;
		}
	}
}

/* On the worker: the group of the new coordinator's incarnation. */
static void rebuild_run(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_cluster *c = rw->c;
	gs_rdv_client_unpark(rw->rdv);
	cluster_drop_group_run(c);
	c->incarnation = gs_rdv_incarnation(rw->rdv);
	rw->rc = cluster_build_group(c, rw->rdv, rw->node, rw->generation, rw->err, sizeof(rw->err));
}


static void rebuild_done(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_cluster *c = rw->c;
	if (cluster_stopped(c)) {
		rejoin_free(rw);
		return;
	}
	if (rw->rc != GS_OK) {
		/* Closing the connection tells the coordinator; it welcomes
		 * every node again once this one is back. */
		gs_error("cannot build the group with the restarted coordinator: %s; re-joining",
			 rw->err);
		rejoin_free(rw);
		if (cluster_member_on(c, GS_MEMBER_BUILD_FAILED, 0, c->member.generation) >= 0)
			cluster_start_rejoin(c);
		return;
	}
	uint32_t world = c->world_size;
	memcpy(c->node, rw->node, c->nodes * sizeof(*c->node));
	cluster_count_world(c);
	if (c->world_size != world) {
		gs_warn("node 0 came back with %u trainers: %u in all, %u before", c->node[0].local_size,
			c->world_size, world);
		cluster_tell_world(c);
	}
	struct gs_rdv_client *rdv = rw->rdv;
	rw->rdv = NULL;
	rejoin_free(rw);
	if (!cluster_adopt_connection(c, rdv)) {
		gs_error("out of memory adopting the connection to the coordinator; re-joining");
		if (cluster_member_on(c, GS_MEMBER_BUILD_FAILED, 0, c->member.generation) >= 0)
			cluster_start_rejoin(c);
		return;
	}
	cluster_member_on(c, GS_MEMBER_BUILT, 0, c->member.generation);
	gs_info("re-joined the coordinator (node 0, incarnation %016llx): the group of %u nodes is whole again",
		(unsigned long long)c->incarnation, c->nodes);
	cluster_reannounce_layout(c);
	gs_job_resume(c->job, c->member.generation);
}

static void rejoin_done(struct gs_work *w)
{
	struct rejoin_work *rw = (struct rejoin_work *)w;
	struct gs_cluster *c = rw->c;
	rw->generation = rw->rc == GS_OK ? gs_rdv_generation(rw->rdv) : 0;
	if (rw->rc != GS_OK ||
	    cluster_member_on(c, GS_MEMBER_REJOINED, 0, rw->generation) < 0) { /* stopping */
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
	gs_worker_submit(c->worker, &rw->work);
}

/* Entered REJOINING (once per entry): a thread of its own joins the
 * successor. */
void cluster_start_rejoin(struct gs_cluster *c)
{
	if (!c->rejoiner_started) {
		int r = gs_worker_start(&c->rejoiner, c->loop);
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
	rw->c = c;
	gs_info("node %u: re-joining the rendezvous at %s (each attempt up to %llu s, until it answers)",
		c->node_rank, c->settings->coordinator, (unsigned long long)c->settings->join_timeout);
	gs_worker_submit(&c->rejoiner, &rw->work);
}
