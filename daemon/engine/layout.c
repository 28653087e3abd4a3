#include "engine/layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gs_layout_free(struct gs_layout *l)
{
	for (uint32_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->counts);
	memset(l, 0, sizeof(*l));
}

int gs_layout_add(struct gs_layout *l, const char *name, uint64_t count)
{
	if (l->n == l->cap) {
		uint32_t cap = l->cap ? l->cap * 2 : 64;
		char **names = realloc(l->names, cap * sizeof(*names));
		if (!names)
			return -ENOMEM;
		l->names = names;
		uint64_t *counts = realloc(l->counts, cap * sizeof(*counts));
		if (!counts)
			return -ENOMEM;
		l->counts = counts;
		l->cap = cap;
	}
	char *copy = strdup(name);
	if (!copy)
		return -ENOMEM;
	l->names[l->n] = copy;
	l->counts[l->n] = count;
	l->n++;
	return 0;
}

int gs_layout_copy(struct gs_layout *dst, const struct gs_layout *src)
{
	memset(dst, 0, sizeof(*dst));
	for (uint32_t i = 0; i < src->n; i++) {
		if (gs_layout_add(dst, src->names[i], src->counts[i]) < 0) {
			gs_layout_free(dst);
			return -ENOMEM;
		}
	}
	return 0;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

uint64_t gs_layout_hash(const struct gs_layout *l)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (uint32_t i = 0; i < l->n; i++) {
		/* The terminating NUL separates a name from the next field. */
		h = fnv1a(h, l->names[i], strlen(l->names[i]) + 1);
		unsigned char le[8];
		for (int b = 0; b < 8; b++)
			le[b] = (unsigned char)(l->counts[i] >> (8 * b));
		h = fnv1a(h, le, sizeof(le));
	}
	return h;
}

static const struct gs_layout *sort_layout;

static int by_name(const void *a, const void *b)
{
	uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
	int c = strcmp(sort_layout->names[i], sort_layout->names[j]);
	return c ? c : (i > j) - (i < j);
}

int gs_layout_find_duplicate(const struct gs_layout *l, uint32_t *first,
			     uint32_t *second)
{
	if (l->n < 2)
		return 0;
	uint32_t *order = malloc(l->n * sizeof(*order));
	if (!order)
		return -ENOMEM;
	for (uint32_t i = 0; i < l->n; i++)
		order[i] = i;
	/* Loop thread only, so the file-scope comparator context is safe. */
	sort_layout = l;
	qsort(order, l->n, sizeof(*order), by_name);
	int found = 0;
	for (uint32_t k = 1; k < l->n && !found; k++) {
		if (strcmp(l->names[order[k - 1]], l->names[order[k]]) == 0) {
			*first = order[k - 1];
			*second = order[k];
			found = 1;
		}
	}
	free(order);
	return found;
}

int gs_layout_compare(const struct gs_layout *mine, const char *mine_owner,
		      const struct gs_layout *ref, const char *ref_owner, char *msg,
		      size_t n)
{
	uint32_t common = mine->n < ref->n ? mine->n : ref->n;
	for (uint32_t i = 0; i < common; i++) {
		if (mine->counts[i] == ref->counts[i] &&
		    strcmp(mine->names[i], ref->names[i]) == 0)
			continue;
		snprintf(msg, n,
			 "tensor %u is '%s' (%llu elements) in %s's layout but '%s' (%llu elements) in %s's",
			 i, mine->names[i], (unsigned long long)mine->counts[i], mine_owner,
			 ref->names[i], (unsigned long long)ref->counts[i], ref_owner);
		return 1;
	}
	if (mine->n != ref->n) {
		snprintf(msg, n, "%s's layout has %u tensors but %s's has %u",
			 mine_owner, mine->n, ref_owner, ref->n);
		return 1;
	}
	return 0;
}
