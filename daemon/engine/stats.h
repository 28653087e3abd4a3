/*
 * The node's running figures of steps: completed and aborted steps, their
 * times (a median over recent steps and a histogram for the metrics) and
 * what they reduced. The job keeps them (job.h); status, metrics and the
 * systemd status line read them.
 */
#ifndef GS_STATS_H
#define GS_STATS_H

#include <stdint.h>

#define GS_STEP_HISTORY 1024
/* Upper bounds of the step-time histogram's buckets (metrics). */
#define GS_STEP_BUCKETS 15
extern const uint64_t gs_step_bounds_ns[GS_STEP_BUCKETS];

struct gs_stats {
	uint64_t steps_completed;
	uint64_t steps_aborted;
	uint64_t last_step_ns;
	uint64_t last_step_end_ns;           /* when it ended (gs_now_ns), 0: none yet */
	uint64_t history[GS_STEP_HISTORY]; /* recent step times, for the median */
	uint64_t bytes_reduced;
	uint64_t elements_clipped;
	uint64_t nonfinite;
	uint64_t step_ns_sum;                /* of completed steps */
	uint64_t step_le[GS_STEP_BUCKETS];   /* steps no longer than each bound */
};

/* The median of the recent step times (0 before the first step). */
uint64_t gs_stats_median(const struct gs_stats *s);
void gs_stats_record_step(struct gs_stats *s, uint64_t duration_ns);

#endif
