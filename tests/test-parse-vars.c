/* test-parse-vars.c — sr_parse_ex (the variable table of a formula and its aliases, the category
 * of GradFromPos' gradient input) and sr_expr_var, which the bindings use instead of reading
 * formula text. */
#include <criterion/criterion.h>

#include "symred.h"

#include <string.h>

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(parse_vars, .init = setup, .fini = teardown);

static const char *const aliases[] = {"x = Vi(3)", " y=Vj( 3 )", "b = Vj(1)", "g=Pm(1)"};

static sr_expr *parse_ex(const char *formula, const char *const *al, int nal, sr_parse_desc *d)
{
    sr_expr *e = NULL;
    sr_status st = sr_parse_ex(ctx, formula, al, nal, d, &e);
    cr_assert_eq(st, SR_OK, "'%s': status %d: %s", formula, st, sr_ctx_error(ctx));
    cr_assert_not_null(e);
    return e;
}

static void expect_var(const sr_parse_var *v, int index, int dim, sr_cat cat, int alias)
{
    cr_expect_eq(v->index, index, "index %d, want %d", v->index, index);
    cr_expect_eq(v->dim, dim, "index %d: dim %d, want %d", index, v->dim, dim);
    cr_expect_eq(v->cat, cat, "index %d: cat %d, want %d", index, (int)v->cat, (int)cat);
    cr_expect_eq(v->alias, alias, "index %d: alias %d, want %d", index, v->alias, alias);
}

Test(parse_vars, aliases_and_var_calls_in_index_order)
{
    sr_parse_var vars[8];
    sr_parse_desc d = {.vars = vars, .vars_cap = 8};
    /* Var(5, 2, 1) and Vi(4, 2) are named by the formula only; b (2) is declared, not used. */
    parse_ex("Exp(-g*SqDist(x,y)) * Var(5, 2, 1) * Vi(4,2)", aliases, 4, &d);
    cr_assert_eq(d.nvars, 6, "nvars %d", d.nvars);
    expect_var(&vars[0], 0, 3, SR_CAT_I, 0);
    expect_var(&vars[1], 1, 3, SR_CAT_J, 1);
    expect_var(&vars[2], 2, 1, SR_CAT_J, 2);
    expect_var(&vars[3], 3, 1, SR_CAT_PARAM, 3);
    expect_var(&vars[4], 4, 2, SR_CAT_I, -1);
    expect_var(&vars[5], 5, 2, SR_CAT_J, -1);
}

Test(parse_vars, explicit_alias_indices)
{
    const char *const al[] = {"v = Var(1, 3, 1)", "p=Pm(0,2)"};
    sr_parse_var vars[2];
    sr_parse_desc d = {.vars = vars, .vars_cap = 2};
    parse_ex("v", al, 2, &d);
    cr_assert_eq(d.nvars, 2);
    expect_var(&vars[0], 0, 2, SR_CAT_PARAM, 1);
    expect_var(&vars[1], 1, 3, SR_CAT_J, 0);
}

Test(parse_vars, table_too_small_gives_the_count)
{
    sr_parse_var vars[1] = {{.index = -7}};
    sr_parse_desc d = {.vars = vars, .vars_cap = 1};
    parse_ex("x*b", aliases, 4, &d);
    cr_expect_eq(d.nvars, 4);
    expect_var(&vars[0], 0, 3, SR_CAT_I, 0);
    sr_parse_desc none = {0};
    parse_ex("x*b", aliases, 4, &none);
    cr_expect_eq(none.nvars, 4);
}

Test(parse_vars, a_zero_gradient_keeps_its_variables)
{
    /* pykeops' own test: the second derivative of a linear function is zero, so the expanded
     * formula reads x only, yet the call takes the arrays of indices 1..3. */
    const char *const al[] = {"x=Vi(0,3)"};
    sr_parse_var vars[4];
    sr_parse_desc d = {.vars = vars, .vars_cap = 4};
    sr_expr *e = parse_ex("Grad(Grad(x + Var(1,3,1), x, Var(2,3,0)), x, Var(3,3,0))", al, 1, &d);
    cr_assert_eq(d.nvars, 4);
    expect_var(&vars[1], 1, 3, SR_CAT_J, -1);
    expect_var(&vars[2], 2, 3, SR_CAT_I, -1);
    expect_var(&vars[3], 3, 3, SR_CAT_I, -1);
    cr_expect_eq(sr_expr_category(e), SR_DEP_CONST);
}

