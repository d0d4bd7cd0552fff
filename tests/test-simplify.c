/*
 * test-simplify.c — the algebraic simplifier (src/formulas): each rule fires on its pattern and
 * not on near-misses, the naive spellings become the canonical ops, folding is exact, the
 * result is a fixed point, and — differentially — the reference interpreter gives the same
 * values (and the same NaN/Inf class) on the original and on the simplified formula.
 *
 * The reference backend interprets the formula as the user passed it (k->simp.f_user), so the
 * differential tests simplify with simp_expr themselves and give the reference, with
 * SYMRED_SIMPLIFY=0, the original and the simplified formula as two separate kernels. Criterion
 * runs each test in its own process, so setting the variable in a test does not leak.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"
#include "core/core.h"
#include "formulas/formulas.h"

static sr_ctx *ctx;
static void setup(void)
{
    unsetenv("SYMRED_SIMPLIFY");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(simplify, .init = setup, .fini = teardown);

/* x = Vi(3) index 0, y = Vj(3) index 1, p = Pm(1) index 2, b = Vj(1) index 3,
 * s = Vi(1) index 4, w = Vj(3) index 5. */
#define X    sr_vi(ctx, 0, 3)
#define Y    sr_vj(ctx, 1, 3)
#define P    sr_pm(ctx, 2, 1)
#define B    sr_vj(ctx, 3, 1)
#define S    sr_vi(ctx, 4, 1)
#define W    sr_vj(ctx, 5, 3)
#define I(n) sr_intcst(ctx, n)

static sr_expr *simp(sr_expr *f)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    sr_expr *out = NULL;
    simp_expr(ctx, f, NULL, &out, NULL);
    cr_assert_not_null(out);
    return out;
}

static const char *pr(const sr_expr *e)
{
    static char buf[4][1024];
    static int which;
    which = (which + 1) % 4;
    sr_expr_print(e, buf[which], sizeof buf[which]);
    return buf[which];
}

/* The log of simplifying f: which rules fired. */
static char *simp_log(sr_expr *f)
{
    struct expr_buf b = {0};
    sr_expr *out;
    simp_expr(ctx, f, NULL, &out, &b);
    return b.data ? b.data : strdup("");
}

#define assert_simp(f, expected)                                                                   \
    do {                                                                                           \
        sr_expr *got_ = simp(f), *exp_ = simp(expected);                                           \
        cr_assert_eq(got_, exp_, "simplified to %s, expected %s", pr(got_), pr(exp_));             \
    } while (0)

#define assert_unchanged(f)                                                                        \
    do {                                                                                           \
        sr_expr *f_ = (f), *got_ = simp(f_);                                                       \
        char *log_ = simp_log(f_);                                                                 \
        cr_assert(strstr(log_, "pass identities") == NULL && strstr(log_, "pass match") == NULL,   \
                  "%s: no identity or match rule should fire, got:\n%s", pr(f_), log_);            \
        (void)got_;                                                                                \
        free(log_);                                                                                \
    } while (0)

static void assert_fires(sr_expr *f, const char *rule)
{
    char *log = simp_log(f);
    cr_assert(strstr(log, rule) != NULL, "rule %s should fire on %s; log:\n%s", rule, pr(f), log);
    free(log);
}
static void assert_not_fires(sr_expr *f, const char *rule)
{
    char *log = simp_log(f);
    cr_assert(strstr(log, rule) == NULL, "rule %s must not fire on %s; log:\n%s", rule, pr(f), log);
    free(log);
}

/* ---- differential evaluation ---- */

#define NI 6
#define NJ 5

struct data {
    double x[NI * 3], s[NI], y[NJ * 3], b[NJ], w[NJ * 3], p[1];
};

/* Inputs: moderate values, or (special) a sprinkling of NaN, +-Inf and zeros. */
static void fill(struct data *d, uint64_t *rng, bool special)
{
    double *arrs[] = {d->x, d->s, d->y, d->b, d->w, d->p};
    int lens[] = {NI * 3, NI, NJ * 3, NJ, NJ * 3, 1};
    for (int a = 0; a < 6; a++)
        for (int t = 0; t < lens[a]; t++) {
            double v = tu_uniform(rng, -2.0, 2.0);
            if (a == 5)
                v = tu_uniform(rng, 0.25, 1.5);
            if (special) {
                int r = (int)(tu_rand(rng) % 12);
                v = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? 0.0 : v;
            }
            arrs[a][t] = v;
        }
}

/* F at every pair (i, j): out[(i*NJ + j)*dim + c]. Each pair is its own Sum over one j. */
static int eval_pairs(sr_expr *f, const struct data *d, bool simplified, double *out, int cap)
{
    if (simplified)
        f = simp(f);
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", NULL);
    int dim = sr_kernel_out_dim(k), nargs = sr_kernel_nargs(k);
    cr_assert(NI * NJ * dim <= cap);
    double row[64];
    for (int j = 0; j < NJ; j++) {
        const void *args[6] = {d->x, d->y + 3 * j, d->p, d->b + j, d->s, d->w + 3 * j};
        cr_assert_eq(sr_kernel_run(k, NI, 1, args, row), SR_OK, "%s", sr_ctx_error(ctx));
        (void)nargs;
        for (int i = 0; i < NI; i++)
            for (int c = 0; c < dim; c++)
                out[(i * NJ + j) * dim + c] = row[i * dim + c];
    }
    sr_kernel_free(k);
    return NI * NJ * dim;
}

