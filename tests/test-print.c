/* test-print.c — the formula printer: canonical text, truncation, and the print → parse round
 * trip for every op. */
#include <criterion/criterion.h>

#include "expr/expr.h"
#include "util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(print, .init = setup, .fini = teardown);

/* Prints e into a fresh malloc'd string (checking the returned length). */
static char *print_alloc(const sr_expr *e)
{
    size_t len = sr_expr_print(e, NULL, 0);
    char *s = malloc(len + 1);
    cr_assert_not_null(s);
    size_t again = sr_expr_print(e, s, len + 1);
    cr_assert_eq(again, len, "sr_expr_print returned %zu then %zu", len, again);
    cr_assert_eq(strlen(s), len, "text '%s' has length %zu, reported %zu", s, strlen(s), len);
    return s;
}

/* Prints e, parses the text back without aliases, and checks it is the same node. */
static void assert_round_trip(const sr_expr *e)
{
    cr_assert_not_null(e, "builder failed: %s", sr_ctx_error(ctx));
    char *s = print_alloc(e);
    sr_expr *back = NULL;
    sr_status st = sr_parse(ctx, s, NULL, 0, &back);
    cr_assert_eq(st, SR_OK, "'%s' does not parse back: %s", s, sr_ctx_error(ctx));
    char *s2 = print_alloc(back);
    cr_assert_eq(back, e, "'%s' parses back to a different node, printed '%s'", s, s2);
    free(s2);
    free(s);
}

static void assert_text(const sr_expr *e, const char *want)
{
    cr_assert_not_null(e, "builder failed: %s", sr_ctx_error(ctx));
    char buf[512];
    size_t len = sr_expr_print(e, buf, sizeof buf);
    cr_assert_str_eq(buf, want, "printed '%s', want '%s'", buf, want);
    cr_assert_eq(len, strlen(want), "length %zu, want %zu", len, strlen(want));
    assert_round_trip(e);
}

Test(print, leaves)
{
    assert_text(sr_vi(ctx, 0, 3), "Var(0,3,0)");
    assert_text(sr_vj(ctx, 7, 2), "Var(7,2,1)");
    assert_text(sr_pm(ctx, 65535, 1), "Var(65535,1,2)");
    assert_text(sr_intcst(ctx, 3), "3");
    assert_text(sr_intcst(ctx, 0), "0");
    assert_text(sr_intcst(ctx, -3), "IntCst(-3)");
    assert_text(sr_intcst(ctx, INT64_MAX), "9223372036854775807");
    assert_text(sr_intcst(ctx, INT64_MIN), "IntCst(-9223372036854775808)");
    assert_text(sr_ratcst(ctx, 2, -4), "RatCst(-1,2)");
    assert_text(sr_ratcst(ctx, 3, 1), "RatCst(3,1)");
}

Test(print, real_constants)
{
    assert_text(sr_const(ctx, 2.0), "2.0");
    assert_text(sr_const(ctx, 0.0), "0.0");
    assert_text(sr_const(ctx, -0.0), "0.0");
    assert_text(sr_const(ctx, 2.5), "2.5");
    assert_text(sr_const(ctx, -2.5), "Cst(-2.5)");
    assert_text(sr_const(ctx, 1e300), "1.0000000000000001e+300");
    assert_text(sr_const(ctx, 1e21), "1e+21");
    assert_text(sr_const(ctx, -1e-300), "Cst(-1e-300)");
    assert_text(sr_const(ctx, 0.1), "0.10000000000000001");
    assert_text(sr_const(ctx, -3.0), "Cst(-3.0)");
}

Test(print, real_constants_round_trip_bit_exactly)
{
    static const double special[] = {
        DBL_MAX,   -DBL_MAX,  DBL_MIN,           -DBL_MIN, 4.9e-324,
        -4.9e-324, 1.0 / 3.0, 3.141592653589793, 1e16,     123456789012345678.0};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        assert_round_trip(sr_const(ctx, special[i]));
    uint64_t rng = 12345;
    for (int i = 0; i < 2000; i++) {
        uint64_t bits = tu_rand(&rng);
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v))
            continue;
        assert_round_trip(sr_const(ctx, v));
    }
}

