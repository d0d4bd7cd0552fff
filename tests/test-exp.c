/*
 * test-exp.c — the CPU JIT's exponential (sr_exp, emitted by src/jit/emit-c.c) against the error
 * bound docs/semantics.md states: every one of the 2^32 float32 inputs, and a dense sample of
 * float64 inputs over the whole range, with the special values (NaN, ±inf, the overflow and
 * underflow thresholds). The values come from the generated code itself: sr_kernel_eval_block of
 * the formula Exp(y), whose block is F's values, computed by the same vectorised loop as a
 * reduction's.
 *
 * float32 oracle: for the inputs where the answer is not exact by definition (0 past the
 * underflow clamp, +inf past overflow, NaN), the float64 kernel's exp of the same input, whose
 * own error (checked by the float64 test against expl) is below 2^-50 relative: it moves the
 * float32 error measured in ulps by less than 1e-6.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The bounds of docs/semantics.md, in units in the last place of the exact result. */
#define EXP_F32_ULP 1.1
#define EXP_F64_ULP 1.1
/* Results below these are 0 (the underflow clamp). */
#define FLUSH_F32 1.7e-38
#define FLUSH_F64 3.4e-308

static sr_ctx *ctx;
static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", "off", 1);
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(exp, .init = setup, .fini = teardown);

