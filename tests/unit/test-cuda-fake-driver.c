/*
 * The fake CUDA driver (see test-cuda-fake-driver.h). Only the calls
 * libgradsync's cuda_driver.c loads exist; each behaves as the real one
 * does for the cases the tests need, and returns CUDA_ERROR_INVALID_VALUE
 * (1) for what it does not know.
 */
#include "test-cuda-fake-driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_INVALID_VALUE 1
#define ERR_INVALID_CONTEXT 201
#define ERR_INVALID_HANDLE 400
#define MAX_ALLOCS 256
#define MAX_EVENTS 64

/* Exported with default visibility: libgradsync dlsyms these. */
#define API __attribute__((visibility("default")))

struct alloc {
	uint64_t base, size;
	int device, flags;
};

static struct alloc allocs[MAX_ALLOCS];
static size_t nallocs;
static struct fake_cuda_event events[MAX_EVENTS];
static size_t nevents;
static uint64_t next_base = UINT64_C(0x7f0000000000);
static int depth;

API void fake_cuda_reset(void)
{
	nallocs = 0;
	nevents = 0;
	depth = 0;
	memset(events, 0, sizeof(events));
}

API uint64_t fake_cuda_alloc(uint64_t size, int device, int flags)
{
	struct alloc *a = &allocs[nallocs++];
	a->base = next_base;
	a->size = size;
	a->device = device;
	a->flags = flags;
	next_base += (size + (UINT64_C(2) << 20) + 0x1fffff) & ~UINT64_C(0x1fffff);
	return a->base;
}

API const struct fake_cuda_event *fake_cuda_event(uint64_t id)
{
	return id >= 1 && id <= nevents ? &events[id - 1] : NULL;
}

API int fake_cuda_ctx_depth(void)
{
	return depth;
}

static const struct alloc *find(uint64_t ptr)
{
	for (size_t i = 0; i < nallocs; i++)
		if (ptr >= allocs[i].base && ptr < allocs[i].base + allocs[i].size)
			return &allocs[i];
	return NULL;
}

static void *ctx_of(int device)
{
	return (void *)(uintptr_t)(0xc000 + device);
}

API int cuInit(unsigned flags)
{
	return flags == 0 ? 0 : ERR_INVALID_VALUE;
}

API int cuPointerGetAttribute(void *data, int attribute, uint64_t ptr)
{
	const struct alloc *a = find(ptr);
	if (!a)
		return ERR_INVALID_VALUE;
	switch (attribute) {
	case 1: /* CONTEXT */
		*(void **)data = ctx_of(a->device);
		return 0;
	case 2: /* MEMORY_TYPE: device */
		*(unsigned *)data = 2;
		return 0;
	case 9: /* DEVICE_ORDINAL */
		*(int *)data = a->device;
		return 0;
	case 10: /* IS_LEGACY_CUDA_IPC_CAPABLE, a bool-sized answer */
		*(unsigned char *)data = !(a->flags & FAKE_CUDA_NOT_IPC);
		return 0;
	}
	return ERR_INVALID_VALUE;
}

API int cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t ptr)
{
	/* As the real one, it needs a current context. */
	if (depth == 0)
		return ERR_INVALID_CONTEXT;
	const struct alloc *a = find(ptr);
	if (!a)
		return ERR_INVALID_VALUE;
	*base = a->base;
	*size = a->size;
	return 0;
}

API int cuIpcGetMemHandle(struct fake_cuda_handle *h, uint64_t ptr)
{
	const struct alloc *a = find(ptr);
	if (!a || a->base != ptr || (a->flags & FAKE_CUDA_NOT_IPC))
		return ERR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, "FAKEIPC", 8);
	h->base_or_id = a->base;
	h->size = a->size;
	return 0;
}

API int cuDeviceGet(int *device, int ordinal)
{
	*device = ordinal;
	return 0;
}

API int cuDeviceGetPCIBusId(char *id, int len, int device)
{
	snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + device);
	return 0;
}

API int cuCtxPushCurrent_v2(void *ctx)
{
	if ((uintptr_t)ctx < 0xc000 || (uintptr_t)ctx > 0xc0ff)
		return ERR_INVALID_HANDLE;
	depth++;
	return 0;
}

API int cuCtxPopCurrent_v2(void **ctx)
{
	if (depth == 0)
		return ERR_INVALID_VALUE;
	depth--;
	*ctx = NULL;
	return 0;
}

static struct fake_cuda_event *event_of(void *ev)
{
	uintptr_t id = (uintptr_t)ev;
	return id >= 1 && id <= nevents ? &events[id - 1] : NULL;
}

API int cuEventCreate(void **ev, unsigned flags)
{
	if (depth == 0 || nevents == MAX_EVENTS)
		return ERR_INVALID_VALUE; /* no current context */
	events[nevents].flags = flags;
	*ev = (void *)(uintptr_t)++nevents;
	return 0;
}

API int cuEventDestroy_v2(void *ev)
{
	struct fake_cuda_event *e = event_of(ev);
	if (!e)
		return ERR_INVALID_HANDLE;
	e->destroyed++;
	return 0;
}

API int cuIpcGetEventHandle(struct fake_cuda_handle *h, void *ev)
{
	struct fake_cuda_event *e = event_of(ev);
	/* As the real one: only for interprocess events without timing. */
	if (!e || (e->flags & 0x6) != 0x6)
		return ERR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, "FAKEEVT", 8);
	h->base_or_id = (uint64_t)(uintptr_t)ev;
	return 0;
}

API int cuEventRecord(void *ev, void *stream)
{
	struct fake_cuda_event *e = event_of(ev);
	if (!e || depth == 0)
		return ERR_INVALID_HANDLE;
	e->records++;
	e->last_record_stream = stream;
	return 0;
}

API int cuStreamWaitEvent(void *stream, void *ev, unsigned flags)
{
	struct fake_cuda_event *e = event_of(ev);
	if (!e || flags != 0)
		return ERR_INVALID_HANDLE;
	e->waits++;
	e->last_wait_stream = stream;
	return 0;
}

API int cuGetErrorString(int r, const char **text)
{
	static char buf[64];
	snprintf(buf, sizeof(buf), "fake CUDA error %d", r);
	*text = buf;
	return 0;
}
