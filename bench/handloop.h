/*
 * handloop.h — the hand-written loops bench-gauss times symred against, one table per file:
 * bench_hand_loops (handloop.c, compiled with the JIT's flags) and bench_fast_loops
 * (handloop-fast.c, the fastest a user would write), and the K-best insertion both ArgKMin
 * loops share.
 */
#ifndef SYMRED_BENCH_HANDLOOP_H
#define SYMRED_BENCH_HANDLOOP_H

#include <stdint.h>

/* The jobs: out_i = sum_j exp(-g |x_i - y_j|^2) b_j (float32, float64), LogSumExp_j of
 * -g |x_i - y_j|^2, and the indices of the k smallest |x_i - y_j|^2 (D = 3, row-major). */
struct bench_loops {
    void (*gauss)(int64_t n, int64_t m, const float *x, const float *y, const float *b, float g,
                  float *out);
    void (*gauss_f64)(int64_t n, int64_t m, const double *x, const double *y, const double *b,
                      double g, double *out);
    void (*lse)(int64_t n, int64_t m, const float *x, const float *y, float g, float *out);
    void (*argkmin)(int64_t n, int64_t m, const float *x, const float *y, int k, int64_t *out);
};

extern const struct bench_loops bench_hand_loops, bench_fast_loops;

/* Puts (v, j) into best[0..k) / bi[0..k), the k smallest values so far in increasing order
 * (ties keep the earlier index), when v beats the k-th. */
static inline void bench_kbest_insert(float *best, int64_t *bi, int k, float v, int64_t j)
{
    if (!(v < best[k - 1]))
        return;
    int p = k - 1;
    while (p > 0 && v < best[p - 1]) {
        best[p] = best[p - 1], bi[p] = bi[p - 1];
        p--;
    }
    best[p] = v, bi[p] = j;
}

#endif
