/*
 * The one monotonic clock of gradsync's programs (CLOCK_MONOTONIC: never
 * steps back, not set by anyone), for deadlines and durations. Wall-clock
 * time is only ever printed (log lines, trace files) and is read there.
 */
#ifndef GS_CLOCK_H
#define GS_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds since an arbitrary point in the past. */
uint64_t gs_now_ns(void);
/* The same in milliseconds, with a fraction. */
double gs_now_ms(void);

#ifdef __cplusplus
}
#endif

#endif
