#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"

const uint64_t gs_step_bounds_ns[GS_STEP_BUCKETS] = {
	1000000, 2500000, 5000000, 10000000, 25000000, 50000000, 100000000, 250000000,
	500000000, 1000000000, 2500000000u, 5000000000u, 10000000000u, 30000000000u,
	60000000000u,
};

void gs_stats_record_step(struct gs_stats *s, uint64_t duration_ns)
{
	s->step_ns_sum += duration_ns;
	for (size_t i = 0; i < GS_STEP_BUCKETS; i++)
		s->step_le[i] += duration_ns <= gs_step_bounds_ns[i];
	s->history[s->steps_completed % GS_STEP_HISTORY] = duration_ns;
	s->steps_completed++;
	s->last_step_ns = duration_ns;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

uint64_t gs_stats_median(const struct gs_stats *s)
{
	size_t n = s->steps_completed < GS_STEP_HISTORY ? s->steps_completed : GS_STEP_HISTORY;
	if (n == 0)
		return 0;
	uint64_t sorted[GS_STEP_HISTORY];
	memcpy(sorted, s->history, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_u64);
	return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}
