#include "file_store.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "errors.h"

/* Keys become file names: refuse anything that could leave the directory. */
static int key_path(const char *dir, const char *key, char *path, size_t len)
{
	if (!key[0] || strchr(key, '/') || key[0] == '.')
		return GS_EINVAL;
	int n = snprintf(path, len, "%s/%s", dir, key);
	return n > 0 && (size_t)n < len ? GS_OK : GS_EINVAL;
}

/* Written under a temporary name and renamed, so a reader never sees half
 * a value. */
static int fs_set(void *ctx, const char *key, const void *value, size_t len)
{
	char path[4096], tmp[4200];
	if (key_path(ctx, key, path, sizeof(path)) < 0)
		return GS_EINVAL;
	snprintf(tmp, sizeof(tmp), "%s/.tmp.%s.%d", (const char *)ctx, key, (int)getpid());
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return GS_ESYSTEM;
	int ok = len == 0 || fwrite(value, 1, len, f) == len;
	ok &= fclose(f) == 0;
	if (!ok || rename(tmp, path) != 0) {
		unlink(tmp);
		return GS_ESYSTEM;
	}
	return GS_OK;
}

static int read_all(FILE *f, void **value, size_t *len)
{
	if (fseek(f, 0, SEEK_END) != 0)
		return GS_ESYSTEM;
	long size = ftell(f);
	rewind(f);
	char *buf = malloc(size > 0 ? (size_t)size : 1);
	if (size < 0 || !buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
		free(buf);
		return GS_ESYSTEM;
	}
	*value = buf;
	*len = (size_t)size;
	return GS_OK;
}

/* Polls every 2 ms: keys appear once per rank per group, so this is cheap. */
static int fs_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms)
{
	char path[4096];
	if (key_path(ctx, key, path, sizeof(path)) < 0)
		return GS_EINVAL;
	double deadline = gs_now_ms() + timeout_ms;
	for (;;) {
		FILE *f = fopen(path, "rb");
		if (f) {
			int rc = read_all(f, value, len);
			fclose(f);
			return rc;
		}
		if (errno != ENOENT)
			return GS_ESYSTEM;
		if (gs_now_ms() >= deadline)
			return GS_ETIMEDOUT;
		nanosleep(&(struct timespec){0, 2000000}, NULL);
	}
}

struct gs_gloo_store_ops file_store(const char *dir)
{
	return (struct gs_gloo_store_ops){(void *)dir, fs_set, fs_get};
}

char *file_store_dir_create(void)
{
	const char *base = getenv("TMPDIR");
	char tmpl[4096];
	snprintf(tmpl, sizeof(tmpl), "%s/gs-gloo-XXXXXX", base && base[0] ? base : "/tmp");
	return mkdtemp(tmpl) ? strdup(tmpl) : NULL;
}

void file_store_dir_remove(char *dir)
{
	if (!dir)
		return;
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4400];
	while (d && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
	free(dir);
}
