/*
 * The client's end of the socket: connect with a deadline, send one frame
 * completely, and read and dispatch whatever gradsyncd sends. The socket
 * is non-blocking; every wait is a poll() bounded by a deadline.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "clock.h"

/* ---- deadlines --------------------------------------------------------- */

int64_t gs__deadline(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : (int64_t)(gs_now_ns() / 1000000) + timeout_ms;
}

int gs__remaining(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - (int64_t)(gs_now_ns() / 1000000);
	if (left <= 0)
		return 0;
	return left > INT_MAX ? INT_MAX : (int)left;
}

/* ---- connecting -------------------------------------------------------- */

static int connect_error(struct gs_client *c, const char *path, int err)
{
	const char *hint = err == EACCES ? "is this user in gradsyncd's group?"
					 : "is gradsyncd running?";
	return gs__fail(c, GS_ECONNECT,
		       "cannot connect to gradsyncd at %s: %s (%s)", path,
		       strerror(err), hint);
}

/* A Unix socket connects at once or not at all: only a full listen
 * backlog makes a non-blocking connect answer EAGAIN, so retry until the
 * deadline rather than block without one. */
static int connect_until(int fd, const struct sockaddr_un *sa,
			 int64_t deadline)
{
	for (;;) {
		if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
			return 0;
		if (errno != EAGAIN)
			return -errno;
		int left = gs__remaining(deadline);
		if (left == 0)
			return -ETIMEDOUT;
		poll(NULL, 0, left < 0 || left > 10 ? 10 : left);
	}
}

int gs__conn_open(struct gs_client *c, const char *path, int64_t deadline)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	if (len == 0 || len >= sizeof(sa.sun_path))
		return gs__fail(c, GS_EINVAL,
			       "socket path '%s' is empty or longer than %zu bytes",
			       path, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, len + 1);

	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->fd < 0)
		return gs__fail(c, GS_ESYSTEM, "cannot create a Unix socket: %s",
			       strerror(errno));
	int r = connect_until(c->fd, &sa, deadline);
	if (r == -ETIMEDOUT)
		return gs__fail(c, GS_ETIMEDOUT,
			       "timed out connecting to gradsyncd at %s: its listen backlog stayed full",
			       path);
	if (r < 0)
		return connect_error(c, path, -r);
	return GS_OK;
}

/* ---- reading ----------------------------------------------------------- */

static int oversize(struct gs_client *c)
{
	return gs__fail_dead(c, GS_EPROTO,
			    "protocol error: gradsyncd sent a frame of %u bytes, over the %u MiB limit",
			    gs_frame_get_len(c->reader.buf),
			    GS_CLIENT_MAX_FRAME >> 20);
}

/* Decodes and dispatches every whole frame buffered. */
static int drain_frames(struct gs_client *c)
{
	const uint8_t *payload;
	size_t len;
	int r;
	while ((r = gs_frame_reader_next(&c->reader, &payload, &len)) == 1) {
		Gradsync__Message *m =
			gradsync__message__unpack(NULL, len, payload);
		gs_frame_reader_consume(&c->reader);
		if (!m)
			return gs__fail_dead(c, GS_EPROTO,
					    "protocol error: gradsyncd sent a message that does not decode (%zu bytes)",
					    len);
		r = gs__dispatch(c, m);
		if (r < 0)
			return r;
	}
	return r < 0 ? oversize(c) : 0;
}

/* gradsyncd never sends descriptors; close any so that they cannot pile
 * up in this process. */
static int refuse_fds(struct gs_client *c)
{
	int fds[GS_FRAME_FD_QUEUE];
	size_t n = c->reader.nfds;
	gs_frame_reader_take_fds(&c->reader, fds, n);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	return gs__fail_dead(c, GS_EPROTO,
			    "protocol error: gradsyncd sent %zu file descriptors",
			    n);
}

static int closed(struct gs_client *c)
{
	return gs__fail_dead(c, GS_EDISCONNECTED,
			    "gradsyncd closed the connection during %s",
			    c->doing);
}

/* One read of what the socket has, then dispatch. Returns 1 when something
 * was read, 0 when nothing was there, or an error. */
