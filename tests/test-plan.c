/*
 * test-plan.c — kernel creation plans before it realises: sr_kernel_plan_candidate lists the
 * chosen plan and the candidates it beat, each with its estimated time, its cost terms and why
 * it was rejected or whether an option forced it; the choice is the feasible plan of least
 * estimated time (the gemm-epilogue for a kNN at D = 64 where a tile gemm exists, the direct
 * strategy for a D = 3 Gaussian mat-vec with one right-hand side, the fused two-product for 64),
 * unless an option forces one (SYMRED_GEMM); a plan whose smallest tiles do not fit in the memory
 * budget is rejected, saying how much it needs; a kernel whose reduction the simplifier rewrote
 * lists its inner kernel's plans.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stddef.h>
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

/* Candidate i of k's plan (sr_kernel_plan_candidate). */
static sr_plan_candidate cand(const sr_kernel *k, int i)
{
    sr_plan_candidate c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    cr_assert_eq(sr_kernel_plan_candidate(k, i, &c), SR_OK, "%s", sr_ctx_error(ctx));
    return c;
}

enum kind { CHOSEN, ALTERNATIVE, REJECTED };

/* The candidate of strategy s of that kind (chosen, a feasible alternative, rejected); fails
 * the test when k has none. */
static sr_plan_candidate find(const sr_kernel *k, sr_strategy s, enum kind kind)
{
    for (int i = 0; i < tu_plan(k).plans; i++) {
        sr_plan_candidate c = cand(k, i);
        enum kind ck = c.chosen ? CHOSEN : c.feasible ? ALTERNATIVE : REJECTED;
        if (c.strategy == s && ck == kind)
            return c;
    }
    static const char *const kinds[] = {"chosen", "alternative", "rejected"};
    cr_assert_fail("no %s %s candidate:\n%s", kinds[kind], sr_strategy_name(s),
                   sr_kernel_explain(k));
    return (sr_plan_candidate){0};
}

/* A candidate states a cost in flops per pair; a feasible one also an estimated time. */
static void assert_costed(sr_plan_candidate c, const sr_kernel *k)
{
    cr_assert(c.flops > 0 || c.gemm_flops > 0, "%s has no cost:\n%s", sr_strategy_name(c.strategy),
              sr_kernel_explain(k));
    if (c.feasible)
        cr_assert_gt(c.est_ns, 0, "%s has no estimated time:\n%s", sr_strategy_name(c.strategy),
                     sr_kernel_explain(k));
}

/* The chosen plan comes first, its estimate is the plan's and the least of the feasible
 * plans' (none forced). */
static void assert_least(const sr_kernel *k)
{
    sr_plan_info p = tu_plan(k);
    cr_assert_gt(p.plans, 0, "%s", sr_kernel_explain(k));
    sr_plan_candidate c = cand(k, 0);
    cr_assert(c.chosen && c.feasible && c.est_ns > 0, "%s", sr_kernel_explain(k));
    cr_assert_eq(c.est_ns, p.est_ns, "%s", sr_kernel_explain(k));
    for (int i = 1; i < p.plans; i++) {
        sr_plan_candidate a = cand(k, i);
        cr_assert(!a.chosen, "two chosen plans:\n%s", sr_kernel_explain(k));
        if (a.feasible)
            cr_assert_geq(a.est_ns, c.est_ns,
                          "an alternative estimated faster than the choice:\n%s",
                          sr_kernel_explain(k));
    }
}

/* Skips the test when the reference runs k (no C compiler). */
static void need_jit(sr_kernel *k)
{
    if (!tu_runs_jit(k))
        cr_skip_test("no C compiler: the reference runs it");
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
    assert_least(k);
    if (cpu_avx512_usable() || tu_blis_usable()) {
        cr_assert_eq(tu_plan(k).strategy, SR_STRATEGY_GEMM_EPILOGUE, "%s", ex);
        sr_plan_candidate g = find(k, SR_STRATEGY_GEMM_EPILOGUE, CHOSEN);
        assert_costed(g, k);
        cr_assert_eq(g.gemm_flops, 128, "%s", ex);
        cr_assert(g.tile_rows == 1024 && g.tile_cols == 512, "%s", ex);
        assert_costed(find(k, SR_STRATEGY_DIRECT, ALTERNATIVE), k);
    } else {
        /* No tile gemm on this machine: the direct strategy, saying why not the gemm. */
        assert_costed(find(k, SR_STRATEGY_DIRECT, CHOSEN), k);
        sr_plan_candidate g = find(k, SR_STRATEGY_GEMM_EPILOGUE, REJECTED);
        assert_costed(g, k);
        cr_assert(strstr(g.why, "no AVX-512F") || strstr(g.why, "SYMRED_GEMM_KERNEL"), "%s", g.why);
    }
    /* ArgKMin writes indices: the fused two-product does not apply, and says so. */
    cr_assert(find(k, SR_STRATEGY_FUSED, REJECTED).why[0], "%s", ex);
    sr_kernel_free(k);
}

