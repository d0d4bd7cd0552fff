/*
 * test-rewrite.c — the simplifier's reduction rewrites (src/core/simp-kernel.c plan_reduction,
 * applied by src/core/post.c): i-only factors out of Sum, non-negative factors out of
 * Min/Max/KMin, additive shifts out of Min/Max/KMin/LogSumExp, linear maps out of Sum. Each is
 * checked to fire (rule name in explain), and differentially: the CPU kernel (which reduces the
 * inner formula and applies the rest afterwards) against the reference kernel, which runs the
 * formula as given, over random inputs, both axes, both dtypes, and NaN/zero inputs.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"
#include "core/core.h"
#include "formulas/formulas.h"

static sr_ctx *ctx;
static void setup(void)
{
    unsetenv("SYMRED_SIMPLIFY");
    unsetenv("SYMRED_DEVICE");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(rewrite, .init = setup, .fini = teardown);

#define X  sr_vi(ctx, 0, 3)
#define Y  sr_vj(ctx, 1, 3)
#define P  sr_pm(ctx, 2, 1)
#define B  sr_vj(ctx, 3, 1)
#define S  sr_vi(ctx, 4, 1)
#define W  sr_vj(ctx, 5, 3)
#define A  sr_pm(ctx, 6, 15) /* 5 x 3 */
#define A2 sr_pm(ctx, 7, 6)  /* 2 x 3 */
#define AI sr_vi(ctx, 8, 15) /* 5 x 3, one per i */
#define A3 sr_pm(ctx, 9, 18) /* 3 x 6 */

#define NX 11
#define NY 53

static const char *pr(const sr_expr *e)
{
    static char buf[4][2048];
    static int which;
    which = (which + 1) % 4;
    sr_expr_print(e, buf[which], sizeof buf[which]);
    return buf[which];
}

static int vclass(double v) { return isnan(v) ? 3 : isinf(v) ? (v > 0 ? 1 : 2) : 0; }

static double get(const void *buf, sr_dtype dt, size_t i)
{
    return dt == SR_F64 ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

/* mode 0: uniform in [-2, 2]; 1: also NaN and zeros. */
static void fill(void *buf, sr_dtype dt, size_t n, uint64_t *rng, int mode)
{
    for (size_t t = 0; t < n; t++) {
        double v = tu_uniform(rng, -2.0, 2.0);
        if (mode == 1) {
            int r = (int)(tu_rand(rng) % 10);
            v = r == 0 ? NAN : r == 1 ? 0.0 : v;
        }
        if (dt == SR_F64)
            ((double *)buf)[t] = v;
        else
            ((float *)buf)[t] = (float)v;
    }
}

static sr_kernel *mk(sr_expr *f, sr_reduction red, int axis, int K, sr_dtype dt, sr_device dev)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.k = K;
    d.dtype = dt;
    d.device = dev;
    d.acc = SR_ACC_F64;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s: %s", pr(f), sr_ctx_error(ctx));
    return k;
}

/*
 * The CPU kernel of f against the reference kernel of f. rule: the rewrite that must fire
 * (NULL: none may). Returns the number of values compared.
 */
