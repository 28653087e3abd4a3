/*
 * Several nodes on this machine syncing: one gradsyncd per node, joined
 * through the node-rank-0 daemon's rendezvous and all-reducing over Gloo
 * on loopback, each with its own trainer processes
 * (gradsync-verifying-trainer). Every trainer regenerates every global
 * rank's inputs and checks each element against its fp64 reference
 * (allowing one rounding per node hop), so a case passes only when all
 * trainers of all nodes got the same correct sum; then every node's
 * status is checked. Failures are test-nodes-failures.c's, the
 * rendezvous's authentication test-nodes-auth.c's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "nodes.h"

static void run_case(const struct nodes_case *c)
{
	struct node n[MAX_NODES];
	struct harness_job job = c->job;
	spawn_nodes(n, &job, c->daemon_args);
	for (unsigned r = 0; r < job.nodes; r++)
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

CASE(two_nodes_one_trainer_fp16, { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 } }, "3", { NULL }, { NULL } })
CASE(two_nodes_two_trainers_fp16, { "resnet50.txt", { .nodes = 2, .local_size = { 2, 2 } }, "2", { NULL }, { NULL } })
CASE(three_nodes_one_trainer_fp16, { "resnet50.txt", { .nodes = 3, .local_size = { 1, 1, 1 } }, "2", { NULL }, { NULL } })
CASE(uneven_nodes_one_and_two, { "resnet50.txt", { .nodes = 2, .local_size = { 1, 2 } }, "2", { NULL }, { NULL } })
CASE(two_nodes_bf16_clipping,
     { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 }, .wire = "bf16" }, "2", { NULL },
       { "--clip", "0.5", NULL } })
CASE(two_nodes_fp16_sum_clipping,
     { "resnet50.txt", { .nodes = 2, .local_size = { 2, 1 }, .op = "sum" }, "2", { NULL },
       { "--clip", "1.0", NULL } })
CASE(two_nodes_two_trainers_fp32_exact,
     { "resnet50.txt", { .nodes = 2, .local_size = { 2, 2 }, .wire = "fp32" }, "2", { NULL },
       { "--pattern", "pow2", "--exact", NULL } })
CASE(two_nodes_fp32_sum_exact,
     { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 }, .wire = "fp32", .op = "sum" }, "2",
       { NULL }, { "--pattern", "pow2", "--exact", NULL } })
/* A planted +inf makes the norm inf on every node and wire. */
CASE(two_nodes_inf_norm_fp16,
     { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 } }, "2", { NULL },
       { "--pattern", "inf", NULL } })
CASE(two_nodes_inf_norm_bf16,
     { "resnet50.txt", { .nodes = 2, .local_size = { 2, 1 }, .wire = "bf16" }, "2", { NULL },
       { "--pattern", "inf", NULL } })
CASE(two_nodes_inf_norm_fp32,
     { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 }, .wire = "fp32" }, "2", { NULL },
       { "--pattern", "inf", NULL } })
CASE(three_nodes_uneven_bf16_sum,
     { "resnet50.txt", { .nodes = 3, .local_size = { 1, 2, 1 }, .wire = "bf16", .op = "sum" }, "2",
       { NULL }, { NULL } })
/* Gradients that no trainer of any node produced, or one trainer of one
 * node only (gs_mark_absent): the nodes' vote carries which. */
CASE(two_nodes_two_trainers_absent,
     { "resnet50.txt", { .nodes = 2, .local_size = { 2, 2 } }, "2", { NULL },
       { "--absent", "3", NULL } })
CASE(two_nodes_absent_staged_fp32_exact,
     { "resnet50.txt", { .nodes = 2, .local_size = { 2, 2 }, .wire = "fp32",
       .fusion_buffer = "65536", .threshold = "100000" }, "2", { NULL },
       { "--absent", "4", "--pattern", "pow2", "--exact", NULL } })

int main(void)
{
	if (!nodes_prepare())
		return HARNESS_EXIT_SKIP;
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
		cmocka_unit_test(two_nodes_two_trainers_absent),
		cmocka_unit_test(two_nodes_absent_staged_fp32_exact),
		cmocka_unit_test(two_nodes_inf_norm_fp16),
		cmocka_unit_test(two_nodes_inf_norm_bf16),
		cmocka_unit_test(two_nodes_inf_norm_fp32),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