static int vclass(double v) { return isnan(v) ? 3 : isinf(v) ? (v > 0 ? 1 : 2) : 0; }

/* Same NaN/Inf class everywhere and close values where finite; returns the first bad index or
 * -1. */
static int compare(const double *a, const double *b, int n, double tol)
{
    for (int t = 0; t < n; t++) {
        if (vclass(a[t]) != vclass(b[t]))
            return t;
        if (!vclass(a[t]) && fabs(a[t] - b[t]) > tol * (1.0 + fabs(b[t])))
            return t;
    }
    return -1;
}

static void check_same_values(sr_expr *f, bool special, uint64_t seed)
{
    static double o1[4096], o2[4096];
    struct data d;
    uint64_t rng = seed;
    fill(&d, &rng, special);
    int n = eval_pairs(f, &d, false, o1, 4096);
    eval_pairs(f, &d, true, o2, 4096);
    int bad = compare(o2, o1, n, 1e-9);
    cr_assert(bad < 0, "%s -> %s: value %d is %g simplified, %g as given", pr(f), pr(simp(f)), bad,
              bad >= 0 ? o2[bad] : 0.0, bad >= 0 ? o1[bad] : 0.0);
}

/* ---- folding ---- */

Test(simplify, fold_integers_exact)
{
    assert_simp(sr_add(ctx, I(2), I(3)), I(5));
    assert_simp(sr_mul(ctx, sr_sub(ctx, I(7), I(10)), I(4)), I(-12));
    assert_simp(sr_pow(ctx, I(3), 4), I(81));
    assert_simp(sr_neg(ctx, I(5)), I(-5));
}

Test(simplify, fold_rationals_exact)
{
    assert_simp(sr_add(ctx, sr_ratcst(ctx, 1, 3), sr_ratcst(ctx, 2, 3)), I(1));
    assert_simp(sr_div(ctx, I(1), I(3)), sr_ratcst(ctx, 1, 3));
    assert_simp(sr_mul(ctx, sr_ratcst(ctx, 2, 7), sr_ratcst(ctx, 7, 4)), sr_ratcst(ctx, 1, 2));
    assert_simp(sr_inv(ctx, sr_ratcst(ctx, -2, 5)), sr_ratcst(ctx, -5, 2));
    assert_simp(sr_pow(ctx, sr_ratcst(ctx, 1, 2), -3), I(8));
    /* 1/3 + 1/3 + 1/3 is exactly 1 as rationals (in doubles it is not). */
    sr_expr *t = sr_ratcst(ctx, 1, 3);
    assert_simp(sr_add(ctx, sr_add(ctx, t, t), t), I(1));
}

Test(simplify, fold_reals_and_overflow)
{
    assert_simp(sr_exp(ctx, I(0)), I(1));
    assert_simp(sr_mul(ctx, sr_const(ctx, 0.5), I(3)), sr_const(ctx, 1.5));
    /* INT64_MAX + 1 overflows as an integer: folded in double, not wrapped around. */
    sr_expr *big = simp(sr_add(ctx, I(INT64_MAX), I(1)));
    cr_assert_eq(big->op, OP_CST, "got %s", pr(big));
    cr_assert_eq(big->fattr, 9223372036854775808.0, "got %s", pr(big));
}

Test(simplify, fold_keeps_non_finite_and_negative_zero)
{
    /* Log(0) = -inf and 1/0 = inf are not constants symred can hold: left as computations. */
    sr_expr *l = sr_log(ctx, I(0));
    cr_assert_eq(simp(l), l, "got %s", pr(simp(l)));
    sr_expr *d = sr_div(ctx, I(1), I(0));
    cr_assert_eq(simp(d)->op, OP_DIV, "got %s", pr(simp(d)));
    /* -0.0 is not folded to +0: Inv(-(0)) must stay -inf. */
    sr_expr *nz = sr_inv(ctx, sr_neg(ctx, sr_const(ctx, 0.0)));
    cr_assert_neq(simp(nz)->op, OP_INTCST);
}

Test(simplify, fold_constant_subtrees_inside_formulas)
{
    sr_expr *f = sr_mul(ctx, sr_mul(ctx, X, I(2)), I(3)); /* (x*2)*3 -> 6*x */
    assert_simp(f, sr_mul(ctx, I(6), X));
    assert_fires(f, "fold-const");
}

/* ---- canonical order ---- */

Test(simplify, commutative_operands_sorted)
{
    assert_simp(sr_add(ctx, X, Y), sr_add(ctx, Y, X));
    assert_simp(sr_mul(ctx, sr_mul(ctx, X, Y), P), sr_mul(ctx, P, sr_mul(ctx, Y, X)));
    assert_simp(sr_add(ctx, sr_add(ctx, X, sr_add(ctx, Y, P)), S),
                sr_add(ctx, sr_add(ctx, S, P), sr_add(ctx, Y, X)));
    assert_simp(sr_scalprod(ctx, X, Y), sr_scalprod(ctx, Y, X));
    assert_simp(sr_sqdist(ctx, X, Y), sr_sqdist(ctx, Y, X));
}

