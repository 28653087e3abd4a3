/*
 * The parts of gradsync-bench, each a function that measures one thing and
 * appends every measurement to the CSV: sync time per step through
 * gradsyncd (sync_gradsync.c) and through Gloo in-process, DDP-style
 * (sync_gloo.c); the conversion kernels against memcpy (kernels.c); the
 * control path against a bare Unix-socket ping-pong (control.c).
 */
#ifndef GS_BENCH_SUITE_H
#define GS_BENCH_SUITE_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench.h"

struct bench_config {
	unsigned nodes, trainers; /* N daemons, M trainers each */
	unsigned steps, warmup;	  /* timed and untimed steps per system */
	unsigned reps;		  /* repetitions of each kernel */
	unsigned roundtrips;	  /* of the control path */
	const char *daemon;	  /* gradsyncd */
	const char *trainer;	  /* gradsync-bench-trainer */
	const char *tmp;	  /* scratch directory of this run */
	FILE *csv;		  /* every measurement */
};

#define MAX_PHASES 8

/* ---- Daemons (cluster.c) ---------------------------------------------- */

#define BENCH_MAX_NODES 16

/* The daemons of one job of `nodes` nodes of `local` trainers each; the
 * job itself its trainers carry (bench_job_env). */
struct bench_cluster {
	unsigned nodes;
	unsigned local;
	int port; /* where the daemons reach each other: node 0's rendezvous */
	pid_t daemon[BENCH_MAX_NODES];
	char socket[BENCH_MAX_NODES][108];
	char log[BENCH_MAX_NODES][256];
};

/* The job's variables (GRADSYNC_*, libgradsync's launch environment) for
 * a trainer of node `node`: vars[] holds them, env the NULL-ended list. */
struct bench_job_env {
	char vars[4][64];
	const char *env[5];
};
void bench_job_env(const struct bench_cluster *cl, unsigned node, struct bench_job_env *out);

/* Starts `nodes` gradsyncd (host backend, `local` trainers each) with their
 * sockets and logs in dir, joined on loopback, and waits until each
 * listens. Returns 0, or -1 after printing why (and the log). */
int bench_cluster_start(struct bench_cluster *cl, const struct bench_config *c, const char *dir,
			unsigned nodes, unsigned local);
/* SIGTERM to each daemon, SIGKILL after 10 s. */
void bench_cluster_stop(struct bench_cluster *cl);
/* Copies a file (a log) to stderr. */
void bench_dump(const char *path);

/* ---- The measurements ---------------------------------------------------- */

/* Step times of one system on one layout: per step, the slowest rank. */
struct sync_result {
	char system[32];
	struct bench_stats st;
	uint64_t bytes; /* fp32 gradient bytes per step and rank */
	int ok;
	/* gradsync: node 0's daemon time per step in each bucket phase. */
	int nphases;
	char phase[MAX_PHASES][32];
	double phase_ms[MAX_PHASES];
};

#define GLOO_SYSTEMS 2 /* gloo-fp32, gloo-fp16 */

/* gradsync: N daemons joined on loopback, N x M bench trainers. Returns 0
 * or -1 (after printing why and the logs). */
int sync_gradsync(const struct bench_config *c, const struct layout_file *l,
		  struct sync_result *out);

/* Gloo, DDP-style, N x M processes in one group: fp32 buckets, then fp16
 * buckets. Returns 0 or -1. */
int sync_gloo(const struct bench_config *c, const struct layout_file *l,
	      struct sync_result out[GLOO_SYSTEMS]);

/* One rank of that baseline in this process, for ranks started elsewhere
 * (in other network namespaces: bench/gloo-rank.c): rank `rank` of
 * `world`, its Gloo device on `host`, meeting the others through the file
 * store in directory `store`. Step times (ms) go to
 * times[(system * world + rank) * c->steps + step]. Returns 0 or 1. */
int sync_gloo_rank(const struct bench_config *c, const struct layout_file *l, const char *store,
		   const char *host, unsigned rank, unsigned world, double *times);

/* The small-bucket baseline (small_gloo.c): rank `rank` of `world` (its
 * Gloo device on `host`, meeting the others through the file store in
 * directory `store`) all-reduces `elements` elements reps times after
 * warmup untimed calls, fp32 then fp16, and writes 'system,rank,call,us'
 * for each timed call to csv; with sched_batch, under SCHED_BATCH (its
 * systems named -batch). Returns 0 or 1 (after printing why). */
int small_gloo_rank(const char *store, const char *host, unsigned rank, unsigned world,
		    uint64_t elements, unsigned warmup, unsigned reps, bool sched_batch, FILE *csv);

struct kernel_result {
	char name[48];
	struct bench_stats st; /* ms per call */
	unsigned buffers;      /* fp32 buffers of elements it reads or writes */
	double ratio;	       /* median time / (buffers x median memcpy time) */
};

#define KERNEL_RESULTS 8

/* memcpy, pack, unpack; and for M = max(2, trainers) trainers: M packs then
 * the local reduce, the fused gs_pack_sum, an unpack to M destinations; on
 * one fusion buffer of elements. Returns how many results it wrote, or -1. */
int bench_kernels(const struct bench_config *c, size_t elements,
		  struct kernel_result out[KERNEL_RESULTS]);

struct control_result {
	struct bench_stats daemon;   /* one-element bucket through gradsyncd, ms */
	struct bench_stats pingpong; /* bare Unix-socket round trip, ms */
	struct bench_stats inside;   /* the daemon's own time for the step, ms */
};

/* A step of a one-element bucket through a daemon of one trainer, and a
 * ping-pong over a socketpair with a second process, taking turns, so both
 * see the same machine. Returns 0 or -1. */
int bench_control(const struct bench_config *c, struct control_result *out);

#endif
