/*
 * Registration: where each tensor's memory lives, and telling gradsyncd.
 *
 * Tensors without memory of their own share ONE sealed memfd that the
 * library creates; a caller's memfds are adopted (mapped too, so that
 * gs_tensor_data works, and never closed). Buffers are numbered in the
 * order tensors first use them, which is the order their descriptors go
 * out, so every tensor's buffer index refers to a descriptor sent in its
 * own frame or an earlier one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"

/* Cache lines, and whole vectors for the daemon's conversion kernels. */
#define TENSOR_ALIGN 64
#define NAME_MAX_BYTES 4096
#define BYTES_MAX (UINT64_C(1) << 62)

size_t gs__dtype_size(enum gs_dtype d)
{
	switch (d) {
	case GS_UINT8: return 1;
	case GS_FLOAT16:
	case GS_BFLOAT16: return 2;
	case GS_FLOAT32:
	case GS_INT32: return 4;
	case GS_FLOAT64:
	case GS_INT64: return 8;
	}
	return 0;
}

static uint64_t spec_bytes(const struct gs_tensor_spec *s)
{
	return s->count * gs__dtype_size(s->dtype);
}

/* The dtype itself is the daemon's to refuse, with its own words; only
 * what the library cannot size is refused here. */
int gs__check_tensor(struct gs_client *c, size_t i, const char *name, enum gs_dtype dtype,
		    uint64_t count, size_t *esize)
{
	if (!name || !*name)
		return gs__fail(c, GS_EINVAL, "tensor %zu has no name", i);
	if (strlen(name) > NAME_MAX_BYTES)
		return gs__fail(c, GS_ELIMIT,
			       "tensor %zu's name is longer than %d bytes", i,
			       NAME_MAX_BYTES);
	*esize = gs__dtype_size(dtype);
	if (*esize == 0)
		return gs__fail(c, GS_EDTYPE, "tensor '%s' has unknown dtype %d",
			       name, (int)dtype);
	if (count == 0)
		return gs__fail(c, GS_EINVAL, "tensor '%s' has no elements",
			       name);
	if (count > BYTES_MAX / *esize)
		return gs__fail(c, GS_ELIMIT,
			       "tensor '%s' has too many elements (%" PRIu64 ")",
			       name, count);
	return GS_OK;
}

static int check_spec(struct gs_client *c, const struct gs_tensor_spec *s,
		      size_t i)
{
	size_t esize;
	int r = gs__check_tensor(c, i, s->name, s->dtype, s->count, &esize);
	if (r < 0)
		return r;
	if (s->memfd >= 0 && s->offset % esize != 0)
		return gs__fail(c, GS_EINVAL,
			       "tensor '%s': offset %" PRIu64
			       " is not a multiple of its element size %zu",
			       s->name, s->offset, esize);
	return GS_OK;
}

/* ---- buffers ----------------------------------------------------------- */

static int create_own(struct gs_client *c, uint64_t size)
{
	int r = gs__memfd_create(c, size, "the tensors", &c->buffers[c->nbuffers]);
	if (r == GS_OK)
		c->nbuffers++;
	return r;
}

/* Maps a caller's memfd once, however many tensors it holds. */
static int adopt(struct gs_client *c, int fd, uint32_t *index)
{
	for (size_t b = 0; b < c->nbuffers; b++) {
		if (!c->buffers[b].owned && c->buffers[b].fd == fd) {
			*index = (uint32_t)b;
			return GS_OK;
		}
	}
	int r = gs__memfd_adopt(c, fd, &c->buffers[c->nbuffers]);
	if (r == GS_OK)
		*index = (uint32_t)c->nbuffers++;
	return r;
}

