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

#include "clock.h"
#include "cluster/rendezvous.h"
#include "control/view.h"
#include "frame.h"
#include "jobs/jobs.h"
#include "serve/access.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/notify.h"
#include "support/settings.h"

struct gs_trace;

struct gs_daemon {
	uv_loop_t *loop;
	struct gs_settings settings; /* the node's */
	struct gs_jobs jobs;         /* every job served, each with its backend and group */
	struct gs_conn_set conns;    /* local clients and nodes */
	struct gs_server server;     /* the listening socket */
	struct gs_node_port port;    /* where other nodes' daemons connect */
	uv_signal_t sigint, sigterm;
	uv_timer_t stop_deadline;    /* a stop that hangs ends here (daemon.c) */
	struct gs_access access;
	struct gs_trace *trace;       /* bucket phases: trace file, metrics */
	struct gs_notifier notifier;  /* under systemd: status lines */
	struct gs_node_view view;     /* what the control layer reads */
	bool serve; /* listens, watches signals, tells systemd (not so in the fuzz target) */
	int stopping;
	int exit_code;
};

/* Starts d (its settings already loaded) on loop: the backend the
 * settings ask for (each job gets its own), the job table, access rules,
 * trace and systemd notifier. With serve, it watches SIGINT and SIGTERM,
 * listens on the socket and the node port and tells systemd it is ready;
 * without (the fuzz target), clients come only through gs_server_adopt.
 * Returns 0, after which the caller runs the loop, or -1 having logged
 * why: the caller should then exit. */
int gs_daemon_start(struct gs_daemon *d, uv_loop_t *loop, bool serve);

/* Stops serving, finishes the work in flight and leaves the loop. */
void gs_daemon_shutdown(struct gs_daemon *d, int exit_code);

/* Frees what gs_daemon_start and the cluster made, once gs_daemon_shutdown
 * has run and the loop has run dry. The loop stays the caller's to close. */
void gs_daemon_free(struct gs_daemon *d);

#endif
