/*
 * The group of a job's nodes, built and dropped on the worker thread:
 * the Gloo context every node votes in, over a store of the rendezvous
 * whose keys name the coordinator's incarnation and the generation, then
 * the backend's part (its communicators), once every node runs the same
 * backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/gloo/gloo_comm.h"
#include "cluster/cluster_private.h"
#include "errors.h"
#include "support/log.h"
#include "support/settings.h"
#include "support/worker.h"

/* The group's Gloo handle changes on the worker thread, which alone runs
 * collectives on it; the old one, if any, is destroyed. */
void cluster_set_gloo(struct gs_cluster *c, struct gs_gloo *g)
{
	pthread_mutex_lock(&c->gloo_lock);
	struct gs_gloo *old = c->gloo;
	c->gloo = g;
	pthread_mutex_unlock(&c->gloo_lock);
	gs_gloo_destroy(old);
}

/* A node is gone (the loop thread's news): a collective the worker waits
 * in would only wait out its deadline (a vote's is --step-timeout plus
 * --peer-timeout), and the group is to be rebuilt, so end it now. */
void cluster_interrupt_group(struct gs_cluster *c, const char *why)
{
	pthread_mutex_lock(&c->gloo_lock);
	gs_gloo_interrupt(c->gloo, why);
	pthread_mutex_unlock(&c->gloo_lock);
}

/* Store keys of one group generation of one coordinator's incarnation, so
 * that a rebuilt group never reads a departed one's addresses, nor one
 * built for a coordinator that has since restarted: the store of the
 * group, for Gloo and for the backend (struct gs_kv). */
struct group_store {
	struct gs_rdv_client *rdv;
	char prefix[48];
};

static int store_set(void *ctx, const char *key, const void *value, size_t len)
{
	struct group_store *p = ctx;
	char k[256];
	snprintf(k, sizeof(k), "%s%s", p->prefix, key);
	return gs_rdv_store_set(p->rdv, k, value, len);
}

static int store_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	struct group_store *p = ctx;
	char k[256];
	snprintf(k, sizeof(k), "%s%s", p->prefix, key);
	return gs_rdv_store_get(p->rdv, k, value, len, timeout_ms);
}

/* A park that fails leaves the pings unanswered: the backend goes on. */
static void store_park(void *ctx)
{
	gs_rdv_client_park(((struct group_store *)ctx)->rdv);
}

static void store_unpark(void *ctx)
{
	gs_rdv_client_unpark(((struct group_store *)ctx)->rdv);
}

static int join_timeout_ms(const struct gs_cluster *c)
{
	return (int)(c->settings->join_timeout * 1000);
}

/* Every node says which backend it runs, and all must run the same one:
 * a node that sums through Gloo cannot meet one that sums through NCCL. */
static int same_backend(struct gs_cluster *c, const struct gs_kv *kv, char *why, size_t n)
{
	const char *mine = c->backend->name;
	size_t mylen = strlen(mine);
	char key[32];
	snprintf(key, sizeof(key), "backend/%u", c->node_rank);
	int rc = kv->set(kv->ctx, key, mine, mylen);
	if (rc != GS_OK) {
		snprintf(why, n, "saying which backend this node runs: %s", gs_error_desc(rc));
		return rc;
	}
	for (uint32_t r = 0; r < c->nodes; r++) {
		void *value = NULL;
		size_t len = 0;
		snprintf(key, sizeof(key), "backend/%u", r);
		rc = kv->get(kv->ctx, key, &value, &len, join_timeout_ms(c));
		if (rc != GS_OK) {
			snprintf(why, n, "node %u did not say which backend it runs (%s)", r,
				 gs_error_desc(rc));
			return rc;
		}
		bool same = len == mylen && !memcmp(value, mine, len);
		if (!same)
			snprintf(why, n, "node %u runs the %.*s backend and node %u the %s backend: every node of a job must run the same one (--backend)",
				 r, (int)(len < 16 ? len : 16), (const char *)value, c->node_rank,
				 mine);
		free(value);
		if (!same)
			return GS_EINVAL;
	}
	return GS_OK;
}

