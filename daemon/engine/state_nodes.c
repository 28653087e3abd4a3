/*
 * The state broadcast between nodes, on the worker thread. Every node of
 * the job runs it once its own trainers have all asked; its steps are
 * collectives of the group (the engine's vote, the backend's
 * broadcast_bytes), in the same order on every node:
 *
 *   1. which node holds the source: each votes in its own slot;
 *   2. that node broadcasts a header (its state layout's hash, the
 *      request's hash, its layout's size) and then its layout;
 *   3. each node compares its own with it and votes whether it differs;
 *      the lowest that differs broadcasts its reason, so that every node
 *      fails alike, naming that node and the first tensor that differs;
 *   4. the tensors asked, end to end, in chunks of STATE_CHUNK bytes, go
 *      from the source's memory into local rank 0's on every other node:
 *      straight where a chunk lies in one tensor, through a staging
 *      buffer of one chunk where it spans several (send_tensors), never
 *      more memory whatever the state's size; each node then copies each
 *      tensor, once whole, into its other local trainers;
 *   5. a last vote: whether every node's local copies worked.
 *
 * The vote in 1 waits for the slowest node's trainers (--step-timeout
 * plus --peer-timeout); every later collective at most --peer-timeout. A
 * failure in 4 (a node lost, the link cut) leaves each receiver with the
 * tensors before tensors_done whole, the one in progress partly the
 * source's and partly its own, and those after it its own; the group is
 * then broken and the node asks for a new one (state_broadcast.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/state_run.h"
#include "engine/trainer.h"
#include "errors.h"

#define STATE_CHUNK ((uint64_t)4 << 20) /* bytes per broadcast: a pipeline's step */
#define REASON_BYTES 384

struct header {
	uint64_t layout_hash;
	uint64_t request_hash;
	uint64_t layout_bytes;
};

/* ---- the collectives, with the run's error ------------------------------ */

static int vote(struct state_run *run, float *v, size_t n, const char *what)
{
	const struct gs_group_port *g = &run->job->env.group;
	char err[256];
	int rc = g->vote(g->ctx, v, n, err, sizeof(err));
	if (rc != GS_OK) {
		snprintf(run->error, sizeof(run->error), "state broadcast between nodes: %s: %s",
			 what, err);
		run->group_failed = true;
	}
	return rc;
}

static int bcast(struct state_run *run, void *buf, uint64_t n, uint32_t root, const char *what)
{
	struct gs_backend *b = run->job->env.backend;
	int rc = b->ops->broadcast_bytes(b, buf, n, root);
	if (rc != GS_OK) {
		snprintf(run->error, sizeof(run->error),
			 "state broadcast between nodes from node %u: %.160s: %.250s", root, what, b->error);
		run->group_failed = true;
	}
	return rc;
}

/* ---- a reason every node gives ------------------------------------------ */

/* Node `from` says why the broadcast fails (code and words, its own in
 * mine); every node takes its words into run->error. Returns its code. */
static int take_reason(struct state_run *run, uint32_t from, int code, const char *mine)
{
	char reason[REASON_BYTES] = "";
	memcpy(reason, &code, sizeof(code));
	snprintf(reason + sizeof(code), sizeof(reason) - sizeof(code), "%s", mine);
	int rc = bcast(run, reason, sizeof(reason), from, "the reason the broadcast fails");
	if (rc != GS_OK)
		return rc;
	reason[sizeof(reason) - 1] = '\0';
	memcpy(&rc, reason, sizeof(rc));
	snprintf(run->error, sizeof(run->error), "%s", reason + sizeof(code));
	return rc < 0 ? rc : GS_EABORTED;
}

/* ---- 1: the source's node ----------------------------------------------- */

/* Each node votes in its slots whether it holds the source and whether it
 * gives up (its own trainers failed the broadcast before it began:
 * run->aborting, with run->status and run->error). */
