/*
 * The step engine of the node's job: which trainer holds which local rank,
 * the layout they all registered and its bucket plan, and the step in
 * progress: readiness per bucket, launching buckets in plan order once
 * every local trainer has marked all of a bucket's tensors, and step done.
 * It knows nothing of memfds, CUDA, Gloo, sockets or the daemon: buckets
 * run through the backend interface on the worker thread (reduce.c), the
 * other nodes are reached through the group port (group_port.h) and the
 * trainers' clients through the client port (client_port.h), all of them
 * given at init (struct gs_engine_env).
 */
#ifndef GS_JOB_H
#define GS_JOB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "backend/backend.h"
#include "backend/plan.h"
#include "client_protocol.h"
#include "engine/client_port.h"
#include "engine/group_port.h"
#include "engine/layout.h"
#include "engine/trainer_state.h"
#include "engine/stats.h"
#include "gradsync.pb-c.h"
#include "support/settings.h"
#include "support/worker.h"

#define GS_MAX_LOCAL GS_MAX_LOCAL_SIZE

struct gs_trace;
struct gs_trainer;

/* What the job is given by whoever runs it (daemon.c; a unit test), for
 * its whole life. */
struct gs_engine_env {
	uv_loop_t *loop;
	const struct gs_settings *settings;
	struct gs_backend *backend;
	struct gs_worker *worker; /* runs buckets, in submission order */
	struct gs_trace *trace;   /* bucket phases and their totals; NULL: none */
	struct gs_group_port group; /* used with several nodes only */
	/* A trainer's Buffer message: whether a descriptor comes with it, and
	 * the descriptor the backend imports, checked (GS_OK, or a GS_E* code
	 * with why). fd is the descriptor that came with it, or -1. */
	bool (*buffer_takes_fd)(const Gradsync__Buffer *m);
	int (*parse_buffer)(const Gradsync__Buffer *m, uint32_t rank, int fd,
			    struct gs_buffer_desc *out, char *err, size_t errlen);
	/* Whether the imported memory at addr lost its pages under the
	 * daemon (a fault guard caught a SIGBUS there). NULL: it never does. */
	bool (*memory_lost)(const void *addr);
	/* The job has no trainer and no work left (gs_job_reap found it so);
	 * called from the loop, never inside another call of the job's, and
	 * maybe more than once. NULL: nobody asks. */
	void (*idle)(void *arg);
	void *idle_arg;
};

/* A registered trainer whose connection went: a step cannot complete
 * until another takes its local rank. */
struct gs_departure {
	bool gone;
	pid_t pid;
	uint64_t last_step; /* the trainer's own step number */
};

struct gs_job {
	struct gs_engine_env env;
	struct gs_world world; /* as the group last said */
	uv_timer_t reap_timer; /* frees trainers gone, from the loop */
	uint64_t mappings;     /* trainers' buffers imported, all together */
	struct gs_trainer *slots[GS_MAX_LOCAL]; /* by local rank */
	unsigned attached;
	const char *id; /* the job's, as its settings say (settings->job_id) */
	/* Its owner (settings->owner): only that user (and root) may join it
	 * or see more of it than that it exists. */
	uid_t owner;
	struct gs_departure departed[GS_MAX_LOCAL];

	/* The layout, fixed by the first trainer to register. */
	bool has_layout;
	struct gs_layout layout;
	uint64_t layout_hash;
	uint32_t layout_rank;
	struct gs_plan plan;
	float prescale, postscale;
	/* With several nodes, a layout is used only once every node has
	 * registered the same one (one agreement round per layout). */
	uint64_t layout_round;
	bool agreed;

	/* The step in progress. */
	uint64_t step;        /* an internal counter of the job's steps, never shown */
	uint64_t step_number; /* the step as its trainers number it (BeginStep) */
	bool in_step;
	bool aborting;
	char abort_reason[768];
	uint32_t *bucket_marks; /* (trainer, tensor) marks per bucket */
	/* Per tensor: whether a trainer produced it this step (marked it
	 * without GradientsReady.absent). Written on the loop by the marks,
	 * then by the bucket's run on the worker, where the nodes' vote makes
	 * it whether any node's trainer did (gs_bucket_io.produced). */
	uint8_t *produced;
	/* The step's tensors no trainer of the job produced, among those it
	 * reduced, as StepDone lists them (finish_step). */
	uint32_t *unproduced;
	uint32_t nunproduced;
	uint32_t next_launch;
	uint32_t buckets_done;
	uint64_t step_start_ns;
	uint64_t step_nonfinite;
	/* The squares of the step's reduced values, summed bucket by bucket
	 * in plan order (the order they complete in): the same bits on every
	 * node, whose square root is the step's gradient norm. */
	double step_sumsq;
	uint64_t step_wire_bytes;
	unsigned inflight; /* buckets on the worker */
	uv_timer_t stall_timer; /* warns, then aborts a step that waits too long */
	uv_timer_t failure_timer; /* holds a failed collective's abort briefly */
	bool holding_failure;
	bool failure_renames;        /* the node's word names the step's abort */
	uint64_t failure_generation; /* of the group the held failure broke */
	char failure_why[200];      /* its words, for the request */
	/* Worker thread only: the step whose buckets stopped; later buckets
	 * of it already queued skip their collectives, as every node does. */
	uint64_t worker_stopped_step;
	bool stall_warned;

