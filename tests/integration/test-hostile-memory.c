/*
 * Shared memory a trainer can make vanish under gradsyncd: a memfd made
 * with MFD_HUGETLB, sealed against shrinking, in which the trainer punches
 * a hole and then uses up the free huge pages, so that the daemon's next
 * read of it faults (SIGBUS). Real daemons, real trainer processes, real
 * memfds and huge pages:
 *
 *   refusal (no huge pages needed): by default such a memfd is refused at
 *     registration, naming hugetlbfs;
 *   hugetlb (root, huge pages this test reserves and gives back): with
 *     --allow-hugetlb=yes the attack itself, on one node and on the second
 *     of two; the daemon lives, drops the attacker naming its buffer, and
 *     the other trainers' step ends aborted naming the attacker, with
 *     their own gradients.
 *
 * Each case checks its time bound, that the daemon answers status queries
 * throughout, and that a following step (with a new trainer in the
 * attacker's rank) is right against a reference computed here. Good
 * trainers run libgradsync in this process; the attacker is a child
 * process that reports over a pipe.
 *
 * Usage: test-hostile-memory refusal | hugetlb (meson runs both; hugetlb
 * exits 77, skipped, where it cannot reserve huge pages).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

#define HUGE_PAGE (2u << 20)
#define BOUND_S 10.0 /* an attack must be over within this */

/* ---- Huge pages of this test's own ------------------------------------- */

static long saved_pages = -1, saved_overcommit = -1;

static long read_long(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;
	if (f && fscanf(f, "%ld", &v) != 1)
		v = -1;
	if (f)
		fclose(f);
	return v;
}

static bool write_long(const char *path, long v)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return false;
	bool ok = fprintf(f, "%ld\n", v) > 0;
	return fclose(f) == 0 && ok;
}

