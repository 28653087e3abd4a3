/*
 * Control connections: what gradsyncctl asks the daemon. A control client
 * takes no trainer slot; it asks for the status, the metrics or the list
 * of connections, and starts and stops traces. Each request waits for its
 * one reply.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

int gs_control_connect(const char *socket_path, int timeout_ms,
				 gs_client **out)
{
	if (!out)
		return gs__fail(NULL, GS_EINVAL, "gs_control_connect: out is NULL");
	return gs__session_open(socket_path, GRADSYNC__ROLE__ROLE_CONTROL, NULL,
			       timeout_ms, out);
}

#define COPY_STR(dst, src) snprintf((dst), sizeof(dst), "%s", (src) ? (src) : "")

static void copy_settings(struct gs_status *s, const Gradsync__Settings *set)
{
	struct gs_session_info *info = &s->settings;
	info->world_size = s->world_size;
	info->local_size = s->local_size;
	info->node_rank = s->node_rank;
	info->nodes = s->nodes;
	info->backend = s->backend;
	info->daemon_version = s->daemon_version;
	if (!set)
		return;
	info->threshold = set->threshold;
	info->wire_dtype = (enum gs_wire_dtype)set->wire_dtype;
	info->op = (enum gs_reduce_op)set->op;
	info->predivide_factor = set->predivide_factor;
	info->fusion_buffer_elements = set->fusion_buffer_elements;
}

static void copy_trainer(struct gs_trainer_status *t,
			 const Gradsync__TrainerStatus *m)
{
	t->pid = m->pid;
	t->uid = m->uid;
	t->local_rank = m->local_rank;
	t->tensors = m->tensors;
	t->bytes = m->bytes;
	t->steps = m->steps;
	COPY_STR(t->state, m->state);
}

static void copy_peer(struct gs_peer_status *p, const Gradsync__PeerStatus *m)
{
	p->node_rank = m->node_rank;
	p->local_size = m->local_size;
	COPY_STR(p->host, m->host);
	COPY_STR(p->state, m->state);
}

static void copy_figures(struct gs_status *s, const Gradsync__StatusReply *m)
{
	COPY_STR(s->daemon_version, m->daemon_version);
	COPY_STR(s->backend, m->backend);
	COPY_STR(s->isa, m->isa);
	COPY_STR(s->job_state, m->job_state);
	COPY_STR(s->job_id, m->job_id);
	s->uptime_ns = m->uptime_ns;
	s->local_size = m->local_size;
	s->world_size = m->world_size;
	s->node_rank = m->node_rank;
	s->nodes = m->nodes;
	s->buckets = m->buckets;
	s->current_step = m->current_step;
	s->buckets_in_flight = m->buckets_in_flight;
	s->steps_completed = m->steps_completed;
	s->steps_aborted = m->steps_aborted;
	s->last_step_ns = m->last_step_ns;
	s->median_step_ns = m->median_step_ns;
	s->bytes_reduced = m->bytes_reduced;
	s->elements_clipped = m->elements_clipped;
	s->nonfinite = m->nonfinite;
	s->internode_bytes = m->internode_bytes;
	s->job_hidden = m->job_hidden;
	s->hidden_trainers = m->hidden_trainers;
	copy_settings(s, m->settings);
}

static void copy_job_figures(struct gs_job_status *j, const Gradsync__JobStatus *m)
{
	COPY_STR(j->job_id, m->job_id);
	COPY_STR(j->state, m->state);
	COPY_STR(j->coordinator, m->coordinator);
	COPY_STR(j->backend, m->backend);
	j->hidden = m->hidden;
	j->owner_uid = m->owner_uid;
	j->local_size = m->local_size;
	j->nodes = m->nodes;
	j->node_rank = m->node_rank;
	j->world_size = m->world_size;
	j->trainers_connected = m->trainers;
	j->buckets = m->buckets;
	j->buckets_in_flight = m->buckets_in_flight;
	j->current_step = m->current_step;
	j->steps_completed = m->steps_completed;
	j->steps_aborted = m->steps_aborted;
	j->last_step_ns = m->last_step_ns;
	j->median_step_ns = m->median_step_ns;
	j->group_generation = m->group_generation;
	j->groups_built = m->groups_built;
	j->age_ns = m->age_ns;
	j->internode_bytes = m->internode_bytes;
	if (m->settings) {
		j->threshold = m->settings->threshold;
		j->wire_dtype = (enum gs_wire_dtype)m->settings->wire_dtype;
		j->op = (enum gs_reduce_op)m->settings->op;
		j->predivide_factor = m->settings->predivide_factor;
		j->fusion_buffer_elements = m->settings->fusion_buffer_elements;
	}
}

/* Arrays get one spare entry so that an empty one is not NULL. */
static int copy_job(struct gs_job_status *j, const Gradsync__JobStatus *m)
{
	j->trainers = calloc(m->n_trainer + 1, sizeof(*j->trainers));
	j->peers = calloc(m->n_peers + 1, sizeof(*j->peers));
	if (!j->trainers || !j->peers)
		return GS_ENOMEM;
	j->trainer_count = m->n_trainer;
	for (size_t i = 0; i < m->n_trainer; i++)
		copy_trainer(&j->trainers[i], m->trainer[i]);
	j->peer_count = m->n_peers;
	for (size_t i = 0; i < m->n_peers; i++)
		copy_peer(&j->peers[i], m->peers[i]);
	copy_job_figures(j, m);
	return GS_OK;
}

