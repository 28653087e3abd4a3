/*
 * Whether this node can run the CUDA backend, and if not, why in words a
 * user can act on.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_private.h"
#include "errors.h"

static void driver_problem(char *why, size_t n)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(why, n, "the NVIDIA driver is missing (%s)", dlerror());
		return;
	}
	dlclose(lib);
	int drv = 0, rt = 0;
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	snprintf(why, n, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime of this build: update the driver",
		 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

/* The id names at most GS_PCI_BUS_ID_MAX bytes; a longer one is no GPU. */
#define BUS_ID_MAX 32

int cuda_parse_gpus(const char *gpus, bool allowed[MAX_DEVICES], char *why, size_t n)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess)
		count = 0;
	int named = 0;
	for (int d = 0; d < MAX_DEVICES; d++)
		allowed[d] = false;
	for (const char *p = gpus; p && *p;) {
		p += strspn(p, " \t");
		size_t len = strcspn(p, ",");
		while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		char id[BUS_ID_MAX + 1];
		int dev = -1;
		snprintf(id, sizeof(id), "%.*s", (int)(len < BUS_ID_MAX ? len : BUS_ID_MAX), p);
		if (len > 0 && (len > BUS_ID_MAX || cudaDeviceGetByPCIBusId(&dev, id) != cudaSuccess ||
				dev < 0 || dev >= MAX_DEVICES)) {
			cudaGetLastError();
			const char *vis = getenv("CUDA_VISIBLE_DEVICES");
			snprintf(why, n, "--gpus names %s, which is not a GPU this gradsyncd sees%s%s%s", id,
				 vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
			return GS_EINVAL;
		}
		if (dev >= 0)
			allowed[dev] = true;
		named += dev >= 0;
		p += len;
		p += strspn(p, " \t");
		p += *p == ',';
	}
	/* A list that names none (NULL, "", blanks): every GPU. */
	for (int d = 0; !named && d < count && d < MAX_DEVICES; d++)
		allowed[d] = true;
	return GS_OK;
}

bool gs_cuda_usable(const char *gpus, char *why, size_t n)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e == cudaErrorInsufficientDriver) {
		driver_problem(why, n);
		return false;
	}
	if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");
		snprintf(why, n, "no CUDA device is visible%s%s%s", vis ? " (CUDA_VISIBLE_DEVICES=" : "",
			 vis ? vis : "", vis ? ")" : "");
		return false;
	}
	if (e != cudaSuccess) {
		snprintf(why, n, "the CUDA runtime cannot use the GPUs: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return false;
	}
	bool allowed[MAX_DEVICES];
	if (cuda_parse_gpus(gpus, allowed, why, n) != GS_OK)
		return false;
	/* Each trainer's GPU is checked as its first buffer comes; here, that
	 * one at least can run the kernels. */
	why[0] = '\0';
	for (int d = 0; d < count && d < MAX_DEVICES; d++) {
		struct cudaDeviceProp p;
		if (!allowed[d] || cudaGetDeviceProperties(&p, d) != cudaSuccess)
			continue;
		if (p.major >= MIN_CC_MAJOR)
			return true;
		if (!why[0])
			snprintf(why, n, "no GPU it may use has compute capability %d.0 or later, which the kernels of this build need (GPU %d, %s, has %d.%d)",
				 MIN_CC_MAJOR, d, p.name, p.major, p.minor);
	}
	if (!why[0])
		snprintf(why, n, "none of the GPUs it may use (--gpus %s) answers", gpus ? gpus : "");
	return false;
}
