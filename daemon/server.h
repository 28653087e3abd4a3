/* The listening Unix socket and the daemon's start and stop. */
#ifndef GS_SERVER_H
#define GS_SERVER_H

struct gs_daemon;

/* Binds and listens on settings.socket_path, replacing a stale socket but
 * refusing to steal one a live daemon answers on. Returns 0 or -errno
 * after logging why. */
int gs_server_listen(struct gs_daemon *d);
/* Serves an accepted client socket as every local client is served: a
 * small frame limit, no descriptors and the --hello-timeout until its
 * Hello. Returns the connection, or NULL (fd closed). */
struct gs_conn *gs_server_adopt(struct gs_daemon *d, int fd);

/* Stops accepting, closes every connection and removes the socket. */
void gs_server_close(struct gs_daemon *d);

#endif
