/*
 * gradsyncctl: shows what the node's gradsyncd is doing (the node, and
 * each job it serves), and starts and stops its timeline. Built on libgradsync's control connection; prints
 * for people, or JSON (status, clients, launch-env) or the Prometheus text
 * format (metrics) for programs. launch-env asks no daemon: it shows the
 * job a trainer started here would derive from the environment. Exit codes
 * are part of its interface.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradsync.h"
#include "number.h"

#ifndef GS_VERSION
#define GS_VERSION "unknown"
#endif

enum {
	EXIT_DAEMON = 1,      /* the request failed: refused, protocol, timeout, file,
			       * or a bad launch environment */
	EXIT_USAGE = 2,
	EXIT_NOT_RUNNING = 3, /* nothing listens on the socket */
	EXIT_DENIED = 4,      /* not allowed to talk to gradsyncd */
};

enum command {
	CMD_STATUS, CMD_JOBS, CMD_CLIENTS, CMD_METRICS, CMD_TRACE_START, CMD_TRACE_STOP,
	CMD_LAUNCH_ENV
};

struct args {
	const char *socket;
	int timeout_ms;
	bool json;
	enum command cmd;
	const char *file; /* trace start */
	const char *job;  /* status --job */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: gradsyncctl [--socket PATH] [--timeout MS] COMMAND\n"
		"\n"
		"Commands:\n"
		"  status [--json] [--job ID]\n"
		"                     the node (version, uptime, backend, jobs) and each\n"
		"                     job: owner, shape, settings, state, trainers, steps,\n"
		"                     group; another user's job shows only its state and\n"
		"                     trainer count; --job ID: that job alone\n"
		"  jobs [--json]      one line per job: id, owner, state, trainers, node\n"
		"                     rank/nodes, local and world size, steps, last step\n"
		"  clients [--json]   every connection: trainers, control clients, nodes\n"
		"  metrics            the daemon's figures in the Prometheus text format:\n"
		"                     the node's totals, and each job's under a job label\n"
		"  trace start FILE   write a Chrome-trace timeline of every bucket's\n"
		"                     phases to FILE (created as the calling user)\n"
		"  trace stop         complete and close the trace file\n"
		"  launch-env [--json]\n"
		"                     the job a trainer started here would take from\n"
		"                     the environment (GRADSYNC_*, torchrun's, Slurm's),\n"
		"                     each field with where it came from; asks no daemon\n"
		"\n"
		"Options:\n"
		"  --socket PATH   gradsyncd's socket (default: $GRADSYNC_SOCKET,\n"
		"                  else " GS_DEFAULT_SOCKET ")\n"
		"  --timeout MS    give up after MS milliseconds (default 5000)\n"
		"  --json          print one JSON object instead of text\n"
		"  --job ID        with status: only the job ID (\"\" for the job\n"
		"                  whose trainers gave no id)\n"
		"  -h, --help      show this help\n"
		"  --version       show the version\n"
		"\n"
		"Exit status: 0 done; 1 the request failed (gradsyncd refused it or\n"
		"failed, status --job found no such job that the caller may see, the\n"
		"trace file cannot be written, or launch-env found a bad value);\n"
		"2 usage error;\n"
		"3 gradsyncd is not running (nothing listens on the socket);\n"
		"4 permission denied (not root, not in gradsyncd's group).\n");
}

static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "gradsyncctl: %s%s%s\n", what, arg ? ": " : "",
		arg ? arg : "");
	fprintf(stderr, "Try 'gradsyncctl --help'.\n");
	return EXIT_USAGE;
}

static bool parse_ms(const char *s, int *out)
{
	uint64_t v;
	if (gs_parse_uint(s, 1, 86400000, &v) < 0)
		return false;
	*out = (int)v;
	return true;
}

