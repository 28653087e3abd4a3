#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Each call site (its format string) may log this many lines per window;
 * more are counted and summed up in one line when the window has passed,
 * so a client that provokes the same warning in a loop cannot flood the
 * journal or keep the loop busy writing it. */
#define LOG_SITES 64

struct log_site {
	const char *fmt;
	uint64_t window_start;
	unsigned lines;
	unsigned long long suppressed;
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
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
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

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Control characters and backslashes as \xNN and \\: text from clients
 * (job ids, tensor names, peers' messages) can then never forge a line of
 * its own or send escape codes to a terminal. */
static void escape(const char *in, char *out, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t k = 0;
	for (const unsigned char *p = (const unsigned char *)in; *p && k + 5 < n; p++) {
		if (*p == '\\') {
			out[k++] = '\\';
			out[k++] = '\\';
		} else if (*p < 0x20 || *p == 0x7f) {
			out[k++] = '\\';
			out[k++] = 'x';
			out[k++] = hex[*p >> 4];
			out[k++] = hex[*p & 15];
		} else {
			out[k++] = (char)*p;
		}
	}
	out[k] = '\0';
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

/* Under lock: the line that sums up a site's window, if it dropped any. */
static void close_window(struct log_site *s)
{
	if (s->suppressed > 0) {
		char line[256];
		snprintf(line, sizeof(line), "%llu more messages like \"%.160s\" were not logged in the last %g s",
			 s->suppressed, s->fmt, (double)window_ns / 1e9);
		char safe[sizeof(line) * 2];
		escape(line, safe, sizeof(safe));
		emit(s->level, safe);
	}
	s->lines = 0;
	s->suppressed = 0;
}

/* Under lock: whether this call site may log now. */
static bool admit(const char *fmt, enum gs_log_level level, uint64_t now)
{
	struct log_site *s = NULL, *oldest = &sites[0];
	for (size_t i = 0; i < LOG_SITES && !s; i++) {
		if (sites[i].fmt == fmt)
			s = &sites[i];
		else if (sites[i].window_start < oldest->window_start)
			oldest = &sites[i];
	}
	if (!s) {
		s = oldest;
		if (s->fmt)
			close_window(s);
		*s = (struct log_site){ fmt, now, 0, 0, level };
	}
	if (now - s->window_start >= window_ns) {
		close_window(s);
		s->window_start = now;
	}
	if (s->lines >= burst) {
		s->suppressed++;
		return false;
	}
	s->lines++;
	return true;
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
	char line[2048], safe[4096];
	vsnprintf(line, sizeof(line), fmt, ap);
	escape(line, safe, sizeof(safe));
	pthread_mutex_lock(&lock);
	if (admit(fmt, level, now_ns()))
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
	uint64_t now = now_ns();
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < LOG_SITES; i++) {
		struct log_site *s = &sites[i];
		if (s->fmt && s->suppressed > 0 && now - s->window_start >= window_ns) {
			close_window(s);
			s->window_start = now;
		}
	}
	pthread_mutex_unlock(&lock);
}

/* ---- Groups of lines -------------------------------------------------- */

/* Once the group's window has ended, says how many lines it held back
 * and starts a new one. */
static void roll(struct gs_log_group *g, enum gs_log_level level)
{
	uint64_t now = now_ns() / 1000000u;
	if (g->window_ms && now - g->window_ms < GS_LOG_GROUP_WINDOW_MS)
		return;
	if (g->held)
		gs_log(level, "%u more lines about %s held back in %.1f s (at most %d every %d s are logged)",
		       g->held, g->what, (double)(now - g->window_ms) / 1000.0, GS_LOG_GROUP_BURST,
		       GS_LOG_GROUP_WINDOW_MS / 1000);
	g->window_ms = now;
	g->logged = g->held = 0;
}

void gs_vlog_grouped(struct gs_log_group *g, enum gs_log_level level, const char *fmt,
		     va_list ap)
{
	roll(g, level);
	if (g->logged >= GS_LOG_GROUP_BURST) {
		g->held++;
		return;
	}
	g->logged++;
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
