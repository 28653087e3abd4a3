/*
 * A fake CUDA driver for libgradsync's CUDA tensors, built as libcuda.so.1
 * and linked into test-cuda-handles, so the library's dlopen finds it
 * already loaded. Its "device memory" is a table of address ranges the
 * test declares; nothing is ever dereferenced. IPC handles encode what they
 * name, so a test can check what went over the wire.
 */
#ifndef GS_TEST_CUDA_FAKE_DRIVER_H
#define GS_TEST_CUDA_FAKE_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* Flags of a fake allocation. */
#define FAKE_CUDA_NOT_IPC 1 /* like cuMemCreate memory: no legacy IPC */

/* Forgets every allocation and event. */
void fake_cuda_reset(void);
/* Declares an allocation of size bytes on device `device`; returns its
 * (fake) device address, 2 MiB aligned. */
uint64_t fake_cuda_alloc(uint64_t size, int device, int flags);

/* What an IPC handle made by the fake says: "FAKEIPC" or "FAKEEVT", then
 * the allocation's base and size, or the event's id. */
struct fake_cuda_handle {
	char magic[8];
	uint64_t base_or_id;
	uint64_t size;
	char pad[40];
};

struct fake_cuda_event {
	unsigned flags;
	unsigned records, waits;
	void *last_record_stream, *last_wait_stream;
	int destroyed;
};
/* Event `id` (1, 2, ... in creation order); NULL if there is none. */
const struct fake_cuda_event *fake_cuda_event(uint64_t id);
/* Contexts pushed and not popped. */
int fake_cuda_ctx_depth(void);

#endif
