/*
 * test-reductions.c — every reduction of the reference backend, both axes, float32 and
 * float64, against brute force written here: the test evaluates F for every pair itself and
 * reduces with plain loops, a full sort (KMin) and two-pass formulas (LogSumExp,
 * SumSoftMaxWeight), following docs/semantics.md.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(red, .init = setup, .fini = teardown);

static const sr_dtype dtypes[2] = {SR_F32, SR_F64};
static const char *dtname(sr_dtype dt) { return dt == SR_F64 ? "f64" : "f32"; }
static double rnd(sr_dtype dt, double v) { return dt == SR_F64 ? v : (double)(float)v; }

/* A covering set of (nx, ny) from {1, 7, 131, 1009}: both orientations, small against big. */
static const int64_t sizes[][2] = {{1, 1},   {7, 1},      {1, 7},     {7, 131},
                                   {131, 7}, {131, 1009}, {1009, 131}};
#define NSIZES ((int)(sizeof sizes / sizeof *sizes))

/* ---- test data: each argument both as rounded doubles (for brute force) and typed ---- */

#define MAXA 5

struct data {
    sr_dtype dt;
    int64_t nx, ny;
    int nargs;
    int dim[MAXA];
    sr_cat cat[MAXA];
    double *d[MAXA];
    void *t[MAXA];
};

static int64_t rows_of(const struct data *D, int v)
{
    return D->cat[v] == SR_CAT_I ? D->nx : D->cat[v] == SR_CAT_J ? D->ny : 1;
}

static void data_set(struct data *D, int v, int64_t at, double val)
{
    D->d[v][at] = rnd(D->dt, val);
    if (D->dt == SR_F64)
        ((double *)D->t[v])[at] = val;
    else
        ((float *)D->t[v])[at] = (float)val;
}

/* Adds argument number D->nargs, uniform in [lo, hi). */
static int data_add(struct data *D, sr_cat cat, int dim, double lo, double hi, uint64_t *s)
{
    int v = D->nargs++;
    D->dim[v] = dim;
    D->cat[v] = cat;
    int64_t n = rows_of(D, v) * dim;
    D->d[v] = malloc((size_t)(n ? n : 1) * sizeof(double));
    D->t[v] = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t t = 0; t < n; t++)
        data_set(D, v, t, tu_uniform(s, lo, hi));
    return v;
}

static void data_free(struct data *D)
{
    for (int v = 0; v < D->nargs; v++) {
        free(D->d[v]);
        free(D->t[v]);
    }
}

/* Row of argument v at pair (i, j). */
static const double *row(const struct data *D, int v, int64_t i, int64_t j)
{
    int64_t r = D->cat[v] == SR_CAT_I ? i : D->cat[v] == SR_CAT_J ? j : 0;
    return D->d[v] + r * D->dim[v];
}

/* ---- running a kernel ---- */

struct result {
    sr_status st;
    int od;
    int64_t nout;
    double *v;
    int64_t *ix;
};

static struct result run(const struct data *D, sr_expr *f, sr_expr *w, sr_reduction red, int axis,
                         int k)
{
    struct result r = {0};
    cr_assert_not_null(f, "formula: %s", sr_ctx_error(ctx));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = red;
    desc.axis = axis;
    desc.k = k;
    desc.dtype = D->dt;
    desc.device = SR_DEVICE_REFERENCE;
    desc.weight = w;
    sr_kernel *kern;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &kern), SR_OK, "kernel_new: %s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_nargs(kern), D->nargs);
    r.od = sr_kernel_out_dim(kern);
    r.nout = axis == 1 ? D->nx : D->ny;
    size_t n = (size_t)r.nout * (size_t)r.od;
    void *vt = malloc((n ? n : 1) * sizeof(double));
    r.ix = malloc((n ? n : 1) * sizeof(int64_t));
    r.v = malloc((n ? n : 1) * sizeof(double));
    for (size_t t = 0; t < n; t++)
        r.ix[t] = -7; /* sentinel: must be overwritten */
    sr_run_desc rd = {D->nx, D->ny, D->nargs, (const void *const *)D->t, vt, r.ix};
    r.st = sr_kernel_run_ex(kern, &rd);
    for (size_t t = 0; t < n && r.st == SR_OK; t++)
        r.v[t] = D->dt == SR_F64 ? ((double *)vt)[t] : (double)((float *)vt)[t];
    free(vt);
    sr_kernel_free(kern);
    return r;
}

static void result_free(struct result *r)
{
    free(r->v);
    free(r->ix);
}

/* ---- brute force ---- */

typedef void (*formula_fn)(const struct data *D, int64_t i, int64_t j, double *out);

struct vi {
    double v;
    int64_t i;
};

