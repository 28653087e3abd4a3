/*
 * libgradsync's derivation of the job from the connect options and the
 * launcher's environment (gs_launch_info_get, which gs_connect uses):
 * environments written out by hand, each with the values and sources a
 * reader of the precedence table expects, and each bad value's message.
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"

/* Every variable the derivation reads, cleared before each case so that
 * the environment the test runs in cannot leak into it. */
static const char *const known[] = {
	"GRADSYNC_JOB_ID", "GRADSYNC_LOCAL_RANK", "GRADSYNC_LOCAL_SIZE",
	"GRADSYNC_NODES", "GRADSYNC_NODE_RANK", "GRADSYNC_COORDINATOR",
	"TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
	"GROUP_RANK", "MASTER_ADDR", "SLURM_JOB_ID", "SLURM_STEP_ID",
	"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES",
	"SLURM_NODEID", "GRADSYNC_THRESHOLD", "GRADSYNC_WIRE", "GRADSYNC_OP", "GRADSYNC_PREDIVIDE",
	"GRADSYNC_FUSION_BUFFER",
};

static void set_env(const char *const *vars)
{
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		unsetenv(known[i]);
	for (size_t i = 0; vars[i]; i++) {
		char name[64];
		const char *eq = strchr(vars[i], '=');
		assert_non_null(eq);
		snprintf(name, sizeof(name), "%.*s", (int)(eq - vars[i]), vars[i]);
		assert_int_equal(setenv(name, eq + 1, 1), 0);
	}
}

struct want {
	const char *job_id, *job_id_source;
	uint32_t local_rank;
	const char *local_rank_source;
	uint32_t local_size;
	const char *local_size_source;
	uint32_t nodes;
	const char *nodes_source;
	uint32_t node_rank;
	const char *node_rank_source;
	const char *coordinator, *coordinator_source;
};

struct good_case {
	const char *name;
	const char *env[20];
	bool with_options; /* every field set in gs_connect_options */
	struct want want;
};

#define OPTS "gs_connect_options"
#define DEF "default"

