/*
 * The reader of the layout files in this folder, shared by the example
 * trainer, the benchmarks and the GPU checks: '#' comments and blank lines,
 * then one "name count shape" line a tensor, in model.parameters() order.
 * Only name and count are read; the shape is for people.
 */
#ifndef GS_LAYOUT_FILE_H
#define GS_LAYOUT_FILE_H

#include <stddef.h>
#include <stdint.h>

struct layout_file {
	char name[64]; /* the file's base name without ".txt" */
	size_t n;
	char **names;    /* owned: layout_file_free frees them */
	uint64_t *counts;
	uint64_t total; /* elements */
};

/* Reads path into l. Returns 0, or -1 after printing why to stderr
 * (naming the file, and the line where one is bad), with l left empty. */
int layout_file_read(const char *path, struct layout_file *l);

/* Frees what l owns and empties it. */
void layout_file_free(struct layout_file *l);

#endif
