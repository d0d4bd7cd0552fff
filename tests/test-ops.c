/*
 * test-ops.c — the value of every op on the reference backend, against closed forms written
 * here with <math.h> from docs/semantics.md.
 *
 * Each formula is evaluated at one pair through a real kernel: a Sum reduction with
 * nx = ny = 1 returns F(x_0, y_0) itself. Inputs are rounded to the dtype first, so the closed
 * form sees exactly what the kernel sees; the kernel computes in double and rounds once, so
 * the expected value rounded to the dtype must match within a few ulps.
 */
#include <criterion/criterion.h>

#include <complex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(ops, .init = setup, .fini = teardown);

#define MAXARGS 5
#define MAXOUT  256

static const sr_dtype dtypes[2] = {SR_F32, SR_F64};
static const char *dtname(sr_dtype dt) { return dt == SR_F64 ? "f64" : "f32"; }

/* The value v as the dtype holds it. */
static double rnd(sr_dtype dt, double v) { return dt == SR_F64 ? v : (double)(float)v; }

/*
 * Evaluates f at one pair: arg[v] holds the n[v] values of variable index v (already rounded to
 * dt), nx = ny = 1, Sum over j. Writes sr_kernel_out_dim values to out and returns that count.
 */
static sr_device eval_device = SR_DEVICE_REFERENCE; /* where eval1 runs */
static int eval1(sr_expr *f, sr_dtype dt, int nargs, const double *const *arg, const int *n,
                 double *out)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    d.device = eval_device;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "sr_kernel_new: %s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_nargs(k), nargs, "kernel takes %d args, test gives %d",
                 sr_kernel_nargs(k), nargs);
    int od = sr_kernel_out_dim(k);
    cr_assert(od >= 1 && od <= MAXOUT, "out_dim %d", od);
    void *bufs[MAXARGS] = {0};
    const void *args[MAXARGS] = {0};
    size_t esz = dt == SR_F64 ? 8 : 4;
    for (int v = 0; v < nargs; v++) {
        if (!arg[v])
            continue;
        bufs[v] = malloc((size_t)n[v] * esz);
        for (int t = 0; t < n[v]; t++) {
            if (dt == SR_F64)
                ((double *)bufs[v])[t] = arg[v][t];
            else
                ((float *)bufs[v])[t] = (float)arg[v][t];
        }
        args[v] = bufs[v];
    }
    double o64[MAXOUT];
    float o32[MAXOUT];
    sr_status st = sr_kernel_run(k, 1, 1, args, dt == SR_F64 ? (void *)o64 : (void *)o32);
    cr_assert_eq(st, SR_OK, "run: %s", sr_ctx_error(ctx));
    for (int t = 0; t < od; t++)
        out[t] = dt == SR_F64 ? o64[t] : (double)o32[t];
    for (int v = 0; v < nargs; v++)
        free(bufs[v]);
    sr_kernel_free(k);
    return od;
}

/* got must be expected rounded to dt, within the dtype's tolerance. */
static void expect_close(sr_dtype dt, double got, double expected, const char *what, int comp)
{
    double e = rnd(dt, expected);
    double rtol = dt == SR_F64 ? 1e-13 : 2e-7, atol = dt == SR_F64 ? 1e-15 : 1e-7;
    cr_expect(tu_close(got, e, rtol, atol), "%s [%s] component %d: got %.17g, expected %.17g", what,
              dtname(dt), comp, got, e);
}

static void expect_vec(sr_dtype dt, const double *got, const double *expected, int n,
                       const char *what)
{
    for (int t = 0; t < n; t++)
        expect_close(dt, got[t], expected[t], what, t);
}

/* Inputs for elementwise ops: ordinary values, zeros, both infinities and NaN. */
static const double special[] = {0.0,  -0.0, 0.5,      -1.25,     2.0, 3.75, -7.5,
                                 1.0,  -1.0, 0.375,    1e-3,      0.7, 1e30, -2.5e-8,
                                 42.5, 2.5,  INFINITY, -INFINITY, NAN};
#define NSPECIAL ((int)(sizeof special / sizeof *special))

/* ---- unary elementwise ops: the whole special vector at once, and each value at dim 1 ---- */

typedef sr_expr *(*unary_fn)(sr_ctx *, sr_expr *);

static void check_unary(const char *name, unary_fn build, double (*ref)(double))
{
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[NSPECIAL], want[NSPECIAL], got[MAXOUT];
        for (int v = 0; v < NSPECIAL; v++) {
            x[v] = rnd(dt, special[v]);
            want[v] = ref(x[v]);
        }
        const double *a[1] = {x};
        int n[1] = {NSPECIAL};
        int od = eval1(build(ctx, sr_vi(ctx, 0, NSPECIAL)), dt, 1, a, n, got);
        cr_assert_eq(od, NSPECIAL);
        expect_vec(dt, got, want, NSPECIAL, name);
        for (int v = 0; v < NSPECIAL; v++) { /* dimension 1, the value as a j-variable */
            const double *b[1] = {&x[v]};
            int one[1] = {1};
            eval1(build(ctx, sr_vj(ctx, 0, 1)), dt, 1, b, one, got);
            expect_close(dt, got[0], want[v], name, v);
        }
    }
}

static double r_minus(double a) { return -a; }
static double r_inv(double a) { return 1.0 / a; }
static double r_square(double a) { return a * a; }
static double r_rsqrt(double a) { return a == 0.0 ? 0.0 : 1.0 / sqrt(a); }
static double r_xlogx(double a) { return a == 0.0 ? 0.0 : a * log(a); }
static double r_sign(double a) { return isnan(a) ? a : (double)((a > 0) - (a < 0)); }
static double r_step(double a) { return isnan(a) ? a : a >= 0.0 ? 1.0 : 0.0; }
static double r_relu(double a) { return isnan(a) ? a : a > 0.0 ? a : 0.0; }
static double r_sinxdivx(double a) { return a == 0.0 ? 1.0 : sin(a) / a; }

