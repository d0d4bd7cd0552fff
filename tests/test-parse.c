/* test-parse.c — the KeOps formula parser: grammar, aliases, every error path, and a
 * deterministic random-input test. */
#include <criterion/criterion.h>

#include "expr/expr.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(parse, .init = setup, .fini = teardown);

/* The aliases most tests use: x, y of dimension 3 (indices 0, 1), b, g scalars (2, 3), z a
 * j-variable of dimension 2 (4). */
static const char *const std_aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)", "z=Vj(2)"};
#define NSTD 5

static sr_expr *X(void) { return sr_vi(ctx, 0, 3); }
static sr_expr *Y(void) { return sr_vj(ctx, 1, 3); }
static sr_expr *B(void) { return sr_vj(ctx, 2, 1); }
static sr_expr *G(void) { return sr_pm(ctx, 3, 1); }

static sr_expr *parse_ok(const char *formula)
{
    sr_expr *e = NULL;
    sr_status st = sr_parse(ctx, formula, std_aliases, NSTD, &e);
    cr_assert_eq(st, SR_OK, "'%s': status %d: %s", formula, st, sr_ctx_error(ctx));
    cr_assert_not_null(e);
    return e;
}

/* Parses formula (with the standard aliases) and checks it is the node want. */
static void assert_parses_to(const char *formula, const sr_expr *want)
{
    cr_assert_not_null(want, "builder failed: %s", sr_ctx_error(ctx));
    sr_expr *e = parse_ok(formula);
    char got[256], exp[256];
    sr_expr_print(e, got, sizeof got);
    sr_expr_print(want, exp, sizeof exp);
    cr_assert_eq(e, want, "'%s' parsed to %s, want %s", formula, got, exp);
}

/* Parses with the given aliases and checks the status, that *out is NULL, and that the message
 * contains each given fragment. */
static void assert_fails_with(const char *formula, const char *const *aliases, int naliases,
                              sr_status want, const char *frag1, const char *frag2)
{
    sr_expr *e = sr_vi(ctx, 9, 9); /* must be overwritten with NULL */
    sr_status st = sr_parse(ctx, formula, aliases, naliases, &e);
    const char *msg = sr_ctx_error(ctx);
    cr_assert_eq(st, want, "'%s': status %d (%s), want %d; message: %s", formula, st,
                 sr_status_str(st), want, msg);
    cr_assert_null(e, "'%s': *out must be NULL on failure", formula);
    cr_assert(frag1 == NULL || strstr(msg, frag1), "'%s': message '%s' lacks '%s'", formula, msg,
              frag1);
    cr_assert(frag2 == NULL || strstr(msg, frag2), "'%s': message '%s' lacks '%s'", formula, msg,
              frag2);
}

static void assert_fails(const char *formula, sr_status want, const char *frag1, const char *frag2)
{
    assert_fails_with(formula, std_aliases, NSTD, want, frag1, frag2);
}

/* ---- valid formulas ---- */

Test(parse, readme_example)
{
    const char *const aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", aliases, 4, &e), SR_OK, "%s",
                 sr_ctx_error(ctx));
    sr_expr *want = sr_mul(
        ctx, sr_exp(ctx, sr_mul(ctx, sr_neg(ctx, sr_sqdist(ctx, X(), Y())), sr_pm(ctx, 3, 1))),
        sr_vj(ctx, 2, 1));
    cr_assert_eq(e, want);
    cr_assert_eq(sr_expr_dim(e), 1);
    cr_assert_eq(sr_expr_category(e), SR_DEP_IJ);
}

Test(parse, aliases_are_numbered_by_position)
{
    const char *const aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)"};
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "(x|y)*b", aliases, 3, &e), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(e, sr_mul(ctx, sr_scalprod(ctx, X(), Y()), sr_vj(ctx, 2, 1)));
}

Test(parse, explicit_index_aliases)
{
    const char *const aliases[] = {"b=Vj(2,1)", "y=Vj(1,3)", "x=Var(0,3,0)", "p=Pm(3,2)"};
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "SqDist(x,y)*b+Sum(p)", aliases, 4, &e), SR_OK, "%s",
                 sr_ctx_error(ctx));
    sr_expr *want = sr_add(ctx, sr_mul(ctx, sr_sqdist(ctx, X(), Y()), sr_vj(ctx, 2, 1)),
                           sr_sum(ctx, sr_pm(ctx, 3, 2)));
    cr_assert_eq(e, want);
    /* Two names for one variable are fine when they agree; unused aliases are fine. */
    const char *const two[] = {"x=Vi(0,3)", "u=Var(0,3,0)", "unused=Pm(1,4)"};
    cr_assert_eq(sr_parse(ctx, "x-u", two, 3, &e), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(e, sr_sub(ctx, X(), X()));
}

Test(parse, whitespace_anywhere)
{
    const char *const aliases[] = {"  x = Vi ( 3 ) ", "\ty\t=\tVj(\n1 ,\r3)", " g=Pm( 2,1 )"};
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, " \n Exp ( - SqDist ( x , y ) * g ) ** 2 \t", aliases, 3, &e), SR_OK,
                 "%s", sr_ctx_error(ctx));
    cr_assert_eq(
        e, sr_pow(ctx,
                  sr_exp(ctx, sr_mul(ctx, sr_neg(ctx, sr_sqdist(ctx, X(), Y())), sr_pm(ctx, 2, 1))),
                  2));
}