Test(print, infix_and_functions)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3);
    assert_text(sr_add(ctx, x, y), "(Var(0,3,0)+Var(1,3,1))");
    assert_text(sr_sub(ctx, x, y), "(Var(0,3,0)-Var(1,3,1))");
    assert_text(sr_mul(ctx, x, sr_intcst(ctx, 2)), "(Var(0,3,0)*2)");
    assert_text(sr_div(ctx, x, sr_const(ctx, -2.0)), "(Var(0,3,0)/Cst(-2.0))");
    assert_text(sr_scalprod(ctx, x, y), "(Var(0,3,0)|Var(1,3,1))");
    assert_text(sr_neg(ctx, x), "(-Var(0,3,0))");
    assert_text(sr_neg(ctx, sr_intcst(ctx, 3)), "(-3)");
    assert_text(sr_pow(ctx, x, 2), "Pow(Var(0,3,0),2)");
    assert_text(sr_pow(ctx, x, -2), "Pow(Var(0,3,0),-2)");
    assert_text(sr_extract(ctx, sr_vi(ctx, 0, 5), 1, 3), "Extract(Var(0,5,0),1,3)");
    assert_text(sr_clampint(ctx, x, -1, 4), "ClampInt(Var(0,3,0),-1,4)");
    assert_text(expr_make(ctx, OP_DIFFCLAMPINT, &x, (int64_t[]){-1, 4}, 0, 0.0),
                "DiffClampInt(Var(0,3,0),-1,4)");
    assert_text(sr_clamp(ctx, x, y, sr_intcst(ctx, 1)), "Clamp(Var(0,3,0),Var(1,3,1),1)");
    assert_text(sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, x, y))),
                "Exp((-SqDist(Var(0,3,0),Var(1,3,1))))");
}

Test(print, shared_subexpressions_are_printed_again)
{
    sr_expr *d = sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2));
    assert_text(sr_add(ctx, sr_exp(ctx, d), d),
                "(Exp(SqDist(Var(0,2,0),Var(1,2,1)))+SqDist(Var(0,2,0),Var(1,2,1)))");
}

