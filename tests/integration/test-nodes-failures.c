/*
 * The ways a job of several nodes must fail, each in bounded time, and
 * recover: a layout or world size that differs between nodes, trainers
 * and daemons killed or late on another node, the coordinator killed and
 * back or gone for good, a node lost between a bucket's chunks, a second
 * node of one rank, a coordinator that never appears. One gradsyncd per
 * node on this machine, with verifying trainers that check every tensor
 * after an abort and every element of the steps after it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "nodes.h"

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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	spawn_nodes(n, &job, NULL);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	double t0 = harness_now_s();
	pid_t p0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "1", NULL, log0);
	pid_t p1 = spawn_trainer(&n[1], 0, other, "1", NULL, log1);
	assert_int_not_equal(harness_wait(p0, 30000), 0);
	assert_int_not_equal(harness_wait(p1, 30000), 0);
	double took = harness_now_s() - t0;
	print_message("both trainers refused after %.2f s\n", took);
	assert_true(took < 20);
	expect_in_log(log0, "layouts differ between node 0 and node 1: tensor 5 is");
	expect_in_log(log1, "layouts differ between node 0 and node 1: tensor 5 is");
	expect_in_log(n[0].d.log, "the nodes do not agree on the layout");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	remove(other);
}

static void expect_exit(pid_t pid, int status, const char *log);

/* A job's trainers on node 1 say three nodes where node 0's say two: node
 * 1's trainer is refused at once naming both counts, and node 0 goes on
 * serving. */
static void wrong_world_size(void **state)
{
	(void)state;
	struct harness_job job = { .nodes = 2 };
	struct harness_job three = { .nodes = 3 };
	struct node n0, n1;
	spawn_node(&n0, &job, 0, NULL);
	three.port = job.port;
	spawn_node(&n1, &three, 1, NULL);
	harness_daemon_wait_ready(&n0.d, 30000);
	harness_daemon_wait_ready(&n1.d, 30000);
	char log0[200], log1[200];
	static const char *const hold[] = { "--pause-at-step", "1", "--pause-for", "60", NULL };
	pid_t t0 = spawn_trainer(&n0, 0, harness_layout("resnet50.txt"), "1", hold, log0);
	double start = harness_now_s();
	pid_t t1 = spawn_trainer(&n1, 0, harness_layout("resnet50.txt"), "1", NULL, log1);
	int status = harness_wait(t1, 25000);
	double took = harness_now_s() - start;
	print_message("the trainer of the wrong world size exited with %d after %.2f s\n", status, took);
	assert_int_not_equal(status, 0);
	assert_true(took < 15);
	expect_in_log(log1, "job '': node 1's trainers say node count 3, node 0's say 2");
	expect_in_log(n0.d.log, "job '': node 1's trainers say node count 3, node 0's say 2");
	assert_true(harness_daemon_alive(&n0.d) && harness_daemon_alive(&n1.d));
	kill(t0, SIGKILL);
	harness_wait(t0, 5000);
	assert_int_equal(harness_daemon_stop(&n1.d), 0);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
}

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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	spawn_nodes(n, &job, NULL);
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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	static const char *const extra[] = { "--peer-timeout=10", NULL };
	spawn_nodes(n, &job, extra);
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
	spawn_node(&back, &job, 1, extra);
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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	static const char *const extra[] = { "--peer-timeout=2", NULL };
	spawn_nodes(n, &job, extra);
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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	static const char *const quick[] = { "--peer-timeout=2", "--step-timeout=2", NULL };
	static const char *const patient[] = { "--peer-timeout=2", NULL };
	spawn_node(&n[0], &job, 0, quick);
	spawn_node(&n[1], &job, 1, patient);
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
 * node-0 daemon on the same port knows nothing of the job until node 0's
 * restarted trainer begins it there; the other daemons, retrying, then
 * join it and offer it their layout again, and step 3 is right on every
 * node (every element checked by the trainers). Without the re-join, the
 * new node 0 never sees the others and never starts serving. */