static int check(sr_expr *f, sr_reduction red, int axis, int K, sr_dtype dt, int mode,
                 uint64_t seed, const char *rule)
{
    sr_kernel *kc = mk(f, red, axis, K, dt, SR_DEVICE_CPU);
    sr_kernel *kr = mk(f, red, axis, K, dt, SR_DEVICE_REFERENCE);
    const char *ex = sr_kernel_explain(kc);
    if (rule) {
        cr_assert(kc->simp.post_rule && strcmp(kc->simp.post_rule, rule) == 0,
                  "%s (%s): expected rewrite %s, got %s\n%s", pr(f), sr_reduction_name(red), rule,
                  kc->simp.post_rule ? kc->simp.post_rule : "none", ex);
        const char *pr_rule = tu_plan(kc).rewrite;
        cr_assert(pr_rule && strcmp(pr_rule, rule) == 0, "the plan names rewrite %s:\n%s",
                  pr_rule ? pr_rule : "none", ex);
        if (strcmp(kc->backend->name, "reference") != 0)
            cr_assert_eq(tu_plan(kc).strategy, SR_STRATEGY_POST_REWRITE, "not applied:\n%s", ex);
    } else {
        cr_assert_null(kc->simp.post, "%s (%s): no rewrite expected, got %s -> %s", pr(f),
                       sr_reduction_name(red), kc->simp.post_rule, pr(kc->simp.post));
    }
    uint64_t rng = seed;
    size_t esz = sr_dtype_size(dt);
    int nargs = sr_kernel_nargs(kc);
    void *bufs[16] = {0};
    const void *args[16] = {0};
    cr_assert(nargs <= 16);
    for (int v = 0; v < nargs; v++) {
        const struct expr_var *var = &kc->vars[v];
        if (!var->dim)
            continue;
        size_t rows = var->cat == SR_CAT_I ? NX : var->cat == SR_CAT_J ? NY : 1;
        bufs[v] = malloc(rows * (size_t)var->dim * esz);
        fill(bufs[v], dt, rows * (size_t)var->dim, &rng, mode);
        args[v] = bufs[v];
    }
    int nout = (axis == 1 ? NX : NY) * sr_kernel_out_dim(kc);
    cr_assert_eq(sr_kernel_out_dim(kc), sr_kernel_out_dim(kr));
    /* 8 bytes a value: the arg reductions write int64 indices */
    void *oc = malloc((size_t)nout * 8), *orf = malloc((size_t)nout * 8);
    bool idx = sr_reductions[red].indices;
    cr_assert_eq(sr_kernel_run(kc, NX, NY, args, oc), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(kr, NX, NY, args, orf), SR_OK, "%s", sr_ctx_error(ctx));
    double tol = dt == SR_F64 ? 1e-9 : 2e-4;
    for (int t = 0; t < nout; t++) {
        double a = idx ? (double)((int64_t *)oc)[t] : get(oc, dt, (size_t)t);
        double b = idx ? (double)((int64_t *)orf)[t] : get(orf, dt, (size_t)t);
        cr_assert(vclass(a) == vclass(b) && (vclass(a) || fabs(a - b) <= tol * (1 + fabs(b))),
                  "%s, %s axis %d K %d %s mode %d: value %d is %.17g rewritten, %.17g as given\n%s",
                  pr(f), sr_reduction_name(red), axis, K, dt == SR_F64 ? "f64" : "f32", mode, t, a,
                  b, ex);
    }
    for (int v = 0; v < nargs; v++)
        free(bufs[v]);
    free(oc);
    free(orf);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
    return nout;
}

/* Every combination of dtype and input mode. */
static void check_all(sr_expr *f, sr_reduction red, int axis, int K, const char *rule)
{
    for (int dt = 0; dt < 2; dt++)
        for (int mode = 0; mode < 2; mode++)
            check(f, red, axis, K, dt ? SR_F64 : SR_F32, mode, 100 + (uint64_t)(dt * 2 + mode),
                  rule);
}

static sr_expr *gauss(void) { return sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y))); }

/* ---- Sum: factors that do not depend on j ---- */

Test(rewrite, sum_factor)
{
    sr_expr *fi = sr_exp(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, X)));
    check_all(sr_mul(ctx, sr_mul(ctx, fi, gauss()), B), SR_SUM, 1, 1, "sum-factor");
    /* a vector outer factor, a scalar inner one; a constant; a parameter */
    check_all(sr_mul(ctx, X, sr_scalprod(ctx, X, Y)), SR_SUM, 1, 1, "sum-factor");
    check_all(sr_mul(ctx, sr_mul(ctx, sr_const(ctx, 2.5), P), sr_mul(ctx, gauss(), W)), SR_SUM, 1,
              1, "sum-factor");
    check_all(sr_mul(ctx, S, sr_mul(ctx, X, Y)), SR_SUM, 1, 1, "sum-factor");
}

/* A negated product with a factor of the output row (the gradient of a Gaussian in x:
 * -(G_i ... g)): Sum_j -(o g) = -(o Sum_j g). With parameter factors only (a gradient in a
 * parameter) it is left alone, so that eval_block keeps its generated path. */
Test(rewrite, sum_factor_negated)
{
    check_all(sr_neg(ctx, sr_mul(ctx, sr_mul(ctx, X, sr_sub(ctx, X, Y)), gauss())), SR_SUM, 1, 1,
              "sum-factor");
    check_all(sr_neg(ctx, sr_mul(ctx, B, sr_mul(ctx, gauss(), S))), SR_SUM, 0, 1, "sum-factor");
    check_all(sr_neg(ctx, sr_mul(ctx, sr_mul(ctx, P, sr_sub(ctx, X, Y)), gauss())), SR_SUM, 1, 1,
              NULL);
}

