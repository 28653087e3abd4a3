/*
 * Places on a node, against real daemons and trainers: a trainer that
 * says Hello and never registers is dropped at --register-timeout and its
 * place freed; one user (root too) cannot take more than
 * --max-jobs-per-user jobs or --max-trainers-per-user trainers, while
 * other users still can; a job of one node does not linger, so that jobs
 * run one after another never find the node full; and a lingering job of
 * several nodes gives its place to a new job when --max-jobs is met, the
 * one that has lingered longest first.
 */
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

#define OTHER_UID 61005

/* A layout of two small tensors, in the daemon's directory. */
static const char *small_layout(const struct gs_test_daemon *d)
{
	static char path[200];
	snprintf(path, sizeof(path), "%s/small.txt", d->dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "a 1000\nb 3000\n");
	fclose(f);
	return path;
}

/* A verifying trainer of job j on node `node` of daemon d, one step. */
static pid_t one_step(const struct gs_test_daemon *d, const struct harness_job *j, unsigned node,
		      char *log, size_t n)
{
	snprintf(log, n, "%s/%s-node%u.log", d->dir, j->id, node);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d->socket, "--layout",
			       small_layout(d), "--steps", "1", NULL };
	return harness_job_spawn(j, node, argv, log);
}

static void expect_ok(pid_t pid, const char *log)
{
	if (harness_wait(pid, 120000) != 0 || !harness_file_contains(log, "OK: 1 steps verified")) {
		harness_dump(log);
		fail_msg("the trainer of %s did not verify its step", log);
	}
}

/* The answer to a trainer's Hello: "WELCOMED", or the Error's words. */
static void hello_answer(int fd, const struct harness_job *j, uint32_t rank, char *out, size_t n)
{
	raw_send_hello_job(fd, rank, GS_PROTOCOL_VERSION, j, 0);
	Gradsync__Message *m = raw_recv(fd);
	if (!m)
		snprintf(out, n, "(closed)");
	else if (m->body_case == GRADSYNC__MESSAGE__BODY_WELCOME)
		snprintf(out, n, "WELCOMED");
	else if (m->body_case == GRADSYNC__MESSAGE__BODY_ERROR)
		snprintf(out, n, "%s", m->error->message);
	else
		snprintf(out, n, "(message %d)", (int)m->body_case);
	if (m)
		gradsync__message__free_unpacked(m, NULL);
}

static void expect_welcome(int fd, const struct harness_job *j, uint32_t rank)
{
	char said[512];
	hello_answer(fd, j, rank, said, sizeof(said));
	if (strcmp(said, "WELCOMED") != 0)
		fail_msg("job '%s' rank %u: expected a Welcome, got '%s'", j->id, rank, said);
}

static void expect_refusal(int fd, const struct harness_job *j, uint32_t rank, const char *text)
{
	char said[512];
	hello_answer(fd, j, rank, said, sizeof(said));
	print_message("  job '%s' rank %u: %s\n", j->id, rank, said);
	if (!strstr(said, text))
		fail_msg("job '%s' rank %u: expected '%s', got '%s'", j->id, rank, text, said);
	close(fd);
}

/* ---- Registration's deadline ---------------------------------------------- */

/* A trainer welcomed and silent since is dropped at --register-timeout,
 * with an Error naming the setting; the job it alone made goes, so that
 * the node's place is another job's at once. A trainer that registered
 * in time is kept, however long it then waits. */