Test(parse, precedence)
{
    sr_expr *x = X(), *y = Y(), *b = B(), *g = G();
    assert_parses_to("-x**2", sr_neg(ctx, sr_pow(ctx, x, 2)));
    assert_parses_to("x-y-x", sr_sub(ctx, sr_sub(ctx, x, y), x));
    assert_parses_to("x/y/x", sr_div(ctx, sr_div(ctx, x, y), x));
    assert_parses_to("x+y*b", sr_add(ctx, x, sr_mul(ctx, y, b)));
    assert_parses_to("x*y+b", sr_add(ctx, sr_mul(ctx, x, y), b));
    assert_parses_to("x-y*b/g", sr_sub(ctx, x, sr_div(ctx, sr_mul(ctx, y, b), g)));
    assert_parses_to("(x+y)*b", sr_mul(ctx, sr_add(ctx, x, y), b));
    assert_parses_to("x|y+x", sr_scalprod(ctx, x, sr_add(ctx, y, x)));
    assert_parses_to("x|y|b", sr_scalprod(ctx, sr_scalprod(ctx, x, y), b));
    assert_parses_to("--x", sr_neg(ctx, sr_neg(ctx, x)));
    assert_parses_to("x*-y", sr_mul(ctx, x, sr_neg(ctx, y)));
    assert_parses_to("-x*y", sr_mul(ctx, sr_neg(ctx, x), y));
    assert_parses_to("2*x**2", sr_mul(ctx, sr_intcst(ctx, 2), sr_pow(ctx, x, 2)));
}

Test(parse, power_exponents)
{
    sr_expr *x = X(), *y = Y();
    assert_parses_to("x**2", sr_pow(ctx, x, 2));
    assert_parses_to("x**-2", sr_pow(ctx, x, -2));
    assert_parses_to("x**0", sr_pow(ctx, x, 0));
    assert_parses_to("x**0.5", sr_sqrt(ctx, x));
    assert_parses_to("x**.5", sr_sqrt(ctx, x));
    assert_parses_to("x**5e-1", sr_sqrt(ctx, x));
    assert_parses_to("x**-0.5", sr_rsqrt(ctx, x));
    assert_parses_to("x**1.5", sr_powf(ctx, x, sr_const(ctx, 1.5)));
    assert_parses_to("x**-1.5", sr_powf(ctx, x, sr_const(ctx, -1.5)));
    assert_parses_to("x**2.0", sr_powf(ctx, x, sr_const(ctx, 2.0)));
    assert_parses_to("x**y", sr_powf(ctx, x, y));
    assert_parses_to("x**-y", sr_powf(ctx, x, sr_neg(ctx, y)));
    assert_parses_to("x**(2)", sr_powf(ctx, x, sr_intcst(ctx, 2)));
    /* right-associative: the exponent 2**3 is a formula */
    assert_parses_to("x**2**3", sr_powf(ctx, x, sr_pow(ctx, sr_intcst(ctx, 2), 3)));
    assert_parses_to("x**y**2", sr_powf(ctx, x, sr_pow(ctx, y, 2)));
    assert_parses_to("x**2*y", sr_mul(ctx, sr_pow(ctx, x, 2), y));
}

Test(parse, number_literals)
{
    assert_parses_to("2", sr_intcst(ctx, 2));
    assert_parses_to("9223372036854775807", sr_intcst(ctx, INT64_MAX));
    assert_parses_to("2.0", sr_const(ctx, 2.0));
    assert_parses_to("2.5", sr_const(ctx, 2.5));
    assert_parses_to("3.", sr_const(ctx, 3.0));
    assert_parses_to(".5", sr_const(ctx, 0.5));
    assert_parses_to("1e-3", sr_const(ctx, 1e-3));
    assert_parses_to("1E3", sr_const(ctx, 1000.0));
    assert_parses_to("2.5e+2", sr_const(ctx, 250.0));
    assert_parses_to("1e-400", sr_const(ctx, 0.0)); /* underflow to zero is finite */
    assert_parses_to("-2", sr_neg(ctx, sr_intcst(ctx, 2)));
}

Test(parse, literal_functions)
{
    assert_parses_to("IntCst(-3)", sr_intcst(ctx, -3));
    assert_parses_to("IntCst(-9223372036854775808)", sr_intcst(ctx, INT64_MIN));
    assert_parses_to("RatCst(2,-4)", sr_ratcst(ctx, -1, 2));
    assert_parses_to("Cst(-2.5)", sr_const(ctx, -2.5));
    assert_parses_to("Cst(3)", sr_const(ctx, 3.0));
    assert_parses_to("Cst(-0.0)", sr_const(ctx, 0.0));
    assert_parses_to("Var(5,2,1)", sr_vj(ctx, 5, 2));
    assert_parses_to("Vi(5,2)", sr_vi(ctx, 5, 2));
    assert_parses_to("Vj(6,2)", sr_vj(ctx, 6, 2));
    assert_parses_to("Pm(7,4)", sr_pm(ctx, 7, 4));
    assert_parses_to("x+Var(0,3,0)", sr_add(ctx, X(), X()));
}

Test(parse, functions_with_attributes)
{
    sr_expr *x = X();
    assert_parses_to("Pow(x,3)", sr_pow(ctx, x, 3));
    assert_parses_to("Pow(x,-3)", sr_pow(ctx, x, -3));
    assert_parses_to("Round(x,2)", sr_round(ctx, x, 2));
    assert_parses_to("ClampInt(x,-1,1)", sr_clampint(ctx, x, -1, 1));
    assert_parses_to("Elem(x,0)", sr_elem(ctx, x, 0));
    assert_parses_to("Extract(x,1,2)", sr_extract(ctx, x, 1, 2));
    assert_parses_to("OneHot(b,5)", sr_onehot(ctx, B(), 5));
    assert_parses_to("Scalprod(x,y)", sr_scalprod(ctx, x, Y()));
    assert_parses_to("WeightedSqDist(g,x,y)", sr_weightedsqdist(ctx, G(), x, Y()));
    assert_parses_to("IfElse(b,x,y)", sr_ifelse(ctx, B(), x, Y()));
}

