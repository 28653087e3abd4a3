/*
 * Emulated device memory: each cudaMalloc is a memfd mapped shared, so a
 * CUDA IPC handle can name it to another process, which maps the same
 * pages. A table of allocations (own, imported, pinned host) answers the
 * driver's pointer queries. memfds are named "gs-cuda-emu-mem-<pid>" so a
 * test can count another process's mappings in /proc/<pid>/maps.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu.h"

#define MEM_MAGIC "GSEMUMEM"

enum mem_kind { MEM_DEVICE, MEM_IMPORTED, MEM_HOST };

struct range {
	void *base;
	size_t size;
	int device;
	enum mem_kind kind;
};

struct alloc {
	struct alloc *next;
	struct range r;
	int fd; /* own device memory: kept open, for the handle */
	uint64_t ino;
};

/* What a memory handle says: 64 bytes, as cudaIpcMemHandle_t. */
struct mem_handle {
	char magic[8];
	int32_t pid, fd;
	uint64_t size, ino;
	int32_t device; /* the node's GPU, not the exporter's numbering */
	char pad[28];
};
_Static_assert(sizeof(struct mem_handle) == sizeof(cudaIpcMemHandle_t), "handle size");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;

static size_t mapped_size(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	return (size + page - 1) / page * page;
}

static void add(struct alloc *a)
{
	pthread_mutex_lock(&lock);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&lock);
}

/* Unlinks the allocation starting at p of one of the kinds; NULL if none. */
static struct alloc *take(const void *p, enum mem_kind kind)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = NULL;
	for (struct alloc **q = &allocs; *q; q = &(*q)->next) {
		if ((*q)->r.base == p && (*q)->r.kind == kind) {
			a = *q;
			*q = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return a;
}

static struct alloc *find_locked(const void *p)
{
	const char *c = p;
	for (struct alloc *a = allocs; a; a = a->next) {
		const char *b = a->r.base;
		if (c >= b && c < b + (a->r.size ? a->r.size : 1))
			return a;
	}
	return NULL;
}

/* The allocation that holds p; false if none does. */
static bool mem_find(const void *p, struct range *out)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = find_locked(p);
	if (a)
		*out = a->r;
	pthread_mutex_unlock(&lock);
	return a != NULL;
}

/* ---- Allocation ---------------------------------------------------------------- */

EMU_API cudaError_t cudaMalloc(void **p, size_t size)
{
	*p = NULL;
	if (size == 0)
		return cudaSuccess;
	char name[64];
	snprintf(name, sizeof(name), "gs-cuda-emu-mem-%d", (int)getpid());
	struct alloc *a = calloc(1, sizeof(*a));
	int fd = a ? memfd_create(name, MFD_CLOEXEC) : -1;
	struct stat st;
	void *m = MAP_FAILED;
	if (fd >= 0 && ftruncate(fd, (off_t)size) == 0 && fstat(fd, &st) == 0)
		m = mmap(NULL, mapped_size(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		if (fd >= 0)
			close(fd);
		free(a);
		return emu_fail(cudaErrorMemoryAllocation);
	}
	a->r = (struct range){ m, size, emu_current_device(), MEM_DEVICE };
	a->fd = fd;
	a->ino = (uint64_t)st.st_ino;
	add(a);
	*p = m;
	return cudaSuccess;
}

EMU_API cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	struct alloc *a = take(p, MEM_DEVICE);
	if (!a)
		return emu_fail(cudaErrorInvalidValue);
	munmap(a->r.base, mapped_size(a->r.size));
	close(a->fd);
	free(a);
	return cudaSuccess;
}

EMU_API cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags)
{
	*p = NULL;
	struct alloc *a = calloc(1, sizeof(*a));
	void *m = size ? mmap(NULL, mapped_size(size), PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
	if (!a || m == MAP_FAILED) {
		free(a);
		return emu_fail(size ? cudaErrorMemoryAllocation : cudaErrorInvalidValue);
	}
	a->r = (struct range){ m, size, emu_current_device(), MEM_HOST };
	a->fd = -1;
	add(a);
	*p = m;
	return cudaSuccess;
}

EMU_API cudaError_t cudaMallocHost(void **p, size_t size)
{
	return cudaHostAlloc(p, size, cudaHostAllocDefault);
}

EMU_API cudaError_t cudaFreeHost(void *p)
{
	if (!p)
		return cudaSuccess;
	struct alloc *a = take(p, MEM_HOST);
	if (!a)
		return emu_fail(cudaErrorInvalidValue);
	munmap(a->r.base, mapped_size(a->r.size));
	free(a);
	return cudaSuccess;
}

/* ---- IPC ------------------------------------------------------------------------ */

static cudaError_t mem_handle(struct mem_handle *h, const void *p)
{
	memset(h, 0, sizeof(*h));
	pthread_mutex_lock(&lock);
	struct alloc *a = find_locked(p);
	bool ok = a && a->r.kind == MEM_DEVICE;
	if (ok) {
		memcpy(h->magic, MEM_MAGIC, 8);
		h->pid = (int32_t)getpid();
		h->fd = a->fd;
		h->size = a->r.size;
		h->ino = a->ino;
		h->device = emu_node_device(a->r.device);
	}
	pthread_mutex_unlock(&lock);
	return ok ? cudaSuccess : emu_fail(cudaErrorInvalidValue);
}

EMU_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p)
{
	return mem_handle((struct mem_handle *)(void *)handle, p);
}