void gs__tensors_release(struct gs_client *c)
{
	gs__cuda_release(c);
	for (size_t b = 0; b < c->nbuffers; b++)
		gs__memfd_release(&c->buffers[b]);
	for (size_t i = 0; c->reg_specs && i < c->ntensors; i++)
		free((char *)c->reg_specs[i].name);
	free(c->reg_specs);
	free(c->reg_pl);
	free(c->reduced);
	free(c->buffers);
	free(c->tensors);
	c->reg_specs = NULL;
	c->reg_pl = NULL;
	c->reduced = NULL;
	c->buffers = NULL;
	c->tensors = NULL;
	c->nbuffers = 0;
	c->ntensors = 0;
	c->registered = false;
}

/* ---- placement --------------------------------------------------------- */

/* Lays out the tensors the library allocates, back to back, aligned. */
static int layout_own(struct gs_client *c, const struct gs_tensor_spec *specs,
		      size_t n, struct gs__placement *pl, uint64_t *total)
{
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		if (specs[i].memfd >= 0)
			continue;
		off = (off + TENSOR_ALIGN - 1) & ~(uint64_t)(TENSOR_ALIGN - 1);
		pl[i].offset = off;
		off += spec_bytes(&specs[i]);
		if (off > BYTES_MAX || off > SIZE_MAX / 2)
			return gs__fail(c, GS_ELIMIT,
				       "the tensors need more shared memory than this process can map");
	}
	*total = off;
	return GS_OK;
}

static int check_fits(struct gs_client *c, const struct gs_tensor_spec *s,
		      const struct gs__placement *pl)
{
	const struct gs__buffer *b = &c->buffers[pl->buffer];
	uint64_t bytes = spec_bytes(s);
	if (pl->offset <= b->size && bytes <= b->size - pl->offset)
		return GS_OK;
	return gs__fail(c, GS_EBUFFER,
		       "tensor '%s' needs bytes %" PRIu64 "..%" PRIu64
		       " of memfd %d, which is %zu bytes long",
		       s->name, pl->offset, pl->offset + bytes, b->fd, b->size);
}

static int place_all(struct gs_client *c, const struct gs_tensor_spec *specs,
		     size_t n, struct gs__placement *pl, uint64_t own_size)
{
	int own = -1;
	for (size_t i = 0; i < n; i++) {
		int r = GS_OK;
		if (specs[i].memfd >= 0) {
			pl[i].offset = specs[i].offset;
			r = adopt(c, specs[i].memfd, &pl[i].buffer);
		} else if (own < 0) {
			own = (int)c->nbuffers;
			r = create_own(c, own_size);
		}
		if (r < 0)
			return r;
		if (specs[i].memfd < 0)
			pl[i].buffer = (uint32_t)own;
		r = check_fits(c, &specs[i], &pl[i]);
		if (r < 0)
			return r;
		c->tensors[i].data =
			(float *)(c->buffers[pl[i].buffer].addr + pl[i].offset);
		c->tensors[i].count = specs[i].count;
	}
	return GS_OK;
}

/* ---- the RegisterTensors frames ---------------------------------------- */

static int send_registration(struct gs_client *c,
			     const struct gs_tensor_spec *specs, size_t n,
			     const struct gs__placement *pl)
{
	struct gs__reg_frames *f = gs__reg_frames_new(c, true);
	if (!f)
		return GS_ENOMEM;
	uint32_t attached = 0; /* buffers whose descriptor is on its way */
	int r = GS_OK;
	for (size_t i = 0; i < n && r == GS_OK; i++) {
		Gradsync__TensorSpec t = GRADSYNC__TENSOR_SPEC__INIT;
		t.name = (char *)specs[i].name;
		t.count = specs[i].count;
		t.dtype = (Gradsync__Dtype)specs[i].dtype;
		t.buffer = pl[i].buffer;
		t.offset = pl[i].offset;
		Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
		const struct gs__buffer *b = NULL;
		if (pl[i].buffer == attached) {
			b = &c->buffers[attached++];
			buf.size = b->size;
		}
		r = gs__reg_frames_add(c, f, &t, b ? &buf : NULL, b ? b->fd : -1);
	}
	return gs__reg_frames_end(c, f, r);
}

