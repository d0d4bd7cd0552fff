/*
 * test-plan-info.c — sr_kernel_plan, the plan a kernel runs as data: the strategy and its name,
 * the backend, the device, the tiles, the workspace and threads, the tier and the fallback, for
 * each strategy (direct, gemm-epilogue, fused two-product, the reference device, a reduction
 * rewrite, a sum split), for a CPU kernel without a C compiler (the reference fallback, with its
 * reason), how the device was decided, and its argument checks and size rule (the struct may
 * grow).
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
    unsetenv("SYMRED_SIMPLIFY");
    unsetenv("SYMRED_CC");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(plan_info, .init = setup, .fini = teardown);

static sr_kernel *mk(sr_ctx *c, sr_expr *f, sr_reduction red, int k, sr_device dev)
{
    cr_assert_not_null(f, "%s", sr_ctx_error(c));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = k;
    d.device = dev;
    sr_kernel *out;
    cr_assert_eq(sr_kernel_new(c, f, &d, &out), SR_OK, "%s", sr_ctx_error(c));
    return out;
}

/* Exp(-SqDist(x, y)) b, D = 3, b of the reduced index and R wide. */
static sr_expr *gauss(sr_ctx *c, int R)
{
    sr_expr *x = sr_vi(c, 0, 3), *y = sr_vj(c, 1, 3), *b = sr_vj(c, 2, R);
    return sr_mul(c, sr_exp(c, sr_neg(c, sr_sqdist(c, x, y))), b);
}

/* What every plan states: its name is its strategy's, the workspace is
 * sr_kernel_workspace_bytes and at least the threads' parts, no compile is pending, and a kernel
 * that is not composed has inner == strategy. */
static sr_plan_info checked_plan(const sr_kernel *k)
{
    sr_plan_info p = tu_plan(k);
    const char *ex = sr_kernel_explain(k);
    cr_assert_eq(p.size, sizeof p, "%s", ex);
    cr_assert_str_eq(p.name, sr_strategy_name(p.strategy), "%s", ex);
    cr_assert_not_null(p.backend);
    cr_assert_eq(p.workspace_bytes, sr_kernel_workspace_bytes(k), "%s", ex);
    cr_assert_geq(p.threads, 1, "%s", ex);
    cr_assert_gt(p.workspace_per_thread, 0, "%s", ex);
    cr_assert_geq(p.workspace_bytes, p.workspace_per_thread * p.threads, "%s", ex);
    cr_assert_eq(p.compiling, 0, "%s", ex);
    if (p.strategy != SR_STRATEGY_SUM_SPLIT && p.strategy != SR_STRATEGY_POST_REWRITE)
        cr_assert_eq(p.inner, p.strategy, "%s", ex);
    return p;
}

/* A kernel of the CPU JIT's generated code: tiled, tier 1, on the CPU, no fallback. */
static void assert_compiled(const sr_plan_info *p, const sr_kernel *k)
{
    const char *ex = sr_kernel_explain(k);
    cr_assert_str_eq(p->backend, "cpu-jit", "%s", ex);
    cr_assert_eq(p->device, SR_DEVICE_CPU, "%s", ex);
    cr_assert_eq(p->tier, 1, "%s", ex);
    cr_assert_null(p->fallback, "%s", ex);
    cr_assert(p->tile_rows > 0 && p->tile_cols > 0, "tiles %d x %d:\n%s", p->tile_rows,
              p->tile_cols, ex);
}

/* A kernel of the reference interpreter: untiled, tier 0, one thread. */
static void assert_interpreted(const sr_plan_info *p, const sr_kernel *k)
{
    const char *ex = sr_kernel_explain(k);
    cr_assert_str_eq(p->backend, "reference", "%s", ex);
    cr_assert_eq(p->device, SR_DEVICE_REFERENCE, "%s", ex);
    cr_assert_eq(p->tier, 0, "%s", ex);
    cr_assert_eq(p->threads, 1, "%s", ex);
    cr_assert(p->tile_rows == 0 && p->tile_cols == 0, "%s", ex);
}

