/*
 * Text that others wrote (a client's coordinator or tensor names, a peer
 * node's host, reason or job id), made safe to print: in gradsyncd's log
 * lines, in the Error strings it sends, and in libgradsync's messages.
 * One function, so that every place escapes alike.
 */
#ifndef GS_ESCAPE_H
#define GS_ESCAPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies text into out (n bytes, NUL-terminated), every byte outside
 * printable ASCII (0x20 to 0x7e) written as \xNN: control characters can
 * then never end a line or drive a terminal, and non-ASCII bytes never
 * reach a log or a message raw. An escape is never cut: when the whole
 * does not fit, out ends with "..." after the last whole character.
 * Returns out.
 *
 * The backslash itself is left as it is, so that escaping is idempotent:
 * a message that crosses several daemons and the client library is
 * escaped once, whichever of them escapes it again (the price is that a
 * literal "\x41" in a name reads like an escape). */
const char *gs_escape(const char *text, char *out, size_t n);

/* Bytes out needs to hold text of len bytes escaped whole. */
#define GS_ESCAPED_SIZE(len) (4 * (len) + 1)

#ifdef __cplusplus
}
#endif

#endif
