/*
 * fma-peak.c — the machine's float32 FMA limit, measured: independent AVX-512 FMA chains (or
 * AVX2 where the CPU lacks AVX-512F) on every OpenMP thread, all operands in registers.
 *
 * Twelve accumulators cover the FMA latency of two pipes (4 cycles x 2 = 8 in flight), and each
 * is a named variable, not an array: gcc -O2 keeps an array of vectors in memory, and such a loop
 * measures store-to-load forwarding instead of the FMA units (on an AVX-512 EPYC it ran at 137
 * GFLOP/s on both cores; this loop, with its operands in registers, at 360-450). Not part of the
 * library.
 */
#define _GNU_SOURCE
#include "fma-peak.h"

#include "bench.h"

#include <immintrin.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define FMA12(F, m, c)                                                                             \
    a0 = F(a0, m, c), a1 = F(a1, m, c), a2 = F(a2, m, c), a3 = F(a3, m, c), a4 = F(a4, m, c),      \
    a5 = F(a5, m, c), a6 = F(a6, m, c), a7 = F(a7, m, c), a8 = F(a8, m, c), a9 = F(a9, m, c),      \
    a10 = F(a10, m, c), a11 = F(a11, m, c)

__attribute__((target("avx512f,fma"))) static float chains512(int64_t iters)
{
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
           a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
           a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
           a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (int64_t t = 0; t < iters; t++)
        FMA12(_mm512_fmadd_ps, m, c);
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float chains256(int64_t iters)
{
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2),
           a3 = _mm256_set1_ps(3), a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5),
           a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7), a8 = _mm256_set1_ps(8),
           a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (int64_t t = 0; t < iters; t++)
        FMA12(_mm256_fmadd_ps, m, c);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float r[8];
    _mm256_storeu_ps(r, s);
    return r[0] + r[7];
}

double bench_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_fma_peak(double seconds, int *width, double *per_cpu_s)
{
    __builtin_cpu_init();
    int w = __builtin_cpu_supports("avx512f") ? 512 : 256;
    if (width)
        *width = w;
    int64_t iters = 1 << 20;
    volatile float sink = 0;
    for (;;) {
        int nt = 1;
        double t0 = bench_now(), c0 = bench_cpu_now();
#ifdef _OPENMP
#pragma omp parallel
#endif
        {
            float r = w == 512 ? chains512(iters) : chains256(iters);
#ifdef _OPENMP
#pragma omp critical
            nt = omp_get_num_threads();
#endif
            sink += r;
        }
        double t = bench_now() - t0, c = bench_cpu_now() - c0;
        double gflop = (double)nt * (double)iters * 12 * (w / 32) * 2 / 1e9;
        if (t >= seconds) {
            if (per_cpu_s)
                *per_cpu_s = gflop / c;
            return gflop / t;
        }
        iters *= t < seconds / 8 ? 8 : 2;
    }
}
