/*
 * Liveness between daemons, with real daemons of two nodes on loopback:
 *
 *   - a crowd of strangers at node 0's rendezvous (connections that say
 *     nothing, or one byte of a frame) while node 1 joins, and re-joins;
 *   - a node that vanishes without closing: a proxy between node 1 and
 *     node 0's rendezvous stops forwarding (SIGSTOP: its sockets stay
 *     open) and node 1's daemon is killed behind it; then it comes back;
 *   - the same proxy frozen with node 1 alive (a partition), then thawed;
 *   - second claims to node rank 1, its holder frozen or alive;
 *   - node 1 frozen past --peer-timeout, then resumed.
 *
 * Each checks its time bound, that node 0 answers status throughout (every
 * status within STATUS_MS), and that a following step is right on both
 * nodes: the verifying trainers check every element against a reference of
 * their own.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

/* The longest a status query of node 0 may take while it is attacked or
 * a peer is lost: it is served on the loop, which nothing may hold up. */
#define STATUS_MS 2000

/* The job every case runs: two nodes of one trainer. */
static const struct harness_job pair_job = { .nodes = 2, .local_size = { 1, 1 } };

/* A node: its daemon, and the job as this node's daemon and trainers see
 * it (pair_job, but for the port node 0 is reached at: a proxy's). */
struct node {
	struct gs_test_daemon d;
	struct harness_job job;
	unsigned rank;
};

static char layout[200];

/* Every process a case starts, killed by its teardown if the case failed
 * before it could stop them (the harness's own net is the program's end). */
static pid_t mine[32];
static size_t nmine;

static pid_t track(pid_t pid)
{
	if (nmine < sizeof(mine) / sizeof(mine[0]))
		mine[nmine++] = pid;
	return pid;
}

static int kill_mine(void **state)
{
	(void)state;
	for (size_t i = 0; i < nmine; i++) {
		if (waitpid(mine[i], NULL, WNOHANG) == 0) {
			kill(mine[i], SIGKILL);
			waitpid(mine[i], NULL, 0);
		}
	}
	nmine = 0;
	return 0;
}

/* A small layout of our own, so that a step is quick. */
static const char *small_layout(void)
{
	if (layout[0])
		return layout;
	snprintf(layout, sizeof(layout), "/tmp/gradsync-liveness-XXXXXX");
	int fd = mkstemp(layout);
	assert_true(fd >= 0);
	static const char text[] = "first 1000\nmiddle 300000\nlast 5000\n";
	assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
	close(fd);
	return layout;
}

/* Starts the daemon of node `rank` of pair_job, reaching node 0's
 * rendezvous at `port`. */
static void spawn_node(struct node *n, unsigned rank, int port, const char *const *extra)
{
	n->job = pair_job;
	n->job.port = port;
	n->rank = rank;
	struct harness_strs args = { .n = 0 };
	harness_strs_printf(&args, "--join-timeout=30");
	harness_strs_append(&args, extra);
	harness_job_daemon_spawn(&n->d, &n->job, rank, args.v);
	track(n->d.pid);
}

/* One step's trainers, one on each node, started: a node's daemon joins
 * the job's group when its trainer comes (or finds the group kept, as a
 * job's group outlives its trainers for --job-linger). */
struct step {
	pid_t pids[2];
	char logs[2][200];
	const struct node *n[2];
};

static void start_step(struct step *st, const struct node *n0, const struct node *n1)
{
	st->n[0] = n0;
	st->n[1] = n1;
	for (int r = 0; r < 2; r++) {
		snprintf(st->logs[r], sizeof(st->logs[r]), "%s/trainer.log", st->n[r]->d.dir);
		const char *argv[] = { getenv("GS_TRAINER"), "--socket", st->n[r]->d.socket, "--layout",
				       small_layout(), "--rank", "0", "--steps", "1", NULL };
		st->pids[r] = track(harness_job_spawn(&st->n[r]->job, st->n[r]->rank, argv,
						      st->logs[r]));
	}
}

/* Both trainers must pass their checks. */
static void finish_step(struct step *st)
{
	int failed = 0;
	for (int r = 0; r < 2; r++) {
		if (harness_wait(st->pids[r], 60000) != 0) {
			harness_dump(st->logs[r]);
			harness_dump(st->n[r]->d.log);
			failed = 1;
		}
	}
	assert_int_equal(failed, 0);
}

