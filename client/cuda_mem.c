/*
 * CUDA allocations, found and exported for gradsyncd: see cuda_mem.h.
 */
#include "cuda_mem.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int gs__cuda_mem_fail(struct gs_client *c, const struct gs__cuda_mem *m, int code,
		      const char *what, gs__cu_result r)
{
	return gs__fail(c, code, "%s: %s", what, gs__cu_error(m->cu, r));
}

int gs__cuda_mem_push(struct gs_client *c, const struct gs__cuda_mem *m)
{
	gs__cu_result r = m->cu->ctx_push_current(m->ctx);
	return r == GS_CU_SUCCESS
		       ? GS_OK
		       : gs__cuda_mem_fail(c, m, GS_ESYSTEM,
					   "cannot make the tensors' CUDA context current", r);
}

void gs__cuda_mem_pop(const struct gs__cuda_mem *m)
{
	void *ctx;
	m->cu->ctx_pop_current(&ctx);
}

int gs__cuda_mem_init(struct gs_client *c, struct gs__cuda_mem *m, size_t n)
{
	char why[256];
	m->cu = gs__cu_load(why, sizeof(why));
	if (!m->cu)
		return gs__fail(c, GS_ESYSTEM, "%s", why);
	m->allocs = calloc(n, sizeof(*m->allocs));
	return m->allocs ? GS_OK : gs__fail(c, GS_ENOMEM, "out of memory");
}

void gs__cuda_mem_free(struct gs__cuda_mem *m)
{
	free(m->allocs);
	m->allocs = NULL;
	m->nallocs = 0;
}

/* The device and context of the first tensor; every other must match. */
static int check_device(struct gs_client *c, struct gs__cuda_mem *m, size_t i, const char *name,
			void *data)
{
	const struct gs__cu *cu = m->cu;
	gs__cu_ptr p = (gs__cu_ptr)(uintptr_t)data;
	unsigned type = 0;
	int ordinal = -1, ipc = 0;
	void *ctx = NULL;
	gs__cu_result r = cu->pointer_get_attribute(&type, GS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
	if (r != GS_CU_SUCCESS || type != GS_CU_MEMORYTYPE_DEVICE)
		return gs__fail(c, GS_EBUFFER, "tensor '%s': %p is not CUDA device memory", name, data);
	r = cu->pointer_get_attribute(&ordinal, GS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	if (r == GS_CU_SUCCESS)
		r = cu->pointer_get_attribute(&ctx, GS_CU_POINTER_ATTRIBUTE_CONTEXT, p);
	if (r != GS_CU_SUCCESS)
		return gs__cuda_mem_fail(c, m, GS_ESYSTEM, "cuPointerGetAttribute", r);
	if (cu->pointer_get_attribute(&ipc, GS_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
				      p) == GS_CU_SUCCESS && !ipc)
		return gs__fail(c, GS_EBUFFER,
			       "tensor '%s' is in memory that CUDA IPC handles cannot export (cudaMallocManaged, or cuMemCreate as PyTorch's expandable_segments uses)",
			       name);
	if (i == 0) {
		m->device = ordinal;
		m->ctx = ctx;
		m->first = name;
	} else if (ordinal != m->device) {
		return gs__fail(c, GS_EINVAL,
			       "tensor '%s' is on GPU %d, tensor '%s' on GPU %d: register one GPU's tensors per connection",
			       name, ordinal, m->first, m->device);
	}
	return GS_OK;
}

/* Allocations are numbered by first use, so a tensor's allocation is sent
 * with it or before it; n tensors have at most n allocations. */
static uint32_t find_alloc(struct gs__cuda_mem *m, gs__cu_ptr base, uint64_t size)
{
	for (size_t a = 0; a < m->nallocs; a++)
		if (m->allocs[a].base == base)
			return (uint32_t)a;
	m->allocs[m->nallocs].base = base;
	m->allocs[m->nallocs].size = size;
	return (uint32_t)m->nallocs++;
}

int gs__cuda_mem_locate(struct gs_client *c, struct gs__cuda_mem *m, size_t i, const char *name,
			void *data, uint64_t bytes, uint32_t *alloc, uint64_t *offset)
{
	int r = check_device(c, m, i, name, data);
	if (r < 0)
		return r;
	gs__cu_ptr p = (gs__cu_ptr)(uintptr_t)data, base = 0;
	size_t size = 0;
	/* The query needs a current context, which the caller's thread may
	 * lack: the tensors' own, as for every other call. */
	r = gs__cuda_mem_push(c, m);
	if (r < 0)
		return r;
	gs__cu_result res = m->cu->mem_get_address_range(&base, &size, p);
	gs__cuda_mem_pop(m);
	if (res != GS_CU_SUCCESS)
		return gs__cuda_mem_fail(c, m, GS_EBUFFER, "cuMemGetAddressRange", res);
	if (p < base || p - base > size || bytes > size - (p - base))
		return gs__fail(c, GS_EBUFFER,
			       "tensor '%s' (%" PRIu64 " bytes at %p) runs past the end of its allocation of %zu bytes",
			       name, bytes, data, size);
	*alloc = find_alloc(m, base, size);
	*offset = p - base;
	return GS_OK;
}

int gs__cuda_mem_handles(struct gs_client *c, struct gs__cuda_mem *m)
{
	const struct gs__cu *cu = m->cu;
	int r = gs__cuda_mem_push(c, m);
	if (r < 0)
		return r;
	const char *what = "cuIpcGetMemHandle";
	gs__cu_result res = GS_CU_SUCCESS;
	for (size_t a = 0; a < m->nallocs && res == GS_CU_SUCCESS; a++)
		res = cu->ipc_get_mem_handle(&m->allocs[a].handle, m->allocs[a].base);
	int dev = 0;
	if (res == GS_CU_SUCCESS) {
		what = "cuDeviceGetPCIBusId";
		res = cu->device_get(&dev, m->device);
	}
	if (res == GS_CU_SUCCESS)
		res = cu->device_get_pci_bus_id(m->pci, (int)sizeof(m->pci), dev);
	gs__cuda_mem_pop(m);
	return res == GS_CU_SUCCESS ? GS_OK : gs__cuda_mem_fail(c, m, GS_ESYSTEM, what, res);
}

Gradsync__Buffer gs__cuda_mem_device_buffer(const struct gs__cuda_mem *m)
{
	Gradsync__Buffer b = GRADSYNC__BUFFER__INIT;
	b.device = m->device;
	b.pci_bus_id = (char *)m->pci;
	return b;
}

Gradsync__Buffer gs__cuda_mem_alloc_buffer(const struct gs__cuda_mem *m, size_t a)
{
	Gradsync__Buffer b = gs__cuda_mem_device_buffer(m);
	b.size = m->allocs[a].size;
	b.cuda_ipc_handle.len = sizeof(m->allocs[a].handle);
	b.cuda_ipc_handle.data = (uint8_t *)m->allocs[a].handle.reserved;
	return b;
}
