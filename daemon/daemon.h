/*
 * The daemon's top-level state, shared by its parts: the loop, settings,
 * backend, worker, the job of the node, connections and running figures.
 */
#ifndef GS_DAEMON_H
#define GS_DAEMON_H

#include <stdint.h>
#include <uv.h>

#include "serve/access.h"
#include "backend/backend.h"
#include "cluster/cluster.h"
#include "clock.h"
#include "frame.h"
#include "engine/job.h"
#include "support/settings.h"
#include "support/worker.h"

#define GS_STEP_HISTORY 1024
/* Upper bounds of the step-time histogram's buckets (metrics). */
#define GS_STEP_BUCKETS 15
extern const uint64_t gs_step_bounds_ns[GS_STEP_BUCKETS];

struct gs_conn;
struct gs_notifier;
struct gs_trace;

struct gs_stats {
	uint64_t steps_completed;
	uint64_t steps_aborted;
	uint64_t last_step_ns;
	uint64_t history[GS_STEP_HISTORY]; /* recent step times, for the median */
	uint64_t bytes_reduced;
	uint64_t elements_clipped;
	uint64_t nonfinite;
	uint64_t step_ns_sum;                /* of completed steps */
	uint64_t step_le[GS_STEP_BUCKETS];   /* steps no longer than each bound */
};

struct gs_daemon {
	uv_loop_t *loop;
	struct gs_settings settings;
	struct gs_backend *backend;
	struct gs_worker worker;
	struct gs_job job;
	struct gs_cluster cluster;
	struct gs_rdv_server *rdv_server; /* node rank 0 only */
	struct gs_stats stats;
	int listen_fd;
	uv_poll_t listen_poll;
	/* Held open so that, out of descriptors, gradsyncd can still accept
	 * a connection to refuse it (server.c). -1: spent or none. */
	int reserve_fd;
	uv_timer_t accept_pause; /* listening paused after running out */
	uv_timer_t sweep;        /* clients' deadlines, the log's summaries */
	struct gs_frame_budget frame_budget; /* every client's reader together */
	uint64_t mappings;       /* trainers' buffers mapped, all together */
	uv_signal_t sigint, sigterm;
	struct gs_conn *conns; /* doubly linked through gs_conn.next/prev */
	unsigned nconns;
	struct gs_access access;
	struct gs_trace *trace;       /* bucket phases: trace file, metrics */
	struct gs_notifier *notifier; /* under systemd: status lines */
	uint64_t start_ns;
	uint64_t next_conn_id;
	int stopping;
	int exit_code;
};

/* Sets up d (its settings already loaded) on loop: the backend the
 * settings ask for, the job, access rules, trace, systemd notifier and
 * worker thread. Joining the other nodes (gs_cluster_start), signals and
 * the listening socket are the caller's. Returns 0, or -1 having logged
 * why; the caller should then exit. */
int gs_daemon_init(struct gs_daemon *d, uv_loop_t *loop);

/* Stops serving, finishes the work in flight and leaves the loop. */
void gs_daemon_shutdown(struct gs_daemon *d, int exit_code);

/* Frees what gs_daemon_init and the cluster made, once gs_daemon_shutdown
 * has run and the loop has run dry. The loop stays the caller's to close. */
void gs_daemon_free(struct gs_daemon *d);

/* The median of the recent step times (0 before the first step). */
uint64_t gs_stats_median(const struct gs_stats *s);
void gs_stats_record_step(struct gs_stats *s, uint64_t duration_ns);

#endif
