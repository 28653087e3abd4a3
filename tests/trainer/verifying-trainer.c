/*
 * gradsync-verifying-trainer: the tests' trainer, without a model. It
 * registers a gradient layout read from a file, fills the gradients with
 * inputs that every rank can regenerate, runs steps through gradsyncd and
 * checks each reduced result against its own fp64 reference of all ranks'
 * inputs. The integration tests drive it through its flags; for a short
 * trainer to read, see examples/trainer.c.
 *
 * The inputs x(rank, step, tensor, element) are a splitmix64 hash of
 * (seed, global rank, step, tensor, element); "tensor" is the registration
 * index (backpropagation order). The settings (wire dtype, op, predivide)
 * are the daemon's, from the welcome.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "gradsync.h"
#include "layout_file.h"

#define WAIT_TIMEOUT_MS 60000
/* How long --hold-before-step waits for its SIGUSR1. */
#define HOLD_TIMEOUT_S 300

enum pattern { PATTERN_RANDOM, PATTERN_POW2, PATTERN_OVERFLOW, PATTERN_INF };

struct options {
	const char *socket;
	const char *layout;
	uint32_t rank;
	unsigned steps;
	uint64_t seed;
	bool clipping;
	float clip;
	enum pattern pattern;
	bool exact;
	unsigned batch;
	bool bucket_events;
	bool quiet;
	/* Failure drills (tests): */
	uint64_t first_step;      /* input step of the first step run */
	uint64_t pause_at;        /* step to stop in, after pause_after marks */
	uint64_t pause_after;
	uint64_t pause_for;       /* seconds; 0: until killed */
	uint64_t expect_abort_at; /* step the daemon must abort */
	uint64_t hold_before;     /* step to wait for SIGUSR1 before */
	bool reconnect;           /* survive a daemon restart */
	uint64_t absent;          /* --absent K: tensors no rank, or one, produces */
};

/* What a check needs besides the tensors: the session's arithmetic. */
struct reference {
	const struct options *o;
	uint32_t world;       /* T: every rank of every node */
	uint32_t global_rank;
	uint32_t nodes;
	enum gs_wire_dtype wire;
	double prescale;      /* 1 / predivide */
	double postscale;     /* predivide / world (average) or predivide */
	double u, e;          /* the wire's unit roundoff and subnormal error */
	double limit;         /* |values| from here on overflow the wire */
};

struct step_check {
	uint64_t nonfinite;   /* elements whose reference overflows */
	double worst;         /* max |error| / tolerance */
};

/* The input generator of one rank for one tensor. */
struct gen {
	enum pattern pattern;
	uint64_t key;
	float scale; /* 2^(tensor % 5 - 2) */
	bool big;    /* overflow pattern on global rank 0 */
	bool inf;    /* inf pattern on global rank 0 */
};

