/*
 * example.h — the small helpers the example programs share: timing, a reproducible random
 * generator, command-line parsing, and error exits that print symred's own message.
 *
 * Each example defines `static const char *prog` (its name, for messages) before including
 * this header. Nothing here is part of the library.
 */
#ifndef SYMRED_EXAMPLE_H
#define SYMRED_EXAMPLE_H

#include <symred.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on a monotonic clock. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A deterministic generator (xorshift64), so that runs are reproducible from the seed. */
static inline double uniform01(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* A non-negative integer argument, or a usage error (exit 2). */
static inline int64_t parse_size(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || !*s || v < 0) {
        fprintf(stderr, "%s: '%s' is not a size (a non-negative integer)\n", prog, s);
        exit(2);
    }
    return (int64_t)v;
}

/* A real argument, or a usage error (exit 2). */
static inline double parse_real(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end || !*s) {
        fprintf(stderr, "%s: '%s' is not a number\n", prog, s);
        exit(2);
    }
    return v;
}

/* "auto", "cpu", "reference" or "cuda" into *dev; 0 if s is none of them. */
static inline int parse_device(const char *s, sr_device *dev)
{
    static const struct {
        const char *name;
        sr_device dev;
    } names[] = {{"auto", SR_DEVICE_AUTO},
                 {"cpu", SR_DEVICE_CPU},
                 {"reference", SR_DEVICE_REFERENCE},
                 {"cuda", SR_DEVICE_CUDA}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i].name) == 0) {
            *dev = names[i].dev;
            return 1;
        }
    return 0;
}

/* Prints what failed with symred's own message, and exits with status 1. */
static inline void fail(sr_ctx *ctx, const char *what, sr_status st)
{
    fprintf(stderr, "%s: %s failed: %s: %s\n", prog, what, sr_status_str(st), sr_ctx_error(ctx));
    exit(1);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", prog, n);
        exit(1);
    }
    return p;
}

/* Element i of a float32 (f64 = 0) or float64 array, as a double. */
static inline double get(const void *a, int f64, int64_t i)
{
    return f64 ? ((const double *)a)[i] : (double)((const float *)a)[i];
}

static inline void set(void *a, int f64, int64_t i, double v)
{
    if (f64)
        ((double *)a)[i] = v;
    else
        ((float *)a)[i] = (float)v;
}

#endif /* SYMRED_EXAMPLE_H */
