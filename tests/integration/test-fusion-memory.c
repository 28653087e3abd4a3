/*
 * The daemon's memory for fusion buffers (issue 23): a job's buffers are
 * sized by its layout when it registers, made off the event loop, counted
 * against the node's budget (--max-fusion-memory), and given back to the
 * system when the job goes. Real daemons, real trainers (in this process
 * through libgradsync, or gradsync-verifying-trainer processes), and the
 * daemon's own resident size from /proc/PID/status:
 *
 *   hellos: jobs that register nothing but ask for the largest fusion
 *     buffer add little resident memory;
 *   budget: a job whose buffers would pass the budget is refused at
 *     registration with GS_ELIMIT, naming the setting and the bytes, while
 *     another job's step in flight and its next steps complete, right; once
 *     that job has gone the refused one fits;
 *   churn: after jobs of a real layout come and go, the resident size
 *     returns near where it started;
 *   stall: a job's step waits are not held up while other jobs open.
 */
#include <errno.h>
#include <signal.h>
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

#define MIB (1024 * 1024)
#define LARGEST_FUSION "67108864" /* gradsyncd's default --max-fusion-buffer */
#define HELLOS 15

/* ---- The daemon, seen from outside ------------------------------------------ */

static size_t jobs_of(const char *socket)
{
	gs_client *c;
	struct gs_status *st = NULL;
	if (gs_control_connect(socket, 5000, &c) != GS_OK)
		fail_msg("status: cannot connect: %s", gs_last_error(NULL));
	if (gs_status_get(c, 5000, &st) != GS_OK)
		fail_msg("status: %s", gs_last_error(c));
	gs_close(c);
	size_t n = st->job_count;
	gs_status_free(st);
	return n;
}

/* The value of a series (`name` or `name{labels}`) in the daemon's
 * metrics; -1: absent. */
static long long metric(const char *socket, const char *series)
{
	char cmd[512], want[160], line[512];
	snprintf(cmd, sizeof(cmd), "%s --socket %s metrics", getenv("GS_CTL"), socket);
	snprintf(want, sizeof(want), "%s ", series);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	long long v = -1;
	while (fgets(line, sizeof(line), p))
		if (strncmp(line, want, strlen(want)) == 0)
			v = atoll(line + strlen(want));
	pclose(p);
	return v;
}

/* Waits (up to 30 s) until the daemon serves `n` jobs at most. */
static void wait_jobs_at_most(const char *socket, size_t n)
{
	double t0 = harness_now_s();
	while (jobs_of(socket) > n) {
		if (harness_now_s() - t0 > 30)
			fail_msg("the daemon still serves more than %zu jobs 30 s after their trainers left", n);
		usleep(20000);
	}
}

/* `n` trainers of jobs named prefix0, prefix1, ... that say Hello asking
 * for the largest fusion buffer, all at once (the daemon may read them in
 * one turn of its loop), and are welcomed; nothing more. Their sockets
 * in fds. */
static void hello_jobs(const char *socket, const char *prefix, int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		char id[32];
		snprintf(id, sizeof(id), "%s%u", prefix, i);
		struct harness_job j = { .id = id, .fusion_buffer = LARGEST_FUSION };
		fds[i] = raw_connect(socket);
		raw_send_hello_job(fds[i], 0, GS_PROTOCOL_VERSION, &j, 0);
	}
	for (unsigned i = 0; i < n; i++) {
		Gradsync__Message *m = raw_recv(fds[i]);
		if (!m || m->body_case != GRADSYNC__MESSAGE__BODY_WELCOME)
			fail_msg("Hello %u of %u: no Welcome (%s)", i, n,
				 m && m->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? m->error->message
									  : "the end of the stream");
		gradsync__message__free_unpacked(m, NULL);
	}
}