EMU_API cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned flags)
{
	struct mem_handle h;
	memcpy(&h, &handle, sizeof(h));
	*p = NULL;
	if (memcmp(h.magic, MEM_MAGIC, 8) != 0 || h.size == 0)
		return emu_fail(cudaErrorInvalidValue);
	/* On a GPU this process does not see. */
	int device = emu_device_of_node(h.device);
	if (device < 0)
		return emu_fail(cudaErrorInvalidDevice);
	/* Freed, or its owner gone: as the driver, "mapping ... failed". */
	int fd = emu_open_remote_fd(h.pid, h.fd, h.ino);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != h.size) {
		if (fd >= 0)
			close(fd);
		return emu_fail(cudaErrorMapBufferObjectFailed);
	}
	void *m = mmap(NULL, mapped_size(h.size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd); /* the mapping keeps the memory */
	struct alloc *a = m == MAP_FAILED ? NULL : calloc(1, sizeof(*a));
	if (!a) {
		if (m != MAP_FAILED)
			munmap(m, mapped_size(h.size));
		return emu_fail(cudaErrorMapBufferObjectFailed);
	}
	a->r = (struct range){ m, h.size, device, MEM_IMPORTED };
	a->fd = -1;
	a->ino = h.ino;
	add(a);
	*p = m;
	return cudaSuccess;
}

EMU_API cudaError_t cudaIpcCloseMemHandle(void *p)
{
	struct alloc *a = take(p, MEM_IMPORTED);
	if (!a)
		return emu_fail(cudaErrorInvalidValue);
	munmap(a->r.base, mapped_size(a->r.size));
	free(a);
	return cudaSuccess;
}

bool emu_mem_on_device(const void *p, int device)
{
	struct range r;
	return mem_find(p, &r) && (r.kind == MEM_HOST || r.device == device);
}

/* ---- Driver queries ---------------------------------------------------------------- */

EMU_API CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p)
{
	return emu_cu_result(mem_handle((struct mem_handle *)(void *)handle,
					(const void *)(uintptr_t)p));
}

EMU_API CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	struct range r;
	if (!mem_find((const void *)(uintptr_t)p, &r) || r.kind == MEM_HOST)
		return CUDA_ERROR_NOT_FOUND;
	if (base)
		*base = (CUdeviceptr)(uintptr_t)r.base;
	if (size)
		*size = r.size;
	return CUDA_SUCCESS;
}

EMU_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
	struct range r;
	if (!mem_find((const void *)(uintptr_t)p, &r))
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = emu_context(r.device);
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = r.kind == MEM_HOST ? CU_MEMORYTYPE_HOST
							  : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = r.device;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = r.kind == MEM_DEVICE;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* The runtime's question, as gradsyncd asks it of a trainer's memory. */
EMU_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
	struct range r;
	memset(a, 0, sizeof(*a));
	a->device = -1;
	if (!mem_find(p, &r))
		return cudaSuccess; /* unregistered host memory, as CUDA 11+ says */
	a->type = r.kind == MEM_HOST ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
	a->device = r.device;
	a->devicePointer = (void *)p;
	a->hostPointer = r.kind == MEM_HOST ? (void *)p : NULL;
	return cudaSuccess;
}

/* ---- Copies ------------------------------------------------------------------------- */

/* Host and device memory are both this process's memory: every kind of
 * copy is a memcpy, done in stream order. */
struct copy {
	void *dst;
	const void *src;
	size_t n;
	int value; /* memset: the byte; copies: -1 */
};

static cudaError_t run_copy(void *arg)
{
	struct copy *c = arg;
	if (c->value >= 0)
		memset(c->dst, c->value, c->n);
	else if (c->n)
		memmove(c->dst, c->src, c->n);
	return cudaSuccess;
}

EMU_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
				    cudaStream_t s)
{
	struct copy c = { dst, src, n, -1 };
	return emu_enqueue(s, run_copy, &c, sizeof(c));
}

EMU_API cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
	struct copy c = { dst, NULL, n, value & 0xff };
	return emu_enqueue(s, run_copy, &c, sizeof(c));
}

/* The synchronous ones run after the default stream's work, as there. */
EMU_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, NULL);
	return e == cudaSuccess ? cudaStreamSynchronize(NULL) : e;
}

EMU_API cudaError_t cudaMemset(void *dst, int value, size_t n)
{
	cudaError_t e = cudaMemsetAsync(dst, value, n, NULL);
	return e == cudaSuccess ? cudaStreamSynchronize(NULL) : e;
}
