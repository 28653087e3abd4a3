/*
 * The trainer of test-cuda-emu: a process of its own that hands gradsyncd
 * CUDA tensors through libgradsync's real C API, on the CUDA emulation.
 *
 * The layout's tensors are pieces of one cudaMalloc, 512-byte aligned, as
 * a caching allocator hands them out. Each step the gradients reach device
 * memory behind a host function that sleeps (--delay-ms) on the trainer's
 * stream, and are marked ready at once: only the ready event keeps
 * gradsyncd from reading the previous step's results. After gs_step_wait
 * the stream waits on the done event and copies the results back.
 *
 * Every element is checked, bit for bit (any NaN equals any NaN), against
 * a reference computed here from every rank's inputs (each trainer
 * regenerates them): clip, prescale, round to the wire dtype, sum in fp32
 * in rank order, round, postscale, as tests/python/pylib.py's
 * reduce_reference. The rounding is done another way than gradsync's
 * kernels: in double, by the FPU's round-to-nearest-even (nearbyint) at
 * the dtype's precision. The step's clipped and non-finite counts are
 * checked too. Prints "PASS ..." and exits 0, or says what differed.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gradsync.h"
#include "cuda_trainer.h"
#include "layout_file.h"
#define PROGRAM "emu-trainer"
#include "check.h"

#define CLIP 0.5f

struct options {
	const char *socket, *layout;
	unsigned rank;        /* local rank */
	int device;           /* its GPU, as this process numbers them: --device, or rank */
	unsigned global_rank; /* whose inputs these are */
	unsigned steps, clip_step;
	unsigned first_step;  /* the number (and inputs) of the first step run */
	unsigned delay_ms;
	unsigned abort_step; /* must be aborted (a peer is lost in it); 0: none */
	unsigned stall_step; /* its gradients come 5 s late; 0: none */
	unsigned batch_ms;   /* --overlap: each batch of 8 takes this long */
	bool hold;           /* register, say so, and wait to be killed */
	bool linger;         /* after its steps, say so, and wait to be killed */
	unsigned absent;     /* --absent K: tensors no rank, or one, produces; 0: none */
};

/* --finite: only the ordinary values of input(), none of the special
 * ones (a NaN among them makes the step's norm NaN; the norm's sum is
 * then checked on finite values). */
static bool finite_inputs;

struct trainer {
	struct options o;
	struct layout_file l;
	struct cuda_trainer ct; /* its tensors are l's */
};

static void parse(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "layout", required_argument, NULL, 'l' },
		{ "rank", required_argument, NULL, 'r' },
		{ "global-rank", required_argument, NULL, 'g' },
		{ "steps", required_argument, NULL, 'n' },
		{ "clip-step", required_argument, NULL, 'c' },
		{ "delay-ms", required_argument, NULL, 'd' },
		{ "overlap", required_argument, NULL, 'o' },
		{ "expect-abort-at", required_argument, NULL, 'a' },
		{ "stall-at", required_argument, NULL, 'S' },
		{ "hold", no_argument, NULL, 'h' },
		{ "linger", no_argument, NULL, 'L' },
		{ "first-step", required_argument, NULL, 'f' },
		{ "device", required_argument, NULL, 'D' },
		{ "absent", required_argument, NULL, 'A' },
		{ "finite", no_argument, NULL, 'F' },
		{ NULL, 0, NULL, 0 },
	};
	*o = (struct options){ NULL, NULL, 0, -1, 0, 3, 2, 1, 50, 0, 0, 0, false, false, 0 };
	bool global = false;
	int opt;
	while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (opt) {
		case 's': o->socket = optarg; break;
		case 'l': o->layout = optarg; break;
		case 'r': o->rank = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'g': o->global_rank = (unsigned)strtoul(optarg, NULL, 10); global = true; break;
		case 'n': o->steps = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'c': o->clip_step = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'd': o->delay_ms = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'o': o->batch_ms = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'a': o->abort_step = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'S': o->stall_step = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'h': o->hold = true; break;
		case 'L': o->linger = true; break;
		case 'f': o->first_step = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'D': o->device = (int)strtol(optarg, NULL, 10); break;
		case 'A': o->absent = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'F': finite_inputs = true; break;
		default:
			fprintf(stderr, "usage: emu-trainer --socket PATH --layout FILE [--rank R] [--global-rank G] [--steps N] [--clip-step S] [--delay-ms MS] [--expect-abort-at S] [--stall-at S] [--first-step S] [--overlap MS] [--hold] [--device D] [--absent K] [--finite]\n");
			exit(2);
		}
	}
	if (!global)
		o->global_rank = o->rank;
	if (o->device < 0)
		o->device = (int)o->rank;
	if (o->absent && o->absent < 3) {
		fprintf(stderr, "emu-trainer: --absent needs K >= 3\n");
		exit(2);
	}
	if (!o->socket || !o->layout) {
		fprintf(stderr, "emu-trainer: --socket and --layout are needed\n");
		exit(2);
	}
}

