/*
 * gs_gloo: Gloo's TCP transport and its ring all-reduce, or our recursive
 * doubling on its pairs, behind a C interface.
 * Every entry point runs its Gloo calls inside guarded(), which turns each
 * kind of C++ exception into a GS_E* code and a message; nothing is thrown
 * across extern "C".
 */
#include "backend/gloo/gloo_comm.h"

#include <net/if.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "backend/gloo/gloo_doubling.h"
#include "backend/gloo/gloo_store.h"
#include "errors.h"

using std::chrono::milliseconds;

struct gs_gloo {
	int rank = 0;
	int size = 0;
	milliseconds timeout{0};
	// Declared before the context, so destroyed after it.
	std::shared_ptr<gloo::transport::Device> device;
	// Null once a failure broke the group; `broken` then says why.
	std::shared_ptr<gloo::Context> context;
	std::string broken;
	// Doubling's and Rabenseifner's receive buffer and last buffers.
	gs::Workspace work;
	// gs_gloo_interrupt's: ends doubling's and Rabenseifner's waits.
	gs::Interrupt interrupt;
	// What AUTO runs: the model's pick, or one algorithm for every call
	// (GRADSYNCD_GLOO_ALGO, for benchmarks' baselines).
	int forced = GS_GLOO_ALGO_AUTO;
};

