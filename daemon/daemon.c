/*
 * The daemon's start-up and shutdown order, in one place: gradsyncd's
 * main.c and the fuzz target both run a daemon through these, so the
 * target exercises the order the real daemon keeps. This is where the
 * layers are wired together: the connections' set to the job, the
 * listener to the session, the control layer's view to the parts it
 * reads, systemd's status lines to the status.
 */
#include <signal.h>
#include <string.h>

#include "backend/cuda/buffer_desc.h"
#include "daemon.h"
#include "support/log.h"
#ifdef GS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif
#include "backend/host/shm_guard.h"
#include "control/session.h"
#include "control/status.h"
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

static bool buffer_takes_fd(const Gradsync__Buffer *m)
{
	return gs_buffer_kind_of(m) == GS_BUFFER_MEMFD;
}

static bool memory_lost(const void *addr)
{
	return gs_shm_guard_lost_ranges() > 0 && gs_shm_guard_lost(addr);
}

static void start_job(struct gs_daemon *d)
{
	struct gs_engine_env env = {
		.loop = d->loop,
		.settings = &d->settings,
		.backend = d->backend,
		.worker = &d->worker,
		.trace = d->trace,
		.group = { &d->cluster, gs_cluster_agree_layout, gs_cluster_withdraw_layout,
			   gs_cluster_request_regroup, gs_cluster_vote },
		.buffer_takes_fd = buffer_takes_fd,
		.parse_buffer = gs_buffer_desc_parse,
		.memory_lost = memory_lost,
	};
	gs_job_init(&d->job, &env);
}

static struct gs_backend *choose_backend(const struct gs_settings *s)
{
#ifdef GS_HAVE_CUDA
	if (s->backend != GS_BACKEND_HOST) {
		char why[400];
		struct gs_backend *cb = NULL;
		if (gs_cuda_usable(NULL, why, sizeof(why)))
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

static void status_line(void *view, char *out, size_t n)
{
	gs_status_line(view, out, n);
}

/* Sets up d on loop: everything but joining, signals and the socket. */
static int init(struct gs_daemon *d, uv_loop_t *loop)
{
	int r;
	const struct gs_settings *s = &d->settings;
	d->loop = loop;
	d->view.start_ns = gs_now_ns();
	gs_conn_set_init(&d->conns, loop, s->max_frame, s->hello_timeout, s->frame_timeout,
			 s->max_parked_fds, s->max_pending_bytes);
	gs_server_init(&d->server, &d->conns, &d->settings, &d->access, gs_session_accept,
		       &d->view);
	d->cluster.cancel_fd = -1;
	d->backend = choose_backend(&d->settings);
	if (!d->backend)
		return -1;
	const struct gs_cluster_parts parts = {
		.loop = loop,
		.settings = &d->settings,
		.backend = d->backend,
		.worker = &d->worker,
		.job = &d->job,
		.server = &d->server,
	};
	gs_cluster_init(&d->cluster, &parts);
	gs_access_init(&d->access, &d->settings);
	d->trace = gs_trace_create(loop);
	start_job(d);
	if (!d->trace) {
		gs_error("out of memory starting");
		goto err_backend;
	}
	d->view.settings = &d->settings;
	d->view.job = &d->job;
	d->view.cluster = &d->cluster;
	d->view.backend = d->backend;
	d->view.conns = &d->conns;
	d->view.stats = &d->job.stats;
	d->view.trace = d->trace;
	gs_notify_start(&d->notifier, loop, status_line, &d->view);
	if (s->nodes > 1)
		gs_notify("STATUS=joining: node %u of %u, rendezvous at %s", s->node_rank, s->nodes,
			  s->coordinator);
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
	if (!d->serve)
		return;
	if (gs_server_listen(&d->server) < 0) {
		gs_daemon_shutdown(d, 1);
		return;
	}
	gs_notify_ready(&d->notifier);
	const struct gs_settings *s = &d->settings;
	gs_info("gradsyncd %s listening on %s: backend %s, kernels %s, node %u of %u, %u trainers here of %u, wire %s, threshold %llu elements",
		GS_VERSION, s->socket_path, d->backend->name, gs_isa_name(gs_isa_active()),
		s->node_rank, s->nodes, s->local_size, d->cluster.world_size,
		gs_wire_name((enum gs_wire)s->wire), (unsigned long long)s->threshold);
}

int gs_daemon_start(struct gs_daemon *d, uv_loop_t *loop, bool serve)
{
	if (init(d, loop) < 0)
		return -1;
	d->serve = serve;
	/* The signals are the program's to watch: the fuzz target leaves
	 * them to libFuzzer. */
	if (serve) {
		uv_signal_init(loop, &d->sigint);
		uv_signal_init(loop, &d->sigterm);
		d->sigint.data = d->sigterm.data = d;
		uv_signal_start(&d->sigint, on_signal, SIGINT);
		uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	}
	if (gs_cluster_start(&d->cluster, on_ready, d) != 0)
		gs_daemon_shutdown(d, 1);
	return 0;
}

void gs_daemon_shutdown(struct gs_daemon *d, int exit_code)
{
	if (d->stopping)
		return;
	d->stopping = 1;
	d->exit_code = exit_code;
	gs_notify_stopping(&d->notifier);
	/* systemd owns an activated socket's file: it must outlive us. */
	if (gs_notify_socket_activated())
		d->settings.socket_path[0] = '\0';
	/* The cluster first: the connections closed next are no news to it. */
	gs_cluster_cancel(&d->cluster);
	gs_server_close(&d->server);
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