Test(simplify, canonical_order_does_not_depend_on_creation_order)
{
    /* Two contexts create the same nodes in opposite orders (so with different ids); the
     * printed simplified formulas must agree. */
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_expr *p2 = sr_pm(c2, 2, 1), *y2 = sr_vj(c2, 1, 3), *x2 = sr_vi(c2, 0, 3);
    sr_expr *f2 = sr_add(c2, sr_mul(c2, sr_exp(c2, x2), p2), sr_sin(c2, y2));
    sr_expr *f1 = sr_add(ctx, sr_sin(ctx, Y), sr_mul(ctx, P, sr_exp(ctx, X)));
    sr_expr *s2;
    simp_expr(c2, f2, NULL, &s2, NULL);
    char a[512], b[512];
    sr_expr_print(simp(f1), a, sizeof a);
    sr_expr_print(s2, b, sizeof b);
    cr_assert_str_eq(a, b);
    sr_ctx_free(c2);
}

Test(simplify, signs_move_outward)
{
    assert_simp(sr_mul(ctx, sr_neg(ctx, X), Y), sr_neg(ctx, sr_mul(ctx, X, Y)));
    assert_simp(sr_add(ctx, X, sr_neg(ctx, Y)), sr_sub(ctx, X, Y));
    assert_simp(sr_sub(ctx, X, sr_neg(ctx, Y)), sr_add(ctx, X, Y));
    assert_simp(sr_neg(ctx, sr_neg(ctx, X)), X);
    assert_fires(sr_neg(ctx, sr_neg(ctx, X)), "neg-neg");
}

Test(simplify, division_by_exact_constant)
{
    assert_simp(sr_div(ctx, X, I(4)), sr_mul(ctx, sr_ratcst(ctx, 1, 4), X));
    assert_fires(sr_div(ctx, X, I(4)), "div-const");
    /* A real constant divisor is kept (its reciprocal is not exact). */
    assert_not_fires(sr_div(ctx, X, sr_const(ctx, 0.3)), "div-const");
}

/* ---- identities ---- */

Test(simplify, add_zero_and_mul_one)
{
    assert_simp(sr_add(ctx, X, I(0)), X);
    assert_simp(sr_mul(ctx, I(1), X), X);
    assert_simp(sr_div(ctx, X, I(1)), X);
    assert_simp(sr_sub(ctx, X, I(0)), X);
    assert_simp(sr_sub(ctx, I(0), X), sr_neg(ctx, X));
    assert_simp(sr_mul(ctx, X, I(-1)), sr_neg(ctx, X));
    assert_fires(sr_add(ctx, X, I(0)), "add-zero");
    assert_fires(sr_mul(ctx, I(1), X), "mul-one");
    /* near misses */
    assert_not_fires(sr_add(ctx, X, I(1)), "add-zero");
    assert_not_fires(sr_mul(ctx, X, I(2)), "mul-one");
}

Test(simplify, mul_zero_only_where_no_nan_can_hide)
{
    /* x may be NaN or infinite (user data): x*0 is not 0. */
    assert_not_fires(sr_mul(ctx, S, I(0)), "mul-zero");
    assert_not_fires(sr_mul(ctx, sr_exp(ctx, P), I(0)), "mul-zero");
    /* A comparison is 0 or 1 whatever its inputs: Less(s,b)*0 is 0. */
    sr_expr *f = sr_mul(ctx, sr_less(ctx, S, B), I(0));
    assert_fires(f, "mul-zero");
    assert_simp(f, I(0));
    /* ... but not for a vector (0 has dimension 1). */
    assert_not_fires(sr_mul(ctx, sr_less(ctx, X, Y), I(0)), "mul-zero");
}

Test(simplify, sub_self_guarded)
{
    assert_not_fires(sr_sub(ctx, S, S), "sub-self");
    sr_expr *c = sr_sin(ctx, sr_greater(ctx, S, B));
    assert_fires(sr_sub(ctx, c, c), "sub-self");
    assert_simp(sr_sub(ctx, c, c), I(0));
}

Test(simplify, squares_and_roots)
{
    assert_simp(sr_square(ctx, sr_neg(ctx, X)), sr_square(ctx, X));
    assert_simp(sr_square(ctx, sr_abs(ctx, X)), sr_square(ctx, X));
    assert_simp(sr_mul(ctx, X, X), sr_square(ctx, X));
    assert_fires(sr_mul(ctx, X, X), "mul-self");
    /* Sqrt(x)^2 -> x on a non-negative operand only. */
    sr_expr *n = sr_exp(ctx, S);
    assert_simp(sr_square(ctx, sr_sqrt(ctx, n)), n);
    assert_fires(sr_square(ctx, sr_sqrt(ctx, n)), "sqrt-square");
    assert_simp(sr_square(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, X))), sr_sqnorm2(ctx, X));
    assert_not_fires(sr_square(ctx, sr_sqrt(ctx, S)), "sqrt-square");
    assert_simp(sr_sqrt(ctx, sr_sqnorm2(ctx, X)), sr_norm2(ctx, X));
    assert_simp(sr_sqrt(ctx, sr_square(ctx, S)), sr_abs(ctx, S));
    assert_simp(sr_abs(ctx, sr_exp(ctx, S)), sr_exp(ctx, S));
}

Test(simplify, exp_and_log)
{
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, P), sr_exp(ctx, sr_sin(ctx, P)));
    assert_fires(f, "exp-mul");
    assert_simp(f, sr_exp(ctx, sr_add(ctx, P, sr_sin(ctx, P))));
    /* An i-only exponential stays apart from a pair one: it is hoisted instead. */
    assert_not_fires(sr_mul(ctx, sr_exp(ctx, S), sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y)))),
                     "exp-mul");
    assert_simp(sr_log(ctx, sr_exp(ctx, X)), X);
    assert_fires(sr_log(ctx, sr_exp(ctx, X)), "log-exp");
    assert_not_fires(sr_exp(ctx, sr_log(ctx, X)), "log-exp");
}

