/*
 * A whole step on one node with the real daemon and real trainer processes
 * (gradsync-verifying-trainer). Each trainer regenerates every rank's inputs,
 * computes the expected result in fp64, and exits non-zero on the first
 * element outside the wire dtype's rounding (or not bitwise equal with
 * --exact), or when the step's non-finite or clipped counts differ from
 * its own. The test passes when every trainer does.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "harness.h"

struct sync_case {
	const char *layout;
	struct harness_job job; /* local_size[0]: the trainers */
	const char *steps;
	const char *trainer_args[6];
};

static void run_case(const struct sync_case *c)
{
	struct harness_job job = c->job;
	const unsigned trainers = job.local_size[0];
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);

	pid_t pids[8];
	char logs[8][200];
	for (unsigned r = 0; r < trainers; r++) {
		char rank[16];
		snprintf(rank, sizeof(rank), "%u", r);
		snprintf(logs[r], sizeof(logs[r]), "%s/trainer-%u.log", d.dir, r);
		const char *argv[24] = {
			getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
			harness_layout(c->layout), "--rank", rank, "--steps", c->steps,
		};
		size_t n = 9;
		for (size_t i = 0; c->trainer_args[i]; i++)
			argv[n++] = c->trainer_args[i];
		pids[r] = harness_job_spawn(&job, 0, argv, logs[r]);
	}
	int failed = 0;
	for (unsigned r = 0; r < trainers; r++) {
		int status = harness_wait(pids[r], 240000);
		if (status != 0) {
			harness_dump(logs[r]);
			failed = 1;
		}
	}
	if (failed)
		harness_dump(d.log);
	assert_int_equal(failed, 0);
	const char *all[8];
	for (unsigned r = 0; r < trainers; r++)
		all[r] = logs[r];
	harness_expect_same_lines(all, trainers, "NORM ");
	assert_int_equal(harness_daemon_stop(&d), 0);
}

#define CASE(name, ...)                                                        \
	static void name(void **state)                                         \
	{                                                                      \
		(void)state;                                                   \
		static const struct sync_case c = __VA_ARGS__;                 \
		run_case(&c);                                                  \
	}

CASE(one_trainer_fp16,
     { "resnet50.txt", { .local_size = { 1 } }, "3", { NULL } })
CASE(two_trainers_fp16,
     { "resnet50.txt", { .local_size = { 2 } }, "3", { "--bucket-events", NULL } })
CASE(four_trainers_fp16,
     { "resnet50.txt", { .local_size = { 4 } }, "2", { NULL } })
CASE(two_trainers_fp32_exact,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "fp32" }, "2",
       { "--pattern", "pow2", "--exact", NULL } })
CASE(four_trainers_fp32_exact,
     { "resnet50.txt", { .local_size = { 4 }, .wire = "fp32" }, "2",
       { "--pattern", "pow2", "--exact", NULL } })
CASE(two_trainers_bf16,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "bf16" }, "2", { NULL } })
CASE(two_trainers_sum,
     { "resnet50.txt", { .local_size = { 2 }, .op = "sum" }, "2", { NULL } })
CASE(two_trainers_sum_fp32_exact,
     { "resnet50.txt", { .local_size = { 2 }, .op = "sum", .wire = "fp32" }, "2",
       { "--pattern", "pow2", "--exact", NULL } })
CASE(two_trainers_clipping,
     { "resnet50.txt", { .local_size = { 2 } }, "2", { "--clip", "1.0", NULL } })
CASE(two_trainers_clipping_bf16,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "bf16" }, "2", { "--clip", "0.5", NULL } })
CASE(overflow_reports_nonfinite,
     { "resnet50.txt", { .local_size = { 2 } }, "2", { "--pattern", "overflow", NULL } })
/* A planted +inf makes the norm inf on every wire (the trainers check it). */
CASE(inf_norm_fp16,
     { "resnet50.txt", { .local_size = { 2 } }, "2", { "--pattern", "inf", NULL } })
CASE(inf_norm_bf16,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "bf16" }, "2", { "--pattern", "inf", NULL } })
CASE(inf_norm_fp32,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "fp32" }, "2", { "--pattern", "inf", NULL } })
CASE(three_trainers_predivide_after,
     { "resnet50.txt", { .local_size = { 3 }, .predivide = "1" }, "2", { NULL } })
CASE(buckets_larger_than_fusion_buffer,
     { "resnet50.txt", { .local_size = { 2 }, .fusion_buffer = "65536", .threshold = "100000" },
       "2", { NULL } })
/* Gradients that no trainer produced, or one only (gs_mark_absent). */
CASE(two_trainers_absent,
     { "resnet50.txt", { .local_size = { 2 } }, "2", { "--absent", "3", NULL } })
CASE(two_trainers_absent_staged_fp32_exact,
     { "resnet50.txt", { .local_size = { 2 }, .wire = "fp32", .fusion_buffer = "65536",
       .threshold = "100000" }, "2", { "--absent", "4", "--pattern", "pow2", "--exact", NULL } })

/* Two trainers built as before grad_norm (tests/trainer/old-abi-trainer.c):
 * the GRADSYNC_0 versions of gs_step_wait and gs_step_poll fill their
 * struct and nothing after it, and the current version adds the norm. */
static void old_abi_callers(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++) {
		snprintf(logs[r], sizeof(logs[r]), "%s/old-abi-%u.log", d.dir, r);
		char rank[16];
		snprintf(rank, sizeof(rank), "%u", r);
		const char *argv[] = { getenv("GS_OLD_ABI_TRAINER"), d.socket, rank, NULL };
		pids[r] = harness_job_spawn(&job, 0, argv, logs[r]);
	}
	int failed = 0;
	for (unsigned r = 0; r < 2; r++) {
		if (harness_wait(pids[r], 120000) != 0) {
			harness_dump(logs[r]);
			failed = 1;
		}
	}
	if (failed)
		harness_dump(d.log);
	assert_int_equal(failed, 0);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(one_trainer_fp16),
		cmocka_unit_test(two_trainers_fp16),
		cmocka_unit_test(four_trainers_fp16),
		cmocka_unit_test(two_trainers_fp32_exact),
		cmocka_unit_test(four_trainers_fp32_exact),
		cmocka_unit_test(two_trainers_bf16),
		cmocka_unit_test(two_trainers_sum),
		cmocka_unit_test(two_trainers_sum_fp32_exact),
		cmocka_unit_test(two_trainers_clipping),
		cmocka_unit_test(two_trainers_clipping_bf16),
		cmocka_unit_test(overflow_reports_nonfinite),
		cmocka_unit_test(inf_norm_fp16),
		cmocka_unit_test(inf_norm_bf16),
		cmocka_unit_test(inf_norm_fp32),
		cmocka_unit_test(three_trainers_predivide_after),
		cmocka_unit_test(buckets_larger_than_fusion_buffer),
		cmocka_unit_test(two_trainers_absent),
		cmocka_unit_test(two_trainers_absent_staged_fp32_exact),
		cmocka_unit_test(old_abi_callers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
