/*
 * The alpha-beta model of the two all-reduces the daemon runs, and the
 * pick between them. The parameters are bench/model.py's fit to
 * bench/scale.sh's Gloo runs on netcluster.sh's namespaces;
 * refit and copy them here when the transport or the host changes.
 */
#include "backend/gloo/gloo_choice.h"

#include <stdint.h>

/* From bench/results/scale/model.txt (bench/scale.sh at 10gbit, 2 to 16
 * nodes sharing a 2-core VM, the sharing divided out): alpha in
 * microseconds per message waited on, beta in nanoseconds per byte on the
 * critical path. They put the crossover near 245 KiB at 2 to 4 nodes,
 * 320 KiB at 8, 470 KiB at 16 and 1.2 MiB at 64: small buckets and votes
 * go by doubling, the default threshold's 4 MiB buckets by the ring. */
static const double RING_ALPHA_US = 36.1;
static const double RING_BETA_NS = 0.594;
static const double DOUBLING_ALPHA_US = 19.6;
static const double DOUBLING_BETA_NS = 0.804;

int gs_gloo_ring_steps(int nodes)
{
	return nodes > 1 ? 2 * (nodes - 1) : 0;
}

int gs_gloo_doubling_steps(int nodes)
{
	int steps = 0, p = 1;
	while (nodes > 1 && p * 2 <= nodes) {
		p *= 2;
		steps++;
	}
	return p == nodes ? steps : steps + 2;
}

double gs_gloo_predict_us(enum gs_gloo_algo algo, size_t bytes, int nodes)
{
	if (nodes <= 1)
		return 0;
	double n = (double)bytes;
	if (algo == GS_GLOO_ALGO_DOUBLING)
		return gs_gloo_doubling_steps(nodes) * (DOUBLING_ALPHA_US + n * DOUBLING_BETA_NS / 1e3);
	return gs_gloo_ring_steps(nodes) * (RING_ALPHA_US + n / nodes * RING_BETA_NS / 1e3);
}

enum gs_gloo_algo gs_gloo_pick(size_t bytes, int nodes)
{
	return gs_gloo_predict_us(GS_GLOO_ALGO_DOUBLING, bytes, nodes) <
			       gs_gloo_predict_us(GS_GLOO_ALGO_RING, bytes, nodes)
		       ? GS_GLOO_ALGO_DOUBLING
		       : GS_GLOO_ALGO_RING;
}

/* Doubling's time grows faster with bytes than the ring's (it moves all
 * n bytes log2 N times, the ring 2 n (N - 1) / N once), so the bytes where
 * it wins are the ones below a crossover: find it by bisection. */
size_t gs_gloo_doubling_below(int nodes)
{
	if (gs_gloo_pick(1, nodes) != GS_GLOO_ALGO_DOUBLING)
		return 0;
	size_t lo = 1, hi = (size_t)1 << 40;
	if (gs_gloo_pick(hi, nodes) == GS_GLOO_ALGO_DOUBLING)
		return hi;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (gs_gloo_pick(mid, nodes) == GS_GLOO_ALGO_DOUBLING)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

const char *gs_gloo_algo_name(int algo)
{
	switch (algo) {
	case GS_GLOO_ALGO_AUTO: return "auto";
	case GS_GLOO_ALGO_RING: return "ring";
	case GS_GLOO_ALGO_DOUBLING: return "doubling";
	case GS_GLOO_ALGO_HALVING_DOUBLING: return "halving-doubling";
	}
	return "?";
}
