/*
 * The daemon's start-up and shutdown order, in one place: gradsyncd's
 * main.c and the fuzz target both run a daemon through these, so the
 * target exercises the order the real daemon keeps. This is where the
 * layers are wired together: the job table to its backends and to the
 * session's Welcome, the listener to the session, the control layer's
 * view to the parts it reads, systemd's status lines to the status.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/buffer_desc.h"
#include "backend/fusion_budget.h"
#include "daemon.h"
#include "support/log.h"
#ifdef GS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif
#include "backend/host/shm_guard.h"
#include "control/session.h"
#include "control/status.h"
#include "support/trace.h"


/* The backend every job gets, chosen at start: "cuda" or "host". */
static const char *node_backend = "host";
/* The bytes every job's fusion buffers may hold together
 * (--max-fusion-memory), which each job's backend takes its share of. */
static struct gs_fusion_budget node_budget;

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
		.gpus = s->gpus,
		.budget = &node_budget,
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

/* A job's backend (gs_jobs_env.open_backend): its own fusion buffers and
 * communicators, of its local size, wire dtype and fusion buffer. The
 * buffers are sized, within the node's budget, once its layout is known. */
static struct gs_backend *open_backend(const struct gs_settings *s, char *why, size_t n)
{
#ifdef GS_HAVE_CUDA
	if (strcmp(node_backend, "cuda") == 0)
		return open_cuda(s, why, n);
#endif
	const struct gs_host_options o = {
		.local_size = s->local_size,
		.wire = (enum gs_wire)s->wire,
		.fusion_elements = s->fusion_elements,
		.allow_hugetlb = s->allow_hugetlb,
		.nodes = s->nodes,
		.budget = &node_budget,
	};
	struct gs_backend *b = gs_backend_host_create(&o);
	if (!b)
		snprintf(why, n, "out of memory setting up its backend for %u trainers",
			 s->local_size);
	return b;
}

/* Which backend the node's jobs get; -1 when the one asked for cannot run. */
static int choose_backend(const struct gs_settings *s)
{
#ifdef GS_HAVE_CUDA
	if (s->backend != GS_BACKEND_HOST) {
		char why[400];
		if (gs_cuda_usable(s->gpus, why, sizeof(why))) {
			if (s->backend == GS_BACKEND_AUTO)
				gs_info("backend auto: using cuda (each tensor reduced on the GPU that holds it)");
			node_backend = "cuda";
			return 0;
		}
		if (s->backend == GS_BACKEND_CUDA) {
			gs_error("--backend cuda: the CUDA backend cannot run here: %s", why);
			return -1;
		}
		gs_info("backend auto: using host, since the CUDA backend cannot run here: %s", why);
	}
#else
	if (s->backend == GS_BACKEND_CUDA) {
		gs_error("--backend cuda: this gradsyncd was built without the CUDA backend; "
			 "use --backend host or --backend auto");
		return -1;
	}
	if (s->backend == GS_BACKEND_AUTO)
		gs_info("backend auto: using host (this build has no CUDA backend)");
#endif
	node_backend = "host";
	return 0;
}

static void status_line(void *view, char *out, size_t n)
{
	gs_status_line(view, out, n);
}

/* Sets up d on loop: everything but signals and the sockets. */
static int init(struct gs_daemon *d, uv_loop_t *loop)
{
	const struct gs_settings *s = &d->settings;
	d->loop = loop;
	d->view.start_ns = gs_now_ns();
	gs_conn_set_init(&d->conns, loop, s->max_frame, s->hello_timeout, s->frame_timeout,
			 s->max_parked_fds, s->max_pending_bytes, s->max_queued_bytes);
	gs_server_init(&d->server, &d->conns, &d->settings, &d->access, gs_session_accept,
		       &d->view);
	if (choose_backend(s) < 0)
		return -1;
	gs_fusion_budget_init(&node_budget, s->max_fusion_memory);
	gs_access_init(&d->access, &d->settings);
	d->trace = gs_trace_create(loop);
	if (!d->trace) {
		gs_error("out of memory starting");
		return -1;
	}
	/* The port takes jobs' rendezvous whether it listens or not. */
	memset(&d->port, 0, sizeof(d->port));
	d->port.loop = loop;
	d->port.settings = s;
	d->port.server = &d->server;
	d->port.fd = -1;
	const struct gs_jobs_env env = {
		.loop = loop,
		.settings = s,
		.server = &d->server,
		.port = &d->port,
		.trace = d->trace,
		.open_backend = open_backend,
		.buffer_takes_fd = buffer_takes_fd,
		.parse_buffer = gs_buffer_desc_parse,
		.memory_lost = memory_lost,
		.welcome = gs_session_welcome,
	};
	gs_jobs_init(&d->jobs, &env);
	d->view.settings = &d->settings;
	d->view.jobs = &d->jobs;
	d->view.conns = &d->conns;
	d->view.trace = d->trace;
	d->view.backend = node_backend;
	d->view.fusion_budget = &node_budget;
	gs_notify_start(&d->notifier, loop, status_line, &d->view);
	return 0;
}

