/*
 * Starting the CUDA backend and joining the group of nodes. Alone
 * (--nodes 1) the daemon makes its own NCCL unique id and its
 * communicators at once. With several nodes that waits for the group
 * (join_group, on a thread of the cluster's): node 0's unique id reaches
 * every node through the group's key-value store before the communicators
 * are made. The same happens again, in the store of the new group,
 * whenever the nodes regroup after one went away.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"

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
	uint8_t uid[GS_NCCL_UID_BYTES];
	why[0] = '\0';
	int rc = share_uid(g, uid, why, n);
	if (rc != GS_OK)
		return rc;
	/* Making the communicators waits for every node's: the coordinator's
	 * pings are answered meanwhile, or it would take this node for lost. */
	const struct gs_kv *kv = g->kv;
	if (kv->park)
		kv->park(kv->ctx);
	rc = cuda_connect(b, uid, g->rank_base, g->world_size, g->join_timeout_ms, g->cancel_fd,
			  why, n);
	if (kv->unpark)
		kv->unpark(kv->ctx);
	return rc;
}

struct gs_backend *gs_backend_cuda_open(const struct gs_cuda_options *o, char *why, size_t n)
{
	struct gs_backend *b = cuda_create(o, why, n);
	if (!b || o->nodes > 1)
		return b;
	uint8_t uid[GS_NCCL_UID_BYTES];
	int rc = cuda_nccl_uid(uid, why, n);
	if (rc == GS_OK)
		rc = cuda_connect(b, uid, 0, o->local_size, o->join_timeout_ms, -1, why, n);
	if (rc != GS_OK) {
		b->ops->destroy(b);
		return NULL;
	}
	return b;
}
