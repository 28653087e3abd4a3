/*
 * The protocol dispatcher: checks that each message is allowed in the
 * connection's state and hands it to the part that owns it. Anything out
 * of place drops that client alone, with an Error that says why.
 */
#ifndef GS_SESSION_H
#define GS_SESSION_H

#include "gradsync.pb-c.h"
#include "serve/conn.h"

/* Takes a local client the server has admitted (gs_server's accepted):
 * its messages are dispatched here from now on, and a trainer leaves its
 * job when the connection closes. view is what they act on. */
void gs_session_accept(struct gs_conn *c, void *view);

struct gs_job_entry;
struct gs_trainer;
/* Sends trainer t its Welcome, its job e having joined its nodes (the job
 * table's welcome hook). */
void gs_session_welcome(struct gs_trainer *t, const struct gs_job_entry *e);

#endif
