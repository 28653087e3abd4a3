/*
 * A trainer of test-cuda-emu that registers a state in CUDA memory
 * (gs_register_state_cuda) and broadcasts it: tensors of several dtypes,
 * one larger than 4 MiB in an allocation of its own (at an offset), the
 * others pieces of a second allocation that also holds a gradient (also
 * registered, gs_register_cuda), at offsets odd ones among them. Its
 * device is its local rank's GPU (or --device's), so the copy crosses GPUs.
 *
 * Every byte of both allocations is filled first: the tensors with a hash
 * of (global rank, tensor, byte), the rest with a guard byte of this
 * rank. After the broadcast from --source each tensor must hold the
 * source's hash, computed here, and every other byte its guard still.
 *
 *   --hold: register, fill, print REGISTERED and wait to be killed;
 *   --expect-fail: the broadcast must fail (a trainer of the job is gone)
 *     and leave this trainer's state as it was;
 *   --device D: its GPU, as this process numbers them (default: --rank);
 *   --mismatch: register tensor 3 as int32 rather than int64 (the same
 *     bytes): the registration must fail with GS_ELAYOUT;
 *   --reconnect: after the broadcast, print BROADCAST DONE, wait for
 *     gradsyncd to go (its connection closes), gs_reconnect to the next
 *     one (which registers the same CUDA state again), refill with a
 *     second hash and broadcast again, from global rank 0.
 * Prints "PASS ..." and exits 0, or says what differed and exits 1.
 */
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gradsync.h"
#define PROGRAM "emu-state-trainer"
#include "check.h"

#define BIG_BYTES ((5u << 20) + 4)    /* fp32: more than 4 MiB */
#define BIG_OFFSET 512                /* into its own allocation */
#define BIG_ALLOC (BIG_OFFSET + BIG_BYTES + 1024)
#define SMALL_ALLOC (64u << 10)
#define GRAD_COUNT 1024               /* the gradient, at the start of the small allocation */

struct tensor {
	const char *name;
	enum gs_dtype dtype;
	uint64_t bytes;
	bool big;        /* in the big allocation, else the small one */
	uint64_t offset; /* into its allocation */
};

static struct tensor tensors[] = {
	{ "fc.weight", GS_FLOAT32, BIG_BYTES, true, BIG_OFFSET },
	{ "fc.bias", GS_FLOAT16, 2 * 1001, false, 4096 },
	{ "bn.running_mean", GS_BFLOAT16, 2 * 333, false, 4096 + 2048 },
	{ "bn.num_batches_tracked", GS_INT64, 8, false, 8192 },
	{ "mask", GS_UINT8, 777, false, 12289 },
	{ "scale", GS_FLOAT64, 8 * 3, false, 16384 },
	{ "ids", GS_INT32, 4 * 4097, false, 20480 },
};
#define NT (sizeof(tensors) / sizeof(tensors[0]))

struct options {
	const char *socket;
	unsigned rank, global_rank, source;
	int device;
	bool hold, expect_fail, mismatch, reconnect;
};

static void parse(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "rank", required_argument, NULL, 'r' },
		{ "global-rank", required_argument, NULL, 'g' },
		{ "source", required_argument, NULL, 'S' },
		{ "hold", no_argument, NULL, 'h' },
		{ "expect-fail", no_argument, NULL, 'f' },
		{ "mismatch", no_argument, NULL, 'm' },
		{ "reconnect", no_argument, NULL, 'R' },
		{ "device", required_argument, NULL, 'D' },
		{ NULL, 0, NULL, 0 },
	};
	*o = (struct options){ .device = -1 };
	bool global = false;
	int opt;
	while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (opt) {
		case 's': o->socket = optarg; break;
		case 'r': o->rank = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'g': o->global_rank = (unsigned)strtoul(optarg, NULL, 10); global = true; break;
		case 'S': o->source = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'h': o->hold = true; break;
		case 'f': o->expect_fail = true; break;
		case 'm': o->mismatch = true; break;
		case 'R': o->reconnect = true; break;
		case 'D': o->device = (int)strtol(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: emu-state-trainer --socket PATH [--rank R] [--global-rank G] [--source S] [--hold] [--expect-fail] [--mismatch] [--reconnect] [--device D]\n");
			exit(2);
		}
	}
	if (!global)
		o->global_rank = o->rank;
	if (o->device < 0)
		o->device = (int)o->rank;
	if (!o->socket) {
		fprintf(stderr, "emu-state-trainer: --socket is needed\n");
		exit(2);
	}
}

