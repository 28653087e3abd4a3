#include "ranks.h"

#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static void run_child(int rank, int n, rank_fn fn, void *arg)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGPIPE, SIG_IGN);
	int rc = fn(rank, n, arg);
	fflush(stdout);
	fflush(stderr);
	/* _exit: the parent's atexit handlers and cmocka state are not ours. */
	_exit(rc < 0 || rc > 125 ? 125 : rc);
}

int ranks_start(struct ranks *r, int n, rank_fn fn, void *arg)
{
	r->n = 0;
	if (n < 1 || n > RANKS_MAX)
		return -1;
	/* Unflushed output would be printed once per child too. */
	fflush(stdout);
	fflush(stderr);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid == 0)
			run_child(i, n, fn, arg);
		if (pid < 0) {
			int status[RANKS_MAX];
			for (int k = 0; k < r->n; k++)
				ranks_kill(r, k);
			ranks_wait(r, 1000, status);
			return -1;
		}
		r->pid[r->n++] = pid;
	}
	return 0;
}

static int decode(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	return 128 + WTERMSIG(wstatus);
}

int ranks_wait(struct ranks *r, int timeout_ms, int status[])
{
	double deadline = gs_now_ms() + timeout_ms;
	int left = 0, overran = 0;
	for (int i = 0; i < r->n; i++)
		left += r->pid[i] > 0;
	while (left > 0 && gs_now_ms() < deadline) {
		for (int i = 0; i < r->n; i++) {
			int ws;
			if (r->pid[i] > 0 && waitpid(r->pid[i], &ws, WNOHANG) == r->pid[i]) {
				status[i] = decode(ws);
				r->pid[i] = 0;
				left--;
			}
		}
		nanosleep(&(struct timespec){0, 5000000}, NULL);
	}
	for (int i = 0; i < r->n; i++) {
		if (r->pid[i] <= 0)
			continue;
		kill(r->pid[i], SIGKILL);
		waitpid(r->pid[i], NULL, 0);
		r->pid[i] = 0;
		status[i] = -1;
		overran++;
	}
	return overran;
}

void ranks_kill(struct ranks *r, int rank)
{
	if (rank >= 0 && rank < r->n && r->pid[rank] > 0)
		kill(r->pid[rank], SIGKILL);
}

void *shared_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void shared_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes);
}
