#include "options.h"

#include <getopt.h>
#include <stdlib.h>

#include "bench.h"

/* getopt_long's value for opts[i]: above any character, so never 'h' or '?'. */
#define FIRST_VAL 256

static int read_one(const struct bench_option *o, char *arg)
{
	unsigned long v;
	switch (o->kind) {
	case BENCH_OPTION_UINT:
		if (bench_parse_uint(arg, o->min, o->max, &v) < 0)
			return -1;
		*(unsigned *)o->to = (unsigned)v;
		return 0;
	case BENCH_OPTION_STRING:
		*(const char **)o->to = arg;
		return 0;
	case BENCH_OPTION_FLAG:
		*(bool *)o->to = true;
		return 0;
	case BENCH_OPTION_PARSE:
		return o->parse(arg, o->to) != 0 ? -1 : 0;
	}
	return -1;
}

int bench_options_parse(int argc, char **argv, const struct bench_option *opts)
{
	size_t n = 0;
	while (opts[n].name)
		n++;
	struct option *longopts = calloc(n + 2, sizeof(*longopts));
	if (!longopts)
		return -1;
	for (size_t i = 0; i < n; i++)
		longopts[i] = (struct option){opts[i].name,
					      opts[i].kind == BENCH_OPTION_FLAG ? no_argument
										: required_argument,
					      NULL, FIRST_VAL + (int)i};
	longopts[n] = (struct option){"help", no_argument, NULL, 'h'};
	int opt, rc = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (opt == 'h') {
			rc = 1;
			break;
		}
		if (opt < FIRST_VAL || read_one(&opts[opt - FIRST_VAL], optarg) < 0)
			rc = -1;
	}
	free(longopts);
	return rc;
}
