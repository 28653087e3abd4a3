/*
 * A trainer's state and its broadcast within a node, against the real
 * gradsyncd and real trainer processes: every trainer registers a state
 * of several dtypes (one tensor larger than the fusion buffer) filled
 * with bytes of its own, and after gs_state_broadcast every trainer holds
 * the source's bytes, which each computes itself, bit for bit. A broadcast
 * of some tensors leaves the others alone. Trainers that name different
 * sources, register another state layout, never ask, or leave while the
 * others wait get an error naming what failed, well within the bounds,
 * and keep their own state.
 */
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

/* Bigger than the default fusion buffer (4194304 float32, 16 MiB). */
#define BIG_ELEMENTS 5000000u

static struct gs_state_spec layout[] = { /* a case may grow tensor 0 */
	{ "big.weight", BIG_ELEMENTS * 4ull, GS_FLOAT32, -1, 0 },
	{ "half.weight", 1001 * 2, GS_FLOAT16, -1, 0 },
	{ "bn.num_batches_tracked", 8, GS_INT64, -1, 0 },
	{ "mask", 7, GS_UINT8, -1, 0 },
	{ "double.bias", 4097 * 8, GS_FLOAT64, -1, 0 },
	{ "bf.weight", 17 * 2, GS_BFLOAT16, -1, 0 },
	{ "ids", 33 * 4, GS_INT32, -1, 0 },
};
#define NSTATE (sizeof(layout) / sizeof(layout[0]))

/* Byte i of tensor k of the trainer of global rank `rank`, generation
 * `gen`: a hash, computed by each trainer itself and not by the code
 * under test. */
static uint8_t pattern(unsigned rank, unsigned gen, unsigned k, uint64_t i)
{
	uint64_t x = (uint64_t)rank << 56 ^ (uint64_t)gen << 48 ^ (uint64_t)k << 40 ^ i;
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ull;
	x ^= x >> 27;
	x *= 0x81dadef4bc2dd44dull;
	return (uint8_t)(x >> 33);
}

static void fill(gs_client *c, unsigned rank, unsigned gen)
{
	for (unsigned k = 0; k < NSTATE; k++) {
		uint8_t *p = gs_state_data(c, k);
		for (uint64_t i = 0; i < layout[k].bytes; i++)
			p[i] = pattern(rank, gen, k, i);
	}
}

/* The first byte of tensor k that is not the pattern of (rank, gen), or
 * -1. */
static long long first_wrong(gs_client *c, unsigned k, unsigned rank, unsigned gen)
{
	const uint8_t *p = gs_state_data(c, k);
	for (uint64_t i = 0; i < layout[k].bytes; i++)
		if (p[i] != pattern(rank, gen, k, i))
			return (long long)i;
	return -1;
}

/* ---- Trainer processes ------------------------------------------------------- */

/* What a trainer process does after registering. */
enum act { BROADCAST, BROADCAST_SOME, PAUSE, EXIT,
	   BROADCAST_CUT /* a watcher kills `victim` once bytes of the source arrive */ };

struct plan {
	const struct gs_test_daemon *d;
	const struct harness_job *job;
	unsigned local_size;
	const struct gs_state_spec *specs; /* NULL: layout */
	enum act act;
	uint32_t source;
	unsigned expect_source; /* whose bytes the state holds after */
	unsigned node;          /* of the job's nodes */
	unsigned rank_base;     /* global rank of the node's local rank 0 */
	unsigned world;         /* trainers of every node; 0: local_size */
	pid_t victim;           /* BROADCAST_CUT: the daemon killed mid-broadcast */
};

