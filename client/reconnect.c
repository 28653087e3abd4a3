/*
 * Surviving a restart of gradsyncd: the daemon's state went with it, but
 * the trainer's shared memory did not. Reconnecting sends the same
 * registrations again (gradients, then state), over the same memfds, and
 * starts over at step one of the new session; the trainer's gradients and
 * state stay where they are.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* Back to a fresh connection's state; tensors and buffers stay. */
static void reset_session(struct gs_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	gs_frame_reader_destroy(&c->reader);
	gs_frame_reader_init(&c->reader, GS_CLIENT_MAX_FRAME);
	if (c->reply)
		gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
	c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
	c->dead = false;
	c->dead_code = GS_OK;
	c->step_state = GS_STEP_IDLE;
	c->step = 0;
	c->buckets_done = 0;
	free(c->backend);
	free(c->daemon_version);
	c->backend = NULL;
	c->daemon_version = NULL;
	for (size_t i = 0; i < c->ntensors; i++) {
		c->tensors[i].marked_step = 0;
		c->tensors[i].absent_step = 0;
	}
}

int gs_reconnect(gs_client *c, int timeout_ms)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_reconnect: NULL handle");
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER)
		return gs__fail(c, GS_ESTATE, "gs_reconnect needs a trainer connection");
	reset_session(c);
	gs__doing(c, "the connection");
	int64_t deadline = gs__deadline(timeout_ms);
	int r = gs__conn_open(c, c->path, deadline);
	if (r == GS_OK)
		r = gs__session_handshake(c, deadline);
	if (r == GS_OK && c->registered)
		r = gs__register_again(c);
	if (r == GS_OK)
		r = gs__register_state_again(c);
	if (r < 0)
		gs__end_session(c, r);
	return r;
}

bool gs_tensor_reduced(const gs_client *c, size_t index)
{
	return c && c->reduced && index < c->ntensors && c->reduced[index];
}

bool gs_tensor_produced(const gs_client *c, size_t index)
{
	return c && c->tensors && index < c->ntensors && c->tensors[index].produced;
}
