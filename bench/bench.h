/*
 * What the benchmark programs share: order statistics, child processes
 * and the CSV of every measurement. Gradient layouts come from
 * layouts/layout_file.h, the clock from common/clock.h.
 */
#ifndef GS_BENCH_H
#define GS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "clock.h"
#include "layout_file.h"

/* An option's value: a decimal number in [min, max] into *out. Returns 0,
 * or -1 when s is not one. */
int bench_parse_uint(const char *s, unsigned long min, unsigned long max, unsigned long *out);

/* ---- Order statistics -------------------------------------------------- */

struct bench_stats {
	size_t n;
	double median, p10, p90, min, max, mean;
};

/* Percentiles with linear interpolation between order statistics; x is
 * not modified. All zero for n == 0. */
void bench_stats(const double *x, size_t n, struct bench_stats *out);

/* ---- Child processes --------------------------------------------------- */

/* Starts argv[0] with argv; its stdout and stderr go to log (appended),
 * or stay the caller's when log is NULL; with keep_stderr, only stdout
 * goes to log. The child dies with the caller. Returns its pid or -1. */
pid_t bench_spawn(const char *const *argv, const char *log, bool keep_stderr);
/* bench_spawn with the variables env (NAME=value, NULL ended) set in the
 * child only. */
pid_t bench_spawn_env(const char *const *argv, const char *const *env, const char *log,
		      bool keep_stderr);

/* Forks a child that runs fn(arg) and exits with its return value; it
 * ignores SIGPIPE and dies with the caller. Returns its pid or -1. */
pid_t bench_fork(int (*fn)(void *arg), void *arg);

/* Waits up to timeout_ms for pid; kills it (SIGKILL) past that. Returns
 * its exit status, 128 + signal when a signal ended it, or -1 when it
 * overran and was killed. */
int bench_wait(pid_t pid, int timeout_ms);

/* True while pid runs (it is not reaped). */
bool bench_alive(pid_t pid);

/* SIGTERM, then SIGKILL after grace_ms; reaps it. */
void bench_stop(pid_t pid, int grace_ms);

/* Zeroed memory shared with children forked later; NULL on failure. */
void *bench_shared_alloc(size_t bytes);
void bench_shared_free(void *p, size_t bytes);

/* A TCP port on 127.0.0.1 that was free a moment ago, or -1. */
int bench_free_port(void);

/* ---- Measurements ------------------------------------------------------ */

/* One row of the CSV of every measurement. */
struct bench_row {
	const char *section; /* sync, kernels, control */
	const char *what;    /* the layout, kernel or path measured */
	const char *system;  /* gradsync, gloo-fp32, gloo-fp16, memcpy, ... */
	unsigned nodes, trainers;
	int rank;	/* global rank, or -1 where it has none */
	long iteration; /* step or repetition, from 1 */
	double ms;
	uint64_t bytes; /* fp32 bytes the measurement covers */
};

#define BENCH_CSV_HEADER "section,what,system,nodes,trainers,rank,iteration,ms,bytes"

void bench_csv_row(FILE *f, const struct bench_row *r);

#endif