static long meminfo(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(key);
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, key, n) == 0)
			v = strtol(line + n, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

#define NR_PAGES "/proc/sys/vm/nr_hugepages"
#define OVERCOMMIT "/proc/sys/vm/nr_overcommit_hugepages"

/* Gives back what reserve_huge_pages took; at exit too, whatever failed. */
static void restore_huge_pages(void)
{
	if (saved_overcommit >= 0)
		write_long(OVERCOMMIT, saved_overcommit);
	if (saved_pages >= 0)
		write_long(NR_PAGES, saved_pages);
	saved_pages = saved_overcommit = -1;
}

/* Adds `n` 2 MiB pages to the pool, with no surplus pages (they would let
 * the attacker's hole fill again). False, with why, when it cannot. */
static bool reserve_huge_pages(long n, char *why, size_t len)
{
	if (meminfo("Hugepagesize:") != 2048) {
		snprintf(why, len, "the default huge page is not 2 MiB");
		return false;
	}
	long pages = read_long(NR_PAGES), over = read_long(OVERCOMMIT);
	if (pages < 0 || over < 0 || geteuid() != 0) {
		snprintf(why, len, "it takes root and %s to reserve huge pages", NR_PAGES);
		return false;
	}
	atexit(restore_huge_pages);
	saved_pages = pages;
	saved_overcommit = over;
	if (!write_long(OVERCOMMIT, 0) || !write_long(NR_PAGES, pages + n) ||
	    meminfo("HugePages_Free:") < 2) {
		restore_huge_pages();
		snprintf(why, len, "the kernel would not add %ld free huge pages to the pool", n);
		return false;
	}
	return true;
}

/* ---- Gradients and their reference ----------------------------------------- */

static const struct gs_tensor_spec layout[] = {
	{ "fc.bias", 1000, GS_FLOAT32, -1, 0 },
	{ "fc.weight", 5000, GS_FLOAT32, -1, 0 },
	{ "conv.weight", 300, GS_FLOAT32, -1, 0 },
};
#define NTENSORS 3

/* Where the attacker's tensors lie in its hugetlb memfd, and where it
 * punches its hole. */
struct attack_plan {
	unsigned pages;
	uint64_t offsets[NTENSORS];
	unsigned hole; /* the page it punches */
};
/* One page, all of it punched. */
static const struct attack_plan whole_buffer = { 1, { 0, 4096, 4096 + 20480 }, 0 };
/* conv.weight alone on the second page, which is punched: a bucket whose
 * first chunks read good pages and a later one the hole. */
static const struct attack_plan second_page = { 2, { 0, 4096, HUGE_PAGE }, 1 };

/* Integers in [-20, 20]: their halves and the sums of those are exact in
 * fp16, so the average of two ranks is known exactly. */
static float grad(unsigned rank, unsigned round, unsigned tensor, size_t i)
{
	return (float)((int)((i * 7 + tensor * 13 + round * 5 + rank * 3) % 41) - 20);
}

static void fill(float *const *data, unsigned rank, unsigned round)
{
	for (unsigned t = 0; t < NTENSORS; t++)
		for (size_t i = 0; i < layout[t].count; i++)
			data[t][i] = grad(rank, round, t, i);
}

/* Whether every tensor holds the average of ranks 0 and 1 of the round
 * (computed here in double), or, own_rank >= 0, that rank's own gradient. */
static bool holds(float *const *data, unsigned round, int own_rank)
{
	for (unsigned t = 0; t < NTENSORS; t++)
		for (size_t i = 0; i < layout[t].count; i++) {
			double want = own_rank >= 0 ? grad((unsigned)own_rank, round, t, i)
						    : ((double)grad(0, round, t, i) +
						       grad(1, round, t, i)) / 2;
			if (data[t][i] != (float)want) {
				print_message("tensor %u element %zu: %g, expected %g\n", t, i,
					      (double)data[t][i], want);
				return false;
			}
		}
	return true;
}

/* ---- Good trainers, in this process ---------------------------------------- */

struct good {
	gs_client *c;
	float *data[NTENSORS];
};

/* A good trainer of node `node` of job j, given the job in its
 * environment while it connects. */
static void good_connect(struct good *g, const struct harness_job *j, unsigned node,
			 const char *socket, uint32_t rank)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.local_rank = rank;
	harness_job_setenv(j, node);
	int r = gs_connect(&o, &g->c);
	harness_clear_launch_env();
	if (r != GS_OK)
		fail_msg("connect as local rank %u: %s", rank, gs_last_error(NULL));
	if (gs_register(g->c, layout, NTENSORS) != GS_OK)
		fail_msg("register as local rank %u: %s", rank, gs_last_error(g->c));
	for (unsigned t = 0; t < NTENSORS; t++)
		g->data[t] = gs_tensor_data(g->c, t);
}

static void good_begin(struct good *g, unsigned rank, unsigned round)
{
	static const uint32_t all[NTENSORS] = { 0, 1, 2 };
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	fill(g->data, rank, round);
	assert_int_equal(gs_step_begin(g->c, &so), GS_OK);
	assert_int_equal(gs_mark_ready(g->c, all, NTENSORS), GS_OK);
}

static void good_expect_ok(struct good *g, unsigned round)
{
	struct gs_step_result res;
	int r = gs_step_wait(g->c, 30000, &res);
	if (r != GS_OK)
		fail_msg("step of round %u: %s: %s", round, gs_strerror(r), gs_last_error(g->c));
	assert_true(holds(g->data, round, -1));
}

/* A status query answered within 2 s, as every case asks throughout. */
static void status_answers(const char *socket)
{
	assert_true(harness_status_seconds(socket) < 2.0);
}

/* Both good trainers step `round` right, then leave. */
static void good_pair_last_step(struct good *g0, struct good *g1, unsigned round)
{
	good_begin(g0, 0, round);
	good_begin(g1, 1, round);
	good_expect_ok(g0, round);
	good_expect_ok(g1, round);
	gs_close(g0->c);
	gs_close(g1->c);
}

/* Waits for the step to end aborted within BOUND_S, asking the daemon's
 * status all the while; returns the seconds it took. */
