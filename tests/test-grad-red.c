/*
 * test-grad-red.c — gradients of reductions (sr_kernel_grad): every reduction, both axes,
 * with respect to a Vi, a Vj and a parameter variable, against central finite differences of
 * the forward reduction (reference backend, float64), run on the reference and the CPU JIT;
 * and the Gaussian mat-vec's gradients against brute-force double loops, float32 on the JIT.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(grad_red, .init = setup, .fini = teardown);

#define NV 4
static const char *const aliases[NV] = {"x=Vi(0,3)", "y=Vj(1,3)", "b=Vj(2,1)", "g=Pm(3,1)"};
static const int vdim[NV] = {3, 3, 1, 1};
static const sr_cat vcat[NV] = {SR_CAT_I, SR_CAT_J, SR_CAT_J, SR_CAT_PARAM};
enum { NX = 6, NY = 5, MAXV = 64 };

static sr_expr *parse(const char *s)
{
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, s, aliases, NV, &f), SR_OK, "%s: %s", s, sr_ctx_error(ctx));
    return f;
}

static int64_t rows(sr_cat c) { return c == SR_CAT_I ? NX : c == SR_CAT_J ? NY : 1; }

struct fwd {
    sr_expr *f, *w;
    sr_reduction red;
    int axis, k;
};

static sr_kernel *make(const struct fwd *c, sr_reduction red, sr_device dev)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = c->axis;
    d.k = c->k;
    d.weight = red == SR_SUMSOFTMAXWEIGHT ? c->w : NULL;
    d.dtype = SR_F64;
    d.device = dev;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, c->f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* Runs k on the reference-style arrays; vals and idx may be NULL. */
static void run(const sr_kernel *k, const void *const *args, int nargs, double *vals, int64_t *idx)
{
    sr_run_desc r = {.nx = NX, .ny = NY, .nargs = nargs, .args = args, .out = vals, .out_idx = idx};
    r.nargs = sr_kernel_nargs(k);
    cr_assert(r.nargs <= nargs);
    cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK, "%s", sr_ctx_error(ctx));
}

static bool has_values(sr_reduction r)
{
    return r != SR_ARGMIN && r != SR_ARGMAX && r != SR_ARGKMIN;
}

/* The reduction that also gives the indices a selecting reduction's gradient needs. */
static sr_reduction with_indices(sr_reduction r)
{
    switch (r) {
    case SR_MIN:
        return SR_MIN_ARGMIN;
    case SR_MAX:
        return SR_MAX_ARGMAX;
    case SR_KMIN:
        return SR_KMIN_ARGKMIN;
    default:
        return r;
    }
}

/* L = <G, forward values> at the arrays a (reference, float64). */
static double loss(const struct fwd *c, double *const *a, const double *G)
{
    sr_kernel *k = make(c, c->red, SR_DEVICE_REFERENCE);
    int64_t nout = c->axis == 1 ? NX : NY, n = nout * sr_kernel_out_dim(k);
    double *v = calloc((size_t)n, sizeof *v);
    int64_t *idx = calloc((size_t)n, sizeof *idx);
    run(k, (const void *const *)a, NV, v, idx);
    double s = 0.0;
    for (int64_t t = 0; t < n; t++)
        s += v[t] * G[t];
    free(v);
    free(idx);
    sr_kernel_free(k);
    return s;
}

