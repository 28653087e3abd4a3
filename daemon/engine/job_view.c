/*
 * A job's settings come from its trainers: the first trainer's Hello
 * defines them (a field it leaves unset takes the default), and every
 * later trainer's view, where it sets a field, must equal the job's.
 */
#include "engine/job_view.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hostport.h"

static bool differs(const char *id, const char *field, const char *says, const char *has,
		    char *err, size_t n)
{
	snprintf(err, n, "job '%s': this trainer says %s %s, the job has %s (set by its first trainer)",
		 id, field, says, has);
	return true;
}

static bool differs_u64(const char *id, const char *field, uint64_t says, uint64_t has,
			char *err, size_t n)
{
	char a[24], b[24];
	snprintf(a, sizeof(a), "%llu", (unsigned long long)says);
	snprintf(b, sizeof(b), "%llu", (unsigned long long)has);
	return differs(id, field, a, b, err, n);
}

/* The host a trainer names, without the brackets of an IPv6 literal. */
static void bare_host(const char *says, char *out, size_t n)
{
	size_t k = strlen(says);
	if (says[0] == '[' && k >= 2 && says[k - 1] == ']')
		snprintf(out, n, "%.*s", (int)(k - 2), says + 1);
	else
		snprintf(out, n, "%s", says);
}

/* The trainer's coordinator host against the host of the job's
 * coordinator, case aside. */
static bool coordinator_differs(const struct gs_settings *s, const char *id,
				const char *says, char *err, size_t n)
{
	char host[GS_COORDINATOR_MAX + 16], port[16], mine[GS_COORDINATOR_MAX + 1];
	if (gs_parse_host_port(s->coordinator, host, sizeof(host), port, sizeof(port)) < 0)
		snprintf(host, sizeof(host), "%s", s->coordinator);
	bare_host(says, mine, sizeof(mine));
	if (strcasecmp(mine, host) == 0)
		return false;
	char a[GS_COORDINATOR_MAX + 3], b[GS_COORDINATOR_MAX + 20];
	snprintf(a, sizeof(a), "'%s'", says);
	snprintf(b, sizeof(b), "'%s'", host);
	return differs(id, "coordinator", a, b, err, n);
}

bool gs_job_view_differs(const struct gs_settings *s, const char *id, const Gradsync__Hello *h,
			 char *err, size_t n)
{
	if (h->local_size && h->local_size != s->local_size)
		return differs_u64(id, "local size", h->local_size, s->local_size, err, n);
	if (h->nodes && h->nodes != s->nodes)
		return differs_u64(id, "node count", h->nodes, s->nodes, err, n);
	if (h->node_rank && h->node_rank->value != s->node_rank)
		return differs_u64(id, "node rank", h->node_rank->value, s->node_rank, err, n);
	if (s->nodes > 1 && h->coordinator && h->coordinator[0] &&
	    coordinator_differs(s, id, h->coordinator, err, n))
		return true;
	if (h->threshold && h->threshold->value != s->threshold)
		return differs_u64(id, "threshold", h->threshold->value, s->threshold, err, n);
	if (h->wire_dtype && (int)h->wire_dtype != s->wire)
		return differs(id, "wire dtype", gs_wire_setting_name((int)h->wire_dtype),
			       gs_wire_setting_name(s->wire), err, n);
	if (h->op && (int)h->op != s->op)
		return differs(id, "op", gs_op_setting_name((int)h->op), gs_op_setting_name(s->op),
			       err, n);
	if (h->predivide_factor && h->predivide_factor->value != s->predivide) {
		char a[32], b[32];
		gs_predivide_text(h->predivide_factor->value, a, sizeof(a));
		gs_predivide_text(s->predivide, b, sizeof(b));
		return differs(id, "predivide", a, b, err, n);
	}
	if (h->fusion_buffer_elements && h->fusion_buffer_elements != s->fusion_elements)
		return differs_u64(id, "fusion buffer", h->fusion_buffer_elements,
				   s->fusion_elements, err, n);
	return false;
}

static int refuse(char *err, size_t n, const char *id, const char *what)
{
	snprintf(err, n, "job '%s': %s", id, what);
	return -1;
}

int gs_hello_check(const char *id, const Gradsync__Hello *h, char *err, size_t n)
{
	const char *coordinator = h->coordinator ? h->coordinator : "";
	char why[160];
	if (!coordinator[0] || gs_host_check(coordinator, why, sizeof(why)) == 0)
		return 0;
	/* The log and the Error escape what is quoted here. */
	snprintf(err, n, "job '%s': the hello's coordinator (the trainer's GRADSYNC_COORDINATOR or MASTER_ADDR) '%.64s%s' is not a host name or address: it %s",
		 id, coordinator, strlen(coordinator) > 64 ? "..." : "", why);
	return -1;
}

