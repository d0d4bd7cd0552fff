/*
 * handloop-fast.c — the strongest hand loops bench-gauss compares symred against: the jobs of
 * handloop.c as a competent C programmer writes them for speed. y is copied once per call into
 * three structure-of-arrays columns (contiguous loads instead of a stride of 3), the outer loop
 * is `omp parallel for` over i and the inner one `omp simd` with a reduction, and the file is
 * compiled with -O3 -march=native -mprefer-vector-width=512 -ffast-math -fopenmp, so that
 * glibc's <math.h> declares its vector exponentials (libmvec) and the compiler may reassociate
 * the sums. The copy of y is part of each call's time: symred reads the same row-major arrays.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "handloop.h"

/* The columns of the n x 3 row-major array a, in one allocation of 3 n values: a0, a1, a2. */
#define SOA(T, a, n, c0, c1, c2)                                                                   \
    T *c0 = malloc(sizeof(T) * 3 * (size_t)(n)), *c1 = c0 + (n), *c2 = c1 + (n);                   \
    if (!c0)                                                                                       \
        abort();                                                                                   \
    _Pragma("omp parallel for schedule(static)") for (int64_t j = 0; j < (n); j++)                 \
    {                                                                                              \
        c0[j] = a[3 * j], c1[j] = a[3 * j + 1], c2[j] = a[3 * j + 2];                              \
    }

#define FAST_GAUSS(name, T, EXP)                                                                   \
    static void name(int64_t n, int64_t m, const T *x, const T *y, const T *b, T g, T *out)        \
    {                                                                                              \
        SOA(T, y, m, y0, y1, y2)                                                                   \
        _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++)               \
        {                                                                                          \
            const T x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];                           \
            T s = 0;                                                                               \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < m; j++)                   \
            {                                                                                      \
                const T d0 = x0 - y0[j], d1 = x1 - y1[j], d2 = x2 - y2[j];                         \
                s += EXP(-(d0 * d0 + d1 * d1 + d2 * d2) * g) * b[j];                               \
            }                                                                                      \
            out[i] = s;                                                                            \
        }                                                                                          \
        free(y0);                                                                                  \
    }

FAST_GAUSS(bench_fast_gauss, float, expf)
FAST_GAUSS(bench_fast_gauss_f64, double, exp)

static void bench_fast_lse(int64_t n, int64_t m, const float *x, const float *y, float g,
                           float *out)
{
    SOA(float, y, m, y0, y1, y2)
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
        float mx = -FLT_MAX; /* -ffast-math assumes no infinities */
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < m; j++) {
            const float d0 = x0 - y0[j], d1 = x1 - y1[j], d2 = x2 - y2[j];
            mx = fmaxf(mx, -(d0 * d0 + d1 * d1 + d2 * d2) * g);
        }
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < m; j++) {
            const float d0 = x0 - y0[j], d1 = x1 - y1[j], d2 = x2 - y2[j];
            s += expf(-(d0 * d0 + d1 * d1 + d2 * d2) * g - mx);
        }
        out[i] = mx + logf(s);
    }
    free(y0);
}

static void bench_fast_argkmin(int64_t n, int64_t m, const float *x, const float *y, int k,
                               int64_t *out)
{
    SOA(float, y, m, y0, y1, y2)
#pragma omp parallel
    {
        float dist[512], best[64];
        int64_t bi[64];
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
            for (int q = 0; q < k; q++)
                best[q] = FLT_MAX, bi[q] = -1;
            for (int64_t j0 = 0; j0 < m; j0 += 512) {
                const int nb = (int)(m - j0 < 512 ? m - j0 : 512);
#pragma omp simd
                for (int jj = 0; jj < nb; jj++) {
                    const float d0 = x0 - y0[j0 + jj], d1 = x1 - y1[j0 + jj], d2 = x2 - y2[j0 + jj];
                    dist[jj] = d0 * d0 + d1 * d1 + d2 * d2;
                }
                for (int jj = 0; jj < nb; jj++)
                    bench_kbest_insert(best, bi, k, dist[jj], j0 + jj);
            }
            for (int q = 0; q < k; q++)
                out[i * k + q] = bi[q];
        }
    }
    free(y0);
}

const struct bench_loops bench_fast_loops = {
    /* .gauss = */ bench_fast_gauss,
    /* .gauss_f64 = */ bench_fast_gauss_f64,
    /* .lse = */ bench_fast_lse,
    /* .argkmin = */ bench_fast_argkmin,
};
