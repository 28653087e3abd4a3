/*
 * The benchmark programs' command lines: each lists its options once, in a
 * table of names, kinds, bounds and where the values go, and this one
 * getopt_long loop reads them, so that an option is not written twice (in
 * getopt's table and again in a switch).
 */
#ifndef GS_BENCH_OPTIONS_H
#define GS_BENCH_OPTIONS_H

#include <stdbool.h>
#include <unistd.h> /* optind */

enum bench_option_kind {
	BENCH_OPTION_UINT,   /* a decimal number in [min, max], into *(unsigned *)to */
	BENCH_OPTION_STRING, /* the argument itself, into *(const char **)to */
	BENCH_OPTION_FLAG,   /* no argument: *(bool *)to = true */
	BENCH_OPTION_PARSE,  /* parse(argument, to): 0, or nonzero when it is bad */
};

struct bench_option {
	const char *name; /* --name; NULL ends the table */
	enum bench_option_kind kind;
	void *to;
	unsigned long min, max;		   /* BENCH_OPTION_UINT only */
	int (*parse)(char *arg, void *to); /* BENCH_OPTION_PARSE only */
};

/* A table's lines. Each casts `to` to the pointer its kind writes
 * through, so that the compiler refuses a field of another width. */
#define BENCH_UINT(name, to, min, max)                                            \
	{(name), BENCH_OPTION_UINT, (unsigned *){(to)}, (min), (max), NULL}
#define BENCH_STRING(name, to) {(name), BENCH_OPTION_STRING, (const char **){(to)}, 0, 0, NULL}
#define BENCH_FLAG(name, to) {(name), BENCH_OPTION_FLAG, (bool *){(to)}, 0, 0, NULL}
#define BENCH_PARSE(name, parse, to) {(name), BENCH_OPTION_PARSE, (to), 0, 0, (parse)}
#define BENCH_OPTIONS_END {NULL, 0, NULL, 0, 0, NULL}

/* Reads argv's options, and -h/--help, into the places opts names. Returns
 * 1 at -h or --help (the options after it are not read), 0 when every
 * option was known and its value good, -1 otherwise (getopt_long has
 * printed why when an option was unknown or lacked its argument; a bad
 * value goes unsaid, for the caller's usage). Operands start at optind. */
int bench_options_parse(int argc, char **argv, const struct bench_option *opts);

#endif
