/*
 * libFuzzer target over gradsyncd's frame decoding and message handling.
 *
 * Each input gets a small real daemon in this process: its own uv loop,
 * settings from gs_settings_load (defaults plus a few flags), started and
 * stopped by the daemon core's gs_daemon_start (without the socket,
 * signals or systemd), gs_daemon_shutdown and gs_daemon_free as
 * gradsyncd's is, and one client connection over a socketpair, adopted
 * as the server adopts the clients it admits. The
 * input's bytes are what the client writes (see fuzz-input.h for the two
 * bytes of flags in front); the loop runs without blocking until the daemon
 * is quiet, the client hangs up, and everything is closed and freed. A
 * memfd the input asks for goes with the bytes after its first frame (the
 * Hello), as no descriptor may come before it.
 *
 * Besides ASan, UBSan and LeakSanitizer, every input must leave no
 * descriptor open and no memfd mapped: a daemon that leaks either per
 * client runs out after enough bad clients. A daemon that never settles
 * (a loop that keeps itself busy) traps.
 *
 * GS_FUZZ_LOG=debug (or info, warning) shows the daemon's log.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "fuzz-daemon.h"
#include "fuzz-input.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "support/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loop passes one input may take to go quiet; far more than any real
 * exchange needs (a few dozen). */
#define SETTLE_PASSES 200000

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_daemon_init();
	return 0;
}

/* ---- Resources the process holds, to catch leaks ------------------------- */

/* Mappings of the memfds this target made. */
static int count_fuzz_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		abort();
	char line[512];
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:gs-fuzz") != NULL;
	fclose(f);
	return n;
}

/* ---- The client's side ---------------------------------------------------- */

static int make_memfd(unsigned flags)
{
	int fd = memfd_create("gs-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		abort();
	size_t size = flags & FUZZ_SMALL ? FUZZ_SMALL_BYTES : FUZZ_MEMFD_BYTES;
	float v[FUZZ_MEMFD_BYTES / sizeof(float)];
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		v[i] = (float)((int)(i % 7) - 3) * 0.25f;
	if (write(fd, v, size) != (ssize_t)size)
		abort();
	if (!(flags & FUZZ_UNSEALED) &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		abort();
	return fd;
}

/* Reads and drops what the daemon wrote; returns the bytes read. */
static size_t drain(int client)
{
	uint8_t buf[65536];
	size_t total = 0;
	ssize_t n;
	while ((n = recv(client, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		total += (size_t)n;
	return total;
}

/* Whether the daemon's connection (if it is still open) has bytes it has
 * not read. */
static bool daemon_has_unread(const struct gs_daemon *d)
{
	int unread = 0;
	return d->conns.head && ioctl(d->conns.head->fd, FIONREAD, &unread) == 0 && unread > 0;
}

/* Whether a job's worker thread has work whose end the loop has not seen. */
static bool work_in_flight(const struct gs_daemon *d)
{
	for (const struct gs_job_entry *e = d->jobs.head; e; e = e->next)
		if (e->worker_started && e->worker.inflight > 0)
			return true;
	return false;
}

/* Runs the loop without blocking until nothing moves: no work on the
 * worker thread, no bytes the daemon has not read, nothing new from it. */
static void settle(struct gs_daemon *d, int client)
{
	for (int i = 0; i < SETTLE_PASSES; i++) {
		uv_run(d->loop, UV_RUN_NOWAIT);
		bool wrote = client >= 0 && drain(client) > 0;
		if (work_in_flight(d)) {
			sched_yield();
			continue;
		}
		if (!wrote && !daemon_has_unread(d))
			return;
	}
	fprintf(stderr, "fuzz-session: the daemon did not go quiet in %d loop passes\n",
		SETTLE_PASSES);
	__builtin_trap();
}

/* Writes all of buf (the memfd, if any, with the first bytes), running the
 * daemon whenever the socket is full. Stops early once the daemon has
 * dropped the client. */
static void client_write(struct gs_daemon *d, int client, const uint8_t *buf,
			 size_t len, int *memfd)
{
	size_t off = 0;
	while (off < len) {
		int nfds = *memfd >= 0;
		ssize_t n = gs_frame_write_some(client, buf + off, len - off, memfd, (size_t)nfds);
		if (n == -EAGAIN) {
			settle(d, client);
			continue;
		}
		if (n < 0)
			break; /* the daemon hung up on us */
		if (nfds) {
			close(*memfd);
			*memfd = -1;
		}
		off += (size_t)n;
	}
}

/* The length of the first whole frame in buf[0..len), or 0 if there is
 * none. */
static size_t first_frame_len(const uint8_t *buf, size_t len)
{
	if (len < GS_FRAME_HEADER_SIZE)
		return 0;
	size_t n = GS_FRAME_HEADER_SIZE + (size_t)gs_frame_get_len(buf);
	return n <= len ? n : 0;
}

/* ---- One input -------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < FUZZ_HEADER)
		return 0;
	unsigned flags = data[0];
	const uint8_t *bytes = data + FUZZ_HEADER;
	size_t len = size - FUZZ_HEADER;
	size_t split = flags & FUZZ_SPLIT ? len * data[1] / 256 : len;
	int fds_before = fuzz_count_fds();

	struct gs_daemon *d = fuzz_daemon_open();
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	/* As a client the server accepts; the connection owns sv[0] from here. */
	gs_server_adopt(&d->server, sv[0]);
	int client = sv[1];
	int memfd = flags & FUZZ_MEMFD ? make_memfd(flags) : -1;

	/* No descriptor may come before Hello: the memfd goes with the bytes
	 * after the first frame (or with the first byte if there is none). */
	size_t first = first_frame_len(bytes, split);
	int none = -1;
	client_write(d, client, bytes, first, &none);
	if (first > 0)
		settle(d, client);
	client_write(d, client, bytes + first, split - first, &memfd);
	if (split < len) {
		settle(d, client);
		client_write(d, client, bytes + split, len - split, &memfd);
	}
	if (memfd >= 0)
		close(memfd); /* never sent: there were no bytes to carry it */
	if (flags & FUZZ_HANGUP)
		shutdown(client, SHUT_WR);
	settle(d, client);
	close(client);
	settle(d, -1);
	fuzz_daemon_close(d);

	int fds_after = fuzz_count_fds();
	if (fds_after != fds_before) {
		fprintf(stderr, "fuzz-session: %d descriptors open before the input, %d after:\n",
			fds_before, fds_after);
		fuzz_list_fds();
		__builtin_trap();
	}
	int maps = flags & FUZZ_MEMFD ? count_fuzz_maps() : 0;
	if (maps != 0) {
		fprintf(stderr, "fuzz-session: %d mappings of the input's memfd left after it\n", maps);
		__builtin_trap();
	}
	return 0;
}
