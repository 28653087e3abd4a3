/*
 * Recursive doubling (see gloo_doubling.h). With P the largest power of two
 * <= N, rank r >= P first hands its buffer to r - P and at the end gets the
 * sum back from it; ranks below P then exchange whole buffers with r ^ 1,
 * r ^ 2, ... r ^ (P / 2), adding each time.
 */
#include "backend/gloo/gloo_doubling.h"

#include <algorithm>

#include <gloo/common/error.h>
#include <gloo/types.h>

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

// A wait that returns false was aborted from elsewhere; nothing here aborts,
// but say so rather than go on with a half-received buffer.
void check(bool done, const char *what, int peer)
{
	if (!done)
		throw gloo::IoException(std::string("recursive doubling: ") + what + " with rank " +
					std::to_string(peer) + " was aborted");
}

} // namespace

void doubling_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
			size_t elsize, SumFn fn, std::vector<char> &scratch, milliseconds timeout)
{
	const int rank = ctx->rank, size = ctx->size;
	if (size == 1 || count == 0)
		return;
	const size_t bytes = count * elsize;
	if (scratch.size() < bytes)
		scratch.resize(bytes);
	const Deadline d(timeout);
	const uint64_t slot = gloo::Slot::build(kDoublingSlotPrefix, 0);
	auto mine = ctx->createUnboundBuffer(buf, bytes);
	auto theirs = ctx->createUnboundBuffer(scratch.data(), bytes);
	int p = 1;
	while (p * 2 <= size)
		p *= 2;

	if (rank >= p) {
		// One of the N - P extra ranks: its partner sums for it. The sum
		// comes back only after the partner has read all of buf, so the
		// receive into buf may be posted at once.
		mine->send(rank - p, slot);
		mine->recv(rank - p, slot);
		check(mine->waitRecv(d.left()), "the receive", rank - p);
		check(mine->waitSend(d.left()), "the send", rank - p);
		return;
	}
	const bool partner = rank + p < size;
	if (partner) {
		theirs->recv(rank + p, slot);
		check(theirs->waitRecv(d.left()), "the receive", rank + p);
		fn(buf, buf, scratch.data(), count);
	}
	for (int mask = 1; mask < p; mask <<= 1) {
		const int peer = rank ^ mask;
		theirs->recv(peer, slot);
		mine->send(peer, slot);
		// The receive first: a closed or failed pair wakes it, where
		// this Gloo leaves a send waiting on a peer that never posted its
		// receive asleep until the deadline. buf is being sent: add into
		// it only once the send is done too.
		check(theirs->waitRecv(d.left()), "the receive", peer);
		check(mine->waitSend(d.left()), "the send", peer);
		fn(buf, buf, scratch.data(), count);
	}
	if (partner) {
		mine->send(rank + p, slot);
		check(mine->waitSend(d.left()), "the send", rank + p);
	}
}

} // namespace gs
