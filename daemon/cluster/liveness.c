#include "cluster/liveness.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int set(int fd, int level, int name, int value)
{
	return setsockopt(fd, level, name, &value, sizeof(value)) < 0 ? -errno : 0;
}

int gs_tcp_liveness(int fd, uint64_t peer_timeout_s)
{
	/* Idle half the timeout, then three probes a sixth apart: about
	 * --peer-timeout in all. Unacknowledged data: --peer-timeout. */
	uint64_t t = peer_timeout_s > 86400 ? 86400 : peer_timeout_s;
	int idle = t / 2 ? (int)(t / 2) : 1;
	int intvl = t / 6 ? (int)(t / 6) : 1;
	int r[5] = {
		set(fd, SOL_SOCKET, SO_KEEPALIVE, 1),
		set(fd, IPPROTO_TCP, TCP_KEEPIDLE, idle),
		set(fd, IPPROTO_TCP, TCP_KEEPINTVL, intvl),
		set(fd, IPPROTO_TCP, TCP_KEEPCNT, 3),
		set(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, (int)(t * 1000)),
	};
	for (int i = 0; i < 5; i++)
		if (r[i] < 0)
			return r[i];
	return 0;
}

void gs_liveness_ping(struct gs_liveness_msg *out, uint64_t seq)
{
	gradsync__message__init(&out->m);
	gradsync__ping__init(&out->ping);
	out->ping.seq = seq;
	out->m.body_case = GRADSYNC__MESSAGE__BODY_PING;
	out->m.ping = &out->ping;
}

void gs_liveness_pong(struct gs_liveness_msg *out, uint64_t seq)
{
	gradsync__message__init(&out->m);
	gradsync__pong__init(&out->pong);
	out->pong.seq = seq;
	out->m.body_case = GRADSYNC__MESSAGE__BODY_PONG;
	out->m.pong = &out->pong;
}
