/*
 * test-hoist.c — the fused two-product strategy with B a formula of the reduced side only
 * (src/cpu/fused.h, struct fused_hoist): out_o = sum_r F(o, r) B(r), B evaluated once per tile
 * of reduced indices into the workspace. The case that motivates it is the sparse GP's
 * K_uf K_fu: F = exp(-g |z_a - x_i|^2), B_i = (exp(-g |z_b - x_i|^2))_b for all M inducing
 * points z_b, a parameter, written as the norms and a MatVecMult (bench/exla/sgpr_jax.py).
 *
 * Against the reference interpreter: widths 1, 16, 17, 100, 1100; sizes 0, 1 and primes;
 * float32 and float64; both axes; B the product of two such vectors; a SumSoftMaxWeight whose
 * weight is such a formula;
 * block-sparse ranges; a memory budget that shrinks the tiles (B's tile among them), and one
 * that nothing fits (SR_EBUDGET). Explain must say that B was hoisted wherever the width
 * selects the fused strategy (R >= 4) and a tile gemm exists. Suite hoist_tier0 runs a few with
 * SYMRED_JIT=off: B's tile and F's formed by the tile interpreter.
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
static bool have_gemm;

static void setup(void)
{
    static const char *const unset[] = {"SYMRED_GEMM_KERNEL", "SYMRED_MEM_LIMIT", "SYMRED_ACC"};
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    for (size_t v = 0; v < sizeof unset / sizeof *unset; v++)
        unsetenv(unset[v]);
    have_gemm = cpu_avx512_usable() || tu_blis_usable();
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void setup_tier0(void)
{
    setup();
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "off"), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(hoist, .init = setup, .fini = teardown);
TestSuite(hoist_tier0, .init = setup_tier0, .fini = teardown);

enum form {
    SGPR,   /* Sum of Exp(-g SqDist(z, x)) * Exp(-g (SqNorm2(x) - 2 MatVecMult(Zt, x) + zn)) */
    ELEM,   /* Sum of Exp(-g SqDist(z, x)) * (Cos(Elem(x, 0) * w) + SqNorm2(x)) */
    SSMW_B, /* SumSoftMaxWeight of -g SqDist(z, x), weight Cos(Elem(x, 0) * w) + SqNorm2(x) */
    PROD    /* Sum of Exp(-g SqDist(z, x)) * (q * Exp(-g q)), q = SqNorm2(x) - 2 MatVecMult(Zt, x)
             * + zn: two vector factors of the reduced side, B their product */
};

struct hcase {
    enum form form;
    int R, axis;
    int64_t nx, ny; /* rows of the i side (arg 0) and of the j side (arg 1) */
    sr_dtype dt;
};

/* Creates the kernel of c (on the reference interpreter with ref) in *k; returns the status.
 * The reduced-side variable is x (arg 1 on axis 1: Vj; arg 0 on axis 0: Vi), the output
 * side's z; g (arg 2), Zt (arg 3, 3R) and zn or w (arg 4, R) are parameters. */
