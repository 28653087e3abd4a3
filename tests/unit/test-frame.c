/*
 * The framing of common/frame.c over a socketpair, no daemon needed: whole
 * and split frames, the size limit, descriptors, end of stream, and the
 * limits a daemon puts on its readers (memory, descriptors).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "frame.h"

#define MAX_FRAME (16u << 20)

struct pair {
	int w; /* the writer's end */
	int r; /* the reader's end */
	struct gs_frame_reader reader;
};

static int setup(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));
	int sv[2];
	assert_non_null(p);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	p->w = sv[0];
	p->r = sv[1];
	gs_frame_reader_init(&p->reader, MAX_FRAME);
	*state = p;
	return 0;
}

static int teardown(void **state)
{
	struct pair *p = *state;
	gs_frame_reader_destroy(&p->reader);
	if (p->w >= 0)
		close(p->w);
	close(p->r);
	free(p);
	return 0;
}

/* ---- helpers ----------------------------------------------------------- */

static void encode_hello(uint32_t rank, const char *job, uint8_t **buf,
			 size_t *len)
{
	Gradsync__Hello hello = GRADSYNC__HELLO__INIT;
	hello.protocol_version = 1;
	hello.role = GRADSYNC__ROLE__ROLE_TRAINER;
	hello.local_rank = rank;
	hello.pid = 4242;
	hello.job_id = (char *)job;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &hello;
	assert_int_equal(gs_frame_encode(&m, buf, len), 0);
}

static void write_all(int fd, const uint8_t *buf, size_t len, const int *fds,
		      size_t nfds)
{
	size_t off = 0;
	while (off < len) {
		ssize_t n = gs_frame_write_some(fd, buf + off, len - off,
						off ? NULL : fds, off ? 0 : nfds);
		assert_true(n > 0);
		off += (size_t)n;
	}
}

/* Fills until a whole frame is there; returns its decoded message. */
static Gradsync__Message *read_message(struct pair *p)
{
	const uint8_t *payload;
	size_t len;
	int r;
	while ((r = gs_frame_reader_next(&p->reader, &payload, &len)) == 0) {
		struct pollfd pfd = { .fd = p->r, .events = POLLIN };
		assert_int_equal(poll(&pfd, 1, 5000), 1);
		assert_true(gs_frame_reader_fill(&p->reader, p->r) > 0);
	}
	assert_int_equal(r, 1);
	Gradsync__Message *m = gradsync__message__unpack(NULL, len, payload);
	assert_non_null(m);
	gs_frame_reader_consume(&p->reader);
	return m;
}

static void assert_hello(Gradsync__Message *m, uint32_t rank, const char *job)
{
	assert_int_equal(m->body_case, GRADSYNC__MESSAGE__BODY_HELLO);
	assert_int_equal(m->hello->protocol_version, 1);
	assert_int_equal(m->hello->role, GRADSYNC__ROLE__ROLE_TRAINER);
	assert_int_equal(m->hello->local_rank, rank);
	assert_int_equal(m->hello->pid, 4242);
	assert_string_equal(m->hello->job_id, job);
	gradsync__message__free_unpacked(m, NULL);
}

static int make_memfd(void)
{
	int fd = memfd_create("test-frame", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4096), 0);
	return fd;
}

static void send_with_fds(struct pair *p, const int *fds, size_t nfds)
{
	uint8_t *buf;
	size_t len;
	encode_hello(1, "fds", &buf, &len);
	write_all(p->w, buf, len, fds, nfds);
	free(buf);
	assert_hello(read_message(p), 1, "fds");
}

/* ---- tests ------------------------------------------------------------- */

static void test_roundtrip(void **state)
{
	struct pair *p = *state;
	uint8_t *buf;
	size_t len;
	encode_hello(3, "job-7", &buf, &len);
	assert_int_equal(gs_frame_get_len(buf), len - GS_FRAME_HEADER_SIZE);
	write_all(p->w, buf, len, NULL, 0);
	free(buf);
	assert_hello(read_message(p), 3, "job-7");
	assert_int_equal(p->reader.len, 0);
}