Test(simplify, complex_identities)
{
    sr_expr *z = sr_concat(ctx, X, Y); /* three complex numbers */
    assert_fires(sr_conj(ctx, sr_conj(ctx, z)), "conj-conj");
    assert_simp(sr_conj(ctx, sr_conj(ctx, z)), z);
    assert_simp(sr_complex_real(ctx, sr_real2complex(ctx, X)), X);
    assert_simp(sr_complex_imag(ctx, sr_imag2complex(ctx, Y)), Y);
    assert_not_fires(sr_complex_imag(ctx, sr_real2complex(ctx, X)), "real-real2complex");
    assert_not_fires(sr_complex_real(ctx, sr_imag2complex(ctx, X)), "imag-imag2complex");
    /* |z| and |z|^2 are never negative (NaN aside): Abs of them goes */
    assert_simp(sr_abs(ctx, sr_complex_abs(ctx, z)), sr_complex_abs(ctx, z));
    assert_simp(sr_square(ctx, sr_sqrt(ctx, sr_complex_squareabs(ctx, z))),
                sr_complex_squareabs(ctx, z));
    /* values unchanged, NaN and Inf inputs included */
    sr_expr *f =
        sr_add(ctx, sr_complex_real(ctx, sr_conj(ctx, sr_conj(ctx, sr_real2complex(ctx, X)))),
               sr_abs(ctx, sr_complex_abs(ctx, sr_complex_mult(ctx, z, sr_conj(ctx, z)))));
    check_same_values(f, false, 5);
    check_same_values(f, true, 6);
}

Test(simplify, powers)
{
    assert_simp(sr_pow(ctx, X, 2), sr_square(ctx, X));
    assert_simp(sr_pow(ctx, X, 1), X);
    assert_simp(sr_pow(ctx, S, 0), I(1));
    assert_simp(sr_pow(ctx, X, -1), sr_inv(ctx, X));
    assert_simp(sr_powf(ctx, X, I(2)), sr_square(ctx, X));
    assert_simp(sr_powf(ctx, sr_sqnorm2(ctx, X), sr_ratcst(ctx, 1, 2)), sr_norm2(ctx, X));
    assert_fires(sr_powf(ctx, sr_sqnorm2(ctx, X), sr_ratcst(ctx, 1, 2)), "powf-const");
    /* pow(-inf, 0.5) = +inf but sqrt(-inf) = NaN: not for an operand that may be -inf. */
    assert_not_fires(sr_powf(ctx, S, sr_ratcst(ctx, 1, 2)), "powf-const");
    assert_not_fires(sr_pow(ctx, X, 3), "pow-small");
}

/* ---- match-and-replace ---- */

Test(simplify, naive_sqdist)
{
    sr_expr *f = sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, Y)));
    assert_simp(f, sr_sqdist(ctx, X, Y));
    assert_fires(f, "sum-sqdist");
    char buf[256];
    sr_expr_print(simp(f), buf, sizeof buf);
    cr_assert(strncmp(buf, "SqDist(", 7) == 0, "printed %s", buf);
}

Test(simplify, naive_sqdist_product_spelling)
{
    sr_expr *d = sr_sub(ctx, X, Y);
    assert_simp(sr_sum(ctx, sr_mul(ctx, d, d)), sr_sqdist(ctx, X, Y));
    assert_simp(sr_sqnorm2(ctx, d), sr_sqdist(ctx, X, Y));
}

Test(simplify, naive_scalprod)
{
    sr_expr *f = sr_sum(ctx, sr_mul(ctx, X, Y));
    assert_simp(f, sr_scalprod(ctx, X, Y));
    assert_fires(f, "sum-scalprod");
    assert_simp(sr_sum(ctx, sr_mul(ctx, X, X)), sr_sqnorm2(ctx, X));
    assert_simp(sr_scalprod(ctx, X, X), sr_sqnorm2(ctx, X));
}

Test(simplify, naive_norm2_of_diff)
{
    sr_expr *f = sr_sqrt(ctx, sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, Y))));
    assert_simp(f, sr_norm2(ctx, sr_sub(ctx, X, Y)));
    assert_fires(f, "sqrt-sqdist");
    char buf[256];
    sr_expr_print(simp(f), buf, sizeof buf);
    cr_assert(strncmp(buf, "Norm2(", 6) == 0, "printed %s", buf);
}

Test(simplify, naive_weighted_sqdist)
{
    sr_expr *f = sr_sum(ctx, sr_mul(ctx, sr_square(ctx, sr_sub(ctx, X, Y)), W));
    assert_simp(f, sr_weightedsqdist(ctx, W, X, Y));
    assert_fires(f, "sum-wsqdist");
    /* a scalar weight is the isotropic WeightedSqDist */
    sr_expr *g = sr_sum(ctx, sr_mul(ctx, B, sr_square(ctx, sr_sub(ctx, X, Y))));
    assert_simp(g, sr_weightedsqdist(ctx, B, X, Y));
    assert_simp(sr_sum(ctx, sr_mul(ctx, sr_square(ctx, X), W)), sr_weightedsqnorm(ctx, W, X));
}

