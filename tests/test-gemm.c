/*
 * test-gemm.c — the gemm-epilogue strategy (src/cpu/gemm.c) against the reference interpreter.
 *
 * Every reduction the strategy serves (Sum with vector weights, Min, ArgMin, KMin, ArgKMin,
 * LogSumExp, SumSoftMaxWeight), D at and around the threshold (32, 100, 784), both axes, both
 * dtypes, sizes that are not multiples of any tile (1, 7, primes above the tile sizes), a budget
 * that shrinks the tiles, and the direct path when BLIS is switched off (SYMRED_GEMM=off) or
 * the formula does not qualify. Inputs are multiples of 1/8 in [-1, 1]: inner products and
 * norms are exact in float32, so distances, ties and arg indices match the reference exactly.
 * The tile's gemm is symred's AVX-512 one where the CPU has AVX-512F, else BLIS; every case runs
 * twice, the second time with SYMRED_GEMM_KERNEL=blis (suite gemm_blis), so both stay tested on an
 * AVX-512 machine; explain must name the kernel that ran. Where neither is available the
 * strategy is never chosen and the results must still match. The AVX-512 gemm itself is checked
 * against a plain loop at sizes that are multiples of no tile (0, 1, primes, tile +- 1).
 *
 * Tier 0: the suite gemm_tier0 runs a case of every family with SYMRED_JIT=off (no compiled
 * code: the tile interpreter evaluates the epilogue on the gemm's tiles and ranks the
 * selections' candidates again), gemm_async with SYMRED_JIT=async and an empty cache of its own
 * (the same on tier 0 while the epilogue compiles, then on tier 1 after sr_kernel_wait), each
 * checking the plan's strategy and tier.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/cpu.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static bool have_blis, have_avx512, force_blis;
/* The tier the suite's kernels start on: SYMRED_JIT=sync (1), off (0) or async (-1). */
static int tier_mode = 1;
static char async_cache[] = "/tmp/symred-gemm-async-XXXXXX";

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_BLIS");
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_GEMM_KERNEL");
    force_blis = false;
    have_avx512 = cpu_avx512_usable();
    unsetenv("SYMRED_MEM_LIMIT");
    unsetenv("SYMRED_NUM_THREADS");
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    have_blis = h != NULL && !getenv("BLIS_ARCH_TYPE");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
/* A new context for the suite, reading the environment as it is now. */
static void renew_ctx(void)
{
    sr_ctx_free(ctx);
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
/* Sets an option of the suite's context (the environment was read when it was created). */
static void set_opt(const char *name, const char *value)
{
    cr_assert_eq(sr_ctx_set_option(ctx, name, value), SR_OK, "%s", sr_ctx_error(ctx));
}
static void setup_blis(void)
{
    setup();
    set_opt("SYMRED_GEMM_KERNEL", "blis");
    force_blis = true;
}
static void setup_tier0(void)
{
    setup();
    set_opt("SYMRED_JIT", "off");
    tier_mode = 0;
}
static void setup_async(void)
{
    setup();
    memcpy(async_cache + strlen(async_cache) - 6, "XXXXXX", 6);
    cr_assert(mkdtemp(async_cache) != NULL);
    set_opt("SYMRED_CACHE_DIR", async_cache);
    set_opt("SYMRED_JIT", "async");
    tier_mode = -1;
}
static void teardown(void)
{
    sr_ctx_free(ctx);
    if (tier_mode < 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", async_cache);
        cr_assert_eq(system(cmd), 0);
    }
    tier_mode = 1;
    unsetenv("SYMRED_BLIS");
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_GEMM_KERNEL");
}
TestSuite(gemm, .init = setup, .fini = teardown);
TestSuite(gemm_blis, .init = setup_blis, .fini = teardown);
TestSuite(gemm_tier0, .init = setup_tier0, .fini = teardown);
TestSuite(gemm_async, .init = setup_async, .fini = teardown);

/* Multiples of 1/8 in [-1, 1]. */
static void *grid(sr_dtype dt, int64_t n, uint64_t *s)
{
    size_t esz = dt == SR_F64 ? 8 : 4;
    void *p = malloc(esz * (size_t)(n > 0 ? n : 1));
    for (int64_t t = 0; t < n; t++) {
        double v = round(tu_uniform(s, -1, 1) * 8) / 8;
        if (dt == SR_F64)
            ((double *)p)[t] = v;
        else
            ((float *)p)[t] = (float)v;
    }
    return p;
}

enum form { KNN, KNN_SCALED, GAUSS_SUM, LSE_DOT, SSMW_DOT };

struct gcase {
    enum form form;
    sr_reduction red;
    int D, K, axis;
    int64_t nx, ny;
    sr_dtype dt;
    bool expect_gemm;
};

/* Builds the formula of c in ctx: its argument dims are x (Vi D), y (Vj D), then b (Vj 3) for
 * the Gaussian sum and the weights, g (Pm 1) for the scaled products. */
static sr_expr *formula(const struct gcase *c, sr_expr **weight)
{
    sr_expr *x = sr_vi(ctx, 0, c->D), *y = sr_vj(ctx, 1, c->D);
    *weight = NULL;
    switch (c->form) {
    case KNN:
        return sr_sqdist(ctx, x, y);
    case KNN_SCALED: /* a parameter in F as given, which the selection ranks again */
        return sr_mul(ctx, sr_sqdist(ctx, x, y), sr_pm(ctx, 3, 1));
    case GAUSS_SUM: {
        /* exp(-|x-y|^2 / D) b, b of dimension 3: Sum with vector weights. */
        sr_expr *g = sr_pm(ctx, 3, 1);
        return sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g))),
                      sr_vj(ctx, 2, 3));
    }
    case LSE_DOT:
        return sr_mul(ctx, sr_scalprod(ctx, x, y), sr_pm(ctx, 3, 1));
    default:
        *weight = sr_vj(ctx, 2, 3);
        return sr_mul(ctx, sr_scalprod(ctx, x, y), sr_pm(ctx, 3, 1));
    }
}

