/*
 * Whose a job is, at every door. A job belongs to the user whose trainer
 * began it, for its whole life on every node (daemon/engine/ownership.h).
 * This file is a table: every way into a job (a door: a trainer's Hello
 * to a job in each state of its life, a node's claim of a rank at the
 * job's rendezvous) against every kind of user who knocks:
 *
 *   owner  the job's own user (uid 61001)
 *   other  another user let onto the socket (uid 61002)
 *   root   uid 0
 *   any    the other user, with every daemon run with --job-access=any
 *
 * Each cell sets the door up anew on real daemons (two, at 127.0.0.1
 * and 127.0.0.2, for the doors between nodes), knocks once and sees
 * what comes of it: admitted (a Welcome, or the daemon counting the
 * trainer in) or refused as another user's. The table below is what the
 * rule must give; a cell that changes fails the test, and the whole
 * table seen is printed.
 */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"

#define OWNER_UID 61001
#define OTHER_UID 61002

enum who { OWNER, OTHER, ROOT, ANY, WHO_COUNT };
static const char *const who_names[WHO_COUNT] = { "owner", "other", "root", "any" };

enum outcome { ADMITTED, REFUSED };
static const char *const outcome_names[] = { "admitted", "refused" };

/* ---- Connections as another user ------------------------------------------ */

/* A connection to socket made by a process of uid, so that the daemon
 * sees that user's credentials; this process then speaks on it. */
static int connect_as(uid_t uid, const char *socket)
{
	if (uid == 0)
		return raw_connect(socket);
	int sp[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sp[0]);
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
			_exit(3);
		int fd = raw_connect(socket);
		raw_send(sp[1], &(Gradsync__Message)GRADSYNC__MESSAGE__INIT, &fd, 1);
		_exit(0);
	}
	close(sp[1]);
	char byte[64];
	char control[CMSG_SPACE(sizeof(int))];
	struct iovec io = { byte, sizeof(byte) };
	struct msghdr mh = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = control,
			     .msg_controllen = sizeof(control) };
	ssize_t n = recvmsg(sp[0], &mh, 0);
	close(sp[0]);
	assert_int_equal(harness_wait(pid, 10000), 0);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	assert_true(n > 0 && cm && cm->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
	return fd;
}

static uid_t uid_of(enum who w)
{
	return w == OWNER ? OWNER_UID : w == ROOT ? 0 : OTHER_UID;
}

/* ---- What a daemon says of a job ------------------------------------------ */

struct job_seen {
	bool found;
	char state[32];
	uint32_t trainers;
	uint32_t owner;
	uint64_t groups_built;
};

static struct job_seen job_status(const char *socket, const char *id)
{
	struct job_seen seen = { .found = false };
	gs_client *c;
	struct gs_status *s;
	assert_int_equal(gs_control_connect(socket, 10000, &c), GS_OK);
	assert_int_equal(gs_status_get(c, 10000, &s), GS_OK);
	for (size_t i = 0; i < s->job_count; i++) {
		const struct gs_job_status *j = &s->jobs[i];
		if (strcmp(j->job_id, id) != 0)
			continue;
		seen = (struct job_seen){ true, "", j->trainers_connected, j->owner_uid,
					  j->groups_built };
		snprintf(seen.state, sizeof(seen.state), "%s", j->state);
	}
	gs_status_free(s);
	gs_close(c);
	return seen;
}

/* Waits (up to 60 s) until the daemon on socket shows job id in state
 * (NULL: any) with `trainers` trainers. */
static void wait_job(const char *socket, const char *id, const char *state, uint32_t trainers)
{
	double end = harness_now_s() + 60;
	struct job_seen seen;
	do {
		seen = job_status(socket, id);
		if (seen.found && seen.trainers == trainers &&
		    (!state || strcmp(seen.state, state) == 0))
			return;
		poll(NULL, 0, 20);
	} while (harness_now_s() < end);
	fail_msg("job '%s' on %s: found %d, state '%s', %u trainers; expected '%s' with %u", id,
		 socket, seen.found, seen.state, seen.trainers, state ? state : "(any)", trainers);
}

/* ---- A knock at a door ----------------------------------------------------- */

/* One cell: the daemons of the door, and what admits a knock that no
 * Welcome answers (a job still joining its nodes, one begun anew). */
struct cell {
	enum who who;
	struct harness_job job;
	struct gs_test_daemon d[2];
	unsigned daemons;
	int held[4]; /* the owner's trainers' connections, -1: none */
	bool keep;   /* the knocker's connection, once admitted, is kept in held[3] */
	bool (*admitted)(struct cell *c, unsigned node);
};

