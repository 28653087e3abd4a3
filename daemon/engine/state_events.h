/*
 * What the job tells the state broadcast (state_broadcast.c) of its group
 * of nodes: apart from state.h, so that job.c, which the state's code
 * calls, calls into it without a circle of includes.
 */
#ifndef GS_STATE_EVENTS_H
#define GS_STATE_EVENTS_H

struct gs_job;

/* The group of nodes is ready: a broadcast that waited for it starts. */
void gs_state_group_ready(struct gs_job *j);
/* A node of the group went away (why names it): a broadcast between nodes
 * that failed meanwhile says so in its answer. */
void gs_state_peer_lost(struct gs_job *j, const char *why);

#endif
