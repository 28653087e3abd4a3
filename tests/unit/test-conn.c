/*
 * daemon/serve/conn.c on its own: a set of connections on a loop of the
 * test's, one connection over a socketpair, and callbacks that record what
 * reaches them. No daemon, no engine: the framing, the set's bookkeeping,
 * the limits and deadlines, and the order of close, closed and the free.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "frame.h"
#include "errors.h"
#include "serve/conn.h"
#include "support/log.h"

struct fixture {
	uv_loop_t loop;
	struct gs_conn_set set;
	struct gs_conn *conn;
	int peer; /* the client's end */
	Gradsync__Message__BodyCase seen[8];
	int nseen;
	int closed;
	int closed_error; /* c->error when closed ran */
	int dispatched;   /* messages that reached dispatch */
	size_t reply;     /* > 0: dispatch answers each with a message this long */
};

static struct fixture *current;

/* An Error whose text is `len` letters, for a message of a size of the
 * test's choosing; numbered by its first letters. */
static void send_long(struct gs_conn *c, size_t len, int number)
{
	char *text = malloc(len + 1);
	assert_non_null(text);
	memset(text, 'x', len);
	text[len] = '\0';
	snprintf(text, len, "%08d", number);
	text[8] = 'x';
	Gradsync__Error err = GRADSYNC__ERROR__INIT;
	err.message = text;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_ERROR;
	m.error = &err;
	gs_conn_send(c, &m);
	free(text);
}

static void on_dispatch(struct gs_conn *c, const Gradsync__Message *m)
{
	assert_ptr_equal(c, current->conn);
	if (current->nseen < 8)
		current->seen[current->nseen++] = m->body_case;
	current->dispatched++;
	if (current->reply)
		send_long(c, current->reply, current->dispatched);
}

static void on_closed(struct gs_conn *c)
{
	assert_ptr_equal(c, current->conn);
	current->closed++;
	current->closed_error = c->error;
}

/* The connection's memory is freed by its poll handle's close callback:
 * until that has run, the loop has a handle left to close. */
static bool freed(struct fixture *f)
{
	return !uv_loop_alive(&f->loop);
}

static int setup(void **state)
{
	static struct fixture f;
	memset(&f, 0, sizeof(f));
	current = &f;
	gs_log_init(GS_LOG_ERROR);
	assert_int_equal(uv_loop_init(&f.loop), 0);
	gs_conn_set_init(&f.set, &f.loop, 1u << 20, 5, 5, 16, 1u << 20, 1u << 20);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	f.conn = gs_conn_create(&f.set, sv[0], 256, on_dispatch, on_closed);
	assert_non_null(f.conn);
	f.peer = sv[1];
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	while (f->set.head)
		gs_conn_close(f->set.head);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	if (f->peer >= 0)
		close(f->peer);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	return 0;
}

/* Runs the loop until nothing is left to do now. */
static void spin(struct fixture *f)
{
	for (int i = 0; i < 20; i++)
		uv_run(&f->loop, UV_RUN_NOWAIT);
}

static void send_message(int fd, Gradsync__Message__BodyCase body)
{
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	Gradsync__StatusRequest sr = GRADSYNC__STATUS_REQUEST__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	m.body_case = body;
	if (body == GRADSYNC__MESSAGE__BODY_HELLO)
		m.hello = &h;
	else
		m.status_request = &sr;
	uint8_t *buf;
	size_t len;
	assert_int_equal(gs_frame_encode(&m, &buf, &len), 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	free(buf);
}

/* The Error the connection sent before closing: its code. */
static int read_error(int fd)
{
	uint8_t buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf));
	assert_true(n >= GS_FRAME_HEADER_SIZE);
	uint32_t len = gs_frame_get_len(buf);
	assert_int_equal((size_t)n, GS_FRAME_HEADER_SIZE + len);
	Gradsync__Message *m;
	assert_int_equal(gs_frame_decode(buf + GS_FRAME_HEADER_SIZE, len, &m), 0);
	assert_int_equal(m->body_case, GRADSYNC__MESSAGE__BODY_ERROR);
	int code = m->error->code;
	gradsync__message__free_unpacked(m, NULL);
	return code;
}

