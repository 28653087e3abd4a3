/*
 * The timeline of buckets (gradsyncctl trace start FILE / trace stop): every
 * phase of every bucket as a Chrome-trace "complete" event, one row per
 * bucket and one process per node, as Horovod's timeline shows tensors.
 * Phases: WAIT_FOR_GRADIENTS (from the step's first readiness to the
 * bucket's launch), QUEUE (launched, waiting for the worker and, with
 * several nodes on the CUDA backend, for every node's vote to go on), then
 * PACK, ALLREDUCE and UNPACK for each chunk that goes through the fusion
 * buffer (or one REDUCE for the bucket, from a backend that does not mark
 * them). The host backend's vote rides in a chunk's data, so there the
 * wait for the other nodes shows in the first chunk's ALLREDUCE.
 *
 * The file is opened by gradsyncctl, as the user who asked, and passed to
 * the daemon as a descriptor: the daemon writes where that user may write
 * and nowhere else, whatever its own sandbox allows. The worker thread
 * appends events to a buffer; the loop thread writes it out every 250 ms.
 *
 * Whether or not a trace runs, the time spent in each phase is summed for
 * the metrics.
 */
#ifndef GS_TRACE_H
#define GS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

enum gs_phase {
	GS_PHASE_WAIT,
	GS_PHASE_QUEUE,
	GS_PHASE_PACK,
	GS_PHASE_ALLREDUCE,
	GS_PHASE_UNPACK,
	GS_PHASE_REDUCE, /* pack, all-reduce and unpack of a backend that does not mark them */
	GS_PHASES
};

struct gs_trace_figures {
	bool active;
	uint64_t events;  /* complete events written or buffered */
	uint64_t dropped; /* events lost because the file did not keep up */
	uint64_t bytes;   /* written to the file so far */
	char path[256];   /* the file, as the daemon sees it */
	char error[160];  /* why writing stopped early, if it did */
};

struct gs_trace *gs_trace_create(uv_loop_t *loop);
/* Ends a running trace (completing its file) and stops the flush timer;
 * the loop may end after this. */
void gs_trace_close(struct gs_trace *t);
/* Frees it, after the loop has ended. Safe on NULL. */
void gs_trace_destroy(struct gs_trace *t);

/* The phase's name in the file and, lower case, in the metrics. */
const char *gs_phase_name(enum gs_phase p);
const char *gs_phase_metric(enum gs_phase p);

/* Who asked for a trace: its buckets are those of jobs that user may see
 * (job.h, gs_job_visible_to), all of them when sees_all. */
struct gs_trace_viewer {
	uid_t uid;
	bool sees_all;
};

/* Starts writing to fd (a regular file open for writing), taking it over
 * on success. who names the requester for the log; node and host name the
 * trace's process. Returns 0, or a GS_E* code with why. */
int gs_trace_begin(struct gs_trace *t, int fd, uint32_t node, const char *host,
		   const char *who, struct gs_trace_viewer viewer, char *why, size_t n);
/* Completes the file and closes it; *out gets its figures. Returns 0,
 * GS_ESTATE when no trace runs, or GS_EREFUSED (why says so) when the
 * trace is another user's and the asker does not see all. */
int gs_trace_end(struct gs_trace *t, struct gs_trace_viewer asker,
		 struct gs_trace_figures *out, char *why, size_t n);
void gs_trace_get_figures(struct gs_trace *t, struct gs_trace_figures *out);

/* Seconds spent in each phase, and buckets reduced, since the start. */
void gs_trace_totals(const struct gs_trace *t, double seconds[GS_PHASES],
		     uint64_t *buckets);

/* One bucket of one step, as its events name it: the engine fills one in
 * when it launches the bucket. */
struct gs_trace_bucket {
	uint64_t step;     /* as the trainers number it */
	uint32_t bucket;   /* its row in the file */
	uint64_t elements; /* of the whole bucket */
	uint64_t chunk;    /* elements of a chunk (the fusion buffer's); 0: one chunk */
	uid_t owner;       /* the job's user: a viewer who may see its jobs sees it */
};

/* The worker thread's events; each does nothing when t is NULL. The
 * bucket reached the worker at `now`: it waited for gradients from ready
 * (the step's first readiness; 0: unknown) until its launch, then queued
 * until now. Nothing for a bucket never launched (launch 0). */
void gs_trace_bucket_start(struct gs_trace *t, const struct gs_trace_bucket *b,
			   uint64_t ready, uint64_t launch, uint64_t now);
/* A chunk of len elements from element first went through; ns[] are when
 * pack, all-reduce and unpack began and when unpack ended (0 for a phase
 * that did not run). */
void gs_trace_chunk(struct gs_trace *t, const struct gs_trace_bucket *b, uint64_t first,
		    uint64_t len, const uint64_t ns[4]);
/* A bucket reduced by a backend that does not mark its phases: one REDUCE
 * event from start to end; reduced says whether it succeeded. */
void gs_trace_whole(struct gs_trace *t, const struct gs_trace_bucket *b, uint64_t start,
		    uint64_t end, bool reduced);

#endif
