#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static float bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

float corner_value(uint64_t *s, float clip)
{
	uint64_t r = rnd(s);
	uint32_t u = (uint32_t)(r >> 32), sign = (uint32_t)(r & 1) << 31;
	switch (r % 9) {
	case 0: /* anything at all */
		return bits(u);
	case 1: { /* an exact tie between two fp16 values: 13 dropped bits 0x1000 */
		uint32_t e = 113 + (u % 30); /* fp16's normal exponents */
		return bits(sign | e << 23 | (u & 0x7fe000) | 0x1000);
	}
	case 2: /* an exact tie between two bf16 values */
		return bits((u & 0xffff0000) | 0x8000);
	case 3: /* fp16 subnormals and below */
		return bits(sign | (uint32_t)(96 + u % 18) << 23 | (u & 0x7fffff));
	case 4: /* around fp16's largest (65504) and its overflow (65520) */
		return bits(sign | (0x477fe000 + (u % 0x2000)));
	case 5: { /* special values */
		static const uint32_t sp[] = { 0, 0x80000000, 0x7f800000, 0xff800000,
					       0x7fc00000, 0x7f800001, 0xffc12345, 0x00000001,
					       0x807fffff, 0x7f7fffff };
		return bits(sp[u % 10]);
	}
	case 6: /* around the clip value */
		return (sign ? -clip : clip) * (1.0f + (float)((int)(u % 2001) - 1000) * 1e-4f);
	default: /* plain gradients */
		return ((float)(u % 2000001) - 1000000.0f) * 1e-6f;
	}
}

float gradient_value(uint64_t *s)
{
	uint64_t r = rnd(s);
	if (r % 1000003 == 0)
		return 1e5f;
	return (float)((double)(r >> 11) / (double)(UINT64_C(1) << 53) * 4.0 - 2.0);
}

double now_s(void)
{
	return (double)gs_now_ns() * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double median(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
