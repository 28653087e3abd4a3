#include "support/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "support/log.h"

#define FLUSH_MS 250
/* Past this much unwritten text, events are dropped (and counted) rather
 * than let a slow file grow the daemon without bound. */
#define MAX_PENDING (16u << 20)

struct gs_trace {
	uv_timer_t timer;
	atomic_bool active;

	/* Guarded by lock: the worker appends, the loop takes. */
	pthread_mutex_t lock;
	char *buf;
	size_t len, cap;
	uint64_t events, dropped;
	uint8_t *named; /* per bucket: its row has a name */
	size_t nnamed;
	uint32_t node;
	int64_t wall_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC */
	struct gs_trace_viewer viewer; /* set before active, read after it */

	/* Loop thread only. */
	int fd;
	uint64_t bytes;
	char path[256];
	char error[160];

	/* Any thread. */
	_Atomic uint64_t phase_ns[GS_PHASES];
	_Atomic uint64_t buckets;
};

static const char *const names[GS_PHASES] = {
	"WAIT_FOR_GRADIENTS", "QUEUE", "PACK", "ALLREDUCE", "UNPACK", "REDUCE",
};
static const char *const metric_names[GS_PHASES] = {
	"wait_for_gradients", "queue", "pack", "allreduce", "unpack", "reduce",
};

const char *gs_phase_name(enum gs_phase p)
{
	return p < GS_PHASES ? names[p] : "?";
}

const char *gs_phase_metric(enum gs_phase p)
{
	return p < GS_PHASES ? metric_names[p] : "?";
}

struct gs_trace *gs_trace_create(uv_loop_t *loop)
{
	struct gs_trace *t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	pthread_mutex_init(&t->lock, NULL);
	t->fd = -1;
	uv_timer_init(loop, &t->timer);
	t->timer.data = t;
	return t;
}

/* ---- Appending events (worker thread) ------------------------------------ */

/* Appends text, growing the buffer; false when over the limit. */
static bool append(struct gs_trace *t, const char *text, size_t n)
{
	if (t->len + n > t->cap) {
		size_t cap = t->cap ? t->cap : 65536;
		while (cap < t->len + n)
			cap *= 2;
		if (cap > MAX_PENDING)
			return false;
		char *b = realloc(t->buf, cap);
		if (!b)
			return false;
		t->buf = b;
		t->cap = cap;
	}
	memcpy(t->buf + t->len, text, n);
	t->len += n;
	return true;
}

static void name_row(struct gs_trace *t, uint32_t bucket)
{
	if (bucket >= t->nnamed) {
		size_t n = bucket + 1 > t->nnamed * 2 ? bucket + 1 : t->nnamed * 2;
		uint8_t *named = realloc(t->named, n);
		if (!named)
			return;
		memset(named + t->nnamed, 0, n - t->nnamed);
		t->named = named;
		t->nnamed = n;
	}
	if (t->named[bucket])
		return;
	char line[256];
	int k = snprintf(line, sizeof(line),
			 ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"name\":\"bucket %u\"}}"
			 ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
			 t->node, bucket, bucket, t->node, bucket, bucket);
	if (append(t, line, (size_t)k))
		t->named[bucket] = 1;
}

struct event {
	enum gs_phase phase;
	uint64_t step;
	uint32_t bucket;
	uint64_t chunk, chunks, elements;
	uint64_t start_ns, end_ns;
};

static void add_event(struct gs_trace *t, const struct event *e)
{
	pthread_mutex_lock(&t->lock);
	if (!atomic_load(&t->active))
		goto out;
	name_row(t, e->bucket);
	/* Microseconds of the wall clock, so that the files of several nodes
	 * line up when they are loaded together. */
	int64_t ts = (int64_t)e->start_ns + t->wall_offset_ns;
	uint64_t dur = e->end_ns - e->start_ns;
	char line[384];
	int k = snprintf(line, sizeof(line),
			 ",\n{\"name\":\"%s\",\"cat\":\"bucket\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,"
			 "\"ts\":%" PRId64 ".%03d,\"dur\":%" PRIu64 ".%03d,"
			 "\"args\":{\"step\":%" PRIu64 ",\"bucket\":%u,\"chunk\":%" PRIu64
			 ",\"chunks\":%" PRIu64 ",\"elements\":%" PRIu64 "}}",
			 names[e->phase], t->node, e->bucket, ts / 1000, (int)(ts % 1000),
			 dur / 1000, (int)(dur % 1000), e->step, e->bucket, e->chunk, e->chunks,
			 e->elements);
	if (append(t, line, (size_t)k))
		t->events++;
	else
		t->dropped++;
out:
	pthread_mutex_unlock(&t->lock);
}

/* Whether the bucket's events go into the trace: the metrics' totals
 * count every job's, the file only those of jobs its viewer may see. */
