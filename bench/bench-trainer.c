/*
 * gradsync-bench-trainer: a lean trainer that only times steps. It
 * registers a layout's gradients with gradsyncd in backpropagation order
 * (the file's order reversed), fills them once, and then, every step,
 * begins it, marks the tensors ready in batches as backpropagation would
 * produce them, and waits for the reduced result. It prints, or writes as
 * CSV, the wall time of each step from gs_step_begin to the return of
 * gs_step_wait.
 *
 * Nothing is recomputed between steps: with the default average the
 * gradients stay the same values from step to step, so nothing overflows
 * however many steps run. Correctness is the example trainer's job; this
 * one only checks that the daemon saw no non-finite values.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gradsync.h"
#include "options.h"

#define WAIT_TIMEOUT_MS 120000

struct options {
	const char *socket;
	const char *layout;
	unsigned rank, steps, warmup, batch;
	const char *csv;
	const char *progress; /* a label: print progress to stderr */
	const char *phases;   /* where the node's time per phase goes */
};

#define MAX_PHASES 8

/* The daemon's time per bucket phase (its metrics), summed over buckets. */
struct phases {
	int n;
	char name[MAX_PHASES][32];
	double seconds[MAX_PHASES];
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: gradsync-bench-trainer --socket PATH --layout FILE [options]\n"
		   "\n"
		   "  --rank R       local rank on this node (default 0)\n"
		   "  --steps K      timed steps (default 20)\n"
		   "  --warmup W     untimed steps first (default 3)\n"
		   "  --batch N      tensors per gs_mark_ready call (default 8)\n"
		   "  --csv FILE     write 'rank,step,ms,daemon_ms,wire_bytes' per timed step\n"
		   "  --progress L   print progress to stderr, labelled L\n"
		   "  --phases FILE  write the daemon's time per step in each bucket phase\n"
		   "                 over the timed steps (from its metrics) as 'phase,ms'\n"
		   "\n"
		   "Prints the median, p10 and p90 step time. Exit status: 0 ok, 1 gradsync\n"
		   "error, 2 usage.\n");
}

static int parse_args(int argc, char **argv, struct options *o)
{
	const struct bench_option opts[] = {
	    BENCH_STRING("socket", &o->socket),
	    BENCH_STRING("layout", &o->layout),
	    BENCH_UINT("rank", &o->rank, 0, 63),
	    BENCH_UINT("steps", &o->steps, 1, 1000000),
	    BENCH_UINT("warmup", &o->warmup, 0, 1000000),
	    BENCH_UINT("batch", &o->batch, 1, 1u << 20),
	    BENCH_STRING("csv", &o->csv),
	    BENCH_STRING("progress", &o->progress),
	    BENCH_STRING("phases", &o->phases),
	    BENCH_OPTIONS_END,
	};
	int r = bench_options_parse(argc, argv, opts);
	if (r > 0) {
		usage(stdout);
		return 0;
	}
	if (r < 0 || optind < argc || !o->layout) {
		usage(stderr);
		return 2;
	}
	return -1;
}

static int failed(gs_client *c, const char *what, int r)
{
	fprintf(stderr, "gradsync-bench-trainer: %s: %s: %s\n", what, gs_strerror(r),
		gs_last_error(c));
	return 1;
}

/* Registers the layout in backpropagation order and fills it once with
 * small values of both signs. */
static int setup(gs_client *c, const struct layout_file *l)
{
	struct gs_tensor_spec *specs = calloc(l->n, sizeof(*specs));
	if (!specs)
		return failed(c, "register", GS_ENOMEM);
	for (size_t j = 0; j < l->n; j++) {
		size_t t = l->n - 1 - j;
		specs[j] = (struct gs_tensor_spec){l->names[t], l->counts[t], GS_FLOAT32, -1, 0};
	}
	int r = gs_register(c, specs, l->n);
	free(specs);
	if (r < 0)
		return failed(c, "gs_register", r);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t j = 0; j < l->n; j++) {
		float *data = gs_tensor_data(c, j);
		for (uint64_t e = 0; e < l->counts[l->n - 1 - j]; e++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			data[e] = (float)((int32_t)(x >> 40) - (1 << 23)) * 0x1p-26f;
		}
	}
	return 0;
}