/* One sample node of each op, built with the public builders. */
static sr_expr *sample(enum expr_op op)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *s = sr_pm(ctx, 2, 1);
    sr_expr *a = sr_vi(ctx, 3, 6), *w = sr_pm(ctx, 4, 9), *z = sr_vj(ctx, 5, 2);
    switch (op) {
    case OP_VAR:
        return y;
    case OP_INTCST:
        return sr_intcst(ctx, -7);
    case OP_RATCST:
        return sr_ratcst(ctx, 3, 4);
    case OP_CST:
        return sr_const(ctx, 0.25);
    case OP_ADD:
        return sr_add(ctx, x, s);
    case OP_SUB:
        return sr_sub(ctx, s, y);
    case OP_MUL:
        return sr_mul(ctx, x, y);
    case OP_DIV:
        return sr_div(ctx, x, sr_ratcst(ctx, 1, 3));
    case OP_MINUS:
        return sr_neg(ctx, x);
    case OP_POWF:
        return sr_powf(ctx, x, sr_const(ctx, 1.5));
    case OP_ATAN2:
        return sr_atan2(ctx, x, y);
    case OP_LESS:
        return sr_less(ctx, x, y);
    case OP_LESSEQ:
        return sr_lesseq(ctx, x, s);
    case OP_GREATER:
        return sr_greater(ctx, x, y);
    case OP_GREATEREQ:
        return sr_greatereq(ctx, x, y);
    case OP_EQUAL:
        return sr_equal(ctx, x, y);
    case OP_NOTEQUAL:
        return sr_notequal(ctx, x, y);
    case OP_INV:
        return sr_inv(ctx, x);
    case OP_SQUARE:
        return sr_square(ctx, x);
    case OP_SQRT:
        return sr_sqrt(ctx, x);
    case OP_RSQRT:
        return sr_rsqrt(ctx, x);
    case OP_EXP:
        return sr_exp(ctx, x);
    case OP_LOG:
        return sr_log(ctx, x);
    case OP_XLOGX:
        return sr_xlogx(ctx, x);
    case OP_SIN:
        return sr_sin(ctx, x);
    case OP_COS:
        return sr_cos(ctx, x);
    case OP_ASIN:
        return sr_asin(ctx, x);
    case OP_ACOS:
        return sr_acos(ctx, x);
    case OP_ATAN:
        return sr_atan(ctx, x);
    case OP_ABS:
        return sr_abs(ctx, x);
    case OP_SIGN:
        return sr_sign(ctx, x);
    case OP_STEP:
        return sr_step(ctx, x);
    case OP_RELU:
        return sr_relu(ctx, x);
    case OP_FLOOR:
        return sr_floor(ctx, x);
    case OP_SINXDIVX:
        return sr_sinxdivx(ctx, x);
    case OP_POW:
        return sr_pow(ctx, x, -3);
    case OP_ROUND:
        return sr_round(ctx, x, 2);
    case OP_CLAMPINT:
        return sr_clampint(ctx, x, -1, 1);
    case OP_DIFFCLAMPINT:
        return expr_make(ctx, OP_DIFFCLAMPINT, &x, (int64_t[]){-1, 1}, 0, 0.0);
    case OP_CLAMP:
        return sr_clamp(ctx, x, s, y);
    case OP_IFELSE:
        return sr_ifelse(ctx, s, x, y);
    case OP_MOD:
        return sr_mod(ctx, x, s, sr_const(ctx, 0.5));
    case OP_SQNORM2:
        return sr_sqnorm2(ctx, x);
    case OP_NORM2:
        return sr_norm2(ctx, x);
    case OP_NORMALIZE:
        return sr_normalize(ctx, x);
    case OP_SQDIST:
        return sr_sqdist(ctx, x, y);
    case OP_SCALPROD:
        return sr_scalprod(ctx, x, y);
    case OP_SUM:
        return sr_sum(ctx, x);
    case OP_MAX:
        return sr_max(ctx, x);
    case OP_MIN:
        return sr_min(ctx, x);
    case OP_ARGMAX:
        return sr_argmax(ctx, x);
    case OP_ARGMIN:
        return sr_argmin(ctx, x);
    case OP_ELEM:
        return sr_elem(ctx, x, 2);
    case OP_EXTRACT:
        return sr_extract(ctx, a, 2, 3);
    case OP_CONCAT:
        return sr_concat(ctx, x, s);
    case OP_ONEHOT:
        return sr_onehot(ctx, s, 4);
    case OP_MATVECMULT:
        return sr_matvecmult(ctx, a, x);
    case OP_VECMATMULT:
        return sr_vecmatmult(ctx, x, a);
    case OP_TENSORPROD:
        return sr_tensorprod(ctx, x, y);
    case OP_WEIGHTEDSQNORM:
        return sr_weightedsqnorm(ctx, w, x);
    case OP_WEIGHTEDSQDIST:
        return sr_weightedsqdist(ctx, x, x, y);
    case OP_SUMT:
        return sr_sumt(ctx, s, 4);
    case OP_ELEMT:
        return sr_elemt(ctx, s, 3, 1);
    case OP_EXTRACTT:
        return sr_extractt(ctx, x, 2, 6);
    case OP_TENSORDOT:
        return sr_tensordot(ctx, a, x, 2, (int[]){2, 3}, 1, (int[]){3}, 1, (int[]){1}, (int[]){0},
                            NULL);
    case OP_CADD:
        return sr_complex_add(ctx, a, z);
    case OP_CSUB:
        return sr_complex_sub(ctx, z, a);
    case OP_CMULT:
        return sr_complex_mult(ctx, a, a);
    case OP_CDIV:
        return sr_complex_div(ctx, a, z);
    case OP_CSCAL:
        return sr_complex_scal(ctx, a, z); /* printed with the scalar first */
    case OP_CREALSCAL:
        return sr_complex_realscal(ctx, a, s);
    case OP_CONJ:
        return sr_conj(ctx, a);
    case OP_CEXP:
        return sr_complex_exp(ctx, z);
    case OP_CEXP1J:
        return sr_complex_exp1j(ctx, x);
    case OP_CREAL:
        return sr_complex_real(ctx, a);
    case OP_CIMAG:
        return sr_complex_imag(ctx, a);
    case OP_CABS:
        return sr_complex_abs(ctx, a);
    case OP_CSQUAREABS:
        return sr_complex_squareabs(ctx, z);
    case OP_CANGLE:
        return sr_complex_angle(ctx, a);
    case OP_REAL2C:
        return sr_real2complex(ctx, x);
    case OP_IMAG2C:
        return sr_imag2complex(ctx, s);
    case OP_CSUM:
        return sr_complex_sum(ctx, a);
    case OP_CSUMT:
        return sr_complex_sumt(ctx, z, 8);
    case OP_COUNT:
        break;
    }
    return NULL;
}

