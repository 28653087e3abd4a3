/*
 * A trainer's state: registering its parameters and buffers (raw bytes of
 * any dtype) in shared memory, and the broadcast that makes every
 * trainer's state equal to one trainer's.
 *
 * The memory is laid out as the gradients' is (tensors.c): tensors
 * without memory of their own share one sealed memfd that the library
 * creates; a caller's memfds are adopted. The state's buffers are
 * numbered apart from the gradients', from 0, in the order tensors first
 * use them. CUDA state is cuda_state.c's (IPC handles of its allocations); the
 * frames, gs_reconnect and the broadcast are the same.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define STATE_ALIGN 64
#define BYTES_MAX (UINT64_C(1) << 62)

/* ---- checks ---------------------------------------------------------------- */

/* What every state tensor needs, memfd or CUDA: a name, bytes that are a
 * whole number of its dtype's elements. */
int gs__check_state_tensor(struct gs_client *c, size_t i, const char *name, enum gs_dtype dtype,
			   uint64_t bytes)
{
	size_t esize;
	int r = gs__check_tensor(c, i, name, dtype, bytes ? bytes : 1, &esize);
	if (r < 0)
		return r;
	if (bytes == 0)
		return gs__fail(c, GS_EINVAL, "state tensor '%s' has no bytes", name);
	if (bytes > BYTES_MAX || bytes % esize)
		return gs__fail(c, GS_EINVAL,
			       "state tensor '%s': %" PRIu64 " bytes is not a whole number of %zu-byte elements",
			       name, bytes, esize);
	return GS_OK;
}

int gs__check_state_register(struct gs_client *c, const char *fn, size_t n, bool have_specs)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER)
		return gs__fail(c, GS_ESTATE, "%s needs a trainer connection", fn);
	if (c->state.registered)
		return gs__fail(c, GS_ESTATE, "state is already registered on this connection");
	if (!have_specs || n == 0)
		return gs__fail(c, GS_EINVAL, "%s: no state tensors", fn);
	if (n > UINT32_MAX)
		return gs__fail(c, GS_ELIMIT, "%s: %zu state tensors", fn, n);
	return GS_OK;
}

/* ---- placement --------------------------------------------------------------- */

/* The state tensors the library allocates, back to back, aligned. */
static int layout_own(struct gs_client *c, const struct gs_state_spec *specs, size_t n,
		      struct gs__placement *pl, uint64_t *total)
{
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		if (specs[i].memfd >= 0)
			continue;
		off = (off + STATE_ALIGN - 1) & ~(uint64_t)(STATE_ALIGN - 1);
		pl[i].offset = off;
		off += specs[i].bytes;
		if (off > BYTES_MAX || off > SIZE_MAX / 2)
			return gs__fail(c, GS_ELIMIT,
				       "the state needs more shared memory than this process can map");
	}
	*total = off;
	return GS_OK;
}

/* A caller's memfd is mapped once, however many tensors it holds. */
static int adopt(struct gs_client *c, int fd, uint32_t *index)
{
	struct gs__state *st = &c->state;
	for (size_t b = 0; b < st->nbuffers; b++) {
		if (!st->buffers[b].owned && st->buffers[b].fd == fd) {
			*index = (uint32_t)b;
			return GS_OK;
		}
	}
	int r = gs__memfd_adopt(c, fd, &st->buffers[st->nbuffers]);
	if (r == GS_OK)
		*index = (uint32_t)st->nbuffers++;
	return r;
}

static int place_one(struct gs_client *c, const struct gs_state_spec *s, struct gs__placement *pl,
		     int *own, uint64_t own_size)
{
	struct gs__state *st = &c->state;
	int r = GS_OK;
	if (s->memfd >= 0) {
		pl->offset = s->offset;
		r = adopt(c, s->memfd, &pl->buffer);
	} else if (*own < 0) {
		r = gs__memfd_create(c, own_size, "the state", &st->buffers[st->nbuffers]);
		if (r == GS_OK)
			*own = (int)st->nbuffers++;
	}
	if (r < 0)
		return r;
	if (s->memfd < 0)
		pl->buffer = (uint32_t)*own;
	const struct gs__buffer *b = &st->buffers[pl->buffer];
	if (pl->offset > b->size || s->bytes > b->size - pl->offset)
		return gs__fail(c, GS_EBUFFER,
			       "state tensor '%s' needs bytes %" PRIu64 "..%" PRIu64
			       " of memfd %d, which is %zu bytes long",
			       s->name, pl->offset, pl->offset + s->bytes, b->fd, b->size);
	return GS_OK;
}

static int place_all(struct gs_client *c, const struct gs_state_spec *specs, size_t n,
		     struct gs__placement *pl)
{
	uint64_t own_size = 0;
	int own = -1;
	int r = layout_own(c, specs, n, pl, &own_size);
	for (size_t i = 0; i < n && r == GS_OK; i++) {
		r = place_one(c, &specs[i], &pl[i], &own, own_size);
		if (r == GS_OK)
			c->state.data[i] = c->state.buffers[pl[i].buffer].addr + pl[i].offset;
	}
	return r;
}

/* ---- the RegisterState frames ------------------------------------------------ */