static int copy_jobs(struct gs_status *s, const Gradsync__StatusReply *m)
{
	s->jobs = calloc(m->n_jobs + 1, sizeof(*s->jobs));
	if (!s->jobs)
		return GS_ENOMEM;
	/* Counted one by one, so that gs_status_free frees what was made. */
	for (size_t i = 0; i < m->n_jobs; i++) {
		s->job_count = i + 1;
		if (copy_job(&s->jobs[i], m->jobs[i]) < 0)
			return GS_ENOMEM;
	}
	s->max_jobs = m->max_jobs;
	return GS_OK;
}

static int convert_status(struct gs_client *c, const Gradsync__StatusReply *m,
			  struct gs_status **out)
{
	struct gs_status *s = calloc(1, sizeof(*s));
	if (!s)
		return gs__fail(c, GS_ENOMEM, "out of memory");
	s->trainers = calloc(m->n_trainers + 1, sizeof(*s->trainers));
	s->peers = calloc(m->n_peers + 1, sizeof(*s->peers));
	if (!s->trainers || !s->peers || copy_jobs(s, m) < 0) {
		gs_status_free(s);
		return gs__fail(c, GS_ENOMEM, "out of memory");
	}
	s->trainer_count = m->n_trainers;
	for (size_t i = 0; i < m->n_trainers; i++)
		copy_trainer(&s->trainers[i], m->trainers[i]);
	s->peer_count = m->n_peers;
	for (size_t i = 0; i < m->n_peers; i++)
		copy_peer(&s->peers[i], m->peers[i]);
	copy_figures(s, m);
	*out = s;
	return GS_OK;
}

/* Sends one request (with fds) and waits for its reply, which is left in
 * c->reply for the caller to take. */
static int request(struct gs_client *c, Gradsync__Message *m, const int *fds, size_t nfds,
		   Gradsync__Message__BodyCase expect, int timeout_ms)
{
	int r = gs__check_alive(c);
	if (r < 0)
		return r;
	if (c->role != GRADSYNC__ROLE__ROLE_CONTROL)
		return gs__fail(c, GS_ESTATE, "%s needs a control connection (gs_control_connect)",
			       c->doing);
	int64_t deadline = gs__deadline(timeout_ms);
	c->expect = expect;
	r = gs__conn_send(c, m, fds, nfds, timeout_ms);
	if (r == GS_OK)
		r = gs__conn_pump(c, gs__has_reply, gs__remaining(deadline));
	if (r < 0) {
		/* A late reply would come unasked: this session is over. */
		gs__end_session(c, r);
		return r;
	}
	return GS_OK;
}

static void drop_reply(struct gs_client *c)
{
	gradsync__message__free_unpacked(c->reply, NULL);
	c->reply = NULL;
}

int gs_status_get(gs_client *c, int timeout_ms, struct gs_status **out)
{
	if (!c || !out)
		return gs__fail(c, GS_EINVAL, "gs_status_get: NULL argument");
	*out = NULL;
	gs__doing(c, "the status request");
	Gradsync__StatusRequest req = GRADSYNC__STATUS_REQUEST__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STATUS_REQUEST;
	m.status_request = &req;
	int r = request(c, &m, NULL, 0, GRADSYNC__MESSAGE__BODY_STATUS_REPLY, timeout_ms);
	if (r < 0)
		return r;
	r = convert_status(c, c->reply->status_reply, out);
	drop_reply(c);
	return r;
}

void gs_status_free(struct gs_status *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->job_count; i++) {
		free(s->jobs[i].trainers);
		free(s->jobs[i].peers);
	}
	free(s->jobs);
	free(s->trainers);
	free(s->peers);
	free(s);
}

