#include "fuzz-seed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "fuzz-input.h"

void seed_put(struct seed *s, const void *p, size_t n)
{
	if (s->len + n > sizeof(s->data)) {
		fprintf(stderr, "fuzz-corpus: seed too long\n");
		exit(1);
	}
	memcpy(s->data + s->len, p, n);
	s->len += n;
}

void seed_start(struct seed *s, unsigned flags)
{
	s->len = 0;
	s->split_lo = s->split_hi = 0;
	uint8_t head[FUZZ_HEADER] = { (uint8_t)flags, 0 };
	seed_put(s, head, sizeof(head));
}

void seed_frame(struct seed *s, const Gradsync__Message *m)
{
	uint8_t *buf;
	size_t len;
	if (gs_frame_encode(m, &buf, &len) != 0) {
		fprintf(stderr, "fuzz-corpus: out of memory\n");
		exit(1);
	}
	seed_put(s, buf, len);
	free(buf);
}

size_t seed_here(const struct seed *s)
{
	return s->len - FUZZ_HEADER;
}

/* Byte 1 (see FUZZ_SPLIT) that puts the split within [lo, hi). */
static void place_split(struct seed *s)
{
	size_t len = s->len - FUZZ_HEADER;
	for (unsigned b = 0; b < 256; b++) {
		size_t at = len * b / 256;
		if (at >= s->split_lo && at < s->split_hi) {
			s->data[1] = (uint8_t)b;
			return;
		}
	}
	fprintf(stderr, "fuzz-corpus: no split point within [%zu, %zu)\n", s->split_lo,
		s->split_hi);
	exit(1);
}

void seed_save(struct seed *s, const char *dir, const char *name)
{
	if (s->data[0] & FUZZ_SPLIT)
		place_split(s);
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(s->data, 1, s->len, f) != s->len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}
