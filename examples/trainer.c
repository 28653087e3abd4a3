/*
 * A minimal trainer: connects to gradsyncd, registers three small gradient
 * tensors, runs a few steps, and checks that every element came back as
 * the average (or the sum, if its job sums) over all trainers.
 *
 *   trainer [SOCKET [LOCAL_RANK]]
 *
 * SOCKET defaults to $GRADSYNC_SOCKET, else gradsyncd's default socket.
 * LOCAL_RANK defaults to what the launcher left in the environment
 * ($GRADSYNC_LOCAL_RANK, torchrun's $LOCAL_RANK, Slurm's $SLURM_LOCALID),
 * else 0. Start one per local rank, each given the job in its
 * environment too: GRADSYNC_LOCAL_SIZE=N (or torchrun's LOCAL_WORLD_SIZE),
 * and any setting it expects (GRADSYNC_WIRE, GRADSYNC_OP, ...); the job's
 * first trainer defines it. Exits 0 when every step checked out.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <gradsync.h>

#define STEPS 3

/* The gradients, in the order backpropagation produces them. */
static const struct gs_tensor_spec layout[] = {
	{ "fc.bias", 10, GS_FLOAT32, -1, 0 },
	{ "fc.weight", 10 * 64, GS_FLOAT32, -1, 0 },
	{ "conv.weight", 64 * 3 * 3 * 3, GS_FLOAT32, -1, 0 },
};
#define TENSORS (sizeof(layout) / sizeof(layout[0]))

/* Trainer r's gradient in a step: small integers, exact on every wire. */
static float gradient(uint32_t rank, int step)
{
	return (float)(rank + 1 + step);
}

static int fail(gs_client *c, const char *what, int r)
{
	fprintf(stderr, "trainer: %s: %s: %s\n", what, gs_strerror(r), gs_last_error(c));
	gs_close(c);
	return 1;
}

static int run_step(gs_client *c, const struct gs_session_info *info, int step)
{
	for (size_t t = 0; t < TENSORS; t++) {
		float *g = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < layout[t].count; i++)
			g[i] = gradient(info->global_rank, step);
	}

	struct gs_step_options so = GS_STEP_OPTIONS_INIT;
	int r = gs_step_begin(c, &so);
	if (r != GS_OK)
		return fail(c, "beginning a step", r);
	/* All at once here; a real trainer marks each as backward() makes it. */
	uint32_t ready[TENSORS];
	for (uint32_t t = 0; t < TENSORS; t++)
		ready[t] = t;
	r = gs_mark_ready(c, ready, TENSORS);
	if (r != GS_OK)
		return fail(c, "marking gradients ready", r);
	struct gs_step_result res;
	r = gs_step_wait(c, 60000, &res);
	if (r != GS_OK)
		return fail(c, "waiting for the step", r);

	double sum = 0;
	for (uint32_t k = 0; k < info->world_size; k++)
		sum += gradient(k, step);
	double want = info->op == GS_OP_SUM ? sum : sum / info->world_size;
	for (size_t t = 0; t < TENSORS; t++) {
		const float *g = gs_tensor_data(c, t);
		for (uint64_t i = 0; i < layout[t].count; i++) {
			if (fabs(g[i] - want) > 1e-2 * fabs(want)) {
				fprintf(stderr, "trainer: step %d: %s[%llu] is %g, not %g\n", step,
					layout[t].name, (unsigned long long)i, g[i], want);
				gs_close(c);
				return 1;
			}
		}
	}
	printf("step %llu: %u buckets, every element %g\n", (unsigned long long)res.step,
	       res.buckets, want);
	return 0;
}

int main(int argc, char **argv)
{
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = argc > 1 ? argv[1] : NULL;
	if (argc > 2)
		o.local_rank = (uint32_t)atoi(argv[2]);

	gs_client *c;
	int r = gs_connect(&o, &c);
	if (r != GS_OK)
		return fail(NULL, "connecting", r);
	struct gs_session_info info;
	gs_session_info(c, &info);
	printf("trainer %u of %u, gradsyncd %s (library %u.%u.%u)\n", info.global_rank,
	       info.world_size, info.daemon_version, gs_version() >> 16,
	       (gs_version() >> 8) & 0xff, gs_version() & 0xff);

	r = gs_register(c, layout, TENSORS);
	if (r != GS_OK)
		return fail(c, "registering", r);
	for (int step = 1; step <= STEPS; step++)
		if (run_step(c, &info, step) != 0)
			return 1;
	gs_close(c);
	return 0;
}
