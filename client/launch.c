/*
 * The launcher's environment: which job a trainer is part of, and where it
 * sits in it, from the connect options and what GRADSYNC_*, torchrun or
 * Slurm left in the environment. Each field is derived on its own, from
 * the first source that gives it; gs_connect and gs_launch_info_get (its
 * dry run) share this one derivation.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "escape.h"
#include "hostport.h"
#include "job_id.h"
#include "number.h"

#define STR_(x) #x
#define STR(x) STR_(x)


/* One variable of one launcher, and how a source names it. */
struct var {
	const char *name;
	const char *launcher; /* NULL for GRADSYNC_* */
};

/* What one field is derived from, after the options: at most one variable
 * per launcher, in the order of precedence. */
struct field {
	const char *what; /* for messages: "local rank" */
	struct var vars[3];
	uint32_t lo, hi;
};

static const struct field local_rank_field = {
	"local rank",
	{ { "GRADSYNC_LOCAL_RANK", NULL }, { "LOCAL_RANK", "torchrun" },
	  { "SLURM_LOCALID", "Slurm" } },
	0, GS_MAX_LOCAL_SIZE - 1,
};
static const struct field local_size_field = {
	"local size",
	{ { "GRADSYNC_LOCAL_SIZE", NULL }, { "LOCAL_WORLD_SIZE", "torchrun" },
	  { "SLURM_NTASKS_PER_NODE", "Slurm" } },
	1, GS_MAX_LOCAL_SIZE,
};
/* torchrun gives the node count as WORLD_SIZE / LOCAL_WORLD_SIZE: see
 * torchrun_nodes(). */
static const struct field nodes_field = {
	"node count",
	{ { "GRADSYNC_NODES", NULL }, { "SLURM_NNODES", "Slurm" } },
	1, GS_MAX_NODES,
};
static const struct field node_rank_field = {
	"node rank",
	{ { "GRADSYNC_NODE_RANK", NULL }, { "GROUP_RANK", "torchrun" },
	  { "SLURM_NODEID", "Slurm" } },
	0, GS_MAX_NODES - 1,
};

/* A variable that is set and not empty; NULL otherwise. */
static const char *env(const char *name)
{
	const char *v = secure_getenv(name);
	return v && *v ? v : NULL;
}

static void set_source(char *dst, const char *name, const char *launcher)
{
	if (launcher)
		snprintf(dst, GS_LAUNCH_SOURCE_MAX, "%s (%s)", name, launcher);
	else
		snprintf(dst, GS_LAUNCH_SOURCE_MAX, "%s", name);
}

/* A value for a message: quoted, bytes outside printable ASCII escaped
 * (common/escape.h), cut after 64 characters. */
static const char *quoted(const char *v, char *buf, size_t n)
{
	char head[65], safe[GS_ESCAPED_SIZE(sizeof(head))];
	snprintf(head, sizeof(head), "%s", v);
	snprintf(buf, n, "'%s%s'", gs_escape(head, safe, sizeof(safe)), strlen(v) > 64 ? "..." : "");
	return buf;
}

static int bad_value(const char *what, const char *source, const char *value,
		     const char *why)
{
	char q[300];
	return gs__fail(NULL, GS_EINVAL, "%s from %s is %s: %s", what, source,
		       quoted(value, q, sizeof(q)), why);
}

/* A number as common/number.h reads them, in [lo, hi]. */
static int parse_uint(const char *what, const char *source, const char *text, uint64_t lo,
		      uint64_t hi, uint64_t *out)
{
	int r = gs_parse_uint(text, lo, hi, out);
	if (r == -EINVAL)
		return bad_value(what, source, text, "not a number (" GS_NUMBER_FORM ")");
	if (r < 0) {
		char why[96];
		snprintf(why, sizeof(why), "out of range: expected %llu to %llu",
			 (unsigned long long)lo, (unsigned long long)hi);
		return bad_value(what, source, text, why);
	}
	return GS_OK;
}

static int parse_number(const struct field *f, const char *source, const char *text,
			uint32_t *out)
{
	uint64_t v;
	int r = parse_uint(f->what, source, text, f->lo, f->hi, &v);
	if (r == GS_OK)
		*out = (uint32_t)v;
	return r;
}

