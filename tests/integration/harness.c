#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "clock.h"
#include "frame.h"
#include "gradsync.h"

static const char *env_or_fail(const char *name)
{
	const char *v = getenv(name);
	if (!v)
		fail_msg("%s is not set; run the test through meson test", name);
	return v;
}

static long now_ms(void)
{
	return (long)(gs_now_ns() / 1000000);
}

/* Every process a test started, so that none outlives a failed test. */
static pid_t spawned[256];
static size_t nspawned;

static void kill_leftovers(void)
{
	for (size_t i = 0; i < nspawned; i++) {
		if (waitpid(spawned[i], NULL, WNOHANG) == 0) {
			kill(spawned[i], SIGKILL);
			waitpid(spawned[i], NULL, 0);
		}
	}
}

pid_t harness_spawn(const char *const *argv, const char *log)
{
	return harness_spawn_env(argv, NULL, log);
}

pid_t harness_spawn_env(const char *const *argv, const char *const *env, const char *log)
{
	if (nspawned == 0)
		atexit(kill_leftovers);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid > 0 && nspawned < sizeof(spawned) / sizeof(spawned[0]))
		spawned[nspawned++] = pid;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		for (size_t i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

int harness_wait(pid_t pid, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	int status;
	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			break;
		if (now_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			fail_msg("process %d still running after %d ms", (int)pid, timeout_ms);
		}
		usleep(5000);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool harness_listening(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	bool ok = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
	close(fd);
	return ok;
}

const char *const harness_launch_vars[] = {
	"GRADSYNC_JOB_ID", "GRADSYNC_LOCAL_RANK", "GRADSYNC_LOCAL_SIZE",
	"GRADSYNC_NODES", "GRADSYNC_NODE_RANK", "GRADSYNC_COORDINATOR",
	"GRADSYNC_THRESHOLD", "GRADSYNC_WIRE", "GRADSYNC_OP", "GRADSYNC_PREDIVIDE",
	"GRADSYNC_FUSION_BUFFER",
	"TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
	"GROUP_RANK", "MASTER_ADDR", "SLURM_JOB_ID", "SLURM_STEP_ID",
	"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_NODEID",
	NULL,
};

void harness_clear_launch_env(void)
{
	for (size_t i = 0; harness_launch_vars[i]; i++)
		unsetenv(harness_launch_vars[i]);
}

void harness_daemon_spawn(struct gs_test_daemon *d, const char *const *args)
{
	/* A test run from a shell (or a job) with a launcher's variables
	 * exported must not hand them to its daemons and trainers. */
	harness_clear_launch_env();
	snprintf(d->dir, sizeof(d->dir), "/tmp/gradsync-test-XXXXXX");
	assert_non_null(mkdtemp(d->dir));
	snprintf(d->socket, sizeof(d->socket), "%s/gradsyncd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/gradsyncd.log", d->dir);

	const char *argv[32];
	size_t n = 0;
	static char socket_arg[200];
	snprintf(socket_arg, sizeof(socket_arg), "--socket=%s", d->socket);
	argv[n++] = env_or_fail("GS_DAEMON");
	argv[n++] = socket_arg;
	argv[n++] = "--log-level=debug";
	/* These tests hand over shared memory; on a GPU machine "auto" would
	 * pick cuda. A test's own --backend comes later and wins. */
	argv[n++] = "--backend=host";
	bool node_port = false;
	for (size_t i = 0; args && args[i] && n < 29; i++) {
		node_port = node_port || strncmp(args[i], "--node-port=", 12) == 0;
		argv[n++] = args[i];
	}
	/* No node port unless the test gives one: tests run side by side,
	 * and the default port would be taken by the first. Such a daemon
	 * serves jobs of one node. */
	if (!node_port)
		argv[n++] = "--node-port=0";
	argv[n] = NULL;
	d->pid = harness_spawn(argv, d->log);
}

/* Until the peer has closed its end of fd (end of stream, or reset) or
 * the deadline (on now_ms()'s clock) passes; closes fd either way.
 * Returns whether the peer closed. */
static bool closed_by_peer(int fd, long deadline)
{
	char buf[256];
	shutdown(fd, SHUT_WR);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long left = deadline - now_ms();
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			break;
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			close(fd);
			return true;
		}
	}
	close(fd);
	return false;
}

/* Whether gradsyncd accepts connections on path and, when it does, has
 * closed the probe's connection again by the deadline: a test that
 * counts the daemon's connections or descriptors next finds none of it. */
static bool listening_settled(const char *path, long deadline)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		close(fd);
		return false;
	}
	return closed_by_peer(fd, deadline);
}

