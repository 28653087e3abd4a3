#include "support/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "number.h"
#include "support/log.h"

/* How often the status line is refreshed, and how far each tick pushes
 * systemd's start timeout while the node joins (the daemon's own
 * --join-timeout bounds the join; systemd's must not cut it short). */
#define TICK_MS 1000
#define EXTEND_USEC 10000000

#define FIRST_LISTEN_FD 3 /* SD_LISTEN_FDS_START */

/* The environment that says so is the process's, and so is this. */
static bool activated;

/* ---- sd_notify ---------------------------------------------------------- */

/* $NOTIFY_SOCKET is a path, or "@name" for the abstract namespace. */
static int notify_address(struct sockaddr_un *sa, socklen_t *len)
{
	const char *e = getenv("NOTIFY_SOCKET");
	if (!e || !*e)
		return 0;
	size_t n = strlen(e);
	if ((e[0] != '/' && e[0] != '@') || n >= sizeof(sa->sun_path))
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, e, n);
	if (e[0] == '@')
		sa->sun_path[0] = '\0';
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/'));
	return 1;
}

int gs_notify(const char *fmt, ...)
{
	struct sockaddr_un sa;
	socklen_t salen;
	int r = notify_address(&sa, &salen);
	if (r <= 0)
		return r;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (len < 0)
		return -EINVAL;
	if ((size_t)len >= sizeof(msg))
		len = sizeof(msg) - 1;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t sent = sendto(fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
	r = sent < 0 ? -errno : 1;
	close(fd);
	if (r < 0)
		gs_debug("cannot notify systemd: %s", strerror(-r));
	return r;
}

/* ---- socket activation -------------------------------------------------- */

static void clear_listen_env(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}

static int int_option(int fd, int level, int name)
{
	int v = -1;
	socklen_t len = sizeof(v);
	if (getsockopt(fd, level, name, &v, &len) < 0)
		return -1;
	return v;
}

/* What systemd passed must be what gradsyncd.socket declares. */
static int check_listener(int fd, char *path, size_t n)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	memset(&sa, 0, sizeof(sa));
	if (int_option(fd, SOL_SOCKET, SO_DOMAIN) != AF_UNIX ||
	    int_option(fd, SOL_SOCKET, SO_TYPE) != SOCK_STREAM ||
	    int_option(fd, SOL_SOCKET, SO_ACCEPTCONN) != 1 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		gs_error("socket activation: descriptor %d is not a listening Unix stream socket "
			 "(gradsyncd.socket must have ListenStream=PATH and Accept=no)",
			 fd);
		return -EINVAL;
	}
	if (sa.sun_path[0] == '\0' || strlen(sa.sun_path) >= n) {
		gs_error("socket activation: the socket passed is not bound to a path");
		return -EINVAL;
	}
	snprintf(path, n, "%s", sa.sun_path);
	return 0;
}

int gs_notify_listen_fd(char *path, size_t n)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	if (!pid || !fds)
		return -ENOENT;
	uint64_t p, count;
	bool mine = gs_parse_uint(pid, 1, UINT64_MAX, &p) == 0 && p == (uint64_t)getpid();
	int r = gs_parse_uint(fds, 0, UINT64_MAX, &count);
	clear_listen_env();
	if (!mine)
		return -ENOENT; /* meant for another process */
	if (r < 0 || count != 1) {
		gs_error("socket activation: systemd passed %s sockets; gradsyncd takes exactly one", fds);
		return -EINVAL;
	}
	int fd = FIRST_LISTEN_FD;
	r = check_listener(fd, path, n);
	if (r < 0)
		return r;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		r = -errno;
		gs_error("socket activation: cannot make descriptor %d non-blocking: %s", fd,
			 strerror(errno));
		return r;
	}
	activated = true;
	return fd;
}

bool gs_notify_socket_activated(void)
{
	return activated;
}

/* ---- status lines -------------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
	struct gs_notifier *nt = t->data;
	if (!nt->ready) {
		gs_notify("EXTEND_TIMEOUT_USEC=%d", EXTEND_USEC);
		return;
	}
	char line[sizeof(nt->last)];
	nt->status(nt->ctx, line, sizeof(line));
	if (strcmp(line, nt->last) == 0)
		return;
	snprintf(nt->last, sizeof(nt->last), "%s", line);
	gs_notify("STATUS=%s", line);
}

void gs_notify_start(struct gs_notifier *nt, uv_loop_t *loop, gs_notify_status_fn *status,
		     void *ctx)
{
	*nt = (struct gs_notifier){ .status = status, .ctx = ctx };
	if (!getenv("NOTIFY_SOCKET"))
		return; /* nobody to tell: no timer either */
	uv_timer_init(loop, &nt->timer);
	nt->timer.data = nt;
	uv_timer_start(&nt->timer, on_tick, TICK_MS, TICK_MS);
	/* The timer alone must not keep the loop running. */
	uv_unref((uv_handle_t *)&nt->timer);
	nt->timing = true;
}

void gs_notify_ready(struct gs_notifier *nt)
{
	char line[sizeof(nt->last)];
	nt->status(nt->ctx, line, sizeof(line));
	nt->ready = true;
	snprintf(nt->last, sizeof(nt->last), "%s", line);
	gs_notify("READY=1\nSTATUS=%s", line);
}

void gs_notify_stopping(struct gs_notifier *nt)
{
	gs_notify("STOPPING=1\nSTATUS=stopping: finishing the work in flight");
	if (!nt->timing)
		return;
	uv_timer_stop(&nt->timer);
	uv_close((uv_handle_t *)&nt->timer, NULL);
	nt->timing = false;
}
