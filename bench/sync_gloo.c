/*
 * The baseline a user would otherwise run: every trainer all-reduces its
 * own gradients in-process with Gloo, as PyTorch DDP does on the Gloo
 * backend. N x M processes form one flat Gloo group (TCP on loopback).
 *
 * Buckets follow DDP: parameters in reverse order, a bucket closes once it
 * holds at least its cap in fp32 bytes, the first cap 1 MiB
 * (dist._DEFAULT_FIRST_BUCKET_BYTES), the others 25 MiB (bucket_cap_mb).
 * Each step all-reduces the buckets one after the other:
 *
 *   gloo-fp32: gradients scaled by 1/world into the bucket, Gloo ring
 *     all-reduce with Gloo's fp32 sum, copied back (DDP's default hook);
 *   gloo-fp16: gradients scaled and cast to fp16 into the bucket, Gloo
 *     ring all-reduce with Gloo's own float16 sum, widened back (the fp16
 *     compress hook on Gloo).
 *
 * The copies and casts use gradsync's vectorised kernels and are fused
 * with the scaling: one pass in, one pass out, where PyTorch makes three
 * in and two out. The baseline gets the benefit of the doubt.
 */
#include <stdlib.h>
#include <string.h>

#include "file_store.h"
#include "gloo_baseline.h"

#define GLOO_TIMEOUT_MS 120000
#define FIRST_BUCKET_BYTES (1u << 20)
#define BUCKET_BYTES (25u << 20)

struct ddp_bucket {
	size_t hi, lo; /* tensors hi, hi - 1, ..., lo (parameter order) */
	uint64_t elements;
};

struct gloo_run {
	const struct bench_config *c;
	const struct layout_file *l;
	const char *store;
	const char *host; /* where this rank's Gloo device listens */
	unsigned world;
	struct ddp_bucket *buckets;
	size_t nbuckets;
	uint64_t largest; /* elements of the largest bucket */
	double *times;	  /* shared: [system][rank][step] */
};

/* DDP's _compute_bucket_assignment_by_size for one dtype. */
static size_t ddp_buckets(const struct layout_file *l, struct ddp_bucket *out, uint64_t *largest)
{
	size_t n = 0;
	uint64_t bytes = 0, cap = FIRST_BUCKET_BYTES;
	*largest = 0;
	for (size_t k = 0; k < l->n; k++) {
		size_t t = l->n - 1 - k;
		if (bytes == 0)
			out[n] = (struct ddp_bucket){t, t, 0};
		out[n].lo = t;
		out[n].elements += l->counts[t];
		bytes += l->counts[t] * sizeof(float);
		if (bytes >= cap || k + 1 == l->n) {
			if (out[n].elements > *largest)
				*largest = out[n].elements;
			n++;
			bytes = 0;
			cap = BUCKET_BYTES;
		}
	}
	return n;
}

/* One bucket through the fp32 or fp16 path. offs[t]: tensor t's first
 * element in grads. */
static int one_bucket(struct gs_gloo *g, enum gs_wire wire, const struct ddp_bucket *b,
		      const struct layout_file *l, const uint64_t *offs, float *grads, void *buf,
		      float prescale, char *err, size_t errlen)
{
	struct gs_pack_params p = {.prescale = prescale};
	size_t esize = gs_wire_size(wire);
	char *at = buf;
	for (size_t t = b->hi + 1; t-- > b->lo;) {
		gs_pack(wire, at, grads + offs[t], l->counts[t], &p);
		at += l->counts[t] * esize;
	}
	int rc = gs_gloo_allreduce_with(g, wire, buf, b->elements, GS_GLOO_SUM_GLOO,
					GLOO_TIMEOUT_MS, err, errlen);
	if (rc < 0)
		return rc;
	at = buf;
	for (size_t t = b->hi + 1; t-- > b->lo;) {
		float *dst = grads + offs[t];
		if (wire == GS_WIRE_F32)
			memcpy(dst, at, l->counts[t] * sizeof(float));
		else
			gs_unpack(wire, &dst, 1, at, l->counts[t], 1.0f);
		at += l->counts[t] * esize;
	}
	return GS_OK;
}

static void fill(float *x, uint64_t n, unsigned rank)
{
	uint64_t r = 0x9e3779b97f4a7c15ull ^ rank;
	for (uint64_t i = 0; i < n; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		x[i] = (float)((int32_t)(r >> 40) - (1 << 23)) * 0x1p-26f;
	}
}

