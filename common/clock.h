/* The daemon's clock: monotonic nanoseconds, for deadlines and durations. */
#ifndef GS_CLOCK_H
#define GS_CLOCK_H

#include <stdint.h>

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t gs_now_ns(void);

#endif
