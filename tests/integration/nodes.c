/*
 * Helpers of the tests of several nodes (test-nodes-sync, -failures and
 * -auth): one gradsyncd per node on this machine, joined through node 0's
 * rendezvous, with trainer processes (gradsync-verifying-trainer) on each.
 */
#include "nodes.h"

#include <sched.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"

void forget_daemon(const struct gs_test_daemon *d)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
}

void spawn_node(struct node *n, struct harness_job *job, unsigned rank,
		const char *const *extra)
{
	struct harness_strs args = { .n = 0 };
	harness_strs_printf(&args, "--join-timeout=30");
	harness_strs_append(&args, extra);
	n->job = job;
	n->rank = rank;
	harness_job_daemon_spawn(&n->d, job, rank, args.v);
}

void spawn_nodes(struct node *n, struct harness_job *job, const char *const *extra)
{
	for (unsigned r = 0; r < job->nodes; r++)
		spawn_node(&n[r], job, r, extra);
}

pid_t spawn_trainer(const struct node *n, unsigned rank, const char *layout,
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
	return harness_job_spawn(n->job, n->rank, argv, log);
}

/* All-reduces a step of layout `name` goes through with the default
 * threshold (2097152 elements) and fusion buffer (4194304), by the plan's
 * rule as DESIGN.md words it, counted here and not by the code under test:
 * a bucket's first chunk begins with a head of 16384 elements (which
 * carries the nodes' vote), and the rest of each chunk goes in pipeline
 * slices of 1048576 elements where node 0 may use two CPUs or more (node
 * protocol 7; the daemons run on this test's CPUs), else in one. */
static uint64_t slices_of(uint64_t elements)
{
	const uint64_t fusion = 4194304, head = 16384;
	cpu_set_t cpus;
	bool spare = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) >= 2;
	const uint64_t slice = spare ? 1048576 : fusion;
	uint64_t n = 0;
	for (uint64_t start = 0; start < elements; start += fusion) {
		uint64_t len = elements - start < fusion ? elements - start : fusion;
		if (start == 0 && len > head) {
			n++;
			len -= head;
		}
		n += (len + slice - 1) / slice;
	}
	return n;
}

/* The trainers register the layout file's tensors in reverse, as
 * backpropagation yields them; the plan takes them in that order. */
static uint64_t default_allreduces(const char *name)
{
	const uint64_t threshold = 2097152;
	FILE *f = fopen(harness_layout(name), "r");
	assert_non_null(f);
	char line[512], tensor[256];
	unsigned long long count;
	uint64_t counts[1024];
	size_t nt = 0;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#' || sscanf(line, "%255s %llu", tensor, &count) != 2)
			continue;
		assert_true(nt < sizeof(counts) / sizeof(counts[0]));
		counts[nt++] = count;
	}
	fclose(f);
	uint64_t acc = 0, n = 0;
	while (nt > 0) {
		uint64_t c = counts[--nt];
		if (c > threshold) {
			n += slices_of(c);
			continue;
		}
		acc += c;
		if (acc > threshold) {
			n += slices_of(acc);
			acc = 0;
		}
	}
	return n + slices_of(acc);
}

/* Tensors of layout `name`: each bucket's vote carries one produced count
 * per member (chunk_status.h), so a step sends one element per tensor. */
static uint64_t layout_tensors(const char *name)
{
	FILE *f = fopen(harness_layout(name), "r");
	assert_non_null(f);
	char line[512], tensor[256];
	unsigned long long count;
	uint64_t n = 0;
	while (fgets(line, sizeof(line), f))
		if (line[0] != '#' && sscanf(line, "%255s %llu", tensor, &count) == 2)
			n++;
	fclose(f);
	return n;
}

/* No setting of the job's or the daemons' differs from the default. */
static bool default_settings(const struct nodes_case *c)
{
	const struct harness_job *j = &c->job;
	return !c->daemon_args[0] && !j->threshold && !j->wire && !j->op && !j->predivide &&
	       !j->fusion_buffer;
}

