/*
 * The trainer of tests/gpu/run.sh, a separate process from gradsyncd that
 * hands it CUDA tensors through libgradsync.
 *
 * Sync mode (check 2): the tensors of a layout (ResNet-50) in two device
 * allocations, 512-byte aligned as a caching allocator places them. Each
 * step the gradients are produced on the trainer's stream behind a 20 ms
 * host callback, and marked ready at once, without synchronising: only the
 * ready event keeps gradsyncd from reading the previous step's values.
 * After the step the stream waits on the done event and copies the results
 * back. Every element is checked against the host backend's kernels on the
 * same inputs (one GPU: the reduce is the identity), bit for bit, and the
 * step's clipped and non-finite counts against the host's. One step clips.
 *
 * Recovery (check 3, --late-step S): step S's gradients come 5 s late on
 * the trainer's stream, past the daemon's --peer-timeout. gradsyncd must
 * abort the step saying why, with every tensor the trainer's own, and the
 * next steps must be right again, on NCCL communicators it made anew.
 *
 * Bench mode (check 4): ELEMENTS as tensors of 65536, all in one bucket,
 * timed per step (begin to results on the trainer's stream); rank 0 prints
 * the median.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common.h"
#include "convert.h"
#include "cuda_trainer.h"
#include "gradsync.h"
#include "layout_file.h"
#define PROGRAM "gpu-trainer"
#include "check.h"

struct options {
	const char *socket;
	const char *layout;
	unsigned rank;
	unsigned steps;
	unsigned clip_step;
	unsigned late_step; /* 0: none */
	uint64_t bench_elements;
};

struct trainer {
	struct options o;
	struct cuda_trainer ct;
};

static void parse(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "layout", required_argument, NULL, 'l' },
		{ "rank", required_argument, NULL, 'r' },
		{ "steps", required_argument, NULL, 'n' },
		{ "clip-step", required_argument, NULL, 'c' },
		{ "bench-elements", required_argument, NULL, 'b' },
		{ "late-step", required_argument, NULL, 'L' },
		{ NULL, 0, NULL, 0 },
	};
	*o = (struct options){ NULL, NULL, 0, 5, 3, 0, 0 };
	int opt;
	while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (opt) {
		case 's': o->socket = optarg; break;
		case 'l': o->layout = optarg; break;
		case 'r': o->rank = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'n': o->steps = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'c': o->clip_step = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'b': o->bench_elements = strtoull(optarg, NULL, 10); break;
		case 'L': o->late_step = (unsigned)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: gpu-trainer --socket PATH (--layout FILE [--steps N] [--clip-step S] [--late-step S] | --bench-elements N) [--rank R]\n");
			exit(2);
		}
	}
	if (!o->socket || (!o->layout && !o->bench_elements)) {
		fprintf(stderr, "gpu-trainer: --socket and --layout or --bench-elements are needed\n");
		exit(2);
	}
}

/* Two allocations, tensors alternating between them, 512-byte aligned. */
static void allocate(struct trainer *t)
{
	uint64_t bytes[2] = { 0, 0 }, *off = calloc(t->ct.n, sizeof(*off));
	t->ct.dev = calloc(t->ct.n, sizeof(*t->ct.dev));
	t->ct.host_off = calloc(t->ct.n, sizeof(*t->ct.host_off));
	int split = t->o.bench_elements ? 1 : 2;
	for (size_t i = 0; i < t->ct.n; i++) {
		int a = (int)(i % (size_t)split);
		off[i] = bytes[a];
		bytes[a] += (t->ct.counts[i] * 4 + 511) & ~(uint64_t)511;
		t->ct.host_off[i] = t->ct.total;
		t->ct.total += t->ct.counts[i];
	}
	char *base[2] = { NULL, NULL };
	for (int a = 0; a < split; a++)
		CUDA(cudaMalloc((void **)&base[a], bytes[a]));
	for (size_t i = 0; i < t->ct.n; i++)
		t->ct.dev[i] = (float *)(base[i % (size_t)split] + off[i]);
	free(off);
	CUDA(cudaMallocHost((void **)&t->ct.in, t->ct.total * 4));
	CUDA(cudaMallocHost((void **)&t->ct.out, t->ct.total * 4));
	memset(t->ct.in, 0, t->ct.total * 4);
}

static void start(struct trainer *t)
{
	t->ct.program = PROGRAM;
	cuda_trainer_connect(&t->ct, t->o.socket, t->o.rank, (int)t->o.rank, 60000);
	allocate(t);
	cuda_trainer_register(&t->ct);
}

/* Produces this step's gradients on the stream, behind a delay of ms, and
 * marks them ready in backpropagation order, eight at a time, without
 * waiting. */
