/*
 * test-wide-grad.c — gradients of the wide reductions (sr_kernel_grad) on the fused
 * two-product strategy, against the same gradient kernels on the reference interpreter.
 *
 * Attention, SumSoftMaxWeight((q|k) s, v): the gradients with respect to q, k and v; the
 * Gaussian mat-vec, Sum of Exp(-SqDist(x, y) g) b: with respect to x, y and b. Widths of v and
 * b 1, 4, 15, 16, 17, 64, 65; float32 and float64; sizes 0, 1 and primes. Each gradient kernel
 * must plan onto the fused strategy where the product is wide (v, b, k and q of at least 4
 * values) or F holds an inner product a gemm forms (x and y when b is at least
 * SR_GEMM_MIN_DIM wide), and its values must agree with the reference's, elementwise within a
 * tolerance relative to the largest output value (the two sum in different orders).
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
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_GEMM_KERNEL");
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_MEM_LIMIT");
    unsetenv("SYMRED_ACC");
    have_gemm = cpu_avx512_usable() || tu_blis_usable();
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(wide_grad, .init = setup, .fini = teardown);

enum form { ATTN, GAUSS };

struct gcase {
    enum form form;
    int R; /* the width of v (ATTN) or b (GAUSS) */
    int64_t nx, ny;
    sr_dtype dt;
};

enum { ATTN_D = 64, GAUSS_D = 3 };

/* The forward kernel of c on device dev: ATTN takes q (0), k (1), s (2), v (3); GAUSS x (0),
 * y (1), b (2), g (3). */
static sr_kernel *forward(const struct gcase *c, sr_device dev)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = c->dt;
    d.device = dev;
    sr_expr *f;
    if (c->form == ATTN) {
        sr_expr *q = sr_vi(ctx, 0, ATTN_D), *k = sr_vj(ctx, 1, ATTN_D), *s = sr_pm(ctx, 2, 1);
        f = sr_mul(ctx, sr_scalprod(ctx, q, k), s);
        d.reduction = SR_SUMSOFTMAXWEIGHT;
        d.weight = sr_vj(ctx, 3, c->R);
    } else {
        sr_expr *x = sr_vi(ctx, 0, GAUSS_D), *y = sr_vj(ctx, 1, GAUSS_D);
        sr_expr *b = sr_vj(ctx, 2, c->R), *g = sr_pm(ctx, 3, 1);
        f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g))), b);
    }
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

static int var_dim(const struct gcase *c, int v)
{
    if (c->form == ATTN)
        return v == 2 ? 1 : v == 3 ? c->R : ATTN_D;
    return v == 3 ? 1 : v == 2 ? c->R : GAUSS_D;
}

static int64_t var_rows(const struct gcase *c, int v)
{
    return v == 0 ? c->nx : v == 1 || v == 2 + (c->form == ATTN) ? c->ny : 1;
}

/* Whether the gradient with respect to v should run on the fused strategy
 * (the planner's cost model, src/cpu/cost.c). */
static bool expect_fused(const struct gcase *c, int v)
{
    if (!have_gemm)
        return false;
    if (c->form == ATTN)
        return v != 3 || c->R >= 4;
    return v == 2 ? c->R >= 4 : c->R >= SR_GEMM_MIN_DIM;
}

static void *fill(sr_dtype dt, int64_t n, double lo, double hi, uint64_t *s)
{
    void *p = malloc((dt == SR_F64 ? 8 : 4) * (size_t)(n > 0 ? n : 1));
    tu_fill(p, dt, n, lo, hi, s);
    return p;
}

