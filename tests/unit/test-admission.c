/*
 * The admission queue (daemon/cluster/admission.c) on a real uv loop with
 * real timers: the limit, whom a newcomer displaces, deadlines that pass
 * in arrival order, removal, and the release of each entry's timer. The
 * loop runs until it has nothing left to do; no test sleeps.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/admission.h"

#define MAX_RECORDS 8

/* An owner's record, as the node port's and the rendezvous's are. */
struct record {
	struct gs_admission_entry entry;
	unsigned index;
};

struct fixture {
	uv_loop_t loop;
	struct gs_admission q;
	struct record records[MAX_RECORDS];
	unsigned expired[MAX_RECORDS], nexpired;   /* indexes, in callback order */
	unsigned released[MAX_RECORDS], nreleased;
	bool expired_had_left; /* each entry had left the queue when told */
};

static struct fixture *the_fixture;

static void on_expired(struct gs_admission_entry *e)
{
	struct record *r = e->owner;
	struct fixture *f = the_fixture;
	if (e->queue != NULL)
		f->expired_had_left = false;
	f->expired[f->nexpired++] = r->index;
}

static void on_released(struct gs_admission_entry *e)
{
	struct record *r = e->owner;
	struct fixture *f = the_fixture;
	f->released[f->nreleased++] = r->index;
}

static struct fixture *fixture_open(unsigned limit, uint64_t deadline_ms)
{
	static struct fixture f;
	memset(&f, 0, sizeof(f));
	assert_int_equal(uv_loop_init(&f.loop), 0);
	gs_admission_init(&f.q, &f.loop, limit, deadline_ms, on_expired, on_released);
	f.expired_had_left = true;
	for (unsigned i = 0; i < MAX_RECORDS; i++)
		f.records[i].index = i;
	the_fixture = &f;
	return &f;
}

/* Runs the loop until every timer has fired or closed. */
static void fixture_close(struct fixture *f)
{
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
}

static struct sockaddr_storage ipv4(const char *host, uint16_t port)
{
	struct sockaddr_storage a;
	memset(&a, 0, sizeof(a));
	struct sockaddr_in *in = (struct sockaddr_in *)&a;
	in->sin_family = AF_INET;
	in->sin_port = htons(port);
	assert_int_equal(inet_pton(AF_INET, host, &in->sin_addr), 1);
	return a;
}

static struct sockaddr_storage ipv6(const char *host, uint16_t port)
{
	struct sockaddr_storage a;
	memset(&a, 0, sizeof(a));
	struct sockaddr_in6 *in = (struct sockaddr_in6 *)&a;
	in->sin6_family = AF_INET6;
	in->sin6_port = htons(port);
	assert_int_equal(inet_pton(AF_INET6, host, &in->sin6_addr), 1);
	return a;
}

static void add(struct fixture *f, unsigned i, const struct sockaddr_storage *from)
{
	assert_int_equal(gs_admission_add(&f->q, &f->records[i].entry, from, &f->records[i]), 0);
}

/* The queue's entries, oldest first, as record indexes; returns the count. */
static unsigned order(const struct fixture *f, unsigned *out)
{
	unsigned n = 0;
	for (const struct gs_admission_entry *e = f->q.oldest; e; e = e->next)
		out[n++] = ((const struct record *)e->owner)->index;
	return n;
}

static void test_limit(void **state)
{
	(void)state;
	struct fixture *f = fixture_open(3, 60000);
	struct sockaddr_storage hosts[6] = { ipv4("10.0.0.1", 1), ipv4("10.0.0.2", 1),
					     ipv4("10.0.0.3", 1), ipv4("10.0.0.4", 1),
					     ipv4("10.0.0.5", 1), ipv4("10.0.0.6", 1) };
	for (unsigned i = 0; i < 3; i++) {
		assert_null(gs_admission_victim(&f->q, &hosts[3]));
		add(f, i, &hosts[i]);
		assert_int_equal(f->q.count, i + 1);
	}
	/* Full: nothing more goes in until someone makes room. */
	assert_int_equal(gs_admission_add(&f->q, &f->records[3].entry, &hosts[3], &f->records[3]),
			 -ENOSPC);
	assert_null(f->records[3].entry.queue);
	assert_int_equal(f->q.count, 3);
	/* Hosts all differ: the oldest makes room, then the next oldest. */
	for (unsigned i = 0; i < 3; i++) {
		struct gs_admission_entry *v = gs_admission_victim(&f->q, &hosts[3 + i]);
		assert_ptr_equal(v, &f->records[i].entry);
		gs_admission_remove(v);
		add(f, 3 + i, &hosts[3 + i]);
	}
	unsigned got[MAX_RECORDS];
	assert_int_equal(order(f, got), 3);
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(got[i], 3 + i);
	for (unsigned i = 3; i < 6; i++)
		gs_admission_remove(&f->records[i].entry);
	fixture_close(f);
	assert_int_equal(f->nexpired, 0);
	assert_int_equal(f->nreleased, 6);
}

