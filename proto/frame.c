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
}

void gs_frame_reader_destroy(struct gs_frame_reader *r)
{
	for (size_t i = 0; i < r->nfds; i++)
		close(r->fds[i]);
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

static int reserve(struct gs_frame_reader *r, size_t want)
{
	if (r->cap >= want)
		return 0;
	uint8_t *buf = realloc(r->buf, want);
	if (!buf)
		return -ENOMEM;
	r->buf = buf;
	r->cap = want;
	return 0;
}

static int queue_fds(struct gs_frame_reader *r, struct msghdr *msg)
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
			if (r->nfds < GS_FRAME_FD_QUEUE) {
				r->fds[r->nfds++] = fds[i];
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
	/* Grow to hold the whole front frame, never past max_frame + header. */
	size_t want = need > READ_CHUNK ? need : READ_CHUNK;
	if (r->len + 1 > want)
		want = r->len + READ_CHUNK;
	err = reserve(r, want);
	if (err < 0)
		return err;

	union {
		char buf[CMSG_SPACE(GS_FRAME_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct iovec iov = { r->buf + r->len, r->cap - r->len };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	ssize_t n;
	do {
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	err = queue_fds(r, &msg);
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
	if (r->cap > READ_CHUNK && r->len <= READ_CHUNK) {
		uint8_t *buf = realloc(r->buf, READ_CHUNK);
		if (buf) {
			r->buf = buf;
			r->cap = READ_CHUNK;
		}
	}
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
