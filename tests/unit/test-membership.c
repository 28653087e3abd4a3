/*
 * The membership state machine (daemon/cluster/membership.c): each path a
 * node takes through a job's life (join, a node lost and back, a group
 * that fails with every node there, the coordinator lost and a successor
 * joined, builds that fail), the late news it must ignore (a build of a
 * generation no longer asked for, a node lost while a group builds), and,
 * over many random sequences of events, invariants checked against a
 * model of the lost nodes kept here: ready only when whole and nothing is
 * lost, the lost count equal to the flags, STOPPED final.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/membership.h"

#define NODES 4

struct fixture {
	struct gs_membership m;
	bool lost[NODES];
};

static struct fixture *fresh(uint32_t self)
{
	static struct fixture f;
	memset(&f, 0xff, sizeof(f)); /* init must clear the caller's flags */
	gs_membership_init(&f.m, NODES, self, f.lost);
	return &f;
}

static int on(struct fixture *f, enum gs_member_event e, uint32_t node, uint64_t generation)
{
	struct gs_member_news news = { node, generation };
	return gs_membership_on(&f->m, e, &news);
}

static void joined(struct fixture *f, uint64_t generation)
{
	assert_int_equal(f->m.state, GS_MEMBER_JOINING);
	assert_false(gs_membership_ready(&f->m));
	assert_int_equal(on(f, GS_MEMBER_JOINED, 0, generation), GS_MEMBER_WHOLE);
	assert_true(gs_membership_ready(&f->m));
	assert_int_equal(f->m.generation, generation);
	for (uint32_t r = 0; r < NODES; r++)
		assert_false(gs_membership_lost(&f->m, r));
}

static void join_then_fail(void **state)
{
	(void)state;
	struct fixture *f = fresh(1);
	assert_int_equal(on(f, GS_MEMBER_JOIN_FAILED, 0, 0), GS_MEMBER_FAILED);
	assert_false(gs_membership_ready(&f->m));
	/* No news moves a node that never joined, but the end does. */
	assert_int_equal(on(f, GS_MEMBER_JOINED, 0, 1), -1);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 2), -1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 2, 0), -1);
	assert_int_equal(on(f, GS_MEMBER_STOP, 0, 0), GS_MEMBER_STOPPED);
}

static void node_lost_and_back(void **state)
{
	(void)state;
	struct fixture *f = fresh(1);
	joined(f, 1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 2, 0), GS_MEMBER_DEGRADED);
	assert_false(gs_membership_ready(&f->m));
	assert_true(gs_membership_lost(&f->m, 2));
	assert_int_equal(f->m.lost_count, 1);
	/* Told twice, counted once; never this node, nor one out of range. */
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 2, 0), GS_MEMBER_DEGRADED);
	assert_int_equal(f->m.lost_count, 1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 1, 0), -1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, NODES, 0), -1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 3, 0), GS_MEMBER_DEGRADED);
	assert_int_equal(f->m.lost_count, 2);
	/* Both back: the coordinator asks for generation 2. */
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 2), GS_MEMBER_REGROUPING);
	assert_false(gs_membership_ready(&f->m));
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 1), -1); /* an older build's end */
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 2), GS_MEMBER_WHOLE);
	assert_true(gs_membership_ready(&f->m));
	assert_int_equal(f->m.lost_count, 0);
	assert_false(gs_membership_lost(&f->m, 2));
	assert_false(gs_membership_lost(&f->m, 3));
}

/* A second regroup while the first builds: only the last one's build
 * makes the group whole. */
static void regroup_while_building(void **state)
{
	(void)state;
	struct fixture *f = fresh(2);
	joined(f, 1);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 2), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 3), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 2), -1);
	assert_false(gs_membership_ready(&f->m));
	assert_int_equal(on(f, GS_MEMBER_BUILD_FAILED, 0, 2), -1);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 3), GS_MEMBER_WHOLE);
}

/* A node lost while the group builds: that build's end is news of
 * nothing, the group stays degraded until the next regroup. */
