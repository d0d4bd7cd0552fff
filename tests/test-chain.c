/*
 * test-chain.c — sr_chain: products of kernel matrices and dense matrices, against the dense
 * products of the materialised matrices at small sizes; the order the DP picks on shapes where
 * each order wins; the errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(chain, .init = setup, .fini = teardown);

enum { DIM = 2 };

/* exp(-g |x - y|^2) with x = Vi(0, 2), y = Vj(1, 2), g = Pm(2, 1). */
static sr_expr *gauss(void)
{
    sr_expr *x = sr_vi(ctx, 0, DIM), *y = sr_vj(ctx, 1, DIM), *g = sr_pm(ctx, 2, 1);
    return sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, x, y), g)));
}

static double *pts(int64_t n, uint64_t *rng)
{
    double *p = malloc((size_t)n * DIM * sizeof *p);
    for (int64_t t = 0; t < n * DIM; t++)
        p[t] = tu_uniform(rng, -1, 1);
    return p;
}

static double *mat(int64_t r, int64_t c, uint64_t *rng)
{
    double *m = malloc((size_t)(r * c) * sizeof *m);
    for (int64_t t = 0; t < r * c; t++)
        m[t] = tu_uniform(rng, -1, 1);
    return m;
}

static double *kmat(const double *x, int64_t n, const double *y, int64_t m, double g)
{
    double *k = malloc((size_t)(n * m) * sizeof *k);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double d2 = 0;
            for (int c = 0; c < DIM; c++)
                d2 += (x[i * DIM + c] - y[j * DIM + c]) * (x[i * DIM + c] - y[j * DIM + c]);
            k[i * m + j] = exp(-g * d2);
        }
    return k;
}

static double *mm(const double *a, const double *b, int64_t m, int64_t k, int64_t n)
{
    double *o = calloc((size_t)(m * n), sizeof *o);
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < k; q++)
            for (int64_t j = 0; j < n; j++)
                o[i * n + j] += a[i * k + q] * b[q * n + j];
    return o;
}

static void assert_close(const double *got, const double *want, int64_t n, const char *what)
{
    for (int64_t t = 0; t < n; t++)
        cr_assert(fabs(got[t] - want[t]) <= 1e-10 * (1 + fabs(want[t])),
                  "%s: value %lld %.17g, "
                  "dense product %.17g",
                  what, (long long)t, got[t], want[t]);
}

/* The order sr_chain_order reports for planned chain c; the chain owns the string. The split
 * reported is the position of the last multiplication's operator at the outermost level. */
static const char *order_of(const sr_chain *c)
{
    sr_chain_order_info o = {.size = sizeof o};
    cr_assert_eq(sr_chain_order(c, &o), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(o.size, sizeof o);
    cr_assert_not_null(o.order);
    int depth = 0, factors = 0, split = 0;
    for (const char *p = o.order; *p; p++) {
        depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
        factors += *p == 'K' || *p == 'M';
        split = *p == '*' && depth == 1 ? factors : split;
    }
    cr_assert_eq(factors, o.factors, "%s", o.order);
    cr_assert_eq(split, o.split, "%s", o.order);
    return o.order;
}

Test(chain, k1_k2_v_w_matches_dense_product)
{
    uint64_t rng = 5;
    enum { N = 9, M = 7, P = 8, C = 3, E = 4 };
    double *x = pts(N, &rng), *y = pts(M, &rng), *z = pts(P, &rng), g1 = 0.7, g2 = 1.3;
    double *V = mat(P, C, &rng), *W = mat(C, E, &rng);
    sr_chain *c;
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), N, M, 3, (const void *[]){x, y, &g1}), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_chain_kernel(c, gauss(), M, P, 3, (const void *[]){y, z, &g2}), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_chain_dense(c, P, C, V), SR_OK);
    cr_assert_eq(sr_chain_dense(c, C, E, W), SR_OK);
    double out[N * E];
    cr_assert_eq(sr_chain_eval(c, out), SR_OK, "%s", sr_ctx_error(ctx));
    double *K1 = kmat(x, N, y, M, g1), *K2 = kmat(y, M, z, P, g2);
    double *a = mm(K1, K2, N, M, P), *b = mm(a, V, N, P, C), *want = mm(b, W, N, C, E);
    assert_close(out, want, N * E, sr_chain_explain(c));
    /* Both kernels are applied to dense operands: K1*(K2*...) in some form. */
    sr_chain_order_info o = {.size = sizeof o};
    cr_assert_eq(sr_chain_order(c, &o), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(o.factors == 4 && o.kernels == 2 && o.cost > 0, "%s", sr_chain_explain(c));
    cr_assert_null(strstr(o.order, "(K1*K2)"), "%s", sr_chain_explain(c));
    sr_chain_free(c);
    free(x), free(y), free(z), free(V), free(W), free(K1), free(K2), free(a), free(b), free(want);
}