/* One byte per write, a fill after each: the frame appears only when its
 * last byte is in. */
static void test_byte_by_byte(void **state)
{
	struct pair *p = *state;
	uint8_t *buf;
	size_t len;
	const uint8_t *payload;
	size_t plen;
	encode_hello(5, "split", &buf, &len);
	for (size_t i = 0; i < len; i++) {
		assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &plen), 0);
		assert_int_equal(gs_frame_write_some(p->w, buf + i, 1, NULL, 0), 1);
		assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), 1);
	}
	free(buf);
	assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &plen), 1);
	assert_int_equal(plen, len - GS_FRAME_HEADER_SIZE);
	assert_hello(read_message(p), 5, "split");
	/* Nothing more: the reader says so without blocking. */
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), -EAGAIN);
}

/* Two frames and a half in one write. */
static void test_two_frames_one_write(void **state)
{
	struct pair *p = *state;
	uint8_t *a, *b, *c;
	size_t alen, blen, clen;
	encode_hello(1, "first", &a, &alen);
	encode_hello(2, "second", &b, &blen);
	encode_hello(3, "third", &c, &clen);
	size_t half = clen / 2;
	uint8_t *both = malloc(alen + blen + half);
	assert_non_null(both);
	memcpy(both, a, alen);
	memcpy(both + alen, b, blen);
	memcpy(both + alen + blen, c, half);
	write_all(p->w, both, alen + blen + half, NULL, 0);
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r),
			 (ssize_t)(alen + blen + half));
	assert_hello(read_message(p), 1, "first");
	assert_hello(read_message(p), 2, "second");
	const uint8_t *payload;
	size_t plen;
	assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &plen), 0);
	write_all(p->w, c + half, clen - half, NULL, 0);
	assert_hello(read_message(p), 3, "third");
	free(a);
	free(b);
	free(c);
	free(both);
}

/* A header announcing max_frame + 1 is refused before the reader
 * allocates anything near that size. */
static void test_oversized(void **state)
{
	struct pair *p = *state;
	uint8_t hdr[GS_FRAME_HEADER_SIZE + 16] = { 0 };
	gs_frame_put_len(hdr, MAX_FRAME + 1);
	write_all(p->w, hdr, sizeof(hdr), NULL, 0);
	ssize_t n = gs_frame_reader_fill(&p->reader, p->r);
	assert_int_equal(n, -EMSGSIZE);
	const uint8_t *payload;
	size_t plen;
	assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &plen), -EMSGSIZE);
	assert_true(p->reader.cap < MAX_FRAME / 16);
	/* And it stays refused: no fill grows the buffer for it. */
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), -EMSGSIZE);
	assert_true(p->reader.cap < MAX_FRAME / 16);
}

/* Exactly max_frame is accepted (the header alone says so). */
static void test_max_frame_header_ok(void **state)
{
	struct pair *p = *state;
	uint8_t hdr[GS_FRAME_HEADER_SIZE];
	gs_frame_put_len(hdr, MAX_FRAME);
	write_all(p->w, hdr, sizeof(hdr), NULL, 0);
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), GS_FRAME_HEADER_SIZE);
	const uint8_t *payload;
	size_t plen;
	assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &plen), 0);
}