/* The words after the options: COMMAND [SUBCOMMAND] [FILE]. */
static int parse_command(int n, char **w, struct args *a)
{
	if (n == 0)
		return usage_error("no command given", NULL);
	int want = 1;
	if (strcmp(w[0], "status") == 0) {
		a->cmd = CMD_STATUS;
	} else if (strcmp(w[0], "jobs") == 0) {
		a->cmd = CMD_JOBS;
	} else if (strcmp(w[0], "clients") == 0) {
		a->cmd = CMD_CLIENTS;
	} else if (strcmp(w[0], "metrics") == 0) {
		a->cmd = CMD_METRICS;
	} else if (strcmp(w[0], "launch-env") == 0) {
		a->cmd = CMD_LAUNCH_ENV;
	} else if (strcmp(w[0], "trace") == 0) {
		if (n < 2)
			return usage_error("trace wants 'start FILE' or 'stop'", NULL);
		if (strcmp(w[1], "start") == 0) {
			if (n < 3)
				return usage_error("trace start wants the FILE to write", NULL);
			a->cmd = CMD_TRACE_START;
			a->file = w[2];
			want = 3;
		} else if (strcmp(w[1], "stop") == 0) {
			a->cmd = CMD_TRACE_STOP;
			want = 2;
		} else {
			return usage_error("unknown trace command", w[1]);
		}
	} else {
		return usage_error("unknown command", w[0]);
	}
	if (n > want)
		return usage_error("unexpected argument", w[want]);
	if (a->json && a->cmd != CMD_STATUS && a->cmd != CMD_JOBS && a->cmd != CMD_CLIENTS &&
	    a->cmd != CMD_LAUNCH_ENV)
		return usage_error("--json goes with status, jobs, clients and launch-env", NULL);
	if (a->job && a->cmd != CMD_STATUS)
		return usage_error("--job goes with status", NULL);
	return -1;
}

/* Returns -1 when parsed, else the exit status. */
static int parse_args(int argc, char **argv, struct args *a)
{
	enum { OPT_VERSION = 256, OPT_JSON, OPT_SOCKET, OPT_TIMEOUT, OPT_JOB };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "job", required_argument, NULL, OPT_JOB },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, OPT_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	int o;
	opterr = 0;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case OPT_SOCKET: a->socket = optarg; break;
		case OPT_TIMEOUT:
			if (!parse_ms(optarg, &a->timeout_ms))
				return usage_error("--timeout wants milliseconds > 0", optarg);
			break;
		case OPT_JSON: a->json = true; break;
		case OPT_JOB: a->job = optarg; break;
		case 'h': usage(stdout); return 0;
		case OPT_VERSION: printf("gradsyncctl %s\n", GS_VERSION); return 0;
		default: return usage_error("unknown or incomplete option", argv[optind - 1]);
		}
	}
	return parse_command(argc - optind, argv + optind, a);
}

/* ---- names and units --------------------------------------------------- */

static const char *wire_name(int w)
{
	switch (w) {
	case GS_WIRE_DTYPE_FP16: return "fp16";
	case GS_WIRE_DTYPE_BF16: return "bf16";
	case GS_WIRE_DTYPE_FP32: return "fp32";
	}
	return "unknown";
}

static const char *op_name(int op)
{
	switch (op) {
	case GS_OP_AVERAGE: return "average";
	case GS_OP_SUM: return "sum";
	}
	return "unknown";
}

static void format_uptime(char *buf, size_t n, uint64_t ns)
{
	uint64_t s = ns / 1000000000u;
	uint64_t d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60;
	if (d > 0)
		snprintf(buf, n, "%" PRIu64 "d %" PRIu64 "h %02" PRIu64 "m", d, h, m);
	else if (h > 0)
		snprintf(buf, n, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", h, m, s % 60);
	else
		snprintf(buf, n, "%" PRIu64 "m %02" PRIu64 "s", m, s % 60);
}

static void format_bytes(char *buf, size_t n, uint64_t bytes)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	if (bytes < 1024) {
		snprintf(buf, n, "%" PRIu64 " B", bytes);
		return;
	}
	double v = (double)bytes / 1024;
	size_t u = 0;
	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, n, "%.2f %s", v, units[u]);
}

static double ms(uint64_t ns)
{
	return (double)ns / 1e6;
}

/* ---- text -------------------------------------------------------------- */

/* The daemon's strings, made safe for a terminal: control characters
 * become '?'. */
static const char *clean(const char *s, char *buf, size_t n)
{
	size_t i;
	for (i = 0; s[i] && i + 1 < n; i++)
		buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
	buf[i] = '\0';
	return buf;
}

#define ROW "  %-16s "

static void print_trainers(const struct gs_trainer_status *list, size_t n)
{
	if (n == 0)
		return;
	printf("  %8s %6s %5s %8s %11s  %-12s %8s\n", "PID", "UID", "RANK",
	       "TENSORS", "BYTES", "STATE", "STEPS");
	for (size_t i = 0; i < n; i++) {
		const struct gs_trainer_status *t = &list[i];
		char bytes[32], state[sizeof(t->state)];
		format_bytes(bytes, sizeof(bytes), t->bytes);
		printf("  %8u %6u %5u %8u %11s  %-12s %8" PRIu64 "\n", t->pid,
		       t->uid, t->local_rank, t->tensors, bytes,
		       clean(t->state, state, sizeof(state)), t->steps);
	}
}