Test(print, every_op_round_trips)
{
    for (int op = 0; op < OP_COUNT; op++) {
        sr_expr *e = sample((enum expr_op)op);
        cr_assert_not_null(e, "no sample for %s: %s", expr_ops[op].name, sr_ctx_error(ctx));
        cr_assert_eq(e->op, op, "sample for %s has op %s", expr_ops[op].name, expr_ops[e->op].name);
        assert_round_trip(e);
        /* also inside a larger formula */
        assert_round_trip(sr_add(ctx, sr_sum(ctx, e), sr_neg(ctx, sr_max(ctx, e))));
    }
}

/* A random expression over a pool of nodes, through the checked constructor so that every op
 * and attribute appears. Candidates the dimension rules reject are skipped. */
static sr_expr *random_expr(uint64_t *rng, int steps)
{
    sr_expr *pool[64];
    int n = 0;
    pool[n++] = sr_vi(ctx, 0, 3);
    pool[n++] = sr_vj(ctx, 1, 3);
    pool[n++] = sr_pm(ctx, 2, 1);
    pool[n++] = sr_vj(ctx, 3, 9);
    pool[n++] = sr_vi(ctx, 4, 4);
    pool[n++] = sr_pm(ctx, 5, 2);
    pool[n++] = sr_vj(ctx, 6, 4);
    pool[n++] = sr_vj(ctx, 7, 2);
    pool[n++] = sr_intcst(ctx, (int64_t)(tu_rand(rng) % 2001) - 1000);
    pool[n++] = sr_const(ctx, tu_uniform(rng, -1e3, 1e3));
    pool[n++] = sr_ratcst(ctx, (int64_t)(tu_rand(rng) % 21) - 10, 1 + (int64_t)(tu_rand(rng) % 9));
    for (int s = 0; s < steps && n < 64; s++) {
        enum expr_op op = (enum expr_op)(OP_ADD + tu_rand(rng) % (OP_COUNT - OP_ADD));
        sr_expr *c[3];
        for (int i = 0; i < 3; i++)
            c[i] = pool[tu_rand(rng) % (uint64_t)n];
        int64_t at[2] = {0, 0};
        int d = c[0]->dim;
        switch (op) {
        case OP_POW:
            at[0] = (int64_t)(tu_rand(rng) % 9) - 4;
            break;
        case OP_ROUND:
            at[0] = (int64_t)(tu_rand(rng) % 7) - 3;
            break;
        case OP_CLAMPINT:
        case OP_DIFFCLAMPINT:
            at[0] = (int64_t)(tu_rand(rng) % 5) - 3;
            at[1] = at[0] + (int64_t)(tu_rand(rng) % 4);
            break;
        case OP_ELEM:
            at[0] = (int64_t)(tu_rand(rng) % (uint64_t)d);
            break;
        case OP_EXTRACT:
            at[0] = (int64_t)(tu_rand(rng) % (uint64_t)d);
            at[1] = 1 + (int64_t)(tu_rand(rng) % (uint64_t)(d - at[0]));
            break;
        case OP_ONEHOT:
        case OP_SUMT:
            at[0] = 1 + (int64_t)(tu_rand(rng) % 4);
            break;
        case OP_CSUMT:
            at[0] = 2 + 2 * (int64_t)(tu_rand(rng) % 3);
            break;
        case OP_ELEMT:
            at[0] = 1 + (int64_t)(tu_rand(rng) % 4);
            at[1] = (int64_t)(tu_rand(rng) % (uint64_t)at[0]);
            break;
        case OP_EXTRACTT:
            at[0] = (int64_t)(tu_rand(rng) % 3);
            at[1] = d + at[0] + (int64_t)(tu_rand(rng) % 3);
            break;
        default:
            break;
        }
        sr_expr *e;
        if (op == OP_TENSORDOT) {
            /* vectors as rank-1 tensors: contracted when of equal sizes, else an outer product,
             * permuted at random */
            int da = c[0]->dim, db = c[1]->dim, ax[1] = {0}, perm[2] = {1, 0};
            bool dot = da == db && tu_rand(rng) % 2;
            e = sr_tensordot(ctx, c[0], c[1], 1, &da, 1, &db, dot, ax, ax,
                             !dot && tu_rand(rng) % 2 ? perm : NULL);
        } else {
            e = expr_make(ctx, op, c, at, 0, 0.0);
        }
        if (e && e->dim <= 64)
            pool[n++] = e;
    }
    return pool[n - 1];
}

