/*
 * ops-trainer: a trainer for the operations tests, with inputs the tests
 * can recompute on their own: element i of tensor t on local rank r is
 * ((i * 7 + t * 5 + r * 3) % 11 - 5) / 2, in [-2.5, 2.5]; with --nan, rank
 * 0's element 0 of tensor 0 is NaN. Prints one line per step:
 *   step S status OK|ABORTED buckets B wire W clipped C nonfinite N
 * --abandon-at S marks only tensor 0 in step S and exits (the daemon
 * aborts the step); --hold keeps the connection until stdin closes.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradsync.h"

#define MAX_TENSORS 64

struct opts {
	const char *socket;
	uint32_t rank;
	uint64_t counts[MAX_TENSORS];
	size_t n;
	unsigned steps;
	float clip;
	bool nan;
	unsigned abandon_at;
	bool hold;
};

static int die(const char *what, gs_client *c)
{
	fprintf(stderr, "ops-trainer: %s: %s\n", what, gs_last_error(c));
	return 1;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "socket", required_argument, NULL, 's' }, { "rank", required_argument, NULL, 'r' },
		{ "counts", required_argument, NULL, 'c' }, { "steps", required_argument, NULL, 'k' },
		{ "clip", required_argument, NULL, 'v' },   { "nan", no_argument, NULL, 'n' },
		{ "abandon-at", required_argument, NULL, 'a' },
		{ "hold", no_argument, NULL, 'h' },        { NULL, 0, NULL, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (c) {
		case 's': o->socket = optarg; break;
		case 'r': o->rank = (uint32_t)atoi(optarg); break;
		case 'k': o->steps = (unsigned)atoi(optarg); break;
		case 'v': o->clip = strtof(optarg, NULL); break;
		case 'n': o->nan = true; break;
		case 'a': o->abandon_at = (unsigned)atoi(optarg); break;
		case 'h': o->hold = true; break;
		case 'c':
			for (char *p = optarg; *p && o->n < MAX_TENSORS; p += *p == ',')
				o->counts[o->n++] = strtoull(p, &p, 10);
			break;
		default: return -1;
		}
	}
	return o->socket && o->n > 0 ? 0 : -1;
}

static void fill(gs_client *c, const struct opts *o)
{
	for (size_t t = 0; t < o->n; t++) {
		float *x = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < o->counts[t]; i++)
			x[i] = (float)((int)((i * 7 + t * 5 + o->rank * 3) % 11) - 5) * 0.5f;
	}
	if (o->nan && o->rank == 0)
		gs_tensor_data(c, 0)[0] = NAN;
}

static int step(gs_client *c, const struct opts *o, unsigned s)
{
	fill(c, o);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	so.clipping = o->clip > 0;
	so.clip_value = o->clip;
	if (gs_step_begin(c, &so) != GS_OK)
		return die("step begin", c);
	uint32_t idx[MAX_TENSORS];
	size_t n = s == o->abandon_at ? 1 : o->n;
	for (size_t t = 0; t < n; t++)
		idx[t] = (uint32_t)t;
	if (gs_mark_ready(c, idx, n) != GS_OK)
		return die("mark ready", c);
	if (s == o->abandon_at) {
		printf("ABANDON %u\n", s);
		fflush(stdout);
		exit(0); /* the connection goes with the process */
	}
	printf("MARKED %u\n", s);
	fflush(stdout);
	struct gs_step_result r;
	int rc = gs_step_wait(c, 60000, &r);
	if (rc != GS_OK && rc != GS_EABORTED)
		return die("step wait", c);
	printf("step %" PRIu64 " status %s buckets %u wire %" PRIu64 " clipped %" PRIu64
	       " nonfinite %" PRIu64 "\n",
	       r.step, rc == GS_OK ? "OK" : "ABORTED", r.buckets, r.wire_bytes, r.clipped,
	       r.nonfinite);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .steps = 1 };
	if (parse(argc, argv, &o) < 0) {
		fprintf(stderr, "usage: ops-trainer --socket PATH --counts N[,N...] [--rank R] "
				"[--steps K] [--clip V] [--nan] [--abandon-at S] [--hold]\n");
		return 2;
	}
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = o.socket;
	co.local_rank = o.rank;
	gs_client *c;
	if (gs_connect(&co, &c) != GS_OK)
		return die("connect", NULL);
	struct gs_tensor_spec specs[MAX_TENSORS];
	char names[MAX_TENSORS][24];
	for (size_t t = 0; t < o.n; t++) {
		snprintf(names[t], sizeof(names[t]), "t%zu", t);
		specs[t] = (struct gs_tensor_spec){ names[t], o.counts[t], GS_FLOAT32, -1, 0 };
	}
	if (gs_register(c, specs, o.n) != GS_OK)
		return die("register", c);
	printf("REGISTERED tensors %zu buckets %zu\n", gs_tensor_count(c), gs_bucket_count(c));
	fflush(stdout);
	for (unsigned s = 1; s <= o.steps; s++)
		if (step(c, &o, s) != 0)
			return 1;
	if (o.hold) {
		printf("HOLDING\n");
		fflush(stdout);
		while (getchar() != EOF)
			;
	}
	gs_close(c);
	return 0;
}
