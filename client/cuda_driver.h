/*
 * The few CUDA driver API calls libgradsync makes for CUDA tensors, loaded
 * with dlopen("libcuda.so.1") on first use: the library has no link-time
 * dependency on CUDA, so it loads on machines without a GPU, and only
 * gs_register_cuda() and friends fail there. The types and constants are
 * the driver's own (cuda.h), restated here so that building the library
 * needs no CUDA headers; where cuda.h is available the build checks them.
 */
#ifndef GS_CUDA_DRIVER_H
#define GS_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int gs__cu_result;   /* CUresult; 0 is CUDA_SUCCESS */
typedef uint64_t gs__cu_ptr; /* CUdeviceptr */
typedef struct {
	char reserved[64];
} gs__cu_ipc_handle; /* CUipcMemHandle, CUipcEventHandle */

#define GS_CU_SUCCESS 0
#define GS_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define GS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define GS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define GS_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define GS_CU_MEMORYTYPE_DEVICE 2
#define GS_CU_EVENT_DISABLE_TIMING 0x2
#define GS_CU_EVENT_INTERPROCESS 0x4

struct gs__cu {
	gs__cu_result (*init)(unsigned flags);
	gs__cu_result (*pointer_get_attribute)(void *data, int attribute, gs__cu_ptr ptr);
	gs__cu_result (*mem_get_address_range)(gs__cu_ptr *base, size_t *size, gs__cu_ptr ptr);
	gs__cu_result (*ipc_get_mem_handle)(gs__cu_ipc_handle *handle, gs__cu_ptr ptr);
	gs__cu_result (*device_get)(int *device, int ordinal);
	gs__cu_result (*device_get_pci_bus_id)(char *id, int len, int device);
	gs__cu_result (*ctx_push_current)(void *ctx);
	gs__cu_result (*ctx_pop_current)(void **ctx);
	gs__cu_result (*event_create)(void **event, unsigned flags);
	gs__cu_result (*event_destroy)(void *event);
	gs__cu_result (*ipc_get_event_handle)(gs__cu_ipc_handle *handle, void *event);
	gs__cu_result (*event_record)(void *event, void *stream);
	gs__cu_result (*stream_wait_event)(void *stream, void *event, unsigned flags);
	gs__cu_result (*get_error_string)(gs__cu_result r, const char **text);
};

/* Loads the driver and initialises it (cuInit), once per process. Returns
 * its calls, or NULL with the reason in why (no driver, too old, cuInit
 * failed). */
const struct gs__cu *gs__cu_load(char *why, size_t n);

/* The driver's description of r; never NULL. */
const char *gs__cu_error(const struct gs__cu *cu, gs__cu_result r);

#endif
