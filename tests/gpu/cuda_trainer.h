/*
 * What the CUDA test trainers share (tests/gpu/gpu-trainer on a GPU and on
 * the CUDA emulation, tests/cuda-emu/emu-trainer): a process that hands
 * gradsyncd CUDA tensors through libgradsync, writes each step's
 * gradients on its stream and reads the results back. A failing call
 * ends the process with status 1 and says which (check.h).
 */
#ifndef GS_TEST_CUDA_TRAINER_H
#define GS_TEST_CUDA_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gradsync.h"

struct cuda_trainer {
	const char *program; /* for messages */
	gs_client *c;
	struct gs_session_info info;
	cudaStream_t stream;
	size_t n;            /* tensors */
	char **names;
	uint64_t *counts;
	float **dev;         /* per tensor, in the allocations the trainer made */
	uint64_t *host_off;  /* per tensor, into in and out */
	uint64_t total;      /* elements */
	float *in, *out;     /* pinned host memory: inputs, results */
};

/* Makes `device` current (the trainer's numbering), a stream on it,
 * connects to the daemon at socket as local rank `rank` and reads the
 * session's settings into t->info. */
void cuda_trainer_connect(struct cuda_trainer *t, const char *socket, unsigned rank, int device,
			  int timeout_ms);
/* Registers the n tensors at t->dev as CUDA tensors. */
void cuda_trainer_register(struct cuda_trainer *t);
/* Waits for the step, makes the stream wait on the daemon's unpack, and
 * copies every tensor back into t->out. Returns GS_OK or GS_EABORTED (an
 * aborted step's tensors are copied back too); ends the process on any
 * other result. */
int cuda_trainer_collect(struct cuda_trainer *t, int timeout_ms, struct gs_step_result *res);
/* A host function for cudaLaunchHostFunc that sleeps `arg` milliseconds
 * on the stream: gradients that come late. */
void CUDART_CB cuda_trainer_sleep(void *arg);

#endif
