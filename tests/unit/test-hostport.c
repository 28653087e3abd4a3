/*
 * gs_parse_host_port, the one split of --coordinator that the settings'
 * check and the rendezvous's client and server share: each case against
 * the parts written out by hand.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "hostport.h"

struct split_case {
	const char *text;
	int rc;
	const char *host, *port;
};

static const struct split_case cases[] = {
	{ "127.0.0.1:29500", 0, "127.0.0.1", "29500" },
	{ "node-0.cluster:1", 0, "node-0.cluster", "1" },
	{ "[::1]:29500", 0, "::1", "29500" },
	{ "[fe80::1%eth0]:80", 0, "fe80::1%eth0", "80" },
	{ "::1:29500", 0, "::1", "29500" }, /* the last colon separates */
	{ "localhost", -EINVAL, NULL, NULL },
	{ ":29500", -EINVAL, NULL, NULL },
	{ "host:", -EINVAL, NULL, NULL },
	{ "[]:29500", -EINVAL, NULL, NULL },
	{ "", -EINVAL, NULL, NULL },
};

static void splits_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char host[64] = "untouched", port[16] = "untouched";
		int rc = gs_parse_host_port(cases[i].text, host, sizeof(host), port, sizeof(port));
		assert_int_equal(rc, cases[i].rc);
		if (rc == 0) {
			assert_string_equal(host, cases[i].host);
			assert_string_equal(port, cases[i].port);
		}
	}
}

static void refuses_what_does_not_fit(void **state)
{
	(void)state;
	char host[8], port[6];
	assert_int_equal(gs_parse_host_port("abcdefg:1", host, sizeof(host), port, sizeof(port)), 0);
	assert_string_equal(host, "abcdefg");
	assert_int_equal(gs_parse_host_port("abcdefgh:1", host, sizeof(host), port, sizeof(port)),
			 -EINVAL);
	assert_int_equal(gs_parse_host_port("h:12345", host, sizeof(host), port, sizeof(port)), 0);
	assert_int_equal(gs_parse_host_port("h:123456", host, sizeof(host), port, sizeof(port)),
			 -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(splits_as_written),
		cmocka_unit_test(refuses_what_does_not_fit),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
