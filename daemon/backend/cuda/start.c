/*
 * Starting the CUDA backend, joining the group of nodes, and making the
 * NCCL communicators. They are made at the first bucket, on the worker
 * thread: only then is every local rank's GPU known (each is bound by its
 * trainer's first buffer), and every node runs that bucket, after the
 * nodes' vote on it, so their creations meet. Alone (--nodes 1) the
 * daemon makes its own NCCL unique id then. With several nodes node 0's
 * unique id reaches every node through the group's key-value store when
 * the node joins the group (join_group, on a thread of the cluster's: the
 * store is there only), and is kept for that bucket. The same happens
 * again, in the store of the new group, whenever the nodes regroup.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"
#include "support/log.h"

#define UID_KEY "nccl/uid"

static int share_uid(const struct gs_group_join *g, uint8_t uid[GS_NCCL_UID_BYTES], char *why,
		     size_t n)
{
	const struct gs_kv *kv = g->kv;
	if (g->node_rank == 0) {
		int rc = cuda_nccl_uid(uid, why, n);
		if (rc == GS_OK)
			rc = kv->set(kv->ctx, UID_KEY, uid, GS_NCCL_UID_BYTES);
		if (rc != GS_OK && !why[0])
			snprintf(why, n, "publishing the NCCL unique id: %s", gs_error_desc(rc));
		return rc;
	}
	void *value = NULL;
	size_t len = 0;
	int rc = kv->get(kv->ctx, UID_KEY, &value, &len, g->join_timeout_ms);
	if (rc == GS_OK && len != GS_NCCL_UID_BYTES)
		rc = GS_EPROTO;
	if (rc == GS_OK)
		memcpy(uid, value, GS_NCCL_UID_BYTES);
	else
		snprintf(why, n, "getting node 0's NCCL unique id: %s", gs_error_desc(rc));
	free(value);
	return rc;
}

int cuda_join_group(struct gs_backend *b, const struct gs_group_join *g, char *why, size_t n)
{
	struct cuda_backend *cb = cuda(b);
	uint8_t uid[GS_NCCL_UID_BYTES];
	why[0] = '\0';
	/* The old group's communicators, if any, go now, and its id. */
	cuda_disconnect(b);
	int rc = share_uid(g, uid, why, n);
	if (rc != GS_OK)
		return rc;
	memcpy(cb->uid, uid, sizeof(cb->uid));
	cb->uid_rank_base = g->rank_base;
	cb->uid_world = g->world_size;
	cb->generation = g->generation;
	cb->have_uid = true;
	cb->gloo = g->gloo;
	cb->node_rank = g->node_rank;
	gs_info("cuda: group generation %llu: global ranks %u to %u of %u, the NCCL communicators made at the first bucket",
		(unsigned long long)g->generation, g->rank_base, g->rank_base + cb->n - 1,
		g->world_size);
	return GS_OK;
}

void cuda_leave_group(struct gs_backend *b)
{
	cuda_disconnect(b);
	cuda(b)->gloo = NULL;
}

/* Several nodes: the group's communicators, once per unique id (the
 * other nodes try once too; after a failure the nodes regroup). */
static int connect_group(struct cuda_backend *cb)
{
	char why[sizeof(cb->base.error)];
	cb->have_uid = false;
	int rc = cuda_connect(&cb->base, cb->uid, cb->uid_rank_base, cb->uid_world,
			      cb->join_timeout_ms, -1, why, sizeof(why));
	if (rc == GS_OK)
		return GS_OK;
	snprintf(cb->base.error, sizeof(cb->base.error),
		 "making the NCCL communicators of group generation %llu: %.200s",
		 (unsigned long long)cb->generation, why);
	cb->broken = true;
	snprintf(cb->broken_why, sizeof(cb->broken_why), "%.199s", cb->base.error);
	return rc;
}

int cuda_make_comms(struct cuda_backend *cb)
{
	if (cb->nodes <= 1)
		return cb->broken || !cb->connected ? cuda_connect_alone(cb) : GS_OK;
	if (!cb->connected && !cb->broken && cb->have_uid)
		return connect_group(cb);
	return GS_OK;
}

struct gs_backend *gs_backend_cuda_open(const struct gs_cuda_options *o, char *why, size_t n)
{
	return cuda_create(o, why, n);
}