static double good_expect_aborted(struct good *g, const char *socket, const char *reason)
{
	double t0 = harness_now_s();
	struct gs_step_result res;
	int r;
	while ((r = gs_step_poll(g->c, &res)) == GS_EAGAIN) {
		if (harness_now_s() - t0 > BOUND_S)
			fail_msg("the step did not end within %.0f s", BOUND_S);
		status_answers(socket);
		usleep(20000);
	}
	double took = harness_now_s() - t0;
	print_message("  good trainer was told after %.3f s: %s\n", took, gs_last_error(g->c));
	assert_int_equal(r, GS_EABORTED);
	if (!strstr(gs_last_error(g->c), reason))
		fail_msg("the abort '%s' does not name '%s'", gs_last_error(g->c), reason);
	for (unsigned t = 0; t < NTENSORS; t++)
		assert_false(gs_tensor_reduced(g->c, t));
	return took;
}

/* ---- The attacker, a child process ------------------------------------------- */

struct attacker {
	pid_t pid;
	int to, from; /* pipe ends: orders to it, lines from it */
	char log[200];
};

static void say(int fd, const char *fmt, ...)
{
	char line[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (write(fd, line, strlen(line)) < 0)
		_exit(90);
}

/* Takes every free huge page (it keeps them until it exits). */
static long exhaust_huge_pages(void)
{
	int hog = memfd_create("hog", MFD_HUGETLB | MFD_CLOEXEC);
	long n = 0;
	while (hog >= 0 && ftruncate(hog, (off_t)(n + 1) * HUGE_PAGE) == 0) {
		char *p = mmap(NULL, HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
			       hog, (off_t)n * HUGE_PAGE);
		if (p == MAP_FAILED)
			break;
		p[0] = 1;
		n++;
	}
	return n;
}

static void wait_order(int fd)
{
	char c;
	if (read(fd, &c, 1) != 1)
		_exit(91);
}

/* The attacker's life: register a sealed hugetlb memfd, do step 1 right,
 * then (when told) punch a hole, use up the pool and begin step 2. */
static void attack(const char *socket, uint32_t rank, const struct attack_plan *plan,
		   int to_parent, int from_parent)
{
	int fd = memfd_create("attacker", MFD_HUGETLB | MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)plan->pages * HUGE_PAGE) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		_exit(80);
	struct gs_tensor_spec specs[NTENSORS];
	for (unsigned t = 0; t < NTENSORS; t++) {
		specs[t] = layout[t];
		specs[t].memfd = fd;
		specs[t].offset = plan->offsets[t];
	}
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = socket;
	o.local_rank = rank;
	gs_client *c;
	if (gs_connect(&o, &c) != GS_OK || gs_register(c, specs, NTENSORS) != GS_OK)
		_exit(81);
	struct good g = { c, { 0 } };
	for (unsigned t = 0; t < NTENSORS; t++)
		g.data[t] = gs_tensor_data(c, t);
	/* Step 1 as a good trainer of rank 1 (the reference's rank). */
	static const uint32_t all[NTENSORS] = { 0, 1, 2 };
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	struct gs_step_result res;
	fill(g.data, 1, 1);
	if (gs_step_begin(c, &so) || gs_mark_ready(c, all, NTENSORS) ||
	    gs_step_wait(c, 30000, &res) || !holds(g.data, 1, -1))
		_exit(82);
	say(to_parent, "STEP1 OK\n");
	wait_order(from_parent);
	fill(g.data, 1, 2);
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)plan->hole * HUGE_PAGE, HUGE_PAGE) < 0)
		_exit(83);
	long hogged = exhaust_huge_pages();
	say(to_parent, "PUNCHED %ld %ld\n", hogged, meminfo("HugePages_Free:"));
	/* From here on its own buffer is not to be touched: it would fault. */
	int r = gs_step_begin(c, &so);
	if (r == GS_OK)
		r = gs_mark_ready(c, all, NTENSORS);
	if (r == GS_OK)
		r = gs_step_wait(c, 30000, &res);
	say(to_parent, "RESULT %d %s\n", r, gs_last_error(c));
	wait_order(from_parent); /* holds the pages until the parent is done */
	_exit(0);
}

