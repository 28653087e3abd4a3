#include "control/metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/fusion_budget.h"
#include "clock.h"
#include "cluster/cluster.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/stats.h"
#include "errors.h"
#include "jobs/jobs.h"
#include "serve/access.h"
#include "serve/conn.h"
#include "support/log.h"
#include "support/settings.h"
#include "support/trace.h"

struct text {
	char *buf;
	size_t len, cap;
	bool failed;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct text *t, const char *fmt, ...)
{
	for (int tries = 0; tries < 2 && !t->failed; tries++) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = true;
			return;
		}
		if (t->buf && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap ? t->cap : 8192;
		while (cap <= t->len + (size_t)n)
			cap *= 2;
		char *b = realloc(t->buf, cap);
		if (!b) {
			t->failed = true;
			return;
		}
		t->buf = b;
		t->cap = cap;
	}
}

/* A label value: backslash, double quote and line feed escaped. */
static void put_label(struct text *t, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			put(t, "\\%c", *v);
		else if (*v == '\n')
			put(t, "\\n");
		else
			put(t, "%c", *v);
	}
}

static void family(struct text *t, const char *name, const char *type, const char *help)
{
	put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(struct text *t, const char *name, const char *type, const char *help,
		   uint64_t v)
{
	family(t, name, type, help);
	put(t, "%s %" PRIu64 "\n", name, v);
}

static const char *wire_label(int w)
{
	return w == GS_WIRE_F16 ? "fp16" : w == GS_WIRE_BF16 ? "bf16" : "fp32";
}

static void info(struct text *t, const struct gs_node_view *v)
{
	family(t, "gradsync_info", "gauge", "The daemon's version, backend and conversion kernels (always 1).");
	put(t, "gradsync_info{version=\"%s\",backend=\"", GS_VERSION);
	put_label(t, v->backend);
	put(t, "\",isa=\"%s\"} 1\n", gs_isa_name(gs_isa_active()));
	family(t, "gradsync_uptime_seconds", "gauge", "Seconds since the daemon started.");
	put(t, "gradsync_uptime_seconds %.3f\n", (double)(gs_now_ns() - v->start_ns) / 1e9);
	scalar(t, "gradsync_connections", "gauge", "Client connections open (trainers, control clients, nodes).",
	       v->conns->count);
	scalar(t, "gradsync_jobs", "gauge", "Jobs this node serves (lingering ones included).",
	       v->jobs->count);
	scalar(t, "gradsync_groups_built_total", "counter",
	       "Groups of nodes this daemon built, every job's (one rendezvous each; a job whose trainers come back within --job-linger builds none).",
	       v->jobs->groups_built);
	scalar(t, "gradsync_fusion_memory_bytes", "gauge",
	       "Bytes every job's fusion and staging buffers hold, as sized by their layouts (until each job's memory is freed).",
	       gs_fusion_budget_used(v->fusion_budget));
	scalar(t, "gradsync_fusion_memory_limit_bytes", "gauge",
	       "The most they may hold together (--max-fusion-memory).", v->fusion_budget->limit);
}

/* Per-job series name the job in a `job` label; another user's jobs are
 * left out of them (they count in the node's totals only). */
struct shown {
	const struct gs_job_entry *e[1024];
	size_t n;
};

static void job_series(struct text *t, const char *name, const char *type, const char *help,
		       const struct shown *sh, uint64_t (*value)(const struct gs_job_entry *))
{
	family(t, name, type, help);
	for (size_t i = 0; i < sh->n; i++) {
		put(t, "%s{job=\"", name);
		put_label(t, sh->e[i]->settings.job_id);
		put(t, "\"} %" PRIu64 "\n", value(sh->e[i]));
	}
}

static uint64_t v_trainers(const struct gs_job_entry *e) { return e->job.attached; }
static uint64_t v_buckets(const struct gs_job_entry *e)
{
	return e->job.has_layout ? e->job.plan.nbuckets : 0;
}
static uint64_t v_in_flight(const struct gs_job_entry *e) { return e->job.inflight; }
static uint64_t v_step(const struct gs_job_entry *e) { return e->job.step_number; }
static uint64_t v_steps(const struct gs_job_entry *e) { return e->job.stats.steps_completed; }
static uint64_t v_aborted(const struct gs_job_entry *e) { return e->job.stats.steps_aborted; }
static uint64_t v_node_rank(const struct gs_job_entry *e) { return e->settings.node_rank; }
static uint64_t v_nodes(const struct gs_job_entry *e) { return e->settings.nodes; }
static uint64_t v_world(const struct gs_job_entry *e) { return gs_job_world_size(&e->job); }
static uint64_t v_local(const struct gs_job_entry *e) { return e->settings.local_size; }
static uint64_t v_generation(const struct gs_job_entry *e) { return e->cluster.member.generation; }
static uint64_t v_groups(const struct gs_job_entry *e) { return e->groups_built; }
static uint64_t v_internode(const struct gs_job_entry *e)
{
	return gs_backend_internode_bytes(e->backend);
}

static uint64_t v_overlapped(const struct gs_job_entry *e)
{
	return gs_backend_overlapped_buckets(e->backend);
}

static uint64_t v_fusion(const struct gs_job_entry *e) { return e->backend->fusion_bytes; }

static void jobs(struct text *t, const struct shown *sh)
{
	family(t, "gradsync_job_info", "gauge", "Each job: its state, backend, wire dtype and op (always 1).");
	for (size_t i = 0; i < sh->n; i++) {
		const struct gs_job_entry *e = sh->e[i];
		put(t, "gradsync_job_info{job=\"");
		put_label(t, e->settings.job_id);
		put(t, "\",state=\"%s\",backend=\"", gs_entry_state_name(e));
		put_label(t, e->backend->name);
		put(t, "\",wire=\"%s\",op=\"%s\"} 1\n", wire_label(e->settings.wire),
		    e->settings.op == GS_REDUCE_SUM ? "sum" : "average");
	}
	job_series(t, "gradsync_trainers", "gauge", "Trainers connected, per job.", sh, v_trainers);
	job_series(t, "gradsync_buckets", "gauge", "Buckets in the job's bucket plan (0 before its layout).",
		   sh, v_buckets);
	job_series(t, "gradsync_buckets_in_flight", "gauge", "Buckets of the job's current step being reduced.",
		   sh, v_in_flight);
	job_series(t, "gradsync_step", "gauge", "The job's current or last step.", sh, v_step);
	job_series(t, "gradsync_job_steps_total", "counter", "Steps the job completed on this node.",
		   sh, v_steps);
	job_series(t, "gradsync_job_steps_aborted_total", "counter", "Steps of the job aborted on this node.",
		   sh, v_aborted);
	job_series(t, "gradsync_node_rank", "gauge", "This node's rank among the job's nodes.", sh,
		   v_node_rank);
	job_series(t, "gradsync_nodes", "gauge", "Nodes (daemons) of the job.", sh, v_nodes);
	job_series(t, "gradsync_world_size", "gauge", "Trainers of all the job's nodes.", sh, v_world);
	job_series(t, "gradsync_local_size", "gauge", "The job's trainers on this node.", sh, v_local);
	job_series(t, "gradsync_group_generation", "gauge", "Generation of the job's group of nodes.",
		   sh, v_generation);
	job_series(t, "gradsync_job_groups_built_total", "counter", "Times this node built the job's group (joined its rendezvous).",
		   sh, v_groups);
	job_series(t, "gradsync_internode_bytes_total", "counter", "Bytes this node sent to the job's other nodes in all-reduces.",
		   sh, v_internode);
	job_series(t, "gradsync_buckets_overlapped_total", "counter", "Buckets packed while the bucket before them was exchanged with the other nodes.",
		   sh, v_overlapped);
	job_series(t, "gradsync_job_fusion_memory_bytes", "gauge", "Bytes the job's fusion and staging buffers hold, as sized by its layout (0 before it registers).",
		   sh, v_fusion);
}

static void steps(struct text *t, const struct gs_stats *st)
{
	scalar(t, "gradsync_steps_total", "counter", "Steps completed on this node, every job's.",
	       st->steps_completed);
	scalar(t, "gradsync_steps_aborted_total", "counter", "Steps aborted on this node, every job's.",
	       st->steps_aborted);
	family(t, "gradsync_step_duration_seconds", "histogram",
	       "Time of completed steps, from the first gradient ready to the last bucket done.");
	for (size_t i = 0; i < GS_STEP_BUCKETS; i++)
		put(t, "gradsync_step_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
		    (double)gs_step_bounds_ns[i] / 1e9, st->step_le[i]);
	put(t, "gradsync_step_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
	    st->steps_completed);
	put(t, "gradsync_step_duration_seconds_sum %.9f\n", (double)st->step_ns_sum / 1e9);
	put(t, "gradsync_step_duration_seconds_count %" PRIu64 "\n", st->steps_completed);
}

static void data(struct text *t, const struct gs_node_view *v, const struct gs_stats *st)
{
	/* A job's wire dtype is fixed for its life: its bytes count under it. */
	family(t, "gradsync_wire_bytes_total", "counter",
	       "Bytes of reduced wire buffers of completed steps, by wire dtype.");
	static const int wires[] = { GS_WIRE_F16, GS_WIRE_BF16, GS_WIRE_F32 };
	uint64_t bytes[3];
	for (size_t i = 0; i < 3; i++)
		bytes[i] = v->jobs->ended_wire_bytes[wires[i]];
	for (const struct gs_job_entry *e = v->jobs->head; e; e = e->next)
		for (size_t i = 0; i < 3; i++)
			if (wires[i] == e->settings.wire)
				bytes[i] += e->job.stats.bytes_reduced;
	for (size_t i = 0; i < 3; i++)
		put(t, "gradsync_wire_bytes_total{dtype=\"%s\"} %" PRIu64 "\n", wire_label(wires[i]),
		    bytes[i]);
	scalar(t, "gradsync_clipped_elements_total", "counter",
	       "Gradient elements clipped, over every trainer of this node.", st->elements_clipped);
	scalar(t, "gradsync_nonfinite_values_total", "counter",
	       "Non-finite values in reduced results of completed steps.", st->nonfinite);
}

static void phases(struct text *t, const struct gs_node_view *v)
{
	double seconds[GS_PHASES];
	uint64_t buckets;
	gs_trace_totals(v->trace, seconds, &buckets);
	scalar(t, "gradsync_buckets_reduced_total", "counter",
	       "Buckets reduced (every chunk packed, all-reduced and unpacked).", buckets);
	family(t, "gradsync_bucket_phase_seconds_total", "counter",
	       "Time buckets spent in each phase, summed over buckets (as in the trace).");
	for (int p = 0; p < GS_PHASES; p++)
		put(t, "gradsync_bucket_phase_seconds_total{phase=\"%s\"} %.9f\n",
		    gs_phase_metric((enum gs_phase)p), seconds[p]);
	struct gs_trace_figures f = { 0 };
	if (v->trace)
		gs_trace_get_figures(v->trace, &f);
	scalar(t, "gradsync_trace_active", "gauge", "1 while a trace file is being written.",
	       f.active);
}

static void peers(struct text *t, const struct shown *sh)
{
	family(t, "gradsync_peer_up", "gauge",
	       "Per job and node of the job: 1 once it has joined (this node included), else 0.");
	for (size_t i = 0; i < sh->n; i++) {
		const struct gs_cluster *c = &sh->e[i]->cluster;
		for (uint32_t r = 0; c->node && r < c->nodes; r++) {
			put(t, "gradsync_peer_up{job=\"");
			put_label(t, sh->e[i]->settings.job_id);
			put(t, "\",node=\"%u\",host=\"", r);
			put_label(t, c->node[r].host);
			put(t, "\",state=\"");
			put_label(t, gs_cluster_peer_state(c, r));
			put(t, "\"} %d\n", gs_cluster_peer_up(c, r));
		}
	}
	family(t, "gradsync_peer_trainers", "gauge", "Per job and node of the job: the trainers it runs.");
	for (size_t i = 0; i < sh->n; i++) {
		const struct gs_cluster *c = &sh->e[i]->cluster;
		for (uint32_t r = 0; c->node && r < c->nodes; r++) {
			put(t, "gradsync_peer_trainers{job=\"");
			put_label(t, sh->e[i]->settings.job_id);
			put(t, "\",node=\"%u\"} %u\n", r, c->node[r].local_size);
		}
	}
}

char *gs_metrics_text(const struct gs_node_view *v, uid_t uid, size_t *len)
{
	struct text t = { NULL, 0, 0, false };
	static struct shown sh; /* the loop thread's alone */
	sh.n = 0;
	for (const struct gs_job_entry *e = v->jobs->head; e && sh.n < 1024; e = e->next)
		if (gs_job_visible_to(&e->job, uid, gs_access_privileged(uid)))
			sh.e[sh.n++] = e;
	struct gs_stats totals;
	gs_jobs_totals(v->jobs, &totals);
	info(&t, v);
	jobs(&t, &sh);
	steps(&t, &totals);
	data(&t, v, &totals);
	phases(&t, v);
	peers(&t, &sh);
	if (t.failed) {
		free(t.buf);
		return NULL;
	}
	*len = t.len;
	return t.buf;
}

void gs_metrics_reply(struct gs_conn *c)
{
	size_t len;
	char *text = gs_metrics_text(c->owner, c->cred.uid, &len);
	if (!text) {
		gs_conn_fail(c, GS_ENOMEM, "out of memory formatting the metrics");
		return;
	}
	Gradsync__MetricsReply reply = GRADSYNC__METRICS_REPLY__INIT;
	reply.text = text;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_METRICS_REPLY;
	m.metrics_reply = &reply;
	gs_conn_send(c, &m);
	free(text);
}
