/*
 * What the GPU check programs share: a gradient layout read from
 * layouts/, reproducible inputs that reach the conversions' corner cases,
 * and time.
 */
#ifndef GS_GPU_COMMON_H
#define GS_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

struct layout {
	size_t n;
	char **names;
	uint64_t *counts;
	uint64_t total;
};

/* Reads "name count shape" lines (# comments). Exits with a message on
 * error. */
void layout_load(const char *path, struct layout *l);

/* A 64-bit xorshift generator. */
uint64_t rnd(uint64_t *state);

/* One input value from a mix of the conversions' hard cases: any bit
 * pattern (NaN, infinity, subnormals), exact fp16 and bf16 ties, fp16
 * subnormals, values around fp16's largest and the clip value, and plain
 * gradients. */
float corner_value(uint64_t *state, float clip);

/* Gradient-like values in [-2, 2], with a rare 1e5 that overflows fp16. */
float gradient_value(uint64_t *state);

double now_s(void);
/* The median of n values (sorts them). */
double median(double *v, size_t n);

#endif