#define UNARY_TEST(tname, builder, ref)                                                            \
    Test(ops, tname) { check_unary(#tname, builder, ref); }

UNARY_TEST(minus, sr_neg, r_minus)
UNARY_TEST(inv, sr_inv, r_inv)
UNARY_TEST(square, sr_square, r_square)
UNARY_TEST(sqrt, sr_sqrt, sqrt)
UNARY_TEST(rsqrt, sr_rsqrt, r_rsqrt)
UNARY_TEST(exp, sr_exp, exp)
UNARY_TEST(log, sr_log, log)
UNARY_TEST(xlogx, sr_xlogx, r_xlogx)
UNARY_TEST(sin, sr_sin, sin)
UNARY_TEST(cos, sr_cos, cos)
UNARY_TEST(asin, sr_asin, asin)
UNARY_TEST(acos, sr_acos, acos)
UNARY_TEST(atan, sr_atan, atan)
UNARY_TEST(abs, sr_abs, fabs)
UNARY_TEST(sign, sr_sign, r_sign)
UNARY_TEST(step, sr_step, r_step)
UNARY_TEST(relu, sr_relu, r_relu)
UNARY_TEST(floor, sr_floor, floor)
UNARY_TEST(sinxdivx, sr_sinxdivx, r_sinxdivx)

/* The documented special points, spelled out (the generic tests cover them too). */
Test(ops, documented_special_points)
{
    double got[MAXOUT];
    const double zero[1] = {0.0};
    const double *a[1] = {zero};
    int n[1] = {1};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        sr_expr *x = sr_vi(ctx, 0, 1);
        eval1(sr_rsqrt(ctx, x), dt, 1, a, n, got);
        cr_expect_eq(got[0], 0.0, "Rsqrt(0) = %g", got[0]);
        eval1(sr_xlogx(ctx, x), dt, 1, a, n, got);
        cr_expect_eq(got[0], 0.0, "XLogX(0) = %g", got[0]);
        eval1(sr_sinxdivx(ctx, x), dt, 1, a, n, got);
        cr_expect_eq(got[0], 1.0, "SinXDivX(0) = %g", got[0]);
        eval1(sr_exp(ctx, sr_neg(ctx, sr_inv(ctx, x))), dt, 1, a, n, got);
        cr_expect_eq(got[0], 0.0, "exp(-1/0) = exp(-inf) = %g", got[0]);
        eval1(sr_log(ctx, x), dt, 1, a, n, got);
        cr_expect(isinf(got[0]) && got[0] < 0, "log(0) = %g", got[0]);
        eval1(sr_sqrt(ctx, sr_sub(ctx, x, sr_intcst(ctx, 1))), dt, 1, a, n, got);
        cr_expect(isnan(got[0]), "sqrt(-1) = %g", got[0]);
        eval1(sr_normalize(ctx, sr_vi(ctx, 0, 3)), dt, 1, (const double *[]){(double[3]){0}},
              (int[]){3}, got);
        cr_expect(got[0] == 0.0 && got[1] == 0.0 && got[2] == 0.0, "Normalize(0) = (%g, %g, %g)",
                  got[0], got[1], got[2]);
    }
}

/* ---- binary elementwise ops: vector-vector at two dims, and broadcasting both ways ---- */

typedef sr_expr *(*binary_fn)(sr_ctx *, sr_expr *, sr_expr *);

static void check_binary(const char *name, binary_fn build, double (*ref)(double, double))
{
    const double bs[] = {1.5, -0.5, 2.0, 0.0,  -3.25, 7.0,  INFINITY, NAN,  0.25, -INFINITY,
                         0.5, 1e-3, 2.5, -1.0, 0.0,   3.75, 1.0,      1e30, NAN};
    _Static_assert(sizeof bs / sizeof *bs == NSPECIAL, "bs matches special");
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double a[NSPECIAL], b[NSPECIAL], want[NSPECIAL], got[MAXOUT];
        for (int v = 0; v < NSPECIAL; v++) {
            a[v] = rnd(dt, special[v]);
            b[v] = rnd(dt, bs[v]);
        }
        /* Vectors of dimension NSPECIAL and 3: i-variable against j-variable. */
        int dims[2] = {NSPECIAL, 3};
        for (int q = 0; q < 2; q++) {
            int d = dims[q];
            for (int v = 0; v < d; v++)
                want[v] = ref(a[v], b[v]);
            const double *args[2] = {a, b};
            int n[2] = {d, d};
            eval1(build(ctx, sr_vi(ctx, 0, d), sr_vj(ctx, 1, d)), dt, 2, args, n, got);
            expect_vec(dt, got, want, d, name);
        }
        /* Scalar (a parameter) against a vector, on either side. */
        for (int s = 0; s < 4; s++) {
            double g = b[s];
            const double *args[2] = {a, &g};
            int n[2] = {NSPECIAL, 1};
            for (int v = 0; v < NSPECIAL; v++)
                want[v] = ref(a[v], g);
            eval1(build(ctx, sr_vi(ctx, 0, NSPECIAL), sr_pm(ctx, 1, 1)), dt, 2, args, n, got);
            expect_vec(dt, got, want, NSPECIAL, name);
            for (int v = 0; v < NSPECIAL; v++)
                want[v] = ref(g, a[v]);
            eval1(build(ctx, sr_pm(ctx, 1, 1), sr_vi(ctx, 0, NSPECIAL)), dt, 2, args, n, got);
            expect_vec(dt, got, want, NSPECIAL, name);
        }
    }
}

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_less(double a, double b) { return a < b; }
static double r_lesseq(double a, double b) { return a <= b; }
static double r_greater(double a, double b) { return a > b; }
static double r_greatereq(double a, double b) { return a >= b; }
static double r_equal(double a, double b) { return a == b; }
static double r_notequal(double a, double b) { return a != b; }

