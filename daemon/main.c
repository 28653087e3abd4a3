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

#include "daemon.h"
#include "support/log.h"
#include "support/notify.h"
#include "support/process_limits.h"
#include "serve/server.h"
#include "backend/host/shm_guard.h"

static void on_signal(uv_signal_t *s, int signum)
{
	struct gs_daemon *d = s->data;
	gs_info("%s received: shutting down", strsignal(signum));
	gs_daemon_shutdown(d, 0);
}

/* The node has joined (or there was nothing to join): serve trainers. */
static void on_ready(void *arg, bool ok)
{
	struct gs_daemon *d = arg;
	if (!ok || d->stopping) {
		gs_daemon_shutdown(d, 1);
		return;
	}
	gs_job_set_world(&d->job);
	if (gs_server_listen(d) < 0) {
		gs_daemon_shutdown(d, 1);
		return;
	}
	gs_notify_ready(d);
	const struct gs_settings *s = &d->settings;
	gs_info("gradsyncd %s listening on %s: backend %s, kernels %s, node %u of %u, %u trainers here of %u, wire %s, threshold %llu elements",
		GS_VERSION, s->socket_path, d->backend->name, gs_isa_name(gs_isa_active()),
		s->node_rank, s->nodes, s->local_size, d->cluster.world_size,
		gs_wire_name((enum gs_wire)s->wire), (unsigned long long)s->threshold);
}

static int run(struct gs_daemon *d)
{
	if (gs_daemon_init(d, uv_default_loop()) < 0)
		return 1;
	uv_signal_init(d->loop, &d->sigint);
	uv_signal_init(d->loop, &d->sigterm);
	d->sigint.data = d->sigterm.data = d;
	uv_signal_start(&d->sigint, on_signal, SIGINT);
	uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	if (gs_cluster_start(&d->cluster, on_ready, d) != 0)
		gs_daemon_shutdown(d, 1);

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