static void joins_the_set(void **state)
{
	struct fixture *f = *state;
	assert_ptr_equal(f->set.head, f->conn);
	assert_int_equal(f->set.count, 1);
	assert_int_equal(f->conn->id, 1);
	assert_ptr_equal(f->conn->set, &f->set);
	assert_ptr_equal(f->conn->reader.budget, &f->set.budget);
}

static void frames_reach_dispatch_in_order(void **state)
{
	struct fixture *f = *state;
	send_message(f->peer, GRADSYNC__MESSAGE__BODY_HELLO);
	send_message(f->peer, GRADSYNC__MESSAGE__BODY_STATUS_REQUEST);
	spin(f);
	assert_int_equal(f->nseen, 2);
	assert_int_equal(f->seen[0], GRADSYNC__MESSAGE__BODY_HELLO);
	assert_int_equal(f->seen[1], GRADSYNC__MESSAGE__BODY_STATUS_REQUEST);
	assert_int_equal(f->closed, 0);
}

/* closed runs at once, the set forgets the connection at once, and its
 * memory is freed only from the loop. */
static void close_then_freed_from_the_loop(void **state)
{
	struct fixture *f = *state;
	gs_conn_close(f->conn);
	gs_conn_close(f->conn); /* safe twice */
	assert_int_equal(f->closed, 1);
	assert_int_equal(f->set.count, 0);
	assert_null(f->set.head);
	assert_false(freed(f));
	spin(f);
	assert_true(freed(f));
}

static void peer_hangup_closes(void **state)
{
	struct fixture *f = *state;
	shutdown(f->peer, SHUT_WR);
	spin(f);
	assert_int_equal(f->closed, 1);
	assert_int_equal(f->closed_error, 0); /* a close, not a failure */
	assert_true(freed(f));
	assert_int_equal(f->set.count, 0);
}

/* A connection that fails (here reset: the peer closes with our bytes
 * unread) closes with the errno, so that closed can say why; what the
 * layer above tells a TCP timeout from a goodbye by. */
static void failure_carries_its_errno(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(write(f->conn->fd, "x", 1), 1);
	close(f->peer);
	f->peer = -1;
	spin(f);
	assert_int_equal(f->closed, 1);
	assert_int_equal(f->closed_error, ECONNRESET);
	assert_true(freed(f));
}

static void frame_over_the_limit_is_refused(void **state)
{
	struct fixture *f = *state;
	uint8_t header[GS_FRAME_HEADER_SIZE];
	gs_frame_put_len(header, 257);
	assert_int_equal(write(f->peer, header, sizeof(header)), (ssize_t)sizeof(header));
	spin(f);
	assert_int_equal(read_error(f->peer), GS_ELIMIT);
	assert_int_equal(f->nseen, 0);
	assert_int_equal(f->closed, 1);
	assert_true(freed(f));
}

/* A trainer's frames may be as long as the set allows. */
static void identified_trainer_gets_the_set_limit(void **state)
{
	struct fixture *f = *state;
	gs_conn_identified(f->conn, GS_CONN_TRAINER);
	assert_int_equal(f->conn->reader.max_frame, 1u << 20);
	assert_int_equal(f->conn->reader.max_fds, GS_CONN_TRAINER_FDS);
}

static void hello_deadline_drops_a_timed_client(void **state)
{
	struct fixture *f = *state;
	f->conn->hello_deadline_ns = 1000;
	gs_conn_check_deadlines(f->conn, 2000);
	assert_int_equal(f->closed, 0); /* untimed: deadlines do not apply */
	f->conn->timed = true;
	gs_conn_check_deadlines(f->conn, 999);
	assert_int_equal(f->closed, 0);
	gs_conn_check_deadlines(f->conn, 1000);
	assert_int_equal(f->closed, 1);
	assert_int_equal(read_error(f->peer), GS_ETIMEDOUT);
	spin(f);
	assert_true(freed(f));
}

