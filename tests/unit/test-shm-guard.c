/*
 * The fault guard over trainers' shared memory, in real processes: a memfd
 * mapped and registered, then truncated under the mapping, so that reading
 * and writing it raise a real SIGBUS. Each case runs in a child process of
 * its own (the guard's handler is process-wide) and the parent checks how
 * the child ended: an exit status naming the check that failed, or the
 * signal that killed it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/host/shm_guard.h"

/* Runs fn in a child; returns its wait status. The child leaves cmocka's
 * crash handlers (it must not report into the parent's run) and starts
 * from the default SIGBUS disposition, as gradsyncd does. */
static int in_child(int (*fn)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGBUS, SIG_DFL);
		signal(SIGSEGV, SIG_DFL);
		alarm(20); /* a fault handled without end never returns */
		_exit(fn());
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return status;
}

static void expect_exit_0(int status)
{
	if (WIFSIGNALED(status))
		fail_msg("the child was killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	if (WEXITSTATUS(status) != 0)
		fail_msg("the child's check %d failed", WEXITSTATUS(status));
}

static void expect_sigbus(int status)
{
	if (!WIFSIGNALED(status))
		fail_msg("the child survived (exit status %d); it should have died of SIGBUS",
			 WEXITSTATUS(status));
	assert_int_equal(WTERMSIG(status), SIGBUS);
}

/* Two pages of a memfd, mapped shared and filled with 0x5a. */
static char *map_memfd(int *fd, size_t *len)
{
	*len = 2 * (size_t)sysconf(_SC_PAGESIZE);
	*fd = memfd_create("shm-guard-test", MFD_CLOEXEC);
	if (*fd < 0 || ftruncate(*fd, (off_t)*len) < 0)
		return NULL;
	char *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x5a, *len);
	return p;
}

/* ---- A fault in a registered range ---------------------------------------- */

static int survive_registered(void)
{
	int fd;
	size_t len;
	if (gs_shm_guard_start(16) < 0)
		return 1;
	char *p = map_memfd(&fd, &len);
	if (!p || gs_shm_guard_add(p, len) < 0)
		return 2;
	if (gs_shm_guard_lost(p) || gs_shm_guard_lost_ranges() != 0 || gs_shm_guard_faults() != 0)
		return 3;
	/* The pages go: the next access faults. */
	if (ftruncate(fd, 0) < 0)
		return 4;
	volatile char *v = p;
	char first = v[0];
	v[len - 1] = 7;
	if (first != 0 || v[len - 1] != 7 || v[len / 2] != 0)
		return 5; /* anonymous memory over the whole range */
	if (!gs_shm_guard_lost(p + len - 1) || gs_shm_guard_lost_ranges() != 1)
		return 6;
	if (gs_shm_guard_faults() < 1)
		return 7;
	if (gs_shm_guard_remove(p) != len || gs_shm_guard_lost_ranges() != 0)
		return 8;
	munmap(p, len);
	gs_shm_guard_stop();
	return 0;
}

static void registered_range_survives(void **state)
{
	(void)state;
	expect_exit_0(in_child(survive_registered));
}

/* A fault on another thread, as on gradsyncd's worker and helpers. */
static void *read_first(void *arg)
{
	volatile char *v = arg;
	return (void *)(intptr_t)v[0];
}

static int survive_on_thread(void)
{
	int fd;
	size_t len;
	if (gs_shm_guard_start(16) < 0)
		return 1;
	char *p = map_memfd(&fd, &len);
	if (!p || gs_shm_guard_add(p, len) < 0 || ftruncate(fd, 0) < 0)
		return 2;
	pthread_t t;
	void *got = (void *)1;
	if (pthread_create(&t, NULL, read_first, p) != 0 || pthread_join(t, &got) != 0)
		return 3;
	return got == NULL && gs_shm_guard_lost(p) ? 0 : 4;
}

static void fault_on_another_thread(void **state)
{
	(void)state;
	expect_exit_0(in_child(survive_on_thread));
}

/* ---- Faults the guard must not swallow -------------------------------------- */

/* The guard hands these back to the previous disposition: the default, as
 * in gradsyncd (a sanitizer's handler would report and abort instead). */
static int start_over_default(void)
{
	return gs_shm_guard_start(16);
}

static int fault_unregistered(void)
{
	int fd;
	size_t len;
	if (start_over_default() < 0)
		return 1;
	char *mine = map_memfd(&fd, &len), *other = map_memfd(&fd, &len);
	if (!mine || !other || gs_shm_guard_add(mine, len) < 0)
		return 2;
	if (ftruncate(fd, 0) < 0) /* other's memfd */
		return 3;
	volatile char *v = other;
	return v[0] == 0 ? 4 : 5; /* never reached: SIGBUS */
}

static void unregistered_address_dies(void **state)
{
	(void)state;
	expect_sigbus(in_child(fault_unregistered));
}

static int fault_after_removal(void)
{
	int fd;
	size_t len;
	if (start_over_default() < 0)
		return 1;
	char *p = map_memfd(&fd, &len);
	if (!p || gs_shm_guard_add(p, len) < 0 || gs_shm_guard_remove(p) != len)
		return 2;
	if (ftruncate(fd, 0) < 0)
		return 3;
	volatile char *v = p;
	return v[0] == 0 ? 4 : 5;
}

static void removed_range_dies(void **state)
{
	(void)state;
	expect_sigbus(in_child(fault_after_removal));
}

static int sent_sigbus(void)
{
	int fd;
	size_t len;
	if (start_over_default() < 0)
		return 1;
	char *p = map_memfd(&fd, &len);
	if (!p || gs_shm_guard_add(p, len) < 0)
		return 2;
	/* si_addr of a sent signal is no address; it must not be covered. */
	kill(getpid(), SIGBUS);
	return 3;
}

static void sent_sigbus_kills(void **state)
{
	(void)state;
	expect_sigbus(in_child(sent_sigbus));
}

/* ---- The registry's capacity --------------------------------------------- */

static void capacity_is_bounded(void **state)
{
	(void)state;
	assert_int_equal(gs_shm_guard_start(3), 0);
	char a[3][4096];
	for (int i = 0; i < 3; i++)
		assert_int_equal(gs_shm_guard_add(a[i], sizeof(a[i])), 0);
	char extra[64];
	assert_int_equal(gs_shm_guard_add(extra, sizeof(extra)), -ENOSPC);
	assert_int_equal(gs_shm_guard_remove(a[1]), sizeof(a[1]));
	assert_int_equal(gs_shm_guard_remove(a[1]), 0);
	assert_int_equal(gs_shm_guard_add(extra, sizeof(extra)), 0);
	assert_false(gs_shm_guard_lost(extra));
	assert_int_equal(gs_shm_guard_remove(extra), sizeof(extra));
	assert_int_equal(gs_shm_guard_remove(a[0]), sizeof(a[0]));
	assert_int_equal(gs_shm_guard_remove(a[2]), sizeof(a[2]));
	gs_shm_guard_stop();
	/* Without the guard started, nothing is registered. */
	assert_int_equal(gs_shm_guard_add(extra, sizeof(extra)), 0);
	assert_int_equal(gs_shm_guard_remove(extra), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(registered_range_survives),
		cmocka_unit_test(fault_on_another_thread),
		cmocka_unit_test(unregistered_address_dies),
		cmocka_unit_test(removed_range_dies),
		cmocka_unit_test(sent_sigbus_kills),
		cmocka_unit_test(capacity_is_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
