/*
 * The conversion kernels on one fusion buffer against memcpy of the same
 * fp32 bytes: pack (fp32 to fp16 with clipping and the prescale), unpack
 * (fp16 to fp32 with the postscale, one destination; and the same while
 * summing the squares for the gradient norm, gs_unpack_norm, to show what
 * the norm costs), and, for the record,
 * what a node of M trainers does per chunk: pack each trainer into its own
 * buffer and reduce them (the way before gs_pack_sum), or both fused in
 * one pass (gs_pack_sum), and unpack to M destinations. The kernels take
 * turns in every repetition so that noise from the machine hits them
 * alike; the ratio is of median times, against M memcpys where a kernel
 * reads or writes M fp32 buffers.
 */
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "suite.h"

enum {
	K_MEMCPY,
	K_PACK,
	K_UNPACK,
	K_UNPACK_NORM,
	K_PACK_REDUCE,
	K_PACK_SUM,
	K_UNPACK_M,
	K_UNPACK_M_NORM,
	NKERNELS
};

struct buffers {
	size_t n;
	unsigned nsrc;		  /* trainers of a node */
	float *src[64], *dst[64]; /* fp32, one per trainer */
	float *copy;		  /* memcpy's own destination */
	void *wire[64];		  /* fp16 */
	double *blocks;		  /* gs_unpack_norm's sums */
};

static void *alloc(size_t bytes)
{
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (p)
		memset(p, 0, bytes); /* fault the pages in before timing */
	return p;
}

static int buffers_init(struct buffers *b, size_t n, unsigned nsrc)
{
	memset(b, 0, sizeof(*b));
	b->n = n;
	b->nsrc = nsrc;
	int ok = (b->copy = alloc(n * sizeof(float))) != NULL;
	ok &= (b->blocks = alloc((n / GS_NORM_BLOCK + 1) * sizeof(double))) != NULL;
	for (unsigned k = 0; k < nsrc; k++) {
		ok &= (b->src[k] = alloc(n * sizeof(float))) != NULL;
		ok &= (b->dst[k] = alloc(n * sizeof(float))) != NULL;
		ok &= (b->wire[k] = alloc(n * 2)) != NULL;
	}
	if (!ok)
		return -1;
	/* Gradient-like values, a few of them beyond the clip value. */
	uint64_t r = 0x9e3779b97f4a7c15ull;
	for (unsigned k = 0; k < nsrc; k++) {
		for (size_t i = 0; i < n; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			b->src[k][i] = (float)((int32_t)(r >> 40) - (1 << 23)) * 0x1p-22f;
		}
		gs_f32_to_f16(b->wire[k], b->src[k], n);
	}
	return 0;
}

static void buffers_free(struct buffers *b)
{
	free(b->copy);
	free(b->blocks);
	for (unsigned k = 0; k < b->nsrc; k++) {
		free(b->src[k]);
		free(b->dst[k]);
		free(b->wire[k]);
	}
}

static const struct gs_pack_params clip = {.prescale = 0.5f, .clip = true, .clip_value = 1.5f};

/* How many fp32 buffers of n elements kernel k reads or writes. */
static unsigned buffers_of(int k, const struct buffers *b)
{
	return k == K_PACK_REDUCE || k == K_PACK_SUM || k == K_UNPACK_M || k == K_UNPACK_M_NORM
		       ? b->nsrc
		       : 1;
}

static double run_one(int k, struct buffers *b)
{
	struct gs_pack_params p[64];
	for (unsigned i = 0; i < b->nsrc; i++)
		p[i] = clip;
	double t0 = gs_now_ms();
	switch (k) {
	case K_MEMCPY:
		memcpy(b->copy, b->src[0], b->n * sizeof(float));
		break;
	case K_PACK:
		gs_pack(GS_WIRE_F16, b->wire[0], b->src[0], b->n, &clip);
		break;
	case K_UNPACK:
		gs_unpack(GS_WIRE_F16, b->dst, 1, b->wire[0], b->n, 0.5f);
		break;
	case K_UNPACK_NORM:
		gs_unpack_norm(GS_WIRE_F16, b->dst, 1, b->wire[0], b->n, 0.5f, 0, b->blocks);
		break;
	case K_PACK_REDUCE:
		for (unsigned i = 0; i < b->nsrc; i++)
			gs_pack(GS_WIRE_F16, b->wire[i], b->src[i], b->n, &clip);
		gs_reduce_sum(GS_WIRE_F16, b->wire[0], (const void *const *)b->wire, b->nsrc, b->n);
		break;
	case K_PACK_SUM:
		gs_pack_sum(GS_WIRE_F16, b->wire[0], (const float *const *)b->src, b->nsrc, b->n, p,
			    NULL);
		break;
	case K_UNPACK_M:
		gs_unpack(GS_WIRE_F16, b->dst, b->nsrc, b->wire[0], b->n, 0.5f);
		break;
	case K_UNPACK_M_NORM:
		gs_unpack_norm(GS_WIRE_F16, b->dst, b->nsrc, b->wire[0], b->n, 0.5f, 0, b->blocks);
		break;
	}
	return gs_now_ms() - t0;
}

int bench_kernels(const struct bench_config *c, size_t elements,
		  struct kernel_result out[KERNEL_RESULTS])
{
	unsigned nsrc = c->trainers > 1 ? c->trainers : 2;
	char names[NKERNELS][48] = {"memcpy fp32", "pack fp32->fp16 clip+scale",
				    "unpack fp16->fp32 scale", "unpack + norm"};
	snprintf(names[K_PACK_REDUCE], sizeof(names[0]), "%u x pack then reduce", nsrc);
	snprintf(names[K_PACK_SUM], sizeof(names[0]), "%u x pack+sum fused", nsrc);
	snprintf(names[K_UNPACK_M], sizeof(names[0]), "unpack to %u", nsrc);
	snprintf(names[K_UNPACK_M_NORM], sizeof(names[0]), "unpack to %u + norm", nsrc);
	struct buffers b;
	double *t = calloc((size_t)NKERNELS * c->reps, sizeof(*t));
	if (nsrc > 64 || !t || buffers_init(&b, elements, nsrc) < 0) {
		fprintf(stderr, "gradsync-bench: out of memory for the kernel buffers\n");
		free(t);
		return -1;
	}
	for (int k = 0; k < NKERNELS; k++) /* warm up */
		run_one(k, &b);
	for (unsigned r = 0; r < c->reps; r++)
		for (int k = 0; k < NKERNELS; k++)
			t[(size_t)k * c->reps + r] = run_one(k, &b);
	const char *isa = gs_isa_name(gs_isa_active());
	for (int k = 0; k < NKERNELS; k++) {
		snprintf(out[k].name, sizeof(out[k].name), "%s", names[k]);
		bench_stats(&t[(size_t)k * c->reps], c->reps, &out[k].st);
		out[k].buffers = buffers_of(k, &b);
		out[k].ratio = out[k].st.median / (out[k].buffers * out[K_MEMCPY].st.median);
		for (unsigned r = 0; r < c->reps; r++) {
			struct bench_row row = {"kernels",
						names[k],
						isa,
						0,
						0,
						-1,
						(long)r + 1,
						t[(size_t)k * c->reps + r],
						out[k].buffers * elements * sizeof(float)};
			bench_csv_row(c->csv, &row);
		}
	}
	buffers_free(&b);
	free(t);
	return NKERNELS;
}
