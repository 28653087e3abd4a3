#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef GS_HAVE_CUDA_H
#include <cuda.h>
_Static_assert(CU_POINTER_ATTRIBUTE_CONTEXT == GS_CU_POINTER_ATTRIBUTE_CONTEXT, "cuda.h");
_Static_assert(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == GS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "cuda.h");
_Static_assert(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == GS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	       "cuda.h");
_Static_assert(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ==
		       GS_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	       "cuda.h");
_Static_assert(CU_MEMORYTYPE_DEVICE == GS_CU_MEMORYTYPE_DEVICE, "cuda.h");
_Static_assert(CU_EVENT_DISABLE_TIMING == GS_CU_EVENT_DISABLE_TIMING, "cuda.h");
_Static_assert(CU_EVENT_INTERPROCESS == GS_CU_EVENT_INTERPROCESS, "cuda.h");
_Static_assert(sizeof(CUipcMemHandle) == sizeof(gs__cu_ipc_handle), "cuda.h");
_Static_assert(sizeof(CUipcEventHandle) == sizeof(gs__cu_ipc_handle), "cuda.h");
_Static_assert(sizeof(CUdeviceptr) == sizeof(gs__cu_ptr), "cuda.h");
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct gs__cu cu;
static const struct gs__cu *loaded;
static char load_error[256];

/* The _v2 names are what cuda.h maps the plain ones to. */
static const struct {
	const char *name;
	size_t offset;
} symbols[] = {
	{ "cuInit", offsetof(struct gs__cu, init) },
	{ "cuPointerGetAttribute", offsetof(struct gs__cu, pointer_get_attribute) },
	{ "cuMemGetAddressRange_v2", offsetof(struct gs__cu, mem_get_address_range) },
	{ "cuIpcGetMemHandle", offsetof(struct gs__cu, ipc_get_mem_handle) },
	{ "cuDeviceGet", offsetof(struct gs__cu, device_get) },
	{ "cuDeviceGetPCIBusId", offsetof(struct gs__cu, device_get_pci_bus_id) },
	{ "cuCtxPushCurrent_v2", offsetof(struct gs__cu, ctx_push_current) },
	{ "cuCtxPopCurrent_v2", offsetof(struct gs__cu, ctx_pop_current) },
	{ "cuEventCreate", offsetof(struct gs__cu, event_create) },
	{ "cuEventDestroy_v2", offsetof(struct gs__cu, event_destroy) },
	{ "cuIpcGetEventHandle", offsetof(struct gs__cu, ipc_get_event_handle) },
	{ "cuEventRecord", offsetof(struct gs__cu, event_record) },
	{ "cuStreamWaitEvent", offsetof(struct gs__cu, stream_wait_event) },
	{ "cuGetErrorString", offsetof(struct gs__cu, get_error_string) },
};

static void load(void)
{
	/* Never closed: the driver stays loaded for the process's life, as
	 * the CUDA runtime keeps it. */
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(load_error, sizeof(load_error),
			 "cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
		void *f = dlsym(lib, symbols[i].name);
		if (!f) {
			snprintf(load_error, sizeof(load_error),
				 "the CUDA driver has no %s: it is too old", symbols[i].name);
			return;
		}
		memcpy((char *)&cu + symbols[i].offset, &f, sizeof(f));
	}
	gs__cu_result r = cu.init(0);
	if (r != GS_CU_SUCCESS) {
		snprintf(load_error, sizeof(load_error), "cuInit: %s", gs__cu_error(&cu, r));
		return;
	}
	loaded = &cu;
}

const struct gs__cu *gs__cu_load(char *why, size_t n)
{
	pthread_once(&once, load);
	if (!loaded)
		snprintf(why, n, "%s", load_error);
	return loaded;
}

const char *gs__cu_error(const struct gs__cu *c, gs__cu_result r)
{
	const char *text = NULL;
	if (c && c->get_error_string && c->get_error_string(r, &text) == GS_CU_SUCCESS && text)
		return text;
	return "unknown CUDA driver error";
}
