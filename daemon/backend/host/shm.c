#include "backend/host/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "backend/host/shm_guard.h"
#include "errors.h"

/* The filesystem decides whether pages can vanish, whatever the name
 * says: a memfd lives on the kernel's internal tmpfs (shmem), where a
 * shrink is sealed and a read of a punched hole finds a page again, or,
 * made with MFD_HUGETLB, on hugetlbfs, where a hole punched while the
 * pool of huge pages is used up makes the daemon's next access fault.
 * On success *page is the size of the file's pages. */
static int check_filesystem(int fd, bool allow_hugetlb, size_t *page, char *err, size_t errlen)
{
	struct statfs fs;
	if (fstatfs(fd, &fs) < 0) {
		snprintf(err, errlen, "fstatfs: %s", strerror(errno));
		return GS_EBUFFER;
	}
	*page = (size_t)fs.f_bsize;
	if (fs.f_type == TMPFS_MAGIC)
		return GS_OK;
	if (fs.f_type == HUGETLBFS_MAGIC && allow_hugetlb)
		return GS_OK;
	if (fs.f_type == HUGETLBFS_MAGIC)
		snprintf(err, errlen, "memfd is on hugetlbfs (MFD_HUGETLB), whose pages can vanish under gradsyncd; use memfd_create without MFD_HUGETLB, or start gradsyncd with --allow-hugetlb=yes");
	else
		snprintf(err, errlen, "descriptor is not a memfd: it is on a filesystem of type 0x%llx, not tmpfs, where memfds live",
			 (unsigned long long)fs.f_type);
	return GS_EBUFFER;
}

static int check_seals_and_size(int fd, uint64_t size, char *err, size_t errlen)
{
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
	return GS_OK;
}

int gs_shm_map(int fd, uint64_t size, bool allow_hugetlb, void **addr, char *err, size_t errlen)
{
	size_t page = 0;
	if (size == 0 || size > (uint64_t)SIZE_MAX / 2) {
		snprintf(err, errlen, "buffer size %llu is out of range",
			 (unsigned long long)size);
		return GS_EBUFFER;
	}
	int rc = check_filesystem(fd, allow_hugetlb, &page, err, errlen);
	if (rc == GS_OK)
		rc = check_seals_and_size(fd, size, err, errlen);
	if (rc != GS_OK)
		return rc;
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		snprintf(err, errlen, "mmap of %llu bytes: %s",
			 (unsigned long long)size, strerror(errno));
		return GS_EBUFFER;
	}
	/* The mapping covers whole pages of the file (huge ones on
	 * hugetlbfs): the guard covers, and unmap undoes, all of it. */
	size_t len = page > 1 ? (size + page - 1) / page * page : size;
	if (gs_shm_guard_add(p, len) < 0) {
		munmap(p, len);
		snprintf(err, errlen, "gradsyncd already guards as many shared-memory buffers as --max-mappings allows");
		return GS_ELIMIT;
	}
	*addr = p;
	return GS_OK;
}

void gs_shm_unmap(void *addr, uint64_t size)
{
	if (!addr)
		return;
	size_t len = gs_shm_guard_remove(addr);
	munmap(addr, len ? len : size);
}
