/*
 * Error messages: the detail of the last failure lives in the handle, or
 * per thread while there is no handle yet. gs_strerror and gs_err_name
 * give the daemon's own names and descriptions (proto/errors.c, from the
 * one map in client_protocol.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "errors.h"
#include "escape.h"

static _Thread_local char thread_error[GS_ERRMSG_SIZE];

bool gs__err_known(int code)
{
	switch (code) {
#define GS_ERR_CASE(name, value, desc) case value:
		GS_ERRNO_MAP(GS_ERR_CASE)
#undef GS_ERR_CASE
		return true;
	}
	return false;
}

const char *gs_strerror(int code)
{
	return gs_error_desc(code);
}

const char *gs_err_name(int code)
{
	return gs_error_name(code);
}

const char *gs_last_error(const gs_client *c)
{
	return c ? c->error : thread_error;
}

static void vfail(struct gs_client *c, const char *fmt, va_list ap)
	GS_PRINTF(2, 0);

/* The message escaped whole, whatever its arguments hold (a value from
 * the environment, the daemon's words): the caller may print it. */
static void vfail(struct gs_client *c, const char *fmt, va_list ap)
{
	char raw[GS_ERRMSG_SIZE];
	vsnprintf(raw, sizeof(raw), fmt, ap);
	gs_escape(raw, c ? c->error : thread_error, GS_ERRMSG_SIZE);
}

int gs__fail(struct gs_client *c, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, fmt, ap);
	va_end(ap);
	return code;
}

int gs__fail_dead(struct gs_client *c, int code, const char *fmt, ...)
{
	/* Only the first reason counts (a daemon's Error, then its close):
	 * what follows is its consequence. */
	if (c->dead)
		return gs__dead_error(c);
	va_list ap;
	va_start(ap, fmt);
	vfail(c, fmt, ap);
	va_end(ap);
	gs__end_session(c, code);
	return code;
}

void gs__end_session(struct gs_client *c, int code)
{
	if (c->dead)
		return;
	c->dead = true;
	c->dead_code = code;
	memcpy(c->dead_reason, c->error, sizeof(c->dead_reason));
}

int gs__dead_error(struct gs_client *c)
{
	memcpy(c->error, c->dead_reason, sizeof(c->error));
	return c->dead_code;
}

int gs__check_alive(struct gs_client *c)
{
	if (!c->dead)
		return GS_OK;
	return gs__fail(c, GS_EDISCONNECTED,
		       "the session with gradsyncd has ended: %s",
		       c->dead_reason);
}

void gs__doing(struct gs_client *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->doing, sizeof(c->doing), fmt, ap);
	va_end(ap);
}