	/* Trainers gone while buckets that read their memory are in flight. */
	struct gs_trainer *retired;

	/* The trainers' state: its layout and broadcast (state.h). */
	struct gs_job_state state;

	/* The node's figures of every job's steps so far. */
	struct gs_stats stats;
};

/* Sets up the job on env->loop (env is copied). */
void gs_job_init(struct gs_job *j, const struct gs_engine_env *env);
/* The world is known (after joining, after a restarted coordinator
 * brought a different one): fixes the scale factors. */
void gs_job_set_world(struct gs_job *j, const struct gs_world *w);
/* Closes the job's timers (shutdown, on the loop). */
void gs_job_close(struct gs_job *j);
void gs_job_destroy(struct gs_job *j);
/* A node of the job went away (the coordinator said so, or is gone), or
 * the group failed: the group is not whole, and the step in progress ends
 * with why. */
void gs_job_peer_lost(struct gs_job *j, const char *why);
/* The group is being rebuilt: buckets wait until gs_job_resume. */
void gs_job_regrouping(struct gs_job *j);
/* The group of nodes (of `generation`) is whole again: buckets may launch. */
void gs_job_resume(struct gs_job *j, uint64_t generation);

uint32_t gs_job_world_size(const struct gs_job *j);
/* Whether the job has trainers or work left (then it has an owner). */
bool gs_job_active(const struct gs_job *j);
/* Whether a client of uid may see the job's identity and shape (its id,
 * trainers, layout, figures), lingering between trainers too: its owner, a
 * privileged user (root, gradsyncd's own user: the caller knows), and
 * anyone under --job-access=any. */
bool gs_job_visible_to(const struct gs_job *j, uid_t uid, bool privileged);
/* What a job is doing, as status names it: gs_job_state_names[] holds
 * each name, and gs_job_state gives the job's. Status carries a name in
 * a char[32] of the public API (struct gs_job_status, which may not
 * grow): every name must fit, which tests/unit/test-state-names.c walks
 * them all to check. */
enum gs_job_states {
	GS_JOB_IDLE,
	GS_JOB_REGISTERING,
	GS_JOB_WAITING_FOR_TRAINERS,
	GS_JOB_AGREEING,
	GS_JOB_READY,
	GS_JOB_IN_STEP,
	GS_JOB_ABORTING,
	GS_JOB_STATES
};
extern const char *const gs_job_state_names[GS_JOB_STATES];
const char *gs_job_state(const struct gs_job *j);

/* A trainer said hello: gives it a local rank slot and returns it, or
 * drops the client with an Error (rank out of range or taken, another job
 * holds the node) and returns NULL. */
struct gs_trainer *gs_job_attach(struct gs_job *j, const struct gs_client *client,
				 const Gradsync__Hello *h);
/* The trainer's client is gone: frees its slot, aborts a step it was part
 * of, and frees it from the loop once no bucket uses its memory. */
void gs_job_detach(struct gs_job *j, struct gs_trainer *t);
/* Frees the trainers gone if no bucket is in flight (and ends the job when
 * the last has left). The job calls it itself, from the loop, after each
 * detach and bucket; a caller that knows a moment is safe may too. Never
 * inside a call that found a trainer gone. */
void gs_job_reap(struct gs_job *j);

/* A trainer's registration is complete: adopt its layout as the job's, or
 * compare it with the job's. Returns GS_OK or a GS_E* code with why. */
int gs_job_adopt_layout(struct gs_job *j, struct gs_trainer *t, char *why,
			size_t n);

/* The other nodes' verdict on layout round `round`: answers the trainers
 * waiting for it with Registered, or drops them with why. */
void gs_job_layout_verdict(struct gs_job *j, uint64_t round, int rc, const char *why);

void gs_job_begin_step(struct gs_trainer *t, const Gradsync__BeginStep *b);
void gs_job_mark_ready(struct gs_trainer *t, const Gradsync__GradientsReady *r);

/* Worker side (reduce.c): one bucket of one step, run chunk by chunk. */
struct gs_bucket_run;
struct gs_bucket_run *gs_bucket_run_create(struct gs_job *j, uint32_t bucket);
/* Called on the loop thread when the worker has finished it. */
void gs_job_bucket_finished(struct gs_job *j, struct gs_bucket_run *run);

#endif