/* Formula text for every op: parse, print, parse again: the same node. */
Test(parse, every_op_text_round_trips)
{
    static const char *const texts[] = {"Var(0,3,0)",
                                        "IntCst(-4)",
                                        "7",
                                        "RatCst(1,3)",
                                        "Cst(-1.25)",
                                        "0.75",
                                        "x+y",
                                        "x-y",
                                        "x*b",
                                        "x/g",
                                        "-x",
                                        "Powf(x,y)",
                                        "Atan2(x,y)",
                                        "Less(x,y)",
                                        "LessEq(x,b)",
                                        "Greater(x,y)",
                                        "GreaterEq(x,y)",
                                        "Equal(x,y)",
                                        "NotEqual(x,y)",
                                        "Inv(x)",
                                        "Square(x)",
                                        "Sqrt(x)",
                                        "Rsqrt(x)",
                                        "Exp(x)",
                                        "Log(x)",
                                        "XLogX(x)",
                                        "Sin(x)",
                                        "Cos(x)",
                                        "Asin(x)",
                                        "Acos(x)",
                                        "Atan(x)",
                                        "Abs(x)",
                                        "Sign(x)",
                                        "Step(x)",
                                        "ReLU(x)",
                                        "Floor(x)",
                                        "SinXDivX(x)",
                                        "Pow(x,4)",
                                        "Round(x,-1)",
                                        "ClampInt(x,-2,2)",
                                        "DiffClampInt(x,-2,2)",
                                        "Clamp(x,b,y)",
                                        "IfElse(g,x,y)",
                                        "Mod(x,g,0.5)",
                                        "SqNorm2(x)",
                                        "Norm2(x)",
                                        "Normalize(x)",
                                        "SqDist(x,y)",
                                        "x|y",
                                        "Sum(x)",
                                        "Max(x)",
                                        "Min(x)",
                                        "ArgMax(x)",
                                        "ArgMin(x)",
                                        "Elem(x,2)",
                                        "Extract(x,0,2)",
                                        "Concat(x,z)",
                                        "OneHot(g,3)",
                                        "MatVecMult(Concat(x,y),z)",
                                        "VecMatMult(z,Concat(x,y))",
                                        "TensorProd(x,z)",
                                        "WeightedSqNorm(x,y)",
                                        "WeightedSqDist(TensorProd(x,y),x,y)",
                                        "SumT(g,4)",
                                        "ElemT(b,3,1)",
                                        "ExtractT(z,1,5)",
                                        "TensorDot(TensorProd(x,z),y,[3,2],[3],[0],[0])",
                                        "TensorDot(TensorProd(x,y),z,[3,3],[2],[],[],[2,0,1])",
                                        "TensorDot(b,g,[],[1],[],[])",
                                        "ComplexAdd(z,Concat(z,z))",
                                        "ComplexSubtract(Concat(z,z),z)",
                                        "ComplexMult(z,z)",
                                        "ComplexDivide(Concat(z,z),z)",
                                        "ComplexScal(Concat(z,z),z)",
                                        "ComplexRealScal(z,b)",
                                        "Conj(z)",
                                        "ComplexExp(z)",
                                        "ComplexExp1j(x)",
                                        "ComplexReal(z)",
                                        "ComplexImag(z)",
                                        "ComplexAbs(z)",
                                        "ComplexSquareAbs(z)",
                                        "ComplexAngle(z)",
                                        "Real2Complex(x)",
                                        "Imag2Complex(b)",
                                        "ComplexSum(Concat(z,z))",
                                        "ComplexSumT(z,6)",
                                        "Exp(-SqDist(x,y)*g)*b+Sqrt(x**2)|Normalize(y)**-0.5"};
    int seen[OP_COUNT] = {0};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        sr_expr *e = parse_ok(texts[i]);
        char buf[1024];
        size_t len = sr_expr_print(e, buf, sizeof buf);
        cr_assert_lt(len, sizeof buf);
        sr_expr *back = NULL;
        cr_assert_eq(sr_parse(ctx, buf, NULL, 0, &back), SR_OK, "'%s' printed '%s': %s", texts[i],
                     buf, sr_ctx_error(ctx));
        cr_assert_eq(back, e, "'%s' printed '%s', which parses to another node", texts[i], buf);
        const sr_expr *order[64];
        size_t cnt = expr_toposort(e, order, 64);
        for (size_t k = 0; k < cnt && k < 64; k++)
            seen[order[k]->op] = 1;
    }
    for (int op = 0; op < OP_COUNT; op++)
        cr_expect(seen[op], "no formula uses %s", expr_ops[op].name);
}

Test(parse, long_flat_input)
{
    /* Long, but not nested: 20000 terms. */
    size_t n = 20000;
    char *s = malloc(2 * n + 1);
    cr_assert_not_null(s);
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = 'b';
        s[2 * i + 1] = '+';
    }
    s[2 * n - 1] = '\0';
    sr_expr *e = parse_ok(s);
    cr_assert_eq(sr_expr_dim(e), 1);
    free(s);
}

Test(parse, nesting_limit)
{
    char s[1024];
    /* 200 levels are fine ... */
    int n = 0;
    for (int i = 0; i < 200; i++)
        s[n++] = '(';
    s[n++] = 'x';
    for (int i = 0; i < 200; i++)
        s[n++] = ')';
    s[n] = '\0';
    assert_parses_to(s, X());
    /* ... 201 are not */
    n = 0;
    for (int i = 0; i < 201; i++)
        s[n++] = '(';
    s[n++] = 'x';
    for (int i = 0; i < 201; i++)
        s[n++] = ')';
    s[n] = '\0';
    assert_fails(s, SR_EPARSE, "column 201: nesting deeper than 200", NULL);
}

Test(parse, deep_input_of_every_kind_is_refused)
{
    size_t n = 100000;
    char *s = malloc(4 * n + 2);
    cr_assert_not_null(s);
    static const char *const units[] = {"(", "-", "Exp(", "x**"};
    for (size_t u = 0; u < 4; u++) {
        size_t len = strlen(units[u]), k = 0;
        for (size_t i = 0; i < n; i++, k += len)
            memcpy(s + k, units[u], len);
        s[k++] = 'y';
        s[k] = '\0';
        assert_fails(s, SR_EPARSE, "nesting deeper than 200", NULL);
    }
    free(s);
}

/* ---- errors ---- */