Test(plan_info, strategy_names)
{
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_REFERENCE), "reference");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_DIRECT), "direct");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_GEMM_EPILOGUE), "gemm-epilogue");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_FUSED), "fused two-product");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_SYMMETRIC), "symmetric fused two-product");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_SUM_SPLIT), "sum split");
    cr_assert_str_eq(sr_strategy_name(SR_STRATEGY_POST_REWRITE), "reduction rewrite");
    cr_assert_null(sr_strategy_name((sr_strategy)-1));
    cr_assert_null(sr_strategy_name((sr_strategy)(SR_STRATEGY_POST_REWRITE + 1)));
}

/* A D = 3 Gaussian with one right-hand side: the direct strategy. */
Test(plan_info, direct)
{
    sr_kernel *k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_DIRECT, "%s:\n%s", p.name, sr_kernel_explain(k));
    assert_compiled(&p, k);
    cr_assert(p.module && p.module_cache && p.compile_ms >= 0, "%s", sr_kernel_explain(k));
    cr_assert(p.plans > 0 && p.est_ns > 0, "%d plans, est. %g", p.plans, p.est_ns);
    cr_assert_eq(p.acc, SR_ACC_BLOCK);
    cr_assert_eq(p.eval_block, 1);
    cr_assert(p.simplified && p.formula, "%s", sr_kernel_explain(k));
    cr_assert(p.flops_per_pair > 0 && p.flops_per_pair_given > 0 && p.bytes_per_pair > 0, "%s",
              sr_kernel_explain(k));
    cr_assert(!p.compile_error && !p.rewrite && !p.tile_isa && !p.product, "%s",
              sr_kernel_explain(k));
    sr_kernel_free(k);
}

/*
 * The text of explain, for people, says what the plan says as data: the one place where the
 * tests read it (tests and programs read sr_kernel_plan; explain's wording is not an interface).
 * The formula as given and as run, the strategy, the memory budget and the workspace.
 */
Test(plan_info, explain_says_the_plan_in_words)
{
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 3 << 20), SR_OK);
    sr_expr *f = gauss(ctx, 1);
    sr_kernel *k = mk(ctx, f, SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    const char *ex = sr_kernel_explain(k);
    char given[512], run[512], ws[64];
    sr_expr_print(f, given, sizeof given);
    sr_expr_print(p.formula, run, sizeof run);
    snprintf(ws, sizeof ws, "workspace: %lld bytes", (long long)p.workspace_bytes);
    cr_assert(strstr(ex, given) && strstr(ex, run), "%s or %s not in:\n%s", given, run, ex);
    cr_assert(strstr(ex, p.name), "%s not in:\n%s", p.name, ex);
    cr_assert(strstr(ex, "memory budget: 3145728 bytes") && strstr(ex, ws), "%s", ex);
    sr_kernel_free(k);
}

/* A kNN at D = 64: the gemm-epilogue where a tile gemm exists, else the direct strategy. */
Test(plan_info, gemm_epilogue)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 64), sr_vj(ctx, 1, 64));
    sr_kernel *k = mk(ctx, f, SR_ARGKMIN, 5, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    sr_strategy want =
        cpu_avx512_usable() || tu_blis_usable() ? SR_STRATEGY_GEMM_EPILOGUE : SR_STRATEGY_DIRECT;
    cr_assert_eq(p.strategy, want, "%s, expected %s:\n%s", p.name, sr_strategy_name(want),
                 sr_kernel_explain(k));
    assert_compiled(&p, k);
    sr_kernel_free(k);
}

/* K @ B with B 64 wide: the fused two-product (its symmetric driver where BLIS serves it, the
 * formula being symmetric in x and y); a formula that is not symmetric runs the plain one. */
