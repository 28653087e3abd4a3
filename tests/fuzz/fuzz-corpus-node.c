/*
 * fuzz-node's seeds: what nodes' daemons say at the node port, whole and
 * split, and what strangers do there, each behind the two bytes of flags
 * of fuzz-input.h. The lobby meets a NodeAuth of the job, of another job,
 * of another protocol version, a NodeHello or store request before it,
 * a forged proof and bytes that are no frame; an authenticated node (the
 * target proves it) says hello beside an honest node 0, offers a layout
 * (the same as node 0's, another, a name of UTF-8), uses the store, asks
 * for a regroup, pings and answers, withdraws, and says what is refused.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fuzz-input.h"
#include "fuzz-seed.h"
#include "node_protocol.h"

static void node_auth(struct seed *s, uint32_t version, const char *job, bool has_secret)
{
	uint8_t nonce[32];
	memset(nonce, 0x33, sizeof(nonce));
	Gradsync__NodeAuth a = GRADSYNC__NODE_AUTH__INIT;
	a.protocol_version = version;
	a.node_rank = FUZZ_NODE_RANK;
	a.nonce.data = nonce;
	a.nonce.len = sizeof(nonce);
	a.has_secret = has_secret;
	a.job_id = (char *)job;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_AUTH;
	m.node_auth = &a;
	seed_frame(s, &m);
}

/* A proof made up without the secret. */
static void forged_proof(struct seed *s)
{
	uint8_t mac[32] = { 0 };
	Gradsync__NodeProof p = GRADSYNC__NODE_PROOF__INIT;
	p.mac.data = mac;
	p.mac.len = sizeof(mac);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_PROOF;
	m.node_proof = &p;
	seed_frame(s, &m);
}

static void node_hello(struct seed *s, uint32_t version, uint32_t rank, const char *settings,
		       const char *host)
{
	Gradsync__NodeHello h = GRADSYNC__NODE_HELLO__INIT;
	h.protocol_version = version;
	h.node_rank = rank;
	h.nodes = FUZZ_NODE_NODES;
	h.local_size = 1;
	h.settings = (char *)settings;
	h.host = (char *)host;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_NODE_HELLO;
	m.node_hello = &h;
	seed_frame(s, &m);
}

/* Round `round` of a layout of one tensor (node 0's, in fuzz-node.c,
 * is fc.weight of 400), or its withdrawal (round 0). */
static void layout_offer(struct seed *s, uint64_t round, const char *name, uint64_t count)
{
	char *names[] = { (char *)name };
	uint64_t counts[] = { count };
	Gradsync__LayoutOffer o = GRADSYNC__LAYOUT_OFFER__INIT;
	o.round = round;
	o.withdraw = round == 0;
	o.n_names = round ? 1 : 0;
	o.names = names;
	o.n_counts = round ? 1 : 0;
	o.counts = counts;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_LAYOUT_OFFER;
	m.layout_offer = &o;
	seed_frame(s, &m);
}

static void store_set(struct seed *s, const char *key, const char *value)
{
	Gradsync__StoreSet set = GRADSYNC__STORE_SET__INIT;
	set.key = (char *)key;
	set.value.data = (uint8_t *)value;
	set.value.len = strlen(value);
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_SET;
	m.store_set = &set;
	seed_frame(s, &m);
}

static void store_get(struct seed *s, const char *key)
{
	Gradsync__StoreGet get = GRADSYNC__STORE_GET__INIT;
	get.key = (char *)key;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_STORE_GET;
	m.store_get = &get;
	seed_frame(s, &m);
}

static void regroup_request(struct seed *s, uint64_t generation, const char *reason)
{
	Gradsync__RegroupRequest r = GRADSYNC__REGROUP_REQUEST__INIT;
	r.generation = generation;
	r.reason = (char *)reason;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGROUP_REQUEST;
	m.regroup_request = &r;
	seed_frame(s, &m);
}

static void ping_pong(struct seed *s, uint64_t seq)
{
	Gradsync__Ping ping = GRADSYNC__PING__INIT;
	Gradsync__Pong pong = GRADSYNC__PONG__INIT;
	ping.seq = seq;
	pong.seq = seq;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_PING;
	m.ping = &ping;
	seed_frame(s, &m);
	m.body_case = GRADSYNC__MESSAGE__BODY_PONG;
	m.pong = &pong;
	seed_frame(s, &m);
}

/* What node 1 says over its life once proven: hello (split from here on
 * with FUZZ_SPLIT), its layout, the store, a regroup, liveness, leaving. */
