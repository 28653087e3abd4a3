/*
 * Several nodes on this machine: one gradsyncd per node, joined through the
 * node-rank-0 daemon's rendezvous and all-reducing over Gloo on loopback,
 * each with its own trainer processes (gradsync-verifying-trainer). Every
 * trainer regenerates every global rank's inputs and checks each element
 * against its fp64 reference (allowing one rounding per node hop), so the
 * test passes only when all trainers of all nodes got the same correct sum.
 * Then the ways a job of several nodes must fail, each in bounded time.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"
#include "node_protocol.h"

#define MAX_NODES 4

struct nodes_case {
	const char *layout;
	unsigned nodes;
	unsigned local[MAX_NODES];
	const char *steps;
	const char *daemon_args[4];
	const char *trainer_args[6];
};

struct node {
	struct gs_test_daemon d;
	char args[6][64];
	const char *argv[12];
};

/* ---- Cluster secrets --------------------------------------------------------- */

static char secret_dir[64];

/* Writes a secret file of this process's own directory with the mode. */
static const char *write_secret(const char *name, const char *text, mode_t mode)
{
	if (!secret_dir[0]) {
		snprintf(secret_dir, sizeof(secret_dir), "/tmp/gradsync-secret-XXXXXX");
		assert_non_null(mkdtemp(secret_dir));
	}
	static char paths[8][128];
	static unsigned next;
	char *path = paths[next++ % 8];
	snprintf(path, 128, "%s/%s", secret_dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

/* Removes the directory of a daemon that has exited as it should. */
static void forget_daemon(const struct gs_test_daemon *d)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
}

static void remove_secrets(void)
{
	if (!secret_dir[0])
		return;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", secret_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", secret_dir);
}

/* Starts the daemon of node `rank` of `nodes`. */
static void spawn_node(struct node *n, unsigned nodes, unsigned rank, unsigned local,
		       const char *const *extra, int port)
{
	snprintf(n->args[0], 64, "--nodes=%u", nodes);
	snprintf(n->args[1], 64, "--node-rank=%u", rank);
	snprintf(n->args[2], 64, "--coordinator=127.0.0.1:%d", port);
	snprintf(n->args[3], 64, "--local-size=%u", local);
	snprintf(n->args[4], 64, "--gloo-host=127.0.0.1");
	snprintf(n->args[5], 64, "--join-timeout=30");
	size_t k = 0;
	for (; k < 6; k++)
		n->argv[k] = n->args[k];
	for (size_t i = 0; extra && extra[i]; i++)
		n->argv[k++] = extra[i];
	n->argv[k] = NULL;
	harness_daemon_spawn(&n->d, n->argv);
}

static void spawn_nodes(struct node *n, unsigned nodes, const unsigned *local,
			const char *const *extra, int port)
{
	for (unsigned r = 0; r < nodes; r++)
		spawn_node(&n[r], nodes, r, local[r], extra, port);
}

static pid_t spawn_trainer(const struct node *n, unsigned rank, const char *layout,
			   const char *steps, const char *const *extra, char *log)
{
	char r[16];
	snprintf(r, sizeof(r), "%u", rank);
	snprintf(log, 200, "%s/trainer-%u.log", n->d.dir, rank);
	const char *argv[24] = {
		getenv("GS_TRAINER"), "--socket", n->d.socket, "--layout", layout,
		"--rank", r, "--steps", steps,
	};
	size_t k = 9;
	for (size_t i = 0; extra && extra[i]; i++)
		argv[k++] = extra[i];
	return harness_spawn(argv, log);
}

/* Chunks a step of layout `name` goes through with the default threshold
 * (2097152 elements) and fusion buffer (4194304), by the plan's rule as
 * DESIGN.md words it, counted here and not by the code under test. */
static uint64_t default_chunks(const char *name)
{
	const uint64_t threshold = 2097152, fusion = 4194304;
	FILE *f = fopen(harness_layout(name), "r");
	assert_non_null(f);
	char line[512], tensor[256];
	unsigned long long count;
	uint64_t acc = 0, chunks = 0;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#' || sscanf(line, "%255s %llu", tensor, &count) != 2)
			continue;
		if (count > threshold) {
			chunks += (count + fusion - 1) / fusion;
			continue;
		}
		acc += count;
		if (acc > threshold) {
			chunks += (acc + fusion - 1) / fusion;
			acc = 0;
		}
	}
	fclose(f);
	return chunks + (acc + fusion - 1) / fusion;
}

/* After the steps, each node's status names every node and, for fp16 on two
 * nodes (a ring sends 2 (N - 1) / N = 1 buffer), the exact bytes sent: every
 * chunk's gradients and its status of 4 elements (chunk_status.h). */
static void check_status(const struct nodes_case *c, struct node *n)
{
	uint32_t world = 0;
	for (unsigned r = 0; r < c->nodes; r++)
		world += c->local[r];
	for (unsigned r = 0; r < c->nodes; r++) {
		gs_client *ctl;
		struct gs_status *st;
		assert_int_equal(gs_control_connect(n[r].d.socket, 5000, &ctl), GS_OK);
		assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
		assert_int_equal(st->node_rank, r);
		assert_int_equal(st->nodes, c->nodes);
		assert_int_equal(st->world_size, world);
		assert_int_equal(st->peer_count, c->nodes);
		for (unsigned p = 0; p < c->nodes; p++) {
			assert_int_equal(st->peers[p].node_rank, p);
			assert_int_equal(st->peers[p].local_size, c->local[p]);
			assert_string_equal(st->peers[p].state, p == r ? "this node" : "joined");
		}
		uint64_t steps = strtoull(c->steps, NULL, 10);
		assert_int_equal(st->steps_completed, steps);
		if (c->nodes == 2 && !c->daemon_args[0])
			assert_int_equal(st->internode_bytes,
					 steps * (harness_layout_elements(c->layout) +
						  4 * default_chunks(c->layout)) * 2);
		else
			assert_true(st->internode_bytes > 0);
		gs_status_free(st);
		gs_close(ctl);
	}
}

