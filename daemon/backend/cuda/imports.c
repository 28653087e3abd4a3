/*
 * Trainers' CUDA IPC handles, on the loop thread, which alone touches the
 * list of imports: each base allocation is opened once however many
 * tensors it holds, checked against what the trainer claims, and closed
 * when the last tensor in it goes; a trainer's pair of events likewise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"
#include "support/log.h"

static struct cuda_import *find_handle(struct cuda_backend *cb, const uint8_t *handle)
{
	for (struct cuda_import *im = cb->imports; im; im = im->next)
		if (im->kind == GS_BUFFER_CUDA && !memcmp(im->handle, handle, sizeof(im->handle)))
			return im;
	return NULL;
}

/* Another local rank bound to device, or -1. */
static int rank_on(const struct cuda_backend *cb, int device)
{
	for (unsigned r = 0; r < cb->n; r++)
		if (cb->rank[r].bound && cb->rank[r].device == device)
			return (int)r;
	return -1;
}

/* The GPU the buffer's PCI bus id names, as this daemon numbers them (the
 * trainer's own numbering may differ: CUDA_VISIBLE_DEVICES), must be one
 * it may use, and the local rank's: its first buffer binds the rank to it,
 * a GPU no other rank has, as NCCL takes one rank of a communicator per
 * GPU. */
static int check_device(struct cuda_backend *cb, const struct gs_buffer_desc *d, char *err,
			size_t n)
{
	if (d->rank >= cb->n) {
		snprintf(err, n, "local rank %u has no GPU here", d->rank);
		return GS_EINVAL;
	}
	if (!d->pci_bus_id[0]) {
		snprintf(err, n, "it names no PCI bus id, by which gradsyncd finds the GPU that holds it (the trainer's device %d means nothing here)",
			 (int)d->device);
		return GS_EBUFFER;
	}
	int dev = -1;
	if (cudaDeviceGetByPCIBusId(&dev, d->pci_bus_id) != cudaSuccess || dev < 0 ||
	    dev >= MAX_DEVICES) {
		cudaGetLastError();
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");
		snprintf(err, n, "it is on GPU %s, which this gradsyncd does not see%s%s%s",
			 d->pci_bus_id, vis ? " (its CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "",
			 vis ? ")" : "");
		return GS_EBUFFER;
	}
	if (!cb->allowed[dev]) {
		snprintf(err, n, "it is on GPU %s, which is not one this gradsyncd may use (--gpus %s)",
			 d->pci_bus_id, cb->gpus);
		return GS_EBUFFER;
	}
	const struct cuda_rank *rk = &cb->rank[d->rank];
	if (rk->bound && rk->device == dev)
		return GS_OK;
	if (rk->bound) {
		snprintf(err, n, "it is on GPU %s, but local rank %u reduces on GPU %s, where its first buffer was: a local rank's tensors must all be on that one GPU",
			 d->pci_bus_id, d->rank, rk->pci);
		return GS_EBUFFER;
	}
	int other = rank_on(cb, dev);
	if (other >= 0) {
		snprintf(err, n, "local ranks %d and %u are both on GPU %s, but NCCL takes one rank of a communicator per GPU: run each local rank on a GPU of its own",
			 other, d->rank, cb->rank[other].pci);
		return GS_EBUFFER;
	}
	return cuda_bind_rank(cb, d->rank, dev, err, n);
}

/* The allocation must be at least as large as the trainer says, or a
 * tensor could reach past it into other memory of this process. */
static int check_range(struct cuda_backend *cb, void *ptr, uint64_t size, char *err, size_t n)
{
	CUdeviceptr base = 0;
	size_t have = 0;
	if (!cb->mem_range)
		return GS_OK;
	CUresult res = cb->mem_range(&base, &have, (CUdeviceptr)(uintptr_t)ptr);
	if (res != CUDA_SUCCESS) {
		gs_warn("cuda: cuMemGetAddressRange of an imported allocation failed (%d); its size is taken on trust",
			(int)res);
		return GS_OK;
	}
	if (base == (CUdeviceptr)(uintptr_t)ptr && have >= size)
		return GS_OK;
	snprintf(err, n, "the trainer says its allocation has %llu bytes, but the one its handle opens has %zu",
		 (unsigned long long)size, have);
	return GS_EBUFFER;
}