static void compare(const struct gcase *c, const void *o1, const void *o2, int64_t n, bool idx);

static void run_case(const struct gcase *c)
{
    uint64_t s = 1234 + (uint64_t)c->D * 7 + (uint64_t)c->red;
    sr_expr *w;
    sr_expr *f = formula(c, &w);
    cr_assert_not_null(f, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = c->red;
    d.k = c->K;
    d.axis = c->axis;
    d.dtype = c->dt;
    d.weight = w;
    sr_kernel *kg, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kg), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(kg);
    /* SumSoftMaxWeight of a plain weight variable, and the Gaussian times b (3 wide), may run
     * on the fused two-product strategy (test-wide.c) when the planner estimates it faster: its
     * tile of F comes from the same gemm of inner products. */
    const sr_plan_info plan = tu_plan(kg);
    bool gemm =
        plan.inner == SR_STRATEGY_GEMM_EPILOGUE ||
        ((c->form == SSMW_DOT || c->form == GAUSS_SUM) && tu_runs_fused(kg) && plan.dot_dim > 0);
    bool avx512 = have_avx512 && !force_blis, avail = avx512 || have_blis;
    if (c->expect_gemm && avail)
        cr_assert(gemm, "expected the gemm-epilogue strategy:\n%s", ex);
    if (!c->expect_gemm || !avail)
        cr_assert(!gemm, "expected the direct strategy:\n%s", ex);
    /* The fused strategy's float32 products without AVX-512F: symred's AVX2 strip products
     * (test-wide.c) unless SYMRED_GEMM_KERNEL=blis. */
    bool strips =
        !avx512 && !force_blis && c->dt == SR_F32 && cpu_avx2_usable() && tu_runs_fused(kg);
    const char *kname = avx512 ? "avx512" : strips ? "avx2" : "blis", *prod = plan.product;
    if (gemm)
        cr_assert(prod && strcmp(prod, kname) == 0, "expected %s:\n%s", kname, ex);
    if (gemm) /* the inner products of this D */
        cr_assert_eq(plan.dot_dim, c->D, "%s", ex);
    if (gemm && avx512) /* and their blocking */
        cr_assert(plan.dot_mr == 14 && plan.dot_nr == (c->dt == SR_F64 ? 16 : 32) &&
                      plan.dot_kc > 0 && plan.dot_kc <= c->D,
                  "micro-kernel %dx%d, K block %d\n%s", plan.dot_mr, plan.dot_nr, plan.dot_kc, ex);

    int nargs = sr_kernel_nargs(kg);
    void *x = grid(c->dt, c->nx * c->D, &s), *y = grid(c->dt, c->ny * c->D, &s);
    void *b = grid(c->dt, c->ny * 3, &s);
    double g64 = 1.0 / c->D;
    float g32 = (float)g64;
    const void *args[4] = {x, y, b, c->dt == SR_F64 ? (const void *)&g64 : (const void *)&g32};
    int64_t nout = c->axis == 1 ? c->nx : c->ny;
    int od = sr_kernel_out_dim(kg);
    bool idx = c->red == SR_ARGMIN || c->red == SR_ARGKMIN;
    size_t esz = idx ? 8 : c->dt == SR_F64 ? 8 : 4;
    void *o1 = calloc((size_t)(nout * od), esz), *o2 = calloc((size_t)(nout * od), esz);
    cr_assert_eq(nargs, c->form == KNN ? 2 : 4);
    cr_assert_eq(sr_kernel_run(kr, c->nx, c->ny, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    /* Tier 0 (SYMRED_JIT=off, or async before the compile ends), then for async tier 1. */
    for (int pass = 0; pass < (tier_mode < 0 ? 2 : 1); pass++) {
        sr_plan_info pi = tu_plan(kg);
        /* (The fused two-product, which a Sum of F * B or SumSoftMaxWeight may take, is
         * compiled when the kernel is created.) */
        gemm = pi.inner == SR_STRATEGY_GEMM_EPILOGUE;
        if (gemm && tier_mode == 0)
            cr_assert(pi.tier == 0 && !pi.compiling, "tier %d compiling %d", pi.tier, pi.compiling);
        if (gemm && tier_mode < 0 && pass == 0) /* the epilogue compiles into an empty cache */
            cr_assert(pi.tier == 0 && pi.compiling && !pi.module, "tier %d compiling %d\n%s",
                      pi.tier, pi.compiling, ex);
        if (tier_mode < 0 && pass == 1) {
            cr_assert_eq(sr_kernel_wait(kg, -1), SR_OK, "%s", sr_ctx_error(ctx));
            pi = tu_plan(kg);
            cr_assert(pi.tier == 1 && !pi.compiling, "tier %d compiling %d", pi.tier, pi.compiling);
            cr_assert(!gemm || pi.module, "%s", sr_kernel_explain(kg));
        }
        memset(o1, 0xff, (size_t)(nout * od) * esz);
        cr_assert_eq(sr_kernel_run(kg, c->nx, c->ny, args, o1), SR_OK, "%s", sr_ctx_error(ctx));
        compare(c, o1, o2, nout * od, idx);
    }
    sr_kernel_free(kg);
    sr_kernel_free(kr);
    free(x);
    free(y);
    free(b);
    free(o1);
    free(o2);
}

/* Compares the kernel's outputs o1 with the reference's o2 (n values, or indices when idx). */
static void compare(const struct gcase *c, const void *o1, const void *o2, int64_t n, bool idx)
{
    double rtol = c->dt == SR_F64 ? 1e-11 : 2e-5;
    for (int64_t t = 0; t < n; t++) {
        if (idx) {
            int64_t a = ((int64_t *)o1)[t], e = ((int64_t *)o2)[t];
            cr_assert_eq(a, e, "D %d red %d [%lld]: index %lld, reference %lld", c->D, c->red,
                         (long long)t, (long long)a, (long long)e);
        } else {
            double a = c->dt == SR_F64 ? ((double *)o1)[t] : ((float *)o1)[t];
            double e = c->dt == SR_F64 ? ((double *)o2)[t] : ((float *)o2)[t];
            cr_assert(tu_close(a, e, rtol, rtol), "D %d red %d [%lld]: %.9g, reference %.9g", c->D,
                      c->red, (long long)t, a, e);
        }
    }
}

#define GCASE(suite, name, ...)                                                                    \
    Test(suite, name)                                                                              \
    {                                                                                              \
        struct gcase c = {__VA_ARGS__};                                                            \
        run_case(&c);                                                                              \
    }
#define CASE(name, ...) GCASE(gemm, name, __VA_ARGS__) GCASE(gemm_blis, name, __VA_ARGS__)

/* kNN-type reductions of SqDist (rewritten to norms + inner product from D = 32). */
CASE(argkmin_d32, KNN, SR_ARGKMIN, 32, 10, 1, 523, 1031, SR_F32, true)
CASE(argkmin_d100, KNN, SR_ARGKMIN, 100, 7, 1, 7, 1031, SR_F32, true)
CASE(argkmin_d784, KNN, SR_ARGKMIN, 784, 10, 1, 7, 1031, SR_F32, true)
CASE(kmin_d100, KNN, SR_KMIN, 100, 5, 1, 13, 2053, SR_F32, true)
CASE(kmin_d784_one_row, KNN, SR_KMIN, 784, 3, 1, 1, 1031, SR_F32, true)
CASE(argmin_d32, KNN, SR_ARGMIN, 32, 1, 1, 131, 1031, SR_F32, true)
CASE(argmin_d784_one_col, KNN, SR_ARGMIN, 784, 1, 1, 7, 1, SR_F32, true)
CASE(min_d100_axis0, KNN, SR_MIN, 100, 1, 0, 1031, 7, SR_F32, true)
CASE(argkmin_d100_f64, KNN, SR_ARGKMIN, 100, 4, 1, 300, 257, SR_F64, true)
CASE(argmin_d100_split, KNN, SR_ARGMIN, 100, 1, 1, 3, 20011, SR_F32, true)
/* Three row blocks of 1024 rebalanced to four of 525 for two threads, states kept across tiles
 * of 512 reduced indices (the K-th value rejects whole blocks of candidates; ties on the grid). */
CASE(argkmin_d32_row_blocks, KNN, SR_ARGKMIN, 32, 10, 1, 2100, 1543, SR_F32, true)
/* Sum with vector weights, LogSumExp, SumSoftMaxWeight. */
CASE(sum_gauss_d32, GAUSS_SUM, SR_SUM, 32, 1, 1, 523, 1031, SR_F32, true)
CASE(sum_gauss_d784, GAUSS_SUM, SR_SUM, 784, 1, 1, 7, 1031, SR_F32, true)
CASE(sum_gauss_d100_f64_axis0, GAUSS_SUM, SR_SUM, 100, 1, 0, 1031, 13, SR_F64, true)
CASE(lse_d32, LSE_DOT, SR_LOGSUMEXP, 32, 1, 1, 131, 1031, SR_F32, true)
CASE(lse_d784, LSE_DOT, SR_LOGSUMEXP, 784, 1, 1, 7, 1031, SR_F32, true)
CASE(lse_d100_split, LSE_DOT, SR_LOGSUMEXP, 100, 1, 1, 2, 20011, SR_F32, true)
CASE(ssmw_d32, SSMW_DOT, SR_SUMSOFTMAXWEIGHT, 32, 1, 1, 131, 1031, SR_F32, true)
CASE(ssmw_d784, SSMW_DOT, SR_SUMSOFTMAXWEIGHT, 784, 1, 1, 7, 1031, SR_F32, true)
CASE(ssmw_d100_f64, SSMW_DOT, SR_SUMSOFTMAXWEIGHT, 100, 1, 1, 67, 300, SR_F64, true)
/* Tier 0: a case of every family the gemm path serves; async (each a compile or two): a few. */
#define CASE0(name, ...) GCASE(gemm_tier0, name, __VA_ARGS__)
#define CASEA(name, ...) CASE0(name, __VA_ARGS__) GCASE(gemm_async, name, __VA_ARGS__)
CASEA(argkmin_d32, KNN, SR_ARGKMIN, 32, 10, 1, 523, 1031, SR_F32, true)
CASE0(argkmin_d32_row_blocks, KNN, SR_ARGKMIN, 32, 10, 1, 2100, 1543, SR_F32, true)
CASE0(argkmin_d784_f64_axis0, KNN, SR_ARGKMIN, 784, 3, 0, 1031, 7, SR_F64, true)
CASE0(kmin_d100, KNN, SR_KMIN, 100, 5, 1, 13, 2053, SR_F32, true)
CASE0(argkmin_scaled_d100, KNN_SCALED, SR_ARGKMIN, 100, 6, 1, 37, 1031, SR_F32, true)
CASE0(kmin_d784_one_row, KNN, SR_KMIN, 784, 3, 1, 1, 1031, SR_F32, true)
CASE0(argmin_d784_one_col, KNN, SR_ARGMIN, 784, 1, 1, 7, 1, SR_F32, true)
CASE0(argmin_d100_split, KNN, SR_ARGMIN, 100, 1, 1, 3, 20011, SR_F32, true)
CASE0(argkmin_d32_no_rows, KNN, SR_ARGKMIN, 32, 2, 1, 0, 31, SR_F32, true)
CASEA(min_d100_axis0, KNN, SR_MIN, 100, 1, 0, 1031, 7, SR_F32, true)
CASEA(sum_gauss_d100_f64_axis0, GAUSS_SUM, SR_SUM, 100, 1, 0, 1031, 13, SR_F64, true)
CASEA(lse_d784, LSE_DOT, SR_LOGSUMEXP, 784, 1, 1, 7, 1031, SR_F32, true)
CASE0(lse_d100_split, LSE_DOT, SR_LOGSUMEXP, 100, 1, 1, 2, 20011, SR_F32, true)
CASE0(ssmw_d100_f64, SSMW_DOT, SR_SUMSOFTMAXWEIGHT, 100, 1, 1, 67, 300, SR_F64, true)

/* No compiler at all (the default SYMRED_JIT=async): the kNN kernel still takes the
 * gemm-epilogue, on tier 0 for good, and explain says why. */
Test(gemm_tier0, no_compiler)
{
    sr_ctx *c2 = NULL;
    setenv("SYMRED_CC", "/nonexistent/cc", 1);
    setenv("SYMRED_JIT", "async", 1);
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_JIT");
    sr_expr *f = sr_sqdist(c2, sr_vi(c2, 0, 784), sr_vj(c2, 1, 784));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 3;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(c2, f, &d, &k), SR_OK, "%s", sr_ctx_error(c2));
    sr_plan_info pi = tu_plan(k);
    bool avail = have_avx512 || have_blis;
    cr_assert(!avail || (pi.strategy == SR_STRATEGY_GEMM_EPILOGUE && pi.tier == 0 && !pi.compiling),
              "strategy %d tier %d compiling %d", (int)pi.strategy, pi.tier, pi.compiling);
    cr_assert_eq(sr_kernel_wait(k, 0), SR_OK);
    const char *ex = sr_kernel_explain(k);
    pi = tu_plan(k);
    cr_assert(pi.fallback && strstr(pi.fallback, "no C compiler"), "%s", ex);
    /* Row i of x is row 2 i + 1 of y: its nearest neighbours are 2 i + 1, then 2 i and 2 i + 2
     * (equal distances, the lower index first). */
    enum { NQ = 5, NY = 13 };
    float x[NQ * 784], y[NY * 784];
    for (int j = 0; j < NY; j++)
        for (int c = 0; c < 784; c++)
            y[j * 784 + c] = (float)j / 8;
    for (int i = 0; i < NQ; i++)
        memcpy(x + i * 784, y + (2 * i + 1) * 784, sizeof(float) * 784);
    int64_t out[NQ * 3];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, NQ, NY, args, out), SR_OK, "%s", sr_ctx_error(c2));
    for (int i = 0; i < NQ; i++) {
        int64_t want[3] = {2 * i + 1, 2 * i, 2 * i + 2};
        for (int q = 0; q < 3; q++)
            cr_assert_eq(out[i * 3 + q], want[q], "row %d [%d]: %lld, expected %lld", i, q,
                         (long long)out[i * 3 + q], (long long)want[q]);
    }
    sr_kernel_free(k);
    sr_ctx_free(c2);
}