/* NumPy sort order: ascending, NaN last, equal values by index. */
static int cmp_sort(const void *pa, const void *pb)
{
    const struct vi *a = pa, *b = pb;
    int na = isnan(a->v), nb = isnan(b->v);
    if (na != nb)
        return na - nb;
    if (!na && a->v != b->v)
        return a->v < b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Expected output row o: ev[od] values, ei[od] indices. vals[r * fdim + c] holds F at reduced
 * index r, wv[r * wdim + c] the weight. */
static void brute_row(sr_reduction red, int k, int fdim, int wdim, int64_t nred, const double *vals,
                      const double *wv, double *ev, int64_t *ei)
{
    struct vi *col = malloc((size_t)nred * sizeof *col);
    for (int c = 0; c < fdim; c++) {
        for (int64_t r = 0; r < nred; r++)
            col[r] = (struct vi){vals[r * fdim + c], r};
        switch (red) {
        case SR_SUM: {
            double s = 0;
            for (int64_t r = 0; r < nred; r++)
                s += col[r].v;
            ev[c] = s;
            break;
        }
        case SR_MIN:
        case SR_ARGMIN:
        case SR_MIN_ARGMIN:
        case SR_MAX:
        case SR_MAX_ARGMAX:
        case SR_ARGMAX: {
            bool mx = red == SR_MAX || red == SR_ARGMAX || red == SR_MAX_ARGMAX;
            int64_t best = -1;
            for (int64_t r = 0; r < nred && best < 0; r++)
                if (isnan(col[r].v))
                    best = r; /* the first NaN wins */
            if (best < 0) {
                best = 0;
                for (int64_t r = 1; r < nred; r++)
                    if (mx ? col[r].v > col[best].v : col[r].v < col[best].v)
                        best = r;
            }
            ev[c] = col[best].v;
            ei[c] = best;
            break;
        }
        case SR_KMIN:
        case SR_ARGKMIN:
        case SR_KMIN_ARGKMIN:
            qsort(col, (size_t)nred, sizeof *col, cmp_sort);
            for (int t = 0; t < k; t++) {
                ev[t * fdim + c] = col[t].v;
                ei[t * fdim + c] = col[t].i;
            }
            break;
        case SR_LOGSUMEXP: {
            bool nan = false, pinf = false;
            double m = -INFINITY;
            for (int64_t r = 0; r < nred; r++) {
                nan |= isnan(col[r].v);
                pinf |= col[r].v == INFINITY;
                if (col[r].v > m)
                    m = col[r].v;
            }
            if (nan)
                ev[c] = NAN;
            else if (pinf || m == -INFINITY)
                ev[c] = m;
            else {
                double s = 0;
                for (int64_t r = 0; r < nred; r++)
                    s += exp(col[r].v - m);
                ev[c] = m + log(s);
            }
            break;
        }
        case SR_SUMSOFTMAXWEIGHT: {
            double m = -INFINITY, s = 0;
            for (int64_t r = 0; r < nred; r++)
                if (col[r].v > m)
                    m = col[r].v;
            for (int64_t r = 0; r < nred; r++)
                s += exp(col[r].v - m);
            for (int q = 0; q < wdim; q++) {
                double a = 0;
                for (int64_t r = 0; r < nred; r++)
                    a += exp(col[r].v - m) * wv[r * wdim + q];
                ev[q] = a / s;
            }
            break;
        }
        default:
            cr_assert_fail("unknown reduction");
        }
    }
    free(col);
}

/* Tolerances: the kernel and the brute force both compute in double (possibly in another
 * order) and round once. */
static bool close_dt(sr_dtype dt, double got, double want)
{
    return dt == SR_F64 ? tu_close(got, want, 1e-12, 1e-300)
                        : tu_close(got, rnd(dt, want), 3e-7, 1e-37);
}

/* Runs red on f (and weight w) and checks every output against brute force. */
static void check(const struct data *D, sr_expr *f, formula_fn ff, sr_expr *w, formula_fn wf,
                  sr_reduction red, int axis, int k)
{
    int fdim = sr_expr_dim(f), wdim = w ? sr_expr_dim(w) : 0;
    struct result r = run(D, f, w, red, axis, k);
    const char *rname = sr_reduction_name(red);
    cr_assert_eq(r.st, SR_OK, "%s axis %d %s %lldx%lld: %s", rname, axis, dtname(D->dt),
                 (long long)D->nx, (long long)D->ny, sr_ctx_error(ctx));
    int64_t nred = axis == 1 ? D->ny : D->nx;
    double *vals = malloc((size_t)(nred * fdim + 1) * sizeof *vals);
    double *wv = calloc((size_t)(nred * wdim + 1), sizeof *wv); /* read only for SumSoftMaxWeight */
    double *ev = malloc((size_t)r.od * sizeof *ev);
    int64_t *ei = malloc((size_t)r.od * sizeof *ei);
    bool has_v = red != SR_ARGMIN && red != SR_ARGMAX && red != SR_ARGKMIN;
    bool has_i = red == SR_ARGMIN || red == SR_ARGMAX || red == SR_ARGKMIN ||
                 red == SR_MIN_ARGMIN || red == SR_MAX_ARGMAX || red == SR_KMIN_ARGKMIN;
    int bad = 0;
    for (int64_t o = 0; o < r.nout && bad < 5; o++) {
        for (int64_t q = 0; q < nred; q++) {
            int64_t i = axis == 1 ? o : q, j = axis == 1 ? q : o;
            ff(D, i, j, vals + q * fdim);
            if (wf)
                wf(D, i, j, wv + q * wdim);
        }
        brute_row(red, k, fdim, wdim, nred, vals, wv, ev, ei);
        for (int c = 0; c < r.od; c++) {
            double got = r.v[o * r.od + c];
            int64_t gi = r.ix[o * r.od + c];
            if (has_v && !close_dt(D->dt, got, ev[c])) {
                bad++;
                cr_expect_fail("%s axis %d %s %lldx%lld k=%d: row %lld comp %d: got %.17g, "
                               "expected %.17g",
                               rname, axis, dtname(D->dt), (long long)D->nx, (long long)D->ny, k,
                               (long long)o, c, got, ev[c]);
            }
            if (has_i && gi != ei[c]) {
                bad++;
                cr_expect_fail("%s axis %d %s %lldx%lld k=%d: row %lld comp %d: index %lld, "
                               "expected %lld",
                               rname, axis, dtname(D->dt), (long long)D->nx, (long long)D->ny, k,
                               (long long)o, c, (long long)gi, (long long)ei[c]);
            }
        }
    }
    free(vals);
    free(wv);
    free(ev);
    free(ei);
    result_free(&r);
}

/* ---- formulas: the kernel's expression and the test's own evaluation ---- */

enum { AX, AY, AB, AG };

/* x = Vi(0,3), y = Vj(1,3), b = Vj(2,1), g = Pm(3,1). */
static void gauss_data(struct data *D, sr_dtype dt, int64_t nx, int64_t ny, uint64_t seed)
{
    memset(D, 0, sizeof *D);
    D->dt = dt;
    D->nx = nx;
    D->ny = ny;
    data_add(D, SR_CAT_I, 3, -1, 1, &seed);
    data_add(D, SR_CAT_J, 3, -1, 1, &seed);
    data_add(D, SR_CAT_J, 1, 0.5, 1.5, &seed);
    data_add(D, SR_CAT_PARAM, 1, 0.5, 2, &seed);
}

static sr_expr *X(void) { return sr_vi(ctx, AX, 3); }
static sr_expr *Y(void) { return sr_vj(ctx, AY, 3); }
static sr_expr *B(void) { return sr_vj(ctx, AB, 1); }
static sr_expr *G(void) { return sr_pm(ctx, AG, 1); }

static double sqdist3(const double *a, const double *b)
{
    double s = 0;
    for (int k = 0; k < 3; k++)
        s += (a[k] - b[k]) * (a[k] - b[k]);
    return s;
}

/* Exp(-SqDist(x,y)*g)*b */
static sr_expr *gauss_expr(void)
{
    return sr_mul(ctx, sr_exp(ctx, sr_mul(ctx, sr_neg(ctx, sr_sqdist(ctx, X(), Y())), G())), B());
}
static void gauss_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    out[0] = exp(-sqdist3(row(D, AX, i, j), row(D, AY, i, j)) * row(D, AG, i, j)[0]) *
             row(D, AB, i, j)[0];
}

