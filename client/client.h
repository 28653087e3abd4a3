/*
 * libgradsync internals: the handle behind the opaque gs_client and the
 * helpers the client files share. Nothing here is part of the ABI: as
 * libuv's uv__ names, every internal name is gs__, so that gs_ (one
 * underscore) is the public API of gradsync.h and nothing else.
 */
#ifndef GS_CLIENT_H
#define GS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "gradsync.h"

#define GS_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))

/* Largest frame accepted from gradsyncd; a StatusReply of a busy node is
 * far below this. */
#define GS_CLIENT_MAX_FRAME (16u << 20)
/* How long a send may wait for gradsyncd to drain the socket before the
 * daemon is taken for stalled. */
#define GS_SEND_TIMEOUT_MS 60000
#define GS_ERRMSG_SIZE 512

enum gs__step_state {
	GS_STEP_IDLE,    /* no step begun, or its result already returned */
	GS_STEP_RUNNING, /* begun, StepDone not received yet */
	GS_STEP_DONE,    /* StepDone received, result not returned yet */
};

/* One mapped shared-memory buffer of a registration. */
struct gs__buffer {
	int fd;
	bool owned; /* created by the library: closed by it */
	uint8_t *addr;
	size_t size;
};

struct gs__tensor {
	float *data;
	uint64_t count;
	uint64_t marked_step; /* the last step that marked it ready */
	uint64_t absent_step; /* the last step that marked it absent (gs_mark_absent) */
	bool produced;        /* in the last finished step (gs_tensor_produced) */
};

/* Where a registered tensor lives: buffer index and byte offset. */
struct gs__placement {
	uint32_t buffer;
	uint64_t offset;
};

/* The trainer's registered state (state.c): its memfd buffers, or its
 * CUDA allocations (cuda_state.c), and where each tensor is. */
struct gs__state {
	bool registered;
	struct gs__buffer *buffers;
	size_t nbuffers;
	struct gs_state_spec *specs; /* as sent, for gs_reconnect (names owned) */
	struct gs__placement *pl;
	struct gs__cuda_mem *cuda;   /* CUDA state: its allocations, as buffers; NULL: memfds */
	void **data;                 /* per tensor: its memory (CUDA: device pointer) */
	size_t n;
	uint64_t seq;                /* broadcasts asked on this session */
};

struct gs_client {
	int fd;
	/* What the session was opened with, for gs_reconnect. */
	char *path;
	uint32_t local_rank;
	char *job_id;
	/* A trainer's view of its job, sent in every hello (has_launch). */
	struct gs_launch_info launch;
	bool has_launch;
	Gradsync__Role role;
	struct gs_frame_reader reader;
	char error[GS_ERRMSG_SIZE];
	/* What the current call does, for messages: "registration", ... */
	char doing[48];

	/* A daemon Error, end of stream or a broken stream ends the session;
	 * the call that saw it returns dead_code, later calls
	 * GS_EDISCONNECTED. */
	bool dead;
	int dead_code;
	char dead_reason[GS_ERRMSG_SIZE];

	/* The reply a synchronous call waits for: its kind, then the message
	 * itself (owned; the waiter frees it). */
	Gradsync__Message__BodyCase expect;
	Gradsync__Message *reply;

	struct gs_session_info info;
	char *backend;
	char *daemon_version;

	bool registered;
	/* The registration as sent, for gs_reconnect (names owned). */
	struct gs_tensor_spec *reg_specs;
	struct gs__placement *reg_pl;
	/* Per tensor: the last finished step left the reduced result in it. */
	bool *reduced;
	struct gs__buffer *buffers;
	size_t nbuffers;
	struct gs__tensor *tensors;
	size_t ntensors;
	struct gs__cuda *cuda; /* CUDA tensors' state (cuda.c); NULL for memfds */
	uint32_t nbuckets;
	uint64_t layout_hash;

	struct gs__state state;

	enum gs__step_state step_state;
	uint32_t ready_event; /* CUDA: the ring entry the next marks recorded */
	uint64_t step; /* the current or last step; counts from 1 */
	uint32_t buckets_done;
	struct gs_step_result result;
	char step_message[GS_ERRMSG_SIZE];
};