static void silent_trainer_dropped_at_register_timeout(void **state)
{
	(void)state;
	static const char *const args[] = { "--register-timeout=2", "--max-jobs=2", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	/* A trainer that registers, then waits in its step for a rank 1
	 * that never comes. */
	static struct harness_job busy = { .id = "busy", .local_size = { 2 } };
	char log[200];
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
			       small_layout(&d), "--rank", "0", "--steps", "1", NULL };
	snprintf(log, sizeof(log), "%s/busy.log", d.dir);
	pid_t holder = harness_job_spawn(&busy, 0, argv, log);
	harness_wait_for_text(d.log, "registered 2 tensors", 60);

	static struct harness_job idle = { .id = "idle" }, next = { .id = "next" };
	int silent = raw_connect(d.socket);
	expect_welcome(silent, &idle, 0);
	double t0 = harness_now_s();
	/* Meanwhile the node is full. */
	expect_refusal(raw_connect(d.socket), &next, 0, "this node serves 2 jobs already, its most (--max-jobs)");
	struct timeval tv = { 30, 0 };
	setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	Gradsync__Message *m = raw_recv(silent);
	double took = harness_now_s() - t0;
	if (!m || m->body_case != GRADSYNC__MESSAGE__BODY_ERROR)
		fail_msg("the silent trainer got %s after %.2f s, not an Error",
			 m ? "another message" : "nothing", took);
	print_message("the silent trainer was dropped after %.2f s: %s\n", took, m->error->message);
	assert_int_equal(m->error->code, GS_ETIMEDOUT);
	assert_non_null(strstr(m->error->message, "job 'idle': no tensors registered within 2 s of the Welcome (--register-timeout)"));
	gradsync__message__free_unpacked(m, NULL);
	assert_null(raw_recv(silent));
	close(silent);
	assert_true(took >= 1.5 && took < 10.0);
	/* Its place is free. */
	int fd = raw_connect(d.socket);
	expect_welcome(fd, &next, 0);
	close(fd);
	/* The registered trainer, waiting in its step, is still there. */
	assert_false(harness_file_contains(d.log, "job 'busy': no tensors registered"));
	assert_int_equal(waitpid(holder, NULL, WNOHANG), 0);
	kill(holder, SIGKILL);
	harness_wait(holder, 10000);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Each user's share ------------------------------------------------------ */

/* A socket connected to the daemon by a child that became uid: the daemon
 * takes uid as its peer (SO_PEERCRED is the connecting process's) while
 * this process speaks on it. */
static int connect_as(uid_t uid, const char *path)
{
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
			_exit(3);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_un addr = { .sun_family = AF_UNIX };
		snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
		if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
			_exit(4);
		char control[CMSG_SPACE(sizeof(int))] = { 0 };
		struct iovec iov = { "s", 1 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
				      .msg_controllen = sizeof(control) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
		_exit(sendmsg(sv[1], &msg, 0) == 1 ? 0 : 5);
	}
	close(sv[1]);
	char byte, control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &byte, 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	ssize_t got = recvmsg(sv[0], &msg, MSG_CMSG_CLOEXEC);
	close(sv[0]);
	assert_int_equal(harness_wait(pid, 10000), 0);
	assert_int_equal(got, 1);
	int fd;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(int));
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* A user at --max-jobs-per-user or --max-trainers-per-user is refused,
 * naming the setting and the user's count, while another user (root
 * here) still begins jobs; root counts like any user. A job the user
 * leaves frees its place for the user's next. */
