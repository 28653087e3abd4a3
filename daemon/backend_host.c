/*
 * The host backend: gradients in sealed memfd shared memory, one fusion
 * buffer per local trainer, packed and unpacked by the CPU's conversion
 * kernels, and summed across the node's trainers on the worker thread.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gradsync.h"
#include "shm.h"
#ifdef GS_HAVE_GLOO
#include "gloo_comm.h"
#endif

struct host_backend {
	struct gs_backend base;
	void **fusion; /* one per local rank, fusion_elements wire elements */
	struct gs_gloo *gloo; /* NULL on a single node */
	int gloo_timeout_ms;
};

static struct host_backend *host(struct gs_backend *b)
{
	return (struct host_backend *)b;
}

static int host_import(struct gs_backend *b, int fd, uint64_t size, void **addr,
		       char *err, size_t errlen)
{
	return gs_shm_map(fd, size, addr, err, errlen);
}

static void host_release(struct gs_backend *b, void *addr, uint64_t size)
{
	gs_shm_unmap(addr, size);
}

static uint64_t host_pack(struct gs_backend *b, unsigned rank,
			  float *const *tensors, const struct gs_span *spans,
			  size_t nspans, const struct gs_pack_params *p)
{
	size_t esize = gs_wire_size(b->wire);
	char *dst = host(b)->fusion[rank];
	uint64_t clipped = 0;
	for (size_t i = 0; i < nspans; i++) {
		const float *src = tensors[spans[i].tensor] + spans[i].offset;
		clipped += gs_pack(b->wire, dst, src, spans[i].count, p);
		dst += spans[i].count * esize;
	}
	return clipped;
}

/* Hierarchical: the node's trainers are summed into rank 0's buffer (one
 * rounding), then that buffer is all-reduced across nodes in the wire
 * dtype (one rounding per hop). */
static int host_allreduce(struct gs_backend *b, size_t n)
{
	struct host_backend *h = host(b);
	gs_reduce_sum(b->wire, h->fusion[0], (const void *const *)h->fusion,
		      b->local_size, n);
#ifdef GS_HAVE_GLOO
	if (h->gloo) {
		int rc = gs_gloo_allreduce(h->gloo, b->wire, h->fusion[0], n,
					   h->gloo_timeout_ms, b->error, sizeof(b->error));
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

void gs_backend_host_attach_gloo(struct gs_backend *b, struct gs_gloo *g, int timeout_ms)
{
	host(b)->gloo = g;
	host(b)->gloo_timeout_ms = timeout_ms;
}

uint64_t gs_backend_internode_bytes(const struct gs_backend *b)
{
	return atomic_load(&((struct gs_backend *)b)->internode_bytes);
}

static uint64_t host_unpack(struct gs_backend *b, float *const *const *tensors,
			    const struct gs_span *spans, size_t nspans,
			    float postscale)
{
	size_t esize = gs_wire_size(b->wire);
	const char *src = host(b)->fusion[0];
	float *dsts[64];
	uint64_t nonfinite = 0;
	for (size_t i = 0; i < nspans; i++) {
		for (unsigned r = 0; r < b->local_size; r++)
			dsts[r] = tensors[r][spans[i].tensor] + spans[i].offset;
		nonfinite += gs_unpack(b->wire, dsts, b->local_size, src,
				       spans[i].count, postscale);
		src += spans[i].count * esize;
	}
	return nonfinite;
}

static void host_destroy(struct gs_backend *b)
{
	struct host_backend *h = host(b);
	for (unsigned r = 0; h->fusion && r < b->local_size; r++)
		free(h->fusion[r]);
	free(h->fusion);
	free(h);
}

static const struct gs_backend_ops host_ops = {
	.import_buffer = host_import,
	.release_buffer = host_release,
	.pack = host_pack,
	.allreduce = host_allreduce,
	.unpack = host_unpack,
	.destroy = host_destroy,
};

struct gs_backend *gs_backend_host_create(unsigned local_size, enum gs_wire wire,
					  uint64_t fusion_elements)
{
	if (local_size == 0 || local_size > 64)
		return NULL;
	struct host_backend *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->base.name = "host";
	h->base.ops = &host_ops;
	h->base.local_size = local_size;
	h->base.wire = wire;
	h->base.fusion_elements = fusion_elements;
	h->fusion = calloc(local_size, sizeof(*h->fusion));
	if (!h->fusion)
		goto err;
	/* Sized for the widest wire dtype, rounded to whole cache lines. */
	size_t bytes = (fusion_elements * sizeof(float) + 63) & ~(size_t)63;
	for (unsigned r = 0; r < local_size; r++) {
		h->fusion[r] = aligned_alloc(64, bytes);
		if (!h->fusion[r])
			goto err;
		memset(h->fusion[r], 0, bytes);
	}
	return &h->base;
err:
	host_destroy(&h->base);
	return NULL;
}