/* Frames of the connection's peer: reads what there is now, counting
 * whole frames and checking that each Error carries its number in order;
 * returns how many whole frames it read. */
static int read_replies(int fd, int *next)
{
	static uint8_t buf[1 << 20];
	static size_t have;
	int got = 0;
	ssize_t n;
	while ((n = recv(fd, buf + have, sizeof(buf) - have, MSG_DONTWAIT)) > 0) {
		have += (size_t)n;
		size_t off = 0;
		while (have - off >= GS_FRAME_HEADER_SIZE &&
		       have - off >= GS_FRAME_HEADER_SIZE + gs_frame_get_len(buf + off)) {
			uint32_t len = gs_frame_get_len(buf + off);
			Gradsync__Message *m;
			assert_int_equal(gs_frame_decode(buf + off + GS_FRAME_HEADER_SIZE, len, &m), 0);
			assert_int_equal(m->body_case, GRADSYNC__MESSAGE__BODY_ERROR);
			assert_int_equal(atoi(m->error->message), ++*next);
			gradsync__message__free_unpacked(m, NULL);
			off += GS_FRAME_HEADER_SIZE + len;
			got++;
		}
		memmove(buf, buf + off, have - off);
		have -= off;
	}
	return got;
}

/* A peer that pipelines requests and reads none of the answers is not
 * read past a sixteenth of the queue's limit (64 KiB of 1 MiB): its
 * requests wait, its frame clock stops, and once it reads, every request
 * is answered, in order. */
