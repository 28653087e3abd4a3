#include "serve/conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "errors.h"
#include "escape.h"
#include "support/log.h"

static void on_poll(uv_poll_t *p, int status, int events);

/* A peer that leaves its replies unread is not read either, so that a
 * client pipelining requests whose answers it never reads stalls itself
 * instead of growing the daemon: its requests wait in its socket. */
bool gs_conn_paused(const struct gs_conn *c)
{
	return c->out_bytes > c->set->max_queued / GS_CONN_PAUSE_SHARE;
}

static void update_poll(struct gs_conn *c)
{
	if (c->closing)
		return;
	/* Paused, only writing: a peer that went away fails the write. */
	int events = gs_conn_paused(c) ? 0 : UV_READABLE | UV_DISCONNECT;
	/* Frames held back by a pause that has ended (the queue drained
	 * while a message was sent): a writable socket says so at once. */
	if (c->out_head || c->held)
		events |= UV_WRITABLE;
	uv_poll_start(&c->poll, events, on_poll);
}

void gs_conn_set_init(struct gs_conn_set *s, uv_loop_t *loop, uint64_t max_frame,
		      uint64_t hello_timeout, uint64_t frame_timeout, size_t max_parked_fds,
		      size_t max_pending_bytes, uint64_t max_queued)
{
	*s = (struct gs_conn_set){ .loop = loop, .max_frame = max_frame,
				   .hello_timeout = hello_timeout, .frame_timeout = frame_timeout,
				   .max_queued = max_queued };
	s->budget.max_fds = max_parked_fds;
	s->budget.max_bytes = max_pending_bytes;
}

struct gs_conn *gs_conn_create(struct gs_conn_set *set, int fd, size_t max_frame,
			       void (*dispatch)(struct gs_conn *c, const Gradsync__Message *m),
			       void (*closed)(struct gs_conn *c))
{
	struct gs_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return NULL;
	}
	c->set = set;
	c->fd = fd;
	c->id = ++set->next_id;
	c->dispatch = dispatch;
	c->closed = closed;
	gs_frame_reader_init(&c->reader, max_frame);
	/* No descriptors before the client is identified; its role's own
	 * allowance comes with its Hello (gs_conn_identified). */
	c->reader.max_fds = 0;
	c->reader.budget = &set->budget;
	socklen_t len = sizeof(c->cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) < 0)
		c->cred = (struct ucred){ 0, (uid_t)-1, (gid_t)-1 };
	int r = uv_poll_init(set->loop, &c->poll, fd);
	if (r < 0) {
		gs_warn("cannot watch a new connection: %s", uv_strerror(r));
		gs_frame_reader_destroy(&c->reader);
		close(fd);
		free(c);
		return NULL;
	}
	c->poll.data = c;
	c->last_rx_ms = uv_now(set->loop);
	set->count++;
	c->next = set->head;
	if (set->head)
		set->head->prev = c;
	set->head = c;
	update_poll(c);
	return c;
}

void gs_conn_identified(struct gs_conn *c, enum gs_conn_role role)
{
	c->role = role;
	c->hello_deadline_ns = 0;
	if (role == GS_CONN_TRAINER) {
		c->reader.max_frame = c->set->max_frame;
		c->reader.max_fds = GS_CONN_TRAINER_FDS;
	} else if (role == GS_CONN_CONTROL) {
		c->reader.max_fds = GS_CONN_CONTROL_FDS;
	}
}