static double at(const void *p, sr_dtype dt, int64_t i)
{
    return dt == SR_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

/* The gradient of c with respect to v on the JIT against the reference, on random inputs: the
 * forward arrays, the incoming gradient G, a forward output o and (attention) a log-normalizer
 * L. The gradient kernel is a Sum of a formula of them, so any values serve. */
static void grad_case(const struct gcase *c, int v)
{
    sr_kernel *fj = forward(c, SR_DEVICE_AUTO), *fr = forward(c, SR_DEVICE_REFERENCE);
    sr_kernel *gj, *gr;
    cr_assert_eq(sr_kernel_grad(fj, v, &gj), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_grad(fr, v, &gr), SR_OK, "%s", sr_ctx_error(ctx));
    const char *ex = sr_kernel_explain(gj);
    bool fused = tu_runs_fused(gj);
    if (expect_fused(c, v))
        cr_assert(fused, "form %d R %d: expected the gradient w.r.t. %d on the fused strategy:\n%s",
                  c->form, c->R, v, ex);
    cr_assert(tu_runs_jit(gj), "expected the CPU JIT:\n%s", ex);

    int n = sr_kernel_nargs(gj);
    cr_assert_eq(n, sr_kernel_nargs(gr));
    cr_assert(n <= 7, "%d arguments", n);
    uint64_t s = 7 + (uint64_t)c->R * 131 + (uint64_t)c->nx * 17 + (uint64_t)c->ny + (uint64_t)v;
    void *arr[7] = {0};
    double p64 = c->form == ATTN ? 0.5 : 2.0;
    float p32 = (float)p64;
    int64_t nout_f = c->nx; /* the forward's output rows (axis 1) */
    int od_f = c->R;
    for (int a = 0; a < n; a++) {
        if (a == (c->form == ATTN ? 2 : 3))
            continue; /* the parameter */
        int64_t cnt;
        double lo = -0.3, hi = 0.3;
        if (a < 4)
            cnt = var_rows(c, a) * var_dim(c, a);
        else if (a < 6)
            cnt = nout_f * od_f; /* G and o */
        else
            cnt = nout_f, lo = 0.0, hi = 3.0; /* L */
        if (c->form == GAUSS && a < 4)
            lo = 0.0, hi = 1.0;
        arr[a] = fill(c->dt, cnt, lo, hi, &s);
    }
    const void *args[7];
    for (int a = 0; a < n; a++)
        args[a] = arr[a] ? arr[a] : (c->dt == SR_F64 ? (const void *)&p64 : (const void *)&p32);
    int od = sr_kernel_out_dim(gj);
    cr_assert_eq(od, var_dim(c, v));
    int64_t nout = v == 0 ? c->nx : c->ny;
    if (v == (c->form == ATTN ? 2 : 3))
        nout = c->nx; /* a parameter's rows, one per forward output row, summed by the caller */
    size_t es = c->dt == SR_F64 ? 8 : 4;
    void *o1 = calloc((size_t)(nout * od + 1), es), *o2 = calloc((size_t)(nout * od + 1), es);
    sr_run_desc r1 = {c->nx, c->ny, n, args, o1, NULL}, r2 = {c->nx, c->ny, n, args, o2, NULL};
    cr_assert_eq(sr_kernel_run_ex(gj, &r1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ex(gr, &r2), SR_OK, "%s", sr_ctx_error(ctx));
    double big = 0;
    for (int64_t t = 0; t < nout * od; t++)
        big = fmax(big, fabs(at(o2, c->dt, t)));
    double rtol = c->dt == SR_F64 ? 1e-11 : 3e-5;
    for (int64_t t = 0; t < nout * od; t++) {
        double a = at(o1, c->dt, t), e = at(o2, c->dt, t);
        cr_assert(fabs(a - e) <= rtol * (fabs(e) + big),
                  "form %d R %d %lldx%lld dt %d, gradient w.r.t. %d [row %lld, col %lld]: %.9g, "
                  "reference %.9g (largest %.3g)",
                  c->form, c->R, (long long)c->nx, (long long)c->ny, c->dt, v, (long long)(t / od),
                  (long long)(t % od), a, e, big);
    }
    for (int a = 0; a < 7; a++)
        free(arr[a]);
    free(o1);
    free(o2);
    sr_kernel_free(gj);
    sr_kernel_free(gr);
    sr_kernel_free(fj);
    sr_kernel_free(fr);
}

/* Every gradient of one forward kernel: attention's q, k, v; the Gaussian's x, y, b. */
static void all_grads(const struct gcase *c)
{
    static const int av[3] = {0, 1, 3}, gv[3] = {0, 1, 2};
    for (int t = 0; t < 3; t++)
        grad_case(c, c->form == ATTN ? av[t] : gv[t]);
}

#define CASE(name, ...)                                                                            \
    Test(wide_grad, name)                                                                          \
    {                                                                                              \
        struct gcase c = {__VA_ARGS__};                                                            \
        all_grads(&c);                                                                             \
    }

/* Attention: every width of v, float32, sizes no tile divides. */
CASE(attn_r1, ATTN, 1, 131, 257, SR_F32)
CASE(attn_r4, ATTN, 4, 131, 257, SR_F32)
CASE(attn_r15, ATTN, 15, 131, 257, SR_F32)
CASE(attn_r16, ATTN, 16, 131, 257, SR_F32)
CASE(attn_r17, ATTN, 17, 131, 257, SR_F32)
CASE(attn_r64, ATTN, 64, 509, 1031, SR_F32)
CASE(attn_r65, ATTN, 65, 131, 257, SR_F32)
/* float64, sizes 0, 1 and primes. */
CASE(attn_r64_f64, ATTN, 64, 263, 521, SR_F64)
CASE(attn_r17_f64, ATTN, 17, 37, 101, SR_F64)
CASE(attn_r64_one, ATTN, 64, 1, 1, SR_F32)
CASE(attn_r64_one_row, ATTN, 64, 1, 257, SR_F32)
CASE(attn_r64_no_rows, ATTN, 64, 0, 257, SR_F32)
CASE(attn_r64_no_cols, ATTN, 64, 131, 0, SR_F32)
/* The Gaussian mat-vec: every width of b. */
CASE(gauss_r1, GAUSS, 1, 131, 257, SR_F32)
CASE(gauss_r4, GAUSS, 4, 131, 257, SR_F32)
CASE(gauss_r15, GAUSS, 15, 131, 257, SR_F32)
CASE(gauss_r16, GAUSS, 16, 131, 257, SR_F32)
CASE(gauss_r17, GAUSS, 17, 131, 257, SR_F32)
CASE(gauss_r64, GAUSS, 64, 509, 1031, SR_F32)
CASE(gauss_r65, GAUSS, 65, 131, 257, SR_F32)
CASE(gauss_r64_f64, GAUSS, 64, 263, 521, SR_F64)
CASE(gauss_r16_f64, GAUSS, 16, 37, 101, SR_F64)
CASE(gauss_r64_one, GAUSS, 64, 1, 1, SR_F32)
CASE(gauss_r64_no_rows, GAUSS, 64, 0, 257, SR_F32)
CASE(gauss_r65_no_cols, GAUSS, 65, 131, 0, SR_F32)

/* The form A - B on its own: Sum of Exp(-SqDist(x, y) g) (x - y), the radial kernel's gradient
 * written as a forward, with x and y of D values: wider than the direct strategy's 64 values
 * per pair, so fused, with SqDist expanded for the gemm; D = 300 takes two passes over B's
 * columns. Against the reference, both axes. */
static void radial_case(int D, int axis)
{
    const int64_t nx = 67, ny = 131;
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D), *g = sr_pm(ctx, 2, 1);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g))),
                        axis == 1 ? sr_sub(ctx, x, y) : sr_sub(ctx, y, x));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.axis = axis;
    sr_kernel *kj, *kr;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kj), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    char fj[1024];
    if (have_gemm)
        cr_assert(tu_runs_fused(kj) && strstr(tu_formula(kj, fj, sizeof fj), "SqNorm2"), "%s",
                  sr_kernel_explain(kj));
    uint64_t s = 3 + (uint64_t)D;
    float *xa = fill(SR_F32, nx * D, 0.0, 0.1, &s), *ya = fill(SR_F32, ny * D, 0.0, 0.1, &s);
    float gv = 1.0f;
    const void *args[3] = {xa, ya, &gv};
    int64_t nout = axis == 1 ? nx : ny;
    float *o1 = calloc((size_t)(nout * D), 4), *o2 = calloc((size_t)(nout * D), 4);
    cr_assert_eq(sr_kernel_run(kj, nx, ny, args, o1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(kr, nx, ny, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    double big = 0;
    for (int64_t t = 0; t < nout * D; t++)
        big = fmax(big, fabs(o2[t]));
    for (int64_t t = 0; t < nout * D; t++)
        cr_assert(fabs(o1[t] - o2[t]) <= 1e-4 * big, "D %d axis %d [%lld]: %.9g, reference %.9g", D,
                  axis, (long long)t, o1[t], o2[t]);
    free(xa);
    free(ya);
    free(o1);
    free(o2);
    sr_kernel_free(kj);
    sr_kernel_free(kr);
}

Test(wide_grad, radial_d100) { radial_case(100, 1); }
Test(wide_grad, radial_d300_axis0) { radial_case(300, 0); }
