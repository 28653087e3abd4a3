/*
 * Writes fuzz-session's seed corpus into a directory: real sessions as a
 * trainer or a control client would speak them (Hello, RegisterTensors
 * with a memfd buffer, BeginStep, GradientsReady, StatusRequest and the
 * other control requests), whole, split, over the other wire dtypes, and a
 * few broken ones (the daemons' own Ping and Pong among them), each behind
 * the two bytes of flags of fuzz-input.h. With a second directory, writes
 * fuzz-node's there too (fuzz-corpus-node.c). Built from the protocol's
 * own definitions, so the seeds follow it.
 *
 * Usage: fuzz-corpus DIR [NODE_DIR]
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_protocol.h"
#include "fuzz-input.h"
#include "fuzz-seed.h"

/* ---- Messages --------------------------------------------------------------- */

static void hello_job(struct seed *s, Gradsync__Role role, uint32_t version, const char *job)
{
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.protocol_version = version;
	h.role = role;
	h.local_rank = 0;
	h.pid = 4242;
	h.job_id = (char *)job;
	/* The job a trainer's Hello defines: small, so that the fuzzer
	 * reaches the limits with small inputs (a bucket per few tensors,
	 * chunks of the smallest fusion buffer). */
	Gradsync__UInt64Value threshold = GRADSYNC__UINT64_VALUE__INIT;
	threshold.value = 300;
	if (role == GRADSYNC__ROLE__ROLE_TRAINER) {
		static const Gradsync__WireDtype wires[] = {
			GRADSYNC__WIRE_DTYPE__WIRE_FP16, GRADSYNC__WIRE_DTYPE__WIRE_BF16,
			GRADSYNC__WIRE_DTYPE__WIRE_FP32, GRADSYNC__WIRE_DTYPE__WIRE_FP16,
		};
		h.local_size = s->data[0] & FUZZ_PAIR ? 2 : 1;
		h.wire_dtype = wires[s->data[0] >> FUZZ_WIRE_SHIFT & 3];
		h.threshold = &threshold;
		h.fusion_buffer_elements = 1024;
	}
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_HELLO;
	m.hello = &h;
	seed_frame(s, &m);
}

static void hello(struct seed *s, Gradsync__Role role, uint32_t version)
{
	hello_job(s, role, version, "fuzz");
}

/* Three tensors in the memfd of FUZZ_MEMFD_BYTES: two share a bucket
 * under the fuzz daemon's threshold of 300 elements, one goes alone. */
static const struct {
	const char *name;
	uint64_t count, offset;
} tensors[] = {
	{ "fc.bias", 100, 0 },
	{ "fc.weight", 400, 512 },
	{ "conv.weight", 250, 2560 },
};
#define NTENSORS (sizeof(tensors) / sizeof(tensors[0]))

/* RegisterTensors of tensors [first, end), with the buffer when with_buffer. */
static void register_tensors(struct seed *s, size_t first, size_t end, bool with_buffer,
			     bool last)
{
	Gradsync__Buffer buf = GRADSYNC__BUFFER__INIT;
	buf.size = FUZZ_MEMFD_BYTES;
	Gradsync__Buffer *bufs[] = { &buf };
	Gradsync__TensorSpec specs[NTENSORS];
	Gradsync__TensorSpec *ptrs[NTENSORS];
	for (size_t i = first; i < end; i++) {
		gradsync__tensor_spec__init(&specs[i]);
		specs[i].name = (char *)tensors[i].name;
		specs[i].count = tensors[i].count;
		specs[i].dtype = GRADSYNC__DTYPE__DTYPE_FLOAT32;
		specs[i].buffer = 0;
		specs[i].offset = tensors[i].offset;
		ptrs[i - first] = &specs[i];
	}
	Gradsync__RegisterTensors r = GRADSYNC__REGISTER_TENSORS__INIT;
	r.n_buffers = with_buffer ? 1 : 0;
	r.buffers = bufs;
	r.n_tensors = end - first;
	r.tensors = ptrs;
	r.last = last;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_REGISTER_TENSORS;
	m.register_tensors = &r;
	seed_frame(s, &m);
}

static void begin_step(struct seed *s, uint64_t step, bool clip, bool events)
{
	Gradsync__BeginStep b = GRADSYNC__BEGIN_STEP__INIT;
	b.step = step;
	b.clipping = clip;
	b.clip_value = 0.5f;
	b.bucket_events = events;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_BEGIN_STEP;
	m.begin_step = &b;
	seed_frame(s, &m);
}

