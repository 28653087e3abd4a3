/*
 * Hostile local clients against a real gradsyncd: descriptors sent to run
 * it out of its own, connections that never say Hello or never finish a
 * frame, frames that pile up memory, a second user probing a job, text
 * made to forge log lines, a trainer killed between steps, too many
 * mappings. Each case checks the error names what failed, the time it took
 * against its bound, that the daemon answered other clients throughout
 * (gradsyncctl status within 2 s), and that a step afterwards is right.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "frame.h"
#include "gradsync.h"
#include "harness.h"
#include "support/log.h" /* GS_LOG_BURST: lines a call site may log in a window */

/* ---- What the daemon process uses, read from /proc ------------------------ */

static unsigned open_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	unsigned n = 0;
	for (int fd = 0; fd < 70000; fd++) {
		char p[96];
		snprintf(p, sizeof(p), "%s/%d", path, fd);
		n += access(p, F_OK) == 0;
	}
	return n;
}

/* Waits (up to 10 s) until the daemon's descriptors number want, or at
 * most want when at_most: what a closed connection held is released a
 * moment after the client sees it closed. Returns the last count. */
static unsigned settled_fds(pid_t pid, unsigned want, bool at_most)
{
	double t0 = harness_now_s();
	unsigned n;
	while ((n = open_fds(pid)) != want && !(at_most && n < want) &&
	       harness_now_s() - t0 < 10)
		usleep(20000);
	return n;
}

/* CPU time (user + system) in seconds. */
static double cpu_seconds(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* Fields after the command name, which ends at the last ')'. */
	char *p = strrchr(buf, ')');
	assert_non_null(p);
	unsigned long utime = 0, stime = 0;
	assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
				&utime, &stime), 2);
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static unsigned log_lines(const struct gs_test_daemon *d)
{
	FILE *f = fopen(d->log, "r");
	assert_non_null(f);
	unsigned n = 0;
	int ch;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* ---- Good trainers, in this process ---------------------------------------- */

static const struct gs_tensor_spec layout[] = {
	{ "fc.weight", 4000, GS_FLOAT32, -1, 0 },
	{ "fc.bias", 100, GS_FLOAT32, -1, 0 },
	{ "conv.weight", 900, GS_FLOAT32, -1, 0 },
};
#define NT 3

/* A trainer of this process in job j, given in its environment while it
 * connects (NULL: none, the job of one trainer, id ""). */
static gs_client *trainer_of(const struct harness_job *j, const char *socket, uint32_t rank)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.local_rank = rank;
	gs_client *c;
	if (j)
		harness_job_setenv(j, 0);
	int r = gs_connect(&o, &c);
	harness_clear_launch_env();
	if (r != GS_OK)
		fail_msg("rank %u: connect: %s", rank, gs_last_error(NULL));
	if (gs_register(c, layout, NT) != GS_OK)
		fail_msg("rank %u: register: %s", rank, gs_last_error(c));
	return c;
}

/* Rank r's gradients are r + 1 everywhere: the average over n ranks is
 * (n + 1) / 2, exact in fp16 for these n. */
static void fill(gs_client *c, uint32_t rank)
{
	for (size_t t = 0; t < NT; t++) {
		float *p = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < layout[t].count; i++)
			p[i] = (float)(rank + 1);
	}
}

/* One step of n trainers, every element checked against (n + 1) / 2. */
static void good_step(gs_client *const *c, uint32_t n)
{
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	const uint32_t all[NT] = { 0, 1, 2 };
	for (uint32_t r = 0; r < n; r++) {
		fill(c[r], r);
		assert_int_equal(gs_step_begin(c[r], &o), GS_OK);
		assert_int_equal(gs_mark_ready(c[r], all, NT), GS_OK);
	}
	float want = (float)(n + 1) / 2.0f;
	for (uint32_t r = 0; r < n; r++) {
		struct gs_step_result res;
		if (gs_step_wait(c[r], 30000, &res) != GS_OK)
			fail_msg("rank %u: %s", r, gs_last_error(c[r]));
		for (size_t t = 0; t < NT; t++) {
			const float *p = gs_tensor_data(c[r], t);
			for (uint64_t i = 0; i < layout[t].count; i++)
				if (p[i] != want)
					fail_msg("rank %u tensor %zu [%llu] = %g, want %g", r, t,
						 (unsigned long long)i, (double)p[i], (double)want);
		}
	}
}

/* The trainers of job j (its local size; NULL: one) step once, right. */
static void one_good_step_of(const char *socket, const struct harness_job *j)
{
	const uint32_t n = j && j->local_size[0] ? j->local_size[0] : 1;
	gs_client *c[8];
	for (uint32_t r = 0; r < n; r++)
		c[r] = trainer_of(j, socket, r);
	good_step(c, n);
	for (uint32_t r = 0; r < n; r++)
		gs_close(c[r]);
}

static void one_good_step(const char *socket)
{
	one_good_step_of(socket, NULL);
}

/* ---- Raw connections ---------------------------------------------------------- */

