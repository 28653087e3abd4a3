/*
 * Check 1 of tests/gpu/run.sh: the CUDA backend's pack and unpack kernels
 * against the host backend's conversion kernels, bit for bit, on the same
 * inputs. A bucket of tensors of awkward sizes (one element, one below and
 * above a thread block's share, a megabyte) sub-allocated in one device
 * allocation goes through a fusion buffer smaller than the bucket, so it
 * takes several launches, for every wire dtype, with and without clipping,
 * at several scales; inputs mix every corner case of the conversions. Then
 * every fp16 and every bf16 value is unpacked at three scales. Clipped and
 * non-finite counts must match too. Prints one line: PASS or FAIL.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common.h"
#include "convert.h"
#include "backend/cuda/kernels.h"
#include "backend/plan.h"
#include "backend/cuda/table.h"

#define FUSION (1u << 19)

#define CHECK(call)                                                                   \
	do {                                                                          \
		cudaError_t e_ = (call);                                              \
		if (e_ != cudaSuccess) {                                              \
			printf("FAIL kernels: %s: %s\n", #call, cudaGetErrorString(e_)); \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static const uint64_t sizes[] = {
	1, 3, 31, 4095, 4096, 4097, 12288, 65536, 100003, 1u << 20, 7, 262149,
};
#define NT (sizeof(sizes) / sizeof(sizes[0]))

struct bucket {
	uint64_t counts[NT];
	uint64_t offsets[NT]; /* bytes into the device allocation */
	struct gs_plan plan;
	struct gs_cuda_bucket_plan bp;
	float *host_in;       /* all tensors back to back (elements) */
	uint64_t host_off[NT];
	char *dev;            /* one allocation holding every tensor */
	float *dev_tensors[NT];
	void *fusion;
	void *table, *staging;
	unsigned long long *counter;
	uint64_t total;
};

static size_t esize(enum gs_wire w)
{
	return gs_wire_size(w);
}

static void setup(struct bucket *b, uint64_t *seed)
{
	uint64_t bytes = 0;
	b->total = 0;
	for (size_t t = 0; t < NT; t++) {
		b->counts[t] = sizes[t];
		b->offsets[t] = bytes;
		b->host_off[t] = b->total;
		b->total += sizes[t];
		bytes += (sizes[t] * 4 + 511) & ~(uint64_t)511; /* as a caching allocator */
	}
	if (gs_plan_build(b->counts, NT, UINT64_C(1) << 40, &b->plan) < 0 ||
	    b->plan.nbuckets != 1 ||
	    gs_cuda_plan_bucket(&b->bp, &b->plan, b->counts, 0, FUSION) < 0) {
		printf("FAIL kernels: cannot plan the bucket\n");
		exit(1);
	}
	b->host_in = malloc(b->total * sizeof(float));
	for (uint64_t i = 0; i < b->total; i++)
		b->host_in[i] = corner_value(seed, 1.5f);
	CHECK(cudaMalloc((void **)&b->dev, bytes));
	for (size_t t = 0; t < NT; t++)
		b->dev_tensors[t] = (float *)(b->dev + b->offsets[t]);
	CHECK(cudaMalloc(&b->fusion, FUSION * sizeof(float)));
	CHECK(cudaMalloc(&b->table, b->bp.table_bytes));
	CHECK(cudaMalloc((void **)&b->counter, sizeof(*b->counter)));
	b->staging = malloc(b->bp.table_bytes);
	gs_cuda_fill_tables(&b->bp, b->dev_tensors, b->staging);
	CHECK(cudaMemcpy(b->table, b->staging, b->bp.table_bytes, cudaMemcpyHostToDevice));
}

static void upload_inputs(struct bucket *b)
{
	for (size_t t = 0; t < NT; t++)
		CHECK(cudaMemcpy(b->dev_tensors[t], b->host_in + b->host_off[t], sizes[t] * 4,
				 cudaMemcpyHostToDevice));
}

static unsigned long long take_counter(struct bucket *b)
{
	unsigned long long v = 0;
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaMemcpy(&v, b->counter, sizeof(v), cudaMemcpyDeviceToHost));
	CHECK(cudaMemset(b->counter, 0, sizeof(v)));
	return v;
}

static const struct gs_cuda_entry *entries(struct bucket *b, const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_entry *)((char *)b->table + l->table_offset);
}

