/*
 * The baseline of check 3 of tests/gpu/run.sh: NCCL called directly, one
 * process driving every local GPU (ncclCommInitAll), an in-place fp16
 * all-reduce of N elements on each, timed per call from the host until
 * every stream is done, as the daemon's steps are timed. Prints one line
 * per size: NCCL elements=N ranks=R step_us=T.
 *
 *   gpu-nccl-busbw --count          prints the number of visible GPUs
 *   gpu-nccl-busbw N1 N2 ...        the sizes, in elements
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "common.h"
#define PROGRAM "gpu-nccl-busbw"
#include "check.h"

#define MAX_GPUS 16

int main(int argc, char **argv)
{
	int n = 0;
	CUDA(cudaGetDeviceCount(&n));
	if (argc > 1 && !strcmp(argv[1], "--count")) {
		printf("%d\n", n);
		return 0;
	}
	if (n > MAX_GPUS)
		n = MAX_GPUS;
	ncclComm_t comms[MAX_GPUS];
	cudaStream_t streams[MAX_GPUS];
	int devs[MAX_GPUS];
	for (int g = 0; g < n; g++)
		devs[g] = g;
	NCCL(ncclCommInitAll(comms, n, devs));
	for (int g = 0; g < n; g++) {
		CUDA(cudaSetDevice(g));
		CUDA(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
	}
	enum { WARMUP = 3, STEPS = 20 };
	for (int a = 1; a < argc; a++) {
		size_t count = strtoull(argv[a], NULL, 10);
		void *buf[MAX_GPUS];
		for (int g = 0; g < n; g++) {
			CUDA(cudaSetDevice(g));
			CUDA(cudaMalloc(&buf[g], count * 2));
			CUDA(cudaMemset(buf[g], 0, count * 2));
		}
		double times[STEPS];
		for (int s = 0; s < WARMUP + STEPS; s++) {
			double t0 = now_s();
			NCCL(ncclGroupStart());
			for (int g = 0; g < n; g++)
				NCCL(ncclAllReduce(buf[g], buf[g], count, ncclFloat16, ncclSum, comms[g],
						   streams[g]));
			NCCL(ncclGroupEnd());
			for (int g = 0; g < n; g++)
				CUDA(cudaStreamSynchronize(streams[g]));
			if (s >= WARMUP)
				times[s - WARMUP] = now_s() - t0;
		}
		printf("NCCL elements=%zu ranks=%d step_us=%.1f\n", count, n,
		       median(times, STEPS) * 1e6);
		for (int g = 0; g < n; g++) {
			CUDA(cudaSetDevice(g));
			CUDA(cudaFree(buf[g]));
		}
	}
	for (int g = 0; g < n; g++)
		ncclCommDestroy(comms[g]);
	return 0;
}
