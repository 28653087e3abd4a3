/*
 * The names and descriptions of gradsync's error codes, from the one
 * X-macro map in gradsync.h. Shared by the daemon (for its Error messages
 * and logs) and libgradsync (which exports them).
 */
#include "gradsync.h"

__attribute__((visibility("default"))) const char *gs_strerror(int code)
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

__attribute__((visibility("default"))) const char *gs_err_name(int code)
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
