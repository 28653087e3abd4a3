#include "cluster/membership.h"

#include <string.h>

const char *const gs_member_state_names[GS_MEMBER_STATES] = {
	[GS_MEMBER_JOINING] = "joining",
	[GS_MEMBER_WHOLE] = "whole",
	[GS_MEMBER_DEGRADED] = "degraded",
	[GS_MEMBER_REGROUPING] = "regrouping",
	[GS_MEMBER_REJOINING] = "rejoining",
	[GS_MEMBER_REBUILDING] = "rebuilding",
	[GS_MEMBER_FAILED] = "failed",
	[GS_MEMBER_STOPPED] = "stopped",
};

const char *const gs_member_event_names[GS_MEMBER_EVENTS] = {
	[GS_MEMBER_JOINED] = "joined",
	[GS_MEMBER_JOIN_FAILED] = "join failed",
	[GS_MEMBER_NODE_LOST] = "node lost",
	[GS_MEMBER_GROUP_FAILED] = "group failed",
	[GS_MEMBER_REGROUP] = "regroup",
	[GS_MEMBER_BUILT] = "built",
	[GS_MEMBER_BUILD_FAILED] = "build failed",
	[GS_MEMBER_COORDINATOR_LOST] = "coordinator lost",
	[GS_MEMBER_REJOINED] = "rejoined",
	[GS_MEMBER_STOP] = "stop",
};

void gs_membership_init(struct gs_membership *m, uint32_t nodes, uint32_t self, bool *lost)
{
	*m = (struct gs_membership){ .state = GS_MEMBER_JOINING, .nodes = nodes, .self = self,
				     .lost = lost };
	if (lost)
		memset(lost, 0, nodes * sizeof(*lost));
}

static void mark_lost(struct gs_membership *m, uint32_t r)
{
	if (!m->lost[r])
		m->lost_count++;
	m->lost[r] = true;
}

static void clear_lost(struct gs_membership *m)
{
	if (m->lost)
		memset(m->lost, 0, m->nodes * sizeof(*m->lost));
	m->lost_count = 0;
}

static bool in(enum gs_member_state s, enum gs_member_state a, enum gs_member_state b,
	       enum gs_member_state c)
{
	return s == a || s == b || s == c;
}

/* The state e leads to from m's, or -1; guards only, no change. */
static int next_state(const struct gs_membership *m, enum gs_member_event e,
		      const struct gs_member_news *news)
{
	enum gs_member_state s = m->state;
	bool connected = in(s, GS_MEMBER_WHOLE, GS_MEMBER_DEGRADED, GS_MEMBER_REGROUPING);
	bool this_build = news && news->generation == m->generation;
	switch (e) {
	case GS_MEMBER_JOINED:
		return s == GS_MEMBER_JOINING ? GS_MEMBER_WHOLE : -1;
	case GS_MEMBER_JOIN_FAILED:
		return s == GS_MEMBER_JOINING ? GS_MEMBER_FAILED : -1;
	case GS_MEMBER_NODE_LOST:
		if (!news || news->node >= m->nodes || news->node == m->self)
			return -1;
		return connected ? GS_MEMBER_DEGRADED : -1;
	case GS_MEMBER_GROUP_FAILED:
		return s == GS_MEMBER_WHOLE && this_build ? GS_MEMBER_DEGRADED : -1;
	case GS_MEMBER_REGROUP:
		return connected && news ? GS_MEMBER_REGROUPING : -1;
	case GS_MEMBER_BUILT:
		if (!this_build)
			return -1;
		return s == GS_MEMBER_REGROUPING || s == GS_MEMBER_REBUILDING ? GS_MEMBER_WHOLE
									       : -1;
	case GS_MEMBER_BUILD_FAILED:
		if (!this_build)
			return -1;
		return s == GS_MEMBER_REGROUPING   ? GS_MEMBER_DEGRADED
		       : s == GS_MEMBER_REBUILDING ? GS_MEMBER_REJOINING
						   : -1;
	case GS_MEMBER_COORDINATOR_LOST:
		if (!connected)
			return -1;
		return m->self == 0 ? GS_MEMBER_DEGRADED : GS_MEMBER_REJOINING;
	case GS_MEMBER_REJOINED:
		return s == GS_MEMBER_REJOINING && news ? GS_MEMBER_REBUILDING : -1;
	case GS_MEMBER_STOP:
		return s == GS_MEMBER_STOPPED ? -1 : GS_MEMBER_STOPPED;
	case GS_MEMBER_EVENTS:
		break;
	}
	return -1;
}

int gs_membership_on(struct gs_membership *m, enum gs_member_event e,
		     const struct gs_member_news *news)
{
	int to = next_state(m, e, news);
	if (to < 0)
		return -1;
	switch (e) {
	case GS_MEMBER_JOINED:
	case GS_MEMBER_REGROUP:
	case GS_MEMBER_REJOINED:
		m->generation = news ? news->generation : m->generation;
		break;
	case GS_MEMBER_NODE_LOST:
		mark_lost(m, news->node);
		break;
	case GS_MEMBER_COORDINATOR_LOST:
		if (m->self != 0)
			mark_lost(m, 0);
		break;
	case GS_MEMBER_BUILT:
		clear_lost(m);
		break;
	default:
		break;
	}
	m->state = (enum gs_member_state)to;
	return to;
}

bool gs_membership_ready(const struct gs_membership *m)
{
	return m->state == GS_MEMBER_WHOLE;
}

bool gs_membership_lost(const struct gs_membership *m, uint32_t r)
{
	return m->lost && r < m->nodes && m->lost[r];
}
