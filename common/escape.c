#include "escape.h"

#include <stdbool.h>
#include <string.h>

static bool printable(unsigned char ch)
{
	return ch >= 0x20 && ch <= 0x7e;
}

const char *gs_escape(const char *text, char *out, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	if (n == 0)
		return out;
	size_t k = 0;
	const unsigned char *p = (const unsigned char *)text;
	for (; *p; p++) {
		size_t need = printable(*p) ? 1 : 4;
		if (k + need >= n)
			break;
		if (need == 1) {
			out[k++] = (char)*p;
			continue;
		}
		out[k++] = '\\';
		out[k++] = 'x';
		out[k++] = hex[*p >> 4];
		out[k++] = hex[*p & 15];
	}
	if (*p && n > 3) {
		/* Cut: room for "..." is made by dropping whole characters,
		 * never part of an escape. */
		while (k + 3 >= n) {
			bool escape = k >= 4 && out[k - 4] == '\\' && out[k - 3] == 'x';
			k -= escape ? 4 : 1;
		}
		memcpy(out + k, "...", 3);
		k += 3;
	}
	out[k] = '\0';
	return out;
}
