/*
 * Who may talk to gradsyncd. The socket and its directory belong to the
 * service's group (--group) with no access for others; on top of the file
 * permissions, every connecting peer's credentials (SO_PEERCRED) are
 * checked and logged: root, the daemon's own user, members of the group and
 * the users of --allow-uids are let in, anyone else is refused.
 */
#ifndef GS_ACCESS_H
#define GS_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "support/settings.h"

struct gs_access {
	bool have_group;
	gid_t gid;
	char group[64];
	uid_t uids[GS_MAX_ALLOW_UIDS];
	size_t nuids;
};

/* Resolves --group and --allow-uids. Logs a warning when the group does
 * not exist (then only root, the daemon's user and --allow-uids). */
void gs_access_init(struct gs_access *a, const struct gs_settings *s);

/* Gives the socket (and a directory the daemon made for it) to the group:
 * 0660 and 0750, or 0600 and 0700 without a group. */
void gs_access_protect(const struct gs_access *a, const char *socket_path,
		       bool made_dir);

/* Root and gradsyncd's own user: let in always, and shown every job and
 * every connection in full (job.c, control.c). */
bool gs_access_privileged(uid_t uid);

/* Whether the peer may connect; if not, why names the user and the rule. */
bool gs_access_allowed(const struct gs_access *a, const struct ucred *peer,
		       char *why, size_t n);

#endif
