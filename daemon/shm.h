/*
 * Validation and mapping of the shared memory a trainer hands over: it must
 * be a memfd, sealed against shrinking (so the daemon can never fault on a
 * truncated mapping), and at least as large as the trainer claims.
 */
#ifndef GS_SHM_H
#define GS_SHM_H

#include <stddef.h>
#include <stdint.h>

/* Maps `size` bytes of memfd `fd` read-write and shared. Returns GS_OK or
 * GS_EBUFFER with a reason in err. The fd stays the caller's. */
int gs_shm_map(int fd, uint64_t size, void **addr, char *err, size_t errlen);
void gs_shm_unmap(void *addr, uint64_t size);

#endif
