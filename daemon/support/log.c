#include "support/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "escape.h"
#include "number.h"

/* Each call site (its format string) may log this many lines per window;
 * more are counted and summed up in one line when the window has passed,
 * so a client that provokes the same warning in a loop cannot flood the
 * journal or keep the loop busy writing it. */
#define LOG_SITES 64

struct log_site {
	const char *fmt;
	struct gs_log_window window;
	enum gs_log_level level;
};

static enum gs_log_level max_level = GS_LOG_INFO;
static bool journal;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_site sites[LOG_SITES];
static unsigned burst = GS_LOG_BURST;
static uint64_t window_ns = GS_LOG_WINDOW_MS * 1000000ull;

/* systemd sets JOURNAL_STREAM to the device and inode of the journal
 * stream it gave us; stderr is still that stream unless redirected since
 * (then the variable was inherited, and prefixes would be noise). */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM"), *colon;
	uint64_t dev, ino;
	struct stat st;
	if (!e || gs_parse_uint_prefix(e, &colon, 0, UINT64_MAX, &dev) < 0 || *colon != ':' ||
	    gs_parse_uint(colon + 1, 0, UINT64_MAX, &ino) < 0 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

void gs_log_init(enum gs_log_level level)
{
	max_level = level;
	journal = stderr_is_journal();
}

static const char *level_name(enum gs_log_level level)
{
	switch (level) {
	case GS_LOG_ERROR:
		return "error";
	case GS_LOG_WARN:
		return "warning";
	case GS_LOG_INFO:
		return "info";
	default:
		return "debug";
	}
}

static void emit(enum gs_log_level level, const char *line)
{
	if (journal) {
		/* journald adds its own timestamps. */
		fprintf(stderr, "<%d>%s: %s\n", (int)level, level_name(level), line);
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	fprintf(stderr, "%02d:%02d:%02d.%03ld gradsyncd %s: %s\n", tm.tm_hour,
		tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_name(level), line);
}

/* ---- Windows of lines ------------------------------------------------- */

/* Starts a new window once span_ns has passed since this one began (or
 * none has); returns how many lines the window that ended held back. */
static unsigned long long roll_window(struct gs_log_window *w, uint64_t span_ns, uint64_t now)
{
	if (w->start_ns && now - w->start_ns < span_ns)
		return 0;
	unsigned long long held = w->held;
	*w = (struct gs_log_window){ now, 0, 0 };
	return held;
}

/* Whether one more line fits the window's burst; if not it is counted. */
static bool take_line(struct gs_log_window *w, unsigned lines)
{
	if (w->lines >= lines) {
		w->held++;
		return false;
	}
	w->lines++;
	return true;
}

/* ---- Call sites ------------------------------------------------------- */

/* Under lock: the line that sums up a site's window, if it held any back. */
static void tell_held(const struct log_site *s, unsigned long long held)
{
	if (held == 0)
		return;
	char line[256];
	snprintf(line, sizeof(line), "%llu more messages like \"%.160s\" were not logged in the last %g s",
		 held, s->fmt, (double)window_ns / 1e9);
	char safe[sizeof(line) * 2];
	emit(s->level, gs_escape(line, safe, sizeof(safe)));
}

/* Under lock: whether this call site may log now. */
static bool admit(const char *fmt, enum gs_log_level level, uint64_t now)
{
	struct log_site *s = NULL, *oldest = &sites[0];
	for (size_t i = 0; i < LOG_SITES && !s; i++) {
		if (sites[i].fmt == fmt)
			s = &sites[i];
		else if (sites[i].window.start_ns < oldest->window.start_ns)
			oldest = &sites[i];
	}
	if (!s) {
		/* The least recent site makes room, telling what it held. */
		s = oldest;
		if (s->fmt)
			tell_held(s, s->window.held);
		*s = (struct log_site){ fmt, { now, 0, 0 }, level };
	}
	tell_held(s, roll_window(&s->window, window_ns, now));
	return take_line(&s->window, burst);
}

void gs_log_limit(unsigned lines, uint64_t window_ms)
{
	pthread_mutex_lock(&lock);
	burst = lines;
	window_ns = window_ms * 1000000ull;
	pthread_mutex_unlock(&lock);
}

void gs_vlog(enum gs_log_level level, const char *fmt, va_list ap)
{
	if (level > max_level)
		return;
	/* The whole line is escaped, whatever its arguments hold: text from
	 * clients and other nodes (job ids, tensor names, hosts, peers'
	 * messages) can then never forge a line of its own, send escape codes
	 * to a terminal, or put non-ASCII bytes in the journal. */
	char line[2048], safe[4096];
	vsnprintf(line, sizeof(line), fmt, ap);
	gs_escape(line, safe, sizeof(safe));
	pthread_mutex_lock(&lock);
	if (admit(fmt, level, gs_now_ns()))
		emit(level, safe);
	pthread_mutex_unlock(&lock);
}

void gs_log(enum gs_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gs_vlog(level, fmt, ap);
	va_end(ap);
}

void gs_log_flush(void)
{
	uint64_t now = gs_now_ns();
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < LOG_SITES; i++)
		if (sites[i].fmt)
			tell_held(&sites[i], roll_window(&sites[i].window, window_ns, now));
	pthread_mutex_unlock(&lock);
}

/* ---- Groups of lines -------------------------------------------------- */

/* Once the group's window has ended, says how many lines it held back
 * and starts a new one. */
static void roll(struct gs_log_group *g, enum gs_log_level level)
{
	uint64_t now = gs_now_ns(), began = g->window.start_ns;
	unsigned long long held = roll_window(&g->window, GS_LOG_GROUP_WINDOW_MS * 1000000ull, now);
	if (held)
		gs_log(level, "%llu more lines about %s held back in %.1f s (at most %d every %d s are logged)",
		       held, g->what, (double)(now - began) / 1e9, GS_LOG_GROUP_BURST,
		       GS_LOG_GROUP_WINDOW_MS / 1000);
}

void gs_vlog_grouped(struct gs_log_group *g, enum gs_log_level level, const char *fmt,
		     va_list ap)
{
	roll(g, level);
	if (take_line(&g->window, GS_LOG_GROUP_BURST))
		gs_vlog(level, fmt, ap);
}

void gs_log_grouped(struct gs_log_group *g, enum gs_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gs_vlog_grouped(g, level, fmt, ap);
	va_end(ap);
}

void gs_log_group_flush(struct gs_log_group *g, enum gs_log_level level)
{
	roll(g, level);
}