static bool shown(const struct gs_trace *t, const struct gs_trace_bucket *b)
{
	return t->viewer.sees_all || b->owner == t->viewer.uid;
}

static void record(struct gs_trace *t, const struct gs_trace_bucket *b, const struct event *e)
{
	atomic_fetch_add_explicit(&t->phase_ns[e->phase], e->end_ns - e->start_ns,
				  memory_order_relaxed);
	if (atomic_load_explicit(&t->active, memory_order_acquire) && shown(t, b))
		add_event(t, e);
}

static uint64_t chunks_of(const struct gs_trace_bucket *b)
{
	return b->chunk ? (b->elements + b->chunk - 1) / b->chunk : 1;
}

void gs_trace_bucket_start(struct gs_trace *t, const struct gs_trace_bucket *b,
			   uint64_t ready, uint64_t launch, uint64_t now)
{
	/* A run that only votes to abort was never launched for real. */
	if (!t || launch == 0)
		return;
	struct event e = { GS_PHASE_WAIT, b->step, b->bucket, 0, chunks_of(b), b->elements, 0,
			   launch };
	e.start_ns = ready && ready < launch ? ready : launch;
	record(t, b, &e);
	e.phase = GS_PHASE_QUEUE;
	e.start_ns = launch;
	e.end_ns = now > launch ? now : launch;
	record(t, b, &e);
}

void gs_trace_chunk(struct gs_trace *t, const struct gs_trace_bucket *b, uint64_t first,
		    uint64_t len, const uint64_t ns[4])
{
	if (!t)
		return;
	uint64_t f = b->chunk;
	uint64_t chunks = chunks_of(b);
	struct event e = { GS_PHASE_PACK, b->step, b->bucket, f ? first / f : 0, chunks, len, 0,
			   0 };
	for (int p = 0; p < 3 && ns[p] && ns[p + 1]; p++) {
		e.phase = (enum gs_phase)(GS_PHASE_PACK + p);
		e.start_ns = ns[p];
		e.end_ns = ns[p + 1];
		record(t, b, &e);
	}
	if (ns[3] && e.chunk + 1 == chunks)
		atomic_fetch_add_explicit(&t->buckets, 1, memory_order_relaxed);
}

void gs_trace_whole(struct gs_trace *t, const struct gs_trace_bucket *b, uint64_t start,
		    uint64_t end, bool reduced)
{
	if (!t)
		return;
	struct event e = { GS_PHASE_REDUCE, b->step, b->bucket, 0, chunks_of(b), b->elements,
			   start, end > start ? end : start };
	record(t, b, &e);
	if (reduced)
		atomic_fetch_add_explicit(&t->buckets, 1, memory_order_relaxed);
}

void gs_trace_totals(const struct gs_trace *t, double seconds[GS_PHASES], uint64_t *buckets)
{
	for (int p = 0; p < GS_PHASES; p++)
		seconds[p] = t ? (double)atomic_load(&t->phase_ns[p]) / 1e9 : 0;
	*buckets = t ? atomic_load(&t->buckets) : 0;
}

/* ---- Writing the file (loop thread) --------------------------------------- */

static int write_all(struct gs_trace *t, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(t->fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			snprintf(t->error, sizeof(t->error), "writing the trace failed: %s",
				 strerror(errno));
			return -errno;
		}
		t->bytes += (uint64_t)w;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Writes what the worker has appended; the buffer is swapped out under the
 * lock, so the worker never waits for the file. */
static int flush(struct gs_trace *t)
{
	pthread_mutex_lock(&t->lock);
	char *buf = t->buf;
	size_t len = t->len;
	t->buf = NULL;
	t->len = t->cap = 0;
	pthread_mutex_unlock(&t->lock);
	int r = len ? write_all(t, buf, len) : 0;
	free(buf);
	return r;
}

static void figures(struct gs_trace *t, struct gs_trace_figures *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&t->lock);
	out->events = t->events;
	out->dropped = t->dropped;
	pthread_mutex_unlock(&t->lock);
	out->active = atomic_load(&t->active);
	out->bytes = t->bytes;
	snprintf(out->path, sizeof(out->path), "%s", t->path);
	snprintf(out->error, sizeof(out->error), "%s", t->error);
}

void gs_trace_get_figures(struct gs_trace *t, struct gs_trace_figures *out)
{
	figures(t, out);
}

/* Ends the trace: no more events, the rest written, the JSON closed. */
static void finish(struct gs_trace *t)
{
	pthread_mutex_lock(&t->lock);
	atomic_store(&t->active, false);
	pthread_mutex_unlock(&t->lock);
	uv_timer_stop(&t->timer);
	if (flush(t) == 0)
		write_all(t, "\n]\n", 3);
	if (close(t->fd) < 0 && !t->error[0])
		snprintf(t->error, sizeof(t->error), "closing the trace failed: %s",
			 strerror(errno));
	t->fd = -1;
}

