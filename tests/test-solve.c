/*
 * test-solve.c — sr_kernel_solve: (alpha I + K) a = b for a Gaussian kernel against a dense LU
 * solve of the materialised matrix (n = 50 and 97, float32 and float64, one and three
 * right-hand sides, both axes); convergence failure (SR_ENOCONV with its message); bad input.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(solve, .init = setup, .fini = teardown);

enum { DIM = 2 };
static const double G = 2.0;

/* exp(-g |x - y|^2) * b with x = V(0, 2), y = V(1, 2), b = V(2, nb) of the reduced index and
 * g = Pm(3, 1); axis 1 reduces over j (x = Vi), axis 0 over i (x = Vj). */
static sr_kernel *gauss_solve_kernel(int axis, int nb, sr_dtype dt)
{
    sr_expr *(*out_v)(sr_ctx *, int, int) = axis == 1 ? sr_vi : sr_vj;
    sr_expr *(*red_v)(sr_ctx *, int, int) = axis == 1 ? sr_vj : sr_vi;
    sr_expr *x = out_v(ctx, 0, DIM), *y = red_v(ctx, 1, DIM), *b = red_v(ctx, 2, nb);
    sr_expr *g = sr_pm(ctx, 3, 1);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g))), b);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.axis = axis;
    d.dtype = dt;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* Solves (alpha I + K) a = b densely (Gaussian elimination with partial pivoting), in place. */
static void dense_solve(const double *x, int64_t n, int nb, double alpha, double *b)
{
    double *a = malloc((size_t)(n * n) * sizeof *a);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double d2 = 0;
            for (int c = 0; c < DIM; c++)
                d2 += (x[i * DIM + c] - x[j * DIM + c]) * (x[i * DIM + c] - x[j * DIM + c]);
            a[i * n + j] = exp(-G * d2) + (i == j ? alpha : 0);
        }
    for (int64_t c = 0; c < n; c++) {
        int64_t piv = c;
        for (int64_t r = c + 1; r < n; r++)
            if (fabs(a[r * n + c]) > fabs(a[piv * n + c]))
                piv = r;
        for (int64_t t = 0; t < n; t++) {
            double s = a[c * n + t];
            a[c * n + t] = a[piv * n + t];
            a[piv * n + t] = s;
        }
        for (int t = 0; t < nb; t++) {
            double s = b[c * nb + t];
            b[c * nb + t] = b[piv * nb + t];
            b[piv * nb + t] = s;
        }
        for (int64_t r = c + 1; r < n; r++) {
            double m = a[r * n + c] / a[c * n + c];
            for (int64_t t = c; t < n; t++)
                a[r * n + t] -= m * a[c * n + t];
            for (int t = 0; t < nb; t++)
                b[r * nb + t] -= m * b[c * nb + t];
        }
    }
    for (int64_t c = n - 1; c >= 0; c--)
        for (int t = 0; t < nb; t++) {
            double s = b[c * nb + t];
            for (int64_t u = c + 1; u < n; u++)
                s -= a[c * n + u] * b[u * nb + t];
            b[c * nb + t] = s / a[c * n + c];
        }
    free(a);
}

