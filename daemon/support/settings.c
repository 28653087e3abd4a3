#include "support/settings.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "escape.h"
#include "hostport.h"
#include "number.h"
#include "support/config_file.h"
#include "support/log.h"

enum kind { K_TEXT, K_UINT, K_CHOICE };

struct choice {
	const char *name;
	int value;
};

struct setting {
	const char *name; /* --name, GRADSYNC_NAME (upper case, '-' as '_') */
	enum kind kind;
	size_t offset;
	size_t size;      /* of the field: a K_UINT is 4 or 8 bytes */
	const char *def;
	uint64_t min, max;      /* K_UINT; K_TEXT: max is the longest length */
	const struct choice *choices; /* K_CHOICE, ended by a NULL name */
	const char *help;
};

static const struct choice wire_choices[] = {
	{ "fp16", GS_WIRE_F16 }, { "bf16", GS_WIRE_BF16 }, { "fp32", GS_WIRE_F32 }, { NULL, 0 },
};
static const struct choice op_choices[] = {
	{ "average", GS_REDUCE_AVERAGE }, { "sum", GS_REDUCE_SUM }, { NULL, 0 },
};
static const struct choice backend_choices[] = {
	{ "auto", GS_BACKEND_AUTO }, { "host", GS_BACKEND_HOST }, { "cuda", GS_BACKEND_CUDA }, { NULL, 0 },
};
static const struct choice job_access_choices[] = {
	{ "owner", GS_JOB_ACCESS_OWNER }, { "any", GS_JOB_ACCESS_ANY }, { NULL, 0 },
};
static const struct choice log_choices[] = {
	{ "error", GS_LOG_ERROR }, { "warning", GS_LOG_WARN }, { "info", GS_LOG_INFO },
	{ "debug", GS_LOG_DEBUG }, { NULL, 0 },
};
static const struct choice yes_no_choices[] = {
	{ "no", 0 }, { "yes", 1 }, { NULL, 0 },
};

#define OFF(field) offsetof(struct gs_settings, field)
/* A setting's field: where it is and how large, so that its type comes
 * from struct gs_settings itself. */
#define FIELD(field) OFF(field), sizeof(((struct gs_settings *)0)->field)