/* The backend joins the group (its communicators, or its all-reduce
 * through the Gloo context). */
static int join_backend(struct gs_cluster *c, const struct gs_kv *kv,
			const struct gs_node_info *nodes, uint64_t generation, char *err, size_t n)
{
	struct gs_backend *b = c->backend;
	if (!b->ops->join_group)
		return GS_OK;
	struct gs_group_join g = {
		.node_rank = c->node_rank,
		.nodes = c->nodes,
		.generation = generation,
		.join_timeout_ms = join_timeout_ms(c),
		.peer_timeout_ms = (int)(c->settings->peer_timeout * 1000),
		.cancel_fd = c->cancel_fd,
		.kv = kv,
		.gloo = c->gloo,
	};
	for (uint32_t r = 0; r < c->nodes; r++) {
		if (r < c->node_rank)
			g.rank_base += nodes[r].local_size;
		g.world_size += nodes[r].local_size;
	}
	return b->ops->join_group(b, &g, err, n);
}

/* The group of generation (worker thread): the Gloo context every node
 * votes in, then the backend's part. nodes are the nodes as the
 * coordinator welcomed them. */
int cluster_build_group(struct gs_cluster *c, struct gs_rdv_client *rdv,
		       const struct gs_node_info *nodes, uint64_t generation, char *err, size_t n)
{
	const struct gs_settings *s = c->settings;
	struct group_store gs = { rdv, "" };
	snprintf(gs.prefix, sizeof(gs.prefix), "i%016llx/g%llu/",
		 (unsigned long long)c->incarnation, (unsigned long long)generation);
	const struct gs_kv kv = { &gs, store_set, store_get, store_park, store_unpark };
	int rc = same_backend(c, &kv, err, n);
	if (rc != GS_OK)
		return rc;
	struct gs_gloo_store_ops store = { &gs, store_set, store_get };
	char why[400];
	struct gs_gloo *g = NULL;
	rc = gs_gloo_create(&store, (int)s->node_rank, (int)s->nodes,
			    s->gloo_host[0] ? s->gloo_host : NULL, join_timeout_ms(c), &g, why,
			    sizeof(why));
	if (rc != GS_OK) {
		snprintf(err, n, "building the Gloo group: %s", why);
		return rc;
	}
	cluster_set_gloo(c, g);
	gs_info("the group of %u nodes sums buckets of up to %zu bytes by recursive doubling, up to %zu by Rabenseifner's halving and doubling, larger ones by Gloo's ring",
		s->nodes, gs_gloo_doubling_up_to(c->gloo), gs_gloo_rabenseifner_up_to(c->gloo));
	rc = join_backend(c, &kv, nodes, generation, err, n);
	if (rc != GS_OK)
		cluster_set_gloo(c, NULL);
	return rc;
}

/* Worker thread: the backend stops using the group before it goes (what
 * it made of it, such as communicators that include the node that went
 * away, is made again with the next group). */
void cluster_drop_group_run(struct gs_cluster *c)
{
	struct gs_backend *b = c->backend;
	if (b->ops->leave_group)
		b->ops->leave_group(b);
	cluster_set_gloo(c, NULL);
}

struct drop_work {
	struct gs_work work;
	struct gs_cluster *c;
};

static void drop_run(struct gs_work *w)
{
	cluster_drop_group_run(((struct drop_work *)w)->c);
}

static void drop_done(struct gs_work *w)
{
	free(w);
}

/* The group includes node 0, which is gone: votes fail at once instead of
 * in a collective with it, and the backend no longer uses it. */
void cluster_drop_group(struct gs_cluster *c)
{
	struct drop_work *dw = calloc(1, sizeof(*dw));
	if (!dw)
		return; /* the group is dropped when it is rebuilt */
	dw->work.run = drop_run;
	dw->work.done = drop_done;
	dw->c = c;
	gs_worker_submit(c->worker, &dw->work);
}