struct trainer {
	struct options o;
	struct layout_file layout; /* in model.parameters() order */
	gs_client *c;
	size_t n;           /* tensors, in registration order from here on */
	const char **names;
	uint64_t *counts;
	struct gen *gens;   /* one per rank, for the reference */
	struct reference ref;
	uint32_t local_rank; /* --rank, or what the library derived */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: gradsync-verifying-trainer --layout FILE [options]\n"
		"\n"
		"Registers the gradient tensors of FILE (lines 'name count shape', '#'\n"
		"comments, in model.parameters() order) with gradsyncd, in REVERSED\n"
		"order as backpropagation produces them, then runs steps and checks\n"
		"every reduced element against an fp64 reference of all ranks' inputs.\n"
		"\n"
		"  --socket PATH     gradsyncd's socket (default: $GRADSYNC_SOCKET, else\n"
		"                    " GS_DEFAULT_SOCKET ")\n"
		"  --layout FILE     the gradient layout (required)\n"
		"  --rank R          local rank on this node (default: from the\n"
		"                    environment, as libgradsync derives it, else 0)\n"
		"  --steps K         steps to run (default 5)\n"
		"  --seed S          input seed (default 1)\n"
		"  --clip V          clip gradients to [-V, V] (default: no clipping)\n"
		"  --pattern P       random: uniform in [-2,2] times 2^(tensor %% 5 - 2);\n"
		"                    pow2: +-2^k, k in [-4,3], so fp32 sums are exact;\n"
		"                    overflow: random, but global rank 0's elements with\n"
		"                    index %% 1000 == 0 are 1e6 (fp16 overflows)\n"
		"                    inf: random, but global rank 0's elements with\n"
		"                    index %% 1000 == 0 are +inf (on every wire)\n"
		"  --exact           require bitwise equality (for wire fp32 + pow2 with a\n"
		"                    power-of-two world and predivide)\n"
		"  --batch N         tensors per gs_mark_ready call (default 8)\n"
		"  --bucket-events   ask for BucketDone events and count them\n"
		"  --quiet           print only the final line and errors\n"
		"\n"
		"Failure drills, for tests:\n"
		"  --first-step S    number the first step S (inputs depend on it), as a\n"
		"                    trainer restarted in the middle of a job would\n"
		"  --pause-at-step S --pause-after N\n"
		"                    in step S mark only the first N tensors, print\n"
		"                    'PAUSED', and wait to be killed\n"
		"  --pause-for T     with --pause-at-step: wait T seconds instead, then\n"
		"                    mark the rest (a trainer that is late, not dead)\n"
		"  --hold-before-step S\n"
		"                    before beginning step S print 'HOLDING' and wait for\n"
		"                    SIGUSR1 (up to %d s): a test lets it go on once\n"
		"                    gradsyncd is in the state the test needs\n"
		"  --expect-abort-at S\n"
		"                    step S must be aborted by gradsyncd; then every\n"
		"                    tensor must hold either the reduced result (checked\n"
		"                    against the reference) or its own input, bitwise\n"
		"  --reconnect       when gradsyncd goes away, reconnect (up to 30 s) and\n"
		"                    run the interrupted step again\n"
		"  --absent K        unproduced gradients (gs_mark_absent): tensors with\n"
		"                    index %% K == 0 are absent on every rank, which\n"
		"                    leaves its input there and checks that it stays and\n"
		"                    that gs_tensor_produced says false; %% K == 1 are\n"
		"                    produced by global rank 0 only, %% K == 2 by the\n"
		"                    last global rank only (the others write zeros and\n"
		"                    mark them absent): their result is that rank's\n"
		"                    input alone\n"
		"  -h, --help        show this help\n"
		"\n"
		"Exit status: 0 all steps verified, 1 mismatch or gradsync error,\n"
		"2 usage error.\n", HOLD_TIMEOUT_S);
}

/* ---- options ----------------------------------------------------------- */

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	if (*s == '-' || *s == '\0')
		return false;
	unsigned long long v = strtoull(s, &end, 0);
	if (*end != '\0' || v > max)
		return false;
	*out = v;
	return true;
}

static bool parse_pattern(const char *s, enum pattern *p)
{
	if (strcmp(s, "random") == 0)
		*p = PATTERN_RANDOM;
	else if (strcmp(s, "pow2") == 0)
		*p = PATTERN_POW2;
	else if (strcmp(s, "overflow") == 0)
		*p = PATTERN_OVERFLOW;
	else if (strcmp(s, "inf") == 0)
		*p = PATTERN_INF;
	else
		return false;
	return true;
}

static bool parse_clip(const char *s, float *clip)
{
	char *end;
	float v = strtof(s, &end);
	if (*s == '\0' || *end != '\0' || !(v > 0.0f) || !isfinite(v))
		return false;
	*clip = v;
	return true;
}

enum {
	OPT_SOCKET = 256, OPT_LAYOUT, OPT_RANK, OPT_STEPS, OPT_SEED, OPT_CLIP,
	OPT_PATTERN, OPT_EXACT, OPT_BATCH, OPT_BUCKET_EVENTS, OPT_QUIET,
	OPT_FIRST_STEP, OPT_PAUSE_AT, OPT_PAUSE_AFTER, OPT_PAUSE_FOR, OPT_EXPECT_ABORT,
	OPT_RECONNECT, OPT_HOLD_BEFORE, OPT_ABSENT,
};

static bool parse_one(int opt, const char *arg, struct options *o)
{
	uint64_t v;
	switch (opt) {
	case OPT_SOCKET: o->socket = arg; return true;
	case OPT_LAYOUT: o->layout = arg; return true;
	case OPT_RANK:
		if (!parse_u64(arg, UINT32_MAX, &v))
			return false;
		o->rank = (uint32_t)v;
		return true;
	case OPT_STEPS:
		if (!parse_u64(arg, 1000000, &v) || v == 0)
			return false;
		o->steps = (unsigned)v;
		return true;
	case OPT_SEED: return parse_u64(arg, UINT64_MAX, &o->seed);
	case OPT_CLIP: o->clipping = true; return parse_clip(arg, &o->clip);
	case OPT_PATTERN: return parse_pattern(arg, &o->pattern);
	case OPT_EXACT: o->exact = true; return true;
	case OPT_BATCH:
		if (!parse_u64(arg, 1u << 20, &v) || v == 0)
			return false;
		o->batch = (unsigned)v;
		return true;
	case OPT_BUCKET_EVENTS: o->bucket_events = true; return true;
	case OPT_QUIET: o->quiet = true; return true;
	case OPT_FIRST_STEP: return parse_u64(arg, 1u << 30, &o->first_step) && o->first_step > 0;
	case OPT_PAUSE_AT: return parse_u64(arg, 1u << 30, &o->pause_at);
	case OPT_PAUSE_AFTER: return parse_u64(arg, UINT32_MAX, &o->pause_after);
	case OPT_PAUSE_FOR: return parse_u64(arg, 3600, &o->pause_for);
	case OPT_EXPECT_ABORT: return parse_u64(arg, 1u << 30, &o->expect_abort_at);
	case OPT_RECONNECT: o->reconnect = true; return true;
	case OPT_HOLD_BEFORE: return parse_u64(arg, 1u << 30, &o->hold_before) && o->hold_before > 0;
	case OPT_ABSENT: return parse_u64(arg, 1u << 20, &o->absent) && o->absent >= 3;
	}
	return false;
}