/* SqDist(x,y) (the data also has b and g, which the kernel must then take but not use: give
 * them a zero-weight term). */
static sr_expr *sqdist_expr(void)
{
    return sr_add(ctx, sr_sqdist(ctx, X(), Y()),
                  sr_mul(ctx, sr_intcst(ctx, 0), sr_mul(ctx, B(), G())));
}
static void sqdist_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    out[0] = sqdist3(row(D, AX, i, j), row(D, AY, i, j)) + 0.0 * 0.0;
}

/* A vector formula of dimension 3: (x - y)^2 * g + b, per component. */
static sr_expr *vec_expr(void)
{
    return sr_add(ctx, sr_mul(ctx, sr_square(ctx, sr_sub(ctx, X(), Y())), G()), B());
}
static void vec_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    const double *x = row(D, AX, i, j), *y = row(D, AY, i, j);
    for (int k = 0; k < 3; k++)
        out[k] = (x[k] - y[k]) * (x[k] - y[k]) * row(D, AG, i, j)[0] + row(D, AB, i, j)[0];
}

/* A scalar LogSumExp / softmax argument: (x|y) * g - b * 3 */
static sr_expr *lse_expr(void)
{
    return sr_sub(ctx, sr_mul(ctx, sr_scalprod(ctx, X(), Y()), G()),
                  sr_mul(ctx, B(), sr_intcst(ctx, 3)));
}
static void lse_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    const double *x = row(D, AX, i, j), *y = row(D, AY, i, j);
    double dot = 0;
    for (int k = 0; k < 3; k++)
        dot += x[k] * y[k];
    out[0] = dot * row(D, AG, i, j)[0] - row(D, AB, i, j)[0] * 3.0;
}

/* The softmax weight: Concat(x - y, b), dimension 4, depends on both indices. */
static sr_expr *weight_expr(void) { return sr_concat(ctx, sr_sub(ctx, X(), Y()), B()); }
static void weight_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    const double *x = row(D, AX, i, j), *y = row(D, AY, i, j);
    for (int k = 0; k < 3; k++)
        out[k] = x[k] - y[k];
    out[3] = row(D, AB, i, j)[0];
}

/* Every size of the covering set, both axes, both dtypes. */
static void sweep(sr_expr *(*fe)(void), formula_fn ff, sr_expr *(*we)(void), formula_fn wf,
                  const sr_reduction *reds, int nreds, int k)
{
    uint64_t seed = 1234;
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < NSIZES; s++) {
            struct data D;
            gauss_data(&D, dtypes[t], sizes[s][0], sizes[s][1], seed++);
            for (int axis = 0; axis < 2; axis++) {
                int64_t nred = axis == 1 ? D.ny : D.nx;
                int kk = k < 0 ? (int)nred : (k > nred ? (int)nred : k);
                for (int q = 0; q < nreds; q++)
                    check(&D, fe(), ff, we ? we() : NULL, wf, reds[q], axis, kk);
            }
            data_free(&D);
        }
}

Test(red, sum_gaussian)
{
    const sr_reduction r[] = {SR_SUM};
    sweep(gauss_expr, gauss_f, NULL, NULL, r, 1, 1);
}

Test(red, min_argmin)
{
    const sr_reduction r[] = {SR_MIN, SR_ARGMIN, SR_MIN_ARGMIN};
    sweep(sqdist_expr, sqdist_f, NULL, NULL, r, 3, 1);
}

Test(red, max_argmax)
{
    const sr_reduction r[] = {SR_MAX, SR_ARGMAX, SR_MAX_ARGMAX};
    sweep(sqdist_expr, sqdist_f, NULL, NULL, r, 3, 1);
}

Test(red, kmin_k5)
{
    const sr_reduction r[] = {SR_KMIN, SR_ARGKMIN, SR_KMIN_ARGKMIN};
    sweep(sqdist_expr, sqdist_f, NULL, NULL, r, 3, 5);
}

Test(red, kmin_k1)
{
    const sr_reduction r[] = {SR_KMIN_ARGKMIN};
    sweep(sqdist_expr, sqdist_f, NULL, NULL, r, 1, 1);
}