static void print_peers(const struct gs_job_status *j)
{
	if (j->peer_count <= 1)
		return;
	char sent[32], host[64], state[32];
	format_bytes(sent, sizeof(sent), j->internode_bytes);
	printf(ROW "%s (%" PRIu64 " bytes)\n", "sent to peers:", sent, j->internode_bytes);
	printf("  %6s %9s  %-24s %s\n", "NODE", "TRAINERS", "HOST", "STATE");
	for (size_t i = 0; i < j->peer_count; i++) {
		const struct gs_peer_status *p = &j->peers[i];
		printf("  %6u %9u  %-24s %s\n", p->node_rank, p->local_size,
		       p->host[0] ? clean(p->host, host, sizeof(host)) : "(host name)",
		       clean(p->state, state, sizeof(state)));
	}
}

static const char *plural(uint64_t n)
{
	return n == 1 ? "" : "s";
}

/* "'x'", or "(no id)" for the job whose trainers gave none. */
static const char *job_name(const char *id, char *buf, size_t n)
{
	char c[GS_JOB_ID_MAX + 1];
	if (!id[0])
		return "(no id)";
	snprintf(buf, n, "'%s'", clean(id, c, sizeof(c)));
	return buf;
}

static const char *user_name(uint32_t uid, char *buf, size_t n)
{
	struct passwd *pw = getpwuid(uid);
	char name[64];
	if (pw)
		snprintf(buf, n, "%s", clean(pw->pw_name, name, sizeof(name)));
	else
		snprintf(buf, n, "%u", uid);
	return buf;
}

static void print_job_settings(const struct gs_job_status *j)
{
	printf(ROW "threshold %" PRIu64 " elements, wire %s, op %s, predivide %g,\n", "settings:",
	       j->threshold, wire_name(j->wire_dtype), op_name(j->op), j->predivide_factor);
	printf(ROW "fusion buffer %" PRIu64 " elements\n", "", j->fusion_buffer_elements);
}

static void print_job(const struct gs_job_status *j)
{
	char buf[GS_COORDINATOR_MAX + 16], user[64], age[48];
	if (j->hidden) {
		printf("another user's job: %s, %u trainer%s\n",
		       clean(j->state, buf, sizeof(buf)), j->trainers_connected,
		       plural(j->trainers_connected));
		return;
	}
	printf("Job %s\n", job_name(j->job_id, buf, sizeof(buf)));
	printf(ROW "%s (uid %u)\n", "owner:", user_name(j->owner_uid, user, sizeof(user)),
	       j->owner_uid);
	printf(ROW "%s\n", "state:", clean(j->state, buf, sizeof(buf)));
	printf(ROW "node %u of %u, local size %u, world size %u\n", "shape:", j->node_rank,
	       j->nodes, j->local_size, j->world_size);
	printf(ROW "%s\n", "coordinator:",
	       j->coordinator[0] ? clean(j->coordinator, buf, sizeof(buf)) : "(none: one node)");
	print_job_settings(j);
	printf(ROW "%s\n", "backend:", clean(j->backend, buf, sizeof(buf)));
	printf(ROW "%u connected\n", "trainers:", j->trainers_connected);
	print_trainers(j->trainers, j->trainer_count);
	printf(ROW "%u (%u in flight)\n", "buckets:", j->buckets, j->buckets_in_flight);
	printf(ROW "%" PRIu64 " completed, %" PRIu64 " aborted; current step %" PRIu64 "\n",
	       "steps:", j->steps_completed, j->steps_aborted, j->current_step);
	printf(ROW "%.2f ms last, %.2f ms median\n", "step time:", ms(j->last_step_ns),
	       ms(j->median_step_ns));
	printf(ROW "generation %" PRIu64 ", built %" PRIu64 " time%s\n", "group:",
	       j->group_generation, j->groups_built, plural(j->groups_built));
	format_uptime(age, sizeof(age), j->age_ns);
	printf(ROW "%s\n", "age:", age);
	print_peers(j);
}

static void print_text(const struct gs_status *s)
{
	char up[48], reduced[32], buf[64];
	format_uptime(up, sizeof(up), s->uptime_ns);
	format_bytes(reduced, sizeof(reduced), s->bytes_reduced);

	printf("gradsyncd %s, up %s\n",
	       clean(s->daemon_version, buf, sizeof(buf)), up);
	printf(ROW "%s\n", "backend:", clean(s->backend, buf, sizeof(buf)));
	printf(ROW "%s\n", "conversion ISA:", clean(s->isa, buf, sizeof(buf)));
	printf(ROW "%zu of %u\n", "jobs:", s->job_count, s->max_jobs);
	printf(ROW "%" PRIu64 " completed, %" PRIu64 " aborted (all jobs)\n", "steps:",
	       s->steps_completed, s->steps_aborted);
	printf(ROW "%s (%" PRIu64 " bytes)\n", "reduced:", reduced, s->bytes_reduced);
	printf(ROW "%" PRIu64 " elements\n", "clipped:", s->elements_clipped);
	printf(ROW "%" PRIu64 " values\n", "non-finite:", s->nonfinite);
	if (s->job_count == 0)
		printf("\nno jobs\n");
	for (size_t i = 0; i < s->job_count; i++) {
		putchar('\n');
		print_job(&s->jobs[i]);
	}
}

