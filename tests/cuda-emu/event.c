/*
 * Emulated events. An event's state is two counters: how many records
 * were queued, and which of them a stream has reached. cudaStreamWaitEvent
 * takes the queued count at the time of the call (as CUDA waits for the
 * latest record then) and the waiting stream's thread blocks until the
 * reached count gets there. Interprocess events keep their counters in a
 * memfd that the IPC handle names, so a wait in one process sees a record
 * in another. A wait gives up when the recording process has died (its
 * work died with it) or after GS_CUDA_EMU_WAIT_LIMIT_MS (default 60 s),
 * so nothing in the tests hangs.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>

#include "emu.h"

#define EVT_MAGIC "GSEMUEVT"

struct ev_shared {
	char magic[8];
	_Atomic uint32_t recorded, completed;
	_Atomic int32_t recorder; /* pid of the last record */
};

struct CUevent_st {
	struct ev_shared *sh;
	_Atomic int refs; /* the user's, and one per queued record or wait */
	int fd;           /* own interprocess events: kept for the handle */
	uint64_t ino;
	unsigned flags;
};

struct ev_handle {
	char magic[8];
	int32_t pid, fd;
	uint64_t ino;
	char pad[40];
};
_Static_assert(sizeof(struct ev_handle) == sizeof(cudaIpcEventHandle_t), "handle size");

static void unref(struct CUevent_st *ev)
{
	if (atomic_fetch_sub(&ev->refs, 1) != 1)
		return;
	if (ev->fd == -2) {
		free(ev->sh);
	} else {
		munmap(ev->sh, sizeof(*ev->sh));
		if (ev->fd >= 0)
			close(ev->fd);
	}
	free(ev);
}

static struct ev_shared *shared_state(int *fd, uint64_t *ino)
{
	char name[64];
	snprintf(name, sizeof(name), "gs-cuda-emu-event-%d", (int)getpid());
	*fd = memfd_create(name, MFD_CLOEXEC);
	struct stat st;
	if (*fd < 0 || ftruncate(*fd, sizeof(struct ev_shared)) < 0 || fstat(*fd, &st) < 0)
		goto fail;
	*ino = (uint64_t)st.st_ino;
	void *m = mmap(NULL, sizeof(struct ev_shared), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (m != MAP_FAILED)
		return m;
fail:
	if (*fd >= 0)
		close(*fd);
	return NULL;
}

static cudaError_t event_create(cudaEvent_t *out, unsigned flags)
{
	struct CUevent_st *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return emu_fail(cudaErrorMemoryAllocation);
	if (flags & cudaEventInterprocess) {
		ev->sh = shared_state(&ev->fd, &ev->ino);
	} else {
		ev->fd = -2; /* private: plain memory */
		ev->sh = calloc(1, sizeof(*ev->sh));
	}
	if (!ev->sh) {
		free(ev);
		return emu_fail(cudaErrorMemoryAllocation);
	}
	memcpy(ev->sh->magic, EVT_MAGIC, 8);
	ev->flags = flags;
	ev->refs = 1;
	*out = ev;
	return cudaSuccess;
}

static cudaError_t event_destroy(cudaEvent_t ev)
{
	if (!ev)
		return emu_fail(cudaErrorInvalidResourceHandle);
	unref(ev);
	return cudaSuccess;
}

/* ---- Record and wait ------------------------------------------------------------ */

struct ev_op {
	struct CUevent_st *ev;
	uint32_t seq;
};

static cudaError_t run_record(void *arg)
{
	struct ev_op *o = arg;
	_Atomic uint32_t *done = &o->ev->sh->completed;
	uint32_t cur = atomic_load(done);
	while ((int32_t)(o->seq - cur) > 0 && !atomic_compare_exchange_weak(done, &cur, o->seq))
		;
	emu_futex_wake(done);
	unref(o->ev);
	return cudaSuccess;
}

static bool gone(pid_t pid)
{
	return pid > 0 && pid != getpid() && kill(pid, 0) < 0 && errno == ESRCH;
}

static cudaError_t run_wait(void *arg)
{
	struct ev_op *o = arg;
	struct ev_shared *sh = o->ev->sh;
	long limit = emu_env_ms("GS_CUDA_EMU_WAIT_LIMIT_MS", 60000), waited = 0;
	cudaError_t e = cudaSuccess;
	for (;;) {
		uint32_t cur = atomic_load(&sh->completed);
		if ((int32_t)(cur - o->seq) >= 0 || gone(atomic_load(&sh->recorder)))
			break;
		if (waited >= limit) {
			fprintf(stderr, "CUDA emulation: a stream waited %ld ms for an event; giving up\n",
				waited);
			e = cudaErrorLaunchTimeout;
			break;
		}
		emu_futex_wait(&sh->completed, cur, 20);
		waited += 20;
	}
	unref(o->ev);
	return e;
}

static cudaError_t event_record(cudaEvent_t ev, cudaStream_t s)
{
	if (!ev)
		return emu_fail(cudaErrorInvalidResourceHandle);
	struct ev_op o = { ev, atomic_fetch_add(&ev->sh->recorded, 1) + 1 };
	atomic_store(&ev->sh->recorder, (int32_t)getpid());
	atomic_fetch_add(&ev->refs, 1);
	cudaError_t e = emu_enqueue(s, run_record, &o, sizeof(o));
	if (e != cudaSuccess)
		unref(ev);
	return e;
}

static cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t ev)
{
	if (!ev)
		return emu_fail(cudaErrorInvalidResourceHandle);
	struct ev_op o = { ev, atomic_load(&ev->sh->recorded) };
	if (o.seq == 0)
		return cudaSuccess; /* never recorded: nothing to wait for */
	atomic_fetch_add(&ev->refs, 1);
	cudaError_t e = emu_enqueue(s, run_wait, &o, sizeof(o));
	if (e != cudaSuccess)
		unref(ev);
	return e;
}