/* As tests/integration/test-state.c's: a byte of (rank, tensor, index). */
static uint8_t pattern(unsigned rank, unsigned k, uint64_t i)
{
	uint64_t x = (uint64_t)rank << 56 ^ (uint64_t)k << 40 ^ i;
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ull;
	x ^= x >> 27;
	x *= 0x81dadef4bc2dd44dull;
	return (uint8_t)(x >> 33);
}

static uint8_t guard(unsigned rank)
{
	return (uint8_t)(0xa5 ^ rank);
}

/* What both allocations must hold: tensors of `owner`'s hash, the rest
 * this rank's guard. */
static void expected(uint8_t *big, uint8_t *small, unsigned owner, unsigned rank)
{
	memset(big, guard(rank), BIG_ALLOC);
	memset(small, guard(rank), SMALL_ALLOC);
	for (unsigned k = 0; k < NT; k++) {
		uint8_t *p = (tensors[k].big ? big : small) + tensors[k].offset;
		for (uint64_t i = 0; i < tensors[k].bytes; i++)
			p[i] = pattern(owner, k, i);
	}
}

/* Where the allocations differ from the expectation; 0 when nowhere. */
static int compare(const uint8_t *have, const uint8_t *want, size_t n, const char *which,
		   unsigned owner)
{
	for (size_t i = 0; i < n; i++) {
		if (have[i] != want[i]) {
			fprintf(stderr, "emu-state-trainer: %s allocation, byte %zu: 0x%02x, want 0x%02x (rank %u's)\n",
				which, i, have[i], want[i], owner);
			return 1;
		}
	}
	return 0;
}

struct trainer {
	struct options o;
	gs_client *c;
	uint8_t *big, *small;          /* device */
	uint8_t *want_big, *want_small; /* host */
	uint8_t *have_big, *have_small;
};

/* Closes the session and frees everything: the way out of every path
 * after the allocations, so that the sanitizers' run finds no leak. */
static int finish(struct trainer *t, int rc)
{
	gs_close(t->c);
	CUDA(cudaFree(t->big));
	CUDA(cudaFree(t->small));
	free(t->want_big);
	free(t->have_big);
	free(t->want_small);
	free(t->have_small);
	return rc;
}

static void connect_and_register(struct trainer *t)
{
	struct gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
	co.socket_path = t->o.socket;
	co.local_rank = t->o.rank;
	co.timeout_ms = 30000;
	if (gs_connect(&co, &t->c) != GS_OK) {
		fprintf(stderr, "emu-state-trainer: gs_connect: %s\n", gs_last_error(NULL));
		exit(1);
	}
	struct gs_cuda_tensor_spec grad = { "fc.weight.grad", GRAD_COUNT, GS_FLOAT32, t->small };
	GS(t->c, gs_register_cuda(t->c, &grad, 1));
	struct gs_cuda_state_spec specs[NT];
	for (unsigned k = 0; k < NT; k++)
		specs[k] = (struct gs_cuda_state_spec){
			tensors[k].name, tensors[k].bytes, tensors[k].dtype,
			(tensors[k].big ? t->big : t->small) + tensors[k].offset
		};
	if (t->o.mismatch)
		specs[3].dtype = GS_INT32;
	int r = gs_register_state_cuda(t->c, specs, NT);
	if (t->o.mismatch) {
		if (r != GS_ELAYOUT) {
			fprintf(stderr, "emu-state-trainer: a mismatched state registration returned %s, want GS_ELAYOUT: %s\n",
				gs_strerror(r), gs_last_error(t->c));
			exit(1);
		}
		printf("PASS rank %u: refused: %s\n", t->o.global_rank, gs_last_error(t->c));
		exit(finish(t, 0));
	}
	GS(t->c, r);
	for (unsigned k = 0; k < NT; k++) {
		if (gs_state_data(t->c, k) != specs[k].data) {
			fprintf(stderr, "emu-state-trainer: gs_state_data(%u) is %p, want %p\n", k,
				gs_state_data(t->c, k), specs[k].data);
			exit(1);
		}
	}
}

