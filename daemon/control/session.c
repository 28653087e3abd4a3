#include "control/session.h"

#include <stdio.h>

#include "backend/backend.h"
#include "cluster/cluster.h"
#include "control/control.h"
#include "control/status.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/trainer.h"
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

static void send_welcome(struct gs_conn *c, uint32_t local_rank)
{
	const struct gs_node_view *v = c->owner;
	Gradsync__Settings settings = GRADSYNC__SETTINGS__INIT;
	gs_status_fill_settings(v, &settings);
	Gradsync__Welcome w = GRADSYNC__WELCOME__INIT;
	w.protocol_version = GS_PROTOCOL_VERSION;
	w.world_size = gs_job_world_size(v->job);
	w.local_size = v->settings->local_size;
	w.node_rank = v->cluster->node_rank;
	w.nodes = v->cluster->nodes;
	w.global_rank = v->cluster->rank_base + local_rank;
	w.backend = (char *)v->backend->name;
	w.settings = &settings;
	w.daemon_version = GS_VERSION;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_WELCOME;
	m.welcome = &w;
	gs_conn_send(c, &m);
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
		struct gs_trainer *t = gs_job_attach(v->job, &client, h);
		if (!t)
			return; /* the job has answered with an Error */
		c->trainer = t;
		snprintf(c->label, sizeof(c->label), "local rank %u", gs_trainer_rank(t));
		gs_conn_identified(c, GS_CONN_TRAINER);
		break;
	}
	case GRADSYNC__ROLE__ROLE_CONTROL:
		gs_conn_identified(c, GS_CONN_CONTROL);
		break;
	default:
		gs_conn_fail(c, GS_EPROTO, "Hello names no role (trainer or control)");
		return;
	}
	send_welcome(c, (uint32_t)h->local_rank); /* checked by gs_job_attach */
}

static void dispatch_trainer(struct gs_conn *c, const Gradsync__Message *m)
{
	struct gs_trainer *t = c->trainer;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS:
		gs_trainer_register(t, m->register_tensors);
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
	gs_trainer_disconnected(t);
}

void gs_session_accept(struct gs_conn *c, void *view)
{
	c->dispatch = dispatch;
	c->closed = closed;
	c->owner = view;
}
