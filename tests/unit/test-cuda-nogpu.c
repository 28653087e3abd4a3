/*
 * The CUDA backend where no GPU is usable, with the real gradsyncd: asked
 * for the cuda backend it refuses to start, saying why (the driver is
 * missing, no device is visible, or this build has no CUDA backend) with a
 * non-zero exit status; on auto it runs the host backend and says so. The
 * host backend refuses a trainer's CUDA buffer with a clear error, and the
 * client library says what is missing rather than crashing. On a machine
 * with a usable GPU the first two are skipped (tests/gpu/run.sh covers it).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda_driver.h"
#include "gradsync.h"
#include "harness.h"

static void cuda_backend_refused_without_gpu(void **state)
{
	struct gs_test_daemon d;
	const char *args[] = { "--backend=cuda", NULL };
	harness_daemon_spawn(&d, args);
	double deadline = harness_now_s() + 60;
	int status = 0;
	for (;;) {
		pid_t r = waitpid(d.pid, &status, WNOHANG);
		if (r == d.pid)
			break;
		if (harness_listening(d.socket)) {
			/* A usable GPU: nothing to refuse here. */
			harness_daemon_stop(&d);
			skip();
		}
		if (harness_now_s() > deadline) {
			harness_dump(d.log);
			fail_msg("gradsyncd --backend cuda neither started nor exited in 60 s");
		}
		usleep(10000);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) == 0) {
		harness_dump(d.log);
		fail_msg("gradsyncd --backend cuda without a GPU exited with status %d, not an error",
			 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	}
	/* Why, in words: the driver, the devices, or the build. */
	bool why = harness_log_contains(&d, "the NVIDIA driver") ||
		   harness_log_contains(&d, "no CUDA device is visible") ||
		   harness_log_contains(&d, "needs one GPU per trainer") ||
		   harness_log_contains(&d, "built without the CUDA backend");
	if (!harness_log_contains(&d, "--backend cuda: ") || !why) {
		harness_dump(d.log);
		fail_msg("gradsyncd's log does not say why the cuda backend cannot run");
	}
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", d.dir);
	assert_int_equal(system(cmd), 0);
}

static void auto_picks_host_and_says_so(void **state)
{
	struct gs_test_daemon d;
	const char *args[] = { "--backend=auto", NULL };
	harness_daemon_start(&d, args);
	if (harness_log_contains(&d, "backend auto: using cuda")) {
		harness_daemon_stop(&d);
		skip();
	}
	bool says = harness_log_contains(&d, "backend auto: using host");
	bool why = harness_log_contains(&d, "cannot run here: ") ||
		   harness_log_contains(&d, "this build has no CUDA backend");
	if (!says || !why)
		harness_dump(d.log);
	assert_true(says);
	assert_true(why);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* A trainer that sends CUDA handles to a host-backend daemon is told so. */
static void host_backend_refuses_cuda_buffers(void **state)
{
	struct gs_test_daemon d;
	const char *args[] = { "--backend=host", NULL };
	harness_daemon_start(&d, args);
	int fd = raw_connect(d.socket);
	raw_hello(fd, 0);
	uint8_t handle[64] = { 1, 2, 3 };
	Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
	buf.size = 1u << 20;
	buf.cuda_ipc_handle = (ProtobufCBinaryData){ sizeof(handle), handle };
	buf.pci_bus_id = "0000:3b:00.0";
	Gradsync__Buffer *bufs[] = { &buf };
	Gradsync__TensorSpec t = GRADSYNC__TENSOR_SPEC__INIT;
	t.name = "w";
	t.count = 16;
	t.dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
	Gradsync__TensorSpec *ts[] = { &t };
	Gradsync__RegisterTensors reg = GRADSYNC__REGISTER_TENSORS__INIT;
	reg.n_buffers = 1;
	reg.buffers = bufs;
	reg.n_tensors = 1;
	reg.tensors = ts;
	reg.last = true;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &reg;
	raw_send(fd, &m, NULL, 0); /* no descriptor: a CUDA buffer has none */
	raw_expect_error(fd, GS_EBUFFER,
			 "it is CUDA device memory, but this gradsyncd runs the host backend");
	close(fd);

	/* Through the library: refused before anything is sent. */
	struct gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
	o.socket_path = d.socket;
	o.local_rank = 0;
	o.job_id = "";
	gs_client *c;
	assert_int_equal(gs_connect(&o, &c), GS_OK);
	static float host[4];
	struct gs_cuda_tensor_spec spec = { "w", 4, GS_FLOAT32, host };
	assert_int_equal(gs_register_cuda(c, &spec, 1), GS_ESTATE);
	assert_non_null(strstr(gs_last_error(c), "runs the host backend"));
	gs_close(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

/* libgradsync loads the driver only for CUDA tensors, and says what is
 * missing when it is. */
static void client_says_when_the_driver_is_missing(void **state)
{
	char why[256] = "";
	const struct gs__cu *cu = gs__cu_load(why, sizeof(why));
	if (cu)
		skip(); /* a driver is installed */
	assert_non_null(strstr(why, "libcuda.so.1"));
	/* Asked again, the same answer, without trying again. */
	char again[256] = "";
	assert_null(gs__cu_load(again, sizeof(again)));
	assert_string_equal(why, again);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(cuda_backend_refused_without_gpu),
		cmocka_unit_test(auto_picks_host_and_says_so),
		cmocka_unit_test(host_backend_refuses_cuda_buffers),
		cmocka_unit_test(client_says_when_the_driver_is_missing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
