/*
 * Logging to stderr with levels. Under systemd (stderr is the journal
 * stream JOURNAL_STREAM names) each line starts with a "<N>" syslog
 * priority prefix that journald stores as the message's priority;
 * otherwise with a timestamp. Every byte of a line outside printable ASCII
 * is escaped (\xNN, common/escape.h), and each call site logs at most 100
 * lines in 10 s, the rest summed up in one line: no client can forge
 * lines, put raw bytes in the log, or flood it.
 * Safe from any thread.
 */
#ifndef GS_LOG_H
#define GS_LOG_H

enum gs_log_level {
	GS_LOG_ERROR = 3,
	GS_LOG_WARN = 4,
	GS_LOG_INFO = 6,
	GS_LOG_DEBUG = 7,
};

#include <stdarg.h>
#include <stdint.h>

void gs_log_init(enum gs_log_level level);

/* Each call site logs at most `lines` lines per window of window_ms (by
 * default GS_LOG_BURST in GS_LOG_WINDOW_MS). */
#define GS_LOG_BURST 100
#define GS_LOG_WINDOW_MS 10000
void gs_log_limit(unsigned lines, uint64_t window_ms);
void gs_log(enum gs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void gs_vlog(enum gs_log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

/* Logs the summary of every call site whose window has passed with lines
 * left out (called now and then, so that a flood that stopped is told). */
void gs_log_flush(void);

/* A group of lines that strangers can cause whatever the call site (what
 * unauthenticated connections to the rendezvous provoke): at most
 * GS_LOG_GROUP_BURST of them every GS_LOG_GROUP_WINDOW_MS together, on top
 * of each site's own limit; the ones held back are counted and the count
 * logged once the window has ended. Zero-initialised but for what; used
 * from one thread. */
#define GS_LOG_GROUP_BURST 10
#define GS_LOG_GROUP_WINDOW_MS 5000
struct gs_log_window {
	uint64_t start_ns; /* when it began; 0: none yet */
	unsigned lines;    /* logged in it */
	unsigned long long held; /* held back in it */
};
struct gs_log_group {
	const char *what; /* "unauthenticated connections": for the count's line */
	struct gs_log_window window;
};

/* Logs the line unless GS_LOG_GROUP_BURST lines of the group were logged
 * in this window; then counts it. */
void gs_log_grouped(struct gs_log_group *g, enum gs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void gs_vlog_grouped(struct gs_log_group *g, enum gs_log_level level, const char *fmt,
		     va_list ap) __attribute__((format(printf, 3, 0)));
/* Logs the count of a window that has ended (call it every
 * GS_LOG_GROUP_WINDOW_MS or so, so that the last count of a flood is told). */
void gs_log_group_flush(struct gs_log_group *g, enum gs_log_level level);

#define gs_error(...) gs_log(GS_LOG_ERROR, __VA_ARGS__)
#define gs_warn(...) gs_log(GS_LOG_WARN, __VA_ARGS__)
#define gs_info(...) gs_log(GS_LOG_INFO, __VA_ARGS__)
#define gs_debug(...) gs_log(GS_LOG_DEBUG, __VA_ARGS__)

#endif
