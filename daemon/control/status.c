#include "control/status.h"

#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "clock.h"
#include "cluster/cluster.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/stats.h"
#include "engine/trainer.h"
#include "errors.h"
#include "jobs/jobs.h"
#include "serve/access.h"
#include "support/settings.h"

/* Status lists at most this many nodes of a job; the count says how many there are. */
#define GS_MAX_PEERS 256

void gs_status_fill_settings(const struct gs_settings *st, uint32_t world, Gradsync__Settings *s)
{
	s->threshold = st->threshold;
	s->wire_dtype = (Gradsync__WireDtype)st->wire;
	s->op = (Gradsync__ReduceOp)st->op;
	s->predivide_factor = gs_settings_predivide(st, world ? world : 1);
	s->fusion_buffer_elements = st->fusion_elements;
	gs_settings_scales(st, world ? world : 1, &s->prescale, &s->postscale);
}

static void fill_trainer(const struct gs_trainer *t, Gradsync__TrainerStatus *ts)
{
	gradsync__trainer_status__init(ts);
	ts->pid = (uint32_t)t->pid;
	ts->uid = (uint32_t)t->uid;
	ts->local_rank = t->rank;
	ts->tensors = t->layout.n;
	ts->bytes = t->bytes;
	ts->state = (char *)gs_trainer_state(t);
	ts->steps = t->steps;
}

/* What one job's status holds besides the message: arrays it points into. */
struct job_parts {
	Gradsync__Settings settings;
	Gradsync__TrainerStatus trainers[GS_MAX_LOCAL];
	Gradsync__TrainerStatus *tptrs[GS_MAX_LOCAL];
	Gradsync__PeerStatus *peers;
	Gradsync__PeerStatus **pptrs;
};

static void fill_job(const struct gs_job_entry *e, uid_t uid, Gradsync__JobStatus *js,
		     struct job_parts *p)
{
	const struct gs_job *j = &e->job;
	const struct gs_cluster *cl = &e->cluster;
	gradsync__job_status__init(js);
	js->state = (char *)gs_entry_state_name(e);
	js->trainers = j->attached;
	js->hidden = !gs_job_visible_to(j, uid, gs_access_privileged(uid));
	if (js->hidden)
		return;
	gradsync__settings__init(&p->settings);
	uint32_t world = gs_job_world_size(j);
	gs_status_fill_settings(&e->settings, world, &p->settings);
	js->job_id = (char *)e->settings.job_id;
	js->owner_uid = (uint32_t)j->owner;
	js->local_size = e->settings.local_size;
	js->nodes = e->settings.nodes;
	js->node_rank = e->settings.node_rank;
	js->world_size = world;
	js->coordinator = (char *)e->settings.coordinator;
	js->settings = &p->settings;
	js->backend = (char *)e->backend->name;
	size_t nt = 0;
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		if (!j->slots[r])
			continue;
		fill_trainer(j->slots[r], &p->trainers[nt]);
		p->tptrs[nt] = &p->trainers[nt];
		nt++;
	}
	js->n_trainer = nt;
	js->trainer = p->tptrs;
	js->buckets = j->has_layout ? j->plan.nbuckets : 0;
	js->steps_completed = j->stats.steps_completed;
	js->steps_aborted = j->stats.steps_aborted;
	js->last_step_ns = j->stats.last_step_ns;
	js->median_step_ns = gs_stats_median(&j->stats);
	js->current_step = j->step_number;
	js->group_generation = cl->member.generation;
	js->groups_built = e->groups_built;
	js->age_ns = gs_now_ns() - e->created_ns;
	js->internode_bytes = gs_backend_internode_bytes(e->backend);
	js->buckets_in_flight = j->inflight;
	uint32_t np = cl->nodes <= GS_MAX_PEERS ? cl->nodes : GS_MAX_PEERS;
	if (!cl->node || np == 0)
		return;
	p->peers = calloc(np, sizeof(*p->peers));
	p->pptrs = calloc(np, sizeof(*p->pptrs));
	if (!p->peers || !p->pptrs)
		return;
	for (uint32_t r = 0; r < np; r++) {
		gradsync__peer_status__init(&p->peers[r]);
		p->peers[r].node_rank = r;
		p->peers[r].local_size = cl->node[r].local_size;
		p->peers[r].host = (char *)cl->node[r].host;
		p->peers[r].state = (char *)gs_cluster_peer_state(cl, r);
		p->pptrs[r] = &p->peers[r];
	}
	js->n_peers = np;
	js->peers = p->pptrs;
}

