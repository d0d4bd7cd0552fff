/*
 * test-split.c — the sum split (src/core/split.c): Sum of (A + C) P run as two Sum kernels, of
 * A P and C P, each on the fused two-product strategy. Checked to fire (explain names the split
 * and both parts' fused plans) on SGPR's derivative in the lengthscale and on a simpler wide form,
 * and differentially: the CPU kernel against the reference kernel (which runs the formula as
 * given), both axes, both dtypes, empty and odd sizes, block-sparse ranges, a NaN in one addend,
 * and the gradient kernels of the split kernel. A narrow form, where the direct plan of the whole
 * formula is the cheaper, is not split.
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

static sr_ctx *ctx;
static void setup(void)
{
    unsetenv("SYMRED_SIMPLIFY");
    unsetenv("SYMRED_DEVICE");
    unsetenv("SYMRED_GEMM");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(split, .init = setup, .fini = teardown);

#define M 64 /* SGPR's inducing points: the width of q */

/* A variable of the output index (out) or of the reduced index for a kernel over axis. */
static sr_expr *side(int axis, bool out, int idx, int dim)
{
    return (axis == 1) == out ? sr_vi(ctx, idx, dim) : sr_vj(ctx, idx, dim);
}

/* SGPR's d/dg of the m-wide Sum: (SqDist(z,x) + q) Exp(-g SqDist(z,x)) Exp(-g q), z of the
 * output index, x of the reduced one, q = SqNorm2(x) - 2 Zt x + zn (m wide). */
static sr_expr *sgpr_m(int axis, int m)
{
    sr_expr *z = side(axis, true, 0, 3), *x = side(axis, false, 1, 3);
    sr_expr *g = sr_pm(ctx, 2, 1), *zt = sr_pm(ctx, 3, 3 * m), *zn = sr_pm(ctx, 4, m);
    sr_expr *q = sr_add(
        ctx,
        sr_sub(ctx, sr_sqnorm2(ctx, x), sr_mul(ctx, sr_const(ctx, 2), sr_matvecmult(ctx, zt, x))),
        zn);
    sr_expr *d = sr_sqdist(ctx, z, x);
    return sr_mul(ctx, sr_mul(ctx, sr_add(ctx, d, q), sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, g, d)))),
                  sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, g, q))));
}

static sr_expr *sgpr(int axis) { return sgpr_m(axis, M); }
static sr_expr *sgpr10(int axis) { return sgpr_m(axis, 10); }

/* (SqDist(x,y) + c) Exp(-SqDist(x,y)) b with c and b of the reduced index, w wide. */
static sr_expr *simple(int axis, int w)
{
    sr_expr *x = side(axis, true, 0, 3), *y = side(axis, false, 1, 3);
    sr_expr *c = side(axis, false, 2, w), *b = side(axis, false, 3, w);
    sr_expr *d = sr_sqdist(ctx, x, y);
    return sr_mul(ctx, sr_mul(ctx, sr_add(ctx, d, c), sr_exp(ctx, sr_neg(ctx, d))), b);
}

static sr_kernel *mk(sr_expr *f, int axis, sr_dtype dt, sr_device dev)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUM;
    d.axis = axis;
    d.dtype = dt;
    d.device = dev;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

static bool fused(sr_strategy s) { return s == SR_STRATEGY_FUSED || s == SR_STRATEGY_SYMMETRIC; }

/* The kernel runs as the split, both parts on the fused strategy (the plan gives the first
 * part's pair work, and each part's strategy), estimated below F whole's best plan. */
static void assert_split(const sr_kernel *k)
{
    const char *ex = sr_kernel_explain(k);
    sr_plan_info p = tu_plan(k);
    cr_assert_eq(p.strategy, SR_STRATEGY_SUM_SPLIT, "not split:\n%s", ex);
    cr_assert(tu_runs_fused(k), "%s", ex);
    cr_assert(!p.split_why && p.split_parts == 2, "%s", ex);
    cr_assert(fused(p.split_strategy[0]) && fused(p.split_strategy[1]),
              "both parts fused: %d, %d\n%s", (int)p.split_strategy[0], (int)p.split_strategy[1],
              ex);
    cr_assert(p.split_est_ns[0] > 0 && p.split_est_ns[1] > 0 &&
                  p.split_est_ns[0] + p.split_est_ns[1] < p.split_whole_est_ns,
              "est. %g + %g against %g\n%s", p.split_est_ns[0], p.split_est_ns[1],
              p.split_whole_est_ns, ex);
}