static double get(const void *p, sr_dtype dt, int64_t i)
{
    return dt == SR_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void check_solve(int64_t n, int nb, sr_dtype dt, int axis, double alpha)
{
    uint64_t rng = 1234 + (uint64_t)n * 7 + (uint64_t)nb;
    size_t es = dt == SR_F64 ? 8 : 4;
    void *x = malloc((size_t)(n * DIM) * es), *b = malloc((size_t)(n * nb) * es);
    void *out = malloc((size_t)(n * nb) * es);
    tu_fill(x, dt, n * DIM, -1, 1, &rng);
    tu_fill(b, dt, n * nb, -1, 1, &rng);
    double *xd = malloc((size_t)(n * DIM) * sizeof *xd), *ref = malloc((size_t)(n * nb) * 8);
    for (int64_t t = 0; t < n * DIM; t++)
        xd[t] = get(x, dt, t);
    for (int64_t t = 0; t < n * nb; t++)
        ref[t] = get(b, dt, t);
    dense_solve(xd, n, nb, alpha, ref);

    sr_kernel *k = gauss_solve_kernel(axis, nb, dt);
    double g64 = G;
    float g32 = (float)G;
    const void *args[] = {x, x, NULL, dt == SR_F64 ? (const void *)&g64 : (const void *)&g32};
    sr_solve_desc d = sr_solve_desc_default();
    d.b_index = 2;
    d.alpha = alpha;
    d.eps = dt == SR_F64 ? 1e-10 : 1e-5;
    cr_assert_eq(sr_kernel_solve(k, &d, n, args, b, out), SR_OK, "%s", sr_ctx_error(ctx));
    double tol = dt == SR_F64 ? 1e-7 : 2e-3, scale = 0;
    for (int64_t t = 0; t < n * nb; t++)
        scale = fmax(scale, fabs(ref[t]));
    for (int64_t t = 0; t < n * nb; t++)
        cr_assert(fabs(get(out, dt, t) - ref[t]) <= tol * scale,
                  "n %lld nb %d dtype %d axis %d: a[%lld] = %.9g, dense %.9g", (long long)n, nb,
                  (int)dt, axis, (long long)t, get(out, dt, t), ref[t]);
    sr_kernel_free(k);
    free(x), free(b), free(out), free(xd), free(ref);
}

Test(solve, matches_dense_lu)
{
    static const int64_t ns[] = {50, 97};
    for (int in = 0; in < 2; in++)
        for (int nb = 1; nb <= 3; nb += 2)
            for (int dt = SR_F32; dt <= SR_F64; dt++)
                check_solve(ns[in], nb, (sr_dtype)dt, 1, 0.5);
}

Test(solve, axis_0_and_small_alpha)
{
    check_solve(50, 1, SR_F64, 0, 0.5);
    check_solve(50, 2, SR_F64, 1, 0.05);
}

Test(solve, empty_is_a_noop)
{
    sr_kernel *k = gauss_solve_kernel(1, 1, SR_F64);
    sr_solve_desc d = sr_solve_desc_default();
    d.b_index = 2;
    double g = G, rhs = 1, out = 42;
    const void *args[] = {&rhs, &rhs, NULL, &g};
    cr_assert_eq(sr_kernel_solve(k, &d, 0, args, &rhs, &out), SR_OK);
    cr_assert_eq(out, 42);
    sr_kernel_free(k);
}

/* Fixtures for the failure tests: n points and one right-hand side in float64. */
struct fix {
    double x[2 * 40], b[40], out[40], g;
    const void *args[4];
};

static void fix_init(struct fix *f)
{
    uint64_t rng = 99;
    tu_fill(f->x, SR_F64, 80, -1, 1, &rng);
    tu_fill(f->b, SR_F64, 40, -1, 1, &rng);
    f->g = G;
    f->args[0] = f->x, f->args[1] = f->x, f->args[2] = NULL, f->args[3] = &f->g;
}

Test(solve, max_iter_reports_no_convergence)
{
    struct fix f;
    fix_init(&f);
    sr_kernel *k = gauss_solve_kernel(1, 1, SR_F64);
    sr_solve_desc d = sr_solve_desc_default();
    d.b_index = 2;
    d.alpha = 0.1;
    d.max_iter = 1;
    cr_assert_eq(sr_kernel_solve(k, &d, 40, f.args, f.b, f.out), SR_ENOCONV);
    const char *msg = sr_ctx_error(ctx);
    cr_assert(strstr(msg, "no convergence after 1 iterations"), "%s", msg);
    cr_assert(strstr(msg, "residual"), "%s", msg);
    cr_assert_str_eq(sr_status_str(SR_ENOCONV), "no convergence");
    sr_kernel_free(k);
}

static void expect_einval(const sr_kernel *k, const sr_solve_desc *d, const void *const *args,
                          const char *part)
{
    struct fix f;
    fix_init(&f);
    cr_assert_eq(sr_kernel_solve(k, d, 40, args ? args : f.args, f.b, f.out), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), part), "expected '%s' in: %s", part, sr_ctx_error(ctx));
}

