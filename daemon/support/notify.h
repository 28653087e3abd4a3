/*
 * The daemon's side of systemd's service protocols, without libsystemd:
 * readiness and status datagrams to $NOTIFY_SOCKET (sd_notify(3): READY=1,
 * STATUS=..., STOPPING=1, EXTEND_TIMEOUT_USEC=...) and the listening
 * socket that socket activation passes as descriptor 3 ($LISTEN_PID,
 * $LISTEN_FDS, sd_listen_fds(3)). Outside systemd both do nothing.
 */
#ifndef GS_NOTIFY_H
#define GS_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

/* Writes how the daemon is doing, one line, into out. */
typedef void gs_notify_status_fn(void *ctx, char *out, size_t n);

/* The status lines' timer and what they said last. */
struct gs_notifier {
	uv_timer_t timer;
	bool timing; /* the timer runs: a service manager listens */
	bool ready;
	gs_notify_status_fn *status;
	void *ctx;
	char last[256]; /* the status line last sent */
};

/* Sends one notification (lines "KEY=value"). Returns 1 when sent, 0 when
 * no service manager listens ($NOTIFY_SOCKET unset), or -errno. */
int gs_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The listening socket systemd passed to this process, if any. Returns the
 * descriptor (non-blocking, close-on-exec) and writes the path it is bound
 * to into path; -ENOENT when the daemon was not socket-activated; another
 * -errno, after logging why, when what was passed is not one listening
 * Unix stream socket. Clears $LISTEN_* either way. */
int gs_notify_listen_fd(char *path, size_t n);
/* Whether gs_notify_listen_fd has returned a socket. */
bool gs_notify_socket_activated(void);

/* Starts telling systemd how the daemon is doing: EXTEND_TIMEOUT_USEC
 * while it joins the other nodes, then, once gs_notify_ready() has been
 * called, a STATUS= line (from status) whenever it changes. Outside
 * systemd there is no timer either. */
void gs_notify_start(struct gs_notifier *nt, uv_loop_t *loop, gs_notify_status_fn *status,
		     void *ctx);
/* READY=1, with the first status line. */
void gs_notify_ready(struct gs_notifier *nt);
/* STOPPING=1, and closes the status timer. Safe to call twice. */
void gs_notify_stopping(struct gs_notifier *nt);

#endif