/* The split was weighed and declined on the estimates: both parts' fused plans together not
 * below F whole's best, whose strategy is the kernel's. */
static void assert_declined_on_estimate(const sr_kernel *k)
{
    const char *ex = sr_kernel_explain(k);
    sr_plan_info p = tu_plan(k);
    cr_assert(p.strategy != SR_STRATEGY_SUM_SPLIT && p.split_why && p.split_parts == 2, "%s", ex);
    cr_assert(fused(p.split_strategy[0]) && fused(p.split_strategy[1]), "%s", ex);
    cr_assert(p.split_whole_est_ns > 0 &&
                  p.split_est_ns[0] + p.split_est_ns[1] >= p.split_whole_est_ns,
              "est. %g + %g against %g\n%s", p.split_est_ns[0], p.split_est_ns[1],
              p.split_whole_est_ns, ex);
    cr_assert_eq(p.split_whole, p.strategy, "F whole's best: %d, runs %d\n%s", (int)p.split_whole,
                 (int)p.strategy, ex);
}

/* Arrays for kernel k: nout output rows, nred reduced rows (axis order), values in [lo, hi). */
struct arrays {
    void *buf[8];
    const void *args[8];
    int nargs;
};

static void arrays_new(struct arrays *a, const sr_kernel *k, int axis, sr_dtype dt, int64_t nout,
                       int64_t nred, uint64_t *rng)
{
    memset(a, 0, sizeof *a);
    a->nargs = sr_kernel_nargs(k);
    cr_assert(a->nargs <= 8);
    int64_t nx = axis == 1 ? nout : nred, ny = axis == 1 ? nred : nout;
    for (int v = 0; v < a->nargs; v++) {
        sr_cat cat;
        int dim;
        cr_assert_eq(sr_kernel_var(k, v, &cat, &dim), SR_OK);
        if (!dim)
            continue;
        int64_t rows = cat == SR_CAT_I ? nx : cat == SR_CAT_J ? ny : 1;
        a->buf[v] = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)dim * 8);
        /* the parameters: g in [0.2, 1), Zt and zn small, so that q stays moderate */
        double lo = cat == SR_CAT_PARAM ? 0.2 : -1, hi = cat == SR_CAT_PARAM ? 1 : 1;
        tu_fill(a->buf[v], dt, rows * dim, lo, hi, rng);
        a->args[v] = a->buf[v];
    }
}

static void arrays_free(struct arrays *a)
{
    for (int v = 0; v < 8; v++)
        free(a->buf[v]);
}

/* out of kc against out of kr (nvals values): NaN where the reference has NaN, else close
 * relative to the largest reference value. */
static void compare(const void *oc, const void *orf, sr_dtype dt, int64_t nvals, const char *what)
{
    double big = 0;
    for (int64_t t = 0; t < nvals; t++) {
        double b = tu_get(orf, dt, t);
        if (isfinite(b) && fabs(b) > big)
            big = fabs(b);
    }
    double tol = dt == SR_F64 ? 1e-10 : 1e-4;
    for (int64_t t = 0; t < nvals; t++) {
        double a = tu_get(oc, dt, t), b = tu_get(orf, dt, t);
        cr_assert(isnan(a) == isnan(b) && (isnan(b) || fabs(a - b) <= tol * (1 + big)),
                  "%s: value %lld is %.17g split, %.17g as given", what, (long long)t, a, b);
    }
}

/*
 * The split CPU kernel of f against the reference kernel, nout x nred, dense or with block-sparse
 * ranges; nan_arg >= 0: a NaN in the first value of that argument.
 */
