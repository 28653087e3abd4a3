/*
 * The state broadcast from the trainer's side: a collective that every
 * trainer of the job asks for with the same source, and whose answer
 * comes once this trainer's state holds the source's bytes. The daemon
 * bounds each of its waits (--step-timeout for the trainers, --peer-timeout
 * for the nodes); the caller's timeout is a last resort that ends the
 * session, since the daemon may still be writing the state.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "client.h"

static int check_call(struct gs_client *c, const uint32_t *idx, size_t n)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_TRAINER || !c->state.registered)
		return gs__fail(c, GS_ESTATE,
			       "no state is registered on this connection (gs_register_state)");
	if (c->step_state == GS_STEP_RUNNING)
		return gs__fail(c, GS_ESTATE,
			       "step %" PRIu64 " is in progress: broadcast the state between steps",
			       c->step);
	if (n > 0 && !idx)
		return gs__fail(c, GS_EINVAL, "gs_state_broadcast_tensors: indices is NULL");
	for (size_t i = 0; i < n; i++) {
		if (idx[i] >= c->state.n)
			return gs__fail(c, GS_EINVAL,
				       "state tensor index %u is out of range (%zu registered)",
				       idx[i], c->state.n);
		if (i > 0 && idx[i] <= idx[i - 1])
			return gs__fail(c, GS_EINVAL,
				       "state tensor indices must increase: %u follows %u", idx[i],
				       idx[i - 1]);
	}
	return GS_OK;
}

static int send_request(struct gs_client *c, uint32_t source, const uint32_t *idx, size_t n)
{
	Gradsync__BroadcastState b = GRADSYNC__BROADCAST_STATE__INIT;
	b.seq = ++c->state.seq;
	b.source = source;
	b.n_tensors = n;
	b.tensors = (uint32_t *)idx;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_BROADCAST_STATE;
	m.broadcast_state = &b;
	return gs__conn_send(c, &m, NULL, 0, GS_SEND_TIMEOUT_MS);
}

/* The answer: its figures into *out, its status as the call's. */
static int take_answer(struct gs_client *c, uint32_t source, struct gs_state_result *out)
{
	const Gradsync__StateBroadcastDone *d = c->reply->state_broadcast_done;
	int r = GS_OK;
	struct gs_state_result res = { sizeof(res), d->bytes, d->duration_ns, d->tensors_done };
	if (d->seq != c->state.seq)
		r = gs__fail_dead(c, GS_EPROTO,
				 "protocol error: gradsyncd answered state broadcast %" PRIu64
				 " during broadcast %" PRIu64,
				 d->seq, c->state.seq);
	else if (d->status < 0)
		r = gs__fail(c, gs__err_known(d->status) ? d->status : GS_EREFUSED,
			    "state broadcast from global rank %u failed: %s", source,
			    d->message ? d->message : "(no message)");
	if (out)
		memcpy(out, &res, out->size < sizeof(res) ? out->size : sizeof(res));
	gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
	return r;
}

int gs_state_broadcast_tensors(gs_client *c, uint32_t source, const uint32_t *indices, size_t n,
			       int timeout_ms, struct gs_state_result *out)
{
	if (!c)
		return gs__fail(NULL, GS_EINVAL, "gs_state_broadcast: NULL handle");
	gs__doing(c, "the state broadcast");
	if (out && out->size < offsetof(struct gs_state_result, bytes))
		return gs__fail(c, GS_EINVAL,
			       "gs_state_broadcast_tensors: result size %zu is too small; use GS_STATE_RESULT_INIT",
			       out->size);
	int r = check_call(c, indices, n);
	if (r < 0)
		return r;
	/* An Error may answer the request: expect the reply from now. */
	c->expect = GRADSYNC__MESSAGE__BODY_STATE_BROADCAST_DONE;
	r = send_request(c, source, indices, n);
	if (r == GS_OK)
		r = gs__conn_pump(c, gs__has_reply, timeout_ms);
	if (r == GS_ETIMEDOUT) {
		/* Closed, so that gradsyncd sees this trainer go. */
		shutdown(c->fd, SHUT_RDWR);
		gs__fail_dead(c, GS_ETIMEDOUT,
			     "the state broadcast did not end within %d ms; the session ends, as gradsyncd may still be writing this trainer's state",
			     timeout_ms);
		return GS_ETIMEDOUT;
	}
	if (r < 0) {
		c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
		return r;
	}
	return take_answer(c, source, out);
}

int gs_state_broadcast(gs_client *c, uint32_t source, int timeout_ms)
{
	return gs_state_broadcast_tensors(c, source, NULL, 0, timeout_ms, NULL);
}
