/* What gradsyncctl status and a trainer's Welcome are told. */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include "serve/conn.h"
#include "gradsync.pb-c.h"

struct gs_daemon;

/* Fills s with the effective settings; strings stay owned by the daemon. */
void gs_status_fill_settings(const struct gs_daemon *d, Gradsync__Settings *s);

/* Answers a StatusRequest on c. */
void gs_status_reply(struct gs_conn *c);

#endif
