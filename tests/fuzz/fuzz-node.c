/*
 * libFuzzer target over gradsyncd's node port: what another node's daemon,
 * or a stranger, sends to the rendezvous of a job whose node 0 this daemon
 * is. The lobby (rendezvous_port.c) reads a connection's first message,
 * the authentication (rendezvous_auth.c) its proof, and the rendezvous
 * server (rendezvous_server.c) what an authenticated node says.
 *
 * Each input gets a small real daemon in this process (fuzz-daemon.h),
 * its node port listening on an ephemeral port of 127.0.0.1 and serving
 * the rendezvous of job FUZZ_NODE_JOB, and one TCP connection to it whose
 * bytes are the input's (fuzz-input.h gives the two bytes of flags in
 * front). As flags ask, an honest node 0 joins first, and the target
 * proves the peer itself before its bytes go, so that the fuzzer need not
 * forge a proof to reach what an authenticated node may say. The loop
 * runs without blocking until the daemon is quiet; then the peers hang up
 * (with a reset, so that no TIME_WAIT piles up; an input that half-closes
 * first, FUZZ_HANGUP, leaves one, whose port loopback reuses), the
 * rendezvous stops and everything is closed and freed.
 *
 * Besides ASan, UBSan and LeakSanitizer, every input must leave no
 * descriptor open; a daemon that never settles traps.
 *
 * GS_FUZZ_LOG=debug (or info, warning) shows the daemon's log.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/auth.h"
#include "cluster/rendezvous.h"
#include "engine/job_view.h"
#include "frame.h"
#include "fuzz-daemon.h"
#include "fuzz-input.h"
#include "node_protocol.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loop passes one input may take to go quiet; far more than any real
 * exchange needs (a few dozen). */
#define SETTLE_PASSES 200000
/* The largest answer an honest peer waits for (a challenge, a proof). */
#define REPLY_MAX_FRAME 4096

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_daemon_init();
	return 0;
}

/* One input's daemon, its node port's settings and the job it serves. */
struct node_daemon {
	struct gs_daemon *d;
	struct gs_settings port_settings, job;
	struct gs_rdv_server *rdv;
	int port;
};

/* ---- Running the loop --------------------------------------------------- */

/* Whether the daemon has bytes or a connection it has not taken yet. */
static bool daemon_has_unread(const struct node_daemon *n)
{
	struct pollfd p = { n->d->port.fd, POLLIN, 0 };
	if (n->d->port.fd >= 0 && poll(&p, 1, 0) > 0)
		return true;
	for (const struct gs_conn *c = n->d->conns.head; c; c = c->next) {
		int unread = 0;
		if (!c->closing && ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0)
			return true;
	}
	return false;
}

/* Whether a peer's socket has bytes from the daemon. */
static bool readable(int fd)
{
	int unread = 0;
	return fd >= 0 && ioctl(fd, FIONREAD, &unread) == 0 && unread > 0;
}