/* One step with a trainer on each node; both must pass their checks. */
static void run_step(const struct node *n0, const struct node *n1)
{
	struct step st;
	start_step(&st, n0, n1);
	finish_step(&st);
}

/* Node 0 at `port`, node 1 reaching it at `port1` (a proxy's, or port
 * itself), both ready, and one step right on both (unless step is false:
 * a case that must act before any step). */
static void start_pair(struct node *n0, struct node *n1, int port, int port1,
		       const char *const *extra, bool step)
{
	spawn_node(n0, 0, port, extra);
	spawn_node(n1, 1, port1, extra);
	harness_daemon_wait_ready(&n0->d, 30000);
	harness_daemon_wait_ready(&n1->d, 30000);
	if (step)
		run_step(n0, n1);
}

/* Node `rank`'s state in d's status (of its first job), which must answer
 * within STATUS_MS. */
static void peer_state(const struct gs_test_daemon *d, unsigned rank, char *out, size_t n)
{
	double t0 = harness_now_s();
	gs_client *ctl;
	struct gs_status *st;
	assert_int_equal(gs_control_connect(d->socket, STATUS_MS, &ctl), GS_OK);
	assert_int_equal(gs_status_get(ctl, STATUS_MS, &st), GS_OK);
	/* A node whose job's trainers have not come yet has no peers. */
	snprintf(out, n, "%s", st->peer_count > rank ? st->peers[rank].state : "(no job yet)");
	gs_status_free(st);
	gs_close(ctl);
	double took = harness_now_s() - t0;
	if (took * 1000 > STATUS_MS)
		fail_msg("status took %.2f s", took);
}

/* Waits until d's status shows node `rank` in `want`, asking every 100
 * ms; returns the seconds it took. Fails past limit_s. */
static double wait_state(const struct gs_test_daemon *d, unsigned rank, const char *want,
			 double limit_s)
{
	double t0 = harness_now_s();
	char state[32] = "";
	for (;;) {
		peer_state(d, rank, state, sizeof(state));
		double took = harness_now_s() - t0;
		if (strcmp(state, want) == 0)
			return took;
		if (took > limit_s) {
			harness_dump(d->log);
			fail_msg("node %u is '%s' after %.1f s, not '%s'", rank, state, took, want);
		}
		usleep(100000);
	}
}

/* Waits until text shows in the log at path while d keeps answering
 * status; returns the seconds it took. Fails past limit_s. */
static double wait_text_serving(const char *path, const char *text, double limit_s,
				const struct gs_test_daemon *d)
{
	double t0 = harness_now_s();
	char state[32];
	while (!harness_file_contains(path, text)) {
		if (harness_now_s() - t0 > limit_s) {
			harness_dump(path);
			harness_dump(d->log);
			fail_msg("'%s' not in %s within %.1f s", text, path, limit_s);
		}
		if (harness_listening(d->socket))
			peer_state(d, 1, state, sizeof(state));
		usleep(100000);
	}
	return harness_now_s() - t0;
}

/* Lines of the log at path, but for those about this process's own
 * status queries (one each). */
static unsigned count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char line[4096], ours[64];
	snprintf(ours, sizeof(ours), "client pid %d ", (int)getpid());
	unsigned n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, ours) == NULL;
	fclose(f);
	return n;
}

static void expect_in_log(const char *path, const char *text)
{
	if (!harness_file_contains(path, text)) {
		harness_dump(path);
		fail_msg("'%s' not found in %s", text, path);
	}
}

