/*
 * The cluster secret's file (--cluster-secret-file): read once at start,
 * refused when others may read it, and wiped from memory after use. What
 * the secret proves is cluster/auth.h's.
 */
#ifndef GS_SECRET_H
#define GS_SECRET_H

#include <stddef.h>
#include <stdint.h>

#define GS_SECRET_MIN 16
#define GS_SECRET_MAX 4096

/* Reads the secret from path into key[0..GS_SECRET_MAX) and *len, with
 * one trailing newline ("\n" or "\r\n") trimmed. Refuses (-EINVAL, -EACCES
 * or -errno, with why filled in) a file that cannot be read, that is not a
 * regular file, whose mode lets its group or others in or gives more than
 * read and write to its owner (only 0600 and 0400 pass, as ssh's keys),
 * or whose secret is shorter than GS_SECRET_MIN or longer than
 * GS_SECRET_MAX bytes. */
int gs_secret_load(const char *path, uint8_t *key, size_t *len, char *why, size_t whylen);

/* Overwrites a secret in memory so that it does not outlive its use. */
void gs_secret_wipe(uint8_t *key, size_t len);

#endif
