/*
 * A trainer's Buffer message, classified and checked before any backend
 * sees it: a memfd (its descriptor travels beside the frame), a CUDA IPC
 * memory handle of a device allocation, or the trainer's pair of CUDA IPC
 * events. Plain C: built with or without CUDA, so the host backend can
 * refuse a CUDA buffer with a clear message.
 */
#ifndef GS_BUFFER_DESC_H
#define GS_BUFFER_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "gradsync.pb-c.h"

/* Longest PCI bus id accepted ("0000:3b:00.0" is 12 bytes). */
#define GS_PCI_BUS_ID_MAX 31

/* Which kind the message says it is (no checks): a descriptor is taken
 * from the frame for each GS_BUFFER_MEMFD. */
enum gs_buffer_kind gs_buffer_kind_of(const Gradsync__Buffer *m);

/* Fills *out from m for the trainer of local rank `rank` (fd: the
 * descriptor that came with a memfd buffer, else -1). Pointers in *out
 * point into m. Returns GS_OK, or GS_EINVAL with the reason in err (a
 * handle of the wrong length, a memory handle with events, ...). */
int gs_buffer_desc_parse(const Gradsync__Buffer *m, uint32_t rank, int fd,
			 struct gs_buffer_desc *out, char *err, size_t errlen);

#endif