static int fail_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail_out(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* Checks every tensor holds the bytes of `rank`; the indices in `some`
 * (n of them) those of `some_rank` instead. */
static int check_all(gs_client *c, unsigned rank, unsigned gen, const uint32_t *some, size_t n,
		     unsigned some_rank, unsigned some_gen)
{
	for (unsigned k = 0; k < NSTATE; k++) {
		bool in_some = false;
		for (size_t s = 0; s < n; s++)
			in_some |= some[s] == k;
		unsigned r = in_some ? some_rank : rank, g = in_some ? some_gen : gen;
		long long at = first_wrong(c, k, r, g);
		if (at >= 0)
			return fail_out("FAIL: state tensor %u (%s) byte %lld is not rank %u's", k,
					layout[k].name, at, r);
	}
	return 0;
}

/* A process that shares the trainer's state memory: once the first 64
 * bytes of tensor 0 are the source's, some of the state has arrived and
 * most has not (tensor 0 is large): it kills the victim. */
static pid_t watch_and_kill(gs_client *c, const struct plan *p)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	const volatile uint8_t *d = gs_state_data(c, 0);
	double t0 = harness_now_s();
	for (;;) {
		bool arrived = true;
		for (unsigned i = 0; i < 64; i++)
			arrived &= d[i] == pattern(p->source, 1, 0, i);
		if (arrived)
			_exit(kill(p->victim, SIGKILL) == 0 ? 0 : 3);
		if (harness_now_s() - t0 > 120)
			_exit(4);
	}
}

/* After a broadcast cut in the middle: tensor 0 begins with the source's
 * bytes if `partly` and ends with this trainer's own; the rest are its own. */
static int check_cut(gs_client *c, unsigned rank, unsigned source, bool partly)
{
	const uint8_t *d = gs_state_data(c, 0);
	uint64_t n = layout[0].bytes;
	bool head = true, tail = true;
	for (uint64_t i = 0; i < 64; i++) {
		head &= d[i] == pattern(partly ? source : rank, 1, 0, i);
		tail &= d[n - 1 - i] == pattern(rank, 1, 0, n - 1 - i);
	}
	if (!head || !tail)
		return fail_out("FAIL: tensor 0's head (%s) or tail (own) is not as a cut leaves it",
				partly ? "the source's" : "own");
	for (unsigned k = 1; k < NSTATE; k++)
		if (first_wrong(c, k, rank, 1) >= 0)
			return fail_out("FAIL: state tensor %u is not this trainer's own", k);
	return 0;
}

static int trainer_body(const struct plan *p, unsigned local)
{
	unsigned rank = p->rank_base + local; /* global: whose bytes these are */
	unsigned world = p->world ? p->world : p->local_size;
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = p->d->socket;
	o.local_rank = local;
	o.timeout_ms = 60000;
	harness_job_setenv(p->job, p->node);
	gs_client *c;
	if (gs_connect(&o, &c) != GS_OK)
		return fail_out("FAIL: connect: %s", gs_last_error(NULL));
	int r = gs_register_state(c, p->specs ? p->specs : layout, NSTATE);
	fprintf(stderr, "REGISTER %d %s\n", r, r == GS_OK ? "" : gs_last_error(c));
	if (r != GS_OK)
		return 0;
	if (gs_state_count(c) != NSTATE)
		return fail_out("FAIL: gs_state_count says %zu", gs_state_count(c));
	fill(c, rank, 1);
	if (p->act == PAUSE)
		pause();
	if (p->act == EXIT)
		return 0;
	struct gs_state_result res = GS_STATE_RESULT_INIT;
	pid_t watcher = p->act == BROADCAST_CUT && local == 0 ? watch_and_kill(c, p) : 0;
	r = gs_state_broadcast_tensors(c, p->source, NULL, 0, 120000, &res);
	fprintf(stderr, "BROADCAST %d %s\n", r, r == GS_OK ? "" : gs_last_error(c));
	if (p->act == BROADCAST_CUT) {
		int st = -1;
		if (watcher > 0)
			waitpid(watcher, &st, 0);
		if (watcher > 0 && st != 0)
			return fail_out("FAIL: the watcher ended with %d", st);
		if (r == GS_OK)
			return fail_out("FAIL: the broadcast was not cut");
		fprintf(stderr, "TENSORS DONE %u\n", res.tensors_done);
		if (res.tensors_done != 0 || check_cut(c, rank, p->source, local == 0))
			return 1;
		return fprintf(stderr, "CUT OK\n"), 0;
	}
	if (r != GS_OK)
		return check_all(c, rank, 1, NULL, 0, 0, 0);
	if (check_all(c, p->expect_source, 1, NULL, 0, 0, 0))
		return 1;
	uint64_t total = 0;
	for (unsigned k = 0; k < NSTATE; k++)
		total += layout[k].bytes;
	if (res.bytes != total || res.tensors_done != NSTATE)
		return fail_out("FAIL: result says %llu bytes, %u tensors; expected %llu, %zu",
				(unsigned long long)res.bytes, res.tensors_done,
				(unsigned long long)total, NSTATE);
	if (p->act != BROADCAST_SOME)
		return fprintf(stderr, "OK\n"), 0;
	/* A second generation, and some tensors only from another source. */
	static const uint32_t some[] = { 1, 3, 6 };
	fill(c, rank, 2);
	unsigned other = (p->source + 1) % world;
	r = gs_state_broadcast_tensors(c, other, some, 3, 120000, &res);
	if (r != GS_OK)
		return fail_out("FAIL: broadcast of some tensors: %s", gs_last_error(c));
	if (check_all(c, rank, 2, some, 3, other, 2))
		return 1;
	fprintf(stderr, "OK\n");
	return 0;
}

