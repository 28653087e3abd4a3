#include "control/control.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "control/metrics.h"
#include "control/status.h"
#include "control/view.h"
#include "engine/trainer.h"
#include "errors.h"
#include "serve/access.h"
#include "serve/conn.h"
#include "support/trace.h"

/* ---- clients ------------------------------------------------------------- */

const char *const gs_conn_role_names[GS_CONN_NODE + 1] = {
	[GS_CONN_NEW] = "new",
	[GS_CONN_TRAINER] = "trainer",
	[GS_CONN_CONTROL] = "control",
	[GS_CONN_NODE] = "node",
};

const char *const gs_client_state_names[GS_CLIENT_STATES] = {
	[GS_CLIENT_HIDDEN] = "another user's",
	[GS_CLIENT_SAYING_HELLO] = "saying hello",
	[GS_CLIENT_CONNECTED] = "connected",
};

/* A local client sees its own user's connections in full, root and
 * gradsyncd's user every one; of another user's only that it is there. */
static bool shows(const struct gs_conn *asker, const struct gs_conn *c)
{
	uid_t uid = asker->cred.uid;
	return c->role == GS_CONN_NODE || gs_access_privileged(uid) || uid == c->cred.uid;
}

static void fill_client(const struct gs_conn *c, const struct gs_conn *asker,
			Gradsync__ClientInfo *ci)
{
	gradsync__client_info__init(ci);
	ci->id = c->id;
	ci->role = (char *)gs_conn_role_names[c->role];
	if (!shows(asker, c)) {
		ci->hidden = true;
		ci->local_rank = -1;
		ci->state = (char *)gs_client_state_names[GS_CLIENT_HIDDEN];
		return;
	}
	ci->pid = (uint32_t)c->cred.pid;
	ci->uid = (uint32_t)c->cred.uid;
	ci->gid = (uint32_t)c->cred.gid;
	ci->self = c == asker;
	ci->local_rank = -1;
	const struct gs_trainer *t = c->trainer;
	if (t) {
		ci->local_rank = (int32_t)t->rank;
		ci->state = (char *)gs_trainer_state(t);
		ci->tensors = t->layout.n;
		ci->bytes = t->bytes;
		ci->steps = t->steps;
	} else {
		ci->state = (char *)gs_client_state_names[c->role == GS_CONN_NEW ? GS_CLIENT_SAYING_HELLO
										 : GS_CLIENT_CONNECTED];
	}
}

static void clients_reply(struct gs_conn *asker)
{
	const struct gs_node_view *v = asker->owner;
	size_t n = 0;
	for (const struct gs_conn *c = v->conns->head; c; c = c->next)
		n++;
	Gradsync__ClientInfo *infos = calloc(n ? n : 1, sizeof(*infos));
	Gradsync__ClientInfo **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		gs_conn_fail(asker, GS_ENOMEM, "out of memory listing the clients");
		return;
	}
	/* Oldest first: the list is kept newest first. */
	size_t i = n;
	for (const struct gs_conn *c = v->conns->head; c; c = c->next) {
		i--;
		fill_client(c, asker, &infos[i]);
		ptrs[i] = &infos[i];
	}
	Gradsync__ClientsReply reply = GRADSYNC__CLIENTS_REPLY__INIT;
	reply.n_clients = n;
	reply.clients = ptrs;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_CLIENTS_REPLY;
	m.clients_reply = &reply;
	gs_conn_send(asker, &m);
	free(ptrs);
	free(infos);
}

/* ---- trace --------------------------------------------------------------- */

static void trace_reply(struct gs_conn *c, const struct gs_trace_figures *f)
{
	Gradsync__TraceReply reply = GRADSYNC__TRACE_REPLY__INIT;
	reply.active = f->active;
	reply.events = f->events;
	reply.dropped = f->dropped;
	reply.bytes = f->bytes;
	reply.path = (char *)f->path;
	reply.error = (char *)f->error;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_TRACE_REPLY;
	m.trace_reply = &reply;
	gs_conn_send(c, &m);
}

static struct gs_trace_viewer viewer_of(const struct gs_conn *c)
{
	uid_t uid = c->cred.uid;
	return (struct gs_trace_viewer){ uid, gs_access_privileged(uid) };
}

static void trace_start(struct gs_conn *c)
{
	const struct gs_node_view *v = c->owner;
	int fd;
	if (gs_frame_reader_take_fds(&c->reader, &fd, 1) < 0) {
		gs_conn_fail(c, GS_EPROTO, "TraceStart carries no descriptor of the file to write");
		return;
	}
	if (!v->trace) {
		close(fd);
		gs_conn_fail(c, GS_ENOMEM, "tracing is not available");
		return;
	}
	char host[256] = "", who[96], why[320];
	gethostname(host, sizeof(host) - 1);
	snprintf(who, sizeof(who), "%s", gs_conn_name(c));
	int r = gs_trace_begin(v->trace, fd, 0, host, who, viewer_of(c), why,
			       sizeof(why));
	if (r != GS_OK) {
		close(fd);
		gs_conn_fail(c, r, "%s", why);
		return;
	}
	struct gs_trace_figures f;
	gs_trace_get_figures(v->trace, &f);
	trace_reply(c, &f);
}

static void trace_stop(struct gs_conn *c)
{
	const struct gs_node_view *v = c->owner;
	struct gs_trace_figures f;
	char why[160] = "no trace is being written (gradsyncctl trace start FILE)";
	int r = v->trace ? gs_trace_end(v->trace, viewer_of(c), &f, why, sizeof(why)) : GS_ESTATE;
	if (r != GS_OK) {
		gs_conn_fail(c, r, "%s", why);
		return;
	}
	trace_reply(c, &f);
}

/* ---- dispatch ------------------------------------------------------------ */

bool gs_control_dispatch(struct gs_conn *c, const Gradsync__Message *m)
{
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_STATUS_REQUEST:
		gs_status_reply(c);
		return true;
	case GRADSYNC__MESSAGE__BODY_METRICS_REQUEST:
		gs_metrics_reply(c);
		return true;
	case GRADSYNC__MESSAGE__BODY_CLIENTS_REQUEST:
		clients_reply(c);
		return true;
	case GRADSYNC__MESSAGE__BODY_TRACE_START:
		trace_start(c);
		return true;
	case GRADSYNC__MESSAGE__BODY_TRACE_STOP:
		trace_stop(c);
		return true;
	default:
		return false;
	}
}
