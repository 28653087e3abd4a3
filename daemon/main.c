/*
 * gradsyncd: the per-node gradient synchronisation daemon. Parses the
 * settings, picks the backend, joins the other nodes when there are any,
 * then serves trainers until SIGINT or SIGTERM, after which it finishes the
 * work in flight and exits.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/host/shm_guard.h"
#include "daemon.h"
#include "support/log.h"
#include "support/process_limits.h"

static int run(struct gs_daemon *d)
{
	if (gs_daemon_start(d, uv_default_loop(), true) < 0)
		return 1;

	uv_run(d->loop, UV_RUN_DEFAULT);

	gs_daemon_free(d);
	uv_loop_close(d->loop);
	gs_info("stopped");
	return d->exit_code;
}

int main(int argc, char **argv)
{
	static struct gs_daemon d;
	switch (gs_settings_load(&d.settings, argc, argv)) {
	case GS_SETTINGS_EXIT_OK:
		return 0;
	case GS_SETTINGS_EXIT_USAGE:
		return 2;
	case GS_SETTINGS_RUN:
		break;
	}
	gs_log_init((enum gs_log_level)d.settings.log_level);
	if (gs_limits_check(&d.settings) < 0)
		return 2;
	signal(SIGPIPE, SIG_IGN);
	/* Before any trainer's memory is mapped: pages that vanish under the
	 * daemon then fail that trainer, not the daemon. Room for every
	 * mapping --max-mappings lets trainers have. */
	int r = gs_shm_guard_start(d.settings.max_mappings);
	if (r < 0) {
		gs_error("cannot set up the guard over trainers' shared memory: %s", strerror(-r));
		return 1;
	}
	int status = run(&d);
	gs_shm_guard_stop();
	gs_secret_wipe(d.settings.cluster_secret, sizeof(d.settings.cluster_secret));
	return status;
}
