/*
 * The names and descriptions of gradsync's error codes, generated from the
 * one X-macro map in client_protocol.h. Linked into the daemon and, with
 * hidden visibility, into libgradsync, whose gs_strerror and gs_err_name
 * (client/errors.c) return these.
 */
#include "errors.h"

const char *gs_error_desc(int code)
{
	switch (code) {
#define GS_ERR_DESC(name, value, desc)                                         \
	case value:                                                            \
		return desc;
		GS_ERRNO_MAP(GS_ERR_DESC)
#undef GS_ERR_DESC
	}
	return "unknown error";
}

const char *gs_error_name(int code)
{
	switch (code) {
#define GS_ERR_NAME(name, value, desc)                                         \
	case value:                                                            \
		return "GS_" #name;
		GS_ERRNO_MAP(GS_ERR_NAME)
#undef GS_ERR_NAME
	}
	return "GS_EUNKNOWN";
}