static void check_case(const char *name, struct fwd *c)
{
    uint64_t seed = 1234;
    double *a[NV];
    for (int v = 0; v < NV; v++) {
        a[v] = malloc((size_t)(rows(vcat[v]) * vdim[v]) * sizeof **a);
        for (int64_t t = 0; t < rows(vcat[v]) * vdim[v]; t++)
            a[v][t] = tu_uniform(&seed, v == 3 ? 0.5 : -1.0, 1.0);
    }
    sr_kernel *fk = make(c, with_indices(c->red), SR_DEVICE_REFERENCE);
    int od = sr_kernel_out_dim(fk);
    int64_t nout = c->axis == 1 ? NX : NY, nred = c->axis == 1 ? NY : NX;
    double *G = malloc((size_t)(nout * od) * sizeof *G), *O = calloc((size_t)(nout * od), 8);
    double *aux = malloc((size_t)(NX > NY ? NX : NY) * sizeof *aux);
    int64_t *idx = calloc((size_t)(nout * od), sizeof *idx);
    for (int64_t t = 0; t < nout * od; t++)
        G[t] = tu_uniform(&seed, -1, 1);
    run(fk, (const void *const *)a, NV, has_values(c->red) ? O : NULL, idx);
    if (c->red != with_indices(c->red) || c->red == SR_MIN_ARGMIN || c->red == SR_MAX_ARGMAX ||
        c->red == SR_KMIN_ARGKMIN)
        for (int64_t t = 0; t < nout * od; t++)
            O[t] = (double)idx[t]; /* the contract: indices as values */
    for (int64_t t = 0; t < nred; t++)
        aux[t] = (double)t;
    if (c->red == SR_SUMSOFTMAXWEIGHT) { /* the log-normalizer */
        struct fwd l = *c;
        l.red = SR_LOGSUMEXP;
        sr_kernel *lk = make(&l, SR_LOGSUMEXP, SR_DEVICE_REFERENCE);
        run(lk, (const void *const *)a, NV, aux, NULL);
        sr_kernel_free(lk);
    }
    const void *args[NV + 3] = {a[0], a[1], a[2], a[3], G, O, aux};
    for (int v = 0; v < NV; v++) {
        for (int dev = 0; dev < 2; dev++) {
            sr_kernel *fwd = make(c, c->red, dev ? SR_DEVICE_CPU : SR_DEVICE_REFERENCE);
            sr_kernel *gk;
            cr_assert_eq(sr_kernel_grad(fwd, v, &gk), SR_OK, "%s: %s", name, sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_out_dim(gk), vdim[v]);
            bool reduced = vcat[v] == (c->axis == 1 ? SR_CAT_J : SR_CAT_I);
            int64_t grows = reduced ? nred : nout;
            double *got = calloc((size_t)(grows * vdim[v]), sizeof *got);
            run(gk, args, NV + 3, got, NULL);
            if (vcat[v] == SR_CAT_PARAM) /* the caller sums the rows */
                for (int64_t r = 1; r < grows; r++)
                    got[0] += got[r];
            int64_t n = vcat[v] == SR_CAT_PARAM ? 1 : rows(vcat[v]);
            for (int64_t t = 0; t < n * vdim[v]; t++) {
                double want = 0.0;
                if (has_values(c->red)) {
                    double x0 = a[v][t], h = 1e-6;
                    a[v][t] = x0 + h;
                    double up = loss(c, a, G);
                    a[v][t] = x0 - h;
                    double down = loss(c, a, G);
                    a[v][t] = x0;
                    want = (up - down) / (2 * h);
                }
                cr_expect(tu_close(got[t], want, 1e-6, 1e-6),
                          "%s axis %d, d/d%s [%lld] on %s: got %.12g, finite differences %.12g",
                          name, c->axis, aliases[v], (long long)t, dev ? "cpu" : "reference",
                          got[t], want);
            }
            free(got);
            sr_kernel_free(gk);
            sr_kernel_free(fwd);
        }
    }
    sr_kernel_free(fk);
    for (int v = 0; v < NV; v++)
        free(a[v]);
    free(G);
    free(O);
    free(aux);
    free(idx);
}

/* The forward values at the arrays a (reference, float64) into v (nout x out_dim). */
static void values(const struct fwd *c, double *const *a, double *v)
{
    sr_kernel *k = make(c, with_indices(c->red), SR_DEVICE_REFERENCE);
    int64_t n = (c->axis == 1 ? NX : NY) * sr_kernel_out_dim(k);
    int64_t *idx = calloc((size_t)n, sizeof *idx);
    run(k, (const void *const *)a, NV, v, idx);
    free(idx);
    sr_kernel_free(k);
}

/* sr_kernel_jvp along random tangents of the variables in mask, on the reference and the CPU
 * JIT, against central finite differences of the forward values along the same tangents. */