/* The attacker of the case running, killed by teardown if the case
 * fails, so that its huge pages go back for the next case. */
static pid_t attacker_pid;

static int kill_attacker(void **state)
{
	(void)state;
	if (attacker_pid > 0 && waitpid(attacker_pid, NULL, WNOHANG) == 0) {
		kill(attacker_pid, SIGKILL);
		waitpid(attacker_pid, NULL, 0);
	}
	attacker_pid = 0;
	return 0;
}

/* The attacker, a trainer of node `node` of job j (given the job in its
 * environment), of local rank `rank`. */
static struct attacker attacker_start(const struct harness_job *j, unsigned node,
				      const char *socket, const char *dir, uint32_t rank,
				      const struct attack_plan *plan)
{
	struct attacker a;
	int up[2], down[2];
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	snprintf(a.log, sizeof(a.log), "%s/attacker.log", dir);
	fflush(NULL);
	a.pid = fork();
	assert_true(a.pid >= 0);
	if (a.pid == 0) {
		/* Not cmocka's crash handlers: a fault here is the attacker's. */
		signal(SIGBUS, SIG_DFL);
		signal(SIGSEGV, SIG_DFL);
		int log = open(a.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (log >= 0) {
			dup2(log, 1);
			dup2(log, 2);
		}
		close(up[0]);
		close(down[1]);
		harness_job_setenv(j, node);
		attack(socket, rank, plan, up[1], down[0]);
	}
	attacker_pid = a.pid;
	close(up[1]);
	close(down[0]);
	a.to = down[1];
	a.from = up[0];
	return a;
}

/* The attacker's next line, within limit_s. */
static void attacker_line(struct attacker *a, char *line, size_t n, double limit_s)
{
	size_t k = 0;
	double t0 = harness_now_s();
	while (k + 1 < n) {
		struct pollfd p = { a->from, POLLIN, 0 };
		int left = (int)((limit_s - (harness_now_s() - t0)) * 1000);
		if (left <= 0 || poll(&p, 1, left) <= 0 || read(a->from, line + k, 1) != 1) {
			harness_dump(a->log);
			fail_msg("the attacker (pid %d) said nothing more within %.0f s (exit status %d)",
				 (int)a->pid, limit_s, harness_wait(a->pid, 1000));
		}
		if (line[k++] == '\n')
			break;
	}
	line[k] = '\0';
}

static void attacker_order(struct attacker *a)
{
	assert_int_equal(write(a->to, "g", 1), 1);
}

static void attacker_finish(struct attacker *a)
{
	attacker_order(a);
	assert_int_equal(harness_wait(a->pid, 10000), 0);
	attacker_pid = 0;
	close(a->to);
	close(a->from);
}

/* Lets the attacker punch its hole and use up the pool; checks it did. */
static void attacker_strike(struct attacker *a)
{
	char line[600];
	attacker_order(a);
	attacker_line(a, line, sizeof(line), 30);
	long hogged, free_pages;
	assert_int_equal(sscanf(line, "PUNCHED %ld %ld", &hogged, &free_pages), 2);
	print_message("  the attacker punched its hole and took %ld huge pages; %ld left free\n",
		      hogged, free_pages);
	assert_true(hogged >= 1);
	assert_int_equal(free_pages, 0);
}

/* The attacker's own end: dropped with an Error naming its buffer. */
static void attacker_expect_dropped(struct attacker *a, const struct attack_plan *plan)
{
	char line[600];
	attacker_line(a, line, sizeof(line), BOUND_S);
	print_message("  attacker was told: %s", line);
	char want[200];
	snprintf(want, sizeof(want), "RESULT %d ", GS_EBUFFER);
	assert_true(strncmp(line, want, strlen(want)) == 0);
	snprintf(want, sizeof(want), "buffer 0 (%u bytes) lost its pages while gradsyncd was reading it (SIGBUS)",
		 plan->pages * HUGE_PAGE);
	assert_non_null(strstr(line, want));
}

/* ---- By default: refused at registration ----------------------------------- */

static void hugetlb_memfd_refused(void **state)
{
	(void)state;
	int fd = memfd_create("hugetlb", MFD_HUGETLB | MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (fd < 0)
		fail_msg("memfd_create(MFD_HUGETLB): %s (a kernel without hugetlbfs?)", strerror(errno));
	assert_int_equal(ftruncate(fd, HUGE_PAGE), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);

	struct gs_test_daemon d;
	static struct harness_job job = { .local_size = { 2 } };
	harness_job_daemon_start(&d, &job, 0, NULL);
	struct good g0;
	good_connect(&g0, &job, 0, d.socket, 0);

	/* Raw protocol: libgradsync would map the memfd itself first. */
	int sock = raw_connect(d.socket);
	raw_hello_job(sock, 1, &job);
	Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT, *bufp = &buf;
	Gradsync__TensorSpec t = GRADSYNC__TENSOR_SPEC__INIT, *tp = &t;
	Gradsync__RegisterTensors r = GRADSYNC__REGISTER_TENSORS__INIT;
	buf.size = HUGE_PAGE;
	t.name = "fc.bias";
	t.count = 1000;
	t.dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
	r.n_buffers = 1;
	r.buffers = &bufp;
	r.n_tensors = 1;
	r.tensors = &tp;
	r.last = true;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &r;
	double t0 = harness_now_s();
	raw_send(sock, &m, &fd, 1);
	raw_expect_error(sock, GS_EBUFFER,
			 "buffer 0: memfd is on hugetlbfs (MFD_HUGETLB), whose pages can vanish under gradsyncd; use memfd_create without MFD_HUGETLB, or start gradsyncd with --allow-hugetlb=yes");
	double took = harness_now_s() - t0;
	print_message("  refused after %.3f s\n", took);
	assert_true(took < 2.0);
	close(sock);
	close(fd);
	status_answers(d.socket);

	/* A good trainer takes the rank, and a step is right. */
	struct good g1;
	good_connect(&g1, &job, 0, d.socket, 1);
	good_pair_last_step(&g0, &g1, 1);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- --allow-hugetlb=yes: the attack on one node --------------------------- */

static void attack_one_node(struct harness_job *job, const struct attack_plan *plan)
{
	struct gs_test_daemon d;
	static const char *const args[] = { "--allow-hugetlb=yes", NULL };
	harness_job_daemon_start(&d, job, 0, args);
	/* Forked before this process holds connections it would inherit. */
	struct attacker a = attacker_start(job, 0, d.socket, d.dir, 1, plan);
	struct good g0;
	good_connect(&g0, job, 0, d.socket, 0);
	char line[600];
	good_begin(&g0, 0, 1);
	good_expect_ok(&g0, 1);
	attacker_line(&a, line, sizeof(line), 30);
	assert_string_equal(line, "STEP1 OK\n");

	attacker_strike(&a);
	good_begin(&g0, 0, 2);
	char reason[200];
	snprintf(reason, sizeof(reason), "trainer local rank 1 (pid %d) of node 0 lost the pages of its buffer 0 while gradsyncd read it (SIGBUS) during step 2",
		 (int)a.pid);
	good_expect_aborted(&g0, d.socket, reason);
	assert_true(holds(g0.data, 2, 0)); /* its own gradients, untouched */
	attacker_expect_dropped(&a, plan);
	assert_true(harness_daemon_alive(&d));
	assert_true(harness_log_contains(&d, "lost its pages while gradsyncd was reading it (SIGBUS)"));
	attacker_finish(&a);

	/* A new trainer in rank 1: the next step is right. */
	struct good g1;
	good_connect(&g1, job, 0, d.socket, 1);
	good_pair_last_step(&g0, &g1, 3);
	status_answers(d.socket);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

static void hole_punched_on_one_node(void **state)
{
	(void)state;
	static struct harness_job job = { .local_size = { 2 } };
	attack_one_node(&job, &whole_buffer);
}

/* The bucket (6300 elements) goes through a fusion buffer of 1024 in 7
 * chunks; the fault comes at the 6th. Nothing of it may be unpacked: the
 * good trainer's fc.bias, reduced in the first chunk, stays its own. */
static void hole_punched_mid_bucket(void **state)
{
	(void)state;
	static struct harness_job job = { .local_size = { 2 }, .fusion_buffer = "1024" };
	attack_one_node(&job, &second_page);
}

/* ---- The attack on node 1 of two --------------------------------------------- */

/* The daemons of the job, on two nodes; node 1 allows huge pages. */
static void start_two_nodes(struct gs_test_daemon *n, struct harness_job *job)
{
	static const char *const args[2][3] = {
		{ "--join-timeout=30", "--allow-hugetlb=no", NULL },
		{ "--join-timeout=30", "--allow-hugetlb=yes", NULL },
	};
	for (unsigned r = 0; r < 2; r++)
		harness_job_daemon_spawn(&n[r], job, r, args[r]);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r], 30000);
}

/* Node 0's trainer ends the step aborted with its own gradients: no node
 * unpacked the bucket, and both nodes go on in step with each other. */
static void attack_node_1(const char *fusion, const struct attack_plan *plan)
{
	struct gs_test_daemon n[2];
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 }, .fusion_buffer = fusion };
	start_two_nodes(n, &job);
	struct attacker a = attacker_start(&job, 1, n[1].socket, n[1].dir, 0, plan);
	struct good g0;
	good_connect(&g0, &job, 0, n[0].socket, 0);
	char line[600];
	good_begin(&g0, 0, 1);
	good_expect_ok(&g0, 1);
	attacker_line(&a, line, sizeof(line), 30);
	assert_string_equal(line, "STEP1 OK\n");

	attacker_strike(&a);
	good_begin(&g0, 0, 2);
	good_expect_aborted(&g0, n[0].socket,
			   "trainer local rank 0 of node 1 lost the pages of its shared memory while gradsyncd read it (SIGBUS); no node unpacked bucket 0");
	assert_true(holds(g0.data, 2, 0));
	attacker_expect_dropped(&a, plan);
	status_answers(n[1].socket);
	for (unsigned r = 0; r < 2; r++)
		assert_true(harness_daemon_alive(&n[r]));
	attacker_finish(&a);

	struct good g1;
	good_connect(&g1, &job, 1, n[1].socket, 0);
	good_pair_last_step(&g0, &g1, 3);
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r]), 0);
}

