/*
 * What the ranks of the Gloo baseline share (sync_gloo.c's DDP-style
 * buckets, small_gloo.c's small all-reduces, gloo-rank.c's CSV): the two
 * systems it measures, and joining and leaving its group through the file
 * store of testing/.
 */
#ifndef GS_BENCH_GLOO_BASELINE_H
#define GS_BENCH_GLOO_BASELINE_H

#include "backend/gloo/gloo_comm.h"
#include "gradsync.h"
#include "suite.h"

struct gloo_system {
	const char *name; /* as the CSVs and tables name it */
	enum gs_wire wire;
};

/* gloo-fp32 and gloo-fp16, in the order every baseline runs them. */
extern const struct gloo_system gloo_systems[GLOO_SYSTEMS];

/* One rank's membership of the group, and why its last call failed. */
struct gloo_member {
	struct gs_gloo *g;
	char err[512];
};

/* Joins as rank `rank` of `world`, its Gloo device on host, meeting the
 * others through the file store in directory store_dir. Returns GS_OK, or
 * a GS_E* code with the reason in m->err. */
int gloo_join(struct gloo_member *m, const char *store_dir, const char *host, unsigned rank,
	      unsigned world, int timeout_ms);

/* Leaves the group (m->g may be NULL); when rc is not GS_OK, first prints
 * "<who> <rank>: <m->err>" to stderr. Returns the rank's exit status: 0 or 1. */
int gloo_leave(struct gloo_member *m, int rc, const char *who, unsigned rank);

#endif