static int import_memory(struct cuda_backend *cb, const struct gs_buffer_desc *d, void **addr,
			 char *err, size_t n)
{
	struct cuda_import *im = find_handle(cb, d->handle);
	if (im) {
		if (im->rank != d->rank || d->size > im->size) {
			snprintf(err, n, "its allocation is already registered by local rank %u with %llu bytes",
				 im->rank, (unsigned long long)im->size);
			return GS_EBUFFER;
		}
		im->refs++;
		*addr = im->ptr;
		return GS_OK;
	}
	const struct cuda_rank *rk = &cb->rank[d->rank];
	cudaSetDevice(rk->device);
	cudaIpcMemHandle_t h;
	memcpy(&h, d->handle, sizeof(h));
	void *ptr = NULL;
	cudaError_t e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, n, "cannot open its CUDA IPC handle: %s (is the trainer on this node, and the allocation still alive?)",
			 cudaGetErrorString(e));
		return GS_EBUFFER;
	}
	int rc = check_range(cb, ptr, d->size, err, n);
	im = rc == GS_OK ? calloc(1, sizeof(*im)) : NULL;
	if (!im) {
		cudaIpcCloseMemHandle(ptr);
		if (rc == GS_OK)
			snprintf(err, n, "out of memory");
		return rc == GS_OK ? GS_ENOMEM : rc;
	}
	im->kind = GS_BUFFER_CUDA;
	im->rank = d->rank;
	im->refs = 1;
	memcpy(im->handle, d->handle, sizeof(im->handle));
	im->ptr = ptr;
	im->size = d->size;
	im->next = cb->imports;
	cb->imports = im;
	*addr = ptr;
	return GS_OK;
}

static cudaError_t open_event(cudaEvent_t *ev, const uint8_t *handle)
{
	cudaIpcEventHandle_t h;
	memcpy(&h, handle, sizeof(h));
	return cudaIpcOpenEventHandle(ev, h);
}

static int import_events(struct cuda_backend *cb, const struct gs_buffer_desc *d, void **addr,
			 char *err, size_t n)
{
	struct cuda_rank *rk = &cb->rank[d->rank];
	struct cuda_import *im = calloc(1, sizeof(*im));
	if (!im) {
		snprintf(err, n, "out of memory");
		return GS_ENOMEM;
	}
	cudaSetDevice(rk->device);
	/* The ring's first is the ready event; without a ring, it alone. */
	const uint8_t *ready1 = d->nring ? d->ready_ring[0] : d->ready_event;
	cudaError_t e = open_event(&im->ring[0], ready1);
	if (e == cudaSuccess)
		im->nring = 1;
	for (size_t i = 1; e == cudaSuccess && i < d->nring; i++)
		if ((e = open_event(&im->ring[i], d->ready_ring[i])) == cudaSuccess)
			im->nring++;
	if (e == cudaSuccess)
		e = open_event(&im->done, d->done_event);
	if (e != cudaSuccess) {
		cudaGetLastError();
		for (unsigned i = 0; i < im->nring; i++)
			cudaEventDestroy(im->ring[i]);
		free(im);
		snprintf(err, n, "cannot open its CUDA IPC events: %s (were they created with cudaEventInterprocess?)",
			 cudaGetErrorString(e));
		return GS_EBUFFER;
	}
	im->kind = GS_BUFFER_CUDA_EVENTS;
	im->rank = d->rank;
	im->refs = 1;
	im->next = cb->imports;
	cb->imports = im;
	atomic_store(&rk->events, im);
	*addr = im;
	return GS_OK;
}

int cuda_import_buffer(struct gs_backend *b, const struct gs_buffer_desc *d, void **addr,
		       char *err, size_t n)
{
	struct cuda_backend *cb = cuda(b);
	if (d->kind == GS_BUFFER_MEMFD) {
		snprintf(err, n, "it is shared memory, but this gradsyncd runs the cuda backend, which reduces GPU memory: register CUDA tensors (gs_register_cuda, gs_register_state_cuda)");
		return GS_EBUFFER;
	}
	int rc = check_device(cb, d, err, n);
	if (rc != GS_OK)
		return rc;
	if (d->kind == GS_BUFFER_CUDA_EVENTS)
		return import_events(cb, d, addr, err, n);
	return import_memory(cb, d, addr, err, n);
}

void cuda_close_import(struct cuda_backend *cb, struct cuda_import *im)
{
	struct cuda_rank *rk = &cb->rank[im->rank];
	cudaSetDevice(rk->device);
	if (im->kind == GS_BUFFER_CUDA_EVENTS) {
		struct cuda_import *mine = im;
		atomic_compare_exchange_strong(&rk->events, &mine, NULL);
		for (unsigned i = 0; i < im->nring; i++)
			cudaEventDestroy(im->ring[i]);
		cudaEventDestroy(im->done);
	} else {
		cudaIpcCloseMemHandle(im->ptr);
	}
	free(im);
}

void cuda_release_buffer(struct gs_backend *b, void *addr, uint64_t size)
{
	struct cuda_backend *cb = cuda(b);
	for (struct cuda_import **p = &cb->imports; *p; p = &(*p)->next) {
		struct cuda_import *im = *p;
		bool match = im->kind == GS_BUFFER_CUDA_EVENTS ? (void *)im == addr : im->ptr == addr;
		if (!match)
			continue;
		if (--im->refs == 0) {
			*p = im->next;
			cuda_close_import(cb, im);
		}
		return;
	}
}
