/*
 * The small-bucket baseline (bench/small-buckets.sh): one rank of a Gloo
 * group all-reducing a buffer of a few elements again and again, fp32
 * then fp16, each call timed on its own. What a bucket of that size
 * through gradsyncd is compared with: the network's round trips and
 * Gloo's own costs, nothing else.
 *
 * With sched_batch, this thread and the Gloo device thread it starts run
 * SCHED_BATCH, as gradsyncd's worker did until it kept its buffers past
 * the call instead (gs::Workspace in daemon/backend/gloo): Gloo at its
 * best on a core it shares and nothing else wants, without the stalls of
 * a caller that preempts Gloo's device thread and then spins in a
 * buffer's destructor.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "gloo_baseline.h"

#define GLOO_TIMEOUT_MS 60000

/* reps timed calls after warmup untimed ones, of one wire dtype; us[k]
 * gets call k's time in microseconds. */
static int time_calls(struct gs_gloo *g, enum gs_wire wire, float *src, void *buf,
		      uint64_t elements, unsigned warmup, unsigned reps, double *us, char *err,
		      size_t errlen)
{
	const struct gs_pack_params p = {.prescale = 1};
	for (unsigned k = 0; k < warmup + reps; k++) {
		/* Fresh small values every call: no overflow, however many. */
		for (uint64_t i = 0; i < elements; i++)
			src[i] = (float)((k + i) % 7) * 0.125f;
		gs_pack(wire, buf, src, elements, &p);
		double t0 = gs_now_ms();
		int rc = gs_gloo_allreduce_with(g, wire, buf, elements, GS_GLOO_SUM_GLOO,
						GLOO_TIMEOUT_MS, err, errlen);
		if (rc < 0)
			return rc;
		if (k >= warmup)
			us[k - warmup] = (gs_now_ms() - t0) * 1e3;
	}
	return GS_OK;
}

int small_gloo_rank(const char *store_dir, const char *host, unsigned rank, unsigned world,
		    uint64_t elements, unsigned warmup, unsigned reps, bool sched_batch, FILE *csv)
{
	struct gloo_member m = {.err = "out of memory"};
	float *src = calloc(elements, sizeof(*src));
	float *buf = calloc(elements, sizeof(*buf)); /* room for the widest dtype */
	double *us = calloc(reps, sizeof(*us));
	int rc = src && buf && us ? GS_OK : GS_ENOMEM;
	if (rc == GS_OK && sched_batch &&
	    pthread_setschedparam(pthread_self(), SCHED_BATCH, &(struct sched_param){0}) != 0) {
		snprintf(m.err, sizeof(m.err), "cannot run SCHED_BATCH");
		rc = GS_ESYSTEM;
	}
	if (rc == GS_OK)
		rc = gloo_join(&m, store_dir, host, rank, world, GLOO_TIMEOUT_MS);
	for (unsigned s = 0; rc == GS_OK && s < GLOO_SYSTEMS; s++) {
		rc = time_calls(m.g, gloo_systems[s].wire, src, buf, elements, warmup, reps, us,
				m.err, sizeof(m.err));
		for (unsigned k = 0; rc == GS_OK && k < reps; k++)
			fprintf(csv, "%s%s,%u,%u,%.3f\n", gloo_systems[s].name,
				sched_batch ? "-batch" : "", rank, k + 1, us[k]);
	}
	int status = gloo_leave(&m, rc, "gradsync-bench-gloo-rank: rank", rank);
	free(src);
	free(buf);
	free(us);
	return status;
}
