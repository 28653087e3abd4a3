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
	unsigned trainers;
	const char *steps;
	const char *daemon_args[6];
	const char *trainer_args[6];
};

static void run_case(const struct sync_case *c)
{
	char local_size[32];
	snprintf(local_size, sizeof(local_size), "--local-size=%u", c->trainers);
	const char *dargs[8] = { local_size };
	for (size_t i = 0; c->daemon_args[i]; i++)
		dargs[i + 1] = c->daemon_args[i];
	struct gs_test_daemon d;
	harness_daemon_start(&d, dargs);

	pid_t pids[8];
	char logs[8][200];
	for (unsigned r = 0; r < c->trainers; r++) {
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
		pids[r] = harness_spawn(argv, logs[r]);
	}
	int failed = 0;
	for (unsigned r = 0; r < c->trainers; r++) {
		int status = harness_wait(pids[r], 240000);
		if (status != 0) {
			harness_dump(logs[r]);
			failed = 1;
		}
	}
	if (failed)
		harness_dump(d.log);
	assert_int_equal(failed, 0);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

#define CASE(name, ...)                                                        \
	static void name(void **state)                                         \
	{                                                                      \
		(void)state;                                                   \
		static const struct sync_case c = __VA_ARGS__;                 \
		run_case(&c);                                                  \
	}

CASE(one_trainer_fp16, { "resnet50.txt", 1, "3", { NULL }, { NULL } })
CASE(two_trainers_fp16, { "resnet50.txt", 2, "3", { NULL }, { "--bucket-events", NULL } })
CASE(four_trainers_fp16, { "resnet50.txt", 4, "2", { NULL }, { NULL } })
CASE(two_trainers_fp32_exact,
     { "resnet50.txt", 2, "2", { "--wire=fp32", NULL }, { "--pattern", "pow2", "--exact", NULL } })
CASE(four_trainers_fp32_exact,
     { "resnet50.txt", 4, "2", { "--wire=fp32", NULL }, { "--pattern", "pow2", "--exact", NULL } })
CASE(two_trainers_bf16, { "resnet50.txt", 2, "2", { "--wire=bf16", NULL }, { NULL } })
CASE(two_trainers_sum, { "resnet50.txt", 2, "2", { "--op=sum", NULL }, { NULL } })
CASE(two_trainers_sum_fp32_exact,
     { "resnet50.txt", 2, "2", { "--op=sum", "--wire=fp32", NULL }, { "--pattern", "pow2", "--exact", NULL } })
CASE(two_trainers_clipping, { "resnet50.txt", 2, "2", { NULL }, { "--clip", "1.0", NULL } })
CASE(two_trainers_clipping_bf16,
     { "resnet50.txt", 2, "2", { "--wire=bf16", NULL }, { "--clip", "0.5", NULL } })
CASE(overflow_reports_nonfinite, { "resnet50.txt", 2, "2", { NULL }, { "--pattern", "overflow", NULL } })
CASE(three_trainers_predivide_after,
     { "resnet50.txt", 3, "2", { "--predivide=1", NULL }, { NULL } })
CASE(buckets_larger_than_fusion_buffer,
     { "resnet50.txt", 2, "2", { "--fusion-buffer=65536", "--threshold=100000", NULL }, { NULL } })

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
		cmocka_unit_test(three_trainers_predivide_after),
		cmocka_unit_test(buckets_larger_than_fusion_buffer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
