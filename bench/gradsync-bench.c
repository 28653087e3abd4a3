/*
 * gradsync-bench: gradsync against what a user would run instead, in one
 * invocation on this machine.
 *
 *   1. sync time per step of real models' gradient layouts through N
 *      gradsyncd daemons (joined on loopback) with M bench trainers each;
 *   2. the same gradients all-reduced in-process by N x M processes in one
 *      Gloo group, DDP-style, in fp32 and in fp16 buckets;
 *   3. the ratio of each baseline to gradsync;
 *   4. pack and unpack against memcpy of the same fp32 bytes;
 *   5. the control path against a bare Unix-socket ping-pong.
 *
 * It prints progress and a summary, and writes to --out: measurements.csv
 * (every measurement), summary.csv, summary.txt and steps.png (gnuplot).
 */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "convert.h"
#include "options.h"
#include "suite.h"

#ifndef GS_BENCH_DAEMON
#define GS_BENCH_DAEMON "gradsyncd"
#endif
#ifndef GS_BENCH_TRAINER
#define GS_BENCH_TRAINER "gradsync-bench-trainer"
#endif
#ifndef GS_BENCH_LAYOUTS
#define GS_BENCH_LAYOUTS "layouts"
#endif

#define MAX_LAYOUTS 8

struct options {
	struct bench_config c;
	const char *layouts; /* comma-separated names or paths */
	const char *layouts_dir;
	const char *out;
	unsigned elements;	     /* of the kernel buffer */
	bool sync, kernels, control; /* the sections to run */
	bool keep;		     /* keep the scratch directory (logs) */
};

struct layout_results {
	struct layout_file l;
	struct sync_result sys[1 + GLOO_SYSTEMS]; /* gradsync first */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: gradsync-bench [options]\n"
		"\n"
		"Measures, in one run on this machine: sync time per step through gradsync\n"
		"(N daemons joined on loopback, M trainers each, fp16 wire, default settings)\n"
		"against Gloo in-process, DDP-style (fp32 and fp16 buckets, N x M processes);\n"
		"pack and unpack against memcpy; the control path against a Unix-socket\n"
		"ping-pong. Writes measurements.csv, summary.csv, summary.txt and steps.png.\n"
		"\n"
		"  --nodes N        daemons (nodes) on this machine (default 2)\n"
		"  --trainers M     trainers per node (default 1)\n"
		"  --steps K        timed steps per layout and system (default 20)\n"
		"  --warmup W       untimed steps before them (default 3)\n"
		"  --layouts LIST   comma-separated layout names or files\n"
		"                   (default resnet50,bert-base)\n"
		"  --layouts-dir D  where layout names are looked up (default %s)\n"
		"  --reps R         repetitions of each kernel (default 50)\n"
		"  --elements E     elements of the kernel buffer (default 4194304, the\n"
		"                   default fusion buffer)\n"
		"  --roundtrips R   control-path round trips (default 2000)\n"
		"  --only LIST      run only these of sync,kernels,control (default all)\n"
		"  --out DIR        where the results go (default bench-results)\n"
		"  --keep           keep the scratch directory (daemon and trainer logs)\n"
		"  --daemon PATH    gradsyncd (default %s)\n"
		"  --trainer PATH   the bench trainer (default %s)\n"
		"  -h, --help       show this help\n",
		GS_BENCH_LAYOUTS, GS_BENCH_DAEMON, GS_BENCH_TRAINER);
}

