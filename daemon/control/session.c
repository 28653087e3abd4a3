#include "control/session.h"

#include <stdio.h>

#include "backend/backend.h"
#include "clock.h"
#include "cluster/cluster.h"
#include "control/control.h"
#include "control/status.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/state.h"
#include "engine/trainer.h"
#include "jobs/jobs.h"
#include "errors.h"
#include "support/log.h"
#include "support/settings.h"

static const char *message_name(Gradsync__Message__BodyCase body)
{
	switch (body) {
	case GRADSYNC__MESSAGE__BODY_HELLO:
		return "Hello";
	case GRADSYNC__MESSAGE__BODY_WELCOME:
		return "Welcome";
	case GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS:
		return "RegisterTensors";
	case GRADSYNC__MESSAGE__BODY_REGISTERED:
		return "Registered";
	case GRADSYNC__MESSAGE__BODY_BEGIN_STEP:
		return "BeginStep";
	case GRADSYNC__MESSAGE__BODY_GRADIENTS_READY:
		return "GradientsReady";
	case GRADSYNC__MESSAGE__BODY_BUCKET_DONE:
		return "BucketDone";
	case GRADSYNC__MESSAGE__BODY_STEP_DONE:
		return "StepDone";
	case GRADSYNC__MESSAGE__BODY_ERROR:
		return "Error";
	case GRADSYNC__MESSAGE__BODY_STATUS_REQUEST:
		return "StatusRequest";
	case GRADSYNC__MESSAGE__BODY_STATUS_REPLY:
		return "StatusReply";
	case GRADSYNC__MESSAGE__BODY_REGISTER_STATE:
		return "RegisterState";
	case GRADSYNC__MESSAGE__BODY_BROADCAST_STATE:
		return "BroadcastState";
	default:
		return "an empty or unknown message";
	}
}

/* ---- The engine's port to a trainer's client (engine/client_port.h) ---- */

static void client_send(void *ctx, const Gradsync__Message *m)
{
	gs_conn_send(ctx, m);
}

static void client_fail(void *ctx, int code, const char *message)
{
	gs_conn_fail(ctx, code, "%s", message);
}

static int client_take_fds(void *ctx, int *fds, size_t n, size_t *have)
{
	struct gs_conn *c = ctx;
	int r = gs_frame_reader_take_fds(&c->reader, fds, n);
	*have = c->reader.nfds;
	return r < 0 ? -1 : 0;
}

static const char *client_name(void *ctx)
{
	return gs_conn_name(ctx);
}

static const struct gs_client_ops client_ops = {
	client_send, client_fail, client_take_fds, client_name,
};

static void send_welcome(struct gs_conn *c, const Gradsync__Welcome *w)
{
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_WELCOME;
	m.welcome = (Gradsync__Welcome *)w;
	gs_conn_send(c, &m);
}

/* The trainer's job has joined its nodes (gs_jobs_env.welcome). */
void gs_session_welcome(struct gs_trainer *t, const struct gs_job_entry *e)
{
	struct gs_conn *c = t->client.ctx;
	if (!c)
		return; /* gone meanwhile */
	Gradsync__Settings settings = GRADSYNC__SETTINGS__INIT;
	uint32_t world = gs_job_world_size(&e->job);
	gs_status_fill_settings(&e->settings, world, &settings);
	Gradsync__Welcome w = GRADSYNC__WELCOME__INIT;
	w.protocol_version = GS_PROTOCOL_VERSION;
	w.world_size = world;
	w.local_size = e->settings.local_size;
	w.node_rank = e->cluster.node_rank;
	w.nodes = e->cluster.nodes;
	w.global_rank = e->cluster.rank_base + t->rank;
	w.backend = (char *)e->backend->name;
	w.settings = &settings;
	w.daemon_version = GS_VERSION;
	send_welcome(c, &w);
	/* Its place in the job and on the node is held for a trainer that
	 * registers, not for one that only said Hello. */
	if (!t->layout_checked)
		gs_conn_set_deadline(c, gs_now_ns() + e->settings.register_timeout * 1000000000ull,
				     "job '%s': no tensors registered within %llu s of the Welcome (--register-timeout); the trainer's place is freed",
				     e->settings.job_id, (unsigned long long)e->settings.register_timeout);
}