Test(parse, bad_arguments)
{
    sr_expr *e = X();
    cr_assert_eq(sr_parse(ctx, NULL, NULL, 0, &e), SR_EINVAL);
    cr_assert_null(e);
    cr_assert(strstr(sr_ctx_error(ctx), "formula is NULL"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "x", NULL, 0, NULL), SR_EINVAL);
    cr_assert_eq(sr_parse(NULL, "1", NULL, 0, &e), SR_EINVAL);
    assert_fails_with("x", NULL, -1, SR_EINVAL, "naliases is -1", NULL);
    assert_fails_with("x", NULL, 2, SR_EINVAL, "aliases is NULL", NULL);
    const char *const with_null[] = {"x=Vi(3)", NULL};
    assert_fails_with("x", with_null, 2, SR_EINVAL, "alias 2 is NULL", NULL);
    /* NULL aliases with naliases 0 is fine */
    cr_assert_eq(sr_parse(ctx, "1", NULL, 0, &e), SR_OK);
}

Test(parse, syntax_errors)
{
    assert_fails("", SR_EPARSE, "column 1: the formula is empty", NULL);
    assert_fails("   ", SR_EPARSE, "column 4: the formula is empty", NULL);
    assert_fails("(x+y", SR_EPARSE, "column 5: expected ')' to close '(' at column 1",
                 "the end of the formula");
    assert_fails("Exp((x+y)*b", SR_EPARSE, "column 12: expected ')' to close '(' at column 4",
                 NULL);
    assert_fails("x y", SR_EPARSE, "column 3: expected an operator or the end", "'y'");
    assert_fails("x)", SR_EPARSE, "column 2: unmatched ')'", NULL);
    assert_fails("x+", SR_EPARSE, "column 3: expected a number, a name or '('", NULL);
    assert_fails("*x", SR_EPARSE, "column 1: expected a number, a name or '('", "'*'");
    assert_fails("+x", SR_EPARSE, "column 1:", "'+'");
    assert_fails("x**", SR_EPARSE, "column 4:", "end of the formula");
    assert_fails("x* *y", SR_EPARSE, "column 4:", NULL);
    assert_fails("x,y", SR_EPARSE, "column 2: expected an operator", NULL);
    assert_fails("x=y", SR_EPARSE, "column 2:", "'='");
    assert_fails("()", SR_EPARSE, "column 2: expected a number", NULL);
    assert_fails("x+$", SR_EPARSE, "column 3:", "'$'");
    assert_fails("x+\x01", SR_EPARSE, "column 3:", "byte 0x01");
    assert_fails("x+\xff\xfe", SR_EPARSE, "column 3:", "byte 0xff");
    assert_fails("2x", SR_EPARSE, "column 2:", "'x'");
    assert_fails("1.2.3", SR_EPARSE, "column 4:", NULL);
    assert_fails(".", SR_EPARSE, "column 1:", NULL);
    assert_fails("Exp(x y)", SR_EPARSE, "column 7: expected ')' to close '(' at column 4", NULL);
    assert_fails("Pow(x 2)", SR_EPARSE, "column 7: expected ',' after argument 1 of Pow", NULL);
    assert_fails("Exp(,x)", SR_EPARSE, "column 5: expected a number", NULL);
}

Test(parse, unknown_names)
{
    assert_fails("Epx(x)", SR_EPARSE, "column 1: unknown name 'Epx'", NULL);
    assert_fails("x+w", SR_EPARSE, "column 3: unknown name 'w'", NULL);
    assert_fails("exp(x)", SR_EPARSE, "unknown name 'exp'", "did you mean 'Exp'");
    assert_fails("add(x,y)", SR_EPARSE, "unknown name 'add'", "did you mean 'Add'");
    assert_fails("x(1)", SR_EPARSE, "column 1: 'x' is a variable, not a function", NULL);
    assert_fails("Exp+x", SR_EPARSE, "column 4: expected '(' after 'Exp'", NULL);
    assert_fails("Vi", SR_EPARSE, "column 3: expected '(' after 'Vi'", NULL);
    /* a very long name is quoted shortened */
    assert_fails("x+aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", SR_EPARSE,
                 "column 3: unknown name 'aaaaaaaaaaaaaaaaaaaaaaaa...'", NULL);
}

Test(parse, arity_errors)
{
    assert_fails("Exp(x,y)", SR_EPARSE, "column 1: Exp takes 1 operand, got 2", NULL);
    assert_fails("b+Exp(x,y,Exp(x,y))", SR_EPARSE, "column 3: Exp takes 1 operand, got 3", NULL);
    assert_fails("Exp()", SR_EPARSE, "Exp takes 1 operand, got 0", NULL);
    assert_fails("SqDist(x)", SR_EPARSE, "SqDist takes 2 operands, got 1", NULL);
    assert_fails("Clamp(x,y)", SR_EPARSE, "Clamp takes 3 operands, got 2", NULL);
    assert_fails("Pow(x)", SR_EPARSE, "Pow takes 1 operand and 1 integer (exponent), got 1", NULL);
    assert_fails("Extract(x,1)", SR_EPARSE, "1 operand and 2 integers (start, length), got 2",
                 NULL);
    assert_fails("Var(0,3)", SR_EPARSE, "Var takes 3 integers (index, dimension, category)", NULL);
    assert_fails("Vi(3)", SR_EPARSE, "Vi takes 2 integers (index, dimension), got 1", NULL);
    assert_fails("RatCst(1)", SR_EPARSE, "RatCst takes 2 integers", NULL);
    assert_fails("Cst(1,2)", SR_EPARSE, "Cst takes 1 number (value), got 2", NULL);
}

