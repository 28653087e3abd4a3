/*
 * Whether a trainer's view of its job (the shape and settings its Hello
 * sets) differs from the job's.
 */
#ifndef GS_ENGINE_JOB_VIEW_H
#define GS_ENGINE_JOB_VIEW_H

#include <stdbool.h>
#include <stddef.h>

#include "gradsync.pb-c.h"
#include "support/settings.h"

/* True when a field h sets differs from the job's (today: s, gradsyncd's
 * flags), with err saying "job 'id': this trainer says threshold 1000, the
 * job has 65536 (gradsyncd's --threshold)". Fields h leaves unset are not
 * compared; nor is the coordinator of a job of one node. */
bool gs_job_view_differs(const struct gs_settings *s, const char *id, const Gradsync__Hello *h,
			 char *err, size_t n);

#endif
