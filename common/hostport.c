#include "hostport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Interface names are at most 15 bytes (IFNAMSIZ - 1). */
#define ZONE_MAX 15

static int refuse(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

/* An IPv6 address of len bytes at text, with an optional %zone. */
static bool ipv6(const char *text, size_t len)
{
	char addr[INET6_ADDRSTRLEN + ZONE_MAX + 2];
	struct in6_addr a;
	if (len >= sizeof(addr))
		return false;
	memcpy(addr, text, len);
	addr[len] = '\0';
	char *zone = strchr(addr, '%');
	if (zone) {
		*zone++ = '\0';
		size_t z = strlen(zone);
		if (z == 0 || z > ZONE_MAX)
			return false;
		for (size_t i = 0; i < z; i++)
			if (!name_char(zone[i]) && zone[i] != '.')
				return false;
	}
	return inet_pton(AF_INET6, addr, &a) == 1;
}

/* A port after a host: ":" and digits to the end. */
static bool port_follows(const char *p)
{
	if (*p++ != ':' || !*p)
		return false;
	return strspn(p, "0123456789") == strlen(p);
}

/* "[v6]", "[v6]:port" and stray brackets. */
static int check_brackets(const char *text, char *why, size_t n)
{
	const char *close = strchr(text, ']');
	if (text[0] != '[' || !close)
		return refuse(why, n, "has an unmatched bracket: only an IPv6 address goes in brackets, as [::1]");
	if (!ipv6(text + 1, (size_t)(close - text - 1)))
		return refuse(why, n, "is not an IPv6 address in brackets");
	if (port_follows(close + 1))
		return refuse(why, n, "has a port ('%.8s'): give the host alone; the port is gradsyncd's --node-port, the same on every node",
			      close + 1);
	if (close[1])
		return refuse(why, n, "has more after the brackets of its IPv6 address");
	return 0;
}

/* A DNS name, or an IPv4 address when its last label is a number. */
static int check_name(const char *text, char *why, size_t n)
{
	size_t len = strlen(text);
	if (text[len - 1] == '.')
		len--; /* the absolute form, "node0.example." */
	const char *p = text, *end = text + len;
	bool numeric;
	for (;;) {
		const char *dot = memchr(p, '.', (size_t)(end - p));
		if (!dot)
			dot = end;
		if (dot == p)
			return refuse(why, n, "has an empty label (a dot at its start or two in a row)");
		if (dot - p > 63)
			return refuse(why, n, "has a label longer than 63 bytes");
		if (p[0] == '-' || dot[-1] == '-')
			return refuse(why, n, "has a label that starts or ends with '-'");
		numeric = true;
		for (const char *q = p; q < dot; q++) {
			/* Only printable ASCII is left to meet here. */
			if (!name_char(*q))
				return refuse(why, n, "has '%c', which no host name or address has (letters, digits, '-', '_' and dots)",
					      *q);
			numeric = numeric && *q >= '0' && *q <= '9';
		}
		if (dot == end)
			break;
		p = dot + 1;
	}
	/* getaddrinfo reads "127.1" and "0x7f.0.0.1" as IPv4 addresses:
	 * a name that looks like one must be a plain one. */
	struct in_addr a;
	if (numeric && inet_pton(AF_INET, text, &a) != 1)
		return refuse(why, n, "is not an IPv4 address (four numbers 0 to 255, as 10.0.0.1)");
	return 0;
}

int gs_host_check(const char *text, char *why, size_t n)
{
	size_t len = strlen(text);
	if (len == 0)
		return refuse(why, n, "is empty");
	if (len > GS_HOST_MAX)
		return refuse(why, n, "is %zu bytes long, more than the %d of a host name", len,
			      GS_HOST_MAX);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)text[i];
		if (c <= 0x20 || c >= 0x7f)
			return refuse(why, n, "has a space, control or non-ASCII byte: a host name or address has none");
	}
	if (strstr(text, "://"))
		return refuse(why, n, "is a URL: give the host alone, without a scheme, path or port");
	if (strchr(text, '/'))
		return refuse(why, n, "has a path ('/'): give the host alone");
	if (strchr(text, '@'))
		return refuse(why, n, "has a user ('@'): give the host alone");
	if (strchr(text, '[') || strchr(text, ']'))
		return check_brackets(text, why, n);
	if (strchr(text, ':')) {
		if (ipv6(text, len))
			return 0;
		const char *colon = strchr(text, ':');
		if (colon == strrchr(text, ':') && port_follows(colon))
			return refuse(why, n, "has a port ('%.8s'): give the host alone; the port is gradsyncd's --node-port, the same on every node",
				      colon);
		return refuse(why, n, "has a ':' but is no IPv6 address");
	}
	return check_name(text, why, n);
}

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
