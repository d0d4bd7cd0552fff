/*
 * test-wide.c — the fused two-product strategy (src/cpu/fused.c) against the reference
 * interpreter: wide outputs, Sum of F * B and SumSoftMaxWeight of F with weight B, F scalar.
 *
 * Widths 1, 2, 11, 15, 16, 17, 63, 64, 65, 255, 1100 and 1101 (below the crossover the direct
 * strategy runs and must agree too); F by generated code per pair (a Gaussian, D = 3) and from a
 * tile of inner products (D = 64, attention); float32 and float64; both axes; sizes 0, 1, primes
 * and sizes that no tile divides; NaN and infinities in F's inputs and in B; block-sparse ranges;
 * a memory budget that shrinks the tiles, and one that nothing fits (SR_EBUDGET). Every case runs
 * twice, the second time with SYMRED_GEMM_KERNEL=blis (suite wide_blis), so both products' gemms
 * stay tested on an AVX-512 machine; explain must name the strategy where a gemm is available,
 * and the AVX2 strip products (src/cpu/gemm-avx2.c) where they run: float32 with F from inner
 * products on a CPU with AVX2 and FMA but not AVX-512F, unless SYMRED_GEMM_KERNEL=blis.
 * Wide formulas that are no fused two-product: tests/test-wide-reductions.c. Suite wide_tier0
 * runs a selection with SYMRED_JIT=off: the tiles of F formed by the tile interpreter (tier 0).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static bool have_gemm, force_blis, tier0, async;
static char async_cache[] = "/tmp/symred-wide-async-XXXXXX";

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_GEMM_KERNEL");
    unsetenv("SYMRED_MEM_LIMIT");
    unsetenv("SYMRED_NUM_THREADS");
    have_gemm = cpu_avx512_usable() || tu_blis_usable();
    force_blis = false;
    tier0 = async = false;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void setup_tier0(void)
{
    setup();
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "off"), SR_OK);
    tier0 = true;
}
static void setup_blis(void)
{
    setup();
    sr_ctx_set_option(ctx, "SYMRED_GEMM_KERNEL", "blis");
    have_gemm = tu_blis_usable();
    force_blis = true;
}
static void teardown(void)
{
    sr_ctx_free(ctx);
    unsetenv("SYMRED_GEMM_KERNEL");
}
TestSuite(wide, .init = setup, .fini = teardown);
TestSuite(wide_blis, .init = setup_blis, .fini = teardown);
static void setup_async(void)
{
    setup();
    memcpy(async_cache + strlen(async_cache) - 6, "XXXXXX", 6);
    cr_assert(mkdtemp(async_cache) != NULL);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_CACHE_DIR", async_cache), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "async"), SR_OK);
    async = true;
}
static void teardown_async(void)
{
    teardown();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", async_cache);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(wide_tier0, .init = setup_tier0, .fini = teardown);
TestSuite(wide_async, .init = setup_async, .fini = teardown_async);

enum form {
    GAUSS,  /* Sum of Exp(-SqDist(x, y) g) b: F per pair, D = 3 */
    DOTEXP, /* Sum of Exp((x|y) g) b: F from inner products, D = 64 */
    SSMW,   /* SumSoftMaxWeight of (x|y) g with weight b, D = 64 */
    SSMW3,  /* SumSoftMaxWeight of -SqDist(x, y) g with weight b, D = 3 */
    SSMWC,  /* SumSoftMaxWeight of c (x|y) with weight b, c the constant -0.37, D = 64 */
    SSMW128 /* SSMW with D = 128 */
};

static bool is_ssmw(enum form f) { return f == SSMW || f == SSMW3 || f == SSMWC || f == SSMW128; }

/* NaN or infinities in x, y or b; or the parameter g other than 2 (D = 3) or 0.5: negative, no
 * power of two, infinite, NaN. */
enum special { NONE, NAN_F, INF_F, NAN_B, INF_B, G_NEG, G_ODD, G_INF, G_NAN };

