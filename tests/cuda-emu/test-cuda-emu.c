/*
 * gradsyncd's CUDA backend end to end on the CUDA emulation: the real
 * daemon (gradsyncd-cuda-emu, GS_DAEMON) and real trainer processes
 * (emu-trainer, GS_TRAINER) that register ResNet-50 as CUDA tensors
 * through libgradsync and check every element of every step against their
 * own reference. Also: a trainer that dies holding handles, or in the
 * middle of its registration, leaves no mapping behind in the daemon,
 * which serves the next trainers; a trainer whose GPU work is late past
 * --peer-timeout aborts the step, and the communicators are made again for
 * the next, as after a creation that failed at the first bucket; each
 * local rank reduced on the GPU its buffers' PCI bus id names, whatever
 * the trainer's and the daemon's numbering (GS_CUDA_EMU_VISIBLE_DEVICES),
 * and the GPUs it refuses; two daemons, one emulated GPU each, that share
 * node 0's NCCL unique id through the rendezvous; a node lost in an all-reduce, or
 * between two launches of a staged bucket; a node (node 0 too) lost and
 * back, with new communicators. And a trainer's state in GPU memory
 * (emu-state-trainer, GS_STATE_TRAINER): broadcast across GPUs and
 * between nodes, after a restart of gradsyncd, with its source killed,
 * and refused where its layout differs or its buffers carry events.
 */
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "gradsync.h"
#include "harness.h"

/* Every daemon here drives emulated GPUs; its job comes from the test's
 * struct harness_job (harness_job_daemon_spawn). */
static const char *const cuda_backend[] = { "--backend=cuda", NULL };

/* Starts one emu-trainer of node `node` of job j, given the job in its
 * environment; its output goes to log (200 bytes). */
static pid_t trainer(const struct harness_job *j, unsigned node, const char *socket,
		     const char *dir, unsigned rank, unsigned global_rank, const char *steps,
		     const char *const *extra, char *log)
{
	char r[16], g[16];
	snprintf(r, sizeof(r), "%u", rank);
	snprintf(g, sizeof(g), "%u", global_rank);
	snprintf(log, 200, "%s/trainer-%s%u.log", dir, j->id ? j->id : "", global_rank);
	const char *argv[16] = { getenv("GS_TRAINER"), "--socket", socket, "--layout",
				 harness_layout("resnet50.txt"), "--rank", r, "--global-rank", g,
				 "--steps", steps };
	for (size_t i = 0; extra && extra[i] && i < 4; i++)
		argv[11 + i] = extra[i];
	return harness_job_spawn(j, node, argv, log);
}

/* Waits for the trainers; each must exit 0 having printed PASS. */
static void expect_pass(const pid_t *pids, char (*logs)[200], unsigned n)
{
	int failed = 0;
	for (unsigned i = 0; i < n; i++) {
		int status = harness_wait(pids[i], 120000);
		if (status != 0 || !harness_file_contains(logs[i], "PASS")) {
			harness_dump(logs[i]);
			failed = 1;
		}
	}
	assert_int_equal(failed, 0);
}

/* One daemon of two emulated GPUs, two trainers of job j. */
static void sync_case(struct harness_job *j, const char *steps, const char *const *trainer_args)
{
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, j, 0, cuda_backend);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(j, 0, d.socket, d.dir, r, r, steps, trainer_args, logs[r]);
	expect_pass(pids, logs, 2);
	/* Every step's gradient norm, the same bits on both trainers. */
	harness_expect_same_lines((const char *const[]){ logs[0], logs[1] }, 2, "NORM ");
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Buckets of up to 2M elements (--threshold's default) through a fusion
 * buffer of 256K: several launches per bucket. Each emulated kernel takes
 * 3 ms longer, so that whatever the daemon read before its stream got
 * there would be stale. */
static void sync_bf16_several_launches(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 }, .wire = "bf16", .fusion_buffer = "262144" };
	const char *targs[] = { "--clip-step=1", NULL };
	setenv("GS_CUDA_EMU_KERNEL_DELAY_MS", "3", 1);
	sync_case(&job, "1", targs);
	unsetenv("GS_CUDA_EMU_KERNEL_DELAY_MS");
}

/* Ordinary values only, so that the step's gradient norm is finite (the
 * special values make it NaN), through several launches per bucket: the
 * trainers check it against their own fp64 sum, and each other's bits. */
static void sync_finite_norm_several_launches(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 }, .wire = "fp32", .fusion_buffer = "262144" };
	const char *targs[] = { "--finite", NULL };
	sync_case(&job, "1", targs);
}

/* Two steps in fp16 (step 2 clips), and the worker sleeps while the
 * GPUs work, until the GPU wakes it: each step's gradients come 1 s late
 * on the trainers' streams (behind a host function that sleeps), so the
 * worker waits 2 s in all on their ready events, then on its own streams
 * at every bucket. A worker that polled the GPU with sleeps of at most
 * 200 us went to sleep over 11,000 times (the kernel's voluntary switches
 * of the gs-worker thread); woken by a host function queued behind the
 * awaited work, and every 100 ms while a stream runs (to look at NCCL's
 * errors), about 460 times here (740 under the sanitizers, whose
 * emulated kernels are slower): a bound of 3,000 leaves room for a loaded
 * machine and still fails a polling worker by far. */
static void sync_fp16_worker_sleeps(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 }, .wire = "fp16" };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, cuda_backend);
	const char *targs[] = { "--delay-ms=1000", "--linger", NULL };
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&job, 0, d.socket, d.dir, r, r, "2", targs, logs[r]);
	for (unsigned r = 0; r < 2; r++) /* the job's worker lives while they linger */
		harness_wait_for_text(logs[r], "LINGERING", 120);
	long sleeps = harness_thread_sleeps(d.pid, "gs-worker");
	fprintf(stderr, "the worker went to sleep %ld times over 2 steps of 1 s waits\n", sleeps);
	for (unsigned r = 0; r < 2; r++) {
		if (!harness_file_contains(logs[r], "PASS"))
			harness_dump(logs[r]);
		assert_true(harness_file_contains(logs[r], "PASS"));
		kill(pids[r], SIGKILL);
		harness_wait(pids[r], 10000);
	}
	harness_expect_same_lines((const char *const[]){ logs[0], logs[1] }, 2, "NORM ");
	assert_int_equal(harness_daemon_stop(&d), 0);
	assert_true(sleeps < 3000);
}

