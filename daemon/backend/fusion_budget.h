/*
 * The node's budget of fusion memory: the bytes that the fusion and
 * staging buffers of every job's backend hold together, at most
 * --max-fusion-memory. A backend sizes its buffers by its job's bucket
 * plan (gs_backend_ops.size_buffers) and takes their bytes from the
 * budget before it makes them; a job whose buffers do not fit is refused
 * at registration, and the bytes come back when its backend goes. For the
 * host backend the bytes are the daemon's own memory; for the CUDA
 * backend, GPU memory summed over the GPUs.
 */
#ifndef GS_FUSION_BUDGET_H
#define GS_FUSION_BUDGET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct gs_fusion_budget {
	uint64_t limit;        /* bytes */
	_Atomic uint64_t used; /* bytes every holder has taken */
};

void gs_fusion_budget_init(struct gs_fusion_budget *b, uint64_t limit);

/* A holder's share of the budget, *held bytes, becomes `want` bytes. A
 * share that shrinks always does; one that grows past the budget's room
 * stays as it was, and the call returns GS_ELIMIT with why naming
 * --max-fusion-memory, the bytes asked for and the bytes other holders
 * use. GS_OK otherwise. A NULL budget has no limit. */
int gs_fusion_budget_resize(struct gs_fusion_budget *b, uint64_t *held, uint64_t want,
			    char *why, size_t n);

/* Bytes every holder has taken. */
uint64_t gs_fusion_budget_used(const struct gs_fusion_budget *b);

#endif
