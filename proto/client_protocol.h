/*
 * What gradsyncd and libgradsync must agree on besides gradsync.proto's
 * messages: the session protocol's version, where the daemon listens by
 * default, and the error codes that Error messages and the API return.
 *
 * This file is the one source of these facts. The daemon includes it (as
 * "errors.h" does); the library's build copies it verbatim into the
 * installed gradsync.h (client/include/meson.build), so a file that
 * includes both gets the second copy skipped by the include guard. meson
 * reads GS_DEFAULT_SOCKET from here for the systemd units and man pages;
 * tests/python/test_errors.py checks python/gradsync/errors.py against
 * GS_ERRNO_MAP. Keep it plain C with no functions: it is public API.
 */
#ifndef GS_CLIENT_PROTOCOL_H
#define GS_CLIENT_PROTOCOL_H

#define GS_PROTOCOL_VERSION 1

/* Where gradsyncd listens unless --socket or GRADSYNC_SOCKET say otherwise. */
#define GS_DEFAULT_SOCKET "/run/gradsync/gradsyncd.sock"

/* What a job's shape may be: gradsyncd refuses more, and libgradsync
 * checks a trainer's launch environment against the same bounds. */
#define GS_MAX_LOCAL_SIZE 64    /* trainers of one job on one node */
#define GS_MAX_NODES 1024       /* nodes of one job */
#define GS_JOB_ID_MAX 63        /* bytes of a job id, printable ASCII */
#define GS_COORDINATOR_MAX 255  /* bytes of the coordinator's address */

/* A job's settings where its first trainer gives none. */
#define GS_DEFAULT_THRESHOLD 2097152      /* elements */
#define GS_DEFAULT_FUSION_BUFFER 4194304  /* elements */
#define GS_MIN_FUSION_BUFFER 1024         /* elements */
#define GS_MAX_THRESHOLD (1ull << 32)     /* elements */

/* Error codes: X(name, value, description). Values never change meaning. */
#define GS_ERRNO_MAP(X)                                                        \
	X(OK, 0, "success")                                                    \
	X(EINVAL, -1, "invalid argument")                                      \
	X(ENOMEM, -2, "out of memory")                                         \
	X(ECONNECT, -3, "cannot connect to gradsyncd")                         \
	X(EDISCONNECTED, -4, "gradsyncd closed the connection")               \
	X(ETIMEDOUT, -5, "timed out")                                          \
	X(EPROTO, -6, "protocol error")                                        \
	X(EVERSION, -7, "protocol version mismatch")                           \
	X(EDTYPE, -8, "unsupported tensor dtype")                              \
	X(ELAYOUT, -9, "tensor layout differs from the other trainers")        \
	X(EBUFFER, -10, "bad shared-memory buffer")                            \
	X(ELIMIT, -11, "limit exceeded")                                       \
	X(ESTATE, -12, "call out of order")                                    \
	X(EABORTED, -13, "step aborted")                                       \
	X(EAGAIN, -14, "not done yet")                                         \
	X(ESYSTEM, -15, "system call failed")                                  \
	X(EREFUSED, -16, "refused by gradsyncd")

enum gs_error {
#define GS_ERRNO_ENUM(name, value, desc) GS_##name = value,
	GS_ERRNO_MAP(GS_ERRNO_ENUM)
#undef GS_ERRNO_ENUM
};

#endif