/* A backward pass in the trainers: each batch of eight gradients comes
 * 10 ms after the one before (21 batches), all queued and marked ready at
 * once, as autograd's hooks run ahead of the GPU; the last batch waits on
 * the stream until the first bucket is back (up to 60 s). The first
 * bucket must come back reduced while later batches are still being
 * produced: each mark records its own entry of the trainer's ring of
 * ready events, and gradsyncd waits for the entry of the bucket's last
 * mark. With one ready event, the latest record covered the whole
 * backward pass, and the gate would time out. */
static void overlaps_the_backward_pass(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 }, .wire = "fp16" };
	const char *targs[] = { "--overlap=10", NULL };
	sync_case(&job, "2", targs);
}

/* Gradients no trainer produced, or one only (emu-trainer --absent):
 * their tasks leave the unpack kernel's table, in buckets of several
 * launches. */
static void sync_absent_several_launches(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 }, .wire = "fp16", .fusion_buffer = "262144" };
	const char *targs[] = { "--absent=3", NULL };
	sync_case(&job, "2", targs);
}

/* ---- Trainers that go away ---------------------------------------------------- */

/* Lines of /proc/<pid>/maps that map memfds of the CUDA emulation made by
 * process `owner` ("mem" or "event"). */
static int mappings(pid_t pid, const char *kind, pid_t owner)
{
	char path[64], needle[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	snprintf(needle, sizeof(needle), "memfd:gs-cuda-emu-%s-%d ", kind, (int)owner);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* Waits up to 10 s until the daemon maps nothing of owner's. */
static void expect_unmapped(const struct gs_test_daemon *d, pid_t owner)
{
	for (int i = 0; i < 1000; i++) {
		if (mappings(d->pid, "mem", owner) == 0 && mappings(d->pid, "event", owner) == 0)
			return;
		usleep(10000);
	}
	harness_dump(d->log);
	fail_msg("gradsyncd still maps %d allocations and %d events of process %d, which is gone",
		 mappings(d->pid, "mem", owner), mappings(d->pid, "event", owner), (int)owner);
}

/* The job of one daemon of two emulated GPUs and two trainers. */
static struct harness_job pair = { .local_size = { 2 } };

/* The next pair of trainers gets its step done. */
static void serves_next(struct gs_test_daemon *d)
{
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&pair, 0, d->socket, d->dir, r, r, "1", NULL, logs[r]);
	expect_pass(pids, logs, 2);
	assert_true(harness_daemon_alive(d));
}

static void trainer_killed_after_registering(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	char log[200];
	const char *hold[] = { "--hold", NULL };
	pid_t t = trainer(&pair, 0, d.socket, d.dir, 0, 0, "1", hold, log);
	harness_wait_for_text(log, "REGISTERED", 30);
	/* Its one allocation and its events (a ring of 32 ready events and
	 * the done event) are open in the daemon. */
	assert_int_equal(mappings(d.pid, "mem", t), 1);
	assert_int_equal(mappings(d.pid, "event", t), 33);
	kill(t, SIGKILL);
	harness_wait(t, 10000);
	expect_unmapped(&d, t);
	serves_next(&d);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A raw trainer holding real handles of this process's emulated GPU
 * memory, on one of its GPUs: one allocation of 1 MiB and the two events. */
struct raw_trainer {
	void *mem;
	cudaEvent_t ready, done;
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t rh, dh;
	char pci[32];
};

static void raw_trainer_make_on(struct raw_trainer *t, int device)
{
	unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
	assert_int_equal(cudaSetDevice(device), cudaSuccess);
	assert_int_equal(cudaMalloc(&t->mem, 1 << 20), cudaSuccess);
	assert_int_equal(cudaEventCreateWithFlags(&t->ready, flags), cudaSuccess);
	assert_int_equal(cudaEventCreateWithFlags(&t->done, flags), cudaSuccess);
	assert_int_equal(cudaIpcGetMemHandle(&t->mh, t->mem), cudaSuccess);
	assert_int_equal(cudaIpcGetEventHandle(&t->rh, t->ready), cudaSuccess);
	assert_int_equal(cudaIpcGetEventHandle(&t->dh, t->done), cudaSuccess);
	assert_int_equal(cudaDeviceGetPCIBusId(t->pci, sizeof(t->pci), device), cudaSuccess);
}

static void raw_trainer_make(struct raw_trainer *t)
{
	raw_trainer_make_on(t, 1);
}

static void raw_trainer_free(struct raw_trainer *t)
{
	cudaFree(t->mem);
	cudaEventDestroy(t->ready);
	cudaEventDestroy(t->done);
}

/* Connects as local rank `rank` and sends the first frame of a
 * registration, `last` unset: ev's events, then mem's allocation (claimed
 * to have `size` bytes) with one tensor in it, each with its GPU's PCI
 * bus id. Returns the socket. */
static int raw_register(const struct raw_trainer *ev, const struct raw_trainer *mem,
			unsigned rank, const struct gs_test_daemon *d, uint64_t size)
{
	Gradsync__Buffer events = GRADSYNC__BUFFER__INIT, alloc = GRADSYNC__BUFFER__INIT;
	events.device = alloc.device = 1;
	events.pci_bus_id = (char *)ev->pci;
	alloc.pci_bus_id = (char *)mem->pci;
	events.cuda_ready_event = (ProtobufCBinaryData){ sizeof(ev->rh), (uint8_t *)&ev->rh };
	events.cuda_done_event = (ProtobufCBinaryData){ sizeof(ev->dh), (uint8_t *)&ev->dh };
	alloc.size = size;
	alloc.cuda_ipc_handle = (ProtobufCBinaryData){ sizeof(mem->mh), (uint8_t *)&mem->mh };
	Gradsync__Buffer *bufs[] = { &events, &alloc };
	Gradsync__TensorSpec spec = GRADSYNC__TENSOR_SPEC__INIT, *sp = &spec;
	spec.name = "fc.weight";
	spec.count = 1000;
	spec.dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
	spec.buffer = 1;
	Gradsync__RegisterTensors r = GRADSYNC__REGISTER_TENSORS__INIT;
	r.n_buffers = 2;
	r.buffers = bufs;
	r.n_tensors = 1;
	r.tensors = &sp;
	r.last = false;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &r;
	int sock = raw_connect(d->socket);
	raw_hello_job(sock, rank, &pair);
	raw_send(sock, &m, NULL, 0);
	return sock;
}

/* Local rank 1, everything on t's GPU. */
static int raw_trainer_register(const struct raw_trainer *t, const struct gs_test_daemon *d,
				uint64_t size)
{
	return raw_register(t, t, 1, d, size);
}

/* A trainer that hangs up after the first frame of its registration. */
static void trainer_gone_mid_registration(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	struct raw_trainer t;
	raw_trainer_make(&t);
	int sock = raw_trainer_register(&t, &d, 1 << 20);
	/* The daemon opens the handles as the frame comes... */
	for (int i = 0; i < 1000 && mappings(d.pid, "mem", getpid()) == 0; i++)
		usleep(10000);
	assert_int_equal(mappings(d.pid, "mem", getpid()), 1);
	assert_int_equal(mappings(d.pid, "event", getpid()), 2);
	/* ...and closes them when the trainer goes before its last frame. */
	close(sock);
	expect_unmapped(&d, getpid());
	serves_next(&d);
	raw_trainer_free(&t);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Handles the daemon must refuse, with what the driver says: an
 * allocation smaller than the trainer claims, and a freed allocation's. */
static void bad_handles(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	struct raw_trainer t;
	raw_trainer_make(&t);
	int sock = raw_trainer_register(&t, &d, 2 << 20);
	raw_expect_error(sock, GS_EBUFFER, "the trainer says its allocation has 2097152 bytes, but the one its handle opens has 1048576");
	close(sock);
	/* Freed, and its descriptor number most likely taken by the next
	 * allocation: the handle must not open that one. */
	void *next;
	assert_int_equal(cudaFree(t.mem), cudaSuccess);
	assert_int_equal(cudaMalloc(&next, 1 << 20), cudaSuccess);
	t.mem = NULL;
	sock = raw_trainer_register(&t, &d, 1 << 20);
	raw_expect_error(sock, GS_EBUFFER, "cannot open its CUDA IPC handle: mapping of buffer object failed");
	close(sock);
	cudaFree(next);
	expect_unmapped(&d, getpid());
	raw_trainer_free(&t);
	assert_true(harness_daemon_alive(&d));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- GPUs found by their PCI bus id ------------------------------------------------- */

/* An emulated node of eight GPUs. The job's trainers run on its GPUs 4 to
 * 7 and see only those (GS_CUDA_EMU_VISIBLE_DEVICES, as CUDA_VISIBLE_DEVICES
 * would), local rank r on their device 3 - r: the node's GPU 7 - r.
 * gradsyncd sees all eight, so local rank r must reduce on its device
 * 7 - r, which only the buffers' PCI bus ids tell it: the emulated GPUs
 * have no peer access, so a kernel on any other GPU fails the step. Every
 * element of every trainer is checked. */
static void gpus_by_bus_id(void **state)
{
	(void)state;
	setenv("GS_CUDA_EMU_DEVICES", "8", 1);
	/* fp32: the emulated NCCL rounds after each addition, as a ring, and
	 * with four ranks only fp32 gives the trainers' single rounding. */
	struct harness_job job = { .local_size = { 4 }, .wire = "fp32" };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, cuda_backend);
	pid_t pids[4];
	char logs[4][200], dev[4][16];
	setenv("GS_CUDA_EMU_VISIBLE_DEVICES", "4,5,6,7", 1);
	for (unsigned r = 0; r < 4; r++) {
		snprintf(dev[r], sizeof(dev[r]), "%u", 3 - r);
		const char *targs[] = { "--device", dev[r], "--clip-step=1", NULL };
		pids[r] = trainer(&job, 0, d.socket, d.dir, r, r, "1", targs, logs[r]);
	}
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	expect_pass(pids, logs, 4);
	/* The node's GPU 7 is on bus 0x18 + 7. */
	assert_true(harness_log_contains(&d, "local rank 0 on GPU 0000:1f:00.0 (device 7 here"));
	assert_true(harness_log_contains(&d, "local rank 3 on GPU 0000:1c:00.0 (device 4 here"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* One gradsyncd on an emulated node of eight GPUs, and two jobs at once on
 * GPUs of their own: job "low"'s two trainers see the node's GPUs 3 and 2
 * only, local rank r on its device r (the node's GPU 3 - r); job "high"'s
 * see every GPU, local rank r on its device 6 + r. Each job has its own
 * backend, whose ranks are bound where their buffers are; both jobs' steps
 * must be right in every element. */
static void two_jobs_own_gpus(void **state)
{
	(void)state;
	setenv("GS_CUDA_EMU_DEVICES", "8", 1);
	struct harness_job low = { .id = "low", .local_size = { 2 }, .wire = "fp16" };
	struct harness_job high = { .id = "high", .local_size = { 2 }, .wire = "fp16" };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &low, 0, cuda_backend);
	pid_t pids[4];
	char logs[4][200];
	setenv("GS_CUDA_EMU_VISIBLE_DEVICES", "3,2", 1);
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&low, 0, d.socket, d.dir, r, r, "2", NULL, logs[r]);
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	const char *dev[2][3] = { { "--device", "6", NULL }, { "--device", "7", NULL } };
	for (unsigned r = 0; r < 2; r++)
		pids[2 + r] = trainer(&high, 0, d.socket, d.dir, r, r, "2", dev[r], logs[2 + r]);
	expect_pass(pids, logs, 4);
	assert_true(harness_log_contains(&d, "local rank 0 on GPU 0000:1b:00.0 (device 3 here"));
	assert_true(harness_log_contains(&d, "local rank 0 on GPU 0000:1e:00.0 (device 6 here"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* --gpus: a daemon allowed the node's GPUs 4 to 7 refuses a trainer on
 * GPU 0, naming its bus id and the list, and serves one on GPU 5. */
static void gpus_allow_list(void **state)
{
	(void)state;
	setenv("GS_CUDA_EMU_DEVICES", "8", 1);
	const char *args[] = { "--backend=cuda",
			       "--gpus=0000:1c:00.0,0000:1d:00.0,0000:1e:00.0,0000:1f:00.0", NULL };
	struct harness_job job = { .local_size = { 1 } };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, args);
	pid_t pid;
	char log[200];
	const char *gpu0[] = { "--device", "0", NULL }, *gpu5[] = { "--device", "5", NULL };
	pid = trainer(&job, 0, d.socket, d.dir, 0, 0, "1", gpu0, log);
	assert_int_not_equal(harness_wait(pid, 60000), 0);
	assert_true(harness_file_contains(log, "it is on GPU 0000:18:00.0, which is not one this gradsyncd may use (--gpus"));
	pid = trainer(&job, 0, d.socket, d.dir, 0, 0, "1", gpu5, log);
	expect_pass(&pid, (char (*)[200])log, 1);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* What gradsyncd refuses, with the GPUs named: a buffer on a GPU it does
 * not see, a second local rank on a GPU a first one has, and a local rank
 * whose buffers move to another GPU than its first one's. It then serves
 * the next trainers, each rank on its GPU. */
static void gpu_refusals(void **state)
{
	(void)state;
	setenv("GS_CUDA_EMU_DEVICES", "4", 1);
	struct gs_test_daemon d;
	setenv("GS_CUDA_EMU_VISIBLE_DEVICES", "0,1", 1);
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	struct raw_trainer on[3];
	for (int g = 0; g < 3; g++)
		raw_trainer_make_on(&on[g], g);
	int sock = raw_register(&on[2], &on[2], 1, &d, 1 << 20);
	raw_expect_error(sock, GS_EBUFFER, "buffer 0: it is on GPU 0000:1a:00.0, which this gradsyncd does not see");
	close(sock);

	char log[200];
	const char *hold[] = { "--hold", NULL };
	pid_t t = trainer(&pair, 0, d.socket, d.dir, 0, 0, "1", hold, log);
	harness_wait_for_text(log, "REGISTERED", 30);
	sock = raw_register(&on[0], &on[0], 1, &d, 1 << 20);
	raw_expect_error(sock, GS_EBUFFER, "buffer 0: local ranks 0 and 1 are both on GPU 0000:18:00.0, but NCCL takes one rank of a communicator per GPU");
	close(sock);
	kill(t, SIGKILL);
	harness_wait(t, 10000);

	/* Its events bind local rank 1 to GPU 1; its memory is on GPU 0. */
	sock = raw_register(&on[1], &on[0], 1, &d, 1 << 20);
	raw_expect_error(sock, GS_EBUFFER, "buffer 1: it is on GPU 0000:18:00.0, but local rank 1 reduces on GPU 0000:19:00.0, where its first buffer was");
	close(sock);
	expect_unmapped(&d, getpid());
	serves_next(&d);
	for (int g = 0; g < 3; g++)
		raw_trainer_free(&on[g]);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Each GPU's fusion buffer is sized by the layout (ResNet-50's largest
 * bucket, 3,151,872 elements, where the setting allows 4,194,304) and
 * made at the first bucket; --max-fusion-memory counts one per GPU of
 * the job: 16 MiB holds one (12 MiB), not the pair, and a job of two
 * GPUs is refused at registration naming the setting. */
static void fusion_buffers_by_layout_within_budget(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 2 } };
	static const char *const tight[] = { "--backend=cuda", "--max-fusion-memory=16777216", NULL };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &job, 0, tight);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&job, 0, d.socket, d.dir, r, r, "1", NULL, logs[r]);
	for (unsigned r = 0; r < 2; r++) {
		assert_int_not_equal(harness_wait(pids[r], 120000), 0);
		if (!harness_file_contains(logs[r], "(--max-fusion-memory=16777216 bytes, 0 in use by other jobs)")) {
			harness_dump(logs[r]);
			fail_msg("trainer %u was not refused naming --max-fusion-memory", r);
		}
	}
	assert_int_equal(harness_daemon_stop(&d), 0);

	harness_job_daemon_start(&d, &job, 0, cuda_backend);
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&job, 0, d.socket, d.dir, r, r, "1", NULL, logs[r]);
	expect_pass(pids, logs, 2);
	for (unsigned r = 0; r < 2; r++) {
		char line[100];
		snprintf(line, sizeof(line), "cuda: local rank %u has a fusion buffer of 3151872 elements (12 MiB)", r);
		assert_true(harness_log_contains(&d, line));
	}
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- Two nodes ------------------------------------------------------------------------------ */

/* The job of two nodes of one emulated GPU and one trainer each. */
#define TWO_NODES { .nodes = 2, .local_size = { 1, 1 } }

/* Node `rank` of job j, one emulated GPU; extra arguments (NULL ended)
 * after the usual ones. Does not wait for it. */
static void spawn_node(struct gs_test_daemon *d, struct harness_job *j, unsigned rank,
		       const char *const *extra)
{
	const char *a[16] = { "--backend=cuda", "--join-timeout=30" };
	size_t n = 2;
	for (size_t i = 0; extra && extra[i] && n < 15; i++)
		a[n++] = extra[i];
	harness_job_daemon_spawn(d, j, rank, a);
}

/* Both nodes of job j, each serving trainers. */
static void start_two_nodes(struct gs_test_daemon d[2], struct harness_job *j,
			    const char *const *extra)
{
	for (unsigned n = 0; n < 2; n++)
		spawn_node(&d[n], j, n, extra);
	for (unsigned n = 0; n < 2; n++)
		harness_daemon_wait_ready(&d[n], 30000);
}

/* Two daemons with one trainer each, node n's on the emulated GPU n: node
 * 0 makes the NCCL unique id, the rendezvous hands it to node 1, each
 * makes its communicator at the first bucket on its trainer's GPU, and the
 * NCCL root sums across the two processes. Each node's status counts what it sent:
 * for fp16 on a world of two, a ring sends 2 (W - 1) / W = 1 buffer. */
static void two_nodes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	struct gs_test_daemon d[2];
	start_two_nodes(d, &job, NULL);
	pid_t pids[2];
	char logs[2][200];
	const char *dev[2][3] = { { "--device", "0", NULL }, { "--device", "1", NULL } };
	for (unsigned n = 0; n < 2; n++)
		pids[n] = trainer(&job, n, d[n].socket, d[n].dir, 0, n, "1", dev[n], logs[n]);
	expect_pass(pids, logs, 2);
	harness_expect_same_lines((const char *const[]){ logs[0], logs[1] }, 2, "NORM ");
	assert_true(harness_log_contains(&d[1], "local rank 0 on GPU 0000:19:00.0 (device 1 here"));
	for (unsigned n = 0; n < 2; n++) {
		gs_client *ctl;
		struct gs_status *st;
		assert_int_equal(gs_control_connect(d[n].socket, 5000, &ctl), GS_OK);
		assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
		assert_int_equal(st->internode_bytes, harness_layout_elements("resnet50.txt") * 2);
		gs_status_free(st);
		gs_close(ctl);
	}
	for (unsigned n = 0; n < 2; n++)
		assert_int_equal(harness_daemon_stop(&d[n]), 0);
}

/* Gradients no trainer of either node produced, or node 0's or node 1's
 * trainer only: which ones rides on the nodes' group vote, in buckets
 * staged through a fusion buffer of several launches. */
static void two_nodes_absent(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	job.fusion_buffer = "262144";
	struct gs_test_daemon d[2];
	start_two_nodes(d, &job, NULL);
	pid_t pids[2];
	char logs[2][200];
	const char *args[2][4] = { { "--device", "0", "--absent=4", NULL },
				   { "--device", "1", "--absent=4", NULL } };
	for (unsigned n = 0; n < 2; n++)
		pids[n] = trainer(&job, n, d[n].socket, d[n].dir, 0, n, "2", args[n], logs[n]);
	expect_pass(pids, logs, 2);
	for (unsigned n = 0; n < 2; n++)
		assert_int_equal(harness_daemon_stop(&d[n]), 0);
}

/* The trainer exits 0 having seen step `step` aborted as it expected. */
static void expect_aborted(pid_t pid, const char *log, const struct gs_test_daemon *d,
			   unsigned step)
{
	char want[64];
	snprintf(want, sizeof(want), "ABORTED step %u as expected", step);
	int status = harness_wait(pid, 60000);
	if (status != 0 || !harness_file_contains(log, want) || !harness_file_contains(log, "PASS")) {
		harness_dump(log);
		harness_dump(d->log);
		fail_msg("the trainer did not see step %u aborted and the rest right (exit status %d)",
			 step, status);
	}
}

/* Node 1's daemon is killed while node 0's waits in the first all-reduce
 * with it (node 1's trainer is 5 s late with its gradients): the emulated
 * NCCL fails the collective on node 0 at once (its root sees rank 1's
 * connection close), well within --peer-timeout. Node 0's step is aborted
 * with every tensor either reduced or the trainer's own, and its daemon
 * stays up. */
static void node_lost_mid_allreduce(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	struct gs_test_daemon d[2];
	const char *extra[] = { "--peer-timeout=20", NULL };
	/* The daemons log each all-reduce of the emulated NCCL and its failures. */
	setenv("NCCL_DEBUG", "INFO", 1);
	start_two_nodes(d, &job, extra);
	unsetenv("NCCL_DEBUG");
	pid_t pids[2];
	char logs[2][200];
	const char *abort1[] = { "--expect-abort-at=1", NULL }, *stall1[] = { "--stall-at=1", NULL };
	pids[0] = trainer(&job, 0, d[0].socket, d[0].dir, 0, 0, "1", abort1, logs[0]);
	pids[1] = trainer(&job, 1, d[1].socket, d[1].dir, 0, 1, "1", stall1, logs[1]);
	harness_wait_for_text(d[0].log, "rank 0 of 2: all-reduce 1,", 30);
	double t0 = harness_now_s();
	kill(d[1].pid, SIGKILL);
	expect_aborted(pids[0], logs[0], &d[0], 1);
	double took = harness_now_s() - t0;
	kill(pids[1], SIGKILL);
	harness_wait(pids[1], 10000);
	print_message("step 1 aborted %.1f s after node 1 was killed\n", took);
	assert_true(took < 15);
	/* The all-reduce itself failed, not only the step. */
	harness_wait_for_text(d[0].log, "rank 1 closed its connection", 5);
	assert_true(harness_daemon_alive(&d[0]));
	harness_daemon_stop(&d[1]);
	assert_int_equal(harness_daemon_stop(&d[0]), 0);
}

/* Node 1's daemon is killed between two launches of a bucket larger than
 * the fusion buffer: node 1's kernels take 200 ms each, and node 0 is seen
 * in the bucket's second all-reduce, so the first is through. Node 0's
 * trainer gets the step aborted with every tensor either reduced or its
 * own gradient: the bucket's launches were all-reduced in the staging
 * buffer and none was unpacked. Without the staging, fc.weight, cut across
 * the bucket's launches, would hold the result in its first launch's part
 * only. */
static void node_lost_between_launches(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	job.fusion_buffer = "262144";
	struct gs_test_daemon d[2];
	const char *extra[] = { "--peer-timeout=20", NULL };
	setenv("NCCL_DEBUG", "INFO", 1);
	spawn_node(&d[0], &job, 0, extra);
	setenv("GS_CUDA_EMU_KERNEL_DELAY_MS", "200", 1);
	spawn_node(&d[1], &job, 1, extra);
	unsetenv("GS_CUDA_EMU_KERNEL_DELAY_MS");
	unsetenv("NCCL_DEBUG");
	for (unsigned n = 0; n < 2; n++)
		harness_daemon_wait_ready(&d[n], 30000);
	pid_t pids[2];
	char logs[2][200];
	const char *abort1[] = { "--expect-abort-at=1", NULL };
	pids[0] = trainer(&job, 0, d[0].socket, d[0].dir, 0, 0, "1", abort1, logs[0]);
	pids[1] = trainer(&job, 1, d[1].socket, d[1].dir, 0, 1, "1", NULL, logs[1]);
	harness_wait_for_text(d[0].log, "rank 0 of 2: all-reduce 2,", 60);
	kill(d[1].pid, SIGKILL);
	kill(pids[1], SIGKILL);
	expect_aborted(pids[0], logs[0], &d[0], 1);
	assert_true(harness_log_contains(&d[0], "stages buckets larger than the fusion buffer"));
	harness_wait(pids[1], 10000);
	harness_daemon_stop(&d[1]);
	assert_int_equal(harness_daemon_stop(&d[0]), 0);
}

/* Node `lost`'s daemon and trainer are killed in step 2, while the other
 * node's trainer waits for them (the lost one's gradients are 5 s late);
 * the other's step 2 is aborted, a new daemon of that rank is started and
 * its new trainer runs step 3, which must be right on both nodes: the NCCL
 * communicators were made again, with the new group's unique id (made by
 * a new node 0 when node 0 was the one lost). */
static void node_killed_and_back(unsigned lost)
{
	if (!harness_have_gloo())
		skip();
	unsigned other = 1 - lost;
	struct harness_job job = TWO_NODES;
	struct gs_test_daemon d[2], back;
	const char *extra[] = { "--peer-timeout=20", NULL };
	start_two_nodes(d, &job, extra);
	pid_t pids[2], again;
	char logs[2][200], log_again[200];
	const char *abort2[] = { "--expect-abort-at=2", NULL }, *stall2[] = { "--stall-at=2", NULL };
	pids[other] = trainer(&job, other, d[other].socket, d[other].dir, 0, other, "3", abort2,
			      logs[other]);
	pids[lost] = trainer(&job, lost, d[lost].socket, d[lost].dir, 0, lost, "3", stall2,
			     logs[lost]);
	/* Both in step 2, the lost one's gradients on their way. */
	harness_wait_in_step(&d[other], 2);
	harness_wait_in_step(&d[lost], 2);
	kill(d[lost].pid, SIGKILL);
	kill(pids[lost], SIGKILL);
	harness_wait(pids[lost], 10000);
	harness_daemon_stop(&d[lost]);
	harness_wait_for_text(logs[other], "ABORTED step 2 as expected", 30);

	spawn_node(&back, &job, lost, extra);
	harness_daemon_wait_ready(&back, 30000);
	const char *step3[] = { "--first-step=3", NULL };
	again = trainer(&job, lost, back.socket, back.dir, 0, lost, "1", step3, log_again);
	expect_aborted(pids[other], logs[other], &d[other], 2);
	expect_pass(&again, &log_again, 1);
	assert_int_equal(harness_daemon_stop(&back), 0);
	assert_int_equal(harness_daemon_stop(&d[other]), 0);
}

static void peer_killed_and_back(void **state)
{
	(void)state;
	node_killed_and_back(1);
}

static void coordinator_killed_and_back(void **state)
{
	(void)state;
	node_killed_and_back(0);
}

/* Two nodes: node 1's trainer's GPU work is 5 s late in step 2, past
 * --peer-timeout (3 s). Node 1's daemon gives up waiting for it and node
 * 0's all-reduce fails with it, both abort their communicators, no node
 * went away, so they ask for a new group: step 2 is aborted on both with
 * every tensor reduced or the trainer's own, and step 3 is right on both,
 * through communicators made again. */
static void trainer_late_on_one_node(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	struct gs_test_daemon d[2];
	const char *extra[] = { "--peer-timeout=3", NULL };
	start_two_nodes(d, &job, extra);
	pid_t pids[2];
	char logs[2][200];
	const char *abort2[] = { "--expect-abort-at=2", NULL };
	const char *late2[] = { "--expect-abort-at=2", "--stall-at=2", NULL };
	pids[0] = trainer(&job, 0, d[0].socket, d[0].dir, 0, 0, "3", abort2, logs[0]);
	pids[1] = trainer(&job, 1, d[1].socket, d[1].dir, 0, 1, "3", late2, logs[1]);
	for (unsigned n = 0; n < 2; n++)
		expect_aborted(pids[n], logs[n], &d[n], 2);
	assert_true(harness_log_contains(&d[0], "rebuilding the group (generation 1)"));
	/* Both nodes saw the failure; one new group answers both. */
	assert_false(harness_log_contains(&d[0], "(generation 2)"));
	for (unsigned n = 0; n < 2; n++)
		assert_int_equal(harness_daemon_stop(&d[n]), 0);
}

/* One node: local rank 0's gradients are 5 s late, past --peer-timeout
 * (3 s), so step 1 is aborted on both trainers with the reason and the
 * communicators aborted; step 2 must be right, on communicators made
 * again at its first bucket, without restarting gradsyncd. */
static void not_ready_then_communicators_again(void **state)
{
	(void)state;
	const char *args[] = { "--backend=cuda", "--peer-timeout=3", NULL };
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, args);
	pid_t pids[2];
	char logs[2][200];
	const char *late[] = { "--expect-abort-at=1", "--stall-at=1", NULL };
	const char *abort1[] = { "--expect-abort-at=1", NULL };
	pids[0] = trainer(&pair, 0, d.socket, d.dir, 0, 0, "2", late, logs[0]);
	pids[1] = trainer(&pair, 0, d.socket, d.dir, 1, 1, "2", abort1, logs[1]);
	for (unsigned r = 0; r < 2; r++)
		expect_aborted(pids[r], logs[r], &d, 1);
	assert_true(harness_file_contains(logs[1], "local rank 0's gradients were not ready on its GPU within 3 s"));
	assert_true(harness_log_contains(&d, "rebuilding the NCCL communicators aborted after"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* One node: making the communicators at the first bucket fails (the
 * emulated NCCL fails the first communicator the daemon makes), so step 1
 * is aborted on both trainers with the reason; step 2 must be right, on
 * communicators made at its first bucket. */
static void communicators_fail_then_made(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	setenv("GS_CUDA_EMU_NCCL_FAIL_INITS", "1", 1);
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	unsetenv("GS_CUDA_EMU_NCCL_FAIL_INITS");
	pid_t pids[2];
	char logs[2][200];
	const char *abort1[] = { "--expect-abort-at=1", NULL };
	for (unsigned r = 0; r < 2; r++)
		pids[r] = trainer(&pair, 0, d.socket, d.dir, r, r, "2", abort1, logs[r]);
	for (unsigned r = 0; r < 2; r++)
		expect_aborted(pids[r], logs[r], &d, 1);
	assert_true(harness_file_contains(logs[0], "cannot make the NCCL communicators: creating the NCCL communicators on local rank 0"));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* ---- tests/gpu/run.sh's trainer, on the emulation ------------------------------ */

/* gpu-trainer, as run.sh runs it, in job j against one emulated GPU: its
 * own checks (every element against the host kernels) must pass. */
static void gpu_trainer_case(struct harness_job *j, const char *const *daemon_args,
			     const char *steps, const char *extra)
{
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, j, 0, daemon_args);
	char log[200];
	snprintf(log, sizeof(log), "%s/gpu-trainer.log", d.dir);
	const char *argv[] = { getenv("GS_GPU_TRAINER"), "--socket", d.socket, "--layout",
			       harness_layout("resnet50.txt"), "--rank", "0", "--steps", steps,
			       "--clip-step", "1", extra, NULL };
	pid_t pid = harness_job_spawn(j, 0, argv, log);
	int status = harness_wait(pid, 120000);
	if (status != 0 || !harness_file_contains(log, "PASS")) {
		harness_dump(log);
		harness_dump(d.log);
		fail_msg("gpu-trainer failed (exit status %d)", status);
	}
	assert_int_equal(harness_daemon_stop(&d), 0);
}

static void gpu_check_sync(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 1 }, .wire = "bf16" };
	gpu_trainer_case(&job, cuda_backend, "2", NULL);
}

/* Its recovery check: step 2 is 5 s late, past a 2 s --peer-timeout. */
static void gpu_check_recovery(void **state)
{
	(void)state;
	struct harness_job job = { .local_size = { 1 } };
	const char *args[] = { "--backend=cuda", "--peer-timeout=2", NULL };
	gpu_trainer_case(&job, args, "3", "--late-step=2");
}

/* ---- A trainer's state in GPU memory ------------------------------------------ */

/* Starts emu-state-trainer as local rank `rank` of pair (GS_STATE_TRAINER),
 * with up to three more arguments; its output goes to log (200 bytes). */
static pid_t state_trainer(const struct gs_test_daemon *d, unsigned rank, const char *a1,
			   const char *a2, char *log)
{
	char r[16];
	snprintf(r, sizeof(r), "%u", rank);
	snprintf(log, 200, "%s/state-trainer%u.log", d->dir, rank);
	const char *argv[] = { getenv("GS_STATE_TRAINER"), "--socket", d->socket, "--rank", r,
			       a1, a2, NULL };
	return harness_job_spawn(&pair, 0, argv, log);
}

/* Two trainers, each on its own GPU, register CUDA state of seven dtypes
 * (one tensor of 5 MiB) beside a gradient, in allocations the gradient
 * shares; the broadcast from global rank 1 gives rank 0 its bytes, device
 * to device across GPUs, and no other byte of either allocation changes
 * (each trainer checks against its own hash). Both go, and the daemon
 * maps nothing of theirs. */
static void state_broadcast_across_gpus(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = state_trainer(&d, r, "--source=1", NULL, logs[r]);
	expect_pass(pids, logs, 2);
	for (unsigned r = 0; r < 2; r++)
		expect_unmapped(&d, pids[r]);
	assert_true(harness_daemon_alive(&d));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Whether gradsyncd's status shows trainer pid in state `what`. */
static bool trainer_in(const struct gs_test_daemon *d, pid_t pid, const char *what)
{
	gs_client *ctl;
	struct gs_status *st;
	bool there = false;
	if (gs_control_connect(d->socket, 5000, &ctl) != GS_OK)
		return false;
	if (gs_status_get(ctl, 5000, &st) == GS_OK) {
		for (size_t i = 0; i < st->trainer_count; i++)
			there |= st->trainers[i].pid == (uint32_t)pid &&
				 strcmp(st->trainers[i].state, what) == 0;
		gs_status_free(st);
	}
	gs_close(ctl);
	return there;
}

/* The source is killed holding its state (two allocations, each open
 * once in the daemon though the gradient shares one) while the other
 * trainer waits in its broadcast, as status shows: that broadcast fails
 * at once, naming the trainer gone, and leaves its state as it was;
 * neither's memory stays mapped. */
static void state_source_killed(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	char logs[2][200];
	pid_t src = state_trainer(&d, 1, "--hold", NULL, logs[1]);
	harness_wait_for_text(logs[1], "REGISTERED", 30);
	assert_int_equal(mappings(d.pid, "mem", src), 2);
	pid_t other = state_trainer(&d, 0, "--source=1", "--expect-fail", logs[0]);
	for (int i = 0; i < 3000 && !trainer_in(&d, other, "broadcasting state"); i++)
		usleep(10000);
	assert_true(trainer_in(&d, other, "broadcasting state"));
	kill(src, SIGKILL);
	harness_wait(src, 10000);
	expect_pass(&other, &logs[0], 1);
	assert_true(harness_file_contains(logs[0], "went away before the state broadcast began"));
	expect_unmapped(&d, src);
	expect_unmapped(&d, other);
	assert_true(harness_daemon_alive(&d));
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* One trainer on each of two nodes, each on its own emulated GPU: the
 * broadcast from global rank 1 (node 1) goes between the daemons over
 * their Gloo group, staged through host memory, and node 0's trainer
 * holds node 1's bytes, every one checked; node 1 counts what it sent. */
static void state_two_nodes(void **state)
{
	(void)state;
	if (!harness_have_gloo())
		skip();
	struct harness_job job = TWO_NODES;
	struct gs_test_daemon d[2];
	start_two_nodes(d, &job, NULL);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned n = 0; n < 2; n++) {
		const char *argv[] = { getenv("GS_STATE_TRAINER"), "--socket", d[n].socket,
				       "--rank=0", n ? "--global-rank=1" : "--global-rank=0",
				       n ? "--device=1" : "--device=0", "--source=1", NULL };
		snprintf(logs[n], 200, "%s/state-trainer-node%u.log", d[n].dir, n);
		pids[n] = harness_job_spawn(&job, n, argv, logs[n]);
	}
	expect_pass(pids, logs, 2);
	gs_client *ctl;
	struct gs_status *st;
	assert_int_equal(gs_control_connect(d[1].socket, 5000, &ctl), GS_OK);
	assert_int_equal(gs_status_get(ctl, 5000, &st), GS_OK);
	/* At least the tensors' bytes (the header and layout go too). */
	assert_true(st->internode_bytes >= (5u << 20) + 4);
	gs_status_free(st);
	gs_close(ctl);
	for (unsigned n = 0; n < 2; n++)
		expect_unmapped(&d[n], pids[n]);
	for (unsigned n = 0; n < 2; n++)
		assert_int_equal(harness_daemon_stop(&d[n]), 0);
}

/* A RegisterState carrying CUDA events is refused (they would replace
 * the gradients' pair), before anything of it is opened. */
static void state_refuses_events(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	struct raw_trainer t;
	raw_trainer_make(&t);
	Gradsync__Buffer events = GRADSYNC__BUFFER__INIT, *bufs[] = { &events };
	events.device = 1;
	events.pci_bus_id = t.pci;
	events.cuda_ready_event = (ProtobufCBinaryData){ sizeof(t.rh), (uint8_t *)&t.rh };
	events.cuda_done_event = (ProtobufCBinaryData){ sizeof(t.dh), (uint8_t *)&t.dh };
	Gradsync__StateTensor st = GRADSYNC__STATE_TENSOR__INIT, *sp = &st;
	st.name = "fc.weight";
	st.bytes = 64;
	st.dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
	Gradsync__RegisterState r = GRADSYNC__REGISTER_STATE__INIT;
	r.n_buffers = 1;
	r.buffers = bufs;
	r.n_tensors = 1;
	r.tensors = &sp;
	r.last = true;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_STATE;
	m.register_state = &r;
	int sock = raw_connect(d.socket);
	raw_hello_job(sock, 1, &pair);
	raw_send(sock, &m, NULL, 0);
	raw_expect_error(sock, GS_EINVAL, "RegisterState buffer 0 carries CUDA events");
	close(sock);
	assert_int_equal(mappings(d.pid, "event", getpid()), 0);
	raw_trainer_free(&t);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* gradsyncd killed after a broadcast and started again on the same
 * socket: each trainer reconnects (gs_reconnect), which registers its
 * CUDA state again (the same allocations' handles), and a second
 * broadcast, from global rank 0, gives each the bytes it must. */
static void state_after_daemon_restart(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	pid_t pids[2];
	char logs[2][200];
	for (unsigned r = 0; r < 2; r++)
		pids[r] = state_trainer(&d, r, "--source=1", "--reconnect", logs[r]);
	for (unsigned r = 0; r < 2; r++)
		harness_wait_for_text(logs[r], "BROADCAST DONE", 30);
	kill(d.pid, SIGKILL);
	harness_wait(d.pid, 5000);
	struct gs_test_daemon d2;
	harness_job_daemon_restart(&d2, &d, &pair, 0, cuda_backend);
	expect_pass(pids, logs, 2);
	for (unsigned r = 0; r < 2; r++)
		assert_true(harness_file_contains(logs[r], "after reconnecting"));
	for (unsigned r = 0; r < 2; r++)
		expect_unmapped(&d2, pids[r]);
	assert_int_equal(harness_daemon_stop(&d2), 0);
}

/* A trainer whose state layout differs (int32 for int64, the same bytes)
 * is refused with GS_ELAYOUT, and the daemon keeps none of its memory. */
static void state_layout_mismatch(void **state)
{
	(void)state;
	struct gs_test_daemon d;
	harness_job_daemon_start(&d, &pair, 0, cuda_backend);
	char logs[2][200];
	pid_t first = state_trainer(&d, 0, "--hold", NULL, logs[0]);
	harness_wait_for_text(logs[0], "REGISTERED", 30);
	pid_t odd = state_trainer(&d, 1, "--mismatch", NULL, logs[1]);
	expect_pass(&odd, &logs[1], 1);
	assert_true(harness_file_contains(logs[1], "differs"));
	expect_unmapped(&d, odd);
	kill(first, SIGKILL);
	harness_wait(first, 10000);
	expect_unmapped(&d, first);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* Each case's time, in the log: the suite is meant to stay short in CI. */
static double started;

static int clock_start(void **state)
{
	(void)state;
	started = harness_now_s();
	return 0;
}

/* And the emulated node's GPUs back to the default for the next case,
 * whatever this one set. */
static int clock_print(void **state)
{
	(void)state;
	print_message("took %.1f s\n", harness_now_s() - started);
	unsetenv("GS_CUDA_EMU_DEVICES");
	unsetenv("GS_CUDA_EMU_VISIBLE_DEVICES");
	return 0;
}

#define TIMED(f) cmocka_unit_test_setup_teardown(f, clock_start, clock_print)

int main(void)
{
	const struct CMUnitTest tests[] = {
		TIMED(sync_fp16_worker_sleeps),
		TIMED(sync_bf16_several_launches),
		TIMED(sync_finite_norm_several_launches),
		TIMED(overlaps_the_backward_pass),
		TIMED(sync_absent_several_launches),
		TIMED(trainer_killed_after_registering),
		TIMED(trainer_gone_mid_registration),
		TIMED(bad_handles),
		TIMED(state_broadcast_across_gpus),
		TIMED(state_source_killed),
		TIMED(state_layout_mismatch),
		TIMED(state_after_daemon_restart),
		TIMED(state_two_nodes),
		TIMED(state_refuses_events),
		TIMED(gpus_by_bus_id),
		TIMED(two_jobs_own_gpus),
		TIMED(gpus_allow_list),
		TIMED(gpu_refusals),
		TIMED(fusion_buffers_by_layout_within_budget),
		TIMED(not_ready_then_communicators_again),
		TIMED(communicators_fail_then_made),
		TIMED(two_nodes),
		TIMED(two_nodes_absent),
		TIMED(node_lost_mid_allreduce),
		TIMED(node_lost_between_launches),
		TIMED(peer_killed_and_back),
		TIMED(coordinator_killed_and_back),
		TIMED(trainer_late_on_one_node),
		TIMED(gpu_check_sync),
		TIMED(gpu_check_recovery),
	};
	/* GS_TEST_FILTER=gpu* runs only the cases it matches. */
	if (getenv("GS_TEST_FILTER"))
		cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
