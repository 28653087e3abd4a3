/*
 * The CUDA emulation: what gradsync calls of the CUDA runtime, the CUDA
 * driver and NCCL, done on the host so CI runs the real CUDA backend of
 * gradsyncd and libgradsync's CUDA path without a GPU. Built as
 * libcuda.so.1 (libgradsync dlopens that name) and linked into the test
 * programs and gradsyncd-cuda-emu in place of cudart, NCCL and kernels.cu.
 *
 * "Device memory" is host memory from a memfd per allocation, so CUDA IPC
 * works between processes; a stream is a thread running its queue in
 * order; events live in shared memory; NCCL is a root thread that reduces
 * over loopback TCP. This header is shared by its files only.
 */
#ifndef GS_CUDA_EMU_H
#define GS_CUDA_EMU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

/* Exported with default visibility: the library is built hidden. */
#define EMU_API __attribute__((visibility("default")))

#define EMU_MAX_DEVICES 16

/* ---- Devices and errors (device.c) ---------------------------------------- */

/* The calling thread's current device (cudaSetDevice, cuCtxPushCurrent). */
int emu_current_device(void);
/* The node's GPU that is this process's device `device`, and back (-1:
 * none; GS_CUDA_EMU_VISIBLE_DEVICES). Handles name the node's GPU. */
int emu_node_device(int device);
int emu_device_of_node(int node_device);
/* The context of a device: one per device, as the primary context. */
CUcontext emu_context(int device);
/* Remembers e as the thread's last error (cudaGetLastError); returns it. */
cudaError_t emu_fail(cudaError_t e);
/* The driver's code for a runtime error (they mostly agree). */
CUresult emu_cu_result(cudaError_t e);
/* Milliseconds from an environment variable, or def. */
long emu_env_ms(const char *name, long def);

/* ---- Streams (stream.c) ----------------------------------------------------- */

/* Work on a stream: run() is called on the stream's thread with a copy of
 * the bytes enqueued. It returns cudaSuccess or an error that sticks to the
 * stream (cudaStreamQuery, cudaStreamSynchronize report it). */
typedef cudaError_t (*emu_op_fn)(void *arg);

cudaError_t emu_enqueue(cudaStream_t s, emu_op_fn run, const void *arg, size_t size);

/* The device a stream was made on (-1: the default stream, any). */
int emu_stream_device(cudaStream_t s);
/* Whether a kernel on `device` may touch p: memory of that device, or
 * pinned host memory. The emulated GPUs have no peer access. */
bool emu_mem_on_device(const void *p, int device);

/* ---- Sharing between processes (ipc.c), and sleeping -------------------------------- */

/* Waits on a futex word shared between processes, up to ms. */
void emu_futex_wait(_Atomic uint32_t *word, uint32_t seen, long ms);
void emu_futex_wake(_Atomic uint32_t *word);
/* Opens another process's descriptor by /proc/<pid>/fd/<fd>; -1 if it is
 * gone or is not the file with inode ino. */
int emu_open_remote_fd(int32_t pid, int32_t fd, uint64_t ino);
void emu_sleep_ms(long ms);

#endif