static void produce_and_mark(struct trainer *t, unsigned ms)
{
	if (ms)
		CUDA(cudaLaunchHostFunc(t->ct.stream, cuda_trainer_sleep, (void *)(uintptr_t)ms));
	uint32_t batch[8];
	size_t k = 0;
	for (size_t i = 0; i < t->ct.n; i++) {
		CUDA(cudaMemcpyAsync(t->ct.dev[i], t->ct.in + t->ct.host_off[i], t->ct.counts[i] * 4,
				     cudaMemcpyHostToDevice, t->ct.stream));
		batch[k++] = (uint32_t)i;
		if (k == 8 || i + 1 == t->ct.n) {
			GS(t->ct.c, gs_cuda_mark_ready(t->ct.c, batch, k, t->ct.stream));
			k = 0;
		}
	}
}

/* The late step: aborted, saying why, and every tensor the trainer's own. */
static uint64_t check_late(struct trainer *t, int r, unsigned step)
{
	const char *why = gs_last_error(t->ct.c);
	if (r != GS_EABORTED || !strstr(why, "were not ready on its GPU")) {
		fprintf(stderr, "gpu-trainer: step %u, 5 s late: %s, not aborted for lateness (%s)\n",
			step, gs_strerror(r), r == GS_OK ? "it completed" : why);
		return 1;
	}
	for (size_t i = 0; i < t->ct.n; i++)
		if (gs_tensor_reduced(t->ct.c, i) ||
		    memcmp(t->ct.out + t->ct.host_off[i], t->ct.in + t->ct.host_off[i], t->ct.counts[i] * 4)) {
			fprintf(stderr, "gpu-trainer: step %u was aborted, but tensor %s is not its own gradient\n",
				step, t->ct.names[i]);
			return 1;
		}
	printf("step %u aborted as expected: %s\n", step, why);
	return 0;
}

/* The same step on the host backend's kernels: with one rank the reduce
 * is the identity, so the result is unpack(pack(input)). */
static uint64_t check_step(struct trainer *t, const struct gs_pack_params *p, float post,
			   const struct gs_step_result *res, unsigned step)
{
	enum gs_wire w = (enum gs_wire)t->ct.info.wire_dtype;
	void *wire = malloc(t->ct.total * 4);
	float *want = malloc(t->ct.total * 4);
	uint64_t clipped = gs_pack(w, wire, t->ct.in, t->ct.total, p);
	uint64_t nonfinite = gs_unpack(w, &want, 1, wire, t->ct.total, post);
	uint64_t bad = 0, first = t->ct.total;
	for (uint64_t i = 0; i < t->ct.total; i++) {
		if (memcmp(&want[i], &t->ct.out[i], 4)) {
			if (first == t->ct.total)
				first = i;
			bad++;
		}
	}
	if (bad)
		fprintf(stderr, "gpu-trainer: step %u: %" PRIu64 " of %" PRIu64 " elements differ, first %" PRIu64 ": %a, want %a (input %a)\n",
			step, bad, t->ct.total, first, (double)t->ct.out[first], (double)want[first],
			(double)t->ct.in[first]);
	if (res->clipped != clipped || res->nonfinite != nonfinite) {
		fprintf(stderr, "gpu-trainer: step %u: gradsyncd counted %" PRIu64 " clipped and %" PRIu64 " non-finite; the host %" PRIu64 " and %" PRIu64 "\n",
			step, res->clipped, res->nonfinite, clipped, nonfinite);
		bad++;
	}
	free(wire);
	free(want);
	return bad;
}