/* A memfd sent with a frame arrives as a descriptor of the same file. */
static void test_fd_passing(void **state)
{
	struct pair *p = *state;
	int fd = make_memfd();
	send_with_fds(p, &fd, 1);
	assert_int_equal(p->reader.nfds, 1);
	int got = -1;
	assert_int_equal(gs_frame_reader_take_fds(&p->reader, &got, 1), 0);
	assert_int_equal(p->reader.nfds, 0);
	assert_true(got >= 0 && got != fd);

	struct stat a, b;
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(fstat(got, &b), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_int_equal(a.st_dev, b.st_dev);
	/* Written through one, read through the other. */
	static const char msg[] = "gradients";
	char back[sizeof(msg)] = { 0 };
	assert_int_equal(pwrite(fd, msg, sizeof(msg), 100), (ssize_t)sizeof(msg));
	assert_int_equal(pread(got, back, sizeof(back), 100), (ssize_t)sizeof(back));
	assert_memory_equal(back, msg, sizeof(msg));
	/* Received descriptors are close-on-exec. */
	assert_true(fcntl(got, F_GETFD) & FD_CLOEXEC);
	close(fd);
	close(got);
}

/* Descriptors keep their order across frames. */
static void test_fd_order(void **state)
{
	struct pair *p = *state;
	int fds[3] = { make_memfd(), make_memfd(), make_memfd() };
	for (int i = 0; i < 3; i++)
		assert_int_equal(ftruncate(fds[i], 1000 * (i + 1)), 0);
	send_with_fds(p, fds, 2);
	send_with_fds(p, fds + 2, 1);
	int got[3];
	assert_int_equal(gs_frame_reader_take_fds(&p->reader, got, 3), 0);
	for (int i = 0; i < 3; i++) {
		struct stat st;
		assert_int_equal(fstat(got[i], &st), 0);
		assert_int_equal(st.st_size, 1000 * (i + 1));
		close(got[i]);
		close(fds[i]);
	}
}

static void test_take_too_many(void **state)
{
	struct pair *p = *state;
	int fd = make_memfd();
	send_with_fds(p, &fd, 1);
	int got[2] = { -1, -1 };
	assert_int_equal(gs_frame_reader_take_fds(&p->reader, got, 2), -EBADMSG);
	/* Nothing was taken. */
	assert_int_equal(p->reader.nfds, 1);
	assert_int_equal(got[0], -1);
	assert_int_equal(gs_frame_reader_take_fds(&p->reader, got, 1), 0);
	close(got[0]);
	close(fd);
}

static void test_destroy_closes_fds(void **state)
{
	struct pair *p = *state;
	int fds[2] = { make_memfd(), make_memfd() };
	send_with_fds(p, fds, 2);
	assert_int_equal(p->reader.nfds, 2);
	int queued[2] = { p->reader.fds[0], p->reader.fds[1] };
	assert_true(fcntl(queued[0], F_GETFD) >= 0);
	assert_true(fcntl(queued[1], F_GETFD) >= 0);
	gs_frame_reader_destroy(&p->reader);
	for (int i = 0; i < 2; i++) {
		errno = 0;
		assert_int_equal(fcntl(queued[i], F_GETFD), -1);
		assert_int_equal(errno, EBADF);
	}
	close(fds[0]);
	close(fds[1]);
	/* teardown destroys again: a destroyed reader is an empty one. */
	gs_frame_reader_init(&p->reader, MAX_FRAME);
}

static void test_eof(void **state)
{
	struct pair *p = *state;
	uint8_t *buf;
	size_t len;
	encode_hello(0, "last", &buf, &len);
	write_all(p->w, buf, len, NULL, 0);
	free(buf);
	close(p->w);
	p->w = -1;
	/* The frame before the end is still delivered, then 0. */
	assert_hello(read_message(p), 0, "last");
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), 0);
}

/* A 1 MiB frame through a socket that holds far less: the writer and the
 * reader take turns, non-blocking, until the frame is whole. */
