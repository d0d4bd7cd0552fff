/*
 * test-symmetric.c — the symmetric driver of the fused two-product (src/cpu/fused-run.c) and the
 * symmetry test of formulas (src/formulas/symmetry.c), against the reference interpreter.
 *
 * A Sum of F(x_i, y_j) * b_j with F symmetric under exchanging x and y runs each off-diagonal
 * tile of F once when x and y are the same array and nx = ny is more than one tile. Checked:
 * which runs take the driver (cpu_fused_symmetric) and that every run matches the reference at
 * sizes 0, 1, one tile plus one, primes and sizes no tile divides; widths 1, 11, 16, 17 and 64;
 * float32 and float64; both axes; NaN and infinities in x and in b. Runs that must take the
 * ordinary path and still match: x and y distinct arrays holding equal values, the same array
 * with nx != ny, a formula that looks symmetric and is not (SqDist(x, y * 2)), and a memory
 * budget too small for the per-thread accumulators. Symmetry with two pairs of variables and
 * parameters, and formulas it must refuse, are checked on the expressions.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "formulas/formulas.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static bool have_blis;

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_GEMM_KERNEL");
    unsetenv("SYMRED_MEM_LIMIT");
    unsetenv("SYMRED_NUM_THREADS");
    unsetenv("SYMRED_ACC");
    have_blis = tu_blis_usable();
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(sym, .init = setup, .fini = teardown);

enum form {
    GAUSS,     /* Exp(-SqDist(x, y) g) b */
    MATERN,    /* (1 + Sqrt(SqDist(x, y) + 1e-20)) Exp(-Sqrt(SqDist(x, y) + 1e-20)) b */
    ASYM,      /* Exp(-SqDist(x, y * 2) g) b: not symmetric */
    TWO_PAIRS, /* Exp(-SqDist(x, y) g - (u | v)^2) b, u and v of dimension 2 */
    HOIST_B    /* Exp(-SqDist(x, y) g) Exp(b): B a formula, hoisted, not a variable */
};

enum special { NONE, NAN_X, INF_X, INF_B, NAN_B };

struct scase {
    enum form form;
    int R, axis;
    int64_t nx, ny;
    sr_dtype dt;
    enum special sp;
    bool same;      /* x and y (and u and v) the same array */
    int64_t budget; /* SYMRED_MEM_LIMIT, 0 none */
};

/* x (arg 0) and y (arg 1) of dimension 3, b (arg 2) of width R on the reduced axis, g (arg 3) a
 * parameter, u (arg 4) and v (arg 5) of dimension 2 for TWO_PAIRS. */
static sr_expr *formula(const struct scase *c)
{
    bool ax1 = c->axis == 1;
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *g = sr_pm(ctx, 3, 1);
    sr_expr *b = ax1 ? sr_vj(ctx, 2, c->R) : sr_vi(ctx, 2, c->R);
    sr_expr *d = sr_sqdist(ctx, x, y), *F;
    switch (c->form) {
    case MATERN: {
        sr_expr *r = sr_sqrt(ctx, sr_add(ctx, d, sr_const(ctx, 1e-20)));
        F = sr_mul(ctx, sr_add(ctx, sr_const(ctx, 1), r), sr_exp(ctx, sr_neg(ctx, r)));
        break;
    }
    case ASYM:
        F = sr_exp(
            ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, sr_mul(ctx, y, sr_const(ctx, 2))), g)));
        break;
    case GAUSS:
    case HOIST_B:
        F = sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, d, g)));
        break;
    default: {
        sr_expr *uv = sr_scalprod(ctx, sr_vi(ctx, 4, 2), sr_vj(ctx, 5, 2));
        F = sr_exp(ctx, sr_sub(ctx, sr_neg(ctx, sr_mul(ctx, d, g)), sr_square(ctx, uv)));
        break;
    }
    }
    return sr_mul(ctx, F, c->form == HOIST_B ? sr_exp(ctx, b) : b);
}

static void *fill(sr_dtype dt, int64_t n, double lo, double hi, uint64_t *s)
{
    void *p = malloc((dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1));
    tu_fill(p, dt, n, lo, hi, s);
    return p;
}

