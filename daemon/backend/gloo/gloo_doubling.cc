/*
 * Recursive doubling (see gloo_doubling.h). With P the largest power of two
 * <= N, rank r >= P first hands its buffer to r - P and at the end gets the
 * sum back from it; ranks below P then exchange whole buffers with r ^ 1,
 * r ^ 2, ... r ^ (P / 2), adding each time.
 */
#include "backend/gloo/gloo_doubling.h"

#include <algorithm>
#include <exception>

#include <gloo/common/error.h>
#include <gloo/types.h>

#include "backend/gloo/gloo_choice.h"

using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace gs {

namespace {

// A slot prefix none of Gloo's collectives use (theirs are 0x01-0x08), so
// that our messages never match a ring's or a barrier's receive.
constexpr uint8_t kDoublingSlotPrefix = 0x47;

class Deadline {
public:
	explicit Deadline(milliseconds timeout) : end_(steady_clock::now() + timeout)
	{
	}

	// What is left, at least 1 ms (Gloo reads 0 as "no time at all" and a
	// negative one as "the context's timeout").
	milliseconds left() const
	{
		auto ms = std::chrono::duration_cast<milliseconds>(end_ - steady_clock::now());
		return std::max(ms, milliseconds(1));
	}

private:
	steady_clock::time_point end_;
};

// A wait that returns false was aborted: by the interrupt, which says why.
void check(bool done, const char *what, int peer, Interrupt &interrupt)
{
	if (!done)
		throw gloo::IoException(std::string("recursive doubling: ") + what + " with rank " +
					std::to_string(peer) + " was interrupted: " +
					interrupt.why());
}

char *grown(std::vector<char> &scratch, size_t bytes)
{
	if (scratch.size() < bytes)
		scratch.resize(bytes);
	return scratch.data();
}

// A call's two buffers: buf, and ws.scratch (grown to the call's bytes)
// for what the peers send; armed for an interrupt for the call's life, and
// left in ws.retired when the call succeeds (Workspace says why).
class Buffers {
public:
	Buffers(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t bytes, Workspace &ws,
		Interrupt &interrupt)
		: ws_(ws), i_(interrupt)
	{
		for (auto &b : ws_.retired)
			b.reset();
		mine = ctx->createUnboundBuffer(buf, bytes);
		theirs = ctx->createUnboundBuffer(grown(ws_.scratch, bytes), bytes);
		i_.arm(mine.get(), theirs.get());
	}
	~Buffers()
	{
		i_.disarm();
		if (std::uncaught_exceptions() > uncaught_) // failed: destroyed now
			return;
		ws_.retired[0] = std::move(mine);
		ws_.retired[1] = std::move(theirs);
	}
	Buffers(const Buffers &) = delete;
	Buffers &operator=(const Buffers &) = delete;

	std::unique_ptr<gloo::transport::UnboundBuffer> mine, theirs;

private:
	Workspace &ws_;
	Interrupt &i_;
	const int uncaught_ = std::uncaught_exceptions();
};

// One of the N - P extra ranks: its partner (rank - P) sums for it and
// hands the sum back. The sum comes back only after the partner has read
// all of buf, so the receive into buf may be posted at once.
void lean_on_partner(gloo::transport::UnboundBuffer &mine, int partner, uint64_t slot,
		     const Deadline &d, Interrupt &interrupt)
{
	mine.send(partner, slot);
	mine.recv(partner, slot);
	check(mine.waitRecv(d.left()), "the receive", partner, interrupt);
	check(mine.waitSend(d.left()), "the send", partner, interrupt);
}

// A rank below P with an extra rank: adds the extra rank's buffer into buf.
void fold_in(gloo::transport::UnboundBuffer &theirs, int extra, uint64_t slot, void *buf,
	     const std::vector<char> &scratch, size_t count, SumFn fn, const Deadline &d,
	     Interrupt &interrupt)
{
	theirs.recv(extra, slot);
	check(theirs.waitRecv(d.left()), "the receive", extra, interrupt);
	fn(buf, buf, scratch.data(), count);
}

// And hands it the sum at the end.
void hand_back(gloo::transport::UnboundBuffer &mine, int extra, uint64_t slot, const Deadline &d,
	       Interrupt &interrupt)
{
	mine.send(extra, slot);
	check(mine.waitSend(d.left()), "the send", extra, interrupt);
}

// One exchange with peer: send [so, so + sn) elements of out's buffer,
// receive rn into into's at ro; either may be empty, which both sides know
// (they split the same range the same way). The receive first: a closed or
// failed pair wakes it, where this Gloo leaves a send waiting on a peer
// that never posted its receive asleep until the deadline.
void exchange(gloo::transport::UnboundBuffer &out, gloo::transport::UnboundBuffer &into,
	      int peer, uint64_t slot, size_t elsize, size_t so, size_t sn, size_t ro,
	      size_t rn, const Deadline &d, Interrupt &interrupt)
{
	if (rn)
		into.recv(peer, slot, ro * elsize, rn * elsize);
	if (sn)
		out.send(peer, slot, so * elsize, sn * elsize);
	if (rn)
		check(into.waitRecv(d.left()), "the receive", peer, interrupt);
	if (sn)
		check(out.waitSend(d.left()), "the send", peer, interrupt);
}

} // namespace

void Interrupt::fire(const std::string &why)
{
	std::lock_guard<std::mutex> lock(m_);
	if (!fired_)
		why_ = why;
	fired_ = true;
	for (auto *b : { a_, b_ })
		if (b) {
			b->abortWaitRecv();
			b->abortWaitSend();
		}
}

bool Interrupt::fired()
{
	std::lock_guard<std::mutex> lock(m_);
	return fired_;
}

std::string Interrupt::why()
{
	std::lock_guard<std::mutex> lock(m_);
	return why_;
}

void Interrupt::arm(gloo::transport::UnboundBuffer *a, gloo::transport::UnboundBuffer *b)
{
	std::lock_guard<std::mutex> lock(m_);
	if (fired_)
		throw gloo::IoException("interrupted: " + why_);
	a_ = a;
	b_ = b;
}

void Interrupt::disarm()
{
	std::lock_guard<std::mutex> lock(m_);
	a_ = b_ = nullptr;
}

void doubling_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			size_t elsize, SumFn fn, Workspace &ws, milliseconds timeout,
			Interrupt &interrupt)
{
	const int rank = ctx->rank, size = ctx->size;
	if (size == 1 || count == 0)
		return;
	const Deadline d(timeout);
	const uint64_t slot = gloo::Slot::build(kDoublingSlotPrefix, 0);
	Buffers io(ctx, buf, count * elsize, ws, interrupt);
	const std::vector<char> &scratch = ws.scratch;
	auto &mine = io.mine, &theirs = io.theirs;
	int steps;
	const int p = gs_gloo_pow2_below(size, &steps);
	if (rank >= p) {
		lean_on_partner(*mine, rank - p, slot, d, interrupt);
		return;
	}
	const bool partner = rank + p < size;
	if (partner)
		fold_in(*theirs, rank + p, slot, buf, scratch, count, fn, d, interrupt);
	for (int mask = 1; mask < p; mask <<= 1) {
		// The whole buffer each way; buf is being sent, so the sum goes
		// into it only once the exchange is through.
		exchange(*mine, *theirs, rank ^ mask, slot, elsize, 0, count, 0, count, d,
			 interrupt);
		fn(buf, buf, scratch.data(), count);
	}
	if (partner)
		hand_back(*mine, rank + p, slot, d, interrupt);
}