/* The options' value when set, else the first variable set, else def. */
static int derive_number(const struct field *f, uint32_t opt, uint32_t def,
			 uint32_t *out, char *source)
{
	if (opt != GS_FROM_ENV) {
		set_source(source, "gs_connect_options", NULL);
		char text[16];
		snprintf(text, sizeof(text), "%u", opt);
		return parse_number(f, source, text, out);
	}
	for (size_t i = 0; i < sizeof(f->vars) / sizeof(f->vars[0]) && f->vars[i].name; i++) {
		const char *v = env(f->vars[i].name);
		if (v) {
			set_source(source, f->vars[i].name, f->vars[i].launcher);
			return parse_number(f, source, v, out);
		}
	}
	set_source(source, "default", NULL);
	*out = def;
	return GS_OK;
}

/* torchrun's node count, WORLD_SIZE / LOCAL_WORLD_SIZE (it runs the same
 * number of workers on every node). Returns 1 when it gave one, 0 when
 * either is unset, or the error. WORLD_SIZE alone is not torchrun's: other
 * launchers (Kubeflow's PyTorchJob, the old torch.distributed.launch) set
 * it without saying how many workers a node has, so it gives no count. */
static int torchrun_nodes(uint32_t *out, char *source)
{
	static const struct field world = { "world size", { { NULL, NULL } }, 1,
					    GS_MAX_LOCAL_SIZE * GS_MAX_NODES };
	const char *ws = env("WORLD_SIZE"), *lws = env("LOCAL_WORLD_SIZE");
	if (!ws || !lws)
		return 0;
	uint32_t w = 0, l = 0;
	int r = parse_number(&world, "WORLD_SIZE (torchrun)", ws, &w);
	if (r == GS_OK)
		r = parse_number(&local_size_field, "LOCAL_WORLD_SIZE (torchrun)", lws, &l);
	if (r < 0)
		return r;
	if (w % l != 0) {
		char q1[300], q2[300];
		return gs__fail(NULL, GS_EINVAL,
			       "node count: WORLD_SIZE (torchrun) %s is not a multiple of LOCAL_WORLD_SIZE (torchrun) %s",
			       quoted(ws, q1, sizeof(q1)), quoted(lws, q2, sizeof(q2)));
	}
	snprintf(source, GS_LAUNCH_SOURCE_MAX, "WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)");
	char text[16];
	snprintf(text, sizeof(text), "%u", w / l);
	r = parse_number(&nodes_field, source, text, out);
	return r < 0 ? r : 1;
}

static int derive_nodes(uint32_t opt, uint32_t *out, char *source)
{
	if (opt != GS_FROM_ENV || env("GRADSYNC_NODES"))
		return derive_number(&nodes_field, opt, 1, out, source);
	int r = torchrun_nodes(out, source);
	if (r != 0)
		return r < 0 ? r : GS_OK;
	return derive_number(&nodes_field, opt, 1, out, source);
}

/* What gradsyncd accepts as a job id: printable ASCII, at most GS_JOB_ID_MAX bytes. */
static int check_job_id(const char *id, const char *source)
{
	if (!gs_job_id_printable(id))
		return bad_value("job id", source, id,
				 "only printable ASCII characters may be in a job id");
	if (strlen(id) > GS_JOB_ID_MAX) {
		char why[96];
		snprintf(why, sizeof(why), "%zu bytes long, more than the %d a job id may have",
			 strlen(id), GS_JOB_ID_MAX);
		return bad_value("job id", source, id, why);
	}
	return GS_OK;
}

static int derive_job_id(const char *opt, struct gs_launch_info *li)
{
	char *source = li->job_id_source;
	char slurm[160];
	const char *id = opt;
	if (opt) {
		set_source(source, "gs_connect_options", NULL);
	} else if ((id = env("GRADSYNC_JOB_ID"))) {
		set_source(source, "GRADSYNC_JOB_ID", NULL);
	} else if ((id = env("TORCHELASTIC_RUN_ID"))) {
		set_source(source, "TORCHELASTIC_RUN_ID", "torchrun");
	} else if ((id = env("SLURM_JOB_ID"))) {
		/* Each srun of a batch job is a step: steps are jobs apart. */
		const char *step = env("SLURM_STEP_ID");
		if (step) {
			snprintf(slurm, sizeof(slurm), "%s.%s", id, step);
			id = slurm;
			set_source(source, "SLURM_JOB_ID.SLURM_STEP_ID", "Slurm");
		} else {
			set_source(source, "SLURM_JOB_ID", "Slurm");
		}
	} else {
		id = "";
		set_source(source, "default", NULL);
	}
	int r = check_job_id(id, source);
	if (r == GS_OK)
		snprintf(li->job_id, sizeof(li->job_id), "%s", id);
	return r;
}

/* MASTER_ADDR is torchrun's, or a Slurm script's (PyTorch's recipes set it
 * from the first host of the allocation); the source says which launcher's
 * other variables are there. */