Test(solve, bad_input)
{
    sr_kernel *k = gauss_solve_kernel(1, 1, SR_F64);
    sr_solve_desc d = sr_solve_desc_default();
    d.b_index = 2;
    d.alpha = -1;
    expect_einval(k, &d, NULL, "alpha");
    d.alpha = 0.5;
    d.eps = 0;
    expect_einval(k, &d, NULL, "eps");
    d.eps = 1e-6;
    d.b_index = 0; /* x_i: not of the reduced index */
    expect_einval(k, &d, NULL, "b_index 0");
    d.b_index = 7;
    expect_einval(k, &d, NULL, "b_index 7");
    d.b_index = 1; /* y_j has dimension 2, the output 1 */
    expect_einval(k, &d, NULL, "dimension");
    d.b_index = 2;
    cr_assert_eq(sr_kernel_solve(k, NULL, 40, NULL, NULL, NULL), SR_EINVAL);
    cr_assert_eq(sr_kernel_solve(NULL, &d, 40, NULL, NULL, NULL), SR_EINVAL);
    sr_kernel_free(k);

    /* Not a Sum. */
    sr_expr *f = sr_mul(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2)), sr_vj(ctx, 2, 1));
    sr_kernel_desc kd = sr_kernel_desc_default();
    kd.reduction = SR_MIN;
    kd.dtype = SR_F64;
    cr_assert_eq(sr_kernel_new(ctx, f, &kd, &k), SR_OK);
    expect_einval(k, &d, NULL, "Sum reduction");
    sr_kernel_free(k);
}

/* n * dim(b) values, and the solver's five double vectors of that length, overflow: a size
 * error before anything is allocated or read (small arrays stand in for the impossible ones). */
Test(solve, sizes_that_overflow)
{
    const int64_t huge[] = {((int64_t)1 << 61) + 1, INT64_MAX / 2, INT64_MAX};
    for (int nb = 1; nb <= 3; nb += 2) {
        sr_kernel *k = gauss_solve_kernel(1, nb, nb == 1 ? SR_F64 : SR_F32);
        sr_solve_desc d = sr_solve_desc_default();
        d.b_index = 2;
        d.alpha = 1;
        double x[8] = {0}, b[8] = {0}, g = 1, out[8];
        const void *args[] = {x, x, b, &g};
        for (int t = 0; t < 3; t++) {
            sr_status st = sr_kernel_solve(k, &d, huge[t], args, b, out);
            cr_assert_eq(st, SR_EOVERFLOW, "nb %d n %lld: status %d: %s", nb, (long long)huge[t],
                         st, sr_ctx_error(ctx));
            cr_assert(strstr(sr_ctx_error(ctx), "overflow"), "message: %s", sr_ctx_error(ctx));
        }
        sr_kernel_free(k);
    }
}

Test(solve, not_symmetric_is_rejected)
{
    /* exp(-g |x - y|^2) with different i and j data: K is not symmetric. */
    sr_kernel *k = gauss_solve_kernel(1, 1, SR_F64);
    sr_solve_desc d = sr_solve_desc_default();
    d.b_index = 2;
    d.alpha = 0.5;
    struct fix f;
    fix_init(&f);
    double y[80];
    uint64_t rng = 5;
    tu_fill(y, SR_F64, 80, -1, 1, &rng);
    const void *args[] = {f.x, y, NULL, &f.g};
    expect_einval(k, &d, args, "not symmetric");
    sr_kernel_free(k);

    /* A formula that is not symmetric in x_i, x_j: exp(-g (x_i - x_j) . (1, 1)). */
    sr_expr *x = sr_vi(ctx, 0, DIM), *xj = sr_vj(ctx, 1, DIM), *b = sr_vj(ctx, 2, 1);
    sr_expr *s = sr_sum(ctx, sr_sub(ctx, x, xj));
    sr_expr *fm = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, s, sr_pm(ctx, 3, 1)))), b);
    sr_kernel_desc kd = sr_kernel_desc_default();
    kd.dtype = SR_F64;
    cr_assert_eq(sr_kernel_new(ctx, fm, &kd, &k), SR_OK, "%s", sr_ctx_error(ctx));
    expect_einval(k, &d, NULL, "not symmetric");
    sr_kernel_free(k);
}
