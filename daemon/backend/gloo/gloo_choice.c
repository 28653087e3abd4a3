/*
 * The alpha-beta model of the three all-reduces the daemon runs, and the
 * pick among them. The parameters are bench/model.py's fit to
 * bench/scale.sh's Gloo runs on netcluster.sh's namespaces; refit and copy
 * them here when the transport or the host changes.
 */
#include "backend/gloo/gloo_choice.h"

#include <stdbool.h>
#include <stdint.h>

/* From bench/results/cluster-report/scale/model.txt (bench/scale.sh at
 * 10gbit, 2 to 16 nodes sharing a quiet 2-core VM, the sharing divided
 * out; the busier run before it, bench/results/scale, fitted within 4%):
 * alpha in microseconds per message waited on, beta in nanoseconds per
 * byte on the critical path. At 8 nodes they give doubling up to about 29
 * KiB, Rabenseifner up to about 610 KiB, the ring above; at 16 nodes 19
 * KiB and 1.3 MiB; at 64, 13 KiB and 5.4 MiB: votes and small buckets by
 * doubling, medium ones by Rabenseifner, and the default threshold's 4 MiB
 * buckets by the ring up to about 45 nodes, by Rabenseifner beyond. */
static const double RING_ALPHA_US = 37.7;
static const double RING_BETA_NS = 0.596;
static const double DOUBLING_ALPHA_US = 19.4;
static const double DOUBLING_BETA_NS = 0.806;
static const double RABENSEIFNER_ALPHA_US = 13.0;
static const double RABENSEIFNER_BETA_NS = 1.005;

int gs_gloo_pow2_below(int nodes, int *log2)
{
	int p = 1, steps = 0;
	while (nodes > 1 && p * 2 <= nodes) {
		p *= 2;
		steps++;
	}
	*log2 = steps;
	return p;
}

int gs_gloo_ring_steps(int nodes)
{
	return nodes > 1 ? 2 * (nodes - 1) : 0;
}

int gs_gloo_doubling_steps(int nodes)
{
	int steps, p = gs_gloo_pow2_below(nodes, &steps);
	return p == nodes ? steps : steps + 2;
}

int gs_gloo_rabenseifner_steps(int nodes)
{
	int steps, p = gs_gloo_pow2_below(nodes, &steps);
	return p == nodes ? 2 * steps : 2 * steps + 2;
}

uint64_t gs_gloo_sent_bytes(enum gs_gloo_algo algo, uint64_t bytes, int rank, int nodes)
{
	if (nodes < 2)
		return 0;
	int steps, p = gs_gloo_pow2_below(nodes, &steps);
	if (algo != GS_GLOO_ALGO_DOUBLING && algo != GS_GLOO_ALGO_RABENSEIFNER)
		return 2 * (uint64_t)(nodes - 1) * bytes / (uint64_t)nodes;
	if (rank >= p) /* an extra rank hands its buffer to its partner */
		return bytes;
	uint64_t handed_back = rank + p < nodes ? bytes : 0;
	if (algo == GS_GLOO_ALGO_DOUBLING) /* the whole buffer each step */
		return (uint64_t)steps * bytes + handed_back;
	/* Halving sends half of what is left each step, the all-gather as
	 * much back: 2 B (P - 1) / P. */
	return 2 * bytes * (uint64_t)(p - 1) / (uint64_t)p + handed_back;
}

double gs_gloo_predict_us(enum gs_gloo_algo algo, size_t bytes, int nodes)
{
	if (nodes <= 1)
		return 0;
	double n = (double)bytes;
	int log2, p = gs_gloo_pow2_below(nodes, &log2);
	switch (algo) {
	case GS_GLOO_ALGO_DOUBLING:
		return gs_gloo_doubling_steps(nodes) * (DOUBLING_ALPHA_US + n * DOUBLING_BETA_NS / 1e3);
	case GS_GLOO_ALGO_RABENSEIFNER: {
		/* Halving sends n/2, n/4, ..., doubling the same back: 2 n (P-1)/P;
		 * the extra ranks' fold and hand-back are n each. */
		double sent = 2 * n * (p - 1) / p + (p == nodes ? 0 : 2 * n);
		return gs_gloo_rabenseifner_steps(nodes) * RABENSEIFNER_ALPHA_US +
		       sent * RABENSEIFNER_BETA_NS / 1e3;
	}
	default:
		return gs_gloo_ring_steps(nodes) * RING_ALPHA_US +
		       2 * n * (nodes - 1) / nodes * RING_BETA_NS / 1e3;
	}
}

enum gs_gloo_algo gs_gloo_pick(size_t bytes, int nodes)
{
	static const enum gs_gloo_algo algos[] = {GS_GLOO_ALGO_RING, GS_GLOO_ALGO_RABENSEIFNER,
						  GS_GLOO_ALGO_DOUBLING};
	enum gs_gloo_algo best = GS_GLOO_ALGO_RING;
	double t = gs_gloo_predict_us(best, bytes, nodes);
	for (size_t i = 1; i < sizeof(algos) / sizeof(algos[0]); i++) {
		double u = gs_gloo_predict_us(algos[i], bytes, nodes);
		if (u < t) {
			best = algos[i];
			t = u;
		}
	}
	return best;
}

/* Doubling's time grows fastest with the bytes (all n, log2 N times), the
 * ring's and Rabenseifner's alike (2 n (N - 1) / N) but the ring waits on
 * the most messages: the picks are bands, doubling for the smallest
 * buffers, then Rabenseifner, then the ring. The largest byte count in
 * [1, 2^40] below a band's end, by bisection; 0 when even 1 byte is past it. */
static size_t band_end(bool (*inside)(size_t bytes, int nodes), int nodes)
{
	size_t lo = 1, hi = (size_t)1 << 40;
	if (!inside(lo, nodes))
		return 0;
	if (inside(hi, nodes))
		return hi;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (inside(mid, nodes))
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

static bool is_doubling(size_t bytes, int nodes)
{
	return gs_gloo_pick(bytes, nodes) == GS_GLOO_ALGO_DOUBLING;
}

static bool not_ring(size_t bytes, int nodes)
{
	return gs_gloo_pick(bytes, nodes) != GS_GLOO_ALGO_RING;
}

size_t gs_gloo_doubling_below(int nodes)
{
	return band_end(is_doubling, nodes);
}

size_t gs_gloo_ring_above(int nodes)
{
	return band_end(not_ring, nodes);
}

const char *gs_gloo_algo_name(int algo)
{
	switch (algo) {
	case GS_GLOO_ALGO_AUTO: return "auto";
	case GS_GLOO_ALGO_RING: return "ring";
	case GS_GLOO_ALGO_DOUBLING: return "doubling";
	case GS_GLOO_ALGO_HALVING_DOUBLING: return "halving-doubling";
	case GS_GLOO_ALGO_RABENSEIFNER: return "rabenseifner";
	}
	return "?";
}
