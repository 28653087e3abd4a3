/*
 * The step engine's way to a trainer's client, owned by the engine and
 * filled in by whoever holds the connection (control/session.c): the
 * engine sends messages and drops clients through it and knows nothing of
 * sockets or framing.
 *
 * Loop thread only. A client dropped with fail is gone before fail
 * returns: its trainer's gs_trainer_disconnected has run (the connection's
 * closed callback), and the trainer is freed later, from the loop.
 */
#ifndef GS_CLIENT_PORT_H
#define GS_CLIENT_PORT_H

#include <stddef.h>
#include <sys/types.h>

#include "gradsync.pb-c.h"

struct gs_client_ops {
	/* Queues one message to the client. */
	void (*send)(void *ctx, const Gradsync__Message *m);
	/* Sends an Error with code and message, logs it naming the client,
	 * and drops it (that client alone). */
	void (*fail)(void *ctx, int code, const char *message);
	/* Takes the next n descriptors that came with the client's frames.
	 * Returns 0, or -1 when fewer have come (*have: how many). */
	int (*take_fds)(void *ctx, int *fds, size_t n, size_t *have);
	/* The client's name for log lines ("pid 12 uid 1000 (local rank 0)"). */
	const char *(*name)(void *ctx);
};

struct gs_client {
	const struct gs_client_ops *ops;
	void *ctx; /* the holder's (its connection); NULL once the client is gone */
	pid_t pid;
	uid_t uid;
};

/* Formats the message and drops the client with it (ops->fail). */
void gs_client_fail(const struct gs_client *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
