/*
 * The fault guard over trainers' shared memory. Pages a client shares can
 * vanish under the daemon (a hole punched in a hugetlbfs memfd whose pool
 * is then used up; a hardware memory error), and a read or write of them
 * then raises SIGBUS, which would kill gradsyncd and every trainer's step
 * with it. As Wayland compositors do for wl_shm, the guard keeps a registry
 * of every client mapping and a SIGBUS handler: a fault inside a registered
 * range maps anonymous memory over the whole range (reads then see zeros,
 * writes go nowhere), marks the range lost, and returns; the step engine
 * then fails that client alone. A fault anywhere else is a bug of ours and
 * still kills the process, as before.
 *
 * The registry is one array allocated at start, so the handler reads it
 * without locks or allocation. Only the loop thread adds and removes
 * ranges; any thread may fault and ask.
 */
#ifndef GS_SHM_GUARD_H
#define GS_SHM_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Allocates the registry (capacity ranges) and installs the SIGBUS
 * handler, replacing whatever handler was there (a sanitizer's), which a
 * fault outside every range is handed back to. Returns 0 or -errno. */
int gs_shm_guard_start(size_t capacity);
/* Restores the previous SIGBUS handler and frees the registry. */
void gs_shm_guard_stop(void);

/* Registers [addr, addr + len), len a whole number of the mapping's pages.
 * Returns 0, or -ENOSPC when the registry is full. Without
 * gs_shm_guard_start (a fuzz target, a unit test of something else) it
 * registers nothing and returns 0. */
int gs_shm_guard_add(void *addr, size_t len);
/* Forgets the range that starts at addr before the caller unmaps it.
 * Returns its registered length (0: not registered). */
size_t gs_shm_guard_remove(void *addr);

/* Whether the registered range holding addr lost its pages. */
bool gs_shm_guard_lost(const void *addr);
/* Registered ranges that have lost their pages (0 almost always: a cheap
 * first test before asking range by range). */
unsigned gs_shm_guard_lost_ranges(void);
/* Faults the guard has caught since start. */
uint64_t gs_shm_guard_faults(void);

#endif