static void one_user_cannot_take_the_node(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	char allow[64];
	snprintf(allow, sizeof(allow), "--allow-uids=%u", OTHER_UID);
	const char *const args[] = { allow, "--max-jobs=8", "--max-trainers=16",
				     "--max-jobs-per-user=2", "--max-trainers-per-user=3", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	chmod(d.dir, 0755);
	chmod(d.socket, 0666);
	static struct harness_job u1 = { .id = "u1", .local_size = { 2 } },
				  u2 = { .id = "u2", .local_size = { 2 } }, u3 = { .id = "u3" },
				  r1 = { .id = "r1" }, r2 = { .id = "r2" },
				  r3 = { .id = "r3" };
	int u1a = connect_as(OTHER_UID, d.socket), u2a = connect_as(OTHER_UID, d.socket);
	expect_welcome(u1a, &u1, 0);
	expect_welcome(u2a, &u2, 0);
	expect_refusal(connect_as(OTHER_UID, d.socket), &u3, 0,
		       "job 'u3' cannot begin: uid 61005 has 2 jobs on this node already, its most (--max-jobs-per-user)");
	int u1b = connect_as(OTHER_UID, d.socket);
	expect_welcome(u1b, &u1, 1);
	expect_refusal(connect_as(OTHER_UID, d.socket), &u2, 1,
		       "uid 61005 has 3 trainers on this node already, its most (--max-trainers-per-user)");
	/* Another user is not held by this one's share. */
	int r1a = raw_connect(d.socket), r2a = raw_connect(d.socket);
	expect_welcome(r1a, &r1, 0);
	expect_welcome(r2a, &r2, 0);
	/* Root has a share like anyone's. */
	expect_refusal(raw_connect(d.socket), &r3, 0,
		       "job 'r3' cannot begin: uid 0 has 2 jobs on this node already, its most (--max-jobs-per-user)");
	/* u2's only trainer leaves: its job of one node goes at once, and
	 * the user's next job begins. */
	close(u2a);
	double t0 = harness_now_s();
	for (;;) {
		char said[512];
		int fd = connect_as(OTHER_UID, d.socket);
		hello_answer(fd, &u3, 0, said, sizeof(said));
		if (strcmp(said, "WELCOMED") == 0) {
			close(fd);
			break;
		}
		close(fd);
		if (harness_now_s() - t0 > 5)
			fail_msg("u3 still refused %.1f s after u2's trainer left: %s",
				 harness_now_s() - t0, said);
		usleep(50000);
	}
	print_message("u3 began %.3f s after u2's trainer left\n", harness_now_s() - t0);
	close(u1a);
	close(u1b);
	close(r1a);
	close(r2a);
	assert_true(harness_daemon_alive(&d));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Lingering ------------------------------------------------------------------ */

/* 17 jobs of one node, one after another, on a daemon of 16 (the
 * default) that keeps groups a minute: a job of one node has no group to
 * keep, goes with its last trainer, and every job begins at once. */
static void one_node_jobs_one_after_another(void **state)
{
	(void)state;
	static const char *const args[] = { "--job-linger=60", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	double t0 = harness_now_s();
	for (int i = 0; i < 17; i++) {
		char id[16], log[200];
		snprintf(id, sizeof(id), "seq%d", i);
		struct harness_job j = { .id = id };
		double t1 = harness_now_s();
		expect_ok(one_step(&d, &j, 0, log, sizeof(log)), log);
		assert_true(harness_now_s() - t1 < 30.0);
	}
	print_message("17 jobs of one node ran one after another in %.2f s\n", harness_now_s() - t0);
	assert_false(harness_log_contains(&d, "keeping its group"));
	assert_false(harness_log_contains(&d, "(--max-jobs)"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Two nodes, both keeping groups two minutes; node 0 serves two jobs at
 * most. Jobs 'first' and then 'second' of both nodes run a step and leave
 * their groups lingering there; a new job 'third' on node 0 then takes
 * the place of 'first', which has lingered longest, and runs at once;
 * 'second' lingers on. */
static void lingering_job_gives_its_place(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	int port = harness_free_port();
	static struct harness_job first = { .id = "first", .nodes = 2 },
				  second = { .id = "second", .nodes = 2 }, third = { .id = "third" };
	first.port = second.port = port;
	static const char *const node0[] = { "--max-jobs=2", "--job-linger=120", NULL };
	static const char *const node1[] = { "--job-linger=120", NULL };
	struct gs_test_daemon d0, d1;
	harness_job_daemon_spawn(&d0, &first, 0, node0);
	harness_job_daemon_spawn(&d1, &first, 1, node1);
	harness_daemon_wait_ready(&d0, 30000);
	harness_daemon_wait_ready(&d1, 30000);
	struct harness_job *jobs[2] = { &first, &second };
	for (int k = 0; k < 2; k++) {
		char logs[2][200];
		pid_t p0 = one_step(&d0, jobs[k], 0, logs[0], sizeof(logs[0]));
		pid_t p1 = one_step(&d1, jobs[k], 1, logs[1], sizeof(logs[1]));
		expect_ok(p0, logs[0]);
		expect_ok(p1, logs[1]);
		char lingers[128];
		snprintf(lingers, sizeof(lingers), "job '%s': every trainer has left; keeping its group for 120 s",
			 jobs[k]->id);
		harness_wait_for_text(d0.log, lingers, 10);
	}
	char log[200];
	double t0 = harness_now_s();
	expect_ok(one_step(&d0, &third, 0, log, sizeof(log)), log);
	print_message("job 'third' ran its step in %.2f s, in the place of a lingering job\n",
		      harness_now_s() - t0);
	assert_true(harness_log_contains(&d0, "job 'first', which has no trainer, gives its place to job 'third': this node serves 2 jobs already, its most (--max-jobs)"));
	assert_false(harness_log_contains(&d0, "job 'second', which has no trainer, gives its place"));
	harness_daemon_stop(&d1);
	assert_int_equal(harness_daemon_stop(&d0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(silent_trainer_dropped_at_register_timeout),
		cmocka_unit_test(one_user_cannot_take_the_node),
		cmocka_unit_test(one_node_jobs_one_after_another),
		cmocka_unit_test(lingering_job_gives_its_place),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