struct wcase {
    enum form form;
    int R, axis;
    int64_t nx, ny;
    sr_dtype dt;
    enum special sp;
};

static int dim_of(enum form f) { return f == GAUSS || f == SSMW3 ? 3 : f == SSMW128 ? 128 : 64; }

static double g_of(const struct wcase *c)
{
    switch (c->sp) {
    case G_NEG:
        return -0.7;
    case G_ODD:
        return 1.3;
    case G_INF:
        return INFINITY;
    case G_NAN:
        return NAN;
    default:
        return dim_of(c->form) == 3 ? 2.0 : 0.5;
    }
}

/* The formula of c: x (arg 0), y (arg 1) of dimension D, b (arg 2) of width R on the reduced
 * axis, g (arg 3) a parameter. */
static sr_expr *formula(const struct wcase *c, sr_expr **weight)
{
    int D = dim_of(c->form);
    bool ax1 = c->axis == 1;
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D);
    sr_expr *b = ax1 ? sr_vj(ctx, 2, c->R) : sr_vi(ctx, 2, c->R), *g = sr_pm(ctx, 3, 1);
    *weight = NULL;
    switch (c->form) {
    case GAUSS:
        return sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g))), b);
    case DOTEXP:
        return sr_mul(ctx, b, sr_exp(ctx, sr_mul(ctx, sr_scalprod(ctx, x, y), g)));
    case SSMW:
    case SSMW128:
        *weight = b;
        return sr_mul(ctx, sr_scalprod(ctx, x, y), g);
    case SSMWC:
        *weight = b;
        return sr_mul(ctx, sr_const(ctx, -0.37), sr_scalprod(ctx, x, y));
    default:
        *weight = b;
        return sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g));
    }
}

static void *fill(sr_dtype dt, int64_t n, double lo, double hi, uint64_t *s)
{
    void *p = malloc((dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1));
    tu_fill(p, dt, n, lo, hi, s);
    return p;
}

/* Runs kernel kg (fused or direct, as planned) and the reference kr on the inputs of c, with
 * ranges when rg is not NULL, and compares every output. */
static void compare(const struct wcase *c, sr_kernel *kg, sr_kernel *kr, const sr_ranges *rg)
{
    int D = dim_of(c->form);
    uint64_t s = 99 + (uint64_t)c->R * 31 + (uint64_t)c->nx * 7 + (uint64_t)c->ny;
    int64_t nb = c->axis == 1 ? c->ny : c->nx; /* B's rows: the reduced axis */
    /* Inner products of D = 64 values in [-0.3, 0.3] stay within a few units: exp is tame. With
     * a scale under test, values in [-3, 3]: F spans more than exp's range in a row, so that only
     * the row maximum of F keeps the exponentials finite. */
    double amp = D == 3 ? 1.0 : c->sp >= G_NEG || c->form == SSMWC ? 3.0 : 0.3;
    void *x = fill(c->dt, c->nx * D, -amp, amp, &s), *y = fill(c->dt, c->ny * D, -amp, amp, &s);
    void *b = fill(c->dt, nb * c->R, 0.0, 1.0, &s);
    if (c->sp == NAN_F && c->nx > 2)
        tu_set(x, c->dt, 2 * D, NAN);
    if (c->sp == INF_F && c->ny > 3)
        tu_set(y, c->dt, 3 * D + 1, INFINITY);
    if (c->sp == NAN_B && nb > 1)
        tu_set(b, c->dt, 1 * c->R + c->R / 2, NAN);
    if (c->sp == INF_B && nb > 2)
        tu_set(b, c->dt, 2 * c->R, -INFINITY);
    double g64 = g_of(c);
    float g32 = (float)g64;
    const void *args[4] = {x, y, b, c->dt == SR_F64 ? (const void *)&g64 : (const void *)&g32};
    int64_t nout = c->axis == 1 ? c->nx : c->ny;
    int od = sr_kernel_out_dim(kg);
    cr_assert_eq(od, c->R);
    size_t esz = c->dt == SR_F64 ? 8 : 4;
    void *o1 = calloc((size_t)(nout * od + 1), esz), *o2 = calloc((size_t)(nout * od + 1), esz);
    const int na = sr_kernel_nargs(kg); /* 3 where g is not used */
    sr_run_desc r1 = {c->nx, c->ny, na, args, o1, NULL}, r2 = {c->nx, c->ny, na, args, o2, NULL};
    cr_assert_eq(sr_kernel_run_ranges(kg, &r1, rg), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ranges(kr, &r2, rg), SR_OK, "%s", sr_ctx_error(ctx));
    double rtol = c->dt == SR_F64 ? 1e-11 : 3e-5;
    for (int64_t t = 0; t < nout * od; t++) {
        double a = c->dt == SR_F64 ? ((double *)o1)[t] : ((float *)o1)[t];
        double e = c->dt == SR_F64 ? ((double *)o2)[t] : ((float *)o2)[t];
        cr_assert(tu_close(a, e, rtol, rtol * 1e-3),
                  "form %d R %d axis %d %lldx%lld dt %d sp %d [row %lld, col %lld]: %.9g, "
                  "reference %.9g",
                  c->form, c->R, c->axis, (long long)c->nx, (long long)c->ny, c->dt, c->sp,
                  (long long)(t / od), (long long)(t % od), a, e);
    }
    free(x);
    free(y);
    free(b);
    free(o1);
    free(o2);
}