static const char *master_addr_launcher(void)
{
	if (env("TORCHELASTIC_RUN_ID") || env("LOCAL_WORLD_SIZE"))
		return "torchrun";
	if (env("SLURM_JOB_ID"))
		return "Slurm";
	return NULL;
}

static int derive_coordinator(const char *opt, struct gs_launch_info *li)
{
	char *source = li->coordinator_source;
	const char *host = opt;
	if (opt)
		set_source(source, "gs_connect_options", NULL);
	else if ((host = env("GRADSYNC_COORDINATOR")))
		set_source(source, "GRADSYNC_COORDINATOR", NULL);
	else if ((host = env("MASTER_ADDR")))
		set_source(source, "MASTER_ADDR", master_addr_launcher());
	else {
		host = "";
		set_source(source, "default", NULL);
	}
	/* Refused here, at once, what gradsyncd would only find out by
	 * failing to reach it for --join-timeout: a port, a path, a URL. */
	char why[160];
	if (host[0] && gs_host_check(host, why, sizeof(why)) < 0) {
		char full[200];
		snprintf(full, sizeof(full), "not a host name or address: it %s", why);
		return bad_value("coordinator", source, host, full);
	}
	snprintf(li->coordinator, sizeof(li->coordinator), "%s", host);
	return GS_OK;
}

/* A rank is checked against its size only when a source gave the size:
 * until the protocol carries it, gradsyncd's own --local-size decides. */
static int check_rank(const char *rank_what, uint32_t rank, const char *rank_source,
		      const char *size_what, uint32_t size, const char *size_source)
{
	if (strcmp(size_source, "default") == 0 || rank < size)
		return GS_OK;
	return gs__fail(NULL, GS_EINVAL, "%s %u from %s is not below the %s %u from %s",
		       rank_what, rank, rank_source, size_what, size, size_source);
}

/* ---- The job's settings ------------------------------------------------ */

/* gradsyncd's bounds of --threshold and --fusion-buffer. */
#define THRESHOLD_MAX (UINT64_C(1) << 32)
#define FUSION_MIN UINT64_C(1024)
#define FUSION_MAX (UINT64_C(1) << 30)

/* A setting's source: the options, its variable, or none ("unset"). */
static const char *setting_source(bool from_options, const char *var, char *source)
{
	const char *v = from_options ? NULL : env(var);
	if (from_options)
		set_source(source, "gs_connect_options", NULL);
	else if (v)
		set_source(source, var, NULL);
	else
		set_source(source, "unset", NULL);
	return v;
}

static int derive_u64(const char *what, const char *var, bool from_options, uint64_t opt,
		      uint64_t lo, uint64_t hi, uint64_t *out, char *source)
{
	const char *v = setting_source(from_options, var, source);
	*out = 0;
	if (from_options) {
		char text[24];
		snprintf(text, sizeof(text), "%llu", (unsigned long long)opt);
		return parse_uint(what, source, text, lo, hi, out);
	}
	return v ? parse_uint(what, source, v, lo, hi, out) : GS_OK;
}

static const char *const wire_names[] = { NULL, "fp16", "bf16", "fp32" };
static const char *const op_names[] = { NULL, "average", "sum" };

/* A name of names[1..n-1]: its index, or 0. */
static int name_index(const char *const *names, int n, const char *text)
{
	for (int i = 1; i < n; i++)
		if (strcmp(names[i], text) == 0)
			return i;
	return 0;
}

static int derive_choice(const char *what, const char *var, int opt,
			 const char *const *names, int n, const char *expected,
			 int *out, char *source)
{
	const char *v = setting_source(opt != 0, var, source);
	*out = 0;
	if (opt != 0) {
		char text[16];
		snprintf(text, sizeof(text), "%d", opt);
		if (opt < 1 || opt >= n)
			return bad_value(what, source, text, expected);
		*out = opt;
	} else if (v) {
		*out = name_index(names, n, v);
		if (*out == 0)
			return bad_value(what, source, v, expected);
	}
	return GS_OK;
}