void gs_conn_check_deadlines(struct gs_conn *c, uint64_t now)
{
	const struct gs_conn_set *s = c->set;
	if (c->closing || !c->timed)
		return;
	if (c->hello_deadline_ns && now >= c->hello_deadline_ns) {
		gs_conn_fail(c, GS_ETIMEDOUT, "no Hello within %llu s of connecting (--hello-timeout)",
			     (unsigned long long)s->hello_timeout);
		return;
	}
	if (c->deadline_ns && now >= c->deadline_ns) {
		gs_conn_fail(c, GS_ETIMEDOUT, "%s", c->deadline_why);
		return;
	}
	/* A paused connection's frames wait for this side, not the peer:
	 * their clock starts again when reading resumes. */
	if (c->frame_start_ns && !gs_conn_paused(c) &&
	    now - c->frame_start_ns >= s->frame_timeout * 1000000000ull) {
		size_t need = GS_FRAME_HEADER_SIZE;
		if (c->reader.len >= GS_FRAME_HEADER_SIZE)
			need += gs_frame_get_len(c->reader.buf);
		gs_conn_fail(c, GS_ETIMEDOUT, "a frame begun %llu s ago is still incomplete: %zu of %zu bytes (--frame-timeout)",
			     (unsigned long long)s->frame_timeout, c->reader.len, need);
	}
}

void gs_conn_set_deadline(struct gs_conn *c, uint64_t at, const char *fmt, ...)
{
	c->deadline_ns = at;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->deadline_why, sizeof(c->deadline_why), fmt, ap);
	va_end(ap);
}

/* Room for an Error's message, escaped. */
#define ERROR_TEXT_MAX 2048

/* An Error message of code and message, held in *err, the message
 * escaped into safe[ERROR_TEXT_MAX]: like a log line, an Error never
 * carries the raw bytes of what a client or peer sent (a coordinator,
 * a tensor name), whoever formatted it. */
static Gradsync__Message error_message(Gradsync__Error *err, int code, const char *message,
				       char *safe)
{
	*err = (Gradsync__Error)GRADSYNC__ERROR__INIT;
	err->code = code;
	err->message = (char *)gs_escape(message, safe, ERROR_TEXT_MAX);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_ERROR;
	m.error = err;
	return m;
}

void gs_conn_refuse(int fd, int code, const char *message)
{
	Gradsync__Error err;
	char safe[ERROR_TEXT_MAX];
	Gradsync__Message m = error_message(&err, code, message, safe);
	uint8_t *buf;
	size_t len;
	if (gs_frame_encode(&m, &buf, &len) == 0) {
		gs_frame_write_some(fd, buf, len, NULL, 0);
		free(buf);
	}
	close(fd);
}

uint64_t gs_conn_silent_ms(const struct gs_conn *c)
{
	int unread = 0;
	if (ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0)
		return 0;
	uint64_t now = uv_now(c->set->loop);
	return now > c->last_rx_ms ? now - c->last_rx_ms : 0;
}

const char *gs_conn_name(const struct gs_conn *c)
{
	static char name[96];
	if (c->addr[0])
		snprintf(name, sizeof(name), "%s", c->addr);
	else if (c->label[0])
		snprintf(name, sizeof(name), "pid %d uid %u (%s)", (int)c->cred.pid,
			 (unsigned)c->cred.uid, c->label);
	else
		snprintf(name, sizeof(name), "pid %d uid %u", (int)c->cred.pid,
			 (unsigned)c->cred.uid);
	return name;
}

static int flush(struct gs_conn *c)
{
	while (c->out_head) {
		struct gs_out_frame *f = c->out_head;
		ssize_t n = gs_frame_write_some(c->fd, f->data + f->off,
						f->len - f->off, NULL, 0);
		if (n == -EAGAIN)
			return 0;
		if (n < 0)
			return (int)n;
		f->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (f->off < f->len)
			continue;
		c->out_head = f->next;
		if (!c->out_head)
			c->out_tail = NULL;
		free(f);
	}
	return 0;
}

/* A read or write failed with -err: closed learns why from c->error. */
static void close_failed(struct gs_conn *c, int err)
{
	if (!c->error)
		c->error = -err;
	gs_conn_close(c);
}