static int run_sync(struct trainer *t)
{
	/* gradsyncd's scale factors, as gs_settings_scales derives them. */
	double world = t->ct.info.world_size, pre = t->ct.info.predivide_factor;
	float prescale = (float)(1.0 / pre);
	float post = (float)(t->ct.info.op == GS_OP_AVERAGE ? pre / world : pre);
	uint64_t seed = 0x853c49e6748fea9bu + t->o.rank, bad = 0, clipped = 0, nonfinite = 0;
	double t0 = now_s();
	for (unsigned s = 1; s <= t->o.steps; s++) {
		for (uint64_t i = 0; i < t->ct.total; i++)
			t->ct.in[i] = gradient_value(&seed);
		struct gs_step_options so = GS_STEP_OPTIONS_INIT;
		so.clipping = s == t->o.clip_step;
		so.clip_value = 0.5f;
		GS(t->ct.c, gs_step_begin(t->ct.c, &so));
		bool late = s == t->o.late_step;
		produce_and_mark(t, late ? 5000 : 20);
		struct gs_step_result res;
		int r = cuda_trainer_collect(&t->ct, 120000, &res);
		if (late) {
			bad += check_late(t, r, s);
			continue;
		}
		if (r != GS_OK)
			GS(t->ct.c, r);
		struct gs_pack_params p = { prescale, so.clipping, so.clip_value };
		bad += check_step(t, &p, post, &res, s);
		clipped += res.clipped;
		nonfinite += res.nonfinite;
	}
	double secs = now_s() - t0;
	if (bad) {
		printf("FAIL sync %s: %" PRIu64 " mismatches over %u steps of %zu tensors (%" PRIu64 " elements)\n",
		       gs_wire_name((enum gs_wire)t->ct.info.wire_dtype), bad, t->o.steps, t->ct.n, t->ct.total);
		return 1;
	}
	if (t->o.late_step) {
		printf("PASS recovery: step %u, its gradients 5 s late, aborted for that with every tensor the trainer's own; the other %u steps bitwise equal to the host kernels\n",
		       t->o.late_step, t->o.steps - 1);
		return 0;
	}
	printf("PASS sync %s: %u steps of %zu tensors (%" PRIu64 " elements) in 2 CUDA allocations through CUDA IPC, bitwise equal to the host kernels; %" PRIu64 " clipped, %" PRIu64 " non-finite as the host counted; %.1f ms per step\n",
	       gs_wire_name((enum gs_wire)t->ct.info.wire_dtype), t->o.steps, t->ct.n, t->ct.total, clipped,
	       nonfinite, secs * 1000 / t->o.steps);
	return 0;
}

static int run_bench(struct trainer *t)
{
	enum { WARMUP = 3, STEPS = 20 };
	double times[STEPS];
	uint32_t *all = malloc(t->ct.n * sizeof(*all));
	for (size_t i = 0; i < t->ct.n; i++)
		all[i] = (uint32_t)i;
	for (int s = 0; s < WARMUP + STEPS; s++) {
		struct gs_step_options so = GS_STEP_OPTIONS_INIT;
		struct gs_step_result res;
		CUDA(cudaStreamSynchronize(t->ct.stream));
		double t0 = now_s();
		GS(t->ct.c, gs_step_begin(t->ct.c, &so));
		GS(t->ct.c, gs_cuda_mark_ready(t->ct.c, all, t->ct.n, t->ct.stream));
		GS(t->ct.c, gs_step_wait(t->ct.c, 120000, &res));
		GS(t->ct.c, gs_cuda_stream_wait(t->ct.c, t->ct.stream));
		CUDA(cudaStreamSynchronize(t->ct.stream));
		if (s >= WARMUP)
			times[s - WARMUP] = now_s() - t0;
	}
	free(all);
	if (t->o.rank == 0)
		printf("BENCH elements=%" PRIu64 " ranks=%u step_us=%.1f\n", t->ct.total,
		       t->ct.info.world_size, median(times, STEPS) * 1e6);
	return 0;
}

/* Everything start() and main() took, so that the sanitizers see no leak. */
static void finish(struct trainer *t, struct layout_file *l)
{
	gs_close(t->ct.c);
	CUDA(cudaStreamDestroy(t->ct.stream));
	CUDA(cudaFreeHost(t->ct.in));
	CUDA(cudaFreeHost(t->ct.out));
	/* Tensors 0 and 1 start the allocations (one in bench mode). */
	for (size_t i = 0; i < t->ct.n && i < (t->o.bench_elements ? 1u : 2u); i++)
		CUDA(cudaFree(t->ct.dev[i]));
	free(t->ct.dev);
	free(t->ct.host_off);
	if (l) {
		layout_file_free(l);
		return;
	}
	for (size_t i = 0; i < t->ct.n; i++)
		free(t->ct.names[i]);
	free(t->ct.names);
	free(t->ct.counts);
}

int main(int argc, char **argv)
{
	struct trainer t;
	struct layout_file l;
	memset(&t, 0, sizeof(t));
	parse(argc, argv, &t.o);
	if (t.o.bench_elements) {
		t.ct.n = (size_t)((t.o.bench_elements + 65535) / 65536);
		t.ct.counts = calloc(t.ct.n, sizeof(*t.ct.counts));
		t.ct.names = calloc(t.ct.n, sizeof(*t.ct.names));
		for (size_t i = 0; i < t.ct.n; i++) {
			t.ct.counts[i] = 65536;
			t.ct.names[i] = malloc(32);
			snprintf(t.ct.names[i], 32, "bench.%zu", i);
		}
	} else {
		if (layout_file_read(t.o.layout, &l) < 0)
			return 2;
		t.ct.n = l.n;
		t.ct.counts = l.counts;
		t.ct.names = l.names;
	}
	start(&t);
	int rc = t.o.bench_elements ? run_bench(&t) : run_sync(&t);
	finish(&t, t.o.bench_elements ? NULL : &l);
	return rc;
}
