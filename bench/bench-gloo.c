/*
 * bench-gloo [ITERATIONS]: two processes on loopback all-reduce 8 MB and
 * 16 MB buffers through gs_gloo, in fp32 (Gloo's sum), fp16 with Gloo's own
 * float16 sum (element by element, its slow path), and fp16 and
 * bf16 with the vectorised kernels. Prints the median time and bandwidth
 * (buffer bytes / time) of each, and the ratio of ours to Gloo's fp16 sum
 * measured in the same run. Every timed all-reduce starts right after a
 * one-element all-reduce, so both ranks start it together, and on freshly
 * copied inputs, so that repeated sums never overflow.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_store.h"
#include "backend/gloo/gloo_comm.h"
#include "clock.h"
#include "errors.h"
#include "ranks.h"

#define TIMEOUT_MS 60000

struct config {
	const char *name;
	enum gs_wire wire;
	enum gs_gloo_sum sum;
};

static const struct config configs[] = {
    {"fp32, Gloo's sum", GS_WIRE_F32, GS_GLOO_SUM_GLOO},
    {"fp16, Gloo's float16 sum", GS_WIRE_F16, GS_GLOO_SUM_GLOO},
    {"fp16, gradsync kernels", GS_WIRE_F16, GS_GLOO_SUM_KERNELS},
    {"bf16, gradsync kernels", GS_WIRE_BF16, GS_GLOO_SUM_KERNELS},
};
#define NCONFIGS (sizeof(configs) / sizeof(configs[0]))

static const size_t sizes_mb[] = {8, 16};
#define NSIZES (sizeof(sizes_mb) / sizeof(sizes_mb[0]))

struct bench {
	char *dir;
	int iterations;
	float *src; /* inputs, as fp32, for the most elements (16 MB of fp16) */
	void *wire; /* the same, in the wire dtype */
	void *buf;  /* what is all-reduced */
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The median time in ms of one configuration at one size. */
static double time_config(struct bench *b, struct gs_gloo *g, const struct config *c, size_t bytes,
			  char *err, size_t errlen)
{
	size_t n = bytes / gs_wire_size(c->wire);
	gs_pack(c->wire, b->wire, b->src, n, NULL);
	double *t = calloc((size_t)b->iterations, sizeof(*t));
	float one = 0;
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (int i = -2; i < b->iterations; i++) { /* two rounds of warm-up */
		memcpy(b->buf, b->wire, bytes);
		if (gs_gloo_allreduce(g, GS_WIRE_F32, &one, 1, TIMEOUT_MS, err, errlen) < 0)
			goto fail;
		double t0 = gs_now_ms();
		if (gs_gloo_allreduce_with(g, c->wire, b->buf, n, c->sum, TIMEOUT_MS, err, errlen) <
		    0)
			goto fail;
		if (i >= 0)
			t[i] = gs_now_ms() - t0;
	}
	qsort(t, (size_t)b->iterations, sizeof(*t), cmp_double);
	double median = t[b->iterations / 2];
	free(t);
	return median;
fail:
	free(t);
	return -1;
}

static void print_row(size_t mb, const char *name, size_t bytes, double ms)
{
	printf("%5zu MB  %-26s %8.2f ms  %6.3f GB/s\n", mb, name, ms, bytes / ms / 1e6);
}

static int rank_main(int rank, int size, void *arg)
{
	struct bench *b = arg;
	struct gs_gloo_store_ops store = file_store(b->dir);
	struct gs_gloo *g;
	char err[512];
	if (gs_gloo_create(&store, rank, size, "127.0.0.1", TIMEOUT_MS, &g, err, sizeof(err)) < 0)
		goto fail;
	for (size_t s = 0; s < NSIZES; s++) {
		size_t bytes = sizes_mb[s] << 20;
		double ms[NCONFIGS];
		for (size_t c = 0; c < NCONFIGS; c++) {
			ms[c] = time_config(b, g, &configs[c], bytes, err, sizeof(err));
			if (ms[c] < 0)
				goto fail;
			if (rank == 0)
				print_row(sizes_mb[s], configs[c].name, bytes, ms[c]);
		}
		if (rank == 0)
			printf("%5zu MB  fp16 gradsync kernels vs Gloo's float16 sum: %.2fx "
			       "faster\n\n",
			       sizes_mb[s], ms[1] / ms[2]);
	}
	gs_gloo_destroy(g);
	return 0;
fail:
	fprintf(stderr, "bench-gloo rank %d: %s\n", rank, err);
	return 1;
}

/* Inputs like gradients: small, of both signs, a few orders of magnitude. */
static void fill(float *x, size_t n)
{
	uint64_t r = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < n; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		double u = (double)(r >> 11) / 9007199254740992.0;
		x[i] = (float)((u - 0.5) * pow(10.0, -3.0 * (double)((r >> 7) & 3) / 3.0));
	}
}

int main(int argc, char **argv)
{
	struct bench b = {.iterations = argc > 1 ? atoi(argv[1]) : 10};
	size_t most = sizes_mb[NSIZES - 1] << 20;
	if (b.iterations < 1) {
		fprintf(stderr, "usage: bench-gloo [ITERATIONS >= 1]\n");
		return 2;
	}
	b.dir = file_store_dir_create();
	size_t most_elements = most / 2;
	b.src = malloc(most_elements * sizeof(float));
	b.wire = malloc(most);
	b.buf = malloc(most);
	if (!b.dir || !b.src || !b.wire || !b.buf) {
		fprintf(stderr, "bench-gloo: out of memory or no temporary directory\n");
		return 1;
	}
	fill(b.src, most_elements);
	printf("bench-gloo: 2 processes on 127.0.0.1, Gloo ring all-reduce, kernels %s, "
	       "median of %d\n",
	       gs_isa_name(gs_isa_active()), b.iterations);

	struct ranks rk;
	int status[RANKS_MAX];
	int rc = ranks_start(&rk, 2, rank_main, &b);
	int overran = rc == 0 ? ranks_wait(&rk, 600000, status) : 0;
	file_store_dir_remove(b.dir);
	if (rc < 0 || overran || status[0] != 0 || status[1] != 0) {
		fprintf(stderr, "bench-gloo: a rank failed\n");
		return 1;
	}
	return 0;
}