static const struct good_case good[] = {
	{ "nothing set", { NULL }, false,
	  { "", DEF, 0, DEF, 1, DEF, 1, DEF, 0, DEF, "", DEF } },
	{ "GRADSYNC only",
	  { "GRADSYNC_JOB_ID=run 7", "GRADSYNC_LOCAL_RANK=3", "GRADSYNC_LOCAL_SIZE=4",
	    "GRADSYNC_NODES=8", "GRADSYNC_NODE_RANK=5", "GRADSYNC_COORDINATOR=node0.example",
	    NULL },
	  false,
	  { "run 7", "GRADSYNC_JOB_ID", 3, "GRADSYNC_LOCAL_RANK", 4, "GRADSYNC_LOCAL_SIZE",
	    8, "GRADSYNC_NODES", 5, "GRADSYNC_NODE_RANK", "node0.example",
	    "GRADSYNC_COORDINATOR" } },
	/* The example: one trainer of node 1 of a 2-node job. */
	{ "torchrun only",
	  { "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=4", "GROUP_RANK=1",
	    "MASTER_ADDR=127.0.0.2", "TORCHELASTIC_RUN_ID=x", NULL },
	  false,
	  { "x", "TORCHELASTIC_RUN_ID (torchrun)", 0, "LOCAL_RANK (torchrun)", 2,
	    "LOCAL_WORLD_SIZE (torchrun)", 2, "WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)",
	    1, "GROUP_RANK (torchrun)", "127.0.0.2", "MASTER_ADDR (torchrun)" } },
	{ "Slurm only",
	  { "SLURM_JOB_ID=123456", "SLURM_STEP_ID=2", "SLURM_LOCALID=1",
	    "SLURM_NTASKS_PER_NODE=4", "SLURM_NNODES=3", "SLURM_NODEID=2",
	    "MASTER_ADDR=gpu-017", NULL },
	  false,
	  { "123456.2", "SLURM_JOB_ID.SLURM_STEP_ID (Slurm)", 1, "SLURM_LOCALID (Slurm)", 4,
	    "SLURM_NTASKS_PER_NODE (Slurm)", 3, "SLURM_NNODES (Slurm)", 2,
	    "SLURM_NODEID (Slurm)", "gpu-017", "MASTER_ADDR (Slurm)" } },
	/* A batch script outside any srun step has no SLURM_STEP_ID. */
	{ "Slurm without a step",
	  { "SLURM_JOB_ID=99", NULL }, false,
	  { "99", "SLURM_JOB_ID (Slurm)", 0, DEF, 1, DEF, 1, DEF, 0, DEF, "", DEF } },
	/* srun running torchrun, with GRADSYNC_* for what differs on this
	 * node: each field from its highest source. */
	{ "GRADSYNC over torchrun over Slurm, per field",
	  { "GRADSYNC_LOCAL_SIZE=3", "GRADSYNC_COORDINATOR=10.0.0.1",
	    "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=4", "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=none",
	    "MASTER_ADDR=10.0.0.9",
	    "SLURM_JOB_ID=77", "SLURM_STEP_ID=0", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=1",
	    "SLURM_NNODES=2", "SLURM_NODEID=1", NULL },
	  false,
	  { "none", "TORCHELASTIC_RUN_ID (torchrun)", 2, "LOCAL_RANK (torchrun)", 3,
	    "GRADSYNC_LOCAL_SIZE", 2, "WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)", 1,
	    "SLURM_NODEID (Slurm)", "10.0.0.1", "GRADSYNC_COORDINATOR" } },
	{ "GRADSYNC over torchrun over Slurm, the other fields",
	  { "GRADSYNC_JOB_ID=mine", "GRADSYNC_NODES=5", "GRADSYNC_LOCAL_RANK=1",
	    "GROUP_RANK=4", "LOCAL_WORLD_SIZE=2",
	    "SLURM_JOB_ID=77", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=8",
	    "SLURM_NNODES=2", "SLURM_NODEID=1", "MASTER_ADDR=h", NULL },
	  false,
	  { "mine", "GRADSYNC_JOB_ID", 1, "GRADSYNC_LOCAL_RANK", 2,
	    "LOCAL_WORLD_SIZE (torchrun)", 5, "GRADSYNC_NODES", 4, "GROUP_RANK (torchrun)",
	    "h", "MASTER_ADDR (torchrun)" } },
	/* WORLD_SIZE without LOCAL_WORLD_SIZE (Kubeflow's PyTorchJob, the old
	 * torch.distributed.launch) says nothing of the nodes. */
	{ "WORLD_SIZE alone",
	  { "WORLD_SIZE=4", "SLURM_NNODES=2", NULL }, false,
	  { "", DEF, 0, DEF, 1, DEF, 2, "SLURM_NNODES (Slurm)", 0, DEF, "", DEF } },
	/* An empty variable is as good as unset. */
	{ "empty variables are unset",
	  { "GRADSYNC_LOCAL_RANK=", "LOCAL_RANK=1", "GRADSYNC_JOB_ID=", "SLURM_JOB_ID=5",
	    NULL },
	  false,
	  { "5", "SLURM_JOB_ID (Slurm)", 1, "LOCAL_RANK (torchrun)", 1, DEF, 1, DEF, 0, DEF,
	    "", DEF } },
	/* srun without --ntasks-per-node: SLURM_TASKS_PER_NODE, this node's
	 * entry of it. */
	{ "Slurm's tasks per node, this node's",
	  { "SLURM_JOB_ID=8", "SLURM_STEP_ID=1", "SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=2(x3),1",
	    "SLURM_NNODES=4", "SLURM_NODEID=2", NULL },
	  false,
	  { "8.1", "SLURM_JOB_ID.SLURM_STEP_ID (Slurm)", 1, "SLURM_LOCALID (Slurm)", 2,
	    "SLURM_TASKS_PER_NODE (Slurm)", 4, "SLURM_NNODES (Slurm)", 2, "SLURM_NODEID (Slurm)",
	    "", DEF } },
	{ "Slurm's tasks per node, the last node",
	  { "SLURM_TASKS_PER_NODE=2(x3),1", "SLURM_NODEID=3", NULL },
	  false,
	  { "", DEF, 0, DEF, 1, "SLURM_TASKS_PER_NODE (Slurm)", 1, DEF, 3, "SLURM_NODEID (Slurm)",
	    "", DEF } },
	{ "Slurm's tasks per node, alike on every node, no node id",
	  { "SLURM_TASKS_PER_NODE=4(x2)", NULL },
	  false,
	  { "", DEF, 0, DEF, 4, "SLURM_TASKS_PER_NODE (Slurm)", 1, DEF, 0, DEF, "", DEF } },
	{ "Slurm's tasks per node, uneven, no node id: none",
	  { "SLURM_TASKS_PER_NODE=4,2", NULL },
	  false,
	  { "", DEF, 0, DEF, 1, DEF, 1, DEF, 0, DEF, "", DEF } },
	{ "SLURM_NTASKS_PER_NODE over SLURM_TASKS_PER_NODE",
	  { "SLURM_NTASKS_PER_NODE=3", "SLURM_TASKS_PER_NODE=5(x2)", "SLURM_NODEID=0", NULL },
	  false,
	  { "", DEF, 0, DEF, 3, "SLURM_NTASKS_PER_NODE (Slurm)", 1, DEF, 0, "SLURM_NODEID (Slurm)",
	    "", DEF } },
	/* The largest repeats and counts there are, and the last node. */
	{ "Slurm's tasks per node at the limits",
	  { "SLURM_TASKS_PER_NODE=64(x1023),3", "SLURM_NODEID=1023", NULL },
	  false,
	  { "", DEF, 0, DEF, 3, "SLURM_TASKS_PER_NODE (Slurm)", 1, DEF, 1023, "SLURM_NODEID (Slurm)",
	    "", DEF } },
	{ "largest ranks and sizes",
	  { "GRADSYNC_LOCAL_RANK=63", "GRADSYNC_LOCAL_SIZE=64", "GRADSYNC_NODES=1024",
	    "GRADSYNC_NODE_RANK=1023", "GRADSYNC_COORDINATOR=[fe80::1%eth0]", NULL },
	  false,
	  { "", DEF, 63, "GRADSYNC_LOCAL_RANK", 64, "GRADSYNC_LOCAL_SIZE", 1024, "GRADSYNC_NODES",
	    1023, "GRADSYNC_NODE_RANK", "[fe80::1%eth0]", "GRADSYNC_COORDINATOR" } },
	{ "a bare IPv6 coordinator",
	  { "MASTER_ADDR=::1", NULL }, false,
	  { "", DEF, 0, DEF, 1, DEF, 1, DEF, 0, DEF, "::1", "MASTER_ADDR" } },
	{ "options over all",
	  { "GRADSYNC_JOB_ID=g", "GRADSYNC_LOCAL_RANK=0", "GRADSYNC_LOCAL_SIZE=1",
	    "GRADSYNC_NODES=1", "GRADSYNC_NODE_RANK=0", "GRADSYNC_COORDINATOR=g",
	    "TORCHELASTIC_RUN_ID=t", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "WORLD_SIZE=1",
	    "GROUP_RANK=0", "MASTER_ADDR=t", "SLURM_JOB_ID=1", "SLURM_LOCALID=0",
	    "SLURM_NTASKS_PER_NODE=1", "SLURM_NNODES=1", "SLURM_NODEID=0", NULL },
	  true,
	  { "opt-job", OPTS, 2, OPTS, 4, OPTS, 3, OPTS, 1, OPTS, "opt-host", OPTS } },
};

