/*
 * The launcher's environment end to end: `gradsyncctl launch-env` under a
 * torchrun-like environment prints what a reader of the precedence table
 * expects, and refuses an inconsistent one; trainers started the way
 * torchrun starts them, with no rank of their own, join a real daemon as
 * the local ranks and job of their environment, as its status shows.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

/* Replaces every launcher variable of this process (which the programs it
 * spawns inherit) with vars, "NAME=value" ended by NULL. */
static void launch_env(const char *const *vars)
{
	harness_clear_launch_env();
	for (size_t i = 0; vars && vars[i]; i++)
		assert_int_equal(putenv((char *)vars[i]), 0);
}

static int run_ctl(const char *dir, const char *name, const char *const *vars,
		   char *log, size_t loglen)
{
	snprintf(log, loglen, "%s/%s.log", dir, name);
	const char *argv[] = { getenv("GS_CTL"), "launch-env", NULL };
	launch_env(vars);
	pid_t pid = harness_spawn(argv, log);
	launch_env(NULL);
	return harness_wait(pid, 30000);
}

static void expect_line(const char *log, const char *line)
{
	if (!harness_file_contains(log, line)) {
		harness_dump(log);
		fail_msg("missing from gradsyncctl's output: %s", line);
	}
}

/* The example: one trainer of node 1 of a 2-node job whose node 0
 * is the daemon at 127.0.0.2. */
static void ctl_under_torchrun(void **state)
{
	(void)state;
	char dir[] = "/tmp/gs-launch-XXXXXX", log[200];
	assert_non_null(mkdtemp(dir));
	static const char *const vars[] = {
		"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=4", "GROUP_RANK=1",
		"MASTER_ADDR=127.0.0.2", "TORCHELASTIC_RUN_ID=x",
		/* Slurm's, under torchrun's: torchrun's win. */
		"SLURM_JOB_ID=5", "SLURM_LOCALID=3", "SLURM_NNODES=7",
		"GRADSYNC_WIRE=bf16", "GRADSYNC_PREDIVIDE=world", NULL,
	};
	int status = run_ctl(dir, "torchrun", vars, log, sizeof(log));
	if (status != 0)
		harness_dump(log);
	assert_int_equal(status, 0);
	expect_line(log, "  job id:          'x'                      from TORCHELASTIC_RUN_ID (torchrun)\n");
	expect_line(log, "  local rank:      0                        from LOCAL_RANK (torchrun)\n");
	expect_line(log, "  local size:      2                        from LOCAL_WORLD_SIZE (torchrun)\n");
	expect_line(log, "  nodes:           2                        from WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)\n");
	expect_line(log, "  node rank:       1                        from GROUP_RANK (torchrun)\n");
	expect_line(log, "  coordinator:     127.0.0.2                from MASTER_ADDR (torchrun)\n");
	expect_line(log, "  threshold:       (the job's)              from unset\n");
	expect_line(log, "  wire dtype:      bf16                     from GRADSYNC_WIRE\n");
	expect_line(log, "  op:              (the job's)              from unset\n");
	expect_line(log, "  predivide:       world                    from GRADSYNC_PREDIVIDE\n");
	expect_line(log, "  fusion buffer:   (the job's)              from unset\n");

	static const char *const odd[] = {
		"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=3", NULL,
	};
	assert_int_equal(run_ctl(dir, "odd", odd, log, sizeof(log)), 1);
	expect_line(log, "gradsyncctl: node count: WORLD_SIZE (torchrun) '3' is not a multiple of LOCAL_WORLD_SIZE (torchrun) '2'\n");
	unlink(log);
	snprintf(log, sizeof(log), "%s/torchrun.log", dir);
	unlink(log);
	rmdir(dir);
}

/* The daemon's view of its trainers, or NULL while it has fewer than n. */
static struct gs_status *status_with_trainers(const char *socket, size_t n)
{
	gs_client *c;
	struct gs_status *st = NULL;
	if (gs_control_connect(socket, 5000, &c) != GS_OK)
		fail_msg("status: cannot connect: %s", gs_last_error(NULL));
	if (gs_status_get(c, 5000, &st) != GS_OK)
		fail_msg("status: %s", gs_last_error(c));
	gs_close(c);
	if (st->trainer_count >= n)
		return st;
	gs_status_free(st);
	return NULL;
}

static struct gs_status *wait_for_trainers(const struct gs_test_daemon *d, size_t n)
{
	double t0 = harness_now_s();
	struct gs_status *st;
	while (!(st = status_with_trainers(d->socket, n))) {
		if (harness_now_s() - t0 > 60) {
			harness_dump(d->log);
			fail_msg("gradsyncd never had %zu trainers", n);
		}
		usleep(20000);
	}
	return st;
}

static pid_t spawn_trainer(const struct gs_test_daemon *d, const char *const *vars,
			   const char *log)
{
	const char *argv[] = {
		getenv("GS_TRAINER"), "--socket", d->socket, "--layout",
		harness_layout("resnet50.txt"), "--steps", "2", NULL,
	};
	launch_env(vars);
	pid_t pid = harness_spawn(argv, log);
	launch_env(NULL);
	return pid;
}

/* LOCAL_RANK=1 LOCAL_WORLD_SIZE=2, no --rank: the trainer is local rank 1
 * of job "launch-test", and every element of both trainers checks out. */
static void trainer_takes_rank_from_env(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	/* The job that torchrun's variables below describe to the trainers. */
	static struct harness_job job = { .id = "launch-test", .local_size = { 2 } };
	launch_env(NULL);
	harness_job_daemon_start(&d, &job, 0, NULL);

	char log1[200], log0[200];
	snprintf(log1, sizeof(log1), "%s/trainer-env-1.log", d.dir);
	snprintf(log0, sizeof(log0), "%s/trainer-env-0.log", d.dir);
	static const char *const rank1[] = {
		"LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=launch-test", NULL,
	};
	static const char *const rank0[] = {
		"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=launch-test", NULL,
	};
	pid_t p1 = spawn_trainer(&d, rank1, log1);

	/* Alone, it waits for rank 0: the daemon shows where it sits. */
	struct gs_status *st = wait_for_trainers(&d, 1);
	assert_int_equal(st->trainer_count, 1);
	assert_int_equal(st->trainers[0].pid, (uint32_t)p1);
	assert_int_equal(st->trainers[0].local_rank, 1);
	assert_string_equal(st->job_id, "launch-test");
	gs_status_free(st);

	pid_t p0 = spawn_trainer(&d, rank0, log0);
	int s1 = harness_wait(p1, 240000), s0 = harness_wait(p0, 240000);
	if (s1 != 0 || s0 != 0) {
		harness_dump(log1);
		harness_dump(log0);
		harness_dump(d.log);
	}
	assert_int_equal(s1, 0);
	assert_int_equal(s0, 0);
	expect_line(log1, "(node 0, local 1 of 2)");
	expect_line(log0, "(node 0, local 0 of 2)");
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ctl_under_torchrun),
		cmocka_unit_test(trainer_takes_rank_from_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
