/*
 * This node's membership in its job's group of nodes, as a state machine:
 * named states, the events that move between them, and nothing else. The
 * cluster (cluster.c) feeds it what happened (a join that completed, a
 * node lost, the coordinator gone, a group built) and acts on the
 * transition it returns; the machine itself does no I/O, so that
 * tests/unit/test-membership.c can drive every path.
 *
 *   JOINING ──joined──▶ WHOLE ──node lost──▶ DEGRADED ──regroup──▶ REGROUPING
 *      │                  ▲ ▲                    │                    │
 *   join failed           │ └────group built─────┼────────────────────┘
 *      ▼                  │                      │ coordinator lost
 *    FAILED               │                      ▼
 *                      rebuilt ◀── REBUILDING ◀─rejoined── REJOINING
 *
 * WHOLE and REGROUPING also go to REJOINING when the coordinator is lost
 * (node 0, which has no coordinator to rejoin, goes to DEGRADED), and a
 * group that failed with every node there (group failed) goes from WHOLE
 * to DEGRADED until the coordinator says regroup; WHOLE goes to
 * REGROUPING too when another node's group failed. A build counts only
 * for the generation last asked for: a second regroup while one builds,
 * or a node lost meanwhile, makes the first build's end news of nothing.
 * A build that fails after a regroup leaves the node DEGRADED (a node
 * that comes back makes the coordinator say regroup again); after a
 * rejoin it goes back to REJOINING. Every state goes to STOPPED when the
 * job or the daemon ends, and STOPPED takes no more events.
 */
#ifndef GS_MEMBERSHIP_H
#define GS_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

enum gs_member_state {
	GS_MEMBER_JOINING,    /* the first join and group build run */
	GS_MEMBER_WHOLE,      /* the group works: buckets may launch */
	GS_MEMBER_DEGRADED,   /* a node went away, or the group failed: steps wait */
	GS_MEMBER_REGROUPING, /* every node is back: the group is built again */
	GS_MEMBER_REJOINING,  /* the coordinator went away: joining its successor */
	GS_MEMBER_REBUILDING, /* joined the successor: its group is built */
	GS_MEMBER_FAILED,     /* the first join failed: the job cannot run here */
	GS_MEMBER_STOPPED,    /* the job or the daemon ended */
	GS_MEMBER_STATES
};

enum gs_member_event {
	GS_MEMBER_JOINED,          /* the first join and build completed */
	GS_MEMBER_JOIN_FAILED,     /* ... or failed */
	GS_MEMBER_NODE_LOST,       /* the coordinator says a node went away */
	GS_MEMBER_GROUP_FAILED,    /* the group failed here, no node gone */
	GS_MEMBER_REGROUP,         /* the coordinator says: build generation g */
	GS_MEMBER_BUILT,           /* a group (regroup or rebuild) is built */
	GS_MEMBER_BUILD_FAILED,    /* ... or its build failed */
	GS_MEMBER_COORDINATOR_LOST, /* the connection to node 0 closed or fell silent */
	GS_MEMBER_REJOINED,        /* the successor welcomed every node */
	GS_MEMBER_STOP,            /* the job or the daemon ends */
	GS_MEMBER_EVENTS
};

struct gs_membership {
	enum gs_member_state state;
	uint64_t generation; /* of the group built, or being built */
	uint32_t nodes;
	uint32_t self;       /* this node's rank */
	uint32_t lost_count; /* nodes marked lost, this one never among them */
	bool *lost;          /* by node rank; the caller's array of nodes */
};

/* Starts in JOINING, as node `self` of `nodes`; lost is the caller's
 * array of `nodes` flags (zeroed here), kept by the caller for the
 * machine's life. */
void gs_membership_init(struct gs_membership *m, uint32_t nodes, uint32_t self, bool *lost);

/* What the caller saw with an event: the node a NODE_LOST names (its
 * rank), the generation a REGROUP or a JOINED/REJOINED names. */
struct gs_member_news {
	uint32_t node;
	uint64_t generation;
};

/* Feeds event e. Returns the state it moved to, or -1 when e means
 * nothing in the current state (a late message: the caller ignores it);
 * the state is then unchanged. */
int gs_membership_on(struct gs_membership *m, enum gs_member_event e,
		     const struct gs_member_news *news);

/* Whether buckets may launch: the group is whole. */
bool gs_membership_ready(const struct gs_membership *m);
/* Whether node rank r is marked lost. */
bool gs_membership_lost(const struct gs_membership *m, uint32_t r);

extern const char *const gs_member_state_names[GS_MEMBER_STATES];
extern const char *const gs_member_event_names[GS_MEMBER_EVENTS];

#endif
