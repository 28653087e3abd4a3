/*
 * The emulated NCCL, rank side: a communicator is a TCP connection to the
 * root of its job (nccl_root.c), made by a thread of its own so that a
 * non-blocking init (config.blocking = 0) returns ncclInProgress at once.
 * ncclAllReduce is work on the stream: the stream's thread sends the
 * buffer and waits for the sum, as an NCCL kernel occupies its stream. A
 * failure sets the communicator's async error (ncclRemoteError when the
 * root says a peer failed, ncclSystemError when the root is gone) and
 * ncclGetLastError names it; ncclCommAbort shuts the connection down, so
 * a stream blocked in a collective goes on at once. NCCL_DEBUG=WARN logs
 * failures to stderr, NCCL_DEBUG=INFO each all-reduce as it starts.
 * GS_CUDA_EMU_NCCL_FAIL_INITS=N: the first N communicators a process
 * makes fail to join, without reaching the root, so tests see a creation
 * fail.
 */
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* nccl.h declares ncclGroupStart() and others without (void), which is no
 * prototype: its definitions here would warn. */
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
#include <nccl.h>

#include "emu.h"
#include "nccl_wire.h"

struct ncclComm {
	pthread_mutex_t lock;
	int fd;
	int rank, nranks;
	struct emu_nccl_uid id;
	_Atomic int async; /* ncclResult_t: ncclInProgress until connected */
	char last_error[256];
	_Atomic int refs;  /* the user's, the connector's, one per queued collective */
	_Atomic bool aborted;
	uint32_t seq;      /* collectives queued (stream order is queue order) */
	int device;        /* current at its creation, as NCCL binds it */
	bool fail;         /* GS_CUDA_EMU_NCCL_FAIL_INITS */
};

static _Atomic long inits;

static _Thread_local int group_depth;
static _Thread_local ncclComm_t group_blocking[64]; /* blocking inits to finish at GroupEnd */
static _Thread_local int group_nblocking;
static _Thread_local bool group_pending; /* a non-blocking init in this group */
static _Thread_local char thread_error[256];

static void unref(ncclComm_t c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->fd >= 0)
		close(c->fd);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Keeps the first error: later ones are its consequences. */
/* NCCL_DEBUG, as NCCL reads it: WARN logs failures, INFO each all-reduce too. */
static int debug_level(void)
{
	const char *v = getenv("NCCL_DEBUG");
	if (!v)
		return 0;
	return !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE") ? 2 : !strcasecmp(v, "WARN");
}

__attribute__((format(printf, 3, 4)))
static void set_error(ncclComm_t c, ncclResult_t res, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&c->lock);
	int cur = atomic_load(&c->async);
	if (cur == ncclSuccess || cur == ncclInProgress) {
		va_start(ap, fmt);
		vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
		va_end(ap);
		atomic_store(&c->async, res);
		if (debug_level() >= 1)
			fprintf(stderr, "NCCL WARN (CUDA emulation) rank %d of %d: %s\n", c->rank,
				c->nranks, c->last_error);
	}
	pthread_mutex_unlock(&c->lock);
}

/* ---- Joining ---------------------------------------------------------------------- */

static int dial(ncclComm_t c)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = c->id.port,
				 .sin_addr.s_addr = c->id.addr };
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	pthread_mutex_lock(&c->lock);
	bool aborted = atomic_load(&c->aborted);
	if (!aborted)
		c->fd = fd;
	pthread_mutex_unlock(&c->lock);
	if (aborted)
		close(fd);
	return aborted ? -1 : fd;
}

static void *connector(void *arg)
{
	ncclComm_t c = arg;
	if (c->fail) {
		set_error(c, ncclSystemError, "joining the communicator failed (GS_CUDA_EMU_NCCL_FAIL_INITS)");
		unref(c);
		return NULL;
	}
	int fd = dial(c);
	struct emu_nccl_hello h = { EMU_NCCL_MAGIC, c->id.job, c->rank, c->nranks };
	struct emu_nccl_reply ready;
	if (fd < 0 || emu_send_all(fd, &h, sizeof(h)) < 0) {
		set_error(c, ncclSystemError,
			  "cannot reach the communicator's root (the process that made the unique id is gone?)");
	} else if (emu_recv_all(fd, &ready, sizeof(ready)) < 0) {
		set_error(c, ncclSystemError, "the communicator's root closed the connection while joining");
	} else if (ready.status != 0) {
		ready.msg[sizeof(ready.msg) - 1] = '\0';
		set_error(c, ncclRemoteError, "joining the communicator: %s", ready.msg);
	} else {
		int expect = ncclInProgress;
		atomic_compare_exchange_strong(&c->async, &expect, ncclSuccess);
	}
	unref(c);
	return NULL;
}

static ncclResult_t wait_init(ncclComm_t c)
{
	while (atomic_load(&c->async) == ncclInProgress)
		emu_sleep_ms(1);
	return atomic_load(&c->async);
}

EMU_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	memset(id, 0, sizeof(*id));
	if (emu_nccl_root_start((struct emu_nccl_uid *)(void *)id->internal) < 0) {
		snprintf(thread_error, sizeof(thread_error), "cannot start the emulated NCCL root");
		return ncclSystemError;
	}
	return ncclSuccess;
}

