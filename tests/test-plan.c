/*
 * test-plan.c — kernel creation plans before it realises: explain lists the chosen plan and the
 * candidates it beat, each with its estimated cost and why, and the choice is the one the
 * strategies' rules make (the gemm-epilogue for a kNN at D = 64 where a tile gemm exists, the
 * direct strategy for a D = 3 Gaussian, the direct strategy when SYMRED_GEMM=off).
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
    setenv("SYMRED_CACHE_DIR", "jit-test-cache", 1);
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

/* A plan line states a cost: "<n> flops per pair". */
static void assert_costed(const char *line, const char *ex)
{
    cr_assert_not_null(line, "%s", ex);
    const char *eol = strchr(line, '\n'), *c = strstr(line, " flops per pair");
    cr_assert(c && eol && c < eol, "no cost on the line:\n%s", ex);
}

Test(plan, knn_d64_chooses_gemm_over_direct)
{
    sr_kernel *k = knn(64);
    const char *ex = sr_kernel_explain(k);
    cr_assert(strstr(ex, "plans (in order of preference"), "%s", ex);
    if (cpu_avx512_usable() || tu_blis_usable()) {
        cr_assert(strstr(ex, "strategy: gemm-epilogue"), "%s", ex);
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
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *b = sr_vj(ctx, 2, 1);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))), b);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(k);
    if (!strstr(ex, "backend: cpu-jit"))
        cr_skip_test("no C compiler: the reference runs it");
    assert_costed(plan_line(ex, "chosen:", "direct"), ex);
    /* The gemm-epilogue is rejected below the crossover, with the dimension, if offered. */
    const char *g = plan_line(ex, "rejected:", "gemm-epilogue");
    cr_assert_not_null(g, "%s", ex);
    cr_assert(strstr(g, "dimension 3, below the measured crossover") ||
                  strstr(g, "does not depend on the pair through one inner product"),
              "%s", ex);
    /* b is one value wide: the fused product is not worth it. */
    cr_assert_not_null(plan_line(ex, "rejected:", "fused two-product"), "%s", ex);
    sr_kernel_free(k);
}

/* The choice follows the context's options: SYMRED_GEMM=off rejects the gemm, saying so. */
Test(plan, gemm_off_is_a_rejection_reason)
{
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_GEMM", "off"), SR_OK);
    sr_kernel *k = knn(64);
    const char *ex = sr_kernel_explain(k);
    if (!strstr(ex, "backend: cpu-jit"))
        cr_skip_test("no C compiler: the reference runs it");
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