Test(plan, gaussian_d3_chooses_direct)
{
    sr_kernel *k = gauss(1);
    need_jit(k);
    sr_plan_candidate d = find(k, SR_STRATEGY_DIRECT, CHOSEN);
    assert_costed(d, k);
    assert_least(k);
    /* The gemm-epilogue is rejected below the crossover, with the dimension, if offered. */
    sr_plan_candidate g = find(k, SR_STRATEGY_GEMM_EPILOGUE, REJECTED);
    cr_assert(strstr(g.why, "dimension 3, below the measured crossover") ||
                  strstr(g.why, "does not depend on the pair through one inner product"),
              "%s", g.why);
    /* b is one value wide: the fused product is estimated slower. */
    if (cpu_avx512_usable() || tu_blis_usable()) {
        sr_plan_candidate f = find(k, SR_STRATEGY_FUSED, ALTERNATIVE);
        assert_costed(f, k);
        cr_assert_gt(f.est_ns, d.est_ns, "%s", sr_kernel_explain(k));
    }
    sr_kernel_free(k);
}

/* K @ B with B 64 wide: the fused two-product, the direct strategy a costed alternative. */
Test(plan, gaussian_r64_chooses_fused)
{
    sr_kernel *k = gauss(64);
    need_jit(k);
    if (!cpu_avx512_usable() && !tu_blis_usable())
        cr_skip_test("no tile gemm: the fused two-product is not offered");
    const char *ex = sr_kernel_explain(k);
    assert_least(k);
    cr_assert(tu_runs_fused(k), "%s", ex);
    /* The symmetric driver's plan wins the tie with the fused one (x and y may be one array). */
    sr_plan_candidate c = cand(k, 0);
    cr_assert(c.strategy == SR_STRATEGY_SYMMETRIC || c.strategy == SR_STRATEGY_FUSED, "%s", ex);
    assert_costed(c, k);
    cr_assert(c.tile_rows > 0 && c.tile_cols > 0 && c.workspace_per_thread > 0, "%s", ex);
    sr_plan_candidate d = find(k, SR_STRATEGY_DIRECT, ALTERNATIVE);
    assert_costed(d, k);
    cr_assert_gt(d.est_ns, 2 * c.est_ns, "%s", ex);
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
    need_jit(k);
    const char *why = find(k, SR_STRATEGY_FUSED, REJECTED).why;
    const char *need = strstr(why, "needs at least ");
    cr_assert(need && strstr(why, "the budget allows 8192"), "%s", why);
    cr_assert_gt(atoll(need + 15), 8192, "%s", why);
    assert_costed(find(k, SR_STRATEGY_DIRECT, CHOSEN), k);
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
    need_jit(k);
    sr_plan_candidate g = find(k, SR_STRATEGY_GEMM_EPILOGUE, CHOSEN);
    assert_costed(g, k);
    cr_assert(g.forced, "%s", sr_kernel_explain(k));
    sr_plan_candidate d = find(k, SR_STRATEGY_DIRECT, ALTERNATIVE);
    assert_costed(d, k);
    cr_assert(!d.forced, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

/* The choice follows the context's options: SYMRED_GEMM=off rejects the gemm, saying so. */
Test(plan, gemm_off_is_a_rejection_reason)
{
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_GEMM", "off"), SR_OK);
    sr_kernel *k = knn(64);
    need_jit(k);
    assert_costed(find(k, SR_STRATEGY_DIRECT, CHOSEN), k);
    const char *why = find(k, SR_STRATEGY_GEMM_EPILOGUE, REJECTED).why;
    cr_assert(strstr(why, "SYMRED_GEMM=off"), "%s", why);
    sr_kernel_free(k);
}

/* The reference backend has no candidates to choose from; asking for one is refused. */
Test(plan, reference_lists_no_plans)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_plan_info p = tu_plan(k);
    cr_assert(p.plans == 0 && p.est_ns == 0, "%d plans, est. %g", p.plans, p.est_ns);
    sr_plan_candidate c;
    memset(&c, 0x5a, sizeof c);
    c.size = sizeof c;
    cr_assert_eq(sr_kernel_plan_candidate(k, 0, &c), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "candidate 0 of 0"), "%s", sr_ctx_error(ctx));
    cr_assert_eq((int)c.strategy, 0x5a5a5a5a, "written on a failure");
    cr_assert_eq(sr_kernel_plan_candidate(k, 0, NULL), SR_EINVAL);
    cr_assert_eq(sr_kernel_plan_candidate(NULL, 0, &c), SR_EINVAL);
    c.size = offsetof(sr_plan_candidate, why);
    cr_assert_eq(sr_kernel_plan_candidate(k, 0, &c), SR_EINVAL);
    sr_kernel_free(k);
}

/* A kernel whose reduction the simplifier rewrote (a Sum of an output-row factor times the rest:
 * sum-factor) runs an inner kernel on the CPU: its candidates are that kernel's, the chosen one
 * and the alternatives it beat with their estimated costs. */
Test(plan, sum_factor_rewrite_lists_inner_plans)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *a = sr_vi(ctx, 2, 1);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, a), sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    need_jit(k);
    sr_plan_info p = tu_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_POST_REWRITE, "%s", sr_kernel_explain(k));
    cr_assert(p.rewrite && strcmp(p.rewrite, "sum-factor") == 0, "rewrite %s", p.rewrite);
    assert_costed(find(k, SR_STRATEGY_DIRECT, CHOSEN), k);
    assert_least(k);
    cr_assert(find(k, SR_STRATEGY_FUSED, REJECTED).why[0], "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}
