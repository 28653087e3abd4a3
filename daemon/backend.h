/*
 * The interface between the step engine and the place gradients live. The
 * engine knows buckets and spans; a backend does the four things that touch
 * memory: import a trainer's buffer handle, pack a chunk of a bucket into a
 * local rank's fusion buffer (gather, clip, scale, cast), all-reduce the
 * packed buffers, and unpack the result into every local rank's tensors
 * (cast, scale, count non-finite values, scatter). pack, allreduce and
 * unpack run on the worker thread, one chunk at a time.
 */
#ifndef GS_BACKEND_H
#define GS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "plan.h"

struct gs_backend;

struct gs_backend_ops {
	/* Validates a trainer's buffer (fd, claimed size) and maps it; the fd
	 * stays the caller's. On failure writes a reason naming what is wrong
	 * to err and returns a GS_E* code. */
	int (*import_buffer)(struct gs_backend *b, int fd, uint64_t size,
			     void **addr, char *err, size_t errlen);
	void (*release_buffer)(struct gs_backend *b, void *addr, uint64_t size);
	/* Packs spans of local rank `rank` (tensor base pointers `tensors`)
	 * into its fusion buffer, back to back. Returns elements clipped. */
	uint64_t (*pack)(struct gs_backend *b, unsigned rank,
			 float *const *tensors, const struct gs_span *spans,
			 size_t nspans, const struct gs_pack_params *p);
	/* Sums the first n elements of the packed buffers of all local ranks
	 * (and, later, of all nodes). Returns 0 or a GS_E* code. */
	int (*allreduce)(struct gs_backend *b, size_t n);
	/* Writes the reduced elements, scaled, into the spans of every local
	 * rank (tensors[rank] are its base pointers). Returns the number of
	 * non-finite results. */
	uint64_t (*unpack)(struct gs_backend *b, float *const *const *tensors,
			   const struct gs_span *spans, size_t nspans,
			   float postscale);
	void (*destroy)(struct gs_backend *b);
};

struct gs_backend {
	const char *name;
	const struct gs_backend_ops *ops;
	unsigned local_size;
	enum gs_wire wire;
	uint64_t fusion_elements; /* capacity of each fusion buffer */
	_Atomic uint64_t internode_bytes;
	char error[256]; /* why the last allreduce failed (worker thread) */
};

/* The host backend: sealed memfd shared memory and the CPU's conversion
 * kernels. Returns NULL when out of memory. */
struct gs_backend *gs_backend_host_create(unsigned local_size, enum gs_wire wire,
					  uint64_t fusion_elements);

struct gs_gloo;
/* From now on the host backend's all-reduce also sums across nodes through
 * this Gloo group (after the local reduce), waiting at most timeout_ms. */
void gs_backend_host_attach_gloo(struct gs_backend *b, struct gs_gloo *g, int timeout_ms);

/* Bytes this node has sent to other nodes in all-reduces (worker thread
 * writes, anyone reads). */
uint64_t gs_backend_internode_bytes(const struct gs_backend *b);

#endif
