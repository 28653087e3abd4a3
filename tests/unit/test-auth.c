/*
 * The rendezvous's proofs against macs computed independently (Python's
 * hmac module over the same bytes, written out below), and the secret
 * file's checks: mode, length, the trailing newline.
 *
 *   python3 -c "import hmac, hashlib, struct; key = b'0123456789abcdef' * 2;
 *     m = b'gradsync rendezvous auth v2\0' + bytes([DIR]) +
 *         struct.pack('<I', RANK) + JOB.encode().ljust(64, b'\0') +
 *         bytes(range(32)) + bytes(range(32, 64));
 *     print(hmac.new(key, m, hashlib.sha256).hexdigest())"
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cluster/auth.h"

static const uint8_t key[] = "0123456789abcdef0123456789abcdef";
#define KEYLEN (sizeof(key) - 1)

static const struct {
	enum gs_auth_dir dir;
	uint32_t rank;
	const char *job;
	const char *hex;
} vectors[] = {
	{ GS_AUTH_NODE, 1, "", "39ac714450d41f5e0c015b510e0d4359a9a20c37a566b5131c5653a03aa67676" },
	{ GS_AUTH_NODE, 7, "", "7bdcd59f38badbd33c0e05fa37c7b5e1578b96aae2b226d7aeedcd52e782c86c" },
	{ GS_AUTH_COORDINATOR, 1, "", "45acbbe22ca8ba85b3d48c0dca90bc2cfe85904c4c98648f9dd5a281aa8d5e91" },
	{ GS_AUTH_COORDINATOR, 7, "", "913a518c43da7231fbaa16f0a4f46e653b5df136ac5e57bc863b7291521a5374" },
	{ GS_AUTH_NODE, 1, "job-a", "f912bb2403ca344f98e33e9c40e3ccc6c2a422a13847b1f352836403ede00cd0" },
	{ GS_AUTH_COORDINATOR, 7, "job-a", "ba2d4824c85b863ca6faf5b1e6f78e4a6d705e7aec1f966bbcbbd934a6cf3782" },
};

static void nonces(uint8_t nn[GS_AUTH_NONCE], uint8_t cn[GS_AUTH_NONCE])
{
	for (int i = 0; i < GS_AUTH_NONCE; i++) {
		nn[i] = (uint8_t)i;
		cn[i] = (uint8_t)(32 + i);
	}
}

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static void mac_matches_reference(void **state)
{
	(void)state;
	uint8_t nn[GS_AUTH_NONCE], cn[GS_AUTH_NONCE], mac[GS_AUTH_MAC];
	char text[2 * GS_AUTH_MAC + 1];
	nonces(nn, cn);
	for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
		assert_int_equal(gs_auth_mac(key, KEYLEN, vectors[i].dir, vectors[i].job, vectors[i].rank, nn, cn,
					     mac), 0);
		hex(mac, sizeof(mac), text);
		assert_string_equal(text, vectors[i].hex);
		assert_true(gs_auth_check(key, KEYLEN, vectors[i].dir, vectors[i].job, vectors[i].rank, nn, cn, mac,
					  sizeof(mac)));
	}
}

/* A proof is good for its own secret, direction, job, rank and nonces only. */
static void check_refuses_any_other_proof(void **state)
{
	(void)state;
	uint8_t nn[GS_AUTH_NONCE], cn[GS_AUTH_NONCE], mac[GS_AUTH_MAC];
	nonces(nn, cn);
	assert_int_equal(gs_auth_mac(key, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac), 0);
	assert_true(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac, sizeof(mac)));
	uint8_t other[] = "0123456789abcdef0123456789abcdeF";
	assert_false(gs_auth_check(other, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "k", 1, nn, cn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j\x01", 1, nn, cn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_COORDINATOR, "j", 1, nn, cn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 2, nn, cn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 1, cn, nn, mac, sizeof(mac)));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac, sizeof(mac) - 1));
	assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac, 0));
	for (size_t i = 0; i < sizeof(mac); i++) {
		mac[i] ^= 0x01;
		assert_false(gs_auth_check(key, KEYLEN, GS_AUTH_NODE, "j", 1, nn, cn, mac, sizeof(mac)));
		mac[i] ^= 0x01;
	}
}

