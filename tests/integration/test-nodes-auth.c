/*
 * The rendezvous's gate (--cluster-secret-file): nodes of one secret
 * authenticate each other and sync; a wrong secret, a secret on one side
 * only and a secret file not kept secret are refused with their reason;
 * peers of another protocol version, and peers that do not hold the secret
 * (a join, the store, garbage, a forged proof, a crowd, silence), get
 * nothing from the coordinator, which goes on serving the real nodes; nor
 * do they learn which jobs it serves.
 */
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cluster/auth.h"
#include "gradsync.h"
#include "nodes.h"
#include "node_protocol.h"

/* ---- Secret files ------------------------------------------------------------ */

static char secret_dir[64];

/* Writes a secret file of this process's own directory with the mode. */
static const char *write_secret(const char *name, const char *text, mode_t mode)
{
	if (!secret_dir[0]) {
		snprintf(secret_dir, sizeof(secret_dir), "/tmp/gradsync-secret-XXXXXX");
		assert_non_null(mkdtemp(secret_dir));
	}
	static char paths[8][128];
	static unsigned next;
	char *path = paths[next++ % 8];
	snprintf(path, 128, "%s/%s", secret_dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static void remove_secrets(void)
{
	if (!secret_dir[0])
		return;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", secret_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", secret_dir);
}

/* ---- Peers of the rendezvous, by hand ---------------------------------------- */

/* A TCP connection to the rendezvous on 127.0.0.1:port, retried while the
 * coordinator starts; receives time out after timeout_s. */
static int tcp_connect(int port, int timeout_s)
{
	int fd = -1;
	for (int i = 0; i < 500 && fd < 0; i++) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
			close(fd);
			fd = -1;
			usleep(20000);
		}
	}
	assert_true(fd >= 0);
	struct timeval tv = { timeout_s, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_node_hello(int fd, uint32_t version)
{
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = version;
	h.node_rank = 1;
	h.nodes = 2;
	h.local_size = 1;
	h.settings = "";
	h.host = "";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	raw_send(fd, &m, NULL, 0);
}

static void send_node_auth(int fd, uint32_t version, bool has_secret)
{
	uint8_t nonce[32];
	for (size_t i = 0; i < sizeof(nonce); i++)
		nonce[i] = (uint8_t)(i * 7 + 1);
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = version;
	a.node_rank = 1;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.has_secret = has_secret;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	raw_send(fd, &m, NULL, 0);
}

/* A peer speaking another protocol version is refused with both numbers,
 * whether it says so in a NodeHello (a daemon from before the rendezvous
 * was authenticated) or in its NodeAuth, and whether the coordinator has
 * a cluster secret or not: never as a failed authentication. */
static void other_protocol_version(void **state)
{
	(void)state;
	const char *secret = write_secret("s", "0123456789abcdef0123456789abcdef\n", 0600);
	for (int with_secret = 0; with_secret < 2; with_secret++) {
		struct harness_job job = { .nodes = 2 };
		char file[300];
		snprintf(file, sizeof(file), "--cluster-secret-file=%s", secret);
		const char *v[] = { with_secret ? file : NULL, NULL };
		struct gs_test_daemon d0;
		harness_job_daemon_spawn(&d0, &job, 0, v);
		int port = job.port;
		/* 99; 1: the daemons from before the authentication; 2: before
		 * the cuda backend's keys of each group; 3: before the chunks'
		 * status; 4: before the pings; 5: before one node port served
		 * every job. */
		static const uint32_t versions[] = { 99, 1, 2, 3, 4, 5 };
		for (int k = 0; k < 6; k++)
			for (int auth = 0; auth < 2; auth++) {
				int fd = tcp_connect(port, 10);
				if (auth)
					send_node_auth(fd, versions[k], with_secret);
				else
					send_node_hello(fd, versions[k]);
				char want[120];
				snprintf(want, sizeof(want),
					 "node 1 speaks protocol version %u; the coordinator (node 0) speaks %d",
					 versions[k], GS_NODE_PROTOCOL_VERSION);
				raw_expect_error(fd, GS_EVERSION, want);
				close(fd);
			}
		expect_in_log(d0.log, "node 1 speaks protocol version 99");
		expect_in_log(d0.log, "node 1 speaks protocol version 1;");
		expect_in_log(d0.log, "node 1 speaks protocol version 2;");
		expect_in_log(d0.log, "node 1 speaks protocol version 3;");
		expect_in_log(d0.log, "node 1 speaks protocol version 4;");
		/* The lines past the first ten of a window are counted, not
		 * logged (a stranger may send many). */
		assert_int_equal(harness_daemon_stop(&d0), 0);
	}
}

/* ---- The cluster secret ------------------------------------------------------ */

#define SECRET_A "the one secret of this cluster, 0123456789\n"
#define SECRET_B "the one secret of another cluster, 98765\n"

static unsigned count_in_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char line[4096];
	unsigned n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	fclose(f);
	return n;
}