Test(plan_info, fused)
{
    sr_kernel *k = mk(ctx, gauss(ctx, 64), SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    cr_assert(p.strategy == SR_STRATEGY_FUSED || p.strategy == SR_STRATEGY_SYMMETRIC, "%s:\n%s",
              p.name, sr_kernel_explain(k));
    assert_compiled(&p, k);
    sr_kernel_free(k);

    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *b = sr_vj(ctx, 2, 64);
    sr_expr *y2 = sr_mul(ctx, y, sr_const(ctx, 2));
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y2))), b);
    k = mk(ctx, f, SR_SUM, 1, SR_DEVICE_CPU);
    p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_FUSED, "%s:\n%s", p.name, sr_kernel_explain(k));
    assert_compiled(&p, k);
    sr_kernel_free(k);
}

/* SR_DEVICE_REFERENCE: the interpreter, asked for, so no fallback. */
Test(plan_info, reference_device)
{
    sr_kernel *k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_REFERENCE);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_REFERENCE, "%s", p.name);
    assert_interpreted(&p, k);
    cr_assert_null(p.fallback);
    sr_kernel_free(k);
}

/* Exp(a_i) Exp(-SqDist(x, y)): the simplifier moves the output-row factor out of the Sum (a
 * reduction rewrite); the inner kernel's direct strategy does the pair work. */
static sr_expr *sum_factor(sr_ctx *c)
{
    sr_expr *x = sr_vi(c, 0, 3), *y = sr_vj(c, 1, 3), *a = sr_vi(c, 2, 1);
    return sr_mul(c, sr_exp(c, a), sr_exp(c, sr_neg(c, sr_sqdist(c, x, y))));
}

Test(plan_info, post_rewrite)
{
    sr_kernel *k = mk(ctx, sum_factor(ctx), SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_POST_REWRITE, "%s:\n%s", p.name, sr_kernel_explain(k));
    cr_assert_str_eq(p.name, "reduction rewrite");
    cr_assert_eq(p.inner, SR_STRATEGY_DIRECT, "%s:\n%s", sr_strategy_name(p.inner),
                 sr_kernel_explain(k));
    assert_compiled(&p, k);
    sr_kernel_free(k);
}

/* (SqDist(x, y) + c) Exp(-SqDist(x, y)) b with c and b 64 wide: two fused kernels whose outputs
 * add; the workspace is the split kernel's, the larger of its parts'. */
Test(plan_info, sum_split)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3);
    sr_expr *c = sr_vj(ctx, 2, 64), *b = sr_vj(ctx, 3, 64), *d = sr_sqdist(ctx, x, y);
    sr_expr *f = sr_mul(ctx, sr_mul(ctx, sr_add(ctx, d, c), sr_exp(ctx, sr_neg(ctx, d))), b);
    sr_kernel *k = mk(ctx, f, SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_SUM_SPLIT, "%s:\n%s", p.name, sr_kernel_explain(k));
    cr_assert_str_eq(p.name, "sum split");
    cr_assert(p.inner == SR_STRATEGY_FUSED || p.inner == SR_STRATEGY_SYMMETRIC, "%s:\n%s",
              sr_strategy_name(p.inner), sr_kernel_explain(k));
    assert_compiled(&p, k);
    sr_kernel_free(k);
}

/* SYMRED_CC naming no program: CPU kernels fall back to the tile interpreter (the direct
 * strategy at tier 0), and the plan says why, a reduction rewrite's included (its inner kernel
 * fell back). */
Test(plan_info, no_compiler_fallback)
{
    setenv("SYMRED_CC", "/nonexistent/cc", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    unsetenv("SYMRED_CC");
    sr_kernel *k = mk(c2, gauss(c2, 1), SR_SUM, 1, SR_DEVICE_CPU);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_DIRECT, "%s", p.name);
    cr_assert_str_eq(p.backend, "tile interpreter");
    cr_assert_eq(p.tier, 0);
    cr_assert_eq(p.compiling, 0);
    cr_assert_not_null(p.fallback);
    cr_assert(strstr(sr_kernel_explain(k), p.fallback), "explain does not give the reason %s:\n%s",
              p.fallback, sr_kernel_explain(k));
    sr_kernel_free(k);

    k = mk(c2, sum_factor(c2), SR_SUM, 1, SR_DEVICE_CPU);
    p = checked_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_POST_REWRITE, "%s", p.name);
    cr_assert_eq(p.inner, SR_STRATEGY_DIRECT, "%s", sr_strategy_name(p.inner));
    cr_assert_eq(p.tier, 0);
    cr_assert_not_null(p.fallback);
    sr_kernel_free(k);
    sr_ctx_free(c2);
}