Test(red, logsumexp)
{
    const sr_reduction r[] = {SR_LOGSUMEXP};
    sweep(lse_expr, lse_f, NULL, NULL, r, 1, 1);
}

Test(red, sumsoftmaxweight)
{
    const sr_reduction r[] = {SR_SUMSOFTMAXWEIGHT};
    sweep(lse_expr, lse_f, weight_expr, weight_f, r, 1, 1);
}

Test(red, vector_formula_componentwise)
{
    /* F of dimension 3: every reduction acts per component; K-results are (K, D) row-major. */
    const sr_reduction r[] = {SR_SUM,       SR_MIN_ARGMIN,   SR_MAX_ARGMAX,
                              SR_LOGSUMEXP, SR_KMIN_ARGKMIN, SR_ARGKMIN};
    for (int t = 0; t < 2; t++) {
        struct data D;
        gauss_data(&D, dtypes[t], 7, 131, 77);
        for (int axis = 0; axis < 2; axis++)
            for (int q = 0; q < 6; q++)
                check(&D, vec_expr(), vec_f, NULL, NULL, r[q], axis, 4);
        data_free(&D);
    }
}

Test(red, kmin_layout_explicit)
{
    /* One row, F = (y0, -y0, 2) over 4 columns: check the (K, D) layout by hand. */
    struct data D = {.dt = SR_F64, .nx = 1, .ny = 4};
    uint64_t s = 1;
    data_add(&D, SR_CAT_J, 1, 0, 1, &s);
    const double y[4] = {3, 1, 2, 0.5};
    for (int j = 0; j < 4; j++)
        data_set(&D, 0, j, y[j]);
    sr_expr *v = sr_vj(ctx, 0, 1);
    sr_expr *f = sr_concat(ctx, sr_concat(ctx, v, sr_neg(ctx, v)), sr_intcst(ctx, 2));
    struct result r = run(&D, f, NULL, SR_KMIN_ARGKMIN, 1, 2);
    cr_assert_eq(r.st, SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(r.od, 6);
    const double wv[6] = {0.5, -3, 2, 1, -2, 2};
    const int64_t wi[6] = {3, 0, 0, 1, 2, 1};
    for (int c = 0; c < 6; c++) {
        cr_expect_eq(r.v[c], wv[c], "value %d: %g, expected %g", c, r.v[c], wv[c]);
        cr_expect_eq(r.ix[c], wi[c], "index %d: %lld, expected %lld", c, (long long)r.ix[c],
                     (long long)wi[c]);
    }
    result_free(&r);
    data_free(&D);
}

Test(red, big_square_gaussian)
{
    /* 1009 x 1009, ~15 nodes: must be quick (this is no timing, just a size check). */
    struct data D;
    gauss_data(&D, SR_F32, 1009, 1009, 5);
    check(&D, gauss_expr(), gauss_f, NULL, NULL, SR_SUM, 1, 1);
    check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_ARGKMIN, 0, 10);
    data_free(&D);
}

/* ---- ties, NaN, infinities ---- */

Test(red, ties_pick_lowest_index)
{
    for (int t = 0; t < 2; t++) {
        struct data D;
        gauss_data(&D, dtypes[t], 5, 40, 3);
        /* Duplicate points: y[7] = y[19] = y[30] = y[3], and x[2] = x[4] for axis 0. */
        for (int k = 0; k < 3; k++) {
            double v = D.d[AY][3 * 3 + k];
            data_set(&D, AY, 7 * 3 + k, v);
            data_set(&D, AY, 19 * 3 + k, v);
            data_set(&D, AY, 30 * 3 + k, v);
            data_set(&D, AX, 4 * 3 + k, D.d[AX][2 * 3 + k]);
            data_set(&D, AX, 0 * 3 + k, v); /* x0 sits on the duplicated y: distance 0 */
        }
        for (int axis = 0; axis < 2; axis++) {
            check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_MIN_ARGMIN, axis, 1);
            check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_MAX_ARGMAX, axis, 1);
            check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_KMIN_ARGKMIN, axis, 5);
        }
        struct result r = run(&D, sqdist_expr(), NULL, SR_ARGKMIN, 1, 4);
        cr_expect(r.ix[0] == 3 && r.ix[1] == 7 && r.ix[2] == 19 && r.ix[3] == 30,
                  "row 0 ties: %lld %lld %lld %lld", (long long)r.ix[0], (long long)r.ix[1],
                  (long long)r.ix[2], (long long)r.ix[3]);
        result_free(&r);
        /* A constant formula: every value ties, index 0 wins; KMin gives 0, 1, 2. */
        sr_expr *c = sr_add(ctx, sqdist_expr(), sr_neg(ctx, sr_sqdist(ctx, X(), Y())));
        r = run(&D, c, NULL, SR_KMIN_ARGKMIN, 1, 3);
        for (int q = 0; q < 3; q++)
            cr_expect(r.ix[q] == q && r.v[q] == 0, "constant ties: %lld %g", (long long)r.ix[q],
                      r.v[q]);
        result_free(&r);
        data_free(&D);
    }
}

Test(red, kmin_sorted_ascending)
{
    struct data D;
    gauss_data(&D, SR_F64, 9, 1009, 8);
    struct result r = run(&D, sqdist_expr(), NULL, SR_KMIN, 0, 9);
    cr_assert_eq(r.st, SR_OK);
    for (int64_t o = 0; o < r.nout; o++)
        for (int q = 1; q < 9; q++)
            cr_expect(r.v[o * 9 + q - 1] <= r.v[o * 9 + q], "row %lld not sorted at %d",
                      (long long)o, q);
    result_free(&r);
    data_free(&D);
}