static void hole_punched_on_node_1(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	attack_node_1("4194304", &whole_buffer);
}

/* Staged: chunks all-reduced before the faulted one are not unpacked. */
static void hole_punched_mid_bucket_on_node_1(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	attack_node_1("1024", &second_page);
}

int main(int argc, char **argv)
{
	const char *group = argc > 1 ? argv[1] : "";
	if (strcmp(group, "refusal") == 0) {
		const struct CMUnitTest tests[] = {
			cmocka_unit_test(hugetlb_memfd_refused),
		};
		return cmocka_run_group_tests(tests, NULL, NULL);
	}
	if (strcmp(group, "hugetlb") == 0) {
		char why[200];
		if (!reserve_huge_pages(8, why, sizeof(why))) {
			printf("skipping the attack with huge pages: %s\n", why);
			return HARNESS_EXIT_SKIP;
		}
		const struct CMUnitTest tests[] = {
			cmocka_unit_test_teardown(hole_punched_on_one_node, kill_attacker),
			cmocka_unit_test_teardown(hole_punched_mid_bucket, kill_attacker),
			cmocka_unit_test_teardown(hole_punched_on_node_1, kill_attacker),
			cmocka_unit_test_teardown(hole_punched_mid_bucket_on_node_1, kill_attacker),
		};
		int failed = cmocka_run_group_tests(tests, NULL, NULL);
		restore_huge_pages();
		return failed;
	}
	fprintf(stderr, "usage: %s refusal|hugetlb\n", argv[0]);
	return 2;
}
