#include "layout_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int add(struct layout_file *l, const char *name, uint64_t count)
{
	char **names = realloc(l->names, (l->n + 1) * sizeof(*names));
	if (names)
		l->names = names;
	uint64_t *counts = realloc(l->counts, (l->n + 1) * sizeof(*counts));
	if (counts)
		l->counts = counts;
	char *copy = strdup(name);
	if (!names || !counts || !copy) {
		free(copy);
		return -1;
	}
	l->names[l->n] = copy;
	l->counts[l->n++] = count;
	l->total += count;
	return 0;
}

/* One line: "name count shape"; blank lines and '#' comments skipped.
 * Returns 0 for a skipped line, 1 for a tensor, -1 for a bad line. */
static int parse_line(char *line, char **name, uint64_t *count)
{
	char *save, *end;
	char *hash = strchr(line, '#');
	if (hash)
		*hash = '\0';
	*name = strtok_r(line, " \t\r\n", &save);
	if (!*name)
		return 0;
	char *num = strtok_r(NULL, " \t\r\n", &save);
	if (!num || *num == '-')
		return -1;
	*count = strtoull(num, &end, 10);
	return *end == '\0' && *count > 0 ? 1 : -1;
}

static void base_name(const char *path, char *out, size_t len)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	snprintf(out, len, "%s", base);
	char *dot = strrchr(out, '.');
	if (dot && strcmp(dot, ".txt") == 0)
		*dot = '\0';
}

int layout_file_read(const char *path, struct layout_file *l)
{
	memset(l, 0, sizeof(*l));
	base_name(path, l->name, sizeof(l->name));
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -1;
	}
	char line[4096];
	unsigned lineno = 0;
	int rc = 0;
	while (rc == 0 && fgets(line, sizeof(line), f)) {
		char *name;
		uint64_t count;
		lineno++;
		int r = parse_line(line, &name, &count);
		if (r < 0) {
			fprintf(stderr, "%s:%u: expected 'name count shape'\n", path, lineno);
			rc = -1;
		} else if (r > 0 && add(l, name, count) < 0) {
			fprintf(stderr, "%s: out of memory\n", path);
			rc = -1;
		}
	}
	fclose(f);
	if (rc == 0 && l->n == 0) {
		fprintf(stderr, "%s: no tensors\n", path);
		rc = -1;
	}
	if (rc < 0)
		layout_file_free(l);
	return rc;
}

void layout_file_free(struct layout_file *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->counts);
	memset(l, 0, sizeof(*l));
}