namespace {

/* ------------------------------------------------------------ errors */

void set_error(char *err, size_t errlen, const std::string &what, const std::string &detail)
{
	if (err && errlen > 0)
		snprintf(err, errlen, "%s: %s", what.c_str(), detail.c_str());
}

// Gloo starts its messages with "[/path/file.cc:123] "; keep what it says.
std::string strip_location(const char *msg)
{
	const char *end = msg[0] == '[' ? strstr(msg, "] ") : nullptr;
	return end ? std::string(end + 2) : std::string(msg);
}

// Gloo reports both timeouts and broken connections as IoException; only
// the wording tells them apart ("Timed out waiting 1000ms for recv ...",
// "Connect timeout ...").
bool says_timeout(std::string msg)
{
	std::transform(msg.begin(), msg.end(), msg.begin(),
		       [](unsigned char c) { return (char)std::tolower(c); });
	return msg.find("timed out") != std::string::npos ||
	       msg.find("timeout") != std::string::npos;
}

// Runs fn; returns GS_OK, or the GS_E* code for the exception it threw,
// with "what: Gloo's words" in err.
template <typename F>
int guarded(F fn, const std::string &what, char *err, size_t errlen, std::string *msg_out)
{
	std::string msg;
	int rc;
	try {
		fn();
		return GS_OK;
	} catch (const gs::StoreError &e) {
		msg = e.what();
		rc = e.code;
	} catch (const gloo::IoException &e) {
		msg = strip_location(e.what());
		rc = says_timeout(msg) ? GS_ETIMEDOUT : GS_EDISCONNECTED;
	} catch (const gloo::EnforceNotMet &e) {
		msg = e.what();
		rc = GS_ESYSTEM;
	} catch (const std::bad_alloc &) {
		msg = "out of memory";
		rc = GS_ENOMEM;
	} catch (const std::exception &e) {
		msg = strip_location(e.what());
		rc = GS_ESYSTEM;
	} catch (...) {
		msg = "unknown C++ exception";
		rc = GS_ESYSTEM;
	}
	set_error(err, errlen, what, msg);
	if (msg_out)
		*msg_out = msg;
	return rc;
}

/* ------------------------------------------------------ reduce functions */

using gs::SumFn;

// One hop of the ring: c = round(widen(a) + widen(b)), vectorised. Gloo
// calls it with c == a (received segment added into the output), but
// gs_reduce_sum allows only its first source to alias the destination, so
// put an aliased source first; fp32 addition of two values commutes.
template <enum gs_wire W>
void kernel_sum(void *c, const void *a, const void *b, size_t n)
{
	const void *srcs[2] = {a, b};
	if (c == b)
		std::swap(srcs[0], srcs[1]);
	gs_reduce_sum(W, c, srcs, 2, n);
}

// The same, as the classic algorithms' two-operand reduction (x += y).
template <typename T, enum gs_wire W>
void kernel_add(T *x, const T *y, size_t n)
{
	const void *srcs[2] = {x, y};
	gs_reduce_sum(W, x, srcs, 2, n);
}

template <typename T, enum gs_wire W>
const gloo::ReductionFunction<T> *kernel_reduction()
{
	static const gloo::ReductionFunction<T> f(gloo::SUM, &kernel_add<T, W>);
	return &f;
}

// Gloo's own element-wise sum. The cast picks the (void *, ...) overload.
template <typename T>
SumFn gloo_sum()
{
	return static_cast<SumFn>(&gloo::sum<T>);
}

// A C caller may pass any int as an enum, but in C++ merely loading an
// out-of-range value of a C enum is undefined; read the bytes as an int.
static_assert(sizeof(enum gs_wire) == sizeof(int), "enums are ints");
static_assert(sizeof(enum gs_gloo_sum) == sizeof(int), "enums are ints");
static_assert(sizeof(enum gs_gloo_algo) == sizeof(int), "enums are ints");
int as_int(const void *e)
{
	int v;
	memcpy(&v, e, sizeof(v));
	return v;
}

bool known_wire(int w)
{
	return w == GS_WIRE_F16 || w == GS_WIRE_BF16 || w == GS_WIRE_F32;
}

// nullptr when there is no such sum (unknown dtype or choice, Gloo bf16).
SumFn pick_sum(int wire, int sum)
{
	if (sum != GS_GLOO_SUM_KERNELS && sum != GS_GLOO_SUM_GLOO)
		return nullptr;
	bool ours = sum == GS_GLOO_SUM_KERNELS;
	switch (wire) {
	case GS_WIRE_F32:
		return gloo_sum<float>();
	case GS_WIRE_F16:
		return ours ? kernel_sum<GS_WIRE_F16> : gloo_sum<gloo::float16>();
	case GS_WIRE_BF16:
		return ours ? kernel_sum<GS_WIRE_BF16> : nullptr;
	}
	return nullptr;
}

/* ------------------------------------------------------------ Gloo calls */

gloo::transport::tcp::attr device_attr(const char *where)
{
	gloo::transport::tcp::attr a;
	if (where && where[0] != '\0') {
		if (if_nametoindex(where) != 0)
			a.iface = where;
		else
			a.hostname = where;
	}
	return a;
}

void connect_group(gs_gloo *g, const gs_gloo_store_ops &ops, const char *where)
{
	auto deadline = std::chrono::steady_clock::now() + g->timeout;
	g->device = gloo::transport::tcp::CreateDevice(device_attr(where));
	auto ctx = std::make_shared<gloo::rendezvous::Context>(g->rank, g->size);
	ctx->setTimeout(g->timeout);
	gs::CallbackStore store(ops, deadline);
	ctx->connectFullMesh(store, g->device);

	// connectFullMesh returns once this rank's own pairs are up; the
	// barrier makes "created" mean the whole group is.
	auto left = std::chrono::duration_cast<milliseconds>(deadline -
							     std::chrono::steady_clock::now());
	gloo::BarrierOptions barrier(ctx);
	barrier.setTimeout(std::max(left, milliseconds(1)));
	gloo::barrier(barrier);
	g->context = ctx;
}

// The element type only tells Gloo the element size; fn does the sums.
// Ring, explicitly: in this Gloo, bcube's waits ignore the per-call timeout.
template <typename T>
void ring_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
		    SumFn fn, milliseconds timeout)
{
	gloo::AllreduceOptions opts(ctx);
	opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
	opts.setOutput(static_cast<T *>(buf), count);
	opts.setReduceFunction(fn);
	opts.setTimeout(timeout);
	gloo::allreduce(opts);
}

// Gloo's classic halving-doubling, built for the one call (it takes an
// int count). Its waits use each pair's timeout, set at connection. Its
// run() returns with its last sends possibly still queued in the pairs,
// and its buffers go with it: the barrier keeps every rank's buffers until
// every rank has received all (seen without it: a rank that left at once
// closed its connections on a peer still waiting for its data).
template <typename T, enum gs_wire W>
void halving_doubling(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
		      milliseconds timeout)
{
	if (count > (size_t)INT32_MAX)
		throw std::invalid_argument("too many elements for Gloo's halving-doubling");
	std::vector<T *> ptrs{static_cast<T *>(buf)};
	gloo::AllreduceHalvingDoubling<T> algo(ctx, ptrs, (int)count, kernel_reduction<T, W>());
	algo.run();
	gloo::BarrierOptions barrier(ctx);
	barrier.setTimeout(timeout);
	gloo::barrier(barrier);
}