static int check(struct trainer *t, unsigned owner)
{
	expected(t->want_big, t->want_small, owner, t->o.global_rank);
	CUDA(cudaMemcpy(t->have_big, t->big, BIG_ALLOC, cudaMemcpyDeviceToHost));
	CUDA(cudaMemcpy(t->have_small, t->small, SMALL_ALLOC, cudaMemcpyDeviceToHost));
	return compare(t->have_big, t->want_big, BIG_ALLOC, "big", owner) |
	       compare(t->have_small, t->want_small, SMALL_ALLOC, "small", owner);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Fills both allocations: tensors of owner's hash, the rest the guard. */
static void fill(struct trainer *t, unsigned owner)
{
	expected(t->want_big, t->want_small, owner, t->o.global_rank);
	CUDA(cudaMemcpy(t->big, t->want_big, BIG_ALLOC, cudaMemcpyHostToDevice));
	CUDA(cudaMemcpy(t->small, t->want_small, SMALL_ALLOC, cudaMemcpyHostToDevice));
}

/* Once gradsyncd has gone (its end of the connection closes, within
 * 60 s), to the next one on the same socket, within 30 s. */
static void reconnect(struct trainer *t)
{
	printf("BROADCAST DONE\n");
	fflush(stdout);
	struct pollfd p = { gs_fd(t->c), POLLIN, 0 };
	if (poll(&p, 1, 60000) != 1) {
		fprintf(stderr, "emu-state-trainer: gradsyncd did not go within 60 s\n");
		exit(1);
	}
	uint64_t deadline = now_ms() + 30000;
	int r;
	while ((r = gs_reconnect(t->c, 1000)) < 0 && now_ms() < deadline)
		usleep(50000);
	GS(t->c, r);
}

/* The second broadcast, after reconnecting: from global rank 0, of
 * every rank's second hash (rank + 2). */
static int again(struct trainer *t)
{
	fill(t, t->o.global_rank + 2);
	GS(t->c, gs_state_broadcast(t->c, 0, 60000));
	if (check(t, 2))
		return 1;
	printf("PASS rank %u: after reconnecting, the state holds rank 0's second bytes\n",
	       t->o.global_rank);
	return 0;
}

int main(int argc, char **argv)
{
	struct trainer t = { 0 };
	parse(argc, argv, &t.o);
	CUDA(cudaSetDevice(t.o.device));
	CUDA(cudaMalloc((void **)&t.big, BIG_ALLOC));
	CUDA(cudaMalloc((void **)&t.small, SMALL_ALLOC));
	t.want_big = malloc(BIG_ALLOC);
	t.have_big = malloc(BIG_ALLOC);
	t.want_small = malloc(SMALL_ALLOC);
	t.have_small = malloc(SMALL_ALLOC);
	if (!t.want_big || !t.have_big || !t.want_small || !t.have_small)
		return 1;
	/* Filled (and the copy done: cudaMemcpy) before gradsyncd may read it. */
	fill(&t, t.o.global_rank);
	connect_and_register(&t);
	if (t.o.hold) {
		printf("REGISTERED\n");
		fflush(stdout);
		pause();
	}
	struct gs_state_result res = GS_STATE_RESULT_INIT;
	int r = gs_state_broadcast_tensors(t.c, t.o.source, NULL, 0, 60000, &res);
	if (t.o.expect_fail) {
		if (r == GS_OK) {
			fprintf(stderr, "emu-state-trainer: the broadcast succeeded, but was to fail\n");
			return finish(&t, 1);
		}
		if (check(&t, t.o.global_rank))
			return finish(&t, 1);
		printf("PASS rank %u: failed as expected (%s): %s; its own state kept\n",
		       t.o.global_rank, gs_strerror(r), gs_last_error(t.c));
		return finish(&t, 0);
	}
	GS(t.c, r);
	if (check(&t, t.o.source))
		return finish(&t, 1);
	uint64_t total = 0;
	for (unsigned k = 0; k < NT; k++)
		total += tensors[k].bytes;
	if (res.bytes != total || res.tensors_done != NT) {
		fprintf(stderr, "emu-state-trainer: the result says %" PRIu64 " bytes in %u tensors, want %" PRIu64 " in %zu\n",
			res.bytes, res.tensors_done, total, NT);
		return finish(&t, 1);
	}
	printf("PASS rank %u: %zu state tensors (%" PRIu64 " bytes) hold rank %u's bytes, the rest of the allocations its own\n",
	       t.o.global_rank, NT, total, t.o.source);
	if (t.o.reconnect) {
		reconnect(&t);
		return finish(&t, again(&t));
	}
	return finish(&t, 0);
}