static void set_all_options(struct gs_connect_options *o)
{
	o->job_id = "opt-job";
	o->local_rank = 2;
	o->local_size = 4;
	o->nodes = 3;
	o->node_rank = 1;
	o->coordinator = "opt-host";
}

static void good_cases(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		const struct good_case *c = &good[i];
		const struct want *w = &c->want;
		print_message("case: %s\n", c->name);
		set_env(c->env);
		struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
		if (c->with_options)
			set_all_options(&o);
		struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
		int r = gs_launch_info_get(&o, &li);
		if (r != GS_OK)
			fail_msg("%s: %s", c->name, gs_last_error(NULL));
		assert_string_equal(li.job_id, w->job_id);
		assert_string_equal(li.job_id_source, w->job_id_source);
		assert_int_equal(li.local_rank, w->local_rank);
		assert_string_equal(li.local_rank_source, w->local_rank_source);
		assert_int_equal(li.local_size, w->local_size);
		assert_string_equal(li.local_size_source, w->local_size_source);
		assert_int_equal(li.nodes, w->nodes);
		assert_string_equal(li.nodes_source, w->nodes_source);
		assert_int_equal(li.node_rank, w->node_rank);
		assert_string_equal(li.node_rank_source, w->node_rank_source);
		assert_string_equal(li.coordinator, w->coordinator);
		assert_string_equal(li.coordinator_source, w->coordinator_source);
	}
}

/* How the library says a value is not a number, in full. */
#define NOT_A_NUMBER "not a number (decimal digits only: no sign, space, base prefix or leading zero)"
#define NOT_A_HOST "not a host name or address: it "

