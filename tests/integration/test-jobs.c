/*
 * Many jobs on daemons started once, as a cluster runs them: two
 * gradsyncd, each listening for the other at its own loopback address
 * (127.0.0.1, 127.0.0.2) on the same node port, and three jobs at once,
 * launched as torchrun and gradsync's own variables describe them:
 *
 *   X  2 nodes x 2 trainers, node 0 on the first daemon (torchrun's variables)
 *   Y  2 nodes x 1 trainer,  node 0 on the second daemon (GRADSYNC_*)
 *   Z  1 node  x 1 trainer,  on the first daemon
 *
 * Every trainer is gradsync-verifying-trainer, which checks every element
 * of every step against its own reference. The daemons live for the whole
 * file; each case leaves them serving.
 */
#include <errno.h>
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

#include "harness.h"

#define STRANGER_UID 61003
#define LAYOUT "resnet50.txt"

static struct gs_test_daemon daemons[2]; /* at 127.0.0.1 and 127.0.0.2 */
static int node_port;

/* One trainer: where it runs, its job (NULL-ended "NAME=value" list). */
struct trainer {
	pid_t pid;
	char log[200];
};

/* Starts a verifying trainer on daemon `node` with the environment env
 * (and nothing else of a launcher's), as uid when uid is not 0. */
static void start(struct trainer *t, unsigned node, const char *name, const char *steps,
		  const char *const *env, uid_t uid)
{
	/* A log of its own: a later case's wait must not read an earlier one's. */
	static unsigned started;
	snprintf(t->log, sizeof(t->log), "%s/%s-%u.log", daemons[node].dir, name, ++started);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", daemons[node].socket, "--layout",
			       harness_layout(LAYOUT), "--steps", steps, NULL };
	fflush(NULL);
	t->pid = fork();
	assert_true(t->pid >= 0);
	if (t->pid == 0) {
		harness_clear_launch_env();
		for (size_t i = 0; env[i]; i++)
			putenv((char *)env[i]);
		FILE *f = freopen(t->log, "w", stdout);
		if (!f || dup2(fileno(stdout), 2) < 0)
			_exit(126);
		if (uid && (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0))
			_exit(125);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
}

/* Waits for t; its exit status. */
static int finish(struct trainer *t, int timeout_ms)
{
	int st = harness_wait(t->pid, timeout_ms);
	if (st != 0)
		harness_dump(t->log);
	return st;
}

static void expect_verified(struct trainer *t, const char *steps)
{
	assert_int_equal(finish(t, 300000), 0);
	char ok[64];
	snprintf(ok, sizeof(ok), "OK: %s steps verified", steps);
	assert_true(harness_file_contains(t->log, ok));
}

/* ---- The jobs ------------------------------------------------------------- */

/* X: torchrun's variables, node n's local rank r; node 0 at 127.0.0.1. */
static void start_x(struct trainer *t, unsigned n, unsigned r, const char *steps)
{
	char rank[32], group[32]; /* the child's environment takes them as they are */
	snprintf(rank, sizeof(rank), "LOCAL_RANK=%u", r);
	snprintf(group, sizeof(group), "GROUP_RANK=%u", n);
	const char *env[] = { rank, group, "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=4",
			      "MASTER_ADDR=127.0.0.1", "TORCHELASTIC_RUN_ID=X", NULL };
	char name[32];
	snprintf(name, sizeof(name), "x-node%u-rank%u", n, r);
	start(t, n, name, steps, env, 0);
}

/* Y: gradsync's variables, node n's only trainer; node 0 at 127.0.0.2,
 * the second daemon. */
static void start_y(struct trainer *t, unsigned n, const char *steps)
{
	const char *env[] = { "GRADSYNC_JOB_ID=Y", "GRADSYNC_NODES=2",
			      n == 0 ? "GRADSYNC_NODE_RANK=0" : "GRADSYNC_NODE_RANK=1",
			      "GRADSYNC_COORDINATOR=127.0.0.2", NULL };
	start(t, n == 0 ? 1 : 0, n == 0 ? "y-node0" : "y-node1", steps, env, 0);
}

static void start_z(struct trainer *t, const char *steps)
{
	const char *env[] = { "GRADSYNC_JOB_ID=Z", NULL };
	start(t, 0, "z", steps, env, 0);
}

static void start_all_x(struct trainer x[4], const char *steps)
{
	for (unsigned n = 0; n < 2; n++)
		for (unsigned r = 0; r < 2; r++)
			start_x(&x[n * 2 + r], n, r, steps);
}

/* ---- What the daemons say ----------------------------------------------------- */

/* The value of `series{job="id"}` (or of `series` when id is NULL) in
 * daemon node's metrics; -1: absent. */
