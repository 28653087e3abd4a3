#include "hostport.h"

#include <errno.h>
#include <string.h>

int gs_parse_host_port(const char *text, char *host, size_t hostlen, char *port,
		       size_t portlen)
{
	const char *colon = strrchr(text, ':');
	if (!colon || colon == text || !colon[1])
		return -EINVAL;
	size_t h = (size_t)(colon - text);
	if (text[0] == '[' && h >= 2 && text[h - 1] == ']') { /* [::1]:29500 */
		text++;
		h -= 2;
	}
	if (h == 0 || h >= hostlen || strlen(colon + 1) >= portlen)
		return -EINVAL;
	memcpy(host, text, h);
	host[h] = '\0';
	strcpy(port, colon + 1);
	return 0;
}
