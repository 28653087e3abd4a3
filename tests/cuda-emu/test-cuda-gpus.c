/*
 * The CUDA backend's allow-list of GPUs (gs_cuda_options.gpus, which
 * gradsyncd's --gpus fills), on the CUDA emulation and in this process:
 * the backend opened as gradsyncd opens it, and handed buffers of this
 * process's own emulated GPUs as a trainer's Buffer messages carry them.
 * An emulated node of eight GPUs; the bus ids are the emulation's
 * (the node's GPU g is on bus 0x18 + g).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "errors.h"

static struct gs_backend *open_with(const char *gpus, char *why, size_t n)
{
	struct gs_cuda_options o = {
		.local_size = 2,
		.wire = GS_WIRE_F16,
		.fusion_elements = 1 << 16,
		.peer_timeout_ms = 5000,
		.nodes = 1,
		.join_timeout_ms = 5000,
		.gpus = gpus,
	};
	return gs_backend_cuda_open(&o, why, n);
}

/* A trainer's allocation of 1 MiB on this process's device `device`. */
struct alloc {
	void *mem;
	cudaIpcMemHandle_t handle;
	char pci[32];
};

static void alloc_on(struct alloc *a, int device)
{
	assert_int_equal(cudaSetDevice(device), cudaSuccess);
	assert_int_equal(cudaMalloc(&a->mem, 1 << 20), cudaSuccess);
	assert_int_equal(cudaIpcGetMemHandle(&a->handle, a->mem), cudaSuccess);
	assert_int_equal(cudaDeviceGetPCIBusId(a->pci, sizeof(a->pci), device), cudaSuccess);
}

/* As local rank `rank`'s Buffer message says it; its device number is
 * the trainer's own, which means nothing to the backend. */
static struct gs_buffer_desc desc_of(const struct alloc *a, unsigned rank)
{
	return (struct gs_buffer_desc){ .kind = GS_BUFFER_CUDA, .rank = rank, .size = 1 << 20,
					.fd = -1, .device = 0, .pci_bus_id = a->pci,
					.handle = (const uint8_t *)&a->handle };
}

/* Imports a's allocation for `rank`; returns the code, err the reason. */
static int import(struct gs_backend *b, const struct alloc *a, unsigned rank, char *err,
		  size_t n)
{
	struct gs_buffer_desc d = desc_of(a, rank);
	void *addr = NULL;
	err[0] = '\0';
	int rc = b->ops->import_buffer(b, &d, &addr, err, n);
	if (rc == GS_OK)
		b->ops->release_buffer(b, addr, d.size);
	return rc;
}

/* --gpus names the node's GPUs 1 and 3, in two forms the driver takes
 * (and a space after the comma): a
 * buffer on GPU 2 is refused, naming its GPU and the list; GPUs 1 and 3
 * take a local rank each. */
static void only_the_listed_gpus(void **state)
{
	(void)state;
	const char *gpus = "0000:19:00.0, 1B:00.0";
	char why[256], err[256];
	assert_true(gs_cuda_usable(gpus, why, sizeof(why)));
	struct gs_backend *b = open_with(gpus, why, sizeof(why));
	if (!b)
		fail_msg("the backend did not open: %s", why);
	struct alloc on[4];
	for (int g = 1; g < 4; g++)
		alloc_on(&on[g], g);
	assert_int_equal(import(b, &on[2], 0, err, sizeof(err)), GS_EBUFFER);
	assert_string_equal(err, "it is on GPU 0000:1a:00.0, which is not one this gradsyncd may use (--gpus 0000:19:00.0, 1B:00.0)");
	assert_int_equal(import(b, &on[3], 0, err, sizeof(err)), GS_OK);
	assert_int_equal(import(b, &on[1], 1, err, sizeof(err)), GS_OK);
	b->ops->destroy(b);
	for (int g = 1; g < 4; g++)
		cudaFree(on[g].mem);
}

/* Without a list, or with one that names none, every GPU the daemon sees. */
static void every_gpu(void **state)
{
	(void)state;
	const char *lists[] = { NULL, "", " " };
	char why[256], err[256];
	struct alloc on7;
	alloc_on(&on7, 7);
	for (int i = 0; i < 3; i++) {
		assert_true(gs_cuda_usable(lists[i], why, sizeof(why)));
		struct gs_backend *b = open_with(lists[i], why, sizeof(why));
		assert_non_null(b);
		if (import(b, &on7, 0, err, sizeof(err)) != GS_OK)
			fail_msg("refused: %s", err);
		b->ops->destroy(b);
	}
	cudaFree(on7.mem);
}

/* A list that names a GPU the daemon does not see (it sees the node's
 * GPUs 0 to 3) stops it at start. */
static void list_names_an_unseen_gpu(void **state)
{
	(void)state;
	setenv("GS_CUDA_EMU_VISIBLE_DEVICES", "0,1,2,3", 1);
	const char *gpus = "0000:18:00.0,0000:1c:00.0";
	char why[256];
	assert_false(gs_cuda_usable(gpus, why, sizeof(why)));
	assert_string_equal(why, "--gpus names 0000:1c:00.0, which is not a GPU this gradsyncd sees");
	why[0] = '\0';
	assert_null(open_with(gpus, why, sizeof(why)));
	assert_string_equal(why, "--gpus names 0000:1c:00.0, which is not a GPU this gradsyncd sees");
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
}

int main(void)
{
	setenv("GS_CUDA_EMU_DEVICES", "8", 1);
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	unsetenv("CUDA_VISIBLE_DEVICES"); /* the messages quote it */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(only_the_listed_gpus),
		cmocka_unit_test(every_gpu),
		cmocka_unit_test(list_names_an_unseen_gpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
