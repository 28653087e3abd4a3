/*
 * The cluster secret that authenticates the rendezvous between the daemons
 * of a job (--cluster-secret-file), and the challenge-response both ends
 * of a rendezvous connection run before anything else:
 *
 *   node -> coordinator   NodeAuth (protocol version, job id, node rank, nonce N)
 *   coordinator -> node   NodeChallenge (nonce C)
 *   node -> coordinator   NodeProof (mac of GS_AUTH_NODE)
 *   coordinator -> node   NodeProof (mac of GS_AUTH_COORDINATOR)
 *
 * Each mac is HMAC-SHA256, keyed with the secret, over a fixed label, the
 * sender's direction, the node rank, the job id and both nonces, so that a
 * proof is good for one connection, one direction, one job and one rank
 * only. The node
 * proves first; the coordinator proves only to a node that has.
 */
#ifndef GS_AUTH_H
#define GS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_protocol.h"
#include "support/secret.h"

#define GS_AUTH_NONCE 32
#define GS_AUTH_MAC 32

/* Who sends a proof: the joining node or the coordinator (node rank 0's
 * rendezvous server). */
enum gs_auth_dir { GS_AUTH_NODE = 1, GS_AUTH_COORDINATOR = 2 };

/* Fills nonce with fresh random bytes (getrandom). Returns 0 or -errno. */
int gs_auth_nonce(uint8_t nonce[GS_AUTH_NONCE]);

/* The proof that dir's side holds key, for this job (at most
 * GS_JOB_ID_MAX bytes), rank and these nonces (the node's first). Returns
 * 0, -EINVAL for a longer job id, or -EIO if libcrypto fails. */
int gs_auth_mac(const uint8_t *key, size_t keylen, enum gs_auth_dir dir, const char *job_id,
		uint32_t node_rank, const uint8_t node_nonce[GS_AUTH_NONCE],
		const uint8_t coordinator_nonce[GS_AUTH_NONCE], uint8_t mac[GS_AUTH_MAC]);

/* Whether mac (len bytes, from the peer) is dir's proof for key, job,
 * rank and nonces; compared in constant time. */
bool gs_auth_check(const uint8_t *key, size_t keylen, enum gs_auth_dir dir, const char *job_id,
		   uint32_t node_rank, const uint8_t node_nonce[GS_AUTH_NONCE],
		   const uint8_t coordinator_nonce[GS_AUTH_NONCE], const uint8_t *mac, size_t len);

#endif