/* Below the threshold: the direct strategy. */
CASE(below_threshold_direct, LSE_DOT, SR_LOGSUMEXP, 16, 1, 1, 131, 1031, SR_F32, false)
CASE(just_below_threshold_direct, LSE_DOT, SR_LOGSUMEXP, 23, 1, 1, 131, 1031, SR_F32, false)
CASE(at_threshold_gemm, LSE_DOT, SR_LOGSUMEXP, 24, 1, 1, 131, 1031, SR_F32, true)

Test(gemm, forced_on_below_threshold)
{
    set_opt("SYMRED_GEMM", "on");
    struct gcase c = {LSE_DOT, SR_LOGSUMEXP, 7, 1, 1, 61, 1031, SR_F32, true};
    run_case(&c);
}

Test(gemm, blis_off_direct)
{
    set_opt("SYMRED_BLIS", "off");
    struct gcase c = {KNN, SR_ARGKMIN, 100, 10, 1, 61, 1031, SR_F32, false};
    run_case(&c);
    struct gcase c2 = {SSMW_DOT, SR_SUMSOFTMAXWEIGHT, 100, 1, 1, 61, 1031, SR_F32, false};
    run_case(&c2);
}

/* SYMRED_BLIS is the older name of SYMRED_GEMM: it still works, and SYMRED_GEMM wins. */
Test(gemm, gemm_off_direct_and_older_name)
{
    setenv("SYMRED_GEMM", "off", 1);
    renew_ctx();
    struct gcase c = {KNN, SR_ARGKMIN, 100, 10, 1, 61, 1031, SR_F32, false};
    run_case(&c);
    setenv("SYMRED_BLIS", "on", 1);
    renew_ctx();
    run_case(&c);
    unsetenv("SYMRED_GEMM");
    renew_ctx();
    struct gcase on = {LSE_DOT, SR_LOGSUMEXP, 7, 1, 1, 61, 1031, SR_F32, true};
    run_case(&on);
}