static int parse_only(char *list, void *to)
{
	struct options *o = to;
	char buf[256];
	char *save = NULL;
	snprintf(buf, sizeof(buf), "%s", list);
	o->sync = o->kernels = o->control = false;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (strcmp(tok, "sync") == 0)
			o->sync = true;
		else if (strcmp(tok, "kernels") == 0)
			o->kernels = true;
		else if (strcmp(tok, "control") == 0)
			o->control = true;
		else
			return -1;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct options *o)
{
	const struct bench_option opts[] = {
	    BENCH_UINT("nodes", &o->c.nodes, 1, 16),
	    BENCH_UINT("trainers", &o->c.trainers, 1, 64),
	    BENCH_UINT("steps", &o->c.steps, 1, 100000),
	    BENCH_UINT("warmup", &o->c.warmup, 0, 100000),
	    BENCH_STRING("layouts", &o->layouts),
	    BENCH_STRING("layouts-dir", &o->layouts_dir),
	    BENCH_UINT("reps", &o->c.reps, 1, 100000),
	    BENCH_UINT("elements", &o->elements, 16, 1ul << 30),
	    BENCH_UINT("roundtrips", &o->c.roundtrips, 10, 1000000),
	    BENCH_STRING("out", &o->out),
	    BENCH_PARSE("only", parse_only, o),
	    BENCH_FLAG("keep", &o->keep),
	    BENCH_STRING("daemon", &o->c.daemon),
	    BENCH_STRING("trainer", &o->c.trainer),
	    BENCH_OPTIONS_END,
	};
	int r = bench_options_parse(argc, argv, opts);
	if (r > 0) {
		usage(stdout);
		return 0;
	}
	if (r == 0 && o->c.nodes * o->c.trainers > 64) {
		fprintf(stderr, "gradsync-bench: at most 64 trainers in all\n");
		return 2;
	}
	if (r < 0 || optind < argc) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/* ---- The machine -------------------------------------------------------- */

static void cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	snprintf(out, len, "unknown CPU");
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (strncmp(line, "model name", 10) == 0 && colon) {
			snprintf(out, len, "%s", colon + 2);
			out[strcspn(out, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
}

static double loadavg(void)
{
	double l = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &l) != 1)
			l = -1;
		fclose(f);
	}
	return l;
}

static void print_machine(FILE *f, double load_before)
{
	char cpu[256], date[64];
	struct utsname u;
	time_t now = time(NULL);
	strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
	cpu_model(cpu, sizeof(cpu));
	uname(&u);
	fprintf(f, "date:     %s\n", date);
	fprintf(f, "machine:  %s, %ld cores online, %s %s, kernels %s\n", cpu,
		sysconf(_SC_NPROCESSORS_ONLN), u.sysname, u.release, gs_isa_name(gs_isa_active()));
	fprintf(f, "load:     %.2f before, %.2f after (1-minute load average)\n", load_before,
		loadavg());
}

/* ---- Layouts ------------------------------------------------------------ */

static int load_layouts(const struct options *o, struct layout_results *lr, size_t *n)
{
	char *list = strdup(o->layouts);
	char *save = NULL;
	*n = 0;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char path[1024];
		if (*n == MAX_LAYOUTS) {
			fprintf(stderr, "gradsync-bench: at most %d layouts\n", MAX_LAYOUTS);
			break;
		}
		if (strchr(tok, '/') || strstr(tok, ".txt"))
			snprintf(path, sizeof(path), "%s", tok);
		else
			snprintf(path, sizeof(path), "%s/%s.txt", o->layouts_dir, tok);
		if (layout_file_read(path, &lr[*n].l) < 0) {
			free(list);
			return -1;
		}
		(*n)++;
	}
	free(list);
	return *n > 0 ? 0 : -1;
}

/* ---- Summary ------------------------------------------------------------ */

static double gbps(uint64_t bytes, double ms)
{
	return ms > 0 ? (double)bytes / ms / 1e6 : 0;
}

