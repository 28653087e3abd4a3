#include "control/session.h"

#include "control/control.h"
#include "daemon.h"
#include "errors.h"
#include "engine/job.h"
#include "support/log.h"
#include "control/status.h"
#include "engine/trainer.h"

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

static void send_welcome(struct gs_conn *c, uint32_t local_rank)
{
	struct gs_daemon *d = c->d;
	Gradsync__Settings settings = GRADSYNC__SETTINGS__INIT;
	gs_status_fill_settings(d, &settings);
	Gradsync__Welcome w = GRADSYNC__WELCOME__INIT;
	w.protocol_version = GS_PROTOCOL_VERSION;
	w.world_size = gs_job_world_size(&d->job);
	w.local_size = d->settings.local_size;
	w.node_rank = d->cluster.node_rank;
	w.nodes = d->cluster.nodes;
	w.global_rank = d->cluster.rank_base + local_rank;
	w.backend = (char *)d->backend->name;
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
	switch (h->role) {
	case GRADSYNC__ROLE__ROLE_TRAINER:
		if (gs_job_attach(&c->d->job, c, h) < 0)
			return; /* the job has answered with an Error */
		gs_conn_identified(c, GS_CONN_TRAINER);
		break;
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

void gs_session_dispatch(struct gs_conn *c, const Gradsync__Message *m)
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

void gs_session_closed(struct gs_conn *c)
{
	struct gs_trainer *t = c->trainer;
	if (!t)
		return;
	c->trainer = NULL;
	gs_trainer_disconnected(t);
}