/* A malformed value of either name is SR_EINVAL naming the variable that was read. */
Test(gemm, gemm_malformed)
{
    static const char *const names[] = {"SYMRED_GEMM", "SYMRED_BLIS"};
    for (int t = 0; t < 2; t++) {
        unsetenv("SYMRED_GEMM");
        setenv(names[t], "sometimes", 1);
        sr_ctx *c;
        cr_assert_eq(sr_ctx_new(&c), SR_OK);
        unsetenv(names[t]);
        sr_expr *f = sr_scalprod(c, sr_vi(c, 0, 64), sr_vj(c, 1, 64));
        sr_kernel_desc d = sr_kernel_desc_default();
        sr_kernel *k;
        cr_assert_eq(sr_kernel_new(c, f, &d, &k), SR_EINVAL);
        char want[64];
        snprintf(want, sizeof want, "%s=sometimes", names[t]);
        cr_assert(strstr(sr_ctx_error(c), want), "%s", sr_ctx_error(c));
        sr_ctx_free(c);
        cr_assert_eq(sr_ctx_set_option(ctx, names[t], "sometimes"), SR_EINVAL);
        cr_assert(strstr(sr_ctx_error(ctx), want), "%s", sr_ctx_error(ctx));
    }
}

/* Two different inner products, or one of expressions: not one gemm, the direct strategy. */
Test(gemm, not_qualifying_direct)
{
    sr_expr *x = sr_vi(ctx, 0, 64), *y = sr_vj(ctx, 1, 64), *z = sr_vj(ctx, 2, 64);
    sr_expr *f = sr_add(ctx, sr_scalprod(ctx, x, y), sr_scalprod(ctx, x, z));
    sr_expr *f2 = sr_scalprod(ctx, sr_exp(ctx, x), y);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(tu_plan(k).inner, SR_STRATEGY_DIRECT, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
    cr_assert_eq(sr_kernel_new(ctx, f2, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(tu_plan(k).inner, SR_STRATEGY_DIRECT, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

/* A budget that shrinks the tiles: same results, workspace within the budget. */
Test(gemm, small_budget)
{
    sr_ctx_set_mem_limit(ctx, 600 << 10);
    struct gcase c = {KNN, SR_ARGKMIN, 100, 10, 1, 523, 1031, SR_F32, true};
    run_case(&c);
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 100), sr_vj(ctx, 1, 100));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 10;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_leq(sr_kernel_workspace_bytes(k), 600 << 10, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

/* ---- selections ranked again by F as given (gemm.c, "ranking the candidates again") ---- */

/* A kernel of the test context reducing SqDist(x, y), x = Vi(D), y = Vj(D), by red (K, axis,
 * dtype as given). */
static sr_kernel *knn_kernel(sr_reduction red, int K, int axis, sr_dtype dt, int D)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, D), sr_vj(ctx, 1, D));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = K;
    d.axis = axis;
    d.dtype = dt;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* Near ties that the float32 expansion |x|^2 + |y|^2 - 2<x, y> cannot order: query i sits at a
 * centre c_i (coordinates in [2, 6], |c|^2 ~ 1000, where float32's spacing is 6e-5) and has six
 * neighbours c_i + s e_a at squared distances 1 + 3e-5 q, q = 0..5, on random axes a, in shuffled
 * index order; the other queries' neighbours are ~80 away. The truth (double, from the float32
 * inputs) is the order of q. The gemm path keeps 7 candidates, so all six are among them, and
 * must find the truth exactly; without the ranking (SYMRED_GEMM_REFINE=off) it must not, which
 * shows that the case tests something. */
Test(gemm, selection_near_ties_exact)
{
    if (!have_avx512 && !have_blis)
        cr_skip_test("neither AVX-512F nor BLIS: the gemm path is never chosen, nothing to rank");
    enum { D = 64, NX = 24, NN = 6, NY = NX * NN, K = 3 };
    uint64_t s = 99;
    float *x = malloc(sizeof(float) * NX * D), *y = malloc(sizeof(float) * NY * D);
    for (int i = 0; i < NX; i++)
        for (int c = 0; c < D; c++)
            x[i * D + c] = (float)tu_uniform(&s, 2, 6);
    int perm[NY];
    for (int j = 0; j < NY; j++)
        perm[j] = j;
    for (int j = NY - 1; j > 0; j--) { /* shuffle: index order is not distance order */
        int r = (int)(tu_rand(&s) % (uint64_t)(j + 1)), t = perm[j];
        perm[j] = perm[r];
        perm[r] = t;
    }
    for (int i = 0; i < NX; i++)
        for (int q = 0; q < NN; q++) {
            float *yj = y + (size_t)perm[i * NN + q] * D;
            memcpy(yj, x + i * D, sizeof(float) * D);
            yj[tu_rand(&s) % D] += (float)sqrt(1.0 + 3e-5 * q);
        }
    int64_t truth[NX * K];
    for (int i = 0; i < NX; i++) {
        double best[K];
        for (int q = 0; q < K; q++) {
            best[q] = INFINITY;
            truth[i * K + q] = -1;
        }
        for (int j = 0; j < NY; j++) {
            double d2 = 0;
            for (int c = 0; c < D; c++) {
                double t = (double)x[i * D + c] - (double)y[j * D + c];
                d2 += t * t;
            }
            for (int q = 0; q < K; q++)
                if (d2 < best[q]) {
                    for (int r = K - 1; r > q; r--) {
                        best[r] = best[r - 1];
                        truth[i * K + r] = truth[i * K + r - 1];
                    }
                    best[q] = d2;
                    truth[i * K + q] = j;
                    break;
                }
        }
    }
    const void *args[2] = {x, y};
    int64_t idx[NX * K];
    int wrong_unranked = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            set_opt("SYMRED_GEMM_REFINE", "off");
        sr_kernel *k = knn_kernel(SR_ARGKMIN, K, 1, SR_F32, D);
        const char *ex = sr_kernel_explain(k);
        cr_assert_eq(tu_plan(k).inner, SR_STRATEGY_GEMM_EPILOGUE, "%s", ex);
        cr_assert_eq(tu_plan(k).rerank, pass == 0, "%s", ex);
        cr_assert_eq(sr_kernel_run(k, NX, NY, args, idx), SR_OK, "%s", sr_ctx_error(ctx));
        for (int t = 0; t < NX * K; t++) {
            if (pass == 0)
                cr_assert_eq(idx[t], truth[t], "query %d rank %d: %lld, truth %lld", t / K, t % K,
                             (long long)idx[t], (long long)truth[t]);
            else
                wrong_unranked += idx[t] != truth[t];
        }
        sr_kernel_free(k);
    }
    set_opt("SYMRED_GEMM_REFINE", NULL);
    cr_assert_gt(wrong_unranked, 0, "the expansion alone ordered every near tie: no test");
    free(x);
    free(y);
}

/* The ranked selections equal the direct strategy's on F as given (SYMRED_GEMM=off,
 * SYMRED_SIMPLIFY=0), values and indices bit for bit, ties (grid inputs) by index: KMin_ArgKMin
 * and KMin on both axes, both dtypes, the split of the reduced range (3 rows) and K more than the
 * candidates' margin; Min_ArgMin and ArgMin, which are not ranked (NaN), equal it too here. */
Test(gemm, selection_equals_direct)
{
    static const struct {
        sr_reduction red;
        int K, axis;
        int64_t nx, ny;
        sr_dtype dt;
    } cases[] = {
        {SR_KMIN_ARGKMIN, 5, 1, 131, 1031, SR_F32}, {SR_MIN_ARGMIN, 1, 1, 131, 1031, SR_F32},
        {SR_KMIN, 4, 0, 1031, 67, SR_F32},          {SR_ARGMIN, 1, 0, 257, 61, SR_F64},
        {SR_KMIN_ARGKMIN, 7, 1, 3, 20011, SR_F32},  {SR_KMIN_ARGKMIN, 40, 1, 61, 523, SR_F64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        uint64_t s = 7 + c;
        enum { D = 100 };
        sr_dtype dt = cases[c].dt;
        void *x = grid(dt, cases[c].nx * D, &s), *y = grid(dt, cases[c].ny * D, &s);
        const void *args[2] = {x, y};
        int64_t nout = cases[c].axis == 1 ? cases[c].nx : cases[c].ny, n = nout * cases[c].K;
        size_t es = dt == SR_F64 ? 8 : 4;
        char *v[2] = {calloc((size_t)n, es), calloc((size_t)n, es)};
        int64_t *ix[2] = {calloc((size_t)n, 8), calloc((size_t)n, 8)};
        const struct sr_reduction_info *ri = &sr_reductions[cases[c].red];
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1) {
                set_opt("SYMRED_BLIS", "off");
                set_opt("SYMRED_SIMPLIFY", "0");
            }
            sr_kernel *k = knn_kernel(cases[c].red, cases[c].K, cases[c].axis, dt, D);
            const char *ex = sr_kernel_explain(k);
            bool kred = cases[c].red == SR_KMIN || cases[c].red == SR_KMIN_ARGKMIN;
            if (pass == 0 && (have_avx512 || have_blis))
                cr_assert_eq(tu_plan(k).rerank, kred, "case %zu:\n%s", c, ex);
            sr_run_desc r = {cases[c].nx,
                             cases[c].ny,
                             2,
                             args,
                             ri->values ? v[pass] : NULL,
                             ri->indices ? ix[pass] : NULL};
            cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK, "%s", sr_ctx_error(ctx));
            sr_kernel_free(k);
        }
        set_opt("SYMRED_BLIS", NULL);
        set_opt("SYMRED_GEMM", NULL);
        set_opt("SYMRED_SIMPLIFY", NULL);
        cr_assert(memcmp(v[0], v[1], (size_t)n * es) == 0, "case %zu: values differ", c);
        for (int64_t t = 0; t < n; t++)
            cr_assert_eq(ix[0][t], ix[1][t], "case %zu [%lld]: index %lld, direct %lld", c,
                         (long long)t, (long long)ix[0][t], (long long)ix[1][t]);
        free(x);
        free(y);
        for (int p = 0; p < 2; p++) {
            free(v[p]);
            free(ix[p]);
        }
    }
}