static void coordinator_killed_and_back(unsigned nodes)
{
	struct node n[MAX_NODES];
	struct harness_job job = { .nodes = nodes, .local_size = { 1, 1, 1, 1 } };
	static const char *const extra[] = { "--peer-timeout=30", NULL };
	spawn_nodes(n, &job, extra);
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

	/* systemd's Restart=on-failure: a new daemon of rank 0, same port,
	 * and the job's node-0 trainer restarted on it (the job is its). */
	struct node back;
	double t0 = harness_now_s();
	spawn_node(&back, &job, 0, extra);
	harness_daemon_wait_ready(&back.d, 30000);
	static const char *const a0b[] = { "--first-step", "3", NULL };
	pid_t t0b = spawn_trainer(&back, 0, harness_layout("resnet50.txt"), "1", a0b, log0b);
	for (unsigned r = 1; r < nodes; r++)
		harness_wait_for_text(n[r].d.log, "re-joined the coordinator", 30);
	print_message("every node re-joined %.3f s after node 0's daemon was started again\n",
		      harness_now_s() - t0);
	expect_exit(t0b, 0, log0b);
	for (unsigned r = 1; r < nodes; r++)
		expect_exit(t[r], 0, logs[r]);
	print_message("step 3 done on every node %.3f s after the restart\n", harness_now_s() - t0);
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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	static const char *const extra[] = { "--peer-timeout=30", NULL };
	spawn_nodes(n, &job, extra);
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
	spawn_node(&back, &job, 0, extra);
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
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	static const char *const extra[] = { "--peer-timeout=30", "--step-timeout=3", NULL };
	spawn_nodes(n, &job, extra);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	static const char *const a0[] = { "--pause-at-step", "2", "--pause-after", "5", NULL };
	static const char *const a1[] = { "--expect-abort-at", "2", NULL };
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "3", a0, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "3", a1, log1);
	kill_node0_in_step_2(n, 2, t0, log0);
	harness_wait_for_text(log1, "ABORTED step 2 as expected", 15);
	double began = harness_now_s();
	expect_exit(t1, 1, log1);
	double took = harness_now_s() - began;
	print_message("step 3 ended %.2f s after step 2's abort (--step-timeout=%d)\n", took,
		      STEP_TIMEOUT_S);
	assert_true(took >= STEP_TIMEOUT_S - 0.5 && took < STEP_TIMEOUT_S + 5);
	expect_in_log(log1, "the group of nodes is not whole again");
	assert_true(harness_daemon_alive(&n[1].d));
	assert_int_equal(harness_daemon_stop(&n[1].d), 0);
}

/* A tensor of many chunks, and node 1's daemon killed while node 0 is
 * reducing it: node 0's trainer gets the step aborted, and the tensor
 * holds that trainer's own gradient in full (check_aborted in the verifying
 * trainer compares every element), not the chunks reduced before the
 * loss. The kill waits until node 0's trace shows chunks of the bucket
 * done, so that it lands between two of its chunks. */
static void peer_lost_between_chunks(void **state)
{
	(void)state;
	enum { BIG = 1 << 25, FUSION = 1024 }; /* 32,768 chunks */
	struct node n[2];
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	char fusion[32];
	snprintf(fusion, sizeof(fusion), "%d", FUSION);
	job.fusion_buffer = fusion;
	const char *const extra[] = { "--peer-timeout=10", NULL };
	spawn_nodes(n, &job, extra);
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

/* Once two nodes of a job have joined, a third daemon whose trainer
 * claims node rank 1 is refused, and the job it tried to enter goes on. */
static void clashing_node_rank(void **state)
{
	(void)state;
	struct node n[2], third;
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	spawn_nodes(n, &job, NULL);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char logs[2][200], log3[200];
	pid_t t[2];
	for (unsigned r = 0; r < 2; r++)
		t[r] = spawn_trainer(&n[r], 0, harness_layout("resnet50.txt"), "1000", NULL, logs[r]);
	harness_wait_for_text(logs[0], "step 1:", 60);
	/* Another daemon, at an address of its own, as node 1 of the job. */
	static const char *const elsewhere[] = { "--node-address=127.0.0.9", NULL };
	spawn_node(&third, &job, 1, elsewhere);
	harness_daemon_wait_ready(&third.d, 30000);
	double start = harness_now_s();
	pid_t t3 = spawn_trainer(&third, 0, harness_layout("resnet50.txt"), "1", NULL, log3);
	int status = harness_wait(t3, 15000);
	double took = harness_now_s() - start;
	print_message("the second node rank 1's trainer exited with %d after %.2f s\n", status, took);
	assert_int_not_equal(status, 0);
	assert_true(took < 10);
	expect_in_log(log3, "node rank 1 has already joined");
	expect_in_log(n[0].d.log, "node rank 1 has already joined");
	for (unsigned r = 0; r < 2; r++) {
		assert_true(harness_daemon_alive(&n[r].d));
		kill(t[r], SIGKILL);
		harness_wait(t[r], 5000);
		assert_false(harness_file_contains(logs[r], "MISMATCH"));
	}
	assert_int_equal(harness_daemon_stop(&third.d), 0);
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

/* A job of two nodes whose node 0 never comes: its trainer on node 1 is
 * told so after --join-timeout, and the daemon goes on serving. */
static void coordinator_never_appears(void **state)
{
	(void)state;
	struct harness_job job = { .nodes = 2 };
	static const char *const v[] = { "--join-timeout=2", NULL };
	struct node n1;
	spawn_node(&n1, &job, 1, v);
	harness_daemon_wait_ready(&n1.d, 30000);
	char log[200];
	double start = harness_now_s();
	pid_t t = spawn_trainer(&n1, 0, harness_layout("resnet50.txt"), "1", NULL, log);
	int status = harness_wait(t, 15000);
	double took = harness_now_s() - start;
	print_message("the trainer was told after %.2f s (status %d)\n", took, status);
	assert_int_not_equal(status, 0);
	assert_true(took >= 2.0 && took < 6);
	expect_in_log(log, "did not answer within 2 s");
	expect_in_log(n1.d.log, "did not answer within 2 s");
	assert_true(harness_daemon_alive(&n1.d));
	assert_int_equal(harness_daemon_stop(&n1.d), 0);
}

int main(void)
{
	if (!nodes_prepare())
		return HARNESS_EXIT_SKIP;
	const struct CMUnitTest tests[] = {
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
		cmocka_unit_test(coordinator_never_appears),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