/* One line per job, as `gradsyncctl jobs` lists them. */
static void print_jobs_table(const struct gs_status *s)
{
	printf("%-16s %-10s %-12s %8s %7s %5s %5s %8s %11s\n", "JOB", "OWNER", "STATE",
	       "TRAINERS", "NODE", "LOCAL", "WORLD", "STEPS", "LAST STEP");
	for (size_t i = 0; i < s->job_count; i++) {
		const struct gs_job_status *j = &s->jobs[i];
		char id[sizeof(j->job_id)], user[64], state[sizeof(j->state)];
		char node[32], last[32];
		clean(j->state, state, sizeof(state));
		if (j->hidden) {
			printf("%-16s %-10s %-12s %8u %7s %5s %5s %8s %11s\n", "(hidden)",
			       "-", state, j->trainers_connected, "-", "-", "-", "-", "-");
			continue;
		}
		snprintf(node, sizeof(node), "%u/%u", j->node_rank, j->nodes);
		snprintf(last, sizeof(last), "%.2f ms", ms(j->last_step_ns));
		printf("%-16s %-10s %-12s %8u %7s %5u %5u %8" PRIu64 " %11s\n",
		       j->job_id[0] ? clean(j->job_id, id, sizeof(id)) : "(no id)",
		       user_name(j->owner_uid, user, sizeof(user)), state, j->trainers_connected,
		       node, j->local_size, j->world_size, j->steps_completed, last);
	}
}

/* ---- JSON -------------------------------------------------------------- */