/* Trainers started by the case, killed by its teardown if a failed
 * check left them (a paused one would hold the test's output open). */
static pid_t started[8];
static size_t nstarted;

static int kill_leftovers(void **state)
{
	(void)state;
	for (size_t i = 0; i < nstarted; i++)
		if (kill(started[i], SIGKILL) == 0)
			waitpid(started[i], NULL, 0);
	nstarted = 0;
	return 0;
}

static pid_t trainer_start(const struct plan *p, unsigned rank, char *log, size_t n)
{
	snprintf(log, n, "%s/trainer%u.log", p->d->dir, rank);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (!freopen(log, "w", stderr))
			_exit(2);
		setvbuf(stderr, NULL, _IONBF, 0);
		_exit(trainer_body(p, rank));
	}
	if (nstarted < sizeof(started) / sizeof(started[0]))
		started[nstarted++] = pid;
	return pid;
}

static void expect_exit_ok(pid_t pid, const char *log, const char *text)
{
	int rc = harness_wait(pid, 180000);
	if (rc != 0 || !harness_file_contains(log, text)) {
		harness_dump(log);
		fail_msg("trainer %s: exit %d, expected '%s'", log, rc, text);
	}
}

/* The trainer's log says what the call returned: code. */
static void expect_code(const char *log, const char *call, int code)
{
	char text[64];
	snprintf(text, sizeof(text), "%s %d ", call, code);
	if (!harness_file_contains(log, text)) {
		harness_dump(log);
		fail_msg("trainer %s: expected '%s' (%s)", log, text, gs_strerror(code));
	}
}

/* Prints the first line of the log that holds text (what a call said). */
static void show_line(const char *log, const char *text)
{
	char line[1024];
	FILE *f = fopen(log, "r");
	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, text)) {
			print_message("  %s", line);
			break;
		}
	if (f)
		fclose(f);
}

/* Waits until the daemon's status shows trainer pid in `state`. */
static void wait_trainer_state(const struct gs_test_daemon *d, pid_t pid, const char *state)
{
	double t0 = harness_now_s();
	for (;;) {
		bool there = false;
		gs_client *ctl;
		struct gs_status *st;
		if (gs_control_connect(d->socket, 5000, &ctl) == GS_OK) {
			if (gs_status_get(ctl, 5000, &st) == GS_OK) {
				for (size_t i = 0; i < st->trainer_count; i++)
					there |= st->trainers[i].pid == (uint32_t)pid &&
						 strcmp(st->trainers[i].state, state) == 0;
				gs_status_free(st);
			}
			gs_close(ctl);
		}
		if (there)
			return;
		if (harness_now_s() - t0 > 120) {
			harness_dump(d->log);
			fail_msg("trainer pid %d never showed '%s'", (int)pid, state);
		}
		usleep(20000);
	}
}

