/*
 * common/hostport.h: gs_host_check, the one validator of a host alone
 * (the coordinator libgradsync derives and gradsyncd receives, a node's
 * address), each case with its verdict and reason written out by hand;
 * and gs_parse_host_port, the one split of --coordinator that the
 * settings' check and the rendezvous's client and server share, each
 * case against the parts written out by hand.
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

struct host_case {
	const char *text;
	const char *why; /* NULL: a host */
};

#define PORT_WHY(p) "has a port ('" p "'): give the host alone; the port is gradsyncd's --node-port, the same on every node"
#define BRACKET_WHY "has an unmatched bracket: only an IPv6 address goes in brackets, as [::1]"
#define BYTE_WHY "has a space, control or non-ASCII byte: a host name or address has none"
#define IPV4_WHY "is not an IPv4 address (four numbers 0 to 255, as 10.0.0.1)"

static const struct host_case hosts[] = {
	{ "localhost", NULL },
	{ "node-0.cluster.example", NULL },
	{ "node0.example.", NULL }, /* the absolute form */
	{ "gpu_017", NULL },
	{ "a", NULL },
	{ "10.0.0.1", NULL },
	{ "255.255.255.255", NULL },
	{ "1e3", NULL }, /* a name, though it looks like a number */
	{ "::1", NULL },
	{ "[::1]", NULL },
	{ "2001:db8::8a2e:370:7334", NULL },
	{ "[fe80::1%eth0]", NULL },
	{ "fe80::1%eth0", NULL },
	{ "::ffff:10.0.0.1", NULL },
	{ "[::ffff:10.0.0.1]", NULL },
	/* The five. */
	{ "host:port", "has a ':' but is no IPv6 address" },
	{ "[::1]:5", PORT_WHY(":5") },
	{ "[", BRACKET_WHY },
	{ "]", BRACKET_WHY },
	{ "http://x/", "is a URL: give the host alone, without a scheme, path or port" },
	/* Ports, paths, users, brackets. */
	{ "node0:29500", PORT_WHY(":29500") },
	{ "10.0.0.1:80", PORT_WHY(":80") },
	{ "node0/", "has a path ('/'): give the host alone" },
	{ "user@node0", "has a user ('@'): give the host alone" },
	{ "[10.0.0.1]", "is not an IPv6 address in brackets" },
	{ "[::1", BRACKET_WHY },
	{ "::1]", BRACKET_WHY },
	{ "[::1]x", "has more after the brackets of its IPv6 address" },
	{ "[]", "is not an IPv6 address in brackets" },
	{ "fe80::1%", "has a ':' but is no IPv6 address" },
	{ "fe80::1%eth 0", BYTE_WHY },
	{ ":::", "has a ':' but is no IPv6 address" },
	/* Bytes no host has. */
	{ "", "is empty" },
	{ "host name", BYTE_WHY },
	{ " node0", BYTE_WHY },
	{ "node0\n", BYTE_WHY },
	{ "n\xc3\xb6" "de", BYTE_WHY },
	{ "\x7f", BYTE_WHY },
	{ "node*", "has '*', which no host name or address has (letters, digits, '-', '_' and dots)" },
	{ "a'b", "has ''', which no host name or address has (letters, digits, '-', '_' and dots)" },
	/* Labels. */
	{ ".node", "has an empty label (a dot at its start or two in a row)" },
	{ "a..b", "has an empty label (a dot at its start or two in a row)" },
	{ ".", "has an empty label (a dot at its start or two in a row)" },
	{ "-node", "has a label that starts or ends with '-'" },
	{ "node-.x", "has a label that starts or ends with '-'" },
	/* What getaddrinfo would read as an IPv4 address of another form. */
	{ "127.1", IPV4_WHY },
	{ "0x7f.0.0.1", IPV4_WHY },
	{ "256.0.0.1", IPV4_WHY },
	{ "1.2.3.4.5", IPV4_WHY },
	{ "010.0.0.1", IPV4_WHY },
	{ "2130706433", IPV4_WHY },
};

static void hosts_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
		char why[200] = "untouched";
		print_message("case: %zu\n", i);
		int rc = gs_host_check(hosts[i].text, why, sizeof(why));
		assert_int_equal(rc, hosts[i].why ? -EINVAL : 0);
		if (hosts[i].why)
			assert_string_equal(why, hosts[i].why);
	}
}

/* The longest name DNS holds, labels of 63; one byte more is refused. */
static void host_lengths(void **state)
{
	(void)state;
	char name[300], why[200];
	memset(name, 'a', sizeof(name));
	/* 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253 */
	name[63] = name[127] = name[191] = '.';
	name[253] = '\0';
	assert_int_equal(gs_host_check(name, why, sizeof(why)), 0);
	name[253] = 'a';
	name[254] = '\0';
	assert_int_equal(gs_host_check(name, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "is 254 bytes long, more than the 253 of a host name");
	memset(name, 'a', 64);
	name[64] = '\0';
	assert_int_equal(gs_host_check(name, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "has a label longer than 63 bytes");
	name[63] = '\0';
	assert_int_equal(gs_host_check(name, why, sizeof(why)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(splits_as_written),
		cmocka_unit_test(refuses_what_does_not_fit),
		cmocka_unit_test(hosts_as_written),
		cmocka_unit_test(host_lengths),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