/* A frame with n copies of fd attached (the kernel takes repeats). */
static void send_fds(int sock, int fd, size_t n, const void *bytes, size_t len)
{
	int fds[250];
	assert_true(n <= 250);
	for (size_t i = 0; i < n; i++)
		fds[i] = fd;
	char control[CMSG_SPACE(sizeof(fds))];
	memset(control, 0, sizeof(control));
	struct iovec iov = { (void *)bytes, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(n * sizeof(int));
	memcpy(CMSG_DATA(c), fds, n * sizeof(int));
	assert_true(sendmsg(sock, &msg, MSG_NOSIGNAL) > 0);
}

/* The Error the daemon sent before closing, or "" (in out). */
static void error_of(int sock, char *out, size_t n)
{
	Gradsync__Message *m = raw_recv(sock);
	out[0] = '\0';
	if (m && m->body_case == GRADSYNC__MESSAGE__BODY_ERROR)
		snprintf(out, n, "%s", m->error->message);
	if (m)
		gradsync__message__free_unpacked(m, NULL);
}

/* ---- Descriptors ------------------------------------------------------------------ */

/* Before Hello a client may pass no descriptor at all: the kernel closes
 * them before they reach the daemon, and the client is dropped. */
static void descriptors_before_hello(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_daemon_start(&d, NULL);
	unsigned before = open_fds(d.pid);
	int sock = raw_connect(d.socket);
	int mfd = make_memfd(4096, true);
	uint8_t partial[2] = { 10, 0 }; /* half a frame header */
	double t0 = harness_now_s();
	send_fds(sock, mfd, 3, partial, sizeof(partial));
	raw_expect_error(sock, GS_ELIMIT, "descriptors sent before Hello");
	assert_true(harness_now_s() - t0 < 1.0);
	close(sock);
	close(mfd);
	unsigned after = settled_fds(d.pid, before, false);
	print_message("gradsyncd's descriptors: %u before, %u after\n", before, after);
	assert_int_equal(after, before);
	one_good_step(d.socket);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A trainer may park what two frames need (2 x 64), and every client
 * together --max-parked-fds: past either it is dropped, the descriptors
 * closed. */
static void parked_descriptors_bounded(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 4 } };
	static const char *const args[] = { "--max-parked-fds=150", NULL };
	harness_job_daemon_start(&d, &job, 0, args);
	int mfd = make_memfd(4096, true);
	uint8_t partial[2] = { 10, 0 };
	unsigned idle = open_fds(d.pid);

	/* One trainer: 64 + 64 parked, one more is too many. Counted from
	 * here, its job (worker, buffers) already made. */
	int a = raw_connect(d.socket);
	raw_hello_job(a, 0, &job);
	unsigned before = open_fds(d.pid);
	send_fds(a, mfd, 64, partial, 1);
	send_fds(a, mfd, 64, partial + 1, 1);
	send_fds(a, mfd, 1, partial, 1);
	raw_expect_error(a, GS_ELIMIT, "more than 128 descriptors sent without a message claiming them");
	close(a);

	/* Three trainers, 64 each: 150 for all of them. */
	int b = raw_connect(d.socket), c = raw_connect(d.socket), e = raw_connect(d.socket);
	raw_hello_job(b, 1, &job);
	raw_hello_job(c, 2, &job);
	raw_hello_job(e, 3, &job);
	send_fds(b, mfd, 64, partial, 1);
	send_fds(c, mfd, 64, partial, 1);
	/* e's descriptors must come after b's and c's are parked (a's
	 * connection gone, b, c and e's come): else e parks and c is the
	 * one dropped. */
	settled_fds(d.pid, before - 1 + 3 + 128, false);
	send_fds(e, mfd, 64, partial, 1);
	raw_expect_error(e, GS_ELIMIT, "gradsyncd already holds 150 descriptors that clients sent and no message claimed (--max-parked-fds)");
	close(e);
	unsigned during = settled_fds(d.pid, before + 2 + 128, true);
	print_message("gradsyncd's descriptors: %u before, %u with 128 parked\n", before, during);
	assert_true(during <= before + 2 + 128);
	assert_true(harness_status_seconds(d.socket) < 2.0);
	raw_close(b);
	raw_close(c);
	close(mfd);
	/* Every descriptor parked is closed, and every client's; their job,
	 * of one node, went with its last trainer, and its descriptors. */
	assert_int_equal(settled_fds(d.pid, idle, false), idle);
	one_good_step_of(d.socket, &job);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* The attack as it was found: a couple of hundred connections, each
 * trying to park 250 descriptors before Hello. gradsyncd's own table
 * never fills, status answers throughout, the log stays short. */
static void descriptor_flood(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_daemon_start(&d, NULL);
	unsigned fds0 = open_fds(d.pid), lines0 = log_lines(&d);
	double cpu0 = cpu_seconds(d.pid), t0 = harness_now_s(), worst = 0;
	int mfd = make_memfd(4096, true);
	uint8_t partial[2] = { 10, 0 };
	int socks[200];
	for (int i = 0; i < 200; i++) {
		socks[i] = raw_connect(d.socket);
		send_fds(socks[i], mfd, 250, partial, sizeof(partial));
		if (i % 25 == 0) {
			double s = harness_status_seconds(d.socket);
			worst = s > worst ? s : worst;
		}
	}
	unsigned refused = 0;
	for (int i = 0; i < 200; i++) {
		char why[256];
		error_of(socks[i], why, sizeof(why));
		refused += strstr(why, "descriptors sent before Hello") != NULL;
		close(socks[i]);
	}
	close(mfd);
	double wall = harness_now_s() - t0, cpu = cpu_seconds(d.pid) - cpu0;
	unsigned lines = log_lines(&d) - lines0;
	print_message("200 connections x 250 descriptors: %u refused, slowest status %.3f s, "
		      "gradsyncd %.2f s of CPU in %.2f s, %u log lines, descriptors %u before %u after\n",
		      refused, worst, cpu, wall, lines, fds0, settled_fds(d.pid, fds0 + 1, true));
	assert_int_equal(refused, 200);
	assert_true(worst < 2.0);
	/* Three lines a connection (connected, dropped, closed: the harness
	 * logs debug), 600 in all, each call site limited. */
	assert_true(lines <= 3 * GS_LOG_BURST + 20);
	assert_true(settled_fds(d.pid, fds0 + 1, true) <= fds0 + 1);
	one_good_step(d.socket);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Out of descriptors whatever the cause (here the test lowers the
 * daemon's limit under its feet): every connection is refused at once
 * with words that say so instead of waiting in the queue while accept
 * fails in a loop, a client already connected is still answered, and
 * once descriptors are back everything works. */
static void out_of_descriptors(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_daemon_start(&d, NULL);
	gs_client *ctl;
	assert_int_equal(gs_control_connect(d.socket, 5000, &ctl), GS_OK);
	struct rlimit old, tight;
	assert_int_equal(prlimit(d.pid, RLIMIT_NOFILE, NULL, &old), 0);
	tight = old;
	tight.rlim_cur = open_fds(d.pid); /* every slot taken, the reserve included */
	assert_int_equal(prlimit(d.pid, RLIMIT_NOFILE, &tight, NULL), 0);

	unsigned lines0 = log_lines(&d), refused = 0;
	double cpu0 = cpu_seconds(d.pid), t0 = harness_now_s();
	for (int i = 0; i < 100; i++) {
		int s = raw_connect(d.socket);
		char why[256];
		error_of(s, why, sizeof(why));
		refused += strstr(why, "gradsyncd has run out of file descriptors") != NULL;
		close(s);
	}
	/* Then connections left waiting: the loop must not spin on them. */
	int waiting[20];
	for (int i = 0; i < 20; i++)
		waiting[i] = raw_connect(d.socket);
	usleep(1500000);
	struct gs_status *st;
	double s0 = harness_now_s();
	assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
	double answered = harness_now_s() - s0;
	gs_status_free(st);
	double wall = harness_now_s() - t0, cpu = cpu_seconds(d.pid) - cpu0;
	unsigned lines = log_lines(&d) - lines0;
	print_message("out of descriptors: %u of 100 refused with the reason, connected client answered in %.3f s, "
		      "gradsyncd %.2f s of CPU in %.2f s, %u log lines\n",
		      refused, answered, cpu, wall, lines);
	assert_int_equal(refused, 100);
	assert_true(answered < 2.0);
	assert_true(cpu < 0.25 * wall);
	assert_true(lines <= GS_LOG_BURST + 4);
	for (int i = 0; i < 20; i++)
		close(waiting[i]);

	assert_int_equal(prlimit(d.pid, RLIMIT_NOFILE, &old, NULL), 0);
	gs_close(ctl);
	usleep(1200000); /* a paused listener resumes within a second */
	assert_true(harness_status_seconds(d.socket) < 2.0);
	one_good_step(d.socket);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A limit that cannot hold --max-clients and --max-parked-fds stops
 * gradsyncd at start, naming both. */
static void descriptor_limit_checked_at_start(void **state)
{
	(void)state;
	char dir[] = "/tmp/gradsync-test-XXXXXX", log[128], sock[160];
	assert_non_null(mkdtemp(dir));
	snprintf(log, sizeof(log), "%s/gradsyncd.log", dir);
	snprintf(sock, sizeof(sock), "--socket=%s/gs.sock", dir);
	const char *argv[] = { "/usr/bin/prlimit", "--nofile=300:300", getenv("GS_DAEMON"), sock,
			       "--max-clients=256", "--max-parked-fds=1024", NULL };
	assert_int_equal(harness_wait(harness_spawn(argv, log), 10000), 2);
	assert_true(harness_file_contains(log, "--max-clients 256 + --max-parked-fds 1024"));
	assert_true(harness_file_contains(log, "RLIMIT_NOFILE allows 300 (hard 300)"));
	/* Settings that fit start, the soft limit raised to what they need. */
	const char *fits[] = { "/usr/bin/prlimit", "--nofile=300:2000", getenv("GS_DAEMON"), sock,
			       "--max-clients=64", "--max-parked-fds=128", "--log-level=debug", NULL };
	pid_t pid = harness_spawn(fits, log);
	double t0 = harness_now_s();
	while (!harness_file_contains(log, "listening on") && harness_now_s() - t0 < 10)
		usleep(20000);
	assert_true(harness_file_contains(log, "raised the soft RLIMIT_NOFILE from 300 to"));
	kill(pid, SIGTERM);
	assert_int_equal(harness_wait(pid, 10000), 0);
}

/* ---- Deadlines and memory of frames ------------------------------------------ */

/* A connection that says nothing, and one that sends its Hello a byte at a
 * time: both are closed at --hello-timeout, naming it. */
static void slow_hello(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static const char *const args[] = { "--hello-timeout=2", NULL };
	harness_daemon_start(&d, args);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.protocol_version = GS_PROTOCOL_VERSION;
	h.role = GRADSYNC__ROLE__ROLE_TRAINER;
	h.job_id = "a-job-id-long-enough-to-drip-for-many-seconds";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &h;
	uint8_t *buf;
	size_t len;
	assert_int_equal(gs_frame_encode(&m, &buf, &len), 0);
	double t0 = harness_now_s(), worst = 0;
	int silent = raw_connect(d.socket), drip = raw_connect(d.socket);
	size_t sent = 0;
	bool open = true;
	while (open && harness_now_s() - t0 < 8) {
		if (sent < len && send(drip, buf + sent, 1, MSG_NOSIGNAL) == 1)
			sent++;
		else
			open = false;
		double s = harness_status_seconds(d.socket);
		worst = s > worst ? s : worst;
		usleep(200000);
	}
	char why[256];
	error_of(drip, why, sizeof(why));
	double took = harness_now_s() - t0;
	print_message("the byte-a-time Hello was dropped after %.2f s (%zu of %zu bytes): %s\n",
		      took, sent, len, why);
	assert_non_null(strstr(why, "no Hello within 2 s of connecting (--hello-timeout)"));
	assert_true(took >= 1.9 && took < 3.5);
	raw_expect_error(silent, GS_ETIMEDOUT, "no Hello within 2 s of connecting (--hello-timeout)");
	assert_true(worst < 2.0);
	close(silent);
	close(drip);
	free(buf);
	one_good_step(d.socket);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A trainer that starts a frame and never finishes it is dropped at
 * --frame-timeout, with how much of it came. */
static void frame_never_finished(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 2 } };
	static const char *const args[] = { "--frame-timeout=2", NULL };
	harness_job_daemon_start(&d, &job, 0, args);
	int sock = raw_connect(d.socket);
	raw_hello_job(sock, 1, &job);
	uint8_t part[14] = { 0 };
	gs_frame_put_len(part, 1000);
	double t0 = harness_now_s();
	raw_send_bytes(sock, part, sizeof(part));
	raw_expect_error(sock, GS_ETIMEDOUT, "a frame begun 2 s ago is still incomplete: 14 of 1004 bytes (--frame-timeout)");
	double took = harness_now_s() - t0;
	print_message("dropped %.2f s after its frame began\n", took);
	assert_true(took >= 1.9 && took < 3.0);
	close(sock);
	one_good_step_of(d.socket, &job);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Trainers that each send all but the last byte of a largest frame: the
 * daemon holds no more than --max-pending-bytes of them in all (the one
 * that would pass it is dropped at once), and the rest go at
 * --frame-timeout. Its resident memory grows by about the budget, not by
 * the frames' claims. */
static void frames_pile_up(void **state)
{
	(void)state;
	enum { ATTACKERS = 4, FRAME = 4 << 20, BUDGET = 10 << 20 };
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 4 } };
	static const char *const args[] = { "--max-frame=4194304", "--max-pending-bytes=10485760",
					     "--frame-timeout=3", NULL };
	harness_job_daemon_start(&d, &job, 0, args);
	uint8_t *frame = calloc(1, FRAME);
	assert_non_null(frame);
	gs_frame_put_len(frame, FRAME - GS_FRAME_HEADER_SIZE);
	int sock[ATTACKERS];
	size_t sent[ATTACKERS] = { 0 };
	for (int i = 0; i < ATTACKERS; i++) {
		sock[i] = raw_connect(d.socket);
		raw_hello_job(sock[i], (uint32_t)i, &job);
		fcntl(sock[i], F_SETFL, O_NONBLOCK);
	}
	/* Counted from here, the job (its fusion buffers) already made. */
	long rss0 = harness_rss_kib(d.pid), peak = rss0;
	double t0 = harness_now_s();
	while (harness_now_s() - t0 < 2.0) {
		for (int i = 0; i < ATTACKERS; i++) {
			if (sent[i] + 1 >= FRAME)
				continue;
			ssize_t n = send(sock[i], frame + sent[i], FRAME - 1 - sent[i], MSG_NOSIGNAL);
			sent[i] += n > 0 ? (size_t)n : 0;
		}
		long r = harness_rss_kib(d.pid);
		peak = r > peak ? r : peak;
		usleep(5000);
	}
	free(frame);
	assert_true(harness_status_seconds(d.socket) < 2.0);
	unsigned budget = 0, timeout = 0;
	for (int i = 0; i < ATTACKERS; i++) {
		fcntl(sock[i], F_SETFL, 0);
		char why[256];
		error_of(sock[i], why, sizeof(why));
		budget += strstr(why, "(--max-pending-bytes)") != NULL;
		timeout += strstr(why, "(--frame-timeout)") != NULL;
		close(sock[i]);
	}
	double took = harness_now_s() - t0;
	print_message("%d trainers x %d MiB frames: %u dropped for the budget, %u at the frame timeout "
		      "(all gone after %.2f s); resident memory %ld KiB, at most %ld KiB during\n",
		      ATTACKERS, FRAME >> 20, budget, timeout, took, rss0, peak);
	assert_true(budget >= 1);
	assert_true(timeout >= 1);
	assert_int_equal(budget + timeout, ATTACKERS);
	assert_true(took < 5.0);
	/* The budget and what the allocator keeps around it; all four frames
	 * held whole would be 16 MiB (two fit in the budget, with room for
	 * the other clients' reads). AddressSanitizer's quarantine keeps
	 * freed buffers resident: there only the daemon's own count holds. */
	if (!getenv("ASAN_OPTIONS"))
		assert_true(peak - rss0 < (BUDGET >> 10) + 3 * 1024);
	one_good_step_of(d.socket, &job);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- A second user ------------------------------------------------------------ */

#define VICTIM_UID 61001
#define STRANGER_UID 61002

/* Forks a child that becomes uid (and a gid of the same number) and runs
 * fn(out, arg), out being the write end of a pipe whose read end comes
 * back in *from. Returns the child's pid. */
static pid_t fork_as(uid_t uid, void (*fn)(int out, void *arg), void *arg, int *from)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
			_exit(3);
		fn(p[1], arg);
		_exit(0);
	}
	close(p[1]);
	*from = p[0];
	return pid;
}

/* fork_as, then what the child wrote, in out. Returns its exit status. */
static int as_user(uid_t uid, void (*fn)(int out, void *arg), void *arg, char *out, size_t n)
{
	int from;
	pid_t pid = fork_as(uid, fn, arg, &from);
	size_t got = 0;
	ssize_t r;
	while (got + 1 < n && (r = read(from, out + got, n - 1 - got)) > 0)
		got += (size_t)r;
	out[got] = '\0';
	close(from);
	return harness_wait(pid, 30000);
}

/* The victim's job: 20 tensors whose names and sizes are its own, all
 * marked in one batch. */
#define SECRET_TENSORS 20
struct secret_layout {
	struct gs_tensor_spec specs[SECRET_TENSORS];
	char names[SECRET_TENSORS][32];
	uint32_t all[SECRET_TENSORS];
};

static void secret_layout_init(struct secret_layout *l)
{
	for (int i = 0; i < SECRET_TENSORS; i++) {
		snprintf(l->names[i], sizeof(l->names[i]), "secret.layer%d.weight", i);
		l->specs[i] = (struct gs_tensor_spec){ l->names[i], 1000 + 7 * (uint64_t)i, GS_FLOAT32, -1, 0 };
		l->all[i] = (uint32_t)i;
	}
}

/* Every element of every tensor of c is value. */
static void secret_fill(gs_client *c, const struct secret_layout *l, float value)
{
	for (int t = 0; t < SECRET_TENSORS; t++) {
		float *p = gs_tensor_data(c, (size_t)t);
		for (uint64_t i = 0; i < l->specs[t].count; i++)
			p[i] = value;
	}
}

/* The victim's job, of two trainers: its own, and root's that joins it. */
static struct harness_job victim_job = { .id = "victim-job", .local_size = { 2 } };

/* The victim: a trainer of uid VICTIM_UID, local rank 0 of job
 * 'victim-job', with 20 tensors whose names and sizes are its own. Steps
 * when told (a byte on cmd), reports each step's first element. */
struct victim {
	const char *socket;
	int cmd[2];
	pid_t pid;
	int report;
};

static void victim_main(int out, void *arg)
{
	struct victim *v = arg;
	close(v->cmd[1]); /* the parent's end */
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = v->socket;
	o.local_rank = 0;
	harness_job_setenv(&victim_job, 0);
	struct secret_layout l;
	secret_layout_init(&l);
	gs_client *c;
	if (gs_connect(&o, &c) != GS_OK || gs_register(c, l.specs, SECRET_TENSORS) != GS_OK) {
		dprintf(out, "victim: %s\n", gs_last_error(NULL));
		return;
	}
	dprintf(out, "registered\n");
	char op;
	while (read(v->cmd[0], &op, 1) == 1 && op == 's') {
		secret_fill(c, &l, 1.0f);
		struct gs_step_options so = GS_STEP_OPTIONS_INIT;
		struct gs_step_result res;
		int r = gs_step_begin(c, &so);
		if (r == GS_OK)
			r = gs_mark_ready(c, l.all, SECRET_TENSORS);
		if (r == GS_OK)
			r = gs_step_wait(c, 30000, &res);
		dprintf(out, "step %s %g\n", r == GS_OK ? "ok" : gs_last_error(c),
			(double)*(float *)gs_tensor_data(c, 0));
	}
	gs_close(c);
}

/* The victim runs in the background; its lines arrive on v->report. */
static void victim_start(struct victim *v, const char *socket)
{
	v->socket = socket;
	assert_int_equal(pipe(v->cmd), 0);
	v->pid = fork_as(VICTIM_UID, victim_main, v, &v->report);
	close(v->cmd[0]);
}

/* The victim's next line, waiting up to 30 s. */
static void victim_line(struct victim *v, char *out, size_t n)
{
	size_t k = 0;
	char ch;
	while (k + 1 < n && read(v->report, &ch, 1) == 1 && ch != '\n')
		out[k++] = ch;
	out[k] = '\0';
}

static void hello_as(int out, const char *socket, uint64_t rank, const char *job)
{
	int s = raw_connect(socket);
	raw_send_hello(s, rank, GS_PROTOCOL_VERSION, job);
	Gradsync__Message *r = raw_recv(s);
	dprintf(out, "hello rank %llu job '%s': %s\n", (unsigned long long)rank, job,
		!r ? "(closed)"
		: r->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? r->error->message : "WELCOMED");
	if (r)
		gradsync__message__free_unpacked(r, NULL);
	close(s);
}

/* The stranger: tries to join the job as every rank and under every id,
 * then asks what status and clients say; arg is the socket's path. */
static void stranger_main(int out, void *arg)
{
	const char *socket = arg;
	hello_as(out, socket, 1, "victim-job");
	hello_as(out, socket, 0, "victim-job");
	hello_as(out, socket, 1, "another-job");
	gs_client *c;
	struct gs_status *st;
	if (gs_control_connect(socket, 5000, &c) != GS_OK || gs_status_get(c, 5000, &st) != GS_OK) {
		dprintf(out, "status failed\n");
		return;
	}
	dprintf(out, "status: hidden %d id '%s' trainers %zu hidden %u buckets %u state '%s'\n",
		st->job_hidden, st->job_id, st->trainer_count, st->hidden_trainers, st->buckets,
		st->job_state);
	gs_status_free(st);
	struct gs_connection_status *list;
	size_t n;
	if (gs_clients_get(c, 5000, &list, &n) == GS_OK) {
		for (size_t i = 0; i < n; i++)
			dprintf(out, "client %s self %d hidden %d pid %u uid %u rank %d tensors %u\n",
				list[i].role, list[i].self, list[i].hidden, list[i].pid, list[i].uid,
				list[i].local_rank, list[i].tensors);
		gs_clients_free(list);
	}
	gs_close(c);
}

/* The stranger starts a trace into a file of its own; the caller steps
 * the victim meanwhile (the child waits for a byte on arg's pipe). */
struct tracer {
	const char *socket;
	const char *path;
	int go[2];
};

static void tracer_main(int out, void *arg)
{
	struct tracer *t = arg;
	int fd = open(t->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	gs_client *c;
	struct gs_trace_status ts;
	if (fd < 0 || gs_control_connect(t->socket, 5000, &c) != GS_OK ||
	    gs_trace_start(c, fd, 5000, &ts) != GS_OK) {
		dprintf(out, "trace start failed\n");
		return;
	}
	dprintf(out, "tracing\n");
	char go;
	if (read(t->go[0], &go, 1) != 1)
		return;
	int r = gs_trace_stop(c, 5000, &ts);
	dprintf(out, "trace stopped: %s, %llu events\n", r == GS_OK ? "ok" : gs_last_error(c),
		(unsigned long long)ts.events);
	gs_close(c);
	close(fd);
}

static void second_user(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	struct gs_test_daemon d;
	char allow[64];
	snprintf(allow, sizeof(allow), "--allow-uids=%u,%u", VICTIM_UID, STRANGER_UID);
	const char *const args[] = { allow, NULL };
	harness_job_daemon_start(&d, &victim_job, 0, args);
	chmod(d.dir, 0755);
	chmod(d.socket, 0666);

	struct victim v;
	victim_start(&v, d.socket);
	char line[512], out[8192];
	victim_line(&v, line, sizeof(line));
	assert_string_equal(line, "registered");

	double t0 = harness_now_s();
	assert_int_equal(as_user(STRANGER_UID, stranger_main, d.socket, out, sizeof(out)), 0);
	print_message("the stranger saw:\n%s(in %.2f s)\n", out, harness_now_s() - t0);
	/* Refused at Hello, before any registration, in the same words
	 * whatever rank it tried; nothing of the job in them. A job id of
	 * its own is a job of its own, judged as any other. */
	const char *refusal = "job 'victim-job' belongs to another user: uid 61002 may not join it";
	assert_non_null(strstr(out, "hello rank 1 job 'victim-job': job 'victim-job' belongs to another user"));
	assert_non_null(strstr(out, "hello rank 0 job 'victim-job': job 'victim-job' belongs to another user"));
	assert_non_null(strstr(out, "hello rank 1 job 'another-job': job 'another-job': local rank 1 is out of range for local size 1"));
	assert_null(strstr(out, "WELCOMED"));
	assert_non_null(strstr(out, refusal));
	assert_null(strstr(out, "secret"));
	assert_null(strstr(out, "taken"));
	assert_non_null(strstr(out, "status: hidden 1 id '' trainers 0 hidden 1 buckets 0"));
	/* Of the victim's connection, only that it is there. */
	assert_non_null(strstr(out, "client trainer self 0 hidden 1 pid 0 uid 0 rank -1 tensors 0"));
	char victim_pid[40];
	snprintf(victim_pid, sizeof(victim_pid), "pid %d ", (int)v.pid);
	assert_null(strstr(out, victim_pid));
	assert_null(strstr(out, "uid 61001"));

	/* A trace the stranger writes holds none of the victim's buckets. */
	char trace[160];
	snprintf(trace, sizeof(trace), "/tmp/gradsync-stranger-%d.trace", (int)getpid());
	struct tracer tr = { d.socket, trace, { -1, -1 } };
	assert_int_equal(pipe(tr.go), 0);
	int from;
	pid_t tpid = fork_as(STRANGER_UID, tracer_main, &tr, &from);
	char tline[256] = "";
	FILE *tf = fdopen(from, "r");
	assert_non_null(fgets(tline, sizeof(tline), tf));
	assert_string_equal(tline, "tracing\n");

	/* Root may join another user's job: the job goes on, right. */
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = d.socket;
	co.local_rank = 1;
	gs_client *root;
	harness_job_setenv(&victim_job, 0);
	assert_int_equal(gs_connect(&co, &root), GS_OK);
	harness_clear_launch_env();
	struct secret_layout l;
	secret_layout_init(&l);
	assert_int_equal(gs_register(root, l.specs, SECRET_TENSORS), GS_OK);
	secret_fill(root, &l, 2.0f);
	assert_int_equal(write(v.cmd[1], "s", 1), 1);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	struct gs_step_result res;
	assert_int_equal(gs_step_begin(root, &so), GS_OK);
	assert_int_equal(gs_mark_ready(root, l.all, SECRET_TENSORS), GS_OK);
	assert_int_equal(gs_step_wait(root, 30000, &res), GS_OK);
	victim_line(&v, line, sizeof(line));
	print_message("victim: %s\n", line);
	assert_string_equal(line, "step ok 1.5");
	assert_true(*(float *)gs_tensor_data(root, 19) == 1.5f);

	assert_int_equal(write(tr.go[1], "x", 1), 1);
	assert_non_null(fgets(tline, sizeof(tline), tf));
	print_message("stranger's %s", tline);
	assert_string_equal(tline, "trace stopped: ok, 0 events\n");
	fclose(tf);
	assert_int_equal(harness_wait(tpid, 10000), 0);
	assert_false(harness_file_contains(trace, "ALLREDUCE"));
	assert_false(harness_file_contains(trace, "bucket"));
	unlink(trace);

	gs_close(root);
	close(v.cmd[1]);
	assert_int_equal(harness_wait(v.pid, 10000), 0);
	close(v.report);
	close(tr.go[0]);
	close(tr.go[1]);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* --job-access=any: a node of one tenant whose trainers run under several
 * users. */
static void job_access_any(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	struct gs_test_daemon d;
	char allow[64];
	snprintf(allow, sizeof(allow), "--allow-uids=%u,%u", VICTIM_UID, STRANGER_UID);
	const char *const args[] = { allow, "--job-access=any", NULL };
	harness_job_daemon_start(&d, &victim_job, 0, args);
	chmod(d.dir, 0755);
	chmod(d.socket, 0666);
	struct victim v;
	victim_start(&v, d.socket);
	char line[256], out[2048];
	victim_line(&v, line, sizeof(line));
	assert_string_equal(line, "registered");
	assert_int_equal(as_user(STRANGER_UID, stranger_main, d.socket, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "hello rank 1 job 'victim-job': WELCOMED"));
	close(v.cmd[1]);
	harness_wait(v.pid, 10000);
	close(v.report);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Settings and text ----------------------------------------------------------- */

/* A user id that wraps to another (2^32 + 65534 would be nobody) is no
 * user id: gradsyncd refuses to start. */
static void allow_uids_range(void **state)
{
	(void)state;
	static const char *const bad[] = { "4295032830", "4294967295", "1,,2", "1000,", "-1", "1e3" };
	char dir[] = "/tmp/gradsync-test-XXXXXX", log[128];
	assert_non_null(mkdtemp(dir));
	snprintf(log, sizeof(log), "%s/out.log", dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char arg[64];
		snprintf(arg, sizeof(arg), "--allow-uids=%s", bad[i]);
		const char *argv[] = { getenv("GS_DAEMON"), arg, "--print-config", NULL };
		assert_int_equal(harness_wait(harness_spawn(argv, log), 10000), 2);
		assert_true(harness_file_contains(log, "invalid value"));
		assert_true(harness_file_contains(log, "for --allow-uids"));
	}
	assert_true(harness_file_contains(log, "'4295032830' is not a user id (0 to 4294967294)"));
	const char *ok[] = { getenv("GS_DAEMON"), "--allow-uids=0,65534,4294967294", "--print-config", NULL };
	assert_int_equal(harness_wait(harness_spawn(ok, log), 10000), 0);
}

/* Text a client controls cannot start a log line of its own: a job id or
 * tensor name with control characters is refused at once, and no line of
 * the log begins with the forged text. */
static void log_injection(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 2 } };
	harness_job_daemon_start(&d, &job, 0, NULL);
	const char *forged = "x\n12:00:00.000 gradsyncd error: FORGED\x1b[2J";
	int s = raw_connect(d.socket);
	raw_send_hello(s, 0, GS_PROTOCOL_VERSION, forged);
	raw_expect_error(s, GS_EINVAL, "job id must be at most 63 printable ASCII characters");
	close(s);

	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = d.socket;
	o.local_rank = 0;
	gs_client *c;
	harness_job_setenv(&job, 0);
	assert_int_equal(gs_connect(&o, &c), GS_OK);
	harness_clear_launch_env();
	const struct gs_tensor_spec bad[] = { { "w\n12:00:00.000 gradsyncd error: FORGED", 10, GS_FLOAT32, -1, 0 } };
	assert_int_equal(gs_register(c, bad, 1), GS_EINVAL);
	assert_non_null(strstr(gs_last_error(c), "tensor 0: name holds a control character"));
	gs_close(c);
	/* Whatever the refusals wrote is in the log once their line is. */
	harness_wait_for_text(d.log, "name holds a control character", 30);
	FILE *f = fopen(d.log, "r");
	char line[1024];
	while (fgets(line, sizeof(line), f))
		assert_null(strstr(line, "FORGED") == line ? line : NULL);
	fclose(f);
	assert_false(harness_log_contains(&d, "\x1b"));
	one_good_step_of(d.socket, &job);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Trainers gone, mappings bounded ------------------------------------------- */

/* A trainer killed between steps: the next step cannot complete, so it
 * ends at once (not at --step-timeout), naming the trainer and the step
 * as the trainers number it; a new trainer in its place steps right. */
static void killed_between_steps(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	/* An earlier job moves the daemon's own count of steps on: the
	 * messages must not quote it. */
	static struct harness_job early_job = { .id = "early", .local_size = { 2 } };
	static struct harness_job job = { .id = "job", .local_size = { 2 } };
	static const char *const args[] = { "--step-timeout=60", NULL };
	harness_job_daemon_start(&d, &job, 0, args);
	gs_client *early[2] = { trainer_of(&early_job, d.socket, 0),
				trainer_of(&early_job, d.socket, 1) };
	for (int i = 0; i < 5; i++)
		good_step(early, 2);
	gs_close(early[0]);
	gs_close(early[1]);

	gs_client *t0 = trainer_of(&job, d.socket, 0);
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t child = fork();
	if (child == 0) {
		close(p[0]);
		gs_client *t1 = trainer_of(&job, d.socket, 1);
		fill(t1, 1);
		struct gs_step_options so = GS_STEP_OPTIONS_INIT;
		const uint32_t all[NT] = { 0, 1, 2 };
		struct gs_step_result res;
		if (gs_step_begin(t1, &so) || gs_mark_ready(t1, all, NT) || gs_step_wait(t1, 30000, &res))
			_exit(1);
		if (write(p[1], "1", 1) != 1)
			_exit(1);
		pause(); /* between steps, until killed */
		_exit(0);
	}
	close(p[1]);
	fill(t0, 0);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	const uint32_t all[NT] = { 0, 1, 2 };
	struct gs_step_result res;
	assert_int_equal(gs_step_begin(t0, &so), GS_OK);
	assert_int_equal(gs_mark_ready(t0, all, NT), GS_OK);
	assert_int_equal(gs_step_wait(t0, 30000, &res), GS_OK);
	char one;
	assert_int_equal(read(p[0], &one, 1), 1);
	kill(child, SIGKILL);
	assert_int_equal(harness_wait(child, 5000), 128 + SIGKILL);
	/* Gone before the step begins, not during it. */
	char left[96];
	snprintf(left, sizeof(left), "trainer pid %d (local rank 1) left job 'job'", (int)child);
	harness_wait_for_text(d.log, left, 30);

	double t_begin = harness_now_s();
	fill(t0, 0);
	assert_int_equal(gs_step_begin(t0, &so), GS_OK);
	assert_int_equal(gs_mark_ready(t0, all, NT), GS_OK);
	assert_int_equal(gs_step_wait(t0, 30000, &res), GS_EABORTED);
	double took = harness_now_s() - t_begin;
	print_message("step 2 ended %.3f s after it began: %s\n", took, gs_last_error(t0));
	assert_true(took < 1.0);
	char want[200];
	snprintf(want, sizeof(want), "step 2 aborted: trainer local rank 1 (pid %d) of node 0 went away after its step 1",
		 (int)child);
	assert_non_null(strstr(gs_last_error(t0), want));
	/* Its own gradients, untouched. */
	assert_true(*(float *)gs_tensor_data(t0, 0) == 1.0f);
	assert_true(harness_log_contains(&d, "job 'job': step 2 aborted: trainer local rank 1"));
	assert_false(harness_log_contains(&d, "step 7"));

	gs_client *t1 = trainer_of(&job, d.socket, 1);
	gs_client *both[2] = { t0, t1 };
	good_step(both, 2);
	gs_close(t0);
	gs_close(t1);
	close(p[0]);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Registers nbuf buffers of one tensor each on a raw trainer of rank in
 * job j. */
static int register_buffers(const char *socket, const struct harness_job *j, uint32_t rank,
			    int nbuf)
{
	int s = raw_connect(socket);
	raw_hello_job(s, rank, j);
	Gradsync__Buffer bufs[16], *bp[16];
	Gradsync__TensorSpec ts[16], *tp[16];
	char names[16][16];
	int fds[16];
	for (int i = 0; i < nbuf; i++) {
		fds[i] = make_memfd(4096, true);
		gradsync__buffer__init(&bufs[i]);
		bufs[i].size = 4096;
		bp[i] = &bufs[i];
		gradsync__tensor_spec__init(&ts[i]);
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		ts[i].name = names[i];
		ts[i].count = 1024;
		ts[i].dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
		ts[i].buffer = (uint64_t)i;
		tp[i] = &ts[i];
	}
	Gradsync__RegisterTensors r = GRADSYNC__REGISTER_TENSORS__INIT;
	r.n_buffers = (size_t)nbuf;
	r.buffers = bp;
	r.n_tensors = (size_t)nbuf;
	r.tensors = tp;
	r.last = true;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &r;
	raw_send(s, &m, fds, (size_t)nbuf);
	for (int i = 0; i < nbuf; i++)
		close(fds[i]);
	return s;
}

/* Every buffer is a mapping in gradsyncd: --max-buffers a trainer,
 * --max-mappings for all, checked before anything is mapped. */
static void mappings_bounded(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 3 } };
	static const char *const args[] = { "--max-buffers=4", "--max-mappings=6", NULL };
	harness_job_daemon_start(&d, &job, 0, args);
	int a = register_buffers(d.socket, &job, 0, 5);
	raw_expect_error(a, GS_ELIMIT, "RegisterTensors brings its buffers to 5; at most 4 per trainer (--max-buffers)");
	close(a);
	int b = register_buffers(d.socket, &job, 0, 4);
	Gradsync__Message *reg = raw_recv(b);
	assert_non_null(reg);
	assert_int_equal(reg->body_case, GRADSYNC__MESSAGE__BODY_REGISTERED);
	gradsync__message__free_unpacked(reg, NULL);
	int c = register_buffers(d.socket, &job, 1, 3);
	raw_expect_error(c, GS_ELIMIT, "gradsyncd already maps 4 buffers of its trainers; at most 6 (--max-mappings)");
	close(c);
	raw_close(b);
	/* Those of a trainer that left count no more. */
	one_good_step_of(d.socket, &job);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(descriptors_before_hello),
		cmocka_unit_test(parked_descriptors_bounded),
		cmocka_unit_test(descriptor_flood),
		cmocka_unit_test(out_of_descriptors),
		cmocka_unit_test(descriptor_limit_checked_at_start),
		cmocka_unit_test(slow_hello),
		cmocka_unit_test(frame_never_finished),
		cmocka_unit_test(frames_pile_up),
		cmocka_unit_test(second_user),
		cmocka_unit_test(job_access_any),
		cmocka_unit_test(allow_uids_range),
		cmocka_unit_test(log_injection),
		cmocka_unit_test(killed_between_steps),
		cmocka_unit_test(mappings_bounded),
	};
	/* GS_TEST_FILTER=second_* runs only the cases it matches. */
	if (getenv("GS_TEST_FILTER"))
		cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
