/*
 * Admission: the connections that have not yet been let in (the node
 * port's, until they name their job; a rendezvous's, until they prove the
 * cluster secret), held in the order they came, each with a deadline.
 *
 * The queue is bounded, so that strangers who hold connections open, or
 * open them without end, cost bounded memory; and a newcomer to a full
 * queue displaces an earlier entry instead of being turned away, so that
 * such strangers can delay a node's join, which retries, but never keep
 * it out. The queue decides whom; its owner says the words and closes the
 * connection.
 */
#ifndef GS_ADMISSION_H
#define GS_ADMISSION_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

struct gs_admission;

/* One connection waiting, embedded in its owner's record. */
struct gs_admission_entry {
	struct gs_admission *queue; /* NULL: not waiting (never was, or has left) */
	struct gs_admission_entry *prev, *next; /* older, newer */
	struct sockaddr_storage from;
	uv_timer_t deadline;
	void *owner; /* the record it is embedded in, for the callbacks */
	/* The queue's, kept here: the queue may go before the timer closes. */
	void (*released)(struct gs_admission_entry *e);
};

typedef void (*gs_admission_fn)(struct gs_admission_entry *e);

struct gs_admission {
	uv_loop_t *loop;
	unsigned limit;
	uint64_t deadline_ms;
	unsigned count;
	struct gs_admission_entry *oldest, *newest;
	/* e's deadline passed: e has left the queue, and the owner refuses it. */
	gs_admission_fn expired;
	/* e's timer has closed after it left: the owner may free its record. */
	gs_admission_fn released;
};

/* An empty queue of at most limit entries (at least 1), each given
 * deadline_ms. */
void gs_admission_init(struct gs_admission *q, uv_loop_t *loop, unsigned limit,
		       uint64_t deadline_ms, gs_admission_fn expired, gs_admission_fn released);

/* Whom a newcomer from `from` must displace before it can be added:
 * NULL while there is room. Else the oldest entry of the newcomer's own
 * host when that host holds half the entries or more (a flood from one
 * host then displaces only itself, never a node joining from elsewhere),
 * or else the oldest of all. The caller refuses it, which removes it. */
struct gs_admission_entry *gs_admission_victim(const struct gs_admission *q,
					       const struct sockaddr_storage *from);

/* Adds e, owned by owner, as the newest entry and starts its deadline.
 * Returns 0, or -ENOSPC when the queue is full (refuse
 * gs_admission_victim's choice first). */
int gs_admission_add(struct gs_admission *q, struct gs_admission_entry *e,
		     const struct sockaddr_storage *from, void *owner);

/* e leaves the queue (let in, or its connection closed): its deadline
 * stops, and released follows once its timer has closed. Does nothing
 * when e is not waiting, so every path that ends a connection may call it. */
void gs_admission_remove(struct gs_admission_entry *e);

#endif