/* A host that holds half the places or more displaces its own oldest,
 * never an older entry of another host; ports do not make hosts differ. */
static void test_flood_displaces_itself(void **state)
{
	(void)state;
	struct fixture *f = fixture_open(4, 60000);
	struct sockaddr_storage node = ipv4("192.0.2.7", 40000);
	struct sockaddr_storage flood[3] = { ipv4("198.51.100.9", 1), ipv4("198.51.100.9", 2),
					     ipv4("198.51.100.9", 3) };
	add(f, 0, &node);
	add(f, 1, &flood[0]);
	add(f, 2, &flood[1]);
	struct sockaddr_storage v6 = ipv6("2001:db8::1", 9), v6_other_port = ipv6("2001:db8::1", 10);
	struct sockaddr_storage third = ipv4("203.0.113.5", 1);
	add(f, 3, &v6);
	/* The flood's host holds 2 of 4: its own oldest goes, not the node. */
	assert_ptr_equal(gs_admission_victim(&f->q, &flood[2]), &f->records[1].entry);
	/* A third host holds none: the oldest of all goes. */
	assert_ptr_equal(gs_admission_victim(&f->q, &third), &f->records[0].entry);
	/* The IPv6 host holds 1 of 4, another port of it as much. */
	assert_ptr_equal(gs_admission_victim(&f->q, &v6_other_port), &f->records[0].entry);
	for (unsigned i = 0; i < 4; i++)
		gs_admission_remove(&f->records[i].entry);
	fixture_close(f);
	assert_int_equal(f->nreleased, 4);
}

/* Deadlines pass in the order the entries came; each has left the queue
 * when its owner is told, and its timer is released after. */
static void test_deadline(void **state)
{
	(void)state;
	struct fixture *f = fixture_open(8, 5);
	struct sockaddr_storage a = ipv4("10.0.0.1", 1);
	for (unsigned i = 0; i < 4; i++)
		add(f, i, &a);
	fixture_close(f);
	assert_true(f->expired_had_left);
	assert_int_equal(f->nexpired, 4);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(f->expired[i], i);
	assert_int_equal(f->nreleased, 4);
	assert_int_equal(f->q.count, 0);
	assert_null(f->q.oldest);
	assert_null(f->q.newest);
}

/* A removed entry (let in, or closed) never expires; the others keep
 * their order; removing twice does nothing; the record is released only
 * once the loop has closed its timer. */
static void test_remove(void **state)
{
	(void)state;
	struct fixture *f = fixture_open(8, 5);
	struct sockaddr_storage a = ipv4("10.0.0.1", 1);
	for (unsigned i = 0; i < 5; i++)
		add(f, i, &a);
	gs_admission_remove(&f->records[2].entry); /* the middle */
	gs_admission_remove(&f->records[0].entry); /* the oldest */
	gs_admission_remove(&f->records[4].entry); /* the newest */
	gs_admission_remove(&f->records[4].entry);
	assert_int_equal(f->q.count, 2);
	unsigned got[MAX_RECORDS];
	assert_int_equal(order(f, got), 2);
	assert_int_equal(got[0], 1);
	assert_int_equal(got[1], 3);
	assert_ptr_equal(f->q.newest, &f->records[3].entry);
	assert_int_equal(f->nreleased, 0);
	fixture_close(f);
	assert_int_equal(f->nexpired, 2);
	assert_int_equal(f->expired[0], 1);
	assert_int_equal(f->expired[1], 3);
	assert_int_equal(f->nreleased, 5); /* each once */
	unsigned seen = 0;
	for (unsigned i = 0; i < f->nreleased; i++)
		seen |= 1u << f->released[i];
	assert_int_equal(seen, 0x1f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_limit),
		cmocka_unit_test(test_flood_displaces_itself),
		cmocka_unit_test(test_deadline),
		cmocka_unit_test(test_remove),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