void harness_daemon_wait_ready(struct gs_test_daemon *d, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	while (!listening_settled(d->socket, deadline)) {
		if (!harness_daemon_alive(d) || now_ms() > deadline) {
			harness_dump(d->log);
			fail_msg("gradsyncd did not start listening on %s", d->socket);
		}
		usleep(10000);
	}
}

void harness_daemon_start(struct gs_test_daemon *d, const char *const *args)
{
	harness_daemon_spawn(d, args);
	harness_daemon_wait_ready(d, 10000);
}

bool harness_have_gloo(void)
{
	/* Unset outside meson test: run, and let the missing paths say why. */
	const char *v = getenv("GS_HAVE_GLOO");
	return !v || strcmp(v, "0") != 0;
}

/* Whether nothing is bound to port on any address (a bind to the
 * wildcard address fails if anything is). */
static bool port_free(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Below the kernel's ephemeral range (ip_local_port_range), so that no
 * connection's own end takes the port between this pick and the daemon's
 * bind: the daemons of a job all bind the node port, on several addresses. */
int harness_free_port(void)
{
	int low = 32768, high = 60999;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%d %d", &low, &high) != 2)
			low = 32768;
		fclose(f);
	}
	int from = low > 12000 ? 10000 : 1024, span = (low > 12000 ? low : 10000) - from;
	static unsigned seed;
	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	for (int tries = 0; tries < 1000; tries++) {
		int port = from + (int)(rand_r(&seed) % (unsigned)span);
		if (port_free(port))
			return port;
	}
	fail_msg("no free TCP port below %d", low);
	return -1;
}

bool harness_daemon_alive(const struct gs_test_daemon *d)
{
	return waitpid(d->pid, NULL, WNOHANG) == 0;
}

int harness_daemon_stop(struct gs_test_daemon *d)
{
	kill(d->pid, SIGTERM);
	int status = harness_wait(d->pid, 10000);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
	if (status == 0 && system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
	return status;
}

bool harness_log_contains(const struct gs_test_daemon *d, const char *text)
{
	return harness_file_contains(d->log, text);
}

bool harness_file_contains(const char *path, const char *text)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	char line[4096];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, text) != NULL;
	fclose(f);
	return found;
}

double harness_now_s(void)
{
	return (double)gs_now_ns() / 1e9;
}

double harness_wait_for_text(const char *path, const char *text, double limit_s)
{
	double t0 = harness_now_s();
	while (!harness_file_contains(path, text)) {
		if (harness_now_s() - t0 > limit_s) {
			harness_dump(path);
			fail_msg("'%s' did not appear in %s within %.0f s", text, path, limit_s);
		}
		usleep(10000);
	}
	return harness_now_s() - t0;
}

const char *harness_layout(const char *name)
{
	static char path[512];
	snprintf(path, sizeof(path), "%s/%s", env_or_fail("GS_LAYOUTS"), name);
	return path;
}

void harness_dump(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	char line[4096];
	fprintf(stderr, "---- %s\n", path);
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fprintf(stderr, "----\n");
	fclose(f);
}

/* The lines of path that begin with prefix, one after another, in buf. */
static void lines_with(const char *path, const char *prefix, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	size_t len = 0;
	assert_non_null(f);
	buf[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		size_t l = strlen(line);
		if (strncmp(line, prefix, strlen(prefix)) != 0)
			continue;
		assert_true(len + l < size);
		memcpy(buf + len, line, l + 1);
		len += l;
	}
	fclose(f);
}

void harness_expect_same_lines(const char *const *logs, size_t n, const char *prefix)
{
	static char first[65536], other[65536];
	lines_with(logs[0], prefix, first, sizeof(first));
	if (!first[0]) {
		harness_dump(logs[0]);
		fail_msg("no '%s' line in %s", prefix, logs[0]);
	}
	for (size_t i = 1; i < n; i++) {
		lines_with(logs[i], prefix, other, sizeof(other));
		if (strcmp(first, other) != 0)
			fail_msg("'%s' lines differ:\n---- %s\n%s---- %s\n%s", prefix, logs[0], first,
				 logs[i], other);
	}
}

/* ---- The job ------------------------------------------------------------ */

void harness_strs_printf(struct harness_strs *s, const char *fmt, ...)
{
	assert_true(s->n < HARNESS_STRS_MAX);
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(s->buf[s->n], sizeof(s->buf[s->n]), fmt, ap);
	va_end(ap);
	assert_true(len >= 0 && (size_t)len < sizeof(s->buf[s->n]));
	s->v[s->n] = s->buf[s->n];
	s->n++;
	s->v[s->n] = NULL;
}