Test(simplify, naive_spellings_near_misses)
{
    /* x - s has dimension 3 but s is a broadcast scalar: not a SqDist of x and s. */
    assert_not_fires(sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, S))), "sum-sqdist");
    /* Sum(x*p) with scalar p is not a scalar product. */
    assert_not_fires(sr_sum(ctx, sr_mul(ctx, X, P)), "sum-scalprod");
    /* Sum(Square(x) - y) is not a norm. */
    assert_not_fires(sr_sum(ctx, sr_sub(ctx, sr_square(ctx, X), Y)), "sum-sqnorm");
    /* Sum(Square(x+y)) is not a distance. */
    assert_not_fires(sr_sum(ctx, sr_square(ctx, sr_add(ctx, X, Y))), "sum-sqdist");
}

Test(simplify, normalize_scalprod)
{
    sr_expr *f = sr_scalprod(ctx, sr_normalize(ctx, X), sr_normalize(ctx, Y));
    assert_fires(f, "scalprod-normalize");
    sr_expr *rx = sr_rsqrt(ctx, sr_sqnorm2(ctx, X)), *ry = sr_rsqrt(ctx, sr_sqnorm2(ctx, Y));
    assert_simp(f, sr_mul(ctx, sr_mul(ctx, sr_scalprod(ctx, X, Y), rx), ry));
}

/* ---- the cost-guarded rewrite ---- */

Test(simplify, division_by_one_sided_terms)
{
    /* Naive cosine similarity: the norms become hoisted reciprocals. */
    sr_expr *f = sr_div(ctx, sr_sum(ctx, sr_mul(ctx, X, Y)),
                        sr_mul(ctx, sr_norm2(ctx, X), sr_norm2(ctx, Y)));
    assert_fires(f, "div-onesided");
    sr_expr *want = sr_mul(ctx, sr_mul(ctx, sr_scalprod(ctx, X, Y), sr_inv(ctx, sr_norm2(ctx, X))),
                           sr_inv(ctx, sr_norm2(ctx, Y)));
    assert_simp(f, want);
    check_same_values(f, false, 11);
    check_same_values(f, true, 12);
    sr_expr *g = sr_div(ctx, sr_sqdist(ctx, X, Y), sr_add(ctx, S, P));
    assert_fires(g, "div-onesided");
    check_same_values(g, false, 13);
    check_same_values(g, true, 14);
    /* near misses: a pair denominator, a one-sided quotient */
    assert_not_fires(sr_div(ctx, S, sr_sqdist(ctx, X, Y)), "div-onesided");
    assert_not_fires(sr_div(ctx, sr_sqdist(ctx, X, Y), sr_mul(ctx, S, sr_scalprod(ctx, X, Y))),
                     "div-onesided");
    assert_not_fires(sr_div(ctx, S, sr_norm2(ctx, X)), "div-onesided");
}

Test(simplify, sqdist_gemm_only_for_large_dimension)
{
    sr_expr *x64 = sr_vi(ctx, 0, 64), *y64 = sr_vj(ctx, 1, 64);
    sr_expr *f = sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x64, y64)));
    assert_fires(f, "sqdist-gemm");
    sr_expr *g = simp(f);
    char buf[512];
    sr_expr_print(g, buf, sizeof buf);
    cr_assert(strstr(buf, "SqNorm2(") && strstr(buf, "|"), "printed %s", buf);
    cr_assert(strstr(buf, "SqDist") == NULL, "printed %s", buf);
    /* D = 3: the direct form is cheaper. */
    assert_not_fires(sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y))), "sqdist-gemm");
    /* Both operands on the same side: no matrix product to win. */
    sr_expr *z64 = sr_vi(ctx, 2, 64);
    assert_not_fires(sr_sqdist(ctx, x64, z64), "sqdist-gemm");
    /* the threshold is the backend's measured gemm crossover */
    cr_assert_eq(simp_cost_gemm_min_dim(), SR_GEMM_MIN_DIM);
    int t = SR_GEMM_MIN_DIM;
    sr_expr *xb = sr_vi(ctx, 0, t - 1), *yb = sr_vj(ctx, 1, t - 1);
    assert_not_fires(sr_sqdist(ctx, xb, yb), "sqdist-gemm");
    sr_expr *xt = sr_vi(ctx, 3, t), *yt = sr_vj(ctx, 4, t);
    assert_fires(sr_sqdist(ctx, xt, yt), "sqdist-gemm");
    assert_fires(sr_norm2(ctx, sr_sub(ctx, xt, yt)), "norm2diff-gemm");
}

/* ---- fixed point ---- */

