/*
 * All-reduce between daemons of different nodes with Gloo (TCP transport).
 *
 * A plain C face on Gloo's C++: one handle per group of daemons, created
 * once through a key-value store the caller provides (the daemon backs it by
 * its own rendezvous), then one in-place sum per call in the wire dtype, by
 * Gloo's ring, by recursive doubling or by Rabenseifner's halving and
 * doubling as gloo_choice.h's model picks for the call's bytes and the
 * group's size.
 * fp16 and bf16 are summed by the project's vectorised kernels (widen, add
 * in fp32, round once per hop) instead of Gloo's element-by-element float16
 * operator+; fp32 uses Gloo's own sum, which is already a plain loop.
 *
 * Every function returns GS_OK (0) or a negative GS_E* code of gradsync.h
 * and, on failure, writes a message naming what failed to err (always NUL
 * terminated when errlen > 0). No C++ exception crosses this interface.
 *
 * Gloo writes to sockets whose peer may be gone: the process must ignore
 * SIGPIPE (gradsyncd does, in main).
 *
 * A build without Gloo links gloo_absent.c instead: the same functions,
 * where gs_gloo_available() is false and no group can be made.
 */
#ifndef GS_GLOO_COMM_H
#define GS_GLOO_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/gloo/gloo_choice.h"
#include "convert.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gs_gloo;

/* Whether this build has Gloo: without it, gs_gloo_create fails (GS_EINVAL)
 * and a daemon cannot join other nodes. */
bool gs_gloo_available(void);

/* A key-value store shared by all ranks of the group. Gloo picks the keys
 * and values: with this Gloo, "rank_<r>" holds rank r's host name and "<r>"
 * its listening addresses (opaque bytes, a few hundred). A caller that
 * reuses one store for several groups must namespace the keys itself. Both
 * functions are called only from the thread running gs_gloo_create. */
struct gs_gloo_store_ops {
	void *ctx;
	/* Stores a copy of value under key. Returns GS_OK or a GS_E* code. */
	int (*set)(void *ctx, const char *key, const void *value, size_t len);
	/* Blocks until key exists or timeout_ms passes. On GS_OK, *value is a
	 * malloc'd copy of the value, which the caller of get (this layer)
	 * frees, and *len its size. Returns GS_ETIMEDOUT when the key did not
	 * appear in time, another GS_E* code on other failures. */
	int (*get)(void *ctx, const char *key, void **value, size_t *len, int timeout_ms);
};

/* Joins the group of `size` ranks as `rank` (0 <= rank < size): opens a
 * TCP device on iface_or_host (a network interface name such as "eth0",
 * else a host name or address such as "127.0.0.1"; NULL or "": the
 * machine's host name), publishes its addresses through the store, connects
 * to every other rank and waits at a barrier until all ranks are connected
 * (so that no rank tears its connections down while a peer still sets its
 * up). Returns GS_OK with *out set; GS_ETIMEDOUT when some rank did not
 * appear within timeout_ms, in all (the message names the rank), or did not
 * connect within a further timeout_ms at most; GS_EINVAL for bad
 * arguments; the store's own code when a store call fails;
 * GS_EDISCONNECTED or GS_ESYSTEM for transport failures. The store is used
 * only during this call. The environment variable GRADSYNCD_GLOO_ALGO
 * ("ring", "doubling" or "rabenseifner"; unset or "auto": the model's
 * pick) fixes what
 * gs_gloo_allreduce runs in this group, for benchmarks' baselines; another
 * value fails with GS_EINVAL. */
int gs_gloo_create(const struct gs_gloo_store_ops *store, int rank, int size,
		   const char *iface_or_host, int timeout_ms, struct gs_gloo **out, char *err,
		   size_t errlen);

/* Which function sums two buffers at each hop. */
enum gs_gloo_sum {
	/* fp16/bf16: the conversion kernels (gs_reduce_sum); fp32: Gloo's. */
	GS_GLOO_SUM_KERNELS = 0,
	/* Gloo's own gloo::sum<T>: for fp16 its scalar float16 operator+.
	 * Kept for benchmarks and cross-checks; bf16 has none (GS_EINVAL). */
	GS_GLOO_SUM_GLOO = 1,
};

