/*
 * examples/trainer.c, run as its readers would: two of them on one node
 * (GS_EXAMPLE is the program). Each checks its own results; the test
 * passes when both exit 0 after printing their last step.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <cmocka.h>

#include "harness.h"

static void two_trainers_average(void **state)
{
	(void)state;
	static struct harness_job job = { .local_size = { 2 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);

	pid_t pids[2];
	char logs[2][200];
	for (int r = 0; r < 2; r++) {
		snprintf(logs[r], sizeof(logs[r]), "%s/example-%d.log", d.dir, r);
		const char *argv[] = { getenv("GS_EXAMPLE"), d.socket, r ? "1" : "0", NULL };
		pids[r] = harness_job_spawn(&job, 0, argv, logs[r]);
	}
	int failed = 0;
	for (int r = 0; r < 2; r++) {
		if (harness_wait(pids[r], 60000) != 0 ||
		    !harness_file_contains(logs[r], "step 3: ")) {
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
		cmocka_unit_test(two_trainers_average),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
