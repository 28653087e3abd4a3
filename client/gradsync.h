/*
 * libgradsync: the client library of gradsync.
 *
 * A trainer connects to the node's gradsyncd, registers its gradient tensors
 * once (in the order backpropagation produces them), and then, each step,
 * begins the step, marks tensors ready as they are produced, and waits for
 * the daemon to write the reduced gradients back into the same buffers.
 *
 * All functions return GS_OK (0) or a negative GS_E* code; gs_strerror()
 * names the code and gs_last_error() gives the specifics of the last failure
 * on a handle. A handle is not thread-safe: use it from one thread at a time.
 */
#ifndef GRADSYNC_H
#define GRADSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GS_PROTOCOL_VERSION 1

/* Where gradsyncd listens unless --socket or GRADSYNC_SOCKET say otherwise. */
#define GS_DEFAULT_SOCKET "/run/gradsync/gradsyncd.sock"

/* Error codes: X(name, value, description). Values never change meaning. */
#define GS_ERRNO_MAP(X)                                                        \
	X(OK, 0, "success")                                                    \
	X(EINVAL, -1, "invalid argument")                                      \
	X(ENOMEM, -2, "out of memory")                                         \
	X(ECONNECT, -3, "cannot connect to gradsyncd")                         \
	X(EDISCONNECTED, -4, "gradsyncd closed the connection")               \
	X(ETIMEDOUT, -5, "timed out")                                          \
	X(EPROTO, -6, "protocol error")                                        \
	X(EVERSION, -7, "protocol version mismatch")                           \
	X(EDTYPE, -8, "unsupported tensor dtype")                              \
	X(ELAYOUT, -9, "tensor layout differs from the other trainers")        \
	X(EBUFFER, -10, "bad shared-memory buffer")                            \
	X(ELIMIT, -11, "limit exceeded")                                       \
	X(ESTATE, -12, "call out of order")                                    \
	X(EABORTED, -13, "step aborted")                                       \
	X(EAGAIN, -14, "not done yet")                                         \
	X(ESYSTEM, -15, "system call failed")                                  \
	X(EREFUSED, -16, "refused by gradsyncd")

enum gs_error {
#define GS_ERRNO_ENUM(name, value, desc) GS_##name = value,
	GS_ERRNO_MAP(GS_ERRNO_ENUM)
#undef GS_ERRNO_ENUM
};

/* Returns a static description of an error code; never NULL. */
const char *gs_strerror(int code);
/* Returns the error code's name ("GS_EPROTO"); never NULL. */
const char *gs_err_name(int code);

/* Tensor element types; values match the wire's Dtype. */
enum gs_dtype {
	GS_FLOAT32 = 1,
	GS_FLOAT16 = 2,
	GS_BFLOAT16 = 3,
	GS_FLOAT64 = 4,
	GS_INT32 = 5,
	GS_INT64 = 6,
	GS_UINT8 = 7,
};

enum gs_wire_dtype {
	GS_WIRE_DTYPE_FP16 = 1,
	GS_WIRE_DTYPE_BF16 = 2,
	GS_WIRE_DTYPE_FP32 = 3,
};
enum gs_reduce_op { GS_OP_AVERAGE = 1, GS_OP_SUM = 2 };

typedef struct gs_client gs_client;

/* Options structs start with their size so that they can grow at the end;
 * initialise them with the matching _INIT macro. */
struct gs_connect_options {
	size_t size;
	const char *socket_path; /* NULL: $GRADSYNC_SOCKET, else GS_DEFAULT_SOCKET */
	uint32_t local_rank;
	const char *job_id; /* NULL: "" */
	int timeout_ms;     /* for connect and hello; <0: no limit */
};
#define GS_CONNECT_OPTIONS_INIT                                                \
	{ sizeof(struct gs_connect_options), NULL, 0, NULL, 10000 }

/* What the daemon said at connection. Strings are owned by the handle. */
struct gs_session_info {
	uint32_t world_size;
	uint32_t local_size;
	uint32_t node_rank;
	uint32_t nodes;
	const char *backend;
	const char *daemon_version;
	uint64_t threshold;
	enum gs_wire_dtype wire_dtype;
	enum gs_reduce_op op;
	double predivide_factor;
	uint64_t fusion_buffer_elements;
	uint32_t global_rank; /* this trainer among all trainers of all nodes */
};

/* Connects as a trainer and exchanges hello. On success *out owns a handle
 * to free with gs_close(). On failure *out is set to NULL and, since there
 * is no handle, the detail is in gs_last_error(NULL) (per thread). */
int gs_connect(const struct gs_connect_options *opts, gs_client **out);

/* Closes the connection and unmaps every buffer the library created.
 * Safe on NULL. */
void gs_close(gs_client *c);

/* The last failure's message on this handle (or, for NULL, this thread's
 * last gs_connect/gs_control_connect failure). Owned by the library; valid
 * until the next call on the handle. Never NULL. */
const char *gs_last_error(const gs_client *c);

/* Fills *info from the daemon's welcome. Returns GS_OK. */
int gs_session_info(const gs_client *c, struct gs_session_info *info);