/* Two nodes holding the same secret authenticate each other and sync
 * right, without the warning of an open rendezvous. */
static void two_nodes_with_a_secret(void **state)
{
	(void)state;
	char arg[300];
	snprintf(arg, sizeof(arg), "--cluster-secret-file=%s", write_secret("same", SECRET_A, 0600));
	struct nodes_case c = { "resnet50.txt", { .nodes = 2, .local_size = { 1, 1 } }, "2",
				{ arg, NULL }, { NULL } };
	struct node n[2];
	spawn_nodes(n, &c.job, c.daemon_args);
	for (unsigned r = 0; r < 2; r++)
		harness_daemon_wait_ready(&n[r].d, 30000);
	char log0[200], log1[200];
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "2", NULL, log0);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "2", NULL, log1);
	assert_int_equal(harness_wait(t0, 120000), 0);
	assert_int_equal(harness_wait(t1, 120000), 0);
	expect_in_log(log0, "OK: 2 steps verified");
	expect_in_log(log1, "OK: 2 steps verified");
	/* Node 0's own daemon and node 1 both proved themselves. */
	expect_in_log(n[0].d.log, "authenticated as node 0");
	expect_in_log(n[0].d.log, "authenticated as node 1");
	for (unsigned r = 0; r < 2; r++) {
		assert_int_equal(count_in_file(n[r].d.log, "is unauthenticated"), 0);
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
	}
}

/* The job's trainer on node 1, whose daemon holds another secret (or a
 * secret where node 0 has none, or none where it has one): its hello is
 * refused at once, naming the cause; node 0 logs whom it refused and goes
 * on serving the job's rendezvous, which a node 1 whose daemon has the
 * right secret then joins. Returns node 1's trainer's log. */
static void refused_then_joined(const char *const *e0, const char *const *e1,
				const char *const *right, const char *why)
{
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	struct node n0, n1, back;
	spawn_node(&n0, &job, 0, e0);
	spawn_node(&n1, &job, 1, e1);
	harness_daemon_wait_ready(&n0.d, 30000);
	harness_daemon_wait_ready(&n1.d, 30000);
	char log0[200], log1[200];
	pid_t t0 = spawn_trainer(&n0, 0, harness_layout("resnet50.txt"), "1", NULL, log0);
	double start = harness_now_s();
	pid_t t1 = spawn_trainer(&n1, 0, harness_layout("resnet50.txt"), "1", NULL, log1);
	int status = harness_wait(t1, 20000);
	double took = harness_now_s() - start;
	print_message("node 1's trainer exited with %d after %.2f s\n", status, took);
	if (status == 0)
		harness_dump(log1);
	assert_int_not_equal(status, 0);
	assert_true(took < 5);
	char said[400];
	snprintf(said, sizeof(said), "the coordinator refused node 1: %s", why);
	expect_in_log(log1, said);
	expect_in_log(n1.d.log, said);
	expect_in_log(n0.d.log, "rendezvous: refused node 1 from 127.0.0.1:");
	expect_in_log(n0.d.log, why);
	assert_true(harness_daemon_alive(&n0.d) && harness_daemon_alive(&n1.d));
	assert_int_equal(harness_daemon_stop(&n1.d), 0);

	/* The job's node 0 still waits for its node 1. */
	spawn_node(&back, &job, 1, right);
	harness_daemon_wait_ready(&back.d, 30000);
	char log_back[200];
	pid_t tb = spawn_trainer(&back, 0, harness_layout("resnet50.txt"), "1", NULL, log_back);
	assert_int_equal(harness_wait(tb, 120000), 0);
	assert_int_equal(harness_wait(t0, 120000), 0);
	expect_in_log(log0, "OK: 1 steps verified");
	assert_int_equal(harness_daemon_stop(&back.d), 0);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
}

static void wrong_cluster_secret(void **state)
{
	(void)state;
	char a[300], b[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("a", SECRET_A, 0600));
	snprintf(b, sizeof(b), "--cluster-secret-file=%s", write_secret("b", SECRET_B, 0400));
	const char *ea[] = { a, NULL }, *eb[] = { b, NULL };
	refused_then_joined(ea, eb, ea,
			    "cluster secret differs (check --cluster-secret-file on every node)");
}

/* A secret on one side only is refused on both sides, whichever side has
 * it; the side without one warns, when the job begins, that its
 * rendezvous is open. */