Test(chain, dense_on_the_left_float32)
{
    /* U · K · V with U 2 x N: U K is computed as (Kᵀ Uᵀ)ᵀ by a reduction over i. */
    uint64_t rng = 9;
    enum { R = 2, N = 6, M = 5, C = 4 };
    double *x = pts(N, &rng), *y = pts(M, &rng), *U = mat(R, N, &rng), *V = mat(M, C, &rng);
    float xf[N * DIM], yf[M * DIM], Uf[R * N], Vf[M * C], g = 0.9f, out[R * C];
    for (int t = 0; t < N * DIM; t++)
        xf[t] = (float)x[t];
    for (int t = 0; t < M * DIM; t++)
        yf[t] = (float)y[t];
    for (int t = 0; t < R * N; t++)
        Uf[t] = (float)U[t];
    for (int t = 0; t < M * C; t++)
        Vf[t] = (float)V[t];
    sr_chain *c;
    cr_assert_eq(sr_chain_new(ctx, SR_F32, &c), SR_OK);
    cr_assert_eq(sr_chain_dense(c, R, N, Uf), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), N, M, 3, (const void *[]){xf, yf, &g}), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_chain_dense(c, M, C, Vf), SR_OK);
    cr_assert_eq(sr_chain_eval(c, out), SR_OK, "%s", sr_ctx_error(ctx));
    double *K = kmat(x, N, y, M, 0.9f), *a = mm(U, K, R, N, M), *want = mm(a, V, R, M, C);
    for (int t = 0; t < R * C; t++)
        cr_assert(fabs(out[t] - want[t]) <= 1e-4 * (1 + fabs(want[t])), "value %d: %g vs %g\n%s", t,
                  out[t], want[t], sr_chain_explain(c));
    /* R = 2 < C = 4: (U*K) first is cheaper. */
    cr_assert_str_eq(order_of(c), "((M1*K2)*M3)", "%s", sr_chain_explain(c));
    sr_chain_free(c);
    free(x), free(y), free(U), free(V), free(K), free(a), free(want);
}

/* The order chosen for K (n x n) · V (n x c1) · W (c1 x c2). */
static const char *order_kvw(int64_t n, int64_t c1, int64_t c2, char *buf, size_t cap)
{
    static double dummy[1];
    sr_chain *c;
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), n, n, 3, (const void *[]){dummy, dummy, dummy}), SR_OK,
                 "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_chain_dense(c, n, c1, dummy), SR_OK);
    cr_assert_eq(sr_chain_dense(c, c1, c2, dummy), SR_OK);
    cr_assert_eq(sr_chain_plan(c), SR_OK, "%s", sr_ctx_error(ctx));
    snprintf(buf, cap, "%s", order_of(c));
    sr_chain_free(c);
    return buf;
}

Test(chain, order_follows_the_shapes)
{
    char b[128];
    /* V narrow, W wide: apply K to V (1 column), then W. */
    cr_assert_str_eq(order_kvw(100000, 1, 50, b, sizeof b), "((K1*M2)*M3)");
    /* V wide, W narrow: V*W first (1 column), then K. */
    cr_assert_str_eq(order_kvw(100000, 50, 1, b, sizeof b), "(K1*(M2*M3))");
}

Test(chain, order_of_two_kernels)
{
    /* K1 (n x m) · K2 (m x p) · v: only K1*(K2*v) avoids materialising a kernel. */
    static double d[1];
    sr_chain *c;
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), 1000, 2000, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), 2000, 3000, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_dense(c, 3000, 1, d), SR_OK);
    cr_assert_eq(sr_chain_plan(c), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_str_eq(order_of(c), "(K1*(K2*M3))", "%s", sr_chain_explain(c));
    sr_chain_free(c);
    /* u · K1 · K2 with u 1 x n: from the left. */
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    cr_assert_eq(sr_chain_dense(c, 1, 1000, d), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), 1000, 2000, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), 2000, 3000, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_plan(c), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_str_eq(order_of(c), "((M1*K2)*K3)", "%s", sr_chain_explain(c));
    sr_chain_free(c);
}

Test(chain, errors)
{
    static double d[4];
    sr_chain *c;
    cr_assert_eq(sr_chain_new(ctx, (sr_dtype)7, &c), SR_EINVAL);
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    /* kernels only: would materialise */
    cr_assert_eq(sr_chain_kernel(c, gauss(), 3, 4, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_kernel(c, gauss(), 4, 2, 3, (const void *[]){d, d, d}), SR_OK);
    cr_assert_eq(sr_chain_plan(c), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "dense factor"), "%s", sr_ctx_error(ctx));
    /* not planned: no order, *o not written */
    sr_chain_order_info o = {.size = sizeof o};
    cr_assert_eq(sr_chain_order(c, &o), SR_EINVAL);
    cr_assert(o.size == sizeof o && !o.order);
    cr_assert_eq(sr_chain_order(c, NULL), SR_EINVAL);
    cr_assert_eq(sr_chain_order(NULL, &o), SR_EINVAL);
    /* size mismatch */
    cr_assert_eq(sr_chain_dense(c, 3, 1, d), SR_EDIM);
    /* wrong argument count, vector formula */
    cr_assert_eq(sr_chain_kernel(c, gauss(), 2, 2, 2, (const void *[]){d, d}), SR_EINVAL);
    cr_assert_eq(sr_chain_kernel(c, sr_vi(ctx, 0, 2), 2, 2, 1, (const void *[]){d}), SR_EDIM);
    sr_chain_free(c);
    cr_assert_eq(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    double out[4];
    cr_assert_eq(sr_chain_eval(c, out), SR_EINVAL); /* empty */
    /* one dense factor: a copy */
    double m[4] = {1, 2, 3, 4};
    cr_assert_eq(sr_chain_dense(c, 2, 2, m), SR_OK);
    cr_assert_eq(sr_chain_eval(c, out), SR_OK);
    cr_assert(out[0] == 1 && out[3] == 4);
    cr_assert_str_eq(order_of(c), "M1");
    /* a size below the struct's first version: refused */
    o.size = offsetof(sr_chain_order_info, cost);
    cr_assert_eq(sr_chain_order(c, &o), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "info->size"), "%s", sr_ctx_error(ctx));
    sr_chain_free(c);
}