/* A deterministic random formula over x, y, p (and s, b). */
static sr_expr *gen(uint64_t *rng, int depth, bool nanprone)
{
    int r = (int)(tu_rand(rng) % (depth <= 0 ? 6 : 40));
    switch (r) {
    case 0:
        return X;
    case 1:
        return Y;
    case 2:
        return P;
    case 3:
        return tu_rand(rng) % 2 ? S : B;
    case 4:
        return I((int64_t)(tu_rand(rng) % 5) - 1);
    case 5:
        return tu_rand(rng) % 2 ? sr_ratcst(ctx, 1, 2) : sr_const(ctx, 0.75);
    default:
        break;
    }
    sr_expr *a = gen(rng, depth - 1, nanprone);
    sr_expr *b = gen(rng, depth - 1, nanprone);
    bool same = a->dim == b->dim;
    switch (r) {
    case 6:
    case 7:
        return sr_add(ctx, a, b);
    case 8:
    case 9:
        return sr_sub(ctx, a, b);
    case 10:
    case 11:
        return sr_mul(ctx, a, b);
    case 12:
        return sr_neg(ctx, a);
    case 13:
        return sr_square(ctx, a);
    case 14:
        return sr_sum(ctx, sr_square(ctx, sr_sub(ctx, a, b)));
    case 15:
        return same ? sr_sum(ctx, sr_mul(ctx, a, b)) : sr_sum(ctx, a);
    case 16:
        return sr_mul(ctx, a, a);
    case 17:
        return sr_mul(ctx, sr_exp(ctx, sr_sin(ctx, a)), sr_exp(ctx, sr_cos(ctx, b)));
    case 18:
        return sr_pow(ctx, a, (int)(tu_rand(rng) % 4));
    case 19:
        return sr_sin(ctx, a);
    case 20:
        return sr_abs(ctx, a);
    case 21:
        return same ? sr_sqdist(ctx, a, b) : sr_sqnorm2(ctx, a);
    case 22:
        return same ? sr_scalprod(ctx, a, b) : sr_norm2(ctx, a);
    case 23:
        return sr_mul(ctx, a, I(tu_rand(rng) % 2));
    case 24:
        return sr_add(ctx, a, I(0));
    case 25:
        return sr_neg(ctx, sr_neg(ctx, a));
    case 26:
        return sr_less(ctx, a, b);
    case 27:
        return sr_sub(ctx, a, a);
    case 28:
        return sr_square(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, a)));
    case 29:
        return sr_relu(ctx, a);
    case 30:
        return sr_div(ctx, a, I(1 + (int)(tu_rand(rng) % 3)));
    case 31:
        return sr_log(ctx, sr_exp(ctx, sr_cos(ctx, a)));
    case 32:
        return sr_powf(ctx, sr_abs(ctx, a), tu_rand(rng) % 2 ? I(2) : sr_ratcst(ctx, 1, 2));
    /* NaN-prone ops */
    case 33:
        return nanprone ? sr_log(ctx, a) : sr_cos(ctx, a);
    case 34:
        return nanprone ? sr_sqrt(ctx, a) : sr_atan(ctx, a);
    case 35:
        return nanprone ? sr_div(ctx, a, b) : sr_mul(ctx, a, b);
    case 36:
        return nanprone ? sr_inv(ctx, a) : sr_neg(ctx, a);
    case 37:
        return nanprone ? sr_powf(ctx, a, sr_ratcst(ctx, 1, 2)) : sr_abs(ctx, a);
    case 38:
        /* Vectors only: Normalize of a scalar is a sign function, whose jump at 0 turns a
         * rounding difference into a difference of 1. */
        return same && a->dim > 1 ? sr_scalprod(ctx, sr_normalize(ctx, a), sr_normalize(ctx, b))
                                  : sr_abs(ctx, a);
    default:
        return sr_exp(ctx, sr_neg(ctx, sr_square(ctx, a)));
    }
}

#define NRANDOM 300

Test(simplify, reaches_a_fixed_point)
{
    uint64_t rng = 12345;
    for (int t = 0; t < NRANDOM; t++) {
        sr_expr *f = gen(&rng, 5, t % 2 == 1);
        cr_assert_not_null(f, "generator built an invalid formula: %s", sr_ctx_error(ctx));
        sr_expr *s1 = simp(f), *s2 = simp(s1);
        cr_assert_eq(s1, s2, "not a fixed point: %s -> %s -> %s", pr(f), pr(s1), pr(s2));
        cr_assert_eq(s1->dim, f->dim);
    }
}

/* ---- differential: the reference on the original and on the simplified formula ---- */

Test(simplify, random_formulas_same_values)
{
    uint64_t rng = 777;
    int changed = 0;
    for (int t = 0; t < NRANDOM; t++) {
        sr_expr *f = gen(&rng, 5, false);
        changed += simp(f) != f;
        check_same_values(f, false, 1000 + (uint64_t)t);
    }
    cr_assert(changed > NRANDOM / 2, "only %d of %d formulas were rewritten", changed, NRANDOM);
}

Test(simplify, random_nan_prone_formulas_same_values_and_classes)
{
    uint64_t rng = 4242;
    for (int t = 0; t < NRANDOM; t++) {
        sr_expr *f = gen(&rng, 5, true);
        check_same_values(f, false, 2000 + (uint64_t)t);
    }
}

Test(simplify, random_formulas_nan_inf_inputs_same_classes)
{
    uint64_t rng = 99;
    for (int t = 0; t < NRANDOM; t++) {
        sr_expr *f = gen(&rng, 4, t % 2 == 0);
        check_same_values(f, true, 3000 + (uint64_t)t);
    }
}