/* The length of the valid UTF-8 sequence at p, or 0. */
static size_t utf8_len(const unsigned char *p)
{
	size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
	if (n == 0 || p[0] > 0xf4)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	/* Overlong forms, surrogates and code points past U+10FFFF. */
	if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
	    (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
		return 0;
	return n;
}

/* A JSON string; bytes that are not UTF-8 become U+FFFD. */
static void json_str(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	putchar('"');
	while (*p) {
		if (*p == '"' || *p == '\\') {
			printf("\\%c", *p++);
		} else if (*p < 0x20 || *p == 0x7f) {
			printf("\\u%04x", *p++);
		} else if (*p < 0x80) {
			putchar(*p++);
		} else {
			size_t n = utf8_len(p);
			if (n == 0) {
				fputs("\\ufffd", stdout);
				p++;
			} else {
				fwrite(p, 1, n, stdout);
				p += n;
			}
		}
	}
	putchar('"');
}

static void json_key_str(const char *key, const char *v, bool comma)
{
	printf("\"%s\":", key);
	json_str(v);
	if (comma)
		putchar(',');
}

static void json_key_u64(const char *key, uint64_t v, bool comma)
{
	printf("\"%s\":%" PRIu64 "%s", key, v, comma ? "," : "");
}

static void json_key_double(const char *key, double v, bool comma)
{
	/* JSON has no inf or nan. */
	if (v - v == 0)
		printf("\"%s\":%.17g%s", key, v, comma ? "," : "");
	else
		printf("\"%s\":null%s", key, comma ? "," : "");
}

static void json_trainer(const struct gs_trainer_status *t, bool comma)
{
	putchar('{');
	json_key_u64("pid", t->pid, true);
	json_key_u64("uid", t->uid, true);
	json_key_u64("local_rank", t->local_rank, true);
	json_key_u64("tensors", t->tensors, true);
	json_key_u64("bytes", t->bytes, true);
	json_key_str("state", t->state, true);
	json_key_u64("steps", t->steps, false);
	printf("}%s", comma ? "," : "");
}

static void json_peer(const struct gs_peer_status *p, bool comma)
{
	putchar('{');
	json_key_u64("node_rank", p->node_rank, true);
	json_key_u64("local_size", p->local_size, true);
	json_key_str("host", p->host, true);
	json_key_str("state", p->state, false);
	printf("}%s", comma ? "," : "");
}

static void json_settings(const struct gs_session_info *set)
{
	printf("\"settings\":{");
	json_key_u64("threshold", set->threshold, true);
	json_key_str("wire_dtype", wire_name(set->wire_dtype), true);
	json_key_str("op", op_name(set->op), true);
	json_key_double("predivide_factor", set->predivide_factor, true);
	json_key_u64("fusion_buffer_elements", set->fusion_buffer_elements,
		     false);
	printf("},");
}

/* A hidden job gives only what the daemon tells of it. */
static void json_job(const struct gs_job_status *j, bool comma)
{
	putchar('{');
	printf("\"hidden\":%s,", j->hidden ? "true" : "false");
	json_key_str("state", j->state, true);
	json_key_u64("trainers_connected", j->trainers_connected, !j->hidden);
	if (!j->hidden) {
		json_key_str("job_id", j->job_id, true);
		json_key_u64("owner_uid", j->owner_uid, true);
		json_key_u64("local_size", j->local_size, true);
		json_key_u64("nodes", j->nodes, true);
		json_key_u64("node_rank", j->node_rank, true);
		json_key_u64("world_size", j->world_size, true);
		json_key_str("coordinator", j->coordinator, true);
		printf("\"settings\":{");
		json_key_u64("threshold", j->threshold, true);
		json_key_str("wire_dtype", wire_name(j->wire_dtype), true);
		json_key_str("op", op_name(j->op), true);
		json_key_double("predivide_factor", j->predivide_factor, true);
		json_key_u64("fusion_buffer_elements", j->fusion_buffer_elements, false);
		printf("},");
		json_key_str("backend", j->backend, true);
		printf("\"trainers\":[");
		for (size_t i = 0; i < j->trainer_count; i++)
			json_trainer(&j->trainers[i], i + 1 < j->trainer_count);
		printf("],");
		json_key_u64("buckets", j->buckets, true);
		json_key_u64("buckets_in_flight", j->buckets_in_flight, true);
		json_key_u64("current_step", j->current_step, true);
		json_key_u64("steps_completed", j->steps_completed, true);
		json_key_u64("steps_aborted", j->steps_aborted, true);
		json_key_u64("last_step_ns", j->last_step_ns, true);
		json_key_u64("median_step_ns", j->median_step_ns, true);
		json_key_u64("group_generation", j->group_generation, true);
		json_key_u64("groups_built", j->groups_built, true);
		json_key_u64("age_ns", j->age_ns, true);
		json_key_u64("internode_bytes", j->internode_bytes, true);
		printf("\"peers\":[");
		for (size_t i = 0; i < j->peer_count; i++)
			json_peer(&j->peers[i], i + 1 < j->peer_count);
		printf("]");
	}
	printf("}%s", comma ? "," : "");
}

static void json_jobs(const struct gs_status *s)
{
	printf("\"jobs\":[");
	for (size_t i = 0; i < s->job_count; i++)
		json_job(&s->jobs[i], i + 1 < s->job_count);
	printf("]");
}

static void print_json(const struct gs_status *s)
{
	putchar('{');
	json_key_str("daemon_version", s->daemon_version, true);
	json_key_u64("uptime_ns", s->uptime_ns, true);
	json_key_str("backend", s->backend, true);
	json_key_str("isa", s->isa, true);
	json_settings(&s->settings);
	json_key_u64("node_rank", s->node_rank, true);
	json_key_u64("nodes", s->nodes, true);
	json_key_u64("world_size", s->world_size, true);
	json_key_u64("local_size", s->local_size, true);
	json_key_u64("internode_bytes", s->internode_bytes, true);
	printf("\"peers\":[");
	for (size_t i = 0; i < s->peer_count; i++)
		json_peer(&s->peers[i], i + 1 < s->peer_count);
	printf("],");
	json_key_str("job_state", s->job_state, true);
	json_key_str("job_id", s->job_id, true);
	printf("\"job_hidden\":%s,", s->job_hidden ? "true" : "false");
	json_key_u64("hidden_trainers", s->hidden_trainers, true);
	printf("\"trainers\":[");
	for (size_t i = 0; i < s->trainer_count; i++)
		json_trainer(&s->trainers[i], i + 1 < s->trainer_count);
	printf("],");
	json_key_u64("buckets", s->buckets, true);
	json_key_u64("buckets_in_flight", s->buckets_in_flight, true);
	json_key_u64("current_step", s->current_step, true);
	json_key_u64("steps_completed", s->steps_completed, true);
	json_key_u64("steps_aborted", s->steps_aborted, true);
	json_key_u64("last_step_ns", s->last_step_ns, true);
	json_key_u64("median_step_ns", s->median_step_ns, true);
	json_key_u64("bytes_reduced", s->bytes_reduced, true);
	json_key_u64("elements_clipped", s->elements_clipped, true);
	json_key_u64("nonfinite", s->nonfinite, true);
	json_key_u64("max_jobs", s->max_jobs, true);
	json_jobs(s);
	printf("}\n");
}

static void print_jobs_json(const struct gs_status *s)
{
	putchar('{');
	json_key_u64("max_jobs", s->max_jobs, true);
	json_jobs(s);
	printf("}\n");
}

/* ---- clients ----------------------------------------------------------- */

static void print_clients(const struct gs_connection_status *l, size_t n)
{
	printf("%5s  %-8s %8s %6s  %-10s %4s  %-24s %7s %11s %7s\n", "ID", "ROLE", "PID",
	       "UID", "USER", "RANK", "STATE", "TENSORS", "BYTES", "STEPS");
	for (size_t i = 0; i < n; i++) {
		const struct gs_connection_status *c = &l[i];
		char role[sizeof(c->role)], state[sizeof(c->state)], user[16] = "?", rank[16] = "-";
		char tensors[16] = "-", bytes[32] = "-", steps[24] = "-";
		struct passwd *pw = c->hidden ? NULL : getpwuid(c->uid);
		if (pw)
			clean(pw->pw_name, user, sizeof(user));
		if (c->hidden) {
			printf("%5" PRIu64 "  %-8s %8s %6s  %-10s %4s  %-24s\n", c->id,
			       clean(c->role, role, sizeof(role)), "-", "-", "-", "-",
			       clean(c->state, state, sizeof(state)));
			continue;
		}
		if (c->local_rank >= 0) {
			snprintf(rank, sizeof(rank), "%d", (int)c->local_rank);
			snprintf(tensors, sizeof(tensors), "%u", c->tensors);
			format_bytes(bytes, sizeof(bytes), c->bytes);
			snprintf(steps, sizeof(steps), "%" PRIu64, c->steps);
		}
		printf("%5" PRIu64 "  %-8s %8u %6u  %-10s %4s  %-24s %7s %11s %7s%s\n", c->id,
		       clean(c->role, role, sizeof(role)), c->pid, c->uid, user, rank,
		       clean(c->state, state, sizeof(state)), tensors, bytes, steps,
		       c->self ? "  (this gradsyncctl)" : "");
	}
}

static void json_clients(const struct gs_connection_status *l, size_t n)
{
	printf("{\"clients\":[");
	for (size_t i = 0; i < n; i++) {
		const struct gs_connection_status *c = &l[i];
		putchar('{');
		json_key_u64("id", c->id, true);
		json_key_str("role", c->role, true);
		if (c->hidden) {
			printf("\"pid\":null,\"uid\":null,\"gid\":null,");
		} else {
			json_key_u64("pid", c->pid, true);
			json_key_u64("uid", c->uid, true);
			json_key_u64("gid", c->gid, true);
		}
		printf("\"self\":%s,", c->self ? "true" : "false");
		printf("\"hidden\":%s,", c->hidden ? "true" : "false");
		if (c->local_rank >= 0)
			printf("\"local_rank\":%d,", (int)c->local_rank);
		else
			printf("\"local_rank\":null,");
		json_key_str("state", c->state, true);
		json_key_u64("tensors", c->tensors, true);
		json_key_u64("bytes", c->bytes, true);
		json_key_u64("steps", c->steps, false);
		printf("}%s", i + 1 < n ? "," : "");
	}
	printf("]}\n");
}

/* ---- launch-env -------------------------------------------------------- */

static void launch_row(const char *what, const char *value, const char *source)
{
	printf(ROW "%-24s from %s\n", what, value, source);
}

static void launch_number(const char *what, uint32_t v, const char *source)
{
	char buf[16];
	snprintf(buf, sizeof(buf), "%u", v);
	launch_row(what, buf, source);
}

/* A setting no option or variable gave is the job's: its first trainer's,
 * else the default. */
static const char *unset_or(const char *source, const char *value)
{
	return strcmp(source, "unset") == 0 ? "(the job's)" : value;
}

static void print_launch_text(const struct gs_launch_info *li)
{
	char id[sizeof(li->job_id) + 2];
	snprintf(id, sizeof(id), "'%s'", li->job_id);
	printf("A trainer started here would join this job:\n");
	launch_row("job id:", li->job_id[0] ? id : "(none)", li->job_id_source);
	launch_number("local rank:", li->local_rank, li->local_rank_source);
	launch_number("local size:", li->local_size, li->local_size_source);
	launch_number("nodes:", li->nodes, li->nodes_source);
	launch_number("node rank:", li->node_rank, li->node_rank_source);
	launch_row("coordinator:", li->coordinator[0] ? li->coordinator : "(none)",
		   li->coordinator_source);
	char thr[24], pre[32], fus[24];
	snprintf(thr, sizeof(thr), "%llu", (unsigned long long)li->threshold);
	snprintf(pre, sizeof(pre), "%g", li->predivide_factor);
	snprintf(fus, sizeof(fus), "%llu", (unsigned long long)li->fusion_buffer_elements);
	launch_row("threshold:", unset_or(li->threshold_source, thr), li->threshold_source);
	launch_row("wire dtype:", unset_or(li->wire_dtype_source, wire_name(li->wire_dtype)),
		   li->wire_dtype_source);
	launch_row("op:", unset_or(li->op_source, op_name(li->op)), li->op_source);
	launch_row("predivide:",
		   unset_or(li->predivide_source, li->predivide_factor == 0 ? "world" : pre),
		   li->predivide_source);
	launch_row("fusion buffer:", unset_or(li->fusion_buffer_source, fus),
		   li->fusion_buffer_source);
}

static void json_launch_field(const char *key, const char *value, uint64_t n,
			      const char *source, bool comma)
{
	printf("\"%s\":{", key);
	if (value)
		json_key_str("value", value, true);
	else
		json_key_u64("value", n, true);
	json_key_str("source", source, false);
	printf("}%s", comma ? "," : "");
}

static void print_launch_json(const struct gs_launch_info *li)
{
	putchar('{');
	json_launch_field("job_id", li->job_id, 0, li->job_id_source, true);
	json_launch_field("local_rank", NULL, li->local_rank, li->local_rank_source, true);
	json_launch_field("local_size", NULL, li->local_size, li->local_size_source, true);
	json_launch_field("nodes", NULL, li->nodes, li->nodes_source, true);
	json_launch_field("node_rank", NULL, li->node_rank, li->node_rank_source, true);
	json_launch_field("coordinator", li->coordinator, 0, li->coordinator_source, true);
	/* An unset setting's value is 0 (its source says "unset"). */
	json_launch_field("threshold", NULL, li->threshold, li->threshold_source, true);
	json_launch_field("wire_dtype", li->wire_dtype ? wire_name(li->wire_dtype) : "", 0,
			  li->wire_dtype_source, true);
	json_launch_field("op", li->op ? op_name(li->op) : "", 0, li->op_source, true);
	printf("\"predivide\":{\"value\":%.17g,", li->predivide_factor);
	json_key_str("source", li->predivide_source, false);
	printf("},");
	json_launch_field("fusion_buffer", NULL, li->fusion_buffer_elements,
			  li->fusion_buffer_source, false);
	printf("}\n");
}

/* What gs_connect would derive with GS_CONNECT_OPTIONS_INIT, as a trainer
 * that sets none of the job's fields itself does. */
static int launch_env(const struct args *a)
{
	struct gs_launch_info li = GS_LAUNCH_INFO_INIT;
	if (gs_launch_info_get(NULL, &li) < 0) {
		fprintf(stderr, "gradsyncctl: %s\n", gs_last_error(NULL));
		return EXIT_DAEMON;
	}
	if (a->json)
		print_launch_json(&li);
	else
		print_launch_text(&li);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		perror("gradsyncctl: stdout");
		return EXIT_DAEMON;
	}
	return 0;
}

