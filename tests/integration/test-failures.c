/*
 * Failures with real processes and signals: a trainer killed mid-step, a
 * gradient that never arrives, gradsyncd killed and restarted, a user
 * outside the service's group, and the limits. Each scenario checks the
 * error text, how long it took against its bound, what every tensor holds
 * afterwards (the trainers check: the reduced result or, bitwise, their own
 * gradient), and that the following step succeeds.
 */
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

static bool file_contains(const char *path, const char *text)
{
	return harness_file_contains(path, text);
}

/* The job of the scenarios with trainers: two on this node. */
static struct harness_job two = { .local_size = { 2 } };

static pid_t trainer(const struct gs_test_daemon *d, unsigned rank, char *log,
		     const char *tag, const char *const *extra)
{
	char r[16];
	snprintf(r, sizeof(r), "%u", rank);
	snprintf(log, 200, "%s/trainer-%s.log", d->dir, tag);
	const char *argv[24] = { getenv("GS_TRAINER"), "--socket", d->socket, "--layout",
				 harness_layout("resnet50.txt"), "--rank", r };
	size_t k = 7;
	for (size_t i = 0; extra[i]; i++)
		argv[k++] = extra[i];
	return harness_job_spawn(&two, 0, argv, log);
}

/* Shared memory of trainers the daemon still has mapped. */
static int memfd_mappings(pid_t pid)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:") != NULL;
	fclose(f);
	return n;
}

static void expect_success(pid_t pid, const char *log)
{
	int status = harness_wait(pid, 120000);
	if (status != 0)
		harness_dump(log);
	assert_int_equal(status, 0);
}

/* ---- A trainer killed between marking some tensors and the rest ---------- */

static void trainer_killed_mid_step(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &two, 0, NULL);
	char log0[200], log1[200], log1b[200];
	/* Trainer 0 holds before step 3 until its new partner has registered:
	 * a step begun while local rank 1 is empty is aborted at once, as it
	 * should be ("no step can complete until a trainer takes its place"). */
	static const char *const a0[] = { "--steps", "3", "--expect-abort-at", "2",
					   "--hold-before-step", "3", NULL };
	static const char *const a1[] = { "--steps", "3", "--pause-at-step", "2",
					   "--pause-after", "40", NULL };
	pid_t t0 = trainer(&d, 0, log0, "0", a0);
	pid_t t1 = trainer(&d, 1, log1, "1", a1);
	harness_wait_for_text(log1, "PAUSED in step 2", 120);
	int mapped = memfd_mappings(d.pid);
	kill(t1, SIGKILL);
	double took = harness_wait_for_text(log0, "ABORTED step 2 as expected", 10);
	print_message("the other trainer learned of the abort %.3f s after the kill\n", took);
	assert_true(took < 2.0);
	char want[160];
	snprintf(want, sizeof(want), "trainer local rank 1 (pid %d) of node 0 went away during step 2",
		 (int)t1);
	assert_true(file_contains(log0, want));
	assert_int_equal(harness_wait(t1, 5000), 128 + SIGKILL);

	/* Its memory is released once no bucket reads it any more. */
	double t_release = harness_now_s();
	while (memfd_mappings(d.pid) >= mapped && harness_now_s() - t_release < 5)
		usleep(10000);
	print_message("daemon memfd mappings: %d with both trainers, %d after the kill\n",
		      mapped, memfd_mappings(d.pid));
	assert_true(memfd_mappings(d.pid) < mapped);

	/* A restarted trainer takes its place and step 3 is right again. */
	static const char *const a1b[] = { "--steps", "1", "--first-step", "3", NULL };
	pid_t t1b = trainer(&d, 1, log1b, "1b", a1b);
	harness_wait_registered(&d, t1b);
	kill(t0, SIGUSR1);
	expect_success(t0, log0);
	expect_success(t1b, log1b);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- A gradient that never arrives ------------------------------------------ */

