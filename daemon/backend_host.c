/*
 * The host backend: gradients in sealed memfd shared memory, reduced by the
 * CPU's conversion kernels a bucket at a time on the worker thread. Each
 * chunk of a bucket (at most one fusion buffer) goes in three phases:
 *
 *   pack+sum: every local trainer's fp32 spans clipped, scaled, rounded to
 *     the wire dtype and summed (fp32, one rounding) into the one fusion
 *     buffer, in a single pass over the trainers' memory (gs_pack_sum);
 *   all-reduce: that buffer across nodes with Gloo, when there are several;
 *   unpack: widened, scaled and written into every trainer's spans.
 *
 * The pack+sum and unpack phases of a large chunk are split by element
 * range over up to one thread per local trainer (the worker thread and
 * helpers of this backend), since on a node of M trainers the reduce does
 * M times the memory traffic of one, and the trainers' own cores wait for
 * it. Every element is computed by the same kernels whichever thread does
 * it, so the result does not depend on the split.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "gradsync.h"
#include "shm.h"
#ifdef GS_HAVE_GLOO
#include "gloo_comm.h"
#endif

/* Threads of one backend, the worker thread being part 0. */
#define HOST_MAX_PARTS 8
/* Below this many elements per part a split costs more than it saves. */
#define HOST_MIN_PART_ELEMENTS 65536

struct host_part {
	struct gs_span *spans; /* room for the largest bucket's members */
	uint64_t clipped[GS_PACK_SUM_MAX_SOURCES];
	uint64_t nonfinite;
};

/* The chunk the parts work on, set by the worker thread before it wakes
 * the helpers. */
struct host_chunk {
	const struct gs_bucket_io *io;
	uint64_t start, len; /* elements of the bucket */
	unsigned parts;
	bool unpack;         /* the phase: pack+sum, or unpack */
};

struct host_backend {
	struct gs_backend base;
	void *fusion; /* fusion_elements elements of the widest wire dtype */
	struct gs_gloo *gloo; /* NULL on a single node */
	int gloo_timeout_ms;

	struct host_part part[HOST_MAX_PARTS];
	size_t span_room; /* spans each part has room for */
	struct host_chunk chunk;

	/* Helpers: threads 1 .. nthreads - 1 run parts 1 .. parts - 1. */
	unsigned nthreads;
	pthread_t helper[HOST_MAX_PARTS];
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	uint64_t round;   /* bumped for every phase the helpers join */
	unsigned pending; /* helpers still in this round */
	bool stopping;
};

static struct host_backend *host(struct gs_backend *b)
{
	return (struct host_backend *)b;
}

static int host_import(struct gs_backend *b, const struct gs_buffer_desc *desc,
		       void **addr, char *err, size_t errlen)
{
	if (desc->kind != GS_BUFFER_MEMFD) {
		snprintf(err, errlen, "it is CUDA device memory, but this gradsyncd runs the host backend, which reduces shared memory (see --backend)");
		return GS_EBUFFER;
	}
	return gs_shm_map(desc->fd, desc->size, addr, err, errlen);
}

static void host_release(struct gs_backend *b, void *addr, uint64_t size)
{
	gs_shm_unmap(addr, size);
}

/* ---- One part of a chunk ---------------------------------------------- */

/* Elements [from, from + n) of the chunk, as spans of the bucket. */
static void part_range(const struct host_chunk *c, unsigned p, uint64_t *from, uint64_t *n)
{
	uint64_t a = c->len * p / c->parts, b = c->len * (p + 1) / c->parts;
	*from = a;
	*n = b - a;
}

static void part_pack(struct host_backend *h, struct host_part *part, const struct gs_span *sp,
		      size_t nspans, char *dst)
{
	const struct gs_bucket_io *io = h->chunk.io;
	size_t esize = gs_wire_size(h->base.wire);
	const float *srcs[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < io->nranks; r++)
			srcs[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		gs_pack_sum(h->base.wire, dst, srcs, io->nranks, sp[i].count, io->pack,
			    part->clipped);
		dst += sp[i].count * esize;
	}
}

static void part_unpack(struct host_backend *h, struct host_part *part, const struct gs_span *sp,
			size_t nspans, const char *src)
{
	const struct gs_bucket_io *io = h->chunk.io;
	size_t esize = gs_wire_size(h->base.wire);
	float *dsts[GS_PACK_SUM_MAX_SOURCES];
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < io->nranks; r++)
			dsts[r] = io->tensors[r][sp[i].tensor] + sp[i].offset;
		part->nonfinite += gs_unpack(h->base.wire, dsts, io->nranks, src, sp[i].count,
					     io->postscale);
		src += sp[i].count * esize;
	}
}