static void cluster_secret_on_one_node_only(void **state)
{
	(void)state;
	char a[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("one", SECRET_A, 0600));
	const char *ea[] = { a, NULL };
	refused_then_joined(ea, NULL, ea,
			    "it has no cluster secret, but the coordinator has one (set the same --cluster-secret-file on every node)");
	refused_then_joined(NULL, ea, NULL,
			    "it has a cluster secret, but the coordinator has none (set the same --cluster-secret-file on every node)");
}

/* A secret file that others may read, that is too short or missing stops
 * gradsyncd at start with the invalid-settings status, naming the file
 * and the reason, from the flag and from the environment alike. */
static void cluster_secret_file_refused(void **state)
{
	(void)state;
	char missing[200];
	write_secret("present", SECRET_A, 0600); /* makes secret_dir */
	snprintf(missing, sizeof(missing), "%s/missing", secret_dir);
	const struct {
		const char *path;
		const char *why;
		bool env;
	} cases[] = {
		{ write_secret("open", SECRET_A, 0644), "its mode is 0644: a secret must be readable by its owner alone", false },
		{ write_secret("group", SECRET_A, 0640), "its mode is 0640", true },
		{ write_secret("short", "0123456789abcde\n", 0600), "it holds 15 bytes of secret; 16 to 4096 are needed", false },
		{ missing, "cannot open it: No such file or directory", false },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct harness_job job = { .nodes = 2 };
		char arg[300];
		snprintf(arg, sizeof(arg), "--cluster-secret-file=%s", cases[i].path);
		const char *v[] = { cases[i].env ? NULL : arg, NULL };
		if (cases[i].env)
			setenv("GRADSYNC_CLUSTER_SECRET_FILE", cases[i].path, 1);
		struct gs_test_daemon d;
		harness_job_daemon_spawn(&d, &job, 0, v);
		unsetenv("GRADSYNC_CLUSTER_SECRET_FILE");
		int status = harness_wait(d.pid, 10000);
		if (status != 2)
			harness_dump(d.log);
		assert_int_equal(status, 2);
		char said[300];
		snprintf(said, sizeof(said), "'%s', from %s, is refused: ", cases[i].path,
			 cases[i].env ? "environment" : "command line");
		expect_in_log(d.log, said);
		expect_in_log(d.log, cases[i].why);
		expect_in_log(d.log, "--cluster-secret-file");
		forget_daemon(&d);
	}
}

static void send_store_get(int fd, const char *key)
{
	Gradsync__StoreGet get = GRADSYNC__STORE_GET__INIT;
	get.key = (char *)key;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_GET;
	m.store_get = &get;
	raw_send(fd, &m, NULL, 0);
}

static void send_store_set(int fd, const char *key, const char *value)
{
	Gradsync__StoreSet set = GRADSYNC__STORE_SET__INIT;
	set.key = (char *)key;
	set.value.data = (uint8_t *)value;
	set.value.len = strlen(value);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_SET;
	m.store_set = &set;
	raw_send(fd, &m, NULL, 0);
}

/* Peers that do not hold the secret get nothing from the coordinator: a
 * join, the store, garbage, a forged proof, a crowd and silence are each
 * refused (a crowd's oldest to make room for a newcomer, silence within
 * --auth-timeout), and the coordinator goes on serving the real nodes,
 * whose job then runs. */
