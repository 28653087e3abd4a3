/*
 * Layout agreement: before its first step, a job's layout (the names and
 * sizes of its tensors) must be the same on every node. Each node offers
 * its own to the coordinator, which answers with a verdict once every
 * node has offered, within --join-timeout.
 */
#include <stdio.h>
#include <string.h>

#include "cluster/cluster_private.h"
#include "engine/job.h"
#include "errors.h"
#include "serve/conn.h"
#include "support/log.h"
#include "support/settings.h"

static void send_offer(struct gs_cluster *c, Gradsync__LayoutOffer *o)
{
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_LAYOUT_OFFER;
	m.layout_offer = o;
	gs_conn_send(c->conn, &m);
}

static void on_agree_timeout(uv_timer_t *t)
{
	struct gs_cluster *c = t->data;
	uint64_t round = c->agree_round;
	c->agree_round = 0;
	char why[160];
	snprintf(why, sizeof(why), "not every node registered its trainers' layout within %llu s (--join-timeout)",
		 (unsigned long long)c->settings->join_timeout);
	gs_job_layout_verdict(c->job, round, GS_ETIMEDOUT, why);
}

/* Offers layout (of this hash) as round `round`; a verdict not come
 * within --join-timeout fails the trainers that wait for it (timed). */
static void offer_layout(struct gs_cluster *c, uint64_t round, const struct gs_layout *layout,
			 uint64_t hash, bool timed)
{
	c->agree_round = round;
	if (timed)
		uv_timer_start(&c->agree_timer, on_agree_timeout, c->settings->join_timeout * 1000, 0);
	if (!c->conn)
		return; /* re-joining: offered once the coordinator is back */
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.round = round;
	o.hash = hash;
	o.n_names = layout->n;
	o.names = layout->names;
	o.n_counts = layout->n;
	o.counts = layout->counts;
	send_offer(c, &o);
}

int gs_cluster_agree_layout(void *cluster, uint64_t round, const struct gs_layout *layout,
			    uint64_t hash)
{
	struct gs_cluster *c = cluster;
	bool rejoining = c->member.state == GS_MEMBER_REJOINING ||
			 c->member.state == GS_MEMBER_REBUILDING;
	if (!c->conn && !rejoining)
		return GS_EDISCONNECTED;
	offer_layout(c, round, layout, hash, true);
	return GS_OK;
}

/* A restarted coordinator knows no layout: this node's job offers its own
 * again, to be compared with what node 0's restarted trainers register.
 * Trainers already registered are not timed out waiting for that. */
void cluster_reannounce_layout(struct gs_cluster *c)
{
	struct gs_job *j = c->job;
	if (!j->has_layout)
		return;
	j->layout_round++;
	gs_info("job '%s': offering its layout to the restarted coordinator", j->id);
	offer_layout(c, j->layout_round, &j->layout, j->layout_hash, !j->agreed);
}

void gs_cluster_withdraw_layout(void *cluster)
{
	struct gs_cluster *c = cluster;
	/* Shutting down, the coordinator learns it as the connection closes. */
	if (c->nodes == 1 || cluster_stopped(c))
		return;
	c->agree_round = 0;
	uv_timer_stop(&c->agree_timer);
	if (!c->conn)
		return; /* a restarted coordinator knows no layout to withdraw */
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.withdraw = true;
	send_offer(c, &o);
}
