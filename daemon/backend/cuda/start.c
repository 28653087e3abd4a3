/*
 * Starting the CUDA backend from the settings. Alone (--nodes 1) the
 * daemon makes its own NCCL unique id and its communicators at once. With
 * several nodes that waits for the join (worker thread): every node says
 * which backend it runs, a CUDA node checks that all do the same, and node
 * 0's unique id reaches every node through the rendezvous store before the
 * communicators are made. The same happens again, under the keys of the
 * new group, whenever the nodes regroup after one went away.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "errors.h"
#include "cluster/rendezvous.h"
#include "support/settings.h"

static int check_backends(struct gs_rdv_client *rdv, const char *prefix,
			  const struct gs_settings *s, int timeout_ms, char *why, size_t n)
{
	for (uint32_t r = 0; r < s->nodes; r++) {
		char key[96];
		void *value = NULL;
		size_t len = 0;
		snprintf(key, sizeof(key), "%sbackend/%u", prefix, r);
		int rc = gs_rdv_store_get(rdv, key, &value, &len, timeout_ms);
		if (rc != GS_OK) {
			snprintf(why, n, "node %u did not say which backend it runs (%s)", r,
				 gs_error_desc(rc));
			return rc;
		}
		bool same = len == 4 && !memcmp(value, "cuda", 4);
		if (!same)
			snprintf(why, n, "node %u runs the %.*s backend and node %u the cuda backend: every node of a job must run the same one (--backend)",
				 r, (int)(len < 16 ? len : 16), (const char *)value, s->node_rank);
		free(value);
		if (!same)
			return GS_EINVAL;
	}
	return GS_OK;
}

static int share_uid(struct gs_rdv_client *rdv, const char *prefix, const struct gs_settings *s,
		     int timeout_ms, uint8_t uid[GS_NCCL_UID_BYTES], char *why, size_t n)
{
	char key[96];
	snprintf(key, sizeof(key), "%snccl/uid", prefix);
	if (s->node_rank == 0) {
		int rc = gs_cuda_nccl_uid(uid, why, n);
		if (rc == GS_OK)
			rc = gs_rdv_store_set(rdv, key, uid, GS_NCCL_UID_BYTES);
		if (rc != GS_OK && !why[0])
			snprintf(why, n, "publishing the NCCL unique id: %s", gs_error_desc(rc));
		return rc;
	}
	void *value = NULL;
	size_t len = 0;
	int rc = gs_rdv_store_get(rdv, key, &value, &len, timeout_ms);
	if (rc == GS_OK && len != GS_NCCL_UID_BYTES)
		rc = GS_EPROTO;
	if (rc == GS_OK)
		memcpy(uid, value, GS_NCCL_UID_BYTES);
	else
		snprintf(why, n, "getting node 0's NCCL unique id: %s", gs_error_desc(rc));
	free(value);
	return rc;
}

int gs_cuda_join(struct gs_backend *b, struct gs_rdv_client *rdv, const char *prefix,
		 const struct gs_settings *s, const struct gs_node_info *nodes, int cancel_fd,
		 char *why, size_t n)
{
	int timeout_ms = (int)(s->join_timeout * 1000);
	char key[96];
	why[0] = '\0';
	snprintf(key, sizeof(key), "%sbackend/%u", prefix, s->node_rank);
	int rc = gs_rdv_store_set(rdv, key, b->name, strlen(b->name));
	if (rc != GS_OK) {
		snprintf(why, n, "saying which backend this node runs: %s", gs_error_desc(rc));
		return rc;
	}
	if (!gs_backend_is_cuda(b))
		return GS_OK;
	rc = check_backends(rdv, prefix, s, timeout_ms, why, n);
	uint8_t uid[GS_NCCL_UID_BYTES];
	if (rc == GS_OK)
		rc = share_uid(rdv, prefix, s, timeout_ms, uid, why, n);
	if (rc != GS_OK)
		return rc;
	uint32_t rank_base = 0, world = 0;
	for (uint32_t r = 0; r < s->nodes; r++) {
		if (r < s->node_rank)
			rank_base += nodes[r].local_size;
		world += nodes[r].local_size;
	}
	/* Making the communicators waits for every node's: the coordinator's
	 * pings are answered meanwhile, or it would take this node for lost. */
	bool parked = gs_rdv_client_park(rdv) == GS_OK;
	rc = gs_backend_cuda_connect(b, uid, rank_base, world, timeout_ms, cancel_fd, why, n);
	if (parked)
		gs_rdv_client_unpark(rdv);
	return rc;
}

struct gs_backend *gs_backend_cuda_open(const struct gs_settings *s, char *why, size_t n)
{
	struct gs_cuda_options o = {
		.local_size = s->local_size,
		.wire = (enum gs_wire)s->wire,
		.fusion_elements = s->fusion_elements,
		.peer_timeout_ms = (int)(s->peer_timeout * 1000),
	};
	struct gs_backend *b = gs_backend_cuda_create(&o, why, n);
	if (!b || s->nodes > 1)
		return b;
	uint8_t uid[GS_NCCL_UID_BYTES];
	int rc = gs_cuda_nccl_uid(uid, why, n);
	if (rc == GS_OK)
		rc = gs_backend_cuda_connect(b, uid, 0, s->local_size,
					     (int)(s->join_timeout * 1000), -1, why, n);
	if (rc != GS_OK) {
		b->ops->destroy(b);
		return NULL;
	}
	return b;
}