/* Reads and drops what the daemon wrote to fd; returns the bytes read. */
static size_t drain(int fd)
{
	uint8_t buf[65536];
	size_t total = 0;
	ssize_t r;
	while (fd >= 0 && (r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		total += (size_t)r;
	return total;
}

/* Runs the loop without blocking until nothing moves: no bytes or
 * connection the daemon has not taken, nothing new from it to the peers
 * in drop[] (-1: none), whose answers are read and dropped. */
static void settle(struct node_daemon *n, const int *drop, size_t ndrop)
{
	for (int i = 0; i < SETTLE_PASSES; i++) {
		uv_run(n->d->loop, UV_RUN_NOWAIT);
		bool wrote = false;
		for (size_t k = 0; k < ndrop; k++)
			wrote = drain(drop[k]) > 0 || wrote;
		if (!wrote && !daemon_has_unread(n))
			return;
	}
	fprintf(stderr, "fuzz-node: the daemon did not go quiet in %d loop passes\n",
		SETTLE_PASSES);
	__builtin_trap();
}

/* ---- An honest node's side ------------------------------------------------ */

/* A connection to the node port; closing it resets it. Every write goes
 * out at once: Nagle's algorithm would hold a second small frame until
 * the first is acknowledged, which a loop that is quiet in between never
 * sees. */
static int peer_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct linger reset = { 1, 0 };
	int one = 1;
	/* Loopback completes the handshake in the kernel: the listener need
	 * not run for connect to return. */
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
	    fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
		abort();
	return fd;
}

static void send_message(struct node_daemon *n, int fd, const Gradsync__Message *m)
{
	uint8_t *buf;
	size_t len, off = 0;
	if (gs_frame_encode(m, &buf, &len) != 0)
		abort();
	while (off < len) {
		ssize_t w = gs_frame_write_some(fd, buf + off, len - off, NULL, 0);
		if (w == -EAGAIN)
			uv_run(n->d->loop, UV_RUN_NOWAIT);
		else if (w < 0)
			abort(); /* an honest peer is never dropped */
		else
			off += (size_t)w;
	}
	free(buf);
}

/* The daemon's next message to fd, running the loop until it comes. An
 * honest peer always gets one: none aborts. */
static Gradsync__Message *next_message(struct node_daemon *n, int fd)
{
	struct gs_frame_reader r;
	gs_frame_reader_init(&r, REPLY_MAX_FRAME);
	Gradsync__Message *m = NULL;
	for (int i = 0; i < SETTLE_PASSES && !m; i++) {
		uv_run(n->d->loop, UV_RUN_NOWAIT);
		const uint8_t *payload;
		size_t len;
		if (readable(fd) && gs_frame_reader_fill(&r, fd) < 0)
			break;
		if (gs_frame_reader_next(&r, &payload, &len) != 1)
			continue;
		if (gs_frame_decode(payload, len, &m) < 0)
			break;
		gs_frame_reader_consume(&r);
	}
	/* One message at a time: nothing follows it unasked. */
	if (!m || r.len > 0)
		abort();
	gs_frame_reader_destroy(&r);
	return m;
}

static const uint8_t *secret_of(bool with_secret, size_t *len)
{
	*len = with_secret ? strlen(FUZZ_NODE_SECRET_TEXT) : 0;
	return (const uint8_t *)FUZZ_NODE_SECRET_TEXT;
}

/* Proves fd to the rendezvous as node `rank`, as a node's daemon does. */
static void authenticate(struct node_daemon *n, int fd, uint32_t rank, bool with_secret)
{
	uint8_t nonce[GS_AUTH_NONCE], mac[GS_AUTH_MAC];
	memset(nonce, 0x5a, sizeof(nonce));
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = GS_NODE_PROTOCOL_VERSION;
	a.node_rank = rank;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.has_secret = with_secret;
	a.job_id = FUZZ_NODE_JOB;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	send_message(n, fd, &m);
	Gradsync__Message *ch = next_message(n, fd);
	if (ch->body_case != GRADSYNC__MESSAGE__BODY_NODE_CHALLENGE ||
	    ch->node_challenge->nonce.len != GS_AUTH_NONCE)
		abort();
	if (with_secret) {
		size_t keylen;
		const uint8_t *key = secret_of(true, &keylen);
		if (gs_auth_mac(key, keylen, GS_AUTH_NODE, FUZZ_NODE_JOB, rank, nonce,
				ch->node_challenge->nonce.data, mac) < 0)
			abort();
		Gradsync__NodeProof pr = GRADSYNC__NODE_PROOF__INIT;
		pr.mac.data = mac;
		pr.mac.len = sizeof(mac);
		Gradsync__Message pm = GRADSYNC__MESSAGE__INIT;
		pm.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
		pm.node_proof = &pr;
		send_message(n, fd, &pm);
		Gradsync__Message *theirs = next_message(n, fd);
		if (theirs->body_case != GRADSYNC__MESSAGE__BODY_NODE_PROOF)
			abort();
		gradsync__message__free_unpacked(theirs, NULL);
	}
	gradsync__message__free_unpacked(ch, NULL);
}

/* Node 0, honest: proven, joined, its layout offered (one tensor, as the
 * seeds' peer offers it). */
static int partner_join(struct node_daemon *n, bool with_secret)
{
	int fd = peer_connect(n->port);
	authenticate(n, fd, 0, with_secret);
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = GS_NODE_PROTOCOL_VERSION;
	h.node_rank = 0;
	h.nodes = FUZZ_NODE_NODES;
	h.local_size = 1;
	h.settings = FUZZ_NODE_SHARED;
	h.host = "127.0.0.1";
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	send_message(n, fd, &m);
	char *names[] = { "fc.weight" };
	uint64_t counts[] = { 400 };
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.round = 1;
	o.n_names = 1;
	o.names = names;
	o.n_counts = 1;
	o.counts = counts;
	Gradsync__Message om = GRADSYNC__MESSAGE__INIT;
	om.body_case = GRADSYNC__MESSAGE__BODY_LAYOUT_OFFER;
	om.layout_offer = &o;
	send_message(n, fd, &om);
	settle(n, &fd, 1);
	return fd;
}

/* ---- The daemon's side ------------------------------------------------------ */

/* A daemon serving the rendezvous of the job on its node port, as
 * gradsyncd's does once a job's node-0 trainer has come: the node port
 * on 127.0.0.1 (an ephemeral port), the job's settings derived from a
 * first trainer's Hello, the cluster secret as the flags ask. */
static void node_open(struct node_daemon *n, bool with_secret)
{
	n->d = fuzz_daemon_open();
	n->port_settings = n->d->settings;
	snprintf(n->port_settings.node_address, sizeof(n->port_settings.node_address), "127.0.0.1");
	n->port_settings.node_port = 0;
	if (gs_node_port_start(&n->d->port, n->d->loop, &n->port_settings, &n->d->server) < 0)
		abort();
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	if (getsockname(n->d->port.fd, (struct sockaddr *)&a, &alen) < 0)
		abort();
	n->port = ntohs(a.sin_port);
	n->port_settings.node_port = (uint32_t)n->port;
	n->port_settings.max_nodes = FUZZ_NODE_NODES;
	/* The job as its first trainer's Hello defines it, gradsyncd's way. */
	Gradsync__UInt64Value rank0 = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.job_id = FUZZ_NODE_JOB;
	h.local_size = 1;
	h.nodes = FUZZ_NODE_NODES;
	h.node_rank = &rank0;
	h.coordinator = "127.0.0.1";
	h.fusion_buffer_elements = FUZZ_NODE_FUSION_BUFFER;
	char why[512];
	if (gs_job_settings_from_hello(&n->port_settings, FUZZ_NODE_JOB, &h, &n->job, why,
				       sizeof(why)) < 0) {
		fprintf(stderr, "fuzz-node: %s\n", why);
		abort();
	}
	/* The seeds' nodes say what fuzz-input.h says the job's nodes say. */
	gs_settings_shared_text(&n->job, why, sizeof(why));
	if (strcmp(why, FUZZ_NODE_SHARED) != 0) {
		fprintf(stderr, "fuzz-node: the job's nodes say '%s', not FUZZ_NODE_SHARED\n", why);
		abort();
	}
	const uint8_t *key = secret_of(with_secret, &n->job.cluster_secret_len);
	memcpy(n->job.cluster_secret, key, n->job.cluster_secret_len);
	if (gs_node_port_serve(&n->d->port, &n->job, &n->rdv) < 0)
		abort();
}

static void node_close(struct node_daemon *n)
{
	gs_node_port_unserve(&n->d->port, n->rdv);
	fuzz_daemon_close(n->d);
}

/* ---- One input -------------------------------------------------------------- */

/* Writes all of buf to the peer, running the daemon whenever the socket
 * is full; stops early once the daemon has dropped the peer. */
static void peer_write(struct node_daemon *n, int fd, const int *drop, size_t ndrop,
		       const uint8_t *buf, size_t len)
{
	size_t off = 0;
	while (off < len) {
		ssize_t w = gs_frame_write_some(fd, buf + off, len - off, NULL, 0);
		if (w == -EAGAIN) {
			settle(n, drop, ndrop);
			continue;
		}
		if (w < 0)
			break; /* the daemon hung up on it */
		off += (size_t)w;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < FUZZ_HEADER)
		return 0;
	unsigned flags = data[0];
	const uint8_t *bytes = data + FUZZ_HEADER;
	size_t len = size - FUZZ_HEADER;
	size_t split = flags & FUZZ_SPLIT ? len * data[1] / 256 : len;
	bool with_secret = flags & FUZZ_NODE_SECRET;
	int fds_before = fuzz_count_fds();

	struct node_daemon n;
	node_open(&n, with_secret);
	int peers[2] = { -1, -1 }; /* the partner, the fuzzed peer */
	if (flags & FUZZ_NODE_PARTNER)
		peers[0] = partner_join(&n, with_secret);
	peers[1] = peer_connect(n.port);
	if (flags & FUZZ_NODE_AUTHED)
		authenticate(&n, peers[1], FUZZ_NODE_RANK, with_secret);
	peer_write(&n, peers[1], peers, 2, bytes, split);
	if (split < len) {
		settle(&n, peers, 2);
		peer_write(&n, peers[1], peers, 2, bytes + split, len - split);
	}
	if (flags & FUZZ_HANGUP)
		shutdown(peers[1], SHUT_WR);
	settle(&n, peers, 2);
	for (int k = 0; k < 2; k++)
		if (peers[k] >= 0)
			close(peers[k]);
	settle(&n, NULL, 0);
	node_close(&n);

	int fds_after = fuzz_count_fds();
	if (fds_after != fds_before) {
		fprintf(stderr, "fuzz-node: %d descriptors open before the input, %d after:\n",
			fds_before, fds_after);
		fuzz_list_fds();
		__builtin_trap();
	}
	return 0;
}