/* b[j] plays F directly: F = b (j-variable) + 0 * x. */
static sr_expr *bonly_expr(void)
{
    return sr_add(ctx, B(), sr_mul(ctx, sr_intcst(ctx, 0), sr_sum(ctx, sr_add(ctx, X(), G()))));
}
static void bonly_f(const struct data *D, int64_t i, int64_t j, double *out)
{
    out[0] = row(D, AB, i, j)[0];
}

static void set_b(struct data *D, const double *b, int n)
{
    for (int j = 0; j < n; j++)
        data_set(D, AB, j, b[j]);
}

Test(red, nan_and_inf_values)
{
    const double cases[][8] = {
        {3, NAN, 1, -INFINITY, NAN, 2, INFINITY, 0},
        {INFINITY, INFINITY, 5, INFINITY, 1, 1, -2, -2},
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
        {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN},
        {7, INFINITY, NAN, -1, INFINITY, -INFINITY, 4, 4},
    };
    const sr_reduction reds[] = {SR_SUM,          SR_MIN_ARGMIN, SR_MAX_ARGMAX,
                                 SR_KMIN_ARGKMIN, SR_LOGSUMEXP,  SR_SUMSOFTMAXWEIGHT};
    for (int t = 0; t < 2; t++)
        for (size_t q = 0; q < sizeof cases / sizeof *cases; q++) {
            struct data D;
            gauss_data(&D, dtypes[t], 2, 8, 9);
            set_b(&D, cases[q], 8);
            for (size_t rr = 0; rr < sizeof reds / sizeof *reds; rr++) {
                bool sm = reds[rr] == SR_SUMSOFTMAXWEIGHT;
                check(&D, bonly_expr(), bonly_f, sm ? weight_expr() : NULL, sm ? weight_f : NULL,
                      reds[rr], 1, 8);
            }
            data_free(&D);
        }
}