/* The kernel Sum_j Exp(y_j) on the CPU JIT, whose eval_block gives Exp(y) itself. */
static sr_kernel *exp_kernel(sr_dtype dt)
{
    const char *aliases[] = {"y=Vj(1)"};
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(sr_parse(ctx, "Exp(y)", aliases, 1, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    d.device = SR_DEVICE_CPU;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(tu_runs_jit(k) && tu_plan(k).eval_block, "not the generated code:\n%s",
              sr_kernel_explain(k));
    return k;
}

static void eval(const sr_kernel *k, const void *in, int64_t n, void *out)
{
    const void *args[] = {in};
    cr_assert_eq(sr_kernel_eval_block(k, 1, n, args, 0, 1, 0, n, out), SR_OK, "%s",
                 sr_ctx_error(ctx));
}

/* |v - ref| in units of the last place of ref in a format with p-bit significands, ref a
 * normal number of that format. */
static double ulps(double v, double ref, int p)
{
    uint64_t u;
    memcpy(&u, &ref, 8);
    u = ((u >> 52 & 0x7ff) - (uint64_t)(p - 1)) << 52; /* 2^(exponent of ref - p + 1) */
    double ulp;
    memcpy(&ulp, &u, 8);
    return fabs(v - ref) / ulp;
}

Test(exp, float32_every_input)
{
    enum { CH = 1 << 22 };
    sr_kernel *k32 = exp_kernel(SR_F32), *k64 = exp_kernel(SR_F64);
    float *in = malloc(sizeof(float) * CH), *out = malloc(sizeof(float) * CH);
    double *din = malloc(sizeof(double) * CH), *dout = malloc(sizeof(double) * CH);
    cr_assert(in && out && din && dout);
    double worst = 0;
    float worst_at = 0;
    int64_t bad = 0;
    float bad_at = 0, bad_got = 0;
    for (uint64_t base = 0; base < (1ull << 32); base += CH) {
        for (uint32_t i = 0; i < CH; i++) {
            uint32_t u = (uint32_t)(base + i);
            memcpy(&in[i], &u, 4);
        }
        eval(k32, in, CH, out);
        /* A chunk lies in one binade of one sign: where its inputs are all NaN, all tiny (exp
         * rounds to 1: |a| < 2^-30), or all past a threshold (+inf above 89, 0 below -88), the
         * answer is exact; elsewhere the float64 kernel is the oracle. */
        const float lo = fabsf(in[0]), hi = fabsf(in[CH - 1]);
        const bool exact = lo != lo || hi < 0x1p-30f || lo > 89.0f;
        if (exact) {
            const float want = hi < 0x1p-30f ? 1.0f : in[0] > 0 ? INFINITY : 0.0f;
            for (uint32_t i = 0; i < CH; i++) {
                const bool ok = in[i] != in[i] ? out[i] != out[i] : out[i] == want;
                if (!ok && bad++ == 0)
                    bad_at = in[i], bad_got = out[i];
            }
            continue;
        }
        for (uint32_t i = 0; i < CH; i++)
            din[i] = in[i];
        eval(k64, din, CH, dout);
        for (uint32_t i = 0; i < CH; i++) {
            const float a = in[i], v = out[i];
            const double ref = dout[i];
            bool ok;
            if (a > 0x1.62e42ep+6f) /* the largest input with a finite exp */
                ok = v == INFINITY;
            else if (ref < FLUSH_F32 * (1 + 0x1p-20))
                ok = v == 0 || (ref >= FLUSH_F32 * (1 - 0x1p-20) && v >= FLUSH_F32);
            else if (v < FLUSH_F32)
                ok = false;
            else {
                double e = ulps(v, ref, 24);
                ok = e <= EXP_F32_ULP;
                if (e > worst)
                    worst = e, worst_at = a;
            }
            if (!ok && bad++ == 0)
                bad_at = a, bad_got = v;
        }
    }
    printf("exp float32: max error %.4f ulp (at %a) over all 2^32 inputs\n", worst, worst_at);
    cr_assert_eq(bad, 0, "%lld inputs out of bound, first exp(%a) = %a", (long long)bad, bad_at,
                 bad_got);
    cr_assert_gt(worst, 0.0, "the comparison ran");
    free(in), free(out), free(din), free(dout);
    sr_kernel_free(k32);
    sr_kernel_free(k64);
}

Test(exp, float64_dense_sample)
{
    enum { N = 1 << 22, NS = 16 };
    sr_kernel *k64 = exp_kernel(SR_F64);
    double *in = malloc(sizeof(double) * (N + NS)), *out = malloc(sizeof(double) * (N + NS));
    cr_assert(in && out);
    const double special[NS] = {NAN,
                                -NAN,
                                INFINITY,
                                -INFINITY,
                                0.0,
                                -0.0,
                                0x1.62e42fefa39efp+9,
                                0x1.62e42fefa39f0p+9,
                                -708.5,
                                -707.9,
                                -745.2,
                                1e-300,
                                -1e-300,
                                0x1p-53,
                                -0x1p-54,
                                1e308};
    /* A grid over [-712, 712] (every argument with a finite non-flushed result and past both
     * ends) with a random offset per point, and random magnitudes over every binade. */
    uint64_t s = 20261126;
    for (int i = 0; i < N / 2; i++)
        in[i] = -712.0 + 1424.0 * (i + tu_uniform(&s, 0, 1)) / (N / 2);
    for (int i = N / 2; i < N; i++) {
        uint64_t u = tu_rand(&s) & 0xffffffffffffffffull;
        memcpy(&in[i], &u, 8);
    }
    memcpy(in + N, special, sizeof special);
    eval(k64, in, N + NS, out);
    double worst = 0, worst_at = 0;
    int64_t bad = 0;
    double bad_at = 0, bad_got = 0;
    for (int i = 0; i < N + NS; i++) {
        const double a = in[i], v = out[i];
        const long double ref = expl((long double)a);
        bool ok;
        if (a != a)
            ok = v != v;
        else if (a > 0x1.62e42fefa39efp+9)
            ok = v == INFINITY;
        else if (ref < FLUSH_F64 * (1 + 0x1p-40))
            ok = v == 0 || (ref >= FLUSH_F64 * (1 - 0x1p-40) && v >= FLUSH_F64);
        else if (v < FLUSH_F64)
            ok = false;
        else {
            int e;
            frexpl(ref, &e);
            double err = (double)(fabsl((long double)v - ref) / ldexpl(1.0L, e - 53));
            ok = err <= EXP_F64_ULP;
            if (err > worst)
                worst = err, worst_at = a;
        }
        if (!ok && bad++ == 0)
            bad_at = a, bad_got = v;
    }
    printf("exp float64: max error %.4f ulp (at %a) over %d inputs\n", worst, worst_at, N + NS);
    cr_assert_eq(bad, 0, "%lld inputs out of bound, first exp(%a) = %a", (long long)bad, bad_at,
                 bad_got);
    cr_assert_gt(worst, 0.0, "the comparison ran");
    free(in), free(out);
    sr_kernel_free(k64);
}