static void summary_sync(FILE *f, FILE *csv, const struct options *o,
			 const struct layout_results *lr, size_t nl)
{
	const struct bench_config *c = &o->c;
	fprintf(f,
		"\nSync time per step, %u node(s) x %u trainer(s), %u steps after %u of warm-up\n"
		"(per step the slowest rank; algbw = fp32 gradient bytes / time)\n\n",
		c->nodes, c->trainers, c->steps, c->warmup);
	fprintf(f, "%-10s %-10s %10s %10s %10s %11s  %s\n", "layout", "system", "median ms",
		"p10 ms", "p90 ms", "algbw GB/s", "baseline / gradsync");
	for (size_t i = 0; i < nl; i++) {
		const struct sync_result *g = &lr[i].sys[0];
		for (int s = 0; s < 1 + GLOO_SYSTEMS; s++) {
			const struct sync_result *r = &lr[i].sys[s];
			if (!r->ok) {
				fprintf(f, "%-10s %-10s   (failed)\n", lr[i].l.name, r->system);
				continue;
			}
			double ratio = g->ok && s > 0 ? r->st.median / g->st.median : 0;
			char rs[32] = "";
			if (ratio > 0)
				snprintf(rs, sizeof(rs), "%.2fx", ratio);
			fprintf(f, "%-10s %-10s %10.2f %10.2f %10.2f %11.3f  %s\n", lr[i].l.name,
				r->system, r->st.median, r->st.p10, r->st.p90,
				gbps(r->bytes, r->st.median), rs);
			if (csv)
				fprintf(csv,
					"sync,%s,%s,%u,%u,%zu,%.6f,%.6f,%.6f,%.6f,%llu,%.6f,%.4f\n",
					lr[i].l.name, r->system, c->nodes, c->trainers, r->st.n,
					r->st.median, r->st.p10, r->st.p90, r->st.min,
					(unsigned long long)r->bytes, gbps(r->bytes, r->st.median),
					ratio);
		}
	}
}

/* Where node 0's daemon spends a step: its worker's pack, all-reduce and
 * unpack, summed over buckets (the metrics' phase counters); the rest of
 * the step is the worker waiting: for the launch, for the vote between
 * nodes, between buckets. Every phase goes to the CSV. */
static void summary_phases(FILE *f, FILE *csv, const struct options *o,
			   const struct layout_results *lr, size_t nl)
{
	static const char *const shown[] = {"pack", "allreduce", "unpack"};
	bool any = false;
	for (size_t i = 0; i < nl; i++)
		any |= lr[i].sys[0].nphases > 0 && lr[i].sys[0].ok;
	if (!any)
		return;
	fprintf(f, "\ngradsync, where a step goes on node 0 (its daemon's phase counters, ms "
		   "per step)\npack includes the sum over the node's trainers; allreduce is the "
		   "exchange between\nnodes, waiting for the slower node included; rest: the "
		   "worker idle (launch, vote\nbetween nodes, control path)\n\n");
	fprintf(f, "%-10s %10s %10s %10s %10s %10s\n", "layout", "step mean", "pack", "allreduce",
		"unpack", "rest");
	for (size_t i = 0; i < nl; i++) {
		const struct sync_result *g = &lr[i].sys[0];
		if (!g->nphases || !g->ok)
			continue;
		double v[3] = {0, 0, 0}, busy = 0;
		for (int p = 0; p < g->nphases; p++) {
			for (int k = 0; k < 3; k++)
				if (strcmp(g->phase[p], shown[k]) == 0)
					v[k] = g->phase_ms[p];
			if (csv)
				fprintf(csv, "phases,%s,%s,%u,%u,%u,%.6f,0,0,0,0,0,%.4f\n",
					lr[i].l.name, g->phase[p], o->c.nodes, o->c.trainers,
					o->c.steps, g->phase_ms[p], g->phase_ms[p] / g->st.median);
		}
		busy = v[0] + v[1] + v[2];
		fprintf(f, "%-10s %10.1f %10.1f %10.1f %10.1f %10.1f\n", lr[i].l.name, g->st.mean,
			v[0], v[1], v[2], g->st.mean - busy);
	}
}