/* Returns -1 when parsed, else the exit status. */
static int parse_args(int argc, char **argv, struct options *o)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "layout", required_argument, NULL, OPT_LAYOUT },
		{ "rank", required_argument, NULL, OPT_RANK },
		{ "steps", required_argument, NULL, OPT_STEPS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "clip", required_argument, NULL, OPT_CLIP },
		{ "pattern", required_argument, NULL, OPT_PATTERN },
		{ "exact", no_argument, NULL, OPT_EXACT },
		{ "batch", required_argument, NULL, OPT_BATCH },
		{ "bucket-events", no_argument, NULL, OPT_BUCKET_EVENTS },
		{ "quiet", no_argument, NULL, OPT_QUIET },
		{ "first-step", required_argument, NULL, OPT_FIRST_STEP },
		{ "pause-at-step", required_argument, NULL, OPT_PAUSE_AT },
		{ "pause-after", required_argument, NULL, OPT_PAUSE_AFTER },
		{ "pause-for", required_argument, NULL, OPT_PAUSE_FOR },
		{ "expect-abort-at", required_argument, NULL, OPT_EXPECT_ABORT },
		{ "reconnect", no_argument, NULL, OPT_RECONNECT },
		{ "hold-before-step", required_argument, NULL, OPT_HOLD_BEFORE },
		{ "absent", required_argument, NULL, OPT_ABSENT },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int opt, index = -1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", opts, &index)) != -1) {
		if (opt == 'h') {
			usage(stdout);
			return 0;
		}
		if (opt == '?' || opt == ':') {
			fprintf(stderr, "gradsync-verifying-trainer: unknown or incomplete option: %s\n",
				argv[optind - 1]);
			return 2;
		}
		if (!parse_one(opt, optarg, o)) {
			fprintf(stderr, "gradsync-verifying-trainer: bad value for --%s: %s\n",
				opts[index].name, optarg);
			return 2;
		}
		index = -1;
	}
	if (optind < argc || !o->layout) {
		fprintf(stderr, "gradsync-verifying-trainer: %s\n",
			optind < argc ? "unexpected argument" : "--layout is required");
		return 2;
	}
	return -1;
}

/* ---- inputs ------------------------------------------------------------ */

#define GOLDEN UINT64_C(0x9e3779b97f4a7c15)

