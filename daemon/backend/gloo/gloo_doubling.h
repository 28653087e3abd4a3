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
 * exception guard: it throws gloo::IoException on a timeout, a broken
 * pair or an interrupt, like Gloo's own collectives.
 */
#ifndef GS_GLOO_DOUBLING_H
#define GS_GLOO_DOUBLING_H

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace gs {

/* Ends, from another thread, the waits of the all-reduce in progress: the
 * daemon's liveness found a node gone, and the call would only wait out its
 * deadline (a vote's is --step-timeout plus --peer-timeout). Once fired it
 * stays so, and every later call fails at once: the group it belongs to is
 * to be rebuilt. One call at a time arms it with the buffers it waits on. */
class Interrupt {
public:
	void fire(const std::string &why);
	bool fired();
	std::string why();
	// Throws gloo::IoException, naming why, when already fired.
	void arm(gloo::transport::UnboundBuffer *a, gloo::transport::UnboundBuffer *b);
	void disarm();

private:
	std::mutex m_;
	bool fired_ = false;
	std::string why_;
	gloo::transport::UnboundBuffer *a_ = nullptr, *b_ = nullptr;
};

/* What the calls keep between them: the receive buffer (grown to a call's
 * bytes), and the last successful call's unbound buffers. Gloo's device
 * thread may hold a reference to a buffer for a moment after the wait on
 * it returns, and the buffer's destructor spins (sched_yield) until that
 * goes: on a core some other process keeps busy that can last its whole
 * time slice. Destroyed at the start of the next call instead, they are
 * long free. A call that fails destroys its own at once, so that nothing
 * late from a peer lands in the caller's buffer. */
struct Workspace {
	std::vector<char> scratch;
	std::unique_ptr<gloo::transport::UnboundBuffer> retired[2];
};

/* c = a + b over n elements; c may be a. */
using SumFn = void (*)(void *c, const void *a, const void *b, size_t n);

/* Sums buf (count elements of elsize bytes) over every rank of ctx, in
 * place, every rank ending with the same bits (each exchange adds the two
 * halves' sums in both orders, and the sums commute). ws is reused across
 * calls. All ranks call it with the
 * same count, in the same order as their other collectives. */
void doubling_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			size_t elsize, SumFn fn, Workspace &ws,
			std::chrono::milliseconds timeout, Interrupt &interrupt);

/* Rabenseifner's all-reduce on the same pairs, for buffers too large for
 * doubling's log2 N full copies: a reduce-scatter by recursive halving (each
 * exchange sends half of what is left), then an all-gather by recursive
 * doubling; 2 log2 P messages like Gloo's halving-doubling and 2 n (P - 1) / P
 * bytes like the ring. The extra ranks fold in and are handed the sum back
 * as in doubling. Same additions in the same tree as doubling, so the same
 * bits; same arguments and errors. */
void rabenseifner_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			    size_t elsize, SumFn fn, Workspace &ws,
			    std::chrono::milliseconds timeout, Interrupt &interrupt);

} // namespace gs

#endif
