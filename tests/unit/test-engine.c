/*
 * The step engine on its own: a real libuv loop and the real worker
 * thread, with a fake backend (it sums the trainers' in-memory tensors
 * itself), a fake group port (its vote adds in what a remote node voted)
 * and fake trainer clients (they note what the engine sends them). No
 * sockets, no daemon: each test runs in milliseconds.
 *
 * Expected values come from the test's own arithmetic and from the bucket
 * rule of DESIGN.md written out by hand, never from the engine.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/job.h"
#include "engine/reduce.h"
#include "engine/trainer.h"
#include "errors.h"
#include "support/log.h"

#define RANKS 2
/* Four tensors and threshold 6: tensor 1 (10 elements) goes alone and
 * first; tensors 0 and 2 (4 + 4 > 6) follow as one bucket; tensor 3 is
 * flushed at the end. */
#define NT 4
static const uint64_t counts[NT] = { 4, 10, 4, 3 };
static const uint32_t bucket_of[NT] = { 1, 0, 1, 2 };
#define NBUCKETS 3
#define ELEMENTS (4 + 10 + 4 + 3)

/* ---- A fake backend: in-memory tensors, summed on the worker ------------ */

struct fake_backend {
	struct gs_backend b;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool hold;         /* buckets wait in reduce_bucket while set */
	unsigned held;     /* buckets waiting there now */
	uint32_t order[16]; /* buckets reduced, in the order they ran */
	unsigned norder;
	int fail_bucket;   /* this bucket's all-reduce fails; -1: none */
	unsigned released; /* buffers released */
};

static int fake_import(struct gs_backend *b, const struct gs_buffer_desc *desc, void **addr,
		       char *err, size_t errlen)
{
	(void)b;
	(void)err;
	(void)errlen;
	memcpy(addr, desc->handle, sizeof(*addr));
	return GS_OK;
}

static void fake_release(struct gs_backend *b, void *addr, uint64_t size)
{
	struct fake_backend *f = (struct fake_backend *)b;
	(void)addr;
	(void)size;
	f->released++;
}

static int fake_reduce_bucket(struct gs_backend *b, const struct gs_bucket_io *io)
{
	struct fake_backend *f = (struct fake_backend *)b;
	pthread_mutex_lock(&f->lock);
	f->order[f->norder++] = io->bucket;
	f->held++;
	while (f->hold)
		pthread_cond_wait(&f->cond, &f->lock);
	f->held--;
	bool fail = (int)io->bucket == f->fail_bucket;
	pthread_mutex_unlock(&f->lock);
	if (fail) {
		snprintf(b->error, sizeof(b->error), "the fake network broke");
		return GS_ESYSTEM;
	}
	const struct gs_bucket *bk = &io->plan->buckets[io->bucket];
	for (uint32_t m = 0; m < bk->count; m++) {
		uint32_t t = io->plan->members[bk->first + m];
		for (uint64_t e = 0; e < io->counts[t]; e++) {
			float sum = 0;
			for (unsigned r = 0; r < io->nranks; r++)
				sum += io->tensors[r][t][e] * io->pack[r].prescale;
			for (unsigned r = 0; r < io->nranks; r++)
				io->tensors[r][t][e] = sum * io->postscale;
		}
	}
	return GS_OK;
}

static void fake_destroy(struct gs_backend *b)
{
	(void)b;
}

static const struct gs_backend_ops fake_ops = {
	.import_buffer = fake_import,
	.release_buffer = fake_release,
	.reduce_bucket = fake_reduce_bucket,
	.destroy = fake_destroy,
};

