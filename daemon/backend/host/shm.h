/*
 * Validation and mapping of the shared memory a trainer hands over: it must
 * be a memfd on tmpfs (or, when allowed, hugetlbfs), sealed against
 * shrinking, and at least as large as the trainer claims. Every mapping is
 * registered with the fault guard (shm_guard.h), so that pages vanishing
 * under the daemon fail that trainer rather than kill gradsyncd.
 */
#ifndef GS_SHM_H
#define GS_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Maps `size` bytes of memfd `fd` read-write and shared. allow_hugetlb
 * accepts memfds made with MFD_HUGETLB (--allow-hugetlb). Returns GS_OK, or
 * GS_EBUFFER (GS_ELIMIT: the guard's registry is full) with a reason in
 * err. The fd stays the caller's. */
int gs_shm_map(int fd, uint64_t size, bool allow_hugetlb, void **addr, char *err, size_t errlen);
void gs_shm_unmap(void *addr, uint64_t size);

#endif
