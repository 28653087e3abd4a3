#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static enum gs_log_level max_level = GS_LOG_INFO;
static bool journal;

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

void gs_log(enum gs_log_level level, const char *fmt, ...)
{
	if (level > max_level)
		return;
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
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
