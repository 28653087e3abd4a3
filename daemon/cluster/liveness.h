/*
 * Liveness between daemons (gradsync.proto's Ping): each end of a
 * rendezvous connection pings the other every quarter of its own
 * --peer-timeout and takes --peer-timeout of silence as the other's loss.
 * TCP keepalive and TCP_USER_TIMEOUT, derived from the same setting, bound
 * what the kernel waits for too: a connection whose data goes
 * unacknowledged, or that is idle and unanswered, fails by itself. Only
 * the pings see a proxy or middlebox that stops forwarding while its own
 * TCP stack stays up.
 */
#ifndef GS_LIVENESS_H
#define GS_LIVENESS_H

#include <stdint.h>

#include "gradsync.pb-c.h"

/* How often this end pings: a quarter of --peer-timeout (250 ms at
 * least, as the setting is whole seconds). */
static inline uint64_t gs_ping_interval_ms(uint64_t peer_timeout_s)
{
	return peer_timeout_s * 250u;
}

/* The longest a second claim to a node rank waits for its holder's Pong:
 * --peer-timeout, but no more than 5 s (a live daemon answers at once). */
static inline uint64_t gs_probe_ms(uint64_t peer_timeout_s)
{
	return peer_timeout_s < 5 ? peer_timeout_s * 1000u : 5000u;
}

/* SO_KEEPALIVE with its idle time, interval and count, and
 * TCP_USER_TIMEOUT, so that the kernel gives up on the peer within about
 * --peer-timeout. Best effort: returns 0 or -errno of the first that
 * failed, having set the others. */
int gs_tcp_liveness(int fd, uint64_t peer_timeout_s);

/* A Ping or a Pong, ready to send as .m. */
struct gs_liveness_msg {
	Gradsync__Message m;
	Gradsync__Ping ping;
	Gradsync__Pong pong;
};

void gs_liveness_ping(struct gs_liveness_msg *out, uint64_t seq);
void gs_liveness_pong(struct gs_liveness_msg *out, uint64_t seq);

#endif