static const struct gs_cuda_task *tasks(struct bucket *b, const struct gs_cuda_launch *l)
{
	return (const struct gs_cuda_task *)((char *)b->table + gs_cuda_tasks_offset(l));
}

static uint64_t first_diff(const void *a, const void *b, uint64_t n, size_t size)
{
	for (uint64_t i = 0; i < n; i++)
		if (memcmp((const char *)a + i * size, (const char *)b + i * size, size))
			return i;
	return n;
}

/* Packs every launch on the GPU and on the host, compares, then unpacks
 * the packed buffer back into the tensors on both and compares. */
static bool check_config(struct bucket *b, enum gs_wire w, struct gs_pack_params p,
			 float post, uint64_t *compared)
{
	size_t es = esize(w);
	char *want = malloc(FUSION * es), *got = malloc(FUSION * es);
	float *out_dev = malloc(FUSION * sizeof(float)), *out_host = malloc(FUSION * sizeof(float));
	bool ok = true;
	upload_inputs(b);
	for (uint32_t li = 0; ok && li < b->bp.nlaunches; li++) {
		const struct gs_cuda_launch *l = &b->bp.launches[li];
		uint64_t clipped = 0, nonfinite = 0, pos = 0;
		for (uint32_t s = 0; s < l->nspans; s++) {
			const struct gs_span *sp = &b->bp.spans[l->first_span + s];
			clipped += gs_pack(w, want + pos * es, b->host_in + b->host_off[sp->tensor] + sp->offset,
					   sp->count, &p);
			pos += sp->count;
		}
		CHECK(gs_cuda_launch_pack(w, entries(b, l), tasks(b, l), l->ntasks, b->fusion, p,
					  b->counter, 0));
		unsigned long long dev_clipped = take_counter(b);
		CHECK(cudaMemcpy(got, b->fusion, l->elements * es, cudaMemcpyDeviceToHost));
		uint64_t d = first_diff(want, got, l->elements, es);
		if (d < l->elements || dev_clipped != clipped) {
			printf("FAIL kernels: pack, wire %s, clip %s, prescale %g, launch %u: element %llu differs (or clipped %llu vs %llu)\n",
			       gs_wire_name(w), p.clip ? "on" : "off", (double)p.prescale, li,
			       (unsigned long long)d, dev_clipped, (unsigned long long)clipped);
			ok = false;
			break;
		}
		/* Unpack what was packed, into the tensors, on both sides. */
		pos = 0;
		for (uint32_t s = 0; s < l->nspans; s++) {
			const struct gs_span *sp = &b->bp.spans[l->first_span + s];
			float *dst = out_host + pos;
			nonfinite += gs_unpack(w, &dst, 1, want + pos * es, sp->count, post);
			pos += sp->count;
		}
		CHECK(gs_cuda_launch_unpack(w, entries(b, l), tasks(b, l), l->ntasks, b->fusion, post,
					    b->counter, NULL, 0));
		unsigned long long dev_nonfinite = take_counter(b);
		pos = 0;
		for (uint32_t s = 0; s < l->nspans; s++) {
			const struct gs_span *sp = &b->bp.spans[l->first_span + s];
			CHECK(cudaMemcpy(out_dev + pos, b->dev_tensors[sp->tensor] + sp->offset,
					 sp->count * 4, cudaMemcpyDeviceToHost));
			pos += sp->count;
		}
		d = first_diff(out_host, out_dev, l->elements, 4);
		if (d < l->elements || dev_nonfinite != nonfinite) {
			printf("FAIL kernels: unpack, wire %s, postscale %g, launch %u: element %llu differs (or non-finite %llu vs %llu)\n",
			       gs_wire_name(w), (double)post, li, (unsigned long long)d, dev_nonfinite,
			       (unsigned long long)nonfinite);
			ok = false;
		}
		*compared += 2 * l->elements;
	}
	free(want);
	free(got);
	free(out_dev);
	free(out_host);
	return ok;
}

