/*
 * The shared memory a registration hands to gradsyncd, for gradients
 * (tensors.c) and state (state.c) alike: a sealed memfd the library
 * creates, or a caller's memfd checked and mapped as the daemon will map
 * it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"

int gs__memfd_create(struct gs_client *c, uint64_t size, const char *what_for,
		     struct gs__buffer *out)
{
	const char *what = "memfd_create";
	int fd = memfd_create("gradsync", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto err;
	what = "ftruncate";
	if (ftruncate(fd, (off_t)size) < 0)
		goto err_fd;
	/* The daemon refuses memory that could shrink under it. */
	what = "sealing";
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto err_fd;
	what = "mmap";
	void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		goto err_fd;
	*out = (struct gs__buffer){ fd, true, addr, size };
	return GS_OK;

err_fd:;
	int err = errno;
	close(fd);
	errno = err;
err:
	return gs__fail(c, errno == ENOMEM ? GS_ENOMEM : GS_ESYSTEM,
		       "cannot create %" PRIu64 " bytes of shared memory for %s: %s: %s", size,
		       what_for, what, strerror(errno));
}

static int check_seals(struct gs_client *c, int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return gs__fail(c, GS_EBUFFER,
			       "fd %d is not a memfd that allows sealing: %s",
			       fd, strerror(errno));
	if (!(seals & F_SEAL_SHRINK))
		return gs__fail(c, GS_EBUFFER,
			       "memfd %d is not sealed against shrinking (F_SEAL_SHRINK)",
			       fd);
	int write_seals = F_SEAL_WRITE;
#ifdef F_SEAL_FUTURE_WRITE
	write_seals |= F_SEAL_FUTURE_WRITE;
#endif
	if (seals & write_seals)
		return gs__fail(c, GS_EBUFFER,
			       "memfd %d is sealed against writing, but gradsyncd writes into it",
			       fd);
	return GS_OK;
}

int gs__memfd_adopt(struct gs_client *c, int fd, struct gs__buffer *out)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return gs__fail(c, GS_EBUFFER, "fd %d is not an open memfd", fd);
	int r = check_seals(c, fd);
	if (r < 0)
		return r;
	void *addr = NULL;
	if (st.st_size > 0) {
		addr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
			    MAP_SHARED, fd, 0);
		if (addr == MAP_FAILED)
			return gs__fail(c, GS_ESYSTEM, "cannot map memfd %d: %s",
				       fd, strerror(errno));
	}
	*out = (struct gs__buffer){ fd, false, addr, (size_t)st.st_size };
	return GS_OK;
}

void gs__memfd_release(struct gs__buffer *b)
{
	if (b->addr)
		munmap(b->addr, b->size);
	if (b->owned)
		close(b->fd);
	b->addr = NULL;
}