static void fake_set_hold(struct fake_backend *f, bool hold)
{
	pthread_mutex_lock(&f->lock);
	f->hold = hold;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

static unsigned fake_held(struct fake_backend *f)
{
	pthread_mutex_lock(&f->lock);
	unsigned n = f->held;
	pthread_mutex_unlock(&f->lock);
	return n;
}

static unsigned fake_reduced(struct fake_backend *f)
{
	pthread_mutex_lock(&f->lock);
	unsigned n = f->norder;
	pthread_mutex_unlock(&f->lock);
	return n;
}

/* A buffer's "handle" is its address: the fake import hands it back. */
static bool fake_takes_fd(const Gradsync__Buffer *m)
{
	(void)m;
	return false;
}

static int fake_parse(const Gradsync__Buffer *m, uint32_t rank, int fd, struct gs_buffer_desc *out,
		      char *err, size_t errlen)
{
	(void)fd;
	if (m->cuda_ipc_handle.len != sizeof(void *)) {
		snprintf(err, errlen, "not a fake handle");
		return GS_EINVAL;
	}
	memset(out, 0, sizeof(*out));
	out->kind = GS_BUFFER_CUDA;
	out->rank = rank;
	out->size = m->size;
	out->fd = -1;
	out->handle = m->cuda_ipc_handle.data;
	return GS_OK;
}

/* ---- A fake group of nodes ----------------------------------------------- */

struct fake_group {
	unsigned agreements, withdrawals, regroups;
	uint64_t round;
	pthread_mutex_t lock;
	float remote[4];  /* what the other node votes, added in */
	float local[4];   /* this node's last vote */
	unsigned votes;
};

static int group_agree(void *ctx, uint64_t round, const struct gs_layout *l, uint64_t hash)
{
	struct fake_group *g = ctx;
	(void)l;
	(void)hash;
	g->agreements++;
	g->round = round;
	return GS_OK;
}

static void group_withdraw(void *ctx)
{
	((struct fake_group *)ctx)->withdrawals++;
}

static void group_regroup(void *ctx, uint64_t generation, const char *why)
{
	(void)generation;
	(void)why;
	((struct fake_group *)ctx)->regroups++;
}

static int group_vote(void *ctx, float *v, size_t n, char *err, size_t errlen)
{
	struct fake_group *g = ctx;
	(void)err;
	(void)errlen;
	pthread_mutex_lock(&g->lock);
	for (size_t i = 0; i < n && i < 4; i++) {
		g->local[i] = v[i];
		v[i] += g->remote[i];
	}
	g->votes++;
	pthread_mutex_unlock(&g->lock);
	return GS_OK;
}

/* ---- Fake trainer clients -------------------------------------------------- */

struct fake_client {
	struct gs_trainer *t; /* NULL once gone */
	unsigned registered;
	unsigned step_done;
	int step_status;
	uint64_t step;
	char step_message[800];
	size_t completed_tensors;
	uint32_t bucket_done[16];
	unsigned nbucket_done;
	int error_code; /* 0: not dropped */
	char error[600];
	float mem[ELEMENTS]; /* the trainer's gradients, tensor after tensor */
};

static void client_send(void *ctx, const Gradsync__Message *m)
{
	struct fake_client *c = ctx;
	switch (m->body_case) {
	case GRADSYNC__MESSAGE__BODY_REGISTERED:
		c->registered++;
		break;
	case GRADSYNC__MESSAGE__BODY_STEP_DONE:
		c->step_done++;
		c->step = m->step_done->step;
		c->step_status = m->step_done->status;
		snprintf(c->step_message, sizeof(c->step_message), "%s", m->step_done->message);
		c->completed_tensors = m->step_done->n_completed_tensors;
		break;
	case GRADSYNC__MESSAGE__BODY_BUCKET_DONE:
		c->bucket_done[c->nbucket_done++] = m->bucket_done->bucket;
		break;
	default:
		fail_msg("unexpected message %d to a trainer", (int)m->body_case);
	}
}

/* What the session does: the connection closes, and its trainer leaves. */
static void client_gone(struct fake_client *c)
{
	struct gs_trainer *t = c->t;
	c->t = NULL;
	if (t)
		gs_trainer_disconnected(t);
}

static void client_fail(void *ctx, int code, const char *message)
{
	struct fake_client *c = ctx;
	c->error_code = code;
	snprintf(c->error, sizeof(c->error), "%s", message);
	client_gone(c);
}

static int client_take_fds(void *ctx, int *fds, size_t n, size_t *have)
{
	(void)ctx;
	(void)fds;
	*have = 0;
	return n == 0 ? 0 : -1;
}

static const char *client_name(void *ctx)
{
	(void)ctx;
	return "a fake trainer";
}

static const struct gs_client_ops client_ops = {
	client_send, client_fail, client_take_fds, client_name,
};

/* ---- The fixture ------------------------------------------------------------- */

struct fx {
	uv_loop_t loop;
	struct gs_settings settings;
	struct fake_backend backend;
	struct fake_group group;
	struct gs_worker worker;
	struct gs_job job;
	struct fake_client client[RANKS];
};

static struct fx *fx_new(uint32_t nodes)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	struct gs_settings *s = &f->settings;
	snprintf(s->job_id, sizeof(s->job_id), "test");
	s->local_size = RANKS;
	s->threshold = 6;
	s->wire = GS_WIRE_F32;
	s->op = GS_REDUCE_AVERAGE;
	s->max_tensors = 1024;
	s->max_bytes = 1 << 20;
	s->max_buffers = 16;
	s->max_mappings = 64;
	s->step_timeout = 600;
	s->stall_warning = 600;
	f->backend.b = (struct gs_backend){ .name = "fake", .ops = &fake_ops, .local_size = RANKS,
					    .wire = GS_WIRE_F32, .fusion_elements = 1 << 20 };
	pthread_mutex_init(&f->backend.lock, NULL);
	pthread_cond_init(&f->backend.cond, NULL);
	f->backend.fail_bucket = -1;
	pthread_mutex_init(&f->group.lock, NULL);
	assert_int_equal(gs_worker_start(&f->worker, &f->loop), 0);
	struct gs_engine_env env = {
		.loop = &f->loop,
		.settings = &f->settings,
		.backend = &f->backend.b,
		.worker = &f->worker,
		.group = { &f->group, group_agree, group_withdraw, group_regroup, group_vote },
		.buffer_takes_fd = fake_takes_fd,
		.parse_buffer = fake_parse,
	};
	gs_job_init(&f->job, &env);
	struct gs_world w = { nodes, 0, nodes * RANKS, 0, 1, true };
	gs_job_set_world(&f->job, &w);
	return f;
}