static int find_root(struct state_run *run, uint32_t *root)
{
	uint32_t nodes = run->world.nodes, me = run->world.node_rank;
	float *v = calloc(2 * (size_t)nodes, sizeof(*v));
	if (!v)
		return GS_ENOMEM;
	v[2 * me] = run->has_source ? 1.0f : 0.0f;
	v[2 * me + 1] = run->aborting ? 1.0f : 0.0f;
	char mine[REASON_BYTES];
	snprintf(mine, sizeof(mine), "%.380s", run->error);
	int rc = vote(run, v, 2 * (size_t)nodes, "finding the source's node");
	uint32_t found = 0, aborts = nodes;
	for (uint32_t r = 0; rc == GS_OK && r < nodes; r++) {
		if (v[2 * r] != 0.0f)
			*root = r, found++;
		if (v[2 * r + 1] != 0.0f && aborts == nodes)
			aborts = r;
	}
	free(v);
	if (rc != GS_OK)
		return rc;
	if (aborts < nodes)
		return take_reason(run, aborts, run->status, mine);
	if (found == 1)
		return GS_OK;
	snprintf(run->error, sizeof(run->error),
		 found ? "the nodes asked for state broadcasts from different sources"
		       : "source %" PRIu64 " is no trainer of job '%s' on any node",
		 run->source_rank, run->job->id);
	return GS_EINVAL;
}

/* ---- 2 and 3: the layout and the request -------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t request_hash(const struct state_run *run)
{
	uint64_t h = fnv1a(0xcbf29ce484222325ull, &run->source_rank, sizeof(run->source_rank));
	return fnv1a(h, run->tensors, run->ntensors * sizeof(*run->tensors));
}

/* A layout as bytes: per tensor its count (8 bytes, little-endian) and its
 * name with its NUL. */
static uint64_t layout_size(const struct gs_layout *l)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < l->n; i++)
		n += 8 + strlen(l->names[i]) + 1;
	return n;
}

static void layout_write(const struct gs_layout *l, unsigned char *p)
{
	for (uint32_t i = 0; i < l->n; i++) {
		for (int b = 0; b < 8; b++)
			*p++ = (unsigned char)(l->counts[i] >> (8 * b));
		size_t len = strlen(l->names[i]) + 1;
		memcpy(p, l->names[i], len);
		p += len;
	}
}

/* Returns 0, or -1 when the bytes are no layout (or memory ran out). */
static int layout_read(struct gs_layout *l, const unsigned char *p, uint64_t n)
{
	const unsigned char *end = p + n;
	while (p < end) {
		uint64_t count = 0;
		if (end - p < 9)
			return -1;
		for (int b = 0; b < 8; b++)
			count |= (uint64_t)p[b] << (8 * b);
		p += 8;
		const unsigned char *nul = memchr(p, 0, (size_t)(end - p));
		if (!nul || gs_layout_add(l, (const char *)p, count) < 0)
			return -1;
		p = nul + 1;
	}
	return 0;
}

/* This node's verdict on the source's layout and request: GS_OK, or a
 * GS_E* code with the reason in why. */
static int judge(struct state_run *run, uint32_t root, const struct header *h,
		 const unsigned char *blob, char *why, size_t n)
{
	const struct gs_layout *mine = &run->job->state.layout;
	uint32_t node = run->world.node_rank;
	if (h->layout_hash != gs_layout_hash(mine)) {
		struct gs_layout src = { 0 };
		char me[48], owner[64], diff[300];
		snprintf(me, sizeof(me), "node %u", node);
		snprintf(owner, sizeof(owner), "the source's node %u", root);
		if (layout_read(&src, blob, h->layout_bytes) < 0)
			snprintf(diff, sizeof(diff), "node %u cannot read the source's layout", node);
		else if (!gs_layout_compare(mine, me, &src, owner, diff, sizeof(diff)))
			snprintf(diff, sizeof(diff), "the hashes differ");
		gs_layout_free(&src);
		snprintf(why, n, "state layout of node %u differs from the source's: %s", node, diff);
		return GS_ELAYOUT;
	}
	if (h->request_hash != request_hash(run)) {
		snprintf(why, n, "node %u asked for other state tensors than the source's node %u",
			 node, root);
		return GS_EINVAL;
	}
	return GS_OK;
}