/* After the steps, each node's status names every node and, for fp16 on two
 * nodes (a ring sends 2 (N - 1) / N = 1 buffer), the exact bytes sent: every
 * slice's gradients and its status of 9 elements, and each bucket's produced
 * counts, one per member (chunk_status.h). */
static void check_status(const struct nodes_case *c, struct node *n)
{
	const struct harness_job *j = &c->job;
	uint32_t world = 0;
	for (unsigned r = 0; r < j->nodes; r++)
		world += j->local_size[r];
	for (unsigned r = 0; r < j->nodes; r++) {
		gs_client *ctl;
		struct gs_status *st;
		assert_int_equal(gs_control_connect(n[r].d.socket, 5000, &ctl), GS_OK);
		assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
		assert_int_equal(st->node_rank, r);
		assert_int_equal(st->nodes, j->nodes);
		assert_int_equal(st->world_size, world);
		assert_int_equal(st->peer_count, j->nodes);
		for (unsigned p = 0; p < j->nodes; p++) {
			assert_int_equal(st->peers[p].node_rank, p);
			assert_int_equal(st->peers[p].local_size, j->local_size[p]);
			assert_string_equal(st->peers[p].state, p == r ? "this node" : "joined");
		}
		uint64_t steps = strtoull(c->steps, NULL, 10);
		assert_int_equal(st->steps_completed, steps);
		if (j->nodes == 2 && default_settings(c))
			assert_int_equal(st->internode_bytes,
					 steps * (harness_layout_elements(c->layout) +
						  9 * default_allreduces(c->layout) +
						  layout_tensors(c->layout)) * 2);
		else
			assert_true(st->internode_bytes > 0);
		gs_status_free(st);
		gs_close(ctl);
	}
}

void run_steps(const struct nodes_case *c, struct node *n)
{
	const struct harness_job *j = &c->job;
	pid_t pids[MAX_NODES][4];
	char logs[MAX_NODES][4][200];
	for (unsigned r = 0; r < j->nodes; r++)
		for (unsigned l = 0; l < j->local_size[r]; l++)
			pids[r][l] = spawn_trainer(&n[r], l, harness_layout(c->layout), c->steps,
						   c->trainer_args, logs[r][l]);
	int failed = 0;
	for (unsigned r = 0; r < j->nodes; r++) {
		for (unsigned l = 0; l < j->local_size[r]; l++) {
			if (harness_wait(pids[r][l], 240000) != 0) {
				harness_dump(logs[r][l]);
				failed = 1;
			}
		}
	}
	if (!failed) {
		const char *all[MAX_NODES * 4];
		size_t nlogs = 0;
		for (unsigned r = 0; r < j->nodes; r++)
			for (unsigned l = 0; l < j->local_size[r]; l++)
				all[nlogs++] = logs[r][l];
		harness_expect_same_lines(all, nlogs, "NORM ");
		check_status(c, n);
	}
	for (unsigned r = 0; r < j->nodes; r++) {
		if (failed)
			harness_dump(n[r].d.log);
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	}
	assert_int_equal(failed, 0);
}

void expect_in_log(const char *path, const char *text)
{
	if (!harness_file_contains(path, text)) {
		harness_dump(path);
		fail_msg("'%s' not found in %s", text, path);
	}
}

bool nodes_prepare(void)
{
	/* Every case here runs a job of several nodes, which a gradsyncd
	 * built without Gloo refuses: skip them all rather than fail. The whole program skips, so the suite counts one skip. */
	if (!harness_have_gloo()) {
		printf("gradsyncd was built without Gloo (-Dgloo=disabled or not found): "
		       "skipping the tests of several nodes\n");
		return false;
	}
	/* GS_TEST_FILTER=coordinator_* runs only the cases it matches. */
	if (getenv("GS_TEST_FILTER"))
		cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
	return true;
}