/* ------------------------------------------------------------ Rabenseifner */

namespace {

struct Range {
	size_t lo, hi;
};

} // namespace

void rabenseifner_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			    size_t elsize, SumFn fn, Workspace &ws,
			    milliseconds timeout, Interrupt &interrupt)
{
	const int rank = ctx->rank, size = ctx->size;
	if (size == 1 || count == 0)
		return;
	const Deadline d(timeout);
	const uint64_t slot = gloo::Slot::build(kDoublingSlotPrefix, 1);
	Buffers io(ctx, buf, count * elsize, ws, interrupt);
	const std::vector<char> &scratch = ws.scratch;
	auto &mine = io.mine, &theirs = io.theirs;
	char *b = static_cast<char *>(buf);
	int steps;
	const int p = gs_gloo_pow2_below(size, &steps);
	if (rank >= p) { // as in doubling: the partner sums for the extra ranks
		lean_on_partner(*mine, rank - p, slot, d, interrupt);
		return;
	}
	const bool partner = rank + p < size;
	if (partner)
		fold_in(*theirs, rank + p, slot, buf, scratch, count, fn, d, interrupt);
	// Reduce-scatter by halving, pairs r ^ 1 first (the same tree of
	// additions as doubling): keep the half this rank's bit says, send
	// the other, add the peer's copy of the kept one.
	std::vector<Range> kept(steps + 1);
	kept[0] = {0, count};
	for (int i = 0; i < steps; i++) {
		const int peer = rank ^ (1 << i);
		const Range r = kept[i];
		const size_t mid = r.lo + (r.hi - r.lo) / 2;
		const bool upper = rank & (1 << i);
		const Range keep = upper ? Range{mid, r.hi} : Range{r.lo, mid};
		const Range give = upper ? Range{r.lo, mid} : Range{mid, r.hi};
		exchange(*mine, *theirs, peer, slot, elsize, give.lo, give.hi - give.lo, keep.lo,
			 keep.hi - keep.lo, d, interrupt);
		if (keep.hi > keep.lo)
			fn(b + keep.lo * elsize, b + keep.lo * elsize,
			   scratch.data() + keep.lo * elsize, keep.hi - keep.lo);
		kept[i + 1] = keep;
	}
	// All-gather by doubling, the same pairs in reverse: send the summed
	// range, receive the peer's, the other half of the range one step up.
	for (int i = steps - 1; i >= 0; i--) {
		const int peer = rank ^ (1 << i);
		const Range have = kept[i + 1], parent = kept[i];
		const Range get = have.lo == parent.lo ? Range{have.hi, parent.hi}
						       : Range{parent.lo, have.lo};
		exchange(*mine, *mine, peer, slot, elsize, have.lo, have.hi - have.lo, get.lo,
			 get.hi - get.lo, d, interrupt);
	}
	if (partner)
		hand_back(*mine, rank + p, slot, d, interrupt);
}

} // namespace gs