/* ---- Inputs ------------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15u;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
	return x ^ (x >> 31);
}

static float bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Element i of rank r's gradient in step s: mostly gradients in [-2, 2),
 * and one in 32 a hard case of the conversions. */
static float input(unsigned r, unsigned s, uint64_t i)
{
	uint64_t h = splitmix(i ^ (uint64_t)r << 40 ^ (uint64_t)s << 52);
	uint32_t u = (uint32_t)(h >> 32), sign = (uint32_t)(h & 2) << 30;
	switch (finite_inputs ? 255 : h % 256) {
	case 0: /* any bit pattern: NaN, infinity, subnormals */
		return bits(u);
	case 1: /* around fp16's largest (65504) and its overflow (65520) */
		return bits(sign | (0x477fe000 + (u % 0x2000)));
	case 2: /* an exact tie between two bf16 values */
		return bits((u & 0xffff0000) | 0x8000);
	case 3: /* an exact tie between two fp16 values */
		return bits(sign | (113 + u % 30) << 23 | (u & 0x7fe000) | 0x1000);
	case 4: /* fp16 subnormals and below */
		return bits(sign | (96 + u % 18) << 23 | (u & 0x7fffff));
	default:
		if (h % 256 < 12) /* around the clip value */
			return (sign ? -CLIP : CLIP) * (1.0f + (float)((int)(u % 2001) - 1000) * 1e-4f);
		return (float)((double)(h >> 11) * 0x1p-53 * 4.0 - 2.0);
	}
}

/* ---- The reference --------------------------------------------------------------------- */

/* 2^k as a double, built from its bits (k within double's normal range). */
static double pow2(int k)
{
	uint64_t u = (uint64_t)(k + 1023) << 52;
	double d;
	memcpy(&d, &u, sizeof(d));
	return d;
}

/* x rounded to nearest even with `mant` fraction bits and exponents down
 * to emin (subnormals below), infinity past max. Computed in double:
 * scaling by powers of two is exact there, and adding and taking away
 * 1.5 * 2^52 rounds |y| < 2^51 to an integer, to even on ties, in the
 * FPU's default rounding mode. */
static float round_to(float x, int mant, int emin, double max)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	int e = (int)((u >> 23) & 0xff) - 127; /* fp32 subnormals: below any emin here */
	if (e == 128 || (u & 0x7fffffffu) == 0) /* infinity, NaN, zero */
		return x;
	if (e < emin)
		e = emin;
	double y = (double)x * pow2(mant - e);
	double r = ((y + 0x1.8p52) - 0x1.8p52) * pow2(e - mant);
	if (fabs(r) > max)
		return copysignf(INFINITY, x);
	return copysignf((float)r, x); /* a value rounded to 0 keeps its sign */
}

