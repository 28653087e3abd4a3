/*
 * gradsyncctl: shows what the node's gradsyncd is doing. Built on
 * libgradsync's control connection; prints for people, or one JSON object
 * for scripts.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradsync.h"

#ifndef GS_VERSION
#define GS_VERSION "unknown"
#endif

enum {
	EXIT_DAEMON = 1,      /* the daemon refused, or spoke nonsense */
	EXIT_USAGE = 2,
	EXIT_NOT_RUNNING = 3, /* nothing to connect to */
};

struct args {
	const char *socket;
	int timeout_ms;
	bool json;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: gradsyncctl [--socket PATH] [--timeout MS] status [--json]\n"
		"\n"
		"Commands:\n"
		"  status          the daemon's settings, trainers and step figures\n"
		"\n"
		"Options:\n"
		"  --socket PATH   gradsyncd's socket (default: $GRADSYNC_SOCKET,\n"
		"                  else " GS_DEFAULT_SOCKET ")\n"
		"  --timeout MS    give up after MS milliseconds (default 5000)\n"
		"  --json          print one JSON object instead of text\n"
		"  -h, --help      show this help\n"
		"  --version       show the version\n"
		"\n"
		"Exit status: 0 ok, 1 daemon or protocol error, 2 usage error,\n"
		"3 gradsyncd is not running (cannot connect).\n");
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
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v <= 0 || v > 86400000)
		return false;
	*out = (int)v;
	return true;
}

/* Returns -1 when parsed, else the exit status. */
static int parse_args(int argc, char **argv, struct args *a)
{
	enum { OPT_VERSION = 256, OPT_JSON, OPT_SOCKET, OPT_TIMEOUT };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "json", no_argument, NULL, OPT_JSON },
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
		case 'h': usage(stdout); return 0;
		case OPT_VERSION: printf("gradsyncctl %s\n", GS_VERSION); return 0;
		default: return usage_error("unknown or incomplete option", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error("no command given", NULL);
	if (strcmp(argv[optind], "status") != 0)
		return usage_error("unknown command", argv[optind]);
	if (optind + 1 < argc)
		return usage_error("unexpected argument", argv[optind + 1]);
	return -1;
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

static void print_trainers(const struct gs_status *s)
{
	printf("\nTrainers (%zu connected)\n", s->trainer_count);
	if (s->trainer_count == 0)
		return;
	printf("  %8s %6s %5s %8s %11s  %-12s %8s\n", "PID", "UID", "RANK",
	       "TENSORS", "BYTES", "STATE", "STEPS");
	for (size_t i = 0; i < s->trainer_count; i++) {
		const struct gs_trainer_status *t = &s->trainers[i];
		char bytes[32], state[sizeof(t->state)];
		format_bytes(bytes, sizeof(bytes), t->bytes);
		printf("  %8u %6u %5u %8u %11s  %-12s %8" PRIu64 "\n", t->pid,
		       t->uid, t->local_rank, t->tensors, bytes,
		       clean(t->state, state, sizeof(state)), t->steps);
	}
}

static void print_peers(const struct gs_status *s)
{
	if (s->peer_count <= 1)
		return;
	char sent[32], host[64], state[32];
	format_bytes(sent, sizeof(sent), s->internode_bytes);
	printf(ROW "%s (%" PRIu64 " bytes)\n", "sent to peers:", sent, s->internode_bytes);
	printf("  %6s %9s  %-24s %s\n", "NODE", "TRAINERS", "HOST", "STATE");
	for (size_t i = 0; i < s->peer_count; i++) {
		const struct gs_peer_status *p = &s->peers[i];
		printf("  %6u %9u  %-24s %s\n", p->node_rank, p->local_size,
		       p->host[0] ? clean(p->host, host, sizeof(host)) : "(host name)",
		       clean(p->state, state, sizeof(state)));
	}
}

static void print_text(const struct gs_status *s)
{
	const struct gs_session_info *set = &s->settings;
	char up[48], reduced[32], buf[sizeof(s->job_id)];
	format_uptime(up, sizeof(up), s->uptime_ns);
	format_bytes(reduced, sizeof(reduced), s->bytes_reduced);

	printf("gradsyncd %s, up %s\n",
	       clean(s->daemon_version, buf, sizeof(buf)), up);
	printf(ROW "%s\n", "backend:", clean(s->backend, buf, sizeof(buf)));
	printf(ROW "%s\n", "conversion ISA:", clean(s->isa, buf, sizeof(buf)));
	printf("\nSettings\n");
	printf(ROW "%" PRIu64 " elements\n", "threshold:", set->threshold);
	printf(ROW "%s\n", "wire dtype:", wire_name(set->wire_dtype));
	printf(ROW "%s\n", "op:", op_name(set->op));
	printf(ROW "%g\n", "predivide:", set->predivide_factor);
	printf(ROW "%" PRIu64 " elements\n", "fusion buffer:",
	       set->fusion_buffer_elements);
	printf("\nNode\n");
	printf(ROW "%u of %u nodes\n", "node rank:", s->node_rank, s->nodes);
	printf(ROW "%u\n", "world size:", s->world_size);
	printf(ROW "%u\n", "local size:", s->local_size);
	print_peers(s);
	printf("\nJob\n");
	printf(ROW "%s\n", "state:", clean(s->job_state, buf, sizeof(buf)));
	printf(ROW "%s\n", "id:",
	       s->job_id[0] ? clean(s->job_id, buf, sizeof(buf)) : "(none)");
	print_trainers(s);
	printf("\nSteps\n");
	printf(ROW "%u (%u in flight)\n", "buckets:", s->buckets,
	       s->buckets_in_flight);
	printf(ROW "%" PRIu64 "\n", "current step:", s->current_step);
	printf(ROW "%" PRIu64 " completed, %" PRIu64 " aborted\n", "steps:",
	       s->steps_completed, s->steps_aborted);
	printf(ROW "%.2f ms last, %.2f ms median\n", "step time:",
	       ms(s->last_step_ns), ms(s->median_step_ns));
	printf(ROW "%s (%" PRIu64 " bytes)\n", "reduced:", reduced,
	       s->bytes_reduced);
	printf(ROW "%" PRIu64 " elements\n", "clipped:", s->elements_clipped);
	printf(ROW "%" PRIu64 " values\n", "non-finite:", s->nonfinite);
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
	json_key_u64("nonfinite", s->nonfinite, false);
	printf("}\n");
}

/* ---- main -------------------------------------------------------------- */

static int status(const struct args *a)
{
	gs_client *c;
	int r = gs_control_connect(a->socket, a->timeout_ms, &c);
	if (r < 0) {
		fprintf(stderr, "gradsyncctl: %s\n", gs_last_error(NULL));
		return r == GS_ECONNECT ? EXIT_NOT_RUNNING : EXIT_DAEMON;
	}
	struct gs_status *s;
	r = gs_status_get(c, a->timeout_ms, &s);
	if (r < 0) {
		fprintf(stderr, "gradsyncctl: %s\n", gs_last_error(c));
		gs_close(c);
		return EXIT_DAEMON;
	}
	if (a->json)
		print_json(s);
	else
		print_text(s);
	gs_status_free(s);
	gs_close(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		perror("gradsyncctl: stdout");
		return EXIT_DAEMON;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct args a = { .socket = NULL, .timeout_ms = 5000, .json = false };
	int r = parse_args(argc, argv, &a);
	if (r >= 0)
		return r;
	return status(&a);
}