static void fx_free(struct fx *f)
{
	fake_set_hold(&f->backend, false);
	for (unsigned r = 0; r < RANKS; r++)
		client_gone(&f->client[r]);
	gs_job_close(&f->job);
	gs_worker_stop(&f->worker);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	gs_job_destroy(&f->job);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	free(f);
}

static uint64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Runs the loop until done(f) holds; fails the test after 2 s. */
static void run_until(struct fx *f, bool (*done)(struct fx *f))
{
	uint64_t end = ms_now() + 2000;
	while (!done(f)) {
		if (ms_now() > end)
			fail_msg("timed out waiting on the loop");
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(100);
	}
}

/* Lets the loop and the worker run a little (for what must not happen). */
static void run_a_while(struct fx *f)
{
	for (int i = 0; i < 50; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(100);
	}
}

static bool idle(struct fx *f)
{
	return !f->job.in_step && f->job.inflight == 0;
}

/* The trainer of local rank `rank` says hello and registers the four
 * tensors, back to back in its memory, each element numbered. */
static void attach(struct fx *f, unsigned rank)
{
	struct fake_client *c = &f->client[rank];
	struct gs_client client = { &client_ops, c, 1000 + (pid_t)rank, getuid() };
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.local_rank = rank;
	h.job_id = "test";
	c->t = gs_job_attach(&f->job, &client, &h);
	assert_non_null(c->t);

	void *addr = c->mem;
	Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
	Gradsync__Buffer *bufs[1] = { &buf };
	buf.size = sizeof(c->mem);
	buf.cuda_ipc_handle.len = sizeof(addr);
	buf.cuda_ipc_handle.data = (uint8_t *)&addr;
	Gradsync__TensorSpec specs[NT], *sp[NT];
	static const char *names[NT] = { "a", "b", "c", "d" };
	uint64_t offset = 0;
	for (unsigned i = 0; i < NT; i++) {
		gradsync__tensor_spec__init(&specs[i]);
		specs[i].name = (char *)names[i];
		specs[i].count = counts[i];
		specs[i].dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
		specs[i].offset = offset;
		offset += counts[i] * sizeof(float);
		sp[i] = &specs[i];
	}
	Gradsync__RegisterTensors reg = GRADSYNC__REGISTER_TENSORS__INIT;
	reg.n_buffers = 1;
	reg.buffers = bufs;
	reg.n_tensors = NT;
	reg.tensors = sp;
	reg.last = true;
	gs_trainer_register(c->t, &reg);
	assert_int_equal(c->error_code, 0);
}

static void attach_all(struct fx *f)
{
	for (unsigned r = 0; r < RANKS; r++)
		attach(f, r);
	if (f->job.world.nodes > 1) {
		assert_int_equal(f->group.agreements, 1);
		assert_int_equal(f->client[0].registered, 0); /* waits for the nodes */
		gs_job_layout_verdict(&f->job, f->group.round, GS_OK, "");
	}
	for (unsigned r = 0; r < RANKS; r++)
		assert_int_equal(f->client[r].registered, 1);
}