#define BINARY_TEST(tname, builder, ref)                                                           \
    Test(ops, tname) { check_binary(#tname, builder, ref); }

BINARY_TEST(add, sr_add, r_add)
BINARY_TEST(sub, sr_sub, r_sub)
BINARY_TEST(mul, sr_mul, r_mul)
BINARY_TEST(div, sr_div, r_div)
BINARY_TEST(powf, sr_powf, pow)
BINARY_TEST(atan2, sr_atan2, atan2)
BINARY_TEST(less, sr_less, r_less)
BINARY_TEST(lesseq, sr_lesseq, r_lesseq)
BINARY_TEST(greater, sr_greater, r_greater)
BINARY_TEST(greatereq, sr_greatereq, r_greatereq)
BINARY_TEST(equal, sr_equal, r_equal)
BINARY_TEST(notequal, sr_notequal, r_notequal)

Test(ops, comparisons_with_nan)
{
    double got[MAXOUT];
    const double x[2] = {NAN, 1.0};
    const double *a[1] = {x};
    int n[1] = {2};
    sr_expr *p = sr_elem(ctx, sr_vi(ctx, 0, 2), 0), *q = sr_elem(ctx, sr_vi(ctx, 0, 2), 1);
    binary_fn fns[6] = {sr_less, sr_lesseq, sr_greater, sr_greatereq, sr_equal, sr_notequal};
    const double want[6] = {0, 0, 0, 0, 0, 1};
    for (int f = 0; f < 6; f++) {
        eval1(fns[f](ctx, p, q), SR_F64, 1, a, n, got);
        cr_expect_eq(got[0], want[f], "comparison %d with NaN gave %g", f, got[0]);
        eval1(fns[f](ctx, p, p), SR_F32, 1, a, n, got);
        cr_expect_eq(got[0], want[f], "comparison %d of NaN with NaN gave %g", f, got[0]);
    }
}

/* ---- ops with integer attributes ---- */

static double r_ipow(double a, int n)
{
    double r = 1.0;
    for (int t = 0; t < abs(n); t++)
        r *= a;
    return n < 0 ? 1.0 / r : r;
}

Test(ops, pow_integer)
{
    const int ns[] = {-3, -1, 0, 1, 2, 3, 7, 12};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[NSPECIAL], want[NSPECIAL], got[MAXOUT];
        for (int v = 0; v < NSPECIAL; v++)
            x[v] = rnd(dt, special[v]);
        if (dt == SR_F32)
            x[12] = 3.0; /* 1e30^12 would only test float overflow */
        for (size_t q = 0; q < sizeof ns / sizeof *ns; q++) {
            for (int v = 0; v < NSPECIAL; v++)
                want[v] = r_ipow(x[v], ns[q]);
            eval1(sr_pow(ctx, sr_vi(ctx, 0, NSPECIAL), ns[q]), dt, 1, (const double *[]){x},
                  (int[]){NSPECIAL}, got);
            expect_vec(dt, got, want, NSPECIAL, "Pow");
        }
        eval1(sr_pow(ctx, sr_vi(ctx, 0, 1), 0), dt, 1, (const double *[]){(double[]){NAN}},
              (int[]){1}, got);
        cr_expect_eq(got[0], 1.0, "Pow(NaN, 0) = %g, the doc says a^0 = 1", got[0]);
    }
}

Test(ops, round_decimals)
{
    const double xs[] = {1.2345, -1.2345, 2.5, -2.5, 0.125, 1234.5678, 0.0, NAN, INFINITY};
    const int ds[] = {-2, 0, 1, 2, 3};
    int nx = (int)(sizeof xs / sizeof *xs);
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[16], want[16], got[MAXOUT];
        for (int v = 0; v < nx; v++)
            x[v] = rnd(dt, xs[v]);
        for (size_t q = 0; q < sizeof ds / sizeof *ds; q++) {
            for (int v = 0; v < nx; v++)
                want[v] = round(x[v] * pow(10.0, ds[q])) / pow(10.0, ds[q]);
            eval1(sr_round(ctx, sr_vi(ctx, 0, nx), ds[q]), dt, 1, (const double *[]){x},
                  (int[]){nx}, got);
            expect_vec(dt, got, want, nx, "Round");
        }
    }
    double got[MAXOUT];
    eval1(sr_round(ctx, sr_vi(ctx, 0, 2), 0), SR_F64, 1, (const double *[]){(double[]){2.5, -0.5}},
          (int[]){2}, got);
    cr_expect(got[0] == 3.0 && got[1] == -1.0, "halves go away from zero: %g %g", got[0], got[1]);
}

Test(ops, clampint)
{
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[NSPECIAL], want[NSPECIAL], got[MAXOUT];
        for (int v = 0; v < NSPECIAL; v++) {
            x[v] = rnd(dt, special[v]);
            want[v] = isnan(x[v]) ? x[v] : x[v] < -1 ? -1 : x[v] > 2 ? 2 : x[v];
        }
        eval1(sr_clampint(ctx, sr_vi(ctx, 0, NSPECIAL), -1, 2), dt, 1, (const double *[]){x},
              (int[]){NSPECIAL}, got);
        expect_vec(dt, got, want, NSPECIAL, "ClampInt");
    }
}

/* DiffClampInt(x, lo, hi): 1 on [lo, hi], 0 outside, 1 at NaN (no comparison holds, as in
 * KeOps); 0 everywhere when lo > hi. On the reference and in the C kernels. */
