#include "serve/server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "serve/access.h"
#include "serve/conn.h"
#include "daemon.h"
#include "errors.h"
#include "support/log.h"
#include "support/notify.h"
#include "control/session.h"

/* How often clients' deadlines are checked: a deadline is met within this
 * much of its setting. */
#define SWEEP_MS 250
/* Out of descriptors with none in reserve: listening pauses this long. */
#define ACCEPT_PAUSE_MS 1000

/* Limits first, before anything is allocated for the client; then its
 * credentials, logged either way. */
static void admit(struct gs_daemon *d, int fd)
{
	struct ucred cred = { 0, (uid_t)-1, (gid_t)-1 };
	socklen_t len = sizeof(cred);
	getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
	char why[256];
	if (d->nconns >= d->settings.max_clients) {
		snprintf(why, sizeof(why), "gradsyncd serves at most %llu connections (--max-clients)",
			 (unsigned long long)d->settings.max_clients);
		gs_warn("refusing pid %d uid %u: %s", (int)cred.pid, (unsigned)cred.uid, why);
		gs_conn_refuse(fd, GS_ELIMIT, why);
		return;
	}
	if (!gs_access_allowed(&d->access, &cred, why, sizeof(why))) {
		gs_warn("refusing pid %d uid %u gid %u: %s", (int)cred.pid, (unsigned)cred.uid,
			(unsigned)cred.gid, why);
		gs_conn_refuse(fd, GS_EREFUSED, why);
		return;
	}
	gs_info("client pid %d uid %u gid %u connected", (int)cred.pid, (unsigned)cred.uid,
		(unsigned)cred.gid);
	gs_server_adopt(d, fd);
}

struct gs_conn *gs_server_adopt(struct gs_daemon *d, int fd)
{
	uint64_t max = d->settings.max_frame;
	struct gs_conn *c = gs_conn_create(d, fd, max < GS_CONN_SMALL_FRAME ? max : GS_CONN_SMALL_FRAME,
					   gs_session_dispatch, gs_session_closed);
	if (c) {
		c->timed = true;
		c->hello_deadline_ns = gs_now_ns() + d->settings.hello_timeout * 1000000000ull;
	}
	return c;
}

static void on_accept(uv_poll_t *p, int status, int events);