static void on_signal(uv_signal_t *s, int signum)
{
	struct gs_daemon *d = s->data;
	gs_info("%s received: shutting down", strsignal(signum));
	gs_daemon_shutdown(d, 0);
}

/* Serves trainers and other nodes. */
static int serve(struct gs_daemon *d)
{
	if (d->settings.node_port != 0 &&
	    gs_node_port_start(&d->port, d->loop, &d->settings, &d->server) < 0)
		return -1;
	if (gs_server_listen(&d->server) < 0)
		return -1;
	gs_notify_ready(&d->notifier);
	const struct gs_settings *s = &d->settings;
	if (s->node_port == 0)
		gs_info("gradsyncd %s listening on %s: backend %s, kernels %s; jobs of one node only (--node-port 0), up to %llu",
			GS_VERSION, s->socket_path, node_backend, gs_isa_name(gs_isa_active()),
			(unsigned long long)s->max_jobs);
	else
		gs_info("gradsyncd %s listening on %s: backend %s, kernels %s, other nodes reach it at %s port %u; up to %llu jobs",
			GS_VERSION, s->socket_path, node_backend, gs_isa_name(gs_isa_active()),
			s->node_address[0] ? s->node_address : "(the host name)", s->node_port,
			(unsigned long long)s->max_jobs);
	return 0;
}

int gs_daemon_start(struct gs_daemon *d, uv_loop_t *loop, bool serving)
{
	if (init(d, loop) < 0)
		return -1;
	d->serve = serving;
	/* The signals are the program's to watch: the fuzz target leaves
	 * them to libFuzzer. */
	if (serving) {
		uv_signal_init(loop, &d->sigint);
		uv_signal_init(loop, &d->sigterm);
		d->sigint.data = d->sigterm.data = d;
		uv_signal_start(&d->sigint, on_signal, SIGINT);
		uv_signal_start(&d->sigterm, on_signal, SIGTERM);
		if (serve(d) < 0)
			gs_daemon_shutdown(d, 1);
	}
	return 0;
}

/* Seconds a stop may take. Its waits all end at once (a collective is
 * interrupted, a join is cancelled); one still open past this is a
 * handle left behind by mistake, which would hold the daemon for as long
 * as its timer runs (say --job-linger) until systemd kills it. */
#define STOP_DEADLINE_S 20

static void name_open_handle(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (uv_is_active(h) && uv_has_ref(h) && !uv_is_closing(h))
		gs_error("  still open: %s handle", uv_handle_type_name(uv_handle_get_type(h)));
}

static void on_stop_deadline(uv_timer_t *t)
{
	struct gs_daemon *d = t->data;
	gs_error("still not stopped %d s after the shutdown began: exiting anyway (exit status 1); what held it:",
		 STOP_DEADLINE_S);
	uv_walk(d->loop, name_open_handle, NULL);
	fflush(NULL);
	/* Not exit(): threads of the jobs may still run, and must not meet
	 * static destructors. */
	_exit(1);
}

static void start_stop_deadline(struct gs_daemon *d)
{
	uv_timer_init(d->loop, &d->stop_deadline);
	d->stop_deadline.data = d;
	uv_timer_start(&d->stop_deadline, on_stop_deadline, STOP_DEADLINE_S * 1000, 0);
	uv_unref((uv_handle_t *)&d->stop_deadline); /* it does not keep the loop running */
}

void gs_daemon_shutdown(struct gs_daemon *d, int exit_code)
{
	if (d->stopping)
		return;
	d->stopping = 1;
	d->exit_code = exit_code;
	if (d->serve)
		start_stop_deadline(d);
	gs_notify_stopping(&d->notifier);
	/* systemd owns an activated socket's file: it must outlive us. */
	if (gs_notify_socket_activated())
		d->settings.socket_path[0] = '\0';
	/* The jobs' groups first: the connections closed next are no news
	 * to them. */
	gs_jobs_cancel(&d->jobs);
	gs_node_port_close(&d->port);
	gs_server_close(&d->server);
	gs_jobs_close(&d->jobs);
	/* The signals are the program's to watch: the fuzz target leaves
	 * them to libFuzzer. */
	if (d->sigint.loop)
		uv_close((uv_handle_t *)&d->sigint, NULL);
	if (d->sigterm.loop)
		uv_close((uv_handle_t *)&d->sigterm, NULL);
	gs_trace_close(d->trace);
}

void gs_daemon_free(struct gs_daemon *d)
{
	if (d->stop_deadline.loop) {
		uv_close((uv_handle_t *)&d->stop_deadline, NULL);
		uv_run(d->loop, UV_RUN_NOWAIT); /* its close */
	}
	/* The jobs were freed from the loop, as their handles closed. */
	gs_trace_destroy(d->trace);
}