struct bad_case {
	const char *env[8];
	const char *message; /* gs_last_error(NULL), whole */
};

static const struct bad_case bad[] = {
	{ { "LOCAL_RANK=one", NULL },
	  "local rank from LOCAL_RANK (torchrun) is 'one': " NOT_A_NUMBER },
	{ { "GRADSYNC_LOCAL_RANK=-1", NULL },
	  "local rank from GRADSYNC_LOCAL_RANK is '-1': " NOT_A_NUMBER },
	{ { "SLURM_LOCALID= 1", NULL },
	  "local rank from SLURM_LOCALID (Slurm) is ' 1': " NOT_A_NUMBER },
	{ { "GRADSYNC_LOCAL_RANK=64", NULL },
	  "local rank from GRADSYNC_LOCAL_RANK is '64': out of range: expected 0 to 63" },
	{ { "LOCAL_WORLD_SIZE=0", NULL },
	  "local size from LOCAL_WORLD_SIZE (torchrun) is '0': out of range: expected 1 to 64" },
	{ { "SLURM_NTASKS_PER_NODE=99999999999999999999", NULL },
	  "local size from SLURM_NTASKS_PER_NODE (Slurm) is '99999999999999999999': out of range: expected 1 to 64" },
	{ { "GRADSYNC_NODES=1025", NULL },
	  "node count from GRADSYNC_NODES is '1025': out of range: expected 1 to 1024" },
	{ { "SLURM_NNODES=2x", NULL },
	  "node count from SLURM_NNODES (Slurm) is '2x': " NOT_A_NUMBER },
	{ { "GROUP_RANK=1024", NULL },
	  "node rank from GROUP_RANK (torchrun) is '1024': out of range: expected 0 to 1023" },
	{ { "WORLD_SIZE=5", "LOCAL_WORLD_SIZE=2", NULL },
	  "node count: WORLD_SIZE (torchrun) '5' is not a multiple of LOCAL_WORLD_SIZE (torchrun) '2'" },
	{ { "WORLD_SIZE=four", "LOCAL_WORLD_SIZE=2", NULL },
	  "world size from WORLD_SIZE (torchrun) is 'four': " NOT_A_NUMBER },
	{ { "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL },
	  "local rank 2 from LOCAL_RANK (torchrun) is not below the local size 2 from LOCAL_WORLD_SIZE (torchrun)" },
	{ { "GRADSYNC_LOCAL_RANK=3", "SLURM_NTASKS_PER_NODE=2", NULL },
	  "local rank 3 from GRADSYNC_LOCAL_RANK is not below the local size 2 from SLURM_NTASKS_PER_NODE (Slurm)" },
	{ { "SLURM_NODEID=2", "SLURM_NNODES=2", NULL },
	  "node rank 2 from SLURM_NODEID (Slurm) is not below the node count 2 from SLURM_NNODES (Slurm)" },
	{ { "GROUP_RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", NULL },
	  "node rank 1 from GROUP_RANK (torchrun) is not below the node count 1 from WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)" },
	{ { "GRADSYNC_JOB_ID=0123456789012345678901234567890123456789012345678901234567890123", NULL },
	  "job id from GRADSYNC_JOB_ID is '0123456789012345678901234567890123456789012345678901234567890123': 64 bytes long, more than the 63 a job id may have" },
	{ { "TORCHELASTIC_RUN_ID=a\tb", NULL },
	  "job id from TORCHELASTIC_RUN_ID (torchrun) is 'a\\x09b': only printable ASCII characters may be in a job id" },
	{ { "SLURM_JOB_ID=12\x7f", "SLURM_STEP_ID=0", NULL },
	  "job id from SLURM_JOB_ID.SLURM_STEP_ID (Slurm) is '12\\x7f.0': only printable ASCII characters may be in a job id" },
	{ { "SLURM_TASKS_PER_NODE=2(x", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '2(x': not Slurm's form: counts N or N(xM), comma separated" },
	{ { "SLURM_TASKS_PER_NODE=2,,1", "SLURM_NODEID=0", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '2,,1': not Slurm's form: counts N or N(xM), comma separated" },
	{ { "SLURM_TASKS_PER_NODE=65(x2)", "SLURM_NODEID=0", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '65(x2)': a node's count is out of range: expected 1 to 64" },
	{ { "MASTER_ADDR=host name", NULL },
	  "coordinator from MASTER_ADDR is 'host name': " NOT_A_HOST "has a space, control or non-ASCII byte: a host name or address has none" },
	/* Strict numbers: no base prefix, leading zero, sign or space. */
	{ { "GRADSYNC_LOCAL_RANK=0x10", NULL },
	  "local rank from GRADSYNC_LOCAL_RANK is '0x10': " NOT_A_NUMBER },
	{ { "GRADSYNC_LOCAL_RANK=010", NULL },
	  "local rank from GRADSYNC_LOCAL_RANK is '010': " NOT_A_NUMBER },
	{ { "GRADSYNC_NODES=+2", NULL },
	  "node count from GRADSYNC_NODES is '+2': " NOT_A_NUMBER },
	{ { "GROUP_RANK=1 ", NULL },
	  "node rank from GROUP_RANK (torchrun) is '1 ': " NOT_A_NUMBER },
	{ { "GRADSYNC_NODES=18446744073709551616", NULL },
	  "node count from GRADSYNC_NODES is '18446744073709551616': out of range: expected 1 to 1024" },
	/* The issue's: a repeat that wrapped the node count round gave node 0
	 * the 5 of a later entry. */
	{ { "SLURM_TASKS_PER_NODE=1(x18446744073709551615),2,5", "SLURM_NODEID=0", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '1(x18446744073709551615),2,5': a count's repeat is out of range: expected 1 to 1024 nodes" },
	{ { "SLURM_TASKS_PER_NODE=1(x1025)", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '1(x1025)': a count's repeat is out of range: expected 1 to 1024 nodes" },
	{ { "SLURM_TASKS_PER_NODE=1(x1024),2", "SLURM_NODEID=0", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '1(x1024),2': it lists more than the 1024 nodes a job may have" },
	{ { "SLURM_TASKS_PER_NODE=2(x0)", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '2(x0)': a count's repeat is out of range: expected 1 to 1024 nodes" },
	{ { "SLURM_TASKS_PER_NODE=02", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '02': not Slurm's form: counts N or N(xM), comma separated" },
	{ { "SLURM_TASKS_PER_NODE=2(x 3)", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '2(x 3)': not Slurm's form: counts N or N(xM), comma separated" },
	{ { "SLURM_TASKS_PER_NODE=2,", NULL },
	  "local size from SLURM_TASKS_PER_NODE (Slurm) is '2,': not Slurm's form: counts N or N(xM), comma separated" },
	/* The coordinators: a host alone, refused at once otherwise. */
	{ { "GRADSYNC_COORDINATOR=host:port", NULL },
	  "coordinator from GRADSYNC_COORDINATOR is 'host:port': " NOT_A_HOST "has a ':' but is no IPv6 address" },
	{ { "MASTER_ADDR=node0:29500", "TORCHELASTIC_RUN_ID=x", NULL },
	  "coordinator from MASTER_ADDR (torchrun) is 'node0:29500': " NOT_A_HOST "has a port (':29500'): give the host alone; the port is gradsyncd's --node-port, the same on every node" },
	{ { "GRADSYNC_COORDINATOR=[::1]:5", NULL },
	  "coordinator from GRADSYNC_COORDINATOR is '[::1]:5': " NOT_A_HOST "has a port (':5'): give the host alone; the port is gradsyncd's --node-port, the same on every node" },
	{ { "GRADSYNC_COORDINATOR=[", NULL },
	  "coordinator from GRADSYNC_COORDINATOR is '[': " NOT_A_HOST "has an unmatched bracket: only an IPv6 address goes in brackets, as [::1]" },
	{ { "GRADSYNC_COORDINATOR=]", NULL },
	  "coordinator from GRADSYNC_COORDINATOR is ']': " NOT_A_HOST "has an unmatched bracket: only an IPv6 address goes in brackets, as [::1]" },
	{ { "GRADSYNC_COORDINATOR=http://x/", NULL },
	  "coordinator from GRADSYNC_COORDINATOR is 'http://x/': " NOT_A_HOST "is a URL: give the host alone, without a scheme, path or port" },
	{ { "MASTER_ADDR=n\xc3\xb6" "de0", "SLURM_JOB_ID=3", NULL },
	  "coordinator from MASTER_ADDR (Slurm) is 'n\\xc3\\xb6de0': " NOT_A_HOST "has a space, control or non-ASCII byte: a host name or address has none" },
};

static void bad_cases(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const struct bad_case *c = &bad[i];
		print_message("case: %s\n", c->env[0]);
		set_env(c->env);
		struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
		li.local_rank = 12345; /* left as it was on failure */
		assert_int_equal(gs_launch_info_get(NULL, &li), GS_EINVAL);
		assert_string_equal(gs_last_error(NULL), c->message);
		assert_int_equal(li.local_rank, 12345);
	}
}

/* A value the caller set is checked as a variable would be. */
static void bad_options(void **state)
{
	(void)state;
	set_env((const char *const[]){ "LOCAL_WORLD_SIZE=2", NULL });
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.local_rank = 2;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_EINVAL);
	assert_string_equal(gs_last_error(NULL),
			    "local rank 2 from gs_connect_options is not below the local size 2 from LOCAL_WORLD_SIZE (torchrun)");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.nodes = 0;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_EINVAL);
	assert_string_equal(gs_last_error(NULL),
			    "node count from gs_connect_options is '0': out of range: expected 1 to 1024");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.job_id = "x\n";
	assert_int_equal(gs_launch_info_get(&o, &li), GS_EINVAL);
	assert_string_equal(gs_last_error(NULL),
			    "job id from gs_connect_options is 'x\\x0a': only printable ASCII characters may be in a job id");
}

/* A rank beyond a default size is gradsyncd's to judge: today its
 * --local-size decides, and it refuses with its own words. */
static void rank_without_size_is_the_daemons(void **state)
{
	(void)state;
	set_env((const char *const[]){ "LOCAL_RANK=5", "GROUP_RANK=3", NULL });
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	assert_int_equal(gs_launch_info_get(NULL, &li), GS_OK);
	assert_int_equal(li.local_rank, 5);
	assert_int_equal(li.local_size, 1);
	assert_int_equal(li.node_rank, 3);
	assert_int_equal(li.nodes, 1);
}

/* An older caller's shorter struct fills only its own bytes; an older
 * options struct leaves the newer fields to the environment. */
static void shorter_structs(void **state)
{
	(void)state;
	set_env((const char *const[]){ "GRADSYNC_NODES=6", "LOCAL_RANK=1", NULL });
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.nodes = 2;
	o.local_rank = 0;
	o.size = offsetof(struct gs_connect_options, local_size);
	unsigned char buf[sizeof(struct gs_launch_info) + 8];
	memset(buf, 0xa5, sizeof(buf));
	struct gs_launch_info *li = (struct gs_launch_info *)buf;
	li->size = offsetof(struct gs_launch_info, local_rank_source);
	assert_int_equal(gs_launch_info_get(&o, li), GS_OK);
	assert_int_equal(li->local_rank, 0);
	assert_int_equal(buf[offsetof(struct gs_launch_info, local_rank_source)], 0xa5);
	struct gs_launch_info full = GS_LAUNCH_INFO_INIT;
	assert_int_equal(gs_launch_info_get(&o, &full), GS_OK);
	assert_int_equal(full.nodes, 6);
	assert_string_equal(full.nodes_source, "GRADSYNC_NODES");
	assert_string_equal(full.local_rank_source, "gs_connect_options");
	li->size = 4;
	assert_int_equal(gs_launch_info_get(&o, li), GS_EINVAL);
}

/* ---- The job's settings ------------------------------------------------ */

/* No option or variable: every setting unset (value 0), for gradsyncd. */
static void settings_unset(void **state)
{
	(void)state;
	set_env((const char *const[]){ "LOCAL_RANK=1", NULL });
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	assert_int_equal(gs_launch_info_get(NULL, &li), GS_OK);
	assert_string_equal(li.threshold_source, "unset");
	assert_string_equal(li.wire_dtype_source, "unset");
	assert_string_equal(li.op_source, "unset");
	assert_string_equal(li.predivide_source, "unset");
	assert_string_equal(li.fusion_buffer_source, "unset");
	assert_int_equal(li.threshold, 0);
	assert_int_equal(li.wire_dtype, 0);
	assert_int_equal(li.op, 0);
	assert_true(li.predivide_factor == 0);
	assert_int_equal(li.fusion_buffer_elements, 0);
}

static void settings_from_env(void **state)
{
	(void)state;
	set_env((const char *const[]){ "GRADSYNC_THRESHOLD=0", "GRADSYNC_WIRE=bf16",
				       "GRADSYNC_OP=sum", "GRADSYNC_PREDIVIDE=2.5",
				       "GRADSYNC_FUSION_BUFFER=1024", NULL });
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	assert_int_equal(gs_launch_info_get(NULL, &li), GS_OK);
	assert_int_equal(li.threshold, 0); /* a value, not unset */
	assert_string_equal(li.threshold_source, "GRADSYNC_THRESHOLD");
	assert_int_equal(li.wire_dtype, GS_WIRE_DTYPE_BF16);
	assert_string_equal(li.wire_dtype_source, "GRADSYNC_WIRE");
	assert_int_equal(li.op, GS_OP_SUM);
	assert_string_equal(li.op_source, "GRADSYNC_OP");
	assert_true(li.predivide_factor == 2.5);
	assert_string_equal(li.predivide_source, "GRADSYNC_PREDIVIDE");
	assert_int_equal(li.fusion_buffer_elements, 1024);
	assert_string_equal(li.fusion_buffer_source, "GRADSYNC_FUSION_BUFFER");

	set_env((const char *const[]){ "GRADSYNC_PREDIVIDE=world", "GRADSYNC_WIRE=fp32",
				       "GRADSYNC_THRESHOLD=4294967296", NULL });
	assert_int_equal(gs_launch_info_get(NULL, &li), GS_OK);
	assert_true(li.predivide_factor == 0);
	assert_string_equal(li.predivide_source, "GRADSYNC_PREDIVIDE");
	assert_int_equal(li.wire_dtype, GS_WIRE_DTYPE_FP32);
	assert_int_equal(li.threshold, UINT64_C(4294967296));

	/* The factors at the edges of [1, 1e6], against the compiler's own
	 * reading of the same text. */
	static const struct {
		const char *var;
		double want;
	} factors[] = {
		{ "GRADSYNC_PREDIVIDE=1", 1.0 },
		{ "GRADSYNC_PREDIVIDE=1e6", 1e6 },
		{ "GRADSYNC_PREDIVIDE=1000000.0", 1000000.0 },
		{ "GRADSYNC_PREDIVIDE=2.5E+1", 2.5E+1 },
		{ "GRADSYNC_PREDIVIDE=0.1e1", 0.1e1 },
	};
	for (size_t i = 0; i < sizeof(factors) / sizeof(factors[0]); i++) {
		print_message("case: %s\n", factors[i].var);
		set_env((const char *const[]){ factors[i].var, NULL });
		assert_int_equal(gs_launch_info_get(NULL, &li), GS_OK);
		assert_true(li.predivide_factor == factors[i].want);
	}
}

/* Options > variables, setting by setting. */
static void settings_options_win(void **state)
{
	(void)state;
	set_env((const char *const[]){ "GRADSYNC_THRESHOLD=5", "GRADSYNC_WIRE=bf16",
				       "GRADSYNC_OP=sum", "GRADSYNC_PREDIVIDE=2",
				       "GRADSYNC_FUSION_BUFFER=2048", NULL });
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.threshold = 7;
	o.op = GS_OP_AVERAGE;
	o.predivide_factor = 0; /* the world size */
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_OK);
	assert_int_equal(li.threshold, 7);
	assert_string_equal(li.threshold_source, "gs_connect_options");
	assert_int_equal(li.op, GS_OP_AVERAGE);
	assert_string_equal(li.op_source, "gs_connect_options");
	assert_true(li.predivide_factor == 0);
	assert_string_equal(li.predivide_source, "gs_connect_options");
	assert_int_equal(li.wire_dtype, GS_WIRE_DTYPE_BF16);
	assert_string_equal(li.wire_dtype_source, "GRADSYNC_WIRE");
	assert_int_equal(li.fusion_buffer_elements, 2048);
	assert_string_equal(li.fusion_buffer_source, "GRADSYNC_FUSION_BUFFER");

	/* -0.0 in the options is the world size, as 0 is, and is sent as 0. */
	o.predivide_factor = -0.0;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_OK);
	assert_true(li.predivide_factor == 0 && !signbit(li.predivide_factor));

	/* An options struct from before the settings leaves them to the
	 * environment. */
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.size = offsetof(struct gs_connect_options, threshold);
	o.threshold = 7;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_OK);
	assert_int_equal(li.threshold, 5);
	assert_string_equal(li.threshold_source, "GRADSYNC_THRESHOLD");
}

#define NOT_A_FACTOR "not a number: expected 'world' or a decimal number in [1, 1e6] (no sign, space, hex, inf or nan)"
#define OUT_OF_FACTORS "out of range: expected 'world' or a number in [1, 1e6]"

struct bad_setting {
	const char *var;
	const char *message;
};

static const struct bad_setting bad_settings[] = {
	{ "GRADSYNC_THRESHOLD=-1", "threshold from GRADSYNC_THRESHOLD is '-1': " NOT_A_NUMBER },
	{ "GRADSYNC_THRESHOLD=4294967297",
	  "threshold from GRADSYNC_THRESHOLD is '4294967297': out of range: expected 0 to 4294967296" },
	{ "GRADSYNC_THRESHOLD=99999999999999999999999",
	  "threshold from GRADSYNC_THRESHOLD is '99999999999999999999999': out of range: expected 0 to 4294967296" },
	{ "GRADSYNC_WIRE=FP16", "wire dtype from GRADSYNC_WIRE is 'FP16': expected fp16, bf16 or fp32" },
	{ "GRADSYNC_OP=max", "op from GRADSYNC_OP is 'max': expected average or sum" },
	{ "GRADSYNC_PREDIVIDE=0.5", "predivide factor from GRADSYNC_PREDIVIDE is '0.5': " OUT_OF_FACTORS },
	{ "GRADSYNC_PREDIVIDE=0", "predivide factor from GRADSYNC_PREDIVIDE is '0': " OUT_OF_FACTORS },
	{ "GRADSYNC_PREDIVIDE=1000000.0000001",
	  "predivide factor from GRADSYNC_PREDIVIDE is '1000000.0000001': " OUT_OF_FACTORS },
	{ "GRADSYNC_PREDIVIDE=2x", "predivide factor from GRADSYNC_PREDIVIDE is '2x': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE=nan", "predivide factor from GRADSYNC_PREDIVIDE is 'nan': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE=inf", "predivide factor from GRADSYNC_PREDIVIDE is 'inf': " NOT_A_FACTOR },
	/* The four, each once accepted. */
	{ "GRADSYNC_PREDIVIDE=0x10", "predivide factor from GRADSYNC_PREDIVIDE is '0x10': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE= 2", "predivide factor from GRADSYNC_PREDIVIDE is ' 2': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE=-0", "predivide factor from GRADSYNC_PREDIVIDE is '-0': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE=1e-400", "predivide factor from GRADSYNC_PREDIVIDE is '1e-400': " OUT_OF_FACTORS },
	{ "GRADSYNC_PREDIVIDE=+2", "predivide factor from GRADSYNC_PREDIVIDE is '+2': " NOT_A_FACTOR },
	{ "GRADSYNC_PREDIVIDE=1e400", "predivide factor from GRADSYNC_PREDIVIDE is '1e400': " OUT_OF_FACTORS },
	{ "GRADSYNC_THRESHOLD=010", "threshold from GRADSYNC_THRESHOLD is '010': " NOT_A_NUMBER },
	{ "GRADSYNC_FUSION_BUFFER=1073741825",
	  "fusion buffer from GRADSYNC_FUSION_BUFFER is '1073741825': out of range: expected 1024 to 1073741824" },
	{ "GRADSYNC_FUSION_BUFFER=1023",
	  "fusion buffer from GRADSYNC_FUSION_BUFFER is '1023': out of range: expected 1024 to 1073741824" },
};

static void settings_bad(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(bad_settings) / sizeof(bad_settings[0]); i++) {
		print_message("case: %s\n", bad_settings[i].var);
		set_env((const char *const[]){ bad_settings[i].var, NULL });
		struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
		assert_int_equal(gs_launch_info_get(NULL, &li), GS_EINVAL);
		assert_string_equal(gs_last_error(NULL), bad_settings[i].message);
	}
	set_env((const char *const[]){ NULL });
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.wire_dtype = (enum gs_wire_dtype)9;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_EINVAL);
	assert_string_equal(gs_last_error(NULL),
			    "wire dtype from gs_connect_options is '9': expected fp16, bf16 or fp32");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.predivide_factor = 2e6;
	assert_int_equal(gs_launch_info_get(&o, &li), GS_EINVAL);
	assert_string_equal(gs_last_error(NULL),
			    "predivide factor from gs_connect_options is '2e+06': expected 'world' (0) or a number in [1, 1e6]");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(good_cases),
		cmocka_unit_test(bad_cases),
		cmocka_unit_test(bad_options),
		cmocka_unit_test(rank_without_size_is_the_daemons),
		cmocka_unit_test(shorter_structs),
		cmocka_unit_test(settings_unset),
		cmocka_unit_test(settings_from_env),
		cmocka_unit_test(settings_options_win),
		cmocka_unit_test(settings_bad),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
