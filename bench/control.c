/*
 * The control path: a step of a one-element bucket through gradsyncd
 * (BeginStep and GradientsReady to the daemon, the bucket through its
 * worker thread, StepDone back) against the least two processes can do
 * over a Unix socket: a 16-byte message there and back. This process is
 * the trainer and the pinging side of both, and they take turns, one round
 * trip each, so that both see the same machine: on a small virtual machine
 * a wake-up costs a few microseconds while the other core is busy and tens
 * of microseconds when it sleeps, which would swamp a comparison of two
 * runs made one after the other.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradsync.h"
#include "suite.h"

#define MESSAGE_BYTES 16
#define WAIT_MS 10000

struct pingpong {
	int fd; /* ours; the echo process has the other end */
	pid_t echo;
};

static int full_io(int fd, char *buf, size_t len, bool write_it)
{
	size_t done = 0;
	while (done < len) {
		ssize_t r =
		    write_it ? write(fd, buf + done, len - done) : read(fd, buf + done, len - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

static int echo_fd = -1, ping_fd = -1;

/* The other process: answers every message until the socket closes. */
static int echo(void *arg)
{
	char buf[MESSAGE_BYTES];
	close(ping_fd); /* else it would never see the end of the stream */
	while (full_io(echo_fd, buf, sizeof(buf), false) == 0)
		if (full_io(echo_fd, buf, sizeof(buf), true) < 0)
			return 1;
	return 0;
}

static int pingpong_start(struct pingpong *p)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	ping_fd = sv[0];
	echo_fd = sv[1];
	p->fd = sv[0];
	p->echo = bench_fork(echo, NULL);
	close(sv[1]);
	return p->echo < 0 ? -1 : 0;
}

static int pingpong_once(struct pingpong *p)
{
	char buf[MESSAGE_BYTES] = "ping";
	if (full_io(p->fd, buf, sizeof(buf), true) < 0)
		return -1;
	return full_io(p->fd, buf, sizeof(buf), false);
}

static int pingpong_stop(struct pingpong *p)
{
	close(p->fd);
	return p->echo > 0 && bench_wait(p->echo, WAIT_MS) == 0 ? 0 : -1;
}

/* A trainer of one one-element tensor. */
static int trainer_start(const char *socket, gs_client **c)
{
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = socket;
	co.local_rank = 0;
	co.job_id = "";
	int r = gs_connect(&co, c);
	if (r < 0) {
		fprintf(stderr, "gradsync-bench: gs_connect: %s\n", gs_last_error(NULL));
		return -1;
	}
	struct gs_tensor_spec spec = {"one", 1, GS_FLOAT32, -1, 0};
	r = gs_register(*c, &spec, 1);
	if (r < 0) {
		fprintf(stderr, "gradsync-bench: gs_register: %s\n", gs_last_error(*c));
		return -1;
	}
	gs_tensor_data(*c, 0)[0] = 1.0f;
	return 0;
}

/* One step; *inside is the daemon's own time for it (from the first
 * readiness to StepDone), in ms. */
static int step_once(gs_client *c, double *inside)
{
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	struct gs_step_result res = {0};
	uint32_t idx = 0;
	int r = gs_step_begin(c, &so);
	if (r == GS_OK)
		r = gs_mark_ready(c, &idx, 1);
	if (r == GS_OK)
		r = gs_step_wait(c, WAIT_MS, &res);
	if (r < 0)
		fprintf(stderr, "gradsync-bench: a one-element step: %s\n", gs_last_error(c));
	*inside = (double)res.duration_ns / 1e6;
	return r;
}

static void rows(const struct bench_config *c, const char *what, const char *system,
		 const double *t, unsigned n, uint64_t bytes)
{
	for (unsigned i = 0; i < n; i++) {
		struct bench_row row = {"control", what,	system, 1,    1,
					-1,	   (long)i + 1, t[i],	bytes};
		bench_csv_row(c->csv, &row);
	}
}

/* Warm-up rounds first, then n timed rounds of one step and one ping-pong. */
static int take_turns(gs_client *gc, struct pingpong *pp, unsigned n, double *daemon,
		      double *inside, double *pingpong)
{
	unsigned warmup = n / 10;
	for (unsigned i = 0; i < warmup + n; i++) {
		double t0 = gs_now_ms(), in;
		if (step_once(gc, &in) < 0)
			return -1;
		double t1 = gs_now_ms();
		if (pingpong_once(pp) < 0)
			return -1;
		double t2 = gs_now_ms();
		if (i >= warmup) {
			daemon[i - warmup] = t1 - t0;
			inside[i - warmup] = in;
			pingpong[i - warmup] = t2 - t1;
		}
	}
	return 0;
}

int bench_control(const struct bench_config *c, struct control_result *out)
{
	unsigned n = c->roundtrips;
	char dir[512];
	struct bench_cluster cl = {0};
	struct pingpong pp = {-1, -1};
	gs_client *gc = NULL;
	double *td = calloc(n, sizeof(*td)), *tp = calloc(n, sizeof(*tp));
	double *ti = calloc(n, sizeof(*ti));
	snprintf(dir, sizeof(dir), "%s/control", c->tmp);
	int rc = td && tp && ti && (mkdir(dir, 0700) == 0 || errno == EEXIST) ? 0 : -1;
	if (rc == 0)
		rc = bench_cluster_start(&cl, c, dir, 1, 1);
	if (rc == 0)
		rc = trainer_start(cl.socket[0], &gc);
	if (rc == 0)
		rc = pingpong_start(&pp);
	if (rc == 0)
		rc = take_turns(gc, &pp, n, td, ti, tp);
	if (pp.fd >= 0 && pingpong_stop(&pp) < 0)
		rc = -1;
	gs_close(gc);
	bench_cluster_stop(&cl);
	if (rc == 0) {
		bench_stats(td, n, &out->daemon);
		bench_stats(tp, n, &out->pingpong);
		bench_stats(ti, n, &out->inside);
		rows(c, "one-element bucket", "gradsync", td, n, sizeof(float));
		rows(c, "unix-socket round trip", "pingpong", tp, n, 0);
		rows(c, "one-element bucket inside the daemon", "gradsync", ti, n, sizeof(float));
	} else {
		fprintf(stderr, "gradsync-bench: the control-path measurement failed\n");
	}
	free(td);
	free(tp);
	free(ti);
	return rc;
}
