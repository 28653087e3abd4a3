/*
 * Independent arithmetic on wire values for the Gloo tests: elements built
 * bit by bit, decoded to double from their bits, and doubles rounded to the
 * wire dtype (nearest even) with nearbyint at the right power of two. None
 * of it goes through the conversion kernels under test.
 */
#ifndef GS_TEST_WIRE_REF_H
#define GS_TEST_WIRE_REF_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"

struct wire_fmt {
	enum gs_wire wire;
	size_t size; /* bytes per element */
	int mant;    /* stored mantissa bits */
	int ebits;   /* exponent bits */
};

const struct wire_fmt *wire_fmt(enum gs_wire w);

/* The value of an element's bits; NaN for infinities and NaNs (which the
 * tests never produce, so a NaN result is a failure). */
double wire_decode(const struct wire_fmt *f, uint32_t bits);

/* x rounded to the nearest value of the wire dtype, ties to even, keeping
 * subnormals; x must be within the dtype's finite range. */
double wire_round(const struct wire_fmt *f, double x);

/* The distance between adjacent wire values at magnitude m (>= 0). */
double wire_ulp(const struct wire_fmt *f, double m);

/* Element i of rank `rank`'s input for a buffer of n elements: random sign,
 * exponent in [-8, 3], random mantissa, so that any sum of up to four of
 * them is exact in double, and for fp16 and bf16 in fp32 too (the kernels'
 * fp32 accumulator then rounds only once, to the wire dtype); every 97th
 * element is zero and, on rank 1, every 16th is rank 0's negated (sums
 * that cancel). */
uint32_t wire_input(const struct wire_fmt *f, int rank, size_t i, size_t n);

uint32_t wire_load(const struct wire_fmt *f, const void *buf, size_t i);
void wire_store(const struct wire_fmt *f, void *buf, size_t i, uint32_t bits);

#endif