static long long metric(unsigned node, const char *series, const char *id)
{
	char cmd[512], want[160], line[512];
	snprintf(cmd, sizeof(cmd), "%s --socket %s metrics", getenv("GS_CTL"), daemons[node].socket);
	if (id)
		snprintf(want, sizeof(want), "%s{job=\"%s\"} ", series, id);
	else
		snprintf(want, sizeof(want), "%s ", series);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	long long v = -1;
	while (fgets(line, sizeof(line), p))
		if (strncmp(line, want, strlen(want)) == 0)
			v = atoll(line + strlen(want));
	pclose(p);
	return v;
}

/* The longest "wait N ms" of a verifying trainer's step lines, in ms. */
static double longest_step(const char *log)
{
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	char line[512];
	double longest = 0;
	unsigned steps = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s;
		double ms;
		if (sscanf(line, "step %llu: wait %lf ms", &s, &ms) == 2) {
			steps++;
			if (ms > longest)
				longest = ms;
		}
	}
	fclose(f);
	assert_true(steps > 0);
	return longest;
}

/* ---- Cases ---------------------------------------------------------------------- */

/* Seven trainers of three jobs, on two daemons, at once: every element of
 * every step is right, and each job built its group once. */
static void three_jobs_at_once(void **state)
{
	(void)state;
	struct trainer x[4], y[2], z;
	start_all_x(x, "3");
	start_y(&y[0], 0, "3");
	start_y(&y[1], 1, "3");
	start_z(&z, "3");
	for (int i = 0; i < 4; i++)
		expect_verified(&x[i], "3");
	expect_verified(&y[0], "3");
	expect_verified(&y[1], "3");
	expect_verified(&z, "3");
	for (unsigned node = 0; node < 2; node++) {
		assert_int_equal(metric(node, "gradsync_job_groups_built_total", "X"), 1);
		assert_int_equal(metric(node, "gradsync_job_groups_built_total", "Y"), 1);
	}
	/* Z, of one node, had no group to keep: it went with its trainer,
	 * and only the node's total counts it. */
	assert_int_equal(metric(0, "gradsync_job_groups_built_total", "Z"), -1);
	assert_int_equal(metric(1, "gradsync_job_groups_built_total", "Z"), -1);
	assert_int_equal(metric(0, "gradsync_groups_built_total", NULL), 3); /* X, Y, Z */
	assert_int_equal(metric(1, "gradsync_groups_built_total", NULL), 2); /* X, Y */
	assert_int_equal(metric(0, "gradsync_job_steps_total", "X"), 3);
	assert_int_equal(metric(1, "gradsync_job_steps_total", "Y"), 3);
}

/* A trainer of X killed in the middle of its steps: X's step aborts, naming
 * it, while Y's and Z's steps go on right and on time. */
static void a_killed_trainer_reaches_only_its_job(void **state)
{
	(void)state;
	struct trainer x[4], y[2], z;
	start_all_x(x, "1000");
	harness_wait_for_text(x[0].log, "step 2:", 240);
	start_y(&y[0], 0, "8");
	start_y(&y[1], 1, "8");
	start_z(&z, "8");
	harness_wait_for_text(y[0].log, "step 2:", 240);
	harness_wait_for_text(z.log, "step 2:", 240);
	pid_t victim = x[3].pid; /* node 1, local rank 1 */
	double killed_at = harness_now_s();
	assert_int_equal(kill(victim, SIGKILL), 0);
	harness_wait(victim, 10000);
	char pid_text[32];
	snprintf(pid_text, sizeof(pid_text), "pid %d", (int)victim);
	/* Every other trainer of X fails its step, told who left. */
	for (int i = 0; i < 3; i++) {
		assert_int_not_equal(harness_wait(x[i].pid, 120000), 0);
		assert_true(harness_file_contains(x[i].log, "aborted"));
	}
	print_message("X's trainers all stopped %.1f s after the kill\n", harness_now_s() - killed_at);
	assert_true(harness_file_contains(x[2].log, pid_text));
	/* Y and Z: every step verified, none held up by X. */
	expect_verified(&y[0], "8");
	expect_verified(&y[1], "8");
	expect_verified(&z, "8");
	double ly = longest_step(y[0].log), lz = longest_step(z.log);
	print_message("longest step while X aborted: Y %.0f ms, Z %.0f ms\n", ly, lz);
	/* A stall would wait out --step-timeout (60 s here). */
	assert_true(ly < 20000);
	assert_true(lz < 20000);
	assert_true(harness_log_contains(&daemons[0], "job 'Y'") &&
		    !harness_file_contains(y[0].log, "aborted"));
}

/* X's trainers come back within --job-linger: the first step needs no new
 * group, on either node. */
