/*
 * A trainer's state in CUDA memory: its tensors' allocations go to
 * gradsyncd as CUDA IPC handles (cuda_mem.h), numbered apart from the
 * gradients' as memfd state buffers are (state.c), which sends the frames,
 * keeps the registration for gs_reconnect and runs the broadcast alike.
 * No events: the broadcast is between steps, and the caller's GPU work on
 * the state has finished before it asks (gradsync.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cuda_mem.h"

void gs__cuda_state_release(struct gs__state *st)
{
	if (!st->cuda)
		return;
	gs__cuda_mem_free(st->cuda);
	free(st->cuda);
	st->cuda = NULL;
}

Gradsync__Buffer gs__cuda_state_buffer(const struct gs__state *st, uint32_t b)
{
	return gs__cuda_mem_alloc_buffer(st->cuda, b);
}

static int check_specs(struct gs_client *c, const struct gs_cuda_state_spec *specs, size_t n)
{
	int r = gs__check_state_register(c, "gs_register_state_cuda", n, specs != NULL);
	if (r == GS_OK && (!c->backend || strcmp(c->backend, "cuda") != 0))
		r = gs__fail(c, GS_ESTATE,
			    "gradsyncd runs the %s backend; CUDA state needs its cuda backend (gradsyncd --backend cuda)",
			    c->backend ? c->backend : "unknown");
	for (size_t i = 0; i < n && r == GS_OK; i++) {
		const struct gs_cuda_state_spec *s = &specs[i];
		r = gs__check_state_tensor(c, i, s->name, s->dtype, s->bytes);
		if (r == GS_OK && (!s->data || (uintptr_t)s->data % gs__dtype_size(s->dtype)))
			r = gs__fail(c, GS_EINVAL,
				    "state tensor '%s': device pointer %p is NULL or misaligned",
				    s->name, s->data);
	}
	return r;
}

/* The specs as state.c keeps them, and where each tensor is. */
static int place(struct gs_client *c, const struct gs_cuda_state_spec *specs, size_t n)
{
	struct gs__state *st = &c->state;
	struct gs_state_spec *kept = calloc(n, sizeof(*kept));
	st->pl = calloc(n, sizeof(*st->pl));
	st->cuda = calloc(1, sizeof(*st->cuda));
	int r = kept && st->pl && st->cuda ? GS_OK : gs__fail(c, GS_ENOMEM, "out of memory");
	for (size_t i = 0; i < n && r == GS_OK; i++)
		kept[i] = (struct gs_state_spec){ specs[i].name, specs[i].bytes, specs[i].dtype, -1, 0 };
	if (r == GS_OK)
		r = gs__state_keep_specs(c, kept, n);
	free(kept);
	if (r == GS_OK)
		r = gs__cuda_mem_init(c, st->cuda, n);
	for (size_t i = 0; i < n && r == GS_OK; i++) {
		r = gs__cuda_mem_locate(c, st->cuda, i, specs[i].name, specs[i].data, specs[i].bytes,
					&st->pl[i].buffer, &st->pl[i].offset);
		st->data[i] = specs[i].data;
	}
	if (r == GS_OK)
		r = gs__cuda_mem_handles(c, st->cuda);
	if (r == GS_OK)
		st->nbuffers = st->cuda->nallocs;
	return r;
}

int gs_register_state_cuda(gs_client *c, const struct gs_cuda_state_spec *specs, size_t n)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_register_state_cuda: NULL handle");
	gs__doing(c, "the state's registration");
	int r = check_specs(c, specs, n);
	if (r == GS_OK)
		r = place(c, specs, n);
	if (r < 0) {
		gs__state_release(c);
		return r;
	}
	return gs__state_send_first(c);
}