static float round_wire(float x, enum gs_wire_dtype w)
{
	switch (w) {
	case GS_WIRE_DTYPE_FP16:
		return round_to(x, 10, -14, 65504.0);
	case GS_WIRE_DTYPE_BF16:
		return round_to(x, 7, -126, 0x1.fep127);
	default:
		return x;
	}
}

struct step_ref {
	enum gs_wire_dtype w;
	unsigned world, step;
	bool clip;
	float prescale, postscale;
	unsigned absent; /* --absent K */
};

/* --absent K, as the verifying trainer's: tensor j (registration index)
 * with j % K == 0 is produced by no rank, == 1 by global rank 0 only, == 2
 * by the last global rank only; every other by every rank. */
static bool produces(const struct step_ref *p, unsigned rank, size_t j)
{
	if (!p->absent)
		return true;
	switch (j % p->absent) {
	case 0: return false;
	case 1: return rank == 0;
	case 2: return rank == p->world - 1;
	default: return true;
	}
}

static bool produced_by_none(const struct step_ref *p, size_t j)
{
	return p->absent && j % p->absent == 0;
}

/* Element i (of tensor j) of what rank r hands over: its input, but zero
 * where another rank produces the tensor and r does not. */
static float handed(const struct step_ref *p, unsigned r, size_t j, uint64_t i)
{
	return produced_by_none(p, j) || produces(p, r, j) ? input(r, p->step, i) : 0.0f;
}

static float reference(const struct step_ref *p, size_t j, uint64_t i)
{
	float acc = 0;
	for (unsigned r = 0; r < p->world; r++) {
		float x = handed(p, r, j, i);
		if (p->clip)
			x = x > CLIP ? CLIP : (x < -CLIP ? -CLIP : x);
		float packed = round_wire(x * p->prescale, p->w);
		acc = r == 0 ? packed : acc + packed;
	}
	return round_wire(acc, p->w) * p->postscale;
}

static bool same(float a, float b)
{
	return !memcmp(&a, &b, sizeof(a)) || (isnan(a) && isnan(b));
}

/* Every element: the reference, or, for a tensor no rank produced, this
 * trainer's own (gradsyncd did not write it back), which
 * gs_tensor_produced must report. */
static uint64_t check_step(struct trainer *t, const struct step_ref *p,
			   const struct gs_step_result *res)
{
	uint64_t bad = 0, first = t->ct.total, clipped = 0, nonfinite = 0;
	float want_first = 0;
	for (size_t j = 0; j < t->l.n; j++) {
		bool none = produced_by_none(p, j);
		if (gs_tensor_produced(t->ct.c, j) == none) {
			fprintf(stderr, "emu-trainer: step %u: tensor %zu (%s) is reported %s\n", p->step,
				j, t->l.names[j], none ? "produced, though no rank produced it"
						       : "produced by no rank, though one did");
			bad++;
		}
		for (uint64_t i = t->ct.host_off[j]; i < t->ct.host_off[j] + t->l.counts[j]; i++) {
			float mine = t->ct.in[i];
			float want = none ? mine : reference(p, j, i);
			clipped += p->clip && (mine > CLIP || mine < -CLIP);
			nonfinite += !none && !isfinite(want);
			if (same(want, t->ct.out[i]))
				continue;
			if (bad++ == 0) {
				first = i;
				want_first = want;
			}
		}
	}
	if (bad)
		fprintf(stderr, "emu-trainer: step %u: %" PRIu64 " of %" PRIu64 " elements differ, first %" PRIu64 ": %a, want %a\n",
			p->step, bad, t->ct.total, first, (double)t->ct.out[first], (double)want_first);
	/* The step's norm against a plain fp64 sum of the squares of the
	 * values here: both sum n positive terms, each within n * 2^-53 of
	 * the exact sum. Its bits go out for the test to compare. */
	double sumsq = 0, norm = res->grad_norm;
	for (size_t j = 0; j < t->l.n; j++) {
		if (produced_by_none(p, j))
			continue; /* left out of the norm, as torch leaves out a None */
		for (uint64_t i = t->ct.host_off[j]; i < t->ct.host_off[j] + t->l.counts[j]; i++)
			sumsq += (double)t->ct.out[i] * (double)t->ct.out[i];
	}
	double want_norm = sqrt(sumsq);
	if (isfinite(want_norm) ? !(fabs(norm - want_norm) <= t->ct.total * 0x1p-53 * want_norm)
				: !(isnan(want_norm) ? isnan(norm) : norm == want_norm)) {
		fprintf(stderr, "emu-trainer: step %u: gradsyncd's gradient norm is %.17g, the reference %.17g\n",
			p->step, norm, want_norm);
		bad++;
	}
	uint64_t bits;
	memcpy(&bits, &norm, sizeof(bits));
	printf("NORM step %u %016" PRIx64 "\n", p->step, bits);
	if (res->clipped != clipped || res->nonfinite != nonfinite) {
		fprintf(stderr, "emu-trainer: step %u: gradsyncd counted %" PRIu64 " clipped and %" PRIu64 " non-finite; the reference %" PRIu64 " and %" PRIu64 "\n",
			p->step, res->clipped, res->nonfinite, clipped, nonfinite);
		bad++;
	}
	return bad;
}

