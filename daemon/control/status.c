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
#include "serve/access.h"
#include "support/settings.h"

/* Status lists at most this many nodes; the count says how many there are. */
#define GS_MAX_PEERS 256

void gs_status_fill_settings(const struct gs_node_view *v, Gradsync__Settings *s)
{
	const struct gs_settings *st = v->settings;
	uint32_t world = gs_job_world_size(v->job);
	s->threshold = st->threshold;
	s->wire_dtype = (Gradsync__WireDtype)st->wire;
	s->op = (Gradsync__ReduceOp)st->op;
	s->predivide_factor = gs_settings_predivide(st, world);
	s->fusion_buffer_elements = st->fusion_elements;
	gs_settings_scales(st, world, &s->prescale, &s->postscale);
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

void gs_status_reply(struct gs_conn *c)
{
	const struct gs_node_view *v = c->owner;
	const struct gs_job *j = v->job;
	const struct gs_cluster *cl = v->cluster;
	const struct gs_stats *st = v->stats;
	Gradsync__Settings settings = GRADSYNC__SETTINGS__INIT;
	gs_status_fill_settings(v, &settings);

	/* Another user's job shows as a job, its state and its trainer
	 * count; its id, trainers and bucket plan are that user's. */
	bool hidden = !gs_job_visible_to(j, c->cred.uid, gs_access_privileged(c->cred.uid));
	Gradsync__TrainerStatus trainers[GS_MAX_LOCAL];
	Gradsync__TrainerStatus *tptrs[GS_MAX_LOCAL];
	size_t nt = 0;
	for (unsigned r = 0; r < GS_MAX_LOCAL && !hidden; r++) {
		if (!j->slots[r])
			continue;
		fill_trainer(j->slots[r], &trainers[nt]);
		tptrs[nt] = &trainers[nt];
		nt++;
	}

	Gradsync__StatusReply s = GRADSYNC__STATUS_REPLY__INIT;
	s.daemon_version = GS_VERSION;
	s.uptime_ns = gs_now_ns() - v->start_ns;
	s.backend = (char *)v->backend->name;
	s.settings = &settings;
	s.local_size = v->settings->local_size;
	s.world_size = gs_job_world_size(j);
	s.node_rank = cl->node_rank;
	s.nodes = cl->nodes;
	s.internode_bytes = gs_backend_internode_bytes(v->backend);
	uint32_t np = cl->nodes <= GS_MAX_PEERS ? cl->nodes : GS_MAX_PEERS;
	Gradsync__PeerStatus peers[GS_MAX_PEERS], *pptrs[GS_MAX_PEERS];
	for (uint32_t r = 0; r < np && cl->node; r++) {
		gradsync__peer_status__init(&peers[r]);
		peers[r].node_rank = r;
		peers[r].local_size = cl->node[r].local_size;
		peers[r].host = (char *)cl->node[r].host;
		peers[r].state = (char *)gs_cluster_peer_state(cl, r);
		pptrs[r] = &peers[r];
	}
	s.n_peers = cl->node ? np : 0;
	s.peers = pptrs;
	s.job_state = (char *)gs_job_state(j);
	s.job_id = hidden ? "" : (char *)j->id;
	s.n_trainers = nt;
	s.trainers = tptrs;
	s.job_hidden = hidden;
	s.hidden_trainers = hidden ? j->attached : 0;
	s.buckets = hidden ? 0 : j->plan.nbuckets;
	s.steps_completed = st->steps_completed;
	s.steps_aborted = st->steps_aborted;
	s.last_step_ns = st->last_step_ns;
	s.median_step_ns = gs_stats_median(st);
	s.bytes_reduced = st->bytes_reduced;
	s.elements_clipped = st->elements_clipped;
	s.nonfinite = st->nonfinite;
	s.current_step = j->step_number;
	s.buckets_in_flight = j->inflight;
	s.isa = (char *)gs_isa_name(gs_isa_active());

	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STATUS_REPLY;
	m.status_reply = &s;
	gs_conn_send(c, &m);
}

void gs_status_line(const struct gs_node_view *v, char *out, size_t n)
{
	const struct gs_job *j = v->job;
	const struct gs_stats *st = v->stats;
	if (!j->attached && !j->in_step) {
		snprintf(out, n, "idle, %u trainers expected; %llu steps done, %llu aborted",
			 v->settings->local_size, (unsigned long long)st->steps_completed,
			 (unsigned long long)st->steps_aborted);
		return;
	}
	snprintf(out, n, "job '%s' %s: %u of %u trainers, step %llu; %llu steps done, %llu aborted, median %.1f ms",
		 j->id, gs_job_state(j), j->attached, v->settings->local_size,
		 (unsigned long long)j->step_number, (unsigned long long)st->steps_completed,
		 (unsigned long long)st->steps_aborted, (double)gs_stats_median(st) / 1e6);
}