static void summary_kernels(FILE *f, FILE *csv, const struct kernel_result *k, int nk,
			    size_t elements, unsigned reps)
{
	fprintf(f,
		"\nKernels on one fusion buffer of %zu elements (%.0f MiB of fp32), %s, median of "
		"%u\n\n",
		elements, (double)elements * 4 / (1 << 20), gs_isa_name(gs_isa_active()), reps);
	fprintf(f, "%-30s %10s %10s %10s %12s  %s\n", "kernel", "median ms", "p10 ms", "p90 ms",
		"fp32 GB/s", "time / memcpy of the same fp32 bytes");
	for (int i = 0; i < nk; i++) {
		uint64_t bytes = k[i].buffers * elements * sizeof(float);
		fprintf(f, "%-30s %10.3f %10.3f %10.3f %12.2f  %.2f\n", k[i].name, k[i].st.median,
			k[i].st.p10, k[i].st.p90, gbps(bytes, k[i].st.median), k[i].ratio);
		if (csv)
			fprintf(csv, "kernels,%s,%s,0,0,%zu,%.6f,%.6f,%.6f,%.6f,%llu,%.6f,%.4f\n",
				k[i].name, gs_isa_name(gs_isa_active()), k[i].st.n, k[i].st.median,
				k[i].st.p10, k[i].st.p90, k[i].st.min, (unsigned long long)bytes,
				gbps(bytes, k[i].st.median), k[i].ratio);
	}
}

static void summary_control(FILE *f, FILE *csv, const struct control_result *r)
{
	const struct bench_stats *d = &r->daemon, *p = &r->pingpong;
	double ratio = d->median / p->median;
	fprintf(f, "\nControl path, %zu round trips of each, taking turns\n\n", d->n);
	fprintf(f, "%-40s %10s %10s %10s\n", "path", "median us", "p10 us", "p90 us");
	fprintf(f, "%-40s %10.1f %10.1f %10.1f\n", "one-element bucket through gradsyncd",
		d->median * 1e3, d->p10 * 1e3, d->p90 * 1e3);
	fprintf(f, "%-40s %10.1f %10.1f %10.1f\n", "  of which inside the daemon",
		r->inside.median * 1e3, r->inside.p10 * 1e3, r->inside.p90 * 1e3);
	fprintf(f, "%-40s %10.1f %10.1f %10.1f\n", "bare Unix-socket ping-pong (16 bytes)",
		p->median * 1e3, p->p10 * 1e3, p->p90 * 1e3);
	fprintf(f, "ratio gradsync / ping-pong: %.2f\n", ratio);
	if (!csv)
		return;
	fprintf(csv, "control,one-element bucket,gradsync,1,1,%zu,%.6f,%.6f,%.6f,%.6f,4,0,%.4f\n",
		d->n, d->median, d->p10, d->p90, d->min, ratio);
	fprintf(csv, "control,unix-socket round trip,pingpong,1,1,%zu,%.6f,%.6f,%.6f,%.6f,16,0,1\n",
		p->n, p->median, p->p10, p->p90, p->min);
}

/* ---- The chart ------------------------------------------------------------ */