/* ---- The steps --------------------------------------------------------------------- */

/* One allocation, as a caching allocator's segment; tensors 512-byte aligned in it. */
static void allocate(struct trainer *t)
{
	size_t n = t->l.n;
	uint64_t bytes = 0, *off = calloc(n, sizeof(*off));
	t->ct.dev = calloc(n, sizeof(*t->ct.dev));
	t->ct.host_off = calloc(n, sizeof(*t->ct.host_off));
	for (size_t i = 0; i < n; i++) {
		off[i] = bytes;
		bytes += (t->l.counts[i] * 4 + 511) & ~(uint64_t)511;
		t->ct.host_off[i] = t->ct.total;
		t->ct.total += t->l.counts[i];
	}
	char *base;
	CUDA(cudaMalloc((void **)&base, bytes));
	for (size_t i = 0; i < n; i++)
		t->ct.dev[i] = (float *)(base + off[i]);
	free(off);
	CUDA(cudaMallocHost((void **)&t->ct.in, t->ct.total * 4));
	CUDA(cudaMallocHost((void **)&t->ct.out, t->ct.total * 4));
}

static void start(struct trainer *t)
{
	t->ct.program = PROGRAM;
	t->ct.n = t->l.n;
	t->ct.names = t->l.names;
	t->ct.counts = t->l.counts;
	cuda_trainer_connect(&t->ct, t->o.socket, t->o.rank, t->o.device, 30000);
	allocate(t);
	cuda_trainer_register(&t->ct);
}

static atomic_bool produced; /* the step's last gradients are on the GPU */
static atomic_bool first_back; /* check_overlap saw the first bucket back */
static atomic_bool gate_timed_out;

static void CUDART_CB set_produced(void *arg)
{
	(void)arg;
	atomic_store(&produced, true);
}

/* --overlap: the last batch of the backward pass waits on the stream
 * until the first bucket is back. gradsyncd that waited for the trainer's
 * latest mark (not the bucket's own) would wait for this batch: the gate
 * then opens only after 60 s, and check_overlap fails. No timing the test
 * does not control decides it. */
static void CUDART_CB wait_first_bucket(void *arg)
{
	(void)arg;
	for (int i = 0; i < 60000 && !atomic_load(&first_back); i++)
		usleep(1000);
	if (!atomic_load(&first_back))
		atomic_store(&gate_timed_out, true);
}

/* This step's gradients, written on the stream behind the delay, marked
 * ready eight at a time in backpropagation order without waiting. With
 * --overlap each batch of eight comes batch_ms after the one before, as a
 * backward pass makes them, all queued at once (the host runs ahead of
 * the GPU, as autograd's hooks do), the last behind wait_first_bucket. */
