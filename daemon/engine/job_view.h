/*
 * A job's settings from its trainers' views (the shape and settings each
 * Hello sets): the first trainer's define the job, and every later
 * trainer's must agree with them.
 */
#ifndef GS_ENGINE_JOB_VIEW_H
#define GS_ENGINE_JOB_VIEW_H

#include <stdbool.h>
#include <stddef.h>

#include "gradsync.pb-c.h"
#include "support/settings.h"

/* Whether the fields of h that have a form of their own, whatever the
 * job, are well formed: the coordinator is a host alone (a name or an
 * address, common/hostport.h), never "host:port", a URL or a path, which
 * the rendezvous could only fail to reach for --join-timeout. Returns 0,
 * or -1 with err naming the field, its variables and why ("job 'x': the
 * hello's coordinator (...) 'h:5' is not a host name or address: it has
 * a port ..."). */
int gs_hello_check(const char *id, const Gradsync__Hello *h, char *err, size_t n);

/* The settings of the job a first trainer's Hello h defines: the node's,
 * with the job's fields from h (defaults where h leaves them unset) and
 * the coordinator at h's host on the node port. Returns 0, or -1 with err
 * naming what is out of range ("job 'x': fusion buffer ... is outside
 * this node's ..."). */
int gs_job_settings_from_hello(const struct gs_settings *node, const char *id,
			       const Gradsync__Hello *h, struct gs_settings *out, char *err,
			       size_t n);

/* True when a field h sets differs from the job's settings s, with err
 * saying "job 'id': this trainer says threshold 1000, the job has 65536
 * (set by its first trainer)". Fields h leaves unset are not compared;
 * nor is the coordinator of a job of one node. */
bool gs_job_view_differs(const struct gs_settings *s, const char *id, const Gradsync__Hello *h,
			 char *err, size_t n);

#endif
