/*
 * A trainer's view of its job against the job's, which its first trainer
 * defines (and today gradsyncd's own flags, made from the same
 * description): a trainer whose environment or connect options disagree
 * on any field is refused, quickly, with the field and both values, and
 * nothing of it stays registered; trainers that agree on every field, set
 * through GRADSYNC_* and torchrun's variables, run steps with every
 * element checked by the verifying trainer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

/* What a refusal says of where the job's value came from. */
#define SOURCE " (set by its first trainer)"

/* The job of one node. */
static struct harness_job job = {
	.id = "view", .local_size = { 2 }, .threshold = "65536", .wire = "bf16", .op = "sum",
	.predivide = "2", .fusion_buffer = "8192",
};

/* Every variable of the job's, agreeing with `job` through torchrun's
 * variables where it has them, for local rank r (with GRADSYNC_LOCAL_RANK
 * unset: LOCAL_RANK). */
static const char *const agreeing[] = {
	"TORCHELASTIC_RUN_ID=view", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=2", "GROUP_RANK=0",
	"MASTER_ADDR=somewhere", /* one node: not compared */
	"GRADSYNC_THRESHOLD=65536", "GRADSYNC_WIRE=bf16", "GRADSYNC_OP=sum",
	"GRADSYNC_PREDIVIDE=2", "GRADSYNC_FUSION_BUFFER=8192", NULL,
};

static void set_env(const char *const *vars)
{
	harness_clear_launch_env();
	for (size_t i = 0; vars && vars[i]; i++)
		assert_int_equal(putenv((char *)vars[i]), 0);
}

static size_t trainers_of(const char *socket)
{
	gs_client *c;
	struct gs_status *st = NULL;
	if (gs_control_connect(socket, 5000, &c) != GS_OK)
		fail_msg("status: cannot connect: %s", gs_last_error(NULL));
	if (gs_status_get(c, 5000, &st) != GS_OK)
		fail_msg("status: %s", gs_last_error(c));
	gs_close(c);
	size_t n = st->trainer_count;
	gs_status_free(st);
	return n;
}

/* The job's first trainer, started with the job's own variables
 * (harness_job_spawn): local rank 1 of node `node`, so that the trainers
 * refused here may say local rank 0. It registers a small layout and
 * waits in step 1, which never ends without its rank 0, until killed. */
static pid_t spawn_holder(const struct gs_test_daemon *d, struct harness_job *j, unsigned node,
			  char *log)
{
	char layout[200];
	snprintf(layout, sizeof(layout), "%s/small.txt", d->dir);
	FILE *f = fopen(layout, "w");
	assert_non_null(f);
	fprintf(f, "a 1000\nb 3000\n");
	fclose(f);
	snprintf(log, 200, "%s/holder.log", d->dir);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d->socket, "--layout", layout,
			       "--rank", "1", "--steps", "1", "--pause-at-step", "1",
			       "--pause-after", "0", NULL };
	return harness_job_spawn(j, node, argv, log);
}

static void stop_holder(pid_t pid)
{
	kill(pid, SIGKILL);
	harness_wait(pid, 5000);
}

/* A trainer of this process with the agreeing environment but `var`
 * and `var2` (NAME=value, or NULL) or options *o: refused with GS_EREFUSED and `text`, in
 * under 5 s, and nothing of it stays. */
static void expect_refused(const char *socket, const char *var, const char *var2,
			   const struct gs_connect_options *o, const char *text)
{
	size_t before = trainers_of(socket);
	set_env(agreeing);
	putenv((char *)"LOCAL_RANK=0");
	if (var)
		putenv((char *)var);
	if (var2)
		putenv((char *)var2);
	struct gs_connect_options opts = GS_CONNECT_OPTIONS_INIT;
	if (o)
		opts = *o;
	opts.socket_path = socket;
	opts.timeout_ms = 5000;
	gs_client *c = NULL;
	double t0 = harness_now_s();
	int r = gs_connect(&opts, &c);
	double took = harness_now_s() - t0;
	harness_clear_launch_env();
	if (r != GS_EREFUSED || !strstr(gs_last_error(NULL), text))
		fail_msg("%s: got %d '%s', expected GS_EREFUSED with '%s'", var ? var : "options",
			 r, gs_last_error(NULL), text);
	assert_null(c);
	assert_true(took < 5.0);
	assert_int_equal(trainers_of(socket), before);
}