/* Whether k's gemm-epilogue candidate was rejected for a reason that names what. */
static bool gemm_rejected_for(const sr_kernel *k, const char *what)
{
    for (int i = 0; i < tu_plan(k).plans; i++) {
        sr_plan_candidate c = {.size = sizeof c};
        cr_assert_eq(sr_kernel_plan_candidate(k, i, &c), SR_OK);
        if (c.strategy == SR_STRATEGY_GEMM_EPILOGUE)
            return !c.feasible && strstr(c.why, what);
    }
    return false;
}

/* A user's BLIS_ARCH_TYPE makes Debian's BLIS 0.9.0 abort at initialisation: symred must not
 * initialise it then (direct strategy, no crash), and the gemm candidate says why. */
Test(gemm_blis, user_blis_arch_type_no_abort)
{
    setenv("BLIS_ARCH_TYPE", "0", 1);
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 100), sr_vj(ctx, 1, 100));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGMIN;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(k);
    float x[200], y[300];
    int64_t out[2];
    for (int t = 0; t < 300; t++)
        y[t] = (float)(t % 7);
    for (int t = 0; t < 200; t++)
        x[t] = (float)(t % 5);
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, 2, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    char *(*ver)(void) = h ? (char *(*)(void))dlsym(h, "bli_info_get_version_str") : NULL;
    if (ver && strncmp(ver(), "0.9.0", 5) == 0)
        cr_assert(tu_plan(k).inner == SR_STRATEGY_DIRECT && gemm_rejected_for(k, "BLIS_ARCH_TYPE"),
                  "%s", ex);
    sr_kernel_free(k);
    unsetenv("BLIS_ARCH_TYPE");
}

