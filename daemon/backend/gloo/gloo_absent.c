/*
 * gloo_comm.h in a build without Gloo: a daemon of one node needs none of
 * it, and one asked to join others says that it cannot (the cluster checks
 * gs_gloo_available first), so that nothing above needs to #ifdef on Gloo.
 */
#include "backend/gloo/gloo_comm.h"

#include <stdio.h>

#include "errors.h"

bool gs_gloo_available(void)
{
	return false;
}

int gs_gloo_create(const struct gs_gloo_store_ops *store, int rank, int size,
		   const char *iface_or_host, int timeout_ms, struct gs_gloo **out, char *err,
		   size_t errlen)
{
	(void)store;
	(void)rank;
	(void)size;
	(void)iface_or_host;
	(void)timeout_ms;
	*out = NULL;
	snprintf(err, errlen, "built without Gloo");
	return GS_EINVAL;
}

int gs_gloo_allreduce_with(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count,
			   enum gs_gloo_sum sum, int timeout_ms, char *err, size_t errlen)
{
	(void)g;
	(void)wire;
	(void)buf;
	(void)count;
	(void)sum;
	(void)timeout_ms;
	snprintf(err, errlen, "built without Gloo");
	return GS_ESTATE;
}

int gs_gloo_allreduce(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count, int timeout_ms,
		      char *err, size_t errlen)
{
	return gs_gloo_allreduce_with(g, wire, buf, count, GS_GLOO_SUM_KERNELS, timeout_ms, err,
				      errlen);
}

int gs_gloo_allreduce_algo(struct gs_gloo *g, enum gs_wire wire, void *buf, size_t count,
			   enum gs_gloo_algo algo, int timeout_ms, char *err, size_t errlen)
{
	(void)algo;
	return gs_gloo_allreduce_with(g, wire, buf, count, GS_GLOO_SUM_KERNELS, timeout_ms, err,
				      errlen);
}

enum gs_gloo_algo gs_gloo_choice(const struct gs_gloo *g, enum gs_wire wire, size_t count)
{
	(void)g;
	(void)wire;
	(void)count;
	return GS_GLOO_ALGO_RING;
}

size_t gs_gloo_doubling_up_to(const struct gs_gloo *g)
{
	(void)g;
	return 0;
}

size_t gs_gloo_rabenseifner_up_to(const struct gs_gloo *g)
{
	(void)g;
	return 0;
}

int gs_gloo_broadcast(struct gs_gloo *g, void *buf, size_t bytes, int root, int timeout_ms,
		      char *err, size_t errlen)
{
	(void)g;
	(void)buf;
	(void)bytes;
	(void)root;
	(void)timeout_ms;
	snprintf(err, errlen, "built without Gloo");
	return GS_EINVAL;
}

int gs_gloo_rank(const struct gs_gloo *g)
{
	(void)g;
	return 0;
}

int gs_gloo_size(const struct gs_gloo *g)
{
	(void)g;
	return 1;
}

uint64_t gs_gloo_call_sent_bytes(const struct gs_gloo *g, enum gs_wire wire, size_t count)
{
	(void)g;
	(void)wire;
	(void)count;
	return 0;
}

void gs_gloo_interrupt(struct gs_gloo *g, const char *why)
{
	(void)g;
	(void)why;
}

void gs_gloo_destroy(struct gs_gloo *g)
{
	(void)g;
}
