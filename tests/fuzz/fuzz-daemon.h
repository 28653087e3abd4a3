/*
 * What the fuzz targets share: a small real daemon for each input, started
 * and stopped as gradsyncd's is (gs_daemon_start without the socket,
 * signals or systemd; gs_daemon_shutdown and gs_daemon_free), and the
 * process's descriptors, counted before and after an input to catch a
 * leak: a daemon that leaks one per client runs out after enough bad
 * clients.
 */
#ifndef GS_FUZZ_DAEMON_H
#define GS_FUZZ_DAEMON_H

#include "daemon.h"

/* Once, from LLVMFuzzerInitialize: the log level (GS_FUZZ_LOG=debug,
 * info or warning shows the daemon's log; errors only otherwise), no
 * SIGPIPE, and libuv's process-wide pipe opened before the first count
 * of descriptors. */
void fuzz_daemon_init(void);

/* A daemon as gradsyncd's starts, with small limits, so that the fuzzer
 * reaches them with small inputs: frames of at most 4 KiB, 64 tensors,
 * 64 KiB of gradients, fusion buffers of at most 64 Ki elements, jobs of
 * one node (no other node would ever come), no configuration file, no
 * node port of its own. Aborts on failure. */
struct gs_daemon *fuzz_daemon_open(void);

/* Stops and frees it as gradsyncd does; a handle left open traps. */
void fuzz_daemon_close(struct gs_daemon *d);

/* Descriptors this process holds, and a list of them on stderr. */
int fuzz_count_fds(void);
void fuzz_list_fds(void);

#endif
