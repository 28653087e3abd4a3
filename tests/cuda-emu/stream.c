/*
 * Emulated streams: each is a thread that runs its queue of work in
 * order, so work really is asynchronous to the host, as on a GPU, and
 * ordering mistakes (reading before an event was waited on) show. The
 * default stream (NULL, cudaStreamLegacy, cudaStreamPerThread) is one
 * stream per process, made on first use.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

struct op {
	struct op *next;
	emu_op_fn run;
	_Alignas(max_align_t) unsigned char arg[];
};

struct CUstream_st {
	pthread_mutex_t lock;
	pthread_cond_t work, idle;
	struct op *head, *tail;
	bool running, stop;
	cudaError_t error; /* the first failed op's, reported from then on */
	int device;        /* current when it was made; -1: the default stream */
	pthread_t thread;
};

static void *stream_main(void *arg)
{
	struct CUstream_st *s = arg;
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->work, &s->lock);
		if (!s->head)
			break;
		struct op *op = s->head;
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		s->running = true;
		pthread_mutex_unlock(&s->lock);
		cudaError_t e = op->run(op->arg);
		free(op);
		pthread_mutex_lock(&s->lock);
		s->running = false;
		if (e != cudaSuccess && s->error == cudaSuccess)
			s->error = e;
		if (!s->head)
			pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static cudaError_t stream_new(struct CUstream_st **out)
{
	struct CUstream_st *s = calloc(1, sizeof(*s));
	if (!s)
		return emu_fail(cudaErrorMemoryAllocation);
	s->device = emu_current_device();
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
		free(s);
		return emu_fail(cudaErrorMemoryAllocation);
	}
	/* Named apart from its maker (the daemon's worker, whose wake-ups
	 * tests count). */
	pthread_setname_np(s->thread, "emu-stream");
	*out = s;
	return cudaSuccess;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static struct CUstream_st *default_stream;

static void make_default(void)
{
	if (stream_new(&default_stream) == cudaSuccess)
		default_stream->device = -1;
}

static struct CUstream_st *stream_of(cudaStream_t s)
{
	if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) {
		pthread_once(&default_once, make_default);
		return default_stream;
	}
	return s;
}

int emu_stream_device(cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);
	return s ? s->device : -1;
}

cudaError_t emu_enqueue(cudaStream_t stream, emu_op_fn run, const void *arg, size_t size)
{
	struct CUstream_st *s = stream_of(stream);
	struct op *op = s ? malloc(sizeof(*op) + size) : NULL;
	if (!op)
		return emu_fail(cudaErrorMemoryAllocation);
	op->next = NULL;
	op->run = run;
	memcpy(op->arg, arg, size);
	pthread_mutex_lock(&s->lock);
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

/* ---- Runtime API -------------------------------------------------------------- */

EMU_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	return stream_new(s);
}

EMU_API cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return stream_new(s);
}

EMU_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);
	pthread_mutex_lock(&s->lock);
	cudaError_t e = s->head || s->running ? cudaErrorNotReady : s->error;
	pthread_mutex_unlock(&s->lock);
	return e == cudaErrorNotReady ? e : emu_fail(e);
}

EMU_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);
	pthread_mutex_lock(&s->lock);
	while (s->head || s->running)
		pthread_cond_wait(&s->idle, &s->lock);
	cudaError_t e = s->error;
	pthread_mutex_unlock(&s->lock);
	return emu_fail(e);
}

/* Finishes the queued work first, as the runtime does before releasing. */
EMU_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	if (stream_of(stream) != stream)
		return emu_fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&stream->lock);
	stream->stop = true;
	pthread_cond_signal(&stream->work);
	pthread_mutex_unlock(&stream->lock);
	pthread_join(stream->thread, NULL);
	pthread_mutex_destroy(&stream->lock);
	pthread_cond_destroy(&stream->work);
	pthread_cond_destroy(&stream->idle);
	free(stream);
	return cudaSuccess;
}

EMU_API cudaError_t cudaDeviceSynchronize(void)
{
	return cudaStreamSynchronize(NULL);
}

struct host_func {
	cudaHostFn_t fn;
	void *data;
};

static cudaError_t run_host_func(void *arg)
{
	struct host_func *h = arg;
	h->fn(h->data);
	return cudaSuccess;
}

EMU_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
	struct host_func h = { fn, data };
	return emu_enqueue(s, run_host_func, &h, sizeof(h));
}