void harness_strs_append(struct harness_strs *s, const char *const *list)
{
	for (size_t i = 0; list && list[i]; i++)
		harness_strs_printf(s, "%s", list[i]);
	s->v[s->n] = NULL;
}

const char *harness_node_host(unsigned node)
{
	static char host[HARNESS_MAX_NODES][16];
	assert_true(node < HARNESS_MAX_NODES);
	snprintf(host[node], sizeof(host[node]), "127.0.0.%u", node + 1);
	return host[node];
}

static const char *job_coordinator(const struct harness_job *j)
{
	if (j->coordinator)
		return j->coordinator;
	return j->nodes > 1 ? harness_node_host(0) : NULL;
}

void harness_job_env(const struct harness_job *j, unsigned node, struct harness_strs *env)
{
	assert_true(node < HARNESS_MAX_NODES);
	if (j->id)
		harness_strs_printf(env, "GRADSYNC_JOB_ID=%s", j->id);
	if (j->local_size[node])
		harness_strs_printf(env, "GRADSYNC_LOCAL_SIZE=%u", j->local_size[node]);
	if (j->nodes) {
		harness_strs_printf(env, "GRADSYNC_NODES=%u", j->nodes);
		harness_strs_printf(env, "GRADSYNC_NODE_RANK=%u", node);
	}
	if (job_coordinator(j))
		harness_strs_printf(env, "GRADSYNC_COORDINATOR=%s", job_coordinator(j));
	if (j->threshold)
		harness_strs_printf(env, "GRADSYNC_THRESHOLD=%s", j->threshold);
	if (j->wire)
		harness_strs_printf(env, "GRADSYNC_WIRE=%s", j->wire);
	if (j->op)
		harness_strs_printf(env, "GRADSYNC_OP=%s", j->op);
	if (j->predivide)
		harness_strs_printf(env, "GRADSYNC_PREDIVIDE=%s", j->predivide);
	if (j->fusion_buffer)
		harness_strs_printf(env, "GRADSYNC_FUSION_BUFFER=%s", j->fusion_buffer);
	env->v[env->n] = NULL;
}

void harness_node_flags(const struct harness_job *j, unsigned node, struct harness_strs *flags)
{
	harness_strs_printf(flags, "--node-address=%s", harness_node_host(node));
	harness_strs_printf(flags, "--node-port=%d", j->port);
}

void harness_job_daemon_flags(struct harness_job *j, unsigned node, const char *const *extra,
			      struct harness_strs *flags)
{
	if (j->nodes > 1) {
		if (j->port == 0)
			j->port = harness_free_port();
		harness_node_flags(j, node, flags);
	}
	harness_strs_append(flags, extra);
}

void harness_job_daemon_spawn(struct gs_test_daemon *d, struct harness_job *j, unsigned node,
			      const char *const *extra)
{
	struct harness_strs flags = { .n = 0 };
	harness_job_daemon_flags(j, node, extra, &flags);
	harness_daemon_spawn(d, flags.v);
}

void harness_job_daemon_start(struct gs_test_daemon *d, struct harness_job *j, unsigned node,
			      const char *const *extra)
{
	harness_job_daemon_spawn(d, j, node, extra);
	harness_daemon_wait_ready(d, 10000);
}

void harness_job_daemon_restart(struct gs_test_daemon *d, const struct gs_test_daemon *old,
				struct harness_job *j, unsigned node, const char *const *extra)
{
	*d = *old;
	snprintf(d->log, sizeof(d->log), "%s/gradsyncd-2.log", old->dir);
	struct harness_strs argv = { .n = 0 };
	harness_strs_printf(&argv, "%s", getenv("GS_DAEMON"));
	harness_strs_printf(&argv, "--socket=%s", old->socket);
	harness_job_daemon_flags(j, node, extra, &argv);
	d->pid = harness_spawn(argv.v, d->log);
	harness_daemon_wait_ready(d, 10000);
}

pid_t harness_job_spawn(const struct harness_job *j, unsigned node, const char *const *argv,
			const char *log)
{
	struct harness_strs env = { .n = 0 };
	harness_job_env(j, node, &env);
	return harness_spawn_env(argv, env.v, log);
}

void harness_job_setenv(const struct harness_job *j, unsigned node)
{
	struct harness_strs env = { .n = 0 };
	harness_job_env(j, node, &env);
	for (size_t i = 0; i < env.n; i++) {
		char *eq = strchr(env.buf[i], '=');
		*eq = '\0';
		assert_int_equal(setenv(env.buf[i], eq + 1, 1), 0);
	}
}