/* ---- commands ------------------------------------------------------------ */

static const char *socket_path(const struct args *a)
{
	if (a->socket)
		return a->socket;
	const char *env = secure_getenv("GRADSYNC_SOCKET");
	return env && *env ? env : GS_DEFAULT_SOCKET;
}

/* Not running, or not allowed: the socket's permissions or gradsyncd's
 * check of this user's credentials say which. */
static int connect_failed(const struct args *a, int r)
{
	fprintf(stderr, "gradsyncctl: %s\n", gs_last_error(NULL));
	if (r == GS_EREFUSED)
		return EXIT_DENIED;
	if (r != GS_ECONNECT)
		return EXIT_DAEMON;
	if (access(socket_path(a), W_OK) < 0 && errno == EACCES)
		return EXIT_DENIED;
	return EXIT_NOT_RUNNING;
}

static int fail(gs_client *c)
{
	fprintf(stderr, "gradsyncctl: %s\n", gs_last_error(c));
	return EXIT_DAEMON;
}

/* The job with this id among those the caller may see (a hidden job's id
 * is not told), or NULL. */
static const struct gs_job_status *find_job(const struct gs_status *s, const char *id)
{
	for (size_t i = 0; i < s->job_count; i++)
		if (!s->jobs[i].hidden && strcmp(s->jobs[i].job_id, id) == 0)
			return &s->jobs[i];
	return NULL;
}

