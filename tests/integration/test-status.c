/*
 * gradsyncctl status against a running daemon: after a known number of
 * steps with known inputs, the figures it reports must match what the test
 * computes itself; a status query must be answered while a bucket is being
 * reduced; gradsyncctl must say clearly when no daemon runs; and two jobs
 * on one daemon show each with its own shape, settings and figures.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

#define STEPS 3
#define CLIP 1.0f

static const struct gs_tensor_spec layout[] = {
	{ "head.bias", 777, GS_FLOAT32, -1, 0 },
	{ "head.weight", 70000, GS_FLOAT32, -1, 0 },
	{ "embed.weight", 3000001, GS_FLOAT32, -1, 0 },
	{ "norm.weight", 64, GS_FLOAT32, -1, 0 },
};
#define NT 4

/* A trainer of this process in job j (its variables set while it
 * connects; NULL: none, a job of one trainer and the defaults). */
static gs_client *trainer(const struct harness_job *j, const char *socket, uint32_t rank,
			  const struct gs_tensor_spec *specs, size_t n)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.local_rank = rank;
	gs_client *c;
	if (j)
		harness_job_setenv(j, 0);
	int r = gs_connect(&o, &c);
	harness_clear_launch_env();
	if (r != GS_OK)
		fail_msg("connect: %s", gs_last_error(NULL));
	if (gs_register(c, specs, n) != GS_OK)
		fail_msg("register: %s", gs_last_error(c));
	return c;
}

/* x = (i % 5) * 0.75 - 1.5: the elements with i % 5 in {0, 4} exceed 1. */
static uint64_t fill(gs_client *c)
{
	uint64_t over = 0;
	for (size_t t = 0; t < NT; t++) {
		float *p = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < layout[t].count; i++) {
			p[i] = (float)(i % 5) * 0.75f - 1.5f;
			over += p[i] > CLIP || p[i] < -CLIP;
		}
	}
	return over;
}

/* The number after "key": in a JSON text, or -1. */
static double json_number(const char *json, const char *key)
{
	char quoted[96];
	snprintf(quoted, sizeof(quoted), "\"%s\"", key);
	const char *p = strstr(json, quoted);
	if (!p)
		return -1;
	p += strlen(quoted);
	while (*p == ' ' || *p == ':')
		p++;
	return strtod(p, NULL);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static int run_ctl(const char *socket, const char *out, const char *a1, const char *a2)
{
	const char *argv[] = { getenv("GS_CTL"), "--socket", socket, a1, a2, NULL };
	remove(out);
	return harness_wait(harness_spawn(argv, out), 10000);
}

static void figures_after_known_steps(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 2 }, .threshold = "100000" };
	harness_job_daemon_start(&d, &job, 0, NULL);
	gs_client *c[2] = { trainer(&job, d.socket, 0, layout, NT),
			    trainer(&job, d.socket, 1, layout, NT) };

	uint64_t elements = 0, clipped = 0;
	for (size_t t = 0; t < NT; t++)
		elements += layout[t].count;
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	o.clipping = true;
	o.clip_value = CLIP;
	const uint32_t order[NT] = { 0, 1, 2, 3 };
	for (int s = 0; s < STEPS; s++) {
		for (int r = 0; r < 2; r++) {
			clipped += fill(c[r]);
			assert_int_equal(gs_step_begin(c[r], &o), GS_OK);
			assert_int_equal(gs_mark_ready(c[r], order, NT), GS_OK);
		}
		for (int r = 0; r < 2; r++) {
			struct gs_step_result res;
			assert_int_equal(gs_step_wait(c[r], 30000, &res), GS_OK);
		}
	}

	gs_client *ctl;
	assert_int_equal(gs_control_connect(d.socket, 5000, &ctl), GS_OK);
	struct gs_status *st;
	assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
	assert_int_equal(st->steps_completed, STEPS);
	assert_int_equal(st->steps_aborted, 0);
	assert_int_equal(st->trainer_count, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(st->trainers[i].tensors, NT);
		assert_int_equal(st->trainers[i].bytes, elements * 4);
		assert_int_equal(st->trainers[i].steps, STEPS);
	}
	assert_int_equal(st->bytes_reduced, STEPS * elements * 2);
	assert_int_equal(st->elements_clipped, clipped);
	assert_int_equal(st->nonfinite, 0);
	/* The plan: 3000001 goes alone; the rest stays one group (70841). */
	assert_int_equal(st->buckets, 2);
	assert_true(st->last_step_ns > 0);
	assert_true(st->median_step_ns > 0);
	assert_string_equal(st->backend, "host");
	assert_int_equal(st->local_size, 2);
	gs_status_free(st);
	gs_close(ctl);

	char out[256];
	snprintf(out, sizeof(out), "%s/ctl.json", d.dir);
	assert_int_equal(run_ctl(d.socket, out, "status", "--json"), 0);
	const char *json = read_file(out);
	print_message("%s\n", json);
	assert_true(json_number(json, "steps_completed") == STEPS);
	assert_true(json_number(json, "bytes_reduced") == (double)(STEPS * elements * 2));
	assert_true(json_number(json, "elements_clipped") == (double)clipped);
	assert_true(json_number(json, "nonfinite") == 0);

	snprintf(out, sizeof(out), "%s/ctl.txt", d.dir);
	assert_int_equal(run_ctl(d.socket, out, "status", NULL), 0);
	const char *text = read_file(out);
	print_message("%s\n", text);
	char want[64];
	snprintf(want, sizeof(want), "%llu", (unsigned long long)clipped);
	assert_non_null(strstr(text, want));
	assert_non_null(strstr(text, "host"));

	gs_close(c[0]);
	gs_close(c[1]);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