static void resume_accepting(uv_timer_t *t)
{
	struct gs_daemon *d = t->data;
	if (d->listen_fd >= 0)
		uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

int gs_server_accept(struct gs_daemon *d, int listen_fd, struct sockaddr_storage *addr,
		     int refuse_code)
{
	socklen_t len = sizeof(*addr);
	int fd = accept4(listen_fd, (struct sockaddr *)addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		return fd;
	int err = errno;
	if (err != EMFILE && err != ENFILE)
		return err == EAGAIN || err == EINTR || err == ECONNABORTED ? -EAGAIN : -err;
	gs_warn("accept: %s: refusing connections until some close (%u connections, %zu parked descriptors)",
		strerror(err), d->nconns, d->frame_budget.fds);
	if (d->reserve_fd < 0)
		return -EMFILE;
	close(d->reserve_fd);
	fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		gs_conn_refuse(fd, refuse_code, "gradsyncd has run out of file descriptors");
	d->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return fd >= 0 && d->reserve_fd >= 0 ? -EAGAIN : -EMFILE;
}

static void on_accept(uv_poll_t *p, int status, int events)
{
	struct gs_daemon *d = p->data;
	if (status < 0)
		return;
	/* Bounded per wake-up, like reads. */
	for (int i = 0; i < 64; i++) {
		struct sockaddr_storage addr;
		int fd = gs_server_accept(d, d->listen_fd, &addr, GS_ELIMIT);
		if (fd == -EMFILE) {
			/* No reserve either: listening pauses a moment. */
			uv_poll_stop(&d->listen_poll);
			uv_timer_start(&d->accept_pause, resume_accepting, ACCEPT_PAUSE_MS, 0);
		} else if (fd < 0 && fd != -EAGAIN) {
			gs_warn("accept: %s", strerror(-fd));
		}
		if (fd < 0)
			return;
		admit(d, fd);
	}
}

static void on_sweep(uv_timer_t *t)
{
	struct gs_daemon *d = t->data;
	uint64_t now = gs_now_ns();
	/* A client dropped here may take others with it (a step aborted,
	 * a write that fails): those are marked closing and skipped, and
	 * stay allocated until the loop's next turn. */
	for (struct gs_conn *c = d->conns, *next; c; c = next) {
		next = c->next;
		gs_conn_check_deadlines(c, now);
	}
	gs_log_flush();
}

/* The listening socket's companions: the reserve descriptor, the pause
 * timer and the deadline sweep. */
static void start_serving(struct gs_daemon *d, int fd)
{
	d->listen_fd = fd;
	d->listen_poll.data = d;
	d->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_timer_init(d->loop, &d->accept_pause);
	d->accept_pause.data = d;
	uv_timer_init(d->loop, &d->sweep);
	d->sweep.data = d;
	uv_timer_start(&d->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
	uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

/* A socket file nobody answers on is left over from a crash. */
static int path_in_use(const struct sockaddr_un *addr)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	int live = connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0;
	close(fd);
	return live;
}

/* Returns whether it created the directory. */
static bool make_parent_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return false;
	*slash = '\0';
	if (mkdir(dir, 0700) == 0)
		return true;
	if (errno != EEXIST)
		gs_warn("cannot create %s: %s", dir, strerror(errno));
	return false;
}

/* Socket activation: systemd made the socket, its mode and its group
 * (gradsyncd.socket); the daemon only accepts on it. */
static int listen_activated(struct gs_daemon *d, int fd)
{
	int r = uv_poll_init(d->loop, &d->listen_poll, fd);
	if (r < 0) {
		gs_error("cannot watch the socket from systemd: %s", uv_strerror(r));
		close(fd);
		return r;
	}
	gs_info("listening on %s, a socket passed by systemd", d->settings.socket_path);
	start_serving(d, fd);
	return 0;
}

int gs_server_listen(struct gs_daemon *d)
{
	int sd_fd = gs_notify_listen_fd(d->settings.socket_path, sizeof(d->settings.socket_path));
	if (sd_fd != -ENOENT)
		return sd_fd < 0 ? sd_fd : listen_activated(d, sd_fd);
	const char *path = d->settings.socket_path;
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (path_in_use(&addr)) {
		gs_error("another gradsyncd is already listening on %s", path);
		return -EADDRINUSE;
	}
	unlink(path);
	bool made_dir = make_parent_dir(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto err_socket;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(fd, 128) < 0)
		goto err_bind;
	int r = uv_poll_init(d->loop, &d->listen_poll, fd);
	if (r < 0) {
		errno = -r;
		goto err_bind;
	}
	gs_access_protect(&d->access, path, made_dir);
	start_serving(d, fd);
	return 0;

err_bind:
	close(fd);
err_socket:
	r = -errno;
	gs_error("cannot listen on %s: %s", path, strerror(errno));
	return r;
}

void gs_server_close(struct gs_daemon *d)
{
	if (d->listen_fd >= 0) {
		uv_poll_stop(&d->listen_poll);
		uv_close((uv_handle_t *)&d->listen_poll, NULL);
		uv_close((uv_handle_t *)&d->accept_pause, NULL);
		uv_close((uv_handle_t *)&d->sweep, NULL);
		close(d->listen_fd);
		d->listen_fd = -1;
		if (d->reserve_fd >= 0)
			close(d->reserve_fd);
		d->reserve_fd = -1;
		unlink(d->settings.socket_path);
	}
	while (d->conns)
		gs_conn_close(d->conns);
}
