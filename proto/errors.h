/*
 * The error codes inside gradsync's programs: the daemon includes this,
 * never the public gradsync.h. The codes themselves are
 * client_protocol.h's GS_ERRNO_MAP; libgradsync exports its own
 * gs_strerror()/gs_err_name() from the same map.
 */
#ifndef GS_ERRORS_H
#define GS_ERRORS_H

#include "client_protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A static description of an error code ("protocol error"); never NULL. */
const char *gs_error_desc(int code);
/* The code's name ("GS_EPROTO"), or "GS_EUNKNOWN"; never NULL. */
const char *gs_error_name(int code);

#ifdef __cplusplus
}
#endif

#endif