static void node_lost_while_building(void **state)
{
	(void)state;
	struct fixture *f = fresh(0);
	joined(f, 1);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 2), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 3, 0), GS_MEMBER_DEGRADED);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 2), -1);
	assert_false(gs_membership_ready(&f->m));
	assert_true(gs_membership_lost(&f->m, 3));
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 3), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_BUILD_FAILED, 0, 3), GS_MEMBER_DEGRADED);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 4), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 4), GS_MEMBER_WHOLE);
}

/* The group failed here with every node there: degraded once, for the
 * generation it failed in, until the coordinator says regroup. Another
 * node's failure reaches a whole node as a regroup. */
static void group_failed(void **state)
{
	(void)state;
	struct fixture *f = fresh(1);
	joined(f, 5);
	assert_int_equal(on(f, GS_MEMBER_GROUP_FAILED, 0, 4), -1); /* an older group */
	assert_true(gs_membership_ready(&f->m));
	assert_int_equal(on(f, GS_MEMBER_GROUP_FAILED, 0, 5), GS_MEMBER_DEGRADED);
	assert_int_equal(on(f, GS_MEMBER_GROUP_FAILED, 0, 5), -1); /* asked already */
	assert_int_equal(f->m.lost_count, 0);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 6), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 6), GS_MEMBER_WHOLE);
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 7), GS_MEMBER_REGROUPING);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 7), GS_MEMBER_WHOLE);
}

static void coordinator_lost_and_rejoined(void **state)
{
	(void)state;
	struct fixture *f = fresh(2);
	joined(f, 1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 1, 0), GS_MEMBER_DEGRADED);
	assert_int_equal(on(f, GS_MEMBER_COORDINATOR_LOST, 0, 0), GS_MEMBER_REJOINING);
	assert_true(gs_membership_lost(&f->m, 0));
	assert_int_equal(f->m.lost_count, 2);
	/* Nothing of the old coordinator's counts while rejoining. */
	assert_int_equal(on(f, GS_MEMBER_REGROUP, 0, 2), -1);
	assert_int_equal(on(f, GS_MEMBER_NODE_LOST, 3, 0), -1);
	assert_int_equal(on(f, GS_MEMBER_COORDINATOR_LOST, 0, 0), -1);
	assert_int_equal(on(f, GS_MEMBER_REJOINED, 0, 1), GS_MEMBER_REBUILDING);
	assert_int_equal(f->m.generation, 1);
	assert_false(gs_membership_ready(&f->m));
	/* The build with the successor fails: rejoin, build again. */
	assert_int_equal(on(f, GS_MEMBER_BUILD_FAILED, 0, 1), GS_MEMBER_REJOINING);
	assert_int_equal(on(f, GS_MEMBER_REJOINED, 0, 2), GS_MEMBER_REBUILDING);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 1), -1);
	assert_int_equal(on(f, GS_MEMBER_BUILT, 0, 2), GS_MEMBER_WHOLE);
	assert_int_equal(f->m.lost_count, 0);
	for (uint32_t r = 0; r < NODES; r++)
		assert_false(gs_membership_lost(&f->m, r));
}

/* Node 0 is the coordinator: losing its own connection leaves it
 * degraded, with nobody to rejoin and no node marked lost. */
static void coordinator_lost_on_node_zero(void **state)
{
	(void)state;
	struct fixture *f = fresh(0);
	joined(f, 1);
	assert_int_equal(on(f, GS_MEMBER_COORDINATOR_LOST, 0, 0), GS_MEMBER_DEGRADED);
	assert_int_equal(f->m.lost_count, 0);
	assert_int_equal(on(f, GS_MEMBER_REJOINED, 0, 2), -1);
}