void run_algorithm(gs_gloo *g, int wire, int algo, void *buf, size_t count, SumFn fn,
		   milliseconds timeout)
{
	size_t elsize = gs_wire_size(static_cast<enum gs_wire>(wire));
	switch (algo) {
	case GS_GLOO_ALGO_DOUBLING:
		gs::doubling_allreduce(g->context, buf, count, elsize, fn, g->work, timeout,
				       g->interrupt);
		return;
	case GS_GLOO_ALGO_RABENSEIFNER:
		gs::rabenseifner_allreduce(g->context, buf, count, elsize, fn, g->work, timeout,
					   g->interrupt);
		return;
	case GS_GLOO_ALGO_HALVING_DOUBLING:
		if (wire == GS_WIRE_F32)
			halving_doubling<float, GS_WIRE_F32>(g->context, buf, count, timeout);
		else if (wire == GS_WIRE_F16)
			halving_doubling<uint16_t, GS_WIRE_F16>(g->context, buf, count, timeout);
		else
			halving_doubling<uint16_t, GS_WIRE_BF16>(g->context, buf, count, timeout);
		return;
	default:
		if (wire == GS_WIRE_F32)
			ring_allreduce<float>(g->context, buf, count, fn, timeout);
		else
			ring_allreduce<uint16_t>(g->context, buf, count, fn, timeout);
	}
}

// AUTO resolved: the model's pick for these bytes in this group.
int resolve(const gs_gloo *g, int wire, size_t count, int algo)
{
	if (algo != GS_GLOO_ALGO_AUTO)
		return algo;
	if (g->forced != GS_GLOO_ALGO_AUTO)
		return g->forced;
	size_t elsize = gs_wire_size(static_cast<enum gs_wire>(wire));
	return gs_gloo_pick(count * elsize, g->size);
}

std::string op_name(const gs_gloo *g, int wire, size_t count, int algo)
{
	char s[192];
	if (known_wire(wire))
		snprintf(s, sizeof(s), "gloo %s all-reduce of %zu %s elements (rank %d of %d)",
			 gs_gloo_algo_name(algo), count,
			 gs_wire_name(static_cast<enum gs_wire>(wire)), g->rank, g->size);
	else
		snprintf(s, sizeof(s),
			 "gloo %s all-reduce of %zu elements of dtype %d (rank %d of %d)",
			 gs_gloo_algo_name(algo), count, wire, g->rank, g->size);
	return s;
}

bool known_algo(int algo)
{
	return algo == GS_GLOO_ALGO_AUTO || algo == GS_GLOO_ALGO_RING ||
	       algo == GS_GLOO_ALGO_DOUBLING || algo == GS_GLOO_ALGO_HALVING_DOUBLING ||
	       algo == GS_GLOO_ALGO_RABENSEIFNER;
}

int check_allreduce_args(const gs_gloo *g, int wire, int sum, int algo, const void *buf,
			 size_t count, SumFn fn, char *err, size_t errlen)
{
	const std::string what = op_name(g, wire, count, algo);
	if (!known_wire(wire)) {
		set_error(err, errlen, what, "unknown wire dtype");
		return GS_EINVAL;
	}
	if (!known_algo(algo) ||
	    (algo == GS_GLOO_ALGO_HALVING_DOUBLING && sum != GS_GLOO_SUM_KERNELS)) {
		set_error(err, errlen, what,
			  known_algo(algo) ? "halving-doubling sums with the kernels only"
					   : "unknown algorithm");
		return GS_EINVAL;
	}
	if (!fn) {
		set_error(err, errlen, what,
			  sum == GS_GLOO_SUM_GLOO ? "Gloo has no sum for this dtype"
						  : "unknown sum function");
		return GS_EINVAL;
	}
	if ((count > 0 && !buf) || count > SIZE_MAX / sizeof(float)) {
		set_error(err, errlen, what, "bad buffer");
		return GS_EINVAL;
	}
	if (!g->context) {
		set_error(err, errlen, what,
			  "the group failed earlier (" + g->broken + "); create it anew");
		return GS_ESTATE;
	}
	return GS_OK;
}

