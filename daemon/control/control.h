/*
 * What a control client (gradsyncctl) may ask: status, metrics, the list
 * of connections, and starting or stopping a trace. Each request gets one
 * reply, or an Error that drops the client.
 */
#ifndef GS_CONTROL_H
#define GS_CONTROL_H

#include <stdbool.h>

#include "gradsync.pb-c.h"
#include "serve/conn.h"

/* The list of connections names each one's role, and what one that is
 * no trainer is doing (a trainer's state is gs_trainer_state's). Each
 * name fits its char[] of the public API's struct gs_connection_status
 * (role[16], state[48]): tests/unit/test-state-names.c checks. */
enum gs_client_states {
	GS_CLIENT_HIDDEN, /* another user's: nothing more is said */
	GS_CLIENT_SAYING_HELLO,
	GS_CLIENT_CONNECTED,
	GS_CLIENT_STATES
};
extern const char *const gs_client_state_names[GS_CLIENT_STATES];
extern const char *const gs_conn_role_names[GS_CONN_NODE + 1];

/* Answers one request; returns false (doing nothing) for a message that
 * is not a control request. */
bool gs_control_dispatch(struct gs_conn *c, const Gradsync__Message *m);

#endif