/* Queues m whatever the queue holds, and writes what the socket takes. */
static void queue(struct gs_conn *c, const Gradsync__Message *m, size_t payload)
{
	struct gs_out_frame *f = malloc(sizeof(*f) + GS_FRAME_HEADER_SIZE + payload);
	if (!f) {
		gs_error("out of memory queueing a frame for %s", gs_conn_name(c));
		gs_conn_close(c);
		return;
	}
	f->next = NULL;
	f->off = 0;
	f->len = GS_FRAME_HEADER_SIZE + payload;
	gs_frame_put_len(f->data, (uint32_t)payload);
	gradsync__message__pack(m, f->data + GS_FRAME_HEADER_SIZE);
	if (c->out_tail)
		c->out_tail->next = f;
	else
		c->out_head = f;
	c->out_tail = f;
	c->out_bytes += f->len;
	int err = flush(c);
	if (err < 0) {
		gs_debug("write to %s failed: %s; closing", gs_conn_name(c), strerror(-err));
		close_failed(c, err);
		return;
	}
	update_poll(c);
}

void gs_conn_send(struct gs_conn *c, const Gradsync__Message *m)
{
	if (c->closing)
		return;
	size_t payload = gradsync__message__get_packed_size(m);
	/* Reading stops long before this (gs_conn_paused): only messages the
	 * daemon sends unasked, to a peer that reads none, get this far. */
	uint64_t max = c->set->max_queued;
	if (c->out_bytes + GS_FRAME_HEADER_SIZE + payload > max) {
		gs_conn_fail(c, GS_ELIMIT, "%zu bytes of messages to this client wait unread; %zu more would pass %llu bytes (--max-queued-bytes)",
			     c->out_bytes, GS_FRAME_HEADER_SIZE + payload, (unsigned long long)max);
		return;
	}
	queue(c, m, payload);
}

/* A warning about c, limited while c is a stranger (log_group). */
static void conn_warn(struct gs_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_warn(struct gs_conn *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (c->log_group)
		gs_vlog_grouped(c->log_group, GS_LOG_WARN, fmt, ap);
	else
		gs_vlog(GS_LOG_WARN, fmt, ap);
	va_end(ap);
}

void gs_conn_fail(struct gs_conn *c, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	conn_warn(c, "dropping client %s: %s: %s", gs_conn_name(c), gs_error_name(code), msg);
	gs_conn_end(c, code, msg);
}

void gs_conn_end(struct gs_conn *c, int code, const char *message)
{
	Gradsync__Error err;
	char safe[ERROR_TEXT_MAX];
	Gradsync__Message m = error_message(&err, code, message, safe);
	/* Past any limit of the queue's: one small frame more, freed with
	 * the connection. */
	if (!c->closing)
		queue(c, &m, gradsync__message__get_packed_size(&m));
	/* Best effort: the error frame is small and the socket buffer empty
	 * in all but hostile cases; we do not wait for a peer that won't read. */
	gs_conn_close(c);
}

static void on_closed(uv_handle_t *h)
{
	struct gs_conn *c = h->data;
	while (c->out_head) {
		struct gs_out_frame *f = c->out_head;
		c->out_head = f->next;
		free(f);
	}
	gs_frame_reader_destroy(&c->reader);
	close(c->fd);
	free(c);
}

void gs_conn_close(struct gs_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	struct gs_conn_set *set = c->set;
	set->count--;
	if (c->prev)
		c->prev->next = c->next;
	else
		set->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (c->closed)
		c->closed(c);
	gs_debug("client pid %d closed", (int)c->cred.pid);
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_closed);
}