static void reap(pid_t pid)
{
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

/* ---- A crowd of strangers --------------------------------------------------- */

enum { SILENT = 100, PARTIAL = 20, CROWD = SILENT + PARTIAL };

/* A connection from host `from` to 127.0.0.1:port, retried while node 0
 * starts; with one byte of a frame's header when partial. */
static int stranger(const char *from, int port, bool partial)
{
	for (int i = 0; i < 1000; i++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in me = { .sin_family = AF_INET };
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		inet_pton(AF_INET, from, &me.sin_addr);
		if (fd >= 0 && bind(fd, (struct sockaddr *)&me, sizeof(me)) == 0 &&
		    connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
			if (partial && write(fd, "\x10", 1) != 1)
				_exit(3);
			return fd;
		}
		if (fd >= 0)
			close(fd);
		usleep(10000);
	}
	_exit(2);
}

/* A process that opens CROWD connections to node 0's rendezvous (SILENT
 * that say nothing, PARTIAL that send one byte) and holds them; with
 * churn it opens a new one for each the coordinator closes, without end.
 * Returns once all are open. */
static pid_t start_crowd(int port, const char *from, bool churn)
{
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid > 0) {
		char c;
		close(ready[1]);
		assert_int_equal(read(ready[0], &c, 1), 1);
		close(ready[0]);
		return track(pid);
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	close(ready[0]);
	struct pollfd p[CROWD];
	for (int i = 0; i < CROWD; i++)
		p[i] = (struct pollfd){ stranger(from, port, i >= SILENT), POLLIN, 0 };
	if (write(ready[1], "!", 1) != 1)
		_exit(4);
	for (;;) {
		if (!churn) {
			pause();
			continue;
		}
		if (poll(p, CROWD, 1000) <= 0)
			continue;
		for (int i = 0; i < CROWD; i++) {
			if (!p[i].revents)
				continue;
			close(p[i].fd);
			p[i].fd = stranger(from, port, i >= SILENT);
		}
		usleep(50000); /* a steady stream, not a busy loop */
	}
}

enum { AUTH_TIMEOUT = 2 };

/* Node 1 joins while the crowd is there, within twice --auth-timeout and
 * a few seconds (it is evicted or refused at worst once or twice and
 * retries); with churn, the crowd keeps coming for as long as it runs, and
 * node 1 is killed and started again meanwhile, joining again within the
 * same bound. The crowd stays past --auth-timeout while node 0 answers
 * status, its log growing by no more than the limit's lines (10 every
 * 5 s, and a count), and a step is then right. */
static void crowd_while_node_joins(const char *from, bool churn, bool secret)
{
	char secret_arg[300], auth_arg[32], path[] = "/tmp/gradsync-secret-XXXXXX";
	snprintf(auth_arg, sizeof(auth_arg), "--auth-timeout=%d", AUTH_TIMEOUT);
	if (secret) {
		int fd = mkstemp(path);
		assert_true(fd >= 0);
		static const char text[] = "the secret of the liveness tests, 0123456789\n";
		assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
		close(fd);
		snprintf(secret_arg, sizeof(secret_arg), "--cluster-secret-file=%s", path);
	}
	/* At the default level: the debug level says a line per connection. */
	const char *extra[] = { auth_arg, "--log-level=info", secret ? secret_arg : NULL, NULL };
	const double bound = 2 * AUTH_TIMEOUT + 5;
	int port = harness_free_port();
	struct node n0, n1, back;
	spawn_node(&n0, 0, port, extra);
	double t0 = harness_now_s();
	pid_t crowd = start_crowd(port, from, churn);
	double opened = harness_now_s();
	print_message("the crowd of %d opened its connections in %.2f s\n", CROWD, opened - t0);
	spawn_node(&n1, 1, port, extra);
	harness_daemon_wait_ready(&n0.d, 10000);
	harness_daemon_wait_ready(&n1.d, 10000);
	/* The job's trainers come: node 1's daemon joins through the crowd. */
	struct step st;
	start_step(&st, &n0, &n1);
	double took = wait_text_serving(n1.d.log, "joined as node 1 of 2", bound, &n0.d);
	print_message("node 1 joined %.2f s after its trainer started (bound %.0f s)\n", took, bound);
	finish_step(&st);
	if (churn) {
		/* Node 0 serves status while the crowd goes on; node 1 comes
		 * back through it, with the job's trainers (node 0 kept the
		 * job's group). */
		kill(n1.d.pid, SIGKILL);
		harness_wait(n1.d.pid, 5000);
		wait_state(&n0.d, 1, "lost", 5);
		spawn_node(&back, 1, port, extra);
		harness_daemon_wait_ready(&back.d, 10000);
		start_step(&st, &n0, &back);
		took = wait_text_serving(back.d.log, "joined as node 1 of 2", bound, &n0.d);
		print_message("node 1 joined again %.2f s after its trainer started, through the crowd\n",
			      took);
		finish_step(&st);
		wait_state(&n0.d, 1, "joined", bound);
	}
	/* The crowd stays past --auth-timeout (its connections time out, and
	 * with churn come back), node 0 answering status all along. */
	for (double until = harness_now_s() + 2 * AUTH_TIMEOUT + 1; harness_now_s() < until;) {
		char state_now[32];
		peer_state(&n0.d, 1, state_now, sizeof(state_now));
		assert_string_equal(state_now, "joined");
		usleep(100000);
	}
	reap(crowd);
	double lasted = harness_now_s() - t0;
	unsigned lines = count_lines(n0.d.log);
	/* The limit's lines in each 5 s window and its count, and the few of
	 * a start, a join, a node lost and back. */
	unsigned allowed = 11 * (unsigned)(lasted / 5 + 2) + 30;
	print_message("node 0 logged %u lines in %.1f s of crowd (at most %u)\n", lines, lasted,
		      allowed);
	if (lines > allowed)
		harness_dump(n0.d.log);
	assert_true(lines <= allowed);
	run_step(&n0, churn ? &back : &n1);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(churn ? &back.d : &n1.d), 0);
	if (secret)
		remove(path);
}