static void check_jvp(const char *name, const struct fwd *c, uint64_t mask)
{
    uint64_t seed = 4321;
    double *a[NV], *da[NV];
    for (int v = 0; v < NV; v++) {
        int64_t n = rows(vcat[v]) * vdim[v];
        a[v] = malloc((size_t)n * sizeof **a);
        da[v] = malloc((size_t)n * sizeof **da);
        for (int64_t t = 0; t < n; t++) {
            a[v][t] = tu_uniform(&seed, v == 3 ? 0.5 : -1.0, 1.0);
            da[v][t] = tu_uniform(&seed, -1.0, 1.0);
        }
    }
    sr_kernel *fk = make(c, with_indices(c->red), SR_DEVICE_REFERENCE);
    int od = sr_kernel_out_dim(fk);
    int64_t nout = c->axis == 1 ? NX : NY, nred = c->axis == 1 ? NY : NX, no = nout * od;
    double *O = calloc((size_t)no, sizeof *O), *aux = calloc((size_t)(NX + NY), sizeof *aux);
    double *up = calloc((size_t)no, sizeof *up), *down = calloc((size_t)no, sizeof *down);
    double *got = calloc((size_t)no, sizeof *got);
    int64_t *idx = calloc((size_t)no, sizeof *idx);
    run(fk, (const void *const *)a, NV, O, idx);
    if (c->red != SR_SUM && c->red != SR_LOGSUMEXP && c->red != SR_SUMSOFTMAXWEIGHT)
        for (int64_t t = 0; t < no; t++)
            O[t] = (double)idx[t];
    for (int64_t t = 0; t < nred; t++)
        aux[t] = (double)t;
    if (c->red == SR_SUMSOFTMAXWEIGHT) {
        struct fwd l = *c;
        l.red = SR_LOGSUMEXP;
        sr_kernel *lk = make(&l, SR_LOGSUMEXP, SR_DEVICE_REFERENCE);
        run(lk, (const void *const *)a, NV, aux, NULL);
        sr_kernel_free(lk);
    }
    double h = 1e-6, *shifted[NV];
    for (int s = 0; s < 2; s++) {
        for (int v = 0; v < NV; v++) {
            int64_t n = rows(vcat[v]) * vdim[v];
            shifted[v] = malloc((size_t)n * sizeof **shifted);
            for (int64_t t = 0; t < n; t++)
                shifted[v][t] = a[v][t] + ((mask >> v & 1) ? (s ? -h : h) * da[v][t] : 0.0);
        }
        values(c, shifted, s ? down : up);
        for (int v = 0; v < NV; v++)
            free(shifted[v]);
    }
    const void *args[2 * NV + 2] = {a[0], a[1], a[2], a[3]};
    for (int v = 0; v < NV; v++)
        args[NV + v] = (mask >> v & 1) ? da[v] : NULL;
    args[2 * NV] = O;
    args[2 * NV + 1] = aux;
    /* The CPU JIT (a compile per kernel) for the all-variables tangent only. */
    for (int dev = 0; dev < (mask == 0xf ? 2 : 1); dev++) {
        sr_kernel *fwd = make(c, c->red, dev ? SR_DEVICE_CPU : SR_DEVICE_REFERENCE), *jk;
        cr_assert_eq(sr_kernel_jvp(fwd, mask, &jk), SR_OK, "%s: %s", name, sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_out_dim(jk), od);
        run(jk, args, 2 * NV + 2, got, NULL);
        for (int64_t t = 0; t < no; t++) {
            double want = (up[t] - down[t]) / (2 * h);
            cr_expect(tu_close(got[t], want, 1e-6, 1e-6),
                      "%s axis %d, mask %#llx, [%lld] on %s: got %.12g, finite differences %.12g",
                      name, c->axis, (unsigned long long)mask, (long long)t,
                      dev ? "cpu" : "reference", got[t], want);
        }
        sr_kernel_free(jk);
        sr_kernel_free(fwd);
    }
    sr_kernel_free(fk);
    for (int v = 0; v < NV; v++)
        free(a[v]), free(da[v]);
    free(O), free(aux), free(up), free(down), free(got), free(idx);
}

/* The gradients (check_case) and, for reductions with values, the tangents along each
 * variable alone and all four together (check_jvp), on both axes. */
static void check_both_axes(const char *name, const char *f, const char *w, sr_reduction red, int k)
{
    for (int axis = 0; axis < 2; axis++) {
        struct fwd c = {parse(f), w ? parse(w) : NULL, red, axis, k};
        check_case(name, &c);
        if (!has_values(red))
            continue;
        for (int v = 0; v < NV; v++)
            check_jvp(name, &c, 1u << v);
        check_jvp(name, &c, 0xf);
    }
}