static const struct setting table[] = {
	{ "config", K_TEXT, FIELD(config_path), GS_DEFAULT_CONFIG, 0, 255, NULL,
	  "configuration file read at start (gradsync.conf(5)); a missing default file is no error; empty: read none" },
	{ "socket", K_TEXT, FIELD(socket_path), GS_DEFAULT_SOCKET, 1, 107, NULL,
	  "Unix socket to listen on" },
	{ "backend", K_CHOICE, FIELD(backend), "auto", 0, 0, backend_choices,
	  "where gradients live and are reduced: host (shared memory), cuda (GPU; needs a usable GPU), auto (cuda when usable)" },
	{ "log-level", K_CHOICE, FIELD(log_level), "info", 0, 0, log_choices,
	  "least severe messages logged" },
	{ "max-frame", K_UINT, FIELD(max_frame), "4194304", 4096, UINT64_C(1) << 30, NULL,
	  "largest protocol frame accepted, in bytes" },
	{ "max-tensors", K_UINT, FIELD(max_tensors), "65536", 1, UINT64_C(1) << 24, NULL,
	  "most tensors one trainer may register" },
	{ "max-bytes", K_UINT, FIELD(max_bytes), "68719476736", 4, UINT64_C(1) << 46, NULL,
	  "most gradient bytes one trainer may register" },
	{ "allow-hugetlb", K_CHOICE, FIELD(allow_hugetlb), "no", 0, 0, yes_no_choices,
	  "accept gradient buffers in huge-page memfds (MFD_HUGETLB), whose pages a trainer can make vanish: a trainer whose huge pages vanish fails its own step and is dropped, and that step is aborted for the others" },
	{ "node-address", K_TEXT, FIELD(node_address), "", 0, 255, NULL,
	  "address (or interface name) where the daemons of other nodes reach this one, for the rendezvous of the jobs whose node 0 it is and for every job's Gloo connections: a host alone, as a coordinator is (no port, path or scheme); empty: the host name" },
	{ "node-port", K_UINT, FIELD(node_port), "29450", 0, 65535, NULL,
	  "TCP port on --node-address where this daemon serves the rendezvous of every job whose node 0 it is; the same on every node, as a job's trainers name only its node 0's host; 0: none, and only jobs of one node are served" },
	{ "cluster-secret-file", K_TEXT, FIELD(cluster_secret_file), "", 0, 255, NULL,
	  "file holding the secret every node proves it knows before the rendezvous serves it: the same on every node, 16 to 4096 bytes (one trailing newline is trimmed), mode 0600 or 0400; empty: the rendezvous is unauthenticated" },
	{ "join-timeout", K_UINT, FIELD(join_timeout), "300", 1, 86400, NULL,
	  "seconds to wait for the coordinator and the other nodes (joining, layout agreement)" },
	{ "peer-timeout", K_UINT, FIELD(peer_timeout), "60", 1, 86400, NULL,
	  "seconds an all-reduce between nodes may wait on a peer (a vote: --step-timeout plus this), and a connection between daemons may stay silent (they ping each other every quarter of it) before the peer counts as lost" },
	{ "auth-timeout", K_UINT, FIELD(auth_timeout), "5", 1, 300, NULL,
	  "seconds a connection to the rendezvous may take to authenticate before node 0 closes it" },
	{ "step-timeout", K_UINT, FIELD(step_timeout), "180", 1, 86400, NULL,
	  "seconds a step may wait for gradients before it is aborted, naming what is missing" },
	{ "stall-warning", K_UINT, FIELD(stall_warning), "30", 1, 86400, NULL,
	  "seconds a step may wait before a warning names the missing gradients" },
	{ "group", K_TEXT, FIELD(group), "gradsync", 0, 63, NULL,
	  "group that owns the socket and whose members may connect; empty or absent: only root and the daemon's user" },
	{ "allow-uids", K_TEXT, FIELD(allow_uids), "", 0, 255, NULL,
	  "further user ids allowed to connect, comma separated" },
	{ "max-clients", K_UINT, FIELD(max_clients), "256", 1, 65536, NULL,
	  "connections (trainers and control clients) at once" },
	{ "job-access", K_CHOICE, FIELD(job_access), "owner", 0, 0, job_access_choices,
	  "who may join a job besides root: owner (the user of its first trainer; others learn nothing of it) or any (every user allowed on the socket, for a node of one tenant)" },
	{ "hello-timeout", K_UINT, FIELD(hello_timeout), "5", 1, 3600, NULL,
	  "seconds a new connection has to say Hello before it is closed" },
	{ "frame-timeout", K_UINT, FIELD(frame_timeout), "10", 1, 3600, NULL,
	  "seconds a client's frame, once begun, has to arrive whole before the client is dropped" },
	{ "register-timeout", K_UINT, FIELD(register_timeout), "60", 1, 86400, NULL,
	  "seconds a trainer has, from its Welcome, to register its tensors before it is dropped and its place in the job and on the node is freed" },
	{ "max-pending-bytes", K_UINT, FIELD(max_pending_bytes), "268435456", 1048576, UINT64_C(1) << 40, NULL,
	  "bytes of frames not yet whole that every client together may have gradsyncd hold; at least --max-frame plus 64 KiB" },
	{ "max-queued-bytes", K_UINT, FIELD(max_queued_bytes), "16777216", 1048576, UINT64_C(1) << 30, NULL,
	  "bytes of messages gradsyncd may hold for one client that does not read them: past a sixteenth of this it reads nothing more from the client (its requests wait) until the client has read its replies, and a client whose messages would pass this (ones sent unasked) is dropped" },
	{ "max-parked-fds", K_UINT, FIELD(max_parked_fds), "1024", 64, 1048576, NULL,
	  "descriptors received from clients and not yet claimed by a message, every client together (none before Hello); with --max-clients it must fit in RLIMIT_NOFILE" },
	{ "max-buffers", K_UINT, FIELD(max_buffers), "1024", 1, 65536, NULL,
	  "separate buffers (memfds or CUDA allocations) one trainer may register" },
	{ "max-mappings", K_UINT, FIELD(max_mappings), "32768", 1, 1048576, NULL,
	  "buffers every trainer together may have mapped into gradsyncd; below vm.max_map_count" },
	{ "max-jobs", K_UINT, FIELD(max_jobs), "16", 1, 1024, NULL,
	  "jobs this node serves at once (each has its own worker thread, fusion buffers and group of nodes), lingering ones included; a job of one more takes the place of the oldest lingering one, or is refused" },
	{ "max-trainers", K_UINT, FIELD(max_trainers), "64", 1, 4096, NULL,
	  "trainers of every job together" },
	{ "max-jobs-per-user", K_UINT, FIELD(max_jobs_per_user), "8", 0, 1024, NULL,
	  "jobs one user (root too) may have on this node at once, lingering ones included: a new job of a user at the limit takes the place of the user's oldest lingering job, or is refused; 0: only --max-jobs" },
	{ "max-trainers-per-user", K_UINT, FIELD(max_trainers_per_user), "32", 0, 4096, NULL,
	  "trainers one user (root too) may have on this node, every job together; 0: only --max-trainers" },
	{ "max-nodes", K_UINT, FIELD(max_nodes), "1024", 1, GS_MAX_NODES, NULL,
	  "most nodes a job may span; 1: this node serves jobs of one node only" },
	{ "max-fusion-buffer", K_UINT, FIELD(max_fusion_elements), "67108864", 1024, UINT64_C(1) << 30, NULL,
	  "largest fusion buffer, in elements, a job may ask for (it has one per local trainer)" },
	{ "max-fusion-memory", K_UINT, FIELD(max_fusion_memory), "4294967296", UINT64_C(1) << 20, UINT64_C(1) << 46, NULL,
	  "bytes the fusion and staging buffers of every job together may hold (GPU memory with the cuda backend); each job's are sized by its layout when it registers, and a job whose buffers would pass this is refused" },
	{ "job-linger", K_UINT, FIELD(job_linger), "30", 0, 86400, NULL,
	  "seconds a job's group of nodes (rendezvous, Gloo connections, NCCL communicators) is kept once its last trainer has left, so that trainers of the same job id and shape that come back resume without a new group; a job of one node has none and goes at once, and a new job that finds no free place takes the oldest lingering job's; 0: every job goes at once" },
	{ "gpus", K_TEXT, FIELD(gpus), "", 0, 255, NULL,
	  "GPUs this daemon may reduce on, as comma-separated PCI bus ids (nvidia-smi's, e.g. 0000:3b:00.0); empty: every GPU it sees" },
};