static void begin(struct fx *f, unsigned rank, uint64_t step)
{
	Gradsync__BeginStep b = GRADSYNC__BEGIN_STEP__INIT;
	b.step = step;
	b.bucket_events = true;
	gs_job_begin_step(f->client[rank].t, &b);
}

static void mark(struct fx *f, unsigned rank, uint64_t step, size_t n, const uint64_t *tensors)
{
	Gradsync__GradientsReady r = GRADSYNC__GRADIENTS_READY__INIT;
	r.step = step;
	r.n_tensors = n;
	r.tensors = (uint64_t *)tensors;
	gs_job_mark_ready(f->client[rank].t, &r);
}

static const uint64_t all[NT] = { 0, 1, 2, 3 };

static void fill(struct fx *f)
{
	for (unsigned r = 0; r < RANKS; r++)
		for (unsigned e = 0; e < ELEMENTS; e++)
			f->client[r].mem[e] = (float)(e + 1) * (r == 0 ? 1.0f : 3.0f);
}

/* ---- The plan and the order of launches ------------------------------------ */

static void test_plan(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	attach_all(f);
	const struct gs_plan *p = &f->job.plan;
	assert_int_equal(p->nbuckets, NBUCKETS);
	for (unsigned i = 0; i < NT; i++)
		assert_int_equal(p->bucket_of[i], bucket_of[i]);
	/* Bucket 1 holds tensors 0 and 2, in that order. */
	assert_int_equal(p->buckets[1].count, 2);
	assert_int_equal(p->members[p->buckets[1].first], 0);
	assert_int_equal(p->members[p->buckets[1].first + 1], 2);
	fx_free(f);
}

/* Buckets launch in plan order, and only once every local trainer has
 * marked all of a bucket's tensors; the step then completes with the
 * averages written into every trainer's memory. */
static void test_launch_order_and_results(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	attach_all(f);
	fill(f);
	begin(f, 0, 1);
	begin(f, 1, 1);
	/* Rank 0: the later buckets (tensors 0, 2, 3), not bucket 0. */
	const uint64_t later[] = { 3, 2, 0 };
	mark(f, 0, 1, 3, later);
	run_a_while(f);
	assert_int_equal(fake_reduced(&f->backend), 0);
	/* Rank 1 everything: bucket 0 still lacks rank 0's tensor 1. */
	mark(f, 1, 1, NT, all);
	run_a_while(f);
	assert_int_equal(fake_reduced(&f->backend), 0);
	assert_int_equal(f->job.next_launch, 0);
	const uint64_t first[] = { 1 };
	mark(f, 0, 1, 1, first);
	run_until(f, idle);

	assert_int_equal(f->backend.norder, NBUCKETS);
	for (uint32_t b = 0; b < NBUCKETS; b++)
		assert_int_equal(f->backend.order[b], b);
	for (unsigned r = 0; r < RANKS; r++) {
		struct fake_client *c = &f->client[r];
		assert_int_equal(c->step_done, 1);
		assert_int_equal(c->step, 1);
		assert_int_equal(c->step_status, GRADSYNC__STEP_STATUS__STEP_OK);
		assert_int_equal(c->nbucket_done, NBUCKETS);
		for (uint32_t b = 0; b < NBUCKETS; b++)
			assert_int_equal(c->bucket_done[b], b);
		/* The average of e+1 and 3(e+1). */
		for (unsigned e = 0; e < ELEMENTS; e++)
			assert_true(c->mem[e] == 2.0f * (float)(e + 1));
	}
	assert_int_equal(f->job.stats.steps_completed, 1);
	assert_int_equal(f->job.stats.steps_aborted, 0);
	fx_free(f);
}

/* ---- Aborts ------------------------------------------------------------------ */