static void check(sr_expr *f, int axis, sr_dtype dt, int64_t nout, int64_t nred, bool ranges,
                  int nan_arg)
{
    sr_kernel *kc = mk(f, axis, dt, SR_DEVICE_CPU);
    sr_kernel *kr = mk(f, axis, dt, SR_DEVICE_REFERENCE);
    assert_split(kc);
    uint64_t rng = 7 + (uint64_t)(nout * 131 + nred);
    struct arrays a;
    arrays_new(&a, kc, axis, dt, nout, nred, &rng);
    if (nan_arg >= 0 && a.buf[nan_arg])
        tu_set(a.buf[nan_arg], dt, 0, NAN);
    int od = sr_kernel_out_dim(kc);
    size_t nb = (size_t)(nout > 0 ? nout : 1) * (size_t)od * 8;
    void *oc = malloc(nb), *orf = malloc(nb);
    sr_run_desc r = {
        .nx = axis == 1 ? nout : nred,
        .ny = axis == 1 ? nred : nout,
        .nargs = a.nargs,
        .args = a.args,
    };
    /* Blocks of bs output rows (5, or a 60th of many rows); block c reduces over [0, nred / 2)
     * and [3 nred / 4, nred), every third block over nothing. */
    int64_t bs = nout > 300 ? (nout + 59) / 60 : 5;
    int64_t nblk = (nout + bs - 1) / bs, rr[2 * 64], sl[64], red[2 * 128];
    int64_t nint = 0;
    cr_assert(nblk <= 64);
    for (int64_t c = 0; c < nblk; c++) {
        rr[2 * c] = bs * c;
        rr[2 * c + 1] = bs * c + bs < nout ? bs * c + bs : nout;
        if (c % 3 != 2) {
            red[2 * nint] = 0;
            red[2 * nint + 1] = nred / 2;
            nint++;
            red[2 * nint] = 3 * nred / 4;
            red[2 * nint + 1] = nred;
            nint++;
        }
        sl[c] = nint;
    }
    sr_ranges R = {0};
    if (axis == 1) {
        R.nranges_i = nblk;
        R.ranges_i = rr;
        R.slices_i = sl;
        R.nredranges_j = nint;
        R.redranges_j = red;
    } else {
        R.nranges_j = nblk;
        R.ranges_j = rr;
        R.slices_j = sl;
        R.nredranges_i = nint;
        R.redranges_i = red;
    }
    r.out = oc;
    cr_assert_eq(sr_kernel_run_ranges(kc, &r, ranges ? &R : NULL), SR_OK, "%s", sr_ctx_error(ctx));
    r.out = orf;
    cr_assert_eq(sr_kernel_run_ranges(kr, &r, ranges ? &R : NULL), SR_OK, "%s", sr_ctx_error(ctx));
    char what[160];
    snprintf(what, sizeof what, "axis %d %s %lld x %lld%s nan %d", axis,
             dt == SR_F64 ? "f64" : "f32", (long long)nout, (long long)nred,
             ranges ? " ranges" : "", nan_arg);
    compare(oc, orf, dt, nout * od, what);
    free(oc);
    free(orf);
    arrays_free(&a);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}

static const int64_t sizes[][2] = {{0, 5}, {1, 1}, {7, 0}, {13, 131}, {131, 67}};

