/*
 * The strict numbers of common/number.h, which every setting and launcher
 * variable goes through: each case of issue 23 and the edges (the largest
 * values, one past them, empty, signs, spaces, hex, octal-looking, inf,
 * nan, denormals, -0), each against its value written out by hand or read
 * by the compiler from the same text.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "number.h"

struct uint_case {
	const char *text;
	uint64_t min, max;
	int rc;
	uint64_t want;
};

static const struct uint_case uints[] = {
	{ "0", 0, 10, 0, 0 },
	{ "7", 0, 10, 0, 7 },
	{ "10", 0, 10, 0, 10 },
	{ "11", 0, 10, -ERANGE, 0 },
	{ "0", 1, 10, -ERANGE, 0 },
	{ "18446744073709551615", 0, UINT64_MAX, 0, UINT64_MAX },
	{ "18446744073709551616", 0, UINT64_MAX, -ERANGE, 0 },
	{ "99999999999999999999999999", 0, UINT64_MAX, -ERANGE, 0 },
	{ "4294967295", 0, UINT32_MAX, 0, UINT32_MAX },
	{ "4294967296", 0, UINT32_MAX, -ERANGE, 0 },
	{ "", 0, 10, -EINVAL, 0 },
	{ "-0", 0, 10, -EINVAL, 0 },
	{ "-1", 0, 10, -EINVAL, 0 },
	{ "+1", 0, 10, -EINVAL, 0 },
	{ " 1", 0, 10, -EINVAL, 0 },
	{ "1 ", 0, 10, -EINVAL, 0 },
	{ "\t1", 0, 10, -EINVAL, 0 },
	{ "0x10", 0, 100, -EINVAL, 0 },
	{ "0X10", 0, 100, -EINVAL, 0 },
	{ "010", 0, 100, -EINVAL, 0 }, /* octal-looking: 8 or 10? neither */
	{ "00", 0, 100, -EINVAL, 0 },
	{ "1e3", 0, 10000, -EINVAL, 0 },
	{ "1.0", 0, 10, -EINVAL, 0 },
	{ "1_000", 0, 10000, -EINVAL, 0 },
	{ "1,000", 0, 10000, -EINVAL, 0 },
	{ "inf", 0, UINT64_MAX, -EINVAL, 0 },
	{ "nan", 0, UINT64_MAX, -EINVAL, 0 },
	{ "\xd9\xa3", 0, 10, -EINVAL, 0 }, /* ARABIC-INDIC DIGIT THREE */
	/* Out of range and not a number: not a number. */
	{ "99999999999999999999999x", 0, UINT64_MAX, -EINVAL, 0 },
};

static void uints_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(uints) / sizeof(uints[0]); i++) {
		const struct uint_case *c = &uints[i];
		print_message("case: '%s'\n", c->text);
		uint64_t v = 12345;
		assert_int_equal(gs_parse_uint(c->text, c->min, c->max, &v), c->rc);
		assert_true(v == (c->rc == 0 ? c->want : 12345)); /* untouched on failure */
	}
}

/* Slurm's "N(xM)" lists read a number at a time. */
static void prefix_stops_after_its_digits(void **state)
{
	(void)state;
	const char *text = "18446744073709551616(x3),2", *end = NULL;
	uint64_t v = 0;
	assert_int_equal(gs_parse_uint_prefix(text, &end, 1, 64, &v), -ERANGE);
	assert_ptr_equal(end, text + 20); /* after every digit, however many */
	assert_int_equal(gs_parse_uint_prefix("2(x3)", &end, 1, 64, &v), 0);
	assert_int_equal(v, 2);
	assert_string_equal(end, "(x3)");
	assert_int_equal(gs_parse_uint_prefix(end + 2, &end, 1, 1024, &v), 0);
	assert_int_equal(v, 3);
	assert_string_equal(end, ")");
	assert_int_equal(gs_parse_uint_prefix("(x3)", &end, 1, 64, &v), -EINVAL);
	assert_int_equal(gs_parse_uint_prefix("07", &end, 0, 64, &v), -EINVAL);
}

struct real_case {
	const char *text;
	double min, max;
	int rc;
	double want;
};

static const struct real_case reals[] = {
	{ "2", 1, 1e6, 0, 2.0 },
	{ "2.5", 1, 1e6, 0, 2.5 },
	{ "1e6", 1, 1e6, 0, 1e6 },
	{ "1E6", 1, 1e6, 0, 1E6 },
	{ "1000000", 1, 1e6, 0, 1000000.0 },
	{ "0.1e1", 1, 1e6, 0, 0.1e1 },
	{ "10e-1", 1, 1e6, 0, 10e-1 },
	{ "1.0000000000000002", 1, 1e6, 0, 1.0000000000000002 },
	{ "1000000.0000001", 1, 1e6, -ERANGE, 0 },
	{ "0.999", 1, 1e6, -ERANGE, 0 },
	{ "0", 0, 1, 0, 0.0 },
	{ "-2.5", -10, 10, 0, -2.5 },
	{ "1.7976931348623157e308", 0, INFINITY, 0, 1.7976931348623157e308 },
	{ "2.2250738585072014e-308", 0, 1, 0, 2.2250738585072014e-308 }, /* smallest normal */
	/* The four. */
	{ "0x10", 1, 1e6, -EINVAL, 0 },
	{ " 2", 1, 1e6, -EINVAL, 0 },
	{ "-0", -10, 10, -EINVAL, 0 },
	{ "1e-400", 0, 1e6, -ERANGE, 0 },
	/* Denormals, overflow, and what is no decimal number. */
	{ "4.9e-324", 0, 1, -ERANGE, 0 },
	{ "2.2250738585072011e-308", 0, 1, -ERANGE, 0 },
	{ "1e400", 0, INFINITY, -ERANGE, 0 },
	{ "1.8e308", 0, INFINITY, -ERANGE, 0 },
	{ "-0.0", -10, 10, -EINVAL, 0 },
	{ "-0e5", -10, 10, -EINVAL, 0 },
	{ "", 1, 1e6, -EINVAL, 0 },
	{ "+2", 1, 1e6, -EINVAL, 0 },
	{ "2 ", 1, 1e6, -EINVAL, 0 },
	{ "02", 1, 1e6, -EINVAL, 0 },
	{ "2.", 1, 1e6, -EINVAL, 0 },
	{ ".5", 0, 1e6, -EINVAL, 0 },
	{ "2e", 1, 1e6, -EINVAL, 0 },
	{ "2e+", 1, 1e6, -EINVAL, 0 },
	{ "0x1p4", 1, 1e6, -EINVAL, 0 },
	{ "inf", 1, INFINITY, -EINVAL, 0 },
	{ "infinity", 1, INFINITY, -EINVAL, 0 },
	{ "nan", 1, 1e6, -EINVAL, 0 },
	{ "NAN", 1, 1e6, -EINVAL, 0 },
	{ "2,5", 1, 1e6, -EINVAL, 0 },
	{ "1e6x", 1, 1e6, -EINVAL, 0 },
};

static void reals_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++) {
		const struct real_case *c = &reals[i];
		print_message("case: '%s'\n", c->text);
		double v = 12345;
		assert_int_equal(gs_parse_real(c->text, c->min, c->max, &v), c->rc);
		if (c->rc == 0)
			assert_true(memcmp(&v, &c->want, sizeof(v)) == 0); /* bit for bit */
		else
			assert_true(v == 12345);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(uints_as_written),
		cmocka_unit_test(prefix_stops_after_its_digits),
		cmocka_unit_test(reals_as_written),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