static void on_flush(uv_timer_t *timer)
{
	struct gs_trace *t = timer->data;
	if (flush(t) < 0) {
		gs_warn("trace stopped: %s", t->error);
		finish(t);
	}
}

static int check_file(int fd, char *why, size_t n)
{
	struct stat st;
	int mode = fcntl(fd, F_GETFL);
	if (fstat(fd, &st) < 0 || mode < 0) {
		snprintf(why, n, "the trace file's descriptor is unusable: %s", strerror(errno));
		return GS_EINVAL;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, n, "the trace file must be a regular file");
		return GS_EINVAL;
	}
	if ((mode & O_ACCMODE) != O_WRONLY && (mode & O_ACCMODE) != O_RDWR) {
		snprintf(why, n, "the trace file is not open for writing");
		return GS_EINVAL;
	}
	return GS_OK;
}

static void json_escape(const char *s, char *out, size_t n)
{
	size_t k = 0;
	for (; *s && k + 7 < n; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			k += (size_t)snprintf(out + k, n - k, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			k += (size_t)snprintf(out + k, n - k, "\\u%04x", ch);
		else
			out[k++] = (char)ch;
	}
	out[k] = '\0';
}

static int64_t clock_ns(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The JSON array format of the Trace Event Format: "[" and events; the
 * closing "]" is written at the end (viewers also load a file cut short). */
static int write_header(struct gs_trace *t, const char *host)
{
	char esc[200], head[512];
	json_escape(host, esc, sizeof(esc));
	int k = snprintf(head, sizeof(head),
			 "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"args\":{\"name\":\"gradsyncd node %u (%s)\"}}"
			 ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"args\":{\"sort_index\":%u}}",
			 t->node, t->node, esc, t->node, t->node);
	return write_all(t, head, (size_t)k);
}

int gs_trace_begin(struct gs_trace *t, int fd, uint32_t node, const char *host,
		   const char *who, struct gs_trace_viewer viewer, char *why, size_t n)
{
	if (atomic_load(&t->active)) {
		snprintf(why, n, "a trace is already being written to %s; stop it first (gradsyncctl trace stop)",
			 t->path);
		return GS_ESTATE;
	}
	int r = check_file(fd, why, n);
	if (r != GS_OK)
		return r;
	/* The client leaves the file as it was until the trace is accepted. */
	if (ftruncate(fd, 0) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
		snprintf(why, n, "cannot truncate the trace file: %s", strerror(errno));
		return GS_ESYSTEM;
	}
	char link[64];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t len = readlink(link, t->path, sizeof(t->path) - 1);
	t->path[len > 0 ? len : 0] = '\0';
	t->fd = fd;
	t->bytes = 0;
	t->error[0] = '\0';
	t->node = node;
	if (write_header(t, host) < 0) {
		snprintf(why, n, "%s", t->error);
		t->fd = -1;
		return GS_ESYSTEM;
	}
	pthread_mutex_lock(&t->lock);
	t->events = t->dropped = 0;
	if (t->named) /* NULL until the first bucket is named */
		memset(t->named, 0, t->nnamed);
	t->wall_offset_ns = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
	t->viewer = viewer;
	atomic_store_explicit(&t->active, true, memory_order_release);
	pthread_mutex_unlock(&t->lock);
	uv_timer_start(&t->timer, on_flush, FLUSH_MS, FLUSH_MS);
	gs_info("trace started by %s: writing bucket phases to %s", who,
		t->path[0] ? t->path : "(unnamed file)");
	return GS_OK;
}

int gs_trace_end(struct gs_trace *t, struct gs_trace_viewer asker,
		 struct gs_trace_figures *out, char *why, size_t n)
{
	if ((t->fd >= 0 || atomic_load(&t->active)) && !asker.sees_all &&
	    asker.uid != t->viewer.uid) {
		snprintf(why, n, "the trace being written was started by another user");
		return GS_EREFUSED;
	}
	/* A trace that ended on a write error still reports once. */
	if (t->fd < 0 && !atomic_load(&t->active)) {
		figures(t, out);
		if (!t->error[0])
			return GS_ESTATE;
		t->error[0] = '\0';
		return GS_OK;
	}
	finish(t);
	figures(t, out);
	gs_info("trace of %s stopped: %" PRIu64 " events, %" PRIu64 " bytes%s", t->path,
		out->events, out->bytes, out->dropped ? ", some events dropped" : "");
	return GS_OK;
}

void gs_trace_close(struct gs_trace *t)
{
	if (!t)
		return;
	if (t->fd >= 0) {
		finish(t);
		gs_info("trace of %s completed at shutdown", t->path);
	}
	uv_close((uv_handle_t *)&t->timer, NULL);
}

void gs_trace_destroy(struct gs_trace *t)
{
	if (!t)
		return;
	pthread_mutex_destroy(&t->lock);
	free(t->buf);
	free(t->named);
	free(t);
}
