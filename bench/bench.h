/*
 * bench.h — what the benchmark programs share: a monotonic clock, an allocator that exits with a
 * message instead of returning NULL, a reproducible uniform generator, and a kernel's plan. Not
 * part of the library.
 */
#ifndef SYMRED_BENCH_H
#define SYMRED_BENCH_H

#include "symred.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The benchmarks time compiled code, so kernel creation waits for the compiler (SYMRED_JIT=sync)
 * unless the environment asks otherwise; bench-tier0 times the tiers themselves. */
__attribute__((constructor)) static void bench_jit_sync(void) { setenv("SYMRED_JIT", "sync", 0); }

/* Seconds on a monotonic clock. */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* malloc that never returns NULL: a benchmark that cannot get its arrays stops with a message. */
static inline void *bench_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "benchmark: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* The plan of kernel k (sr_kernel_plan), all zero when it cannot be had. */
static inline sr_plan_info bench_plan(const sr_kernel *k)
{
    sr_plan_info p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    if (sr_kernel_plan(k, &p) != SR_OK)
        memset(&p, 0, sizeof p);
    return p;
}

/* Uniform in [0, 1) from an xorshift64 state, so runs are reproducible from the seed. */
static inline double bench_uniform(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

#endif /* SYMRED_BENCH_H */