/* Every size, dtype and axis, dense. */
static void check_sizes(sr_expr *(*form)(int axis))
{
    for (int axis = 0; axis < 2; axis++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
                check(form(axis), axis, dt ? SR_F64 : SR_F32, sizes[s][0], sizes[s][1], false, -1);
}

static sr_expr *simple16(int axis) { return simple(axis, 16); }
static sr_expr *simple64(int axis) { return simple(axis, 64); }

Test(split, sgpr_dense) { check_sizes(sgpr); }

/* With q 10 wide the direct plan of F whole holds more accumulators than the vector registers
 * do: the two fused parts are estimated (and measured) faster, and compute F's sums. */
Test(split, sgpr_ten_wide_splits) { check_sizes(sgpr10); }

/* With q 5 wide the direct plan of F whole stays, estimated below the two parts. */
Test(split, sgpr_five_wide_stays_direct)
{
    for (int axis = 0; axis < 2; axis++)
        for (int dt = 0; dt < 2; dt++) {
            sr_kernel *k = mk(sgpr_m(axis, 5), axis, dt ? SR_F64 : SR_F32, SR_DEVICE_CPU);
            cr_assert_eq(tu_plan(k).strategy, SR_STRATEGY_DIRECT, "%s", sr_kernel_explain(k));
            assert_declined_on_estimate(k);
            sr_kernel_free(k);
        }
}

Test(split, simple_dense)
{
    check_sizes(simple16);
    check_sizes(simple64);
}

Test(split, ranges)
{
    for (int axis = 0; axis < 2; axis++)
        for (int dt = 0; dt < 2; dt++) {
            check(sgpr(axis), axis, dt ? SR_F64 : SR_F32, 131, 67, true, -1);
            check(simple(axis, 16), axis, dt ? SR_F64 : SR_F32, 13, 131, true, -1);
        }
}

/* More output rows than one chunk of the second part's output (4 MiB: 8192 rows of 64 float64
 * values), dense and with ranges whose blocks straddle the chunks. */
Test(split, several_chunks)
{
    for (int axis = 0; axis < 2; axis++) {
        check(sgpr(axis), axis, SR_F64, 9000, 5, false, -1);
        check(sgpr(axis), axis, SR_F64, 9000, 5, true, -1);
    }
}

/* A NaN in q's zn (a column of the second part's B) and in c (a reduced row of it). */
Test(split, nan_in_one_addend)
{
    for (int axis = 0; axis < 2; axis++)
        for (int dt = 0; dt < 2; dt++) {
            check(sgpr(axis), axis, dt ? SR_F64 : SR_F32, 13, 131, false, 4);
            check(simple(axis, 16), axis, dt ? SR_F64 : SR_F32, 13, 131, false, 2);
        }
}

/* With c and b one value wide, F whole is a scalar formula that the direct strategy runs
 * cheaper than two kernels: no split. */
Test(split, narrow_b_is_not_split)
{
    for (int axis = 0; axis < 2; axis++) {
        sr_kernel *k = mk(simple(axis, 1), axis, SR_F32, SR_DEVICE_CPU);
        const char *ex = sr_kernel_explain(k);
        sr_plan_info p = tu_plan(k);
        cr_assert_eq(p.strategy, SR_STRATEGY_DIRECT, "%s", ex);
        /* Declined at the first part, offered the direct strategy only. */
        cr_assert(p.split_why && p.split_parts == 1 && p.split_strategy[0] == SR_STRATEGY_DIRECT,
                  "%s", ex);
        sr_kernel_free(k);
    }
}

/* The gradient kernels of a split kernel differentiate the formula as given: each against the
 * reference kernel's, in a variable of each index and in the parameter g. */
Test(split, gradient)
{
    for (int axis = 0; axis < 2; axis++)
        for (int var = 0; var < 3; var++) {
            sr_expr *f = sgpr(axis);
            sr_kernel *kc = mk(f, axis, SR_F64, SR_DEVICE_CPU);
            sr_kernel *kr = mk(f, axis, SR_F64, SR_DEVICE_REFERENCE);
            assert_split(kc);
            sr_kernel *gc, *gr;
            cr_assert_eq(sr_kernel_grad(kc, var, &gc), SR_OK, "%s", sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_grad(kr, var, &gr), SR_OK, "%s", sr_ctx_error(ctx));
            uint64_t rng = 11;
            int64_t nout = 13, nred = 29;
            struct arrays a;
            arrays_new(&a, gc, axis, SR_F64, nout, nred, &rng);
            int od = sr_kernel_out_dim(gc);
            int64_t rows = var == 1 ? nred : nout;
            double *oc = malloc((size_t)rows * (size_t)od * 8);
            double *orf = malloc((size_t)rows * (size_t)od * 8);
            int64_t nx = axis == 1 ? nout : nred, ny = axis == 1 ? nred : nout;
            cr_assert_eq(sr_kernel_run(gc, nx, ny, a.args, oc), SR_OK, "%s", sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_run(gr, nx, ny, a.args, orf), SR_OK, "%s", sr_ctx_error(ctx));
            compare(oc, orf, SR_F64, rows * od, "gradient");
            free(oc);
            free(orf);
            arrays_free(&a);
            sr_kernel_free(gc);
            sr_kernel_free(gr);
            sr_kernel_free(kc);
            sr_kernel_free(kr);
        }
}

/* With c one value wide and b 16 wide, F whole is already a scalar pair formula times b: one
 * fused kernel, cheaper than two. */
Test(split, fused_whole_is_not_split)
{
    for (int axis = 0; axis < 2; axis++) {
        sr_expr *x = side(axis, true, 0, 3), *y = side(axis, false, 1, 3);
        sr_expr *c = side(axis, false, 2, 1), *b = side(axis, false, 3, 16);
        sr_expr *d = sr_sqdist(ctx, x, y);
        sr_expr *f = sr_mul(ctx, sr_mul(ctx, sr_add(ctx, d, c), sr_exp(ctx, sr_neg(ctx, d))), b);
        sr_kernel *k = mk(f, axis, SR_F32, SR_DEVICE_CPU);
        cr_assert(tu_runs_fused(k), "%s", sr_kernel_explain(k));
        assert_declined_on_estimate(k);
        sr_kernel_free(k);
    }
}

/* float16 arrays: widened to float32 around the split kernel as around the reference's. */
Test(split, float16)
{
    for (int axis = 0; axis < 2; axis++) {
        sr_expr *f = simple(axis, 16);
        sr_kernel *kc = mk(f, axis, SR_F16, SR_DEVICE_CPU);
        sr_kernel *kr = mk(f, axis, SR_F16, SR_DEVICE_REFERENCE);
        assert_split(kc);
        uint64_t rng = 5;
        int64_t nout = 13, nred = 131;
        struct arrays a;
        arrays_new(&a, kc, axis, SR_F32, nout, nred, &rng);
        for (int v = 0; v < a.nargs; v++) { /* the same values as float16, in place */
            int dim;
            sr_cat cat;
            sr_kernel_var(kc, v, &cat, &dim);
            int64_t n = (cat == SR_CAT_PARAM                        ? 1
                         : cat == (axis == 1 ? SR_CAT_I : SR_CAT_J) ? nout
                                                                    : nred) *
                        dim;
            for (int64_t t = 0; t < n; t++)
                ((uint16_t *)a.buf[v])[t] = sr__f32_to_f16(((float *)a.buf[v])[t]);
        }
        int od = sr_kernel_out_dim(kc);
        uint16_t *oc = malloc((size_t)(nout * od) * 2), *orf = malloc((size_t)(nout * od) * 2);
        int64_t nx = axis == 1 ? nout : nred, ny = axis == 1 ? nred : nout;
        cr_assert_eq(sr_kernel_run(kc, nx, ny, a.args, oc), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_run(kr, nx, ny, a.args, orf), SR_OK, "%s", sr_ctx_error(ctx));
        float *fc = malloc((size_t)(nout * od) * 4), *fr = malloc((size_t)(nout * od) * 4);
        for (int64_t t = 0; t < nout * od; t++) {
            fc[t] = sr__f16_to_f32(oc[t]);
            fr[t] = sr__f16_to_f32(orf[t]);
        }
        compare(fc, fr, SR_F32, nout * od, "float16"); /* rounding to float16 apart: 1e-4 rel */
        free(fc);
        free(fr);
        free(oc);
        free(orf);
        arrays_free(&a);
        sr_kernel_free(kc);
        sr_kernel_free(kr);
    }
}

/* sr_kernel_eval_block of a split kernel: F's values, as the reference's. */
Test(split, eval_block)
{
    sr_expr *f = sgpr(1);
    sr_kernel *kc = mk(f, 1, SR_F64, SR_DEVICE_CPU);
    sr_kernel *kr = mk(f, 1, SR_F64, SR_DEVICE_REFERENCE);
    assert_split(kc);
    uint64_t rng = 3;
    struct arrays a;
    arrays_new(&a, kc, 1, SR_F64, 9, 17, &rng);
    size_t n = (size_t)(4 * 5 * M);
    double *oc = malloc(n * 8), *orf = malloc(n * 8);
    cr_assert_eq(sr_kernel_eval_block(kc, 9, 17, a.args, 2, 4, 11, 5, oc), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_eval_block(kr, 9, 17, a.args, 2, 4, 11, 5, orf), SR_OK, "%s",
                 sr_ctx_error(ctx));
    compare(oc, orf, SR_F64, (int64_t)n, "eval_block");
    free(oc);
    free(orf);
    arrays_free(&a);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}

/* Under a memory budget: a kernel that splits states a workspace within it (the parts' and the
 * chunk's) and computes the same values with chunks of a few rows. */
Test(split, memory_budget)
{
    int nsplit = 0;
    for (int64_t lim = (int64_t)3 << 20; lim >= (int64_t)1 << 19; lim -= (int64_t)1 << 18) {
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, lim), SR_OK);
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = SR_SUM;
        d.axis = 1;
        d.dtype = SR_F64;
        sr_kernel *k;
        sr_status st = sr_kernel_new(ctx, sgpr(1), &d, &k);
        if (st == SR_EBUDGET)
            continue;
        cr_assert_eq(st, SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_leq(sr_kernel_workspace_bytes(k), lim, "%s", sr_kernel_explain(k));
        if (tu_plan(k).strategy == SR_STRATEGY_SUM_SPLIT) {
            nsplit++;
            check(sgpr(1), 1, SR_F64, 131, 67, false, -1);
        }
        sr_kernel_free(k);
    }
    cr_assert(nsplit > 0, "no budget split the kernel");
}