static inline uint64_t mix64(uint64_t z)
{
	z += GOLDEN;
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* One key per (seed, rank, step, tensor); elements hash off it, so any
 * trainer regenerates any rank's inputs. */
static uint64_t tensor_key(uint64_t seed, uint32_t rank, uint64_t step,
			   uint32_t tensor)
{
	uint64_t k = mix64(seed);
	k = mix64(k ^ rank);
	k = mix64(k ^ step);
	return mix64(k ^ tensor);
}

static struct gen make_gen(const struct options *o, uint32_t rank,
			   uint64_t step, uint32_t tensor)
{
	static const float scales[5] = { 0.25f, 0.5f, 1.0f, 2.0f, 4.0f };
	struct gen g = {
		.pattern = o->pattern,
		.key = tensor_key(o->seed, rank, step, tensor),
		.scale = scales[tensor % 5],
		.big = o->pattern == PATTERN_OVERFLOW && rank == 0,
		.inf = o->pattern == PATTERN_INF && rank == 0,
	};
	return g;
}

/* Every value is exact in fp32, so the trainer's buffer and the reference
 * see the same number. */
static inline float gen_value(const struct gen *g, uint64_t e)
{
	static const float pow2[8] = { 0.0625f, 0.125f, 0.25f, 0.5f,
				       1.0f,    2.0f,   4.0f,  8.0f };
	uint64_t h = mix64(g->key + e * GOLDEN);
	if (g->pattern == PATTERN_POW2)
		return (h & 1) ? -pow2[(h >> 1) & 7] : pow2[(h >> 1) & 7];
	if (g->big && e % 1000 == 0)
		return 1e6f;
	if (g->inf && e % 1000 == 0)
		return INFINITY;
	/* 24 random bits: uniform in [-2, 2) on a 2^-22 grid. */
	int32_t u = (int32_t)(h >> 40) - (1 << 23);
	return (float)u * 0x1p-22f * g->scale;
}

static inline float clip_value(const struct options *o, float x)
{
	if (!o->clipping)
		return x;
	return x > o->clip ? o->clip : x < -o->clip ? -o->clip : x;
}

/* --absent K: whether tensor t has no rank's gradient at all. */
static bool produced_by_none(const struct trainer *tr, size_t t)
{
	return tr->o.absent && t % tr->o.absent == 0;
}

/* --absent K: whether global rank `rank` produces tensor t's gradient. */
static bool produces(const struct trainer *tr, uint32_t rank, size_t t)
{
	if (!tr->o.absent)
		return true;
	switch (t % tr->o.absent) {
	case 0: return false;
	case 1: return rank == 0;
	case 2: return rank == tr->ref.world - 1;
	default: return true;
	}
}

/* What this rank holds in tensor t: its input, but zeros for a gradient
 * that another rank produces and this one does not (it adds nothing). */
static bool holds_zeros(const struct trainer *tr, size_t t)
{
	return !produced_by_none(tr, t) && !produces(tr, tr->ref.global_rank, t);
}

/* Writes this rank's inputs of `step`; returns how many elements clipping
 * changes, which the daemon must report back. */
static uint64_t fill(const struct trainer *tr, uint64_t step)
{
	uint64_t clipped = 0;
	for (size_t t = 0; t < tr->n; t++) {
		float *data = gs_tensor_data(tr->c, t);
		struct gen g = make_gen(&tr->o, tr->ref.global_rank, step,
					(uint32_t)t);
		bool zeros = holds_zeros(tr, t);
		for (uint64_t e = 0; e < tr->counts[t]; e++) {
			float x = zeros ? 0.0f : gen_value(&g, e);
			data[e] = x;
			clipped += tr->o.clipping && fabsf(x) > tr->o.clip;
		}
	}
	return clipped;
}

/* ---- the reference ----------------------------------------------------- */

static bool mismatch(const struct trainer *tr, uint64_t step, size_t t,
		     uint64_t e, float got, double want, double tol)
{
	fprintf(stderr,
		"MISMATCH in step %" PRIu64 ": tensor '%s' (registration index %zu) "
		"element %" PRIu64 ": got %.9g, ",
		step, tr->names[t], t, e, (double)got);
	if (isfinite(want))
		fprintf(stderr, "expected %.9g, tolerance %.3g\n", want, tol);
	else
		fprintf(stderr, "expected a non-finite value (the wire overflows)\n");
	return false;
}

static bool same_bits(float a, float b)
{
	uint32_t x, y;
	memcpy(&x, &a, sizeof(x));
	memcpy(&y, &b, sizeof(y));
	return x == y;
}

/*
 * Checks one reduced tensor against all ranks' inputs, in double:
 * v_r = clip(x_r) * prescale, S = sum_r v_r, result = S * postscale, where
 * a rank that did not produce the tensor (--absent) adds nothing.
 *
 * The tolerance of an element, with T ranks and the wire's unit roundoff u
 * and subnormal error e, over N nodes: each rank's v_r is rounded once when
 * cast to the wire (u |v_r| + e); each node sums its trainers in fp32 and
 * rounds once, then the ring all-reduce between nodes rounds once per hop,
 * N - 1 hops: N roundings of partial sums (each u |partial| + e, and every
 * |partial| <= sum_r |v_r|); fp32 accumulation and the final scaling add
 * at most T + N + 2 roundings of 2^-24. So
 *     tol = postscale * (((N+1) u + (T+N+2) 2^-24) * sum_r |v_r| + (T+N) e).
 * An element whose inputs or sum reach the wire's overflow threshold must
 * come back non-finite instead.
 */
static bool check_tensor(const struct trainer *tr, uint64_t step, size_t t,
			 struct step_check *sc)
{
	const struct reference *ref = &tr->ref;
	const uint32_t T = ref->world, N = ref->nodes;
	const double k = (N + 1) * ref->u + (T + N + 2) * 0x1p-24;
	const double abs_err = (T + N) * ref->e;
	const float *got = gs_tensor_data(tr->c, t);
	for (uint32_t r = 0; r < T; r++)
		tr->gens[r] = make_gen(&tr->o, r, step, (uint32_t)t);

	for (uint64_t e = 0; e < tr->counts[t]; e++) {
		double s = 0, a = 0;
		bool over = false;
		for (uint32_t r = 0; r < T; r++) {
			if (!produces(tr, r, t))
				continue;
			float x = clip_value(&tr->o, gen_value(&tr->gens[r], e));
			double v = (double)x * ref->prescale;
			s += v;
			a += fabs(v);
			over |= fabs(v) >= ref->limit;
		}
		if (over || fabs(s) >= ref->limit) {
			sc->nonfinite++;
			if (isfinite(got[e]))
				return mismatch(tr, step, t, e, got[e], INFINITY, 0);
			continue;
		}
		double want = s * ref->postscale;
		if (tr->o.exact) {
			if (!same_bits(got[e], (float)want))
				return mismatch(tr, step, t, e, got[e], want, 0);
			continue;
		}
		double tol = ref->postscale * (k * a + abs_err);
		double err = fabs((double)got[e] - want);
		if (!(err <= tol))
			return mismatch(tr, step, t, e, got[e], want, tol);
		if (err > sc->worst * tol)
			sc->worst = err / tol;
	}
	return true;
}

static bool setup_reference(struct trainer *tr)
{
	struct gs_session_info info;
	struct reference *ref = &tr->ref;
	gs_session_info(tr->c, &info);
	double pre = info.predivide_factor;
	if (!(pre > 0) || !isfinite(pre) || info.world_size == 0) {
		fprintf(stderr, "gradsync-verifying-trainer: daemon has predivide %g, world size %u\n",
			pre, info.world_size);
		return false;
	}
	ref->o = &tr->o;
	ref->world = info.world_size;
	ref->global_rank = info.global_rank;
	ref->nodes = info.nodes ? info.nodes : 1;
	ref->wire = info.wire_dtype;
	ref->prescale = 1 / pre;
	ref->postscale = info.op == GS_OP_AVERAGE ? pre / info.world_size : pre;
	switch (info.wire_dtype) {
	case GS_WIRE_DTYPE_FP16: /* overflow from 65520 = (2 - 2^-11) 2^15 on */
		ref->u = 0x1p-11, ref->e = 0x1p-25, ref->limit = 65520.0;
		break;
	case GS_WIRE_DTYPE_BF16: /* from (2 - 2^-8) 2^127, about 3.396e38 */
		ref->u = 0x1p-8, ref->e = 0, ref->limit = 0x1.fep127;
		break;
	default:
		ref->u = 0x1p-24, ref->e = 0, ref->limit = 0x1.ffffffp127;
		break;
	}
	tr->gens = calloc(ref->world, sizeof(*tr->gens));
	return tr->gens != NULL;
}

/* ---- gradsync ---------------------------------------------------------- */

static bool gs_failed(const struct trainer *tr, const char *what, int r)
{
	fprintf(stderr, "gradsync-verifying-trainer: %s: %s (%s): %s\n", what,
		gs_strerror(r), gs_err_name(r), gs_last_error(tr->c));
	return false;
}

/* Registers the layout in reverse: backpropagation yields the last
 * parameters' gradients first. */
static bool register_layout(struct trainer *tr)
{
	const struct layout_file *l = &tr->layout;
	struct gs_tensor_spec *specs = calloc(l->n, sizeof(*specs));
	tr->names = calloc(l->n, sizeof(*tr->names));
	tr->counts = calloc(l->n, sizeof(*tr->counts));
	if (!specs || !tr->names || !tr->counts) {
		free(specs);
		fprintf(stderr, "gradsync-verifying-trainer: out of memory\n");
		return false;
	}
	tr->n = l->n;
	for (size_t j = 0; j < l->n; j++) {
		tr->names[j] = l->names[l->n - 1 - j];
		tr->counts[j] = l->counts[l->n - 1 - j];
		specs[j] = (struct gs_tensor_spec){ .name = tr->names[j],
						    .count = tr->counts[j],
						    .dtype = GS_FLOAT32,
						    .memfd = -1 };
	}
	int r = gs_register(tr->c, specs, l->n);
	free(specs);
	return r < 0 ? gs_failed(tr, "gs_register", r) : true;
}

static const char *wire_name(enum gs_wire_dtype w)
{
	return w == GS_WIRE_DTYPE_FP16 ? "fp16" : w == GS_WIRE_DTYPE_BF16 ? "bf16" : "fp32";
}

static void print_session(const struct trainer *tr)
{
	struct gs_session_info info;
	uint64_t elements = 0;
	gs_session_info(tr->c, &info);
	for (size_t t = 0; t < tr->n; t++)
		elements += tr->counts[t];
	printf("rank %u of %u (node %u, local %u of %u): %zu tensors, %" PRIu64
	       " elements, %zu buckets; wire %s, op %s, predivide %g, pattern %s%s\n",
	       tr->ref.global_rank, info.world_size, info.node_rank, tr->local_rank,
	       info.local_size, tr->n, elements, gs_bucket_count(tr->c),
	       wire_name(info.wire_dtype),
	       info.op == GS_OP_AVERAGE ? "average" : "sum",
	       info.predivide_factor,
	       tr->o.pattern == PATTERN_POW2 ? "pow2"
	       : tr->o.pattern == PATTERN_OVERFLOW ? "overflow"
	       : tr->o.pattern == PATTERN_INF ? "inf" : "random",
	       tr->o.exact ? ", exact" : "");
}

/* Marks one tensor absent (--absent): this rank produced no gradient. */
static bool mark_absent(const struct trainer *tr, size_t t)
{
	uint32_t index = (uint32_t)t;
	int r = gs_mark_absent(tr->c, &index, 1);
	return r >= 0 || r == GS_EABORTED || gs_failed(tr, "gs_mark_absent", r);
}

/* Marks tensors [first, n) ready, in batches, or absent where this rank
 * produces none; false on an error. */
static bool mark_range(const struct trainer *tr, size_t first, size_t n, uint32_t *batch)
{
	size_t k = 0;
	for (size_t t = first; t < n; t++) {
		if (!produces(tr, tr->ref.global_rank, t)) {
			if (!mark_absent(tr, t))
				return false;
		} else {
			batch[k++] = (uint32_t)t;
		}
		if (k == 0 || (k < tr->o.batch && t + 1 < n))
			continue;
		int r = gs_mark_ready(tr->c, batch, k);
		if (r == GS_EABORTED)
			return true; /* the daemon ended the step: the wait says why */
		if (r < 0)
			return gs_failed(tr, "gs_mark_ready", r);
		k = 0;
	}
	return true;
}

/* Marks every tensor ready, in batches, in backpropagation order; in the
 * step of a pause drill only the first pause_after, then waits forever
 * (or pause_for seconds, then marks the rest). */
static bool mark_all(const struct trainer *tr, uint64_t step, uint32_t *batch)
{
	size_t n = tr->n;
	bool drill = tr->o.pause_at == step;
	if (drill && tr->o.pause_after < n)
		n = tr->o.pause_after;
	if (!mark_range(tr, 0, n, batch))
		return false;
	if (!drill)
		return true;
	printf("PAUSED in step %" PRIu64 " after marking %zu of %zu tensors\n", step, n, tr->n);
	fflush(stdout);
	if (tr->o.pause_for == 0)
		for (;;)
			pause();
	sleep((unsigned)tr->o.pause_for);
	return mark_range(tr, n, tr->n, batch);
}

/* Waits for the test's SIGUSR1, blocked since start-up so that one sent
 * before the trainer got here is kept, not lost or fatal. */
static bool hold(uint64_t step)
{
	printf("HOLDING before step %" PRIu64 " until SIGUSR1\n", step);
	fflush(stdout);
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	struct timespec limit = { HOLD_TIMEOUT_S, 0 };
	while (sigtimedwait(&usr1, NULL, &limit) < 0) {
		if (errno == EINTR)
			continue;
		fprintf(stderr, "gradsync-verifying-trainer: no SIGUSR1 within %d s of holding before step %" PRIu64 "\n",
			HOLD_TIMEOUT_S, step);
		return false;
	}
	return true;
}

/* Tensor t holds, bitwise, what this rank wrote there (fill). */
static bool check_own(const struct trainer *tr, uint64_t step, size_t t)
{
	const float *got = gs_tensor_data(tr->c, t);
	struct gen g = make_gen(&tr->o, tr->ref.global_rank, step, (uint32_t)t);
	bool zeros = holds_zeros(tr, t);
	for (uint64_t e = 0; e < tr->counts[t]; e++) {
		float want = zeros ? 0.0f : gen_value(&g, e);
		if (!same_bits(got[e], want))
			return mismatch(tr, step, t, e, got[e], want, 0);
	}
	return true;
}

/* After a completed step: a tensor that no rank produced is reported so
 * and holds this rank's own input (the daemon did not write it back);
 * every other one is reported produced and holds the reduced result. */
static bool check_step(const struct trainer *tr, uint64_t step, struct step_check *sc,
		       size_t *unproduced)
{
	for (size_t t = 0; t < tr->n; t++) {
		bool none = produced_by_none(tr, t);
		if (gs_tensor_produced(tr->c, t) == none) {
			fprintf(stderr, "MISMATCH in step %" PRIu64 ": tensor '%s' (registration index %zu) is reported %s\n",
				step, tr->names[t], t, none ? "produced, though no rank produced it"
							    : "produced by no rank, though one did");
			return false;
		}
		*unproduced += none;
		if (none ? !check_own(tr, step, t) : !check_tensor(tr, step, t, sc))
			return false;
	}
	return true;
}

/* After an aborted step each tensor holds the reduced result or, bitwise,
 * this rank's own input: never a mix. */
static bool check_aborted(const struct trainer *tr, uint64_t step)
{
	size_t reduced = 0;
	struct step_check sc = { 0, 0 };
	for (size_t t = 0; t < tr->n; t++) {
		if (gs_tensor_reduced(tr->c, t)) {
			reduced++;
			if (!check_tensor(tr, step, t, &sc))
				return false;
			continue;
		}
		if (!check_own(tr, step, t))
			return false;
	}
	printf("ABORTED step %" PRIu64 " as expected: %s; %zu of %zu tensors reduced, the others hold their own gradients\n",
	       step, gs_last_error(tr->c), reduced, tr->n);
	return true;
}

/* gradsyncd went away: connect to the next one, up to 30 s. */
static bool reconnect(const struct trainer *tr, uint64_t step)
{
	printf("DISCONNECTED in step %" PRIu64 ": %s\n", step, gs_last_error(tr->c));
	fflush(stdout);
	double deadline = gs_now_ms() + 30000;
	int r;
	while ((r = gs_reconnect(tr->c, 1000)) < 0 && gs_now_ms() < deadline)
		usleep(100000);
	if (r < 0)
		return gs_failed(tr, "gs_reconnect", r);
	printf("RECONNECTED: running step %" PRIu64 " again\n", step);
	return true;
}

/* The daemon's figures against the trainer's own. */
static bool check_figures(const struct trainer *tr,
			  const struct gs_step_result *res,
			  const struct step_check *sc, uint64_t clipped)
{
	bool ok = true;
	if (res->nonfinite != sc->nonfinite) {
		fprintf(stderr, "MISMATCH in step %" PRIu64 ": gradsyncd counts %" PRIu64
			" non-finite values, the reference %" PRIu64 "\n",
			res->step, res->nonfinite, sc->nonfinite);
		ok = false;
	}
	if (res->clipped != clipped) {
		fprintf(stderr, "MISMATCH in step %" PRIu64 ": gradsyncd clipped %" PRIu64
			" elements of this trainer, the trainer counts %" PRIu64 "\n",
			res->step, res->clipped, clipped);
		ok = false;
	}
	if (tr->o.bucket_events && gs_buckets_done(tr->c) != res->buckets) {
		fprintf(stderr, "MISMATCH in step %" PRIu64 ": %u BucketDone events for %u buckets\n",
			res->step, gs_buckets_done(tr->c), res->buckets);
		ok = false;
	}
	return ok;
}

/*
 * The step's gradient norm against one computed here from the reduced
 * tensors: their fp32 values squared and summed in fp64 in plain order.
 * The daemon sums in another fixed order; both add n positive terms, each
 * sum within n * 2^-53 of the exact one, so the sums of squares agree to
 * 2n * 2^-53 relative and the norms to half that. A non-finite value
 * makes both inf, or NaN where a NaN is. The norm's bits go to stdout
 * ("NORM step S BITS") for the tests to compare across trainers and
 * nodes.
 */
static bool check_norm(const struct trainer *tr, const struct gs_step_result *res)
{
	double sumsq = 0;
	uint64_t n = 0;
	for (size_t t = 0; t < tr->n; t++) {
		const float *g = gs_tensor_data(tr->c, t);
		if (!gs_tensor_produced(tr->c, t))
			continue; /* left out of the norm, as torch leaves out a None */
		for (uint64_t e = 0; e < tr->counts[t]; e++)
			sumsq += (double)g[e] * (double)g[e];
		n += tr->counts[t];
	}
	double want = sqrt(sumsq), got = res->grad_norm;
	bool ok = isfinite(want) ? fabs(got - want) <= (double)n * 0x1p-53 * want
				 : (isnan(want) ? isnan(got) : got == want);
	if (!ok)
		fprintf(stderr, "MISMATCH in step %" PRIu64 ": gradsyncd's gradient norm is %.17g, the reference %.17g\n",
			res->step, got, want);
	uint64_t bits;
	memcpy(&bits, &got, sizeof(bits));
	printf("NORM step %" PRIu64 " %016" PRIx64 "\n", res->step, bits);
	return ok;
}

static bool run_step(const struct trainer *tr, uint64_t step,
		     uint32_t *batch, double *step_ms)
{
	uint64_t clipped = fill(tr, step);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	so.clipping = tr->o.clipping;
	so.clip_value = tr->o.clip;
	so.bucket_events = tr->o.bucket_events;

	if (step == tr->o.hold_before && !hold(step))
		return false;
	double t0 = gs_now_ms();
	int r = gs_step_begin(tr->c, &so);
	if (r == GS_OK && !mark_all(tr, step, batch))
		return false;
	struct gs_step_result res;
	double t1 = gs_now_ms();
	if (r == GS_OK)
		r = gs_step_wait(tr->c, WAIT_TIMEOUT_MS, &res);
	double t2 = gs_now_ms();
	if (r == GS_EDISCONNECTED && tr->o.reconnect)
		return reconnect(tr, step) && run_step(tr, step, batch, step_ms);
	if (r == GS_EABORTED && step == tr->o.expect_abort_at)
		return check_aborted(tr, step);
	if (r < 0)
		return gs_failed(tr, "gs_step_wait", r);
	if (step == tr->o.expect_abort_at) {
		fprintf(stderr, "MISMATCH: step %" PRIu64 " was expected to be aborted, but completed\n", step);
		return false;
	}
	*step_ms = t2 - t0;

	struct step_check sc = { 0, 0 };
	size_t unproduced = 0;
	if (!check_step(tr, step, &sc, &unproduced))
		return false;
	if (!check_figures(tr, &res, &sc, clipped) || !check_norm(tr, &res))
		return false;
	if (!tr->o.quiet)
		printf("step %" PRIu64 ": wait %.2f ms, %u buckets, nonfinite %" PRIu64
		       ", clipped %" PRIu64 ", max |error|/tol %.3f, norm %.9g, %zu tensors produced by no rank\n",
		       step, t2 - t1, res.buckets, res.nonfinite, res.clipped,
		       sc.worst, res.grad_norm, unproduced);
	return true;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static bool run(struct trainer *tr)
{
	double *times = calloc(tr->o.steps, sizeof(*times));
	uint32_t *batch = calloc(tr->o.batch, sizeof(*batch));
	bool ok = times && batch;
	for (unsigned s = 0; ok && s < tr->o.steps; s++)
		ok = run_step(tr, tr->o.first_step + s, batch, &times[s]);
	if (ok) {
		qsort(times, tr->o.steps, sizeof(*times), cmp_double);
		unsigned m = tr->o.steps;
		double median = m % 2 ? times[m / 2]
				      : (times[m / 2 - 1] + times[m / 2]) / 2;
		printf("OK: %u steps verified, median step %.2f ms\n", m, median);
	}
	free(times);
	free(batch);
	return ok;
}

static bool connect_session(struct trainer *tr)
{
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = tr->o.socket;
	co.local_rank = tr->o.rank;
	int r = gs_connect(&co, &tr->c);
	if (r < 0)
		return gs_failed(tr, "gs_connect", r);
	/* The rank gs_connect said hello with, from the same derivation. */
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	r = gs_launch_info_get(&co, &li);
	if (r < 0)
		return gs_failed(tr, "gs_launch_info_get", r);
	tr->local_rank = li.local_rank;
	return setup_reference(tr) && register_layout(tr);
}

static void cleanup(struct trainer *tr)
{
	gs_close(tr->c);
	layout_file_free(&tr->layout);
	free(tr->names);
	free(tr->counts);
	free(tr->gens);
}

int main(int argc, char **argv)
{
	struct trainer tr = {
		.o = { .rank = GS_FROM_ENV, .steps = 5, .seed = 1, .clip = 100.0f, .batch = 8,
		       .first_step = 1 },
	};
	/* Whole lines as they happen: tests and operators follow the output. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	int r = parse_args(argc, argv, &tr.o);
	if (r >= 0)
		return r;
	if (tr.o.hold_before) {
		sigset_t usr1;
		sigemptyset(&usr1);
		sigaddset(&usr1, SIGUSR1);
		sigprocmask(SIG_BLOCK, &usr1, NULL);
	}
	bool ok = layout_file_read(tr.o.layout, &tr.layout) == 0 && connect_session(&tr);
	if (ok && !tr.o.quiet)
		print_session(&tr);
	ok = ok && run(&tr);
	cleanup(&tr);
	return ok ? 0 : 1;
}