static void nonces_differ(void **state)
{
	(void)state;
	uint8_t a[GS_AUTH_NONCE], b[GS_AUTH_NONCE];
	assert_int_equal(gs_auth_nonce(a), 0);
	assert_int_equal(gs_auth_nonce(b), 0);
	assert_memory_not_equal(a, b, GS_AUTH_NONCE);
}

/* ---- The secret file ------------------------------------------------------- */

static char dir[64];

static int make_dir(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/gradsync-auth-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *write_secret(const char *name, const void *data, size_t len, mode_t mode)
{
	static char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static void load(const char *path, int want, size_t want_len, const char *why_has)
{
	uint8_t k[GS_SECRET_MAX];
	size_t len = 99;
	char why[256] = "";
	int r = gs_secret_load(path, k, &len, why, sizeof(why));
	if (r != want || !strstr(why, why_has))
		fail_msg("%s: got %d '%s', expected %d with '%s'", path, r, why, want, why_has);
	assert_int_equal(len, want_len);
}

static void secret_file_trims_one_newline(void **state)
{
	(void)state;
	uint8_t k[GS_SECRET_MAX];
	size_t len;
	char why[256];
	const char *p = write_secret("nl", "0123456789abcdef\n", 17, 0600);
	assert_int_equal(gs_secret_load(p, k, &len, why, sizeof(why)), 0);
	assert_int_equal(len, 16);
	assert_memory_equal(k, "0123456789abcdef", 16);
	p = write_secret("crlf", "0123456789abcdefX\r\n", 19, 0400);
	assert_int_equal(gs_secret_load(p, k, &len, why, sizeof(why)), 0);
	assert_int_equal(len, 17);
	assert_memory_equal(k, "0123456789abcdefX", 17);
	/* Only one newline goes: the rest is secret. */
	p = write_secret("two", "0123456789abcdef\n\n", 18, 0600);
	assert_int_equal(gs_secret_load(p, k, &len, why, sizeof(why)), 0);
	assert_int_equal(len, 17);
	/* Binary secrets are fine. */
	uint8_t bin[32];
	for (size_t i = 0; i < sizeof(bin); i++)
		bin[i] = (uint8_t)(255 - i);
	p = write_secret("bin", bin, sizeof(bin), 0600);
	assert_int_equal(gs_secret_load(p, k, &len, why, sizeof(why)), 0);
	assert_int_equal(len, sizeof(bin));
	assert_memory_equal(k, bin, sizeof(bin));
}

static void secret_file_refusals(void **state)
{
	(void)state;
	load(write_secret("short", "0123456789abcde\n", 16, 0600), -EINVAL, 0,
	     "holds 15 bytes of secret; 16 to 4096 are needed");
	load(write_secret("empty", "", 0, 0600), -EINVAL, 0, "holds 0 bytes");
	load(write_secret("g", "0123456789abcdef", 16, 0640), -EACCES, 0, "mode is 0640");
	load(write_secret("o", "0123456789abcdef", 16, 0644), -EACCES, 0, "mode is 0644");
	load(write_secret("x", "0123456789abcdef", 16, 0700), -EACCES, 0, "mode is 0700");
	load(write_secret("w", "0123456789abcdef", 16, 0602), -EACCES, 0, "chmod 600");
	static char big[GS_SECRET_MAX + 1];
	memset(big, 'a', sizeof(big));
	load(write_secret("big", big, sizeof(big), 0600), -EINVAL, 0, "more than 4096 bytes");
	char missing[128];
	snprintf(missing, sizeof(missing), "%s/missing", dir);
	load(missing, -ENOENT, 0, "No such file");
	load(dir, -EINVAL, 0, "not a regular file");
	load(write_secret("ok", "0123456789abcdef", 16, 0400), 0, 16, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(mac_matches_reference),
		cmocka_unit_test(check_refuses_any_other_proof),
		cmocka_unit_test(nonces_differ),
		cmocka_unit_test_setup_teardown(secret_file_trims_one_newline, make_dir, remove_dir),
		cmocka_unit_test_setup_teardown(secret_file_refusals, make_dir, remove_dir),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