/* ---- Raw protocol ------------------------------------------------------ */

int raw_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

void raw_close(int fd)
{
	if (!closed_by_peer(fd, now_ms() + 10000))
		fail_msg("gradsyncd did not close a connection within 10 s of the client's end");
}

void raw_send_bytes(int fd, const void *data, size_t len)
{
	const char *p = data;
	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return; /* the daemon may already have dropped us */
		p += n;
		len -= (size_t)n;
	}
}

void raw_send(int fd, const Gradsync__Message *m, const int *fds, size_t nfds)
{
	uint8_t *buf;
	size_t len;
	assert_int_equal(gs_frame_encode(m, &buf, &len), 0);
	size_t off = 0;
	if (nfds > 0) {
		ssize_t n = gs_frame_write_some(fd, buf, len, fds, nfds);
		assert_true(n > 0);
		off = (size_t)n;
	}
	raw_send_bytes(fd, buf + off, len - off);
	free(buf);
}

Gradsync__Message *raw_recv(int fd)
{
	uint8_t hdr[4];
	size_t got = 0;
	while (got < 4) {
		ssize_t n = recv(fd, hdr + got, 4 - got, 0);
		if (n <= 0)
			return NULL;
		got += (size_t)n;
	}
	uint32_t len = gs_frame_get_len(hdr);
	assert_true(len < (16u << 20));
	uint8_t *buf = malloc(len ? len : 1);
	got = 0;
	while (got < len) {
		ssize_t n = recv(fd, buf + got, len - got, 0);
		if (n <= 0) {
			free(buf);
			return NULL;
		}
		got += (size_t)n;
	}
	Gradsync__Message *m = gradsync__message__unpack(NULL, len, buf);
	free(buf);
	return m;
}

void raw_send_hello(int fd, uint64_t rank, uint64_t version, const char *job)
{
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.protocol_version = version;
	h.role = GRADSYNC__ROLE__ROLE_TRAINER;
	h.local_rank = rank;
	h.pid = (uint64_t)getpid();
	h.job_id = (char *)job;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &h;
	raw_send(fd, &m, NULL, 0);
}

void raw_send_hello_job(int fd, uint64_t rank, uint64_t version, const struct harness_job *j,
			unsigned node)
{
	assert_true(node < HARNESS_MAX_NODES);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.protocol_version = version;
	h.role = GRADSYNC__ROLE__ROLE_TRAINER;
	h.local_rank = rank;
	h.pid = (uint64_t)getpid();
	h.job_id = (char *)(j->id ? j->id : "");
	h.local_size = j->local_size[node];
	h.nodes = j->nodes;
	Gradsync__UInt64Value node_rank = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__UInt64Value threshold = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue predivide = GRADSYNC__DOUBLE_VALUE__INIT;
	if (j->nodes) {
		node_rank.value = node;
		h.node_rank = &node_rank;
	}
	h.coordinator = (char *)(job_coordinator(j) ? job_coordinator(j) : "");
	if (j->threshold) {
		threshold.value = strtoull(j->threshold, NULL, 10);
		h.threshold = &threshold;
	}
	if (j->wire)
		h.wire_dtype = strcmp(j->wire, "fp16") == 0   ? GRADSYNC__WIRE_DTYPE__WIRE_FP16
			       : strcmp(j->wire, "bf16") == 0 ? GRADSYNC__WIRE_DTYPE__WIRE_BF16
							      : GRADSYNC__WIRE_DTYPE__WIRE_FP32;
	if (j->op)
		h.op = strcmp(j->op, "sum") == 0 ? GRADSYNC__REDUCE_OP__OP_SUM
						 : GRADSYNC__REDUCE_OP__OP_AVERAGE;
	if (j->predivide) {
		predivide.value = strcmp(j->predivide, "world") == 0 ? 0 : strtod(j->predivide, NULL);
		h.predivide_factor = &predivide;
	}
	if (j->fusion_buffer)
		h.fusion_buffer_elements = strtoull(j->fusion_buffer, NULL, 10);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &h;
	raw_send(fd, &m, NULL, 0);
}

static void expect_welcome(int fd)
{
	Gradsync__Message *r = raw_recv(fd);
	assert_non_null(r);
	if (r->body_case == GRADSYNC__MESSAGE__BODY_ERROR)
		fail_msg("hello refused: %s", r->error->message);
	assert_int_equal(r->body_case, GRADSYNC__MESSAGE__BODY_WELCOME);
	gradsync__message__free_unpacked(r, NULL);
}

void raw_hello(int fd, uint32_t rank)
{
	raw_send_hello(fd, rank, GS_PROTOCOL_VERSION, "");
	expect_welcome(fd);
}

