/* What gradsyncctl status, a trainer's Welcome and systemd are told. */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include "gradsync.pb-c.h"
#include "serve/conn.h"

#include <stddef.h>

#include <stdint.h>

struct gs_node_view;
struct gs_settings;

/* Fills s with a job's effective settings for a world of `world` ranks. */
void gs_status_fill_settings(const struct gs_settings *st, uint32_t world, Gradsync__Settings *s);

/* One line of how the node is doing, for systemd's STATUS=. */
void gs_status_line(const struct gs_node_view *v, char *out, size_t n);

/* Answers a StatusRequest on c. */
void gs_status_reply(struct gs_conn *c);

#endif