Test(red, nan_documented_results)
{
    struct data D;
    gauss_data(&D, SR_F64, 1, 6, 4);
    set_b(&D, (const double[]){2, NAN, -1, NAN, INFINITY, -INFINITY}, 6);
    struct result r = run(&D, bonly_expr(), NULL, SR_ARGMIN, 1, 1);
    cr_expect_eq(r.ix[0], 1, "ArgMin: the first NaN, got %lld", (long long)r.ix[0]);
    result_free(&r);
    r = run(&D, bonly_expr(), NULL, SR_KMIN_ARGKMIN, 1, 6);
    const double wv[6] = {-INFINITY, -1, 2, INFINITY, NAN, NAN};
    const int64_t wi[6] = {5, 2, 0, 4, 1, 3};
    for (int q = 0; q < 6; q++)
        cr_expect(tu_close(r.v[q], wv[q], 0, 0) && r.ix[q] == wi[q],
                  "KMin %d: %g @ %lld, expected %g @ %lld (NaN sorts after +inf)", q, r.v[q],
                  (long long)r.ix[q], wv[q], (long long)wi[q]);
    result_free(&r);
    r = run(&D, bonly_expr(), NULL, SR_LOGSUMEXP, 1, 1);
    cr_expect(isnan(r.v[0]), "LogSumExp with NaN: %g", r.v[0]);
    result_free(&r);
    set_b(&D, (const double[]){2, 1, -1, 3, INFINITY, -INFINITY}, 6);
    r = run(&D, bonly_expr(), NULL, SR_LOGSUMEXP, 1, 1);
    cr_expect(r.v[0] == INFINITY, "LogSumExp with +inf: %g", r.v[0]);
    result_free(&r);
    set_b(&D, (const double[]){-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
          6);
    r = run(&D, bonly_expr(), NULL, SR_LOGSUMEXP, 1, 1);
    cr_expect(r.v[0] == -INFINITY, "LogSumExp of all -inf: %g", r.v[0]);
    result_free(&r);
    set_b(&D, (const double[]){-INFINITY, 0, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, 6);
    r = run(&D, bonly_expr(), NULL, SR_LOGSUMEXP, 1, 1);
    cr_expect(r.v[0] == 0.0, "LogSumExp of one 0 among -inf: %g", r.v[0]);
    result_free(&r);
    data_free(&D);
}

Test(red, logsumexp_stable_at_1000)
{
    /* F = b with b around 1000..1010: exp(1000) overflows; the result is about 1000 + log n. */
    for (int t = 0; t < 2; t++) {
        struct data D;
        gauss_data(&D, dtypes[t], 3, 131, 21);
        for (int j = 0; j < 131; j++)
            data_set(&D, AB, j, 1000.0 + (j % 11));
        check(&D, bonly_expr(), bonly_f, NULL, NULL, SR_LOGSUMEXP, 1, 1);
        struct result r = run(&D, bonly_expr(), NULL, SR_LOGSUMEXP, 1, 1);
        cr_expect(isfinite(r.v[0]) && r.v[0] > 1010 && r.v[0] < 1016, "LSE ~ 1010+: %g", r.v[0]);
        result_free(&r);
        /* Also large negative: exp(-1000) underflows. */
        for (int j = 0; j < 131; j++)
            data_set(&D, AB, j, -1000.0 - (j % 5));
        check(&D, bonly_expr(), bonly_f, NULL, NULL, SR_LOGSUMEXP, 1, 1);
        check(&D, bonly_expr(), bonly_f, weight_expr(), weight_f, SR_SUMSOFTMAXWEIGHT, 1, 1);
        data_free(&D);
    }
}

Test(red, softmax_stable_and_concentrated)
{
    /* F = b * 1000 with one b much larger: the softmax puts all weight there. */
    struct data D;
    gauss_data(&D, SR_F64, 4, 50, 31);
    for (int j = 0; j < 50; j++)
        data_set(&D, AB, j, j == 17 ? 2.0 : 1.0);
    sr_expr *f =
        sr_mul(ctx, B(),
               sr_add(ctx, sr_intcst(ctx, 1000), sr_mul(ctx, sr_intcst(ctx, 0), sr_sum(ctx, X()))));
    sr_expr *w = sr_add(ctx, Y(), G()); /* weight: y_j + g */
    struct result r = run(&D, f, w, SR_SUMSOFTMAXWEIGHT, 1, 1);
    cr_assert_eq(r.st, SR_OK, "%s", sr_ctx_error(ctx));
    for (int64_t o = 0; o < 4; o++)
        for (int c = 0; c < 3; c++) {
            double want = D.d[AY][17 * 3 + c] + D.d[AG][0];
            cr_expect(tu_close(r.v[o * 3 + c], want, 1e-12, 1e-12), "row %lld: %g, expected %g",
                      (long long)o, r.v[o * 3 + c], want);
        }
    result_free(&r);
    data_free(&D);
}

/* ---- sizes and errors through the public API ---- */

Test(red, empty_reductions_give_identities)
{
    const sr_reduction reds[] = {SR_SUM,
                                 SR_MIN,
                                 SR_MAX,
                                 SR_ARGMIN,
                                 SR_ARGMAX,
                                 SR_KMIN,
                                 SR_ARGKMIN,
                                 SR_MIN_ARGMIN,
                                 SR_MAX_ARGMAX,
                                 SR_LOGSUMEXP,
                                 SR_SUMSOFTMAXWEIGHT,
                                 SR_KMIN_ARGKMIN};
    for (int t = 0; t < 2; t++)
        for (int axis = 0; axis < 2; axis++) {
            struct data D;
            /* The reduced count is 0, the output count 7. */
            gauss_data(&D, dtypes[t], axis == 1 ? 7 : 0, axis == 1 ? 0 : 7, 1);
            for (size_t q = 0; q < sizeof reds / sizeof *reds; q++) {
                sr_reduction red = reds[q];
                bool uses_k = red == SR_KMIN || red == SR_ARGKMIN || red == SR_KMIN_ARGKMIN;
                bool sm = red == SR_SUMSOFTMAXWEIGHT;
                struct result r = run(&D, sm ? lse_expr() : sqdist_expr(),
                                      sm ? weight_expr() : NULL, red, axis, 1);
                if (uses_k) { /* k = 1 > 0 reduced rows */
                    cr_expect_eq(r.st, SR_EINVAL, "%s with nothing to reduce: %d",
                                 sr_reduction_name(red), r.st);
                    result_free(&r);
                    continue;
                }
                cr_assert_eq(r.st, SR_OK, "%s: %s", sr_reduction_name(red), sr_ctx_error(ctx));
                double want = red == SR_SUM                           ? 0.0
                              : red == SR_MIN || red == SR_MIN_ARGMIN ? INFINITY
                              : red == SR_MAX || red == SR_MAX_ARGMAX ? -INFINITY
                              : red == SR_LOGSUMEXP                   ? -INFINITY
                                                                      : NAN;
                bool vals = red != SR_ARGMIN && red != SR_ARGMAX;
                bool idx = red == SR_ARGMIN || red == SR_ARGMAX || red == SR_MIN_ARGMIN ||
                           red == SR_MAX_ARGMAX;
                for (int64_t c = 0; c < r.nout * r.od; c++) {
                    if (vals)
                        cr_expect(tu_close(r.v[c], want, 0, 0), "%s axis %d: %g, expected %g",
                                  sr_reduction_name(red), axis, r.v[c], want);
                    if (idx)
                        cr_expect_eq(r.ix[c], -1, "%s: index %lld", sr_reduction_name(red),
                                     (long long)r.ix[c]);
                }
                result_free(&r);
            }
            data_free(&D);
        }
}

Test(red, empty_outputs_write_nothing)
{
    struct data D;
    gauss_data(&D, SR_F64, 0, 0, 1);
    struct result r = run(&D, gauss_expr(), NULL, SR_SUM, 1, 1);
    cr_expect_eq(r.st, SR_OK, "%s", sr_ctx_error(ctx));
    result_free(&r);
    data_free(&D);
}

Test(red, k_equal_ny_and_k_above_ny)
{
    for (int t = 0; t < 2; t++) {
        struct data D;
        gauss_data(&D, dtypes[t], 7, 131, 6);
        check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_KMIN_ARGKMIN, 1, 131);
        check(&D, sqdist_expr(), sqdist_f, NULL, NULL, SR_ARGKMIN, 0, 7);
        struct result r = run(&D, sqdist_expr(), NULL, SR_KMIN, 1, 132);
        cr_expect_eq(r.st, SR_EINVAL, "k = 132 > ny = 131 must fail, got %d", r.st);
        cr_expect(strstr(sr_ctx_error(ctx), "k = 132") != NULL, "message: %s", sr_ctx_error(ctx));
        result_free(&r);
        r = run(&D, sqdist_expr(), NULL, SR_ARGKMIN, 0, 8);
        cr_expect_eq(r.st, SR_EINVAL, "k = 8 > nx = 7 on axis 0 must fail, got %d", r.st);
        result_free(&r);
        data_free(&D);
    }
}

Test(red, hoisted_terms)
{
    /* Terms that depend only on the output row, only on parameters, or on nothing: the
     * interpreter evaluates them once per row; the results must not change. F = Exp(-|x|^2 g)
     * * (|y|^2 + 2.5) with no pair term at all, then a pure row term. */
    for (int t = 0; t < 2; t++) {
        struct data D;
        gauss_data(&D, dtypes[t], 7, 131, 12);
        sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqnorm2(ctx, X()), G()))),
                            sr_add(ctx, sr_sqnorm2(ctx, Y()), sr_const(ctx, 2.5)));
        f = sr_add(ctx, f, sr_mul(ctx, sr_intcst(ctx, 0), B()));
        for (int axis = 0; axis < 2; axis++) {
            struct result r = run(&D, f, NULL, SR_SUM, axis, 1);
            cr_assert_eq(r.st, SR_OK);
            for (int64_t o = 0; o < r.nout; o++) {
                double s = 0;
                for (int64_t q = 0; q < (axis ? D.ny : D.nx); q++) {
                    int64_t i = axis ? o : q, j = axis ? q : o;
                    const double *x = row(&D, AX, i, j), *y = row(&D, AY, i, j);
                    double nx2 = x[0] * x[0] + x[1] * x[1] + x[2] * x[2];
                    double ny2 = y[0] * y[0] + y[1] * y[1] + y[2] * y[2];
                    s += exp(-(nx2 * D.d[AG][0])) * (ny2 + 2.5) + 0.0;
                }
                cr_expect(close_dt(D.dt, r.v[o], s), "axis %d row %lld: %g vs %g", axis,
                          (long long)o, r.v[o], s);
            }
            result_free(&r);
        }
        data_free(&D);
    }
}