/* A knocker's Hello as a trainer of node `node` (local rank rank, the
 * job's view of it in *j) and what comes of it: a Welcome or the
 * cell's own sign admits it, an Error that says the job is another
 * user's refuses it; anything else fails the test. */
static enum outcome knock(struct cell *c, unsigned node, uint32_t rank,
			  const struct harness_job *j)
{
	int fd = connect_as(uid_of(c->who), c->d[node].socket);
	raw_send_hello_job(fd, rank, GS_PROTOCOL_VERSION, j, node);
	double end = harness_now_s() + 60;
	while (harness_now_s() < end) {
		struct pollfd p = { fd, POLLIN, 0 };
		if (poll(&p, 1, 50) == 1) {
			Gradsync__Message *m = raw_recv(fd);
			assert_non_null(m);
			bool welcomed = m->body_case == GRADSYNC__MESSAGE__BODY_WELCOME;
			bool refused = m->body_case == GRADSYNC__MESSAGE__BODY_ERROR &&
				       strstr(m->error->message, "belongs to another user");
			/* Admitted, and then failed for a reason of its own
			 * (a job begun anew that its node 0 does not know). */
			if (!welcomed && !refused && c->admitted && c->admitted(c, node))
				welcomed = true;
			if (!welcomed && !refused)
				fail_msg("%s's knock: message %d (%s)", who_names[c->who],
					 (int)m->body_case,
					 m->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? m->error->message : "");
			if (refused)
				print_message("    %s: %s\n", who_names[c->who], m->error->message);
			gradsync__message__free_unpacked(m, NULL);
			if (welcomed && c->keep)
				c->held[3] = fd;
			else
				close(fd);
			return welcomed ? ADMITTED : REFUSED;
		}
		if (c->admitted && c->admitted(c, node)) {
			close(fd);
			return ADMITTED;
		}
	}
	fail_msg("%s's knock: neither admitted nor refused within 60 s", who_names[c->who]);
	return REFUSED;
}

/* The owner's trainer of node `node`, local rank rank: connected, its
 * Hello sent; welcome says whether to wait for the Welcome. */
static int owner_trainer(struct cell *c, unsigned node, uint32_t rank, bool welcome)
{
	int fd = connect_as(OWNER_UID, c->d[node].socket);
	raw_send_hello_job(fd, rank, GS_PROTOCOL_VERSION, &c->job, node);
	if (welcome) {
		Gradsync__Message *m = raw_recv(fd);
		assert_non_null(m);
		if (m->body_case != GRADSYNC__MESSAGE__BODY_WELCOME)
			fail_msg("the owner's trainer of node %u: message %d (%s)", node,
				 (int)m->body_case,
				 m->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? m->error->message : "");
		gradsync__message__free_unpacked(m, NULL);
	}
	return fd;
}

static void start_daemons(struct cell *c, unsigned n)
{
	char allow[64];
	snprintf(allow, sizeof(allow), "--allow-uids=%u,%u", OWNER_UID, OTHER_UID);
	const char *const extra[] = { allow, "--join-timeout=60", "--peer-timeout=5",
				      c->who == ANY ? "--job-access=any" : NULL, NULL };
	c->daemons = n;
	for (unsigned i = 0; i < n; i++)
		harness_job_daemon_spawn(&c->d[i], &c->job, i, extra);
	for (unsigned i = 0; i < n; i++) {
		harness_daemon_wait_ready(&c->d[i], 10000);
		chmod(c->d[i].dir, 0755);
		chmod(c->d[i].socket, 0666);
	}
}

static void cell_init(struct cell *c, enum who who, const char *id, unsigned nodes,
		      unsigned local_size)
{
	*c = (struct cell){ .who = who };
	c->job.id = id;
	c->job.nodes = nodes;
	for (unsigned n = 0; n < nodes; n++)
		c->job.local_size[n] = local_size;
	for (size_t i = 0; i < 4; i++)
		c->held[i] = -1;
}

static void cell_end(struct cell *c)
{
	for (size_t i = 0; i < 4; i++)
		if (c->held[i] >= 0)
			close(c->held[i]);
	for (unsigned i = 0; i < c->daemons; i++)
		if (c->d[i].pid > 0)
			assert_int_equal(harness_daemon_stop(&c->d[i]), 0);
}

/* ---- The doors ------------------------------------------------------------- */

/* No job has the id: anyone may begin one, which is then theirs. */
static enum outcome door_new(enum who who)
{
	struct cell c;
	cell_init(&c, who, "new", 1, 1);
	start_daemons(&c, 1);
	c.keep = true; /* a job of one node goes with its last trainer */
	enum outcome o = knock(&c, 0, 0, &c.job);
	if (o == ADMITTED)
		assert_int_equal(job_status(c.d[0].socket, "new").owner, uid_of(who));
	cell_end(&c);
	return o;
}