Test(grad_red, sum) { check_both_axes("Sum", "Exp(-SqDist(x,y)*g)*b", NULL, SR_SUM, 1); }
Test(grad_red, sum_vector)
{
    check_both_axes("Sum of a vector", "Exp(-SqDist(x,y)*g)*y*b", NULL, SR_SUM, 1);
}
Test(grad_red, logsumexp)
{
    check_both_axes("LogSumExp", "-SqDist(x,y)*g+b", NULL, SR_LOGSUMEXP, 1);
    check_both_axes("LogSumExp of a vector", "x*y*g+b", NULL, SR_LOGSUMEXP, 1);
}
Test(grad_red, sumsoftmaxweight)
{
    check_both_axes("SumSoftMaxWeight", "-SqDist(x,y)*g", "y*b+x", SR_SUMSOFTMAXWEIGHT, 1);
}
Test(grad_red, min_max)
{
    check_both_axes("Min", "SqDist(x,y)*g+b", NULL, SR_MIN, 1);
    check_both_axes("Max of a vector", "x*y*g+b", NULL, SR_MAX, 1);
    check_both_axes("Min_ArgMin", "SqDist(x,y)*g+b", NULL, SR_MIN_ARGMIN, 1);
    check_both_axes("Max_ArgMax", "(x|y)*g-b", NULL, SR_MAX_ARGMAX, 1);
}
Test(grad_red, kmin)
{
    check_both_axes("KMin", "SqDist(x,y)*g+b", NULL, SR_KMIN, 3);
    check_both_axes("KMin of a vector", "x*y*g+b", NULL, SR_KMIN_ARGKMIN, 2);
}
Test(grad_red, arg_reductions_are_zero)
{
    check_both_axes("ArgMin", "SqDist(x,y)*g+b", NULL, SR_ARGMIN, 1);
    check_both_axes("ArgKMin", "SqDist(x,y)*g+b", NULL, SR_ARGKMIN, 2);
}

/* Second derivatives: the gradient kernel's own gradient, against finite differences of it. */
Test(grad_red, gradient_of_a_gradient_kernel)
{
    struct fwd c = {parse("Exp(-SqDist(x,y)*g)*b"), NULL, SR_SUM, 1, 1};
    sr_kernel *fk = make(&c, SR_SUM, SR_DEVICE_REFERENCE), *gk, *hk;
    cr_assert_eq(sr_kernel_grad(fk, 0, &gk), SR_OK, "%s", sr_ctx_error(ctx));
    /* d/dg of sum_i <H_i, dL/dx_i>: the gradient kernel has 5 arrays, H is its args[5] */
    cr_assert_eq(sr_kernel_grad(gk, 3, &hk), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_nargs(gk), 5);
    uint64_t seed = 5;
    double x[NX * 3], y[NY * 3], b[NY], g = 0.7, G[NX], H[NX * 3], gx[2][NX * 3], h[NX];
    tu_fill(x, SR_F64, NX * 3, -1, 1, &seed);
    tu_fill(y, SR_F64, NY * 3, -1, 1, &seed);
    tu_fill(b, SR_F64, NY, -1, 1, &seed);
    tu_fill(G, SR_F64, NX, -1, 1, &seed);
    tu_fill(H, SR_F64, NX * 3, -1, 1, &seed);
    const void *args[6] = {x, y, b, &g, G, H};
    cr_assert_eq(sr_kernel_run(hk, NX, NY, args, h), SR_OK, "%s", sr_ctx_error(ctx));
    double got = 0.0, want = 0.0, eps = 1e-6;
    for (int i = 0; i < NX; i++)
        got += h[i];
    for (int s = 0; s < 2; s++) {
        g = 0.7 + (s ? -eps : eps);
        cr_assert_eq(sr_kernel_run(gk, NX, NY, args, gx[s]), SR_OK);
    }
    for (int t = 0; t < NX * 3; t++)
        want += H[t] * (gx[0][t] - gx[1][t]) / (2 * eps);
    cr_expect(tu_close(got, want, 1e-6, 1e-6), "got %.12g, finite differences %.12g", got, want);
    sr_kernel_free(hk);
    sr_kernel_free(gk);
    sr_kernel_free(fk);
}

/* The Gaussian mat-vec, float32 on the CPU JIT at a size with several tiles, against the
 * closed-form gradients written as double loops. */
