/* check_random.h — the C checks' seeded inputs: a linear congruential generator, so a check
 * draws the same values on every machine without libc's rand */
#ifndef CHECK_RANDOM_H
#define CHECK_RANDOM_H

/* the next value of the sequence at *s, uniform in [-1, 1) */
static inline float uniform(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f * 2.0f - 1.0f;
}

#endif