/* Whether the planner's cost model (src/cpu/cost.c) should pick the fused strategy for c. */
static bool expect_fused(const struct wcase *c)
{
    bool ssmw = is_ssmw(c->form);
    if (!have_gemm || (c->dt == SR_F32 && getenv("SYMRED_ACC")))
        return false;
    return ssmw || c->R >= 4;
}

static void kernels(const struct wcase *c, sr_kernel **kg, sr_kernel **kr)
{
    sr_expr *w;
    sr_expr *f = formula(c, &w);
    cr_assert_not_null(f, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = is_ssmw(c->form) ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
    d.axis = c->axis;
    d.dtype = c->dt;
    d.weight = w;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, kg), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, kr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(*kg);
    const sr_plan_info plan = tu_plan(*kg);
    bool fused = tu_runs_fused(*kg);
    if (expect_fused(c))
        cr_assert(fused, "expected the fused two-product strategy:\n%s", ex);
    else
        cr_assert(!fused, "expected the direct strategy:\n%s", ex);
    /* Never the reference because of width while a compiler is there. */
    cr_assert_str_eq(plan.backend, "cpu-jit", "expected the CPU JIT:\n%s", ex);
    if (fused)
        cr_assert(plan.workspace_bytes > 0 && plan.tile_rows > 0 && plan.tile_cols > 0, "%s", ex);
    /* Tier 0 for good without compiled code; with async, while the modules compile (into an
     * empty cache), the symmetric driver's too. */
    bool bg = async;
    if (fused)
        cr_assert(plan.tier == (tier0 || bg ? 0 : 1) && plan.compiling == bg,
                  "tier %d compiling %d\n%s", plan.tier, plan.compiling, ex);
    /* float32 with F from inner products, without AVX-512F: the AVX2 strip products unless
     * SYMRED_GEMM_KERNEL=blis. */
    bool strips = fused && c->dt == SR_F32 && c->form != GAUSS && c->form != SSMW3 && !force_blis &&
                  !cpu_avx512_usable() && cpu_avx2_usable();
    cr_assert_eq(plan.product && strcmp(plan.product, "avx2") == 0, strips,
                 "expected %s the AVX2 strip products:\n%s", strips ? "" : "no", ex);
    /* Attention's F = c (x|y) on them: its scale applied inside the exponentials. */
    bool sdp = strips && (c->form == SSMW || c->form == SSMWC || c->form == SSMW128);
    cr_assert_eq(plan.scale_in_exp, sdp, "expected %s the scale inside the exponentials:\n%s",
                 sdp ? "" : "not", ex);
    /* BLIS's product takes a width that is no multiple of 4 padded with zero columns. */
    bool blis = fused && plan.product && strcmp(plan.product, "blis") == 0;
    if (blis && c->R < 256 && c->R % 4)
        cr_assert(plan.b_padded > 0 && plan.b_padded % 4 == 0, "padded to %d\n%s", plan.b_padded,
                  ex);
    if (!blis)
        cr_assert_eq(plan.b_padded, 0, "%s", ex);
}

