/*
 * Devices, contexts and errors of the CUDA emulation. The emulated node
 * has GS_CUDA_EMU_DEVICES GPUs (default 2), each of compute capability
 * 9.0 and its own PCI bus id; a process sees those that
 * GS_CUDA_EMU_VISIBLE_DEVICES lists (their indices on the node,
 * comma-separated; all when unset), in that order, as the real
 * CUDA_VISIBLE_DEVICES: with "4,5" its device 0 is the node's GPU 4. One
 * context per device, standing for its primary context.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

#define EMU_NAME "gradsync CUDA emulation"

/* The context handles are addresses of these; nothing reads them. */
static char contexts[EMU_MAX_DEVICES];
static _Thread_local int current_device;
static _Thread_local cudaError_t last_error;

long emu_env_ms(const char *name, long def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	long ms = strtol(v, &end, 10);
	return *end || ms < 0 ? def : ms;
}

void emu_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int node_device_count(void)
{
	long n = emu_env_ms("GS_CUDA_EMU_DEVICES", 2);
	return n > EMU_MAX_DEVICES ? EMU_MAX_DEVICES : (int)n;
}

/* The node's GPUs this process sees, in its order. As CUDA reads
 * CUDA_VISIBLE_DEVICES, the list ends at the first entry that is not one
 * of the node's GPUs. */
static int visible(int node[EMU_MAX_DEVICES])
{
	int all = node_device_count();
	const char *v = getenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	if (!v) {
		for (int i = 0; i < all; i++)
			node[i] = i;
		return all;
	}
	int n = 0;
	while (*v && n < EMU_MAX_DEVICES) {
		char *end;
		long d = strtol(v, &end, 10);
		if (end == v || d < 0 || d >= all || (*end && *end != ','))
			break;
		node[n++] = (int)d;
		v = *end ? end + 1 : end;
	}
	return n;
}

static int emu_device_count(void)
{
	int node[EMU_MAX_DEVICES];
	return visible(node);
}

int emu_node_device(int device)
{
	int node[EMU_MAX_DEVICES];
	int n = visible(node);
	return device >= 0 && device < n ? node[device] : -1;
}

int emu_device_of_node(int node_device)
{
	int node[EMU_MAX_DEVICES];
	int n = visible(node);
	for (int i = 0; i < n; i++)
		if (node[i] == node_device)
			return i;
	return -1;
}

int emu_current_device(void)
{
	return current_device;
}

CUcontext emu_context(int device)
{
	return (CUcontext)(void *)&contexts[device];
}

static int emu_context_device(CUcontext ctx)
{
	char *c = (char *)(void *)ctx;
	if (c < contexts || c >= contexts + emu_device_count())
		return -1;
	return (int)(c - contexts);
}

/* The node's GPU g is on bus 0x18 + g. */
static void emu_pci_bus_id(int device, char *id, int len)
{
	snprintf(id, (size_t)len, "0000:%02x:00.0", 0x18 + emu_node_device(device));
}

cudaError_t emu_fail(cudaError_t e)
{
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

CUresult emu_cu_result(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return CUDA_SUCCESS;
	case cudaErrorInvalidValue:
		return CUDA_ERROR_INVALID_VALUE;
	case cudaErrorMemoryAllocation:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case cudaErrorInvalidDevice:
		return CUDA_ERROR_INVALID_DEVICE;
	case cudaErrorNotReady:
		return CUDA_ERROR_NOT_READY;
	case cudaErrorMapBufferObjectFailed:
		return CUDA_ERROR_MAP_FAILED;
	default:
		return CUDA_ERROR_INVALID_HANDLE;
	}
}

static bool valid_device(int device)
{
	return device >= 0 && device < emu_device_count();
}

/* ---- Runtime API -------------------------------------------------------------- */

EMU_API cudaError_t cudaGetDeviceCount(int *count)
{
	*count = emu_device_count();
	return *count ? cudaSuccess : emu_fail(cudaErrorNoDevice);
}

EMU_API cudaError_t cudaSetDevice(int device)
{
	if (!valid_device(device))
		return emu_fail(cudaErrorInvalidDevice);
	current_device = device;
	return cudaSuccess;
}

EMU_API cudaError_t cudaGetDevice(int *device)
{
	*device = current_device;
	return cudaSuccess;
}