/* ---- metrics ------------------------------------------------------------- */

int gs_metrics_get(gs_client *c, int timeout_ms, char **text)
{
	if (!c || !text)
		return gs__fail(c, GS_EINVAL, "gs_metrics_get: NULL argument");
	*text = NULL;
	gs__doing(c, "the metrics request");
	Gradsync__MetricsRequest req = GRADSYNC__METRICS_REQUEST__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_METRICS_REQUEST;
	m.metrics_request = &req;
	int r = request(c, &m, NULL, 0, GRADSYNC__MESSAGE__BODY_METRICS_REPLY, timeout_ms);
	if (r < 0)
		return r;
	const char *t = c->reply->metrics_reply->text;
	*text = strdup(t ? t : "");
	drop_reply(c);
	return *text ? GS_OK : gs__fail(c, GS_ENOMEM, "out of memory");
}

void gs_metrics_free(char *text)
{
	free(text);
}

/* ---- clients ------------------------------------------------------------- */

static void copy_connection(struct gs_connection_status *o, const Gradsync__ClientInfo *m)
{
	o->id = m->id;
	COPY_STR(o->role, m->role);
	o->pid = m->pid;
	o->uid = m->uid;
	o->gid = m->gid;
	o->self = m->self;
	o->local_rank = m->local_rank;
	COPY_STR(o->state, m->state);
	o->tensors = m->tensors;
	o->bytes = m->bytes;
	o->steps = m->steps;
	o->hidden = m->hidden;
}

int gs_clients_get(gs_client *c, int timeout_ms, struct gs_connection_status **out,
			     size_t *count)
{
	if (!c || !out || !count)
		return gs__fail(c, GS_EINVAL, "gs_clients_get: NULL argument");
	*out = NULL;
	*count = 0;
	gs__doing(c, "the clients request");
	Gradsync__ClientsRequest req = GRADSYNC__CLIENTS_REQUEST__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_CLIENTS_REQUEST;
	m.clients_request = &req;
	int r = request(c, &m, NULL, 0, GRADSYNC__MESSAGE__BODY_CLIENTS_REPLY, timeout_ms);
	if (r < 0)
		return r;
	const Gradsync__ClientsReply *reply = c->reply->clients_reply;
	struct gs_connection_status *list = calloc(reply->n_clients + 1, sizeof(*list));
	if (!list) {
		drop_reply(c);
		return gs__fail(c, GS_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < reply->n_clients; i++)
		copy_connection(&list[i], reply->clients[i]);
	*count = reply->n_clients;
	*out = list;
	drop_reply(c);
	return GS_OK;
}

void gs_clients_free(struct gs_connection_status *list)
{
	free(list);
}

/* ---- trace --------------------------------------------------------------- */

static void copy_trace(struct gs_trace_status *o, const Gradsync__TraceReply *m)
{
	if (!o)
		return;
	memset(o, 0, sizeof(*o));
	o->active = m->active;
	o->events = m->events;
	o->bytes = m->bytes;
	o->dropped = m->dropped;
	COPY_STR(o->path, m->path);
	COPY_STR(o->error, m->error);
}

static int trace_request(gs_client *c, Gradsync__Message *m, int fd, int timeout_ms,
			 struct gs_trace_status *out)
{
	int r = request(c, m, &fd, fd >= 0 ? 1 : 0, GRADSYNC__MESSAGE__BODY_TRACE_REPLY,
			timeout_ms);
	if (r < 0)
		return r;
	copy_trace(out, c->reply->trace_reply);
	drop_reply(c);
	return GS_OK;
}

int gs_trace_start(gs_client *c, int fd, int timeout_ms, struct gs_trace_status *out)
{
	if (!c || fd < 0)
		return gs__fail(c, GS_EINVAL, "gs_trace_start: %s",
			       c ? "the descriptor is negative" : "NULL handle");
	gs__doing(c, "the trace start");
	Gradsync__TraceStart req = GRADSYNC__TRACE_START__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_TRACE_START;
	m.trace_start = &req;
	return trace_request(c, &m, fd, timeout_ms, out);
}

int gs_trace_stop(gs_client *c, int timeout_ms, struct gs_trace_status *out)
{
	if (!c)
		return gs__fail(c, GS_EINVAL, "gs_trace_stop: NULL handle");
	gs__doing(c, "the trace stop");
	Gradsync__TraceStop req = GRADSYNC__TRACE_STOP__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_TRACE_STOP;
	m.trace_stop = &req;
	return trace_request(c, &m, -1, timeout_ms, out);
}