/* A job with one of its two trainers. */
static enum outcome door_running(enum who who)
{
	struct cell c;
	cell_init(&c, who, "running", 1, 2);
	start_daemons(&c, 1);
	c.held[0] = owner_trainer(&c, 0, 0, true);
	enum outcome o = knock(&c, 0, 1, &c.job);
	cell_end(&c);
	return o;
}

static bool counted_in(struct cell *c, unsigned node)
{
	return job_status(c->d[node].socket, c->job.id).trainers == 1;
}

/* Node 1 of a job whose node 0 is not up: joining, and its only trainer
 * gone (the window the first outside round found). */
static enum outcome door_joining(enum who who)
{
	struct cell c;
	cell_init(&c, who, "joining", 2, 2);
	start_daemons(&c, 2);
	harness_daemon_stop(&c.d[0]); /* node 0 never comes */
	c.d[0].pid = 0;
	int fd = owner_trainer(&c, 1, 0, false);
	wait_job(c.d[1].socket, "joining", "joining", 1);
	close(fd);
	wait_job(c.d[1].socket, "joining", "joining", 0);
	c.admitted = counted_in;
	enum outcome o = knock(&c, 1, 1, &c.job);
	cell_end(&c);
	return o;
}

/* The owner's trainer process of the failed door: two trainers of one
 * job, each with one tensor; rank 0 begins a step, rank 1 dies in it. */
static void failed_trainers_main(int out, void *arg)
{
	const char *socket = arg;
	struct gs_tensor_spec spec = { "w", 1024, GS_FLOAT32, -1, 0 };
	gs_client *t[2];
	for (uint32_t r = 0; r < 2; r++) {
		struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
		o.socket_path = socket;
		o.local_rank = r;
		o.job_id = "failed";
		o.local_size = 2;
		o.timeout_ms = 30000;
		if (gs_connect(&o, &t[r]) != GS_OK || gs_register(t[r], &spec, 1) != GS_OK) {
			dprintf(out, "trainer %u: %s\n", r, gs_last_error(NULL));
			return;
		}
	}
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	struct gs_step_result res;
	uint32_t all = 0;
	int r = gs_step_begin(t[0], &so);
	if (r == GS_OK)
		r = gs_mark_ready(t[0], &all, 1);
	gs_close(t[1]);
	if (r == GS_OK)
		r = gs_step_wait(t[0], 30000, &res);
	dprintf(out, "%s\n", r == GS_OK ? "step completed" : "step aborted");
	/* Rank 0 stays until the parent is done with the door. */
	pause();
}

/* A job whose step was aborted when one of its trainers died: the rank
 * waits for a replacement. */
static enum outcome door_failed(enum who who)
{
	struct cell c;
	cell_init(&c, who, "failed", 1, 2);
	start_daemons(&c, 1);
	int p[2];
	assert_int_equal(pipe(p), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) < 0 || setgid(OWNER_UID) < 0 || setuid(OWNER_UID) < 0)
			_exit(3);
		failed_trainers_main(p[1], c.d[0].socket);
		_exit(1);
	}
	close(p[1]);
	char line[256] = "";
	FILE *f = fdopen(p[0], "r");
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	assert_string_equal(line, "step aborted\n");
	wait_job(c.d[0].socket, "failed", NULL, 1);
	enum outcome o = knock(&c, 0, 1, &c.job);
	kill(pid, SIGKILL);
	harness_wait(pid, 10000);
	cell_end(&c);
	return o;
}

/* Two nodes that joined, their trainers then gone: the job lingers on
 * both, keeping its group. */
static void lingering_job(struct cell *c, enum who who, const char *id)
{
	cell_init(c, who, id, 2, 1);
	start_daemons(c, 2);
	int t0 = owner_trainer(c, 0, 0, false);
	int t1 = owner_trainer(c, 1, 0, true);
	close(t0);
	close(t1);
	wait_job(c->d[1].socket, id, "lingering", 0);
}

static enum outcome door_lingering(enum who who)
{
	struct cell c;
	lingering_job(&c, who, "lingering");
	uint64_t built = job_status(c.d[1].socket, "lingering").groups_built;
	enum outcome o = knock(&c, 1, 0, &c.job);
	/* A refused knock leaves the owner's group as it was. */
	struct job_seen after = job_status(c.d[1].socket, "lingering");
	if (o == REFUSED) {
		assert_string_equal(after.state, "lingering");
		assert_int_equal(after.owner, OWNER_UID);
	}
	assert_int_equal(after.groups_built, built);
	cell_end(&c);
	return o;
}

