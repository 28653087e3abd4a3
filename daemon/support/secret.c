#include "support/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

/* Reads at most cap bytes of fd; returns the count or -errno. */
static ssize_t read_all(int fd, uint8_t *buf, size_t cap)
{
	size_t got = 0;
	while (got < cap) {
		ssize_t n = read(fd, buf + got, cap - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static int check_file(int fd, char *why, size_t whylen)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int err = errno;
		snprintf(why, whylen, "%s", strerror(err));
		return -err;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, whylen, "not a regular file");
		return -EINVAL;
	}
	unsigned mode = (unsigned)st.st_mode & 07777;
	if (mode & ~0600u) {
		snprintf(why, whylen, "its mode is %04o: a secret must be readable by its owner alone "
			 "(mode 0600 or 0400; chmod 600 it)", mode);
		return -EACCES;
	}
	return 0;
}

int gs_secret_load(const char *path, uint8_t *key, size_t *len, char *why, size_t whylen)
{
	*len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		int err = errno;
		snprintf(why, whylen, "cannot open it: %s", strerror(err));
		return -err;
	}
	int r = check_file(fd, why, whylen);
	if (r < 0)
		goto out;
	/* One byte more than the limit, and two for a trailing "\r\n". */
	uint8_t buf[GS_SECRET_MAX + 3];
	ssize_t n = read_all(fd, buf, sizeof(buf));
	if (n < 0) {
		r = (int)n;
		snprintf(why, whylen, "cannot read it: %s", strerror((int)-n));
		goto out;
	}
	size_t k = (size_t)n;
	if (k > 0 && buf[k - 1] == '\n')
		k--;
	if (k > 0 && (size_t)n > k && buf[k - 1] == '\r')
		k--;
	if (k < GS_SECRET_MIN || k > GS_SECRET_MAX) {
		snprintf(why, whylen, "it holds %s%zu bytes of secret; %d to %d are needed "
			 "(for example: head -c 32 /dev/urandom | base64 > FILE)",
			 k > GS_SECRET_MAX ? "more than " : "", k > GS_SECRET_MAX ? (size_t)GS_SECRET_MAX : k,
			 GS_SECRET_MIN, GS_SECRET_MAX);
		r = -EINVAL;
	} else {
		memcpy(key, buf, k);
		*len = k;
	}
	gs_secret_wipe(buf, sizeof(buf));
out:
	close(fd);
	return r;
}

void gs_secret_wipe(uint8_t *key, size_t len)
{
	OPENSSL_cleanse(key, len);
}