static int one_job(const struct gs_status *s, const struct args *a)
{
	const struct gs_job_status *j = find_job(s, a->job);
	if (!j) {
		char id[256];
		fprintf(stderr, "gradsyncctl: no job '%s' on this node that you may see "
			"('gradsyncctl jobs' lists them)\n", clean(a->job, id, sizeof(id)));
		return EXIT_DAEMON;
	}
	if (a->json) {
		json_job(j, false);
		putchar('\n');
	} else {
		print_job(j);
	}
	return 0;
}

static int status(gs_client *c, const struct args *a)
{
	struct gs_status *s;
	if (gs_status_get(c, a->timeout_ms, &s) < 0)
		return fail(c);
	int r = 0;
	if (a->job)
		r = one_job(s, a);
	else if (a->cmd == CMD_JOBS && a->json)
		print_jobs_json(s);
	else if (a->cmd == CMD_JOBS)
		print_jobs_table(s);
	else if (a->json)
		print_json(s);
	else
		print_text(s);
	gs_status_free(s);
	return r;
}

static int clients(gs_client *c, const struct args *a)
{
	struct gs_connection_status *list;
	size_t n;
	if (gs_clients_get(c, a->timeout_ms, &list, &n) < 0)
		return fail(c);
	if (a->json)
		json_clients(list, n);
	else
		print_clients(list, n);
	gs_clients_free(list);
	return 0;
}

