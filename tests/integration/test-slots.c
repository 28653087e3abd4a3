/*
 * Places on a node, against real daemons and trainers: a trainer that
 * says Hello and never registers is dropped at --register-timeout and its
 * place freed; and a job of one node does not linger, so that jobs run
 * one after another never find the node full.
 */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

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
	assert_true(kill(holder, 0) == 0);
	kill(holder, SIGKILL);
	harness_wait(holder, 10000);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(silent_trainer_dropped_at_register_timeout),
		cmocka_unit_test(one_node_jobs_one_after_another),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
