/*
 * The emulated NCCL's unique id and the messages between a rank and the
 * root, over loopback TCP. A rank sends a hello, gets "ready" once every
 * rank has joined, then per all-reduce sends a request and its buffer and
 * gets a reply and the sum. A reply with a non-zero status says which rank
 * failed; the root then closes every connection.
 */
#ifndef GS_CUDA_EMU_NCCL_WIRE_H
#define GS_CUDA_EMU_NCCL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define EMU_NCCL_MAGIC "GSEMUNCL"
#define EMU_NCCL_MAX_RANKS 256

struct emu_nccl_uid { /* the first bytes of ncclUniqueId */
	char magic[8];
	uint64_t job;  /* random: a rank of another job is refused */
	uint32_t addr; /* the root's IPv4 address and port, network order */
	uint16_t port;
};

struct emu_nccl_hello {
	char magic[8];
	uint64_t job;
	int32_t rank, nranks;
};

struct emu_nccl_request {
	uint32_t seq;
	int32_t dtype; /* ncclDataType_t */
	uint64_t count;
};

struct emu_nccl_reply {
	int32_t status; /* 0: ok (the sum follows, for a request) */
	int32_t rank;   /* the rank that failed */
	uint64_t count;
	char msg[112];
};

/* Whole-buffer socket I/O: 0, or -1 on error or end of stream. */
int emu_send_all(int fd, const void *buf, size_t n);
int emu_recv_all(int fd, void *buf, size_t n);
/* Bytes per element of an NCCL data type gradsync uses; 0 for others. */
size_t emu_nccl_size(int dtype);
/* Starts the root of a new job in this process; fills the id. 0 or -1. */
int emu_nccl_root_start(struct emu_nccl_uid *uid);

#endif