static sr_status build(const struct hcase *c, bool ref, sr_kernel **k)
{
    char a0[32], a1[32], a3[32], a4[32];
    const char *zc = c->axis == 1 ? "Vi" : "Vj", *xc = c->axis == 1 ? "Vj" : "Vi";
    snprintf(a0, sizeof a0, "z = %s(%d, 3)", zc, c->axis == 1 ? 0 : 1);
    snprintf(a1, sizeof a1, "x = %s(%d, 3)", xc, c->axis == 1 ? 1 : 0);
    snprintf(a3, sizeof a3, "Zt = Pm(3, %d)", 3 * c->R);
    bool sgpr = c->form == SGPR || c->form == PROD;
    snprintf(a4, sizeof a4, "%s = Pm(4, %d)", sgpr ? "zn" : "w", c->R);
    const char *aliases[] = {a0, a1, "g = Pm(2, 1)", a3, a4};
    static const char *const text[] = {
        [SGPR] = "Exp(-g * SqDist(z, x)) * Exp(-g * (SqNorm2(x) - 2 * MatVecMult(Zt, x) + zn))",
        [ELEM] = "Exp(-g * SqDist(z, x)) * (Cos(Elem(x, 0) * w) + SqNorm2(x))",
        [SSMW_B] = "-g * SqDist(z, x)",
        [PROD] = "Exp(-g * SqDist(z, x)) * ((SqNorm2(x) - 2 * MatVecMult(Zt, x) + zn) * "
                 "Exp(-g * (SqNorm2(x) - 2 * MatVecMult(Zt, x) + zn)))",
    };
    sr_expr *f = NULL, *w = NULL;
    cr_assert_eq(sr_parse(ctx, text[c->form], aliases, 5, &f), SR_OK, "%s", sr_ctx_error(ctx));
    if (c->form == SSMW_B)
        cr_assert_eq(sr_parse(ctx, "Cos(Elem(x, 0) * w) + SqNorm2(x)", aliases, 5, &w), SR_OK, "%s",
                     sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = w ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
    d.weight = w;
    d.axis = c->axis;
    d.dtype = c->dt;
    if (ref)
        d.device = SR_DEVICE_REFERENCE;
    *k = NULL;
    return sr_kernel_new(ctx, f, &d, k);
}

/* The kernel of c and its reference twin; explain must say whether B was hoisted. */
static void kernels(const struct hcase *c, sr_kernel **kg, sr_kernel **kr)
{
    cr_assert_eq(build(c, false, kg), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(build(c, true, kr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(*kg);
    cr_assert(tu_runs_jit(*kg), "expected the CPU JIT:\n%s", ex);
    bool want = have_gemm && (c->R >= 4 || c->form == SSMW_B);
    bool hoisted = tu_runs_fused(*kg) && tu_plan(*kg).b_hoisted;
    cr_assert_eq(hoisted, want, "expected %s:\n%s",
                 want ? "the fused strategy with B hoisted" : "the direct strategy", ex);
}

static void *fill(sr_dtype dt, int64_t n, double lo, double hi, uint64_t *s)
{
    void *p = malloc((dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1));
    tu_fill(p, dt, n, lo, hi, s);
    return p;
}

/* Runs both kernels on the inputs of c (with ranges rg, or none) and compares every output. */
static void compare(const struct hcase *c, sr_kernel *kg, sr_kernel *kr, const sr_ranges *rg)
{
    uint64_t s = 7 + (uint64_t)c->R * 13 + (uint64_t)c->nx * 5 + (uint64_t)c->ny;
    int R = c->R;
    /* Inducing points in [-1, 1]^3, their transposed copy Zt (R x 3 row-major, as MatVecMult
     * reads a 3R parameter) and squared norms zn, for the SGPR form. */
    void *a0 = fill(c->dt, c->nx * 3, -1, 1, &s), *a1 = fill(c->dt, c->ny * 3, -1, 1, &s);
    double *zt = malloc(sizeof *zt * (size_t)(3 * R)), *p4 = malloc(sizeof *p4 * (size_t)R);
    tu_fill(zt, SR_F64, 3 * R, -1, 1, &s);
    for (int b = 0; b < R; b++)
        p4[b] = c->form == SGPR || c->form == PROD
                    ? zt[3 * b] * zt[3 * b] + zt[3 * b + 1] * zt[3 * b + 1] +
                          zt[3 * b + 2] * zt[3 * b + 2]
                    : 0.3 + 2.0 * b / R;
    double g64 = 0.7;
    float g32 = (float)g64, *zt32 = malloc(sizeof *zt32 * (size_t)(3 * R)),
          *p432 = malloc(sizeof *p432 * (size_t)R);
    for (int t = 0; t < 3 * R; t++)
        zt32[t] = (float)zt[t];
    for (int b = 0; b < R; b++)
        p432[b] = (float)p4[b];
    bool f64 = c->dt == SR_F64;
    const void *args[5] = {a0, a1, f64 ? (const void *)&g64 : (const void *)&g32,
                           f64 ? (const void *)zt : (const void *)zt32,
                           f64 ? (const void *)p4 : (const void *)p432};
    int64_t nout = c->axis == 1 ? c->nx : c->ny;
    cr_assert_eq(sr_kernel_out_dim(kg), R);
    size_t es = f64 ? 8 : 4;
    void *o1 = calloc((size_t)(nout * R + 1), es), *o2 = calloc((size_t)(nout * R + 1), es);
    sr_run_desc r1 = {c->nx, c->ny, 5, args, o1, NULL}, r2 = {c->nx, c->ny, 5, args, o2, NULL};
    cr_assert_eq(sr_kernel_run_ranges(kg, &r1, rg), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ranges(kr, &r2, rg), SR_OK, "%s", sr_ctx_error(ctx));
    double rtol = f64 ? 1e-11 : 3e-5;
    for (int64_t t = 0; t < nout * R; t++) {
        double a = f64 ? ((double *)o1)[t] : ((float *)o1)[t];
        double e = f64 ? ((double *)o2)[t] : ((float *)o2)[t];
        cr_assert(tu_close(a, e, rtol, rtol * 1e-3),
                  "form %d R %d axis %d %lldx%lld dt %d [row %lld, col %lld]: %.12g, reference "
                  "%.12g",
                  c->form, R, c->axis, (long long)c->nx, (long long)c->ny, c->dt,
                  (long long)(t / R), (long long)(t % R), a, e);
    }
    free(a0), free(a1), free(zt), free(p4), free(zt32), free(p432), free(o1), free(o2);
}

/* Kernels for c, compared on its inputs, with ranges rg or none. */
static void run_case(struct hcase c, const sr_ranges *rg)
{
    sr_kernel *kg, *kr;
    kernels(&c, &kg, &kr);
    compare(&c, kg, kr, rg);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

#define CASE(name, ...)                                                                            \
    Test(hoist, name) { run_case((struct hcase){__VA_ARGS__}, NULL); }

/* The sparse GP's form: M inducing points as the output rows, many points reduced. */
CASE(sgpr_r16, SGPR, 16, 1, 16, 1031, SR_F64)
CASE(sgpr_r17_f32, SGPR, 17, 1, 17, 1031, SR_F32)
CASE(sgpr_r100, SGPR, 100, 1, 100, 2003, SR_F64)
CASE(sgpr_r100_f32, SGPR, 100, 1, 100, 2003, SR_F32)
CASE(sgpr_r100_axis0, SGPR, 100, 0, 2003, 100, SR_F64)
CASE(sgpr_r1100, SGPR, 1100, 1, 29, 131, SR_F32)
/* Other widths and sizes: 1 (direct), many output rows, sizes 0 and 1. */
CASE(elem_r1, ELEM, 1, 1, 37, 257, SR_F64)
CASE(elem_r16_axis0_f32, ELEM, 16, 0, 1031, 131, SR_F32)
CASE(elem_r17_many_rows, ELEM, 17, 1, 1031, 523, SR_F32)
CASE(elem_r1100_f64, ELEM, 1100, 1, 13, 131, SR_F64)
CASE(elem_r100_one, ELEM, 100, 1, 1, 1, SR_F64)
CASE(elem_r100_one_row, ELEM, 100, 1, 1, 1031, SR_F32)
CASE(elem_r100_no_rows, ELEM, 100, 1, 0, 257, SR_F32)
CASE(elem_r100_no_cols, ELEM, 100, 1, 37, 0, SR_F64)
/* B the product of two vectors of the reduced side (the derivative of the SGPR form in g). */
CASE(prod_r100, PROD, 100, 1, 100, 1031, SR_F64)
CASE(prod_r17_axis0_f32, PROD, 17, 0, 523, 17, SR_F32)
/* A SumSoftMaxWeight whose weight is a formula of the reduced side. */
CASE(ssmw_r17, SSMW_B, 17, 1, 131, 1031, SR_F32)
CASE(ssmw_r100_axis0_f64, SSMW_B, 100, 0, 523, 37, SR_F64)

/* Tier 0 (no compiled code). */
#define CASE0(name, ...)                                                                           \
    Test(hoist_tier0, name) { run_case((struct hcase){__VA_ARGS__}, NULL); }
CASE0(sgpr_r17_f32, SGPR, 17, 1, 17, 1031, SR_F32)
CASE0(sgpr_r100_axis0, SGPR, 100, 0, 2003, 100, SR_F64)
CASE0(elem_r100_no_rows, ELEM, 100, 1, 0, 257, SR_F32)
CASE0(prod_r100, PROD, 100, 1, 100, 1031, SR_F64)
CASE0(ssmw_r17, SSMW_B, 17, 1, 131, 1031, SR_F32)

/* SYMRED_JIT=async: tier 0 while the modules of F's and B's tiles compile, then compiled code. */
Test(hoist_tier0, async_then_compiled)
{
    char dir[] = "/tmp/symred-hoist-async-XXXXXX";
    cr_assert(mkdtemp(dir) != NULL);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_CACHE_DIR", dir), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "async"), SR_OK);
    struct hcase c = {SGPR, 100, 1, 100, 1031, SR_F64};
    sr_kernel *kg, *kr;
    kernels(&c, &kg, &kr);
    sr_plan_info p = tu_plan(kg);
    cr_assert(!have_gemm || (p.tier == 0 && p.compiling), "tier %d compiling %d", p.tier,
              p.compiling);
    compare(&c, kg, kr, NULL);
    cr_assert_eq(sr_kernel_wait(kg, -1), SR_OK);
    p = tu_plan(kg);
    cr_assert(p.tier == 1 && !p.compiling, "tier %d compiling %d", p.tier, p.compiling);
    compare(&c, kg, kr, NULL);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Block-sparse ranges: two row blocks over different intervals, rows outside every block. */
Test(hoist, ranges)
{
    int64_t ri[4] = {3, 40, 50, 120}, sl[2] = {2, 3}, rj[6] = {0, 100, 300, 700, 5, 1000};
    sr_ranges rg = {
        .nranges_i = 2, .ranges_i = ri, .slices_i = sl, .nredranges_j = 3, .redranges_j = rj};
    run_case((struct hcase){SGPR, 100, 1, 131, 1031, SR_F64}, &rg);
}

/* A budget below the default tiles' workspace (B's tile of 256 x 100 float64 alone is 200 KiB):
 * smaller tiles, B still hoisted, the same results. */
Test(hoist, budget_shrinks_tiles)
{
    struct hcase c = {SGPR, 100, 1, 100, 2003, SR_F64};
    sr_kernel *kg, *kr;
    kernels(&c, &kg, &kr);
    const sr_plan_info dflt = tu_plan(kg);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 300 << 10), SR_OK);
    kernels(&c, &kg, &kr);
    const sr_plan_info cut = tu_plan(kg);
    if (have_gemm)
        cr_assert(dflt.tile_rows * dflt.tile_cols > cut.tile_rows * cut.tile_cols,
                  "no smaller tiles: %d x %d, without the budget %d x %d", cut.tile_rows,
                  cut.tile_cols, dflt.tile_rows, dflt.tile_cols);
    compare(&c, kg, kr, NULL);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

/* A budget nothing fits: SR_EBUDGET with a message naming the budget, the context usable. */
Test(hoist, budget_too_small)
{
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 2048), SR_OK);
    struct hcase c = {SGPR, 100, 1, 100, 2003, SR_F64};
    sr_kernel *k;
    sr_status st = build(&c, false, &k);
    cr_assert_eq(st, SR_EBUDGET, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "budget"), "%s", sr_ctx_error(ctx));
    cr_assert_null(k);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    run_case(c, NULL);
}
