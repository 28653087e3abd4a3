/*
 * What one input of fuzz-session means, shared by the target and the
 * program that writes the seed corpus. The first byte is a set of flags
 * that shape the connection, the second says where to split the stream,
 * and the rest is what the client writes to the daemon: frames, or
 * anything else.
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

#endif
