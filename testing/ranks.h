/*
 * The ranks of a test group as real processes: fork one child per rank,
 * wait for them with a deadline, kill and reap whatever overruns it, so that
 * no test can hang or leave a process behind.
 */
#ifndef GS_TEST_RANKS_H
#define GS_TEST_RANKS_H

#include <stddef.h>
#include <sys/types.h>

#define RANKS_MAX 8

struct ranks {
	int n;
	pid_t pid[RANKS_MAX];
};

/* A rank's body: its return value (0 for success, 1..125 for a failure the
 * body chose) becomes the child's exit status. */
typedef int (*rank_fn)(int rank, int size, void *arg);

/* Forks n children running fn(rank, n, arg). Each child ignores SIGPIPE
 * (as gradsyncd does) and dies with its parent. Returns 0, or -1 when a
 * fork failed (the children already started are killed and reaped). */
int ranks_start(struct ranks *r, int n, rank_fn fn, void *arg);

/* Waits up to timeout_ms for every child; SIGKILLs and reaps the rest.
 * status[i]: the exit status, 128 + signal for a child killed by a signal,
 * or -1 for one that overran. Returns how many overran. */
int ranks_wait(struct ranks *r, int timeout_ms, int status[]);

/* SIGKILLs one rank (it is reaped by ranks_wait). */
void ranks_kill(struct ranks *r, int rank);

/* Zeroed memory shared between the parent and children forked after this
 * call (MAP_SHARED | MAP_ANONYMOUS); NULL on failure. */
void *shared_alloc(size_t bytes);
void shared_free(void *p, size_t bytes);

#endif
