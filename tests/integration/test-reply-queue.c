/*
 * A control client that pipelines status and metrics requests and never
 * reads the answers, against a real gradsyncd: the daemon stops reading
 * it once a sixteenth of --max-queued-bytes waits for it, so its
 * resident memory stays bounded, other clients are answered meanwhile,
 * and once the flooder reads, every request it sent is answered, in
 * order (nothing it handed over is lost).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "frame.h"
#include "gradsync.h"
#include "harness.h"

/* Frames of requests, status and metrics in turn, REQUESTS of them. */
struct flood {
	uint8_t *buf;
	size_t len;
	size_t *ends; /* where request i ends in buf */
	size_t n;
};

static void append(struct flood *f, const Gradsync__Message *m)
{
	uint8_t *frame;
	size_t len;
	assert_int_equal(gs_frame_encode(m, &frame, &len), 0);
	memcpy(f->buf + f->len, frame, len);
	f->len += len;
	f->ends[f->n++] = f->len;
	free(frame);
}

static void flood_init(struct flood *f, size_t requests)
{
	f->buf = malloc(requests * 16);
	f->ends = malloc(requests * sizeof(*f->ends));
	assert_non_null(f->buf);
	assert_non_null(f->ends);
	f->len = f->n = 0;
	Gradsync__StatusRequest sr = GRADSYNC__STATUS_REQUEST__INIT;
	Gradsync__MetricsRequest mr = GRADSYNC__METRICS_REQUEST__INIT;
	for (size_t i = 0; i < requests; i++) {
		Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
		if (i % 2 == 0) {
			m.body_case = GRADSYNC__MESSAGE__BODY_STATUS_REQUEST;
			m.status_request = &sr;
		} else {
			m.body_case = GRADSYNC__MESSAGE__BODY_METRICS_REQUEST;
			m.metrics_request = &mr;
		}
		append(f, &m);
	}
}

/* A control client's Hello, answered with a Welcome. */
static int control_client(const char *socket)
{
	int fd = raw_connect(socket);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.protocol_version = GS_PROTOCOL_VERSION;
	h.role = GRADSYNC__ROLE__ROLE_CONTROL;
	h.pid = (uint64_t)getpid();
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &h;
	raw_send(fd, &m, NULL, 0);
	Gradsync__Message *r = raw_recv(fd);
	assert_non_null(r);
	assert_int_equal(r->body_case, GRADSYNC__MESSAGE__BODY_WELCOME);
	gradsync__message__free_unpacked(r, NULL);
	return fd;
}

/* Sends as much of the flood as the socket takes within limit_s, in
 * sends of whole requests of at most 4 KiB, which a Unix stream socket
 * takes whole or not at all (a frame left half sent would be the
 * client's own fault, and dropped at --frame-timeout). Samples the
 * daemon's resident memory meanwhile: its most, in *peak. Returns the
 * requests sent. */
static size_t pour(int fd, const struct flood *f, pid_t daemon, double limit_s, long *peak)
{
	size_t off = 0, whole = 0;
	double t0 = harness_now_s();
	while (whole < f->n) {
		size_t end = whole;
		while (end + 1 < f->n && f->ends[end + 1] - off <= 4096)
			end++;
		ssize_t n = send(fd, f->buf + off, f->ends[end] - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0)
			off += (size_t)n;
		else
			assert_true(n < 0 && errno == EAGAIN);
		while (whole < f->n && f->ends[whole] <= off)
			whole++;
		long r = harness_rss_kib(daemon);
		*peak = r > *peak ? r : *peak;
		bool mid_frame = off != (whole ? f->ends[whole - 1] : 0);
		double t = harness_now_s() - t0;
		if (mid_frame && t > limit_s + 20)
			fail_msg("a send of whole requests was taken in part, and the rest never");
		if (n < 0 && !mid_frame && t > limit_s)
			break;
		if (n < 0)
			poll(&(struct pollfd){ .fd = fd, .events = POLLOUT }, 1, 20);
	}
	return whole;
}

/* Reads the answers to `sent` requests: a StatusReply and a MetricsReply
 * in turn, each within 30 s. Returns their bytes. */
static size_t answers(int fd, size_t sent)
{
	size_t bytes = 0;
	for (size_t i = 0; i < sent; i++) {
		Gradsync__Message *m = raw_recv(fd);
		if (!m)
			fail_msg("request %zu of %zu has no answer (the connection ended or was silent)",
				 i, sent);
		Gradsync__Message__BodyCase want = i % 2 == 0 ? GRADSYNC__MESSAGE__BODY_STATUS_REPLY
							      : GRADSYNC__MESSAGE__BODY_METRICS_REPLY;
		if (m->body_case != want)
			fail_msg("answer %zu is message %d, not %d%s%s", i, (int)m->body_case, (int)want,
				 m->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? ": " : "",
				 m->body_case == GRADSYNC__MESSAGE__BODY_ERROR ? m->error->message : "");
		bytes += gradsync__message__get_packed_size(m) + GS_FRAME_HEADER_SIZE;
		gradsync__message__free_unpacked(m, NULL);
	}
	return bytes;
}

static void flood_stalls_only_the_flooder(void **state)
{
	(void)state;
	enum { REQUESTS = 60000 };
	/* Growth allowed: the flooder's sixteenth of the default 16 MiB
	 * (1 MiB), its reader, and what the allocator keeps around them.
	 * All the answers of the flood held at once are some 170 MiB. */
	const long bound_kib = 32 << 10;
	struct gs_test_daemon d;
	static struct harness_job job = { .id = "busy", .local_size = { 2 } };
	harness_daemon_start(&d, NULL);
	int trainer = raw_connect(d.socket);
	raw_hello_job(trainer, 0, &job); /* a job for status to describe */
	struct flood f;
	flood_init(&f, REQUESTS);
	int fd = control_client(d.socket);
	long rss0 = harness_rss_kib(d.pid), peak = rss0;
	size_t sent = pour(fd, &f, d.pid, 3.0, &peak);
	/* Others are served while the flooder's answers wait. */
	double worst = 0;
	for (int i = 0; i < 5; i++) {
		double took = harness_status_seconds(d.socket);
		worst = took > worst ? took : worst;
		long r = harness_rss_kib(d.pid);
		peak = r > peak ? r : peak;
	}
	/* The flooder reads at last: every request it sent is answered. */
	struct timeval tv = { 30, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	double t0 = harness_now_s();
	size_t bytes = answers(fd, sent);
	print_message("the flooder sent %zu of %d requests (%zu bytes) without reading; resident "
		      "memory %ld KiB, at most %ld KiB meanwhile (+%ld KiB); another client's "
		      "status took %.3f s at most; then all %zu answers (%zu bytes) came in %.2f s\n",
		      sent, REQUESTS, sent ? f.ends[sent - 1] : 0, rss0, peak, peak - rss0, worst,
		      sent, bytes, harness_now_s() - t0);
	assert_true(sent > 0);
	assert_true(worst < 5.0);
	/* AddressSanitizer's quarantine keeps freed answers resident: there
	 * the answers' order and number are what is checked. */
	if (!getenv("ASAN_OPTIONS"))
		assert_true(peak - rss0 < bound_kib);
	/* It is served as before. */
	raw_send_bytes(fd, f.buf, f.ends[1]);
	assert_true(answers(fd, 2) > 0);
	close(fd);
	close(trainer);
	assert_true(harness_daemon_alive(&d));
	free(f.buf);
	free(f.ends);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(flood_stalls_only_the_flooder),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