static void run_part(struct host_backend *h, unsigned p)
{
	const struct host_chunk *c = &h->chunk;
	const struct gs_bucket_io *io = c->io;
	struct host_part *part = &h->part[p];
	uint64_t from, n;
	part_range(c, p, &from, &n);
	size_t nspans = gs_plan_chunk_spans(io->plan, io->counts, io->bucket, c->start + from, n,
					    part->spans, h->span_room);
	char *at = (char *)h->fusion + from * gs_wire_size(h->base.wire);
	if (c->unpack)
		part_unpack(h, part, part->spans, nspans, at);
	else
		part_pack(h, part, part->spans, nspans, at);
}

/* ---- Helper threads ----------------------------------------------------- */

static void *helper_main(void *arg)
{
	struct host_backend *h = arg;
	pthread_mutex_lock(&h->lock);
	unsigned me = h->pending++; /* 0-based among helpers, in start order */
	uint64_t seen = h->round;
	pthread_cond_signal(&h->done);
	for (;;) {
		while (h->round == seen && !h->stopping)
			pthread_cond_wait(&h->go, &h->lock);
		if (h->stopping)
			break;
		seen = h->round;
		unsigned p = me + 1;
		bool mine = p < h->chunk.parts;
		pthread_mutex_unlock(&h->lock);
		if (mine)
			run_part(h, p);
		pthread_mutex_lock(&h->lock);
		if (--h->pending == 0)
			pthread_cond_signal(&h->done);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Runs the current phase of h->chunk on all its parts and returns when
 * every part is done. */
static void run_phase(struct host_backend *h)
{
	if (h->chunk.parts == 1) {
		run_part(h, 0);
		return;
	}
	pthread_mutex_lock(&h->lock);
	h->round++;
	h->pending = h->nthreads - 1;
	pthread_cond_broadcast(&h->go);
	pthread_mutex_unlock(&h->lock);
	run_part(h, 0);
	pthread_mutex_lock(&h->lock);
	while (h->pending > 0)
		pthread_cond_wait(&h->done, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

static void stop_helpers(struct host_backend *h)
{
	pthread_mutex_lock(&h->lock);
	h->stopping = true;
	pthread_cond_broadcast(&h->go);
	pthread_mutex_unlock(&h->lock);
	for (unsigned t = 1; t < h->nthreads; t++)
		pthread_join(h->helper[t], NULL);
	h->nthreads = 1;
}

/* Starts want - 1 helpers (fewer if thread creation fails: the parts then
 * just run on fewer threads) and waits until each is ready. */
static void start_helpers(struct host_backend *h, unsigned want)
{
	h->nthreads = 1;
	pthread_mutex_lock(&h->lock);
	h->pending = 0;
	pthread_mutex_unlock(&h->lock);
	for (unsigned t = 1; t < want; t++) {
		if (pthread_create(&h->helper[t], NULL, helper_main, h) != 0)
			break;
		h->nthreads++;
	}
	pthread_mutex_lock(&h->lock);
	while (h->pending < h->nthreads - 1)
		pthread_cond_wait(&h->done, &h->lock);
	h->pending = 0;
	pthread_mutex_unlock(&h->lock);
}

/* ---- A bucket ----------------------------------------------------------- */

static int all_nodes(struct host_backend *h, size_t n)
{
#ifdef GS_HAVE_GLOO
	struct gs_backend *b = &h->base;
	if (h->gloo) {
		int rc = gs_gloo_allreduce(h->gloo, b->wire, h->fusion, n, h->gloo_timeout_ms,
					   b->error, sizeof(b->error));
		if (rc != GS_OK)
			return rc;
		/* A ring all-reduce sends 2 (N - 1) / N of the buffer. */
		uint64_t nodes = (uint64_t)gs_gloo_size(h->gloo);
		atomic_fetch_add(&b->internode_bytes,
				 2 * (nodes - 1) * n * gs_wire_size(b->wire) / nodes);
	}
#endif
	return GS_OK;
}

static int ensure_span_room(struct host_backend *h, size_t members)
{
	if (members <= h->span_room)
		return GS_OK;
	for (unsigned p = 0; p < HOST_MAX_PARTS; p++) {
		struct gs_span *s = realloc(h->part[p].spans, members * sizeof(*s));
		if (!s)
			return GS_ENOMEM;
		h->part[p].spans = s;
	}
	h->span_room = members;
	return GS_OK;
}

/* Chunk by chunk: a failed all-reduce stops the bucket, so earlier chunks
 * hold the reduced result and later ones the trainers' own gradients. */
static int host_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct host_backend *h = host(b);
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	if (io->nranks == 0 || io->nranks > GS_PACK_SUM_MAX_SOURCES) {
		snprintf(b->error, sizeof(b->error), "%u local ranks", io->nranks);
		return GS_EINVAL;
	}
	if (ensure_span_room(h, bk->count) != GS_OK) {
		snprintf(b->error, sizeof(b->error), "out of memory for bucket %u", io->bucket);
		return GS_ENOMEM;
	}
	for (unsigned p = 0; p < h->nthreads; p++)
		memset(h->part[p].clipped, 0, io->nranks * sizeof(uint64_t));
	int rc = GS_OK;
	for (uint64_t start = 0; start < bk->elements && rc == GS_OK;
	     start += b->fusion_elements) {
		uint64_t len = bk->elements - start;
		if (len > b->fusion_elements)
			len = b->fusion_elements;
		uint64_t parts = len / HOST_MIN_PART_ELEMENTS;
		h->chunk = (struct host_chunk){ io, start, len, 1, false };
		if (parts > 1)
			h->chunk.parts = parts < h->nthreads ? (unsigned)parts : h->nthreads;
		for (unsigned p = 0; p < h->chunk.parts; p++)
			h->part[p].nonfinite = 0;
		gs_io_mark(io, GS_MARK_PACK, start, len);
		run_phase(h);
		gs_io_mark(io, GS_MARK_ALLREDUCE, start, len);
		rc = all_nodes(h, len);
		if (rc != GS_OK)
			break;
		gs_io_mark(io, GS_MARK_UNPACK, start, len);
		h->chunk.unpack = true;
		run_phase(h);
		for (unsigned p = 0; p < h->chunk.parts; p++)
			*io->nonfinite += h->part[p].nonfinite;
		gs_io_mark(io, GS_MARK_DONE, start, len);
	}
	for (unsigned p = 0; p < h->nthreads; p++)
		for (unsigned r = 0; r < io->nranks; r++)
			io->clipped[r] += h->part[p].clipped[r];
	return rc;
}

void gs_backend_host_attach_gloo(struct gs_backend *b, struct gs_gloo *g, int timeout_ms)
{
	/* The CUDA backend reduces across nodes with NCCL; there the Gloo
	 * group only carries the nodes' votes. */
	if (strcmp(b->name, "host") != 0)
		return;
	host(b)->gloo = g;
	host(b)->gloo_timeout_ms = timeout_ms;
}

uint64_t gs_backend_internode_bytes(const struct gs_backend *b)
{
	return atomic_load(&((struct gs_backend *)b)->internode_bytes);
}

static void host_destroy(struct gs_backend *b)
{
	struct host_backend *h = host(b);
	stop_helpers(h);
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->go);
	pthread_cond_destroy(&h->done);
	for (unsigned p = 0; p < HOST_MAX_PARTS; p++)
		free(h->part[p].spans);
	free(h->fusion);
	free(h);
}

static const struct gs_backend_ops host_ops = {
	.import_buffer = host_import,
	.release_buffer = host_release,
	.reduce_bucket = host_reduce_bucket,
	.destroy = host_destroy,
};

/* One thread per local trainer, as many as the CPUs allow, at most
 * HOST_MAX_PARTS. */
static unsigned thread_count(unsigned local_size)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = local_size;
	if (cpus > 0 && (unsigned long)cpus < n)
		n = (unsigned)cpus;
	return n < 1 ? 1 : n > HOST_MAX_PARTS ? HOST_MAX_PARTS : n;
}

struct gs_backend *gs_backend_host_create(unsigned local_size, enum gs_wire wire,
					  uint64_t fusion_elements)
{
	if (local_size == 0 || local_size > GS_PACK_SUM_MAX_SOURCES)
		return NULL;
	struct host_backend *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->base.name = "host";
	h->base.ops = &host_ops;
	h->base.local_size = local_size;
	h->base.wire = wire;
	h->base.fusion_elements = fusion_elements;
	h->nthreads = 1;
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->go, NULL);
	pthread_cond_init(&h->done, NULL);
	/* Sized for the widest wire dtype, rounded to whole cache lines. */
	size_t bytes = (fusion_elements * sizeof(float) + 63) & ~(size_t)63;
	h->fusion = aligned_alloc(64, bytes);
	if (!h->fusion)
		goto err;
	memset(h->fusion, 0, bytes);
	start_helpers(h, thread_count(local_size));
	return &h->base;
err:
	host_destroy(&h->base);
	return NULL;
}