/* ---- Cases ---------------------------------------------------------------------- */

/* Four trainers; the source is local rank 2, then 3 for some tensors. */
static void broadcast_from_any_rank(void **state)
{
	(void)state;
	struct harness_job job = { .id = "state-bcast", .local_size = { 4 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	struct plan p = { &d, &job, 4, NULL, BROADCAST_SOME, 2, 2, 0, 0, 0, 0 };
	char logs[4][200];
	pid_t pids[4];
	for (unsigned r = 0; r < 4; r++)
		pids[r] = trainer_start(&p, r, logs[r], sizeof(logs[r]));
	for (unsigned r = 0; r < 4; r++)
		expect_exit_ok(pids[r], logs[r], "OK");
	assert_true(harness_log_contains(&d, "state broadcast from global rank 2"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Trainers that name different sources: GS_EINVAL, named, state kept. */
static void different_sources_refused(void **state)
{
	(void)state;
	struct harness_job job = { .id = "state-sources", .local_size = { 2 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	struct plan p0 = { &d, &job, 2, NULL, BROADCAST, 0, 0, 0, 0, 0, 0 };
	struct plan p1 = { &d, &job, 2, NULL, BROADCAST, 1, 1, 0, 0, 0, 0 };
	char logs[2][200];
	pid_t a = trainer_start(&p0, 0, logs[0], sizeof(logs[0]));
	pid_t b = trainer_start(&p1, 1, logs[1], sizeof(logs[1]));
	expect_exit_ok(a, logs[0], "asked for different state broadcasts (source 0 and 1");
	expect_exit_ok(b, logs[1], "asked for different state broadcasts (source 0 and 1");
	expect_code(logs[0], "BROADCAST", GS_EINVAL);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A second trainer whose state differs in a dtype: GS_ELAYOUT, naming
 * the tensor of each. */
static void other_layout_refused(void **state)
{
	(void)state;
	struct harness_job job = { .id = "state-layout", .local_size = { 2 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL);
	struct gs_state_spec other[NSTATE];
	memcpy(other, layout, sizeof(other));
	other[3].dtype = GS_INT32;
	other[3].bytes = 8;
	struct plan p0 = { &d, &job, 2, NULL, PAUSE, 0, 0, 0, 0, 0, 0 };
	struct plan p1 = { &d, &job, 2, other, EXIT, 0, 0, 0, 0, 0, 0 };
	char logs[2][200];
	pid_t a = trainer_start(&p0, 0, logs[0], sizeof(logs[0]));
	harness_wait_for_text(logs[0], "REGISTER 0", 60);
	pid_t b = trainer_start(&p1, 1, logs[1], sizeof(logs[1]));
	expect_exit_ok(b, logs[1], "state layout differs from the job's: tensor 3 is 'mask (int32)' (8 elements) in local rank 1's layout but 'mask (uint8)' (7 elements)");
	expect_code(logs[1], "REGISTER", GS_ELAYOUT);
	kill(a, SIGKILL);
	harness_wait(a, 30000);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A trainer that registers and never asks: the others' broadcast ends at
 * --step-timeout, naming it, and they keep their own state. */
static void silent_trainer_times_out(void **state)
{
	(void)state;
	struct harness_job job = { .id = "state-silent", .local_size = { 2 } };
	struct gs_test_daemon d;
	const char *const extra[] = { "--step-timeout=2", NULL };
	harness_job_daemon_start(&d, &job, 0, extra);
	struct plan p0 = { &d, &job, 2, NULL, BROADCAST, 1, 1, 0, 0, 0, 0 };
	struct plan p1 = { &d, &job, 2, NULL, PAUSE, 1, 1, 0, 0, 0, 0 };
	char logs[2][200];
	pid_t b = trainer_start(&p1, 1, logs[1], sizeof(logs[1]));
	/* Registered before the other asks: else the timeout could name it
	 * as one with no state registered. */
	harness_wait_for_text(logs[1], "REGISTER 0", 60);
	double t0 = harness_now_s();
	pid_t a = trainer_start(&p0, 0, logs[0], sizeof(logs[0]));
	expect_exit_ok(a, logs[0], "local rank 1 did not ask for it within 2 s (--step-timeout)");
	double took = harness_now_s() - t0;
	print_message("  the broadcast failed after %.1f s\n", took);
	assert_true(took < 60);
	expect_code(logs[0], "BROADCAST", GS_ETIMEDOUT);
	kill(b, SIGKILL);
	harness_wait(b, 30000);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* The source leaves while the others wait for it: they are answered at
 * once (not at --step-timeout), named, with their own state. */
static void leaving_source_aborts(void **state)
{
	(void)state;
	struct harness_job job = { .id = "state-leaves", .local_size = { 3 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, NULL); /* --step-timeout 180 s */
	struct plan src = { &d, &job, 3, NULL, PAUSE, 0, 0, 0, 0, 0, 0 };
	struct plan rcv = { &d, &job, 3, NULL, BROADCAST, 0, 0, 0, 0, 0, 0 };
	char logs[3][200];
	pid_t pids[3];
	pids[0] = trainer_start(&src, 0, logs[0], sizeof(logs[0]));
	harness_wait_for_text(logs[0], "REGISTER 0", 60); /* one that registered leaves */
	for (unsigned r = 1; r < 3; r++) {
		pids[r] = trainer_start(&rcv, r, logs[r], sizeof(logs[r]));
		wait_trainer_state(&d, pids[r], "broadcasting state");
	}
	double t0 = harness_now_s();
	kill(pids[0], SIGKILL);
	harness_wait(pids[0], 30000);
	char text[200];
	snprintf(text, sizeof(text), "trainer local rank 0 (pid %d) went away before the state broadcast began; no state was copied",
		 (int)pids[0]);
	for (unsigned r = 1; r < 3; r++) {
		expect_exit_ok(pids[r], logs[r], text);
		expect_code(logs[r], "BROADCAST", GS_EABORTED);
	}
	double took = harness_now_s() - t0;
	print_message("  the receivers were answered %.2f s after the source died\n", took);
	assert_true(took < 60);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Several nodes ---------------------------------------------------------- */

struct nodes {
	struct harness_job job;
	struct gs_test_daemon d[2];
	unsigned base[2];
};

static void nodes_start(struct nodes *n, const char *id, unsigned per_node,
			const char *const *extra)
{
	n->job = (struct harness_job){ .id = id, .nodes = 2, .local_size = { per_node, per_node } };
	for (unsigned k = 0; k < 2; k++)
		harness_job_daemon_spawn(&n->d[k], &n->job, k, extra);
	for (unsigned k = 0; k < 2; k++) {
		harness_daemon_wait_ready(&n->d[k], 30000);
		n->base[k] = k * per_node;
	}
}

/* Two nodes of two trainers: the source is global rank 3 (node 1's local
 * rank 1), then global rank 0 for some tensors; every trainer of both
 * nodes checks every byte, the big tensor going in several chunks. */
static void broadcast_between_nodes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct nodes n;
	nodes_start(&n, "state-nodes", 2, NULL);
	char logs[4][200];
	pid_t pids[4];
	for (unsigned k = 0; k < 2; k++)
		for (unsigned r = 0; r < 2; r++) {
			struct plan p = { &n.d[k], &n.job, 2, NULL, BROADCAST_SOME, 3, 3, k, n.base[k], 4, 0 };
			pids[2 * k + r] = trainer_start(&p, r, logs[2 * k + r], sizeof(logs[0]));
		}
	for (unsigned i = 0; i < 4; i++)
		expect_exit_ok(pids[i], logs[i], "OK");
	for (unsigned k = 0; k < 2; k++) {
		assert_true(harness_log_contains(&n.d[k], "state broadcast from global rank 3"));
		assert_true(harness_log_contains(&n.d[k], "state broadcast from global rank 0"));
		assert_int_equal(harness_daemon_stop(&n.d[k]), 0);
	}
}

/* Node 1's state differs in a dtype: the trainers of both nodes fail
 * alike, naming node 1 and the tensor, and keep their own state. */
static void other_layout_between_nodes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct nodes n;
	nodes_start(&n, "state-nodes-layout", 1, NULL);
	struct gs_state_spec other[NSTATE];
	memcpy(other, layout, sizeof(other));
	other[3].dtype = GS_INT32;
	other[3].bytes = 8;
	char logs[2][200];
	pid_t pids[2];
	for (unsigned k = 0; k < 2; k++) {
		struct plan p = { &n.d[k], &n.job, 1, k ? other : NULL, BROADCAST, 0, 0, k, n.base[k], 2, 0 };
		pids[k] = trainer_start(&p, 0, logs[k], sizeof(logs[k]));
	}
	for (unsigned k = 0; k < 2; k++) {
		expect_exit_ok(pids[k], logs[k], "state layout of node 1 differs from the source's: tensor 3 is 'mask (int32)' (8 elements) in node 1's layout but 'mask (uint8)' (7 elements) in the source's node 0's");
		expect_code(logs[k], "BROADCAST", GS_ELAYOUT);
	}
	for (unsigned k = 0; k < 2; k++)
		assert_int_equal(harness_daemon_stop(&n.d[k]), 0);
}

/* Node 1's daemon dies while node 0's trainer waits in the broadcast: it
 * is answered in bounded time, naming node 1, with its own state. */
static void node_lost_during_broadcast(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct nodes n;
	const char *const extra[] = { "--peer-timeout=5", NULL };
	nodes_start(&n, "state-nodes-lost", 1, extra);
	char logs[2][200];
	struct plan p1 = { &n.d[1], &n.job, 1, NULL, PAUSE, 1, 1, 1, n.base[1], 2, 0 };
	struct plan p0 = { &n.d[0], &n.job, 1, NULL, BROADCAST, 1, 1, 0, n.base[0], 2, 0 };
	pid_t b = trainer_start(&p1, 0, logs[1], sizeof(logs[1]));
	pid_t a = trainer_start(&p0, 0, logs[0], sizeof(logs[0]));
	harness_wait_for_text(logs[1], "REGISTER 0", 60);
	wait_trainer_state(&n.d[0], a, "broadcasting state");
	double t0 = harness_now_s();
	kill(n.d[1].pid, SIGKILL);
	expect_exit_ok(a, logs[0], "node 1");
	expect_code(logs[0], "BROADCAST", GS_EDISCONNECTED);
	double took = harness_now_s() - t0;
	print_message("  node 0's trainer was answered %.2f s after node 1's daemon died\n", took);
	show_line(logs[0], "BROADCAST");
	assert_true(took < 60);
	kill(b, SIGKILL);
	harness_wait(b, 30000);
	harness_wait(n.d[1].pid, 30000);
	assert_int_equal(harness_daemon_stop(&n.d[0]), 0);
}

/* The source (node 1's local rank 1) dies before it asks, while the
 * other three trainers wait: node 1 fails the broadcast at once and tells
 * node 0, whose trainers are answered with the same words, naming it. */
static void source_lost_between_nodes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct nodes n;
	nodes_start(&n, "state-nodes-source", 2, NULL); /* --step-timeout 180 s */
	char logs[4][200];
	pid_t pids[4];
	for (unsigned k = 0; k < 2; k++)
		for (unsigned r = 0; r < 2; r++) {
			enum act act = k == 1 && r == 1 ? PAUSE : BROADCAST;
			struct plan p = { &n.d[k], &n.job, 2, NULL, act, 3, 3, k, n.base[k], 4, 0 };
			pids[2 * k + r] = trainer_start(&p, r, logs[2 * k + r], sizeof(logs[0]));
		}
	for (unsigned i = 0; i < 3; i++)
		wait_trainer_state(&n.d[i / 2], pids[i], "broadcasting state");
	harness_wait_for_text(logs[3], "REGISTER 0", 60);
	double t0 = harness_now_s();
	kill(pids[3], SIGKILL);
	harness_wait(pids[3], 30000);
	char text[200];
	snprintf(text, sizeof(text), "trainer local rank 1 (pid %d) went away before the state broadcast began; no state was copied",
		 (int)pids[3]);
	for (unsigned i = 0; i < 3; i++) {
		expect_exit_ok(pids[i], logs[i], text);
		expect_code(logs[i], "BROADCAST", GS_EABORTED);
	}
	for (unsigned i = 0; i < 2; i++)
		if (!harness_file_contains(logs[i], "failed: node 1: job 'state-nodes-source'")) {
			harness_dump(logs[i]);
			fail_msg("node 0's trainer %u does not name node 1", i);
		}
	double took = harness_now_s() - t0;
	print_message("  the three others were answered %.2f s after the source died\n", took);
	show_line(logs[0], "BROADCAST");
	assert_true(took < 60);
	for (unsigned k = 0; k < 2; k++)
		assert_int_equal(harness_daemon_stop(&n.d[k]), 0);
}

/* The source's node (node 0, the coordinator) dies while its bytes travel:
 * node 1's two trainers are answered in bounded time, naming node 0, and
 * hold what the README says a cut leaves: local rank 0 (which receives)
 * tensor 0 partly the source's, local rank 1 (which gets a tensor only
 * once it is whole) its own, both every other tensor their own, and
 * tensors_done 0. Tensor 0 grows to 400 MB so that the cut falls inside. */
static void node_lost_mid_bytes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	uint64_t was = layout[0].bytes;
	layout[0].bytes = 400ull << 20;
	struct nodes n;
	const char *const extra[] = { "--peer-timeout=10", NULL };
	nodes_start(&n, "state-nodes-cut", 2, extra);
	char logs[4][200];
	pid_t pids[4];
	for (unsigned k = 0; k < 2; k++)
		for (unsigned r = 0; r < 2; r++) {
			struct plan p = { &n.d[k], &n.job, 2, NULL, k ? BROADCAST_CUT : BROADCAST, 0, 0, k,
					  n.base[k], 4, n.d[0].pid };
			pids[2 * k + r] = trainer_start(&p, r, logs[2 * k + r], sizeof(logs[0]));
		}
	double t0 = harness_now_s();
	for (unsigned i = 2; i < 4; i++) {
		expect_exit_ok(pids[i], logs[i], "CUT OK");
		/* Whichever notices first words it: the Gloo connection
		 * ("... (node 0 (the coordinator) went away: ...)") or the
		 * rendezvous ("interrupted: node 0 (the coordinator) went away"). */
		if (!harness_file_contains(logs[i], "node 0 (the coordinator) went away")) {
			harness_dump(logs[i]);
			fail_msg("trainer %u does not say that node 0 went away", i);
		}
	}
	double took = harness_now_s() - t0;
	print_message("  node 1's trainers were answered within %.2f s of the start\n", took);
	show_line(logs[2], "BROADCAST");
	for (unsigned i = 0; i < 2; i++)
		harness_wait(pids[i], 60000);
	harness_wait(n.d[0].pid, 30000);
	layout[0].bytes = was;
	assert_int_equal(harness_daemon_stop(&n.d[1]), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(broadcast_from_any_rank, kill_leftovers),
		cmocka_unit_test_teardown(different_sources_refused, kill_leftovers),
		cmocka_unit_test_teardown(other_layout_refused, kill_leftovers),
		cmocka_unit_test_teardown(silent_trainer_times_out, kill_leftovers),
		cmocka_unit_test_teardown(leaving_source_aborts, kill_leftovers),
		cmocka_unit_test_teardown(broadcast_between_nodes, kill_leftovers),
		cmocka_unit_test_teardown(other_layout_between_nodes, kill_leftovers),
		cmocka_unit_test_teardown(node_lost_during_broadcast, kill_leftovers),
		cmocka_unit_test_teardown(source_lost_between_nodes, kill_leftovers),
		cmocka_unit_test_teardown(node_lost_mid_bytes, kill_leftovers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
