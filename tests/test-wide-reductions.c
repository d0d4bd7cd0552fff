/*
 * test-wide-reductions.c — every reduction with a wide F, and SumSoftMaxWeight with a wide
 * weight formula, on the CPU JIT against the reference interpreter. These formulas are no fused
 * two-product (tests/test-wide.c has those): past 64 values per pair, or with a pair node held
 * in an array (a MatVecMult of a wide matrix), the direct strategy runs in loop mode, and
 * explain must name the CPU JIT, never the reference.
 *
 * Widths 1, 2, 15, 16, 17, 63, 64, 65, 255 and 1100; for each reduction and width one case of a
 * rotation over float32/float64, both axes, sizes 0, 1, primes and sizes no tile divides,
 * block-sparse ranges, and NaN or infinities in the inputs. The selections (Min, ArgMin, KMin,
 * ...) use a formula that is exact on grid inputs, so values and indices must be equal, ties
 * included; Sum, LogSumExp and SumSoftMaxWeight a smooth one, compared within the dtype's
 * rounding.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_MEM_LIMIT");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(wide_red, .init = setup, .fini = teardown);

static const int widths[] = {1, 2, 15, 16, 17, 63, 64, 65, 255, 1100};
#define NWIDTHS ((int)(sizeof widths / sizeof *widths))

enum special { NONE, NAN_IN, INF_IN };

struct rcase {
    sr_reduction red;
    int W, axis;
    sr_dtype dt;
    int64_t nx, ny;
    bool array; /* a MatVecMult term: a pair node held in an array */
    bool ranges;
    enum special sp;
};

/* Arguments: x Vi(3), y Vj(3), u Vi(W), v Vj(W), g Pm(1), M Vi(2W), z Vj(2). */
#define NARGS 7

static bool uses_k(sr_reduction r)
{
    return r == SR_KMIN || r == SR_ARGKMIN || r == SR_KMIN_ARGKMIN;
}

static bool selection(sr_reduction r)
{
    return r != SR_SUM && r != SR_LOGSUMEXP && r != SR_SUMSOFTMAXWEIGHT;
}

/* F (and the weight of SumSoftMaxWeight) of c. Selections: SqDist(x, y) (u - v) [+ M z], exact
 * on the grid inputs; the others: Exp(-SqDist(x, y) g) v + Cos(u - v) [+ M z]; the weight:
 * Cos(u - v) v [+ M z] with F = -SqDist(x, y) g. */
static sr_expr *formula(const struct rcase *c, sr_expr **weight)
{
    int W = c->W;
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *u = sr_vi(ctx, 2, W),
            *v = sr_vj(ctx, 3, W), *g = sr_pm(ctx, 4, 1);
    sr_expr *mz = c->array ? sr_matvecmult(ctx, sr_vi(ctx, 5, 2 * W), sr_vj(ctx, 6, 2)) : NULL;
    sr_expr *d = sr_sqdist(ctx, x, y), *f;
    *weight = NULL;
    if (c->red == SR_SUMSOFTMAXWEIGHT) {
        sr_expr *w = sr_mul(ctx, sr_cos(ctx, sr_sub(ctx, u, v)), v);
        *weight = mz ? sr_add(ctx, w, mz) : w;
        return sr_neg(ctx, sr_mul(ctx, d, g));
    }
    if (selection(c->red))
        f = sr_mul(ctx, d, sr_sub(ctx, u, v));
    else
        f = sr_add(ctx, sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, d, g))), v),
                   sr_cos(ctx, sr_sub(ctx, u, v)));
    return mz ? sr_add(ctx, f, mz) : f;
}

/* n values of dtype dt: multiples of 1/8 in [-2, 2] (exact products and sums). */
static void *grid(sr_dtype dt, int64_t n, uint64_t *s)
{
    void *p = malloc((dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1));
    for (int64_t t = 0; t < n; t++) {
        tu_set(p, dt, t, (double)(tu_rand(s) % 33) / 8.0 - 2.0);
    }
    return p;
}

/* Block-sparse ranges for either axis: two output blocks over different reduced intervals
 * (one of them two intervals), the rows past 3/4 in no block. */
