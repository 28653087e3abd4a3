/*
 * The NCCL communicators: one per local rank, on its GPU, made in one
 * group call and non-blocking (so a stuck collective can be aborted), from
 * a unique id node 0 makes; aborted when the group of nodes is dropped,
 * made again with the next one, and alone, made again after a failure.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"
#include "support/log.h"

int cuda_nccl_uid(uint8_t uid[GS_NCCL_UID_BYTES], char *why, size_t n)
{
	ncclUniqueId id;
	ncclResult_t res = ncclGetUniqueId(&id);
	if (res != ncclSuccess) {
		snprintf(why, n, "ncclGetUniqueId: %s", ncclGetErrorString(res));
		return GS_ESYSTEM;
	}
	memcpy(uid, id.internal, GS_NCCL_UID_BYTES);
	return GS_OK;
}

int cuda_connect(struct gs_backend *b, const uint8_t uid[GS_NCCL_UID_BYTES], uint32_t rank_base,
		 uint32_t world, int timeout_ms, int cancel_fd, char *why, size_t n)
{
	struct cuda_backend *cb = cuda(b);
	cuda_disconnect(b);
	ncclUniqueId id;
	memcpy(id.internal, uid, GS_NCCL_UID_BYTES);
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	config.blocking = 0; /* so a stuck collective can be aborted */
	int rc = GS_OK;
	unsigned failed = 0;
	ncclResult_t res = ncclSuccess;
	ncclGroupStart();
	for (unsigned r = 0; r < cb->n; r++) {
		cudaSetDevice(cb->rank[r].device);
		res = ncclCommInitRankConfig(&cb->rank[r].comm, (int)world, id,
					     (int)(rank_base + r), &config);
		if (res != ncclSuccess && res != ncclInProgress) {
			failed = r;
			break;
		}
	}
	/* The group ends before any abort: aborting inside it would make the
	 * others' creation blocking. */
	ncclResult_t end = ncclGroupEnd();
	if (res != ncclSuccess && res != ncclInProgress)
		rc = cuda_nccl_error(cb, "ncclCommInitRankConfig", failed, res);
	else if (end != ncclSuccess && end != ncclInProgress)
		rc = cuda_nccl_error(cb, "ncclGroupEnd of the communicators' creation", 0, end);
	if (rc == GS_OK)
		rc = cuda_wait_comms(cb, "creating the NCCL communicators", timeout_ms, cancel_fd);
	if (rc != GS_OK) {
		snprintf(why, n, "%s", b->error);
		cuda_abort_comms(cb, why);
		return rc;
	}
	cb->connected = true;
	cb->world = world;
	gs_info("cuda: %u NCCL communicators ready, global ranks %u to %u of %u", cb->n, rank_base,
		rank_base + cb->n - 1, world);
	return GS_OK;
}

void cuda_disconnect(struct gs_backend *b)
{
	struct cuda_backend *cb = cuda(b);
	for (unsigned r = 0; r < cb->n; r++) {
		if (cb->rank[r].comm)
			ncclCommAbort(cb->rank[r].comm);
		cb->rank[r].comm = NULL;
	}
	cb->connected = false;
	cb->broken = false;
	cb->have_uid = false; /* the group's: it is gone */
}

/* Alone (one node), the communicators are made at the first bucket, and
 * those an all-reduce failure aborted are rebuilt at the next bucket with
 * a fresh unique id, once the streams have drained the aborted work: the
 * daemon need not be restarted. */
int cuda_connect_alone(struct cuda_backend *cb)
{
	char why[sizeof(cb->base.error)];
	bool again = cb->broken;
	int rc = again ? cuda_wait_streams(cb, "draining the aborted all-reduce") : GS_OK;
	if (rc == GS_OK) {
		if (again)
			gs_warn("cuda: rebuilding the NCCL communicators aborted after: %s",
				cb->broken_why);
		uint8_t uid[GS_NCCL_UID_BYTES];
		rc = cuda_nccl_uid(uid, why, sizeof(why));
		if (rc == GS_OK)
			rc = cuda_connect(&cb->base, uid, 0, cb->n, cb->join_timeout_ms, -1, why,
					  sizeof(why));
	} else {
		snprintf(why, sizeof(why), "%s", cb->base.error);
	}
	if (rc != GS_OK && again)
		snprintf(cb->base.error, sizeof(cb->base.error),
			 "cannot rebuild the NCCL communicators aborted after: %.80s: %.110s",
			 cb->broken_why, why);
	else if (rc != GS_OK)
		snprintf(cb->base.error, sizeof(cb->base.error),
			 "cannot make the NCCL communicators: %.200s", why);
	return rc;
}