/* A crowd from node 1's own host, there before it starts. */
static void crowd_of_silent_connections(void **state)
{
	(void)state;
	crowd_while_node_joins("127.0.0.1", false, false);
}

/* A crowd from another host that keeps coming, with a cluster secret. */
static void crowd_that_keeps_coming_with_a_secret(void **state)
{
	(void)state;
	crowd_while_node_joins("127.0.0.2", true, true);
}

/* ---- A node that vanishes without closing ------------------------------------ */

/* A TCP proxy from a port of its own to 127.0.0.1:target, one process
 * forwarding every connection both ways; *port says where it listens.
 * Node 1 binds that port too, as its node port, on 127.0.0.2: it is one
 * of harness_free_port()'s, below the ephemeral range, since a port the
 * kernel picked (bind to port 0) may be the own end of any connection
 * from 127.0.0.2 meanwhile, and node 1 would fail to start. */
static pid_t start_proxy(int target, int *port)
{
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	do /* target is not bound yet: the pick could be it */
		*port = harness_free_port();
	while (*port == target);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)*port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(lfd, 16), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid > 0) {
		close(lfd);
		return track(pid);
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	enum { PAIRS = 16 };
	struct pollfd p[1 + 2 * PAIRS];
	int n = 1;
	p[0] = (struct pollfd){ lfd, POLLIN, 0 };
	for (;;) {
		if (poll(p, (nfds_t)n, -1) < 0)
			continue;
		if (p[0].revents && n < 1 + 2 * PAIRS) {
			int in = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			int out = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			struct sockaddr_in t = { .sin_family = AF_INET, .sin_port = htons((uint16_t)target),
						 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			if (in >= 0 && connect(out, (struct sockaddr *)&t, sizeof(t)) == 0) {
				p[n++] = (struct pollfd){ in, POLLIN, 0 };
				p[n++] = (struct pollfd){ out, POLLIN, 0 };
			} else {
				close(in);
				close(out);
			}
		}
		for (int i = 1; i < n; i++) {
			if (!p[i].revents || p[i].fd < 0)
				continue;
			int other = i % 2 ? i + 1 : i - 1; /* pairs at (1,2), (3,4), ... */
			char buf[65536];
			ssize_t got = read(p[i].fd, buf, sizeof(buf));
			if (got <= 0 || write(p[other].fd, buf, (size_t)got) != got) {
				close(p[i].fd);
				close(p[other].fd);
				p[i].fd = p[other].fd = -1;
			}
		}
	}
}

enum { PEER_TIMEOUT = 2, SLACK = 3 };

/* Node 1 reaches node 0's rendezvous through the proxy. After a good
 * step the proxy freezes and node 1's daemon is killed: node 0 cannot see
 * it go, yet shows it lost within --peer-timeout and SLACK. A new node-1
 * daemon, straight to node 0, is accepted (not "two daemons claim it")
 * and the next step is right on both. */
static void node_vanishes_behind_a_frozen_proxy(void **state)
{
	(void)state;
	char pt[32];
	snprintf(pt, sizeof(pt), "--peer-timeout=%d", PEER_TIMEOUT);
	const char *extra[] = { pt, NULL };
	int port = harness_free_port(), proxy_port;
	pid_t proxy = start_proxy(port, &proxy_port);
	struct node n0, n1, back;
	start_pair(&n0, &n1, port, proxy_port, extra, true);

	kill(proxy, SIGSTOP);
	kill(n1.d.pid, SIGKILL);
	harness_wait(n1.d.pid, 5000);
	double took = wait_state(&n0.d, 1, "lost", PEER_TIMEOUT + SLACK);
	print_message("node 0 showed node 1 lost %.2f s after it vanished (--peer-timeout %d s)\n",
		      took, PEER_TIMEOUT);
	expect_in_log(n0.d.log, "rendezvous: node 1 (127.0.0.1:");
	expect_in_log(n0.d.log, "sent nothing for");

	spawn_node(&back, 1, port, extra);
	harness_daemon_wait_ready(&back.d, 10000);
	struct step st;
	start_step(&st, &n0, &back);
	took = wait_text_serving(back.d.log, "joined as node 1 of 2", 10, &n0.d);
	print_message("the new node 1 joined %.2f s after its trainer started\n", took);
	assert_false(harness_file_contains(back.d.log, "two daemons claim it"));
	finish_step(&st);
	wait_state(&n0.d, 1, "joined", 10);
	reap(proxy);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(&back.d), 0);
}

