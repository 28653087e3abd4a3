#include "wire_ref.h"

#include <math.h>
#include <string.h>

static const struct wire_fmt fmts[] = {
    {GS_WIRE_F16, 2, 10, 5},
    {GS_WIRE_BF16, 2, 7, 8},
    {GS_WIRE_F32, 4, 23, 8},
};

const struct wire_fmt *wire_fmt(enum gs_wire w)
{
	for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++)
		if (fmts[i].wire == w)
			return &fmts[i];
	return NULL;
}

static int bias(const struct wire_fmt *f)
{
	return (1 << (f->ebits - 1)) - 1;
}

double wire_decode(const struct wire_fmt *f, uint32_t bits)
{
	uint32_t m = bits & ((1u << f->mant) - 1);
	int e = (int)((bits >> f->mant) & ((1u << f->ebits) - 1));
	if (e == (1 << f->ebits) - 1)
		return NAN;
	double v = e == 0 ? ldexp(m, 1 - bias(f) - f->mant)
			  : ldexp(m + (1u << f->mant), e - bias(f) - f->mant);
	return (bits >> (f->mant + f->ebits)) & 1 ? -v : v;
}

double wire_ulp(const struct wire_fmt *f, double m)
{
	int e = 0;
	if (m > 0)
		frexp(m, &e);
	/* frexp: m = frac * 2^e with frac in [0.5, 1), so the leading bit is
	 * 2^(e-1); below the normal range the spacing stays the subnormal one. */
	int lead = e - 1 < 1 - bias(f) ? 1 - bias(f) : e - 1;
	return ldexp(1.0, lead - f->mant);
}

double wire_round(const struct wire_fmt *f, double x)
{
	double ulp = wire_ulp(f, fabs(x));
	/* x / ulp is exact (a power of two); nearbyint rounds ties to even in
	 * the default rounding mode. */
	return nearbyint(x / ulp) * ulp;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint32_t wire_input(const struct wire_fmt *f, int rank, size_t i, size_t n)
{
	if (i % 97 == 3)
		return 0;
	if (rank == 1 && i % 16 == 5)
		return wire_input(f, 0, i, n) ^ (1u << (f->mant + f->ebits));
	uint64_t r = mix(((uint64_t)rank << 56) ^ ((uint64_t)f->wire << 48) ^ (n << 24) ^ i);
	uint32_t e = (uint32_t)((int)(r % 12) - 8 + bias(f));
	uint32_t m = (uint32_t)(r >> 8) & ((1u << f->mant) - 1);
	uint32_t s = (uint32_t)(r >> 40) & 1;
	return s << (f->mant + f->ebits) | e << f->mant | m;
}

uint32_t wire_load(const struct wire_fmt *f, const void *buf, size_t i)
{
	if (f->size == 2) {
		uint16_t v;
		memcpy(&v, (const char *)buf + 2 * i, 2);
		return v;
	}
	uint32_t v;
	memcpy(&v, (const char *)buf + 4 * i, 4);
	return v;
}

void wire_store(const struct wire_fmt *f, void *buf, size_t i, uint32_t bits)
{
	if (f->size == 2) {
		uint16_t v = (uint16_t)bits;
		memcpy((char *)buf + 2 * i, &v, 2);
	} else {
		memcpy((char *)buf + 4 * i, &bits, 4);
	}
}
