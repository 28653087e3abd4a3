/*
 * The status after each all-reduce of the host backend (chunk_status.h):
 * each node writes its own, the nodes' statuses are summed element by
 * element in the wire dtype as Gloo sums them (one rounding per addition),
 * and every node reads back the same verdict. The sum is done here, in a
 * loop of the test's own, and what it must decode to is written out by
 * hand: which node lost memory, which voted to abort and why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "backend/chunk_status.h"

#define MAX_NODES 600

static const enum gs_wire wires[] = { GS_WIRE_F16, GS_WIRE_BF16, GS_WIRE_F32 };

/* acc += one node's status, element by element, rounding to the wire
 * dtype after each addition as a ring all-reduce does. */
static void add_status(enum gs_wire w, void *acc, const void *one)
{
	float a[GS_CHUNK_STATUS_ELEMENTS], b[GS_CHUNK_STATUS_ELEMENTS];
	float *pa = a, *pb = b;
	gs_unpack(w, &pa, 1, acc, GS_CHUNK_STATUS_ELEMENTS, 1.0f);
	gs_unpack(w, &pb, 1, one, GS_CHUNK_STATUS_ELEMENTS, 1.0f);
	for (int i = 0; i < GS_CHUNK_STATUS_ELEMENTS; i++)
		a[i] += b[i];
	gs_pack(w, acc, a, GS_CHUNK_STATUS_ELEMENTS, NULL);
}

/* Nodes 0 .. nodes - 1 write their status (lost[n] < 0: nothing lost;
 * votes[n]: NULL or its vote) and the sum is read back into *out. */
static void sum_of(enum gs_wire w, unsigned nodes, const int *lost,
		   const struct gs_vote *const *votes, struct gs_chunk_status *out)
{
	uint32_t acc[GS_CHUNK_STATUS_ELEMENTS], one[GS_CHUNK_STATUS_ELEMENTS];
	memset(acc, 0, sizeof(acc));
	for (unsigned n = 0; n < nodes; n++) {
		gs_chunk_status_put(w, one, n, lost ? lost[n] : -1, votes ? votes[n] : NULL);
		add_status(w, acc, one);
	}
	gs_chunk_status_get(w, acc, out);
}

static void nothing_goes_on(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
		struct gs_chunk_status st;
		struct gs_vote go = { 0 };
		const struct gs_vote *votes[4] = { &go, &go, NULL, &go };
		sum_of(wires[i], 4, NULL, votes, &st);
		assert_int_equal(st.lost_nodes, 0);
		assert_int_equal(st.vote.aborts, 0);
		assert_false(gs_chunk_status_stops(&st));
	}
}

/* Node 37 (past 32: both halves of its rank) lost local rank 5's memory;
 * node 12 votes to abort for local rank 3, reason 2. Both are named. */
static void lost_and_vote_are_named(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
		static int lost[40];
		static const struct gs_vote *votes[40];
		static const struct gs_vote abort = { 1, 12, 3, 2 };
		for (int n = 0; n < 40; n++) {
			lost[n] = n == 37 ? 5 : -1;
			votes[n] = n == 12 ? &abort : NULL;
		}
		struct gs_chunk_status st;
		sum_of(wires[i], 40, lost, votes, &st);
		assert_int_equal(st.lost_nodes, 1);
		assert_int_equal(st.node, 37);
		assert_int_equal(st.rank, 5);
		assert_int_equal(st.vote.aborts, 1);
		assert_int_equal(st.vote.node, 12);
		assert_int_equal(st.vote.rank, 3);
		assert_int_equal(st.vote.reason, 2);
		assert_true(gs_chunk_status_stops(&st));
		char msg[300];
		gs_chunk_status_describe(&st, 4, msg, sizeof(msg));
		assert_string_equal(msg, "trainer local rank 5 of node 37 lost the pages of its shared memory while gradsyncd read it (SIGBUS); no node unpacked bucket 4");
	}
}

/* A vote alone stops the bucket; the node that votes is the one that
 * writes the status, whatever rank its vote names. */
static void a_vote_alone_stops(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
		static const struct gs_vote abort = { 1, 999, 63, 4 };
		const struct gs_vote *votes[3] = { NULL, NULL, &abort };
		struct gs_chunk_status st;
		sum_of(wires[i], 3, NULL, votes, &st);
		assert_int_equal(st.lost_nodes, 0);
		assert_int_equal(st.vote.aborts, 1);
		assert_int_equal(st.vote.node, 2);
		assert_int_equal(st.vote.rank, 63);
		assert_int_equal(st.vote.reason, 4);
		assert_true(gs_chunk_status_stops(&st));
	}
}

/* Up to 255 nodes the counts are exact in every wire dtype (bf16 holds
 * integers to 256); past it, in bf16, a count is no longer exact but still
 * stops the bucket. */
static void counts_stay_nonzero(void **state)
{
	(void)state;
	static int lost[MAX_NODES];
	static const struct gs_vote *votes[MAX_NODES];
	static const struct gs_vote abort = { 1, 0, 0, 1 };
	for (int n = 0; n < MAX_NODES; n++) {
		lost[n] = 0;
		votes[n] = &abort;
	}
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
		struct gs_chunk_status st;
		sum_of(wires[i], 255, lost, votes, &st);
		assert_int_equal(st.lost_nodes, 255);
		assert_int_equal(st.vote.aborts, 255);
		sum_of(wires[i], MAX_NODES, lost, votes, &st);
		assert_true(st.lost_nodes > 1);
		assert_true(st.vote.aborts > 1);
		assert_true(gs_chunk_status_stops(&st));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(nothing_goes_on),
		cmocka_unit_test(lost_and_vote_are_named),
		cmocka_unit_test(a_vote_alone_stops),
		cmocka_unit_test(counts_stay_nonzero),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