/* The proxy freezes with node 1 alive behind it, a partition: each side
 * takes the other as lost within --peer-timeout and SLACK (node 0 shows
 * node 1 lost; node 1 says node 0 sent nothing and tries to join again).
 * The partition heals (SIGCONT): node 1 joins again through the proxy
 * and the next step is right. */
static void partition_between_nodes_heals(void **state)
{
	(void)state;
	char pt[32];
	snprintf(pt, sizeof(pt), "--peer-timeout=%d", PEER_TIMEOUT);
	const char *extra[] = { pt, NULL };
	int port = harness_free_port(), proxy_port;
	pid_t proxy = start_proxy(port, &proxy_port);
	struct node n0, n1;
	start_pair(&n0, &n1, port, proxy_port, extra, true);

	kill(proxy, SIGSTOP);
	double took = wait_state(&n0.d, 1, "lost", PEER_TIMEOUT + SLACK);
	print_message("node 0 showed node 1 lost %.2f s into the partition\n", took);
	took = wait_text_serving(n1.d.log, "sent nothing for", PEER_TIMEOUT + SLACK, &n0.d);
	print_message("node 1 took node 0 as gone %.2f s later\n", took);
	/* Logged just after, from the same turn of node 1's loop: the file
	 * may be read between the two lines. */
	wait_text_serving(n1.d.log, "re-joining the rendezvous", 5, &n0.d);
	kill(proxy, SIGCONT);
	took = wait_text_serving(n1.d.log, "re-joined the coordinator", 15, &n0.d);
	print_message("node 1 re-joined %.2f s after the partition healed\n", took);
	wait_state(&n0.d, 1, "joined", 10);
	run_step(&n0, &n1);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(&n1.d), 0);
	reap(proxy);
}

/* ---- Second claims -------------------------------------------------------------- */

/* How long node 0 waits for a holder's answer to a second claim:
 * min(5 s, --peer-timeout), and --peer-timeout is longer here, so that
 * the claim, not the holder's silence, settles it. */
enum { PROBE = 5 };

/* Node 1's daemon is frozen (SIGSTOP) and a new one claims its rank: the
 * claim is granted within PROBE and SLACK, the frozen one dropped as lost;
 * then it is killed, and the next step is right with the new one. */
static void second_claim_to_a_frozen_holder(void **state)
{
	(void)state;
	const char *extra[] = { "--peer-timeout=20", NULL };
	int port = harness_free_port();
	struct node n0, n1, back;
	start_pair(&n0, &n1, port, port, extra, true);

	kill(n1.d.pid, SIGSTOP);
	/* The second daemon of node 1, at an address of its own. */
	const char *elsewhere[] = { "--peer-timeout=20", "--node-address=127.0.0.3", NULL };
	spawn_node(&back, 1, port, elsewhere);
	harness_daemon_wait_ready(&back.d, 10000);
	struct step st;
	start_step(&st, &n0, &back);
	double took = wait_text_serving(back.d.log, "joined as node 1 of 2", PROBE + SLACK, &n0.d);
	print_message("the second claim was granted %.2f s after its trainer started (probe %d s)\n",
		      took, PROBE);
	expect_in_log(n0.d.log, "asking the holder whether it is alive");
	expect_in_log(n0.d.log, "did not answer within 5.0 s while a daemon at 127.0.0.1:");
	finish_step(&st);
	reap(n1.d.pid);
	wait_state(&n0.d, 1, "joined", 10);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(&back.d), 0);
}