static void refused_on_each_field(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	char holder_log[200];
	pid_t holder = spawn_holder(&d, &job, 0, holder_log);
	harness_wait_for_text(holder_log, "PAUSED in step 1", 60);
	assert_int_equal(trainers_of(d.socket), 1);
	expect_refused(d.socket, "GRADSYNC_LOCAL_SIZE=4", NULL, NULL,
		       "job 'view': this trainer says local size 4, the job has 2" SOURCE);
	expect_refused(d.socket, "GRADSYNC_NODES=3", NULL, NULL,
		       "this trainer says node count 3, the job has 1" SOURCE);
	/* A node rank above the node count fails in the library; with
	 * WORLD_SIZE emptied the count is no source's, and not sent. */
	expect_refused(d.socket, "GRADSYNC_NODE_RANK=1", "WORLD_SIZE=", NULL,
		       "this trainer says node rank 1, the job has 0" SOURCE);
	expect_refused(d.socket, "GRADSYNC_THRESHOLD=1000", NULL, NULL,
		       "this trainer says threshold 1000, the job has 65536" SOURCE);
	expect_refused(d.socket, "GRADSYNC_WIRE=fp16", NULL, NULL,
		       "this trainer says wire dtype fp16, the job has bf16" SOURCE);
	expect_refused(d.socket, "GRADSYNC_OP=average", NULL, NULL,
		       "this trainer says op average, the job has sum" SOURCE);
	expect_refused(d.socket, "GRADSYNC_PREDIVIDE=world", NULL, NULL,
		       "this trainer says predivide world, the job has 2" SOURCE);
	expect_refused(d.socket, "GRADSYNC_FUSION_BUFFER=4096", NULL, NULL,
		       "this trainer says fusion buffer 4096, the job has 8192" SOURCE);

	/* The options win over the (agreeing) environment, and are checked
	 * the same way. */
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.threshold = 1000;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says threshold 1000, the job has 65536");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.wire_dtype = GS_WIRE_DTYPE_FP32;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says wire dtype fp32, the job has bf16");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.op = GS_OP_AVERAGE;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says op average, the job has sum");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.predivide_factor = 4;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says predivide 4, the job has 2");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.fusion_buffer_elements = 1024;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says fusion buffer 1024, the job has 8192");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.local_size = 1;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says local size 1, the job has 2");
	o = (struct gs_connect_options)GS_CONNECT_OPTIONS_INIT;
	o.nodes = 2;
	o.node_rank = 0;
	expect_refused(d.socket, NULL, NULL, &o, "this trainer says node count 2, the job has 1");
	assert_true(harness_daemon_alive(&d));
	stop_holder(holder);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A job of two nodes compares the coordinator's host with the job's
 * (its first trainer's, today also the host of gradsyncd's
 * --coordinator), case aside (a trainer is refused at hello, on node 0). */