static void gradient_never_arrives(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static const char *const args[] = { "--step-timeout=3", "--stall-warning=1", NULL };
	harness_job_daemon_start(&d, &two, 0, args);
	char log0[200], log1[200], log1b[200];
	/* Trainer 0 holds before step 2 until the late trainer's replacement
	 * has registered, as in trainer_killed_mid_step. */
	static const char *const a0[] = { "--steps", "2", "--expect-abort-at", "1",
					   "--hold-before-step", "2", NULL };
	static const char *const a1[] = { "--steps", "2", "--pause-at-step", "1",
					   "--pause-after", "5", NULL };
	pid_t t0 = trainer(&d, 0, log0, "0", a0);
	pid_t t1 = trainer(&d, 1, log1, "1", a1);
	harness_wait_for_text(log1, "PAUSED in step 1", 120);
	double took = harness_wait_for_text(log0, "ABORTED step 1 as expected", 10);
	print_message("aborted %.2f s after the trainer stopped marking\n", took);
	/* Measured from the pause: the step began a little before it. */
	assert_true(took > 2.0 && took < 5.0);
	char want[160];
	snprintf(want, sizeof(want), "timed out after 3 s (--step-timeout) on node 0: local rank 1 (pid %d) did not mark",
		 (int)t1);
	assert_true(file_contains(log0, want));
	snprintf(want, sizeof(want), "step 1 has waited 1 s: local rank 1 (pid %d) did not mark", (int)t1);
	assert_true(harness_log_contains(&d, want));

	kill(t1, SIGKILL);
	harness_wait(t1, 5000);
	static const char *const a1b[] = { "--steps", "1", "--first-step", "2", NULL };
	pid_t t1b = trainer(&d, 1, log1b, "1b", a1b);
	harness_wait_registered(&d, t1b);
	kill(t0, SIGUSR1);
	expect_success(t0, log0);
	expect_success(t1b, log1b);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- gradsyncd killed and started again ------------------------------------- */

static void daemon_restarts(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &two, 0, NULL);
	char log0[200], log1[200], log1b[200];
	static const char *const a0[] = { "--steps", "3", "--reconnect", NULL };
	static const char *const a1[] = { "--steps", "3", "--pause-at-step", "2",
					   "--pause-after", "5", NULL };
	pid_t t0 = trainer(&d, 0, log0, "0", a0);
	pid_t t1 = trainer(&d, 1, log1, "1", a1);
	harness_wait_for_text(log1, "PAUSED in step 2", 120);
	kill(d.pid, SIGKILL);
	harness_wait(d.pid, 5000);
	double took = harness_wait_for_text(log0, "DISCONNECTED in step 2", 5);
	print_message("the waiting trainer saw the daemon go %.3f s after the kill\n", took);
	assert_true(took < 1.0);
	assert_true(file_contains(log0, "gradsyncd closed the connection"));
	kill(t1, SIGKILL);
	harness_wait(t1, 5000);

	/* The same socket path: the stale socket file is replaced. */
	struct gs_test_daemon d2;
	harness_job_daemon_restart(&d2, &d, &two, 0, NULL);
	harness_wait_for_text(log0, "RECONNECTED: running step 2 again", 30);
	static const char *const a1b[] = { "--steps", "2", "--first-step", "2", NULL };
	pid_t t1b = trainer(&d2, 1, log1b, "1b", a1b);
	expect_success(t0, log0);
	expect_success(t1b, log1b);
	assert_int_equal(harness_daemon_stop(&d2), 0);
}

/* ---- Access -------------------------------------------------------------------- */

/* In a child that becomes uid/gid 65534 (nobody/nogroup): asks for the
 * status; exits 0 when answered, 1 when refused (message on stdout). */