#define NSETTINGS (sizeof(table) / sizeof(table[0]))

static const char *sources[NSETTINGS];
static char file_sources[NSETTINGS][300]; /* "file PATH:LINE" */

static void env_name(const struct setting *st, char *out, size_t n)
{
	size_t k = (size_t)snprintf(out, n, "GRADSYNC_");
	for (const char *p = st->name; *p && k + 1 < n; p++)
		out[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	out[k] = '\0';
}

/* The counts kept as 32-bit fields (the others are 64-bit). */
static bool is_u32(const struct setting *st)
{
	return st->size == sizeof(uint32_t);
}

static void describe_range(const struct setting *st, char *out, size_t n)
{
	switch (st->kind) {
	case K_UINT:
		snprintf(out, n, "an integer in [%llu, %llu]",
			 (unsigned long long)st->min, (unsigned long long)st->max);
		break;
	case K_CHOICE: {
		size_t k = (size_t)snprintf(out, n, "one of");
		for (const struct choice *c = st->choices; c->name && k < n; c++)
			k += (size_t)snprintf(out + k, n - k, " %s", c->name);
		break;
	}
	case K_TEXT:
		snprintf(out, n, "a text of %llu to %llu bytes", (unsigned long long)st->min,
			 (unsigned long long)st->max);
		break;
	}
}

static int apply(const struct setting *st, const char *text, struct gs_settings *s)
{
	char *field = (char *)s + st->offset;
	uint64_t v;
	switch (st->kind) {
	case K_TEXT:
		if (strlen(text) < st->min || strlen(text) > st->max)
			return -EINVAL;
		strcpy(field, text);
		return 0;
	case K_UINT:
		if (gs_parse_uint(text, st->min, st->max, &v) < 0)
			return -EINVAL;
		if (is_u32(st))
			*(uint32_t *)field = (uint32_t)v;
		else
			*(uint64_t *)field = v;
		return 0;
	case K_CHOICE:
		for (const struct choice *c = st->choices; c->name; c++) {
			if (strcmp(c->name, text) == 0) {
				*(int *)field = c->value;
				return 0;
			}
		}
		return -EINVAL;
	}
	return -EINVAL;
}

static int apply_from(const struct setting *st, const char *text,
		      const char *source, struct gs_settings *s)
{
	if (apply(st, text, s) == 0) {
		sources[st - table] = source;
		return 0;
	}
	char env[64], range[160], safe[GS_ESCAPED_SIZE(256)];
	env_name(st, env, sizeof(env));
	describe_range(st, range, sizeof(range));
	if (st->kind == K_UINT)
		snprintf(range + strlen(range), sizeof(range) - strlen(range), " (%s)", GS_NUMBER_FORM);
	fprintf(stderr, "gradsyncd: invalid value '%s' for --%s (%s), from %s: expected %s\n",
		gs_escape(text, safe, sizeof(safe)), st->name, env, source, range);
	return -EINVAL;
}

static const char *choice_name(const struct choice *choices, int value)
{
	for (const struct choice *c = choices; c->name; c++)
		if (c->value == value)
			return c->name;
	return "unknown";
}

static void format_value(const struct setting *st, const struct gs_settings *s,
			 char *out, size_t n)
{
	const char *field = (const char *)s + st->offset;
	switch (st->kind) {
	case K_TEXT:
		snprintf(out, n, "%s", field);
		break;
	case K_UINT:
		if (is_u32(st))
			snprintf(out, n, "%u", *(const uint32_t *)field);
		else
			snprintf(out, n, "%llu", (unsigned long long)*(const uint64_t *)field);
		break;
	case K_CHOICE:
		snprintf(out, n, "%s", choice_name(st->choices, *(const int *)field));
		break;
	}
}

static void print_help(FILE *f)
{
	fprintf(f, "Usage: gradsyncd [OPTION]...\n"
		   "Synchronise the gradients of data-parallel trainers on this node.\n\n");
	for (size_t i = 0; i < NSETTINGS; i++) {
		char env[64], range[160];
		env_name(&table[i], env, sizeof(env));
		describe_range(&table[i], range, sizeof(range));
		fprintf(f, "  --%s=VALUE\n      %s.\n      %s; default %s; environment %s.\n",
			table[i].name, table[i].help, range, table[i].def, env);
	}
	fprintf(f, "  --print-config\n      print the effective settings and where each came from, then exit.\n"
		   "  --print-example-config\n      print a configuration file with every setting commented, then exit.\n"
		   "  --help, --version\n\n"
		   "A flag beats its GRADSYNC_* variable, which beats the configuration file\n"
		   "(key = value, the flag's name as key), which beats the default.\n");
}

/* "# text", wrapped at 76 columns, its first letter upper case. */
static void print_comment(FILE *f, const char *text)
{
	size_t col = 0;
	for (const char *p = text; *p;) {
		size_t word = strcspn(p, " ");
		if (col == 0)
			col = (size_t)fprintf(f, "#");
		else if (col + 1 + word > 76)
			col = (size_t)fprintf(f, "\n#");
		col += (size_t)fprintf(f, " %c%.*s", p == text ? toupper((unsigned char)*p) : *p,
				       (int)word - 1, p + 1);
		p += word;
		p += strspn(p, " ");
	}
	fputc('\n', f);
}

/* The installed example: every setting but config, documented, commented
 * out at its default. */
static void print_example(FILE *f)
{
	fprintf(f, "# gradsyncd's configuration: gradsync.conf(5).\n"
		   "#\n"
		   "# One setting a line, \"key = value\"; lines starting with '#' or ';' are\n"
		   "# comments. Each key is the name of a gradsyncd flag; a flag on the\n"
		   "# command line and its GRADSYNC_* environment variable override the\n"
		   "# value here. Every setting below is commented out at its default.\n"
		   "# An invalid value stops gradsyncd at start, naming the setting and its\n"
		   "# allowed range; `gradsyncd --print-config` shows the effective settings\n"
		   "# and where each came from.\n");
	for (size_t i = 0; i < NSETTINGS; i++) {
		const struct setting *st = &table[i];
		if (st->offset == OFF(config_path))
			continue;
		char env[64], range[160];
		env_name(st, env, sizeof(env));
		describe_range(st, range, sizeof(range));
		char text[512];
		snprintf(text, sizeof(text), "%s. Allowed: %s. Flag --%s, environment %s.",
			 st->help, range, st->name, env);
		fputc('\n', f);
		print_comment(f, text);
		fprintf(f, "#%s = %s\n", st->name, st->def);
	}
}

static void print_config(const struct gs_settings *s)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		char value[160];
		format_value(&table[i], s, value, sizeof(value));
		printf("%-14s %-30s # %s\n", table[i].name, value, sources[i]);
	}
}