/* One step; *ms is its wall time, *res the daemon's figures. */
static int step(gs_client *c, size_t n, unsigned batch, uint32_t *idx, double *ms,
		struct gs_step_result *res)
{
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	double t0 = gs_now_ms();
	int r = gs_step_begin(c, &so);
	if (r < 0)
		return failed(c, "gs_step_begin", r);
	for (size_t t = 0; t < n; t += batch) {
		size_t k = n - t < batch ? n - t : batch;
		for (size_t i = 0; i < k; i++)
			idx[i] = (uint32_t)(t + i);
		r = gs_mark_ready(c, idx, k);
		if (r < 0)
			return failed(c, "gs_mark_ready", r);
	}
	r = gs_step_wait(c, WAIT_TIMEOUT_MS, res);
	*ms = gs_now_ms() - t0;
	if (r < 0)
		return failed(c, "gs_step_wait", r);
	if (res->nonfinite) {
		fprintf(stderr,
			"gradsync-bench-trainer: step %" PRIu64 ": %" PRIu64 " non-finite values\n",
			res->step, res->nonfinite);
		return 1;
	}
	return 0;
}

/* Reads the phase counters through a control connection; n = 0 when the
 * daemon has none (or cannot be asked). */
static void read_phases(const char *socket, struct phases *ph)
{
	gs_client *ctl = NULL;
	char *text = NULL;
	ph->n = 0;
	if (gs_control_connect(socket, 5000, &ctl) != GS_OK ||
	    gs_metrics_get(ctl, 5000, &text) != GS_OK) {
		gs_close(ctl);
		return;
	}
	for (char *line = strtok(text, "\n"); line && ph->n < MAX_PHASES;
	     line = strtok(NULL, "\n")) {
		if (sscanf(line, "gradsync_bucket_phase_seconds_total{phase=\"%31[^\"]\"} %lf",
			   ph->name[ph->n], &ph->seconds[ph->n]) == 2)
			ph->n++;
	}
	gs_metrics_free(text);
	gs_close(ctl);
}

static void write_phases(const char *path, const struct phases *a, const struct phases *b,
			 unsigned steps)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	for (int i = 0; i < a->n && i < b->n; i++)
		fprintf(f, "%s,%.6f\n", b->name[i], (b->seconds[i] - a->seconds[i]) * 1e3 / steps);
	fclose(f);
}

static int run(gs_client *c, const struct options *o, size_t n, FILE *csv)
{
	struct phases before = {0}, after = {0};
	struct gs_session_info info;
	gs_session_info(c, &info);
	uint32_t *idx = calloc(o->batch, sizeof(*idx));
	double *times = calloc(o->steps, sizeof(*times));
	int rc = idx && times ? 0 : failed(c, "steps", GS_ENOMEM);
	unsigned every = o->steps >= 10 ? o->steps / 5 : 1;
	for (unsigned s = 0; rc == 0 && s < o->warmup + o->steps; s++) {
		struct gs_step_result res;
		double ms;
		if (o->phases && s == o->warmup)
			read_phases(o->socket, &before);
		rc = step(c, n, o->batch, idx, &ms, &res);
		if (rc != 0 || s < o->warmup)
			continue;
		unsigned k = s - o->warmup;
		times[k] = ms;
		if (csv)
			fprintf(csv, "%u,%u,%.6f,%.6f,%" PRIu64 "\n", info.global_rank, k + 1, ms,
				(double)res.duration_ns / 1e6, res.wire_bytes);
		if (o->progress && ((k + 1) % every == 0 || k + 1 == o->steps))
			fprintf(stderr, "    %s: step %u/%u %.2f ms\n", o->progress, k + 1,
				o->steps, ms);
	}
	if (rc == 0 && o->phases) {
		read_phases(o->socket, &after);
		write_phases(o->phases, &before, &after, o->steps);
	}
	if (rc == 0) {
		struct bench_stats st;
		bench_stats(times, o->steps, &st);
		printf("rank %u: %u steps, median %.3f ms, p10 %.3f ms, p90 %.3f ms\n",
		       info.global_rank, o->steps, st.median, st.p10, st.p90);
	}
	free(idx);
	free(times);
	return rc;
}

int main(int argc, char **argv)
{
	struct options o = {.steps = 20, .warmup = 3, .batch = 8};
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct layout_file l;
	if (layout_file_read(o.layout, &l) < 0)
		return 1;
	FILE *csv = NULL;
	if (o.csv && !(csv = fopen(o.csv, "w"))) {
		perror(o.csv);
		layout_file_free(&l);
		return 1;
	}
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = o.socket;
	co.local_rank = o.rank;
	co.timeout_ms = 60000;
	gs_client *c = NULL;
	rc = gs_connect(&co, &c);
	if (rc < 0)
		rc = failed(NULL, "gs_connect", rc);
	else
		rc = setup(c, &l);
	if (rc == 0)
		rc = run(c, &o, l.n, csv);
	gs_close(c);
	if (csv && fclose(csv) != 0)
		rc = 1;
	layout_file_free(&l);
	return rc;
}