/* HOST:PORT, or [HOST]:PORT for an IPv6 literal. */
static void join_host_port(const char *host, uint32_t port, char *out, size_t n)
{
	if (strchr(host, ':'))
		snprintf(out, n, "[%s]:%u", host, port);
	else
		snprintf(out, n, "%s:%u", host, port);
}

int gs_job_settings_from_hello(const struct gs_settings *node, const char *id,
			       const Gradsync__Hello *h, struct gs_settings *out, char *err,
			       size_t n)
{
	char why[GS_COORDINATOR_MAX + 160];
	*out = *node;
	snprintf(out->job_id, sizeof(out->job_id), "%s", id);
	out->local_size = h->local_size ? h->local_size : 1;
	out->nodes = h->nodes ? h->nodes : 1;
	out->node_rank = h->node_rank ? (uint32_t)h->node_rank->value : 0;
	out->threshold = h->threshold ? h->threshold->value : GS_DEFAULT_THRESHOLD;
	out->wire = h->wire_dtype ? (int)h->wire_dtype : GS_WIRE_F16;
	out->op = h->op ? (int)h->op : GS_REDUCE_AVERAGE;
	out->predivide = h->predivide_factor ? h->predivide_factor->value : 0;
	out->fusion_elements = h->fusion_buffer_elements ? h->fusion_buffer_elements
							  : GS_DEFAULT_FUSION_BUFFER;
	snprintf(out->gloo_host, sizeof(out->gloo_host), "%s", node->node_address);
	if (out->local_size > GS_MAX_LOCAL_SIZE) {
		snprintf(why, sizeof(why), "local size %u is more than %d", out->local_size,
			 GS_MAX_LOCAL_SIZE);
		return refuse(err, n, id, why);
	}
	if (h->local_rank >= out->local_size) {
		snprintf(why, sizeof(why), "local rank %llu is out of range for local size %u",
			 (unsigned long long)h->local_rank, out->local_size);
		return refuse(err, n, id, why);
	}
	if (out->nodes > GS_MAX_NODES || (h->node_rank && h->node_rank->value >= out->nodes)) {
		snprintf(why, sizeof(why), "node rank %llu of %u nodes is out of range (at most %d nodes)",
			 h->node_rank ? (unsigned long long)h->node_rank->value : 0ull, out->nodes,
			 GS_MAX_NODES);
		return refuse(err, n, id, why);
	}
	if (out->nodes > node->max_nodes) {
		snprintf(why, sizeof(why), "%u nodes are more than this node serves a job of (--max-nodes %u)",
			 out->nodes, node->max_nodes);
		return refuse(err, n, id, why);
	}
	if (out->threshold > GS_MAX_THRESHOLD) {
		snprintf(why, sizeof(why), "threshold %llu is more than %llu elements",
			 (unsigned long long)out->threshold, (unsigned long long)GS_MAX_THRESHOLD);
		return refuse(err, n, id, why);
	}
	if (out->wire < GS_WIRE_F16 || out->wire > GS_WIRE_F32 || out->op < GS_REDUCE_AVERAGE ||
	    out->op > GS_REDUCE_SUM) {
		snprintf(why, sizeof(why), "wire dtype %d or op %d is unknown", out->wire, out->op);
		return refuse(err, n, id, why);
	}
	if (out->predivide != 0 && !(out->predivide >= 1 && out->predivide <= 1e6)) {
		snprintf(why, sizeof(why), "predivide %g is outside [1, 1e6]", out->predivide);
		return refuse(err, n, id, why);
	}
	if (out->fusion_elements < GS_MIN_FUSION_BUFFER ||
	    out->fusion_elements > node->max_fusion_elements) {
		snprintf(why, sizeof(why), "fusion buffer %llu elements is outside this node's [%d, %llu] (--max-fusion-buffer)",
			 (unsigned long long)out->fusion_elements, GS_MIN_FUSION_BUFFER,
			 (unsigned long long)node->max_fusion_elements);
		return refuse(err, n, id, why);
	}
	out->coordinator[0] = '\0';
	if (out->nodes > 1) {
		char host[GS_COORDINATOR_MAX + 1];
		bare_host(h->coordinator ? h->coordinator : "", host, sizeof(host));
		if (!host[0])
			return refuse(err, n, id, "a job of several nodes needs its coordinator, the host of its node-0 daemon (GRADSYNC_COORDINATOR or MASTER_ADDR)");
		if (node->node_port == 0)
			return refuse(err, n, id, "this daemon serves jobs of one node only (--node-port 0)");
		join_host_port(host, node->node_port, out->coordinator, sizeof(out->coordinator));
	}
	return 0;
}
