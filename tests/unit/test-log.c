/*
 * daemon/support/log.c: what a client's text can do to the log. Each case sends
 * stderr to a temporary file, logs, and reads the lines back.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/log.h"

static FILE *capture;
static int saved_stderr;

static int setup(void **state)
{
	(void)state;
	fflush(stderr);
	capture = tmpfile();
	assert_non_null(capture);
	saved_stderr = dup(STDERR_FILENO);
	dup2(fileno(capture), STDERR_FILENO);
	gs_log_init(GS_LOG_DEBUG);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fflush(stderr);
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	fclose(capture);
	gs_log_limit(GS_LOG_BURST, GS_LOG_WINDOW_MS);
	return 0;
}

/* The lines written so far, counted; the whole text in out. */
static unsigned captured(char *out, size_t n)
{
	fflush(stderr);
	rewind(capture);
	size_t len = fread(out, 1, n - 1, capture);
	out[len] = '\0';
	unsigned lines = 0;
	for (size_t i = 0; i < len; i++)
		lines += out[i] == '\n';
	return lines;
}

/* A job id that tries to end the line and start a forged one, with a
 * terminal escape and UTF-8: one line comes out, every byte outside
 * printable ASCII as \xNN (the backslash as it was: escaping twice
 * changes nothing). */
static void test_control_characters(void **state)
{
	(void)state;
	const char *id = "job\n12:00:00.000 gradsyncd error: forged\x1b[31m\\ caf\xc3\xa9";
	gs_warn("trainer joined job '%s'", id);
	char out[1024];
	assert_int_equal(captured(out, sizeof(out)), 1);
	assert_non_null(strstr(out, "job\\x0a12:00:00.000 gradsyncd error: forged\\x1b[31m\\ caf\\xc3\\xa9'"));
	assert_null(strchr(out, '\x1b'));
	for (const char *p = out; *p; p++)
		assert_true((unsigned char)*p < 0x80);
}

/* One call site logging in a loop: the first lines of the window, then
 * nothing, then one line that counts what was left out. */
static void test_rate_limit(void **state)
{
	(void)state;
	gs_log_limit(5, 200);
	for (int i = 0; i < 50; i++)
		gs_warn("accept: %s (%d)", "Too many open files", i);
	gs_info("another call site is not limited by the first");
	char out[8192];
	assert_int_equal(captured(out, sizeof(out)), 6);
	assert_non_null(strstr(out, "(4)"));
	assert_null(strstr(out, "(5)"));
	usleep(250000);
	gs_log_flush();
	assert_int_equal(captured(out, sizeof(out)), 7);
	assert_non_null(strstr(out, "45 more messages like \"accept: %s (%d)\" were not logged in the last 0.2 s"));
	/* The next window logs again. */
	gs_warn("accept: %s (%d)", "Too many open files", 99);
	assert_int_equal(captured(out, sizeof(out)), 8);
}

/* A group caps lines across call sites: strangers provoking many kinds
 * of refusal still get GS_LOG_GROUP_BURST lines in a window, in all. */
static void test_group_spans_call_sites(void **state)
{
	(void)state;
	struct gs_log_group g = { .what = "strangers" };
	for (int i = 0; i < GS_LOG_GROUP_BURST; i++) {
		gs_log_grouped(&g, GS_LOG_WARN, "refused one stranger (%d)", i);
		gs_log_grouped(&g, GS_LOG_WARN, "refused another kind of stranger (%d)", i);
	}
	gs_log_group_flush(&g, GS_LOG_WARN); /* the window has not ended */
	char out[8192];
	assert_int_equal(captured(out, sizeof(out)), GS_LOG_GROUP_BURST);
	assert_null(strstr(out, "held back"));
	assert_int_equal(g.window.held, GS_LOG_GROUP_BURST);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_control_characters, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rate_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_group_spans_call_sites, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