Test(print, random_expressions_round_trip)
{
    uint64_t rng = 2024;
    int ops_seen[OP_COUNT] = {0};
    for (int t = 0; t < 400; t++) {
        sr_expr *e = random_expr(&rng, 40);
        assert_round_trip(e);
        const sr_expr *order[256];
        size_t cnt = expr_toposort(e, order, 256);
        for (size_t i = 0; i < cnt && i < 256; i++)
            ops_seen[order[i]->op]++;
    }
    for (int op = 0; op < OP_COUNT; op++)
        if (op != OP_CST && op != OP_INTCST && op != OP_RATCST && op != OP_VAR)
            cr_expect_gt(ops_seen[op], 0, "random expressions never used %s", expr_ops[op].name);
}

Test(print, truncation_has_snprintf_semantics)
{
    sr_expr *e = sr_add(ctx, sr_vi(ctx, 0, 3), sr_intcst(ctx, 12));
    const char *full = "(Var(0,3,0)+12)";
    size_t n = strlen(full);
    char buf[64];

    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(sr_expr_print(e, buf, 0), n);
    cr_assert_eq(buf[0], 'Z', "cap 0 must not write");
    cr_assert_eq(sr_expr_print(e, NULL, 0), n);
    cr_assert_eq(sr_expr_print(e, NULL, 10), n, "NULL buffer: nothing written, length returned");

    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(sr_expr_print(e, buf, 1), n);
    cr_assert_str_eq(buf, "");

    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(sr_expr_print(e, buf, 5), n);
    cr_assert_str_eq(buf, "(Var");
    cr_assert_eq(buf[5], 'Z', "wrote past cap");

    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(sr_expr_print(e, buf, n), n);
    cr_assert_eq(strlen(buf), n - 1);
    cr_assert_eq(strncmp(buf, full, n - 1), 0, "got '%s'", buf);

    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(sr_expr_print(e, buf, n + 1), n);
    cr_assert_str_eq(buf, full);
    cr_assert_eq(buf[n + 1], 'Z', "wrote past the NUL");
}

