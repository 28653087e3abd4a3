/*
 * gradsync-old-abi-trainer: a trainer as one built against libgradsync
 * before struct gs_step_result grew grad_norm. It declares that struct as
 * it was, binds gs_step_wait and gs_step_poll to their GRADSYNC_0 versions
 * (as such a binary's undefined symbols are), and checks that they fill
 * the old struct and nothing after it: the struct sits in a buffer whose
 * following bytes hold a pattern that must survive every call. It then
 * runs a step through the current versions (GRADSYNC_0.1) and checks the
 * norm they add against its own fp64 sum of the reduced values.
 *
 * The inputs are small integers, so every reduced element is exact on
 * every wire: rank r's gradient in step s is r + 1 + s.
 *
 * Usage: gradsync-old-abi-trainer SOCKET LOCAL_RANK (the job from the
 * environment).
 */
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradsync.h"

#define WAIT_TIMEOUT_MS 60000
#define COUNT 100000
#define GUARD 64

/* struct gs_step_result as gradsync.h had it before grad_norm. */
struct old_step_result {
	uint64_t step;
	int status;
	uint32_t buckets;
	uint64_t wire_bytes;
	uint64_t clipped;
	uint64_t nonfinite;
	uint64_t duration_ns;
};

/* What an old binary's calls bind to. */
__asm__(".symver old_step_wait, gs_step_wait@GRADSYNC_0");
__asm__(".symver old_step_poll, gs_step_poll@GRADSYNC_0");
int old_step_wait(gs_client *c, int timeout_ms, struct old_step_result *out);
int old_step_poll(gs_client *c, struct old_step_result *out);

/* The old struct, then GUARD bytes of a pattern. */
union slot {
	struct old_step_result res;
	unsigned char bytes[sizeof(struct old_step_result) + GUARD];
};

static int fail(gs_client *c, const char *what)
{
	fprintf(stderr, "old-abi-trainer: %s%s%s\n", what, c ? ": " : "", c ? gs_last_error(c) : "");
	return 1;
}

static bool guard_intact(const union slot *s)
{
	for (size_t i = sizeof(s->res); i < sizeof(s->bytes); i++)
		if (s->bytes[i] != 0xa5)
			return false;
	return true;
}

static void wait_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	poll(&p, 1, 100); /* a result the library already read leaves nothing to wake on */
}

static int begin_step(gs_client *c, uint32_t rank, uint64_t step)
{
	float *g = gs_tensor_data(c, 0);
	for (size_t i = 0; i < COUNT; i++)
		g[i] = (float)(rank + 1 + step);
	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	uint32_t index = 0;
	if (gs_step_begin(c, &so) != GS_OK || gs_mark_ready(c, &index, 1) != GS_OK)
		return -1;
	return 0;
}

/* One step waited for by the old gs_step_wait (polled: by the old
 * gs_step_poll, until it stops saying GS_EAGAIN). */
static int old_step(gs_client *c, uint32_t rank, uint64_t step, bool polled)
{
	union slot s;
	memset(s.bytes, 0xa5, sizeof(s.bytes));
	if (begin_step(c, rank, step) < 0)
		return fail(c, "beginning a step");
	int r;
	/* Polled as an event loop would: wait for the socket, then ask. */
	if (polled)
		while ((r = old_step_poll(c, &s.res)) == GS_EAGAIN)
			wait_readable(gs_fd(c));
	else
		r = old_step_wait(c, WAIT_TIMEOUT_MS, &s.res);
	if (r != GS_OK)
		return fail(c, polled ? "gs_step_poll@GRADSYNC_0" : "gs_step_wait@GRADSYNC_0");
	if (!guard_intact(&s))
		return fail(NULL, "the GRADSYNC_0 version wrote past the old struct");
	if (s.res.step != step || s.res.status != GS_OK || s.res.buckets != 1) {
		fprintf(stderr, "old-abi-trainer: step %" PRIu64 ": status %d, %u buckets\n",
			s.res.step, s.res.status, s.res.buckets);
		return 1;
	}
	printf("step %" PRIu64 " through %s@GRADSYNC_0: the old struct filled, its guard intact\n",
	       step, polled ? "gs_step_poll" : "gs_step_wait");
	return 0;
}

/* One step through the current version: the norm it adds against the
 * reduced values, squared and summed here. */
static int new_step(gs_client *c, uint32_t rank, uint64_t step)
{
	struct gs_step_result res;
	if (begin_step(c, rank, step) < 0 || gs_step_wait(c, WAIT_TIMEOUT_MS, &res) != GS_OK)
		return fail(c, "a step through gs_step_wait@@GRADSYNC_0.1");
	const float *g = gs_tensor_data(c, 0);
	double sumsq = 0;
	for (size_t i = 0; i < COUNT; i++)
		sumsq += (double)g[i] * g[i];
	if (fabs(res.grad_norm - sqrt(sumsq)) > COUNT * 0x1p-53 * sqrt(sumsq)) {
		fprintf(stderr, "old-abi-trainer: grad_norm %.17g, the values' %.17g\n", res.grad_norm,
			sqrt(sumsq));
		return 1;
	}
	printf("step %" PRIu64 " through gs_step_wait@@GRADSYNC_0.1: grad_norm %.17g\n", step,
	       res.grad_norm);
	return 0;
}

int main(int argc, char **argv)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = argc > 1 ? argv[1] : NULL;
	if (argc > 2)
		o.local_rank = (uint32_t)atoi(argv[2]);
	gs_client *c;
	if (gs_connect(&o, &c) != GS_OK)
		return fail(NULL, "connecting");
	struct gs_session_info info;
	gs_session_info(c, &info);
	const struct gs_tensor_spec spec = { "w", COUNT, GS_FLOAT32, -1, 0 };
	int rc = gs_register(c, &spec, 1) == GS_OK ? 0 : fail(c, "registering");
	if (!rc)
		rc = old_step(c, info.global_rank, 1, false);
	if (!rc)
		rc = old_step(c, info.global_rank, 2, true);
	if (!rc)
		rc = new_step(c, info.global_rank, 3);
	gs_close(c);
	if (!rc)
		printf("OK\n");
	return rc;
}
