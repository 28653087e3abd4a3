/*
 * Numbers as people write them in settings and launchers' variables, read
 * strictly: gradsyncd's settings (flags, GRADSYNC_* variables, the
 * configuration file) and libgradsync's launcher variables (GRADSYNC_*,
 * torchrun's, Slurm's) all go through these, so that what one accepts the
 * other does too. Decimal only: no sign, space, base prefix ("0x10") or
 * leading zero ("010", which C and shells read as octal), and never a
 * value that wraps; a factor is never infinite, NaN, denormal or -0.
 */
#ifndef GS_NUMBER_H
#define GS_NUMBER_H

#include <stdint.h>

/* The form every integer takes, for messages about one that does not. */
#define GS_NUMBER_FORM "decimal digits only: no sign, space, base prefix or leading zero"

#ifdef __cplusplus
extern "C" {
#endif

/* The decimal integer text is, all of it, in [min, max]: "0", or a digit
 * 1-9 then digits. Returns 0 with *out set, -EINVAL when text is not
 * such a number, or -ERANGE when it is one outside [min, max] (however
 * many digits: nothing wraps). */
int gs_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* The same for the number text begins with, as in a list ("2(x3),1"):
 * *end is set after its digits. -EINVAL when text begins with no digit
 * or with a leading zero. */
int gs_parse_uint_prefix(const char *text, const char **end, uint64_t min, uint64_t max,
			 uint64_t *out);

/* The decimal number text is, all of it, in [min, max]: an optional '-',
 * an integer part as above, an optional fraction ('.' and digits) and an
 * optional exponent ('e' or 'E', an optional sign, digits): "2", "2.5",
 * "1e6". Returns 0 with *out set; -EINVAL when text is not such a number,
 * or is negative zero; -ERANGE when its value is outside [min, max], or
 * too large or too small for a double to hold in full (overflow to
 * infinity, a denormal, or a non-zero value that underflows to 0). */
int gs_parse_real(const char *text, double min, double max, double *out);

#ifdef __cplusplus
}
#endif

#endif
