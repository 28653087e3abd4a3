/*
 * Input at the edges, end to end (issue 23, finding 6): a coordinator
 * that is no host alone (a port, a bracket, a URL) is refused at once,
 * naming the field and the variable, whether libgradsync derives it from
 * the environment or a raw Hello carries it to gradsyncd, never after
 * waiting out --join-timeout; and the non-ASCII bytes of a coordinator, a
 * node's host or a job id sent to the node port never reach gradsyncd's
 * log or its Error strings raw.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gradsync.h"
#include "harness.h"
#include "node_protocol.h"

/* What the daemons wait for a coordinator that never answers: what a
 * bad one cost before it was refused at once. Every refusal below must
 * come within REFUSED_WITHIN_S, far below it, on a loaded machine too. */
#define JOIN_TIMEOUT "--join-timeout=300"
#define REFUSED_WITHIN_S 20.0

/* The coordinators, each with the start of why it is refused. */
static const struct {
	const char *coordinator;
	const char *why;
} bad[] = {
	{ "host:port", "has a ':' but is no IPv6 address" },
	{ "[::1]:5", "has a port (':5')" },
	{ "[", "has an unmatched bracket" },
	{ "]", "has an unmatched bracket" },
	{ "http://x/", "is a URL" },
	{ "node0:29500", "has a port (':29500')" },
};
#define NBAD (sizeof(bad) / sizeof(bad[0]))

/* Whether every byte of the file is printable ASCII or a newline. */
static bool file_is_ascii(const char *path)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int ch;
	bool ascii = true;
	while ((ch = fgetc(f)) != EOF)
		ascii = ascii && ((ch >= 0x20 && ch <= 0x7e) || ch == '\n');
	fclose(f);
	return ascii;
}

static bool text_is_ascii(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
			return false;
	return true;
}

static void expect_ascii_log(const struct gs_test_daemon *d)
{
	if (!file_is_ascii(d->log)) {
		harness_dump(d->log);
		fail_msg("gradsyncd's log holds bytes outside printable ASCII");
	}
}

/* Expects an Error of code containing text, printable ASCII throughout,
 * then the end of the stream. */
static void expect_ascii_error(int fd, int code, const char *text)
{
	Gradsync__Message *r = raw_recv(fd);
	if (!r)
		fail_msg("expected an Error containing '%s', got nothing", text);
	if (r->body_case != GRADSYNC__MESSAGE__BODY_ERROR)
		fail_msg("expected an Error containing '%s', got message %d", text, (int)r->body_case);
	print_message("  daemon said: %s\n", r->error->message);
	if (!text_is_ascii(r->error->message))
		fail_msg("the Error holds bytes outside printable ASCII");
	if (text && !strstr(r->error->message, text))
		fail_msg("error '%s' does not contain '%s'", r->error->message, text);
	assert_int_equal(r->error->code, code);
	gradsync__message__free_unpacked(r, NULL);
	assert_null(raw_recv(fd));
}

/* Reads until the end of the stream (or 10 s of silence): every Error
 * that comes is printable ASCII throughout. */
static void expect_only_ascii(int fd)
{
	Gradsync__Message *r;
	while ((r = raw_recv(fd))) {
		if (r->body_case == GRADSYNC__MESSAGE__BODY_ERROR) {
			print_message("  daemon said: %s\n", r->error->message);
			if (!text_is_ascii(r->error->message))
				fail_msg("the Error holds bytes outside printable ASCII");
		}
		gradsync__message__free_unpacked(r, NULL);
	}
}

/* ---- libgradsync, from the environment ----------------------------------- */

/* A trainer of node 1 of a 2-node job whose GRADSYNC_COORDINATOR (or
 * torchrun's MASTER_ADDR) is no host: gs_connect fails before it says a
 * word to gradsyncd, naming the field, the variable and the value. */