void raw_hello_job(int fd, uint32_t rank, const struct harness_job *j)
{
	raw_send_hello_job(fd, rank, GS_PROTOCOL_VERSION, j, 0);
	expect_welcome(fd);
}

void raw_expect_error(int fd, int code, const char *text)
{
	Gradsync__Message *r = raw_recv(fd);
	if (!r)
		fail_msg("expected an Error containing '%s', got the end of the stream", text);
	if (r->body_case != GRADSYNC__MESSAGE__BODY_ERROR)
		fail_msg("expected an Error containing '%s', got message %d", text,
			 (int)r->body_case);
	print_message("  daemon said: %s\n", r->error->message);
	if (!strstr(r->error->message, text))
		fail_msg("error '%s' does not contain '%s'", r->error->message, text);
	assert_int_equal(r->error->code, code);
	gradsync__message__free_unpacked(r, NULL);
	/* The daemon closes after an Error. */
	assert_null(raw_recv(fd));
}

int make_memfd(size_t size, bool sealed)
{
	int fd = memfd_create("gradsync-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (sealed)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
	return fd;
}

double harness_status_seconds(const char *socket)
{
	double t0 = harness_now_s();
	gs_client *c;
	if (gs_control_connect(socket, 5000, &c) != GS_OK)
		fail_msg("status: cannot connect: %s", gs_last_error(NULL));
	struct gs_status *st;
	if (gs_status_get(c, 5000, &st) != GS_OK)
		fail_msg("status: %s", gs_last_error(c));
	gs_status_free(st);
	gs_close(c);
	return harness_now_s() - t0;
}

void harness_wait_in_step(const struct gs_test_daemon *d, uint64_t step)
{
	double t0 = harness_now_s();
	for (;;) {
		gs_client *ctl;
		struct gs_status *st;
		bool there = false;
		if (gs_control_connect(d->socket, 5000, &ctl) == GS_OK) {
			if (gs_status_get(ctl, 5000, &st) == GS_OK) {
				there = st->current_step == step &&
					strcmp(st->job_state, "in step") == 0;
				gs_status_free(st);
			}
			gs_close(ctl);
		}
		if (there)
			return;
		if (harness_now_s() - t0 > 120)
			fail_msg("node never reached step %llu", (unsigned long long)step);
		usleep(20000);
	}
}

/* Whether the daemon's status lists trainer pid with its tensors registered. */
static bool trainer_registered(const char *socket, pid_t pid)
{
	gs_client *ctl;
	struct gs_status *st;
	bool there = false;
	if (gs_control_connect(socket, 5000, &ctl) != GS_OK)
		return false;
	if (gs_status_get(ctl, 5000, &st) == GS_OK) {
		for (size_t i = 0; i < st->trainer_count; i++)
			there |= st->trainers[i].pid == (uint32_t)pid &&
				 (strcmp(st->trainers[i].state, "idle") == 0 ||
				  strcmp(st->trainers[i].state, "in step") == 0);
		gs_status_free(st);
	}
	gs_close(ctl);
	return there;
}

void harness_wait_registered(const struct gs_test_daemon *d, pid_t pid)
{
	double t0 = harness_now_s();
	while (!trainer_registered(d->socket, pid)) {
		if (harness_now_s() - t0 > 120) {
			harness_dump(d->log);
			fail_msg("trainer pid %d never registered", (int)pid);
		}
		usleep(20000);
	}
}

uint64_t harness_layout_elements(const char *name)
{
	FILE *f = fopen(harness_layout(name), "r");
	assert_non_null(f);
	char line[512], tensor[256];
	unsigned long long count, total = 0;
	while (fgets(line, sizeof(line), f))
		if (line[0] != '#' && sscanf(line, "%255s %llu", tensor, &count) == 2)
			total += count;
	fclose(f);
	return total;
}

long harness_thread_sleeps(pid_t pid, const char *name)
{
	char path[320], line[256];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);
	assert_non_null(dir);
	long sleeps = 0;
	int threads = 0;
	for (struct dirent *e; (e = readdir(dir));) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue; /* it ended meanwhile */
		char comm[64] = "";
		long n = 0;
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "Name: %63s", comm);
			sscanf(line, "voluntary_ctxt_switches: %ld", &n);
		}
		fclose(f);
		if (strcmp(comm, name) == 0) {
			sleeps += n;
			threads++;
		}
	}
	closedir(dir);
	assert_true(threads > 0);
	return sleeps;
}

long harness_rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	long kib = -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	assert_true(kib > 0);
	return kib;
}