/* ---- errors.c ---------------------------------------------------------- */

/* Records the last error of c (of this thread when c is NULL) and returns
 * code. */
int gs__fail(struct gs_client *c, int code, const char *fmt, ...) GS_PRINTF(3, 4);
/* Like gs__fail, and ends the session. */
int gs__fail_dead(struct gs_client *c, int code, const char *fmt, ...)
	GS_PRINTF(3, 4);
/* Ends the session with the last error as its reason. */
void gs__end_session(struct gs_client *c, int code);
/* Restores the reason the session ended; returns the code it ended with. */
int gs__dead_error(struct gs_client *c);
/* GS_OK on a live session; GS_EDISCONNECTED (with the reason) otherwise. */
int gs__check_alive(struct gs_client *c);
/* Whether code is one of the GS_E* codes. */
bool gs__err_known(int code);
/* Sets what the current call does, for error messages. */
void gs__doing(struct gs_client *c, const char *fmt, ...) GS_PRINTF(2, 3);

/* ---- connection.c ------------------------------------------------------ */

int64_t gs__deadline(int timeout_ms);
/* Milliseconds left until deadline for poll(): -1 without a deadline. */
int gs__remaining(int64_t deadline);

/* Connects c->fd to path (non-blocking once connected). */
int gs__conn_open(struct gs_client *c, const char *path, int64_t deadline);
/* Sends one message with fds, all of it, reading what arrives meanwhile. */
int gs__conn_send(struct gs_client *c, const Gradsync__Message *m,
		 const int *fds, size_t nfds, int timeout_ms);

typedef bool gs__done_fn(const struct gs_client *c);
/* Handles incoming messages until done(c), the timeout (GS_ETIMEDOUT) or
 * the end of the session. timeout_ms 0 reads only what is there. */
int gs__conn_pump(struct gs_client *c, gs__done_fn *done, int timeout_ms);
/* A done function for synchronous calls: the expected reply arrived. */
bool gs__has_reply(const struct gs_client *c);

/* ---- dispatch.c -------------------------------------------------------- */

/* Handles one message from gradsyncd and takes ownership of it. */
int gs__dispatch(struct gs_client *c, Gradsync__Message *m);

/* ---- launch.c ---------------------------------------------------------- */

/* Copies the caller's options (NULL, or an older and shorter struct) over
 * GS_CONNECT_OPTIONS_INIT; fn names the public call in the error. */
int gs__connect_options_take(const struct gs_connect_options *opts,
			     struct gs_connect_options *o, const char *fn);
/* Derives the job's fields from complete options and the environment into
 * *li (all of it). Returns GS_OK, or GS_EINVAL with this thread's last
 * error naming the field, the variable and its value. */
int gs__launch_derive(const struct gs_connect_options *o, struct gs_launch_info *li);

/* ---- registration.c ---------------------------------------------------- */

/* A registration's RegisterTensors frames, built and sent as they fill. */
struct gs__reg_frames;
/* Frames that carry their buffers' descriptors (with_fds, memfds) or none
 * (CUDA handles travel inside the Buffer). NULL, the error recorded, when
 * out of memory. gs__reg_frames_end frees it. */
struct gs__reg_frames *gs__reg_frames_new(struct gs_client *c, bool with_fds);
/* The same, of RegisterState frames when state. */
struct gs__reg_frames *gs__reg_frames_new_as(struct gs_client *c, bool with_fds, bool state);
/* Adds buf (with fd) then t, either may be NULL, sending the frame so far
 * first when they would not fit. Both are copied; what they point to
 * (names, handles) must live until gs__reg_frames_end. */
int gs__reg_frames_add(struct gs_client *c, struct gs__reg_frames *f,
		      const Gradsync__TensorSpec *t, const Gradsync__Buffer *buf,
		      int fd);
/* gs__reg_frames_add for a state registration's frames. */
int gs__reg_frames_add_state(struct gs_client *c, struct gs__reg_frames *f,
			     const Gradsync__StateTensor *t, const Gradsync__Buffer *buf, int fd);