static bool began_anew(struct cell *c, unsigned node)
{
	return harness_log_contains(&c->d[node], "the lingering job's group goes");
}

/* A Hello of another shape to a lingering job: whoever may join it
 * begins it anew; anyone else leaves it lingering. */
static enum outcome door_anew(enum who who)
{
	struct cell c;
	lingering_job(&c, who, "anew");
	struct harness_job other = c.job;
	other.threshold = "1000";
	c.admitted = began_anew;
	enum outcome o = knock(&c, 1, 0, &other);
	if (o == REFUSED) {
		assert_string_equal(job_status(c.d[1].socket, "anew").state, "lingering");
		assert_false(began_anew(&c, 1));
	}
	cell_end(&c);
	return o;
}

/* Node 1's first trainer (the knocker) begins the job there, and node 1
 * claims its rank in node 0's job, the owner's. */
static enum outcome door_node_joins(enum who who)
{
	struct cell c;
	cell_init(&c, who, "joins", 2, 1);
	start_daemons(&c, 2);
	c.held[0] = owner_trainer(&c, 0, 0, false);
	enum outcome o = knock(&c, 1, 0, &c.job);
	cell_end(&c);
	return o;
}

/* The group formed, node 1's daemon killed and started again: its new
 * job, the knocker's, rejoins node 0's group. */
static enum outcome door_node_rejoins(enum who who)
{
	struct cell c;
	cell_init(&c, who, "rejoins", 2, 1);
	start_daemons(&c, 2);
	c.held[0] = owner_trainer(&c, 0, 0, false);
	c.held[1] = owner_trainer(&c, 1, 0, true);
	kill(c.d[1].pid, SIGKILL);
	harness_wait(c.d[1].pid, 10000);
	harness_wait_for_text(c.d[0].log, "rendezvous: node 1 left job", 60);
	char allow[64];
	snprintf(allow, sizeof(allow), "--allow-uids=%u,%u", OWNER_UID, OTHER_UID);
	const char *const extra[] = { allow, "--join-timeout=60", "--peer-timeout=5",
				      who == ANY ? "--job-access=any" : NULL, NULL };
	harness_job_daemon_start(&c.d[1], &c.job, 1, extra);
	chmod(c.d[1].dir, 0755);
	chmod(c.d[1].socket, 0666);
	enum outcome o = knock(&c, 1, 0, &c.job);
	cell_end(&c);
	return o;
}

/* ---- The table ------------------------------------------------------------- */

struct door {
	const char *name;
	enum outcome (*open)(enum who who);
	enum outcome expected[WHO_COUNT]; /* owner, other, root, any */
};

#define A ADMITTED
#define R REFUSED
static const struct door doors[] = {
	{ "Hello, no such job", door_new, { A, A, A, A } },
	{ "Hello, job joining its nodes", door_joining, { A, R, A, A } },
	{ "Hello, job running", door_running, { A, R, A, A } },
	{ "Hello, job after a trainer died", door_failed, { A, R, A, A } },
	{ "Hello, job lingering", door_lingering, { A, R, A, A } },
	{ "Hello, job begun anew", door_anew, { A, R, A, A } },
	{ "node claims its rank", door_node_joins, { A, R, A, A } },
	{ "node rejoins the group", door_node_rejoins, { A, R, A, A } },
};
#undef A
#undef R

static void check_door(void **state)
{
	const struct door *d = *state;
	if (geteuid() != 0) {
		print_message("skipped: users other than root need root to be\n");
		skip();
	}
	if (strstr(d->name, "node") || strstr(d->name, "joining") || strstr(d->name, "linger") ||
	    strstr(d->name, "anew")) {
		if (!harness_have_gloo())
			skip();
	}
	enum outcome seen[WHO_COUNT];
	for (int w = 0; w < WHO_COUNT; w++)
		seen[w] = d->open((enum who)w);
	print_message("%-34s", d->name);
	for (int w = 0; w < WHO_COUNT; w++)
		print_message(" %s %-8s%s", who_names[w], outcome_names[seen[w]],
			      seen[w] == d->expected[w] ? "" : "(!)");
	print_message("\n");
	for (int w = 0; w < WHO_COUNT; w++)
		if (seen[w] != d->expected[w])
			fail_msg("%s, %s: %s, expected %s", d->name, who_names[w],
				 outcome_names[seen[w]], outcome_names[d->expected[w]]);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	struct CMUnitTest tests[sizeof(doors) / sizeof(doors[0])];
	for (size_t i = 0; i < sizeof(doors) / sizeof(doors[0]); i++)
		tests[i] = (struct CMUnitTest){ doors[i].name, check_door, NULL, NULL,
						(void *)&doors[i] };
	return cmocka_run_group_tests(tests, NULL, NULL);
}