static void close_all(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* ---- Trainers in this process ------------------------------------------------ */

/* Integers in [-20, 20]: their halves and the sums of those are exact in
 * fp16, so the average of two ranks is known exactly. */
static float grad(unsigned rank, unsigned step, unsigned tensor, size_t i)
{
	return (float)((int)((i * 7 + tensor * 13 + step * 5 + rank * 3) % 41) - 20);
}

struct trainer {
	gs_client *c;
	const struct gs_tensor_spec *layout;
	unsigned n;
	float *data[4];
};

/* Connects as local rank `rank` of job j and registers the layout:
 * GS_OK, or the library's error (the message in gs_last_error). */
static int trainer_open(struct trainer *t, const char *socket, const struct harness_job *j,
			uint32_t rank, const struct gs_tensor_spec *layout, unsigned n)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.local_rank = rank;
	*t = (struct trainer){ .layout = layout, .n = n };
	harness_job_setenv(j, 0);
	int r = gs_connect(&o, &t->c);
	harness_clear_launch_env();
	if (r != GS_OK)
		fail_msg("connect as local rank %u of job '%s': %s", rank, j->id, gs_last_error(NULL));
	r = gs_register(t->c, layout, n);
	if (r != GS_OK)
		return r;
	for (unsigned k = 0; k < n; k++)
		t->data[k] = gs_tensor_data(t->c, k);
	return GS_OK;
}

static void trainer_begin(struct trainer *t, unsigned rank, unsigned step)
{
	static const uint32_t all[4] = { 0, 1, 2, 3 };
	for (unsigned k = 0; k < t->n; k++)
		for (size_t i = 0; i < t->layout[k].count; i++)
			t->data[k][i] = grad(rank, step, k, i);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	assert_int_equal(gs_step_begin(t->c, &so), GS_OK);
	assert_int_equal(gs_mark_ready(t->c, all, t->n), GS_OK);
}

/* The step ends right: every element is the average of ranks 0 to
 * nranks - 1, computed here in double. */
static void trainer_expect(struct trainer *t, unsigned step, unsigned nranks)
{
	struct gs_step_result res;
	int r = gs_step_wait(t->c, 60000, &res);
	if (r != GS_OK)
		fail_msg("step %u: %s: %s", step, gs_strerror(r), gs_last_error(t->c));
	for (unsigned k = 0; k < t->n; k++)
		for (size_t i = 0; i < t->layout[k].count; i++) {
			double want = 0;
			for (unsigned q = 0; q < nranks; q++)
				want += grad(q, step, k, i);
			want /= nranks;
			if (t->data[k][i] != (float)want)
				fail_msg("step %u, tensor %u element %zu: %g, expected %g", step, k, i,
					 (double)t->data[k][i], want);
		}
}

/* One step of both trainers of a pair, right. */
static void pair_step(struct trainer p[2], unsigned step)
{
	trainer_begin(&p[0], 0, step);
	trainer_begin(&p[1], 1, step);
	trainer_expect(&p[0], step, 2);
	trainer_expect(&p[1], step, 2);
}

/* ---- Cases --------------------------------------------------------------------- */

/* Fifteen Hellos that ask for the largest fusion buffer (256 MiB each)
 * and register nothing. Before the buffers were sized by the layout, each
 * allocated and zeroed its buffer at once, on the event loop: 3.8 GiB. */
static void hellos_asking_for_the_largest_buffer_add_little(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	/* The Hellos are all root's: one user's jobs, more than the
	 * per-user default. */
	static const char *const args[] = { "--max-jobs-per-user=0", NULL };
	harness_daemon_start(&d, args);
	long before = harness_rss_kib(d.pid);
	int fds[HELLOS];
	double t0 = harness_now_s();
	hello_jobs(d.socket, "h", fds, HELLOS);
	double took = harness_now_s() - t0;
	long after = harness_rss_kib(d.pid);
	print_message("%d Hellos asking for %s elements: VmRSS %ld -> %ld KiB (+%ld KiB) in %.2f s\n",
		      HELLOS, LARGEST_FUSION, before, after, after - before, took);
	/* A thread or two per job, a few pages each; one buffer alone would
	 * be 256 MiB. */
	assert_true(after - before < 48 * 1024);
	close_all(fds, HELLOS);
	wait_jobs_at_most(d.socket, 0);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Both jobs' largest bucket: 3,000,000 elements, 12 MB of fp32 (the
 * fusion buffer holds the widest wire dtype). Either fits in 20 MiB;
 * both together do not. */