Test(ops, diffclampint)
{
    static const char *const formulas[] = {"DiffClampInt(x,-1,2)", "DiffClampInt(x,2,1)"};
    static const sr_device devs[] = {SR_DEVICE_REFERENCE, SR_DEVICE_CPU};
    char alias[32];
    snprintf(alias, sizeof alias, "x=Vi(%d)", NSPECIAL);
    const char *al[] = {alias};
    for (int f = 0; f < 2; f++)
        for (int dv = 0; dv < 2; dv++)
            for (int t = 0; t < 2; t++) {
                sr_dtype dt = dtypes[t];
                double x[NSPECIAL], want[NSPECIAL], got[MAXOUT];
                for (int v = 0; v < NSPECIAL; v++) {
                    x[v] = rnd(dt, special[v]);
                    want[v] = isnan(x[v]) || (f == 0 && x[v] >= -1 && x[v] <= 2) ? 1.0 : 0.0;
                }
                sr_expr *e;
                cr_assert_eq(sr_parse(ctx, formulas[f], al, 1, &e), SR_OK, "%s", sr_ctx_error(ctx));
                eval_device = devs[dv];
                eval1(e, dt, 1, (const double *[]){x}, (int[]){NSPECIAL}, got);
                eval_device = SR_DEVICE_REFERENCE;
                for (int v = 0; v < NSPECIAL; v++)
                    cr_expect_eq(got[v], want[v], "%s at %g (%s, device %d): %g, want %g",
                                 formulas[f], x[v], dtname(dt), (int)devs[dv], got[v], want[v]);
            }
}

Test(ops, elem_extract_concat)
{
    double x[5] = {1.5, -2, 3.25, 4, -5.5}, y[2] = {7, 8.5}, got[MAXOUT];
    const double *a[2] = {x, y};
    int n[2] = {5, 2};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        sr_expr *vx = sr_vi(ctx, 0, 5), *vy = sr_vj(ctx, 1, 2);
        for (int m = 0; m < 5; m++) {
            eval1(sr_add(ctx, sr_elem(ctx, vx, m), sr_mul(ctx, sr_intcst(ctx, 0), vy)), dt, 2, a, n,
                  got);
            expect_close(dt, got[0], x[m], "Elem", m);
        }
        eval1(sr_concat(ctx, sr_extract(ctx, vx, 1, 3), vy), dt, 2, a, n, got);
        const double want[5] = {-2, 3.25, 4, 7, 8.5};
        expect_vec(dt, got, want, 5, "Concat(Extract)");
        eval1(sr_concat(ctx, vy, vx), dt, 2, a, n, got);
        const double want2[7] = {7, 8.5, 1.5, -2, 3.25, 4, -5.5};
        expect_vec(dt, got, want2, 7, "Concat");
    }
}

Test(ops, onehot)
{
    const double xs[] = {0.0, 2.0, 3.4, 3.5, 4.6, -0.4, -0.6, 5.0, 1e9, -1e9, NAN, INFINITY};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof xs / sizeof *xs; q++) {
            double x = rnd(dt, xs[q]), got[MAXOUT], want[5] = {0};
            double r = round(x);
            if (r >= 0 && r < 5)
                want[(int)r] = 1.0;
            eval1(sr_onehot(ctx, sr_vi(ctx, 0, 1), 5), dt, 1, (const double *[]){&x}, (int[]){1},
                  got);
            expect_vec(dt, got, want, 5, "OneHot");
        }
    }
}

/* ---- ternary ops, with broadcasting ---- */

Test(ops, clamp)
{
    const double lo[3] = {-1, 0, NAN}, hi[3] = {2, 0.5, 1};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[NSPECIAL], got[MAXOUT], want[NSPECIAL];
        for (int v = 0; v < NSPECIAL; v++)
            x[v] = rnd(dt, special[v]);
        for (int q = 0; q < 2; q++) { /* scalar bounds broadcast */
            for (int v = 0; v < NSPECIAL; v++)
                want[v] = isnan(x[v]) ? x[v] : fmin(fmax(x[v], lo[q]), hi[q]);
            eval1(sr_clamp(ctx, sr_vi(ctx, 0, NSPECIAL), sr_pm(ctx, 1, 1), sr_pm(ctx, 2, 1)), dt, 3,
                  (const double *[]){x, &lo[q], &hi[q]}, (int[]){NSPECIAL, 1, 1}, got);
            expect_vec(dt, got, want, NSPECIAL, "Clamp");
        }
        /* Vector bounds, one NaN bound: min(max(a, NaN), hi) is NaN. */
        eval1(sr_clamp(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3), sr_pm(ctx, 2, 3)), dt, 3,
              (const double *[]){(double[]){-5, 0.25, 0.5}, lo, hi}, (int[]){3, 3, 3}, got);
        cr_expect(got[0] == -1 && got[1] == 0.25 && isnan(got[2]), "Clamp vec: %g %g %g", got[0],
                  got[1], got[2]);
    }
}

Test(ops, ifelse)
{
    const double c[6] = {1, 0, -0.0, -2, NAN, INFINITY};
    const double a[6] = {10, 11, 12, 13, 14, 15}, b = -1;
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double got[MAXOUT];
        eval1(sr_ifelse(ctx, sr_vi(ctx, 0, 6), sr_vj(ctx, 1, 6), sr_pm(ctx, 2, 1)), dt, 3,
              (const double *[]){c, a, &b}, (int[]){6, 6, 1}, got);
        const double want[6] = {10, 11, 12, -1, -1, 15};
        expect_vec(dt, got, want, 6, "IfElse (a NaN condition selects b)");
        /* Scalar condition, vector branches. */
        eval1(sr_ifelse(ctx, sr_pm(ctx, 2, 1), sr_vj(ctx, 1, 6), sr_vi(ctx, 0, 6)), dt, 3,
              (const double *[]){c, a, &b}, (int[]){6, 6, 1}, got);
        expect_vec(dt, got, c, 6, "IfElse scalar condition");
    }
}

