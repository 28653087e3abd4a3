/*
 * Reading gradsyncd's configuration file (gradsync.conf(5)): one setting a
 * line, "key = value", with blank lines and whole-line comments ('#' or
 * ';'). A value may be written in double quotes to keep leading or
 * trailing spaces. What the keys mean is the settings table's business
 * (settings.c); this file only splits lines and says where each came from.
 */
#ifndef GS_CONFIG_FILE_H
#define GS_CONFIG_FILE_H

#include <stdbool.h>
#include <stddef.h>

/* Called for each "key = value" line with its line number; a negative
 * return stops reading and is returned. */
typedef int gs_config_fn(void *ctx, const char *key, const char *value, unsigned line);

/* Reads path and calls fn for every setting in it, in order. Returns 0;
 * -ENOENT when the file does not exist and missing_ok (nothing printed);
 * or, after printing "gradsyncd: PATH:LINE: why" to stderr, -EINVAL for a
 * line that is not "key = value" or a key given twice, -errno when the
 * file cannot be read, or what fn returned. */
int gs_config_file_read(const char *path, bool missing_ok, gs_config_fn *fn, void *ctx);

#endif