Test(grad_red, gaussian_matvec_against_brute_force)
{
    enum { N = 300, M = 200 };
    static float x[N * 3], y[M * 3], b[M], G[N], got[N * 3 > M * 3 ? N * 3 : M * 3];
    float g = 0.8f;
    uint64_t seed = 99;
    tu_fill(x, SR_F32, N * 3, -1, 1, &seed);
    tu_fill(y, SR_F32, M * 3, -1, 1, &seed);
    tu_fill(b, SR_F32, M, -1, 1, &seed);
    tu_fill(G, SR_F32, N, -1, 1, &seed);
    static double wx[N * 3], wy[M * 3], wb[M], wg;
    memset(wx, 0, sizeof wx), memset(wy, 0, sizeof wy), memset(wb, 0, sizeof wb), wg = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++) {
            double d[3], r2 = 0;
            for (int c = 0; c < 3; c++)
                d[c] = (double)x[i * 3 + c] - y[j * 3 + c], r2 += d[c] * d[c];
            double kij = exp(-g * r2), t = G[i] * kij * b[j];
            for (int c = 0; c < 3; c++) {
                wx[i * 3 + c] += -2 * g * t * d[c];
                wy[j * 3 + c] += 2 * g * t * d[c];
            }
            wb[j] += G[i] * kij;
            wg += -t * r2;
        }
    sr_expr *f = parse("Exp(-SqDist(x,y)*g)*b");
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK);
    const void *args[5] = {x, y, b, &g, G};
    const double *want[NV] = {wx, wy, wb, &wg};
    for (int v = 0; v < NV; v++) {
        sr_kernel *gk;
        cr_assert_eq(sr_kernel_grad(k, v, &gk), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_run(gk, N, M, args, got), SR_OK, "%s", sr_ctx_error(ctx));
        int64_t n = v == 3 ? 1 : rows(vcat[v]) == NX ? N * vdim[v] : M * vdim[v];
        if (v == 3)
            for (int i = 1; i < N; i++)
                got[0] += got[i];
        for (int64_t t = 0; t < n; t++)
            cr_expect(tu_close(got[t], want[v][t], 1e-4, 1e-4), "d/d%s [%lld]: %.7g, want %.7g",
                      aliases[v], (long long)t, got[t], want[v][t]);
        sr_kernel_free(gk);
    }
    sr_kernel_free(k);
}

/* High dimension: vectors beyond the JIT's unrolling limit, and a D at which the Gaussian's
 * gradients with respect to b and g take the gemm-epilogue path (they depend on the pair only
 * through (x|y)); the gradient kernels on the JIT against the reference. */
