/*
 * A trainer of the node's job: its client (client_port.h), its registered
 * tensors (imported by the backend) and where it stands in the current
 * step.
 */
#ifndef GS_TRAINER_H
#define GS_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "convert.h"
#include "engine/client_port.h"
#include "engine/layout.h"
#include "engine/trainer_state.h"
#include "gradsync.pb-c.h"

struct gs_job;

struct gs_trainer_buffer {
	void *addr;
	uint64_t size;
};

struct gs_trainer {
	struct gs_job *job;
	struct gs_client client; /* client.ctx NULL once the client is gone */
	struct gs_trainer *next_retired;
	uint32_t rank;
	pid_t pid;
	uid_t uid;

	/* Registration, possibly over several frames. */
	bool layout_checked; /* matches the job's; Registered may wait for the nodes */
	bool registered;     /* Registered sent: steps may begin */
	struct gs_trainer_buffer *buffers;
	uint32_t nbuffers;
	uint64_t buffer_bytes;
	struct gs_layout layout;
	uint32_t *tensor_buffer;  /* per tensor, while registering */
	uint64_t *tensor_offset;
	float **tensors;          /* per tensor, once registered */
	uint64_t bytes;           /* registered gradient bytes */

	/* Its state (state.h), registered apart from its gradients. */
	struct gs_trainer_state state;

	/* The step. */
	uint64_t seq;             /* the trainer's own step number */
	uint64_t aborted_seq;     /* its last step that was aborted */
	bool owes_abort;          /* the job aborted a step it had not begun */
	bool in_step;
	struct gs_pack_params pack;
	bool bucket_events;
	uint64_t *marked;         /* per tensor: job step it was marked in */
	uint32_t *bucket_event;   /* per bucket: ready-ring entry of its last mark */
	uint64_t clipped;         /* this step */
	uint64_t steps;           /* completed */
};

struct gs_trainer *gs_trainer_create(struct gs_job *job, const struct gs_client *client,
				     uint32_t rank);
/* Unmaps its buffers and frees it. */
void gs_trainer_destroy(struct gs_trainer *t);

uint32_t gs_trainer_rank(const struct gs_trainer *t);
/* What a trainer is doing, as status and the clients' list name it
 * (gs_trainer_state): each name fits the char[32] of the public API's
 * struct gs_trainer_status (tests/unit/test-state-names.c checks). */
enum gs_trainer_states {
	GS_TRAINER_CONNECTED,
	GS_TRAINER_REGISTERING,
	GS_TRAINER_WAITING_FOR_NODES,
	GS_TRAINER_IDLE,
	GS_TRAINER_IN_STEP,
	GS_TRAINER_BROADCASTING, /* asked for a state broadcast, unanswered */
	GS_TRAINER_STATES
};
extern const char *const gs_trainer_state_names[GS_TRAINER_STATES];
const char *gs_trainer_state(const struct gs_trainer *t);

/* Handles one RegisterTensors frame; answers Registered after the last,
 * or drops the client with an Error naming what is wrong. */
void gs_trainer_register(struct gs_trainer *t, const Gradsync__RegisterTensors *r);

/* Imports a registration frame's buffers (what: the message, for errors)
 * into *arr, of *narr so far, within the trainer's and the node's limits
 * on buffers and bytes. Returns 0, or -1 with the client dropped. */
int gs_trainer_import_buffers(struct gs_trainer *t, const char *what, Gradsync__Buffer *const *bufs,
			      size_t n, struct gs_trainer_buffer **arr, uint32_t *narr);
/* Whether a tensor's name holds a control character (names reach logs,
 * status and other nodes). */
bool gs_name_has_control_char(const char *s);
/* A Dtype's name ("float32"), or "unspecified". */
const char *gs_dtype_name(Gradsync__Dtype d);

/* Tells the trainer its registration is accepted. */
void gs_trainer_send_registered(struct gs_trainer *t);

/* Sends the trainer's client a message. */
void gs_trainer_send(struct gs_trainer *t, const Gradsync__Message *m);
/* Drops the trainer's client with an Error of code and the message (the
 * client is gone when it returns: gs_trainer_disconnected has run). */
void gs_trainer_fail(struct gs_trainer *t, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The first of its buffers whose pages vanished under the daemon (the
 * environment's memory_lost says so), or -1. */
int gs_trainer_lost_buffer(const struct gs_trainer *t);

/* The client went away: the job decides what that means for the step. */
void gs_trainer_disconnected(struct gs_trainer *t);

#endif
