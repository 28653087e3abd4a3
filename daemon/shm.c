#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradsync.h"

/* memfds show in /proc as "/memfd:NAME (deleted)"; nothing else does. */
static int is_memfd(int fd)
{
	char path[64], target[256];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = '\0';
	return strncmp(target, "/memfd:", 7) == 0;
}

int gs_shm_map(int fd, uint64_t size, void **addr, char *err, size_t errlen)
{
	if (size == 0 || size > (uint64_t)SIZE_MAX) {
		snprintf(err, errlen, "buffer size %llu is out of range",
			 (unsigned long long)size);
		return GS_EBUFFER;
	}
	if (!is_memfd(fd)) {
		snprintf(err, errlen, "descriptor is not a memfd");
		return GS_EBUFFER;
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		snprintf(err, errlen, "memfd is not sealed against shrinking (F_SEAL_SHRINK)");
		return GS_EBUFFER;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "fstat: %s", strerror(errno));
		return GS_EBUFFER;
	}
	if ((uint64_t)st.st_size < size) {
		snprintf(err, errlen, "memfd holds %lld bytes, %llu claimed",
			 (long long)st.st_size, (unsigned long long)size);
		return GS_EBUFFER;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		snprintf(err, errlen, "mmap of %llu bytes: %s",
			 (unsigned long long)size, strerror(errno));
		return GS_EBUFFER;
	}
	*addr = p;
	return GS_OK;
}

void gs_shm_unmap(void *addr, uint64_t size)
{
	if (addr)
		munmap(addr, size);
}
