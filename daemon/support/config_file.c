#include "support/config_file.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "escape.h"

#define MAX_LINE 4096
#define MAX_KEYS 256

struct seen {
	char *keys[MAX_KEYS];
	unsigned lines[MAX_KEYS];
	size_t n;
};

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n > 0 && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	return s;
}

static bool valid_key(const char *k)
{
	if (!*k)
		return false;
	for (; *k; k++)
		if (!islower((unsigned char)*k) && !isdigit((unsigned char)*k) && *k != '-')
			return false;
	return true;
}

/* "value" without its quotes; no escapes: a value holds no newline. */
static int unquote(char **value)
{
	char *v = *value;
	size_t n = strlen(v);
	if (n == 0 || v[0] != '"')
		return 0;
	if (n < 2 || v[n - 1] != '"')
		return -EINVAL;
	v[n - 1] = '\0';
	*value = v + 1;
	return 0;
}

static int complain(const char *path, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int complain(const char *path, unsigned line, const char *fmt, ...)
{
	/* A line of the file may hold any bytes: quoted back escaped. */
	char msg[512], safe[GS_ESCAPED_SIZE(sizeof(msg))];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "gradsyncd: %s:%u: %s\n", path, line, gs_escape(msg, safe, sizeof(safe)));
	return -EINVAL;
}

static int remember(struct seen *s, const char *path, const char *key, unsigned line)
{
	for (size_t i = 0; i < s->n; i++) {
		if (strcmp(s->keys[i], key) != 0)
			continue;
		fprintf(stderr, "gradsyncd: %s:%u: '%s' is already set on line %u\n", path, line,
			key, s->lines[i]);
		return -EINVAL;
	}
	if (s->n == MAX_KEYS)
		return complain(path, line, "more than %d settings", MAX_KEYS);
	if (!(s->keys[s->n] = strdup(key)))
		return -ENOMEM;
	s->lines[s->n++] = line;
	return 0;
}

static int parse_line(char *text, const char *path, unsigned line, struct seen *seen,
		      gs_config_fn *fn, void *ctx)
{
	char *s = trim(text);
	if (*s == '\0' || *s == '#' || *s == ';')
		return 0;
	char *eq = strchr(s, '=');
	if (!eq)
		return complain(path, line, "'%s' is not 'key = value'", s);
	*eq = '\0';
	char *key = trim(s), *value = trim(eq + 1);
	if (!valid_key(key))
		return complain(path, line, "'%s' is not a setting's name (lower case, digits and '-')",
				key);
	if (unquote(&value) < 0)
		return complain(path, line, "the value of '%s' has an opening quote but no closing one",
				key);
	int r = remember(seen, path, key, line);
	return r < 0 ? r : fn(ctx, key, value, line);
}

static int read_lines(FILE *f, const char *path, gs_config_fn *fn, void *ctx)
{
	struct seen seen = { .n = 0 };
	char *buf = NULL;
	size_t cap = 0;
	unsigned line = 0;
	int r = 0;
	ssize_t len;
	errno = 0;
	while (r == 0 && (len = getline(&buf, &cap, f)) >= 0) {
		line++;
		if (len > MAX_LINE)
			r = complain(path, line, "line longer than %d bytes", MAX_LINE);
		else if (strlen(buf) != (size_t)len)
			r = complain(path, line, "%s", "the line holds a NUL byte");
		else
			r = parse_line(buf, path, line, &seen, fn, ctx);
	}
	if (r == 0 && ferror(f)) {
		r = errno ? -errno : -EIO;
		fprintf(stderr, "gradsyncd: cannot read %s: %s\n", path, strerror(-r));
	}
	free(buf);
	for (size_t i = 0; i < seen.n; i++)
		free(seen.keys[i]);
	return r;
}

int gs_config_file_read(const char *path, bool missing_ok, gs_config_fn *fn, void *ctx)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		int r = -errno;
		if (r == -ENOENT && missing_ok)
			return r;
		fprintf(stderr, "gradsyncd: cannot read the configuration file %s: %s\n", path,
			strerror(-r));
		return r;
	}
	int r = read_lines(f, path, fn, ctx);
	fclose(f);
	return r;
}
