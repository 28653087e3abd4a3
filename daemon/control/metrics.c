#include "control/metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "clock.h"
#include "cluster/cluster.h"
#include "control/view.h"
#include "engine/job.h"
#include "engine/stats.h"
#include "errors.h"
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
	family(t, "gradsync_info", "gauge", "The daemon's version, backend and shared settings (always 1).");
	put(t, "gradsync_info{version=\"%s\",backend=\"", GS_VERSION);
	put_label(t, v->backend->name);
	put(t, "\",isa=\"%s\",wire=\"%s\",op=\"%s\"} 1\n", gs_isa_name(gs_isa_active()),
	    wire_label(v->settings->wire), v->settings->op == GS_REDUCE_SUM ? "sum" : "average");
	family(t, "gradsync_uptime_seconds", "gauge", "Seconds since the daemon started.");
	put(t, "gradsync_uptime_seconds %.3f\n", (double)(gs_now_ns() - v->start_ns) / 1e9);
	scalar(t, "gradsync_node_rank", "gauge", "This node's rank among the nodes of the job.",
	       v->cluster->node_rank);
	scalar(t, "gradsync_nodes", "gauge", "Nodes (daemons) of the job.", v->cluster->nodes);
	scalar(t, "gradsync_world_size", "gauge", "Trainers of all nodes.",
	       gs_job_world_size(v->job));
	scalar(t, "gradsync_local_size", "gauge", "Trainers this node runs in every step.",
	       v->settings->local_size);
}

static void job(struct text *t, const struct gs_node_view *v)
{
	const struct gs_job *j = v->job;
	scalar(t, "gradsync_connections", "gauge", "Client connections open (trainers, control clients, nodes).",
	       v->conns->count);
	scalar(t, "gradsync_trainers", "gauge", "Trainers connected to this node's job.", j->attached);
	scalar(t, "gradsync_buckets", "gauge", "Buckets in the bucket plan of the current job (0 without a job).",
	       j->has_layout ? j->plan.nbuckets : 0);
	scalar(t, "gradsync_buckets_in_flight", "gauge", "Buckets of the current step being reduced.",
	       j->inflight);
	scalar(t, "gradsync_step", "gauge", "The current or last step of the job.", j->step_number);
}

static void steps(struct text *t, const struct gs_node_view *v)
{
	const struct gs_stats *st = v->stats;
	scalar(t, "gradsync_steps_total", "counter", "Steps completed on this node.",
	       st->steps_completed);
	scalar(t, "gradsync_steps_aborted_total", "counter", "Steps aborted on this node.",
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

static void data(struct text *t, const struct gs_node_view *v)
{
	const struct gs_stats *st = v->stats;
	/* The wire dtype is fixed for the daemon's life: every byte so far
	 * travelled in it, and the other series stay at zero. */
	family(t, "gradsync_wire_bytes_total", "counter",
	       "Bytes of reduced wire buffers of completed steps, by wire dtype.");
	static const int wires[] = { GS_WIRE_F16, GS_WIRE_BF16, GS_WIRE_F32 };
	for (size_t i = 0; i < 3; i++)
		put(t, "gradsync_wire_bytes_total{dtype=\"%s\"} %" PRIu64 "\n", wire_label(wires[i]),
		    wires[i] == v->settings->wire ? st->bytes_reduced : 0);
	scalar(t, "gradsync_internode_bytes_total", "counter",
	       "Bytes this node sent to other nodes in all-reduces.",
	       gs_backend_internode_bytes(v->backend));
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

static void peers(struct text *t, const struct gs_node_view *v)
{
	const struct gs_cluster *c = v->cluster;
	family(t, "gradsync_peer_up", "gauge",
	       "Per node of the job: 1 once it has joined (this node included), else 0.");
	for (uint32_t r = 0; c->node && r < c->nodes; r++) {
		const char *state = gs_cluster_peer_state(c, r);
		put(t, "gradsync_peer_up{node=\"%u\",host=\"", r);
		put_label(t, c->node[r].host);
		put(t, "\",state=\"");
		put_label(t, state);
		put(t, "\"} %d\n", r == c->node_rank || c->joined);
	}
	family(t, "gradsync_peer_trainers", "gauge", "Per node of the job: the trainers it runs.");
	for (uint32_t r = 0; c->node && r < c->nodes; r++)
		put(t, "gradsync_peer_trainers{node=\"%u\"} %u\n", r, c->node[r].local_size);
}

char *gs_metrics_text(const struct gs_node_view *v, size_t *len)
{
	struct text t = { NULL, 0, 0, false };
	info(&t, v);
	job(&t, v);
	steps(&t, v);
	data(&t, v);
	phases(&t, v);
	peers(&t, v);
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
	char *text = gs_metrics_text(c->owner, &len);
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
