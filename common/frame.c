#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK (64u << 10)

void gs_frame_reader_init(struct gs_frame_reader *r, size_t max_frame)
{
	memset(r, 0, sizeof(*r));
	r->max_frame = max_frame;
	r->max_fds = GS_FRAME_FD_QUEUE;
}

void gs_frame_reader_destroy(struct gs_frame_reader *r)
{
	for (size_t i = 0; i < r->nfds; i++)
		close(r->fds[i]);
	if (r->budget) {
		r->budget->fds -= r->nfds;
		r->budget->bytes -= r->cap;
	}
	free(r->buf);
	memset(r, 0, sizeof(*r));
}

/* The bytes the frame at the front needs in the buffer, or 0 while its
 * header is incomplete. */
static int front_frame_size(const struct gs_frame_reader *r, size_t *size)
{
	if (r->len < GS_FRAME_HEADER_SIZE) {
		*size = 0;
		return 0;
	}
	uint32_t payload = gs_frame_get_len(r->buf);
	if (payload > r->max_frame)
		return -EMSGSIZE;
	*size = GS_FRAME_HEADER_SIZE + (size_t)payload;
	return 0;
}

/* Resizes the buffer to cap bytes (never below len), charging the budget. */
static int resize(struct gs_frame_reader *r, size_t cap)
{
	struct gs_frame_budget *b = r->budget;
	if (b && cap > r->cap && b->bytes + (cap - r->cap) > b->max_bytes)
		return -ENOBUFS;
	uint8_t *buf = realloc(r->buf, cap);
	if (!buf)
		return -ENOMEM;
	if (b)
		b->bytes = b->bytes - r->cap + cap;
	r->buf = buf;
	r->cap = cap;
	return 0;
}

static int reserve(struct gs_frame_reader *r, size_t want)
{
	return r->cap >= want ? 0 : resize(r, want);
}

/* Room for the next read: one chunk past what is buffered, the buffer
 * doubling towards the front frame's size, so that memory follows the
 * bytes that arrived (at most about twice them), never a header's claim. */
static size_t next_capacity(const struct gs_frame_reader *r, size_t need)
{
	size_t want = r->len + READ_CHUNK;
	if (want <= r->cap)
		return r->cap;
	size_t doubled = 2 * r->cap;
	if (need > want && doubled > want)
		want = doubled < need ? doubled : need;
	return want;
}

/* Descriptors the next read may bring: what this reader and the budget
 * still have room for, at most one sendmsg's worth. */
static size_t fd_room(const struct gs_frame_reader *r)
{
	size_t room = r->max_fds > r->nfds ? r->max_fds - r->nfds : 0;
	if (room > GS_FRAME_MAX_FDS)
		room = GS_FRAME_MAX_FDS;
	const struct gs_frame_budget *b = r->budget;
	if (b) {
		size_t left = b->fds < b->max_fds ? b->max_fds - b->fds : 0;
		if (left < room)
			room = left;
	}
	return room;
}

static int queue_fds(struct gs_frame_reader *r, struct msghdr *msg, size_t room)
{
	int r_err = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int fds[GS_FRAME_MAX_FDS];
		if (n > GS_FRAME_MAX_FDS)
			n = GS_FRAME_MAX_FDS;
		memcpy(fds, CMSG_DATA(c), n * sizeof(int));
		for (size_t i = 0; i < n; i++) {
			if (room > 0 && r->nfds < GS_FRAME_FD_QUEUE) {
				r->fds[r->nfds++] = fds[i];
				room--;
				if (r->budget)
					r->budget->fds++;
			} else {
				close(fds[i]);
				r_err = -EMFILE;
			}
		}
	}
	/* The kernel closed what did not fit in our control buffer. */
	if (msg->msg_flags & MSG_CTRUNC)
		r_err = -EMFILE;
	return r_err;
}

