/*
 * Hosts as gradsync's daemons reach each other by: the coordinator a
 * trainer names (libgradsync checks it before its hello, gradsyncd again
 * when the hello arrives), the host a node tells the rendezvous its Gloo
 * device listens on, and the "host:port" of --coordinator that the
 * rendezvous's client and server connect to and listen on. One validator
 * and one split, so that every side agrees on what is valid.
 */
#ifndef GS_HOSTPORT_H
#define GS_HOSTPORT_H

#include <stddef.h>

/* The longest host name DNS has room for, and so the longest host. */
#define GS_HOST_MAX 253

/* Whether text is a host alone, as a coordinator must be: a DNS name
 * (labels of 1 to 63 letters, digits, '-' or '_', between dots, neither
 * starting nor ending with '-'; a trailing dot allowed), an IPv4 address
 * (four decimal numbers: a name whose last label is a number must be
 * one), or an IPv6 address, bare or in brackets, with an optional
 * "%zone". A port, a path, a scheme, a user, spaces, control and
 * non-ASCII bytes are refused. Returns 0, or -EINVAL with why (a reason,
 * "has a port (':29500'): ..."; never quoting text's bytes raw) written
 * into why[n]. "" is refused too: callers that allow none check first. */
int gs_host_check(const char *text, char *why, size_t n);

/* Splits "host:port" or "[v6]:port" (the last colon separates) into host
 * and port, each NUL-terminated. Returns 0, or -EINVAL when either part is
 * empty or longer than its buffer allows. */
int gs_parse_host_port(const char *text, char *host, size_t hostlen, char *port,
		       size_t portlen);

#endif
