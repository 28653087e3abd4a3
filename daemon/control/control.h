/*
 * What a control client (gradsyncctl) may ask: status, metrics, the list
 * of connections, and starting or stopping a trace. Each request gets one
 * reply, or an Error that drops the client.
 */
#ifndef GS_CONTROL_H
#define GS_CONTROL_H

#include <stdbool.h>

#include "gradsync.pb-c.h"

struct gs_conn;

/* Answers one request; returns false (doing nothing) for a message that
 * is not a control request. */
bool gs_control_dispatch(struct gs_conn *c, const Gradsync__Message *m);

#endif