static void restarted_within_the_linger_keeps_the_group(void **state)
{
	(void)state;
	long long built[2], generation[2];
	for (unsigned node = 0; node < 2; node++) {
		built[node] = metric(node, "gradsync_groups_built_total", NULL);
		generation[node] = metric(node, "gradsync_group_generation", "X");
		assert_true(generation[node] >= 0); /* still there: lingering */
	}
	struct trainer x[4];
	start_all_x(x, "2");
	for (int i = 0; i < 4; i++)
		expect_verified(&x[i], "2");
	/* No daemon built a group since: X's first step ran in the kept one. */
	for (unsigned node = 0; node < 2; node++) {
		assert_int_equal(metric(node, "gradsync_groups_built_total", NULL), built[node]);
		assert_int_equal(metric(node, "gradsync_group_generation", "X"), generation[node]);
	}
	assert_true(harness_log_contains(&daemons[0], "job 'X': a trainer came back"));
}

/* A trainer of Y whose view differs, and one of another user, are refused
 * naming what differs, while Y runs. */
static void refusals_name_the_field(void **state)
{
	(void)state;
	struct trainer y[2], bad;
	start_y(&y[0], 0, "1000");
	start_y(&y[1], 1, "1000");
	harness_wait_for_text(y[0].log, "step 1:", 240);

	const char *threshold[] = { "GRADSYNC_JOB_ID=Y", "GRADSYNC_NODES=2", "GRADSYNC_NODE_RANK=0",
				    "GRADSYNC_COORDINATOR=127.0.0.2", "GRADSYNC_THRESHOLD=1234",
				    NULL };
	start(&bad, 1, "y-threshold", "1", threshold, 0);
	assert_int_not_equal(harness_wait(bad.pid, 30000), 0);
	assert_true(harness_file_contains(bad.log, "job 'Y': this trainer says threshold 1234, the job has 2097152"));

	const char *nodes[] = { "GRADSYNC_JOB_ID=Y", "GRADSYNC_NODES=3", "GRADSYNC_NODE_RANK=0",
				"GRADSYNC_COORDINATOR=127.0.0.2", NULL };
	start(&bad, 1, "y-nodes", "1", nodes, 0);
	assert_int_not_equal(harness_wait(bad.pid, 30000), 0);
	assert_true(harness_file_contains(bad.log, "job 'Y': this trainer says node count 3, the job has 2"));

	const char *stranger[] = { "GRADSYNC_JOB_ID=Y", "GRADSYNC_NODES=2", "GRADSYNC_NODE_RANK=0",
				   "GRADSYNC_COORDINATOR=127.0.0.2", NULL };
	start(&bad, 1, "y-stranger", "1", stranger, STRANGER_UID);
	assert_int_not_equal(harness_wait(bad.pid, 30000), 0);
	assert_true(harness_file_contains(bad.log, "job 'Y' belongs to another user"));
	/* ...and learns nothing of it: not its trainers' pids. */
	char pid_text[32];
	snprintf(pid_text, sizeof(pid_text), "%d", (int)y[0].pid);
	assert_false(harness_file_contains(bad.log, pid_text));

	/* Y itself went on. */
	assert_true(harness_daemon_alive(&daemons[1]));
	kill(y[0].pid, SIGTERM);
	kill(y[1].pid, SIGTERM);
	harness_wait(y[0].pid, 60000);
	harness_wait(y[1].pid, 60000);
	assert_false(harness_file_contains(y[0].log, "MISMATCH"));
}

static int start_daemons(void **state)
{
	(void)state;
	if (!harness_have_gloo() || geteuid() != 0)
		return 0;
	node_port = harness_free_port();
	for (unsigned node = 0; node < 2; node++) {
		static char address[2][64], port[2][64];
		snprintf(address[node], sizeof(address[node]), "--node-address=127.0.0.%u", node + 1);
		snprintf(port[node], sizeof(port[node]), "--node-port=%d", node_port);
		const char *args[] = { address[node], port[node], "--job-linger=120",
				       "--step-timeout=60", "--join-timeout=60",
				       "--allow-uids=61003", NULL };
		harness_daemon_spawn(&daemons[node], args);
	}
	for (unsigned node = 0; node < 2; node++) {
		harness_daemon_wait_ready(&daemons[node], 30000);
		/* The stranger reaches the socket; the daemon's own check decides. */
		chmod(daemons[node].dir, 0755);
		chmod(daemons[node].socket, 0666);
	}
	return 0;
}

static int stop_daemons(void **state)
{
	(void)state;
	for (unsigned node = 0; node < 2; node++)
		if (daemons[node].pid > 0)
			harness_daemon_stop(&daemons[node]);
	return 0;
}

int main(void)
{
	if (!harness_have_gloo()) {
		fprintf(stderr, "skipped: gradsyncd is built without Gloo, which several nodes need\n");
		return HARNESS_EXIT_SKIP;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "skipped: a trainer of another user needs root to start\n");
		return HARNESS_EXIT_SKIP;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(three_jobs_at_once),
		cmocka_unit_test(a_killed_trainer_reaches_only_its_job),
		cmocka_unit_test(restarted_within_the_linger_keeps_the_group),
		cmocka_unit_test(refusals_name_the_field),
	};
	return cmocka_run_group_tests(tests, start_daemons, stop_daemons);
}