enum { OPT_HELP = 256, OPT_VERSION, OPT_PRINT_CONFIG, OPT_PRINT_EXAMPLE, OPT_SETTING };

#define CONFIG_INDEX 0 /* table[0] is --config */

static int load_defaults(struct gs_settings *s)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (apply_from(&table[i], table[i].def, "default", s) < 0)
			return -EINVAL;
	return 0;
}

static int load_env(struct gs_settings *s, size_t first, size_t end)
{
	for (size_t i = first; i < end; i++) {
		char env[64];
		env_name(&table[i], env, sizeof(env));
		const char *v = getenv(env);
		if (v && apply_from(&table[i], v, "environment", s) < 0)
			return -EINVAL;
	}
	return 0;
}

/* A first pass over the flags: the file is named before it is read
 * (--config beats GRADSYNC_CONFIG), and the options that only print work
 * whatever the file holds. Returns 0, 1 when such an option printed, or
 * -EINVAL; other options wait for the second pass, which reports errors. */
static int load_config_path(struct gs_settings *s, int argc, char **argv,
			    const struct option *opts)
{
	if (load_env(s, CONFIG_INDEX, CONFIG_INDEX + 1) < 0)
		return -EINVAL;
	int saved = opterr, c, r = 0;
	opterr = 0;
	optind = 0;
	while (r == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == OPT_SETTING + CONFIG_INDEX)
			r = apply_from(&table[CONFIG_INDEX], optarg, "command line", s);
		else if (c == OPT_HELP)
			print_help(stdout);
		else if (c == OPT_VERSION)
			printf("gradsyncd %s\n", GS_VERSION);
		else if (c == OPT_PRINT_EXAMPLE)
			print_example(stdout);
		r = r < 0 ? r : c == OPT_HELP || c == OPT_VERSION || c == OPT_PRINT_EXAMPLE;
	}
	opterr = saved;
	return r;
}