/* keopscore prints its formulas with a comma after the last argument. */
Test(parse, trailing_comma)
{
    sr_expr *x = X(), *y = Y();
    assert_parses_to("Abs(x,)", sr_abs(ctx, x));
    assert_parses_to("SqDist(x,y,)", sr_sqdist(ctx, x, y));
    assert_parses_to("Pow(x,3,)", sr_pow(ctx, x, 3));
    assert_parses_to("Exp(-Var(0,3,0,),)", sr_exp(ctx, sr_neg(ctx, sr_vi(ctx, 0, 3))));
    assert_parses_to("Sum(Abs(x,),)", sr_sum(ctx, sr_abs(ctx, x)));
    assert_fails("Abs(x,,)", SR_EPARSE, "Abs takes 1 operand", NULL);
    assert_fails("Abs(x,y)", SR_EPARSE, "Abs takes 1 operand, got 2", NULL);
    assert_fails("Abs(x,y,z)", SR_EPARSE, "Abs takes 1 operand, got 3", NULL);
    assert_fails("Abs(,)", SR_EPARSE, NULL, NULL);
    assert_fails("Exp(x,", SR_EPARSE, NULL, NULL);
}

Test(parse, literal_errors)
{
    assert_fails("Pow(x,2.0)", SR_EPARSE,
                 "column 7: Pow: expected an integer literal for the "
                 "exponent, found '2.0'",
                 NULL);
    assert_fails("Pow(x,y)", SR_EPARSE, "column 7: Pow: expected an integer literal", "'y'");
    assert_fails("Elem(x,-)", SR_EPARSE, "column 9: Elem: expected an integer literal", NULL);
    assert_fails("Cst(x)", SR_EPARSE, "Cst: expected a number literal for the value", NULL);
    assert_fails("99999999999999999999", SR_EPARSE,
                 "column 1: the integer literal '99999999999999999999' does not fit", NULL);
    assert_fails("x*9223372036854775808", SR_EPARSE, "column 3: the integer literal", NULL);
    assert_fails("IntCst(-9223372036854775809)", SR_EPARSE,
                 "integer literal '-9223372036854775809'", NULL);
    assert_fails("x**99999999999999999999", SR_EPARSE, "column 4: the integer literal", NULL);
    assert_fails("1e999", SR_EPARSE, "column 1: the real literal '1e999' is out of range", NULL);
    assert_fails("Cst(-1e999)", SR_EPARSE, "real literal '-1e999'", NULL);
    assert_fails("x**5000", SR_EPARSE, "column 2: Pow: exponent 5000 is not in", NULL);
    assert_fails("RatCst(1,0)", SR_EPARSE, "column 1: RatCst: the denominator is 0", NULL);
    assert_fails("ClampInt(x,2,1)", SR_EPARSE, "ClampInt: lower bound 2 is above", NULL);
    assert_fails("Round(x,1000)", SR_EPARSE, "Round: 1000 decimals", NULL);
    assert_fails("Var(70000,1,0)", SR_EPARSE, "Var: index 70000 is not in", NULL);
    assert_fails("Var(0,1,3)", SR_EPARSE, "Var: category 3", NULL);
    assert_fails("Vi(0,0)", SR_EDIM, "column 1: Vi: dimension 0 is not positive", NULL);
    assert_fails("Vi(0,99999999999)", SR_EDIM, "dimension 99999999999 is too large", NULL);
}

Test(parse, dimension_errors)
{
    assert_fails("x+z", SR_EDIM, "column 2: Add: operand dimensions 3 and 2 do not match", NULL);
    assert_fails("b*(x-z)", SR_EDIM, "column 5: Subtract: operand dimensions 3 and 2", NULL);
    assert_fails("SqDist(x,z)", SR_EDIM, "column 1: SqDist: operand dimensions 3 and 2", NULL);
    assert_fails("x|z", SR_EDIM, "column 2: Scalprod", NULL);
    assert_fails("Elem(x,3)", SR_EDIM, "column 1: Elem: index 3 is out of range", NULL);
    assert_fails("Extract(x,1,3)", SR_EDIM, "Extract: start 1 and length 3", NULL);
    assert_fails("OneHot(x,3)", SR_EDIM, "OneHot: the operand must have dimension 1", NULL);
    /* one index with two dimensions or categories */
    assert_fails("x+Var(0,2,0)", SR_EDIM,
                 "column 3: variable index 0 is used as Vi of dimension 2 here, but as Vi of "
                 "dimension 3 at column 1",
                 NULL);
    assert_fails("Vi(7,2)*Exp(Vj(7,2))", SR_EDIM, "column 13: variable index 7 is used as Vj",
                 NULL);
}

Test(parse, alias_errors)
{
    const char *const a1[] = {"x=Vi(3)", "y=Vj(3"};
    assert_fails_with("x", a1, 2, SR_EPARSE, "alias 2 'y=Vj(3': column 7: expected ')'", NULL);
    const char *const a2[] = {"x=Vi(3)", "x=Vj(3)"};
    assert_fails_with("x", a2, 2, SR_EPARSE, "alias 2 'x=Vj(3)': column 1: the name 'x'",
                      "already declared by alias 1");
    const char *const a3[] = {"Exp=Vi(3)"};
    assert_fails_with("1", a3, 1, SR_EPARSE, "'Exp' is a function name", NULL);
    const char *const a3b[] = {"Vj=Vi(3)"};
    assert_fails_with("1", a3b, 1, SR_EPARSE, "'Vj' is a function name", NULL);
    const char *const a4[] = {"x=Vi(3)", "y=Vj(0,2)"};
    assert_fails_with("x", a4, 2, SR_EPARSE, "alias 2 'y=Vj(0,2)': column 3: index 0",
                      "alias 1 declared it as Vi of dimension 3");
    const char *const a5[] = {"x=Vi(0,3)", "y=Vj(2,3)"};
    assert_fails_with("x", a5, 2, SR_EPARSE, "no alias declares index 1", NULL);
    const char *const a6[] = {"x=Vi(1,2,3)"};
    assert_fails_with("1", a6, 1, SR_EPARSE, "alias 1 'x=Vi(1,2,3)': column 3: Vi takes 1 or 2",
                      NULL);
    const char *const a7[] = {"x=Var(1,2)"};
    assert_fails_with("1", a7, 1, SR_EPARSE, "Var takes 3 integers", NULL);
    const char *const a8[] = {"x=Foo(3)"};
    assert_fails_with("1", a8, 1, SR_EPARSE, "column 3: expected Vi, Vj, Pm or Var", NULL);
    const char *const a9[] = {"x:Vi(3)"};
    assert_fails_with("1", a9, 1, SR_EPARSE, "column 2: expected '='", NULL);
    const char *const a10[] = {"x=Vi(3) z"};
    assert_fails_with("1", a10, 1, SR_EPARSE, "column 9: expected the end of the alias", NULL);
    const char *const a11[] = {""};
    assert_fails_with("1", a11, 1, SR_EPARSE, "alias 1 '': column 1: expected a name", NULL);
    const char *const a12[] = {"x=Vi(0)"};
    assert_fails_with("1", a12, 1, SR_EDIM, "Vi: dimension 0 is not positive", NULL);
    const char *const a13[] = {"x=Vi(2.5)"};
    assert_fails_with("1", a13, 1, SR_EPARSE, "expected an integer literal", NULL);
    const char *const a14[] = {"x=Vi(-1,3)"};
    assert_fails_with("1", a14, 1, SR_EPARSE, "Var: index -1 is not in", NULL);
    const char *const a15[] = {"x=Vi(3)\x01 and a long tail of text that goes on"};
    assert_fails_with("1", a15, 1, SR_EPARSE, "alias 1 'x=Vi(3)? and a long", "byte 0x01");
    const char *const a16[] = {"x=Vi"};
    assert_fails_with("1", a16, 1, SR_EPARSE, "column 5: expected '(' after 'Vi'", NULL);
}

