/*
 * test-plan.c — kernel creation plans before it realises: explain lists the chosen plan and the
 * candidates it beat, each with its estimated time, its cost terms and why it lost or was
 * rejected; the choice is the feasible plan of least estimated time (the gemm-epilogue for a kNN
 * at D = 64 where a tile gemm exists, the direct strategy for a D = 3 Gaussian mat-vec with one
 * right-hand side, the fused two-product for 64), unless an option forces one (SYMRED_GEMM);
 * a plan whose smallest tiles do not fit in the memory budget is rejected, saying how much it
 * needs; a kernel whose reduction the simplifier rewrote lists its inner kernel's plans.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_BLIS");
    unsetenv("SYMRED_GEMM_KERNEL");
    unsetenv("SYMRED_DEVICE");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(plan, .init = setup, .fini = teardown);

static sr_kernel *knn(int D)
{
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 5;
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, sr_sqdist(ctx, x, y), &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* The line of explain that starts with "  <label> <strategy>:", or NULL. */
static const char *plan_line(const char *ex, const char *label, const char *strategy)
{
    char want[96];
    snprintf(want, sizeof want, "\n  %s %s: ", label, strategy);
    const char *p = strstr(ex, want);
    return p ? p + 1 : NULL;
}

/* Whether the line starting at line holds s. */
static bool line_has(const char *line, const char *s)
{
    const char *eol = strchr(line, '\n'), *c = strstr(line, s);
    return c && eol && c < eol;
}

/* A plan line states a cost: "<n> flops per pair"; a feasible plan's also an estimated time,
 * "est. <t> ns per pair". */
static void assert_costed(const char *line, const char *ex)
{
    cr_assert_not_null(line, "%s", ex);
    cr_assert(line_has(line, " flops per pair"), "no cost on the line:\n%s", ex);
    if (strncmp(line, "rejected:", 9) != 0)
        cr_assert(line_has(line, "est. ") && line_has(line, " ns per pair"),
                  "no estimated time on the line:\n%s", ex);
}

/* The estimated time on a plan line, or -1. */
static double est_of(const char *line)
{
    const char *e = strstr(line, "est. "), *eol = strchr(line, '\n');
    return e && eol && e < eol ? atof(e + 5) : -1;
}

/* The chosen plan's estimate is the least of the feasible plans' (none forced). */
static void assert_least(const char *ex)
{
    const char *c = strstr(ex, "\n  chosen: ");
    cr_assert_not_null(c, "%s", ex);
    double best = est_of(c + 1);
    cr_assert_gt(best, 0, "%s", ex);
    for (const char *a = strstr(ex, "\n  alternative: "); a; a = strstr(a + 1, "\n  alternative: "))
        cr_assert_geq(est_of(a + 1), best, "an alternative estimated faster than the choice:\n%s",
                      ex);
}

/* k's explain; skips the test when the reference runs k (no C compiler). */
static const char *jit_explain(sr_kernel *k)
{
    if (!tu_runs_jit(k))
        cr_skip_test("no C compiler: the reference runs it");
    return sr_kernel_explain(k);
}

/* The Gaussian mat-vec Exp(-SqDist(x, y)) b, D = 3, b of width R, on the CPU. */
static sr_kernel *gauss(int R)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *b = sr_vj(ctx, 2, R);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))), b);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

Test(plan, knn_d64_chooses_gemm_over_direct)
{
    sr_kernel *k = knn(64);
    const char *ex = sr_kernel_explain(k);
    cr_assert(strstr(ex, "plans (the feasible one of least estimated time chosen"), "%s", ex);
    assert_least(ex);
    if (cpu_avx512_usable() || tu_blis_usable()) {
        cr_assert_eq(tu_plan(k).strategy, SR_STRATEGY_GEMM_EPILOGUE, "%s", ex);
        const char *g = plan_line(ex, "chosen:", "gemm-epilogue");
        assert_costed(g, ex);
        cr_assert(strstr(g, "128 flops per pair in the tile product"), "%s", ex);
        cr_assert(strstr(g, "tiles 1024 x 512"), "%s", ex);
        assert_costed(plan_line(ex, "alternative:", "direct"), ex);
    } else {
        /* No tile gemm on this machine: the direct strategy, saying why not the gemm. */
        assert_costed(plan_line(ex, "chosen:", "direct"), ex);
        const char *g = plan_line(ex, "rejected:", "gemm-epilogue");
        assert_costed(g, ex);
        cr_assert(strstr(g, "no AVX-512F") || strstr(g, "SYMRED_GEMM_KERNEL"), "%s", ex);
    }
    /* ArgKMin writes indices: the fused two-product does not apply, and says so. */
    cr_assert_not_null(plan_line(ex, "rejected:", "fused two-product"), "%s", ex);
    sr_kernel_free(k);
}

Test(plan, gaussian_d3_chooses_direct)
{
    sr_kernel *k = gauss(1);
    const char *ex = jit_explain(k);
    assert_costed(plan_line(ex, "chosen:", "direct"), ex);
    assert_least(ex);
    /* The gemm-epilogue is rejected below the crossover, with the dimension, if offered. */
    const char *g = plan_line(ex, "rejected:", "gemm-epilogue");
    cr_assert_not_null(g, "%s", ex);
    cr_assert(strstr(g, "dimension 3, below the measured crossover") ||
                  strstr(g, "does not depend on the pair through one inner product"),
              "%s", ex);
    /* b is one value wide: the fused product is estimated slower, and says so. */
    if (cpu_avx512_usable() || tu_blis_usable()) {
        const char *f = plan_line(ex, "alternative:", "fused two-product");
        assert_costed(f, ex);
        cr_assert(line_has(f, "lost: estimated ") && line_has(f, "x the time of direct"), "%s", ex);
    }
    sr_kernel_free(k);
}