static void *copy_of(const void *p, sr_dtype dt, int64_t n)
{
    size_t bytes = (dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1);
    void *q = malloc(bytes);
    memcpy(q, p, bytes);
    return q;
}

/* Whether a run of c must take the symmetric driver. */
static bool expect_sym(const struct scase *c)
{
    return have_blis && c->form != ASYM && c->form != HOIST_B && c->R >= 4 && c->same &&
           c->nx == c->ny && c->nx > 256 && c->budget == 0;
}

/* Builds the kernel of c and the reference's, runs both on the same inputs and compares every
 * output; checks explain and which runs take the symmetric driver. */
/* Whether k's symmetric candidate was rejected because F is not symmetric. */
static bool rejected_as_not_symmetric(const sr_kernel *k)
{
    for (int i = 0; i < tu_plan(k).plans; i++) {
        sr_plan_candidate p = {.size = sizeof p};
        if (sr_kernel_plan_candidate(k, i, &p) == SR_OK && p.strategy == SR_STRATEGY_SYMMETRIC &&
            !p.feasible)
            return strstr(p.why, "F is not symmetric") != NULL;
    }
    return false;
}

static void run_case(const struct scase *c)
{
    if (c->budget) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)c->budget);
        cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_MEM_LIMIT", v), SR_OK, "%s", sr_ctx_error(ctx));
    }
    sr_expr *f = formula(c);
    cr_assert_not_null(f, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.axis = c->axis;
    d.dtype = c->dt;
    sr_kernel *kg, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kg), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(kg);
    bool sym_plan = have_blis && c->R >= 4 && c->form != ASYM && c->form != HOIST_B;
    cr_assert_eq(tu_plan(kg).strategy == SR_STRATEGY_SYMMETRIC, sym_plan, "%s", ex);
    if (c->form == ASYM && c->R >= 4 && have_blis)
        cr_assert(rejected_as_not_symmetric(kg), "%s", ex);
    if (c->form == HOIST_B && c->R >= 4)
        cr_assert(tu_plan(kg).b_hoisted, "%s", ex);

    uint64_t s = 7 + (uint64_t)c->R * 31 + (uint64_t)c->nx * 5 + (uint64_t)c->ny;
    int64_t nb = c->axis == 1 ? c->ny : c->nx, nout = c->axis == 1 ? c->nx : c->ny;
    /* x and u hold max(nx, ny) rows: with nx < ny, y (x itself) reads ny of them. */
    int64_t rows = c->nx > c->ny ? c->nx : c->ny;
    void *x = fill(c->dt, rows * 3, -1, 1, &s), *u = fill(c->dt, rows * 2, -1, 1, &s);
    void *b = fill(c->dt, nb * c->R, 0, 1, &s);
    if (c->sp == NAN_X && c->nx > 2)
        tu_set(x, c->dt, 2 * 3 + 1, NAN);
    if (c->sp == INF_X && c->nx > 300)
        tu_set(x, c->dt, 300 * 3, INFINITY);
    if (c->sp == INF_B && nb > 270)
        tu_set(b, c->dt, 270 * c->R + 1, INFINITY);
    if (c->sp == NAN_B && nb > 5)
        tu_set(b, c->dt, 5 * c->R, NAN);
    /* y: x itself, a copy of x (equal values, another array), or x's first rows. */
    void *y = c->same ? x : copy_of(x, c->dt, c->ny * 3);
    void *v = c->same ? u : copy_of(u, c->dt, c->ny * 2);
    double g64 = 1.5;
    float g32 = 1.5f;
    const void *args[6] = {x, y, b, c->dt == SR_F64 ? (const void *)&g64 : (const void *)&g32,
                           u, v};
    int nargs = sr_kernel_nargs(kg);
    cr_assert_eq(cpu_fused_symmetric(kg, c->nx, c->ny, args), expect_sym(c),
                 "form %d R %d %lldx%lld same %d budget %lld:\n%s", c->form, c->R, (long long)c->nx,
                 (long long)c->ny, c->same, (long long)c->budget, ex);
    size_t esz = c->dt == SR_F64 ? 8 : 4;
    void *o1 = calloc((size_t)(nout * c->R + 1), esz), *o2 = calloc((size_t)(nout * c->R + 1), esz);
    sr_run_desc r1 = {c->nx, c->ny, nargs, args, o1, NULL},
                r2 = {c->nx, c->ny, nargs, args, o2, NULL};
    cr_assert_eq(sr_kernel_run_ex(kg, &r1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ex(kr, &r2), SR_OK, "%s", sr_ctx_error(ctx));
    /* A second call gives the same bits: each thread's share of the tiles is fixed. */
    void *o3 = calloc((size_t)(nout * c->R + 1), esz);
    sr_run_desc r3 = {c->nx, c->ny, nargs, args, o3, NULL};
    cr_assert_eq(sr_kernel_run_ex(kg, &r3), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(memcmp(o1, o3, esz * (size_t)(nout * c->R)) == 0, "two calls differ");
    free(o3);
    double rtol = c->dt == SR_F64 ? 1e-11 : 3e-5;
    for (int64_t t = 0; t < nout * c->R; t++) {
        double a = tu_get(o1, c->dt, t), e = tu_get(o2, c->dt, t);
        cr_assert(tu_close(a, e, rtol, rtol * 1e-3),
                  "form %d R %d axis %d %lldx%lld dt %d sp %d same %d [row %lld, col %lld]: "
                  "%.9g, reference %.9g",
                  c->form, c->R, c->axis, (long long)c->nx, (long long)c->ny, c->dt, c->sp, c->same,
                  (long long)(t / c->R), (long long)(t % c->R), a, e);
    }
    if (!c->same) {
        free(y);
        free(v);
    }
    free(x);
    free(u);
    free(b);
    free(o1);
    free(o2);
    sr_kernel_free(kg);
    sr_kernel_free(kr);
}

#define CASE(name, ...)                                                                            \
    Test(sym, name)                                                                                \
    {                                                                                              \
        struct scase c = {__VA_ARGS__};                                                            \
        run_case(&c);                                                                              \
    }

/* GPyTorch's shape (11 columns: y and 10 probes) and widths around BLIS's multiples of 4. */
CASE(gauss_r11, GAUSS, 11, 1, 1031, 1031, SR_F32, NONE, true, 0)
CASE(gauss_r11_f64, GAUSS, 11, 1, 1031, 1031, SR_F64, NONE, true, 0)
CASE(gauss_r16_prime, GAUSS, 16, 1, 521, 521, SR_F32, NONE, true, 0)
CASE(gauss_r17_tile_plus_one, GAUSS, 17, 1, 257, 257, SR_F32, NONE, true, 0)
CASE(gauss_r64_f64_axis0, GAUSS, 64, 0, 523, 523, SR_F64, NONE, true, 0)
CASE(gauss_r17_axis0, GAUSS, 17, 0, 769, 769, SR_F32, NONE, true, 0)
CASE(matern_r11, MATERN, 11, 1, 601, 601, SR_F32, NONE, true, 0)
CASE(two_pairs_r11, TWO_PAIRS, 11, 1, 601, 601, SR_F32, NONE, true, 0)
/* Width 1 (the direct strategy), one tile or less, one row, none. */
CASE(gauss_r1, GAUSS, 1, 1, 521, 521, SR_F32, NONE, true, 0)
CASE(gauss_r11_one_tile, GAUSS, 11, 1, 256, 256, SR_F32, NONE, true, 0)
CASE(gauss_r11_one, GAUSS, 11, 1, 1, 1, SR_F32, NONE, true, 0)
CASE(gauss_r11_none, GAUSS, 11, 1, 0, 0, SR_F32, NONE, true, 0)
/* NaN and infinities: in a row of x (its whole row and column of F) and in b. */
CASE(gauss_nan_x, GAUSS, 11, 1, 601, 601, SR_F32, NAN_X, true, 0)
CASE(gauss_inf_x, GAUSS, 16, 1, 601, 601, SR_F64, INF_X, true, 0)
CASE(gauss_inf_b, GAUSS, 11, 1, 601, 601, SR_F32, INF_B, true, 0)
CASE(gauss_nan_b, GAUSS, 17, 1, 601, 601, SR_F32, NAN_B, true, 0)
/* The ordinary path: equal values in two arrays, the same array with nx != ny, a formula that
 * is not symmetric, B a formula rather than a variable, a budget without room for the accumulators
 * (1031 x 64 float32 per thread, and the fused two-product fits). */
CASE(gauss_r11_distinct, GAUSS, 11, 1, 601, 601, SR_F32, NONE, false, 0)
CASE(two_pairs_distinct, TWO_PAIRS, 11, 1, 601, 601, SR_F32, NONE, false, 0)
CASE(gauss_r11_prefix, GAUSS, 11, 1, 307, 601, SR_F32, NONE, true, 0)
CASE(asym_r11, ASYM, 11, 1, 601, 601, SR_F32, NONE, true, 0)
CASE(hoisted_b_r11, HOIST_B, 11, 1, 601, 601, SR_F32, NONE, true, 0)
CASE(gauss_r64_budget, GAUSS, 64, 1, 1031, 1031, SR_F32, NONE, true, 256 << 10)

/* A budget with room for them: the symmetric driver, with as many threads as fit. */
Test(sym, budget_fits)
{
    struct scase c = {GAUSS, 11, 1, 601, 601, SR_F32, NONE, true, 0};
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_MEM_LIMIT", "64MB"), SR_OK, "%s",
                 sr_ctx_error(ctx));
    run_case(&c);
}