EMU_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
	if (!valid_device(device))
		return emu_fail(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", EMU_NAME);
	p->major = 9;
	p->minor = 0;
	p->totalGlobalMem = (size_t)16 << 30;
	p->multiProcessorCount = 1;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->pciDomainID = 0;
	p->pciBusID = 0x18 + emu_node_device(device);
	return cudaSuccess;
}

EMU_API cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device)
{
	if (!valid_device(device) || len <= 0)
		return emu_fail(cudaErrorInvalidValue);
	emu_pci_bus_id(device, id, len);
	return cudaSuccess;
}

/* "[domain:]bus:device.function", in hex, as the driver takes it. */
EMU_API cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *id)
{
	unsigned dom = 0, bus, dev, fn;
	int used = 0;
	if (!id || (sscanf(id, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &used) != 4 &&
		    (dom = 0, sscanf(id, "%x:%x.%x%n", &bus, &dev, &fn, &used) != 3)) ||
	    id[used])
		return emu_fail(cudaErrorInvalidValue);
	for (int d = 0; d < emu_device_count(); d++) {
		if (dom == 0 && dev == 0 && fn == 0 && bus == (unsigned)(0x18 + emu_node_device(d))) {
			*device = d;
			return cudaSuccess;
		}
	}
	return emu_fail(cudaErrorInvalidDevice);
}

EMU_API cudaError_t cudaDriverGetVersion(int *v)
{
	*v = CUDA_VERSION;
	return cudaSuccess;
}

EMU_API cudaError_t cudaRuntimeGetVersion(int *v)
{
	*v = CUDART_VERSION;
	return cudaSuccess;
}

EMU_API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

EMU_API cudaError_t cudaPeekAtLastError(void)
{
	return last_error;
}

static const struct {
	cudaError_t code;
	const char *name, *text;
} errors[] = {
	{ cudaSuccess, "cudaSuccess", "no error" },
	{ cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument" },
	{ cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory" },
	{ cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal" },
	{ cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected" },
	{ cudaErrorNotReady, "cudaErrorNotReady", "device not ready" },
	{ cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle" },
	{ cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed" },
	{ cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated" },
	{ cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered" },
	{ cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported" },
};

static int error_index(cudaError_t e)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == e)
			return (int)i;
	return -1;
}

EMU_API const char *cudaGetErrorString(cudaError_t e)
{
	int i = error_index(e);
	return i < 0 ? "unrecognized error code" : errors[i].text;
}

EMU_API const char *cudaGetErrorName(cudaError_t e)
{
	int i = error_index(e);
	return i < 0 ? "cudaErrorUnknown" : errors[i].name;
}

/* The backend asks for cuMemGetAddressRange this way; nothing else is here. */
EMU_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
						     unsigned int version,
						     unsigned long long flags,
						     enum cudaDriverEntryPointQueryResult *status)
{
	*fn = NULL;
	if (!strcmp(symbol, "cuMemGetAddressRange"))
		*fn = (void *)cuMemGetAddressRange;
	if (status)
		*status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

/* ---- Driver API --------------------------------------------------------------- */

EMU_API CUresult cuInit(unsigned flags)
{
	return emu_device_count() ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EMU_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!valid_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice device)
{
	if (!valid_device(device) || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	emu_pci_bus_id(device, id, len);
	return CUDA_SUCCESS;
}

/* A stack of one level is all libgradsync needs (push, call, pop): the
 * previous device is kept so that pop restores it. */
static _Thread_local int pushed[8];
static _Thread_local int npushed;

EMU_API CUresult cuCtxPushCurrent(CUcontext ctx)
{
	int d = emu_context_device(ctx);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (npushed == 8)
		return CUDA_ERROR_INVALID_VALUE;
	pushed[npushed++] = current_device;
	current_device = d;
	return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxPopCurrent(CUcontext *ctx)
{
	if (npushed == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx)
		*ctx = emu_context(current_device);
	current_device = pushed[--npushed];
	return CUDA_SUCCESS;
}

EMU_API CUresult cuGetErrorString(CUresult r, const char **text)
{
	switch (r) {
	case CUDA_SUCCESS: *text = "no error"; break;
	case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
	case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
	case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
	case CUDA_ERROR_MAP_FAILED: *text = "mapping of buffer object failed"; break;
	case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
	case CUDA_ERROR_NOT_READY: *text = "device not ready"; break;
	default: *text = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}
