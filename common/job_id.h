/*
 * What a job id may hold, as gradsyncd accepts it and libgradsync checks
 * a launcher's before sending it: it goes into logs, status and other
 * nodes' messages, so printable ASCII (spaces allowed), at most
 * GS_JOB_ID_MAX bytes (client_protocol.h).
 */
#ifndef GS_JOB_ID_H
#define GS_JOB_ID_H

#include <stdbool.h>

/* Whether every byte of id is printable ASCII (0x20 to 0x7e). */
bool gs_job_id_printable(const char *id);

/* Whether id is a job id gradsyncd accepts: printable and not too long. */
bool gs_job_id_valid(const char *id);

#endif