ssize_t gs_frame_reader_fill(struct gs_frame_reader *r, int fd)
{
	size_t need;
	int err = front_frame_size(r, &need);
	if (err < 0)
		return err;
	err = reserve(r, next_capacity(r, need));
	if (err < 0)
		return err;

	/* A control buffer with room for just the descriptors allowed: the
	 * kernel closes any more and says so (MSG_CTRUNC). */
	size_t room = fd_room(r);
	union {
		char buf[CMSG_SPACE(GS_FRAME_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct iovec iov = { r->buf + r->len, r->cap - r->len };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = room ? control.buf : NULL,
		.msg_controllen = room ? CMSG_LEN(room * sizeof(int)) : 0,
	};
	ssize_t n;
	do {
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	err = queue_fds(r, &msg, room);
	r->len += (size_t)n;
	if (err < 0)
		return err;
	err = front_frame_size(r, &need);
	return err < 0 ? err : n;
}

int gs_frame_reader_next(struct gs_frame_reader *r, const uint8_t **payload,
			 size_t *len)
{
	size_t need;
	int err = front_frame_size(r, &need);
	if (err < 0)
		return err;
	if (need == 0 || r->len < need)
		return 0;
	*payload = r->buf + GS_FRAME_HEADER_SIZE;
	*len = need - GS_FRAME_HEADER_SIZE;
	return 1;
}

void gs_frame_reader_consume(struct gs_frame_reader *r)
{
	size_t need;
	if (front_frame_size(r, &need) < 0 || need == 0 || r->len < need)
		return;
	memmove(r->buf, r->buf + need, r->len - need);
	r->len -= need;
	/* Give back a large frame's buffer once it is gone. */
	if (r->cap > READ_CHUNK && r->len <= READ_CHUNK)
		resize(r, READ_CHUNK);
}

int gs_frame_reader_prepend(struct gs_frame_reader *r, const uint8_t *data, size_t len)
{
	int err = reserve(r, r->len + len);
	if (err < 0)
		return err;
	memmove(r->buf + len, r->buf, r->len);
	memcpy(r->buf, data, len);
	r->len += len;
	return 0;
}

int gs_frame_reader_take_fds(struct gs_frame_reader *r, int *fds, size_t n)
{
	if (n > r->nfds)
		return -EBADMSG;
	memcpy(fds, r->fds, n * sizeof(int));
	memmove(r->fds, r->fds + n, (r->nfds - n) * sizeof(int));
	r->nfds -= n;
	if (r->budget)
		r->budget->fds -= n;
	return 0;
}

int gs_frame_decode(const uint8_t *payload, size_t len, Gradsync__Message **out)
{
	Gradsync__Message *m = gradsync__message__unpack(NULL, len, payload);
	*out = NULL;
	if (!m)
		return -EBADMSG;
	if (gradsync__message__get_packed_size(m) != len) {
		gradsync__message__free_unpacked(m, NULL);
		return -ERANGE;
	}
	*out = m;
	return 0;
}

int gs_frame_encode(const Gradsync__Message *m, uint8_t **out, size_t *len)
{
	size_t payload = gradsync__message__get_packed_size(m);
	if (payload > UINT32_MAX)
		return -EMSGSIZE;
	uint8_t *buf = malloc(GS_FRAME_HEADER_SIZE + payload);
	if (!buf)
		return -ENOMEM;
	gs_frame_put_len(buf, (uint32_t)payload);
	gradsync__message__pack(m, buf + GS_FRAME_HEADER_SIZE);
	*out = buf;
	*len = GS_FRAME_HEADER_SIZE + payload;
	return 0;
}

ssize_t gs_frame_write_some(int fd, const uint8_t *buf, size_t len,
			    const int *fds, size_t nfds)
{
	if (nfds > GS_FRAME_MAX_FDS)
		return -EINVAL;
	union {
		char buf[CMSG_SPACE(GS_FRAME_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct iovec iov = { (void *)buf, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		memset(control.buf, 0, sizeof(control.buf));
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	ssize_t n;
	do {
		n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return n;
}
