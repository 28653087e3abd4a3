/*
 * A gradient layout: tensor names and element counts in registration
 * order. Every trainer of a job must register the same one; the first
 * difference is named when they don't.
 */
#ifndef GS_LAYOUT_H
#define GS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define GS_MAX_NAME 255

struct gs_layout {
	uint32_t n;
	uint32_t cap;
	char **names;
	uint64_t *counts;
};

void gs_layout_free(struct gs_layout *l);
/* Appends a tensor (copies the name). Returns 0 or -ENOMEM. */
int gs_layout_add(struct gs_layout *l, const char *name, uint64_t count);
/* A deep copy. Returns 0 or -ENOMEM. */
int gs_layout_copy(struct gs_layout *dst, const struct gs_layout *src);
/* FNV-1a over names and counts, the same on every node. */
uint64_t gs_layout_hash(const struct gs_layout *l);
/* Finds a repeated name. Returns 1 and the two indices if there is one. */
int gs_layout_find_duplicate(const struct gs_layout *l, uint32_t *first,
			     uint32_t *second);
/* Returns 0 when equal; otherwise describes the first difference in msg
 * ("tensor 12 is 'a' (64 elements) in node 1's layout but 'b' (64
 * elements) in node 0's"), naming each layout by its owner. */
int gs_layout_compare(const struct gs_layout *mine, const char *mine_owner,
		      const struct gs_layout *ref, const char *ref_owner, char *msg,
		      size_t n);

#endif