/* The device: the one the desc names, else SR_DEVICE_AUTO's, the planner's choice (the CPU, or
 * the device SYMRED_DEVICE names); the plan and explain say how it was decided. */
Test(plan_info, device_choice)
{
    sr_kernel *k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_AUTO);
    sr_plan_info p = checked_plan(k);
    cr_assert_eq(p.device, SR_DEVICE_CPU, "%d", (int)p.device);
    cr_assert_str_eq(p.backend, "cpu-jit");
    cr_assert_not_null(p.device_why);
    cr_assert(strstr(p.device_why, "the planner chose the CPU"), "%s", p.device_why);
    cr_assert(strstr(sr_kernel_explain(k), p.device_why), "explain does not say %s:\n%s",
              p.device_why, sr_kernel_explain(k));
    sr_kernel_free(k);

    k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_CPU);
    p = checked_plan(k);
    cr_assert_str_eq(p.device_why, "the kernel's desc names it");
    sr_kernel_free(k);

    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_DEVICE", "reference"), SR_OK);
    k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_AUTO);
    p = checked_plan(k);
    cr_assert_eq(p.device, SR_DEVICE_REFERENCE, "%d", (int)p.device);
    cr_assert_str_eq(p.backend, "reference");
    cr_assert(strstr(p.device_why, "SYMRED_DEVICE"), "%s", p.device_why);
    sr_kernel_free(k);
}

Test(plan_info, invalid_arguments)
{
    sr_plan_info p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    cr_assert_eq(sr_kernel_plan(NULL, &p), SR_EINVAL);
    sr_kernel *k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_REFERENCE);
    cr_assert_eq(sr_kernel_plan(k, NULL), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "info is NULL"), "%s", sr_ctx_error(ctx));
    /* A size below the first version's: refused, nothing written. */
    memset(&p, 0x5a, sizeof p);
    p.size = offsetof(sr_plan_info, fallback);
    cr_assert_eq(sr_kernel_plan(k, &p), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "info->size"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(p.size, offsetof(sr_plan_info, fallback));
    cr_assert_eq((int)p.strategy, 0x5a5a5a5a);
    sr_kernel_free(k);
}

/* The struct may grow: a caller compiled with a larger one gets the members this library knows
 * and zeroes past them, with size saying how many bytes were filled; one compiled with the
 * first version (up to fallback) gets exactly those bytes. */
Test(plan_info, size_rule)
{
    sr_kernel *k = mk(ctx, gauss(ctx, 1), SR_SUM, 1, SR_DEVICE_REFERENCE);
    struct {
        sr_plan_info p;
        unsigned char later[64];
    } big;
    memset(&big, 0xa5, sizeof big);
    big.p.size = sizeof big;
    cr_assert_eq(sr_kernel_plan(k, &big.p), SR_OK);
    cr_assert_eq(big.p.size, sizeof(sr_plan_info));
    cr_assert_eq(big.p.strategy, SR_STRATEGY_REFERENCE);
    for (size_t i = 0; i < sizeof big.later; i++)
        cr_assert_eq(big.later[i], 0, "byte %zu past the struct is %#x", i, big.later[i]);

    const size_t v1 = offsetof(sr_plan_info, fallback) + sizeof(const char *);
    _Alignas(sr_plan_info) unsigned char buf[sizeof(sr_plan_info) + 16];
    memset(buf, 0xa5, sizeof buf);
    sr_plan_info *p = (sr_plan_info *)buf;
    p->size = v1;
    cr_assert_eq(sr_kernel_plan(k, p), SR_OK);
    cr_assert_eq(p->size, v1);
    cr_assert_eq(p->tier, 0);
    for (size_t i = v1; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0xa5, "byte %zu past the caller's size was written", i);
    sr_kernel_free(k);
}