Test(ops, mod)
{
    const double ms[3] = {3, -2.5, 0.5}, os[3] = {0, 1, -0.25};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double x[NSPECIAL], got[MAXOUT], want[NSPECIAL];
        for (int v = 0; v < NSPECIAL; v++)
            x[v] = rnd(dt, special[v]);
        for (int q = 0; q < 3; q++) {
            for (int v = 0; v < NSPECIAL; v++)
                want[v] = fma(-ms[q], floor((x[v] - os[q]) / ms[q]), x[v]); /* one rounding */
            eval1(sr_mod(ctx, sr_vi(ctx, 0, NSPECIAL), sr_pm(ctx, 1, 1), sr_pm(ctx, 2, 1)), dt, 3,
                  (const double *[]){x, &ms[q], &os[q]}, (int[]){NSPECIAL, 1, 1}, got);
            expect_vec(dt, got, want, NSPECIAL, "Mod");
        }
        eval1(sr_mod(ctx, sr_vi(ctx, 0, 1), sr_intcst(ctx, 3), sr_intcst(ctx, 0)), dt, 1,
              (const double *[]){(double[]){-1}}, (int[]){1}, got);
        cr_expect_eq(got[0], 2.0, "Mod(-1, 3, 0) = %g", got[0]);
    }
}

/* ---- constants ---- */

Test(ops, constants)
{
    double got[MAXOUT];
    const double x = 0.0;
    sr_expr *z = sr_mul(ctx, sr_intcst(ctx, 0), sr_vi(ctx, 0, 1)); /* a kernel needs a variable */
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        eval1(sr_add(ctx, sr_intcst(ctx, -7), z), dt, 1, (const double *[]){&x}, (int[]){1}, got);
        expect_close(dt, got[0], -7.0, "IntCst", 0);
        eval1(sr_add(ctx, sr_ratcst(ctx, 2, -6), z), dt, 1, (const double *[]){&x}, (int[]){1},
              got);
        expect_close(dt, got[0], -1.0 / 3.0, "RatCst", 0);
        eval1(sr_add(ctx, sr_const(ctx, 2.71828), z), dt, 1, (const double *[]){&x}, (int[]){1},
              got);
        expect_close(dt, got[0], 2.71828, "Cst", 0);
    }
}

/* ---- vector ops at several dimensions ---- */

static void fill(double *v, int n, uint64_t *s, sr_dtype dt)
{
    for (int t = 0; t < n; t++)
        v[t] = rnd(dt, tu_uniform(s, -2, 2));
}

Test(ops, norms_and_products)
{
    const int dims[] = {1, 2, 3, 5, 17};
    uint64_t s = 11;
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof dims / sizeof *dims; q++) {
            int d = dims[q];
            double a[32], b[32], got[MAXOUT], want[32];
            fill(a, d, &s, dt);
            fill(b, d, &s, dt);
            const double *args[2] = {a, b};
            int n[2] = {d, d};
            sr_expr *x = sr_vi(ctx, 0, d), *y = sr_vj(ctx, 1, d);
            double sq = 0, dist = 0, dot = 0, sum = 0;
            for (int k = 0; k < d; k++) {
                sq += a[k] * a[k];
                dist += (a[k] - b[k]) * (a[k] - b[k]);
                dot += a[k] * b[k];
                sum += a[k];
            }
            /* Combine with a y-term of weight 0 so every kernel reads both arrays. */
            sr_expr *zy = sr_mul(ctx, sr_intcst(ctx, 0), sr_sum(ctx, y));
            eval1(sr_add(ctx, sr_sqnorm2(ctx, x), zy), dt, 2, args, n, got);
            expect_close(dt, got[0], sq, "SqNorm2", d);
            eval1(sr_add(ctx, sr_norm2(ctx, x), zy), dt, 2, args, n, got);
            expect_close(dt, got[0], sqrt(sq), "Norm2", d);
            eval1(sr_sqdist(ctx, x, y), dt, 2, args, n, got);
            expect_close(dt, got[0], dist, "SqDist", d);
            eval1(sr_scalprod(ctx, x, y), dt, 2, args, n, got);
            expect_close(dt, got[0], dot, "Scalprod", d);
            eval1(sr_add(ctx, sr_sum(ctx, x), zy), dt, 2, args, n, got);
            expect_close(dt, got[0], sum, "Sum", d);
            for (int k = 0; k < d; k++)
                want[k] = a[k] / sqrt(sq);
            eval1(sr_add(ctx, sr_normalize(ctx, x), zy), dt, 2, args, n, got);
            expect_vec(dt, got, want, d, "Normalize");
        }
    }
}

Test(ops, vector_min_max_arg)
{
    struct {
        double v[5];
        double min, max, argmin, argmax;
    } cases[] = {
        {{3, 1, 4, 1, 5}, 1, 5, 1, 4},
        {{2, 2, 2, 2, 2}, 2, 2, 0, 0},
        {{-1, 7, NAN, -3, NAN}, NAN, NAN, 2, 2},
        {{NAN, 1, 2, 3, 4}, NAN, NAN, 0, 0},
        {{INFINITY, -INFINITY, 0, -INFINITY, INFINITY}, -INFINITY, INFINITY, 1, 0},
        {{-0.5, 9, 9, -0.5, 8}, -0.5, 9, 0, 1},
    };
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof cases / sizeof *cases; q++) {
            double got[MAXOUT];
            const double *a[1] = {cases[q].v};
            int n[1] = {5};
            sr_expr *x = sr_vi(ctx, 0, 5);
            eval1(sr_min(ctx, x), dt, 1, a, n, got);
            expect_close(dt, got[0], cases[q].min, "Min", (int)q);
            eval1(sr_max(ctx, x), dt, 1, a, n, got);
            expect_close(dt, got[0], cases[q].max, "Max", (int)q);
            eval1(sr_argmin(ctx, x), dt, 1, a, n, got);
            expect_close(dt, got[0], cases[q].argmin, "ArgMin", (int)q);
            eval1(sr_argmax(ctx, x), dt, 1, a, n, got);
            expect_close(dt, got[0], cases[q].argmax, "ArgMax", (int)q);
        }
    }
}

