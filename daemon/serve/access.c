#include "serve/access.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "number.h"
#include "support/log.h"
#include "support/settings.h"

void gs_access_init(struct gs_access *a, const struct gs_settings *s)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->group, sizeof(a->group), "%s", s->group);
	if (s->group[0]) {
		struct group *g = getgrnam(s->group);
		if (g) {
			a->have_group = true;
			a->gid = g->gr_gid;
		} else {
			gs_warn("group '%s' does not exist: only root, uid %u and --allow-uids may connect",
				s->group, (unsigned)geteuid());
		}
	}
	char why[160];
	/* Checked at start (settings.c): cannot fail here. */
	if (gs_settings_allow_uids(s, a->uids, &a->nuids, why, sizeof(why)) < 0)
		a->nuids = 0;
}

static void protect_path(const char *path, mode_t mode, gid_t gid, bool have_group)
{
	if (have_group && chown(path, (uid_t)-1, gid) < 0)
		gs_warn("cannot give %s to its group: %s", path, strerror(errno));
	if (chmod(path, mode) < 0)
		gs_warn("cannot set the mode of %s: %s", path, strerror(errno));
}

void gs_access_protect(const struct gs_access *a, const char *socket_path,
		       bool made_dir)
{
	protect_path(socket_path, a->have_group ? 0660 : 0600, a->gid, a->have_group);
	if (!made_dir)
		return;
	char dir[256];
	snprintf(dir, sizeof(dir), "%s", socket_path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		protect_path(dir, a->have_group ? 0750 : 0700, a->gid, a->have_group);
	}
}

/* The peer's supplementary groups, as the kernel has them now. */
static bool process_in_group(pid_t pid, gid_t gid)
{
	char path[64], line[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool found = false;
	while (!found && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Groups:", 7) != 0)
			continue;
		for (const char *p = line + 7; *p && !found;) {
			uint64_t g;
			p += strspn(p, " \t");
			if (gs_parse_uint_prefix(p, &p, 0, UINT32_MAX, &g) < 0)
				break;
			found = (gid_t)g == gid;
		}
	}
	fclose(f);
	return found;
}

bool gs_access_privileged(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

bool gs_access_allowed(const struct gs_access *a, const struct ucred *peer,
		       char *why, size_t n)
{
	if (gs_access_privileged(peer->uid))
		return true;
	for (size_t i = 0; i < a->nuids; i++)
		if (a->uids[i] == peer->uid)
			return true;
	if (a->have_group && (peer->gid == a->gid || process_in_group(peer->pid, a->gid)))
		return true;
	struct passwd *pw = getpwuid(peer->uid);
	snprintf(why, n, "uid %u (%s, pid %d) may not use gradsyncd: not root, not in group '%s'%s, not in --allow-uids",
		 (unsigned)peer->uid, pw ? pw->pw_name : "unknown user", (int)peer->pid,
		 a->group, a->have_group ? "" : " (which does not exist)");
	return false;
}