/* A control client's Welcome describes the node, not a job. */
static void welcome_control(struct gs_conn *c)
{
	const struct gs_node_view *v = c->owner;
	Gradsync__Settings settings = GRADSYNC__SETTINGS__INIT;
	settings.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_FP16;
	settings.op = GRADSYNC__REDUCE_OP__OP_AVERAGE;
	Gradsync__Welcome w = GRADSYNC__WELCOME__INIT;
	w.protocol_version = GS_PROTOCOL_VERSION;
	w.backend = (char *)v->backend;
	w.settings = &settings;
	w.daemon_version = GS_VERSION;
	send_welcome(c, &w);
}

static void handle_hello(struct gs_conn *c, const Gradsync__Hello *h)
{
	if (h->protocol_version != GS_PROTOCOL_VERSION) {
		gs_conn_fail(c, GS_EVERSION,
			     "protocol version %llu is not supported; this gradsyncd speaks version %d",
			     (unsigned long long)h->protocol_version, GS_PROTOCOL_VERSION);
		return;
	}
	const struct gs_node_view *v = c->owner;
	switch (h->role) {
	case GRADSYNC__ROLE__ROLE_TRAINER: {
		struct gs_client client = { &client_ops, c, c->cred.pid, c->cred.uid };
		struct gs_trainer *t = gs_jobs_attach(v->jobs, &client, h);
		if (!t)
			return; /* the job has answered with an Error */
		c->trainer = t;
		snprintf(c->label, sizeof(c->label), "local rank %u", gs_trainer_rank(t));
		gs_conn_identified(c, GS_CONN_TRAINER);
		gs_jobs_welcome(v->jobs, t);
		break;
	}
	case GRADSYNC__ROLE__ROLE_CONTROL:
		gs_conn_identified(c, GS_CONN_CONTROL);
		welcome_control(c);
		break;
	default:
		gs_conn_fail(c, GS_EPROTO, "Hello names no role (trainer or control)");
		return;
	}
}

static void dispatch_trainer(struct gs_conn *c, const Gradsync__Message *m)
{
	struct gs_trainer *t = c->trainer;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS:
		gs_trainer_register(t, m->register_tensors);
		/* Its part done (the other nodes' agreement may follow). */
		if (c->trainer && c->trainer->layout_checked)
			c->deadline_ns = 0;
		break;
	case GRADSYNC__MESSAGE__BODY_REGISTER_STATE:
		gs_state_register(t, m->register_state);
		/* A trainer may hold state alone, without gradients. */
		if (c->trainer && c->trainer->state.checked)
			c->deadline_ns = 0;
		break;
	case GRADSYNC__MESSAGE__BODY_BROADCAST_STATE:
		gs_state_broadcast_ask(t, m->broadcast_state);
		break;
	case GRADSYNC__MESSAGE__BODY_BEGIN_STEP:
		gs_job_begin_step(t, m->begin_step);
		break;
	case GRADSYNC__MESSAGE__BODY_GRADIENTS_READY:
		gs_job_mark_ready(t, m->gradients_ready);
		break;
	default:
		gs_conn_fail(c, GS_EPROTO, "unexpected %s from a trainer",
			     message_name(m->body_case));
	}
}

static void dispatch(struct gs_conn *c, const Gradsync__Message *m)
{
	switch (c->role) {
	case GS_CONN_NEW:
		if (m->body_case != GRADSYNC__MESSAGE__BODY_HELLO) {
			gs_conn_fail(c, GS_EPROTO, "expected Hello, got %s",
				     message_name(m->body_case));
			return;
		}
		handle_hello(c, m->hello);
		return;
	case GS_CONN_TRAINER:
		dispatch_trainer(c, m);
		return;
	case GS_CONN_NODE:
		return; /* node connections have a dispatcher of their own */
	case GS_CONN_CONTROL:
		if (!gs_control_dispatch(c, m))
			gs_conn_fail(c, GS_EPROTO, "unexpected %s from a control client",
				     message_name(m->body_case));
		return;
	}
}

/* A client's connection closed: a trainer leaves its job. */
static void closed(struct gs_conn *c)
{
	struct gs_trainer *t = c->trainer;
	if (!t)
		return;
	c->trainer = NULL;
	c->label[0] = '\0';
	/* A state broadcast waiting for it fails now, naming it. */
	gs_state_trainer_left(t->job, t);
	gs_jobs_detach(((const struct gs_node_view *)c->owner)->jobs, t);
}

void gs_session_accept(struct gs_conn *c, void *view)
{
	c->dispatch = dispatch;
	c->closed = closed;
	c->owner = view;
}