static void unread_replies_pause_reading(void **state)
{
	struct fixture *f = *state;
	enum { REQUESTS = 200, REPLY = 16 << 10 };
	f->reply = REPLY;
	int small = 4096; /* the kernel's buffer, as small as it goes */
	setsockopt(f->conn->fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	setsockopt(f->peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	for (int i = 0; i < REQUESTS; i++)
		send_message(f->peer, GRADSYNC__MESSAGE__BODY_STATUS_REQUEST);
	spin(f);
	int answered = f->dispatched;
	print_message("paused after %d of %d requests, %zu bytes queued\n", answered, REQUESTS,
		      f->conn->out_bytes);
	assert_true(gs_conn_paused(f->conn));
	assert_true(answered < REQUESTS / 4);
	assert_true(f->conn->out_bytes <= (1u << 20) / GS_CONN_PAUSE_SHARE + REPLY + 64);
	/* Held requests are this side's wait, not a frame the peer left
	 * unfinished. */
	f->conn->timed = true;
	gs_conn_check_deadlines(f->conn, gs_now_ns() + 3600 * 1000000000ull);
	assert_int_equal(f->closed, 0);
	int next = 0, read = 0;
	for (int round = 0; round < 10000 && read < REQUESTS; round++) {
		read += read_replies(f->peer, &next);
		spin(f);
	}
	assert_int_equal(read, REQUESTS);
	assert_int_equal(f->dispatched, REQUESTS);
	assert_false(gs_conn_paused(f->conn));
	assert_int_equal(f->closed, 0);
}

/* stderr into a file for the time of a call: what the log said. */
static int capture_begin(char *path, size_t n)
{
	snprintf(path, n, "/tmp/gs-test-conn-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(stderr);
	int saved = dup(2);
	assert_int_equal(dup2(fd, 2), 2);
	close(fd);
	return saved;
}

static void capture_end(int saved, const char *path, char *out, size_t n)
{
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t got = fread(out, 1, n - 1, f);
	out[got] = '\0';
	fclose(f);
	unlink(path);
	fprintf(stderr, "%s", out);
}

/* Messages the daemon sends unasked to a peer that reads none: past
 * --max-queued-bytes the peer is dropped, the log naming the setting, and
 * the queue never holds more than the limit. */
static void queue_past_its_limit_drops_the_peer(void **state)
{
	struct fixture *f = *state;
	gs_log_init(GS_LOG_WARN);
	char path[64], log[4096];
	int saved = capture_begin(path, sizeof(path));
	int sent = 0;
	size_t most = 0;
	while (!f->closed && sent < 1000) {
		send_long(f->conn, 60 << 10, ++sent);
		if (!f->closed && f->conn->out_bytes > most)
			most = f->conn->out_bytes;
	}
	capture_end(saved, path, log, sizeof(log));
	print_message("dropped at message %d, %zu bytes queued at most\n", sent, most);
	assert_int_equal(f->closed, 1);
	assert_true(most <= 1u << 20);
	assert_true(sent < 40);
	assert_non_null(strstr(log, "(--max-queued-bytes)"));
	spin(f);
	assert_true(freed(f));
}

/* The layer above's deadline drops a timed client with its words. */
static void own_deadline_drops_a_timed_client(void **state)
{
	struct fixture *f = *state;
	f->conn->timed = true;
	gs_conn_set_deadline(f->conn, 1000, "no tensors within %d s (--register-timeout)", 7);
	gs_conn_check_deadlines(f->conn, 999);
	assert_int_equal(f->closed, 0);
	gs_conn_set_deadline(f->conn, 0, "cleared");
	gs_conn_check_deadlines(f->conn, 5000);
	assert_int_equal(f->closed, 0);
	gs_conn_set_deadline(f->conn, 1000, "no tensors within %d s (--register-timeout)", 7);
	gs_conn_check_deadlines(f->conn, 1000);
	assert_int_equal(f->closed, 1);
	uint8_t buf[4096];
	ssize_t n = read(f->peer, buf, sizeof(buf));
	assert_true(n > GS_FRAME_HEADER_SIZE);
	Gradsync__Message *m;
	assert_int_equal(gs_frame_decode(buf + GS_FRAME_HEADER_SIZE, (size_t)n - GS_FRAME_HEADER_SIZE, &m), 0);
	assert_int_equal(m->error->code, GS_ETIMEDOUT);
	assert_string_equal(m->error->message, "no tensors within 7 s (--register-timeout)");
	gradsync__message__free_unpacked(m, NULL);
}

static void name_carries_the_label(void **state)
{
	struct fixture *f = *state;
	char want[96];
	snprintf(want, sizeof(want), "pid %d uid %u", (int)getpid(), (unsigned)getuid());
	assert_string_equal(gs_conn_name(f->conn), want);
	snprintf(f->conn->label, sizeof(f->conn->label), "local rank 3");
	snprintf(want, sizeof(want), "pid %d uid %u (local rank 3)", (int)getpid(),
		 (unsigned)getuid());
	assert_string_equal(gs_conn_name(f->conn), want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(joins_the_set, setup, teardown),
		cmocka_unit_test_setup_teardown(frames_reach_dispatch_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(close_then_freed_from_the_loop, setup, teardown),
		cmocka_unit_test_setup_teardown(peer_hangup_closes, setup, teardown),
		cmocka_unit_test_setup_teardown(failure_carries_its_errno, setup, teardown),
		cmocka_unit_test_setup_teardown(frame_over_the_limit_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(identified_trainer_gets_the_set_limit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(hello_deadline_drops_a_timed_client, setup,
						teardown),
		cmocka_unit_test_setup_teardown(unread_replies_pause_reading, setup, teardown),
		cmocka_unit_test_setup_teardown(queue_past_its_limit_drops_the_peer, setup,
						teardown),
		cmocka_unit_test_setup_teardown(own_deadline_drops_a_timed_client, setup,
						teardown),
		cmocka_unit_test_setup_teardown(name_carries_the_label, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
