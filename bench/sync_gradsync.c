/*
 * Sync time per step through gradsync: one gradsyncd per node, joined
 * through a rendezvous on loopback as scripts/demo.sh does, and M bench
 * trainers on each. Default settings: fp16 wire, average, the default
 * threshold and fusion buffer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "suite.h"

#define MAX_RANKS 64

/* Reads one trainer's CSV into times[rank][step - 1]; returns its global
 * rank or -1. */
static int read_trainer_csv(const char *path, unsigned steps, double *times)
{
	FILE *f = fopen(path, "r");
	unsigned rank = 0, step, seen = 0;
	double ms, daemon_ms;
	unsigned long long wire;
	if (!f)
		return -1;
	while (fscanf(f, "%u,%u,%lf,%lf,%llu\n", &rank, &step, &ms, &daemon_ms, &wire) == 5) {
		if (rank >= MAX_RANKS || step < 1 || step > steps)
			break;
		times[rank * steps + step - 1] = ms;
		seen++;
	}
	fclose(f);
	return seen == steps ? (int)rank : -1;
}

struct job {
	unsigned ranks;
	pid_t pid[MAX_RANKS];
	char csv[MAX_RANKS][600];
	char log[MAX_RANKS][600];
	char phases[600]; /* node 0's */
};

static int spawn_trainers(struct job *jb, const struct bench_config *c,
			  const struct bench_cluster *cl, unsigned local, const char *layout_path,
			  const char *label, const char *dir)
{
	char steps[16], warmup[16];
	snprintf(steps, sizeof(steps), "%u", c->steps);
	snprintf(warmup, sizeof(warmup), "%u", c->warmup);
	jb->ranks = 0;
	snprintf(jb->phases, sizeof(jb->phases), "%s/phases-0.csv", dir);
	for (unsigned node = 0; node < cl->nodes; node++) {
		struct bench_job_env job;
		bench_job_env(cl, node, &job);
		for (unsigned r = 0; r < local; r++) {
			unsigned k = jb->ranks;
			char rank[16];
			snprintf(rank, sizeof(rank), "%u", r);
			snprintf(jb->csv[k], sizeof(jb->csv[k]), "%s/trainer-%u-%u.csv", dir, node,
				 r);
			snprintf(jb->log[k], sizeof(jb->log[k]), "%s/trainer-%u-%u.log", dir, node,
				 r);
			const char *argv[] = {c->trainer,
					      "--socket",
					      cl->socket[node],
					      "--layout",
					      layout_path,
					      "--rank",
					      rank,
					      "--steps",
					      steps,
					      "--warmup",
					      warmup,
					      "--csv",
					      jb->csv[k],
					      k == 0 ? "--phases" : NULL,
					      jb->phases,
					      "--progress",
					      label,
					      NULL};
			/* Rank 0 shows progress (and its errors) on our stderr. */
			jb->pid[k] = bench_spawn_env(argv, job.env, jb->log[k], k == 0);
			if (jb->pid[k] < 0)
				return -1;
			jb->ranks++;
		}
	}
	return 0;
}

/* Node 0's time per step in each phase, as its first trainer wrote it. */
static void read_phases(const char *path, struct sync_result *out)
{
	FILE *f = fopen(path, "r");
	out->nphases = 0;
	while (f && out->nphases < MAX_PHASES &&
	       fscanf(f, "%31[^,],%lf\n", out->phase[out->nphases], &out->phase_ms[out->nphases]) ==
		   2)
		out->nphases++;
	if (f)
		fclose(f);
}

/* Runs a job of `steps` steps on an already started cluster and collects
 * each rank's step times (times[rank * steps + step]) and, when out is
 * not NULL, node 0's phases. */
static int run_job(const struct bench_config *c, const struct bench_cluster *cl, unsigned local,
		   const char *layout_path, const char *label, const char *dir, int timeout_ms,
		   double *times, struct sync_result *out)
{
	struct job jb;
	int rc = spawn_trainers(&jb, c, cl, local, layout_path, label, dir);
	double deadline = gs_now_ms() + timeout_ms;
	for (unsigned k = 0; k < jb.ranks; k++) {
		int left = (int)(deadline - gs_now_ms());
		int st = bench_wait(jb.pid[k], left > 0 ? left : 1);
		if (st != 0) {
			fprintf(stderr, "gradsync-bench: trainer %u %s (status %d)\n", k,
				st < 0 ? "overran its time and was killed" : "failed", st);
			bench_dump(jb.log[k]);
			rc = -1;
		}
	}
	for (unsigned k = 0; rc == 0 && k < jb.ranks; k++) {
		if (read_trainer_csv(jb.csv[k], c->steps, times) < 0) {
			fprintf(stderr, "gradsync-bench: bad results in %s\n", jb.csv[k]);
			rc = -1;
		}
	}
	if (rc < 0)
		for (unsigned i = 0; i < cl->nodes; i++)
			bench_dump(cl->log[i]);
	else if (out)
		read_phases(jb.phases, out);
	return rc;
}

static int write_layout_file(const char *path, const struct layout_file *l)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	for (size_t i = 0; i < l->n; i++)
		fprintf(f, "%s %llu %llu\n", l->names[i], (unsigned long long)l->counts[i],
			(unsigned long long)l->counts[i]);
	return fclose(f) == 0 ? 0 : -1;
}

int sync_gradsync(const struct bench_config *c, const struct layout_file *l,
		  struct sync_result *out)
{
	unsigned world = c->nodes * c->trainers;
	char dir[512], layout_path[600], label[128];
	memset(out, 0, sizeof(*out));
	snprintf(out->system, sizeof(out->system), "gradsync");
	out->bytes = l->total * sizeof(float);
	snprintf(dir, sizeof(dir), "%s/gradsync-%s", c->tmp, l->name);
	snprintf(layout_path, sizeof(layout_path), "%s/layout.txt", dir);
	snprintf(label, sizeof(label), "gradsync %s", l->name);
	if (world > MAX_RANKS || (mkdir(dir, 0700) < 0 && errno != EEXIST) ||
	    write_layout_file(layout_path, l) < 0) {
		fprintf(stderr, "gradsync-bench: cannot prepare %s\n", dir);
		return -1;
	}
	double *times = calloc((size_t)world * c->steps, sizeof(*times));
	struct bench_cluster cl;
	if (!times || bench_cluster_start(&cl, c, dir, c->nodes, c->trainers) < 0) {
		free(times);
		return -1;
	}
	int rc = run_job(c, &cl, c->trainers, layout_path, label, dir, 600000, times, out);
	bench_cluster_stop(&cl);
	double *worst = calloc(c->steps, sizeof(*worst));
	if (rc == 0 && worst) {
		for (unsigned s = 0; s < c->steps; s++) {
			for (unsigned r = 0; r < world; r++) {
				double ms = times[r * c->steps + s];
				struct bench_row row = {"sync",	     l->name,	  "gradsync",
							c->nodes,    c->trainers, (int)r,
							(long)s + 1, ms,	  out->bytes};
				bench_csv_row(c->csv, &row);
				if (ms > worst[s])
					worst[s] = ms;
			}
		}
		bench_stats(worst, c->steps, &out->st);
		out->ok = 1;
	}
	free(worst);
	free(times);
	return rc == 0 && out->ok ? 0 : -1;
}
