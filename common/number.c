#include "number.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

static bool digit(char c)
{
	return c >= '0' && c <= '9';
}

int gs_parse_uint_prefix(const char *text, const char **end, uint64_t min, uint64_t max,
			 uint64_t *out)
{
	const char *p = text;
	if (!digit(*p) || (p[0] == '0' && digit(p[1])))
		return -EINVAL;
	uint64_t v = 0;
	bool over = false;
	for (; digit(*p); p++) {
		unsigned d = (unsigned)(*p - '0');
		/* Every digit is read, so that *end is right whatever the value. */
		if (v > (UINT64_MAX - d) / 10)
			over = true;
		else
			v = v * 10 + d;
	}
	*end = p;
	if (over || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int gs_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	const char *end;
	uint64_t v;
	int r = gs_parse_uint_prefix(text, &end, min, max, &v);
	/* A number followed by anything is no number, in range or not. */
	if (r != -EINVAL && *end)
		return -EINVAL;
	if (r == 0)
		*out = v;
	return r;
}

/* Where the integer part, fraction and exponent of a decimal number end:
 * the end of text when it is one and nothing else, else NULL. */
static const char *skip_decimal(const char *p)
{
	if (*p == '-')
		p++;
	if (!digit(*p) || (p[0] == '0' && digit(p[1])))
		return NULL;
	while (digit(*p))
		p++;
	if (*p == '.') {
		if (!digit(*++p))
			return NULL;
		while (digit(*p))
			p++;
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!digit(*p))
			return NULL;
		while (digit(*p))
			p++;
	}
	return *p ? NULL : p;
}

/* The "C" locale's numbers, whatever locale the program (a Python
 * trainer, say) has set: "2.5" is never read as 2 where ',' is the
 * decimal separator. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
	c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

int gs_parse_real(const char *text, double min, double max, double *out)
{
	if (!skip_decimal(text))
		return -EINVAL;
	pthread_once(&c_locale_once, make_c_locale);
	if (!c_locale)
		return -ENOMEM;
	errno = 0;
	char *end;
	double v = strtod_l(text, &end, c_locale);
	if (*end)
		return -EINVAL;
	if (v == 0 && signbit(v))
		return -EINVAL;
	/* ERANGE: overflow to infinity, or underflow to a denormal or to 0
	 * (1e-400): either way the value written is not the value read. */
	if (errno == ERANGE || !isfinite(v) || (v != 0 && !isnormal(v)))
		return -ERANGE;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}
