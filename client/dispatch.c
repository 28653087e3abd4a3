/*
 * What the client does with each message from gradsyncd: step events
 * update the handle, an Error ends the session, and a reply is kept for
 * the synchronous call that waits for it. Anything else is a protocol
 * error, which also ends the session.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "client.h"

static const char *body_name(Gradsync__Message__BodyCase body)
{
	switch (body) {
	case GRADSYNC__MESSAGE__BODY_HELLO: return "Hello";
	case GRADSYNC__MESSAGE__BODY_WELCOME: return "Welcome";
	case GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS: return "RegisterTensors";
	case GRADSYNC__MESSAGE__BODY_REGISTERED: return "Registered";
	case GRADSYNC__MESSAGE__BODY_BEGIN_STEP: return "BeginStep";
	case GRADSYNC__MESSAGE__BODY_GRADIENTS_READY: return "GradientsReady";
	case GRADSYNC__MESSAGE__BODY_BUCKET_DONE: return "BucketDone";
	case GRADSYNC__MESSAGE__BODY_STEP_DONE: return "StepDone";
	case GRADSYNC__MESSAGE__BODY_ERROR: return "Error";
	case GRADSYNC__MESSAGE__BODY_STATUS_REQUEST: return "StatusRequest";
	case GRADSYNC__MESSAGE__BODY_STATUS_REPLY: return "StatusReply";
	case GRADSYNC__MESSAGE__BODY_METRICS_REPLY: return "MetricsReply";
	case GRADSYNC__MESSAGE__BODY_CLIENTS_REPLY: return "ClientsReply";
	case GRADSYNC__MESSAGE__BODY_TRACE_REPLY: return "TraceReply";
	case GRADSYNC__MESSAGE__BODY_STATE_REGISTERED: return "StateRegistered";
	case GRADSYNC__MESSAGE__BODY_STATE_BROADCAST_DONE: return "StateBroadcastDone";
	default: return "an empty message";
	}
}

/* A step event must name the step that runs. */
static int check_step(struct gs_client *c, const char *what, uint64_t step)
{
	if (c->step_state == GS_STEP_RUNNING && step == c->step)
		return GS_OK;
	if (c->step_state != GS_STEP_RUNNING)
		return gs__fail_dead(c, GS_EPROTO,
				    "protocol error: gradsyncd sent %s for step %" PRIu64
				    " while no step runs",
				    what, step);
	return gs__fail_dead(c, GS_EPROTO,
			    "protocol error: gradsyncd sent %s for step %" PRIu64
			    " during step %" PRIu64,
			    what, step, c->step);
}

static int on_bucket_done(struct gs_client *c, const Gradsync__BucketDone *b)
{
	int r = check_step(c, "BucketDone", b->step);
	if (r < 0)
		return r;
	c->buckets_done++;
	return GS_OK;
}

/* Which tensors hold a gradient someone produced: a reduced one unless
 * the daemon lists it as produced by no trainer of the job; one the step
 * did not reduce (aborted) holds this trainer's own, produced unless it
 * was marked absent. */
static void note_produced(struct gs_client *c, const Gradsync__StepDone *d)
{
	if (!c->tensors || !c->reduced)
		return;
	for (size_t i = 0; i < c->ntensors; i++)
		c->tensors[i].produced = c->reduced[i] || c->tensors[i].absent_step != d->step;
	for (size_t i = 0; i < d->n_unproduced_tensors; i++) {
		uint32_t t = d->unproduced_tensors[i];
		if (t < c->ntensors && c->reduced[t])
			c->tensors[t].produced = false;
	}
}

static int on_step_done(struct gs_client *c, const Gradsync__StepDone *d)
{
	int r = check_step(c, "StepDone", d->step);
	if (r < 0)
		return r;
	if (d->status != GRADSYNC__STEP_STATUS__STEP_OK &&
	    d->status != GRADSYNC__STEP_STATUS__STEP_ABORTED)
		return gs__fail_dead(c, GS_EPROTO,
				    "protocol error: gradsyncd sent step status %d",
				    (int)d->status);

	struct gs_step_result *res = &c->result;
	memset(res, 0, sizeof(*res));
	res->step = d->step;
	res->status = d->status == GRADSYNC__STEP_STATUS__STEP_OK ? GS_OK
								  : GS_EABORTED;
	if (d->stats) {
		res->buckets = d->stats->buckets;
		res->wire_bytes = d->stats->wire_bytes;
		res->clipped = d->stats->clipped;
		res->nonfinite = d->stats->nonfinite;
		res->duration_ns = d->stats->duration_ns;
		res->grad_norm = d->stats->grad_norm;
	}
	snprintf(c->step_message, sizeof(c->step_message), "%s",
		 d->message ? d->message : "");
	/* Which tensors hold the reduced result: all of a completed step; of
	 * an aborted one, those the daemon lists. */
	bool ok = res->status == GS_OK;
	for (size_t i = 0; c->reduced && i < c->ntensors; i++)
		c->reduced[i] = ok;
	for (size_t i = 0; !ok && c->reduced && i < d->n_completed_tensors; i++)
		if (d->completed_tensors[i] < c->ntensors)
			c->reduced[d->completed_tensors[i]] = true;
	note_produced(c, d);
	c->step_state = GS_STEP_DONE;
	return GS_OK;
}

/* An Error means the daemon closes the connection after it. */
static int on_error(struct gs_client *c, const Gradsync__Error *e)
{
	int code = e->code < 0 && gs__err_known(e->code) ? e->code : GS_EREFUSED;
	return gs__fail_dead(c, code, "gradsyncd refused %s: %s", c->doing,
			    e->message ? e->message : "(no message)");
}

static int on_reply(struct gs_client *c, Gradsync__Message *m)
{
	if (m->body_case != c->expect || c->reply) {
		int r = gs__fail_dead(c, GS_EPROTO,
				     "protocol error: gradsyncd sent an unexpected %s during %s",
				     body_name(m->body_case), c->doing);
		gradsync__message__free_unpacked(m, NULL);
		return r;
	}
	c->reply = m;
	c->expect = GRADSYNC__MESSAGE__BODY__NOT_SET;
	return GS_OK;
}

int gs__dispatch(struct gs_client *c, Gradsync__Message *m)
{
	int r;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_WELCOME:
	case GRADSYNC__MESSAGE__BODY_REGISTERED:
	case GRADSYNC__MESSAGE__BODY_STATUS_REPLY:
	case GRADSYNC__MESSAGE__BODY_METRICS_REPLY:
	case GRADSYNC__MESSAGE__BODY_CLIENTS_REPLY:
	case GRADSYNC__MESSAGE__BODY_TRACE_REPLY:
	case GRADSYNC__MESSAGE__BODY_STATE_REGISTERED:
	case GRADSYNC__MESSAGE__BODY_STATE_BROADCAST_DONE:
		return on_reply(c, m);
	case GRADSYNC__MESSAGE__BODY_BUCKET_DONE:
		r = on_bucket_done(c, m->bucket_done);
		break;
	case GRADSYNC__MESSAGE__BODY_STEP_DONE:
		r = on_step_done(c, m->step_done);
		break;
	case GRADSYNC__MESSAGE__BODY_ERROR:
		r = on_error(c, m->error);
		break;
	default:
		r = gs__fail_dead(c, GS_EPROTO,
				 "protocol error: gradsyncd sent %s%s during %s",
				 m->body_case ? "an unexpected " : "",
				 body_name(m->body_case), c->doing);
		break;
	}
	gradsync__message__free_unpacked(m, NULL);
	return r;
}