static void unauthenticated_peers_refused(void **state)
{
	(void)state;
	char a[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("peers", SECRET_A, 0600));
	const char *ea[] = { a, "--auth-timeout=3", NULL };
	struct harness_job job = { .nodes = 2, .local_size = { 1, 1 } };
	struct node n[2];
	spawn_node(&n[0], &job, 0, ea);
	harness_daemon_wait_ready(&n[0].d, 30000);
	int port = job.port;
	/* The job's node 0: its trainer waits for node 1, and its daemon
	 * serves the job's rendezvous meanwhile. */
	char log0[200], log1[200];
	pid_t t0 = spawn_trainer(&n[0], 0, harness_layout("resnet50.txt"), "1", NULL, log0);
	harness_wait_for_text(n[0].d.log, "serving the rendezvous", 30);

	int fd = tcp_connect(port, 10);
	send_node_hello(fd, GS_NODE_PROTOCOL_VERSION);
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	send_store_get(fd, "nccl/uid");
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	send_store_set(fd, "g0/rank_1", "10.6.6.6:666");
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	fd = tcp_connect(port, 10);
	static const char http[] = "GET / HTTP/1.1\r\nHost: gradsync\r\n\r\n";
	raw_send_bytes(fd, http, sizeof(http) - 1);
	raw_expect_error(fd, GS_ELIMIT, "frame longer than the 4096-byte maximum");
	close(fd);

	/* A proof made up without the secret. */
	fd = tcp_connect(port, 10);
	send_node_auth(fd, GS_NODE_PROTOCOL_VERSION, true);
	Gradsync__Message *ch = raw_recv(fd);
	assert_non_null(ch);
	assert_int_equal(ch->body_case, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE);
	assert_int_equal(ch->node_challenge->nonce.len, 32);
	assert_true(ch->node_challenge->has_secret);
	gradsync__message__free_unpacked(ch, NULL);
	uint8_t forged[32] = { 0 };
	Gradsync__NodeProof pr = GRADSYNC__NODE_PROOF__INIT;
	pr.mac.data = forged;
	pr.mac.len = sizeof(forged);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &pr;
	raw_send(fd, &m, NULL, 0);
	raw_expect_error(fd, GS_EREFUSED, "cluster secret differs");
	close(fd);

	/* Only so many peers of a job may be authenticating at once (4 per
	 * node and 64): the next takes the place of the oldest, which is told
	 * to try again (GS_EAGAIN), and is served. */
	enum { PENDING = 4 * 2 + 64 };
	int held[PENDING];
	for (int i = 0; i < PENDING; i++) {
		held[i] = tcp_connect(port, 10);
		send_node_auth(held[i], GS_NODE_PROTOCOL_VERSION, true);
		ch = raw_recv(held[i]);
		assert_non_null(ch);
		assert_int_equal(ch->body_case, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE);
		gradsync__message__free_unpacked(ch, NULL);
	}
	fd = tcp_connect(port, 10);
	send_node_auth(fd, GS_NODE_PROTOCOL_VERSION, true);
	raw_expect_error(held[0], GS_EAGAIN, "72 connections were authenticating at once; the oldest made room for a newer one (127.0.0.1:");
	ch = raw_recv(fd);
	assert_non_null(ch);
	assert_int_equal(ch->body_case, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE);
	gradsync__message__free_unpacked(ch, NULL);
	send_node_hello(fd, GS_NODE_PROTOCOL_VERSION);
	raw_expect_error(fd, GS_EREFUSED, "before authenticating");
	close(fd);
	for (int i = 0; i < PENDING; i++)
		close(held[i]);

	/* A peer that says nothing, while the real node 1 joins. */
	int silent = tcp_connect(port, 20);
	double start = harness_now_s();
	spawn_node(&n[1], &job, 1, ea);
	harness_daemon_wait_ready(&n[1].d, 30000);
	pid_t t1 = spawn_trainer(&n[1], 0, harness_layout("resnet50.txt"), "1", NULL, log1);
	raw_expect_error(silent, GS_EAGAIN, "did not authenticate within 3 s (--auth-timeout); try again");
	double took = harness_now_s() - start;
	print_message("the silent peer was dropped after %.2f s\n", took);
	assert_true(took > 2.5 && took < 6);
	close(silent);
	assert_int_equal(harness_wait(t0, 120000), 0);
	assert_int_equal(harness_wait(t1, 120000), 0);
	expect_in_log(log0, "OK: 1 steps verified");
	expect_in_log(log1, "OK: 1 steps verified");
	expect_in_log(n[0].d.log, "rendezvous: refused a connection from 127.0.0.1:");
	expect_in_log(n[0].d.log, "rendezvous: refused node 1 from 127.0.0.1:");
	for (unsigned r = 0; r < 2; r++)
		assert_int_equal(harness_daemon_stop(&n[r].d), 0);
}

/* ---- Which jobs there are ------------------------------------------------------ */

/* A NodeAuth for job `id` as node `rank` (nonce: 32 bytes of seed). */
static void send_auth_for(int fd, const char *id, uint32_t rank, uint8_t seed)
{
	uint8_t nonce[GS_AUTH_NONCE];
	memset(nonce, seed, sizeof(nonce));
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = GS_NODE_PROTOCOL_VERSION;
	a.node_rank = rank;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.has_secret = true;
	a.job_id = (char *)id;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	raw_send(fd, &m, NULL, 0);
}

/* The answer to a proof for job id as node rank on a new connection:
 * made with `key` (NULL: made up); *code and message (n bytes) are what
 * the coordinator said, or code 0 and "proof" for its own proof back. */