static void status_while_reducing(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_daemon_start(&d, NULL);
	/* 64M elements: the bucket takes far longer than a status round trip. */
	static const struct gs_tensor_spec big[] = { { "big", 64u << 20, GS_FLOAT32, -1, 0 } };
	gs_client *c = trainer(NULL, d.socket, 0, big, 1);
	memset(gs_tensor_data(c, 0), 0, (64u << 20) * sizeof(float));
	gs_client *ctl;
	assert_int_equal(gs_control_connect(d.socket, 5000, &ctl), GS_OK);

	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	const uint32_t idx = 0;
	assert_int_equal(gs_step_begin(c, &o), GS_OK);
	assert_int_equal(gs_mark_ready(c, &idx, 1), GS_OK);
	/* The control connection may be served before the trainer's
	 * GradientsReady (two sockets, no order between them): ask until the
	 * bucket shows in flight or the step is over. */
	struct gs_status *st;
	bool seen_in_flight = false;
	for (int i = 0; i < 10000 && !seen_in_flight; i++) {
		assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
		if (st->buckets_in_flight == 1) {
			print_message("during the step: state '%s', %u bucket(s) in flight\n",
				      st->job_state, st->buckets_in_flight);
			assert_string_equal(st->job_state, "in step");
			assert_int_equal(st->steps_completed, 0);
			seen_in_flight = true;
		}
		bool over = st->steps_completed > 0;
		gs_status_free(st);
		if (over)
			break;
	}
	assert_true(seen_in_flight);

	struct gs_step_result res;
	assert_int_equal(gs_step_wait(c, 30000, &res), GS_OK);
	assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
	assert_int_equal(st->steps_completed, 1);
	assert_int_equal(st->buckets_in_flight, 0);
	gs_status_free(st);
	gs_close(ctl);
	gs_close(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A trainer of job `id` whose first trainer defines it: local_size
 * trainers, this threshold. */
static gs_client *job_trainer(const char *socket, const char *id, uint32_t rank,
			      uint32_t local_size, uint64_t threshold)
{
	static const struct gs_tensor_spec small[] = {
		{ "w", 3000, GS_FLOAT32, -1, 0 },
		{ "b", 100, GS_FLOAT32, -1, 0 },
	};
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.job_id = id;
	o.local_rank = rank;
	o.local_size = local_size;
	o.threshold = threshold;
	gs_client *c;
	if (gs_connect(&o, &c) != GS_OK)
		fail_msg("connect to job %s: %s", id, gs_last_error(NULL));
	if (gs_register(c, small, 2) != GS_OK)
		fail_msg("register in job %s: %s", id, gs_last_error(c));
	return c;
}

static void steps(gs_client **c, size_t n, int count)
{
	struct gs_step_options o = GS_STEP_OPTIONS_INIT;
	const uint32_t order[2] = { 0, 1 };
	for (int s = 0; s < count; s++) {
		for (size_t r = 0; r < n; r++) {
			assert_int_equal(gs_step_begin(c[r], &o), GS_OK);
			assert_int_equal(gs_mark_ready(c[r], order, 2), GS_OK);
		}
		for (size_t r = 0; r < n; r++) {
			struct gs_step_result res;
			assert_int_equal(gs_step_wait(c[r], 30000, &res), GS_OK);
		}
	}
}

static const struct gs_job_status *find_job(const struct gs_status *st, const char *id)
{
	for (size_t i = 0; i < st->job_count; i++)
		if (strcmp(st->jobs[i].job_id, id) == 0)
			return &st->jobs[i];
	fail_msg("no job '%s' in the status", id);
	return NULL;
}

/* Two jobs on one daemon, each with its own shape, settings and steps:
 * gs_status lists both, each with its own figures, and totals the node. */
static void two_jobs(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_daemon_start(&d, NULL);
	gs_client *a[2] = { job_trainer(d.socket, "a", 0, 2, 1000),
			    job_trainer(d.socket, "a", 1, 2, 1000) };
	gs_client *b[1] = { job_trainer(d.socket, "b", 0, 1, GS_FROM_ENV_U64) };
	steps(a, 2, 1);
	steps(b, 1, 2);

	gs_client *ctl;
	assert_int_equal(gs_control_connect(d.socket, 5000, &ctl), GS_OK);
	struct gs_status *st;
	assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
	assert_int_equal(st->job_count, 2);
	assert_int_equal(st->max_jobs, 16);
	assert_int_equal(st->steps_completed, 3);
	const struct gs_job_status *ja = find_job(st, "a"), *jb = find_job(st, "b");
	assert_false(ja->hidden);
	assert_int_equal(ja->owner_uid, getuid());
	assert_int_equal(ja->local_size, 2);
	assert_int_equal(ja->world_size, 2);
	assert_int_equal(ja->nodes, 1);
	assert_int_equal(ja->node_rank, 0);
	assert_string_equal(ja->coordinator, "");
	assert_string_equal(ja->backend, "host");
	assert_int_equal(ja->threshold, 1000);
	assert_int_equal(ja->wire_dtype, GS_WIRE_DTYPE_FP16);
	assert_int_equal(ja->trainers_connected, 2);
	assert_int_equal(ja->trainer_count, 2);
	assert_int_equal(ja->trainers[0].tensors + ja->trainers[1].tensors, 4);
	assert_int_equal(ja->trainers[0].local_rank + ja->trainers[1].local_rank, 1);
	assert_int_equal(ja->steps_completed, 1);
	assert_int_equal(ja->current_step, 1);
	/* The plan: 3000 > 1000 goes alone, then 100. */
	assert_int_equal(ja->buckets, 2);
	assert_true(ja->last_step_ns > 0 && ja->age_ns > 0);
	assert_int_equal(jb->local_size, 1);
	assert_int_equal(jb->threshold, 2097152);
	assert_int_equal(jb->trainer_count, 1);
	assert_int_equal(jb->steps_completed, 2);
	assert_int_equal(jb->buckets, 1);
	gs_status_free(st);
	gs_close(ctl);

	gs_close(a[0]);
	gs_close(a[1]);
	gs_close(b[0]);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

static void ctl_without_daemon(void **state)
{
	(void)state;
	char out[] = "/tmp/gradsync-ctl-XXXXXX";
	int fd = mkstemp(out);
	assert_true(fd >= 0);
	int status = run_ctl("/tmp/gradsync-no-such-dir/gradsyncd.sock", out, "status", NULL);
	const char *text = read_file(out);
	print_message("%s", text);
	assert_int_equal(status, 3);
	assert_non_null(strstr(text, "/tmp/gradsync-no-such-dir/gradsyncd.sock"));
	assert_non_null(strstr(text, "is gradsyncd running?"));
	remove(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(figures_after_known_steps),
		cmocka_unit_test(status_while_reducing),
		cmocka_unit_test(ctl_without_daemon),
		cmocka_unit_test(two_jobs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