Test(parse, failed_parse_is_reported_by_kernel_new)
{
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "x+z", std_aliases, NSTD, &e), SR_EDIM);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, e, &d, &k), SR_EDIM, "%s", sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "column 2: Add"), "message: %s", sr_ctx_error(ctx));
    cr_assert_null(k);
}

Test(parse, context_stays_usable_after_errors)
{
    assert_fails("Exp(", SR_EPARSE, NULL, NULL);
    assert_parses_to("Exp(x)", sr_exp(ctx, X()));
}

/* ---- random input ---- */

Test(parse, random_token_soup_never_crashes)
{
    static const char *const soup[] = {"x",       "y",      "b",        "g",
                                       "z",       "w",      "Exp",      "SqDist",
                                       "Pow",     "Var",    "Vi",       "Vj",
                                       "Pm",      "IntCst", "RatCst",   "Cst",
                                       "Extract", "OneHot", "Clamp",    "WeightedSqDist",
                                       "Elem",    "Sum",    "Scalprod", "Concat",
                                       "Add",     "0",      "1",        "2",
                                       "3",       "-1",     "0.5",      "1e3",
                                       "2.",      ".5",     "1e999",    "99999999999999999999",
                                       "+",       "-",      "*",        "/",
                                       "|",       "**",     "(",        "(",
                                       ")",       ")",      ",",        ",",
                                       " ",       "=",      "\x01",     "\xff",
                                       "$",       "e",      "E",        ".",
                                       "\t",      "_a1"};
    const size_t nsoup = sizeof soup / sizeof soup[0];
    uint64_t rng = 7;
    char s[512];
    int ok = 0, failed = 0;
    for (int t = 0; t < 20000; t++) {
        size_t n = 0;
        int ntok = 1 + (int)(tu_rand(&rng) % 24);
        for (int i = 0; i < ntok; i++) {
            const char *piece = soup[tu_rand(&rng) % nsoup];
            size_t len = strlen(piece);
            if (n + len >= sizeof s)
                break;
            memcpy(s + n, piece, len);
            n += len;
        }
        s[n] = '\0';
        sr_expr *e = NULL;
        sr_status st = sr_parse(ctx, s, std_aliases, NSTD, &e);
        if (st == SR_OK) {
            ok++;
            cr_assert_not_null(e, "'%s': SR_OK without a node", s);
            char buf[2048], buf2[2048];
            size_t len = sr_expr_print(e, buf, sizeof buf);
            cr_assert_lt(len, sizeof buf);
            sr_expr *back = NULL;
            cr_assert_eq(sr_parse(ctx, buf, NULL, 0, &back), SR_OK, "'%s' -> '%s': %s", s, buf,
                         sr_ctx_error(ctx));
            sr_expr_print(back, buf2, sizeof buf2);
            cr_assert_eq(back, e, "'%s' -> '%s' -> '%s'", s, buf, buf2);
        } else {
            failed++;
            cr_assert(st == SR_EPARSE || st == SR_EDIM, "'%s': status %d", s, st);
            cr_assert_null(e, "'%s': *out not NULL on failure", s);
            const char *msg = sr_ctx_error(ctx);
            cr_assert(msg[0] != '\0', "'%s': empty message", s);
            cr_assert(strstr(msg, "column ") != NULL, "'%s': no column in '%s'", s, msg);
        }
    }
    /* the soup must exercise both outcomes */
    cr_assert_gt(ok, 100, "only %d of 20000 random formulas parsed", ok);
    cr_assert_gt(failed, 100, "only %d of 20000 random formulas failed", failed);
}

Test(parse, positional_and_explicit_aliases_mix)
{
    const char *const aliases[] = {"x=Vi(3)", "y=Vj(1,3)", "p=Pm(1)"};
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "x*p+y", aliases, 3, &e), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(e, sr_add(ctx, sr_mul(ctx, X(), sr_pm(ctx, 2, 1)), Y()));
}

Test(parse, same_text_same_node)
{
    sr_expr *a = parse_ok("Exp(-SqDist(x,y)*g)*b");
    sr_expr *b = parse_ok("Exp( - SqDist(x, y) * g ) * b");
    cr_assert_eq(a, b);
    /* a Var written inline is the alias's node */
    cr_assert_eq(parse_ok("Exp(-SqDist(Var(0,3,0),Vj(1,3))*Pm(3,1))*b"), a);
}

