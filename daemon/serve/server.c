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

#include "clock.h"
#include "errors.h"
#include "support/log.h"
#include "support/notify.h"

/* How often clients' deadlines are checked: a deadline is met within this
 * much of its setting. */
#define SWEEP_MS 250
/* Out of descriptors with none in reserve: listening pauses this long. */
#define ACCEPT_PAUSE_MS 1000

/* Limits first, before anything is allocated for the client; then its
 * credentials, logged either way. */
static void admit(struct gs_server *srv, int fd)
{
	struct ucred cred = { 0, (uid_t)-1, (gid_t)-1 };
	socklen_t len = sizeof(cred);
	getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
	char why[256];
	if (srv->conns->count >= srv->settings->max_clients) {
		snprintf(why, sizeof(why), "gradsyncd serves at most %llu connections (--max-clients)",
			 (unsigned long long)srv->settings->max_clients);
		gs_warn("refusing pid %d uid %u: %s", (int)cred.pid, (unsigned)cred.uid, why);
		gs_conn_refuse(fd, GS_ELIMIT, why);
		return;
	}
	if (!gs_access_allowed(srv->access, &cred, why, sizeof(why))) {
		gs_warn("refusing pid %d uid %u gid %u: %s", (int)cred.pid, (unsigned)cred.uid,
			(unsigned)cred.gid, why);
		gs_conn_refuse(fd, GS_EREFUSED, why);
		return;
	}
	gs_info("client pid %d uid %u gid %u connected", (int)cred.pid, (unsigned)cred.uid,
		(unsigned)cred.gid);
	gs_server_adopt(srv, fd);
}

void gs_server_init(struct gs_server *srv, struct gs_conn_set *conns,
		    struct gs_settings *settings, const struct gs_access *access,
		    void (*accepted)(struct gs_conn *c, void *ctx), void *ctx)
{
	*srv = (struct gs_server){ .conns = conns, .settings = settings, .access = access,
				   .accepted = accepted, .ctx = ctx, .listen_fd = -1,
				   .reserve_fd = -1 };
}

struct gs_conn *gs_server_adopt(struct gs_server *srv, int fd)
{
	struct gs_conn_set *set = srv->conns;
	uint64_t max = set->max_frame;
	struct gs_conn *c = gs_conn_create(set, fd, max < GS_CONN_SMALL_FRAME ? max : GS_CONN_SMALL_FRAME,
					   NULL, NULL);
	if (c) {
		c->timed = true;
		c->hello_deadline_ns = gs_now_ns() + set->hello_timeout * 1000000000ull;
		srv->accepted(c, srv->ctx);
	}
	return c;
}

static void on_accept(uv_poll_t *p, int status, int events);

static void resume_accepting(uv_timer_t *t)
{
	struct gs_server *srv = t->data;
	if (srv->listen_fd >= 0)
		uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
}

int gs_server_accept(struct gs_server *srv, int listen_fd, struct sockaddr_storage *addr,
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
		strerror(err), srv->conns->count, srv->conns->budget.fds);
	if (srv->reserve_fd < 0)
		return -EMFILE;
	close(srv->reserve_fd);
	fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		gs_conn_refuse(fd, refuse_code, "gradsyncd has run out of file descriptors");
	srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return fd >= 0 && srv->reserve_fd >= 0 ? -EAGAIN : -EMFILE;
}

static void on_accept(uv_poll_t *p, int status, int events)
{
	struct gs_server *srv = p->data;
	if (status < 0)
		return;
	/* Bounded per wake-up, like reads. */
	for (int i = 0; i < 64; i++) {
		struct sockaddr_storage addr;
		int fd = gs_server_accept(srv, srv->listen_fd, &addr, GS_ELIMIT);
		if (fd == -EMFILE) {
			/* No reserve either: listening pauses a moment. */
			uv_poll_stop(&srv->listen_poll);
			uv_timer_start(&srv->accept_pause, resume_accepting, ACCEPT_PAUSE_MS, 0);
		} else if (fd < 0 && fd != -EAGAIN) {
			gs_warn("accept: %s", strerror(-fd));
		}
		if (fd < 0)
			return;
		admit(srv, fd);
	}
}

static void on_sweep(uv_timer_t *t)
{
	struct gs_server *srv = t->data;
	uint64_t now = gs_now_ns();
	/* A client dropped here may take others with it (a step aborted,
	 * a write that fails): those are marked closing and skipped, and
	 * stay allocated until the loop's next turn. */
	for (struct gs_conn *c = srv->conns->head, *next; c; c = next) {
		next = c->next;
		gs_conn_check_deadlines(c, now);
	}
	gs_log_flush();
}

/* The listening socket's companions: the reserve descriptor, the pause
 * timer and the deadline sweep. */
static void start_serving(struct gs_server *srv, int fd)
{
	uv_loop_t *loop = srv->conns->loop;
	srv->listen_fd = fd;
	srv->listen_poll.data = srv;
	srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_timer_init(loop, &srv->accept_pause);
	srv->accept_pause.data = srv;
	uv_timer_init(loop, &srv->sweep);
	srv->sweep.data = srv;
	uv_timer_start(&srv->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
	uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
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
static int listen_activated(struct gs_server *srv, int fd)
{
	int r = uv_poll_init(srv->conns->loop, &srv->listen_poll, fd);
	if (r < 0) {
		gs_error("cannot watch the socket from systemd: %s", uv_strerror(r));
		close(fd);
		return r;
	}
	gs_info("listening on %s, a socket passed by systemd", srv->settings->socket_path);
	start_serving(srv, fd);
	return 0;
}

int gs_server_listen(struct gs_server *srv)
{
	struct gs_settings *s = srv->settings;
	int sd_fd = gs_notify_listen_fd(s->socket_path, sizeof(s->socket_path));
	if (sd_fd != -ENOENT)
		return sd_fd < 0 ? sd_fd : listen_activated(srv, sd_fd);
	const char *path = s->socket_path;
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
	int r = uv_poll_init(srv->conns->loop, &srv->listen_poll, fd);
	if (r < 0) {
		errno = -r;
		goto err_bind;
	}
	gs_access_protect(srv->access, path, made_dir);
	start_serving(srv, fd);
	return 0;

err_bind:
	close(fd);
err_socket:
	r = -errno;
	gs_error("cannot listen on %s: %s", path, strerror(errno));
	return r;
}

void gs_server_close(struct gs_server *srv)
{
	if (srv->listen_fd >= 0) {
		uv_poll_stop(&srv->listen_poll);
		uv_close((uv_handle_t *)&srv->listen_poll, NULL);
		uv_close((uv_handle_t *)&srv->accept_pause, NULL);
		uv_close((uv_handle_t *)&srv->sweep, NULL);
		close(srv->listen_fd);
		srv->listen_fd = -1;
		if (srv->reserve_fd >= 0)
			close(srv->reserve_fd);
		srv->reserve_fd = -1;
		unlink(srv->settings->socket_path);
	}
	while (srv->conns->head)
		gs_conn_close(srv->conns->head);
}
