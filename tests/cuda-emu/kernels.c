/*
 * The pack and unpack kernels of daemon/backend/cuda/kernels.cu, run on the
 * emulated stream: the same walk of the entry and task tables (read when
 * the stream reaches the launch, as the GPU reads them), elementwise.h's
 * arithmetic, and kernels.cu's NaN rule (a NaN skips the multiply and is
 * passed on quieted). What this cannot check is the device code itself;
 * tests/gpu/run.sh does. GS_CUDA_EMU_KERNEL_DELAY_MS delays each launch,
 * so that reading the trainers' memory too early shows in the tests.
 */
#include <string.h>

#include "emu.h"
#include "elementwise.h"
#include "backend/cuda/kernels.h"

static bool is_nan(float x)
{
	return (gs_ew_bits(x) & 0x7fffffffu) > 0x7f800000u;
}

static float quiet(float x)
{
	return gs_ew_float(gs_ew_bits(x) | 0x400000u);
}

struct launch {
	enum gs_wire w;
	const struct gs_cuda_entry *entries;
	const struct gs_cuda_task *tasks;
	uint32_t ntasks;
	void *fusion;
	struct gs_pack_params p;
	float postscale;
	unsigned long long *counter;
	int device; /* the stream's; -1: any */
	double *sumsq; /* unpack: [task], or NULL */
};

static void delay(void)
{
	long ms = emu_env_ms("GS_CUDA_EMU_KERNEL_DELAY_MS", 0);
	if (ms)
		emu_sleep_ms(ms);
}

/* Whether every span, the fusion buffer and the counter are on the
 * launch's GPU (read as the stream reaches it, as the table is). */
static bool on_device(const struct launch *l)
{
	if (l->device < 0)
		return true;
	if (!emu_mem_on_device(l->fusion, l->device) ||
	    (l->counter && !emu_mem_on_device(l->counter, l->device)) ||
	    (l->sumsq && !emu_mem_on_device(l->sumsq, l->device)))
		return false;
	for (uint32_t b = 0; b < l->ntasks; b++) {
		const struct gs_cuda_entry e = l->entries[l->tasks[b].entry];
		if (!emu_mem_on_device((const void *)(uintptr_t)e.ptr, l->device))
			return false;
	}
	return true;
}

static cudaError_t run_pack(void *arg)
{
	const struct launch *l = arg;
	unsigned long long n = 0;
	delay();
	if (!on_device(l))
		return cudaErrorIllegalAddress;
	for (uint32_t b = 0; b < l->ntasks; b++) { /* one block per task */
		const struct gs_cuda_task t = l->tasks[b];
		const struct gs_cuda_entry e = l->entries[t.entry];
		const float *src = (const float *)(uintptr_t)e.ptr + t.start;
		size_t base = e.offset + t.start;
		for (uint32_t i = 0; i < t.count; i++) {
			float x = src[i];
			if (is_nan(x))
				gs_ew_store(l->w, l->fusion, base + i, quiet(x));
			else
				n += gs_ew_pack_one(l->w, l->fusion, base + i, x, &l->p);
		}
	}
	if (l->counter)
		*l->counter += n;
	return cudaSuccess;
}

/* kernels.h's GS_CUDA_NORM_ORDER: thread j's elements in order, then
 * the threads halved pairwise. */
static double task_sumsq(const float *y, uint32_t count)
{
	double th[GS_CUDA_BLOCK_THREADS] = { 0 };
	for (uint32_t i = 0; i < count; i++)
		th[i % GS_CUDA_BLOCK_THREADS] += (double)y[i] * (double)y[i];
	for (unsigned half = GS_CUDA_BLOCK_THREADS / 2; half > 0; half /= 2)
		for (unsigned j = 0; j < half; j++)
			th[j] += th[j + half];
	return th[0];
}

static cudaError_t run_unpack(void *arg)
{
	const struct launch *l = arg;
	unsigned long long n = 0;
	delay();
	if (!on_device(l))
		return cudaErrorIllegalAddress;
	for (uint32_t b = 0; b < l->ntasks; b++) {
		const struct gs_cuda_task t = l->tasks[b];
		const struct gs_cuda_entry e = l->entries[t.entry];
		float *dst = (float *)(uintptr_t)e.ptr + t.start;
		size_t base = e.offset + t.start;
		for (uint32_t i = 0; i < t.count; i++) {
			float y = gs_ew_unpack_one(l->w, l->fusion, base + i, l->postscale);
			if (is_nan(y))
				y = quiet(gs_ew_load(l->w, l->fusion, base + i));
			dst[i] = y;
			n += gs_ew_nonfinite(y);
		}
		if (l->sumsq)
			l->sumsq[b] = task_sumsq(dst, t.count);
	}
	if (l->counter)
		*l->counter += n;
	return cudaSuccess;
}

static bool valid_wire(enum gs_wire w)
{
	return w == GS_WIRE_F16 || w == GS_WIRE_BF16 || w == GS_WIRE_F32;
}

EMU_API cudaError_t gs_cuda_launch_pack(enum gs_wire w, const struct gs_cuda_entry *entries,
					const struct gs_cuda_task *tasks, uint32_t ntasks,
					void *fusion, struct gs_pack_params p,
					unsigned long long *clipped, cudaStream_t s)
{
	if (ntasks == 0)
		return cudaSuccess;
	if (!valid_wire(w))
		return cudaErrorInvalidValue;
	struct launch l = { w, entries, tasks, ntasks, fusion, p, 0, clipped, emu_stream_device(s), NULL };
	return emu_enqueue(s, run_pack, &l, sizeof(l));
}

EMU_API cudaError_t gs_cuda_launch_unpack(enum gs_wire w, const struct gs_cuda_entry *entries,
					  const struct gs_cuda_task *tasks, uint32_t ntasks,
					  const void *fusion, float postscale,
					  unsigned long long *nonfinite, double *sumsq,
					  cudaStream_t s)
{
	if (ntasks == 0)
		return cudaSuccess;
	if (!valid_wire(w))
		return cudaErrorInvalidValue;
	struct launch l = { w, entries, tasks, ntasks, (void *)fusion, { 0, false, 0 }, postscale,
			    nonfinite, emu_stream_device(s), sumsq };
	return emu_enqueue(s, run_unpack, &l, sizeof(l));
}
