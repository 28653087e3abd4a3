/*
 * A trainer's view of its job, as its Hello gives it, against the job's:
 * every field the trainer set must equal the job's. Today the job's shape
 * and settings are gradsyncd's own flags, so the message names the flag.
 */
#include "engine/job_view.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hostport.h"

static const char *const wire_names[] = { "unknown", "fp16", "bf16", "fp32" };
static const char *const op_names[] = { "unknown", "average", "sum" };

static const char *name_of(const char *const *names, size_t n, int v)
{
	return v > 0 && (size_t)v < n ? names[v] : names[0];
}

static void predivide_text(double f, char *buf, size_t n)
{
	if (f == 0)
		snprintf(buf, n, "world");
	else
		snprintf(buf, n, "%g", f);
}

static bool differs(const char *id, const char *field, const char *says, const char *has,
		    const char *flag, char *err, size_t n)
{
	snprintf(err, n, "job '%s': this trainer says %s %s, the job has %s (gradsyncd's %s)",
		 id, field, says, has, flag);
	return true;
}

static bool differs_u64(const char *id, const char *field, uint64_t says, uint64_t has,
			const char *flag, char *err, size_t n)
{
	char a[24], b[24];
	snprintf(a, sizeof(a), "%llu", (unsigned long long)says);
	snprintf(b, sizeof(b), "%llu", (unsigned long long)has);
	return differs(id, field, a, b, flag, err, n);
}

/* The trainer's coordinator host against the host of --coordinator, case
 * aside and without the brackets of an IPv6 literal. */
static bool coordinator_differs(const struct gs_settings *s, const char *id,
				const char *says, char *err, size_t n)
{
	char host[GS_COORDINATOR_MAX + 1], port[16], mine[GS_COORDINATOR_MAX + 1];
	if (gs_parse_host_port(s->coordinator, host, sizeof(host), port, sizeof(port)) < 0)
		snprintf(host, sizeof(host), "%s", s->coordinator);
	size_t k = strlen(says);
	if (says[0] == '[' && k >= 2 && says[k - 1] == ']')
		snprintf(mine, sizeof(mine), "%.*s", (int)(k - 2), says + 1);
	else
		snprintf(mine, sizeof(mine), "%s", says);
	if (strcasecmp(mine, host) == 0)
		return false;
	char a[GS_COORDINATOR_MAX + 3], b[GS_COORDINATOR_MAX + 3];
	snprintf(a, sizeof(a), "'%s'", says);
	snprintf(b, sizeof(b), "'%s'", host);
	return differs(id, "coordinator", a, b, "--coordinator", err, n);
}

bool gs_job_view_differs(const struct gs_settings *s, const char *id, const Gradsync__Hello *h,
			 char *err, size_t n)
{
	if (h->local_size && h->local_size != s->local_size)
		return differs_u64(id, "local size", h->local_size, s->local_size,
				   "--local-size", err, n);
	if (h->nodes && h->nodes != s->nodes)
		return differs_u64(id, "node count", h->nodes, s->nodes, "--nodes", err, n);
	if (h->node_rank && h->node_rank->value != s->node_rank)
		return differs_u64(id, "node rank", h->node_rank->value, s->node_rank,
				   "--node-rank", err, n);
	if (s->nodes > 1 && h->coordinator && h->coordinator[0] &&
	    coordinator_differs(s, id, h->coordinator, err, n))
		return true;
	if (h->threshold && h->threshold->value != s->threshold)
		return differs_u64(id, "threshold", h->threshold->value, s->threshold,
				   "--threshold", err, n);
	if (h->wire_dtype && (int)h->wire_dtype != s->wire)
		return differs(id, "wire dtype", name_of(wire_names, 4, (int)h->wire_dtype),
			       name_of(wire_names, 4, s->wire), "--wire", err, n);
	if (h->op && (int)h->op != s->op)
		return differs(id, "op", name_of(op_names, 3, (int)h->op),
			       name_of(op_names, 3, s->op), "--op", err, n);
	if (h->predivide_factor && h->predivide_factor->value != s->predivide) {
		char a[32], b[32];
		predivide_text(h->predivide_factor->value, a, sizeof(a));
		predivide_text(s->predivide, b, sizeof(b));
		return differs(id, "predivide", a, b, "--predivide", err, n);
	}
	if (h->fusion_buffer_elements && h->fusion_buffer_elements != s->fusion_elements)
		return differs_u64(id, "fusion buffer", h->fusion_buffer_elements,
				   s->fusion_elements, "--fusion-buffer", err, n);
	return false;
}