static int send_registration(struct gs_client *c)
{
	const struct gs__state *st = &c->state;
	struct gs__reg_frames *f = gs__reg_frames_new_as(c, st->cuda == NULL, true);
	if (!f)
		return GS_ENOMEM;
	uint32_t attached = 0; /* buffers whose descriptor is on its way */
	int r = GS_OK;
	for (size_t i = 0; i < st->n && r == GS_OK; i++) {
		Gradsync__StateTensor t = GRADSYNC__STATE_TENSOR__INIT;
		t.name = (char *)st->specs[i].name;
		t.bytes = st->specs[i].bytes;
		t.dtype = (Gradsync__Dtype)st->specs[i].dtype;
		t.buffer = st->pl[i].buffer;
		t.offset = st->pl[i].offset;
		Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
		const struct gs__buffer *b = NULL;
		bool new_buf = st->pl[i].buffer == attached;
		if (new_buf && st->cuda) {
			buf = gs__cuda_state_buffer(st, attached++);
		} else if (new_buf) {
			b = &st->buffers[attached++];
			buf.size = b->size;
		}
		r = gs__reg_frames_add_state(c, f, &t, new_buf ? &buf : NULL, b ? b->fd : -1);
	}
	return gs__reg_frames_end(c, f, r);
}

int gs__wait_state_registered(struct gs_client *c, size_t n)
{
	/* The daemon waits for the other nodes' state layouts; it bounds
	 * that wait (--join-timeout), not us. */
	int r = gs__conn_pump(c, gs__has_reply, -1);
	if (r < 0)
		return r;
	const Gradsync__StateRegistered *reg = c->reply->state_registered;
	if (reg->tensors != n)
		r = gs__fail_dead(c, GS_EPROTO,
				 "protocol error: gradsyncd registered %u state tensors of %zu",
				 reg->tensors, n);
	gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
	return r;
}

int gs__register_state_again(struct gs_client *c)
{
	if (!c->state.registered)
		return GS_OK;
	gs__doing(c, "the state's registration");
	c->expect = GRADSYNC__MESSAGE__BODY_STATE_REGISTERED;
	int r = send_registration(c);
	if (r == GS_OK)
		r = gs__wait_state_registered(c, c->state.n);
	return r;
}

/* ---- keeping it ---------------------------------------------------------------- */

void gs__state_release(struct gs_client *c)
{
	struct gs__state *st = &c->state;
	for (size_t b = 0; st->buffers && b < st->nbuffers; b++)
		gs__memfd_release(&st->buffers[b]);
	gs__cuda_state_release(st);
	for (size_t i = 0; st->specs && i < st->n; i++)
		free((char *)st->specs[i].name);
	free(st->buffers);
	free(st->specs);
	free(st->pl);
	free(st->data);
	*st = (struct gs__state){ .seq = st->seq };
}

/* A copy of the specs (names too), for the frames and gs_reconnect. */
int gs__state_keep_specs(struct gs_client *c, const struct gs_state_spec *specs, size_t n)
{
	struct gs__state *st = &c->state;
	st->specs = calloc(n, sizeof(*st->specs));
	st->data = calloc(n, sizeof(*st->data));
	if (!st->specs || !st->data)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	st->n = n;
	for (size_t i = 0; i < n; i++) {
		st->specs[i] = specs[i];
		st->specs[i].name = strdup(specs[i].name);
		if (!st->specs[i].name)
			return gs__fail(c, GS_ENOMEM, "out of memory");
	}
	return GS_OK;
}

/* ---- the API ----------------------------------------------------------------------- */

int gs_register_state(gs_client *c, const struct gs_state_spec *specs, size_t n)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_register_state: NULL handle");
	gs__doing(c, "the state's registration");
	int r = gs__check_state_register(c, "gs_register_state", n, specs != NULL);
	for (size_t i = 0; i < n && r == GS_OK; i++)
		r = gs__check_state_tensor(c, i, specs[i].name, specs[i].dtype, specs[i].bytes);
	if (r < 0)
		return r;
	struct gs__state *st = &c->state;
	st->pl = calloc(n, sizeof(*st->pl));
	st->buffers = calloc(n, sizeof(*st->buffers));
	r = st->pl && st->buffers ? gs__state_keep_specs(c, specs, n)
				  : gs__fail(c, GS_ENOMEM, "out of memory");
	if (r == GS_OK)
		r = place_all(c, specs, n, st->pl);
	if (r < 0) {
		gs__state_release(c);
		return r;
	}
	return gs__state_send_first(c);
}

int gs__state_send_first(struct gs_client *c)
{
	/* An Error may answer any frame: expect the reply from the first. */
	c->expect = GRADSYNC__MESSAGE__BODY_STATE_REGISTERED;
	int r = send_registration(c);
	if (r == GS_OK)
		r = gs__wait_state_registered(c, c->state.n);
	if (r == GS_OK) {
		c->state.registered = true;
		return GS_OK;
	}
	/* The daemon holds part of a registration that cannot go on. */
	gs__end_session(c, r);
	c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
	gs__state_release(c);
	return r;
}

size_t gs_state_count(const gs_client *c)
{
	return c && c->state.registered ? c->state.n : 0;
}

void *gs_state_data(gs_client *c, size_t index)
{
	if (!c || !c->state.registered || index >= c->state.n)
		return NULL;
	return c->state.data[index];
}
