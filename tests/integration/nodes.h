/*
 * What the tests of several nodes share (test-nodes-sync.c,
 * test-nodes-failures.c, test-nodes-auth.c): nodes as daemons of one job
 * on this machine, their trainers, and a run of steps checked on every
 * trainer and in every node's status.
 */
#ifndef GS_TEST_NODES_H
#define GS_TEST_NODES_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define MAX_NODES HARNESS_MAX_NODES

struct nodes_case {
	const char *layout;
	struct harness_job job;     /* nodes, trainers per node, settings */
	const char *steps;
	const char *daemon_args[4]; /* node settings, not the job's */
	const char *trainer_args[6];
};

/* A node of a job: its daemon, and the job its trainers are given. */
struct node {
	struct gs_test_daemon d;
	struct harness_job *job;
	unsigned rank;
};

/* Skips the program (false: return HARNESS_EXIT_SKIP) where gradsyncd has
 * no Gloo; applies GS_TEST_FILTER (a cmocka pattern) otherwise. */
bool nodes_prepare(void);

/* Starts the daemon of node `rank` of the job (harness_job_daemon_spawn,
 * with --join-timeout=30); extra: further flags, NULL ended (or NULL).
 * Does not wait for it. The job must outlive the node. */
void spawn_node(struct node *n, struct harness_job *job, unsigned rank,
		const char *const *extra);
/* spawn_node for every node of the job. */
void spawn_nodes(struct node *n, struct harness_job *job, const char *const *extra);
/* A verifying trainer of local rank `rank` on node n, given the node's
 * job in its environment, running `steps` steps of layout; its output
 * goes to log (200 bytes, filled in here). */
pid_t spawn_trainer(const struct node *n, unsigned rank, const char *layout,
		    const char *steps, const char *const *extra, char *log);

/* Runs the case's trainers on nodes that have joined, checks them and
 * every node's status, and stops the daemons. */
void run_steps(const struct nodes_case *c, struct node *n);

/* Removes the directory of a daemon that has exited as it should. */
void forget_daemon(const struct gs_test_daemon *d);
/* Fails the test, showing the file, unless it contains text. */
void expect_in_log(const char *path, const char *text);

#endif
