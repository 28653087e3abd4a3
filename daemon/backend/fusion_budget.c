#include "backend/fusion_budget.h"

#include <stdio.h>

#include "errors.h"

void gs_fusion_budget_init(struct gs_fusion_budget *b, uint64_t limit)
{
	b->limit = limit;
	atomic_store(&b->used, 0);
}

int gs_fusion_budget_resize(struct gs_fusion_budget *b, uint64_t *held, uint64_t want,
			    char *why, size_t n)
{
	if (!b) {
		*held = want;
		return GS_OK;
	}
	/* Jobs' backends size their buffers on the loop thread and give them
	 * back from it, but a compare-and-swap keeps the sum right whichever
	 * thread does. */
	uint64_t used = atomic_load(&b->used);
	for (;;) {
		uint64_t others = used - *held;
		if (want > *held && (want > b->limit || others > b->limit - want)) {
			snprintf(why, n, "its fusion buffers need %llu bytes, more than this node's fusion memory has free (--max-fusion-memory=%llu bytes, %llu in use by other jobs)",
				 (unsigned long long)want, (unsigned long long)b->limit,
				 (unsigned long long)others);
			return GS_ELIMIT;
		}
		if (atomic_compare_exchange_weak(&b->used, &used, others + want))
			break;
	}
	*held = want;
	return GS_OK;
}

uint64_t gs_fusion_budget_used(const struct gs_fusion_budget *b)
{
	return atomic_load(&((struct gs_fusion_budget *)b)->used);
}