Test(ops, matvec_vecmat_tensorprod)
{
    uint64_t s = 5;
    const int shapes[][2] = {{1, 1}, {2, 3}, {3, 2}, {4, 4}, {1, 5}};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof shapes / sizeof *shapes; q++) {
            int m = shapes[q][0], nn = shapes[q][1];
            double A[32], v[8], u[8], got[MAXOUT], want[32];
            fill(A, m * nn, &s, dt);
            fill(v, nn, &s, dt);
            fill(u, m, &s, dt);
            for (int r = 0; r < m; r++) {
                want[r] = 0;
                for (int c = 0; c < nn; c++)
                    want[r] += A[r * nn + c] * v[c];
            }
            eval1(sr_matvecmult(ctx, sr_vi(ctx, 0, m * nn), sr_vj(ctx, 1, nn)), dt, 2,
                  (const double *[]){A, v}, (int[]){m * nn, nn}, got);
            expect_vec(dt, got, want, m, "MatVecMult");
            for (int c = 0; c < nn; c++) {
                want[c] = 0;
                for (int r = 0; r < m; r++)
                    want[c] += u[r] * A[r * nn + c];
            }
            eval1(sr_vecmatmult(ctx, sr_vj(ctx, 1, m), sr_vi(ctx, 0, m * nn)), dt, 2,
                  (const double *[]){A, u}, (int[]){m * nn, m}, got);
            expect_vec(dt, got, want, nn, "VecMatMult");
            for (int i = 0; i < m; i++)
                for (int j = 0; j < nn; j++)
                    want[i * nn + j] = u[i] * v[j];
            eval1(sr_tensorprod(ctx, sr_vi(ctx, 0, m), sr_vj(ctx, 1, nn)), dt, 2,
                  (const double *[]){u, v}, (int[]){m, nn}, got);
            expect_vec(dt, got, want, m * nn, "TensorProd");
        }
    }
}

/* SumT, ElemT, ExtractT: the other components are exactly 0, whatever the operand (NaN, inf). */
Test(ops, sumt_elemt_extractt)
{
    double got[MAXOUT];
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof special / sizeof *special; q++) {
            double a = rnd(dt, special[q]), y = 0.75;
            const double *args[2] = {&a, &y};
            sr_expr *va = sr_vi(ctx, 0, 1), *vy = sr_vj(ctx, 1, 1);
            eval1(sr_add(ctx, sr_elemt(ctx, va, 4, 2),
                         sr_sumt(ctx, sr_mul(ctx, vy, sr_intcst(ctx, 0)), 4)),
                  dt, 2, args, (int[]){1, 1}, got);
            expect_vec(dt, got, (double[]){0, 0, a, 0}, 4, "ElemT");
            eval1(sr_mul(ctx, sr_sumt(ctx, va, 3), vy), dt, 2, args, (int[]){1, 1}, got);
            expect_vec(dt, got, (double[]){a * y, a * y, a * y}, 3, "SumT");
            eval1(sr_extractt(ctx, sr_concat(ctx, va, vy), 1, 5), dt, 2, args, (int[]){1, 1}, got);
            expect_vec(dt, got, (double[]){0, a, y, 0, 0}, 5, "ExtractT");
        }
    }
}

/* The complex ops on interleaved (re, im) pairs against C99 complex arithmetic: a and b are
 * 3 complex numbers (i and j), c a complex scalar (broadcast), r 3 reals and s one real. */