static void run_case(const struct wcase *c)
{
    sr_kernel *kg, *kr;
    kernels(c, &kg, &kr);
    compare(c, kg, kr, NULL);
    if (async) { /* then on compiled code */
        cr_assert_eq(sr_kernel_wait(kg, -1), SR_OK);
        const sr_plan_info plan = tu_plan(kg);
        cr_assert(plan.tier == 1 && !plan.compiling, "tier %d compiling %d\n%s", plan.tier,
                  plan.compiling, sr_kernel_explain(kg));
        compare(c, kg, kr, NULL);
    }
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

#define WCASE(suite, name, ...)                                                                    \
    Test(suite, name)                                                                              \
    {                                                                                              \
        struct wcase c = {__VA_ARGS__};                                                            \
        run_case(&c);                                                                              \
    }
#define CASE(name, ...) WCASE(wide, name, __VA_ARGS__) WCASE(wide_blis, name, __VA_ARGS__)

/* Every width, Gaussian Sum, float32, axis 1, sizes no tile divides. */
CASE(gauss_r1, GAUSS, 1, 1, 37, 1031, SR_F32, NONE)
CASE(gauss_r2, GAUSS, 2, 1, 37, 1031, SR_F32, NONE)
CASE(gauss_r15, GAUSS, 15, 1, 131, 1031, SR_F32, NONE)
CASE(gauss_r16, GAUSS, 16, 1, 131, 1031, SR_F32, NONE)
CASE(gauss_r17, GAUSS, 17, 1, 131, 1031, SR_F32, NONE)
CASE(gauss_r63, GAUSS, 63, 1, 229, 523, SR_F32, NONE)
CASE(gauss_r64, GAUSS, 64, 1, 229, 523, SR_F32, NONE)
CASE(gauss_r65, GAUSS, 65, 1, 229, 523, SR_F32, NONE)
CASE(gauss_r255, GAUSS, 255, 1, 113, 257, SR_F32, NONE)
CASE(gauss_r1100, GAUSS, 1100, 1, 29, 131, SR_F32, NONE)
/* Widths that BLIS's product takes padded to a multiple of 4: GPyTorch's 11 columns (the
 * right-hand side and 10 probes), and passes of 256 columns with a last one of 77. */
CASE(gauss_r11, GAUSS, 11, 1, 131, 1031, SR_F32, NONE)
CASE(gauss_r11_f64_axis0, GAUSS, 11, 0, 1031, 131, SR_F64, NONE)
CASE(gauss_r1101, GAUSS, 1101, 1, 29, 131, SR_F32, NONE)
/* float64, axis 0, sizes 0 and 1. */
CASE(gauss_r17_f64, GAUSS, 17, 1, 131, 1031, SR_F64, NONE)
CASE(gauss_r1100_f64, GAUSS, 1100, 1, 29, 131, SR_F64, NONE)
CASE(gauss_r65_axis0, GAUSS, 65, 0, 523, 229, SR_F32, NONE)
CASE(gauss_r16_axis0_f64, GAUSS, 16, 0, 1031, 131, SR_F64, NONE)
CASE(gauss_r16_many_rows, GAUSS, 16, 1, 1031, 523, SR_F32, NONE)
CASE(ssmw_r64_many_rows, SSMW, 64, 1, 1031, 257, SR_F32, NONE)
CASE(gauss_r64_one, GAUSS, 64, 1, 1, 1, SR_F32, NONE)
CASE(gauss_r64_one_row, GAUSS, 64, 1, 1, 1031, SR_F32, NONE)
CASE(gauss_r64_no_rows, GAUSS, 64, 1, 0, 1031, SR_F32, NONE)
CASE(gauss_r64_no_cols, GAUSS, 64, 1, 131, 0, SR_F32, NONE)
/* F from a tile of inner products. */
CASE(dotexp_r16, DOTEXP, 16, 1, 131, 1031, SR_F32, NONE)
CASE(dotexp_r255_axis0, DOTEXP, 255, 0, 257, 113, SR_F32, NONE)
CASE(dotexp_r65_f64, DOTEXP, 65, 1, 131, 523, SR_F64, NONE)
/* SumSoftMaxWeight: attention and a low-dimensional F. */
CASE(ssmw_r2, SSMW, 2, 1, 37, 1031, SR_F32, NONE)
CASE(ssmw_r15, SSMW, 15, 1, 131, 1031, SR_F32, NONE)
CASE(ssmw_r64, SSMW, 64, 1, 229, 1031, SR_F32, NONE)
CASE(ssmw_r65, SSMW, 65, 1, 229, 523, SR_F32, NONE)
CASE(ssmw_r255_f64, SSMW, 255, 1, 113, 257, SR_F64, NONE)
CASE(ssmw_r1100, SSMW, 1100, 1, 29, 131, SR_F32, NONE)
CASE(ssmw_r64_axis0, SSMW, 64, 0, 523, 229, SR_F32, NONE)
CASE(ssmw_r17_one, SSMW, 17, 1, 1, 1, SR_F32, NONE)
CASE(ssmw_r17_no_cols, SSMW, 17, 1, 7, 0, SR_F32, NONE)
CASE(ssmw3_r63, SSMW3, 63, 1, 131, 1031, SR_F32, NONE)
CASE(ssmw3_r16_f64_axis0, SSMW3, 16, 0, 1031, 131, SR_F64, NONE)
/* NaN and infinities in F's inputs and in B. */
CASE(gauss_nan_f, GAUSS, 16, 1, 37, 257, SR_F32, NAN_F)
CASE(gauss_inf_f, GAUSS, 16, 1, 37, 257, SR_F32, INF_F)
CASE(gauss_nan_b, GAUSS, 65, 1, 37, 257, SR_F32, NAN_B)
CASE(gauss_inf_b, GAUSS, 65, 1, 37, 257, SR_F64, INF_B)
CASE(ssmw_nan_f, SSMW, 16, 1, 37, 257, SR_F32, NAN_F)
CASE(ssmw_inf_f, SSMW, 16, 1, 37, 257, SR_F32, INF_F)
CASE(ssmw_nan_b, SSMW, 64, 1, 37, 257, SR_F32, NAN_B)
CASE(ssmw3_inf_b, SSMW3, 64, 1, 37, 257, SR_F64, INF_B)
/* Attention around the AVX2 strip products' shapes: strips of 6 and 12 rows and their remainders,
 * B narrower than, as wide as and past one 16-column panel, reduced tiles of 256 and a prime rest;
 * infinities in B. */
CASE(ssmw_r1_strip_rest, SSMW, 1, 1, 13, 17, SR_F32, NONE)
CASE(ssmw_r16_six_rows, SSMW, 16, 1, 6, 256, SR_F32, NONE)
CASE(ssmw_r17_twelve_rows, SSMW, 17, 1, 12, 513, SR_F32, NONE)
CASE(ssmw_r33_axis0, SSMW, 33, 0, 257, 25, SR_F32, NONE)
CASE(ssmw_inf_b, SSMW, 31, 1, 37, 257, SR_F32, INF_B)
/* Attention's scale c of F = c (x|y), which the AVX2 strip products apply inside the
 * exponentials: negative (the row maximum of F from the minimum of (x|y)), no power of two, a
 * constant, infinite and NaN (F formed, as for any F); several tiles of reduced indices. */
CASE(ssmw_scale_negative, SSMW, 64, 1, 131, 1031, SR_F32, G_NEG)
CASE(ssmw_scale_odd, SSMW, 17, 1, 131, 1031, SR_F32, G_ODD)
CASE(ssmw_scale_odd_axis0, SSMW, 17, 0, 1031, 131, SR_F32, G_ODD)
CASE(ssmw_scale_const, SSMWC, 33, 1, 131, 1031, SR_F32, NONE)
CASE(ssmw_scale_inf, SSMW, 16, 1, 37, 257, SR_F32, G_INF)
CASE(ssmw_scale_nan, SSMW, 16, 1, 37, 257, SR_F32, G_NAN)
/* Attention at D = 128: two whole tiles of reduced indices and a rest of 32 on the AVX2 strip
 * products (384 per tile there), B of width 128 and 17. */
CASE(ssmw_d128_tiles, SSMW128, 128, 1, 25, 800, SR_F32, NONE)
CASE(ssmw_d128_r17, SSMW128, 17, 1, 13, 401, SR_F32, NONE)

/* Tier 0: F per pair and from inner products, both dtypes and axes, passes over B's columns,
 * sizes 0 and no tile divides, NaN in F's inputs and scale. */
#define CASE0(name, ...) WCASE(wide_tier0, name, __VA_ARGS__)
#define CASEA(name, ...) CASE0(name, __VA_ARGS__) WCASE(wide_async, name, __VA_ARGS__)
CASEA(gauss_r16, GAUSS, 16, 1, 131, 1031, SR_F32, NONE)
CASE0(gauss_r11_f64_axis0, GAUSS, 11, 0, 1031, 131, SR_F64, NONE)
CASE0(gauss_r1101, GAUSS, 1101, 1, 29, 131, SR_F32, NONE)
CASE0(gauss_r64_no_rows, GAUSS, 64, 1, 0, 1031, SR_F32, NONE)
CASE0(gauss_nan_f, GAUSS, 16, 1, 37, 257, SR_F32, NAN_F)
CASE0(dotexp_r16, DOTEXP, 16, 1, 131, 1031, SR_F32, NONE)
CASEA(dotexp_r65_f64, DOTEXP, 65, 1, 131, 523, SR_F64, NONE)
CASEA(ssmw_r64, SSMW, 64, 1, 229, 1031, SR_F32, NONE)
CASE0(ssmw_r64_axis0, SSMW, 64, 0, 523, 229, SR_F32, NONE)
CASE0(ssmw3_r16_f64_axis0, SSMW3, 16, 0, 1031, 131, SR_F64, NONE)
CASE0(ssmw_scale_nan, SSMW, 16, 1, 37, 257, SR_F32, G_NAN)

/* Block-sparse ranges: two row blocks over different intervals, rows outside every block. */
static void ranges_case(const struct wcase *c)
{
    sr_kernel *kg, *kr;
    kernels(c, &kg, &kr);
    int64_t ri[4] = {3, 40, 50, 120}, sl[2] = {2, 3}, rj[6] = {0, 100, 300, 700, 5, 1000};
    sr_ranges rg;
    memset(&rg, 0, sizeof rg);
    rg.nranges_i = 2;
    rg.ranges_i = ri;
    rg.slices_i = sl;
    rg.nredranges_j = 3;
    rg.redranges_j = rj;
    compare(c, kg, kr, &rg);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

Test(wide, ranges_sum)
{
    struct wcase c = {GAUSS, 33, 1, 131, 1031, SR_F32, NONE};
    ranges_case(&c);
}
Test(wide, ranges_ssmw)
{
    struct wcase c = {SSMW, 64, 1, 131, 1031, SR_F32, NONE};
    ranges_case(&c);
}

/* A budget the fused strategy's default tiles exceed: smaller tiles than without it, the same
 * results. */
static void budget_case(const struct wcase *c, int64_t bytes)
{
    sr_kernel *kg, *kr;
    kernels(c, &kg, &kr);
    const sr_plan_info dflt = tu_plan(kg);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, bytes), SR_OK);
    kernels(c, &kg, &kr);
    const sr_plan_info cut = tu_plan(kg);
    if (have_gemm)
        cr_assert(dflt.tile_rows * dflt.tile_cols > cut.tile_rows * cut.tile_cols,
                  "no smaller tiles: %d x %d, without the budget %d x %d", cut.tile_rows,
                  cut.tile_cols, dflt.tile_rows, dflt.tile_cols);
    compare(c, kg, kr, NULL);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

Test(wide, budget_shrinks_tiles)
{
    struct wcase c = {GAUSS, 64, 1, 229, 1031, SR_F32, NONE};
    budget_case(&c, 200 << 10);
}

/* Attention under budgets that cut the reduced tile, and then the rows (with the AVX2 strip
 * products: 448 x 256, 112 x 16, and 14 x 16, one strip of 12 rows and a rest of 2). AVX-512's
 * micro-kernel needs more for its smallest tiles (22 912 bytes at 14 x 16), so its budgets are
 * larger. */
Test(wide, budget_shrinks_attention_tiles)
{
    struct wcase c = {SSMW, 33, 1, 229, 1031, SR_F32, NONE};
    const int kib[3] = {200, cpu_avx512_usable() ? 48 : 16, cpu_avx512_usable() ? 24 : 10};
    for (int q = 0; q < 3; q++)
        budget_case(&c, (int64_t)kib[q] << 10);
}

/* A budget nothing fits: SR_EBUDGET with a message, never a crash, the context still usable. */
Test(wide, budget_too_small)
{
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 2048), SR_OK);
    struct wcase c = {SSMW, 1100, 1, 29, 131, SR_F32, NONE};
    sr_expr *w;
    sr_expr *f = formula(&c, &w);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUMSOFTMAXWEIGHT;
    d.weight = w;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    cr_assert_eq(st, SR_EBUDGET, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "budget"), "%s", sr_ctx_error(ctx));
    cr_assert_null(k);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    run_case(&c);
}

