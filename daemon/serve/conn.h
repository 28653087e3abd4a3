/*
 * One client connection: a non-blocking Unix socket watched by a uv_poll_t,
 * a frame reader, a queue of frames to write, the peer's credentials, and
 * what the client turned out to be (trainer or control). A connection is
 * freed only from the uv_close callback, never inside a callback using it.
 * What its messages mean is the layer above's: it hands each to the
 * connection's dispatch callback. The daemon's connections make up one
 * set, which holds what they share.
 */
#ifndef GS_CONN_H
#define GS_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "frame.h"

struct gs_conn;
struct gs_log_group;
struct gs_trainer;

enum gs_conn_role { GS_CONN_NEW, GS_CONN_TRAINER, GS_CONN_CONTROL, GS_CONN_NODE };

/* Until a client has said who it is (and for control clients), frames are
 * small and carry no descriptors; a trainer's may be --max-frame long and
 * park two sendmsgs' worth of descriptors (a frame's, and the next one's
 * read with its tail). */
#define GS_CONN_SMALL_FRAME (64u << 10)
#define GS_CONN_TRAINER_FDS (2 * GS_FRAME_MAX_FDS)
#define GS_CONN_CONTROL_FDS 2
/* A connection is not read while more than this share of
 * --max-queued-bytes waits in its queue for the peer to read it. */
#define GS_CONN_PAUSE_SHARE 16

/* Every connection of a daemon, and what they share. */
struct gs_conn_set {
	uv_loop_t *loop;
	struct gs_conn *head; /* newest first, doubly linked through gs_conn.next/prev */
	unsigned count;
	uint64_t next_id;
	struct gs_frame_budget budget; /* every connection's reader together */
	/* A trainer's frames (--max-frame), and the deadlines of a local
	 * client, in seconds (--hello-timeout, --frame-timeout). */
	uint64_t max_frame;
	uint64_t hello_timeout, frame_timeout;
	/* Bytes one connection's queue may hold (--max-queued-bytes). */
	uint64_t max_queued;
};

/* An empty set on loop: frames up to max_frame (a trainer's), a local
 * client's deadlines, a budget of parked descriptors and bytes of
 * unfinished frames over all connections, and what one connection's queue
 * of frames to write may hold. */
void gs_conn_set_init(struct gs_conn_set *s, uv_loop_t *loop, uint64_t max_frame,
		      uint64_t hello_timeout, uint64_t frame_timeout, size_t max_parked_fds,
		      size_t max_pending_bytes, uint64_t max_queued);

struct gs_out_frame {
	struct gs_out_frame *next;
	size_t len, off;
	uint8_t data[];
};

struct gs_conn {
	struct gs_conn_set *set;
	struct gs_conn *prev, *next;
	uint64_t id;
	int fd;
	uv_poll_t poll;
	struct gs_frame_reader reader;
	struct gs_out_frame *out_head, *out_tail;
	size_t out_bytes; /* queued and not yet written */
	/* Reading paused (gs_conn_paused) with frames read and not yet
	 * dispatched, maybe: they go first once it resumes. */
	bool held;
	struct ucred cred;
	enum gs_conn_role role;
	/* The engine's trainer on this connection; set and read above,
	 * never used here. */
	struct gs_trainer *trainer;
	/* The layer above's, for its callbacks: the node's view for a local
	 * client (session.c), the rendezvous's record of a peer. */
	void *owner;
	/* Said after the peer's identity in log lines ("local rank 3"); set
	 * by the layer above. "": nothing. */
	char label[32];
	char addr[64]; /* a TCP peer's "host:port", for log lines; "": none */
	/* Set while the peer is a stranger (an unauthenticated rendezvous
	 * connection): lines about it are limited, so that a flood of them
	 * cannot flood the log. NULL: each is logged. */
	struct gs_log_group *log_group;
	uint64_t last_rx_ms; /* loop time anything last arrived (liveness.h) */
	/* The errno of the read or write that failed and closed it (a TCP
	 * timeout, a reset, no route), for closed to say why; 0: the peer
	 * closed it, or this side did. */
	int error;
	/* What this kind of connection does with each message, and on close. */
	void (*dispatch)(struct gs_conn *c, const Gradsync__Message *m);
	void (*closed)(struct gs_conn *c);
	bool closing;
	/* Deadlines of a local client (timed): its Hello (0 once said), and
	 * the frame it has begun to send (0: none begun). */
	bool timed;
	uint64_t hello_deadline_ns;
	uint64_t frame_start_ns;
	/* A deadline of the layer above's (a trainer's registration), and
	 * the Error's words when it passes; 0: none. */
	uint64_t deadline_ns;
	char deadline_why[256];
};

/* Takes over an accepted socket into the set, reading frames of at most
 * max_frame bytes and handing each message to dispatch; closed (may be
 * NULL) runs when the connection goes. Returns the connection, or NULL
 * (fd closed) on failure. */
struct gs_conn *gs_conn_create(struct gs_conn_set *set, int fd, size_t max_frame,
			       void (*dispatch)(struct gs_conn *c, const Gradsync__Message *m),
			       void (*closed)(struct gs_conn *c));

/* The client said Hello as `role`: its frames may now be as long and carry
 * as many descriptors as that role needs. */
void gs_conn_identified(struct gs_conn *c, enum gs_conn_role role);

/* Drops a local client that is past its Hello or frame deadline (by
 * --hello-timeout and --frame-timeout), or the one the layer above set;
 * now from gs_now_ns(). A frame is not timed while the connection is not
 * read (its replies wait unread). */
void gs_conn_check_deadlines(struct gs_conn *c, uint64_t now);

/* Sets the layer above's deadline of a local client: past `at` (by
 * gs_now_ns()) it is dropped with GS_ETIMEDOUT and the formatted words.
 * at 0 clears it. */
void gs_conn_set_deadline(struct gs_conn *c, uint64_t at, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Whether the connection is not read now: its peer has left more than
 * --max-queued-bytes / GS_CONN_PAUSE_SHARE of its messages unread. Its
 * requests wait in the socket and are read once it has read enough. */
bool gs_conn_paused(const struct gs_conn *c);

/* Answers a socket that gets no connection with one Error frame (best
 * effort, never blocking) and closes it. */
void gs_conn_refuse(int fd, int code, const char *message);

/* Queues one message and writes what the socket takes now. A message
 * that would take the queue past --max-queued-bytes drops the client
 * instead, naming the setting (gs_conn_fail: the client is gone when this
 * returns). */
void gs_conn_send(struct gs_conn *c, const Gradsync__Message *m);

/* Sends an Error with code and message, logs it with the peer's identity,
 * and closes the connection (only this client is dropped). */
void gs_conn_fail(struct gs_conn *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* gs_conn_fail for a caller that has logged why in its own words. */
void gs_conn_end(struct gs_conn *c, int code, const char *message);

/* Stops reading, calls closed, and frees the connection from the
 * loop. Safe to call twice. */
void gs_conn_close(struct gs_conn *c);

/* Milliseconds since anything arrived from the peer; 0 while bytes wait
 * in the socket unread (a loop that was held up has not read them yet:
 * the peer was not silent). */
uint64_t gs_conn_silent_ms(const struct gs_conn *c);

/* "pid 123 uid 1000" plus its label ("(local rank 3)"), or a TCP peer's
 * address, for log lines. */
const char *gs_conn_name(const struct gs_conn *c);

#endif