static int metrics(gs_client *c, const struct args *a)
{
	char *text;
	if (gs_metrics_get(c, a->timeout_ms, &text) < 0)
		return fail(c);
	fputs(text, stdout);
	gs_metrics_free(text);
	return 0;
}

/* The file is opened here, as the calling user, and handed to the daemon:
 * it writes only where this user may. It is not truncated here either: the
 * daemon truncates it once it accepts, so a refused start (a trace already
 * running, perhaps into this very file) leaves it as it was. */
static int trace_start(gs_client *c, const struct args *a)
{
	bool created = true;
	int fd = open(a->file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644);
	if (fd < 0 && errno == EEXIST) {
		created = false;
		fd = open(a->file, O_WRONLY | O_CLOEXEC | O_NOCTTY);
	}
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "gradsyncctl: cannot write the trace to %s: %s\n", a->file,
			fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return EXIT_DAEMON;
	}
	struct gs_trace_status ts;
	int r = gs_trace_start(c, fd, a->timeout_ms, &ts);
	close(fd);
	if (r < 0) {
		if (created)
			unlink(a->file);
		return fail(c);
	}
	printf("tracing every bucket's phases to %s; 'gradsyncctl trace stop' completes the file\n",
	       ts.path[0] ? ts.path : a->file);
	return 0;
}

static int trace_stop(gs_client *c, const struct args *a)
{
	struct gs_trace_status ts;
	if (gs_trace_stop(c, a->timeout_ms, &ts) < 0)
		return fail(c);
	printf("trace written to %s: %" PRIu64 " events, %" PRIu64 " bytes\n", ts.path,
	       ts.events, ts.bytes);
	if (ts.dropped)
		fprintf(stderr, "gradsyncctl: %" PRIu64 " events were dropped: the file did not keep up\n",
			ts.dropped);
	if (ts.error[0]) {
		fprintf(stderr, "gradsyncctl: the trace stopped early: %s\n", ts.error);
		return EXIT_DAEMON;
	}
	return 0;
}

static int run(const struct args *a)
{
	if (a->cmd == CMD_LAUNCH_ENV)
		return launch_env(a);
	gs_client *c;
	int r = gs_control_connect(a->socket, a->timeout_ms, &c);
	if (r < 0)
		return connect_failed(a, r);
	switch (a->cmd) {
	case CMD_STATUS:
	case CMD_JOBS: r = status(c, a); break;
	case CMD_CLIENTS: r = clients(c, a); break;
	case CMD_METRICS: r = metrics(c, a); break;
	case CMD_TRACE_START: r = trace_start(c, a); break;
	case CMD_TRACE_STOP: r = trace_stop(c, a); break;
	case CMD_LAUNCH_ENV: break;
	}
	gs_close(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		perror("gradsyncctl: stdout");
		return EXIT_DAEMON;
	}
	return r;
}

/* ---- main -------------------------------------------------------------- */

int main(int argc, char **argv)
{
	struct args a = { .socket = NULL, .timeout_ms = 5000, .json = false };
	int r = parse_args(argc, argv, &a);
	if (r >= 0)
		return r;
	return run(&a);
}
