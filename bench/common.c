#include "bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int bench_parse_uint(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (*s == '\0' || *s == '-' || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* ---- Order statistics -------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double quantile(const double *sorted, size_t n, double q)
{
	double pos = q * (double)(n - 1);
	size_t lo = (size_t)floor(pos);
	size_t hi = lo + 1 < n ? lo + 1 : lo;
	double frac = pos - (double)lo;
	return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

void bench_stats(const double *x, size_t n, struct bench_stats *out)
{
	memset(out, 0, sizeof(*out));
	double *s = n ? malloc(n * sizeof(*s)) : NULL;
	if (!s)
		return;
	memcpy(s, x, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	out->n = n;
	out->median = quantile(s, n, 0.5);
	out->p10 = quantile(s, n, 0.1);
	out->p90 = quantile(s, n, 0.9);
	out->min = s[0];
	out->max = s[n - 1];
	for (size_t i = 0; i < n; i++)
		out->mean += s[i] / (double)n;
	free(s);
}

/* ---- Child processes --------------------------------------------------- */

/* Forks once stdio is flushed (so that the child does not print the
 * caller's buffered output again); the child dies with the caller. */
static pid_t fork_child(void)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	return pid;
}

pid_t bench_spawn(const char *const *argv, const char *log, bool keep_stderr)
{
	return bench_spawn_env(argv, NULL, log, keep_stderr);
}

pid_t bench_spawn_env(const char *const *argv, const char *const *env, const char *log,
		      bool keep_stderr)
{
	pid_t pid = fork_child();
	if (pid != 0)
		return pid;
	if (log) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			if (!keep_stderr)
				dup2(fd, 2);
		}
	}
	for (size_t i = 0; env && env[i]; i++)
		putenv((char *)env[i]);
	execv(argv[0], (char *const *)argv);
	fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

pid_t bench_fork(int (*fn)(void *arg), void *arg)
{
	pid_t pid = fork_child();
	if (pid != 0)
		return pid;
	signal(SIGPIPE, SIG_IGN);
	int rc = fn(arg);
	fflush(stdout);
	fflush(stderr);
	_exit(rc < 0 || rc > 125 ? 125 : rc);
}

static int decode(int ws)
{
	return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

int bench_wait(pid_t pid, int timeout_ms)
{
	double deadline = gs_now_ms() + timeout_ms;
	int ws;
	for (;;) {
		pid_t r = waitpid(pid, &ws, WNOHANG);
		if (r == pid)
			return decode(ws);
		if (r < 0 && errno != EINTR)
			return -1;
		if (gs_now_ms() > deadline)
			break;
		nanosleep(&(struct timespec){0, 5000000}, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &ws, 0);
	return -1;
}

bool bench_alive(pid_t pid)
{
	return pid > 0 && kill(pid, 0) == 0 && waitpid(pid, NULL, WNOHANG) == 0;
}

void bench_stop(pid_t pid, int grace_ms)
{
	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	bench_wait(pid, grace_ms);
}

void *bench_shared_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void bench_shared_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes);
}

int bench_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* ---- Measurements ------------------------------------------------------ */

void bench_csv_row(FILE *f, const struct bench_row *r)
{
	fprintf(f, "%s,%s,%s,%u,%u,%d,%ld,%.6f,%" PRIu64 "\n", r->section, r->what, r->system,
		r->nodes, r->trainers, r->rank, r->iteration, r->ms, r->bytes);
}