/* "world" (0) or a number in [1, 1e6], as gradsyncd's --predivide. */
static int derive_predivide(double opt, struct gs_launch_info *li)
{
	char *source = li->predivide_source;
	const char *v = setting_source(opt >= 0, "GRADSYNC_PREDIVIDE", source);
	double f = opt;
	li->predivide_factor = 0;
	if (opt < 0 && !v)
		return GS_OK;
	if (opt < 0 && strcmp(v, "world") == 0)
		f = 0;
	else if (opt < 0) {
		int r = gs_parse_real(v, 1, 1e6, &f);
		if (r == -EINVAL)
			return bad_value("predivide factor", source, v,
					 "not a number: expected 'world' or a decimal number in [1, 1e6] (no sign, space, hex, inf or nan)");
		if (r < 0)
			return bad_value("predivide factor", source, v,
					 "out of range: expected 'world' or a number in [1, 1e6]");
	}
	if (f != 0 && !(f >= 1 && f <= 1e6)) {
		char text[32];
		snprintf(text, sizeof(text), "%g", f);
		return bad_value("predivide factor", source, v ? v : text,
				 "expected 'world' (0) or a number in [1, 1e6]");
	}
	li->predivide_factor = f == 0 ? 0 : f; /* -0.0 from the options is the world too */
	return GS_OK;
}

static int derive_settings(const struct gs_connect_options *o, struct gs_launch_info *li)
{
	int wire, op;
	int r = derive_u64("threshold", "GRADSYNC_THRESHOLD", o->threshold != GS_FROM_ENV_U64,
			   o->threshold, 0, THRESHOLD_MAX, &li->threshold, li->threshold_source);
	if (r == GS_OK)
		r = derive_choice("wire dtype", "GRADSYNC_WIRE", (int)o->wire_dtype, wire_names, 4,
				  "expected fp16, bf16 or fp32", &wire, li->wire_dtype_source);
	if (r == GS_OK)
		li->wire_dtype = (enum gs_wire_dtype)wire;
	if (r == GS_OK)
		r = derive_choice("op", "GRADSYNC_OP", (int)o->op, op_names, 3,
				  "expected average or sum", &op, li->op_source);
	if (r == GS_OK)
		li->op = (enum gs_reduce_op)op;
	if (r == GS_OK)
		r = derive_predivide(o->predivide_factor, li);
	if (r == GS_OK)
		r = derive_u64("fusion buffer", "GRADSYNC_FUSION_BUFFER",
			       o->fusion_buffer_elements != 0, o->fusion_buffer_elements,
			       FUSION_MIN, FUSION_MAX, &li->fusion_buffer_elements,
			       li->fusion_buffer_source);
	return r;
}

#define TASKS_SOURCE "SLURM_TASKS_PER_NODE (Slurm)"
#define TASKS_FORM "not Slurm's form: counts N or N(xM), comma separated"

/* One entry of SLURM_TASKS_PER_NODE (all of it v) at *p, "N" or "N(xM)":
 * its count and repeat, *p moved past it. Returns GS_OK or the error. */
static int slurm_entry(const char **p, const char *v, uint64_t *count, uint64_t *repeat)
{
	int r = gs_parse_uint_prefix(*p, p, 1, GS_MAX_LOCAL_SIZE, count);
	if (r == -ERANGE)
		return bad_value("local size", TASKS_SOURCE, v,
				 "a node's count is out of range: expected 1 to " STR(GS_MAX_LOCAL_SIZE));
	if (r < 0)
		return bad_value("local size", TASKS_SOURCE, v, TASKS_FORM);
	*repeat = 1;
	if (strncmp(*p, "(x", 2) != 0)
		return GS_OK;
	r = gs_parse_uint_prefix(*p + 2, p, 1, GS_MAX_NODES, repeat);
	if (r == -ERANGE)
		return bad_value("local size", TASKS_SOURCE, v,
				 "a count's repeat is out of range: expected 1 to " STR(GS_MAX_NODES) " nodes");
	if (r < 0 || **p != ')')
		return bad_value("local size", TASKS_SOURCE, v, TASKS_FORM);
	(*p)++;
	return GS_OK;
}

/* Slurm's SLURM_TASKS_PER_NODE, which srun sets with or without
 * --ntasks-per-node: "2(x3),1" is 2 tasks on each of the first three
 * nodes and 1 on the fourth. This node's count (node SLURM_NODEID; with
 * no node id, the count all nodes share). Returns 1 when it gave one, 0
 * when it gives none, or the error. Every number is bounded, and so is
 * the nodes' sum: no repeat can wrap it round to another node's entry. */
