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
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
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

/* ---- Produced counts: one per member of the bucket, after the head's
 * status, summed like it. */

#define TENSORS 300

/* Which nodes produced tensor t, by a rule written out here: none, one
 * (which depends on t), every node, every node but node 0. */
static bool node_produced(uint32_t t, unsigned node, unsigned nodes)
{
	switch (t % 4) {
	case 0: return false;
	case 1: return node == t % nodes;
	case 2: return true;
	default: return node != 0;
	}
}

/* acc += one, n elements of wire dtype w, one rounding per addition. */
static void add_elements(enum gs_wire w, void *acc, const void *one, uint32_t n)
{
	float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
	assert_non_null(a);
	assert_non_null(b);
	gs_unpack(w, &a, 1, acc, n, 1.0f);
	gs_unpack(w, &b, 1, one, n, 1.0f);
	for (uint32_t i = 0; i < n; i++)
		a[i] += b[i];
	gs_pack(w, acc, a, n, NULL);
	free(a);
	free(b);
}

/* Every bucket of a plan whose buckets' members are not in index order (a
 * tensor over the threshold goes alone, the group goes on across it): the
 * nodes' counts summed say, per member, whether any node produced it, and
 * nothing outside the bucket is written. Past 256 nodes a bf16 count is
 * no longer exact, but a sum of ones never rounds back to zero. */
static void produced_is_any_node(void **state)
{
	(void)state;
	static const unsigned node_counts[] = { 2, 3, 300 };
	uint64_t counts[TENSORS];
	for (uint32_t t = 0; t < TENSORS; t++)
		counts[t] = t % 7 == 3 ? 100 : 1 + t % 5;
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, TENSORS, 20, &p), 0);
	uint8_t mine[TENSORS], produced[TENSORS];
	char acc[TENSORS * 4], one[TENSORS * 4];
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++)
		for (size_t k = 0; k < sizeof(node_counts) / sizeof(node_counts[0]); k++)
			for (uint32_t b = 0; b < p.nbuckets; b++) {
				const unsigned nodes = node_counts[k];
				const uint32_t n = p.buckets[b].count;
				memset(acc, 0, sizeof(acc));
				for (unsigned node = 0; node < nodes; node++) {
					for (uint32_t t = 0; t < TENSORS; t++)
						mine[t] = node_produced(t, node, nodes);
					gs_chunk_produced_put(wires[i], one, &p, b, mine);
					add_elements(wires[i], acc, one, n);
				}
				memset(produced, 7, sizeof(produced));
				gs_chunk_produced_get(wires[i], acc, &p, b, produced);
				for (uint32_t t = 0; t < TENSORS; t++) {
					bool any = false;
					for (unsigned node = 0; node < nodes; node++)
						any |= node_produced(t, node, nodes);
					uint8_t want = p.bucket_of[t] == b ? any : 7;
					assert_int_equal(produced[t], want);
				}
			}
	gs_plan_free(&p);
}

/* A node that puts no produced array (NULL) says every member was. */
static void null_means_every_member(void **state)
{
	(void)state;
	uint64_t counts[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
	struct gs_plan p;
	assert_int_equal(gs_plan_build(counts, 8, 100, &p), 0);
	assert_int_equal(p.nbuckets, 1);
	for (size_t i = 0; i < sizeof(wires) / sizeof(wires[0]); i++) {
		char at[8 * 4];
		uint8_t produced[8] = { 0 };
		gs_chunk_produced_put(wires[i], at, &p, 0, NULL);
		gs_chunk_produced_get(wires[i], at, &p, 0, produced);
		for (int t = 0; t < 8; t++)
			assert_int_equal(produced[t], 1);
	}
	gs_plan_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(nothing_goes_on),
		cmocka_unit_test(lost_and_vote_are_named),
		cmocka_unit_test(a_vote_alone_stops),
		cmocka_unit_test(counts_stay_nonzero),
		cmocka_unit_test(produced_is_any_node),
		cmocka_unit_test(null_means_every_member),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