/* With AVX-512 the strategy needs no BLIS at all: BLIS_ARCH_TYPE (which keeps BLIS unloaded)
 * leaves it on, on the AVX-512 gemm. */
Test(gemm, avx512_without_blis)
{
    if (!have_avx512)
        cr_skip_test("the CPU lacks AVX-512F");
    setenv("BLIS_ARCH_TYPE", "0", 1);
    struct gcase c = {KNN, SR_ARGKMIN, 100, 10, 1, 29, 1031, SR_F32, true};
    run_case(&c);
    unsetenv("BLIS_ARCH_TYPE");
}

Test(gemm, kernel_malformed)
{
    setenv("SYMRED_GEMM_KERNEL", "fast", 1);
    sr_ctx *c;
    cr_assert_eq(sr_ctx_new(&c), SR_OK);
    unsetenv("SYMRED_GEMM_KERNEL");
    sr_expr *f = sr_scalprod(c, sr_vi(c, 0, 64), sr_vj(c, 1, 64));
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(c, f, &d, &k), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(c), "SYMRED_GEMM_KERNEL"), "%s", sr_ctx_error(c));
    sr_ctx_free(c);
}

/* The AVX-512 gemm against a plain loop, C = A B^T, on grid values (exact sums): m, n, K around
 * and between the tiles (MR 14, NR 32 / 16, chunks MC 126 x NC 128, K blocks), C with a wider row
 * stride whose extra columns must stay untouched. */