static void ready(struct seed *s, uint64_t step, const uint64_t *idx, size_t n)
{
	Gradsync__GradientsReady r = GRADSYNC__GRADIENTS_READY__INIT;
	r.step = step;
	r.n_tensors = n;
	r.tensors = (uint64_t *)idx;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = GRADSYNC__MESSAGE__BODY_GRADIENTS_READY;
	m.gradients_ready = &r;
	seed_frame(s, &m);
}

/* An empty control request of the given kind. */
static void request(struct seed *s, Gradsync__Message__BodyCase body)
{
	Gradsync__StatusRequest sr = GRADSYNC__STATUS_REQUEST__INIT;
	Gradsync__MetricsRequest mr = GRADSYNC__METRICS_REQUEST__INIT;
	Gradsync__ClientsRequest cr = GRADSYNC__CLIENTS_REQUEST__INIT;
	Gradsync__TraceStart ts = GRADSYNC__TRACE_START__INIT;
	Gradsync__TraceStop tp = GRADSYNC__TRACE_STOP__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	m.body_case = body;
	switch (body) {
	case GRADSYNC__MESSAGE__BODY_STATUS_REQUEST:
		m.status_request = &sr;
		break;
	case GRADSYNC__MESSAGE__BODY_METRICS_REQUEST:
		m.metrics_request = &mr;
		break;
	case GRADSYNC__MESSAGE__BODY_CLIENTS_REQUEST:
		m.clients_request = &cr;
		break;
	case GRADSYNC__MESSAGE__BODY_TRACE_START:
		m.trace_start = &ts;
		break;
	case GRADSYNC__MESSAGE__BODY_TRACE_STOP:
		m.trace_stop = &tp;
		break;
	default:
		abort();
	}
	seed_frame(s, &m);
}

/* A Ping, or a Pong, of seq (messages between daemons). */
static void liveness(struct seed *s, bool pong, uint64_t seq)
{
	Gradsync__Ping ping = GRADSYNC__PING__INIT;
	Gradsync__Pong answer = GRADSYNC__PONG__INIT;
	Gradsync__Message m = GRADSYNC__MESSAGE__INIT;
	if (pong) {
		answer.seq = seq;
		m.body_case = GRADSYNC__MESSAGE__BODY_PONG;
		m.pong = &answer;
	} else {
		ping.seq = seq;
		m.body_case = GRADSYNC__MESSAGE__BODY_PING;
		m.ping = &ping;
	}
	seed_frame(s, &m);
}

/* A trainer's whole life: hello, registration, two steps (the second
 * clipped, with bucket events, its marks in two frames). A trainer waits
 * for step 1 to end before it begins step 2: split there (FUZZ_SPLIT, the
 * loop runs in between), anywhere up to the end of BeginStep. */
