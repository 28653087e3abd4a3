/*
 * The process limits the settings must fit in, checked at start: every
 * connection and every descriptor clients may park must fit in
 * RLIMIT_NOFILE with room for the daemon's own, and every buffer trainers
 * may map in vm.max_map_count, so that no client can run gradsyncd out of
 * either while it serves the others.
 */
#ifndef GS_PROCESS_LIMITS_H
#define GS_PROCESS_LIMITS_H

#include <stdint.h>

struct gs_settings;

/* Descriptors gradsyncd keeps for itself beyond clients and parked ones:
 * sockets, the loop, timers, the worker's eventfds, log and trace files,
 * the one held in reserve to refuse connections when the rest are spent,
 * and per node of the job the rendezvous and Gloo connections. */
uint64_t gs_limits_own_fds(const struct gs_settings *s);

/* Raises the soft RLIMIT_NOFILE to what the settings need when the hard
 * limit allows; returns 0, or -1 having said on stderr which settings do
 * not fit and how to fix them. Warns when --max-mappings passes
 * vm.max_map_count. */
int gs_limits_check(const struct gs_settings *s);

#endif
