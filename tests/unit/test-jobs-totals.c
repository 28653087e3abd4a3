/*
 * The node's figures over its jobs (gs_jobs_totals), without a daemon:
 * every job's steps count, the median is over the steps the jobs really
 * made (not over empty slots), and the last step is the one that ended
 * last. Jobs are given only their figures, which is all the sum reads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jobs/jobs.h"

/* A job whose steps took times[0..n) ns, its last ending at end_ns. */
static struct gs_job_entry *job_of(const uint64_t *times, size_t n, uint64_t end_ns)
{
	struct gs_job_entry *e = calloc(1, sizeof(*e));
	assert_non_null(e);
	for (size_t i = 0; i < n; i++)
		gs_stats_record_step(&e->job.stats, times[i]);
	e->job.stats.last_step_end_ns = end_ns;
	return e;
}

static void two_jobs_one_median(void **state)
{
	(void)state;
	/* Job a: 3 steps of 10 ms; job b: 2 steps of 40 ms, ended later. The
	 * node's 5 steps: 10, 10, 10, 40, 40 ms, median 10 ms. */
	static const uint64_t a[] = { 10000000, 10000000, 10000000 };
	static const uint64_t b[] = { 40000000, 40000000 };
	struct gs_jobs t;
	memset(&t, 0, sizeof(t));
	struct gs_job_entry *ea = job_of(a, 3, 100), *eb = job_of(b, 2, 200);
	ea->next = eb;
	t.head = ea;
	struct gs_stats s;
	gs_jobs_totals(&t, &s);
	assert_int_equal(s.steps_completed, 5);
	assert_int_equal(gs_stats_median(&s), 10000000);
	assert_int_equal(s.last_step_ns, 40000000);
	assert_int_equal(s.step_ns_sum, 110000000);
	/* Jobs that have gone count too. */
	gs_stats_record_step(&t.ended, 40000000);
	gs_stats_record_step(&t.ended, 40000000);
	gs_jobs_totals(&t, &s);
	assert_int_equal(s.steps_completed, 7);
	assert_int_equal(gs_stats_median(&s), 40000000);
	free(ea);
	free(eb);
}

/* A job with more steps than the window: its last GS_STEP_HISTORY times
 * fill the node's whole window, and the count holds every step. */
static void a_long_job_fills_the_window(void **state)
{
	(void)state;
	enum { N = GS_STEP_HISTORY + 300 };
	uint64_t *times = calloc(N, sizeof(*times));
	assert_non_null(times);
	for (size_t i = 0; i < N; i++)
		times[i] = i < 300 ? 999000000 : 5000000; /* the old ones, out of the window */
	static const uint64_t one[] = { 7000000 };
	struct gs_jobs t;
	memset(&t, 0, sizeof(t));
	struct gs_job_entry *small = job_of(one, 1, 50), *big = job_of(times, N, 60);
	small->next = big;
	t.head = small;
	struct gs_stats s;
	gs_jobs_totals(&t, &s);
	assert_int_equal(s.steps_completed, N + 1);
	assert_int_equal(gs_stats_median(&s), 5000000);
	assert_int_equal(s.last_step_ns, 5000000);
	free(small);
	free(big);
	free(times);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(two_jobs_one_median),
		cmocka_unit_test(a_long_job_fills_the_window),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