static int rank_main(struct gloo_run *run, unsigned rank)
{
	const struct bench_config *c = run->c;
	const struct layout_file *l = run->l;
	struct gloo_member m = {.err = "out of memory"};
	uint64_t *offs = calloc(l->n, sizeof(*offs));
	float *grads = aligned_alloc(64, (l->total * sizeof(float) + 63) & ~(size_t)63);
	void *buf = aligned_alloc(64, (run->largest * sizeof(float) + 63) & ~(size_t)63);
	int rc = offs && grads && buf ? GS_OK : GS_ENOMEM;
	if (rc == GS_OK)
		rc = gloo_join(&m, run->store, run->host, rank, run->world, GLOO_TIMEOUT_MS);
	if (rc == GS_OK) {
		for (size_t t = 1; t < l->n; t++)
			offs[t] = offs[t - 1] + l->counts[t - 1];
		fill(grads, l->total, rank);
		memset(buf, 0, run->largest * sizeof(float));
	}
	float prescale = 1.0f / (float)run->world;
	unsigned every = c->steps >= 10 ? c->steps / 5 : 1;
	for (unsigned sys = 0; rc == GS_OK && sys < GLOO_SYSTEMS; sys++) {
		for (unsigned s = 0; rc == GS_OK && s < c->warmup + c->steps; s++) {
			double t0 = gs_now_ms();
			for (size_t b = 0; rc == GS_OK && b < run->nbuckets; b++)
				rc = one_bucket(m.g, gloo_systems[sys].wire, &run->buckets[b], l,
						offs, grads, buf, prescale, m.err, sizeof(m.err));
			double ms = gs_now_ms() - t0;
			if (s < c->warmup)
				continue;
			unsigned k = s - c->warmup;
			run->times[((size_t)sys * run->world + rank) * c->steps + k] = ms;
			if (rank == 0 && ((k + 1) % every == 0 || k + 1 == c->steps))
				fprintf(stderr, "    %s %s: step %u/%u %.2f ms\n",
					gloo_systems[sys].name, l->name, k + 1, c->steps, ms);
		}
	}
	int status = gloo_leave(&m, rc, "gradsync-bench: Gloo rank", rank);
	free(offs);
	free(grads);
	free(buf);
	return status;
}

struct rank_arg {
	struct gloo_run *run;
	unsigned rank;
};

static int rank_entry(void *arg)
{
	struct rank_arg *a = arg;
	return rank_main(a->run, a->rank);
}

/* Per step, the slowest rank; every rank's time goes to the CSV. */
static void collect(const struct gloo_run *run, struct sync_result out[GLOO_SYSTEMS])
{
	const struct bench_config *c = run->c;
	double *worst = calloc(c->steps, sizeof(*worst));
	for (unsigned sys = 0; worst && sys < GLOO_SYSTEMS; sys++) {
		memset(worst, 0, c->steps * sizeof(*worst));
		for (unsigned s = 0; s < c->steps; s++) {
			for (unsigned r = 0; r < run->world; r++) {
				double ms =
				    run->times[((size_t)sys * run->world + r) * c->steps + s];
				struct bench_row row = {
				    "sync",	 run->l->name, gloo_systems[sys].name,
				    c->nodes,	 c->trainers,  (int)r,
				    (long)s + 1, ms,	       out[sys].bytes};
				bench_csv_row(c->csv, &row);
				if (ms > worst[s])
					worst[s] = ms;
			}
		}
		bench_stats(worst, c->steps, &out[sys].st);
		out[sys].ok = 1;
	}
	free(worst);
}

int sync_gloo(const struct bench_config *c, const struct layout_file *l,
	      struct sync_result out[GLOO_SYSTEMS])
{
	struct gloo_run run = {
	    .c = c, .l = l, .host = "127.0.0.1", .world = c->nodes * c->trainers};
	size_t times_bytes = (size_t)GLOO_SYSTEMS * run.world * c->steps * sizeof(double);
	struct rank_arg args[64];
	pid_t pids[64];
	unsigned started = 0;
	int rc = 0;
	for (unsigned sys = 0; sys < GLOO_SYSTEMS; sys++) {
		memset(&out[sys], 0, sizeof(out[sys]));
		snprintf(out[sys].system, sizeof(out[sys].system), "%s", gloo_systems[sys].name);
		out[sys].bytes = l->total * sizeof(float);
	}
	run.buckets = calloc(l->n, sizeof(*run.buckets));
	run.times = bench_shared_alloc(times_bytes);
	char *store = file_store_dir_create();
	run.store = store;
	if (run.world > 64 || !run.buckets || !run.times || !store) {
		fprintf(stderr, "gradsync-bench: cannot set up the Gloo ranks\n");
		rc = -1;
		goto out;
	}
	run.nbuckets = ddp_buckets(l, run.buckets, &run.largest);
	printf("  DDP buckets: %zu (first cap 1 MiB, then 25 MiB of fp32), largest %.1f MiB\n",
	       run.nbuckets, (double)run.largest * 4 / (1 << 20));
	for (unsigned r = 0; r < run.world; r++) {
		args[r] = (struct rank_arg){&run, r};
		pids[r] = bench_fork(rank_entry, &args[r]);
		if (pids[r] < 0) {
			rc = -1;
			break;
		}
		started++;
	}
	double deadline = gs_now_ms() + 600000;
	for (unsigned r = 0; r < started; r++) {
		int left = (int)(deadline - gs_now_ms());
		int st = bench_wait(pids[r], left > 0 ? left : 1);
		if (st != 0) {
			fprintf(stderr, "gradsync-bench: Gloo rank %u %s (status %d)\n", r,
				st < 0 ? "overran its time" : "failed", st);
			rc = -1;
		}
	}
	if (rc == 0)
		collect(&run, out);
out:
	file_store_dir_remove(store);
	bench_shared_free(run.times, times_bytes);
	free(run.buckets);
	return rc;
}

int sync_gloo_rank(const struct bench_config *c, const struct layout_file *l, const char *store,
		   const char *host, unsigned rank, unsigned world, double *times)
{
	struct gloo_run run = {
	    .c = c, .l = l, .store = store, .host = host, .world = world, .times = times};
	if (rank >= world || !(run.buckets = calloc(l->n, sizeof(*run.buckets))))
		return 1;
	run.nbuckets = ddp_buckets(l, run.buckets, &run.largest);
	int rc = rank_main(&run, rank);
	free(run.buckets);
	return rc;
}