static int read_available(struct gs_client *c)
{
	ssize_t n = gs_frame_reader_fill(&c->reader, c->fd);
	if (c->reader.nfds > 0 || n == -EMFILE)
		return refuse_fds(c);
	if (n > 0) {
		int r = drain_frames(c);
		return r < 0 ? r : 1;
	}
	if (n == -EAGAIN)
		return 0;
	if (n == 0 || n == -ECONNRESET)
		return closed(c);
	if (n == -EMSGSIZE)
		return oversize(c);
	if (n == -ENOMEM)
		return gs__fail_dead(c, GS_ENOMEM,
				    "out of memory reading from gradsyncd");
	return gs__fail_dead(c, GS_ESYSTEM, "cannot read from gradsyncd: %s",
			    strerror((int)-n));
}

static int wait_readable(struct gs_client *c, int64_t deadline)
{
	for (;;) {
		int left = gs__remaining(deadline);
		if (left == 0)
			return gs__fail(c, GS_ETIMEDOUT,
				       "timed out waiting for gradsyncd during %s",
				       c->doing);
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int n = poll(&p, 1, left);
		if (n > 0)
			return GS_OK;
		if (n < 0 && errno != EINTR)
			return gs__fail(c, GS_ESYSTEM, "poll: %s",
				       strerror(errno));
	}
}

bool gs__has_reply(const struct gs_client *c)
{
	return c->reply != NULL;
}

int gs__conn_pump(struct gs_client *c, gs__done_fn *done, int timeout_ms)
{
	int64_t deadline = gs__deadline(timeout_ms);
	for (;;) {
		if (done(c))
			return GS_OK;
		if (c->dead)
			return gs__dead_error(c);
		int r = read_available(c);
		if (r > 0)
			continue;
		/* What arrived before an Error or the end still counts. */
		if (r < 0)
			return done(c) ? GS_OK : r;
		r = wait_readable(c, deadline);
		if (r < 0)
			return r;
	}
}

/* ---- writing ----------------------------------------------------------- */

/* The daemon closed its end. What it said before closing (an Error) is
 * still in our receive queue, and names the reason. */
static int peer_gone(struct gs_client *c)
{
	int r;
	while ((r = read_available(c)) > 0)
		;
	return r < 0 ? r : closed(c);
}

/* Waits until the socket takes more bytes. It reads meanwhile, so that a
 * daemon writing to us while we write to it cannot deadlock the two. */
static int wait_writable(struct gs_client *c, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = POLLOUT | POLLIN };
		int n = poll(&p, 1, gs__remaining(deadline));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return gs__fail(c, GS_ESYSTEM, "poll: %s",
				       strerror(errno));
		if (n == 0)
			return GS_ETIMEDOUT;
		/* Errors and hang-ups are for sendmsg to report. */
		if (p.revents & (POLLOUT | POLLERR | POLLHUP))
			return GS_OK;
		int r = read_available(c);
		if (r < 0)
			return r;
	}
}

static int send_timeout(struct gs_client *c, size_t sent)
{
	/* Half a frame on the wire leaves the stream unusable. */
	if (sent > 0)
		return gs__fail_dead(c, GS_ETIMEDOUT,
				    "timed out sending to gradsyncd during %s: the daemon stopped reading",
				    c->doing);
	return gs__fail(c, GS_ETIMEDOUT,
		       "timed out sending to gradsyncd during %s: the daemon is not reading",
		       c->doing);
}

int gs__conn_send(struct gs_client *c, const Gradsync__Message *m,
		 const int *fds, size_t nfds, int timeout_ms)
{
	uint8_t *buf;
	size_t len;
	int r = gs_frame_encode(m, &buf, &len);
	if (r < 0)
		return gs__fail(c, r == -ENOMEM ? GS_ENOMEM : GS_ELIMIT,
			       "cannot encode a message for gradsyncd: %s",
			       strerror(-r));

	int64_t deadline = gs__deadline(timeout_ms);
	size_t off = 0;
	r = GS_OK;
	while (off < len && r == GS_OK) {
		/* The descriptors travel with the first chunk, once. */
		ssize_t n = gs_frame_write_some(c->fd, buf + off, len - off,
						off ? NULL : fds,
						off ? 0 : nfds);
		if (n > 0)
			off += (size_t)n;
		else if (n == 0 || n == -EAGAIN)
			r = wait_writable(c, deadline);
		else if (n == -EPIPE || n == -ECONNRESET)
			r = peer_gone(c);
		else
			r = gs__fail_dead(c, GS_ESYSTEM,
					 "cannot send to gradsyncd: %s",
					 strerror((int)-n));
	}
	if (r == GS_ETIMEDOUT)
		r = send_timeout(c, off);
	free(buf);
	return r;
}
