/*
 * Framing shared by gradsyncd and libgradsync: each frame is a 4-byte
 * little-endian payload length, then one serialised gradsync.Message.
 * File descriptors ride along as SCM_RIGHTS; the reader queues them in
 * arrival order and a message that carries descriptors takes them from the
 * queue, so a frame split across reads keeps its descriptors.
 */
#ifndef GS_FRAME_H
#define GS_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gradsync.pb-c.h"

#define GS_FRAME_HEADER_SIZE 4
/* Descriptors accepted in one sendmsg (the kernel's SCM_MAX_FD is 253). */
#define GS_FRAME_MAX_FDS 64
/* Descriptors held unclaimed by one reader before it refuses more. */
#define GS_FRAME_FD_QUEUE 256
#define GS_FRAME_DEFAULT_MAX (4u << 20)

/* What the readers of one process may hold together: queued descriptors
 * and buffer bytes. A reader that would pass either fails its fill, so
 * that many connections cannot add up to more than the process can hold
 * (its RLIMIT_NOFILE, its memory). */
struct gs_frame_budget {
	size_t fds, max_fds;
	size_t bytes, max_bytes;
};

struct gs_frame_reader {
	uint8_t *buf;
	size_t len;       /* bytes buffered */
	size_t cap;       /* bytes allocated */
	size_t max_frame; /* largest payload accepted */
	int fds[GS_FRAME_FD_QUEUE];
	size_t nfds;
	size_t max_fds;   /* queued at most; more fail the fill (<= GS_FRAME_FD_QUEUE) */
	struct gs_frame_budget *budget; /* charged with buf and fds; NULL: none */
};

/* An empty reader: max_fds GS_FRAME_FD_QUEUE, no budget. Set max_fds and
 * budget before the first fill. */
void gs_frame_reader_init(struct gs_frame_reader *r, size_t max_frame);
/* Frees the buffer and closes every queued descriptor. */
void gs_frame_reader_destroy(struct gs_frame_reader *r);

/* Reads what the socket has (one recvmsg). The buffer grows with the bytes
 * that arrive, not with the length a header announces. Returns the bytes
 * read (> 0), 0 at end of stream, -EAGAIN when nothing is there, -EMSGSIZE
 * when the buffered header announces a payload over max_frame, -EMFILE when
 * more descriptors came than max_fds or the budget allow (the kernel or
 * the reader closed the extra ones), -ENOBUFS when the budget has no room
 * for the buffer to grow, or another -errno. */
ssize_t gs_frame_reader_fill(struct gs_frame_reader *r, int fd);

/* Returns 1 and points *payload at the next whole frame's payload (valid
 * until gs_frame_reader_consume), 0 if it is not all here yet, -EMSGSIZE if
 * its header announces more than max_frame. Checked before any allocation. */
int gs_frame_reader_next(struct gs_frame_reader *r, const uint8_t **payload,
			 size_t *len);
/* Puts bytes read elsewhere (a connection changing hands) in front of
 * what is buffered. Returns 0 or -ENOMEM. */
int gs_frame_reader_prepend(struct gs_frame_reader *r, const uint8_t *data, size_t len);

/* Drops the frame returned by the last gs_frame_reader_next. */
void gs_frame_reader_consume(struct gs_frame_reader *r);

/* Moves the n oldest queued descriptors to fds (the caller owns them).
 * Returns 0, or -EBADMSG (taking nothing) when fewer than n are queued. */
int gs_frame_reader_take_fds(struct gs_frame_reader *r, int *fds, size_t n);

/* Decodes one payload into *out (the caller frees it). Returns 0,
 * -EBADMSG when it is not a message, or -ERANGE when it does not encode
 * back to its own length: protobuf-c keeps the low bits of a number too
 * wide for its field (a tensor index of 2^40 reads as 0, an enum of
 * 2^32 + 1 as 1), so such a frame would be read as another. */
int gs_frame_decode(const uint8_t *payload, size_t len, Gradsync__Message **out);

/* Serialises m with its header into a new buffer the caller frees.
 * Returns 0 or -ENOMEM. */
int gs_frame_encode(const Gradsync__Message *m, uint8_t **out, size_t *len);

/* One sendmsg of buf[0..len) with fds attached (nfds may be 0). Returns the
 * bytes written (the descriptors went with them), -EAGAIN, or -errno.
 * Never raises SIGPIPE. */
ssize_t gs_frame_write_some(int fd, const uint8_t *buf, size_t len,
			    const int *fds, size_t nfds);

/* Little-endian length helpers. */
static inline uint32_t gs_frame_get_len(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline void gs_frame_put_len(uint8_t *p, uint32_t len)
{
	p[0] = (uint8_t)len;
	p[1] = (uint8_t)(len >> 8);
	p[2] = (uint8_t)(len >> 16);
	p[3] = (uint8_t)(len >> 24);
}

#endif