/* Every rule's own pattern, on ordinary inputs and on NaN/Inf/0 inputs. */
Test(simplify, each_rule_preserves_values)
{
    sr_expr *d = sr_sub(ctx, X, Y);
    sr_expr *cases[] = {
        sr_mul(ctx, sr_mul(ctx, X, I(2)), I(3)),
        sr_add(ctx, sr_add(ctx, X, sr_add(ctx, Y, P)), S),
        sr_mul(ctx, sr_neg(ctx, X), Y),
        sr_add(ctx, X, sr_neg(ctx, Y)),
        sr_sub(ctx, X, sr_neg(ctx, Y)),
        sr_sub(ctx, sr_neg(ctx, X), Y),
        sr_div(ctx, X, I(4)),
        sr_add(ctx, X, I(0)),
        sr_mul(ctx, I(1), X),
        sr_mul(ctx, X, I(-1)),
        sr_sub(ctx, I(0), X),
        sr_div(ctx, X, I(1)),
        sr_mul(ctx, sr_less(ctx, S, B), I(0)),
        sr_sub(ctx, sr_sin(ctx, sr_greater(ctx, S, B)), sr_sin(ctx, sr_greater(ctx, S, B))),
        sr_square(ctx, sr_neg(ctx, X)),
        sr_square(ctx, sr_abs(ctx, X)),
        sr_mul(ctx, d, d),
        sr_square(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, X))),
        sr_square(ctx, sr_sqrt(ctx, sr_exp(ctx, S))),
        sr_sqrt(ctx, sr_square(ctx, S)),
        sr_abs(ctx, sr_exp(ctx, S)),
        sr_mul(ctx, sr_exp(ctx, P), sr_exp(ctx, sr_sin(ctx, P))),
        sr_log(ctx, sr_exp(ctx, X)),
        sr_pow(ctx, X, 2),
        sr_pow(ctx, X, -1),
        sr_pow(ctx, S, 0),
        sr_powf(ctx, X, I(2)),
        sr_powf(ctx, X, I(3)),
        sr_powf(ctx, sr_sqnorm2(ctx, X), sr_ratcst(ctx, 1, 2)),
        sr_square(ctx, sr_norm2(ctx, X)),
        sr_sum(ctx, sr_square(ctx, d)),
        sr_sum(ctx, sr_mul(ctx, d, d)),
        sr_sum(ctx, sr_mul(ctx, X, Y)),
        sr_sqrt(ctx, sr_sum(ctx, sr_square(ctx, d))),
        sr_sum(ctx, sr_mul(ctx, sr_square(ctx, d), W)),
        sr_sum(ctx, sr_mul(ctx, B, sr_square(ctx, d))),
        sr_sum(ctx, sr_mul(ctx, sr_square(ctx, X), W)),
        sr_scalprod(ctx, X, X),
        sr_scalprod(ctx, sr_normalize(ctx, X), sr_normalize(ctx, Y)),
        sr_sum(ctx, S),
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cr_assert_neq(simp(cases[c]), cases[c], "case %zu (%s) is not rewritten", c, pr(cases[c]));
        for (uint64_t seed = 1; seed <= 3; seed++) {
            check_same_values(cases[c], false, seed);
            check_same_values(cases[c], true, 100 + seed);
        }
    }
}

/* The eXLA rewrite changes rounding (and is not exact for infinite inputs, see
 * docs/simplifier.md): finite inputs, a looser tolerance. */
Test(simplify, sqdist_gemm_preserves_values)
{
    enum { D = 40, N = 7, M = 9 };
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D);
    sr_expr *fs[] = {sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))),
                     sr_norm2(ctx, sr_sub(ctx, x, y)),
                     sr_sqrt(ctx, sr_sum(ctx, sr_square(ctx, sr_sub(ctx, x, y))))};
    static double xv[N * D], yv[M * D], o1[N], o2[N];
    uint64_t rng = 5;
    for (int t = 0; t < N * D; t++)
        xv[t] = tu_uniform(&rng, -0.2, 0.2);
    for (int t = 0; t < M * D; t++)
        yv[t] = tu_uniform(&rng, -0.2, 0.2);
    memcpy(yv, xv, D * sizeof *xv); /* a zero distance: the ReLU keeps Sqrt away from NaN */
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    for (size_t c = 0; c < sizeof fs / sizeof *fs; c++) {
        for (int on = 0; on < 2; on++) {
            sr_expr *f = on ? simp(fs[c]) : fs[c];
            if (on)
                cr_assert(strstr(pr(f), "SqDist") == NULL && strstr(pr(f), "Norm2((") == NULL,
                          "not rewritten: %s", pr(f));
            sr_kernel_desc desc = sr_kernel_desc_default();
            desc.dtype = SR_F64;
            desc.device = SR_DEVICE_REFERENCE;
            sr_kernel *k;
            cr_assert_eq(sr_kernel_new(ctx, f, &desc, &k), SR_OK, "%s", sr_ctx_error(ctx));
            const void *args[] = {xv, yv};
            cr_assert_eq(sr_kernel_run(k, N, M, args, on ? o2 : o1), SR_OK);
            sr_kernel_free(k);
        }
        for (int i = 0; i < N; i++)
            cr_assert(tu_close(o2[i], o1[i], 1e-7, 1e-7), "case %zu row %d: %g vs %g", c, i, o2[i],
                      o1[i]);
    }
}

/* ---- kernels: explain, the switch, hoisting, factoring ---- */

static sr_kernel *kernel(sr_expr *f, sr_reduction red)
{
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = red;
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

Test(simplify, plan_shows_the_rules_formula_and_cost)
{
    sr_expr *f =
        sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, Y))))), B);
    sr_kernel *k = kernel(f, SR_SUM);
    cr_assert(k->simp.log && strstr(k->simp.log, "pass match: sum-sqdist x1"), "%s",
              k->simp.log ? k->simp.log : "(no log)");
    sr_plan_info p = tu_plan(k);
    cr_assert_eq(p.simplified, 1);
    cr_assert_eq(p.formula, k->f, "the plan names %s", pr(p.formula));
    cr_assert_eq(p.formula, simp(sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y))), B)),
                 "runs %s", pr(p.formula));
    cr_assert_eq(p.hoisted, k->simp.nhoisted);
    cr_assert(p.flops_per_pair > 0 && p.flops_per_pair <= p.flops_per_pair_given,
              "%g flops per pair, %g as given", p.flops_per_pair, p.flops_per_pair_given);
    cr_assert_gt(p.bytes_per_pair, 0);
    sr_kernel_free(k);
}

