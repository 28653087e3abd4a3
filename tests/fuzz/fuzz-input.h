/*
 * What one input of fuzz-session (and, below, of fuzz-node) means, shared
 * by the targets and the program that writes the seed corpus. The first
 * byte is a set of flags that shape the connection, the second says where
 * to split the stream, and the rest is what the client writes to the
 * daemon: frames, or anything else.
 */
#ifndef GS_FUZZ_INPUT_H
#define GS_FUZZ_INPUT_H

/* Write the stream in two writes, split at byte 1's share of it (n/256),
 * with the loop run in between, so frames arrive in pieces. */
#define FUZZ_SPLIT 0x01u
/* Pass a memfd (SCM_RIGHTS) with the first write after the first frame
 * (the Hello): a trainer's gradient buffer, or a control client's trace
 * file. */
#define FUZZ_MEMFD 0x02u
/* Leave that memfd unsealed (the daemon must refuse it as a buffer). */
#define FUZZ_UNSEALED 0x04u
/* Make it FUZZ_SMALL_BYTES long instead of FUZZ_MEMFD_BYTES. */
#define FUZZ_SMALL 0x08u
/* The seed's trainer Hello asks for a job of local size 2: the one
 * trainer's steps never launch, and they end when it goes. Otherwise of
 * local size 1, so that a step reduces its buckets on the job's worker
 * thread. (The target reads the job from the Hello, as gradsyncd does;
 * these bits shape the seeds fuzz-corpus writes.) */
#define FUZZ_PAIR 0x10u
/* Hang up right after the last write, before the daemon has read it, so
 * that it meets the end of the stream with frames still to handle. */
#define FUZZ_HANGUP 0x20u
/* Bits 6-7: the wire dtype the seed's Hello asks for: 0 fp16, 1 bf16, 2 fp32, 3 fp16. */
#define FUZZ_WIRE_SHIFT 6

#define FUZZ_HEADER 2
#define FUZZ_MEMFD_BYTES 4096
#define FUZZ_SMALL_BYTES 64

/* ---- fuzz-node: what another node's daemon, or a stranger, says ----------
 *
 * One input of fuzz-node is, after the same two bytes (flags, split), what
 * one peer writes to the node port of a daemon that serves the rendezvous
 * of job FUZZ_NODE_JOB (FUZZ_NODE_NODES nodes) there. FUZZ_SPLIT and
 * FUZZ_HANGUP mean what they mean above; these bits shape the rest. */

/* The target proves the peer honestly first, as node FUZZ_NODE_RANK
 * (NodeAuth, and with FUZZ_NODE_SECRET the proof): the bytes are then
 * what an authenticated node says. Otherwise they meet the lobby raw. */
#define FUZZ_NODE_AUTHED 0x02u
/* Both sides hold the cluster secret FUZZ_NODE_SECRET_TEXT (otherwise
 * neither: a NodeAuth without one is welcomed at once). */
#define FUZZ_NODE_SECRET 0x04u
/* Before the peer, an honest node 0 joins (authenticated, NodeHello,
 * LayoutOffer of round 1 of the seeds' layout), so that the peer's
 * hello completes the group and its offer is judged. */
#define FUZZ_NODE_PARTNER 0x08u

#define FUZZ_NODE_JOB "fuzz"
#define FUZZ_NODE_NODES 2
#define FUZZ_NODE_RANK 1
#define FUZZ_NODE_SECRET_TEXT "the fuzz target's cluster secret"
/* The job's fusion buffer (its other settings are the defaults), within
 * the fuzz daemon's --max-fusion-buffer; and what every node of the job
 * must then say alike (gs_settings_shared_text, which fuzz-node checks). */
#define FUZZ_NODE_FUSION_BUFFER 1024
#define FUZZ_NODE_SHARED \
	"threshold=2097152 wire=fp16 op=average predivide=world fusion-buffer=1024"

#endif
