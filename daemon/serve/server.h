/* The listening Unix socket and the daemon's start and stop. */
#ifndef GS_SERVER_H
#define GS_SERVER_H

#include <sys/socket.h>

struct gs_daemon;

/* Binds and listens on settings.socket_path, replacing a stale socket but
 * refusing to steal one a live daemon answers on. Returns 0 or -errno
 * after logging why. */
int gs_server_listen(struct gs_daemon *d);
/* Serves an accepted client socket as every local client is served: a
 * small frame limit, no descriptors and the --hello-timeout until its
 * Hello. Returns the connection, or NULL (fd closed). */
struct gs_conn *gs_server_adopt(struct gs_daemon *d, int fd);

/* accept4 on listen_fd. Out of descriptors (EMFILE, ENFILE), the one the
 * daemon holds in reserve makes room to accept the waiting connection and
 * refuse it (refuse_code, "gradsyncd has run out of file descriptors"),
 * so that the listening socket does not stay readable and the loop spin.
 * Returns the new descriptor, -EAGAIN when none waits or one was refused,
 * -EMFILE when not even the reserve helped (stop polling a moment), or
 * another -errno. */
int gs_server_accept(struct gs_daemon *d, int listen_fd, struct sockaddr_storage *addr,
		     int refuse_code);

/* Stops accepting, closes every connection and removes the socket. */
void gs_server_close(struct gs_daemon *d);

#endif