/* K @ B with B 64 wide: the fused two-product, the direct strategy a costed alternative. */
Test(plan, gaussian_r64_chooses_fused)
{
    sr_kernel *k = gauss(64);
    const char *ex = jit_explain(k);
    if (!cpu_avx512_usable() && !tu_blis_usable())
        cr_skip_test("no tile gemm: the fused two-product is not offered");
    assert_least(ex);
    cr_assert(tu_runs_fused(k), "%s", ex);
    /* The symmetric driver's plan wins the tie with the fused one (x and y may be one array). */
    const char *c = plan_line(ex, "chosen:", "symmetric fused two-product");
    if (!c)
        c = plan_line(ex, "chosen:", "fused two-product");
    assert_costed(c, ex);
    cr_assert(line_has(c, "tiles ") && line_has(c, "workspace at least"), "%s", ex);
    const char *d = plan_line(ex, "alternative:", "direct");
    assert_costed(d, ex);
    cr_assert(line_has(d, "lost: estimated "), "%s", ex);
    cr_assert_gt(est_of(d), 2 * est_of(c), "%s", ex);
    sr_kernel_free(k);
}

/* A memory budget below the fused two-product's smallest tiles rejects it, saying how much it
 * needs; the direct strategy, which needs less, runs. */
Test(plan, budget_rejects_with_bytes)
{
    if (!cpu_avx512_usable() && !tu_blis_usable())
        cr_skip_test("no tile gemm: the fused two-product is not offered");
    /* Below the smallest fused tiles of either micro-kernel (AVX-512's 14 x 16 need 14 KiB). */
    sr_ctx_set_mem_limit(ctx, 8192);
    sr_kernel *k = gauss(64);
    const char *ex = jit_explain(k);
    const char *f = plan_line(ex, "rejected:", "fused two-product");
    cr_assert_not_null(f, "%s", ex);
    cr_assert(line_has(f, "needs at least ") && line_has(f, "the budget allows 8192"), "%s", ex);
    long long need = atoll(strstr(f, "needs at least ") + 15);
    cr_assert_gt(need, 8192, "%s", ex);
    assert_costed(plan_line(ex, "chosen:", "direct"), ex);
    sr_kernel_free(k);
}

/* SYMRED_GEMM=on forces the gemm path where the formula allows it, whatever the estimates. */
Test(plan, forced_plan_wins)
{
    if (!cpu_avx512_usable() && !tu_blis_usable())
        cr_skip_test("no tile gemm");
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_GEMM", "on"), SR_OK);
    /* LogSumExp of an inner product at D = 8, below the gemm's crossover. */
    sr_expr *f = sr_scalprod(ctx, sr_vi(ctx, 0, 8), sr_vj(ctx, 1, 8));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_LOGSUMEXP;
    desc.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = jit_explain(k);
    const char *g = plan_line(ex, "chosen:", "gemm-epilogue");
    assert_costed(g, ex);
    const char *d = plan_line(ex, "alternative:", "direct");
    assert_costed(d, ex);
    cr_assert(line_has(d, "lost: an option forces gemm-epilogue"), "%s", ex);
    sr_kernel_free(k);
}

/* The choice follows the context's options: SYMRED_GEMM=off rejects the gemm, saying so. */
Test(plan, gemm_off_is_a_rejection_reason)
{
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_GEMM", "off"), SR_OK);
    sr_kernel *k = knn(64);
    const char *ex = jit_explain(k);
    assert_costed(plan_line(ex, "chosen:", "direct"), ex);
    const char *g = plan_line(ex, "rejected:", "gemm-epilogue");
    cr_assert(g && strstr(g, "SYMRED_GEMM=off"), "%s", ex);
    sr_kernel_free(k);
}

/* The reference backend has no candidates to choose from: explain lists none. */
Test(plan, reference_lists_no_plans)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(strstr(sr_kernel_explain(k), "plans (") == NULL, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

/* A kernel whose reduction the simplifier rewrote (a Sum of an output-row factor times the rest:
 * sum-factor) runs an inner kernel on the CPU: explain lists that kernel's plans, the chosen one
 * and the alternatives it beat with their estimated costs. */
Test(plan, sum_factor_rewrite_lists_inner_plans)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *a = sr_vi(ctx, 2, 1);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, a), sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = jit_explain(k);
    cr_assert_eq(tu_plan(k).strategy, SR_STRATEGY_POST_REWRITE, "%s", ex);
    cr_assert(strstr(ex, "sum-factor"), "%s", ex);
    cr_assert(strstr(ex, "plans (the feasible one of least estimated time chosen"), "%s", ex);
    assert_costed(plan_line(ex, "chosen:", "direct"), ex);
    assert_least(ex);
    cr_assert_not_null(plan_line(ex, "rejected:", "fused two-product"), "%s", ex);
    sr_kernel_free(k);
}