static void node_life(struct seed *s, const char *name)
{
	node_hello(s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_RANK, FUZZ_NODE_SHARED, "127.0.0.2");
	s->split_lo = seed_here(s);
	layout_offer(s, 1, name, 400);
	s->split_hi = seed_here(s);
	store_set(s, "i1/g0/rank_1", "127.0.0.2:40000");
	store_get(s, "i1/g0/rank_1");
	/* An empty value: protobuf-c gives no data for it (found by fuzzing). */
	store_set(s, "i1/g0/empty", "");
	store_get(s, "i1/g0/empty");
	store_get(s, "i1/g0/rank_0"); /* waits: nobody set it */
	regroup_request(s, 0, "a collective of generation 0 timed out");
	ping_pong(s, 1);
	layout_offer(s, 0, NULL, 0);
}

void node_seeds(const char *dir)
{
	struct seed s;
	static const struct {
		const char *name;
		unsigned flags;
		const char *tensor;
	} lives[] = {
		{ "authed-life", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER, "fc.weight" },
		{ "authed-life-split", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER | FUZZ_SPLIT, "fc.weight" },
		{ "authed-life-secret", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER | FUZZ_NODE_SECRET,
		  "fc.weight" },
		{ "authed-life-hangup", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER | FUZZ_HANGUP, "fc.weight" },
		{ "authed-layout-differs", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER, "fc.bias" },
		{ "authed-layout-utf8", FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER, "caf\xc3\xa9.weight" },
		{ "authed-alone", FUZZ_NODE_AUTHED, "fc.weight" },
	};
	for (size_t i = 0; i < sizeof(lives) / sizeof(lives[0]); i++) {
		seed_start(&s, lives[i].flags);
		node_life(&s, lives[i].tensor);
		seed_save(&s, dir, lives[i].name);
	}

	/* The same life through the lobby: no secret, so its NodeAuth is
	 * welcomed at once. */
	seed_start(&s, FUZZ_NODE_PARTNER);
	node_auth(&s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_JOB, false);
	node_life(&s, "fc.weight");
	seed_save(&s, dir, "lobby-life");

	/* What the lobby and the authentication refuse. */
	seed_start(&s, FUZZ_NODE_SECRET);
	node_auth(&s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_JOB, true);
	forged_proof(&s);
	seed_save(&s, dir, "lobby-forged-proof");

	seed_start(&s, 0);
	node_auth(&s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_JOB, true);
	seed_save(&s, dir, "lobby-secret-on-one-side");

	seed_start(&s, 0);
	node_auth(&s, GS_NODE_PROTOCOL_VERSION, "caf\xc3\xa9", false);
	seed_save(&s, dir, "lobby-other-job");

	seed_start(&s, 0);
	node_auth(&s, GS_NODE_PROTOCOL_VERSION + 1, FUZZ_NODE_JOB, false);
	seed_save(&s, dir, "lobby-other-version");

	seed_start(&s, 0);
	node_hello(&s, 1, FUZZ_NODE_RANK, FUZZ_NODE_SHARED, "");
	seed_save(&s, dir, "lobby-hello-first");

	seed_start(&s, 0);
	store_get(&s, "nccl/uid");
	seed_save(&s, dir, "lobby-store-first");

	seed_start(&s, 0);
	static const char http[] = "GET / HTTP/1.1\r\nHost: gradsync\r\n\r\n";
	seed_put(&s, http, sizeof(http) - 1);
	seed_save(&s, dir, "lobby-http");

	/* Hellos an authenticated node is refused for. */
	seed_start(&s, FUZZ_NODE_AUTHED);
	node_hello(&s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_RANK, FUZZ_NODE_SHARED, "n\xc3\xb6" "de1");
	seed_save(&s, dir, "authed-hello-host");

	seed_start(&s, FUZZ_NODE_AUTHED);
	node_hello(&s, GS_NODE_PROTOCOL_VERSION, FUZZ_NODE_RANK, "threshold=1", "127.0.0.2");
	seed_save(&s, dir, "authed-hello-settings");

	seed_start(&s, FUZZ_NODE_AUTHED | FUZZ_NODE_PARTNER);
	node_hello(&s, GS_NODE_PROTOCOL_VERSION, 0, FUZZ_NODE_SHARED, "127.0.0.2");
	seed_save(&s, dir, "authed-hello-other-rank");

	seed_start(&s, FUZZ_NODE_AUTHED);
	layout_offer(&s, 1, "fc.weight", 400);
	seed_save(&s, dir, "authed-offer-before-hello");
}
