/*
 * How fuzz-corpus writes a seed: the two bytes of flags of fuzz-input.h,
 * then frames built from the protocol's own definitions, saved to a file
 * of the corpus directory.
 */
#ifndef GS_FUZZ_SEED_H
#define GS_FUZZ_SEED_H

#include <stddef.h>
#include <stdint.h>

#include "gradsync.pb-c.h"

struct seed {
	uint8_t data[8192];
	size_t len;
	/* Where a split write should fall (payload offsets, lo <= split < hi). */
	size_t split_lo, split_hi;
};

/* An empty seed of these flags. */
void seed_start(struct seed *s, unsigned flags);
/* Appends n bytes as they are, or m as one frame. */
void seed_put(struct seed *s, const void *p, size_t n);
void seed_frame(struct seed *s, const Gradsync__Message *m);
/* Offset of the end of what the seed holds, for split_lo and split_hi. */
size_t seed_here(const struct seed *s);
/* Writes it to dir/name, with byte 1 putting a FUZZ_SPLIT within
 * [split_lo, split_hi). Exits on failure. */
void seed_save(struct seed *s, const char *dir, const char *name);

/* The seeds of fuzz-node (fuzz-corpus-node.c). */
void node_seeds(const char *dir);

#endif