static void coordinator_from_environment_refused_at_once(void **state)
{
	(void)state;
	struct harness_job job = { .id = "edges", .nodes = 2 };
	struct gs_test_daemon d;
	const char *extra[] = { JOIN_TIMEOUT, NULL };
	harness_job_daemon_start(&d, &job, 1, extra);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
			       harness_layout("resnet50.txt"), "--steps", "1", NULL };
	double slowest = 0;
	for (size_t i = 0; i < NBAD + 1; i++) {
		char log[200], want[300];
		snprintf(log, sizeof(log), "%s/trainer-%zu.log", d.dir, i);
		double t0 = harness_now_s();
		pid_t pid;
		if (i < NBAD) {
			job.coordinator = bad[i].coordinator;
			pid = harness_job_spawn(&job, 1, argv, log);
			snprintf(want, sizeof(want),
				 "coordinator from GRADSYNC_COORDINATOR is '%s': not a host name or address: it %s",
				 bad[i].coordinator, bad[i].why);
		} else {
			/* torchrun's, node 1 of 2 nodes of one trainer each. */
			const char *env[] = { "TORCHELASTIC_RUN_ID=edges", "LOCAL_WORLD_SIZE=1",
					      "WORLD_SIZE=2", "GROUP_RANK=1",
					      "MASTER_ADDR=node0:29500", NULL };
			pid = harness_spawn_env(argv, env, log);
			snprintf(want, sizeof(want),
				 "coordinator from MASTER_ADDR (torchrun) is 'node0:29500': not a host name or address: it has a port");
		}
		int status = harness_wait(pid, (int)(REFUSED_WITHIN_S * 1000));
		double took = harness_now_s() - t0;
		slowest = took > slowest ? took : slowest;
		if (status == 0 || !harness_file_contains(log, want)) {
			harness_dump(log);
			fail_msg("trainer %zu (exit %d) did not say: %s", i, status, want);
		}
	}
	print_message("  slowest refusal, trainer start to exit: %.3f s\n", slowest);
	/* Refused before its hello: the daemon never heard of the job. */
	assert_false(harness_log_contains(&d, "job 'edges'"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- gradsyncd, from a raw Hello ----------------------------------------- */

/* The same coordinators in a Hello that no libgradsync checked: refused
 * at once (GS_EINVAL) naming the field and its variables, the job never
 * begun; with non-ASCII bytes, the Error and the log say them escaped. */
static void coordinator_in_raw_hello_refused_at_once(void **state)
{
	(void)state;
	struct harness_job job = { .id = "edges", .nodes = 2 };
	struct gs_test_daemon d;
	const char *extra[] = { JOIN_TIMEOUT, NULL };
	harness_job_daemon_start(&d, &job, 0, extra);
	double slowest = 0;
	for (size_t i = 0; i < NBAD + 1; i++) {
		char want[300];
		if (i < NBAD) {
			job.coordinator = bad[i].coordinator;
			snprintf(want, sizeof(want),
				 "job 'edges': the hello's coordinator (the trainer's GRADSYNC_COORDINATOR or MASTER_ADDR) '%s' is not a host name or address: it %s",
				 bad[i].coordinator, bad[i].why);
		} else {
			job.coordinator = "n\xc3\xb6" "de0";
			snprintf(want, sizeof(want),
				 "'n\\xc3\\xb6de0' is not a host name or address: it has a space, control or non-ASCII byte");
		}
		for (unsigned node = 0; node < 2; node++) {
			int fd = raw_connect(d.socket);
			double t0 = harness_now_s();
			raw_send_hello_job(fd, 0, GS_PROTOCOL_VERSION, &job, node);
			expect_ascii_error(fd, GS_EINVAL, want);
			double took = harness_now_s() - t0;
			slowest = took > slowest ? took : slowest;
			assert_true(took < REFUSED_WITHIN_S);
			close(fd);
		}
	}
	print_message("  slowest refusal, Hello to Error: %.3f s\n", slowest);
	assert_false(harness_log_contains(&d, "job 'edges' begins"));
	assert_true(harness_log_contains(&d, "'n\\xc3\\xb6de0'"));
	expect_ascii_log(&d);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- The node port ------------------------------------------------------- */

/* A TCP connection to 127.0.0.1:port; receives time out after 10 s. */
static int tcp_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_node_auth(int fd, const char *job_id)
{
	uint8_t nonce[32] = { 1 };
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = GS_NODE_PROTOCOL_VERSION;
	a.node_rank = 1;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.job_id = (char *)job_id;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	raw_send(fd, &m, NULL, 0);
}

/* What a node holds that every node must (gradsyncd's --help: the job's
 * settings at their defaults), written out here as a node says it. */
#define DEFAULT_SHARED "threshold=2097152 wire=fp16 op=average predivide=world fusion-buffer=4194304"

/* Strangers' bytes at the node port of a job's node 0: a NodeAuth naming
 * a job id of UTF-8, and a node (no cluster secret: it authenticates at
 * once) whose NodeHello names a host of UTF-8, which is refused. Neither
 * reaches the Error strings or the log raw. */
static void node_port_escapes_what_strangers_send(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = { .id = "edges", .nodes = 2, .local_size = { 1, 1 } };
	struct gs_test_daemon d;
	const char *extra[] = { JOIN_TIMEOUT, NULL };
	harness_job_daemon_start(&d, &job, 0, extra);
	char log[200];
	snprintf(log, sizeof(log), "%s/trainer.log", d.dir);
	const char *argv[] = { getenv("GS_TRAINER"), "--socket", d.socket, "--layout",
			       harness_layout("resnet50.txt"), "--steps", "1", NULL };
	pid_t trainer = harness_job_spawn(&job, 0, argv, log);
	harness_wait_for_text(d.log, "serving the rendezvous", 60);

	/* Whatever the lobby answers a job it does not serve (now "try
	 * again"), it says in printable ASCII. */
	int fd = tcp_connect(job.port);
	send_node_auth(fd, "caf\xc3\xa9");
	expect_only_ascii(fd);
	close(fd);

	fd = tcp_connect(job.port);
	send_node_auth(fd, "edges");
	Gradsync__Message *ch = raw_recv(fd);
	assert_non_null(ch);
	assert_int_equal(ch->body_case, GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE);
	assert_false(ch->node_challenge->has_secret);
	gradsync__message__free_unpacked(ch, NULL);
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = GS_NODE_PROTOCOL_VERSION;
	h.node_rank = 1;
	h.nodes = 2;
	h.local_size = 1;
	h.settings = DEFAULT_SHARED;
	h.host = "n\xc3\xb6" "de1";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	raw_send(fd, &m, NULL, 0);
	expect_ascii_error(fd, GS_EINVAL,
			   "node 1's NodeHello host (its --node-address) 'n\\xc3\\xb6de1' is not a host name or address: it has a space, control or non-ASCII byte");
	close(fd);

	/* Both refusals were logged, escaped. */
	harness_wait_for_text(d.log, "rendezvous: refused node 1 from 127.0.0.1", 10);
	harness_wait_for_text(d.log, "'n\\xc3\\xb6de1'", 10);
	expect_ascii_log(&d);
	assert_int_equal(harness_daemon_stop(&d), 0);
	assert_true(harness_wait(trainer, 60000) != 0); /* its node 1 never came */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(coordinator_from_environment_refused_at_once),
		cmocka_unit_test(coordinator_in_raw_hello_refused_at_once),
		cmocka_unit_test(node_port_escapes_what_strangers_send),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