static double complex cz(const double *v, int k) { return CMPLX(v[2 * k], v[2 * k + 1]); }
static void cset(double *v, int k, double complex z)
{
    v[2 * k] = creal(z);
    v[2 * k + 1] = cimag(z);
}
Test(ops, complex_ops)
{
    uint64_t seed = 31;
    enum { NC = 3 };
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double a[2 * NC], b[2 * NC], c[2], r[NC], s1[1], got[MAXOUT], want[4 * NC];
        fill(a, 2 * NC, &seed, dt);
        fill(b, 2 * NC, &seed, dt);
        fill(c, 2, &seed, dt);
        fill(r, NC, &seed, dt);
        fill(s1, 1, &seed, dt);
        const double *args[5] = {a, b, c, r, s1};
        const int n[5] = {2 * NC, 2 * NC, 2, NC, 1};
        sr_expr *A = sr_vi(ctx, 0, 2 * NC), *B = sr_vj(ctx, 1, 2 * NC), *C = sr_pm(ctx, 2, 2),
                *R = sr_vj(ctx, 3, NC), *S = sr_pm(ctx, 4, 1);
        /* Every formula uses all five variables (so the kernel takes five arrays): the extra
         * term is 0 * Sum(...) of those it does not use, exact for finite inputs. */
        sr_expr *z = sr_mul(ctx, sr_intcst(ctx, 0),
                            sr_add(ctx, sr_add(ctx, sr_sum(ctx, A), sr_sum(ctx, B)),
                                   sr_add(ctx, sr_add(ctx, sr_sum(ctx, C), sr_sum(ctx, R)), S)));
#define CHECK(expr, count, what)                                                                   \
    do {                                                                                           \
        int od_ = eval1(sr_add(ctx, (expr), z), dt, 5, args, n, got);                              \
        cr_assert_eq(od_, (count), "%s: dimension %d", what, od_);                                 \
        expect_vec(dt, got, want, (count), what);                                                  \
    } while (0)
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(a, k) * cz(b, k));
        CHECK(sr_complex_mult(ctx, A, B), 2 * NC, "ComplexMult");
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(c, 0) * cz(b, k));
        CHECK(sr_complex_mult(ctx, C, B), 2 * NC, "ComplexMult broadcast");
        CHECK(sr_complex_scal(ctx, B, C), 2 * NC, "ComplexScal");
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(a, k) + cz(c, 0));
        CHECK(sr_complex_add(ctx, A, C), 2 * NC, "ComplexAdd");
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(c, 0) - cz(b, k));
        CHECK(sr_complex_sub(ctx, C, B), 2 * NC, "ComplexSubtract");
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(a, k) / cz(b, k));
        CHECK(sr_complex_div(ctx, A, B), 2 * NC, "ComplexDivide");
        for (int k = 0; k < NC; k++)
            cset(want, k, cz(a, k) / cz(c, 0));
        CHECK(sr_complex_div(ctx, A, C), 2 * NC, "ComplexDivide broadcast");
        for (int k = 0; k < NC; k++)
            cset(want, k, s1[0] * cz(b, k));
        CHECK(sr_complex_realscal(ctx, B, S), 2 * NC, "ComplexRealScal");
        for (int k = 0; k < NC; k++)
            cset(want, k, conj(cz(a, k)));
        CHECK(sr_conj(ctx, A), 2 * NC, "Conj");
        for (int k = 0; k < NC; k++)
            cset(want, k, cexp(cz(a, k)));
        CHECK(sr_complex_exp(ctx, A), 2 * NC, "ComplexExp");
        for (int k = 0; k < NC; k++)
            cset(want, k, cexp(I * r[k]));
        CHECK(sr_complex_exp1j(ctx, R), 2 * NC, "ComplexExp1j");
        for (int k = 0; k < NC; k++)
            cset(want, k, CMPLX(r[k], 0) + CMPLX(0, s1[0]));
        CHECK(sr_add(ctx, sr_real2complex(ctx, R), sr_imag2complex(ctx, sr_sumt(ctx, S, NC))),
              2 * NC, "Real2Complex + Imag2Complex");
        for (int k = 0; k < NC; k++)
            want[k] = creal(cz(a, k));
        CHECK(sr_complex_real(ctx, A), NC, "ComplexReal");
        for (int k = 0; k < NC; k++)
            want[k] = cimag(cz(a, k));
        CHECK(sr_complex_imag(ctx, A), NC, "ComplexImag");
        for (int k = 0; k < NC; k++)
            want[k] = cabs(cz(a, k));
        CHECK(sr_complex_abs(ctx, A), NC, "ComplexAbs");
        for (int k = 0; k < NC; k++)
            want[k] = creal(cz(a, k) * conj(cz(a, k)));
        CHECK(sr_complex_squareabs(ctx, A), NC, "ComplexSquareAbs");
        for (int k = 0; k < NC; k++)
            want[k] = carg(cz(a, k));
        CHECK(sr_complex_angle(ctx, A), NC, "ComplexAngle");
        cset(want, 0, cz(a, 0) + cz(a, 1) + cz(a, 2));
        CHECK(sr_complex_sum(ctx, A), 2, "ComplexSum");
        for (int k = 0; k < 2; k++)
            cset(want, k, cz(c, 0));
        CHECK(sr_complex_sumt(ctx, C, 4), 4, "ComplexSumT");
#undef CHECK
    }
}

/* TensorDot against loops written here: MatVecMult, VecMatMult, TensorProd and its transpose as
 * special cases, and a rank-3 tensor contracted on two axes given out of order. */
Test(ops, tensordot)
{
    uint64_t s = 9;
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        double A[24], v[4], u[3], got[MAXOUT], want[24];
        fill(A, 24, &s, dt);
        fill(v, 4, &s, dt);
        fill(u, 3, &s, dt);
        sr_expr *vA = sr_vi(ctx, 0, 12), *vv = sr_vj(ctx, 1, 4), *vu = sr_vj(ctx, 1, 3);
        int d34[2] = {3, 4}, d4[1] = {4}, d3[1] = {3}, c0[1] = {0}, c1[1] = {1}, sw[2] = {1, 0};
        for (int r = 0; r < 3; r++) {
            want[r] = 0;
            for (int c = 0; c < 4; c++)
                want[r] += A[r * 4 + c] * v[c];
        }
        eval1(sr_tensordot(ctx, vA, vv, 2, d34, 1, d4, 1, c1, c0, NULL), dt, 2,
              (const double *[]){A, v}, (int[]){12, 4}, got);
        expect_vec(dt, got, want, 3, "TensorDot as MatVecMult");
        for (int c = 0; c < 4; c++) {
            want[c] = 0;
            for (int r = 0; r < 3; r++)
                want[c] += u[r] * A[r * 4 + c];
        }
        eval1(sr_tensordot(ctx, vu, vA, 1, d3, 2, d34, 1, c0, c0, NULL), dt, 2,
              (const double *[]){A, u}, (int[]){12, 3}, got);
        expect_vec(dt, got, want, 4, "TensorDot as VecMatMult");
        sr_expr *x = sr_vi(ctx, 0, 3);
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++)
                    want[p ? j * 3 + i : i * 4 + j] = A[i] * v[j];
            eval1(sr_tensordot(ctx, x, vv, 1, d3, 1, d4, 0, NULL, NULL, p ? sw : NULL), dt, 2,
                  (const double *[]){A, v}, (int[]){3, 4}, got);
            expect_vec(dt, got, want, 12, p ? "TensorDot, permuted outer product" : "TensorDot");
        }
        /* a (2,3,4), b (4,3): out[i] = sum_{k,l} a[i,l,k] b[k,l] */
        int d234[3] = {2, 3, 4}, d43[2] = {4, 3}, ca[2] = {2, 1}, cb[2] = {0, 1};
        for (int i = 0; i < 2; i++) {
            want[i] = 0;
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 3; l++)
                    want[i] += A[i * 12 + l * 4 + k] * v[0] * A[k * 3 + l];
        }
        sr_expr *a3 = sr_vi(ctx, 0, 24), *b3 = sr_mul(ctx, sr_pm(ctx, 2, 12), sr_elem(ctx, vv, 0));
        eval1(sr_tensordot(ctx, a3, b3, 3, d234, 2, d43, 2, ca, cb, NULL), dt, 3,
              (const double *[]){A, v, A}, (int[]){24, 4, 12}, got);
        expect_vec(dt, got, want, 2, "TensorDot rank 3");
    }
}