/* Keeps what was sent (pl is taken over) so that gs_reconnect can send
 * it again to a restarted daemon. */
static int keep_registration(struct gs_client *c, const struct gs_tensor_spec *specs,
			     size_t n, struct gs__placement *pl)
{
	c->reg_pl = pl;
	c->reg_specs = calloc(n, sizeof(*c->reg_specs));
	c->reduced = calloc(n, sizeof(*c->reduced));
	if (!c->reg_specs || !c->reduced)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		c->reg_specs[i] = specs[i];
		c->reg_specs[i].name = strdup(specs[i].name);
		if (!c->reg_specs[i].name)
			return gs__fail(c, GS_ENOMEM, "out of memory");
	}
	return GS_OK;
}

int gs__register_again(struct gs_client *c)
{
	if (c->cuda)
		return gs__cuda_register_again(c);
	gs__doing(c, "registration");
	c->expect = GRADSYNC__MESSAGE__BODY_REGISTERED;
	int r = send_registration(c, c->reg_specs, c->ntensors, c->reg_pl);
	if (r == GS_OK)
		r = gs__wait_registered(c, c->ntensors);
	return r;
}

/* ---- the API ----------------------------------------------------------- */

static int check_register(struct gs_client *c,
			  const struct gs_tensor_spec *specs, size_t n)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER)
		return gs__fail(c, GS_ESTATE,
			       "gs_register needs a trainer connection");
	if (c->registered)
		return gs__fail(c, GS_ESTATE,
			       "tensors are already registered on this connection");
	if (!specs || n == 0)
		return gs__fail(c, GS_EINVAL, "gs_register: no tensors");
	if (n > UINT32_MAX)
		return gs__fail(c, GS_ELIMIT, "gs_register: %zu tensors", n);
	for (size_t i = 0; i < n; i++) {
		r = check_spec(c, &specs[i], i);
		if (r < 0)
			return r;
	}
	return GS_OK;
}

int gs_register(gs_client *c, const struct gs_tensor_spec *specs,
			  size_t n)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_register: NULL handle");
	gs__doing(c, "registration");
	int r = check_register(c, specs, n);
	if (r < 0)
		return r;

	uint64_t own_size = 0;
	struct gs__placement *pl = calloc(n, sizeof(*pl));
	c->buffers = calloc(n, sizeof(*c->buffers));
	c->tensors = calloc(n, sizeof(*c->tensors));
	if (!pl || !c->buffers || !c->tensors) {
		r = gs__fail(c, GS_ENOMEM, "out of memory");
		goto err_release;
	}
	r = layout_own(c, specs, n, pl, &own_size);
	if (r == GS_OK)
		r = place_all(c, specs, n, pl, own_size);
	if (r < 0)
		goto err_release;

	/* An Error may answer any frame, so expect the reply from the
	 * first one on. */
	c->expect = GRADSYNC__MESSAGE__BODY_REGISTERED;
	r = send_registration(c, specs, n, pl);
	if (r == GS_OK)
		r = gs__wait_registered(c, n);
	if (r < 0)
		goto err_session;
	c->ntensors = n;
	c->registered = true;
	r = keep_registration(c, specs, n, pl);
	if (r < 0) {
		pl = NULL; /* c->reg_pl, freed with the tensors */
		gs__end_session(c, r);
		goto err_release;
	}
	return GS_OK;

err_session:
	/* The daemon holds part of a registration that cannot go on. */
	gs__end_session(c, r);
err_release:
	c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
	gs__tensors_release(c);
	free(pl);
	return r;
}

size_t gs_tensor_count(const gs_client *c)
{
	return c && c->registered ? c->ntensors : 0;
}

size_t gs_bucket_count(const gs_client *c)
{
	return c && c->registered ? c->nbuckets : 0;
}

float *gs_tensor_data(gs_client *c, size_t index)
{
	if (!c || !c->registered || index >= c->ntensors)
		return NULL;
	return c->tensors[index].data;
}
