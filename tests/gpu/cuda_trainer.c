#include "cuda_trainer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PROGRAM t->program
#include "check.h"

void cuda_trainer_connect(struct cuda_trainer *t, const char *socket, unsigned rank, int device,
			  int timeout_ms)
{
	CUDA(cudaSetDevice(device));
	CUDA(cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking));
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = socket;
	co.local_rank = rank;
	co.timeout_ms = timeout_ms;
	if (gs_connect(&co, &t->c) != GS_OK) {
		fprintf(stderr, "%s: gs_connect: %s\n", t->program, gs_last_error(NULL));
		exit(1);
	}
	GS(t->c, gs_session_info(t->c, &t->info));
}

void cuda_trainer_register(struct cuda_trainer *t)
{
	struct gs_cuda_tensor_spec *specs = calloc(t->n, sizeof(*specs));
	for (size_t i = 0; i < t->n; i++)
		specs[i] = (struct gs_cuda_tensor_spec){ t->names[i], t->counts[i], GS_FLOAT32,
							 t->dev[i] };
	GS(t->c, gs_register_cuda(t->c, specs, t->n));
	free(specs);
}

int cuda_trainer_collect(struct cuda_trainer *t, int timeout_ms, struct gs_step_result *res)
{
	int r = gs_step_wait(t->c, timeout_ms, res);
	if (r != GS_OK && r != GS_EABORTED)
		GS(t->c, r);
	GS(t->c, gs_cuda_stream_wait(t->c, t->stream));
	for (size_t i = 0; i < t->n; i++)
		CUDA(cudaMemcpyAsync(t->out + t->host_off[i], t->dev[i], t->counts[i] * 4,
				     cudaMemcpyDeviceToHost, t->stream));
	CUDA(cudaStreamSynchronize(t->stream));
	return r;
}

void CUDART_CB cuda_trainer_sleep(void *arg)
{
	usleep((useconds_t)(uintptr_t)arg * 1000);
}
