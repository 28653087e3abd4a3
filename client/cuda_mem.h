/*
 * CUDA allocations as libgradsync hands them to gradsyncd, for gradients
 * (cuda.c) and state (cuda_state.c) alike. Caching allocators hand out
 * pieces of larger allocations, and CUDA IPC exports whole allocations:
 * so each tensor is sent as (base allocation, offset), and each base
 * allocation once, as a Buffer holding its IPC handle, its size and its
 * device. All of one registration's tensors are on one GPU, in one context.
 */
#ifndef GS_CLIENT_CUDA_MEM_H
#define GS_CLIENT_CUDA_MEM_H

#include "client.h"
#include "cuda_driver.h"

struct gs__cuda_alloc {
	gs__cu_ptr base;
	uint64_t size;
	gs__cu_ipc_handle handle;
};

struct gs__cuda_mem {
	const struct gs__cu *cu;
	void *ctx; /* the tensors' context */
	int device;
	char pci[32];
	const char *first; /* the first tensor's name, for messages while locating */
	struct gs__cuda_alloc *allocs;
	size_t nallocs;
};

/* Loads the driver and makes room for n allocations (a tensor each at
 * most). Returns GS_OK or the error; gs__cuda_mem_free undoes it either way. */
int gs__cuda_mem_init(struct gs_client *c, struct gs__cuda_mem *m, size_t n);
void gs__cuda_mem_free(struct gs__cuda_mem *m);

/* Tensor i, bytes at data, named name: checks it is IPC-exportable device
 * memory of the registration's GPU (the first tensor sets it) and finds
 * its allocation, numbered from 0 by first use, and its offset there. */
int gs__cuda_mem_locate(struct gs_client *c, struct gs__cuda_mem *m, size_t i, const char *name,
			void *data, uint64_t bytes, uint32_t *alloc, uint64_t *offset);
/* The allocations' IPC handles and the device's PCI bus id. */
int gs__cuda_mem_handles(struct gs_client *c, struct gs__cuda_mem *m);

/* The Buffer of the device (no memory), and of allocation a. */
Gradsync__Buffer gs__cuda_mem_device_buffer(const struct gs__cuda_mem *m);
Gradsync__Buffer gs__cuda_mem_alloc_buffer(const struct gs__cuda_mem *m, size_t a);

/* The tensors' context made current on this thread, and back. */
int gs__cuda_mem_push(struct gs_client *c, const struct gs__cuda_mem *m);
void gs__cuda_mem_pop(const struct gs__cuda_mem *m);
/* gs__fail with what and the driver's words for r. */
int gs__cuda_mem_fail(struct gs_client *c, const struct gs__cuda_mem *m, int code,
		      const char *what, gs__cu_result r);

#endif