static void refused_on_coordinator(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job two = job;
	two.nodes = 2;
	two.local_size[1] = 2;
	two.coordinator = "LocalHost"; /* node 0's address, 127.0.0.1, in other words */
	static const char *const args[] = { "--join-timeout=30", NULL };
	struct gs_test_daemon d, d1;
	harness_job_daemon_spawn(&d, &two, 0, args);
	harness_job_daemon_spawn(&d1, &two, 1, args);
	harness_daemon_wait_ready(&d, 30000);
	harness_daemon_wait_ready(&d1, 30000);
	/* The job's first trainer on each node. */
	char holder_log[2][200];
	pid_t holder[2] = { spawn_holder(&d, &two, 0, holder_log[0]),
			    spawn_holder(&d1, &two, 1, holder_log[1]) };
	for (unsigned r = 0; r < 2; r++)
		harness_wait_for_text(holder_log[r], "PAUSED in step 1", 60);
	/* WORLD_SIZE 4 of LOCAL_WORLD_SIZE 2: two nodes, as the daemon's. */
	expect_refused(d.socket, "MASTER_ADDR=127.0.0.9", "WORLD_SIZE=4", NULL,
		       "job 'view': this trainer says coordinator '127.0.0.9', the job has 'LocalHost'" SOURCE);
	expect_refused(d.socket, "GRADSYNC_COORDINATOR=localhost.example", "WORLD_SIZE=4", NULL,
		       "this trainer says coordinator 'localhost.example', the job has 'LocalHost'");
	/* The same host in other letters is no difference: the next field
	 * that differs is what the refusal names. */
	expect_refused(d.socket, "MASTER_ADDR=localhost", "WORLD_SIZE=6", NULL,
		       "this trainer says node count 3, the job has 2");
	assert_true(harness_daemon_alive(&d));
	for (unsigned r = 0; r < 2; r++)
		stop_holder(holder[r]);
	harness_daemon_stop(&d1);
	harness_daemon_stop(&d);
}

/* The verifying trainer itself, under a disagreeing torchrun environment,
 * exits non-zero with the daemon's words. */
static void verifying_trainer_refused(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	char holder_log[200];
	pid_t holder = spawn_holder(&d, &job, 0, holder_log);
	harness_wait_for_text(holder_log, "PAUSED in step 1", 60);
	char log[200];
	snprintf(log, sizeof(log), "%s/trainer-refused.log", d.dir);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
			       harness_layout("resnet50.txt"), "--steps", "1", NULL };
	set_env(agreeing);
	putenv((char *)"LOCAL_RANK=0");
	putenv((char *)"GRADSYNC_THRESHOLD=1000");
	pid_t pid = harness_spawn(argv, log);
	harness_clear_launch_env();
	assert_int_not_equal(harness_wait(pid, 30000), 0);
	if (!harness_file_contains(log, "this trainer says threshold 1000, the job has 65536" SOURCE)) {
		harness_dump(log);
		fail_msg("the trainer did not report the daemon's refusal");
	}
	stop_holder(holder);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Both trainers agree on every field, the first of them defining the
 * job from torchrun's variables: steps run, every element checked. */
static void agreeing_trainers_run(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	static const char *const rank_vars[2] = { "LOCAL_RANK=0", "LOCAL_RANK=1" };
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++) {
		snprintf(logs[r], sizeof(logs[r]), "%s/trainer-%u.log", d.dir, r);
		const char *argv[] = { getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
				       harness_layout("resnet50.txt"), "--steps", "2", NULL };
		set_env(agreeing);
		putenv((char *)rank_vars[r]);
		pids[r] = harness_spawn(argv, logs[r]);
		harness_clear_launch_env();
	}
	int failed = 0;
	for (unsigned r = 0; r < 2; r++)
		if (harness_wait(pids[r], 240000) != 0) {
			harness_dump(logs[r]);
			failed = 1;
		}
	if (failed)
		harness_dump(d.log);
	assert_int_equal(failed, 0);
	for (unsigned r = 0; r < 2; r++) {
		char where[64];
		snprintf(where, sizeof(where), "(node 0, local %u of 2)", r);
		if (!harness_file_contains(logs[r], "OK: 2 steps verified") ||
		    !harness_file_contains(logs[r], where)) {
			harness_dump(logs[r]);
			fail_msg("trainer %u did not verify 2 steps as local rank %u", r, r);
		}
	}
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A raw trainer of job j, local rank `rank`, welcomed; its socket. */
static int welcomed(const struct gs_test_daemon *d, const struct harness_job *j, uint32_t rank)
{
	int fd = raw_connect(d->socket);
	raw_hello_job(fd, rank, j);
	return fd;
}