int run_allreduce(gs_gloo *g, int wire, void *buf, size_t count, int sum, int algo,
		  int timeout_ms, char *err, size_t errlen)
{
	if (!g) {
		set_error(err, errlen, "gloo all-reduce", "no group");
		return GS_EINVAL;
	}
	SumFn fn = pick_sum(wire, sum);
	int rc = check_allreduce_args(g, wire, sum, algo, buf, count, fn, err, errlen);
	if (rc < 0 || count == 0)
		return rc;
	algo = resolve(g, wire, count, algo);
	milliseconds timeout = timeout_ms > 0 ? milliseconds(timeout_ms) : g->timeout;
	std::string msg;
	rc = guarded(
		[&] {
			// Interrupted: the group is to be rebuilt; not even the
			// ring, which the interrupt cannot wake, may start.
			if (g->interrupt.fired())
				throw gloo::IoException("interrupted: " + g->interrupt.why());
			run_algorithm(g, wire, algo, buf, count, fn, timeout);
		},
		op_name(g, wire, count, algo), err, errlen, &msg);
	if (rc < 0) {
		// Dropping the context closes every connection, so no late
		// message can land in buf after we return.
		g->context.reset();
		g->broken = msg;
	}
	return rc;
}

// GRADSYNCD_GLOO_ALGO: unset, "auto", "ring", "doubling" or "rabenseifner";
// -1 for others.
int forced_algo()
{
	const char *v = getenv("GRADSYNCD_GLOO_ALGO");
	if (!v || !*v || strcmp(v, "auto") == 0)
		return GS_GLOO_ALGO_AUTO;
	if (strcmp(v, "ring") == 0)
		return GS_GLOO_ALGO_RING;
	if (strcmp(v, "doubling") == 0)
		return GS_GLOO_ALGO_DOUBLING;
	if (strcmp(v, "rabenseifner") == 0)
		return GS_GLOO_ALGO_RABENSEIFNER;
	return -1;
}

} // namespace

/* ------------------------------------------------------------ C interface */

extern "C" int gs_gloo_create(const struct gs_gloo_store_ops *store, int rank, int size,
			      const char *iface_or_host, int timeout_ms, struct gs_gloo **out,
			      char *err, size_t errlen)
{
	char what[96];
	snprintf(what, sizeof(what), "gloo rendezvous of rank %d of %d", rank, size);
	if (!out || !store || !store->set || !store->get || size < 1 || rank < 0 ||
	    rank >= size || timeout_ms <= 0) {
		set_error(err, errlen, what, "invalid arguments");
		return GS_EINVAL;
	}
	*out = nullptr;
	int forced = forced_algo();
	if (forced < 0) {
		set_error(err, errlen, what,
			  std::string("GRADSYNCD_GLOO_ALGO is '") + getenv("GRADSYNCD_GLOO_ALGO") +
				  "': expected auto, ring, doubling or rabenseifner");
		return GS_EINVAL;
	}
	gs_gloo *g = nullptr;
	int rc = guarded(
		[&] {
			g = new gs_gloo();
			g->rank = rank;
			g->size = size;
			g->timeout = milliseconds(timeout_ms);
			g->forced = forced;
			connect_group(g, *store, iface_or_host);
		},
		what, err, errlen, nullptr);
	if (rc < 0) {
		delete g;
		return rc;
	}
	*out = g;
	return GS_OK;
}

extern "C" int gs_gloo_allreduce_with(struct gs_gloo *g, enum gs_wire wire, void *buf,
				      size_t count, enum gs_gloo_sum sum, int timeout_ms,
				      char *err, size_t errlen)
{
	return run_allreduce(g, as_int(&wire), buf, count, as_int(&sum), GS_GLOO_ALGO_AUTO,
			     timeout_ms, err, errlen);
}

extern "C" int gs_gloo_allreduce_algo(struct gs_gloo *g, enum gs_wire wire, void *buf,
				      size_t count, enum gs_gloo_algo algo, int timeout_ms,
				      char *err, size_t errlen)
{
	return run_allreduce(g, as_int(&wire), buf, count, GS_GLOO_SUM_KERNELS, as_int(&algo),
			     timeout_ms, err, errlen);
}

