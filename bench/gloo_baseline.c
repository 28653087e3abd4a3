#include "gloo_baseline.h"

#include <stdio.h>

#include "file_store.h"

const struct gloo_system gloo_systems[GLOO_SYSTEMS] = {
    {"gloo-fp32", GS_WIRE_F32},
    {"gloo-fp16", GS_WIRE_F16},
};

int gloo_join(struct gloo_member *m, const char *store_dir, const char *host, unsigned rank,
	      unsigned world, int timeout_ms)
{
	/* gs_gloo_create uses the store only while it runs. */
	struct gs_gloo_store_ops store = file_store(store_dir);
	return gs_gloo_create(&store, (int)rank, (int)world, host, timeout_ms, &m->g, m->err,
			      sizeof(m->err));
}

int gloo_leave(struct gloo_member *m, int rc, const char *who, unsigned rank)
{
	if (rc != GS_OK)
		fprintf(stderr, "%s %u: %s\n", who, rank, m->err);
	gs_gloo_destroy(m->g);
	m->g = NULL;
	return rc == GS_OK ? 0 : 1;
}