Test(grad_red, high_dimension_jit_matches_reference)
{
    enum { D = 40, N = 70, M = 90 };
    const char *al[] = {"x=Vi(40)", "y=Vj(40)", "b=Vj(1)", "g=Pm(1)"};
    static const char *const formulas[] = {
        "Exp(-SqDist(x,y)*g)*b",
        "Exp(-SqDist(x,y)*g)*b+(Extract(Normalize(x-y),3,2)|Extract(y,0,2))"};
    static double x[N * D], y[M * D], b[M], G[N], got[2][M * D];
    double g = 0.05;
    uint64_t seed = 17;
    tu_fill(x, SR_F64, N * D, -1, 1, &seed);
    tu_fill(y, SR_F64, M * D, -1, 1, &seed);
    tu_fill(b, SR_F64, M, -1, 1, &seed);
    tu_fill(G, SR_F64, N, -1, 1, &seed);
    const void *args[5] = {x, y, b, &g, G};
    for (int i = 0; i < 2; i++) {
        sr_expr *f;
        cr_assert_eq(sr_parse(ctx, formulas[i], al, 4, &f), SR_OK, "%s", sr_ctx_error(ctx));
        for (int v = 0; v < 4; v++) {
            for (int dev = 0; dev < 2; dev++) {
                sr_kernel_desc d = sr_kernel_desc_default();
                d.dtype = SR_F64;
                d.device = dev ? SR_DEVICE_CPU : SR_DEVICE_REFERENCE;
                sr_kernel *k, *gk;
                cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert_eq(sr_kernel_grad(k, v, &gk), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert_eq(sr_kernel_run(gk, N, M, args, got[dev]), SR_OK, "%s",
                             sr_ctx_error(ctx));
                sr_kernel_free(gk);
                sr_kernel_free(k);
            }
            int64_t n = v == 0 ? N * D : v == 1 ? M * D : v == 2 ? M : N;
            for (int64_t t = 0; t < n; t++)
                cr_expect(tu_close(got[1][t], got[0][t], 1e-10, 1e-10),
                          "%s: d/d%s [%lld]: JIT %.15g, reference %.15g", formulas[i], al[v],
                          (long long)t, got[1][t], got[0][t]);
        }
    }
}

/* The tangent kernel of a gradient kernel: a second derivative, against finite differences of
 * the gradient kernel along the tangent of g. */
Test(grad_red, jvp_of_a_gradient_kernel)
{
    struct fwd c = {parse("Exp(-SqDist(x,y)*g)*b"), NULL, SR_SUM, 1, 1};
    sr_kernel *fk = make(&c, SR_SUM, SR_DEVICE_CPU), *gk, *jk;
    cr_assert_eq(sr_kernel_grad(fk, 1, &gk), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_jvp(gk, 1u << 3 | 1u << 0, &jk), SR_OK, "%s", sr_ctx_error(ctx));
    uint64_t seed = 8;
    double x[NX * 3], y[NY * 3], b[NY], g = 0.7, G[NX], dx[NX * 3], dg = 0.3;
    double got[NY * 3], gy[2][NY * 3];
    tu_fill(x, SR_F64, NX * 3, -1, 1, &seed);
    tu_fill(y, SR_F64, NY * 3, -1, 1, &seed);
    tu_fill(b, SR_F64, NY, -1, 1, &seed);
    tu_fill(G, SR_F64, NX, -1, 1, &seed);
    tu_fill(dx, SR_F64, NX * 3, -1, 1, &seed);
    int n = sr_kernel_nargs(gk);
    cr_assert_eq(n, 5);
    const void *args[10] = {x, y, b, &g, G, dx, NULL, NULL, &dg, NULL};
    cr_assert_eq(sr_kernel_run(jk, NX, NY, args, got), SR_OK, "%s", sr_ctx_error(ctx));
    double eps = 1e-6, x0[NX * 3];
    memcpy(x0, x, sizeof x);
    for (int s = 0; s < 2; s++) {
        double e = s ? -eps : eps;
        g = 0.7 + e * dg;
        for (int t = 0; t < NX * 3; t++)
            x[t] = x0[t] + e * dx[t];
        cr_assert_eq(sr_kernel_run(gk, NX, NY, args, gy[s]), SR_OK);
    }
    for (int t = 0; t < NY * 3; t++)
        cr_expect(tu_close(got[t], (gy[0][t] - gy[1][t]) / (2 * eps), 1e-6, 1e-6),
                  "[%d]: got %.12g, finite differences %.12g", t, got[t],
                  (gy[0][t] - gy[1][t]) / (2 * eps));
    sr_kernel_free(jk);
    sr_kernel_free(gk);
    sr_kernel_free(fk);
}

Test(grad_red, errors)
{
    struct fwd c = {parse("SqDist(x,y)"), NULL, SR_SUM, 1, 1};
    sr_kernel *k = make(&c, SR_SUM, SR_DEVICE_REFERENCE), *gk = (sr_kernel *)1;
    cr_expect_eq(sr_kernel_grad(NULL, 0, &gk), SR_EINVAL);
    cr_expect_null(gk);
    cr_expect_eq(sr_kernel_grad(k, 0, NULL), SR_EINVAL);
    cr_expect_eq(sr_kernel_grad(k, -1, &gk), SR_EINVAL);
    cr_expect_eq(sr_kernel_grad(k, 2, &gk), SR_EINVAL);
    cr_expect(strstr(sr_ctx_error(ctx), "index 2") != NULL, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
    /* an index in range but unused by the formula */
    c.f = parse("SqDist(x,x)*b");
    k = make(&c, SR_SUM, SR_DEVICE_REFERENCE);
    cr_expect_eq(sr_kernel_grad(k, 1, &gk), SR_EINVAL);
    cr_expect_eq(sr_kernel_grad(k, 2, &gk), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_free(gk);
    sr_kernel_free(k);
    /* sr_kernel_jvp */
    k = make(&c, SR_SUM, SR_DEVICE_REFERENCE);
    sr_kernel *jk = (sr_kernel *)1;
    cr_expect_eq(sr_kernel_jvp(NULL, 1, &jk), SR_EINVAL);
    cr_expect_null(jk);
    cr_expect_eq(sr_kernel_jvp(k, 1, NULL), SR_EINVAL);
    cr_expect_eq(sr_kernel_jvp(k, 0, &jk), SR_EINVAL);
    cr_expect_eq(sr_kernel_jvp(k, 1u << 1, &jk), SR_EINVAL); /* y is not used */
    cr_expect(strstr(sr_ctx_error(ctx), "index 1") != NULL, "%s", sr_ctx_error(ctx));
    cr_expect_eq(sr_kernel_jvp(k, (uint64_t)1 << 40, &jk), SR_EINVAL);
    sr_kernel_free(k);
    c.f = parse("SqDist(x,y)");
    k = make(&c, SR_ARGMIN, SR_DEVICE_REFERENCE);
    cr_expect_eq(sr_kernel_jvp(k, 1, &jk), SR_EINVAL);
    cr_expect(strstr(sr_ctx_error(ctx), "ArgMin") != NULL, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
}