struct rg {
    int64_t ro[4], sl[2], rr[6];
    sr_ranges r;
};

static void make_ranges(struct rg *g, int axis, int64_t no, int64_t nr)
{
    int64_t ro[4] = {0, no / 2, no / 2, 3 * no / 4}, sl[2] = {2, 3},
            rr[6] = {0, nr / 3, nr / 2, nr, nr / 4, nr};
    memcpy(g->ro, ro, sizeof ro);
    memcpy(g->sl, sl, sizeof sl);
    memcpy(g->rr, rr, sizeof rr);
    memset(&g->r, 0, sizeof g->r);
    if (axis == 1) {
        g->r.nranges_i = 2;
        g->r.ranges_i = g->ro;
        g->r.slices_i = g->sl;
        g->r.nredranges_j = 3;
        g->r.redranges_j = g->rr;
    } else {
        g->r.nranges_j = 2;
        g->r.ranges_j = g->ro;
        g->r.slices_j = g->sl;
        g->r.nredranges_i = 3;
        g->r.redranges_i = g->rr;
    }
}

static void run_case(const struct rcase *c)
{
    sr_expr *w;
    sr_expr *f = formula(c, &w);
    cr_assert_not_null(f, "%s", sr_ctx_error(ctx));
    int64_t nout = c->axis == 1 ? c->nx : c->ny, nred = c->axis == 1 ? c->ny : c->nx;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = c->red;
    d.axis = c->axis;
    d.dtype = c->dt;
    d.weight = w;
    d.k = uses_k(c->red) ? 3 : 1;
    sr_kernel *kj, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kj), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(kj);
    cr_assert(tu_runs_jit(kj) && !tu_plan(kj).fallback,
              "expected generated code, not the reference:\n%s", ex);
    if (c->W + (w ? 1 : 0) > 64 || (c->array && c->W > 16))
        cr_assert(tu_plan(kj).loop_mode, "expected the direct strategy's loop mode:\n%s", ex);

    uint64_t s = 7 + (uint64_t)c->W * 131 + (uint64_t)c->red * 17 + (uint64_t)c->nx;
    const int dims[NARGS] = {3, 3, c->W, c->W, 1, 2 * c->W, 2};
    const int cats[NARGS] = {0, 1, 0, 1, 2, 0, 1};
    void *a[NARGS];
    for (int v = 0; v < NARGS; v++)
        a[v] = grid(c->dt, (cats[v] == 2 ? 1 : cats[v] == 0 ? c->nx : c->ny) * dims[v], &s);
    tu_set(a[4], c->dt, 0, 0.5); /* g */
    if (c->sp != NONE && c->nx > 1 && c->ny > 2) {
        double bad = c->sp == NAN_IN ? NAN : INFINITY;
        tu_set(a[2], c->dt, 1 * c->W + c->W / 2, bad); /* u of row 1 */
        tu_set(a[3], c->dt, 2 * c->W, -bad);           /* v of column 2 */
    }
    int od = sr_kernel_out_dim(kj);
    cr_assert_eq(od, sr_kernel_out_dim(kr));
    cr_assert_eq(od, c->W * (uses_k(c->red) ? 3 : 1));
    size_t es = c->dt == SR_F64 ? 8 : 4, n = (size_t)(nout * od + 1);
    bool vals = c->red != SR_ARGMIN && c->red != SR_ARGMAX && c->red != SR_ARGKMIN;
    bool idx = c->red == SR_ARGMIN || c->red == SR_ARGMAX || c->red == SR_MIN_ARGMIN ||
               c->red == SR_MAX_ARGMAX || c->red == SR_ARGKMIN || c->red == SR_KMIN_ARGKMIN;
    void *o1 = calloc(n, es), *o2 = calloc(n, es);
    int64_t *i1 = calloc(n, 8), *i2 = calloc(n, 8);
    sr_run_desc r1 = {
        c->nx,          c->ny, sr_kernel_nargs(kj), (const void *const *)a, vals ? o1 : NULL,
        idx ? i1 : NULL};
    sr_run_desc r2 = {
        c->nx,          c->ny, sr_kernel_nargs(kr), (const void *const *)a, vals ? o2 : NULL,
        idx ? i2 : NULL};
    struct rg g;
    make_ranges(&g, c->axis, nout, nred);
    const sr_ranges *rg = c->ranges ? &g.r : NULL;
    cr_assert_eq(sr_kernel_run_ranges(kj, &r1, rg), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ranges(kr, &r2, rg), SR_OK, "%s", sr_ctx_error(ctx));
    double rtol = selection(c->red) ? 0 : c->dt == SR_F64 ? 1e-11 : 3e-5;
    /* Sum's terms are at most about 11 in size: a rounding error per term at worst. */
    double atol = c->red == SR_SUM ? rtol * 11 * sqrt((double)(nred + 1)) : rtol;
    for (int64_t t = 0; t < nout * od; t++) {
        if (vals) {
            double x = tu_get(o1, c->dt, t), e = tu_get(o2, c->dt, t);
            cr_assert(tu_close(x, e, rtol, atol),
                      "%s W %d axis %d %s %lldx%lld array %d ranges %d sp %d [row %lld, col "
                      "%lld]: %.9g, reference %.9g",
                      sr_reduction_name(c->red), c->W, c->axis, c->dt == SR_F64 ? "f64" : "f32",
                      (long long)c->nx, (long long)c->ny, c->array, c->ranges, c->sp,
                      (long long)(t / od), (long long)(t % od), x, e);
        }
        if (idx)
            cr_assert_eq(i1[t], i2[t],
                         "%s W %d axis %d [row %lld, col %lld]: index %lld, "
                         "reference %lld",
                         sr_reduction_name(c->red), c->W, c->axis, (long long)(t / od),
                         (long long)(t % od), (long long)i1[t], (long long)i2[t]);
    }
    for (int v = 0; v < NARGS; v++)
        free(a[v]);
    free(o1);
    free(o2);
    free(i1);
    free(i2);
    sr_kernel_free(kj);
    sr_kernel_free(kr);
}