static void prove(int port, const char *id, uint32_t rank, const char *key, int *code,
		  char *message, size_t n)
{
	int fd = tcp_connect(port, 10);
	send_auth_for(fd, id, rank, 0x5a);
	Gradsync__Message *ch = raw_recv(fd);
	assert_non_null(ch);
	if (ch->body_case != GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE)
		fail_msg("NodeAuth for '%s' as node %u: message %d (%s), not a challenge", id, rank,
			 (int)ch->body_case,
			 ch->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? ch->error->message : "");
	assert_true(ch->node_challenge->has_secret);
	assert_int_equal(ch->node_challenge->nonce.len, GS_AUTH_NONCE);
	uint8_t node_nonce[GS_AUTH_NONCE], mac[GS_AUTH_MAC] = { 0 };
	memset(node_nonce, 0x5a, sizeof(node_nonce));
	if (key)
		assert_int_equal(gs_auth_mac((const uint8_t *)key, strlen(key), GS_AUTH_NODE, id, rank,
					     node_nonce, ch->node_challenge->nonce.data, mac), 0);
	gradsync__message__free_unpacked(ch, NULL);
	Gradsync__NodeProof pr = GRADSYNC__NODE_PROOF__INIT;
	pr.mac.data = mac;
	pr.mac.len = sizeof(mac);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &pr;
	raw_send(fd, &m, NULL, 0);
	Gradsync__Message *r = raw_recv(fd);
	assert_non_null(r);
	if (r->body_case == GRADSYNC__MESSAGE__BODY_NODE_PROOF) {
		*code = 0;
		snprintf(message, n, "proof");
	} else {
		assert_int_equal(r->body_case, GRADSYNC__MESSAGE__BODY_ERROR);
		*code = r->error->code;
		snprintf(message, n, "%s", r->error->message);
	}
	gradsync__message__free_unpacked(r, NULL);
	close(fd);
}

/* The node port serves every job whose node 0 is here; until a peer has
 * proven the secret, a job that is here and one that is not (and a rank
 * out of a job's range) are answered alike: a challenge, then the same
 * refusal of a proof made up. Only a peer with the secret learns that a
 * job is not here, or that its rank is out of range. */
static void job_ids_hidden_before_authentication(void **state)
{
	(void)state;
	const char *key = "0123456789abcdef0123456789abcdef";
	char a[300];
	snprintf(a, sizeof(a), "--cluster-secret-file=%s", write_secret("ids", key, 0600));
	const char *ea[] = { a, NULL };
	struct harness_job job = { .id = "known", .nodes = 2, .local_size = { 1, 1 } };
	struct node n0;
	spawn_node(&n0, &job, 0, ea);
	harness_daemon_wait_ready(&n0.d, 30000);
	char log0[200];
	pid_t t0 = spawn_trainer(&n0, 0, harness_layout("resnet50.txt"), "1", NULL, log0);
	harness_wait_for_text(n0.d.log, "serving the rendezvous", 30);

	static const struct {
		const char *id;
		uint32_t rank;
	} asks[] = { { "known", 1 }, { "unknown", 1 }, { "known", 7 }, { "unknown", 7 } };
	char first[512] = "", message[512];
	int code;
	for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
		prove(job.port, asks[i].id, asks[i].rank, NULL, &code, message, sizeof(message));
		print_message("made-up proof for '%s' as node %u: %s\n", asks[i].id, asks[i].rank, message);
		assert_int_equal(code, GS_EREFUSED);
		if (!first[0])
			snprintf(first, sizeof(first), "%s", message);
		assert_string_equal(message, first);
	}
	/* The secret's holders are told the truth. */
	prove(job.port, "unknown", 1, key, &code, message, sizeof(message));
	assert_int_equal(code, GS_EAGAIN);
	assert_non_null(strstr(message, "no job 'unknown' has its node 0 on this daemon (yet)"));
	prove(job.port, "known", 7, key, &code, message, sizeof(message));
	assert_int_equal(code, GS_EREFUSED);
	assert_non_null(strstr(message, "node rank 7 is out of range for 2 nodes"));
	prove(job.port, "known", 1, key, &code, message, sizeof(message));
	assert_int_equal(code, 0);
	kill(t0, SIGKILL);
	harness_wait(t0, 10000);
	assert_int_equal(harness_daemon_stop(&n0.d), 0);
}

int main(void)
{
	if (!nodes_prepare())
		return HARNESS_EXIT_SKIP;
	atexit(remove_secrets);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(other_protocol_version),
		cmocka_unit_test(two_nodes_with_a_secret),
		cmocka_unit_test(wrong_cluster_secret),
		cmocka_unit_test(cluster_secret_on_one_node_only),
		cmocka_unit_test(cluster_secret_file_refused),
		cmocka_unit_test(unauthenticated_peers_refused),
		cmocka_unit_test(job_ids_hidden_before_authentication),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