/* Node 1's daemon is well: a second daemon's trainer claiming its rank is
 * refused at once with "two daemons claim it"; the first goes on, and the
 * next step is right. */
static void second_claim_to_a_live_holder(void **state)
{
	(void)state;
	const char *extra[] = { "--peer-timeout=20", NULL };
	int port = harness_free_port();
	struct node n0, n1, dup;
	start_pair(&n0, &n1, port, port, extra, true);
	const char *elsewhere[] = { "--peer-timeout=20", "--node-address=127.0.0.3", NULL };
	spawn_node(&dup, 1, port, elsewhere);
	harness_daemon_wait_ready(&dup.d, 10000);
	char log[200];
	snprintf(log, sizeof(log), "%s/trainer.log", dup.d.dir);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", dup.d.socket, "--layout",
			       small_layout(), "--rank", "0", "--steps", "1", NULL };
	double t0 = harness_now_s();
	pid_t t = track(harness_job_spawn(&dup.job, 1, argv, log));
	int status = harness_wait(t, 15000);
	double took = harness_now_s() - t0;
	print_message("the second node 1's trainer exited with %d after %.2f s\n", status, took);
	if (status == 0)
		harness_dump(log);
	assert_int_not_equal(status, 0);
	assert_true(took < PROBE);
	expect_in_log(log, "node rank 1 has already joined (127.0.0.1:");
	expect_in_log(log, "two daemons claim it");
	expect_in_log(n0.d.log, "two daemons claim it");
	assert_true(harness_daemon_alive(&n1.d) && harness_daemon_alive(&dup.d));
	char state_now[32];
	peer_state(&n0.d, 1, state_now, sizeof(state_now));
	assert_string_equal(state_now, "joined");
	run_step(&n0, &n1);
	assert_int_equal(harness_daemon_stop(&dup.d), 0);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(&n1.d), 0);
}

/* ---- A node frozen, then resumed ---------------------------------------------- */

/* Node 1's daemon is stopped (SIGSTOP) past --peer-timeout: node 0 shows
 * it lost within --peer-timeout and SLACK. Continued, node 1 finds its
 * connection dropped, joins again, and the next step is right. */
static void node_frozen_then_resumed(void **state)
{
	(void)state;
	char pt[32];
	snprintf(pt, sizeof(pt), "--peer-timeout=%d", PEER_TIMEOUT);
	const char *extra[] = { pt, NULL };
	int port = harness_free_port();
	struct node n0, n1;
	start_pair(&n0, &n1, port, port, extra, true);

	kill(n1.d.pid, SIGSTOP);
	double took = wait_state(&n0.d, 1, "lost", PEER_TIMEOUT + SLACK);
	print_message("node 0 showed the frozen node 1 lost after %.2f s\n", took);
	kill(n1.d.pid, SIGCONT);
	took = wait_text_serving(n1.d.log, "re-joined the coordinator", 15, &n0.d);
	print_message("node 1 re-joined %.2f s after it was continued\n", took);
	wait_state(&n0.d, 1, "joined", 10);
	run_step(&n0, &n1);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
	assert_int_equal(harness_daemon_stop(&n1.d), 0);
}

static int remove_layout(void **state)
{
	(void)state;
	if (layout[0])
		remove(layout);
	return 0;
}

int main(void)
{
	if (!harness_have_gloo()) {
		printf("gradsyncd was built without Gloo: skipping the tests of several nodes\n");
		return HARNESS_EXIT_SKIP;
	}
	signal(SIGPIPE, SIG_IGN);
	if (getenv("GS_TEST_FILTER"))
		cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(crowd_of_silent_connections, kill_mine),
		cmocka_unit_test_teardown(crowd_that_keeps_coming_with_a_secret, kill_mine),
		cmocka_unit_test_teardown(node_vanishes_behind_a_frozen_proxy, kill_mine),
		cmocka_unit_test_teardown(partition_between_nodes_heals, kill_mine),
		cmocka_unit_test_teardown(second_claim_to_a_frozen_holder, kill_mine),
		cmocka_unit_test_teardown(second_claim_to_a_live_holder, kill_mine),
		cmocka_unit_test_teardown(node_frozen_then_resumed, kill_mine),
	};
	return cmocka_run_group_tests(tests, NULL, remove_layout);
}
