#include "backend/host/shm_guard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The handler may only touch lock-free atomics. */
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "pointers must be lock-free atomics");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit integers must be lock-free atomics");

/* One registered mapping. The loop thread rewrites a slot inside an odd
 * seq (a seqlock), so a reader on another thread never takes a start of
 * one mapping with the length of another. */
struct range {
	_Atomic unsigned seq;
	_Atomic uintptr_t start;
	_Atomic size_t len; /* 0: the slot is free */
	_Atomic bool lost;
};

static struct range *ranges;
static size_t capacity;
static _Atomic size_t used;      /* slots [0, used) may be taken */
static size_t free_hint;         /* loop thread: no free slot below it */
static size_t remove_hint;       /* loop thread: where the last removal was */
static _Atomic unsigned lost_ranges;
static _Atomic uint64_t faults;
static struct sigaction previous;

/* ---- Reading the registry (any thread, the handler too) ----------------- */

/* A consistent start and length of slot r; false when it is free or kept
 * changing (the writer is another thread and finishes in nanoseconds). */
static bool snapshot(struct range *r, uintptr_t *start, size_t *len)
{
	for (int tries = 0; tries < 1000; tries++) {
		unsigned s = atomic_load(&r->seq);
		if (s & 1)
			continue;
		*start = atomic_load(&r->start);
		*len = atomic_load(&r->len);
		if (atomic_load(&r->seq) == s)
			return *len != 0;
	}
	return false;
}

static struct range *find(uintptr_t addr, uintptr_t *start, size_t *len)
{
	size_t n = atomic_load(&used);
	for (size_t i = 0; ranges && i < n; i++)
		if (snapshot(&ranges[i], start, len) && addr - *start < *len)
			return &ranges[i];
	return NULL;
}

/* ---- The handler --------------------------------------------------------- */

/* Puts anonymous memory over the registered range holding addr. A raw
 * system call: a sanitizer's mmap interceptor is no place to be in a
 * signal handler. */
static bool cover(uintptr_t addr)
{
	uintptr_t start;
	size_t len;
	struct range *r = find(addr, &start, &len);
	if (!r)
		return false;
	/* Another thread faulted here first and has covered it: retry. */
	if (atomic_load(&r->lost))
		return true;
	long p = syscall(SYS_mmap, start, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (p != (long)start)
		return false;
	if (!atomic_exchange(&r->lost, true))
		atomic_fetch_add(&lost_ranges, 1);
	atomic_fetch_add(&faults, 1);
	return true;
}

/* A fault in a client's range is covered and the access retried. Anything
 * else goes back to the previous disposition: a fault recurs there (and
 * kills the process, or reaches a sanitizer's report); a SIGBUS someone
 * sent is sent again. */
static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	(void)uctx;
	int saved = errno;
	bool fault = si->si_code > 0; /* SI_USER, SI_QUEUE, SI_TKILL are <= 0 */
	if (!(fault && cover((uintptr_t)si->si_addr))) {
		sigaction(sig, &previous, NULL);
		if (!fault)
			raise(sig);
	}
	errno = saved;
}

/* ---- Start and stop ------------------------------------------------------- */

int gs_shm_guard_start(size_t n)
{
	struct range *r = calloc(n, sizeof(*r));
	if (!r)
		return -ENOMEM;
	ranges = r;
	capacity = n;
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO };
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &previous) < 0) {
		int e = errno;
		ranges = NULL;
		capacity = 0;
		free(r);
		return -e;
	}
	return 0;
}

void gs_shm_guard_stop(void)
{
	if (!ranges)
		return;
	sigaction(SIGBUS, &previous, NULL);
	free(ranges);
	ranges = NULL;
	capacity = 0;
	atomic_store(&used, 0);
	free_hint = remove_hint = 0;
	atomic_store(&lost_ranges, 0);
}

/* ---- Adding and removing (loop thread) ------------------------------------ */

static void rewrite(struct range *r, uintptr_t start, size_t len)
{
	atomic_fetch_add(&r->seq, 1);
	atomic_store(&r->len, (size_t)0);
	if (atomic_exchange(&r->lost, false))
		atomic_fetch_sub(&lost_ranges, 1);
	atomic_store(&r->start, start);
	atomic_store(&r->len, len);
	atomic_fetch_add(&r->seq, 1);
}

int gs_shm_guard_add(void *addr, size_t len)
{
	if (!ranges)
		return 0;
	size_t i = free_hint;
	while (i < capacity && atomic_load(&ranges[i].len) != 0)
		i++;
	if (i == capacity)
		return -ENOSPC;
	rewrite(&ranges[i], (uintptr_t)addr, len);
	if (i >= atomic_load(&used))
		atomic_store(&used, i + 1);
	free_hint = i + 1;
	return 0;
}

/* The slot of the range starting at addr: looked for from where the last
 * removal was, since trainers give their buffers back in the order they
 * handed them over. */
static struct range *slot_of(uintptr_t addr)
{
	size_t n = atomic_load(&used);
	for (size_t k = 0; k < n; k++) {
		size_t i = (remove_hint + k) % n;
		if (atomic_load(&ranges[i].len) && atomic_load(&ranges[i].start) == addr) {
			remove_hint = i + 1;
			return &ranges[i];
		}
	}
	return NULL;
}

size_t gs_shm_guard_remove(void *addr)
{
	struct range *r = ranges ? slot_of((uintptr_t)addr) : NULL;
	if (!r)
		return 0;
	size_t len = atomic_load(&r->len);
	rewrite(r, 0, 0);
	size_t i = (size_t)(r - ranges);
	if (i < free_hint)
		free_hint = i;
	return len;
}

/* ---- Questions ------------------------------------------------------------ */

bool gs_shm_guard_lost(const void *addr)
{
	uintptr_t start;
	size_t len;
	struct range *r = find((uintptr_t)addr, &start, &len);
	return r && atomic_load(&r->lost);
}

unsigned gs_shm_guard_lost_ranges(void)
{
	return atomic_load(&lost_ranges);
}

uint64_t gs_shm_guard_faults(void)
{
	return atomic_load(&faults);
}
