/*
 * "host:port" as --coordinator gives it: what the settings check at start
 * and what the rendezvous's client and server then connect to and listen
 * on, split by one function so that both agree on what is valid.
 */
#ifndef GS_HOSTPORT_H
#define GS_HOSTPORT_H

#include <stddef.h>

/* Splits "host:port" or "[v6]:port" (the last colon separates) into host
 * and port, each NUL-terminated. Returns 0, or -EINVAL when either part is
 * empty or longer than its buffer allows. */
int gs_parse_host_port(const char *text, char *host, size_t hostlen, char *port,
		       size_t portlen);

#endif