Test(rewrite, sum_factor_axis0)
{
    /* Over i, the j-only factor b leaves the reduction. */
    check_all(sr_mul(ctx, B, sr_mul(ctx, gauss(), S)), SR_SUM, 0, 1, "sum-factor");
}

Test(rewrite, sum_without_outer_factor_is_left_alone)
{
    check_all(sr_mul(ctx, gauss(), B), SR_SUM, 1, 1, NULL);
    check_all(sr_exp(ctx, sr_mul(ctx, S, sr_scalprod(ctx, X, Y))), SR_SUM, 1, 1, NULL);
}

/* ---- Sum: linear maps ---- */

Test(rewrite, linear_map_out_of_sum)
{
    /* Sum_j K_ij (A w_j), A 5x3: reduce the 3-vector K w, then apply A. */
    check_all(sr_mul(ctx, gauss(), sr_matvecmult(ctx, A, W)), SR_SUM, 1, 1,
              "linear-map-out-of-sum");
    /* v^T A with A 3x6 */
    check_all(sr_mul(ctx, gauss(), sr_vecmatmult(ctx, W, A3)), SR_SUM, 1, 1,
              "linear-map-out-of-sum");
    /* the map of the output row's own A_i; together with an outer factor */
    check_all(sr_mul(ctx, sr_mul(ctx, S, gauss()), sr_matvecmult(ctx, AI, W)), SR_SUM, 1, 1,
              "sum-factor+linear-map");
    /* a map of a pair term */
    check_all(sr_matvecmult(ctx, A, sr_mul(ctx, gauss(), sr_sub(ctx, Y, X))), SR_SUM, 1, 1,
              "linear-map-out-of-sum");
}

Test(rewrite, linear_map_that_shrinks_stays_inside)
{
    /* A2 is 2x3: reducing A2 w (2 values) is cheaper than reducing w (3). */
    check_all(sr_mul(ctx, gauss(), sr_matvecmult(ctx, A2, W)), SR_SUM, 1, 1, NULL);
    /* a vector co-factor: K w_j ⊙ (A w_j) is not linear in one vector */
    check_all(sr_mul(ctx, sr_matvecmult(ctx, A, W), sr_matvecmult(ctx, A, W)), SR_SUM, 1, 1, NULL);
}

/* ---- Min / Max / KMin: non-negative factors ---- */

Test(rewrite, minmax_nonneg_factor)
{
    sr_expr *fi = sr_exp(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, X)));
    sr_expr *g = sr_mul(ctx, fi, sr_mul(ctx, sr_square(ctx, S), sr_scalprod(ctx, X, Y)));
    check_all(g, SR_MIN, 1, 1, "minmax-nonneg-factor");
    check_all(g, SR_MAX, 1, 1, "minmax-nonneg-factor");
    check_all(g, SR_KMIN, 1, 3, "minmax-nonneg-factor");
    check_all(sr_mul(ctx, sr_sqnorm2(ctx, Y), sr_sub(ctx, X, Y)), SR_MIN, 0, 1,
              "minmax-nonneg-factor");
    /* a vector factor: per component */
    check_all(sr_mul(ctx, sr_square(ctx, X), sr_scalprod(ctx, X, Y)), SR_MAX, 1, 1,
              "minmax-nonneg-factor");
}

Test(rewrite, minmax_factor_of_unknown_sign_stays)
{
    /* s may be negative: Min would become Max. */
    check_all(sr_mul(ctx, S, sr_scalprod(ctx, X, Y)), SR_MIN, 1, 1, NULL);
    /* only the non-negative factor moves */
    sr_expr *g = sr_mul(ctx, sr_mul(ctx, S, sr_square(ctx, S)), sr_scalprod(ctx, X, Y));
    check_all(g, SR_MAX, 1, 1, "minmax-nonneg-factor");
    /* the Arg reductions keep their indices: no rewrite */
    g = sr_mul(ctx, sr_exp(ctx, S), sr_scalprod(ctx, X, Y));
    check_all(g, SR_ARGMIN, 1, 1, NULL);
    check_all(g, SR_ARGMAX, 1, 1, NULL);
    check_all(g, SR_ARGKMIN, 1, 2, NULL);
    /* Sum-only rewrites do not apply to LogSumExp */
    check_all(g, SR_LOGSUMEXP, 1, 1, NULL);
}

