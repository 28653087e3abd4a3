#include "job_id.h"

#include <string.h>

#include "client_protocol.h"

bool gs_job_id_printable(const char *id)
{
	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			return false;
	return true;
}

bool gs_job_id_valid(const char *id)
{
	return gs_job_id_printable(id) && strlen(id) <= GS_JOB_ID_MAX;
}