struct file_ctx {
	struct gs_settings *s;
	const char *path;
};

static int file_setting(void *ctx, const char *key, const char *value, unsigned line)
{
	struct file_ctx *fc = ctx;
	for (size_t i = 0; i < NSETTINGS; i++) {
		if (strcmp(table[i].name, key) != 0)
			continue;
		if (i == CONFIG_INDEX) {
			fprintf(stderr, "gradsyncd: %s:%u: 'config' names the file to read and cannot be set in it\n",
				fc->path, line);
			return -EINVAL;
		}
		snprintf(file_sources[i], sizeof(file_sources[i]), "file %s:%u", fc->path, line);
		return apply_from(&table[i], value, file_sources[i], fc->s);
	}
	fprintf(stderr, "gradsyncd: %s:%u: unknown setting '%s' (gradsyncd --help lists them)\n",
		fc->path, line, key);
	return -EINVAL;
}

/* Reads the secret the setting names; prints why the file is refused. */
static int load_secret(struct gs_settings *s)
{
	if (!s->cluster_secret_file[0])
		return 0;
	char why[256];
	if (gs_secret_load(s->cluster_secret_file, s->cluster_secret, &s->cluster_secret_len,
			   why, sizeof(why)) == 0)
		return 0;
	const char *source = "?";
	for (size_t i = 0; i < NSETTINGS; i++)
		if (table[i].offset == OFF(cluster_secret_file))
			source = sources[i];
	fprintf(stderr, "gradsyncd: --cluster-secret-file (GRADSYNC_CLUSTER_SECRET_FILE) '%s', from %s, is refused: %s\n",
		s->cluster_secret_file, source, why);
	return -EINVAL;
}

