/*
 * What lets two processes share emulated device memory and events: a
 * memfd per object, named in a handle by its owner's pid, descriptor and
 * inode, and reopened through /proc (same user, as CUDA IPC is per node).
 * The inode check makes a handle of a freed object fail even when its
 * descriptor number has been reused.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

int emu_open_remote_fd(int32_t pid, int32_t fd, uint64_t ino)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0)
		return -1;
	struct stat st;
	if (fstat(f, &st) < 0 || (uint64_t)st.st_ino != ino) {
		close(f);
		return -1;
	}
	return f;
}

/* Not FUTEX_PRIVATE: the word may be in memory shared with other processes. */
void emu_futex_wait(_Atomic uint32_t *word, uint32_t seen, long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

void emu_futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