/* Every node ends with the same verdict: the lowest node that differs
 * says why to all. */
static int agree(struct state_run *run, uint32_t root, const struct header *h,
		 const unsigned char *blob)
{
	uint32_t nodes = run->world.nodes;
	char why[REASON_BYTES] = "";
	int mine = judge(run, root, h, blob, why, sizeof(why));
	float *v = calloc(nodes, sizeof(*v));
	if (!v)
		return GS_ENOMEM;
	v[run->world.node_rank] = mine != GS_OK ? 1.0f : 0.0f;
	int rc = vote(run, v, nodes, "agreeing on the state layout");
	uint32_t first = nodes;
	for (uint32_t r = 0; rc == GS_OK && r < nodes && first == nodes; r++)
		if (v[r] != 0.0f)
			first = r;
	free(v);
	if (rc != GS_OK || first == nodes)
		return rc;
	return take_reason(run, first, mine, why);
}

static int check_layout(struct state_run *run, uint32_t root)
{
	bool is_root = run->world.node_rank == root;
	const struct gs_layout *mine = &run->job->state.layout;
	struct header h = { 0 };
	if (is_root)
		h = (struct header){ gs_layout_hash(mine), request_hash(run), layout_size(mine) };
	int rc = bcast(run, &h, sizeof(h), root, "the state layout's header");
	if (rc != GS_OK)
		return rc;
	/* The root's own layout: as long as it is, whatever this node's. */
	unsigned char *blob = malloc(h.layout_bytes ? h.layout_bytes : 1);
	if (!blob) {
		snprintf(run->error, sizeof(run->error), "out of memory for the source's state layout (%" PRIu64 " bytes)",
			 h.layout_bytes);
		return GS_ENOMEM;
	}
	if (is_root)
		layout_write(mine, blob);
	rc = bcast(run, blob, h.layout_bytes, root, "the state layout");
	if (rc == GS_OK)
		rc = agree(run, root, &h, blob);
	free(blob);
	return rc;
}

/* ---- 4: the bytes --------------------------------------------------------- */

/* The tensors asked, end to end, as one stream of bytes cut into chunks
 * of STATE_CHUNK: the cut depends on the layout alone, the same on every
 * node. A chunk inside one tensor goes straight from and into the
 * trainers' memory; one that spans tensors (small ones, as most of a
 * model's are) is gathered into a staging buffer of STATE_CHUNK bytes on
 * the source's node and scattered from it on the others, so that a
 * model of many small tensors costs one broadcast per chunk, not one per
 * tensor. */
struct stream {
	struct state_run *run;
	uint32_t holder;   /* the local rank whose memory is sent or filled */
	size_t k;          /* the first tensor not yet whole */
	uint64_t k_start;  /* its first byte's place in the stream */
	unsigned char *staging;
};

static uint64_t size_of(const struct stream *st, size_t k)
{
	return st->run->job->state.layout.counts[st->run->tensors[k]];
}

static char *data_of(const struct stream *st, size_t k)
{
	return st->run->trainers[st->holder]->state.data[st->run->tensors[k]];
}

/* Copies [pos, pos + len) of the stream between the tensors and buf:
 * into buf (gather) or out of it. */
static void move_pieces(const struct stream *st, uint64_t pos, uint64_t len, bool gather)
{
	uint64_t start = st->k_start;
	for (size_t j = st->k; j < st->run->ntensors && start < pos + len; j++) {
		uint64_t end = start + size_of(st, j);
		uint64_t a = pos > start ? pos : start, b = end < pos + len ? end : pos + len;
		if (a < b) {
			char *t = data_of(st, j) + (a - start);
			unsigned char *c = st->staging + (a - pos);
			memcpy(gather ? (void *)c : (void *)t, gather ? (void *)t : (void *)c, b - a);
		}
		start = end;
	}
}

