/*
 * The RegisterTensors frames of a registration, for memfd tensors
 * (tensors.c) and CUDA tensors (cuda.c) alike. A registration too big for
 * one frame goes in several, each below the daemon's frame limit and
 * carrying at most GS_FRAME_MAX_FDS buffers; the last says so. Then
 * the one Registered that answers them all.
 */
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define FRAME_MAX_TENSORS 1024
/* Well below the daemon's frame limit, however long the names are. */
#define FRAME_MAX_BYTES (1u << 20)

struct gs__reg_frames {
	bool with_fds;
	bool state; /* RegisterState frames of StateTensors */
	Gradsync__Buffer buf_msgs[GS_FRAME_MAX_FDS];
	Gradsync__Buffer *bufs[GS_FRAME_MAX_FDS];
	int fds[GS_FRAME_MAX_FDS];
	size_t nbufs;
	Gradsync__TensorSpec spec_msgs[FRAME_MAX_TENSORS];
	Gradsync__TensorSpec *specs[FRAME_MAX_TENSORS];
	Gradsync__StateTensor state_msgs[FRAME_MAX_TENSORS];
	Gradsync__StateTensor *states[FRAME_MAX_TENSORS];
	size_t nspecs;
	size_t bytes; /* an estimate of the encoded tensors */
};

struct gs__reg_frames *gs__reg_frames_new(struct gs_client *c, bool with_fds)
{
	return gs__reg_frames_new_as(c, with_fds, false);
}

struct gs__reg_frames *gs__reg_frames_new_as(struct gs_client *c, bool with_fds, bool state)
{
	struct gs__reg_frames *f = calloc(1, sizeof(*f));
	if (!f) {
		gs__fail(c, GS_ENOMEM, "out of memory");
		return NULL;
	}
	f->with_fds = with_fds;
	f->state = state;
	return f;
}

static int send_frame(struct gs_client *c, struct gs__reg_frames *f, bool last)
{
	Gradsync__RegisterTensors reg = GRADSYNC__REGISTER_TENSORS__INIT;
	reg.n_buffers = f->nbufs;
	reg.buffers = f->bufs;
	reg.n_tensors = f->nspecs;
	reg.tensors = f->specs;
	reg.last = last;
	Gradsync__RegisterState state = GRADSYNC__REGISTER_STATE__INIT;
	state.n_buffers = f->nbufs;
	state.buffers = f->bufs;
	state.n_tensors = f->nspecs;
	state.tensors = f->states;
	state.last = last;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &reg;
	if (f->state) {
		m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_STATE;
		m.register_state = &state;
	}
	int r = gs__conn_send(c, &m, f->with_fds ? f->fds : NULL,
			     f->with_fds ? f->nbufs : 0, GS_SEND_TIMEOUT_MS);
	f->nbufs = 0;
	f->nspecs = 0;
	f->bytes = 0;
	return r;
}

/* Sends the frame so far first when a tensor of `est` bytes or a buffer
 * would not fit, then adds the buffer. */
static int make_room(struct gs_client *c, struct gs__reg_frames *f, size_t est,
		     const Gradsync__Buffer *buf, int fd)
{
	int r = GS_OK;
	if (f->nspecs == FRAME_MAX_TENSORS ||
	    (buf && f->nbufs == GS_FRAME_MAX_FDS) ||
	    (f->nspecs > 0 && f->bytes + est > FRAME_MAX_BYTES))
		r = send_frame(c, f, false);
	if (buf) {
		f->buf_msgs[f->nbufs] = *buf;
		f->bufs[f->nbufs] = &f->buf_msgs[f->nbufs];
		f->fds[f->nbufs++] = fd;
	}
	return r;
}

int gs__reg_frames_add_state(struct gs_client *c, struct gs__reg_frames *f,
			     const Gradsync__StateTensor *t, const Gradsync__Buffer *buf, int fd)
{
	size_t est = strlen(t->name) + 48;
	int r = make_room(c, f, est, buf, fd);
	f->state_msgs[f->nspecs] = *t;
	f->states[f->nspecs] = &f->state_msgs[f->nspecs];
	f->nspecs++;
	f->bytes += est;
	return r;
}

int gs__reg_frames_add(struct gs_client *c, struct gs__reg_frames *f,
		      const Gradsync__TensorSpec *t, const Gradsync__Buffer *buf,
		      int fd)
{
	size_t est = t ? strlen(t->name) + 48 : 0;
	int r = make_room(c, f, est, buf, fd);
	if (t) {
		f->spec_msgs[f->nspecs] = *t;
		f->specs[f->nspecs] = &f->spec_msgs[f->nspecs];
		f->nspecs++;
		f->bytes += est;
	}
	return r;
}

int gs__reg_frames_end(struct gs_client *c, struct gs__reg_frames *f, int r)
{
	if (r == GS_OK)
		r = send_frame(c, f, true);
	free(f);
	return r;
}

int gs__wait_registered(struct gs_client *c, size_t n)
{
	/* The daemon may wait for the node's other trainers before it
	 * answers; it bounds that wait, not us. */
	int r = gs__conn_pump(c, gs__has_reply, -1);
	if (r < 0)
		return r;
	const Gradsync__Registered *reg = c->reply->registered;
	if (reg->tensors != n)
		r = gs__fail_dead(c, GS_EPROTO,
				 "protocol error: gradsyncd registered %u tensors of %zu",
				 reg->tensors, n);
	c->nbuckets = reg->buckets;
	c->layout_hash = reg->layout_hash;
	gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
	return r;
}
