/*
 * What the cluster's files share, and nothing outside daemon/cluster/
 * includes: cluster.c (the coordinator's connection, the membership
 * machine's events, start and stop), group.c (the group, built on the
 * worker thread), rejoin.c (joining a restarted coordinator) and
 * layout_agreement.c (the layout every node must register).
 */
#ifndef GS_CLUSTER_PRIVATE_H
#define GS_CLUSTER_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/cluster.h"

/* ---- cluster.c ---------------------------------------------------------- */

/* Feeds the membership machine (membership.h); the state it moved to, or
 * -1 when the event means nothing now (logged for debugging). */
int cluster_member_on(struct gs_cluster *c, enum gs_member_event e, uint32_t node,
		      uint64_t generation);
/* Whether the job or the daemon has ended (the machine is STOPPED). */
bool cluster_stopped(const struct gs_cluster *c);
/* The engine learns the world through its calls (engine/job.h). */
void cluster_tell_world(const struct gs_cluster *c);
/* world_size and rank_base from c->node. */
void cluster_count_world(struct gs_cluster *c);
/* Takes over rdv's connection to the coordinator (its pings, its
 * messages); false when it cannot. */
bool cluster_adopt_connection(struct gs_cluster *c, struct gs_rdv_client *rdv);

/* ---- group.c: on the worker thread unless said ----------------------------- */

/* The group's Gloo handle becomes g; the old one, if any, is destroyed. */
void cluster_set_gloo(struct gs_cluster *c, struct gs_gloo *g);
/* Ends the collective the worker waits in, if any (any thread). */
void cluster_interrupt_group(struct gs_cluster *c, const char *why);
/* The group of generation over rdv's store: the Gloo context every node
 * votes in, then the backend's part; nodes as the coordinator welcomed
 * them. GS_OK, or a GS_E* code with err. */
int cluster_build_group(struct gs_cluster *c, struct gs_rdv_client *rdv,
			const struct gs_node_info *nodes, uint64_t generation, char *err,
			size_t n);
/* The backend leaves the group, and the group goes. */
void cluster_drop_group_run(struct gs_cluster *c);
/* The same, queued on the worker from the loop. */
void cluster_drop_group(struct gs_cluster *c);

/* ---- rejoin.c ----------------------------------------------------------- */

/* Entered REJOINING (once per entry): a thread of its own joins the
 * coordinator's successor, then the worker builds its group. */
void cluster_start_rejoin(struct gs_cluster *c);

/* ---- layout_agreement.c --------------------------------------------------- */

/* A restarted coordinator knows no layout: the job offers its own again. */
void cluster_reannounce_layout(struct gs_cluster *c);

#endif