/* A raw trainer of job j refused with code and text. */
static void refused(const struct gs_test_daemon *d, const struct harness_job *j, uint32_t rank,
		    int code, const char *text)
{
	int fd = raw_connect(d->socket);
	raw_send_hello_job(fd, rank, GS_PROTOCOL_VERSION, j, 0);
	raw_expect_error(fd, code, text);
	close(fd);
}

/* The node's limits keep one job from taking it: a job beyond --max-jobs,
 * a trainer beyond --max-trainers (every job's together), a fusion buffer
 * beyond --max-fusion-buffer and, without a node port, a job of several
 * nodes are refused, naming the limit; the jobs within them go on. */
static void node_limits(void **state)
{
	(void)state;
	static const char *const args[] = { "--max-jobs=2", "--max-trainers=4",
					    "--max-fusion-buffer=65536", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	struct harness_job a = { .id = "a", .local_size = { 3 }, .fusion_buffer = "65536" };
	struct harness_job b = { .id = "b", .fusion_buffer = "4096" };
	struct harness_job c = { .id = "c", .fusion_buffer = "4096" };
	struct harness_job big = { .id = "big", .fusion_buffer = "65537" };
	struct harness_job wide = { .id = "wide", .nodes = 2, .coordinator = "127.0.0.1",
				    .fusion_buffer = "4096" };
	refused(&d, &big, 0, GS_EINVAL, "job 'big': fusion buffer 65537 elements is outside this node's [1024, 65536] (--max-fusion-buffer)");
	refused(&d, &wide, 0, GS_EINVAL, "job 'wide': this daemon serves jobs of one node only (--node-port 0)");
	int a0 = welcomed(&d, &a, 0), a1 = welcomed(&d, &a, 1), b0 = welcomed(&d, &b, 0);
	refused(&d, &c, 0, GS_ELIMIT, "job 'c' cannot begin: this node serves 2 jobs already, its most (--max-jobs)");
	/* b's trainer gone, b lingers: still a job of the node's two; its
	 * local rank 0 is free again once the daemon has closed it. */
	raw_close(b0);
	refused(&d, &c, 0, GS_ELIMIT, "this node serves 2 jobs already");
	int b1 = welcomed(&d, &b, 0), a2 = welcomed(&d, &a, 2);
	refused(&d, &c, 0, GS_ELIMIT, "this node serves 4 trainers already, its most (--max-trainers)");
	close(a2);
	close(b1);
	close(a1);
	close(a0);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A job lingers between trainers: one of the same shape and user takes
 * it up again; one of another shape begins the job anew, which the
 * daemon says. */
static void lingering_job_taken_up_or_begun_anew(void **state)
{
	(void)state;
	static const char *const args[] = { "--job-linger=60", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	struct harness_job j = { .id = "l", .threshold = "1000" };
	raw_close(welcomed(&d, &j, 0));
	harness_wait_for_text(d.log, "job 'l': every trainer has left; keeping its group for 60 s", 10);
	/* Gone again before the other shape comes, which would otherwise
	 * find the job held, not lingering. */
	raw_close(welcomed(&d, &j, 0));
	harness_wait_for_text(d.log, "job 'l': a trainer came back", 10);
	assert_false(harness_log_contains(&d, "the lingering job's group goes"));
	struct harness_job other = { .id = "l", .threshold = "2000" };
	int fd = welcomed(&d, &other, 0);
	harness_wait_for_text(d.log, "job 'l': this trainer says threshold 2000, the job has 1000 (set by its first trainer): the lingering job's group goes", 10);
	/* The job is the new trainer's now. */
	refused(&d, &j, 0, GS_EREFUSED, "this trainer says threshold 1000, the job has 2000");
	close(fd);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(refused_on_each_field),
		cmocka_unit_test(refused_on_coordinator),
		cmocka_unit_test(verifying_trainer_refused),
		cmocka_unit_test(agreeing_trainers_run),
		cmocka_unit_test(node_limits),
		cmocka_unit_test(lingering_job_taken_up_or_begun_anew),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