// Not a tag that the all-reduces use (Gloo's ring and ours use slots of
// their own), so that a late byte of one never lands in the other.
constexpr uint32_t kBroadcastTag = 0x5354; // "ST", the state's

extern "C" int gs_gloo_broadcast(struct gs_gloo *g, void *buf, size_t bytes, int root,
				 int timeout_ms, char *err, size_t errlen)
{
	char what[128];
	snprintf(what, sizeof(what), "gloo broadcast of %zu bytes from rank %d (rank %d of %d)",
		 bytes, root, g ? g->rank : -1, g ? g->size : 0);
	if (!g || (bytes > 0 && !buf) || root < 0 || root >= g->size) {
		set_error(err, errlen, what, "invalid arguments");
		return GS_EINVAL;
	}
	if (!g->context) {
		set_error(err, errlen, what,
			  "the group failed earlier (" + g->broken + "); create it anew");
		return GS_ESTATE;
	}
	if (bytes == 0 || g->size == 1)
		return GS_OK;
	milliseconds timeout = timeout_ms > 0 ? milliseconds(timeout_ms) : g->timeout;
	std::string msg;
	int rc = guarded(
		[&] {
			if (g->interrupt.fired())
				throw gloo::IoException("interrupted: " + g->interrupt.why());
			gloo::BroadcastOptions opts(g->context);
			opts.setOutput(static_cast<uint8_t *>(buf), bytes);
			opts.setRoot(root);
			opts.setTag(kBroadcastTag);
			opts.setTimeout(timeout);
			gloo::broadcast(opts);
		},
		what, err, errlen, &msg);
	if (rc < 0) {
		g->context.reset();
		g->broken = msg;
	}
	return rc;
}

extern "C" enum gs_gloo_algo gs_gloo_choice(const struct gs_gloo *g, enum gs_wire wire,
					    size_t count)
{
	return static_cast<enum gs_gloo_algo>(resolve(g, as_int(&wire), count, GS_GLOO_ALGO_AUTO));
}

extern "C" int gs_gloo_allreduce(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count,
				 int timeout_ms, char *err, size_t errlen)
{
	return run_allreduce(g, as_int(&wire), buf, count, GS_GLOO_SUM_KERNELS, GS_GLOO_ALGO_AUTO,
			     timeout_ms, err, errlen);
}

extern "C" size_t gs_gloo_doubling_up_to(const struct gs_gloo *g)
{
	if (g->forced == GS_GLOO_ALGO_DOUBLING)
		return SIZE_MAX;
	if (g->forced != GS_GLOO_ALGO_AUTO || g->size == 1)
		return 0;
	return gs_gloo_doubling_below(g->size);
}

extern "C" size_t gs_gloo_rabenseifner_up_to(const struct gs_gloo *g)
{
	if (g->forced == GS_GLOO_ALGO_DOUBLING || g->forced == GS_GLOO_ALGO_RABENSEIFNER)
		return SIZE_MAX;
	if (g->forced != GS_GLOO_ALGO_AUTO || g->size == 1)
		return 0;
	return gs_gloo_ring_above(g->size);
}

extern "C" bool gs_gloo_available(void)
{
	return true;
}

extern "C" uint64_t gs_gloo_call_sent_bytes(const struct gs_gloo *g, enum gs_wire wire,
					   size_t count)
{
	if (!g)
		return 0;
	int algo = resolve(g, as_int(&wire), count, GS_GLOO_ALGO_AUTO);
	return gs_gloo_sent_bytes(static_cast<enum gs_gloo_algo>(algo), count * gs_wire_size(wire),
				  g->rank, g->size);
}

extern "C" int gs_gloo_rank(const struct gs_gloo *g)
{
	return g->rank;
}

extern "C" int gs_gloo_size(const struct gs_gloo *g)
{
	return g->size;
}

extern "C" void gs_gloo_interrupt(struct gs_gloo *g, const char *why)
{
	if (!g)
		return;
	try {
		g->interrupt.fire(why ? why : "no reason given");
	} catch (...) {
		// A string that cannot be copied: the waits are not ended, and
		// the call's deadline still bounds them.
	}
}

extern "C" void gs_gloo_destroy(struct gs_gloo *g)
{
	delete g;
}