/* A trainer that leaves mid-step aborts the step, which names it. */
static void test_trainer_leaves_mid_step(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	attach_all(f);
	begin(f, 0, 1);
	begin(f, 1, 1);
	mark(f, 0, 1, NT, all);
	client_gone(&f->client[1]);
	run_until(f, idle);
	struct fake_client *c = &f->client[0];
	assert_int_equal(c->step_done, 1);
	assert_int_equal(c->step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
	assert_non_null(strstr(c->step_message,
			       "trainer local rank 1 (pid 1001) of node 0 went away during step 1"));
	assert_int_equal(fake_reduced(&f->backend), 0);
	assert_int_equal(f->job.stats.steps_aborted, 1);
	fx_free(f);
}

/* A step that waits past --step-timeout is aborted with a reason naming
 * what it waited for, and every trainer gets that reason: the one in the
 * step at once, the one that had not begun it when it does. */
static void test_stall_reason_to_every_trainer(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	f->settings.step_timeout = 0; /* the stall timer fires at once */
	f->settings.stall_warning = 0;
	attach_all(f);
	begin(f, 0, 1);
	mark(f, 0, 1, NT, all);
	run_until(f, idle);
	const char *reason = "step 1 timed out after 0 s (--step-timeout) on node 0: local rank 1 (pid 1001) has not begun the step";
	assert_int_equal(f->client[0].step_done, 1);
	assert_int_equal(f->client[0].step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
	assert_string_equal(f->client[0].step_message, reason);
	begin(f, 1, 1);
	assert_int_equal(f->client[1].step_done, 1);
	assert_int_equal(f->client[1].step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
	assert_string_equal(f->client[1].step_message, reason);
	assert_int_equal(f->job.stats.steps_aborted, 1);
	fx_free(f);
}

/* A bucket whose all-reduce fails aborts the step for every trainer, who
 * learn which buckets' tensors were reduced before it. */
static void test_failed_bucket_aborts(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	f->backend.fail_bucket = 1;
	attach_all(f);
	for (unsigned r = 0; r < RANKS; r++) {
		begin(f, r, 1);
		mark(f, r, 1, NT, all);
	}
	run_until(f, idle);
	for (unsigned r = 0; r < RANKS; r++) {
		struct fake_client *c = &f->client[r];
		assert_int_equal(c->step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
		assert_string_equal(c->step_message,
				    "all-reduce of bucket 1 failed: the fake network broke");
		assert_int_equal(c->completed_tensors, 1); /* bucket 0: tensor 1 */
	}
	fx_free(f);
}

/* ---- The vote of the nodes ------------------------------------------------------ */

/* The other node votes to abort (its trainer went away): every bucket of
 * this node stops at the vote, and the step ends naming that node. */
static void test_remote_vote_aborts(void **state)
{
	(void)state;
	struct fx *f = fx_new(2);
	f->group.remote[0] = 1;
	f->group.remote[1] = 1; /* node 1 */
	f->group.remote[2] = 0; /* its local rank 0 */
	f->group.remote[3] = GS_ABORT_TRAINER_GONE;
	attach_all(f);
	for (unsigned r = 0; r < RANKS; r++) {
		begin(f, r, 1);
		mark(f, r, 1, NT, all);
	}
	run_until(f, idle);
	assert_true(f->group.votes >= 1);
	assert_true(f->group.local[0] == 0); /* this node voted to go on */
	assert_int_equal(fake_reduced(&f->backend), 0);
	for (unsigned r = 0; r < RANKS; r++) {
		struct fake_client *c = &f->client[r];
		assert_int_equal(c->step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
		assert_string_equal(c->step_message,
				    "trainer local rank 0 of node 1 went away during step 1");
	}
	assert_int_equal(f->job.stats.steps_aborted, 1);
	fx_free(f);
}

/* This node aborts (a trainer left mid-step): it takes part in the next
 * bucket's vote with its abort, so that the other nodes end the step too,
 * naming this node and the trainer. */
static void test_local_abort_votes(void **state)
{
	(void)state;
	struct fx *f = fx_new(2);
	attach_all(f);
	begin(f, 0, 1);
	begin(f, 1, 1);
	client_gone(&f->client[1]);
	run_until(f, idle);
	assert_int_equal(f->group.votes, 1);
	assert_true(f->group.local[0] == 1);                      /* abort */
	assert_true(f->group.local[1] == 0);                      /* node 0 */
	assert_true(f->group.local[2] == 1);                      /* local rank 1 */
	assert_true(f->group.local[3] == GS_ABORT_TRAINER_GONE);  /* why */
	assert_int_equal(f->client[0].step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
	fx_free(f);
}

static bool holding(struct fx *f)
{
	return f->job.holding_failure && f->job.inflight == 1;
}

/* A collective that fails with several nodes is held a moment for the
 * group's word: a node lost then names the step's abort, and the group
 * waits until it is whole again. */
static void test_peer_lost_names_the_abort(void **state)
{
	(void)state;
	struct fx *f = fx_new(2);
	f->backend.fail_bucket = 0;
	attach_all(f);
	for (unsigned r = 0; r < RANKS; r++) {
		begin(f, r, 1);
		mark(f, r, 1, NT, all);
	}
	run_until(f, holding);
	assert_int_equal(f->client[0].step_done, 0);
	gs_job_peer_lost(&f->job, "node 1 went away: test");
	run_until(f, idle);
	for (unsigned r = 0; r < RANKS; r++) {
		assert_int_equal(f->client[r].step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
		assert_string_equal(f->client[r].step_message, "node 1 went away: test");
	}
	assert_int_equal(f->group.regroups, 0);
	assert_false(f->job.world.group_ready);
	gs_job_resume(&f->job, 2);
	assert_true(f->job.world.group_ready);
	assert_int_equal(f->job.world.generation, 2);
	fx_free(f);
}

/* ---- Reaping a trainer that went away --------------------------------------------- */

/* A trainer that leaves once every bucket has launched lets the step
 * finish; its memory, which the buckets read and write, is released only
 * after the last of them is done. */
static void test_reap_after_buckets(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	attach_all(f);
	fake_set_hold(&f->backend, true);
	for (unsigned r = 0; r < RANKS; r++) {
		begin(f, r, 1);
		mark(f, r, 1, NT, all);
	}
	assert_int_equal(f->job.next_launch, NBUCKETS);
	uint64_t end = ms_now() + 2000;
	while (fake_held(&f->backend) == 0 && ms_now() < end)
		usleep(100);
	assert_int_equal(fake_held(&f->backend), 1);
	client_gone(&f->client[1]);
	run_a_while(f);
	assert_int_equal(f->backend.released, 0);
	assert_non_null(f->job.retired);
	fake_set_hold(&f->backend, false);
	run_until(f, idle);
	run_a_while(f);
	assert_int_equal(f->backend.released, 1);
	assert_null(f->job.retired);
	assert_int_equal(f->client[0].step_status, GRADSYNC__STEP_STATUS__STEP_OK);
	fx_free(f);
}

/* A trainer that leaves before the buckets have all launched aborts the
 * step; its memory, which the bucket in flight reads, is released only
 * once that bucket is done. */
static void test_reap_after_abort(void **state)
{
	(void)state;
	struct fx *f = fx_new(1);
	attach_all(f);
	fake_set_hold(&f->backend, true);
	const uint64_t first[] = { 1 };
	for (unsigned r = 0; r < RANKS; r++) {
		begin(f, r, 1);
		mark(f, r, 1, 1, first);
	}
	assert_int_equal(f->job.next_launch, 1);
	client_gone(&f->client[1]);
	run_a_while(f);
	assert_int_equal(f->backend.released, 0);
	assert_true(f->job.aborting);
	fake_set_hold(&f->backend, false);
	run_until(f, idle);
	run_a_while(f);
	assert_int_equal(f->backend.released, 1);
	assert_null(f->job.retired);
	assert_int_equal(f->client[0].step_status, GRADSYNC__STEP_STATUS__STEP_ABORTED);
	assert_int_equal(f->client[0].completed_tensors, 1); /* bucket 0 finished */
	fx_free(f);
}

/* A trainer that leaves between steps is freed from the loop, never
 * inside the call that found it gone; the last one to leave ends the job
 * (its layout no longer binds the other nodes). */
static void test_reap_from_the_loop(void **state)
{
	(void)state;
	struct fx *f = fx_new(2);
	attach_all(f);
	client_gone(&f->client[1]);
	assert_int_equal(f->backend.released, 0);
	assert_non_null(f->job.retired);
	run_a_while(f);
	assert_int_equal(f->backend.released, 1);
	assert_null(f->job.retired);
	assert_true(f->job.has_layout);
	client_gone(&f->client[0]);
	run_a_while(f);
	assert_int_equal(f->backend.released, 2);
	assert_false(f->job.has_layout);
	assert_int_equal(f->group.withdrawals, 1);
	fx_free(f);
}

int main(void)
{
	gs_log_init(GS_LOG_ERROR);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan),
		cmocka_unit_test(test_launch_order_and_results),
		cmocka_unit_test(test_trainer_leaves_mid_step),
		cmocka_unit_test(test_stall_reason_to_every_trainer),
		cmocka_unit_test(test_failed_bucket_aborts),
		cmocka_unit_test(test_remote_vote_aborts),
		cmocka_unit_test(test_local_abort_votes),
		cmocka_unit_test(test_peer_lost_names_the_abort),
		cmocka_unit_test(test_reap_after_buckets),
		cmocka_unit_test(test_reap_after_abort),
		cmocka_unit_test(test_reap_from_the_loop),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