/* Sends the last frame when r is GS_OK, frees f, and returns the result. */
int gs__reg_frames_end(struct gs_client *c, struct gs__reg_frames *f, int r);
/* Waits for the Registered that answers a registration of n tensors
 * (c->expect set before its first frame) and keeps its buckets and
 * layout hash. */
int gs__wait_registered(struct gs_client *c, size_t n);

/* ---- memfd.c ----------------------------------------------------------- */

/* A sealed memfd of size bytes, mapped, into *out (owned by the library);
 * what_for names its use in the error. Returns GS_OK or the error. */
int gs__memfd_create(struct gs_client *c, uint64_t size, const char *what_for,
		     struct gs__buffer *out);
/* A caller's memfd, checked as gradsyncd will (sealed against shrinking,
 * writable) and mapped, into *out (not owned). */
int gs__memfd_adopt(struct gs_client *c, int fd, struct gs__buffer *out);
/* Unmaps b, and closes it when the library made it. */
void gs__memfd_release(struct gs__buffer *b);

/* ---- session.c --------------------------------------------------------- */

/* Connects, says hello in role and waits for the welcome. A trainer's
 * hello carries li (its job, rank and view of the job); a control
 * client's passes NULL. */
int gs__session_open(const char *path, Gradsync__Role role,
		    const struct gs_launch_info *li, int timeout_ms, struct gs_client **out);

/* ---- tensors.c --------------------------------------------------------- */

/* The bytes of one element of d; 0 for a dtype the library cannot size. */
size_t gs__dtype_size(enum gs_dtype d);
/* Checks what a memfd and a CUDA tensor spec share: tensor i has a name
 * and elements, of a dtype the library can size (into *esize), not too
 * many to address. Returns GS_OK, or the error (the last error says why). */
int gs__check_tensor(struct gs_client *c, size_t i, const char *name, enum gs_dtype dtype,
		    uint64_t count, size_t *esize);

/* Unmaps and closes what a registration holds. */
void gs__tensors_release(struct gs_client *c);
/* Hello and welcome on c's connection, with its rank and job. */
int gs__session_handshake(struct gs_client *c, int64_t deadline);
/* Sends the kept registration again and waits for Registered. */
int gs__register_again(struct gs_client *c);

/* ---- state.c ----------------------------------------------------------- */

/* Waits for the StateRegistered that answers a state registration of n
 * tensors (c->expect set before its first frame). */
int gs__wait_state_registered(struct gs_client *c, size_t n);
/* Unmaps and closes what the state's registration holds. */
void gs__state_release(struct gs_client *c);
/* Sends the kept state registration again and waits for StateRegistered;
 * GS_OK at once when there is none. */
int gs__register_state_again(struct gs_client *c);
/* What a memfd and a CUDA state registration check alike: the call
 * (fn, n tensors) and state tensor i. */
int gs__check_state_register(struct gs_client *c, const char *fn, size_t n, bool have_specs);
int gs__check_state_tensor(struct gs_client *c, size_t i, const char *name, enum gs_dtype dtype,
			   uint64_t bytes);
/* Keeps a copy of the specs (names too) in c->state. */
int gs__state_keep_specs(struct gs_client *c, const struct gs_state_spec *specs, size_t n);

/* Sends c->state's registration, the first time, and waits for
 * StateRegistered: registered on success; else the session ends and the
 * state is released. */
int gs__state_send_first(struct gs_client *c);

/* ---- cuda_state.c ------------------------------------------------------ */

/* Forgets the CUDA state's allocations (st->cuda). */
void gs__cuda_state_release(struct gs__state *st);
/* The Buffer of the CUDA state's allocation b, its IPC handle. */
Gradsync__Buffer gs__cuda_state_buffer(const struct gs__state *st, uint32_t b);

/* ---- cuda.c ------------------------------------------------------------ */

/* Destroys the CUDA tensors' events and forgets their handles. */
void gs__cuda_release(struct gs_client *c);
/* gs__register_again for a registration of CUDA tensors. */
int gs__cuda_register_again(struct gs_client *c);

#endif
