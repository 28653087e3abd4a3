/*
 * The test programs' way out when a call fails: the program's name (PROGRAM,
 * defined before this is included), the call as written, and what CUDA,
 * NCCL or libgradsync said, then exit status 1. Shared by tests/gpu/ and
 * tests/cuda-emu/, whose trainers make the same calls on a GPU and on the
 * CUDA emulation.
 */
#ifndef GS_TEST_CHECK_H
#define GS_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CUDA(call)                                                                           \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			fprintf(stderr, "%s: %s: %s\n", PROGRAM, #call, cudaGetErrorString(e_)); \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

#define NCCL(call)                                                                           \
	do {                                                                                 \
		ncclResult_t r_ = (call);                                                    \
		if (r_ != ncclSuccess) {                                                     \
			fprintf(stderr, "%s: %s: %s\n", PROGRAM, #call, ncclGetErrorString(r_)); \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

/* A libgradsync call on client c. */
#define GS(c, call)                                                                          \
	do {                                                                                 \
		int r_ = (call);                                                             \
		if (r_ != GS_OK) {                                                           \
			fprintf(stderr, "%s: %s: %s\n", PROGRAM, #call, gs_last_error(c));   \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

#endif
