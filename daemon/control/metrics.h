/*
 * The daemon's figures in the Prometheus text exposition format (0.0.4),
 * for `gradsyncctl metrics` (and from there a node exporter's textfile
 * collector or any scraper that runs a command). Every counter counts from
 * the daemon's start.
 */
#ifndef GS_METRICS_H
#define GS_METRICS_H

#include <stddef.h>
#include <sys/types.h>

struct gs_conn;
struct gs_node_view;

/* The exposition text, in a buffer the caller frees; NULL when out of
 * memory. */
char *gs_metrics_text(const struct gs_node_view *v, uid_t uid, size_t *len);

/* Answers a MetricsRequest. */
void gs_metrics_reply(struct gs_conn *c);

#endif
