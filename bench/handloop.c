/*
 * handloop.c — the hand-written loops that bench-gauss compares symred against: the Gaussian
 * mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j (D = 3, float32 and float64), LogSumExp of -g
 * |x_i - y_j|^2 and ArgKMin of |x_i - y_j|^2; OpenMP over i and `omp simd` over j.
 *
 * Compiled with the JIT's own flags (-O3 -march=native -mprefer-vector-width=512
 * -fno-math-errno, plus -fopenmp). glibc's <math.h> only declares its vector expf under
 * -ffast-math, so the loops declare exp and expf `omp declare simd` themselves: they call
 * libmvec's vector exponentials (symred's generated code has an inline one of its own).
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "handloop.h"

#pragma omp declare simd notinbranch
extern float expf(float);

#pragma omp declare simd notinbranch
extern double exp(double);
extern float logf(float);

/* The mat-vec in the scalar type T with the exponential EXP, as one writes it by hand. */
#define HAND_GAUSS(name, T, EXP)                                                                   \
    static void name(int64_t n, int64_t m, const T *x, const T *y, const T *b, T g, T *out)        \
    {                                                                                              \
        _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++)               \
        {                                                                                          \
            const T x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];                           \
            T s = 0;                                                                               \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < m; j++)                   \
            {                                                                                      \
                const T d0 = x0 - y[3 * j], d1 = x1 - y[3 * j + 1], d2 = x2 - y[3 * j + 2];        \
                s += EXP(-(d0 * d0 + d1 * d1 + d2 * d2) * g) * b[j];                               \
            }                                                                                      \
            out[i] = s;                                                                            \
        }                                                                                          \
    }

HAND_GAUSS(bench_hand_gauss, float, expf)
HAND_GAUSS(bench_hand_gauss_f64, double, exp)

/* out_i = log sum_j exp(-g |x_i - y_j|^2), the usual two passes (the largest term, then the sum
 * of the shifted exponentials), each vectorised. */
static void bench_hand_lse(int64_t n, int64_t m, const float *x, const float *y, float g,
                           float *out)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
        float mx = -__builtin_inff();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < m; j++) {
            const float d0 = x0 - y[3 * j], d1 = x1 - y[3 * j + 1], d2 = x2 - y[3 * j + 2];
            const float v = -(d0 * d0 + d1 * d1 + d2 * d2) * g;
            mx = v > mx ? v : mx;
        }
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < m; j++) {
            const float d0 = x0 - y[3 * j], d1 = x1 - y[3 * j + 1], d2 = x2 - y[3 * j + 2];
            s += expf(-(d0 * d0 + d1 * d1 + d2 * d2) * g - mx);
        }
        out[i] = mx + logf(s);
    }
}

/* out_i = the indices of the k smallest |x_i - y_j|^2 (increasing, ties by index): distances of
 * a block of 512 j by a vectorised loop, then an insertion into the sorted list of the k best
 * for the few that beat the k-th. */
static void bench_hand_argkmin(int64_t n, int64_t m, const float *x, const float *y, int k,
                               int64_t *out)
{
#pragma omp parallel
    {
        float dist[512], best[64];
        int64_t bi[64];
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
            for (int q = 0; q < k; q++)
                best[q] = __builtin_inff(), bi[q] = -1;
            for (int64_t j0 = 0; j0 < m; j0 += 512) {
                const int nb = (int)(m - j0 < 512 ? m - j0 : 512);
#pragma omp simd
                for (int jj = 0; jj < nb; jj++) {
                    const int64_t j = j0 + jj;
                    const float d0 = x0 - y[3 * j], d1 = x1 - y[3 * j + 1], d2 = x2 - y[3 * j + 2];
                    dist[jj] = d0 * d0 + d1 * d1 + d2 * d2;
                }
                for (int jj = 0; jj < nb; jj++)
                    bench_kbest_insert(best, bi, k, dist[jj], j0 + jj);
            }
            for (int q = 0; q < k; q++)
                out[i * k + q] = bi[q];
        }
    }
}

const struct bench_loops bench_hand_loops = {
    /* .gauss = */ bench_hand_gauss,
    /* .gauss_f64 = */ bench_hand_gauss_f64,
    /* .lse = */ bench_hand_lse,
    /* .argkmin = */ bench_hand_argkmin,
};
