/*
 * gradsync-bench-gloo-rank: one rank of gradsync-bench's Gloo baseline
 * (sync_gloo.c: DDP-style buckets, fp32 then fp16) as a process of its
 * own, for ranks that gradsync-bench cannot fork itself: one per network
 * namespace of scripts/netcluster.sh (bench/cluster.sh). The ranks meet
 * through a file store in a directory they all see; each one's Gloo device
 * listens on --address. Writes 'system,rank,step,ms' per timed step.
 *
 * With --small E instead of --layout, the small-bucket baseline
 * (small_gloo.c, bench/small-buckets.sh): --steps calls of an all-reduce
 * of E elements, each timed, writing 'system,rank,call,us'; with
 * --sched-batch as well, under SCHED_BATCH (small_gloo.c says why).
 */
#include <signal.h>
#include <stdlib.h>

#include "gloo_baseline.h"
#include "options.h"

static void usage(FILE *f)
{
	fprintf(f, "Usage: gradsync-bench-gloo-rank --rank R --size N --store DIR --address A\n"
		   "                                (--layout FILE | --small E) --csv FILE\n"
		   "                                [--steps K] [--warmup W] [--sched-batch]\n"
		   "\n"
		   "One rank of the Gloo baseline (fp32 buckets, then fp16 buckets). The N ranks\n"
		   "share the file store DIR (an existing directory, empty at first); A is this\n"
		   "rank's address (its Gloo device's). Steps default to 20, warm-up to 3.\n"
		   "With --small E: K all-reduces of E elements (fp32, then fp16), each timed,\n"
		   "written as 'system,rank,call,us'; with --sched-batch, run SCHED_BATCH.\n");
}

struct options {
	unsigned rank, size, steps, warmup, small;
	bool sched_batch;
	const char *store, *address, *layout, *csv;
};

static int parse_args(int argc, char **argv, struct options *o)
{
	const struct bench_option opts[] = {
	    BENCH_UINT("rank", &o->rank, 0, 63),
	    BENCH_UINT("size", &o->size, 1, 64),
	    BENCH_STRING("store", &o->store),
	    BENCH_STRING("address", &o->address),
	    BENCH_STRING("layout", &o->layout),
	    BENCH_STRING("csv", &o->csv),
	    BENCH_UINT("steps", &o->steps, 1, 100000),
	    BENCH_UINT("warmup", &o->warmup, 0, 100000),
	    BENCH_UINT("small", &o->small, 1, 1ul << 20),
	    BENCH_FLAG("sched-batch", &o->sched_batch),
	    BENCH_OPTIONS_END,
	};
	int r = bench_options_parse(argc, argv, opts);
	if (r > 0) {
		usage(stdout);
		return 0;
	}
	if (r < 0 || optind < argc || !o->store || !o->address || !o->layout == !o->small ||
	    (o->sched_batch && !o->small) || !o->csv || o->rank >= o->size) {
		usage(stderr);
		return 2;
	}
	return -1;
}

static int small_main(const struct options *o)
{
	FILE *csv = fopen(o->csv, "w");
	if (!csv) {
		perror(o->csv);
		return 1;
	}
	int rc = small_gloo_rank(o->store, o->address, o->rank, o->size, o->small, o->warmup,
				 o->steps, o->sched_batch, csv);
	if (fclose(csv) != 0)
		rc = 1;
	return rc;
}

int main(int argc, char **argv)
{
	struct options o = {.steps = 20, .warmup = 3};
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	signal(SIGPIPE, SIG_IGN);
	if (o.small)
		return small_main(&o);
	struct layout_file l;
	if (layout_file_read(o.layout, &l) < 0)
		return 1;
	struct bench_config c = {
	    .nodes = o.size, .trainers = 1, .steps = o.steps, .warmup = o.warmup};
	size_t n = (size_t)GLOO_SYSTEMS * o.size * o.steps;
	double *times = calloc(n, sizeof(*times));
	FILE *csv = times ? fopen(o.csv, "w") : NULL;
	rc = csv ? sync_gloo_rank(&c, &l, o.store, o.address, o.rank, o.size, times) : 1;
	for (unsigned s = 0; rc == 0 && s < GLOO_SYSTEMS; s++)
		for (unsigned k = 0; k < o.steps; k++)
			fprintf(csv, "%s,%u,%u,%.6f\n", gloo_systems[s].name, o.rank, k + 1,
				times[(s * o.size + o.rank) * o.steps + k]);
	if (csv && fclose(csv) != 0)
		rc = 1;
	if (!csv)
		perror(o.csv);
	free(times);
	layout_file_free(&l);
	return rc;
}