Test(simplify, switch_off_leaves_formula_unchanged)
{
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    sr_expr *f = sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, Y)));
    sr_kernel *k = kernel(f, SR_SUM);
    cr_assert_eq(k->f, f, "the kernel runs %s", pr(k->f));
    cr_assert_eq(k->simp.nhoisted, 0);
    cr_assert_null(k->simp.outer);
    cr_assert_eq(tu_plan(k).simplified, 0);
    sr_kernel_free(k);
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", NULL);
    k = kernel(f, SR_SUM);
    cr_assert_eq(k->f, sr_sqdist(ctx, Y, X), "the kernel runs %s", pr(k->f));
    cr_assert_eq(k->simp.f_user, f);
    sr_kernel_free(k);
}

Test(simplify, arguments_come_from_the_formula_as_given)
{
    /* Simplification removes s and b (Less(s,b)*0 = 0), but the kernel still takes them. */
    sr_expr *f = sr_add(ctx, sr_mul(ctx, sr_less(ctx, S, B), I(0)), sr_scalprod(ctx, X, Y));
    sr_kernel *k = kernel(f, SR_SUM);
    cr_assert_eq(sr_kernel_nargs(k), 5);
    cr_assert_eq(k->f, simp(sr_scalprod(ctx, X, Y)), "runs %s", pr(k->f));
    sr_kernel_free(k);
}

Test(simplify, hoisting_lists_one_sided_terms)
{
    /* Cosine similarity: both inverse norms are one-sided. */
    sr_expr *f = sr_scalprod(ctx, sr_normalize(ctx, X), sr_normalize(ctx, Y));
    sr_kernel *k = kernel(f, SR_MAX);
    sr_expr *rx = sr_rsqrt(ctx, sr_sqnorm2(ctx, X)), *ry = sr_rsqrt(ctx, sr_sqnorm2(ctx, Y));
    bool hx = false, hy = false;
    for (int i = 0; i < k->simp.nhoisted; i++) {
        hx |= k->simp.hoisted[i] == rx;
        hy |= k->simp.hoisted[i] == ry;
    }
    cr_assert(hx && hy, "%s", sr_kernel_explain(k));
    cr_assert(tu_plan(k).hoisted == k->simp.nhoisted && k->simp.nhoisted >= 2, "%s",
              sr_kernel_explain(k));
    cr_assert(k->simp.cost.flops_pair < k->simp.cost_user.flops_pair, "%g vs %g",
              k->simp.cost.flops_pair, k->simp.cost_user.flops_pair);
    sr_kernel_free(k);
}

Test(simplify, sum_factoring_moves_i_only_factors_out)
{
    sr_expr *fi = sr_exp(ctx, sr_sqrt(ctx, sr_sqnorm2(ctx, X)));
    sr_expr *g = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y))), B);
    sr_expr *f = sr_mul(ctx, fi, g);
    sr_kernel *k = kernel(f, SR_SUM);
    cr_assert_not_null(k->simp.outer, "%s", sr_kernel_explain(k));
    cr_assert_eq(k->simp.outer, simp(fi), "outer %s", pr(k->simp.outer));
    cr_assert_eq(k->simp.inner->deps & DEP_J, DEP_J);
    const char *rule = tu_plan(k).rewrite;
    cr_assert(rule && strcmp(rule, "sum-factor") == 0, "rewrite %s", rule ? rule : "none");
    /* outer * inner is F */
    sr_expr *prod = sr_mul(ctx, (sr_expr *)k->simp.outer, (sr_expr *)k->simp.inner);
    cr_assert_eq(simp(prod), k->f, "%s vs %s", pr(simp(prod)), pr(k->f));
    sr_kernel_free(k);
    /* Min: the factor is never negative, so it moves out too (tests/test-rewrite.c checks the
     * values); a factor of unknown sign does not. */
    k = kernel(f, SR_MIN);
    cr_assert_eq(k->simp.outer, simp(fi), "%s", sr_kernel_explain(k));
    cr_assert_str_eq(k->simp.post_rule, "minmax-nonneg-factor");
    sr_kernel_free(k);
    k = kernel(sr_mul(ctx, S, g), SR_MIN);
    cr_assert_null(k->simp.outer, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

Test(simplify, weight_is_simplified)
{
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_SUMSOFTMAXWEIGHT;
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    desc.weight = sr_add(ctx, sr_mul(ctx, I(1), Y), I(0));
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, sr_neg(ctx, sr_sqdist(ctx, X, Y)), &desc, &k), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(k->weight, Y, "weight runs as %s", pr(k->weight));
    sr_kernel_free(k);
}

Test(simplify, pending_builder_error_is_kept)
{
    /* A failed builder before: its status must still be reported by sr_kernel_new(NULL)
     * even after the simplifier ran in between. */
    cr_assert_null(sr_sqdist(ctx, X, S));
    sr_kernel *k = kernel(sr_sum(ctx, sr_square(ctx, sr_sub(ctx, X, Y))), SR_SUM);
    sr_kernel_free(k);
    sr_kernel_desc desc = sr_kernel_desc_default();
    cr_assert_eq(sr_kernel_new(ctx, NULL, &desc, &k), SR_EDIM);
}
