/*
 * What the GPU check programs share: reproducible inputs that reach the
 * conversions' corner cases, and time. Gradient layouts come from
 * layouts/layout_file.h.
 */
#ifndef GS_GPU_COMMON_H
#define GS_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

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