/* A wide formula that is no fused two-product runs generated code (the direct strategy's loop
 * mode, not the reference interpreter), says so in explain, and agrees with the reference. */
Test(wide, not_fused_runs_generated_code)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *b = sr_vj(ctx, 2, 100);
    sr_expr *f = sr_add(ctx, sr_mul(ctx, b, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y)))), b);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(k);
    cr_assert(tu_runs_jit(k) && !tu_plan(k).fallback && tu_plan(k).loop_mode, "%s", ex);
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    uint64_t s = 5;
    const int64_t nx = 37, ny = 131;
    void *xa = fill(SR_F32, nx * 3, -1, 1, &s), *ya = fill(SR_F32, ny * 3, -1, 1, &s),
         *ba = fill(SR_F32, ny * 100, 0, 1, &s);
    const void *args[3] = {xa, ya, ba};
    float *o1 = calloc(nx * 100, 4), *o2 = calloc(nx * 100, 4);
    cr_assert_eq(sr_kernel_run(k, nx, ny, args, o1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(kr, nx, ny, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    for (int64_t t = 0; t < nx * 100; t++)
        cr_assert(tu_close(o1[t], o2[t], 3e-5, 3e-8), "[%lld]: %.9g, reference %.9g", (long long)t,
                  o1[t], o2[t]);
    free(xa);
    free(ya);
    free(ba);
    free(o1);
    free(o2);
    sr_kernel_free(k);
    sr_kernel_free(kr);
}

/* Attention on the AVX2 strip products, F = g (x|y): its exponentials replace the tile of inner
 * products, so its workspace holds no tile of F, less than F = g g (x|y)'s, which forms one. */
Test(wide, attention_workspace_without_tile_of_f)
{
    if (cpu_avx512_usable() || !cpu_avx2_usable())
        return;
    sr_expr *x = sr_vi(ctx, 0, 64), *y = sr_vj(ctx, 1, 64), *b = sr_vj(ctx, 2, 64);
    sr_expr *g = sr_pm(ctx, 3, 1), *s = sr_scalprod(ctx, x, y);
    sr_expr *f[2] = {sr_mul(ctx, s, g), sr_mul(ctx, sr_mul(ctx, s, g), g)};
    int64_t ws[2];
    for (int v = 0; v < 2; v++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = SR_SUMSOFTMAXWEIGHT;
        d.weight = b;
        sr_kernel *k;
        cr_assert_eq(sr_kernel_new(ctx, f[v], &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
        const char *ex = sr_kernel_explain(k);
        const sr_plan_info plan = tu_plan(k);
        cr_assert(plan.product && strcmp(plan.product, "avx2") == 0, "%s", ex);
        cr_assert_eq(plan.scale_in_exp, v == 0, "%s", ex);
        ws[v] = sr_kernel_workspace_bytes(k);
        sr_kernel_free(k);
    }
    cr_assert(ws[0] < ws[1], "workspace %lld bytes with the scale inside, %lld with F formed",
              (long long)ws[0], (long long)ws[1]);
}

/* Attention at D = 96 (336 reduced indices per tile on the AVX2 strip products) under a budget
 * one byte short of one thread's workspace: the tile of reduced indices shrinks, and stays a
 * multiple of the products' 16-column panels (the strips write whole panels of the tile of inner
 * products: a tile of 168 would have its last row spill into the next buffer, the packed K of the
 * tile, which the next strip reads). Each tile packed per row block (the budget leaves no room
 * for the packed copies of the whole run). */
Test(wide, budget_keeps_attention_tiles_whole_panels)
{
    const int D = 96, R = 16;
    const int64_t nx = 25, ny = 400;
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D), *b = sr_vj(ctx, 2, R);
    sr_expr *f = sr_mul(ctx, sr_scalprod(ctx, x, y), sr_pm(ctx, 3, 1));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUMSOFTMAXWEIGHT;
    d.weight = b;
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_NUM_THREADS", "1"), SR_OK);
    sr_kernel *k, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    const int64_t ws = sr_kernel_workspace_bytes(k);
    sr_kernel_free(k);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, ws - 1), SR_OK);
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    uint64_t s = 7;
    float *xv = fill(SR_F32, nx * D, -0.3, 0.3, &s), *yv = fill(SR_F32, ny * D, -0.3, 0.3, &s);
    float *bv = fill(SR_F32, ny * R, 0.0, 1.0, &s), g = 0.5f;
    float *o1 = calloc((size_t)(nx * R), 4), *o2 = calloc((size_t)(nx * R), 4);
    const void *args[4] = {xv, yv, bv, &g};
    cr_assert_eq(sr_kernel_run(k, nx, ny, args, o1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(kr, nx, ny, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    for (int64_t t = 0; t < nx * R; t++)
        cr_assert(tu_close(o1[t], o2[t], 3e-5, 3e-8), "[row %lld, col %lld]: %.9g, reference %.9g",
                  (long long)(t / R), (long long)(t % R), o1[t], o2[t]);
    const char *ex = sr_kernel_explain(k);
    const char *prod = tu_plan(k).product;
    if (prod && strcmp(prod, "avx2") == 0) {
        const sr_plan_info p = tu_plan(k);
        cr_assert(p.tile_rows > 0 && p.tile_cols > 0, "%s", ex);
        cr_assert(p.tile_rows * p.tile_cols < 448 * 336, "the budget did not shrink the tiles:\n%s",
                  ex);
    }
    sr_kernel_free(k);
    sr_kernel_free(kr);
    free(xv);
    free(yv);
    free(bv);
    free(o1);
    free(o2);
}

/* Attention's tile of reduced indices at D = 128 on the AVX2 strip products with the scale inside
 * the exponentials: 384, whose panelled tiles of K^T and of B (192 KiB each) stay in L2. */
Test(wide, attention_d128_tiles)
{
    if (cpu_avx512_usable() || !cpu_avx2_usable())
        return;
    struct wcase c = {SSMW128, 128, 1, 25, 800, SR_F32, NONE};
    sr_kernel *kg, *kr;
    kernels(&c, &kg, &kr);
    const sr_plan_info p = tu_plan(kg);
    cr_assert_eq(p.tile_cols, 384, "tiles %d x %d:\n%s", p.tile_rows, p.tile_cols,
                 sr_kernel_explain(kg));
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}