static double wsq(const double *w, int dw, const double *a, const double *b, int d)
{
    double diff[16], s = 0;
    for (int k = 0; k < d; k++)
        diff[k] = a[k] - (b ? b[k] : 0.0);
    if (dw == 1) {
        for (int k = 0; k < d; k++)
            s += diff[k] * diff[k];
        return w[0] * s;
    }
    if (dw == d) {
        for (int k = 0; k < d; k++)
            s += w[k] * diff[k] * diff[k];
        return s;
    }
    for (int r = 0; r < d; r++)
        for (int c = 0; c < d; c++)
            s += diff[r] * w[r * d + c] * diff[c];
    return s;
}

Test(ops, weighted_sqnorm_and_sqdist)
{
    uint64_t s = 99;
    const int dims[] = {2, 3, 4};
    for (int t = 0; t < 2; t++) {
        sr_dtype dt = dtypes[t];
        for (size_t q = 0; q < sizeof dims / sizeof *dims; q++) {
            int d = dims[q];
            int wdims[3] = {1, d, d * d};
            for (int wq = 0; wq < 3; wq++) {
                int dw = wdims[wq];
                double w[16], a[4], b[4], got[MAXOUT];
                fill(w, dw, &s, dt);
                fill(a, d, &s, dt);
                fill(b, d, &s, dt);
                sr_expr *W = sr_pm(ctx, 2, dw), *x = sr_vi(ctx, 0, d), *y = sr_vj(ctx, 1, d);
                const double *args[3] = {a, b, w};
                int n[3] = {d, d, dw};
                eval1(sr_weightedsqdist(ctx, W, x, y), dt, 3, args, n, got);
                expect_close(dt, got[0], wsq(w, dw, a, b, d), "WeightedSqDist", dw);
                eval1(sr_add(ctx, sr_weightedsqnorm(ctx, W, x),
                             sr_mul(ctx, sr_intcst(ctx, 0), sr_sum(ctx, y))),
                      dt, 3, args, n, got);
                expect_close(dt, got[0], wsq(w, dw, a, NULL, d), "WeightedSqNorm", dw);
            }
        }
    }
}

/* ---- whole formulas ---- */

Test(ops, shared_subexpressions_and_depth)
{
    /* d is used three times; a chain of 200 nodes checks the evaluation order. */
    double a[3] = {0.5, -1, 2}, b[3] = {1.5, 0.25, -0.75}, got[MAXOUT];
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3);
    sr_expr *d = sr_sqdist(ctx, x, y);
    sr_expr *f = sr_add(ctx, sr_mul(ctx, d, d), sr_exp(ctx, sr_neg(ctx, d)));
    double dd = 1 + 1.5625 + 7.5625;
    for (int t = 0; t < 2; t++) {
        eval1(f, dtypes[t], 2, (const double *[]){a, b}, (int[]){3, 3}, got);
        expect_close(dtypes[t], got[0], dd * dd + exp(-dd), "shared", 0);
    }
    sr_expr *c = sr_elem(ctx, x, 0);
    double want = 0.5;
    for (int t = 0; t < 200; t++) {
        c = sr_add(ctx, sr_mul(ctx, c, sr_ratcst(ctx, 1, 2)), sr_elem(ctx, y, t % 3));
        want = want * 0.5 + b[t % 3];
    }
    eval1(c, SR_F64, 2, (const double *[]){a, b}, (int[]){3, 3}, got);
    expect_close(SR_F64, got[0], want, "chain", 0);
}

Test(ops, float32_evaluates_in_double)
{
    /* (x + 1e-10) - x is 0 in float arithmetic but 1e-10 in double: the reference rounds once,
     * at the output. */
    double x = 1.0, got[MAXOUT];
    sr_expr *v = sr_vi(ctx, 0, 1);
    eval1(sr_sub(ctx, sr_add(ctx, v, sr_const(ctx, 1e-10)), v), SR_F32, 1, (const double *[]){&x},
          (int[]){1}, got);
    cr_expect(fabs(got[0] - 1e-10) < 1e-16, "got %.17g, expected ~1e-10", got[0]);
}

Test(ops, builder_errors_reach_kernel_new)
{
    sr_expr *f = sr_add(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 2));
    cr_assert_null(f);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_expect_eq(sr_kernel_new(ctx, f, &d, &k), SR_EDIM, "%s", sr_ctx_error(ctx));
    cr_expect_null(k);
}

Test(ops, plan_names_reference)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    sr_expr *f =
        sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3)))),
               sr_vj(ctx, 2, 1));
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_plan_info p = tu_plan(k);
    cr_expect(strcmp(p.backend, "reference") == 0 && p.strategy == SR_STRATEGY_REFERENCE, "%s: %s",
              p.backend, sr_kernel_explain(k));
    sr_kernel_free(k);
}