static void avx512_case(sr_dtype dt, int64_t m, int64_t n, int64_t K)
{
    int f64 = dt == SR_F64;
    size_t es = f64 ? 8 : 4;
    uint64_t s = 99 + (uint64_t)(m * 131 + n * 17 + K);
    int64_t ldc = n + 3;
    char *A = grid(dt, m * K, &s), *B = grid(dt, n * K, &s);
    char *C = malloc(es * (size_t)(m * ldc + 1));
    for (int64_t t = 0; t < m * ldc; t++)
        if (f64)
            ((double *)C)[t] = -7;
        else
            ((float *)C)[t] = -7;
    void *Ap = malloc((size_t)cpu_avx512_pack_a_bytes(m, K, f64));
    void *Bp = malloc((size_t)cpu_avx512_pack_b_bytes(n, K, f64));
    cpu_avx512_pack_a(f64, m, K, A, Ap);
    cpu_avx512_gemm(f64, m, n, K, Ap, B, Bp, C, ldc);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double e = -7;
            if (j < n) {
                e = 0;
                for (int64_t k = 0; k < K; k++)
                    e += f64 ? ((double *)A)[i * K + k] * ((double *)B)[j * K + k]
                             : (double)((float *)A)[i * K + k] * ((float *)B)[j * K + k];
            }
            double a = f64 ? ((double *)C)[i * ldc + j] : ((float *)C)[i * ldc + j];
            cr_assert_eq(a, e, "%s m %lld n %lld K %lld: C[%lld][%lld] = %.9g, expected %.9g",
                         f64 ? "f64" : "f32", (long long)m, (long long)n, (long long)K,
                         (long long)i, (long long)j, a, e);
        }
    free(A);
    free(B);
    free(C);
    free(Ap);
    free(Bp);
}