static int load_file(struct gs_settings *s)
{
	if (!s->config_path[0])
		return 0;
	/* Only the default file may be absent; one that was asked for must be there. */
	bool optional = strcmp(sources[CONFIG_INDEX], "default") == 0;
	char path[sizeof(s->config_path)];
	snprintf(path, sizeof(path), "%s", s->config_path);
	struct file_ctx fc = { s, path };
	int r = gs_config_file_read(path, optional, file_setting, &fc);
	if (r == -ENOENT && optional) {
		sources[CONFIG_INDEX] = "default, absent";
		return 0;
	}
	return r;
}

enum gs_settings_result gs_settings_load(struct gs_settings *s, int argc,
					 char **argv)
{
	memset(s, 0, sizeof(*s));
	struct option opts[NSETTINGS + 5];
	for (size_t i = 0; i < NSETTINGS; i++)
		opts[i] = (struct option){ table[i].name, required_argument, NULL,
					   OPT_SETTING + (int)i };
	opts[NSETTINGS] = (struct option){ "help", no_argument, NULL, OPT_HELP };
	opts[NSETTINGS + 1] = (struct option){ "version", no_argument, NULL, OPT_VERSION };
	opts[NSETTINGS + 2] = (struct option){ "print-config", no_argument, NULL, OPT_PRINT_CONFIG };
	opts[NSETTINGS + 3] = (struct option){ "print-example-config", no_argument, NULL,
					       OPT_PRINT_EXAMPLE };
	opts[NSETTINGS + 4] = (struct option){ NULL, 0, NULL, 0 };
	/* Default < file < environment < flag. */
	int r = load_defaults(s) < 0 ? -EINVAL : load_config_path(s, argc, argv, opts);
	if (r > 0)
		return GS_SETTINGS_EXIT_OK;
	if (r < 0 || load_file(s) < 0 || load_env(s, CONFIG_INDEX + 1, NSETTINGS) < 0)
		return GS_SETTINGS_EXIT_USAGE;

	bool want_config = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == OPT_HELP) {
			print_help(stdout);
			return GS_SETTINGS_EXIT_OK;
		} else if (c == OPT_VERSION) {
			printf("gradsyncd %s\n", GS_VERSION);
			return GS_SETTINGS_EXIT_OK;
		} else if (c == OPT_PRINT_CONFIG) {
			want_config = true;
		} else if (c >= OPT_SETTING && c < OPT_SETTING + (int)NSETTINGS) {
			if (apply_from(&table[c - OPT_SETTING], optarg, "command line", s) < 0)
				return GS_SETTINGS_EXIT_USAGE;
		} else {
			fprintf(stderr, "Try 'gradsyncd --help'.\n");
			return GS_SETTINGS_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gradsyncd: unexpected argument '%s'\nTry 'gradsyncd --help'.\n",
			argv[optind]);
		return GS_SETTINGS_EXIT_USAGE;
	}
	uid_t uids[GS_MAX_ALLOW_UIDS];
	char why[160];
	if (gs_settings_allow_uids(s, uids, &(size_t){ 0 }, why, sizeof(why)) < 0) {
		char safe[GS_ESCAPED_SIZE(sizeof(s->allow_uids))];
		fprintf(stderr, "gradsyncd: invalid value '%s' for --allow-uids (GRADSYNC_ALLOW_UIDS): %s\n",
			gs_escape(s->allow_uids, safe, sizeof(safe)), why);
		return GS_SETTINGS_EXIT_USAGE;
	}
	if (s->node_address[0] && gs_host_check(s->node_address, why, sizeof(why)) < 0) {
		char safe[GS_ESCAPED_SIZE(sizeof(s->node_address))];
		fprintf(stderr, "gradsyncd: invalid value '%s' for --node-address (GRADSYNC_NODE_ADDRESS): it %s\n",
			gs_escape(s->node_address, safe, sizeof(safe)), why);
		return GS_SETTINGS_EXIT_USAGE;
	}
	if (s->max_pending_bytes < s->max_frame + (64u << 10)) {
		fprintf(stderr, "gradsyncd: --max-pending-bytes %llu is less than --max-frame %llu plus 64 KiB: no largest frame could ever arrive\n",
			(unsigned long long)s->max_pending_bytes, (unsigned long long)s->max_frame);
		return GS_SETTINGS_EXIT_USAGE;
	}
	if (s->max_buffers > s->max_mappings) {
		fprintf(stderr, "gradsyncd: --max-buffers %llu is more than --max-mappings %llu, every trainer's buffers together\n",
			(unsigned long long)s->max_buffers, (unsigned long long)s->max_mappings);
		return GS_SETTINGS_EXIT_USAGE;
	}
	if (want_config) {
		print_config(s);
		return GS_SETTINGS_EXIT_OK;
	}
	return load_secret(s) < 0 ? GS_SETTINGS_EXIT_USAGE : GS_SETTINGS_RUN;
}