static int status_as_nobody(const char *socket, char *out, size_t n)
{
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(pipefd[0]);
		if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(3);
		gs_client *c;
		int r = gs_control_connect(socket, 5000, &c);
		struct gs_status *st = NULL;
		if (r == GS_OK)
			r = gs_status_get(c, 5000, &st);
		dprintf(pipefd[1], "%s", r == GS_OK ? "answered" : gs_last_error(r == GS_OK ? c : (c ? c : NULL)));
		_exit(r == GS_OK ? 0 : 1);
	}
	close(pipefd[1]);
	ssize_t got = read(pipefd[0], out, n - 1);
	out[got > 0 ? got : 0] = '\0';
	close(pipefd[0]);
	return harness_wait(pid, 10000);
}

static void access_by_group_and_uid(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	struct gs_test_daemon d;
	static const char *const args[] = { "--group=root", NULL };
	harness_daemon_start(&d, args);
	struct stat st;
	assert_int_equal(stat(d.socket, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal(st.st_gid, 0);

	/* Open the file permissions wide: the credential check still holds. */
	chmod(d.dir, 0755);
	chmod(d.socket, 0666);
	char out[512];
	assert_int_equal(status_as_nobody(d.socket, out, sizeof(out)), 1);
	print_message("nobody was told: %s\n", out);
	assert_non_null(strstr(out, "uid 65534 (nobody"));
	assert_non_null(strstr(out, "not in group 'root'"));
	assert_true(harness_log_contains(&d, "refusing pid"));
	assert_int_equal(harness_daemon_stop(&d), 0);

	static const char *const allow[] = { "--group=root", "--allow-uids=1000,65534", NULL };
	harness_daemon_start(&d, allow);
	chmod(d.dir, 0755);
	chmod(d.socket, 0666);
	assert_int_equal(status_as_nobody(d.socket, out, sizeof(out)), 0);
	assert_true(harness_log_contains(&d, "uid 65534 gid 65534 connected"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Limits ----------------------------------------------------------------------- */

static void too_many_clients(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static const char *const args[] = { "--max-clients=2", NULL };
	/* The start-up probe's connection is closed once it returns. */
	harness_daemon_start(&d, args);
	/* The daemon accepts connections in the order they came: a and b are
	 * counted before c is looked at. */
	int a = raw_connect(d.socket), b = raw_connect(d.socket);
	int c = raw_connect(d.socket);
	raw_expect_error(c, GS_ELIMIT, "gradsyncd serves at most 2 connections (--max-clients)");
	close(c);
	raw_close(a);
	int e = raw_connect(d.socket);
	raw_hello(e, 0);
	close(b);
	close(e);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

static void too_many_tensors(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static const char *const args[] = { "--max-tensors=3", NULL };
	harness_daemon_start(&d, args);
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = d.socket;
	o.local_rank = 0;
	o.job_id = "";
	gs_client *c;
	assert_int_equal(gs_connect(&o, &c), GS_OK);
	const struct gs_tensor_spec specs[] = {
		{ "a", 10, GS_FLOAT32, -1, 0 }, { "b", 10, GS_FLOAT32, -1, 0 },
		{ "c", 10, GS_FLOAT32, -1, 0 }, { "d", 10, GS_FLOAT32, -1, 0 },
	};
	assert_int_equal(gs_register(c, specs, 4), GS_ELIMIT);
	print_message("%s\n", gs_last_error(c));
	assert_non_null(strstr(gs_last_error(c), "more than 3 tensors (--max-tensors)"));
	gs_close(c);
	/* Three are fine, and a step runs. */
	assert_int_equal(gs_connect(&o, &c), GS_OK);
	assert_int_equal(gs_register(c, specs, 3), GS_OK);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	const uint32_t idx[] = { 0, 1, 2 };
	struct gs_step_result res;
	assert_int_equal(gs_step_begin(c, &so), GS_OK);
	assert_int_equal(gs_mark_ready(c, idx, 3), GS_OK);
	assert_int_equal(gs_step_wait(c, 10000, &res), GS_OK);
	gs_close(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(trainer_killed_mid_step),
		cmocka_unit_test(gradient_never_arrives),
		cmocka_unit_test(daemon_restarts),
		cmocka_unit_test(access_by_group_and_uid),
		cmocka_unit_test(too_many_clients),
		cmocka_unit_test(too_many_tensors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
