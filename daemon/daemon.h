/*
 * The daemon's top-level state: every part of the node, owned here and
 * wired together by daemon.c. Only main.c and daemon.c (and the fuzz
 * target) see it; each part below is given what it needs.
 */
#ifndef GS_DAEMON_H
#define GS_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "backend/backend.h"
#include "clock.h"
#include "cluster/cluster.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/stats.h"
#include "frame.h"
#include "serve/access.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/notify.h"
#include "support/settings.h"
#include "support/worker.h"

struct gs_trace;

struct gs_daemon {
	uv_loop_t *loop;
	struct gs_settings settings;
	struct gs_backend *backend;
	struct gs_worker worker;
	struct gs_job job;
	struct gs_cluster cluster;
	struct gs_conn_set conns;  /* local clients and nodes */
	struct gs_server server;   /* the listening socket */
	uv_signal_t sigint, sigterm;
	struct gs_access access;
	struct gs_trace *trace;       /* bucket phases: trace file, metrics */
	struct gs_notifier notifier;  /* under systemd: status lines */
	struct gs_node_view view;     /* what the control layer reads */
	bool serve; /* listens, watches signals, tells systemd (not so in the fuzz target) */
	int stopping;
	int exit_code;
};

/* Starts d (its settings already loaded) on loop: the backend the settings
 * ask for, the job, access rules, trace, systemd notifier and worker
 * thread, then joining the other nodes. With serve, it watches SIGINT and
 * SIGTERM and, once the node has joined, listens on the socket and tells
 * systemd it is ready; without (the fuzz target), clients come only
 * through gs_server_adopt. Returns 0, after which the caller runs the loop
 * (a failure to join shuts the daemon down from there, with exit code 1),
 * or -1 having logged why: the caller should then exit. */
int gs_daemon_start(struct gs_daemon *d, uv_loop_t *loop, bool serve);

/* Stops serving, finishes the work in flight and leaves the loop. */
void gs_daemon_shutdown(struct gs_daemon *d, int exit_code);

/* Frees what gs_daemon_start and the cluster made, once gs_daemon_shutdown
 * has run and the loop has run dry. The loop stays the caller's to close. */
void gs_daemon_free(struct gs_daemon *d);

#endif
