#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon.h"
#include "gradsync.h"
#include "log.h"
#include "worker.h"
#ifdef GS_HAVE_GLOO
#include "gloo_comm.h"
#endif

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
#ifdef GS_HAVE_GLOO
	struct gs_gloo_store_ops store = { c->rdv, gs_rdv_store_set, gs_rdv_store_get };
	char why[400];
	jw->rc = gs_gloo_create(&store, (int)s->node_rank, (int)s->nodes, host,
				(int)(s->join_timeout * 1000), &c->gloo, why, sizeof(why));
	if (jw->rc != GS_OK)
		snprintf(jw->err, sizeof(jw->err), "building the Gloo group: %s", why);
#endif
}

static void join_done(struct gs_work *w)
{
	struct join_work *jw = (struct join_work *)w;
	struct gs_daemon *d = jw->d;
	struct gs_cluster *c = &d->cluster;
	bool ok = jw->rc == GS_OK;
	if (ok) {
		c->world_size = 0;
		c->rank_base = 0;
		for (uint32_t r = 0; r < c->nodes; r++) {
			if (r < c->node_rank)
				c->rank_base += c->node[r].local_size;
			c->world_size += c->node[r].local_size;
		}
		c->joined = true;
		gs_info("joined as node %u of %u: %u trainers in all, this node's are global ranks %u to %u",
			c->node_rank, c->nodes, c->world_size, c->rank_base,
			c->rank_base + d->settings.local_size - 1);
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
	if (s->nodes == 1) {
		c->node[0].local_size = s->local_size;
		c->world_size = s->local_size;
		c->joined = true;
		ready(d, true);
		return GS_OK;
	}
#ifndef GS_HAVE_GLOO
	gs_error("--nodes %u: this gradsyncd was built without Gloo, which several nodes need",
		 s->nodes);
	return GS_EINVAL;
#endif
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
}

/* ---- Layout agreement ---------------------------------------------------- */

struct agree_work {
	struct gs_work work;
	struct gs_daemon *d;
	uint64_t round;
	int rc;
	char why[512];
};

static void agree_run(struct gs_work *w)
{
	struct agree_work *aw = (struct agree_work *)w;
	struct gs_daemon *d = aw->d;
	const struct gs_job *j = &d->job;
	aw->rc = gs_rdv_agree_layout(d->cluster.rdv, aw->round, &j->layout, j->layout_hash,
				     (int)(d->settings.join_timeout * 1000), aw->why,
				     sizeof(aw->why));
}

static void agree_done(struct gs_work *w)
{
	struct agree_work *aw = (struct agree_work *)w;
	gs_job_layout_verdict(&aw->d->job, aw->round, aw->rc, aw->why);
	free(aw);
}

int gs_cluster_agree_layout(struct gs_daemon *d, uint64_t round)
{
	struct agree_work *aw = calloc(1, sizeof(*aw));
	if (!aw)
		return GS_ENOMEM;
	aw->work.run = agree_run;
	aw->work.done = agree_done;
	aw->d = d;
	aw->round = round;
	gs_worker_submit(&d->worker, &aw->work);
	return GS_OK;
}

int gs_cluster_vote(struct gs_daemon *d, float *v, size_t n, char *err, size_t errlen)
{
#ifdef GS_HAVE_GLOO
	if (d->cluster.gloo)
		return gs_gloo_allreduce(d->cluster.gloo, GS_WIRE_F32, v, n,
					 (int)(d->settings.peer_timeout * 1000), err, errlen);
#endif
	snprintf(err, errlen, "no group of nodes to vote in");
	return GS_ESTATE;
}

const char *gs_cluster_peer_state(const struct gs_daemon *d, uint32_t rank)
{
	if (rank == d->cluster.node_rank)
		return "this node";
	return d->cluster.joined ? "joined" : "joining";
}
