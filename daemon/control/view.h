/*
 * What the control layer (session, control, status, metrics) reads and
 * acts on: the parts of the node, each owned elsewhere, pointed at by
 * daemon.c when it starts.
 */
#ifndef GS_VIEW_H
#define GS_VIEW_H

#include <stdint.h>

struct gs_backend;
struct gs_cluster;
struct gs_conn_set;
struct gs_job;
struct gs_settings;
struct gs_stats;
struct gs_trace;

struct gs_node_view {
	const struct gs_settings *settings;
	struct gs_job *job; /* trainers attach to it */
	const struct gs_cluster *cluster;
	const struct gs_backend *backend;
	const struct gs_conn_set *conns;
	const struct gs_stats *stats;
	struct gs_trace *trace; /* NULL: tracing is not available */
	uint64_t start_ns;      /* when the daemon started (gs_now_ns) */
};

#endif
