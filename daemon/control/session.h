/*
 * The protocol dispatcher: checks that each message is allowed in the
 * connection's state and hands it to the part that owns it. Anything out
 * of place drops that client alone, with an Error that says why.
 */
#ifndef GS_SESSION_H
#define GS_SESSION_H

#include "serve/conn.h"
#include "gradsync.pb-c.h"

void gs_session_dispatch(struct gs_conn *c, const Gradsync__Message *m);
/* A client's connection closed: a trainer leaves its job. */
void gs_session_closed(struct gs_conn *c);

#endif
