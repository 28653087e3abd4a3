/* The library's version, from meson's project version through gradsync.h. */
#include "client.h"

unsigned int gs_version(void)
{
	return GS_VERSION_HEX;
}
