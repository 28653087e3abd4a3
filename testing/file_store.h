/*
 * A gs_gloo_store_ops backed by one file per key in a directory: what the
 * daemon's rendezvous will provide, done by the file system so that forked
 * test processes share it.
 */
#ifndef GS_TEST_FILE_STORE_H
#define GS_TEST_FILE_STORE_H

#include "backend/gloo/gloo_comm.h"

/* A store over dir (which must exist); the returned ops point at dir, which
 * must outlive them. */
struct gs_gloo_store_ops file_store(const char *dir);

/* A fresh, empty directory under $TMPDIR (or /tmp) for one group's store;
 * NULL on failure. Free with file_store_dir_remove, which deletes it and
 * the keys in it. */
char *file_store_dir_create(void);
void file_store_dir_remove(char *dir);

#endif