Test(gemm, avx512_gemm_odd_sizes)
{
    if (!have_avx512)
        cr_skip_test("the CPU lacks AVX-512F");
    static const int64_t ms[] = {0, 1, 13, 14, 15, 29, 43};
    static const int64_t ns[] = {0, 1, 15, 16, 17, 31, 32, 33, 97};
    static const int64_t ks[] = {0, 1, 7, 255, 256, 257, 601};
    for (int d = 0; d < 2; d++)
        for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof ks / sizeof *ks; c++)
                    avx512_case(d ? SR_F64 : SR_F32, ms[a], ns[b], ks[c]);
}

/* Several chunks of rows (MC = 126) and of B (NC = 128), and K in one block, in two and three
 * blocks (the largest K of one block depends on the CPU's L2: asked, not assumed), also uneven
 * blocks, both dtypes. */
Test(gemm, avx512_gemm_chunks_and_k_blocks)
{
    if (!have_avx512)
        cr_skip_test("the CPU lacks AVX-512F");
    for (int d = 0; d < 2; d++) {
        int64_t kmax = cpu_avx512_kc_max(d);
        const int64_t cases[][3] = {
            {126, 128, kmax},   {127, 129, kmax + 1},   {253, 300, 2 * kmax + 1},
            {1, 257, kmax + 1}, {125, 1, 2 * kmax + 1}, {14, 256, 3 * kmax - 1},
            {141, 97, 37}};
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            avx512_case(d ? SR_F64 : SR_F32, cases[c][0], cases[c][1], cases[c][2]);
    }
}