static void test_large_frame(void **state)
{
	struct pair *p = *state;
	size_t size = 1u << 20;
	char *text = malloc(size + 1);
	assert_non_null(text);
	for (size_t i = 0; i < size; i++)
		text[i] = (char)('a' + i * 7 % 26);
	text[size] = '\0';
	Gradsync__Error err = GRADSYNC__ERROR__INIT;
	err.code = -6;
	err.message = text;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_ERROR;
	m.error = &err;
	uint8_t *buf;
	size_t len;
	assert_int_equal(gs_frame_encode(&m, &buf, &len), 0);

	size_t off = 0;
	unsigned fills = 0;
	const uint8_t *payload;
	size_t plen;
	while (gs_frame_reader_next(&p->reader, &payload, &plen) == 0) {
		if (off < len) {
			ssize_t n = gs_frame_write_some(p->w, buf + off, len - off, NULL, 0);
			assert_true(n > 0 || n == -EAGAIN);
			if (n > 0)
				off += (size_t)n;
		}
		ssize_t n = gs_frame_reader_fill(&p->reader, p->r);
		assert_true(n > 0 || n == -EAGAIN);
		fills += n > 0;
	}
	assert_true(fills > 1);
	assert_int_equal(plen, len - GS_FRAME_HEADER_SIZE);
	Gradsync__Message *got = gradsync__message__unpack(NULL, plen, payload);
	assert_non_null(got);
	assert_int_equal(got->body_case, GRADSYNC__MESSAGE__BODY_ERROR);
	assert_int_equal(got->error->code, -6);
	assert_int_equal(strlen(got->error->message), size);
	assert_memory_equal(got->error->message, text, size);
	gradsync__message__free_unpacked(got, NULL);
	gs_frame_reader_consume(&p->reader);
	assert_int_equal(p->reader.len, 0);
	free(buf);
	free(text);
}

/* ---- limits: memory that follows the bytes, descriptors that fit ------ */

/* Descriptors open in this process, counted by the kernel. */
static unsigned open_fds(void)
{
	unsigned n = 0;
	for (int fd = 0; fd < 4096; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* A header that claims the largest frame, then a few bytes: the buffer
 * holds what came, not what was claimed (the old reader allocated the
 * claim at once, which let idle clients pin max-frame bytes each). */
static void test_claim_allocates_nothing(void **state)
{
	struct pair *p = *state;
	uint8_t bytes[4 + 10] = { 0 };
	gs_frame_put_len(bytes, MAX_FRAME);
	write_all(p->w, bytes, sizeof(bytes), NULL, 0);
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), (ssize_t)sizeof(bytes));
	assert_true(p->reader.cap <= (128u << 10));
	const uint8_t *payload;
	size_t len;
	assert_int_equal(gs_frame_reader_next(&p->reader, &payload, &len), 0);
}

/* A budget of 256 KiB shared by the reader: a 1 MiB frame fills it and
 * the reader says so, its charge is its buffer, and destroying it gives
 * everything back. Below the budget, memory stays within twice what came. */
static void test_budget_bytes(void **state)
{
	struct pair *p = *state;
	struct gs_frame_budget budget = { 0, 8, 0, 256u << 10 };
	p->reader.budget = &budget;
	size_t size = 1u << 20;
	uint8_t *buf = calloc(1, size);
	assert_non_null(buf);
	gs_frame_put_len(buf, (uint32_t)(size - GS_FRAME_HEADER_SIZE));
	size_t off = 0;
	ssize_t n = 0;
	for (unsigned turns = 0; n != -ENOBUFS; turns++) {
		assert_true(turns < 100000);
		if (off < size) {
			ssize_t w = gs_frame_write_some(p->w, buf + off, size - off, NULL, 0);
			assert_true(w > 0 || w == -EAGAIN);
			off += w > 0 ? (size_t)w : 0;
		}
		n = gs_frame_reader_fill(&p->reader, p->r);
		assert_true(n > 0 || n == -EAGAIN || n == -ENOBUFS);
		assert_int_equal(budget.bytes, p->reader.cap);
		assert_true(budget.bytes <= budget.max_bytes);
		assert_true(p->reader.cap <= 2 * p->reader.len + (64u << 10));
	}
	assert_true(p->reader.len < size);
	gs_frame_reader_destroy(&p->reader);
	assert_int_equal(budget.bytes, 0);
	gs_frame_reader_init(&p->reader, MAX_FRAME);
	free(buf);
}

/* max_fds 0: a descriptor sent anyway is closed by the kernel before it
 * reaches this process, and the fill says so. */
