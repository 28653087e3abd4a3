/*
 * gradsync-bench-gloo-algo: one rank timing the daemon's all-reduce between
 * nodes alone, algorithm by algorithm (Gloo's ring, our recursive doubling
 * and Rabenseifner, Gloo's classic halving-doubling) and size by size, in
 * fp32 with the kernels' sums: the points bench/model.py fits its
 * alpha-beta model to.
 * One process per node of scripts/netcluster.sh (bench/scale.sh); the
 * ranks meet through a file store in a directory they all see.
 *
 * Before each (algorithm, size) the ranks line up on a one-element
 * all-reduce, then run W untimed and K timed calls back to back. Writes
 * 'algo,nodes,rank,bytes,call,us' per timed call.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "errors.h"
#include "file_store.h"
#include "options.h"

#define MAX_SIZES 32
#define TIMEOUT_MS 60000

static void usage(FILE *f)
{
	fprintf(f, "Usage: gradsync-bench-gloo-algo --rank R --size N --store DIR --address A\n"
		   "                                --csv FILE [--bytes B1,B2,...] [--calls K]\n"
		   "                                [--warmup W] [--algos ring,doubling,"
		   "rabenseifner,halving-doubling]\n"
		   "\n"
		   "Times gs_gloo_allreduce_algo of B bytes of fp32 for each algorithm and size\n"
		   "(defaults: 4,1024,16384,262144,1048576,4194304 bytes; 20 calls after 3).\n");
}

struct options {
	unsigned rank, size, calls, warmup;
	const char *store, *address, *csv, *algos;
	size_t bytes[MAX_SIZES];
	int nbytes;
};

static int parse_bytes(char *list, void *to)
{
	struct options *o = to;
	o->nbytes = 0;
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		unsigned long v;
		if (o->nbytes == MAX_SIZES || bench_parse_uint(tok, 4, 1ul << 30, &v) < 0)
			return 1;
		o->bytes[o->nbytes++] = v / 4 * 4;
	}
	return o->nbytes == 0;
}

static int parse_args(int argc, char **argv, struct options *o)
{
	const struct bench_option opts[] = {
	    BENCH_UINT("rank", &o->rank, 0, 4095),
	    BENCH_UINT("size", &o->size, 1, 4096),
	    BENCH_STRING("store", &o->store),
	    BENCH_STRING("address", &o->address),
	    BENCH_STRING("csv", &o->csv),
	    BENCH_PARSE("bytes", parse_bytes, o),
	    BENCH_UINT("calls", &o->calls, 1, 100000),
	    BENCH_UINT("warmup", &o->warmup, 0, 100000),
	    BENCH_STRING("algos", &o->algos),
	    BENCH_OPTIONS_END,
	};
	int r = bench_options_parse(argc, argv, opts);
	if (r > 0) {
		usage(stdout);
		return 0;
	}
	if (r < 0 || optind < argc || !o->store || !o->address || !o->csv || o->rank >= o->size) {
		usage(stderr);
		return 2;
	}
	return -1;
}

static int algo_of(const char *name)
{
	static const int algos[] = {GS_GLOO_ALGO_RING, GS_GLOO_ALGO_DOUBLING,
				    GS_GLOO_ALGO_RABENSEIFNER, GS_GLOO_ALGO_HALVING_DOUBLING};
	for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
		if (strcmp(name, gs_gloo_algo_name(algos[i])) == 0)
			return algos[i];
	return -1;
}

/* Times one algorithm at one size; writes its calls to csv. */
static int time_one(struct gs_gloo *g, const struct options *o, int algo, size_t bytes,
		    float *buf, FILE *csv)
{
	char err[512];
	float one = 1;
	size_t n = bytes / 4;
	int rc = gs_gloo_allreduce_algo(g, GS_WIRE_F32, &one, 1, GS_GLOO_ALGO_DOUBLING,
					TIMEOUT_MS, err, sizeof(err));
	for (unsigned k = 0; rc == GS_OK && k < o->warmup + o->calls; k++) {
		for (size_t i = 0; i < n; i++)
			buf[i] = (float)((o->rank + i) % 7);
		double t0 = gs_now_ms();
		rc = gs_gloo_allreduce_algo(g, GS_WIRE_F32, buf, n, algo, TIMEOUT_MS, err,
					    sizeof(err));
		double us = (gs_now_ms() - t0) * 1e3;
		if (rc == GS_OK && k >= o->warmup)
			fprintf(csv, "%s,%u,%u,%zu,%u,%.3f\n", gs_gloo_algo_name(algo), o->size,
				o->rank, bytes, k - o->warmup + 1, us);
	}
	if (rc != GS_OK)
		fprintf(stderr, "gradsync-bench-gloo-algo: rank %u: %s\n", o->rank, err);
	return rc == GS_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
	static char default_bytes[] = "4,1024,16384,262144,1048576,4194304";
	struct options o = {.calls = 20,
			    .warmup = 3,
			    .algos = "ring,doubling,rabenseifner,halving-doubling"};
	parse_bytes(default_bytes, &o);
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	signal(SIGPIPE, SIG_IGN);
	size_t most = 0;
	for (int i = 0; i < o.nbytes; i++)
		most = o.bytes[i] > most ? o.bytes[i] : most;
	float *buf = malloc(most);
	FILE *csv = buf ? fopen(o.csv, "w") : NULL;
	if (!csv) {
		perror(o.csv);
		free(buf);
		return 1;
	}
	struct gs_gloo_store_ops store = file_store(o.store);
	struct gs_gloo *g = NULL;
	char err[512];
	rc = gs_gloo_create(&store, (int)o.rank, (int)o.size, o.address, TIMEOUT_MS, &g, err,
			    sizeof(err));
	if (rc != GS_OK)
		fprintf(stderr, "gradsync-bench-gloo-algo: rank %u: %s\n", o.rank, err);
	char *algos = strdup(o.algos);
	char *save = NULL;
	for (char *a = strtok_r(algos, ",", &save); rc == GS_OK && a; a = strtok_r(NULL, ",", &save)) {
		int algo = algo_of(a);
		if (algo < 0) {
			fprintf(stderr, "gradsync-bench-gloo-algo: unknown algorithm '%s'\n", a);
			rc = 2;
		}
		for (int i = 0; rc == GS_OK && i < o.nbytes; i++)
			rc = time_one(g, &o, algo, o.bytes[i], buf, csv);
	}
	free(algos);
	gs_gloo_destroy(g);
	if (fclose(csv) != 0)
		rc = 1;
	free(buf);
	return rc == GS_OK ? 0 : rc < 0 ? 1 : rc;
}
