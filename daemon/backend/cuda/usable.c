/*
 * Whether this node can run the CUDA backend, and if not, why in words a
 * user can act on.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_private.h"

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

bool gs_cuda_usable(unsigned local_size, char *why, size_t n)
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
	if ((unsigned)count < local_size) {
		snprintf(why, n, "--local-size %u needs one GPU per trainer, but %d %s visible",
			 local_size, count, count == 1 ? "is" : "are");
		return false;
	}
	for (unsigned r = 0; r < local_size; r++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, (int)r) != cudaSuccess)
			continue;
		if (p.major < MIN_CC_MAJOR) {
			snprintf(why, n, "GPU %u (%s) has compute capability %d.%d; the kernels of this build need %d.0 or later",
				 r, p.name, p.major, p.minor, MIN_CC_MAJOR);
			return false;
		}
	}
	return true;
}