/* The socket's descriptor, to watch for readability in the caller's event
 * loop; call gs_step_poll() when it is readable. Owned by the handle. */
int gs_fd(const gs_client *c);

/* One tensor to register. With memfd < 0 the library allocates the tensor's
 * memory in a sealed memfd of its own; otherwise it adopts the caller's
 * memfd (sealed against shrinking, at least offset + count * 4 bytes
 * long), which stays the caller's to close. */
struct gs_tensor_spec {
	const char *name;
	uint64_t count; /* elements */
	enum gs_dtype dtype;
	int memfd;       /* -1: allocate */
	uint64_t offset; /* bytes into memfd; ignored when allocating */
};

/* Registers tensors in backpropagation order, once per connection, and
 * waits for the daemon to accept them. Returns GS_OK, or the daemon's error
 * (GS_EDTYPE, GS_ELAYOUT, GS_EBUFFER, GS_ELIMIT, ...). */
int gs_register(gs_client *c, const struct gs_tensor_spec *specs, size_t n);

/* The number of registered tensors and buckets in the daemon's plan. */
size_t gs_tensor_count(const gs_client *c);
size_t gs_bucket_count(const gs_client *c);

/* The mapped memory of registered tensor `index` (count floats), shared with
 * the daemon; NULL when index is out of range. Owned by the handle. */
float *gs_tensor_data(gs_client *c, size_t index);

struct gs_step_options {
	size_t size;
	bool clipping;      /* clip each element to [-clip_value, clip_value] */
	float clip_value;   /* before any communication, as the original */
	bool bucket_events; /* count BucketDone events (gs_buckets_done) */
};
#define GS_STEP_OPTIONS_INIT                                                   \
	{ sizeof(struct gs_step_options), false, 100.0f, false }

/* Starts the next step. The tensors' buffers must not be touched from the
 * first gs_mark_ready() until the step is done. Returns GS_ESTATE when a
 * step is still in progress or nothing is registered. */
int gs_step_begin(gs_client *c, const struct gs_step_options *opts);

/* Marks tensors (registration indices) ready; one frame per call, so pass
 * them in batches. Returns GS_EINVAL for an index out of range. */
int gs_mark_ready(gs_client *c, const uint32_t *indices, size_t n);

struct gs_step_result {
	uint64_t step;
	int status;          /* GS_OK, or GS_EABORTED */
	uint32_t buckets;
	uint64_t wire_bytes;
	uint64_t clipped;    /* elements of this trainer clipped */
	uint64_t nonfinite;  /* non-finite values in the reduced result */
	uint64_t duration_ns;
};

/* Waits up to timeout_ms (<0: forever) for the step to finish. Returns
 * GS_OK with *out filled, GS_ETIMEDOUT, GS_EABORTED (with *out filled and
 * the reason in gs_last_error), or a connection error. */
int gs_step_wait(gs_client *c, int timeout_ms, struct gs_step_result *out);

/* Like gs_step_wait without blocking: GS_EAGAIN while the step runs. */
int gs_step_poll(gs_client *c, struct gs_step_result *out);

/* Buckets of the current step reported done so far (needs bucket_events). */
uint32_t gs_buckets_done(const gs_client *c);

/* After a step has finished: true when tensor `index` holds the reduced
 * result, false when it still holds this trainer's own gradient (buckets
 * the daemon never reduced because the step was aborted). No tensor is
 * ever left partly written. */
bool gs_tensor_reduced(const gs_client *c, size_t index);

/* After GS_EDISCONNECTED (gradsyncd died or restarted): connects again to
 * the same socket as the same local rank and job, registers the same
 * tensors (same shared memory) again and forgets the interrupted step.
 * Returns GS_OK, or the error of the connection or registration (the
 * handle stays usable for another try). */
int gs_reconnect(gs_client *c, int timeout_ms);

/* ---- Control: what gradsyncctl uses ---------------------------------- */

struct gs_trainer_status {
	uint32_t pid;
	uint32_t uid;
	uint32_t local_rank;
	uint32_t tensors;
	uint64_t bytes;
	uint64_t steps;
	char state[32];
};

struct gs_peer_status {
	uint32_t node_rank;
	uint32_t local_size;
	char host[64];
	char state[32];
};

struct gs_status {
	char daemon_version[32];
	char backend[16];
	char isa[16];
	char job_state[32];
	char job_id[64];
	uint64_t uptime_ns;
	struct gs_session_info settings; /* strings point into this struct */
	uint32_t local_size;
	uint32_t world_size;
	uint32_t node_rank;
	uint32_t nodes;
	uint32_t buckets;
	uint64_t current_step;
	uint32_t buckets_in_flight;
	uint64_t steps_completed;
	uint64_t steps_aborted;
	uint64_t last_step_ns;
	uint64_t median_step_ns;
	uint64_t bytes_reduced;
	uint64_t elements_clipped;
	uint64_t nonfinite;
	size_t trainer_count;
	struct gs_trainer_status *trainers; /* owned by the struct */
	uint64_t internode_bytes; /* sent to other nodes by all-reduces */
	size_t peer_count;        /* nodes of the job, this one included */
	struct gs_peer_status *peers; /* owned by the struct */
	/* The job is another user's: job_id, trainers and buckets are left
	 * out, hidden_trainers says how many trainers it has. */
	bool job_hidden;
	uint32_t hidden_trainers;
};