/* Runs the case's trainers on nodes that have joined, checks them and
 * every node's status, and stops the daemons. */
static void run_steps(const struct nodes_case *c, struct node *n)
{
	pid_t pids[MAX_NODES][4];
	char logs[MAX_NODES][4][200];
	for (unsigned r = 0; r < c->nodes; r++)
		for (unsigned l = 0; l < c->local[r]; l++)
			pids[r][l] = spawn_trainer(&n[r], l, harness_layout(c->layout), c->steps,
						   c->trainer_args, logs[r][l]);
	int failed = 0;
	for (unsigned r = 0; r < c->nodes; r++) {
		for (unsigned l = 0; l < c->local[r]; l++) {
			if (harness_wait(pids[r][l], 240000) != 0) {
				harness_dump(logs[r][l]);
				failed = 1;
			}
		}
	}
	if (!failed)
		check_status(c, n);
	for (unsigned r = 0; r < c->nodes; r++) {
		if (failed)
			harness_dump(n[r].d.log);
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	}
	assert_int_equal(failed, 0);
}

static void run_case(const struct nodes_case *c)
{
	struct node n[MAX_NODES];
	spawn_nodes(n, c->nodes, c->local, c->daemon_args, harness_free_port());
	for (unsigned r = 0; r < c->nodes; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	run_steps(c, n);
}

#define CASE(name, ...)                                                        \
	static void name(void **state)                                         \
	{                                                                      \
		(void)state;                                                   \
		static const struct nodes_case c = __VA_ARGS__;                \
		run_case(&c);                                                  \
	}

CASE(two_nodes_one_trainer_fp16, { "resnet50.txt", 2, { 1, 1 }, "3", { NULL }, { NULL } })
CASE(two_nodes_two_trainers_fp16, { "resnet50.txt", 2, { 2, 2 }, "2", { NULL }, { NULL } })
CASE(three_nodes_one_trainer_fp16, { "resnet50.txt", 3, { 1, 1, 1 }, "2", { NULL }, { NULL } })
CASE(uneven_nodes_one_and_two, { "resnet50.txt", 2, { 1, 2 }, "2", { NULL }, { NULL } })
CASE(two_nodes_bf16_clipping,
     { "resnet50.txt", 2, { 1, 1 }, "2", { "--wire=bf16", NULL }, { "--clip", "0.5", NULL } })
CASE(two_nodes_fp16_sum_clipping,
     { "resnet50.txt", 2, { 2, 1 }, "2", { "--op=sum", NULL }, { "--clip", "1.0", NULL } })
CASE(two_nodes_two_trainers_fp32_exact,
     { "resnet50.txt", 2, { 2, 2 }, "2", { "--wire=fp32", NULL }, { "--pattern", "pow2", "--exact", NULL } })
CASE(two_nodes_fp32_sum_exact,
     { "resnet50.txt", 2, { 1, 1 }, "2", { "--wire=fp32", "--op=sum", NULL }, { "--pattern", "pow2", "--exact", NULL } })
CASE(three_nodes_uneven_bf16_sum,
     { "resnet50.txt", 3, { 1, 2, 1 }, "2", { "--wire=bf16", "--op=sum", NULL }, { NULL } })

/* ---- Failures, each within a bound the test checks -------------------- */

static double seconds_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void expect_in_log(const char *path, const char *text)
{
	if (!harness_file_contains(path, text)) {
		harness_dump(path);
		fail_msg("'%s' not found in %s", text, path);
	}
}

/* Node 1's trainers register a layout whose tensor 5 (in registration
 * order) has one element more: every trainer of both nodes is refused,
 * with the nodes and the tensor named, instead of a hang or a wrong sum. */
static void layout_mismatch_between_nodes(void **state)
{
	(void)state;
	char other[] = "/tmp/gradsync-layout-XXXXXX";
	int fd = mkstemp(other);
	assert_true(fd >= 0);
	FILE *in = fopen(harness_layout("resnet50.txt"), "r");
	FILE *out = fdopen(fd, "w");
	char line[512];
	int kept = 0;
	while (fgets(line, sizeof(line), in)) {
		char name[256];
		unsigned long long count;
		if (line[0] != '#' && sscanf(line, "%255s %llu", name, &count) == 2 &&
		    ++kept == 161 - 5) /* the 6th tensor in backpropagation order */
			fprintf(out, "%s %llu changed\n", name, count + 1);
		else
			fputs(line, out);
	}
	fclose(in);
	fclose(out);

	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	spawn_nodes(n, 2, local, NULL, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pid_t p0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "1", NULL, log0);
	pid_t p1 = spawn_trainer(&n[1], 0, other, "1", NULL, log1);
	assert_int_not_equal(harness_wait(p0, 30000), 0);
	assert_int_not_equal(harness_wait(p1, 30000), 0);
	double took = seconds_since(&t0);
	print_message("both trainers refused after %.2f s\n", took);
	assert_true(took < 20);
	expect_in_log(log0, "layouts differ between node 0 and node 1: tensor 5 is");
	expect_in_log(log1, "layouts differ between node 0 and node 1: tensor 5 is");
	expect_in_log(n[0].d.log, "the nodes do not agree on the layout");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	remove(other);
}

/* A daemon that believes in three nodes joins a rendezvous of two. */
static void wrong_world_size(void **state)
{
	(void)state;
	int port = harness_free_port();
	struct gs_test_daemon d0, d1;
	char a0[4][64], a1[4][64];
	snprintf(a0[0], 64, "--nodes=2");
	snprintf(a0[1], 64, "--node-rank=0");
	snprintf(a0[2], 64, "--coordinator=127.0.0.1:%d", port);
	snprintf(a0[3], 64, "--gloo-host=127.0.0.1");
	snprintf(a1[0], 64, "--nodes=3");
	snprintf(a1[1], 64, "--node-rank=1");
	snprintf(a1[2], 64, "--coordinator=127.0.0.1:%d", port);
	snprintf(a1[3], 64, "--join-timeout=20");
	const char *v0[] = { a0[0], a0[1], a0[2], a0[3], NULL };
	const char *v1[] = { a1[0], a1[1], a1[2], a1[3], NULL };
	harness_daemon_spawn(&d0, v0);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	harness_daemon_spawn(&d1, v1);
	int status = harness_wait(d1.pid, 25000);
	double took = seconds_since(&t0);
	print_message("the daemon of the wrong world size exited with %d after %.2f s\n", status, took);
	assert_int_equal(status, 1);
	assert_true(took < 15);
	expect_in_log(d1.log, "node 1 expects 3 nodes but the coordinator (node 0) runs 2");
	expect_in_log(d0.log, "node 1 expects 3 nodes but the coordinator (node 0) runs 2");
	assert_true(harness_daemon_alive(&d0));
	assert_int_equal(harness_daemon_stop(&d0), 0);
}

/* ---- Failures across nodes ------------------------------------------------ */

static void expect_exit(pid_t pid, int status, const char *log)
{
	int got = harness_wait(pid, 120000);
	if (got != status)
		harness_dump(log);
	assert_int_equal(got, status);
}

/* Node 1's trainer is killed mid-step: node 0's trainer hears of it
 * through the next bucket's vote, naming node and rank; a restarted
 * trainer on node 1 registers again (the job's layout is still agreed)
 * and the next step is right on both nodes. */
static void trainer_killed_on_other_node(void **state)
{
	(void)state;
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	spawn_nodes(n, 2, local, NULL, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200], log1b[200];
	static const char *const a0[] = { "--expect-abort-at", "2", NULL };
	static const char *const a1[] = { "--pause-at-step", "2", "--pause-after", "40", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", a1, log1);
	harness_wait_for_text(log1, "PAUSED in step 2", 120);
	kill(t1, SIGKILL);
	double took = harness_wait_for_text(log0, "ABORTED step 2 as expected", 10);
	print_message("node 0's trainer learned of it %.3f s after the kill\n", took);
	assert_true(took < 3.0);
	expect_in_log(log0, "trainer local rank 0 of node 1 went away during step 2");
	harness_wait(t1, 5000);

	static const char *const a1b[] = { "--first-step", "3", NULL };
	pid_t t1b = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "1", a1b, log1b);
	expect_exit(t0, 0, log0);
	expect_exit(t1b, 0, log1b);
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

/* Node 1's daemon is killed while node 0 waits for it in a collective:
 * node 0's trainer gets the step aborted naming node 1, node 0's daemon
 * stays up, and when node 1's daemon is started again the group is
 * rebuilt and the next step is right. */
static void peer_daemon_killed_and_back(void **state)
{
	(void)state;
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	int port = harness_free_port();
	static const char *const extra[] = { "--peer-timeout=10", NULL };
	spawn_nodes(n, 2, local, extra, port);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200], log1b[200];
	static const char *const a0[] = { "--expect-abort-at", "2", NULL };
	static const char *const a1[] = { "--pause-at-step", "2", "--pause-after", "5", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", a1, log1);
	harness_wait_for_text(log1, "PAUSED in step 2", 120);
	/* Node 0's trainer must be in step 2 too, so that the step is in
	 * flight when the peer goes (a step begun after it waits instead). */
	harness_wait_in_step(&n[0].d, 2);
	kill(n[1].d.pid, SIGKILL);
	kill(t1, SIGKILL);
	double took = harness_wait_for_text(log0, "ABORTED step 2 as expected", 15);
	print_message("node 0's trainer learned of it %.3f s after the kill\n", took);
	assert_true(took < 5.0);
	expect_in_log(log0, "node 1 went away");
	harness_wait(n[1].d.pid, 5000);
	harness_wait(t1, 5000);
	assert_true(harness_daemon_alive(&n[0].d));

	/* Node 1 comes back: a new daemon with the same rank. */
	struct node back;
	spawn_node(&back, 2, 1, 1, extra, port);
	harness_daemon_wait_ready(&back.d, 30000);
	static const char *const a1b[] = { "--first-step", "3", NULL };
	pid_t t1b = spawn_trainer(&back, 0, harness_layout("resnet50.txt"), "1", a1b, log1b);
	expect_exit(t0, 0, log0);
	expect_exit(t1b, 0, log1b);
	expect_in_log(n[0].d.log, "rebuilding the group (generation 1)");
	assert_int_equal(harness_daemon_stop(&n[0].d), 0);
	assert_int_equal(harness_daemon_stop(&back.d), 0);
}

/* Node 1's trainer is late in step 2 by 5 s, past --peer-timeout (2 s) but
 * within --step-timeout: node 0 waits for it in the bucket's vote, and
 * every step is right on both nodes. (The vote is bounded by
 * --step-timeout plus --peer-timeout, not --peer-timeout alone, which
 * broke the group here.) */
static void trainer_late_on_other_node(void **state)
{
	(void)state;
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	static const char *const extra[] = { "--peer-timeout=2", NULL };
	spawn_nodes(n, 2, local, extra, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	static const char *const late[] = { "--pause-at-step", "2", "--pause-after", "40",
					    "--pause-for", "5", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", NULL, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", late, log1);
	expect_exit(t0, 0, log0);
	expect_exit(t1, 0, log1);
	expect_in_log(log1, "PAUSED in step 2");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

/* The group fails with every node there: node 0's --step-timeout (2 s) is
 * far below node 1's, so node 0's vote on a bucket that waits for node
 * 1's late trainer (8 s) times out (4 s) and breaks its Gloo group. Node 0 asks
 * the coordinator for a new group; every node aborts step 2 and builds
 * it, and step 3 is right on both. Without the request the group stays
 * broken and every later step fails. */
static void group_rebuilt_after_it_failed(void **state)
{
	(void)state;
	struct node n[2];
	int port = harness_free_port();
	static const char *const quick[] = { "--peer-timeout=2", "--step-timeout=2", NULL };
	static const char *const patient[] = { "--peer-timeout=2", NULL };
	spawn_node(&n[0], 2, 0, 1, quick, port);
	spawn_node(&n[1], 2, 1, 1, patient, port);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	static const char *const a0[] = { "--expect-abort-at", "2", NULL };
	static const char *const a1[] = { "--pause-at-step", "2", "--pause-after", "40",
					  "--pause-for", "8", "--expect-abort-at", "2", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", a1, log1);
	expect_exit(t0, 0, log0);
	expect_exit(t1, 0, log1);
	expect_in_log(n[0].d.log, "asking the coordinator to rebuild it");
	expect_in_log(n[0].d.log, "rebuilding the group (generation 1)");
	expect_in_log(log1, "the group of nodes failed on node 0");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

/* Once node 0's trainer has paused in step 2 and every other node is in
 * that step, kills node 0's daemon and trainer, and reaps them. */
static void kill_node0_in_step_2(struct node *n, unsigned nodes, pid_t t0, const char *log0)
{
	harness_wait_for_text(log0, "PAUSED in step 2", 120);
	for (unsigned r = 1; r < nodes; r++)
		harness_wait_in_step(&n[r].d, 2);
	kill(n[0].d.pid, SIGKILL);
	kill(t0, SIGKILL);
	harness_wait(n[0].d.pid, 5000);
	harness_wait(t0, 5000);
	forget_daemon(&n[0].d);
}

/* Node 0's daemon, the coordinator, is killed with its trainer while the
 * other nodes wait for it in step 2's collectives: their trainers get the
 * step aborted naming node 0 within seconds and stay connected. A new
 * node-0 daemon on the same port, knowing nothing of the job, is joined by
 * the other daemons, which offer it their layout again; node 0's restarted
 * trainer registers, and step 3 is right on every node (every element
 * checked by the trainers). Without the re-join, the new node 0 never sees
 * the others and never starts serving. */
static void coordinator_killed_and_back(unsigned nodes)
{
	struct node n[MAX_NODES];
	const unsigned local[MAX_NODES] = { 1, 1, 1, 1 };
	int port = harness_free_port();
	static const char *const extra[] = { "--peer-timeout=30", NULL };
	spawn_nodes(n, nodes, local, extra, port);
	for (unsigned r = 0; r < nodes; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char logs[MAX_NODES][200], log0b[200];
	pid_t t[MAX_NODES];
	static const char *const a0[] = { "--pause-at-step", "2", "--pause-after", "5", NULL };
	static const char *const ak[] = { "--expect-abort-at", "2", NULL };
	for (unsigned r = 0; r < nodes; r++)
		t[r] = spawn_trainer(&n[r], 0, harness_layout("resnet50.txt"), "3", r ? ak : a0,
				     logs[r]);
	kill_node0_in_step_2(n, nodes, t[0], logs[0]);
	for (unsigned r = 1; r < nodes; r++) {
		double took = harness_wait_for_text(logs[r], "ABORTED step 2 as expected", 15);
		print_message("node %u's trainer learned of it %.3f s after the kill\n", r, took);
		assert_true(took < 5.0);
		expect_in_log(logs[r], "node 0 (the coordinator) went away");
		assert_true(harness_daemon_alive(&n[r].d));
	}

	/* systemd's Restart=on-failure: a new daemon of rank 0, same port. */
	struct node back;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	spawn_node(&back, nodes, 0, 1, extra, port);
	harness_daemon_wait_ready(&back.d, 30000);
	for (unsigned r = 1; r < nodes; r++)
		harness_wait_for_text(n[r].d.log, "re-joined the coordinator", 30);
	print_message("every node re-joined %.3f s after node 0's daemon was started again\n",
		      seconds_since(&t0));
	static const char *const a0b[] = { "--first-step", "3", NULL };
	pid_t t0b = spawn_trainer(&back, 0, harness_layout("resnet50.txt"), "1", a0b, log0b);
	expect_exit(t0b, 0, log0b);
	for (unsigned r = 1; r < nodes; r++)
		expect_exit(t[r], 0, logs[r]);
	print_message("step 3 done on every node %.3f s after the restart\n", seconds_since(&t0));
	for (unsigned r = 1; r < nodes; r++)
		expect_in_log(n[r].d.log, "offering its layout to the restarted coordinator");
	assert_int_equal(harness_daemon_stop(&back.d), 0);
	for (unsigned r = 1; r < nodes; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

static void coordinator_killed_and_back_two_nodes(void **state)
{
	(void)state;
	coordinator_killed_and_back(2);
}

static void coordinator_killed_and_back_three_nodes(void **state)
{
	(void)state;
	coordinator_killed_and_back(3);
}

/* While node 0 is away, node 1's trainer is replaced: the new one
 * registers on node 1 (its layout is offered to the coordinator once
 * node 1 has re-joined it), and when node 0 is back with a new trainer,
 * step 3 is right on both nodes. */
static void trainer_registers_while_coordinator_away(void **state)
{
	(void)state;
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	int port = harness_free_port();
	static const char *const extra[] = { "--peer-timeout=30", NULL };
	spawn_nodes(n, 2, local, extra, port);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200], log0b[200], want[120];
	static const char *const a0[] = { "--pause-at-step", "2", "--pause-after", "5", NULL };
	static const char *const a1[] = { "--expect-abort-at", "2", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "2", a1, log1);
	kill_node0_in_step_2(n, 2, t0, log0);
	expect_exit(t1, 0, log1); /* step 2 aborted as expected, then done */

	/* A new trainer on node 1 while node 0 is still away. */
	static const char *const b[] = { "--first-step", "3", NULL };
	pid_t t1b = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "1", b, log1);
	snprintf(want, sizeof(want), "trainer pid %d uid %u (local rank 0) registered 161 tensors",
		 (int)t1b, (unsigned)getuid());
	harness_wait_for_text(n[1].d.log, want, 30);
	assert_true(harness_daemon_alive(&n[1].d));

	struct node back;
	spawn_node(&back, 2, 0, 1, extra, port);
	harness_daemon_wait_ready(&back.d, 30000);
	pid_t t0b = spawn_trainer(&back, 0, harness_layout("resnet50.txt"), "1", b, log0b);
	expect_exit(t0b, 0, log0b);
	expect_exit(t1b, 0, log1);
	expect_in_log(n[1].d.log, "offering its layout to the restarted coordinator");
	assert_int_equal(harness_daemon_stop(&back.d), 0);
	assert_int_equal(harness_daemon_stop(&n[1].d), 0);
}

/* Node 0's daemon killed and not restarted: node 1's trainer gets step 2
 * aborted, and its step 3 is aborted --step-timeout seconds in, with a
 * reason that says the group of nodes is not whole, not left waiting. */
static void coordinator_stays_away(void **state)
{
	(void)state;
	enum { STEP_TIMEOUT_S = 3 };
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	static const char *const extra[] = { "--peer-timeout=30", "--step-timeout=3", NULL };
	spawn_nodes(n, 2, local, extra, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	static const char *const a0[] = { "--pause-at-step", "2", "--pause-after", "5", NULL };
	static const char *const a1[] = { "--expect-abort-at", "2", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", a1, log1);
	kill_node0_in_step_2(n, 2, t0, log0);
	harness_wait_for_text(log1, "ABORTED step 2 as expected", 15);
	struct timespec began;
	clock_gettime(CLOCK_MONOTONIC, &began);
	expect_exit(t1, 1, log1);
	double took = seconds_since(&began);
	print_message("step 3 ended %.2f s after step 2's abort (--step-timeout=%d)\n", took,
		      STEP_TIMEOUT_S);
	assert_true(took >= STEP_TIMEOUT_S - 0.5 && took < STEP_TIMEOUT_S + 5);
	expect_in_log(log1, "the group of nodes is not whole again");
	assert_true(harness_daemon_alive(&n[1].d));
	assert_int_equal(harness_daemon_stop(&n[1].d), 0);
}

/* A tensor of many chunks, and node 1's daemon killed while node 0 is
 * reducing it: node 0's trainer gets the step aborted, and the tensor
 * holds that trainer's own gradient in full (check_aborted in the example
 * trainer compares every element), not the chunks reduced before the
 * loss. The kill waits until node 0's trace shows chunks of the bucket
 * done, so that it lands between two of its chunks. */
static void peer_lost_between_chunks(void **state)
{
	(void)state;
	enum { BIG = 1 << 25, FUSION = 1024 }; /* 32,768 chunks */
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	char fusion[32];
	snprintf(fusion, sizeof(fusion), "--fusion-buffer=%d", FUSION);
	const char *const extra[] = { "--peer-timeout=10", fusion, NULL };
	spawn_nodes(n, 2, local, extra, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);

	char layout[200], trace[200], chunks[64], log0[200], log1[200];
	snprintf(layout, sizeof(layout), "%s/big.txt", n[0].d.dir);
	FILE *f = fopen(layout, "w");
	assert_non_null(f);
	fprintf(f, "first 1000\nbig %d\nlast 1000\n", BIG);
	fclose(f);
	snprintf(trace, sizeof(trace), "%s/trace.json", n[0].d.dir);
	int fd = open(trace, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	gs_client *ctl;
	assert_int_equal(gs_control_connect(n[0].d.socket, 5000, &ctl), GS_OK);
	assert_int_equal(gs_trace_start(ctl, fd, 5000, NULL), GS_OK);
	close(fd);

	static const char *const a0[] = { "--expect-abort-at", "1", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, layout, "1", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, layout, "1", NULL, log1);
	snprintf(chunks, sizeof(chunks), "\"chunks\":%d", BIG / FUSION);
	harness_wait_for_text(trace, chunks, 120);
	kill(n[1].d.pid, SIGKILL);
	kill(t1, SIGKILL);
	harness_wait_for_text(log0, "ABORTED step 1 as expected", 30);
	expect_in_log(log0, "node 1 went away");
	expect_exit(t0, 0, log0);
	harness_wait(n[1].d.pid, 5000);
	harness_wait(t1, 5000);
	gs_close(ctl);
	assert_int_equal(harness_daemon_stop(&n[0].d), 0);
}

/* Once two nodes have joined, a third daemon claiming node rank 1 is
 * refused, and the job it tried to enter goes on. */
static void clashing_node_rank(void **state)
{
	(void)state;
	struct node n[2];
	const unsigned local[2] = { 1, 1 };
	int port = harness_free_port();
	spawn_nodes(n, 2, local, NULL, port);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char coord[64];
	snprintf(coord, sizeof(coord), "--coordinator=127.0.0.1:%d", port);
	const char *v[] = { "--nodes=2", "--node-rank=1", coord, "--join-timeout=10", NULL };
	struct gs_test_daemon d;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	harness_daemon_spawn(&d, v);
	int status = harness_wait(d.pid, 15000);
	double took = seconds_since(&t0);
	print_message("the second node rank 1 exited with %d after %.2f s\n", status, took);
	assert_int_equal(status, 1);
	assert_true(took < 5);
	expect_in_log(d.log, "node rank 1 has already joined");
	expect_in_log(n[0].d.log, "node rank 1 has already joined");
	for (unsigned r = 0; r < 2; r++) {
		assert_true(harness_daemon_alive(&n[r].d));
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	}
}

/* A TCP connection to the rendezvous on 127.0.0.1:port, retried while the
 * coordinator starts; receives time out after timeout_s. */
static int tcp_connect(int port, int timeout_s)
{
	int fd = -1;
	for (int i = 0; i < 500 && fd < 0; i++) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
			close(fd);
			fd = -1;
			usleep(20000);
		}
	}
	assert_true(fd >= 0);
	struct timeval tv = { timeout_s, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_node_hello(int fd, uint32_t version)
{
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = version;
	h.node_rank = 1;
	h.nodes = 2;
	h.local_size = 1;
	h.settings = "";
	h.host = "";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	raw_send(fd, &m, NULL, 0);
}

static void send_node_auth(int fd, uint32_t version, bool has_secret)
{
	uint8_t nonce[32];
	for (size_t i = 0; i < sizeof(nonce); i++)
		nonce[i] = (uint8_t)(i * 7 + 1);
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = version;
	a.node_rank = 1;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.has_secret = has_secret;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	raw_send(fd, &m, NULL, 0);
}

/* A peer speaking another protocol version is refused with both numbers,
 * whether it says so in a NodeHello (a daemon from before the rendezvous
 * was authenticated) or in its NodeAuth, and whether the coordinator has
 * a cluster secret or not: never as a failed authentication. */
static void other_protocol_version(void **state)
{
	(void)state;
	const char *secret = write_secret("s", "0123456789abcdef0123456789abcdef\n", 0600);
	for (int with_secret = 0; with_secret < 2; with_secret++) {
		int port = harness_free_port();
		char coord[64], file[300];
		snprintf(coord, sizeof(coord), "--coordinator=127.0.0.1:%d", port);
		snprintf(file, sizeof(file), "--cluster-secret-file=%s", secret);
		const char *v[] = { "--nodes=2", "--node-rank=0", coord, with_secret ? file : NULL, NULL };
		struct gs_test_daemon d0;
		harness_daemon_spawn(&d0, v);
		/* 99; 1: the daemons from before the authentication; 2: before
		 * the cuda backend's keys of each group; 3: before the chunks'
		 * status; 4: before the pings. */
		static const uint32_t versions[] = { 99, 1, 2, 3, 4 };
		for (int k = 0; k < 5; k++)
			for (int auth = 0; auth < 2; auth++) {
				int fd = tcp_connect(port, 10);
				if (auth)
					send_node_auth(fd, versions[k], with_secret);
				else
					send_node_hello(fd, versions[k]);
				char want[120];
				snprintf(want, sizeof(want),
					 "node 1 speaks protocol version %u; the coordinator (node 0) speaks %d",
					 versions[k], GS_NODE_PROTOCOL_VERSION);
				raw_expect_error(fd, GS_EVERSION, want);
				close(fd);
			}
		expect_in_log(d0.log, "node 1 speaks protocol version 99");
		expect_in_log(d0.log, "node 1 speaks protocol version 1;");
		expect_in_log(d0.log, "node 1 speaks protocol version 2;");
		expect_in_log(d0.log, "node 1 speaks protocol version 3;");
		expect_in_log(d0.log, "node 1 speaks protocol version 4;");
		assert_int_equal(harness_daemon_stop(&d0), 0);
	}
}

static void coordinator_never_appears(void **state)
{
	(void)state;
	char coord[64];
	snprintf(coord, sizeof(coord), "--coordinator=127.0.0.1:%d", harness_free_port());
	const char *v[] = { "--nodes=2", "--node-rank=1", coord, "--join-timeout=2", NULL };
	struct gs_test_daemon d;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	harness_daemon_spawn(&d, v);
	int status = harness_wait(d.pid, 15000);
	double took = seconds_since(&t0);
	print_message("gradsyncd gave up after %.2f s with status %d\n", took, status);
	assert_int_equal(status, 1);
	assert_true(took >= 2.0 && took < 6);
	expect_in_log(d.log, "did not answer within 2 s");
}


/* ---- The cluster secret ------------------------------------------------------ */

#define SECRET_A "the one secret of this cluster, 0123456789\n"
#define SECRET_B "the one secret of another cluster, 98765\n"

static unsigned count_in_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char line[4096];
	unsigned n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	fclose(f);
	return n;
}

/* Two nodes holding the same secret authenticate each other and sync
 * right, without the warning of an open rendezvous. */
static void two_nodes_with_a_secret(void **state)
{
	(void)state;
	char arg[300];
	snprintf(arg, sizeof(arg), "--cluster-secret-file=%s", write_secret("same", SECRET_A, 0600));
	struct nodes_case c = { "resnet50.txt", 2, { 1, 1 }, "2", { arg, NULL }, { NULL } };
	struct node n[2];
	spawn_nodes(n, 2, c.local, c.daemon_args, harness_free_port());
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	/* Node 0's own daemon and node 1 both proved themselves. */
	expect_in_log(n[0].d.log, "authenticated as node 0");
	expect_in_log(n[0].d.log, "authenticated as node 1");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(count_in_file(n[r].d.log, "is unauthenticated"), 0);
	run_steps(&c, n);
}

/* Node 1 holds another secret: it exits at once naming the cause, and
 * node 0 logs who it refused and goes on serving the rendezvous, which a
 * node 1 with the right secret then joins. */
static void wrong_cluster_secret(void **state)
{
	(void)state;
	char a[300], b[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("a", SECRET_A, 0600));
	snprintf(b, sizeof(b), "--cluster-secret-file=%s", write_secret("b", SECRET_B, 0400));
	const char *ea[] = { a, NULL }, *eb[] = { b, NULL };
	int port = harness_free_port();
	struct node n0, n1, back;
	spawn_node(&n0, 2, 0, 1, ea, port);
	double t0 = harness_now_s();
	spawn_node(&n1, 2, 1, 1, eb, port);
	int status = harness_wait(n1.d.pid, 20000);
	double took = harness_now_s() - t0;
	print_message("node 1 with the wrong secret exited with %d after %.2f s\n", status, took);
	if (status != 1)
		harness_dump(n1.d.log);
	assert_int_equal(status, 1);
	assert_true(took < 5);
	expect_in_log(n1.d.log, "the coordinator refused node 1: cluster secret differs (check --cluster-secret-file on every node)");
	expect_in_log(n0.d.log, "rendezvous: refused node 1 from 127.0.0.1:");
	expect_in_log(n0.d.log, "cluster secret differs");
	assert_true(harness_daemon_alive(&n0.d));
	forget_daemon(&n1.d);

	spawn_node(&back, 2, 1, 1, ea, port);
	harness_daemon_wait_ready(&n0.d, 30000);
	harness_daemon_wait_ready(&back.d, 30000);
	assert_int_equal(harness_daemon_stop(&back.d), 0);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
}

/* A secret on one side only is refused on both sides, whichever side has
 * it; the side without one warns at start that its rendezvous is open. */
static void cluster_secret_on_one_node_only(void **state)
{
	(void)state;
	char a[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("one", SECRET_A, 0600));
	const char *ea[] = { a, NULL };
	static const char *const why[2] = {
		"it has no cluster secret, but the coordinator has one (set the same --cluster-secret-file on every node)",
		"it has a cluster secret, but the coordinator has none (set the same --cluster-secret-file on every node)",
	};
	for (unsigned holder = 0; holder < 2; holder++) {
		int port = harness_free_port();
		struct node n0, n1;
		spawn_node(&n0, 2, 0, 1, holder == 0 ? ea : NULL, port);
		double t0 = harness_now_s();
		spawn_node(&n1, 2, 1, 1, holder == 1 ? ea : NULL, port);
		int status = harness_wait(n1.d.pid, 20000);
		double took = harness_now_s() - t0;
		print_message("secret on node %u only: node 1 exited with %d after %.2f s\n", holder,
			      status, took);
		if (status != 1)
			harness_dump(n1.d.log);
		assert_int_equal(status, 1);
		assert_true(took < 5);
		char said[300];
		snprintf(said, sizeof(said), "the coordinator refused node 1: %s", why[holder]);
		expect_in_log(n1.d.log, said);
		snprintf(said, sizeof(said), ": %s", why[holder]);
		expect_in_log(n0.d.log, "rendezvous: refused node 1 from 127.0.0.1:");
		expect_in_log(n0.d.log, said);
		const char *open_log = holder == 0 ? n1.d.log : n0.d.log;
		const char *closed_log = holder == 0 ? n0.d.log : n1.d.log;
		assert_int_equal(count_in_file(open_log, "is unauthenticated: anyone who reaches it can join"), 1);
		expect_in_log(open_log, "set --cluster-secret-file (GRADSYNC_CLUSTER_SECRET_FILE) on every node");
		assert_int_equal(count_in_file(closed_log, "is unauthenticated"), 0);
		assert_true(harness_daemon_alive(&n0.d));
		assert_int_equal(harness_daemon_stop(&n0.d), 0);
		forget_daemon(&n1.d);
	}
}

/* A secret file that others may read, that is too short or missing stops
 * gradsyncd at start with the invalid-settings status, naming the file
 * and the reason, from the flag and from the environment alike. */
static void cluster_secret_file_refused(void **state)
{
	(void)state;
	char missing[200];
	write_secret("present", SECRET_A, 0600); /* makes secret_dir */
	snprintf(missing, sizeof(missing), "%s/missing", secret_dir);
	const struct {
		const char *path;
		const char *why;
		bool env;
	} cases[] = {
		{ write_secret("open", SECRET_A, 0644), "its mode is 0644: a secret must be readable by its owner alone", false },
		{ write_secret("group", SECRET_A, 0640), "its mode is 0640", true },
		{ write_secret("short", "0123456789abcde\n", 0600), "it holds 15 bytes of secret; 16 to 4096 are needed", false },
		{ missing, "cannot open it: No such file or directory", false },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char coord[64], arg[300];
		snprintf(coord, sizeof(coord), "--coordinator=127.0.0.1:%d", harness_free_port());
		snprintf(arg, sizeof(arg), "--cluster-secret-file=%s", cases[i].path);
		const char *v[] = { "--nodes=2", "--node-rank=0", coord, cases[i].env ? NULL : arg, NULL };
		if (cases[i].env)
			setenv("GRADSYNC_CLUSTER_SECRET_FILE", cases[i].path, 1);
		struct gs_test_daemon d;
		harness_daemon_spawn(&d, v);
		unsetenv("GRADSYNC_CLUSTER_SECRET_FILE");
		int status = harness_wait(d.pid, 10000);
		if (status != 2)
			harness_dump(d.log);
		assert_int_equal(status, 2);
		char said[300];
		snprintf(said, sizeof(said), "'%s', from %s, is refused: ", cases[i].path,
			 cases[i].env ? "environment" : "command line");
		expect_in_log(d.log, said);
		expect_in_log(d.log, cases[i].why);
		expect_in_log(d.log, "--cluster-secret-file");
		forget_daemon(&d);
	}
}

static void send_store_get(int fd, const char *key)
{
	Gradsync__StoreGet get = GRADSYNC__STORE_GET__INIT;
	get.key = (char *)key;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_GET;
	m.store_get = &get;
	raw_send(fd, &m, NULL, 0);
}

static void send_store_set(int fd, const char *key, const char *value)
{
	Gradsync__StoreSet set = GRADSYNC__STORE_SET__INIT;
	set.key = (char *)key;
	set.value.data = (uint8_t *)value;
	set.value.len = strlen(value);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_SET;
	m.store_set = &set;
	raw_send(fd, &m, NULL, 0);
}

/* Peers that do not hold the secret get nothing from the coordinator: a
 * join, the store, garbage, a forged proof, a crowd and silence are each
 * refused (a crowd's oldest to make room for a newcomer, silence within
 * --auth-timeout), and the coordinator goes on serving the real nodes,
 * whose job then runs. */
static void unauthenticated_peers_refused(void **state)
{
	(void)state;
	char a[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("peers", SECRET_A, 0600));
	const char *ea[] = { a, "--auth-timeout=3", NULL };
	int port = harness_free_port();
	struct node n[2];
	spawn_node(&n[0], 2, 0, 1, ea, port);

	int fd = tcp_connect(port, 10);
	send_node_hello(fd, GS_NODE_PROTOCOL_VERSION);
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	send_store_get(fd, "nccl/uid");
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	send_store_set(fd, "g0/rank_1", "10.6.6.6:666");
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	static const char http[] = "GET / HTTP/1.1\r\nHost: gradsync\r\n\r\n";
	raw_send_bytes(fd, http, sizeof(http) - 1);
	raw_expect_error(fd, GS_ELIMIT, "frame longer than the 4096-byte maximum");
	close(fd);

	/* A proof made up without the secret. */
	fd = tcp_connect(port, 10);
	send_node_auth(fd, GS_NODE_PROTOCOL_VERSION, true);
	Gradsync__Message *ch = raw_recv(fd);
	assert_non_null(ch);
	assert_int_equal(ch->body_case, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE);
	assert_int_equal(ch->node_challenge->nonce.len, 32);
	assert_true(ch->node_challenge->has_secret);
	gradsync__message__free_unpacked(ch, NULL);
	uint8_t forged[32] = { 0 };
	Gradsync__NodeProof pr = GRADSYNC__NODE_PROOF__INIT;
	pr.mac.data = forged;
	pr.mac.len = sizeof(forged);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &pr;
	raw_send(fd, &m, NULL, 0);
	raw_expect_error(fd, GS_EREFUSED, "cluster secret differs");
	close(fd);

	/* Only so many peers may be authenticating at once (4 per node and
	 * 64): the next takes the place of the oldest, which is told to try
	 * again (GS_EAGAIN), and is served. */
	enum { PENDING = 4 * 2 + 64 };
	int held[PENDING];
	for (int i = 0; i < PENDING; i++)
		held[i] = tcp_connect(port, 10);
	fd = tcp_connect(port, 10);
	raw_expect_error(held[0], GS_EAGAIN, "72 connections were authenticating at once; the oldest made room for a newer one (127.0.0.1:");
	send_node_hello(fd, GS_NODE_PROTOCOL_VERSION);
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	for (int i = 0; i < PENDING; i++)
		close(held[i]);

	/* A peer that says nothing, while the real node 1 joins. */
	int silent = tcp_connect(port, 20);
	double t0 = harness_now_s();
	spawn_node(&n[1], 2, 1, 1, ea, port);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	raw_expect_error(silent, GS_EAGAIN, "did not authenticate within 3 s (--auth-timeout); try again");
	double took = harness_now_s() - t0;
	print_message("the silent peer was dropped after %.2f s\n", took);
	assert_true(took > 2.5 && took < 6);
	close(silent);
	expect_in_log(n[0].d.log, "rendezvous: refused a connection from 127.0.0.1:");
	expect_in_log(n[0].d.log, "rendezvous: refused node 1 from 127.0.0.1:");
	assert_true(harness_daemon_alive(&n[0].d));

	static const struct nodes_case c = { "resnet50.txt", 2, { 1, 1 }, "1", { NULL }, { NULL } };
	run_steps(&c, n);
}

int main(void)
{
	/* Every case here starts daemons with --nodes above 1, which a
	 * gradsyncd built without Gloo refuses: skip them all rather than
	 * fail. The whole program skips, so the suite counts one skip. */
	if (!harness_have_gloo()) {
		printf("gradsyncd was built without Gloo (-Dgloo=disabled or not found): "
		       "skipping the tests of several nodes\n");
		return HARNESS_EXIT_SKIP;
	}
	atexit(remove_secrets);
	/* GS_TEST_FILTER=coordinator_* runs only the cases it matches. */
	if (getenv("GS_TEST_FILTER"))
		cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(two_nodes_one_trainer_fp16),
		cmocka_unit_test(two_nodes_two_trainers_fp16),
		cmocka_unit_test(three_nodes_one_trainer_fp16),
		cmocka_unit_test(uneven_nodes_one_and_two),
		cmocka_unit_test(two_nodes_bf16_clipping),
		cmocka_unit_test(two_nodes_fp16_sum_clipping),
		cmocka_unit_test(two_nodes_two_trainers_fp32_exact),
		cmocka_unit_test(two_nodes_fp32_sum_exact),
		cmocka_unit_test(three_nodes_uneven_bf16_sum),
		cmocka_unit_test(layout_mismatch_between_nodes),
		cmocka_unit_test(wrong_world_size),
		cmocka_unit_test(trainer_killed_on_other_node),
		cmocka_unit_test(peer_daemon_killed_and_back),
		cmocka_unit_test(trainer_late_on_other_node),
		cmocka_unit_test(group_rebuilt_after_it_failed),
		cmocka_unit_test(coordinator_killed_and_back_two_nodes),
		cmocka_unit_test(coordinator_killed_and_back_three_nodes),
		cmocka_unit_test(coordinator_stays_away),
		cmocka_unit_test(trainer_registers_while_coordinator_away),
		cmocka_unit_test(peer_lost_between_chunks),
		cmocka_unit_test(clashing_node_rank),
		cmocka_unit_test(other_protocol_version),
		cmocka_unit_test(coordinator_never_appears),
		cmocka_unit_test(two_nodes_with_a_secret),
		cmocka_unit_test(wrong_cluster_secret),
		cmocka_unit_test(cluster_secret_on_one_node_only),
		cmocka_unit_test(cluster_secret_file_refused),
		cmocka_unit_test(unauthenticated_peers_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
