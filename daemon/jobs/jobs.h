/*
 * The node's jobs: every job this daemon serves at once, each defined by
 * its first trainer (engine/job_view.h) and each with its own settings,
 * backend (fusion buffers, communicators), worker thread, step engine and
 * group of nodes, so that nothing that happens to one job reaches
 * another. A job of several nodes whose trainers have all gone keeps its
 * group for --job-linger seconds: trainers of the same id and shape that
 * come back meanwhile resume without a new rendezvous. A job of one node
 * has no group to keep and goes at once, and a lingering job gives way
 * to a new job that finds no place free.
 */
#ifndef GS_JOBS_H
#define GS_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "cluster/cluster.h"
#include "engine/job.h"
#include "engine/stats.h"
#include "support/settings.h"
#include "support/worker.h"

struct gs_jobs;
struct gs_job_entry;

/* What the table is given by the daemon, for its whole life. */
struct gs_jobs_env {
	uv_loop_t *loop;
	const struct gs_settings *settings; /* the node's */
	struct gs_server *server;           /* the local listener (cluster parts) */
	struct gs_node_port *port;          /* the rendezvous of jobs whose node 0 this is */
	struct gs_trace *trace;
	/* Opens the backend a job's settings ask for (NULL with why). */
	struct gs_backend *(*open_backend)(const struct gs_settings *job, char *why, size_t n);
	/* The engine's buffer hooks (struct gs_engine_env). */
	bool (*buffer_takes_fd)(const Gradsync__Buffer *m);
	int (*parse_buffer)(const Gradsync__Buffer *m, uint32_t rank, int fd,
			    struct gs_buffer_desc *out, char *err, size_t errlen);
	bool (*memory_lost)(const void *addr);
	/* Sends trainer t its Welcome: its job has joined its nodes. */
	void (*welcome)(struct gs_trainer *t, const struct gs_job_entry *e);
};

enum gs_entry_state {
	GS_ENTRY_JOINING,   /* its group is being built: trainers wait for Welcome */
	GS_ENTRY_READY,     /* serving steps */
	GS_ENTRY_LINGERING, /* no trainer: the group is kept for --job-linger */
	GS_ENTRY_CLOSING,   /* going: no longer found by its id */
	GS_ENTRY_STATES
};
/* Each state's name, as status shows it (a ready job shows its job's
 * own, gs_job_state): each fits the char[32] of the public API's struct
 * gs_job_status (tests/unit/test-state-names.c checks). */
extern const char *const gs_entry_state_names[GS_ENTRY_STATES];

struct gs_job_entry {
	struct gs_jobs *table;
	struct gs_job_entry *next;
	enum gs_entry_state state;
	struct gs_settings settings; /* the node's, with the job's fields */
	struct gs_backend *backend;
	struct gs_worker worker;
	bool worker_started;
	struct gs_job job;
	struct gs_cluster cluster;
	bool cluster_started;
	bool welcomed[GS_MAX_LOCAL]; /* by local rank: Welcome sent */
	uv_timer_t linger_timer;     /* ends a lingering job; also the idle check */
	uv_timer_t free_timer;       /* frees the entry once its handles closed */
	uint64_t groups_built;       /* times its group was built: 1 unless it failed */
	uint64_t created_ns;
};

struct gs_jobs {
	struct gs_jobs_env env;
	struct gs_job_entry *head; /* every job found by its id, oldest first */
	unsigned count;
	/* Jobs whose nodes could not join: found by no Hello, each closes once
	 * its trainers have been told (it is idle); listed so that a shutdown
	 * closes them too, rather than wait for them. */
	struct gs_job_entry *refused;
	bool stopping;
	/* Steps of the jobs that have gone, so that the node's totals only
	 * ever grow. */
	struct gs_stats ended;
	uint64_t ended_wire_bytes[4]; /* their bytes reduced, by wire dtype */
	uint64_t groups_built;        /* by every job: joins of a rendezvous */
};

void gs_jobs_init(struct gs_jobs *t, const struct gs_jobs_env *env);

/* A trainer said Hello: finds its job or makes it (its Hello defines the
 * job), and attaches it. Returns the trainer, welcomed now or once the
 * job has joined its nodes; or NULL, having failed the client with an
 * Error that names what was refused. */
struct gs_trainer *gs_jobs_attach(struct gs_jobs *t, const struct gs_client *c,
				  const Gradsync__Hello *h);
/* Sends tr its Welcome if its job has joined its nodes (else that comes
 * when it has). After gs_jobs_attach, once the client is a trainer. */
void gs_jobs_welcome(struct gs_jobs *t, struct gs_trainer *tr);
/* The trainer's client is gone. */
void gs_jobs_detach(struct gs_jobs *t, struct gs_trainer *tr);

/* The job entry a trainer belongs to. */
struct gs_job_entry *gs_jobs_entry_of(const struct gs_job *j);

/* Trainers of every job. */
unsigned gs_jobs_trainers(const struct gs_jobs *t);
/* The node's totals: every job's steps, those gone included. */
void gs_jobs_totals(const struct gs_jobs *t, struct gs_stats *out);
const char *gs_entry_state_name(const struct gs_job_entry *e);

/* ---- Places on the node (slots.c) ------------------------------------- */

/* Whether one more trainer of uid fits the node (--max-trainers) and its
 * user (--max-trainers-per-user, 0: none); if not, why names the limit
 * and the count it met. */
bool gs_jobs_trainer_fits(const struct gs_jobs *t, uid_t uid, char *why, size_t n);
/* Whether a new job of uid fits the node (--max-jobs) and its user
 * (--max-jobs-per-user, 0: none): true with *yield NULL when a place is
 * free, or with *yield the job without trainers whose place it takes (the
 * user's own when the user is at its limit, else any user's; of those the
 * one that has lingered longest), why then naming the limit that is met;
 * false with why when no such job is there. */
bool gs_jobs_job_fits(const struct gs_jobs *t, uid_t uid, struct gs_job_entry **yield,
		      char *why, size_t n);

/* Shutting down: every job's waits on other nodes end (first, before any
 * connection closes), then every job closes. The entries are freed from
 * the loop once their handles have closed. */
void gs_jobs_cancel(struct gs_jobs *t);
void gs_jobs_close(struct gs_jobs *t);

#endif