static void trainer_session(struct seed *s)
{
	static const uint64_t all[] = { 0, 1, 2 }, last[] = { 2 }, first[] = { 0, 1 };
	hello(s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	register_tensors(s, 0, NTENSORS, true, true);
	begin_step(s, 1, false, false);
	ready(s, 1, all, 3);
	s->split_lo = seed_here(s);
	begin_step(s, 2, true, true);
	s->split_hi = seed_here(s);
	ready(s, 2, last, 1);
	ready(s, 2, first, 2);
}

/* ---- The corpus ----------------------------------------------------------- */

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: fuzz-corpus DIR [NODE_DIR]\n");
		return 2;
	}
	const char *dir = argv[1];
	struct seed s;

	seed_start(&s, 0);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	seed_save(&s, dir, "hello-trainer");

	seed_start(&s, FUZZ_MEMFD);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	register_tensors(&s, 0, NTENSORS, true, true);
	seed_save(&s, dir, "register");

	/* Registration over two frames; the second names the first's buffer. */
	seed_start(&s, FUZZ_MEMFD);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	register_tensors(&s, 0, 1, true, false);
	register_tensors(&s, 1, NTENSORS, false, true);
	begin_step(&s, 1, false, false);
	seed_save(&s, dir, "register-two-frames");

	/* Step 2 begins after step 1 ends, but for "steps-unsplit" (which
	 * begins it too early and is dropped for it). */
	static const struct {
		const char *name;
		unsigned flags;
	} steps[] = {
		{ "steps", FUZZ_MEMFD | FUZZ_SPLIT },
		{ "steps-bf16", FUZZ_MEMFD | FUZZ_SPLIT | 1u << FUZZ_WIRE_SHIFT },
		{ "steps-fp32", FUZZ_MEMFD | FUZZ_SPLIT | 2u << FUZZ_WIRE_SHIFT },
		{ "steps-pair", FUZZ_MEMFD | FUZZ_SPLIT | FUZZ_PAIR },
		{ "steps-hangup", FUZZ_MEMFD | FUZZ_SPLIT | FUZZ_HANGUP },
		{ "steps-unsplit", FUZZ_MEMFD },
		{ "steps-unsealed", FUZZ_MEMFD | FUZZ_SPLIT | FUZZ_UNSEALED },
		{ "steps-small-memfd", FUZZ_MEMFD | FUZZ_SPLIT | FUZZ_SMALL },
		{ "steps-no-memfd", FUZZ_SPLIT },
	};
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		seed_start(&s, steps[i].flags);
		trainer_session(&s);
		request(&s, GRADSYNC__MESSAGE__BODY_STATUS_REQUEST); /* refused: a trainer's */
		seed_save(&s, dir, steps[i].name);
	}

	seed_start(&s, 0);
	hello(&s, GRADSYNC__ROLE__ROLE_CONTROL, GS_PROTOCOL_VERSION);
	request(&s, GRADSYNC__MESSAGE__BODY_STATUS_REQUEST);
	request(&s, GRADSYNC__MESSAGE__BODY_CLIENTS_REQUEST);
	request(&s, GRADSYNC__MESSAGE__BODY_METRICS_REQUEST);
	seed_save(&s, dir, "control");

	/* The trace file is the memfd, unsealed so that it can be written. */
	seed_start(&s, FUZZ_MEMFD | FUZZ_UNSEALED);
	hello(&s, GRADSYNC__ROLE__ROLE_CONTROL, GS_PROTOCOL_VERSION);
	request(&s, GRADSYNC__MESSAGE__BODY_TRACE_START);
	request(&s, GRADSYNC__MESSAGE__BODY_STATUS_REQUEST);
	request(&s, GRADSYNC__MESSAGE__BODY_TRACE_STOP);
	seed_save(&s, dir, "control-trace");

	seed_start(&s, 0);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION + 1);
	seed_save(&s, dir, "hello-wrong-version");

	seed_start(&s, 0);
	begin_step(&s, 1, false, false);
	seed_save(&s, dir, "step-before-hello");

	/* A header announcing more than --max-frame. */
	seed_start(&s, 0);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	static const uint8_t huge[] = { 0xff, 0xff, 0xff, 0x7f, 0x08, 0x01 };
	seed_put(&s, huge, sizeof(huge));
	seed_save(&s, dir, "oversized-frame");

	/* Numbers and text past what the daemon takes. */
	seed_start(&s, FUZZ_MEMFD);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	register_tensors(&s, 0, NTENSORS, true, true);
	begin_step(&s, 1, false, false);
	static const uint64_t far[] = { 0, UINT64_C(1) << 40 };
	ready(&s, 1, far, 2);
	seed_save(&s, dir, "ready-huge-index");

	seed_start(&s, 0);
	hello_job(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION, "job\n\x1b[2Jforged");
	seed_save(&s, dir, "hello-job-id-control");

	/* A descriptor before any whole frame: before Hello. */
	seed_start(&s, FUZZ_MEMFD);
	static const uint8_t half[] = { 0x10, 0x00 };
	seed_put(&s, half, sizeof(half));
	seed_save(&s, dir, "memfd-before-hello");

	/* The daemons' liveness messages on a trainer's socket, where they
	 * are refused: their fields, for the fuzzer to vary. (The rendezvous
	 * that serves them is fuzz-node's.) */
	seed_start(&s, 0);
	hello(&s, GRADSYNC__ROLE__ROLE_TRAINER, GS_PROTOCOL_VERSION);
	liveness(&s, false, 1);
	liveness(&s, true, UINT64_MAX);
	seed_save(&s, dir, "node-ping-pong");

	/* A whole frame that is not a message. */
	seed_start(&s, 0);
	static const uint8_t junk[] = { 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff };
	seed_put(&s, junk, sizeof(junk));
	seed_save(&s, dir, "garbage");
	if (argc == 3)
		node_seeds(argv[2]);
	return 0;
}
