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
#include "log.h"
#ifdef GS_HAVE_CUDA
#include "backend_cuda.h"
#endif
#include "notify.h"
#include "rendezvous.h"
#include "server.h"
#include "trace.h"

void gs_daemon_shutdown(struct gs_daemon *d, int exit_code)
{
	if (d->stopping)
		return;
	d->stopping = 1;
	d->exit_code = exit_code;
	gs_notify_stopping(d);
	/* systemd owns an activated socket's file: it must outlive us. */
	if (gs_notify_socket_activated())
		d->settings.socket_path[0] = '\0';
	gs_server_close(d);
	gs_rdv_server_stop(d);
	gs_cluster_cancel(d);
	gs_job_close(&d->job);
	if (d->cluster.agree_timer.loop)
		uv_close((uv_handle_t *)&d->cluster.agree_timer, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	gs_worker_stop(&d->worker);
	gs_trace_close(d->trace);
}

static void on_signal(uv_signal_t *s, int signum)
{
	struct gs_daemon *d = s->data;
	gs_info("%s received: shutting down", strsignal(signum));
	gs_daemon_shutdown(d, 0);
}

static struct gs_backend *choose_backend(const struct gs_settings *s)
{
#ifdef GS_HAVE_CUDA
	if (s->backend != GS_BACKEND_HOST) {
		char why[400];
		struct gs_backend *cb = NULL;
		if (gs_cuda_usable(s->local_size, why, sizeof(why)))
			cb = gs_backend_cuda_open(s, why, sizeof(why));
		if (cb && s->backend == GS_BACKEND_AUTO)
			gs_info("backend auto: using cuda (one GPU per local rank)");
		if (cb)
			return cb;
		if (s->backend == GS_BACKEND_CUDA) {
			gs_error("--backend cuda: the CUDA backend cannot run here: %s", why);
			return NULL;
		}
		gs_info("backend auto: using host, since the CUDA backend cannot run here: %s", why);
	}
#else
	if (s->backend == GS_BACKEND_CUDA) {
		gs_error("--backend cuda: this gradsyncd was built without the CUDA backend; "
			 "use --backend host or --backend auto");
		return NULL;
	}
	if (s->backend == GS_BACKEND_AUTO)
		gs_info("backend auto: using host (this build has no CUDA backend)");
#endif
	struct gs_backend *b = gs_backend_host_create(s->local_size, (enum gs_wire)s->wire,
						      s->fusion_elements);
	if (!b)
		gs_error("cannot allocate %u fusion buffers of %llu elements", s->local_size,
			 (unsigned long long)s->fusion_elements);
	return b;
}

/* The node has joined (or there was nothing to join): serve trainers. */
static void on_ready(struct gs_daemon *d, bool ok)
{
	if (!ok || d->stopping) {
		gs_daemon_shutdown(d, 1);
		return;
	}
	gs_job_set_world(&d->job);
	if (d->cluster.gloo)
		gs_backend_host_attach_gloo(d->backend, d->cluster.gloo,
					    (int)(d->settings.peer_timeout * 1000));
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
	d->loop = uv_default_loop();
	d->listen_fd = -1;
	d->start_ns = gs_now_ns();
	d->cluster.cancel_fd = -1;
	d->backend = choose_backend(&d->settings);
	if (!d->backend)
		return 1;
	gs_job_init(&d->job, d);
	gs_access_init(&d->access, &d->settings);
	d->trace = gs_trace_create(d->loop);
	if (!d->trace || gs_notify_start(d) < 0) {
		gs_error("out of memory starting");
		d->backend->ops->destroy(d->backend);
		return 1;
	}
	int r = gs_worker_start(&d->worker, d->loop);
	if (r < 0) {
		gs_error("cannot start the worker thread: %s", strerror(-r));
		d->backend->ops->destroy(d->backend);
		return 1;
	}
	uv_signal_init(d->loop, &d->sigint);
	uv_signal_init(d->loop, &d->sigterm);
	d->sigint.data = d->sigterm.data = d;
	uv_signal_start(&d->sigint, on_signal, SIGINT);
	uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	if (gs_cluster_start(d, on_ready) != 0)
		gs_daemon_shutdown(d, 1);

	uv_run(d->loop, UV_RUN_DEFAULT);

	gs_trace_destroy(d->trace);
	gs_job_destroy(&d->job);
	gs_cluster_destroy(d);
	d->backend->ops->destroy(d->backend);
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
	signal(SIGPIPE, SIG_IGN);
	return run(&d);
}