#define BIG 3000000u
#define BUDGET "20971520"
static const struct gs_tensor_spec layout_a[] = {
	{ "a.weight", BIG, GS_FLOAT32, -1, 0 },
	{ "a.bias", 1000, GS_FLOAT32, -1, 0 },
};
static const struct gs_tensor_spec layout_b[] = {
	{ "b.weight", BIG, GS_FLOAT32, -1, 0 },
};

/* The number a refusal gives right after `key`. */
static unsigned long long bytes_after(const char *text, const char *key)
{
	const char *p = strstr(text, key);
	if (!p)
		fail_msg("'%s' does not say '%s'", text, key);
	return strtoull(p + strlen(key), NULL, 10);
}

/* Job B registers while job A's step is in flight: refused with
 * GS_ELIMIT, naming --max-fusion-memory, its bytes and A's; A's step and
 * its next ones complete right. Once A has gone, B fits. */
static void over_the_budget_refused_while_another_job_runs(void **state)
{
	(void)state;
	static const char *const args[] = { "--max-fusion-memory=" BUDGET, "--job-linger=0", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	struct harness_job a = { .id = "A", .local_size = { 2 } };
	struct harness_job b = { .id = "B" };
	struct trainer pa[2], tb;
	for (uint32_t r = 0; r < 2; r++)
		assert_int_equal(trainer_open(&pa[r], d.socket, &a, r, layout_a, 2), GS_OK);
	pair_step(pa, 1);

	trainer_begin(&pa[0], 0, 2);
	trainer_begin(&pa[1], 1, 2);
	double t0 = harness_now_s();
	int r = trainer_open(&tb, d.socket, &b, 0, layout_b, 1);
	double took = harness_now_s() - t0;
	const char *why = gs_last_error(tb.c);
	print_message("B refused after %.3f s: %s\n", took, why);
	assert_int_equal(r, GS_ELIMIT);
	assert_true(took < 5.0);
	assert_non_null(strstr(why, "job 'B': its fusion buffers need "));
	assert_non_null(strstr(why, "(--max-fusion-memory=" BUDGET " bytes, "));
	/* A fusion buffer holds the largest bucket in fp32, and a few
	 * elements of status after each slice of it. */
	unsigned long long need = bytes_after(why, "need ");
	unsigned long long used = bytes_after(why, "=" BUDGET " bytes, ");
	assert_true(need >= BIG * 4ull && need < BIG * 4ull + MIB);
	assert_true(used >= BIG * 4ull && used < BIG * 4ull + MIB);
	assert_true(need + used > strtoull(BUDGET, NULL, 10));
	gs_close(tb.c);
	/* What is in use is A's, as the metrics say too. */
	assert_int_equal(metric(d.socket, "gradsync_job_fusion_memory_bytes{job=\"A\"}"), used);
	assert_int_equal(metric(d.socket, "gradsync_fusion_memory_bytes"), used);
	assert_int_equal(metric(d.socket, "gradsync_fusion_memory_limit_bytes"), strtoull(BUDGET, NULL, 10));

	trainer_expect(&pa[0], 2, 2);
	trainer_expect(&pa[1], 2, 2);
	for (unsigned step = 3; step <= 5; step++)
		pair_step(pa, step);
	assert_true(harness_daemon_alive(&d));
	gs_close(pa[0].c);
	gs_close(pa[1].c);

	/* A's bytes come back when it goes (at once: --job-linger=0, but
	 * freed from the loop a turn or two later). */
	t0 = harness_now_s();
	while ((r = trainer_open(&tb, d.socket, &b, 0, layout_b, 1)) == GS_ELIMIT) {
		if (harness_now_s() - t0 > 30)
			fail_msg("B is still refused 30 s after A left: %s", gs_last_error(tb.c));
		gs_close(tb.c);
		usleep(50000);
	}
	assert_int_equal(r, GS_OK);
	trainer_begin(&tb, 0, 1);
	trainer_expect(&tb, 1, 1);
	gs_close(tb.c);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Starts a verifying trainer of job `id` on the daemon: local rank
 * `rank` of `size`, `steps` steps of layout `layout` (a file of layouts/,
 * or an absolute path). */
static pid_t start_trainer(const struct gs_test_daemon *d, const char *id, unsigned rank,
			   unsigned size, const char *layout, const char *steps, const char *fusion,
			   char *log)
{
	struct harness_job j = { .id = id, .local_size = { size }, .fusion_buffer = fusion };
	char rank_text[16];
	snprintf(rank_text, sizeof(rank_text), "%u", rank);
	snprintf(log, 200, "%s/%s-%u.log", d->dir, id, rank);
	const char *path = layout[0] == '/' ? layout : harness_layout(layout);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d->socket, "--layout", path,
			       "--rank", rank_text, "--steps", steps, NULL };
	return harness_job_spawn(&j, 0, argv, log);
}

static void expect_exit_ok(pid_t pid, const char *log)
{
	if (harness_wait(pid, 300000) != 0) {
		harness_dump(log);
		fail_msg("trainer %s failed", log);
	}
}

/* Rounds of jobs of ResNet-50's layout at once, two steps each, their
 * fusion buffer settings (elements) in turn: a larger one first, then
 * several smaller ones together. A buffer from malloc of 28 MiB raises
 * glibc's threshold for mmap to that, and the smaller ones of the rounds
 * after it then come from its heap, which does not shrink while anything
 * small lies above them. Sized by the layout (3,151,872 elements at most)
 * and mapped on their own, none stays. */
#define CHURN_ROUNDS 4
#define CHURN_JOBS 3
static const char *const churn_fusion[CHURN_ROUNDS][CHURN_JOBS] = {
	{ "7340032", NULL, NULL },
	{ "6291456", "5242880", "4194304" },
	{ "6291456", "5242880", "4194304" },
	{ "6291456", "5242880", "4194304" },
};
#define CHURN_SLACK_KIB (16 * 1024)

/* The rounds of jobs, then the Hellos of the first case: once every job
 * has gone, the resident size returns within CHURN_SLACK_KIB of the
 * daemon's at start. */
static void memory_goes_back_when_jobs_go(void **state)
{
	(void)state;
	static const char *const args[] = { "--job-linger=0", "--max-jobs-per-user=0", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	long start = harness_rss_kib(d.pid), peak = start;
	unsigned jobs = 0;
	for (unsigned round = 0; round < CHURN_ROUNDS; round++) {
		char logs[CHURN_JOBS][200];
		pid_t pids[CHURN_JOBS];
		unsigned n = 0;
		for (; n < CHURN_JOBS && churn_fusion[round][n]; n++) {
			char id[16];
			snprintf(id, sizeof(id), "c%u", jobs++);
			pids[n] = start_trainer(&d, id, 0, 1, "resnet50.txt", "2", churn_fusion[round][n],
						logs[n]);
		}
		for (unsigned i = 0; i < n; i++) {
			expect_exit_ok(pids[i], logs[i]);
			long now = harness_rss_kib(d.pid);
			peak = now > peak ? now : peak;
		}
		wait_jobs_at_most(d.socket, 0);
	}
	int fds[HELLOS];
	hello_jobs(d.socket, "h", fds, HELLOS);
	close_all(fds, HELLOS);
	wait_jobs_at_most(d.socket, 0);
	/* The jobs' memory goes from the loop a turn or two after they do,
	 * and its bytes with it. */
	double t0 = harness_now_s();
	while (metric(d.socket, "gradsync_fusion_memory_bytes") != 0) {
		if (harness_now_s() - t0 > 30)
			fail_msg("the jobs' fusion memory is still counted 30 s after they went");
		usleep(50000);
	}
	long now;
	while ((now = harness_rss_kib(d.pid)) > start + CHURN_SLACK_KIB && harness_now_s() - t0 < 30)
		usleep(50000);
	print_message("VmRSS at start %ld KiB, at its highest %ld KiB, after %u jobs and %d Hellos %ld KiB (+%ld KiB)\n",
		      start, peak, jobs, HELLOS, now, now - start);
	assert_true(now <= start + CHURN_SLACK_KIB);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* The longest "wait N ms" of a verifying trainer's step lines, in ms, and
 * how many there were. */
static double longest_step(const char *log, unsigned *steps)
{
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	char line[512];
	double longest = 0;
	*steps = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s;
		double ms;
		if (sscanf(line, "step %llu: wait %lf ms", &s, &ms) == 2) {
			(*steps)++;
			longest = ms > longest ? ms : longest;
		}
	}
	fclose(f);
	return longest;
}

#define STALL_ROUNDS 3
#define STALL_BOUND_MS 2000.0

/* A job of two trainers steps on while rounds of Hellos open fifteen
 * jobs each that ask for the largest fusion buffer: its longest step
 * wait stays under STALL_BOUND_MS. When each Hello zeroed 256 MiB on the
 * event loop, a round held every other job's step for seconds. */
static void other_jobs_opening_do_not_stall_a_step(void **state)
{
	(void)state;
	static const char *const args[] = { "--job-linger=0", "--max-jobs-per-user=0", NULL };
	struct gs_test_daemon d;
	harness_daemon_start(&d, args);
	/* A small layout: its steps are short, and its trainers spend them
	 * waiting on the daemon. */
	char layout[200], logs[2][200];
	snprintf(layout, sizeof(layout), "%s/small.txt", d.dir);
	FILE *f = fopen(layout, "w");
	assert_non_null(f);
	fprintf(f, "a 40000\nb 3000\nc 50000\n");
	fclose(f);
	pid_t pids[2];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = start_trainer(&d, "S", r, 2, layout, "1000000", NULL, logs[r]);
	harness_wait_for_text(logs[0], "step 3:", 120);
	unsigned before;
	longest_step(logs[0], &before);
	for (unsigned round = 0; round < STALL_ROUNDS; round++) {
		int fds[HELLOS];
		char prefix[8];
		snprintf(prefix, sizeof(prefix), "r%u-", round);
		hello_jobs(d.socket, prefix, fds, HELLOS);
		close_all(fds, HELLOS);
		wait_jobs_at_most(d.socket, 1);
	}
	/* Steps that began after the last round: they saw every round. */
	unsigned during;
	longest_step(logs[0], &during);
	char next[32];
	snprintf(next, sizeof(next), "step %u:", during + 2);
	harness_wait_for_text(logs[0], next, 120);
	for (unsigned r = 0; r < 2; r++) {
		kill(pids[r], SIGKILL);
		harness_wait(pids[r], 10000);
	}
	unsigned steps;
	double longest = longest_step(logs[0], &steps);
	print_message("job S: %u steps, %u while %d rounds of %d Hellos opened jobs; longest step wait %.1f ms\n",
		      steps, during + 2 - before, STALL_ROUNDS, HELLOS, longest);
	assert_true(longest < STALL_BOUND_MS);
	assert_true(harness_daemon_alive(&d));
	harness_daemon_stop(&d);
}

/* Usage: test-fusion-memory [PATTERN]: the cases whose names match (a
 * cmocka filter, "*" as a wildcard), to measure them against another
 * build's gradsyncd (GS_DAEMON). */
int main(int argc, char **argv)
{
	const struct CMUnitTest all[] = {
		cmocka_unit_test(hellos_asking_for_the_largest_buffer_add_little),
		cmocka_unit_test(over_the_budget_refused_while_another_job_runs),
		cmocka_unit_test(memory_goes_back_when_jobs_go),
		cmocka_unit_test(other_jobs_opening_do_not_stall_a_step),
	};
	if (argc > 1)
		cmocka_set_test_filter(argv[1]);
	return cmocka_run_group_tests(all, NULL, NULL);
}