static void test_no_fds_allowed(void **state)
{
	struct pair *p = *state;
	p->reader.max_fds = 0;
	int fd = make_memfd();
	unsigned before = open_fds();
	uint8_t *buf;
	size_t len;
	encode_hello(1, "fds", &buf, &len);
	write_all(p->w, buf, len, &fd, 1);
	free(buf);
	assert_int_equal(gs_frame_reader_fill(&p->reader, p->r), -EMFILE);
	assert_int_equal(p->reader.nfds, 0);
	assert_int_equal(open_fds(), before);
	close(fd);
}

/* Two readers share a budget of three descriptors: the second gets what
 * is left and no more, and taking descriptors gives budget back. */
static void test_budget_fds(void **state)
{
	struct pair *p = *state;
	struct gs_frame_budget budget = { 0, 3, 0, 1u << 30 };
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	struct gs_frame_reader other;
	gs_frame_reader_init(&other, MAX_FRAME);
	p->reader.budget = &budget;
	other.budget = &budget;
	int fds[2] = { make_memfd(), make_memfd() };
	send_with_fds(p, fds, 2);
	assert_int_equal(budget.fds, 2);
	uint8_t *buf;
	size_t len;
	encode_hello(1, "fds", &buf, &len);
	write_all(sv[0], buf, len, fds, 2);
	free(buf);
	unsigned before = open_fds();
	assert_int_equal(gs_frame_reader_fill(&other, sv[1]), -EMFILE);
	assert_int_equal(other.nfds, 1);
	assert_int_equal(open_fds(), before + 1);
	assert_int_equal(budget.fds, 3);
	int got[2];
	assert_int_equal(gs_frame_reader_take_fds(&p->reader, got, 2), 0);
	assert_int_equal(budget.fds, 1);
	close(got[0]);
	close(got[1]);
	gs_frame_reader_destroy(&other);
	assert_int_equal(budget.fds, 0);
	close(sv[0]);
	close(sv[1]);
	close(fds[0]);
	close(fds[1]);
}

/* A number too wide for its field loses its high bits in protobuf-c: the
 * decoded message no longer encodes to the payload's length, and
 * gs_frame_decode refuses it; a canonical payload passes. */
static void test_decode_refuses_truncated_numbers(void **state)
{
	(void)state;
	static const uint8_t wide_enum[] = { 0x0a, 8, 0x08, 0x01, 0x10, 0x82, 0x80, 0x80, 0x80, 0x10 };
	static const uint8_t wide_rank[] = { 0x0a, 8, 0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01 };
	static const uint8_t canonical[] = { 0x0a, 4, 0x08, 0x01, 0x10, 0x02 };
	static const uint8_t junk[] = { 0xff, 0xff, 0xff };
	Gradsync__Message *m;
	assert_int_equal(gs_frame_decode(wide_enum, sizeof(wide_enum), &m), -ERANGE);
	assert_null(m);
	/* local_rank is 64-bit: 2^42 is kept, and refused later by range. */
	assert_int_equal(gs_frame_decode(wide_rank, sizeof(wide_rank), &m), 0);
	assert_int_equal(m->hello->local_rank, UINT64_C(1) << 42);
	gradsync__message__free_unpacked(m, NULL);
	assert_int_equal(gs_frame_decode(canonical, sizeof(canonical), &m), 0);
	assert_int_equal(m->hello->role, GRADSYNC__ROLE__ROLE_CONTROL);
	gradsync__message__free_unpacked(m, NULL);
	assert_int_equal(gs_frame_decode(junk, sizeof(junk), &m), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_byte_by_byte, setup, teardown),
		cmocka_unit_test_setup_teardown(test_two_frames_one_write, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_frame_header_ok, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fd_passing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fd_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_take_too_many, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_closes_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof, setup, teardown),
		cmocka_unit_test_setup_teardown(test_large_frame, setup, teardown),
		cmocka_unit_test_setup_teardown(test_claim_allocates_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_fds_allowed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget_fds, setup, teardown),
		cmocka_unit_test(test_decode_refuses_truncated_numbers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