int gs_settings_allow_uids(const struct gs_settings *s, uid_t *uids, size_t *n,
			   char *why, size_t whylen)
{
	*n = 0;
	for (const char *p = s->allow_uids; *p;) {
		size_t len = strcspn(p, ",");
		char item[32];
		uint64_t v;
		snprintf(item, sizeof(item), "%.*s", (int)(len < sizeof(item) ? len : sizeof(item) - 1), p);
		/* (uid_t)-1 means "no user" to the kernel: never a real user. */
		if (len == 0 || len >= sizeof(item) ||
		    gs_parse_uint(item, 0, (uint64_t)(uid_t)-1 - 1, &v) < 0) {
			snprintf(why, whylen, "'%.*s' is not a user id (0 to %u)", (int)(len > 20 ? 20 : len),
				 p, (unsigned)(uid_t)-1 - 1);
			return -EINVAL;
		}
		if (*n == GS_MAX_ALLOW_UIDS) {
			snprintf(why, whylen, "more than %d user ids", GS_MAX_ALLOW_UIDS);
			return -EINVAL;
		}
		uids[(*n)++] = (uid_t)v;
		p += len;
		if (*p == ',' && !*++p) {
			snprintf(why, whylen, "it ends with a comma");
			return -EINVAL;
		}
	}
	return 0;
}

const char *gs_wire_setting_name(int wire)
{
	return choice_name(wire_choices, wire);
}

const char *gs_op_setting_name(int op)
{
	return choice_name(op_choices, op);
}

void gs_predivide_text(double factor, char *out, size_t n)
{
	if (factor == 0)
		snprintf(out, n, "world");
	else
		snprintf(out, n, "%g", factor);
}

void gs_settings_shared_text(const struct gs_settings *s, char *out, size_t n)
{
	char predivide[32];
	gs_predivide_text(s->predivide, predivide, sizeof(predivide));
	snprintf(out, n, "threshold=%llu wire=%s op=%s predivide=%s fusion-buffer=%llu",
		 (unsigned long long)s->threshold, gs_wire_setting_name(s->wire),
		 gs_op_setting_name(s->op), predivide, (unsigned long long)s->fusion_elements);
}

double gs_settings_predivide(const struct gs_settings *s, uint32_t world)
{
	return s->predivide == 0 ? (double)world : s->predivide;
}

void gs_settings_scales(const struct gs_settings *s, uint32_t world,
			double *pre, double *post)
{
	double f = gs_settings_predivide(s, world);
	*pre = 1.0 / f;
	*post = s->op == GS_REDUCE_AVERAGE ? f / (double)world : f;
}
