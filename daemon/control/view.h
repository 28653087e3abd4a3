/*
 * What the control layer (session, control, status, metrics) reads and
 * acts on: the parts of the node, each owned elsewhere, pointed at by
 * daemon.c when it starts.
 */
#ifndef GS_VIEW_H
#define GS_VIEW_H

#include <stdint.h>

struct gs_conn_set;
struct gs_fusion_budget;
struct gs_jobs;
struct gs_job_entry;
struct gs_settings;
struct gs_trace;

struct gs_node_view {
	const struct gs_settings *settings; /* the node's */
	struct gs_jobs *jobs;               /* trainers attach to them */
	const struct gs_conn_set *conns;
	struct gs_trace *trace; /* NULL: tracing is not available */
	uint64_t start_ns;      /* when the daemon started (gs_now_ns) */
	const char *backend;    /* the backend jobs get: "host", "cuda" */
	const struct gs_fusion_budget *fusion_budget; /* every job's fusion buffers */
};

#endif