Test(print, null_expression)
{
    char buf[8] = "abc";
    cr_assert_eq(sr_expr_print(NULL, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(sr_expr_print(NULL, NULL, 0), 0);
}

Test(print, deep_chain_prints_without_recursion)
{
    /* Deeper than any C stack would allow for a recursive printer. */
    enum { DEPTH = 200000 };
    sr_expr *e = sr_vi(ctx, 0, 1);
    for (int i = 0; i < DEPTH; i++)
        e = i % 2 ? sr_exp(ctx, e) : sr_add(ctx, e, sr_intcst(ctx, 1));
    cr_assert_not_null(e);
    size_t len = sr_expr_print(e, NULL, 0);
    /* Var(0,1,0) + DEPTH/2 * "Exp(" ")" + DEPTH/2 * "(" "+1)" */
    size_t want = strlen("Var(0,1,0)") + (size_t)DEPTH / 2 * 5 + (size_t)DEPTH / 2 * 4;
    cr_assert_eq(len, want, "length %zu, want %zu", len, want);
    char *s = print_alloc(e);
    cr_assert_eq(strncmp(s, "Exp((Exp((", 10), 0, "unexpected head '%.20s'", s);
    cr_assert_str_eq(s + len - 4, "+1))", "unexpected tail '%s'", s + len - 4);
    free(s);
    /* The parser limits nesting, so such text is refused, cleanly. */
    char prefix[4096];
    sr_expr_print(e, prefix, sizeof prefix);
    sr_expr *back = sr_vi(ctx, 0, 1);
    cr_assert_eq(sr_parse(ctx, prefix, NULL, 0, &back), SR_EPARSE);
    cr_assert(strstr(sr_ctx_error(ctx), "nesting deeper than 200"), "message: %s",
              sr_ctx_error(ctx));
    cr_assert_null(back);
}

Test(print, exponential_dag_is_measured_not_expanded)
{
    /* e_k = e_{k-1} + e_{k-1}: 200 nodes, text of about 2^200 bytes. */
    sr_expr *e = sr_vi(ctx, 0, 1);
    size_t len20 = 0;
    for (int k = 1; k <= 200; k++) {
        e = sr_add(ctx, e, e);
        if (k == 20)
            len20 = sr_expr_print(e, NULL, 0);
    }
    /* L_k = 2 L_{k-1} + 3 with L_0 = 10: L_20 = 13 * 2^20 - 3 */
    cr_assert_eq(len20, (size_t)13 * ((size_t)1 << 20) - 3, "L_20 = %zu", len20);
    char buf[32];
    size_t len = sr_expr_print(e, buf, sizeof buf);
    cr_assert_eq(len, SIZE_MAX, "the length saturates, got %zu", len);
    cr_assert_str_eq(buf, "(((((((((((((((((((((((((((((((");
}

Test(print, print_to_appends)
{
    struct expr_buf b = {0};
    expr_buf_printf(&b, "formula: ");
    expr_print_to(&b, sr_sqnorm2(ctx, sr_vi(ctx, 0, 2)));
    expr_buf_printf(&b, ";");
    cr_assert(!b.oom);
    cr_assert_str_eq(b.data, "formula: SqNorm2(Var(0,2,0));");
    cr_assert_eq(b.len, strlen(b.data));
    free(b.data);
}

Test(print, negative_constants_inside_formulas)
{
    sr_expr *x = sr_vi(ctx, 0, 3);
    assert_text(sr_sub(ctx, x, sr_const(ctx, -1.0)), "(Var(0,3,0)-Cst(-1.0))");
    assert_text(sr_mul(ctx, sr_intcst(ctx, -2), x), "(IntCst(-2)*Var(0,3,0))");
    assert_text(sr_neg(ctx, sr_ratcst(ctx, -1, 3)), "(-RatCst(-1,3))");
    assert_text(sr_powf(ctx, x, sr_neg(ctx, sr_const(ctx, 0.5))), "Powf(Var(0,3,0),(-0.5))");
}
