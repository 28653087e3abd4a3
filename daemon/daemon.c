/*
 * The daemon's start-up and shutdown order, in one place: gradsyncd's
 * main.c and the fuzz target both run a daemon through these, so the
 * target exercises the order the real daemon keeps.
 */
#include <string.h>

#include "daemon.h"
#include "support/log.h"
#ifdef GS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif
#include "support/notify.h"
#include "serve/server.h"
#include "support/trace.h"

#ifdef GS_HAVE_CUDA
static struct gs_backend *open_cuda(const struct gs_settings *s, char *why, size_t n)
{
	struct gs_cuda_options o = {
		.local_size = s->local_size,
		.wire = (enum gs_wire)s->wire,
		.fusion_elements = s->fusion_elements,
		.peer_timeout_ms = (int)(s->peer_timeout * 1000),
		.nodes = s->nodes,
		.join_timeout_ms = (int)(s->join_timeout * 1000),
	};
	return gs_backend_cuda_open(&o, why, n);
}
#endif

static struct gs_backend *choose_backend(const struct gs_settings *s)
{
#ifdef GS_HAVE_CUDA
	if (s->backend != GS_BACKEND_HOST) {
		char why[400];
		struct gs_backend *cb = NULL;
		if (gs_cuda_usable(s->local_size, why, sizeof(why)))
			cb = open_cuda(s, why, sizeof(why));
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
						      s->fusion_elements, s->allow_hugetlb);
	if (!b)
		gs_error("cannot allocate %u fusion buffers of %llu elements", s->local_size,
			 (unsigned long long)s->fusion_elements);
	return b;
}

int gs_daemon_init(struct gs_daemon *d, uv_loop_t *loop)
{
	int r;
	d->loop = loop;
	d->listen_fd = -1;
	d->reserve_fd = -1;
	d->frame_budget.max_fds = d->settings.max_parked_fds;
	d->frame_budget.max_bytes = d->settings.max_pending_bytes;
	d->start_ns = gs_now_ns();
	d->backend = choose_backend(&d->settings);
	if (!d->backend)
		return -1;
	gs_job_init(&d->job, d);
	const struct gs_cluster_parts parts = {
		.loop = loop,
		.settings = &d->settings,
		.backend = d->backend,
		.worker = &d->worker,
		.job = &d->job,
		.conns = d,
	};
	gs_cluster_init(&d->cluster, &parts);
	gs_access_init(&d->access, &d->settings);
	d->trace = gs_trace_create(loop);
	if (!d->trace || gs_notify_start(d) < 0) {
		gs_error("out of memory starting");
		goto err_backend;
	}
	r = gs_worker_start(&d->worker, loop);
	if (r < 0) {
		gs_error("cannot start the worker thread: %s", strerror(-r));
		goto err_backend;
	}
	return 0;

	/* Only the backend is undone: the caller exits, and the loop's
	 * handles made so far go with the process. */
err_backend:
	d->backend->ops->destroy(d->backend);
	d->backend = NULL;
	return -1;
}

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
	/* The cluster first: the connections closed next are no news to it. */
	gs_cluster_cancel(&d->cluster);
	gs_server_close(d);
	gs_job_close(&d->job);
	gs_cluster_close(&d->cluster);
	/* The signals are the program's to watch: the fuzz target leaves
	 * them to libFuzzer. */
	if (d->sigint.loop)
		uv_close((uv_handle_t *)&d->sigint, NULL);
	if (d->sigterm.loop)
		uv_close((uv_handle_t *)&d->sigterm, NULL);
	gs_worker_stop(&d->worker);
	gs_trace_close(d->trace);
}

void gs_daemon_free(struct gs_daemon *d)
{
	gs_trace_destroy(d->trace);
	gs_job_destroy(&d->job);
	gs_cluster_destroy(&d->cluster);
	d->backend->ops->destroy(d->backend);
}
