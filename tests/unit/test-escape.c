/*
 * gs_escape, the one escaping of what clients and peers send before it is
 * printed (log lines, Error strings, libgradsync's messages): each case
 * against its escaped form written out by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "escape.h"

struct escape_case {
	const char *text;
	const char *want;
};

static const struct escape_case cases[] = {
	{ "", "" },
	{ "node-0.example", "node-0.example" },
	{ " ~!'\"", " ~!'\"" }, /* printable ASCII, its ends included */
	{ "a\nb", "a\\x0ab" },
	{ "\r\t\x1b[31m", "\\x0d\\x09\\x1b[31m" },
	{ "\x7f", "\\x7f" },
	{ "\x01\x1f", "\\x01\\x1f" },
	{ "caf\xc3\xa9", "caf\\xc3\\xa9" },
	{ "\x80\xff", "\\x80\\xff" },
	/* The backslash stays: escaping again changes nothing. */
	{ "a\\b", "a\\b" },
	{ "\\x0a", "\\x0a" },
};

static void escapes_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char out[64], again[64];
		assert_string_equal(gs_escape(cases[i].text, out, sizeof(out)), cases[i].want);
		assert_string_equal(gs_escape(out, again, sizeof(again)), out);
	}
}

/* Every byte value, alone: printable ASCII as it is, every other byte as
 * \x and its two lower-case hex digits. */
static void every_byte(void **state)
{
	(void)state;
	static const char hex[] = "0123456789abcdef";
	for (int b = 1; b < 256; b++) {
		char one[2] = { (char)b, '\0' }, out[8], want[8];
		if (b >= 0x20 && b <= 0x7e) {
			want[0] = (char)b;
			want[1] = '\0';
		} else {
			want[0] = '\\';
			want[1] = 'x';
			want[2] = hex[b >> 4];
			want[3] = hex[b & 15];
			want[4] = '\0';
		}
		assert_string_equal(gs_escape(one, out, sizeof(out)), want);
	}
}

/* Text that does not fit is cut after a whole character, never inside an
 * escape, and ends with "...". */
static void cut_never_splits_an_escape(void **state)
{
	(void)state;
	char out[10];
	assert_string_equal(gs_escape("abcdefghijkl", out, sizeof(out)), "abcdef...");
	assert_string_equal(gs_escape("abcdefghi", out, sizeof(out)), "abcdefghi"); /* fits */
	assert_string_equal(gs_escape("ab\xc3\xa9", out, sizeof(out)), "ab\\xc3...");
	assert_string_equal(gs_escape("\xc3\xa9\xc3", out, sizeof(out)), "\\xc3...");
	char tiny[3];
	assert_string_equal(gs_escape("abc", tiny, sizeof(tiny)), "ab");
	assert_string_equal(gs_escape("\x01", tiny, sizeof(tiny)), "");
	char big[GS_ESCAPED_SIZE(3)];
	assert_string_equal(gs_escape("\x01\x02\x03", big, sizeof(big)), "\\x01\\x02\\x03");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(escapes_as_written),
		cmocka_unit_test(every_byte),
		cmocka_unit_test(cut_never_splits_an_escape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