static int send_chunk(struct stream *st, uint32_t root, uint64_t pos, uint64_t len)
{
	struct state_run *run = st->run;
	const struct gs_layout *l = &run->job->state.layout;
	uint32_t i = run->tensors[st->k];
	char what[200];
	snprintf(what, sizeof(what), "state bytes %" PRIu64 " to %" PRIu64 " of %" PRIu64 " (from tensor %u, '%.60s')",
		 pos, pos + len, run->bytes, i, l->names[i]);
	if (pos + len <= st->k_start + size_of(st, st->k))
		return bcast(run, data_of(st, st->k) + (pos - st->k_start), len, root, what);
	bool is_root = run->world.node_rank == root;
	if (is_root)
		move_pieces(st, pos, len, true);
	int rc = bcast(run, st->staging, len, root, what);
	if (rc == GS_OK && !is_root)
		move_pieces(st, pos, len, false);
	return rc;
}

/* A local copy's failure does not stop this node's part in the
 * broadcasts (the others would wait for it): it copies nothing more, and
 * says so in the last vote. */
static int send_tensors(struct state_run *run, uint32_t root, unsigned char *staging, int *local)
{
	struct stream st = { run, run->world.node_rank == root ? run->source : 0, 0, 0, staging };
	int rc = GS_OK;
	for (uint64_t pos = 0; pos < run->bytes && rc == GS_OK;) {
		uint64_t len = run->bytes - pos < STATE_CHUNK ? run->bytes - pos : STATE_CHUNK;
		rc = send_chunk(&st, root, pos, len);
		pos += len;
		/* The tensors now whole go to this node's other trainers. */
		while (rc == GS_OK && st.k < run->ntensors && st.k_start + size_of(&st, st.k) <= pos) {
			if (*local == GS_OK)
				*local = gs_state_copy_local(run, run->tensors[st.k], st.holder);
			if (*local == GS_OK)
				run->done++;
			st.k_start += size_of(&st, st.k);
			st.k++;
		}
	}
	return rc;
}

/* ---- 5: every node's local copies ----------------------------------------- */

static int confirm(struct state_run *run, int local)
{
	uint32_t nodes = run->world.nodes;
	float *v = calloc(nodes, sizeof(*v));
	if (!v)
		return GS_ENOMEM;
	v[run->world.node_rank] = local != GS_OK ? 1.0f : 0.0f;
	int rc = vote(run, v, nodes, "confirming every node's copies");
	for (uint32_t r = 0; rc == GS_OK && r < nodes; r++)
		if (v[r] != 0.0f && r != run->world.node_rank) {
			snprintf(run->error, sizeof(run->error),
				 "state broadcast: node %u failed to copy the state into its trainers", r);
			rc = GS_EABORTED;
		}
	free(v);
	return rc;
}

void gs_state_nodes_run(struct state_run *run)
{
	uint32_t root = 0;
	int local = GS_OK;
	/* Made before the first collective, so that a node without it gives
	 * up there, and says why, rather than in the middle. */
	unsigned char *staging = malloc(STATE_CHUNK);
	if (!staging) {
		run->aborting = true;
		run->status = GS_ENOMEM;
		snprintf(run->error, sizeof(run->error), "node %u: out of memory for the state's staging buffer (%" PRIu64 " bytes)",
			 run->world.node_rank, STATE_CHUNK);
	}
	int rc = find_root(run, &root);
	if (rc == GS_OK)
		rc = check_layout(run, root);
	if (rc == GS_OK)
		rc = send_tensors(run, root, staging, &local);
	/* After the group failed no collective can follow. */
	if (rc == GS_OK) {
		char mine[sizeof(run->error)];
		memcpy(mine, run->error, sizeof(mine));
		rc = confirm(run, local);
		if (local != GS_OK) {
			memcpy(run->error, mine, sizeof(mine));
			rc = local;
		}
	}
	free(staging);
	run->status = rc;
}

void gs_state_nodes_abort(struct state_run *run)
{
	uint32_t root;
	find_root(run, &root);
}