/* Sums buf (count elements of the wire dtype) over all ranks, in place;
 * every rank ends with the same bits. All ranks must call it with the same
 * wire and count, in the same order. timeout_ms <= 0 means the timeout given
 * to gs_gloo_create. Returns GS_OK; GS_ETIMEDOUT when a peer did not take
 * part in time; GS_EDISCONNECTED when a peer's connection failed or closed
 * (but a peer that dies while a send to it is half written shows only at
 * the timeout, as GS_ETIMEDOUT: this Gloo does not wake that send);
 * GS_EINVAL for bad arguments; GS_ESTATE when an earlier failure broke the
 * handle; GS_ESYSTEM otherwise. After any failure buf holds unspecified
 * (partly reduced) values, Gloo no longer touches it, and the handle only
 * answers GS_ESTATE: destroy it and create a new group. One call at a time
 * per handle. */
int gs_gloo_allreduce(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count, int timeout_ms,
		      char *err, size_t errlen);

/* gs_gloo_allreduce with the per-hop sum chosen (benchmarks, tests). */
int gs_gloo_allreduce_with(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count,
			   enum gs_gloo_sum sum, int timeout_ms, char *err, size_t errlen);

/* gs_gloo_allreduce by the algorithm given (benchmarks, tests): AUTO is
 * what gs_gloo_allreduce does; HALVING_DOUBLING (Gloo's classic class)
 * waits with the timeout given to gs_gloo_create whatever timeout_ms says,
 * sums with the kernels only, and ends with a barrier (see gloo_comm.cc).
 * Every rank must name the same one. */
int gs_gloo_allreduce_algo(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count,
			   enum gs_gloo_algo algo, int timeout_ms, char *err, size_t errlen);

/* Copies bytes bytes of buf on rank root into buf on every other rank
 * (Gloo's broadcast, a binomial tree): raw bytes, no conversion. All ranks
 * must call it with the same root and bytes, in the same order as their
 * other calls on g. timeout_ms <= 0 means the timeout given to
 * gs_gloo_create. Returns and fails as gs_gloo_allreduce does: after a
 * failure a receiver's buf holds some of the root's bytes and some of its
 * own, and the handle only answers GS_ESTATE. */
int gs_gloo_broadcast(struct gs_gloo *g, void *buf, size_t bytes, int root, int timeout_ms,
		      char *err, size_t errlen);

/* What gs_gloo_allreduce runs for count elements of wire in this group
 * (RING, DOUBLING or RABENSEIFNER). */
enum gs_gloo_algo gs_gloo_choice(const struct gs_gloo *g, enum gs_wire wire, size_t count);

/* The bytes up to which gs_gloo_allreduce runs doubling in this group,
 * and up to which doubling or Rabenseifner, the ring above (0: never;
 * SIZE_MAX: always), for the daemon's log. */
size_t gs_gloo_doubling_up_to(const struct gs_gloo *g);
size_t gs_gloo_rabenseifner_up_to(const struct gs_gloo *g);

/* Bytes this rank sends in gs_gloo_allreduce of count elements of wire:
 * what the algorithm it runs for them sends (gs_gloo_sent_bytes). */
uint64_t gs_gloo_call_sent_bytes(const struct gs_gloo *g, enum gs_wire wire, size_t count);

int gs_gloo_rank(const struct gs_gloo *g);
int gs_gloo_size(const struct gs_gloo *g);

/* Ends the wait of the all-reduce in progress on g and fails every later
 * one at once (GS_EDISCONNECTED, the message ending in why): for a caller
 * that learned by other means, its liveness pings, that a rank is gone, so
 * that a call does not wait out its deadline. Any thread may call it while
 * g lives; NULL does nothing. Doubling and Rabenseifner (the votes, the
 * small buckets, every bucket's head) are woken; Gloo's ring, for large
 * buffers, ends at its deadline, --peer-timeout. Then destroy g and create
 * a new group. */
void gs_gloo_interrupt(struct gs_gloo *g, const char *why);

/* Closes the connections and frees g; NULL does nothing. Peers blocked in
 * an all-reduce with this rank then fail with GS_EDISCONNECTED. */
void gs_gloo_destroy(struct gs_gloo *g);

#ifdef __cplusplus
}
#endif

#endif
