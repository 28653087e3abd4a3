/*
 * Which all-reduce between nodes: ring, recursive doubling or Rabenseifner,
 * by the buffer's bytes and the group's size, from an alpha-beta model of
 * each (time = messages x alpha + bytes on the critical path x beta) whose
 * parameters bench/model.py fitted to bench/scale.sh's measurements.
 *
 * Ring: 2 (N - 1) messages of n / N bytes each, one after another.
 * Recursive doubling: log2 P exchanges of all n bytes (P the largest power
 * of two <= N), plus 2 more (fold in, hand back) when N is not a power of two.
 * Rabenseifner: 2 log2 P messages carrying 2 n (P - 1) / P bytes in all
 * (halving, then doubling), plus the same 2 of n bytes when N is not P.
 * Doubling waits on the fewest messages and wins on small buffers; the
 * ring and Rabenseifner move the fewest bytes, Rabenseifner with log2
 * rather than N latencies, so it wins the middle, more so in larger groups.
 *
 * Plain C, no Gloo: a build without Gloo and the unit tests use it too.
 */
#ifndef GS_GLOO_CHOICE_H
#define GS_GLOO_CHOICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum gs_gloo_algo {
	/* The model's pick for the buffer's bytes and the group's size. */
	GS_GLOO_ALGO_AUTO = 0,
	/* Gloo's ring (AllreduceOptions RING): honours the per-call timeout. */
	GS_GLOO_ALGO_RING = 1,
	/* Ours, on Gloo's pairs (gloo_doubling.cc): honours it too. */
	GS_GLOO_ALGO_DOUBLING = 2,
	/* Gloo's classic AllreduceHalvingDoubling, for benchmarks and checks
	 * only: its waits use the group's timeout (the one given at creation,
	 * fixed in each pair), not the call's, and, built per call, it makes
	 * each peer's device loop busy-wait until the call's buffers are
	 * registered; the daemon never picks it. */
	GS_GLOO_ALGO_HALVING_DOUBLING = 3,
	/* Ours, on Gloo's pairs (gloo_doubling.cc): reduce-scatter by halving,
	 * all-gather by doubling; honours the call's timeout. */
	GS_GLOO_ALGO_RABENSEIFNER = 4,
};

/* The model's predicted microseconds for one all-reduce of `bytes` over
 * `nodes` ranks by algo (RING, DOUBLING or RABENSEIFNER; 0 for one node). */
double gs_gloo_predict_us(enum gs_gloo_algo algo, size_t bytes, int nodes);

/* RING, RABENSEIFNER or DOUBLING: the one the model predicts fastest
 * (the earlier of these on a tie). */
enum gs_gloo_algo gs_gloo_pick(size_t bytes, int nodes);

/* The largest byte count for which gs_gloo_pick says DOUBLING at `nodes`
 * (0 when never), and the largest for which it says anything but RING:
 * the bands the daemon logs. */
size_t gs_gloo_doubling_below(int nodes);
size_t gs_gloo_ring_above(int nodes);

/* "ring", "doubling", "halving-doubling", "auto"; "?" for others. */
const char *gs_gloo_algo_name(int algo);

/* The largest power of two <= nodes (1 for one node), and its log2. */
int gs_gloo_pow2_below(int nodes, int *log2);

/* Bytes rank `rank` of `nodes` sends in one all-reduce of `bytes` by algo
 * (RING for anything but DOUBLING and RABENSEIFNER). */
uint64_t gs_gloo_sent_bytes(enum gs_gloo_algo algo, uint64_t bytes, int rank, int nodes);

/* Messages each rank waits on, one after another, in one call. */
int gs_gloo_ring_steps(int nodes);
int gs_gloo_doubling_steps(int nodes);
int gs_gloo_rabenseifner_steps(int nodes);

#ifdef __cplusplus
}
#endif

#endif
