#include "fuzz-daemon.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "support/log.h"

static const char *log_level = "error";

void fuzz_daemon_init(void)
{
	const char *e = getenv("GS_FUZZ_LOG");
	if (e && *e)
		log_level = e;
	signal(SIGPIPE, SIG_IGN);
	/* libuv opens a process-wide pipe with the first loop; open it now, so
	 * that the descriptor count of the first input is not off by it. */
	uv_loop_t loop;
	if (uv_loop_init(&loop) != 0 || uv_loop_close(&loop) != 0)
		abort();
}

int fuzz_count_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		abort();
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n - 1; /* the directory's own */
}

void fuzz_list_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	while (dir && (e = readdir(dir))) {
		char path[300], target[256];
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n > 0 && e->d_name[0] != '.') {
			target[n] = '\0';
			fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
		}
	}
	if (dir)
		closedir(dir);
}

struct gs_daemon *fuzz_daemon_open(void)
{
	char level[64];
	snprintf(level, sizeof(level), "--log-level=%s", log_level);
	char *argv[] = {
		"gradsyncd-fuzz", "--config=", "--backend=host", level,
		"--max-fusion-buffer=65536", "--max-nodes=1", "--job-linger=0", "--max-frame=4096",
		"--max-tensors=64", "--max-bytes=65536", "--group=", NULL,
	};
	struct gs_daemon *d = calloc(1, sizeof(*d));
	uv_loop_t *loop = calloc(1, sizeof(*loop));
	if (!d || !loop || uv_loop_init(loop) != 0)
		abort();
	if (gs_settings_load(&d->settings, (int)(sizeof(argv) / sizeof(argv[0])) - 1, argv) !=
	    GS_SETTINGS_RUN)
		abort();
	gs_log_init((enum gs_log_level)d->settings.log_level);
	if (gs_daemon_start(d, loop, false) < 0 || d->stopping)
		abort();
	return d;
}

static void print_handle(uv_handle_t *h, void *arg)
{
	(void)arg;
	fprintf(stderr, "  %s handle %p%s%s\n", uv_handle_type_name(uv_handle_get_type(h)),
		(void *)h, uv_is_active(h) ? ", active" : "", uv_is_closing(h) ? ", closing" : "");
}

void fuzz_daemon_close(struct gs_daemon *d)
{
	uv_loop_t *loop = d->loop;
	gs_daemon_shutdown(d, 0);
	uv_run(loop, UV_RUN_DEFAULT);
	gs_daemon_free(d);
	if (uv_loop_close(loop) != 0) {
		fprintf(stderr, "fuzz: uv handles still open after shutdown:\n");
		uv_walk(loop, print_handle, NULL);
		__builtin_trap();
	}
	free(loop);
	free(d);
}