static void produce_and_mark(struct trainer *t, const struct step_ref *p, unsigned step)
{
	uintptr_t ms = step == t->o.stall_step ? 5000 : t->o.delay_ms;
	CUDA(cudaLaunchHostFunc(t->ct.stream, cuda_trainer_sleep, (void *)ms));
	atomic_store(&produced, false);
	atomic_store(&first_back, false);
	atomic_store(&gate_timed_out, false);
	uint32_t batch[8];
	size_t k = 0;
	for (size_t q = 0; q < t->l.n; q++) {
		/* --overlap: in registration order, the plan's (the order its
		 * buckets launch in); else from the last tensor back. */
		size_t j = t->o.batch_ms ? q : t->l.n - 1 - q;
		if (k == 0 && t->o.batch_ms) {
			CUDA(cudaLaunchHostFunc(t->ct.stream, cuda_trainer_sleep,
						(void *)(uintptr_t)t->o.batch_ms));
			if (q + 8 >= t->l.n) /* the last batch */
				CUDA(cudaLaunchHostFunc(t->ct.stream, wait_first_bucket, NULL));
		}
		CUDA(cudaMemcpyAsync(t->ct.dev[j], t->ct.in + t->ct.host_off[j], t->l.counts[j] * 4,
				     cudaMemcpyHostToDevice, t->ct.stream));
		if (produces(p, t->o.global_rank, j)) {
			batch[k++] = (uint32_t)j;
		} else {
			uint32_t one = (uint32_t)j;
			GS(t->ct.c, gs_cuda_mark_absent(t->ct.c, &one, 1, t->ct.stream));
		}
		if (k == 8 || (k > 0 && q + 1 == t->l.n)) {
			GS(t->ct.c, gs_cuda_mark_ready(t->ct.c, batch, k, t->ct.stream));
			k = 0;
		}
	}
	CUDA(cudaLaunchHostFunc(t->ct.stream, set_produced, NULL));
}

/* --overlap: the first bucket must come back reduced while later
 * gradients are still being produced: gradsyncd waited for that bucket's
 * own gradients, not for the trainer's latest mark. */
static int check_overlap(struct trainer *t)
{
	struct gs_step_result res;
	int r;
	while ((r = gs_step_poll(t->ct.c, &res)) == GS_EAGAIN && gs_buckets_done(t->ct.c) == 0)
		usleep(1000);
	bool early = gs_buckets_done(t->ct.c) > 0 && !atomic_load(&produced);
	atomic_store(&first_back, true); /* opens the gate */
	if (!early || atomic_load(&gate_timed_out)) {
		printf("FAIL overlap: the first bucket came back only once every gradient was produced\n");
		return 1;
	}
	printf("overlap: a bucket came back while the backward pass still ran\n");
	fflush(stdout);
	return 0;
}

/* After an aborted step each tensor holds the reduced result or, bit for
 * bit, this trainer's own gradient: never a mix, never half a launch. */
static uint64_t check_aborted(struct trainer *t, const struct step_ref *p)
{
	size_t reduced = 0;
	for (size_t j = 0; j < t->l.n; j++) {
		bool red = gs_tensor_reduced(t->ct.c, j);
		reduced += red;
		for (uint64_t i = t->ct.host_off[j]; i < t->ct.host_off[j] + t->l.counts[j]; i++) {
			float want = red ? reference(p, j, i) : t->ct.in[i];
			if (!same(want, t->ct.out[i])) {
				fprintf(stderr, "emu-trainer: aborted step %u: tensor %zu (%s) is %s, but element %" PRIu64 " is %a, want %a\n",
					p->step, j, t->l.names[j], red ? "reduced" : "not reduced",
					i - t->ct.host_off[j], (double)t->ct.out[i], (double)want);
				return 1;
			}
		}
	}
	printf("ABORTED step %u as expected: %s; %zu of %zu tensors reduced, the others hold their own gradients\n",
	       p->step, gs_last_error(t->ct.c), reduced, t->l.n);
	fflush(stdout);
	return 0;
}

