/*
 * The process limits the settings must fit in, checked at start: every
 * connection and every descriptor clients may park must fit in
 * RLIMIT_NOFILE with room for the daemon's own, and every buffer trainers
 * may map in vm.max_map_count, so that no client can run gradsyncd out of
 * either while it serves the others.
 */
#ifndef GS_PROCESS_LIMITS_H
#define GS_PROCESS_LIMITS_H

struct gs_settings;

/* Raises the soft RLIMIT_NOFILE to what the settings need when the hard
 * limit allows; returns 0, or -1 having said on stderr which settings do
 * not fit and how to fix them. Warns when --max-mappings passes
 * vm.max_map_count. */
int gs_limits_check(const struct gs_settings *s);

#endif
