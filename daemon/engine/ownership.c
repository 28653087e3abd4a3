#include "engine/ownership.h"

#include "support/settings.h"

bool gs_owner_admits(uid_t owner, int job_access, uid_t uid)
{
	return uid == owner || uid == 0 || job_access == GS_JOB_ACCESS_ANY;
}
