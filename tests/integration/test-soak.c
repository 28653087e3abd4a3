/*
 * Soak: thousands of steps of four trainers on one real gradsyncd, in which
 * the daemon's resident memory, descriptors and threads must stay flat, and
 * every element of every step must be the exact average.
 *
 * The four trainers are four libgradsync handles in this process, driven
 * in lock step: each begins the step, writes its gradients and marks them
 * all ready, then each waits for the step to end. Every so often a control
 * client asks for the status, so that connections come and go as well.
 *
 * Inputs are integers in [-64, 64]: with --op average the daemon divides
 * each by 4 (exact), rounds to fp16 (exact: a multiple of 1/4 below 16 has
 * few significant bits), sums four in fp32 and rounds once (exact: a
 * multiple of 1/4 below 64), so the result must equal, bit for bit, the
 * average computed here in double precision.
 *
 * GS_SOAK_STEPS overrides the number of steps (default 5000).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

#define TRAINERS 4
#define WARMUP_STEP 200
/* Growth of the daemon's resident memory allowed from the warm-up to the
 * end. In steady state every allocation of a step (frames in and out, a
 * bucket run per bucket) is freed within the step and glibc hands the same
 * chunks back the next one: measured, RSS moves by 16 KiB over 10000 steps
 * (a few pages as malloc settles). The smallest chunk glibc allocates is 32
 * bytes, so a single allocation leaked per step grows RSS by 150 KiB over
 * the 4800 steps measured and fails the test. Under AddressSanitizer freed
 * memory sits in a quarantine and RSS grows by design; there LeakSanitizer
 * checks the daemon exactly at its exit instead. */
#define RSS_GROWTH_MAX_KB 128
#define DEFAULT_STEPS 5000

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* A small layout in backpropagation order: lone tensors above the
 * threshold, groups below it, buckets larger than the fusion buffer. */
static const struct {
	const char *name;
	uint64_t count;
} layout[] = {
	{ "head.weight", 2048 }, { "head.bias", 1 },     { "block3.norm", 300 },
	{ "block3.conv", 4096 }, { "block2.bias", 17 },  { "block2.conv", 1500 },
	{ "block1.conv", 3000 }, { "stem.conv", 1000 },
};
#define NTENSORS (sizeof(layout) / sizeof(layout[0]))
static struct harness_job job = {
	.id = "soak", .local_size = { TRAINERS }, .threshold = "2048", .fusion_buffer = "1024",
	.wire = "fp16", .op = "average",
};
static const char *const daemon_args[] = { "--log-level=info", NULL };

static struct gs_test_daemon daemon_;
static gs_client *trainer[TRAINERS];

/* ---- The daemon's resources, from /proc ---------------------------------- */

struct usage {
	long rss_kb;
	long threads;
	int fds;
};

static long status_field(pid_t pid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	long v = -1;
	size_t n = strlen(field);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	fclose(f);
	assert_true(v >= 0);
	return v;
}

static int count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static struct usage usage_of(pid_t pid)
{
	struct usage u = { status_field(pid, "VmRSS"), status_field(pid, "Threads"),
			   count_fds(pid) };
	return u;
}

/* ---- Inputs and the reference ---------------------------------------------- */

/* An integer in [-64, 64] that differs between steps, ranks, tensors and
 * elements, so that a stale or misplaced result shows. */
static float input(uint64_t step, unsigned rank, size_t tensor, uint64_t i)
{
	return (float)((int)((step * 7 + rank * 13 + tensor * 5 + i * 3) % 129) - 64);
}

static float expected(uint64_t step, size_t tensor, uint64_t i)
{
	double sum = 0;
	for (unsigned r = 0; r < TRAINERS; r++)
		sum += input(step, r, tensor, i);
	return (float)(sum / TRAINERS);
}

/* ---- One step -------------------------------------------------------------- */

static void run_step(uint64_t step)
{
	static uint32_t all[NTENSORS];
	for (size_t t = 0; t < NTENSORS; t++)
		all[t] = (uint32_t)t;
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	for (unsigned r = 0; r < TRAINERS; r++) {
		if (gs_step_begin(trainer[r], &so) != GS_OK)
			fail_msg("step %llu, rank %u: begin: %s", (unsigned long long)step, r,
				 gs_last_error(trainer[r]));
		for (size_t t = 0; t < NTENSORS; t++) {
			float *g = gs_tensor_data(trainer[r], t);
			for (uint64_t i = 0; i < layout[t].count; i++)
				g[i] = input(step, r, t, i);
		}
		if (gs_mark_ready(trainer[r], all, NTENSORS) != GS_OK)
			fail_msg("step %llu, rank %u: mark: %s", (unsigned long long)step, r,
				 gs_last_error(trainer[r]));
	}
	for (unsigned r = 0; r < TRAINERS; r++) {
		struct gs_step_result res;
		int rc = gs_step_wait(trainer[r], 30000, &res);
		if (rc != GS_OK)
			fail_msg("step %llu, rank %u: %s: %s", (unsigned long long)step, r,
				 gs_strerror(rc), gs_last_error(trainer[r]));
		assert_int_equal(res.step, step);
		assert_int_equal(res.nonfinite, 0);
	}
	for (unsigned r = 0; r < TRAINERS; r++)
		for (size_t t = 0; t < NTENSORS; t++) {
			const float *g = gs_tensor_data(trainer[r], t);
			for (uint64_t i = 0; i < layout[t].count; i++) {
				float want = expected(step, t, i);
				if (memcmp(&g[i], &want, sizeof(want)) != 0)
					fail_msg("step %llu, rank %u, %s[%llu]: %g, expected %g",
						 (unsigned long long)step, r, layout[t].name,
						 (unsigned long long)i, (double)g[i], (double)want);
			}
		}
}