static void stop_from_every_state(void **state)
{
	(void)state;
	/* A path to each state, then the end. */
	static const struct {
		enum gs_member_event e;
		uint32_t node;
		uint64_t generation;
	} path[] = {
		{ GS_MEMBER_JOINED, 0, 1 },	      /* WHOLE */
		{ GS_MEMBER_NODE_LOST, 3, 0 },	      /* DEGRADED */
		{ GS_MEMBER_REGROUP, 0, 2 },	      /* REGROUPING */
		{ GS_MEMBER_COORDINATOR_LOST, 0, 0 }, /* REJOINING */
		{ GS_MEMBER_REJOINED, 0, 3 },	      /* REBUILDING */
	};
	bool seen[GS_MEMBER_STATES] = { false };
	for (size_t depth = 0; depth <= sizeof(path) / sizeof(path[0]); depth++) {
		struct fixture *f = fresh(1);
		for (size_t i = 0; i < depth; i++)
			assert_true(on(f, path[i].e, path[i].node, path[i].generation) >= 0);
		seen[f->m.state] = true;
		assert_int_equal(on(f, GS_MEMBER_STOP, 0, 0), GS_MEMBER_STOPPED);
		for (int e = 0; e < GS_MEMBER_EVENTS; e++)
			for (uint64_t g = 0; g < 4; g++)
				assert_int_equal(on(f, (enum gs_member_event)e, 2, g), -1);
		assert_int_equal(f->m.state, GS_MEMBER_STOPPED);
		assert_false(gs_membership_ready(&f->m));
	}
	seen[GS_MEMBER_FAILED] = seen[GS_MEMBER_STOPPED] = true; /* join_then_fail */
	for (int s = 0; s < GS_MEMBER_STATES; s++)
		assert_true(seen[s]);
}

/* Random events, checked against a model of which nodes are lost kept
 * here from the news alone. */
static void random_walks(void **state)
{
	(void)state;
	unsigned seed = 12345;
	for (int walk = 0; walk < 2000; walk++) {
		uint32_t self = (uint32_t)(rand_r(&seed) % NODES);
		struct fixture *f = fresh(self);
		bool model[NODES] = { false };
		uint64_t generation = 0;
		for (int step = 0; step < 60; step++) {
			enum gs_member_event e = (enum gs_member_event)(rand_r(&seed) % GS_MEMBER_EVENTS);
			uint32_t node = (uint32_t)(rand_r(&seed) % (NODES + 1));
			uint64_t g = rand_r(&seed) % 3 ? generation : generation + 1;
			enum gs_member_state from = f->m.state;
			int to = on(f, e, node, g);
			if (to < 0) {
				assert_int_equal(f->m.state, from);
			} else {
				assert_true(to < GS_MEMBER_STATES);
				assert_int_equal(f->m.state, to);
				if (e == GS_MEMBER_NODE_LOST)
					model[node] = true;
				if (e == GS_MEMBER_COORDINATOR_LOST && self != 0)
					model[0] = true;
				if (e == GS_MEMBER_BUILT)
					memset(model, 0, sizeof(model));
				if (e == GS_MEMBER_JOINED || e == GS_MEMBER_REGROUP ||
				    e == GS_MEMBER_REJOINED)
					generation = g;
			}
			assert_int_equal(f->m.generation, generation);
			uint32_t count = 0;
			for (uint32_t r = 0; r < NODES; r++) {
				assert_int_equal(gs_membership_lost(&f->m, r), model[r]);
				count += model[r];
			}
			assert_int_equal(f->m.lost_count, count);
			assert_false(model[self]);
			if (gs_membership_ready(&f->m))
				assert_int_equal(count, 0);
			assert_int_equal(gs_membership_ready(&f->m), f->m.state == GS_MEMBER_WHOLE);
			if (from == GS_MEMBER_STOPPED || from == GS_MEMBER_FAILED)
				assert_true(to < 0 || (from == GS_MEMBER_FAILED &&
						       to == GS_MEMBER_STOPPED));
			if (to == GS_MEMBER_FAILED)
				assert_int_equal(from, GS_MEMBER_JOINING);
		}
	}
}

static void names(void **state)
{
	(void)state;
	for (int s = 0; s < GS_MEMBER_STATES; s++)
		assert_non_null(gs_member_state_names[s]);
	for (int e = 0; e < GS_MEMBER_EVENTS; e++)
		assert_non_null(gs_member_event_names[e]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(join_then_fail),
		cmocka_unit_test(node_lost_and_back),
		cmocka_unit_test(regroup_while_building),
		cmocka_unit_test(node_lost_while_building),
		cmocka_unit_test(group_failed),
		cmocka_unit_test(coordinator_lost_and_rejoined),
		cmocka_unit_test(coordinator_lost_on_node_zero),
		cmocka_unit_test(stop_from_every_state),
		cmocka_unit_test(random_walks),
		cmocka_unit_test(names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
