#include "cluster/auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

/* Every field of the mac's input has a fixed length (the job id padded
 * with zeros to its longest), so no two different inputs concatenate to
 * the same bytes. The label keeps these macs apart from any other use of
 * the same secret. */
static const char label[] = "gradsync rendezvous auth v2";
#define JOB_FIELD (GS_JOB_ID_MAX + 1)

int gs_auth_nonce(uint8_t nonce[GS_AUTH_NONCE])
{
	size_t got = 0;
	while (got < GS_AUTH_NONCE) {
		ssize_t n = getrandom(nonce + got, GS_AUTH_NONCE - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		got += (size_t)n;
	}
	return 0;
}

int gs_auth_mac(const uint8_t *key, size_t keylen, enum gs_auth_dir dir, const char *job_id,
		uint32_t node_rank, const uint8_t node_nonce[GS_AUTH_NONCE],
		const uint8_t coordinator_nonce[GS_AUTH_NONCE], uint8_t mac[GS_AUTH_MAC])
{
	uint8_t msg[sizeof(label) + 1 + 4 + JOB_FIELD + 2 * GS_AUTH_NONCE];
	size_t k = 0, idlen = strlen(job_id);
	if (idlen > GS_JOB_ID_MAX)
		return -EINVAL;
	memcpy(msg, label, sizeof(label)); /* with its '\0' */
	k += sizeof(label);
	msg[k++] = (uint8_t)dir;
	for (int i = 0; i < 4; i++)
		msg[k++] = (uint8_t)(node_rank >> (8 * i)); /* little-endian */
	memset(msg + k, 0, JOB_FIELD);
	memcpy(msg + k, job_id, idlen);
	k += JOB_FIELD;
	memcpy(msg + k, node_nonce, GS_AUTH_NONCE);
	k += GS_AUTH_NONCE;
	memcpy(msg + k, coordinator_nonce, GS_AUTH_NONCE);
	k += GS_AUTH_NONCE;
	unsigned int out = 0;
	if (keylen > INT32_MAX ||
	    !HMAC(EVP_sha256(), key, (int)keylen, msg, k, mac, &out) || out != GS_AUTH_MAC)
		return -EIO;
	return 0;
}

bool gs_auth_check(const uint8_t *key, size_t keylen, enum gs_auth_dir dir, const char *job_id,
		   uint32_t node_rank, const uint8_t node_nonce[GS_AUTH_NONCE],
		   const uint8_t coordinator_nonce[GS_AUTH_NONCE], const uint8_t *mac, size_t len)
{
	uint8_t want[GS_AUTH_MAC];
	if (len != GS_AUTH_MAC ||
	    gs_auth_mac(key, keylen, dir, job_id, node_rank, node_nonce, coordinator_nonce, want) < 0)
		return false;
	bool ok = CRYPTO_memcmp(want, mac, GS_AUTH_MAC) == 0;
	gs_secret_wipe(want, sizeof(want));
	return ok;
}
