/*
 * The admission queue (admission.h): a list in arrival order, a count,
 * and a timer per entry.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>

#include "cluster/admission.h"

void gs_admission_init(struct gs_admission *q, uv_loop_t *loop, unsigned limit,
		       uint64_t deadline_ms, gs_admission_fn expired, gs_admission_fn released)
{
	memset(q, 0, sizeof(*q));
	q->loop = loop;
	q->limit = limit > 0 ? limit : 1;
	q->deadline_ms = deadline_ms;
	q->expired = expired;
	q->released = released;
}

/* The same host (the port aside). */
static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
	return false;
}

struct gs_admission_entry *gs_admission_victim(const struct gs_admission *q,
					       const struct sockaddr_storage *from)
{
	if (q->count < q->limit)
		return NULL;
	struct gs_admission_entry *own = NULL;
	unsigned same = 0;
	for (struct gs_admission_entry *e = q->oldest; e; e = e->next)
		if (same_host(&e->from, from) && same++ == 0)
			own = e;
	return own && 2 * same >= q->count ? own : q->oldest;
}

static void unlink_entry(struct gs_admission_entry *e)
{
	struct gs_admission *q = e->queue;
	if (e->prev)
		e->prev->next = e->next;
	else
		q->oldest = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		q->newest = e->prev;
	e->prev = e->next = NULL;
	e->queue = NULL;
	q->count--;
}

static void on_deadline(uv_timer_t *t)
{
	struct gs_admission_entry *e = t->data;
	gs_admission_fn expired = e->queue->expired;
	gs_admission_remove(e);
	expired(e);
}

int gs_admission_add(struct gs_admission *q, struct gs_admission_entry *e,
		     const struct sockaddr_storage *from, void *owner)
{
	if (q->count >= q->limit)
		return -ENOSPC;
	e->queue = q;
	e->from = *from;
	e->owner = owner;
	e->released = q->released;
	e->prev = q->newest;
	e->next = NULL;
	if (q->newest)
		q->newest->next = e;
	else
		q->oldest = e;
	q->newest = e;
	q->count++;
	uv_timer_init(q->loop, &e->deadline);
	e->deadline.data = e;
	uv_timer_start(&e->deadline, on_deadline, q->deadline_ms, 0);
	return 0;
}

static void on_closed(uv_handle_t *h)
{
	struct gs_admission_entry *e = h->data;
	e->released(e);
}

void gs_admission_remove(struct gs_admission_entry *e)
{
	if (!e->queue)
		return;
	unlink_entry(e);
	uv_timer_stop(&e->deadline);
	uv_close((uv_handle_t *)&e->deadline, on_closed);
}