static int chart(const struct options *o, const struct layout_results *lr, size_t nl)
{
	char dat[1100], png[1100], cmd[1200];
	snprintf(dat, sizeof(dat), "%s/steps.dat", o->out);
	snprintf(png, sizeof(png), "%s/steps.png", o->out);
	FILE *d = fopen(dat, "w");
	if (!d)
		return -1;
	for (size_t i = 0; i < nl; i++) {
		fprintf(d, "# %s: system median p10 p90 (ms)\n", lr[i].l.name);
		for (int s = 0; s < 1 + GLOO_SYSTEMS; s++) {
			const struct sync_result *r = &lr[i].sys[s];
			fprintf(d, "%s %.3f %.3f %.3f\n", r->system, r->ok ? r->st.median : 0,
				r->ok ? r->st.p10 : 0, r->ok ? r->st.p90 : 0);
		}
		fprintf(d, "\n\n");
	}
	fclose(d);
	snprintf(cmd, sizeof(cmd), "gnuplot 2>&1");
	FILE *g = popen(cmd, "w");
	if (!g)
		return -1;
	fprintf(g, "set terminal pngcairo size %zu,520 font 'sans,10'\n", 80 + 440 * nl);
	fprintf(g, "set output '%s'\n", png);
	fprintf(g,
		"set multiplot layout 1,%zu title 'Sync time per step, %u node(s) x %u "
		"trainer(s) on one machine: median, bars p10-p90 (lower is better)'\n",
		nl, o->c.nodes, o->c.trainers);
	fprintf(g, "set style fill solid 0.6 border -1\nset boxwidth 0.6\nset grid ytics\n"
		   "set ylabel 'ms per step'\nset yrange [0:*]\nset xrange [-0.6:2.6]\n"
		   "set offsets 0,0,graph 0.12,0\nset tmargin 4\n"
		   "unset key\n");
	for (size_t i = 0; i < nl; i++) {
		fprintf(g, "set title '%s (%.1fM parameters)'\n", lr[i].l.name,
			(double)lr[i].l.total / 1e6);
		fprintf(
		    g,
		    "plot '%s' index %zu using 0:2:($0+1):xtic(1) with boxes lc variable, "
		    "'' index %zu using 0:2:3:4 with yerrorbars lc rgb 'black' pt 0, "
		    "'' index %zu using 0:4:(sprintf('%%.0f ms', $2)) with labels offset 0,0.8\n",
		    dat, i, i, i);
	}
	fprintf(g, "unset multiplot\n");
	return pclose(g) == 0 ? 0 : -1;
}

/* ---- Running ------------------------------------------------------------ */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static FILE *open_out(const char *dir, const char *name, const char *header)
{
	char path[1100];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (!f)
		fprintf(stderr, "gradsync-bench: %s: %s\n", path, strerror(errno));
	else if (header)
		fprintf(f, "%s\n", header);
	return f;
}

static void phase(unsigned *k, unsigned total, const char *what, double t0)
{
	printf("[%u/%u %5.0f s] %s\n", ++*k, total, (gs_now_ms() - t0) / 1e3, what);
	fflush(stdout);
}

static int run_all(struct options *o, struct layout_results *lr, size_t nl, double t0,
		   struct kernel_result *k, int *nk, struct control_result *ctl)
{
	unsigned step = 0, total = o->kernels + o->control + (o->sync ? 2 * (unsigned)nl : 0);
	char what[512];
	int rc = 0;
	if (o->kernels) {
		phase(&step, total, "kernels: pack and unpack against memcpy", t0);
		*nk = bench_kernels(&o->c, o->elements, k);
		rc |= *nk < 0;
	}
	if (o->control) {
		phase(&step, total,
		      "control path: one-element bucket against a Unix-socket ping-pong", t0);
		rc |= bench_control(&o->c, ctl) < 0;
	}
	for (size_t i = 0; o->sync && i < nl; i++) {
		const struct layout_file *l = &lr[i].l;
		snprintf(
		    what, sizeof(what),
		    "gradsync on %.63s: %zu tensors, %.1fM elements, %u daemon(s) x %u trainer(s)",
		    l->name, l->n, (double)l->total / 1e6, o->c.nodes, o->c.trainers);
		phase(&step, total, what, t0);
		rc |= sync_gradsync(&o->c, l, &lr[i].sys[0]) < 0;
		snprintf(what, sizeof(what), "Gloo in-process, DDP-style, on %.63s: %u processes",
			 l->name, o->c.nodes * o->c.trainers);
		phase(&step, total, what, t0);
		rc |= sync_gloo(&o->c, l, &lr[i].sys[1]) < 0;
	}
	return rc ? -1 : 0;
}