/* Why a fill failed, in words that name the limit. */
static void fail_fill(struct gs_conn *c, ssize_t err)
{
	const struct gs_frame_budget *b = &c->set->budget;
	if (err == -EMSGSIZE && (c->role == GS_CONN_NEW || c->role == GS_CONN_CONTROL))
		gs_conn_fail(c, GS_ELIMIT, "frame longer than %zu bytes from a %s",
			     c->reader.max_frame,
			     c->role == GS_CONN_NEW ? "client that has not said Hello" : "control client");
	else if (err == -EMSGSIZE)
		gs_conn_fail(c, GS_ELIMIT, "frame longer than the %zu-byte maximum (--max-frame)",
			     c->reader.max_frame);
	else if (err == -EMFILE && b->fds >= b->max_fds)
		gs_conn_fail(c, GS_ELIMIT, "gradsyncd already holds %zu descriptors that clients sent and no message claimed (--max-parked-fds)",
			     b->fds);
	else if (err == -EMFILE && c->role == GS_CONN_NEW)
		gs_conn_fail(c, GS_ELIMIT, "descriptors sent before Hello");
	else if (err == -EMFILE)
		gs_conn_fail(c, GS_ELIMIT, "more than %zu descriptors sent without a message claiming them",
			     c->reader.max_fds);
	else if (err == -ENOBUFS)
		gs_conn_fail(c, GS_ELIMIT, "gradsyncd already holds %zu bytes of frames not yet whole from its clients (--max-pending-bytes)",
			     b->bytes);
	else {
		gs_debug("read from %s: %s", gs_conn_name(c), strerror((int)-err));
		close_failed(c, (int)err);
	}
}

/* Decodes and dispatches every whole frame that is buffered. */
static void process_frames(struct gs_conn *c)
{
	const uint8_t *payload;
	size_t len;
	int r = 0;
	while (!c->closing && !gs_conn_paused(c) &&
	       (r = gs_frame_reader_next(&c->reader, &payload, &len)) > 0) {
		Gradsync__Message *m;
		int err = gs_frame_decode(payload, len, &m);
		gs_frame_reader_consume(&c->reader);
		if (err == -ERANGE) {
			gs_conn_fail(c, GS_EPROTO, "frame of %zu bytes does not encode back to itself: a number does not fit its field, or the encoding is padded",
				     len);
			return;
		}
		if (err < 0) {
			gs_conn_fail(c, GS_EPROTO, "frame of %zu bytes is not a valid message", len);
			return;
		}
		c->dispatch(c, m);
		gradsync__message__free_unpacked(m, NULL);
	}
	if (r < 0 && !c->closing)
		fail_fill(c, r);
	c->held = gs_conn_paused(c);
}

/* A local client's frame is timed from its first byte until it is whole. */
static void note_frame_start(struct gs_conn *c)
{
	if (c->reader.len == 0)
		c->frame_start_ns = 0;
	else if (c->frame_start_ns == 0)
		c->frame_start_ns = gs_now_ns();
}

/* The peer has read enough of its replies: the frames read before the
 * pause come first, their clock started anew. */
static void resume(struct gs_conn *c)
{
	c->held = false;
	c->frame_start_ns = 0;
	process_frames(c);
	note_frame_start(c);
}

static void on_readable(struct gs_conn *c)
{
	/* Bounded per wake-up so one client cannot starve the others. */
	for (int i = 0; i < 16 && !c->closing && !gs_conn_paused(c); i++) {
		ssize_t n = gs_frame_reader_fill(&c->reader, c->fd);
		if (n == -EAGAIN)
			return;
		if (n > 0)
			c->last_rx_ms = uv_now(c->set->loop);
		if (n < 0) {
			fail_fill(c, n);
			return;
		}
		if (n == 0) {
			if (c->reader.len > 0)
				conn_warn(c, "client %s closed mid-frame (%zu bytes unread)",
					  gs_conn_name(c), c->reader.len);
			gs_conn_close(c);
			return;
		}
		process_frames(c);
		note_frame_start(c);
	}
}

static void on_poll(uv_poll_t *p, int status, int events)
{
	struct gs_conn *c = p->data;
	if (status < 0) {
		/* libuv says UV_EBADF for any POLLERR; the socket knows which. */
		int so_error = 0;
		socklen_t len = sizeof(so_error);
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) == 0 && so_error)
			status = -so_error;
		close_failed(c, status);
		return;
	}
	if (events & UV_WRITABLE) {
		int err = flush(c);
		if (err < 0) {
			close_failed(c, err);
			return;
		}
	}
	if (c->held && !gs_conn_paused(c))
		resume(c);
	if ((events & (UV_READABLE | UV_DISCONNECT)) && !gs_conn_paused(c))
		on_readable(c);
	update_poll(c);
}