Test(rewrite, kmin_vector_factor_with_k_above_one_stays)
{
    /* Per-component outer factor and K slots per component: not rewritten for K > 1. */
    sr_expr *g = sr_mul(ctx, sr_square(ctx, X), sr_sub(ctx, X, Y));
    check_all(g, SR_KMIN, 1, 2, NULL);
    check_all(g, SR_KMIN, 1, 1, "minmax-nonneg-factor");
}

/* ---- additive shifts ---- */

Test(rewrite, minmax_shift)
{
    sr_expr *g = sr_add(ctx, sr_sqdist(ctx, X, Y), sr_mul(ctx, S, sr_sqnorm2(ctx, X)));
    check_all(g, SR_MIN, 1, 1, "minmax-shift");
    check_all(g, SR_MAX, 1, 1, "minmax-shift");
    check_all(g, SR_KMIN, 1, 4, "minmax-shift");
    /* differences and negations, vector terms */
    check_all(sr_sub(ctx, S, sr_scalprod(ctx, X, Y)), SR_MIN, 1, 1, "minmax-shift");
    check_all(sr_sub(ctx, sr_sub(ctx, Y, X), S), SR_MAX, 1, 1, "minmax-shift");
    check_all(sr_add(ctx, sr_neg(ctx, X), sr_mul(ctx, B, Y)), SR_KMIN, 1, 1, "minmax-shift");
    check_all(sr_sub(ctx, B, sr_mul(ctx, S, Y)), SR_MIN, 0, 1, "minmax-shift");
}

Test(rewrite, logsumexp_shift)
{
    sr_expr *g = sr_add(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y)), sr_sqrt(ctx, sr_sqnorm2(ctx, X)));
    check_all(g, SR_LOGSUMEXP, 1, 1, "logsumexp-shift");
    check_all(sr_sub(ctx, sr_mul(ctx, S, X), sr_mul(ctx, B, Y)), SR_LOGSUMEXP, 1, 1,
              "logsumexp-shift");
    check_all(sr_add(ctx, B, sr_scalprod(ctx, X, Y)), SR_LOGSUMEXP, 0, 1, "logsumexp-shift");
    /* SumSoftMaxWeight: not rewritten */
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUMSOFTMAXWEIGHT;
    d.weight = Y;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, g, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_null(k->simp.post);
    sr_kernel_free(k);
}

/* ---- the switch, empty reductions, the reference ---- */