static void report(FILE *f, FILE *csv, const struct options *o, const struct layout_results *lr,
		   size_t nl, const struct kernel_result *k, int nk,
		   const struct control_result *ctl, double load_before)
{
	print_machine(f, load_before);
	if (o->sync) {
		summary_sync(f, csv, o, lr, nl);
		summary_phases(f, csv, o, lr, nl);
	}
	if (nk > 0)
		summary_kernels(f, csv, k, nk, o->elements, o->c.reps);
	if (ctl->daemon.n)
		summary_control(f, csv, ctl);
}

int main(int argc, char **argv)
{
	struct options o = {
	    .c = {.nodes = 2,
		  .trainers = 1,
		  .steps = 20,
		  .warmup = 3,
		  .reps = 50,
		  .roundtrips = 2000,
		  .daemon = GS_BENCH_DAEMON,
		  .trainer = GS_BENCH_TRAINER},
	    .layouts = "resnet50,bert-base",
	    .layouts_dir = GS_BENCH_LAYOUTS,
	    .out = "bench-results",
	    .elements = 4194304,
	    .sync = true,
	    .kernels = true,
	    .control = true,
	};
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	/* A child that dies mid-measurement must fail a write, not kill us. */
	signal(SIGPIPE, SIG_IGN);
	static struct layout_results lr[MAX_LAYOUTS];
	size_t nl = 0;
	if (load_layouts(&o, lr, &nl) < 0)
		return 1;
	char tmp[] = "/tmp/gradsync-bench-XXXXXX";
	if ((mkdir(o.out, 0755) < 0 && errno != EEXIST) || !mkdtemp(tmp)) {
		fprintf(stderr, "gradsync-bench: cannot create %s or a temporary directory\n",
			o.out);
		return 1;
	}
	o.c.tmp = tmp;
	o.c.csv = open_out(o.out, "measurements.csv", BENCH_CSV_HEADER);
	FILE *sum = open_out(o.out, "summary.csv",
			     "section,what,system,nodes,trainers,n,median_ms,p10_ms,p90_ms,min_ms,"
			     "bytes,algbw_gbps,ratio");
	FILE *txt = open_out(o.out, "summary.txt", NULL);
	if (!o.c.csv || !sum || !txt)
		return 1;

	double t0 = gs_now_ms(), load = loadavg();
	printf("gradsync-bench: %u node(s) x %u trainer(s), %u steps, layouts %s; results in %s\n",
	       o.c.nodes, o.c.trainers, o.c.steps, o.layouts, o.out);
	struct kernel_result k[KERNEL_RESULTS];
	struct control_result ctl = {0};
	int nk = 0;
	rc = run_all(&o, lr, nl, t0, k, &nk, &ctl);

	fprintf(txt, "command:  ");
	for (int i = 0; i < argc; i++)
		fprintf(txt, "%s%s", argv[i], i + 1 < argc ? " " : "\n");
	report(txt, sum, &o, lr, nl, k, nk, &ctl, load);
	printf("\n");
	report(stdout, NULL, &o, lr, nl, k, nk, &ctl, load);
	fclose(o.c.csv);
	fclose(sum);
	fclose(txt);
	if (o.sync && chart(&o, lr, nl) < 0)
		fprintf(stderr, "gradsync-bench: no chart: gnuplot (with pngcairo) failed or is "
				"missing\n");
	printf("\n%.0f s in all; every measurement in %s/measurements.csv, summary in "
	       "%s/summary.{txt,csv}, chart %s/steps.png\n",
	       (gs_now_ms() - t0) / 1e3, o.out, o.out, o.out);
	if (rc == 0 && !o.keep)
		nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	else if (rc == 0)
		printf("logs kept in %s\n", tmp);
	else
		fprintf(stderr, "gradsync-bench: some measurements failed; logs kept in %s\n", tmp);
	for (size_t i = 0; i < nl; i++)
		layout_file_free(&lr[i].l);
	return rc == 0 ? 0 : 1;
}