EMU_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
					    ncclConfig_t *config)
{
	struct emu_nccl_uid uid;
	memcpy(&uid, id.internal, sizeof(uid));
	*out = NULL;
	if (memcmp(uid.magic, EMU_NCCL_MAGIC, 8) || nranks < 1 || nranks > EMU_NCCL_MAX_RANKS ||
	    rank < 0 || rank >= nranks) {
		snprintf(thread_error, sizeof(thread_error), "invalid unique id, rank %d or nranks %d",
			 rank, nranks);
		return ncclInvalidArgument;
	}
	ncclComm_t c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	pthread_mutex_init(&c->lock, NULL);
	c->fd = -1;
	c->device = emu_current_device();
	c->fail = atomic_fetch_add(&inits, 1) < emu_env_ms("GS_CUDA_EMU_NCCL_FAIL_INITS", 0);
	c->rank = rank;
	c->nranks = nranks;
	c->id = uid;
	c->async = ncclInProgress;
	c->refs = 2;
	pthread_t t;
	if (pthread_create(&t, NULL, connector, c) != 0) {
		free(c);
		return ncclSystemError;
	}
	pthread_detach(t);
	*out = c;
	bool blocking = !config || config->blocking != 0; /* NCCL_CONFIG_UNDEF_INT: blocking */
	if (!blocking) {
		group_pending |= group_depth > 0;
		return ncclInProgress;
	}
	if (group_depth > 0 && group_nblocking < 64) {
		group_blocking[group_nblocking++] = c;
		return ncclSuccess;
	}
	return wait_init(c);
}

EMU_API ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

EMU_API ncclResult_t ncclGroupEnd(void)
{
	if (group_depth == 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	ncclResult_t res = ncclSuccess;
	for (int i = 0; i < group_nblocking; i++) {
		ncclResult_t r = wait_init(group_blocking[i]);
		if (res == ncclSuccess)
			res = r;
	}
	group_nblocking = 0;
	if (res == ncclSuccess && group_pending)
		res = ncclInProgress;
	group_pending = false;
	return res;
}

/* ---- All-reduce ------------------------------------------------------------------------- */

struct allreduce {
	ncclComm_t c;
	const void *send;
	void *recv;
	size_t count;
	int dtype;
	uint32_t seq;
};

static void exchange(const struct allreduce *a)
{
	ncclComm_t c = a->c;
	size_t bytes = a->count * emu_nccl_size(a->dtype);
	struct emu_nccl_request q = { a->seq, a->dtype, a->count };
	struct emu_nccl_reply rep;
	if (emu_send_all(c->fd, &q, sizeof(q)) < 0 || emu_send_all(c->fd, a->send, bytes) < 0 ||
	    emu_recv_all(c->fd, &rep, sizeof(rep)) < 0) {
		set_error(c, ncclSystemError,
			  "the connection to the communicator's root was lost (its process died, or this communicator was aborted)");
		return;
	}
	if (rep.status != 0) {
		rep.msg[sizeof(rep.msg) - 1] = '\0';
		set_error(c, ncclRemoteError, "a peer of this communicator failed, rank %d: %s",
			  (int)rep.rank, rep.msg);
		return;
	}
	if (rep.count != a->count || emu_recv_all(c->fd, a->recv, bytes) < 0)
		set_error(c, ncclSystemError, "the all-reduce's result did not arrive");
}

static cudaError_t run_allreduce(void *arg)
{
	struct allreduce *a = arg;
	if (debug_level() >= 2)
		fprintf(stderr, "NCCL INFO (CUDA emulation) rank %d of %d: all-reduce %u, %zu elements\n",
			a->c->rank, a->c->nranks, a->seq, a->count);
	if (!atomic_load(&a->c->aborted) && atomic_load(&a->c->async) == ncclSuccess)
		exchange(a);
	unref(a->c);
	return cudaSuccess;
}

EMU_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dtype,
				   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	if (!comm || op != ncclSum || !emu_nccl_size(dtype)) {
		snprintf(thread_error, sizeof(thread_error),
			 "the CUDA emulation's NCCL sums fp32, fp16 and bf16 only");
		return ncclInvalidArgument;
	}
	if (atomic_load(&comm->aborted))
		return ncclInvalidUsage;
	int sd = emu_stream_device(stream);
	if ((sd >= 0 && sd != comm->device) || !emu_mem_on_device(send, comm->device) ||
	    !emu_mem_on_device(recv, comm->device)) {
		snprintf(thread_error, sizeof(thread_error),
			 "rank %d's communicator is on device %d, but its stream or buffers are not",
			 comm->rank, comm->device);
		return ncclInvalidArgument;
	}
	struct allreduce a = { comm, send, recv, count, dtype, ++comm->seq };
	atomic_fetch_add(&comm->refs, 1);
	if (emu_enqueue(stream, run_allreduce, &a, sizeof(a)) != cudaSuccess) {
		unref(comm);
		return ncclUnhandledCudaError;
	}
	return ncclSuccess;
}

/* ---- State and errors ---------------------------------------------------------------------- */

EMU_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
	if (!comm || !async)
		return ncclInvalidArgument;
	*async = atomic_load(&comm->async);
	return ncclSuccess;
}

EMU_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess;
	pthread_mutex_lock(&comm->lock);
	atomic_store(&comm->aborted, true);
	if (comm->fd >= 0)
		shutdown(comm->fd, SHUT_RDWR); /* wakes a stream blocked in a collective */
	pthread_mutex_unlock(&comm->lock);
	unref(comm);
	return ncclSuccess;
}

EMU_API const char *ncclGetLastError(ncclComm_t comm)
{
	/* A call refused at once words it for the thread, as NCCL does. */
	return comm && comm->last_error[0] ? comm->last_error : thread_error;
}

EMU_API const char *ncclGetErrorString(ncclResult_t res)
{
	switch (res) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}