static const char *wire_name(enum gs_wire_dtype w)
{
	return w == GS_WIRE_DTYPE_FP16 ? "fp16" : w == GS_WIRE_DTYPE_BF16 ? "bf16" : "fp32";
}

static int run(struct trainer *t)
{
	/* gradsyncd's scale factors, as gs_settings_scales derives them. */
	double world = t->ct.info.world_size, pre = t->ct.info.predivide_factor;
	struct step_ref p = {
		.w = t->ct.info.wire_dtype,
		.world = t->ct.info.world_size,
		.prescale = (float)(1.0 / pre),
		.postscale = (float)(t->ct.info.op == GS_OP_AVERAGE ? pre / world : pre),
		.absent = t->o.absent,
	};
	uint64_t bad = 0, clipped = 0, nonfinite = 0;
	for (unsigned s = t->o.first_step; s < t->o.first_step + t->o.steps; s++) {
		p.step = s;
		for (size_t j = 0; j < t->l.n; j++)
			for (uint64_t i = t->ct.host_off[j]; i < t->ct.host_off[j] + t->l.counts[j]; i++)
				t->ct.in[i] = handed(&p, t->o.global_rank, j, i);
		struct gs_step_options so = GS_STEP_OPTIONS_INIT;
		so.clipping = s == t->o.clip_step;
		so.clip_value = CLIP;
		so.bucket_events = t->o.batch_ms > 0;
		GS(t->ct.c, gs_step_begin(t->ct.c, &so));
		produce_and_mark(t, &p, s);
		if (t->o.batch_ms && check_overlap(t))
			return 1;
		struct gs_step_result res;
		int r = cuda_trainer_collect(&t->ct, 60000, &res);
		p.step = s;
		p.clip = so.clipping;
		if (r == GS_EABORTED && s == t->o.abort_step) {
			if (check_aborted(t, &p))
				return 1;
			continue; /* the next step must be right again */
		}
		if (r != GS_OK || s == t->o.abort_step) {
			fprintf(stderr, "emu-trainer: step %u: %s\n", s,
				r != GS_OK ? gs_last_error(t->ct.c) : "completed, but was to be aborted");
			return 1;
		}
		bad += check_step(t, &p, &res);
		printf("step %u done\n", s);
		fflush(stdout);
		clipped += res.clipped;
		nonfinite += res.nonfinite;
	}
	if (bad) {
		printf("FAIL rank %u %s: %" PRIu64 " mismatches\n", t->o.global_rank,
		       wire_name(p.w), bad);
		return 1;
	}
	printf("PASS rank %u of %u %s: %u steps of %zu tensors (%" PRIu64 " elements), bitwise equal to the reference; %" PRIu64 " clipped, %" PRIu64 " non-finite\n",
	       t->o.global_rank, p.world, wire_name(p.w), t->o.steps, t->l.n, t->ct.total, clipped,
	       nonfinite);
	return 0;
}

int main(int argc, char **argv)
{
	struct trainer t;
	memset(&t, 0, sizeof(t));
	parse(argc, argv, &t.o);
	if (layout_file_read(t.o.layout, &t.l) < 0)
		return 2;
	start(&t);
	if (t.o.hold) {
		printf("REGISTERED\n");
		fflush(stdout);
		pause(); /* the test kills it: a trainer that dies holding handles */
	}
	int rc = run(&t);
	if (t.o.linger) {
		printf("LINGERING\n");
		fflush(stdout);
		pause(); /* its job stays, for the test to look at the daemon */
	}
	gs_close(t.ct.c);
	CUDA(cudaStreamDestroy(t.ct.stream));
	CUDA(cudaFreeHost(t.ct.in));
	CUDA(cudaFreeHost(t.ct.out));
	CUDA(cudaFree(t.ct.dev[0]));
	free(t.ct.dev);
	free(t.ct.host_off);
	layout_file_free(&t.l);
	return rc;
}
