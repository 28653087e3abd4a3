/*
 * Recursive doubling all-reduce on a Gloo context's pairs: the small
 * buckets' and the votes' all-reduce, whose time is its messages' latency.
 * Gloo's own halving-doubling (the classic AllreduceHalvingDoubling) waits
 * with the timeout fixed in each pair at connection, not the call's, and
 * its new-style allreduce offers only ring and bcube (whose waits ignore
 * the call's timeout too); this one waits on unbound buffers with the
 * call's deadline, as Gloo's ring does.
 *
 * Internal to backend/gloo (C++); gloo_comm.cc calls it inside its
 * exception guard: it throws gloo::IoException on a timeout or a broken
 * pair, like Gloo's own collectives.
 */
#ifndef GS_GLOO_DOUBLING_H
#define GS_GLOO_DOUBLING_H

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include <gloo/context.h>

namespace gs {

/* c = a + b over n elements; c may be a. */
using SumFn = void (*)(void *c, const void *a, const void *b, size_t n);

/* Sums buf (count elements of elsize bytes) over every rank of ctx, in
 * place, every rank ending with the same bits (each exchange adds the two
 * halves' sums in both orders, and the sums commute). scratch is grown to
 * count x elsize bytes and reused across calls. All ranks call it with the
 * same count, in the same order as their other collectives. */
void doubling_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			size_t elsize, SumFn fn, std::vector<char> &scratch,
			std::chrono::milliseconds timeout);

/* Rabenseifner's all-reduce on the same pairs, for buffers too large for
 * doubling's log2 N full copies: a reduce-scatter by recursive halving (each
 * exchange sends half of what is left), then an all-gather by recursive
 * doubling; 2 log2 P messages like Gloo's halving-doubling and 2 n (P - 1) / P
 * bytes like the ring. The extra ranks fold in and are handed the sum back
 * as in doubling. Same additions in the same tree as doubling, so the same
 * bits; same arguments and errors. */
void rabenseifner_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			    size_t elsize, SumFn fn, std::vector<char> &scratch,
			    std::chrono::milliseconds timeout);

} // namespace gs

#endif