Test(red, unused_argument_may_be_null)
{
    /* Index 1 is not used by the formula: NULL is accepted for it. */
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 2, 2));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    d.reduction = SR_MIN;
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    double x[4] = {0, 0, 1, 1}, y[6] = {5, 5, 1, 0, 0, 1}, out[2];
    const void *args[3] = {x, NULL, y};
    cr_assert_eq(sr_kernel_run(k, 2, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    cr_expect(out[0] == 1 && out[1] == 1, "min sqdist: %g %g", out[0], out[1]);
    sr_kernel_free(k);
}

/* ---- thread safety: one kernel, four threads, same answers ---- */

struct job {
    const sr_kernel *k;
    const void *const *args;
    int64_t nx, ny;
    double out[64];
    sr_status st;
};

static void *job_run(void *p)
{
    struct job *j = p;
    for (int rep = 0; rep < 20 && j->st == SR_OK; rep++)
        j->st = sr_kernel_run(j->k, j->nx, j->ny, j->args, j->out);
    return NULL;
}

Test(red, concurrent_runs_agree)
{
    struct data D;
    gauss_data(&D, SR_F64, 64, 131, 17);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    d.reduction = SR_LOGSUMEXP;
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, lse_expr(), &d, &k), SR_OK);
    struct job jobs[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (struct job){.k = k, .args = (const void *const *)D.t, .nx = 64, .ny = 131};
        cr_assert_eq(pthread_create(&th[t], NULL, job_run, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 4; t++) {
        cr_expect_eq(jobs[t].st, SR_OK);
        cr_expect(memcmp(jobs[t].out, jobs[0].out, sizeof jobs[0].out) == 0, "thread %d differs",
                  t);
    }
    sr_kernel_free(k);
    check(&D, lse_expr(), lse_f, NULL, NULL, SR_LOGSUMEXP, 1, 1);
    data_free(&D);
}

/* ---- the accumulator rules in cpu.h: a split reduction combines to the sequential result --- */

/* The rows of the reduction table (src/core/reductions.h) agree with each other and with the
 * public map: a partial reduction holds the whole state of its reduction (the selections'
 * values and indices), in the same order, and is its own partial; only the selections have an
 * order, and their empty result is the order's infinity. */
Test(red, rule_table_rows_agree)
{
    for (int r = 0; r < SR_REDUCTION_COUNT; r++) {
        const struct sr_reduction_info *ri = &sr_reductions[r], *pi = &sr_reductions[ri->partial];
        const char *name = sr_reduction_name((sr_reduction)r);
        const bool sel = ri->family == SR_RED_FAM_EXT || ri->family == SR_RED_FAM_ARGEXT ||
                         ri->family == SR_RED_FAM_KSEL;
        cr_assert_str_eq(ri->name, name);
        cr_assert(ri->values || ri->indices, "%s writes nothing", name);
        cr_assert_eq(pi->partial, ri->partial, "%s: the partial of its partial", name);
        cr_assert_eq(pi->order, ri->order, "%s: partial in another order", name);
        cr_assert_eq(pi->uses_k, ri->uses_k, "%s: partial uses k differently", name);
        cr_assert_eq(pi->weight, ri->weight, "%s: partial takes the weight differently", name);
        cr_assert_eq(ri->order != SR_RED_UNORDERED, sel, "%s: order %d", name, ri->order);
        cr_assert_eq(ri->empty == SR_RED_EMPTY_ORDER, sel, "%s: empty %d", name, ri->empty);
        cr_assert_eq(ri->uses_k, ri->family == SR_RED_FAM_KSEL, "%s: uses_k", name);
        cr_assert(sel || !ri->indices, "%s: indices of an unordered reduction", name);
        cr_assert(ri->family != SR_RED_FAM_ARGEXT || ri->indices, "%s: no indices", name);
        if (sel)
            cr_assert(pi->values && pi->indices, "%s: partial %s lacks values or indices", name,
                      pi->name);
        else
            cr_assert_eq(ri->partial, (sr_reduction)r, "%s: partial %s", name, pi->name);
    }
    /* The rankings: NaN first for Min and Max, after +inf for the K-reductions, index ties. */
    cr_assert(cpu_ext_before(SR_RED_ASC, NAN, 5, -INFINITY, 0));
    cr_assert(cpu_ext_before(SR_RED_DESC, NAN, 5, INFINITY, 0));
    cr_assert(!cpu_kmin_before(NAN, 0, INFINITY, 5));
    cr_assert(cpu_ext_before(SR_RED_DESC, 2, 1, 1, 0) && !cpu_ext_before(SR_RED_ASC, 2, 1, 1, 0));
    cr_assert(cpu_kmin_before(1, 3, 1, 4) && !cpu_kmin_before(1, 4, 1, 3));
}

Test(red, accumulators_combine_like_one_pass)
{
    uint64_t s = 44;
    const double specials[] = {NAN, INFINITY, -INFINITY, 0.0};
    for (int trial = 0; trial < 200; trial++) {
        int n = 1 + (int)(tu_rand(&s) % 40), cut = (int)(tu_rand(&s) % (uint64_t)(n + 1));
        double v[40];
        for (int t = 0; t < n; t++) {
            v[t] = (double)(int)tu_uniform(&s, -5, 5); /* small integers: many ties */
            if (tu_rand(&s) % 10 == 0)
                v[t] = specials[tu_rand(&s) % 4];
        }
        /* Min / Max */
        for (int o = -1; o <= 1; o += 2) {
            const enum sr_red_order ord = o < 0 ? SR_RED_DESC : SR_RED_ASC;
            double mv, a1, a2;
            int64_t mi, i1, i2;
            cpu_ext_init(ord, &mv, &mi);
            cpu_ext_init(ord, &a1, &i1);
            cpu_ext_init(ord, &a2, &i2);
            for (int t = 0; t < n; t++) {
                cpu_ext_push(ord, &mv, &mi, v[t], t);
                if (t < cut)
                    cpu_ext_push(ord, &a1, &i1, v[t], t);
                else
                    cpu_ext_push(ord, &a2, &i2, v[t], t);
            }
            cpu_ext_combine(ord, &a2, &i2, a1, i1); /* order of combination must not matter */
            cr_assert(tu_close(a2, mv, 0, 0) && i2 == mi, "%s: %g@%lld vs %g@%lld",
                      o < 0 ? "max" : "min", a2, (long long)i2, mv, (long long)mi);
        }
        /* KMin */
        double kv[40], k1[40], k2[40];
        int64_t ki[40], j1[40], j2[40];
        int K = 1 + (int)(tu_rand(&s) % (uint64_t)n), nk = 0, n1 = 0, n2 = 0;
        for (int t = 0; t < n; t++) {
            nk = cpu_kmin_push(kv, ki, nk, K, v[t], t);
            if (t < cut)
                n1 = cpu_kmin_push(k1, j1, n1, K, v[t], t);
            else
                n2 = cpu_kmin_push(k2, j2, n2, K, v[t], t);
        }
        /* The linear merge of the two sorted lists, either way round, as one pass too. */
        double mv[2][40];
        int64_t mi[2][40];
        const int nm0 = cpu_kmin_merge(k1, j1, n1, k2, j2, n2, K, mv[0], mi[0]);
        const int nm1 = cpu_kmin_merge(k2, j2, n2, k1, j1, n1, K, mv[1], mi[1]);
        n2 = cpu_kmin_combine(k2, j2, n2, K, k1, j1, n1);
        cr_assert_eq(n2, nk);
        cr_assert(nm0 == nk && nm1 == nk, "kmin merge: %d, %d entries vs %d", nm0, nm1, nk);
        for (int t = 0; t < nk; t++) {
            cr_assert(tu_close(k2[t], kv[t], 0, 0) && j2[t] == ki[t], "kmin %d", t);
            for (int w = 0; w < 2; w++)
                cr_assert(tu_close(mv[w][t], kv[t], 0, 0) && mi[w][t] == ki[t],
                          "kmin merge %d: %g@%lld vs %g@%lld", t, mv[w][t], (long long)mi[w][t],
                          kv[t], (long long)ki[t]);
        }
        /* LogSumExp */
        struct cpu_lse L, L1, L2;
        cpu_lse_init(&L);
        cpu_lse_init(&L1);
        cpu_lse_init(&L2);
        for (int t = 0; t < n; t++) {
            cpu_lse_push(&L, v[t]);
            cpu_lse_push(t < cut ? &L1 : &L2, v[t]);
        }
        cpu_lse_combine(&L2, L1);
        cr_assert(tu_close(cpu_lse_finish(L2), cpu_lse_finish(L), 1e-14, 1e-14), "lse %g vs %g",
                  cpu_lse_finish(L2), cpu_lse_finish(L));
        /* SumSoftMaxWeight with weight (v, 1) */
        double m, sm, acc[2], m1 = 0, s1 = 0, c1[2], m2 = 0, s2 = 0, c2[2], r0[2], r1[2];
        cpu_ssmw_init(&m, &sm, acc, 2);
        cpu_ssmw_init(&m1, &s1, c1, 2);
        cpu_ssmw_init(&m2, &s2, c2, 2);
        for (int t = 0; t < n; t++) {
            double g[2] = {isfinite(v[t]) ? v[t] : 1.0, 1.0};
            cpu_ssmw_push(&m, &sm, acc, 2, v[t], g);
            if (t < cut)
                cpu_ssmw_push(&m1, &s1, c1, 2, v[t], g);
            else
                cpu_ssmw_push(&m2, &s2, c2, 2, v[t], g);
        }
        cpu_ssmw_combine(&m2, &s2, c2, 2, m1, s1, c1);
        cpu_ssmw_finish(sm, acc, 2, r0);
        cpu_ssmw_finish(s2, c2, 2, r1);
        for (int c = 0; c < 2; c++)
            cr_assert(tu_close(r1[c], r0[c], 1e-13, 1e-13), "ssmw %d: %g vs %g", c, r1[c], r0[c]);
    }
}

Test(red, formula_without_variables)
{
    /* No variables at all: no arrays (args may be NULL), every pair gives the constant. */
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, sr_ratcst(ctx, 3, 2), &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_nargs(k), 0);
    float out[3];
    cr_assert_eq(sr_kernel_run(k, 3, 10, NULL, out), SR_OK, "%s", sr_ctx_error(ctx));
    for (int i = 0; i < 3; i++)
        cr_expect_eq(out[i], 15.0f, "row %d: %g", i, out[i]);
    sr_kernel_free(k);
}
