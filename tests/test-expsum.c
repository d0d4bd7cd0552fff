/*
 * test-expsum.c — the fused strategy's vectorised softmax step cpu_expsum_f32 (cpu/fused-simd.c):
 * F[c] = exp(F[c] - m) and their sum, against the bound and the special values that
 * docs/semantics.md states for the CPU JIT's Exp: within 1.1 ulp of the exact exponential, 0
 * where the result is below 1.7e-38 (and for -inf), +inf above 88.72283, NaN for NaN whatever
 * its payload. Lengths that are multiples of no vector check the tail, and the value past the
 * end must stay untouched.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"

/* |v - ref| in units of the last place of ref, a normal float32 number. */
static double ulps32(double v, double ref)
{
    int e;
    frexp(ref, &e);
    return fabs(v - ref) / ldexp(1.0, e - 24);
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Whether v is a correct result for exp(a), a = F - m as float32 computes it. */
static bool exp_ok(float v, float a, double *worst)
{
    if (isnan(a))
        return isnan(v);
    if (a > 0x1.62e42ep+6f)
        return v == INFINITY;
    const double ref = exp((double)a);
    if (ref < 1.69e-38)
        return v == 0;
    if (ref < 1.71e-38 && v == 0) /* the flush threshold compares the rounded result */
        return true;
    const double u = ulps32(v, ref);
    *worst = u > *worst ? u : *worst;
    return u <= 1.1;
}

/* Float32 values spread over every binade: the bit patterns k * 997, both signs. */
Test(expsum, within_bound_over_the_range)
{
    enum { N = 4093 };
    float *F = malloc(sizeof(float) * (N + 1)), *A = malloc(sizeof(float) * N);
    double worst = 0;
    uint64_t u = 0;
    for (int chunk = 0; u < (1ull << 32); chunk++) {
        int n = 0;
        for (; n < N && u < (1ull << 32); n++, u += 997)
            A[n] = bits_float((uint32_t)u);
        const float m = chunk % 2 ? 0.0f : -3.0f; /* a = F - m, exact or rounded */
        for (int c = 0; c < n; c++)
            F[c] = A[c];
        F[n] = 42.0f;
        const double s = cpu_expsum_f32(F, n, m);
        double t = 0;
        for (int c = 0; c < n; c++) {
            const float a = A[c] - m;
            cr_assert(exp_ok(F[c], a, &worst), "exp(%a - %a) = %a, exp is %a", (double)A[c],
                      (double)m, (double)F[c], exp((double)a));
            t += F[c];
        }
        cr_assert_eq(F[n], 42.0f, "the value past the end changed: %g", (double)F[n]);
        /* float32 partial sums: n roundings of at most 2^-24 of the (nonnegative) total */
        cr_assert(isnan(t) ? isnan(s) : s == t || fabs(s - t) <= n * 0x1p-24 * t,
                  "sum %.9g, values sum to %.9g", s, t);
    }
    cr_assert(worst > 0.1 && worst <= 1.1, "largest error %g ulp", worst);
    free(F);
    free(A);
}

/* NaN (also with payload bits that would move the exponent), infinities, the row maximum +inf
 * and -inf, every length up to 17 (the tails). */
Test(expsum, special_values)
{
    const float specials[] = {-INFINITY,
                              NAN,
                              bits_float(0x7fc001ffu),
                              bits_float(0xffc00155u),
                              0.0f,
                              -1e30f,
                              -88.0f,
                              -87.0f,
                              1e-3f,
                              100.0f,
                              INFINITY};
    enum { NS = sizeof specials / sizeof *specials };
    float F[NS + 20];
    double worst = 0;
    for (int n = 0; n <= 17; n++)
        for (int off = 0; off < NS; off++) {
            float A[32];
            for (int c = 0; c < n; c++)
                A[c] = specials[(c + off) % NS];
            memcpy(F, A, sizeof(float) * (size_t)n);
            F[n] = 42.0f;
            cpu_expsum_f32(F, n, 0.0f);
            for (int c = 0; c < n; c++)
                cr_assert(exp_ok(F[c], A[c], &worst), "n %d: exp(%a) = %a", n, (double)A[c],
                          (double)F[c]);
            cr_assert_eq(F[n], 42.0f);
            /* m = +inf: every finite or -inf value weighs 0, +inf gives NaN (inf - inf). */
            memcpy(F, A, sizeof(float) * (size_t)n);
            cpu_expsum_f32(F, n, INFINITY);
            for (int c = 0; c < n; c++)
                cr_assert(A[c] == INFINITY || isnan(A[c]) ? isnan(F[c]) : F[c] == 0,
                          "m = +inf: exp(%a - m) = %a", (double)A[c], (double)F[c]);
            /* m = -inf (the row has only -inf and NaN so far): -inf weighs 0, NaN stays. */
            for (int c = 0; c < n; c++)
                F[c] = c % 2 ? -INFINITY : NAN;
            const double s = cpu_expsum_f32(F, n, -INFINITY);
            for (int c = 0; c < n; c++)
                cr_assert(c % 2 ? F[c] == 0 : isnan(F[c]), "m = -inf: F[%d] = %a", c, (double)F[c]);
            cr_assert(n < 1 ? s == 0 : isnan(s), "m = -inf: sum %g", s);
        }
}