Test(rewrite, switch_off_and_reference_device)
{
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, S), sr_mul(ctx, gauss(), B));
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    sr_kernel *k = mk(f, SR_SUM, 1, 1, SR_F64, SR_DEVICE_CPU);
    cr_assert_null(k->simp.post);
    sr_kernel_free(k);
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", NULL);
    /* The reference records the plan (explain shows it) but runs the formula as given. */
    k = mk(f, SR_SUM, 1, 1, SR_F64, SR_DEVICE_REFERENCE);
    cr_assert_not_null(k->simp.post);
    cr_assert_str_eq(k->backend->name, "reference");
    cr_assert_eq(tu_plan(k).strategy, SR_STRATEGY_REFERENCE, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

Test(rewrite, empty_reduction_and_one_row)
{
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, S), sr_mul(ctx, gauss(), B));
    sr_expr *g = sr_add(ctx, S, sr_scalprod(ctx, X, Y));
    sr_kernel *k = mk(f, SR_SUM, 1, 1, SR_F64, SR_DEVICE_CPU);
    sr_kernel *km = mk(g, SR_MIN, 1, 1, SR_F64, SR_DEVICE_CPU);
    double x[6] = {1, 2, 3, 4, 5, 6}, y[3] = {1, 0, 1}, b[1] = {2}, s[2] = {0.5, -1}, out[2];
    const void *args[5] = {x, y, NULL, b, s};
    cr_assert_eq(sr_kernel_run(k, 2, 0, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(out[0] == 0 && out[1] == 0, "%g %g", out[0], out[1]);
    cr_assert_eq(sr_kernel_run(km, 2, 0, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(isinf(out[0]) && out[0] > 0, "%g", out[0]);
    cr_assert_eq(sr_kernel_run(k, 2, 1, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    double d0 = 0 + 4 + 4, want0 = exp(0.5) * exp(-d0) * 2;
    cr_assert(fabs(out[0] - want0) < 1e-12 * want0, "%.17g vs %.17g", out[0], want0);
    cr_assert_eq(sr_kernel_run(km, 2, 1, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(fabs(out[1] - (-1 + 4 + 6)) < 1e-12, "%g", out[1]);
    sr_kernel_free(k);
    sr_kernel_free(km);
}

/* ---- a property test: random inner formulas with random outer parts ---- */

static sr_expr *rnd_pair(uint64_t *rng)
{
    switch (tu_rand(rng) % 6) {
    case 0:
        return gauss();
    case 1:
        return sr_scalprod(ctx, X, Y);
    case 2:
        return sr_mul(ctx, B, sr_sqdist(ctx, X, W));
    case 3:
        return sr_sub(ctx, Y, sr_mul(ctx, S, W));
    case 4:
        return sr_sin(ctx, sr_add(ctx, sr_scalprod(ctx, X, W), B));
    default:
        return sr_mul(ctx, sr_inv(ctx, sr_add(ctx, sr_const(ctx, 1.0), sr_sqdist(ctx, X, Y))), Y);
    }
}

static sr_expr *rnd_side(uint64_t *rng)
{
    switch (tu_rand(rng) % 6) {
    case 0:
        return S;
    case 1:
        return sr_exp(ctx, S);
    case 2:
        return sr_sqnorm2(ctx, X);
    case 3:
        return sr_mul(ctx, P, X);
    case 4:
        return sr_abs(ctx, X);
    default:
        return sr_const(ctx, 3.0);
    }
}

Test(rewrite, random_outer_and_inner_parts)
{
    static const sr_reduction reds[] = {SR_SUM, SR_MIN, SR_MAX, SR_KMIN, SR_LOGSUMEXP};
    uint64_t rng = 2024;
    int fired = 0;
    for (int t = 0; t < 60; t++) {
        sr_expr *a = rnd_side(&rng), *g = rnd_pair(&rng);
        bool add = tu_rand(&rng) % 2;
        sr_expr *f = add ? sr_add(ctx, g, a) : sr_mul(ctx, a, g);
        if (!f) /* incompatible dimensions */
            continue;
        sr_reduction red = reds[tu_rand(&rng) % 5];
        int K = red == SR_KMIN ? 2 : 1;
        sr_kernel *k = mk(f, red, 1, K, SR_F64, SR_DEVICE_CPU);
        fired += k->simp.post != NULL;
        const char *rule = k->simp.post_rule;
        sr_kernel_free(k);
        check(f, red, 1, K, SR_F64, (int)(t % 2), 5000 + (uint64_t)t, rule);
    }
    cr_assert(fired > 20, "only %d rewrites fired", fired);
}

Test(rewrite, output_rows_in_chunks_under_a_memory_budget)
{
    /* 64 KiB budget: R (3 doubles a row) is computed 682 rows at a time. */
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 64 << 10), SR_OK, "%s", sr_ctx_error(ctx));
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, S), sr_mul(ctx, gauss(), W));
    sr_kernel *kc = mk(f, SR_SUM, 1, 1, SR_F64, SR_DEVICE_CPU);
    sr_kernel *kr = mk(f, SR_SUM, 1, 1, SR_F64, SR_DEVICE_REFERENCE);
    cr_assert_not_null(kc->simp.post);
    enum { N = 2000, M = 40 };
    static double x[N * 3], s[N], y[M * 3], w[M * 3], oc[N * 3], orf[N * 3];
    uint64_t rng = 7;
    fill(x, SR_F64, N * 3, &rng, 0);
    fill(s, SR_F64, N, &rng, 0);
    fill(y, SR_F64, M * 3, &rng, 0);
    fill(w, SR_F64, M * 3, &rng, 0);
    const void *args[6] = {x, y, NULL, NULL, s, w};
    cr_assert_eq(sr_kernel_run(kc, N, M, args, oc), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(kr, N, M, args, orf), SR_OK, "%s", sr_ctx_error(ctx));
    for (int t = 0; t < N * 3; t++)
        cr_assert(fabs(oc[t] - orf[t]) <= 1e-9 * (1 + fabs(orf[t])), "value %d: %.17g vs %.17g", t,
                  oc[t], orf[t]);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}