/* ---- IPC ---------------------------------------------------------------------------- */

static cudaError_t event_ipc_handle(cudaIpcEventHandle_t *out, cudaEvent_t ev)
{
	if (!ev || ev->fd < 0)
		return emu_fail(cudaErrorInvalidResourceHandle);
	struct ev_handle h;
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, EVT_MAGIC, 8);
	h.pid = (int32_t)getpid();
	h.fd = ev->fd;
	h.ino = ev->ino;
	memcpy(out, &h, sizeof(h));
	return cudaSuccess;
}

static cudaError_t open_event(cudaEvent_t *out, const void *handle)
{
	struct ev_handle h;
	memcpy(&h, handle, sizeof(h));
	if (memcmp(h.magic, EVT_MAGIC, 8) != 0)
		return emu_fail(cudaErrorInvalidValue);
	int fd = emu_open_remote_fd(h.pid, h.fd, h.ino);
	if (fd < 0)
		return emu_fail(cudaErrorMapBufferObjectFailed);
	void *m = mmap(NULL, sizeof(struct ev_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	struct CUevent_st *ev = m == MAP_FAILED ? NULL : calloc(1, sizeof(*ev));
	if (!ev) {
		if (m != MAP_FAILED)
			munmap(m, sizeof(struct ev_shared));
		return emu_fail(cudaErrorMapBufferObjectFailed);
	}
	ev->sh = m;
	ev->fd = -1; /* imported: no handle of its own */
	ev->flags = cudaEventInterprocess | cudaEventDisableTiming;
	ev->refs = 1;
	*out = ev;
	return cudaSuccess;
}

/* ---- Runtime and driver API ------------------------------------------------------------ */

EMU_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags)
{
	return event_create(ev, flags);
}

EMU_API cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
	return event_create(ev, cudaEventDefault);
}

EMU_API cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
	return event_destroy(ev);
}

EMU_API cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
	return event_record(ev, s);
}

EMU_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags)
{
	return stream_wait_event(s, ev);
}

EMU_API cudaError_t cudaEventQuery(cudaEvent_t ev)
{
	uint32_t want = atomic_load(&ev->sh->recorded);
	return (int32_t)(atomic_load(&ev->sh->completed) - want) >= 0 ? cudaSuccess
								       : cudaErrorNotReady;
}

EMU_API cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
	struct ev_op o = { ev, atomic_load(&ev->sh->recorded) };
	atomic_fetch_add(&ev->refs, 1);
	return emu_fail(run_wait(&o));
}

EMU_API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t ev)
{
	return event_ipc_handle(h, ev);
}

EMU_API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *ev, cudaIpcEventHandle_t h)
{
	return open_event(ev, &h);
}

EMU_API CUresult cuEventCreate(CUevent *ev, unsigned flags)
{
	/* CU_EVENT_DISABLE_TIMING and CU_EVENT_INTERPROCESS have the runtime's values. */
	return emu_cu_result(event_create(ev, flags));
}

EMU_API CUresult cuEventDestroy(CUevent ev)
{
	return emu_cu_result(event_destroy(ev));
}

EMU_API CUresult cuEventRecord(CUevent ev, CUstream s)
{
	return emu_cu_result(event_record(ev, s));
}

EMU_API CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned flags)
{
	return emu_cu_result(stream_wait_event(s, ev));
}

EMU_API CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev)
{
	return emu_cu_result(event_ipc_handle((cudaIpcEventHandle_t *)(void *)h, ev));
}