/* Every width of reduction red, each with its own point of the rotation over dtypes, axes,
 * sizes, ranges, array nodes and special values. The sizes shrink (halving the larger side) so
 * that the reference interprets at most about 400 000 pair components. */
static void all_widths(sr_reduction red)
{
    static const int64_t sizes[][2] = {{37, 131}, {0, 37},  {131, 1031}, {1, 1},
                                       {1, 1031}, {29, 13}, {257, 3},    {3, 521}};
    const int nsz = (int)(sizeof sizes / sizeof *sizes);
    for (int i = 0; i < NWIDTHS; i++) {
        int r = (int)red;
        struct rcase c = {red,
                          widths[i],
                          (i / 2 + r) % 2,
                          (i + r) % 2 ? SR_F64 : SR_F32,
                          sizes[(i + 3 * r) % nsz][0],
                          sizes[(i + 3 * r) % nsz][1],
                          i % 3 == 1,
                          (i + r) % 4 == 2,
                          (i + r) % 5 == 4   ? NAN_IN
                          : (i + r) % 5 == 2 ? INF_IN
                                             : NONE};
        while (c.nx * c.ny * c.W > 400000)
            *(c.nx > c.ny ? &c.nx : &c.ny) /= 2;
        int64_t nred = c.axis == 1 ? c.ny : c.nx;
        if (uses_k(red) && nred < 3) /* k = 3 needs three reduced indices */
            *(c.axis == 1 ? &c.ny : &c.nx) = 7;
        run_case(&c);
    }
}

#define RED(name, red)                                                                             \
    Test(wide_red, name, .timeout = 600) { all_widths(red); }

RED(sum, SR_SUM)
RED(min, SR_MIN)
RED(max, SR_MAX)
RED(argmin, SR_ARGMIN)
RED(argmax, SR_ARGMAX)
RED(min_argmin, SR_MIN_ARGMIN)
RED(max_argmax, SR_MAX_ARGMAX)
RED(kmin, SR_KMIN)
RED(argkmin, SR_ARGKMIN)
RED(kmin_argkmin, SR_KMIN_ARGKMIN)
RED(logsumexp, SR_LOGSUMEXP)
RED(sumsoftmaxweight, SR_SUMSOFTMAXWEIGHT)