/* A control client comes, asks, and goes. Returns the completed steps. */
static uint64_t status_steps(void)
{
	gs_client *ctl;
	if (gs_control_connect(daemon_.socket, 10000, &ctl) != GS_OK)
		fail_msg("control connect: %s", gs_last_error(NULL));
	struct gs_status *st;
	if (gs_status_get(ctl, 10000, &st) != GS_OK)
		fail_msg("status: %s", gs_last_error(ctl));
	uint64_t steps = st->steps_completed;
	gs_status_free(st);
	gs_close(ctl);
	return steps;
}

/* ---- The test ---------------------------------------------------------------- */

static uint64_t soak_steps(void)
{
	const char *e = getenv("GS_SOAK_STEPS");
	uint64_t n = e ? strtoull(e, NULL, 10) : DEFAULT_STEPS;
	return n > WARMUP_STEP ? n : WARMUP_STEP + 1;
}

static void flat_over_thousands_of_steps(void **state)
{
	(void)state;
	uint64_t steps = soak_steps();
	harness_job_daemon_start(&daemon_, &job, 0, daemon_args);
	struct gs_tensor_spec specs[NTENSORS];
	for (size_t t = 0; t < NTENSORS; t++)
		specs[t] = (struct gs_tensor_spec){ layout[t].name, layout[t].count, GS_FLOAT32,
						    -1, 0 };
	harness_job_setenv(&job, 0);
	for (unsigned r = 0; r < TRAINERS; r++) {
		struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
		o.socket_path = daemon_.socket;
		o.local_rank = r;
		if (gs_connect(&o, &trainer[r]) != GS_OK)
			fail_msg("connect rank %u: %s", r, gs_last_error(NULL));
		if (gs_register(trainer[r], specs, NTENSORS) != GS_OK)
			fail_msg("register rank %u: %s", r, gs_last_error(trainer[r]));
	}
	harness_clear_launch_env();
	print_message("%zu tensors in %zu buckets, %llu steps\n", gs_tensor_count(trainer[0]),
		      gs_bucket_count(trainer[0]), (unsigned long long)steps);

	struct usage start = usage_of(daemon_.pid), warm = start;
	double t0 = harness_now_s(), t_warm = t0;
	for (uint64_t step = 1; step <= steps; step++) {
		run_step(step);
		if (step % 100 == 50)
			assert_int_equal(status_steps(), step);
		if (step == WARMUP_STEP) {
			warm = usage_of(daemon_.pid);
			t_warm = harness_now_s();
		}
	}
	struct usage end = usage_of(daemon_.pid);
	double t_end = harness_now_s();

	print_message("daemon after registering: VmRSS %ld KiB, %d fds, %ld threads\n",
		      start.rss_kb, start.fds, start.threads);
	print_message("daemon at step %d:        VmRSS %ld KiB, %d fds, %ld threads\n",
		      WARMUP_STEP, warm.rss_kb, warm.fds, warm.threads);
	print_message("daemon at step %llu:       VmRSS %ld KiB, %d fds, %ld threads\n",
		      (unsigned long long)steps, end.rss_kb, end.fds, end.threads);
	print_message("RSS growth over %llu steps after the warm-up: %ld KiB (at most %d); %.0f steps/s\n",
		      (unsigned long long)(steps - WARMUP_STEP), end.rss_kb - warm.rss_kb,
		      RSS_GROWTH_MAX_KB, (double)(steps - WARMUP_STEP) / (t_end - t_warm));
	assert_int_equal(end.fds, warm.fds);
	assert_int_equal(end.threads, warm.threads);
	if (UNDER_ASAN)
		print_message("AddressSanitizer build: RSS growth not checked (LeakSanitizer is)\n");
	else
		assert_true(end.rss_kb - warm.rss_kb <= RSS_GROWTH_MAX_KB);
	assert_int_equal(status_steps(), steps);

	for (unsigned r = 0; r < TRAINERS; r++) {
		gs_close(trainer[r]);
		trainer[r] = NULL;
	}
	/* Non-zero also when LeakSanitizer finds a leak at its exit. */
	assert_int_equal(harness_daemon_stop(&daemon_), 0);
	daemon_.pid = 0;
}

/* A failed check leaves the daemon running: stop it. */
static int teardown(void **state)
{
	(void)state;
	for (unsigned r = 0; r < TRAINERS; r++)
		gs_close(trainer[r]);
	if (daemon_.pid > 0 && harness_daemon_alive(&daemon_)) {
		fprintf(stderr, "gradsyncd's log is %s\n", daemon_.log);
		harness_daemon_stop(&daemon_);
	}
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(flat_over_thousands_of_steps, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