/* Connects as a control client (no trainer slot is taken). */
int gs_control_connect(const char *socket_path, int timeout_ms, gs_client **out);

/* Asks the daemon for its status. On success the caller owns *out and frees
 * it with gs_status_free(). */
int gs_status_get(gs_client *c, int timeout_ms, struct gs_status **out);
void gs_status_free(struct gs_status *s);

/* Asks for the daemon's figures in the Prometheus text exposition format.
 * On success *text is a NUL-terminated string the caller owns and frees
 * with gs_metrics_free(). */
int gs_metrics_get(gs_client *c, int timeout_ms, char **text);
void gs_metrics_free(char *text);

/* One connection to the daemon, as gs_clients_get() lists them. */
struct gs_connection_status {
	uint64_t id;
	char role[16];      /* "trainer", "control", "node", or "new" before hello */
	uint32_t pid;       /* the peer's credentials */
	uint32_t uid;
	uint32_t gid;
	bool self;          /* the connection that asked */
	int32_t local_rank; /* -1 unless a trainer */
	char state[48];
	uint32_t tensors;   /* trainers: registered tensors, bytes, steps done */
	uint64_t bytes;
	uint64_t steps;
	bool hidden;        /* another user's: only id, role and state are given */
};

/* Lists every connection, oldest first. On success *out is an array of
 * *count entries the caller owns and frees with gs_clients_free(). */
int gs_clients_get(gs_client *c, int timeout_ms, struct gs_connection_status **out,
		   size_t *count);
void gs_clients_free(struct gs_connection_status *list);

/* What a trace has written. */
struct gs_trace_status {
	bool active;
	uint64_t events;  /* complete events */
	uint64_t bytes;   /* written to the file */
	uint64_t dropped; /* events lost because the file did not keep up */
	char path[256];   /* the file, as the daemon names it */
	char error[256];  /* why writing stopped early; "" if it did not */
};

/* Starts a Chrome-trace timeline of every bucket's phases into fd, a
 * regular file the caller opened for writing (as its own user: the daemon
 * writes only where the caller may). The descriptor is sent to the daemon
 * and stays the caller's to close. Returns GS_OK, or GS_ESTATE when a trace
 * already runs. out may be NULL. */
int gs_trace_start(gs_client *c, int fd, int timeout_ms, struct gs_trace_status *out);
/* Completes and closes the trace file. Returns GS_OK with *out filled (out
 * may be NULL), or GS_ESTATE when no trace runs. */
int gs_trace_stop(gs_client *c, int timeout_ms, struct gs_trace_status *out);

/* ---- CUDA tensors: gradsyncd's cuda backend ---------------------------
 *
 * With the cuda backend, gradients stay in the trainer's GPU memory: the
 * daemon opens CUDA IPC handles of their allocations once, and each step
 * its GPU waits for the trainer's kernels and the trainer's stream for the
 * daemon's, through two interprocess events, without either host blocking.
 * The library loads the CUDA driver (libcuda.so.1) on the first of these
 * calls only; it has no link-time dependency on CUDA. Streams are
 * cudaStream_t / CUstream values of the tensors' context (the CUDA
 * runtime's primary context, as PyTorch uses); NULL is the legacy default
 * stream. */

/* One CUDA tensor: a device pointer, possibly inside a larger allocation
 * (a caching allocator's block). The library sends the base allocation's
 * IPC handle once, however many tensors it holds, and each tensor's offset. */
struct gs_cuda_tensor_spec {
	const char *name;
	uint64_t count;      /* elements */
	enum gs_dtype dtype; /* GS_FLOAT32 */
	void *data;          /* device pointer */
};

/* Registers CUDA tensors in backpropagation order, once per connection;
 * all must be on one GPU, the local rank's (gradsyncd reduces local rank r
 * on the node's GPU r). Returns GS_OK or the daemon's error; GS_ESTATE when
 * gradsyncd does not run the cuda backend; GS_ESYSTEM when the driver
 * cannot be loaded; GS_EBUFFER for a pointer that is not device memory
 * CUDA IPC can export (cudaMallocManaged, cuMemCreate). gs_last_error says
 * which. gs_tensor_data() then returns each tensor's device pointer. */
int gs_register_cuda(gs_client *c, const struct gs_cuda_tensor_spec *specs, size_t n);

/* gs_mark_ready, after recording an event on stream: the daemon's GPU
 * waits for the work queued there so far (the kernels that produced the
 * gradients) before it reads them. */
int gs_cuda_mark_ready(gs_client *c, const uint32_t *indices, size_t n, void *stream);

/* Makes stream wait, on the GPU, for every result gradsyncd has reported
 * so far (StepDone, BucketDone): call it once gs_step_wait() or
 * gs_step_poll() has returned, before work on stream reads the gradients. */
int gs_cuda_stream_wait(gs_client *c, void *stream);

#ifdef __cplusplus
}
#endif

#endif
