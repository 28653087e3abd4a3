/*
 * The root of an emulated NCCL communicator: a thread, in the process
 * that called ncclGetUniqueId, that every rank connects to. Per
 * all-reduce it takes each rank's buffer, sums them in rank order (fp32
 * arithmetic, the sum rounded to the data type after each addition, as a
 * ring rounds after each step: with two ranks that is the host backend's
 * single rounding) and sends every rank the result. A rank that
 * disconnects, or sends a mismatched request, fails the communicator:
 * every other rank gets a reply naming it and the root closes down.
 * Everything is bounded: joining by GS_CUDA_EMU_TIMEOUT_MS (default 60 s),
 * each read by a receive timeout of the same length.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "elementwise.h"
#include "emu.h"
#include "nccl_wire.h"

struct root {
	int lfd;
	uint64_t job;
	int nranks; /* 0 until the first hello */
	int fd[EMU_NCCL_MAX_RANKS];
	void *buf[EMU_NCCL_MAX_RANKS];
	size_t cap[EMU_NCCL_MAX_RANKS];
	long timeout_ms;
};

int emu_send_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int emu_recv_all(int fd, void *buf, size_t n)
{
	char *p = buf;
	while (n) {
		ssize_t k = recv(fd, p, n, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

size_t emu_nccl_size(int dtype)
{
	switch (dtype) {
	case ncclFloat16:
	case ncclBfloat16:
		return 2;
	case ncclFloat32:
		return 4;
	default:
		return 0;
	}
}

static enum gs_wire wire_of(int dtype)
{
	return dtype == ncclFloat16 ? GS_WIRE_F16 : dtype == ncclBfloat16 ? GS_WIRE_BF16 : GS_WIRE_F32;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_timeout(int fd, long ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Tells every other rank that `rank` failed, and closes everything. */
static void *fail(struct root *r, int rank, const char *msg)
{
	struct emu_nccl_reply rep = { 1, rank, 0, { 0 } };
	snprintf(rep.msg, sizeof(rep.msg), "%s", msg);
	for (int k = 0; k < EMU_NCCL_MAX_RANKS; k++) {
		if (r->fd[k] < 0)
			continue;
		if (k != rank)
			emu_send_all(r->fd[k], &rep, sizeof(rep));
		close(r->fd[k]);
		free(r->buf[k]);
	}
	if (r->lfd >= 0)
		close(r->lfd);
	free(r);
	return NULL;
}

/* One connection's hello; the rank it is, or -1 (then it is closed). */
static int admit(struct root *r, int fd)
{
	struct emu_nccl_hello h;
	set_timeout(fd, r->timeout_ms);
	if (emu_recv_all(fd, &h, sizeof(h)) < 0 || memcmp(h.magic, EMU_NCCL_MAGIC, 8) ||
	    h.job != r->job || h.nranks < 1 || h.nranks > EMU_NCCL_MAX_RANKS ||
	    (r->nranks && h.nranks != r->nranks) || h.rank < 0 || h.rank >= h.nranks ||
	    r->fd[h.rank] >= 0) {
		close(fd);
		return -1;
	}
	r->nranks = h.nranks;
	r->fd[h.rank] = fd;
	return h.rank;
}

static bool join(struct root *r)
{
	long deadline = now_ms() + r->timeout_ms;
	int joined = 0;
	while (r->nranks == 0 || joined < r->nranks) {
		struct pollfd p = { r->lfd, POLLIN, 0 };
		if (now_ms() > deadline)
			return false;
		if (poll(&p, 1, 100) <= 0)
			continue;
		int fd = accept(r->lfd, NULL, NULL);
		if (fd >= 0 && admit(r, fd) >= 0)
			joined++;
	}
	close(r->lfd);
	r->lfd = -1;
	struct emu_nccl_reply ready = { 0, -1, 0, "ready" };
	for (int k = 0; k < r->nranks; k++)
		if (emu_send_all(r->fd[k], &ready, sizeof(ready)) < 0)
			return false;
	return true;
}

/* Reads rank k's request and buffer; checks it against the first one. */
static int take(struct root *r, int k, struct emu_nccl_request *first, bool *have_first,
		char *why, size_t n)
{
	struct emu_nccl_request q;
	if (emu_recv_all(r->fd[k], &q, sizeof(q)) < 0) {
		snprintf(why, n, "rank %d closed its connection (its process or communicator is gone)", k);
		return -1;
	}
	size_t esize = emu_nccl_size(q.dtype);
	if (!esize || (*have_first && (q.seq != first->seq || q.dtype != first->dtype ||
				       q.count != first->count))) {
		snprintf(why, n, "rank %d called a different all-reduce (count %llu, type %d)", k,
			 (unsigned long long)q.count, q.dtype);
		return -1;
	}
	*first = q;
	*have_first = true;
	size_t bytes = q.count * esize;
	if (bytes > r->cap[k]) {
		free(r->buf[k]);
		r->buf[k] = malloc(bytes);
		r->cap[k] = r->buf[k] ? bytes : 0;
	}
	if (bytes && (!r->buf[k] || emu_recv_all(r->fd[k], r->buf[k], bytes) < 0)) {
		snprintf(why, n, "rank %d's buffer did not arrive", k);
		return -1;
	}
	return 0;
}

/* The sum goes into rank 0's buffer. */
static void reduce(struct root *r, const struct emu_nccl_request *q)
{
	enum gs_wire w = wire_of(q->dtype);
	for (uint64_t i = 0; i < q->count; i++) {
		float acc = gs_ew_load(w, r->buf[0], i);
		for (int k = 1; k < r->nranks; k++) {
			gs_ew_store(w, r->buf[0], i, acc + gs_ew_load(w, r->buf[k], i));
			acc = gs_ew_load(w, r->buf[0], i);
		}
	}
}

/* One all-reduce: every rank's buffer (in whatever order they come), the
 * sum, the replies. -1 with the failed rank in *bad. */
static int collective(struct root *r, int *bad, char *why, size_t n)
{
	bool have[EMU_NCCL_MAX_RANKS] = { false }, have_first = false;
	struct emu_nccl_request q = { 0 };
	for (int got = 0; got < r->nranks;) {
		struct pollfd p[EMU_NCCL_MAX_RANKS];
		for (int k = 0; k < r->nranks; k++)
			p[k] = (struct pollfd){ have[k] ? -1 : r->fd[k], POLLIN, 0 };
		if (poll(p, (nfds_t)r->nranks, 1000) < 0 && errno != EINTR)
			return *bad = 0, snprintf(why, n, "poll: %s", strerror(errno)), -1;
		for (int k = 0; k < r->nranks; k++) {
			if (have[k] || !p[k].revents)
				continue;
			if (take(r, k, &q, &have_first, why, n) < 0)
				return *bad = k, -1;
			have[k] = true;
			got++;
		}
	}
	reduce(r, &q);
	struct emu_nccl_reply rep = { 0, -1, q.count, "" };
	size_t bytes = q.count * emu_nccl_size(q.dtype);
	for (int k = 0; k < r->nranks; k++) {
		if (emu_send_all(r->fd[k], &rep, sizeof(rep)) < 0 ||
		    emu_send_all(r->fd[k], r->buf[0], bytes) < 0) {
			snprintf(why, n, "rank %d stopped taking results", k);
			return *bad = k, -1;
		}
	}
	return 0;
}

static void *root_main(void *arg)
{
	struct root *r = arg;
	char why[112];
	int bad = -1;
	if (!join(r))
		return fail(r, -1, "not every rank joined the communicator in time");
	while (collective(r, &bad, why, sizeof(why)) == 0)
		;
	return fail(r, bad, why);
}

int emu_nccl_root_start(struct emu_nccl_uid *uid)
{
	struct root *r = calloc(1, sizeof(*r));
	if (!r)
		return -1;
	for (int k = 0; k < EMU_NCCL_MAX_RANKS; k++)
		r->fd[k] = -1;
	r->timeout_ms = emu_env_ms("GS_CUDA_EMU_TIMEOUT_MS", 60000);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pthread_t t;
	if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(r->lfd, EMU_NCCL_MAX_RANKS) < 0 ||
	    getsockname(r->lfd, (struct sockaddr *)&a, &len) < 0 ||
	    getrandom(&r->job, sizeof(r->job), 0) != sizeof(r->job))
		goto fail;
	memset(uid, 0, sizeof(*uid));
	memcpy(uid->magic, EMU_NCCL_MAGIC, 8);
	uid->job = r->job;
	uid->addr = a.sin_addr.s_addr;
	uid->port = a.sin_port;
	if (pthread_create(&t, NULL, root_main, r) != 0)
		goto fail;
	pthread_detach(t);
	return 0;
fail:
	if (r->lfd >= 0)
		close(r->lfd);
	free(r);
	return -1;
}