/* The job the reply's own fields describe: the first the asker may see. */
static size_t first_shown(Gradsync__JobStatus *const *jobs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!jobs[i]->hidden)
			return i;
	return 0;
}

void gs_status_reply(struct gs_conn *c)
{
	const struct gs_node_view *v = c->owner;
	uid_t uid = c->cred.uid;
	size_t n = v->jobs->count;
	Gradsync__JobStatus *jobs = calloc(n ? n : 1, sizeof(*jobs));
	Gradsync__JobStatus **jptrs = calloc(n ? n : 1, sizeof(*jptrs));
	struct job_parts *parts = calloc(n ? n : 1, sizeof(*parts));
	if (!jobs || !jptrs || !parts) {
		free(jobs);
		free(jptrs);
		free(parts);
		gs_conn_fail(c, GS_ENOMEM, "out of memory answering a status request");
		return;
	}
	size_t k = 0;
	for (const struct gs_job_entry *e = v->jobs->head; e && k < n; e = e->next, k++) {
		fill_job(e, uid, &jobs[k], &parts[k]);
		jptrs[k] = &jobs[k];
	}

	struct gs_stats totals;
	gs_jobs_totals(v->jobs, &totals);
	Gradsync__Settings node_settings = GRADSYNC__SETTINGS__INIT;
	node_settings.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_FP16;
	node_settings.op = GRADSYNC__REDUCE_OP__OP_AVERAGE;
	Gradsync__StatusReply s = GRADSYNC__STATUS_REPLY__INIT;
	s.daemon_version = GS_VERSION;
	s.uptime_ns = gs_now_ns() - v->start_ns;
	s.backend = (char *)v->backend;
	s.settings = &node_settings;
	/* No job: the node is as idle as a job without trainers. */
	s.job_state = (char *)gs_job_state_names[GS_JOB_IDLE];
	s.job_id = "";
	s.steps_completed = totals.steps_completed;
	s.steps_aborted = totals.steps_aborted;
	s.last_step_ns = totals.last_step_ns;
	s.median_step_ns = gs_stats_median(&totals);
	s.bytes_reduced = totals.bytes_reduced;
	s.elements_clipped = totals.elements_clipped;
	s.nonfinite = totals.nonfinite;
	s.isa = (char *)gs_isa_name(gs_isa_active());
	s.n_jobs = k;
	s.jobs = jptrs;
	s.max_jobs = (uint32_t)v->settings->max_jobs;
	if (k > 0) {
		const Gradsync__JobStatus *j = jptrs[first_shown(jptrs, k)];
		s.job_state = j->state;
		s.job_hidden = j->hidden;
		s.hidden_trainers = j->hidden ? j->trainers : 0;
		if (!j->hidden) {
			s.job_id = j->job_id;
			s.backend = j->backend;
			s.settings = j->settings;
			s.local_size = j->local_size;
			s.world_size = j->world_size;
			s.node_rank = j->node_rank;
			s.nodes = j->nodes;
			s.n_trainers = j->n_trainer;
			s.trainers = j->trainer;
			s.buckets = j->buckets;
			s.current_step = j->current_step;
			s.buckets_in_flight = j->buckets_in_flight;
			s.n_peers = j->n_peers;
			s.peers = j->peers;
			s.internode_bytes = j->internode_bytes;
		}
	}

	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STATUS_REPLY;
	m.status_reply = &s;
	gs_conn_send(c, &m);
	for (size_t i = 0; i < k; i++) {
		free(parts[i].peers);
		free(parts[i].pptrs);
	}
	free(parts);
	free(jptrs);
	free(jobs);
}

void gs_status_line(const struct gs_node_view *v, char *out, size_t n)
{
	struct gs_stats st;
	gs_jobs_totals(v->jobs, &st);
	if (v->jobs->count == 0) {
		snprintf(out, n, "idle, no job; %llu steps done, %llu aborted",
			 (unsigned long long)st.steps_completed, (unsigned long long)st.steps_aborted);
		return;
	}
	unsigned trainers = gs_jobs_trainers(v->jobs);
	snprintf(out, n, "%u job%s, %u trainer%s; %llu steps done, %llu aborted, median %.1f ms",
		 v->jobs->count, v->jobs->count == 1 ? "" : "s", trainers, trainers == 1 ? "" : "s",
		 (unsigned long long)st.steps_completed, (unsigned long long)st.steps_aborted,
		 (double)gs_stats_median(&st) / 1e6);
}