Test(parse_vars, gradfrompos_input_takes_the_given_category)
{
    const char *f = "GradFromPos(Exp(-g*SqDist(x,y))*b, x, 4)";
    sr_parse_var vars[5];
    sr_parse_desc d = {.vars = vars, .vars_cap = 5};
    sr_expr *ei = parse_ex(f, aliases, 4, &d);
    cr_assert_eq(d.nvars, 5);
    expect_var(&vars[4], 4, 1, SR_CAT_I, -1);
    d.gradin_cat = SR_CAT_J;
    sr_expr *ej = parse_ex(f, aliases, 4, &d);
    expect_var(&vars[4], 4, 1, SR_CAT_J, -1);
    /* The same as writing the input out, and sr_parse keeps KeOps' Vi. */
    cr_expect_eq(ej, parse_ex("Grad(Exp(-g*SqDist(x,y))*b, x, Vj(4,1))", aliases, 4, &d));
    sr_expr *plain = NULL;
    cr_assert_eq(sr_parse(ctx, f, aliases, 4, &plain), SR_OK);
    cr_expect_eq(plain, ei);
    cr_expect_neq(ei, ej);
    /* Nested: the inner input is declared first and used by the outer gradient. */
    sr_parse_desc n = {.vars = vars, .vars_cap = 5, .gradin_cat = SR_CAT_J};
    parse_ex("GradFromPos(GradFromPos(Exp(-SqDist(x,y)), y, 2), y, 3)",
             (const char *const[]){"x=Vi(3)", "y=Vj(3)"}, 2, &n);
    cr_assert_eq(n.nvars, 4);
    expect_var(&vars[2], 2, 1, SR_CAT_J, -1);
    expect_var(&vars[3], 3, 3, SR_CAT_J, -1);
}

Test(parse_vars, errors)
{
    sr_expr *e = NULL;
    sr_parse_desc bad = {.gradin_cat = SR_CAT_PARAM};
    cr_expect_eq(sr_parse_ex(ctx, "x", aliases, 4, &bad, &e), SR_EINVAL);
    cr_expect(strstr(sr_ctx_error(ctx), "gradin_cat"), "%s", sr_ctx_error(ctx));
    cr_expect_eq(sr_parse_ex(ctx, "x", aliases, 4, NULL, &e), SR_EINVAL);
    sr_parse_desc nul = {.vars_cap = 3};
    cr_expect_eq(sr_parse_ex(ctx, "x", aliases, 4, &nul, &e), SR_EINVAL);
    cr_expect_null(e);
    /* A parse error leaves no table. */
    sr_parse_var vars[4];
    sr_parse_desc d = {.vars = vars, .vars_cap = 4, .nvars = 99};
    cr_expect_eq(sr_parse_ex(ctx, "x +", aliases, 4, &d, &e), SR_EPARSE);
    cr_expect_eq(d.nvars, 0);
    /* An index declared by an alias and written otherwise in the formula (also in sr_parse). */
    cr_expect_eq(sr_parse_ex(ctx, "x * Var(2, 3, 0)", aliases, 4, &d, &e), SR_EDIM);
    cr_expect(strstr(sr_ctx_error(ctx), "alias 3 declares it as Vj of dimension 1"), "%s",
              sr_ctx_error(ctx));
    cr_expect_eq(sr_parse(ctx, "x * Var(2, 3, 0)", aliases, 4, &e), SR_EDIM);
    cr_expect_eq(sr_parse(ctx, "GradFromPos(SqDist(x,y), x, 2)", aliases, 4, &e), SR_EDIM);
}

Test(parse_vars, expr_var_reads_variable_nodes)
{
    int index = -1, dim = -1;
    sr_cat cat = SR_CAT_PARAM;
    cr_assert_eq(sr_expr_var(sr_vj(ctx, 7, 4), &index, &cat, &dim), SR_OK);
    cr_expect_eq(index, 7);
    cr_expect_eq(cat, SR_CAT_J);
    cr_expect_eq(dim, 4);
    sr_expr *x = parse_ex("x", aliases, 4, &(sr_parse_desc){0});
    cr_assert_eq(sr_expr_var(x, &index, NULL, NULL), SR_OK);
    cr_expect_eq(index, 0);
    cr_expect_eq(sr_expr_var(sr_exp(ctx, x), &index, &cat, &dim), SR_EINVAL);
    cr_expect_eq(index, 0, "nothing written on failure");
    cr_expect_eq(sr_expr_var(NULL, NULL, NULL, NULL), SR_EINVAL);
}