Test(parse, huge_alias_list)
{
    enum { N = 3000 };
    char(*texts)[32] = malloc(N * sizeof *texts);
    const char **ptrs = malloc(N * sizeof *ptrs);
    cr_assert(texts && ptrs);
    for (int i = 0; i < N; i++) {
        snprintf(texts[i], sizeof texts[i], "v%d=V%c(%d)", i, i % 2 ? 'j' : 'i', 1 + i % 4);
        ptrs[i] = texts[i];
    }
    sr_expr *e = NULL;
    cr_assert_eq(sr_parse(ctx, "v2999*v0+v1235", ptrs, N, &e), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(
        e, sr_add(ctx, sr_mul(ctx, sr_vj(ctx, 2999, 4), sr_vi(ctx, 0, 1)), sr_vj(ctx, 1235, 4)));
    snprintf(texts[N - 1], sizeof texts[N - 1], "v17=Pm(1)");
    cr_assert_eq(sr_parse(ctx, "v0", ptrs, N, &e), SR_EPARSE);
    cr_assert(strstr(sr_ctx_error(ctx), "alias 3000 'v17=Pm(1)': column 1: the name 'v17' is "
                                        "already declared by alias 18"),
              "message: %s", sr_ctx_error(ctx));
    free(texts);
    free(ptrs);
}

/* ---- KeOps' other spellings, TensorDot's lists, and the functions symred lacks ---- */

Test(parse, keops_derived_functions)
{
    sr_expr *x = X(), *y = Y();
    assert_parses_to("SqNormIso(g,x)", sr_weightedsqnorm(ctx, G(), x));
    assert_parses_to("SqNormDiag(y,x)", sr_weightedsqnorm(ctx, y, x));
    assert_parses_to("SymSqNorm(TensorProd(y,y),x)",
                     sr_weightedsqnorm(ctx, sr_tensorprod(ctx, y, y), x));
    assert_parses_to("IntInv(4)", sr_ratcst(ctx, 1, 4));
    assert_parses_to("Zero(1)", sr_intcst(ctx, 0));
    assert_parses_to("Zero(4)", sr_onehot(ctx, sr_intcst(ctx, -1), 4));
    /* DiffClampInt is an op of its own (one node), not KeOps' definition through comparisons */
    assert_parses_to("DiffClampInt(x,-1,2)",
                     expr_make(ctx, OP_DIFFCLAMPINT, &x, (int64_t[]){-1, 2}, 0, 0.0));
    /* Kron = TensorDot with the axes of a and b interleaved (np.kron) */
    int d[2] = {1, 3}, e[2] = {1, 2}, perm[4] = {0, 2, 1, 3};
    sr_expr *z = sr_vj(ctx, 4, 2);
    assert_parses_to("Kron(x,z,[1,3],[1,2])",
                     sr_tensordot(ctx, x, z, 2, d, 2, e, 0, NULL, NULL, perm));
    /* an identity permute is the same node as none */
    int d3[1] = {3}, c0[1] = {0}, id[2] = {0, 1};
    sr_expr *m = sr_tensorprod(ctx, x, z);
    int dm[2] = {3, 2};
    assert_parses_to("TensorDot(TensorProd(x,z),y,[3,2],[3],[0],[0],[0])",
                     sr_tensordot(ctx, m, y, 2, dm, 1, d3, 1, c0, c0, NULL));
    assert_parses_to("TensorDot(x,z,[3],[2],[],[],[0,1])",
                     sr_tensordot(ctx, x, z, 1, d3, 1, (int[]){2}, 0, NULL, NULL, id));
    sr_expr *gm = parse_ok("GradMatrix(Sin(x)*2,x)");
    cr_assert_eq(gm->dim, 9);
    cr_assert_eq(parse_ok("Divergence(x*x,x)")->dim, 1);
    cr_assert_eq(parse_ok("Laplacian(SqNorm2(x),x)")->dim, 1);
}

/* KeOps formulas are Python expressions: x<y is LessThan(x,y), x>y is LessThan(y,x). */
Test(parse, comparison_operators_and_keops_names)
{
    sr_expr *x = X(), *y = Y(), *b = B();
    assert_parses_to("x<y", sr_less(ctx, x, y));
    assert_parses_to("x <= y", sr_lesseq(ctx, x, y));
    assert_parses_to("x>y", sr_greater(ctx, x, y));
    assert_parses_to("x>=b", sr_greatereq(ctx, x, b));
    assert_parses_to("LessThan(x,y)", sr_less(ctx, x, y));
    assert_parses_to("LessOrEqual(x,b)", sr_lesseq(ctx, x, b));
    /* below + and | (as in Python), usable as an argument */
    assert_parses_to("x+y<b*2", sr_less(ctx, sr_add(ctx, x, y), sr_mul(ctx, b, sr_intcst(ctx, 2))));
    assert_parses_to("x|y<b", sr_less(ctx, sr_scalprod(ctx, x, y), b));
    assert_parses_to("IfElse(x<y,x,y)", sr_ifelse(ctx, sr_less(ctx, x, y), x, y));
    assert_parses_to("-x<-y", sr_less(ctx, sr_neg(ctx, x), sr_neg(ctx, y)));
    assert_fails("x<y<b", SR_EPARSE, "column 4:", "do not chain");
    assert_fails("x<", SR_EPARSE, "column 3:", NULL);
    assert_fails("x=<y", SR_EPARSE, NULL, NULL);
}

/* keopscore's names of the infix ops are functions too (pykeops writes Minus(x)); they print
 * infix. */
Test(parse, infix_ops_as_functions)
{
    sr_expr *x = X(), *y = Y();
    assert_parses_to("Add(x,y)", sr_add(ctx, x, y));
    assert_parses_to("Subtract(x,y)", sr_sub(ctx, x, y));
    assert_parses_to("Mult(x,y)", sr_mul(ctx, x, y));
    assert_parses_to("Divide(x,y)", sr_div(ctx, x, y));
    assert_parses_to("Minus(Exp(x))", sr_neg(ctx, sr_exp(ctx, x)));
    assert_fails("Minus(x,y)", SR_EPARSE, "Minus takes 1 operand", NULL);
    const char *const al[] = {"Mult=Vi(3)"};
    assert_fails_with("Mult", al, 1, SR_EPARSE, "function name", NULL);
}

Test(parse, keops_derived_function_errors)
{
    assert_fails("SqNormIso(y,x)", SR_EDIM, "SqNormIso", "dimension 3");
    assert_fails("SqNormDiag(z,x)", SR_EDIM, "SqNormDiag", NULL);
    assert_fails("SymSqNorm(y,x)", SR_EDIM, "SymSqNorm", "needs 9");
    assert_fails("DiffClampInt(x,1)", SR_EPARSE, "DiffClampInt", NULL);
    assert_fails("Zero(0)", SR_EDIM, "Zero", "not positive");
    assert_fails("x+Zero(2)", SR_EDIM, NULL, NULL);
    assert_fails("Laplacian(x,x)", SR_EDIM, "Laplacian", NULL);
    assert_fails("Divergence(z,x)", SR_EDIM, "Divergence", NULL);
    assert_fails("GradMatrix(x,x+y)", SR_EPARSE, "GradMatrix", "variable");
    /* One gradient per component: a huge dimension is refused at once, not built. */
    assert_fails("GradMatrix(Var(0,8628455,0),y)", SR_EDIM, "GradMatrix", "at most 1024");
    assert_fails("Divergence(Var(0,1025,0),Var(0,1025,0))", SR_EDIM, "Divergence", "at most 1024");
    assert_fails("Laplacian(SqNorm2(Var(0,5000,0)),Var(0,5000,0))", SR_EDIM, "Divergence",
                 "dimension 5000");
}

/* Builder errors of kind EINVAL are parse errors in the parser (see built() in parse.c). */
Test(parse, tensordot_errors)
{
    assert_fails("TensorDot(x,y,[3],[3],[0])", SR_EPARSE, "TensorDot", "list");
    assert_fails("TensorDot(x,y,3,[3],[0],[0])", SR_EPARSE, "list of integers", "dimensions of a");
    assert_fails("TensorDot(x,y,[3,1],[3],[0],[0]", SR_EPARSE, "TensorDot", "')'");
    assert_fails("TensorDot(x,y,[2],[3],[0],[0])", SR_EDIM, "TensorDot", "3");
    assert_fails("TensorDot(x,z,[3],[2],[0],[0])", SR_EDIM, "size 3", "size 2");
    assert_fails("TensorDot(x,y,[3],[3],[1],[0])", SR_EPARSE, "contracted axes", NULL);
    assert_fails("TensorDot(x,y,[3],[3],[0],[])", SR_EDIM, "1 contracted axes of a but 0", NULL);
    assert_fails("TensorDot(x,y,[3],[3],[],[],[0,0])", SR_EPARSE, "permutation", NULL);
    assert_fails("TensorDot(x,y,[3],[3],[],[],[0])", SR_EDIM, "permute has 1", NULL);
    assert_fails("TensorDot(x,y,[3],[3],[],[],[1,2])", SR_EPARSE, "permutation", NULL);
    assert_fails("TensorDot(x,y,[3,0],[3],[],[])", SR_EDIM, "not >= 1", NULL);
    assert_fails("Kron(x,y,[3],[1,3])", SR_EDIM, "Kron", "ranks");
    assert_fails("ElemT(x,3,1)", SR_EDIM, "ElemT", "dimension 1");
    assert_fails("ElemT(b,3,3)", SR_EDIM, "ElemT", "out of range");
    assert_fails("ExtractT(x,1,3)", SR_EDIM, "ExtractT", NULL);
    assert_fails("SumT(x,3)", SR_EDIM, "SumT", NULL);
    /* complex operands have even dimensions; a complex scalar broadcasts, nothing else does */
    assert_fails("ComplexMult(x,y)", SR_EDIM, "ComplexMult", "even");
    assert_fails("Conj(x)", SR_EDIM, "Conj", "dimension 3");
    assert_fails("ComplexAdd(Concat(z,z),Concat(z,Concat(z,z)))", SR_EDIM, "ComplexAdd", "4 and 6");
    assert_fails("ComplexScal(Concat(z,z),Concat(z,z))", SR_EDIM, "ComplexScal", "complex scalar");
    assert_fails("ComplexRealScal(z,x)", SR_EDIM, "ComplexRealScal", "real scalar");
    assert_fails("ComplexSumT(z,5)", SR_EDIM, "ComplexSumT", "even");
    assert_fails("ComplexSumT(Concat(z,z),4)", SR_EDIM, "ComplexSumT", "dimension 2");
    assert_fails("ComplexReal(b)", SR_EDIM, "ComplexReal", "even");
}

Test(parse, complex_scalars_go_first)
{
    /* ComplexRealScal(f, g) with the scalar second is the same node as with it first (KeOps
     * swaps the operands); likewise ComplexScal's complex scalar. */
    sr_expr *a = parse_ok("ComplexRealScal(Concat(z,z),b)"),
            *b = parse_ok("ComplexRealScal(b,Concat(z,z))");
    cr_assert_eq(a, b);
    cr_assert_eq(a->child[0]->dim, 1);
    sr_expr *c = parse_ok("ComplexScal(Concat(z,z),z)"),
            *d = parse_ok("ComplexScal(z,Concat(z,z))");
    cr_assert_eq(c, d);
    cr_assert_eq(c->child[0]->dim, 2);
    cr_assert_eq(sr_expr_dim(c), 4);
}

Test(parse, keops_functions_symred_lacks_are_named)
{
    assert_fails("BSpline(x,b,2)", SR_EPARSE, "'BSpline'", "not implemented");
    assert_fails("SoftDTW_SqDist(x,y,g)", SR_EPARSE, "'SoftDTW_SqDist'", NULL);
}