static int slurm_tasks_per_node(uint32_t *out, char *source)
{
	const char *v = env("SLURM_TASKS_PER_NODE");
	if (!v)
		return 0;
	const char *id_text = env("SLURM_NODEID");
	uint64_t node = UINT64_MAX, at = 0, found = 0, first = 0;
	bool uniform = true;
	if (id_text && parse_uint("node rank", "SLURM_NODEID (Slurm)", id_text, 0,
				  GS_MAX_NODES - 1, &node) != GS_OK)
		return GS_EINVAL;
	for (const char *p = v;;) {
		uint64_t count, repeat;
		int r = slurm_entry(&p, v, &count, &repeat);
		if (r < 0)
			return r;
		if (at + repeat > GS_MAX_NODES)
			return bad_value("local size", TASKS_SOURCE, v,
					 "it lists more than the " STR(GS_MAX_NODES) " nodes a job may have");
		if (!first)
			first = count;
		uniform = uniform && count == first;
		if (node >= at && node - at < repeat)
			found = count;
		at += repeat;
		if (!*p)
			break;
		if (*p != ',' || !p[1])
			return bad_value("local size", TASKS_SOURCE, v, TASKS_FORM);
		p++;
	}
	if (node == UINT64_MAX)
		found = uniform ? first : 0;
	if (!found)
		return 0;
	set_source(source, "SLURM_TASKS_PER_NODE", "Slurm");
	*out = (uint32_t)found;
	return 1;
}

/* The options, GRADSYNC_LOCAL_SIZE, torchrun's LOCAL_WORLD_SIZE, Slurm's
 * SLURM_NTASKS_PER_NODE, else Slurm's SLURM_TASKS_PER_NODE (which srun
 * sets without --ntasks-per-node), else 1. */
static int derive_local_size(uint32_t opt, uint32_t *out, char *source)
{
	bool named = opt != GS_FROM_ENV;
	for (size_t i = 0; !named && i < sizeof(local_size_field.vars) / sizeof(local_size_field.vars[0]) &&
			   local_size_field.vars[i].name; i++)
		named = env(local_size_field.vars[i].name) != NULL;
	if (!named) {
		int r = slurm_tasks_per_node(out, source);
		if (r != 0)
			return r < 0 ? r : GS_OK;
	}
	return derive_number(&local_size_field, opt, 1, out, source);
}

int gs__launch_derive(const struct gs_connect_options *o, struct gs_launch_info *li)
{
	memset(li, 0, sizeof(*li));
	li->size = sizeof(*li);
	int r = derive_job_id(o->job_id, li);
	if (r == GS_OK)
		r = derive_number(&local_rank_field, o->local_rank, 0, &li->local_rank,
				  li->local_rank_source);
	if (r == GS_OK)
		r = derive_local_size(o->local_size, &li->local_size, li->local_size_source);
	if (r == GS_OK)
		r = derive_nodes(o->nodes, &li->nodes, li->nodes_source);
	if (r == GS_OK)
		r = derive_number(&node_rank_field, o->node_rank, 0, &li->node_rank,
				  li->node_rank_source);
	if (r == GS_OK)
		r = derive_coordinator(o->coordinator, li);
	if (r == GS_OK)
		r = check_rank("local rank", li->local_rank, li->local_rank_source,
			       "local size", li->local_size, li->local_size_source);
	if (r == GS_OK)
		r = check_rank("node rank", li->node_rank, li->node_rank_source,
			       "node count", li->nodes, li->nodes_source);
	if (r == GS_OK)
		r = derive_settings(o, li);
	return r;
}

int gs__connect_options_take(const struct gs_connect_options *opts,
			     struct gs_connect_options *o, const char *fn)
{
	static const struct gs_connect_options init = GS_CONNECT_OPTIONS_INIT;
	*o = init;
	if (!opts)
		return GS_OK;
	if (opts->size < offsetof(struct gs_connect_options, socket_path))
		return gs__fail(NULL, GS_EINVAL,
			       "%s: options size %zu is too small; use GS_CONNECT_OPTIONS_INIT",
			       fn, opts->size);
	/* An older caller's struct is a prefix of ours. */
	memcpy(o, opts, opts->size < sizeof(*o) ? opts->size : sizeof(*o));
	o->size = sizeof(*o);
	return GS_OK;
}

int gs_launch_info_get(const struct gs_connect_options *opts, struct gs_launch_info *out)
{
	if (!out)
		return gs__fail(NULL, GS_EINVAL, "gs_launch_info_get: out is NULL");
	if (out->size < offsetof(struct gs_launch_info, job_id))
		return gs__fail(NULL, GS_EINVAL,
			       "gs_launch_info_get: out->size %zu is too small; use GS_LAUNCH_INFO_INIT",
			       out->size);
	struct gs_connect_options o;
	struct gs_launch_info li;
	int r = gs__connect_options_take(opts, &o, "gs_launch_info_get");
	if (r == GS_OK)
		r = gs__launch_derive(&o, &li);
	if (r < 0)
		return r;
	size_t n = out->size < sizeof(li) ? out->size : sizeof(li);
	li.size = n;
	memcpy(out, &li, n);
	return GS_OK;
}