/* The symmetry test itself: which pairing it finds, and what it must refuse. */
Test(sym, pairs)
{
    int vi[4], vj[4];
    const char *al[] = {"x = Vi(0, 3)", "y = Vj(1, 3)", "g = Pm(2, 1)",
                        "u = Vj(3, 2)", "w = Vi(4, 2)", "z = Vj(5, 3)"};
    struct {
        const char *f;
        int n, i0, j0;
    } t[] = {
        {"Exp(-SqDist(x, y) * g)", 1, 0, 1},
        {"Exp(-SqDist(y, x) * g) + (x | y)", 1, 0, 1},
        {"Sum((x - y) * (x - y))", 1, 0, 1},
        /* pairs found by permutation: w (i) goes with u (j), x with y */
        {"Exp(-SqDist(x, y) - SqDist(w, u))", 2, -1, -1},
        {"Exp(-SqDist(x, y * 2))", -1, 0, 0},
        {"Exp(-SqDist(x, y)) * Sum(x)", -1, 0, 0},
        {"x - y", -1, 0, 0},
        /* an i-variable without a partner of its dimension */
        {"Exp(-SqDist(x, z)) * (w | w)", -1, 0, 0},
        /* two j-variables of the same dimension, only one of them pairs */
        {"Exp(-SqDist(x, y) - SqDist(x, z))", -1, 0, 0},
    };
    for (size_t q = 0; q < sizeof t / sizeof t[0]; q++) {
        sr_expr *e = NULL;
        cr_assert_eq(sr_parse(ctx, t[q].f, al, 6, &e), SR_OK, "%s", sr_ctx_error(ctx));
        int n = simp_symmetric_pairs(ctx, e, vi, vj, 4);
        cr_assert_eq(n, t[q].n, "%s: %d pairs", t[q].f, n);
        if (n == 1)
            cr_assert(vi[0] == t[q].i0 && vj[0] == t[q].j0, "%s: [%d] [%d]", t[q].f, vi[0], vj[0]);
        if (n == 2)
            cr_assert((vi[0] == 0 && vj[0] == 1 && vi[1] == 4 && vj[1] == 3) ||
                          (vi[0] == 4 && vj[0] == 3 && vi[1] == 0 && vj[1] == 1),
                      "%s: [%d]-[%d], [%d]-[%d]", t[q].f, vi[0], vj[0], vi[1], vj[1]);
    }
}