/* Every 16-bit pattern as a packed fp16 or bf16 value, unpacked. */
static bool check_every_value(enum gs_wire w, float post)
{
	enum { N = 65536 };
	uint64_t counts[1] = { N };
	struct gs_plan plan;
	struct gs_cuda_bucket_plan bp = { 0 };
	if (gs_plan_build(counts, 1, N, &plan) < 0 || gs_cuda_plan_bucket(&bp, &plan, counts, 0, N) < 0)
		return false;
	uint16_t *codes = malloc(N * 2);
	float *want = malloc(N * 4), *got = malloc(N * 4);
	for (uint32_t i = 0; i < N; i++)
		codes[i] = (uint16_t)i;
	float *dev_out;
	void *fusion, *table;
	unsigned long long *counter, dev_nonfinite = 0;
	CHECK(cudaMalloc((void **)&dev_out, N * 4));
	CHECK(cudaMalloc(&fusion, N * 2));
	CHECK(cudaMalloc(&table, bp.table_bytes));
	CHECK(cudaMalloc((void **)&counter, sizeof(*counter)));
	CHECK(cudaMemset(counter, 0, sizeof(*counter)));
	void *staging = malloc(bp.table_bytes);
	gs_cuda_fill_tables(&bp, &dev_out, staging);
	CHECK(cudaMemcpy(table, staging, bp.table_bytes, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(fusion, codes, N * 2, cudaMemcpyHostToDevice));
	const struct gs_cuda_launch *l = &bp.launches[0];
	CHECK(gs_cuda_launch_unpack(w, (const struct gs_cuda_entry *)((char *)table + l->table_offset),
				    (const struct gs_cuda_task *)((char *)table + gs_cuda_tasks_offset(l)),
				    l->ntasks, fusion, post, counter, NULL, 0));
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaMemcpy(got, dev_out, N * 4, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(&dev_nonfinite, counter, sizeof(dev_nonfinite), cudaMemcpyDeviceToHost));
	uint64_t nonfinite = gs_unpack(w, &want, 1, codes, N, post);
	uint64_t d = first_diff(want, got, N, 4);
	bool ok = d == N && dev_nonfinite == nonfinite;
	if (!ok)
		printf("FAIL kernels: every %s value, postscale %g: code 0x%04llx differs (or non-finite %llu vs %llu)\n",
		       gs_wire_name(w), (double)post, (unsigned long long)d, dev_nonfinite,
		       (unsigned long long)nonfinite);
	cudaFree(dev_out);
	cudaFree(fusion);
	cudaFree(table);
	cudaFree(counter);
	free(staging);
	free(codes);
	free(want);
	free(got);
	gs_cuda_bucket_plan_free(&bp);
	gs_plan_free(&plan);
	return ok;
}

int main(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("FAIL kernels: no usable GPU\n");
		return 1;
	}
	CHECK(cudaSetDevice(0));
	uint64_t seed = 0x2545f4914f6cdd1du;
	struct bucket b;
	memset(&b, 0, sizeof(b));
	setup(&b, &seed);
	const enum gs_wire wires[] = { GS_WIRE_F16, GS_WIRE_BF16, GS_WIRE_F32 };
	const float prescales[] = { 1.0f, 0.125f, 1.0f / 3.0f };
	const float postscales[] = { 1.0f, 0.5f, 3.0f };
	uint64_t compared = 0;
	unsigned configs = 0;
	bool ok = true;
	for (int wi = 0; ok && wi < 3; wi++)
		for (int clip = 0; ok && clip < 2; clip++)
			for (int s = 0; ok && s < 3; s++, configs++) {
				struct gs_pack_params p = { prescales[s], clip == 1, 1.5f };
				ok = check_config(&b, wires[wi], p, postscales[(s + clip) % 3], &compared);
			}
	const float every_post[] = { 1.0f, 0.25f, 1e-3f };
	for (int i = 0; ok && i < 3; i++)
		ok = check_every_value(GS_WIRE_F16, every_post[i]) &&
		     check_every_value(GS_WIRE_BF16, every_post[i]);
	if (!ok)
		return 1;
	printf("PASS kernels: pack and unpack bitwise equal to the host's %s kernels: %u configurations (fp16/bf16/fp32, clip on/off, 3 scales) of %llu elements in %u launches each, %llu values compared, and every fp16 and bf16 value unpacked at 3 scales\n",
	       gs_isa_name(gs_isa_active()), configs, (unsigned long long)b.total, b.bp.nlaunches,
	       (unsigned long long)compared);
	return 0;
}
