/*
 * The listening Unix socket: accepts local clients, refuses those past
 * --max-clients or not let in by the access rules, and hands each one it
 * admits to the layer above (the session) as a connection. It also sweeps
 * the connections' deadlines.
 */
#ifndef GS_SERVER_H
#define GS_SERVER_H

#include <sys/socket.h>
#include <uv.h>

#include "serve/access.h"
#include "serve/conn.h"
#include "support/settings.h"

struct gs_server {
	struct gs_conn_set *conns;
	/* socket_path (rewritten to the socket systemd passed, if it did;
	 * "" at shutdown leaves the file where it is) and max_clients. */
	struct gs_settings *settings;
	const struct gs_access *access;
	/* Takes each admitted client's connection: sets what its messages
	 * and its close do. ctx is given back to it. */
	void (*accepted)(struct gs_conn *c, void *ctx);
	void *ctx;
	int listen_fd;
	uv_poll_t listen_poll;
	/* Held open so that, out of descriptors, gradsyncd can still accept
	 * a connection to refuse it. -1: spent or none. */
	int reserve_fd;
	uv_timer_t accept_pause; /* listening paused after running out */
	uv_timer_t sweep;        /* clients' deadlines, the log's summaries */
};

/* A server of conns that is not listening yet. */
void gs_server_init(struct gs_server *srv, struct gs_conn_set *conns,
		    struct gs_settings *settings, const struct gs_access *access,
		    void (*accepted)(struct gs_conn *c, void *ctx), void *ctx);

/* Binds and listens on settings->socket_path, replacing a stale socket but
 * refusing to steal one a live daemon answers on. Returns 0 or -errno
 * after logging why. */
int gs_server_listen(struct gs_server *srv);
/* Serves an accepted client socket as every local client is served: a
 * small frame limit, no descriptors and the --hello-timeout until its
 * Hello, then hands it to accepted. Returns the connection, or NULL (fd
 * closed). */
struct gs_conn *gs_server_adopt(struct gs_server *srv, int fd);

/* accept4 on listen_fd. Out of descriptors (EMFILE, ENFILE), the one the
 * server holds in reserve makes room to accept the waiting connection and
 * refuse it (refuse_code, "gradsyncd has run out of file descriptors"),
 * so that the listening socket does not stay readable and the loop spin.
 * Returns the new descriptor, -EAGAIN when none waits or one was refused,
 * -EMFILE when not even the reserve helped (stop polling a moment), or
 * another -errno. */
int gs_server_accept(struct gs_server *srv, int listen_fd, struct sockaddr_storage *addr,
		     int refuse_code);

/* Stops accepting, closes every connection of the set and removes the
 * socket. */
void gs_server_close(struct gs_server *srv);

#endif
