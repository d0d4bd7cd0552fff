/*
 * handloop.c — the hand-written Gaussian mat-vec that bench-gauss compares symred against:
 * out_i = sum_j exp(-g |x_i - y_j|^2) b_j, D = 3, float32, OpenMP over i and `omp simd` over j.
 *
 * Compiled with the JIT's own flags (-O3 -march=native -mprefer-vector-width=512
 * -fno-math-errno, plus -fopenmp). glibc's <math.h> only declares its vector expf under
 * -ffast-math, which the JIT does not use, so the loop declares it the way the generated code
 * does: both sides call libmvec.
 */
#include <stdint.h>

#pragma omp declare simd notinbranch
extern float expf(float);

void bench_hand_gauss(int64_t n, int64_t m, const float *x, const float *y, const float *b, float g,
                      float *out);

void bench_hand_gauss(int64_t n, int64_t m, const float *x, const float *y, const float *b, float g,
                      float *out)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float x0 = x[3 * i], x1 = x[3 * i + 1], x2 = x[3 * i + 2];
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < m; j++) {
            const float d0 = x0 - y[3 * j], d1 = x1 - y[3 * j + 1], d2 = x2 - y[3 * j + 2];
            s += expf(-(d0 * d0 + d1 * d1 + d2 * d2) * g) * b[j];
        }
        out[i] = s;
    }
}
