/* test-hashcons.c — interning: equal formulas are equal pointers. */
#include <criterion/criterion.h>

#include "symred.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(hashcons, .init = setup, .fini = teardown);

Test(hashcons, same_formula_same_node)
{
    sr_expr *a = sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3))));
    sr_expr *b = sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3))));
    cr_assert_not_null(a);
    cr_assert_eq(a, b, "the same formula built twice must be one node");
}

Test(hashcons, different_attributes_differ)
{
    sr_expr *x = sr_vi(ctx, 0, 3);
    cr_assert_neq(sr_pow(ctx, x, 2), sr_pow(ctx, x, 3));
    cr_assert_neq(sr_vi(ctx, 0, 3), sr_vj(ctx, 0, 3));
    cr_assert_neq(sr_vi(ctx, 0, 3), sr_vi(ctx, 0, 2));
    cr_assert_neq(sr_const(ctx, 1.5), sr_const(ctx, 2.5));
    cr_assert_eq(sr_const(ctx, 0.0), sr_const(ctx, -0.0), "-0.0 and 0.0 are one constant");
}

Test(hashcons, ratcst_is_reduced)
{
    cr_assert_eq(sr_ratcst(ctx, 2, 4), sr_ratcst(ctx, 1, 2));
    cr_assert_eq(sr_ratcst(ctx, 1, -2), sr_ratcst(ctx, -1, 2));
}

Test(hashcons, shared_subexpressions)
{
    sr_expr *d = sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3));
    sr_expr *f = sr_add(ctx, sr_exp(ctx, d), sr_sqrt(ctx, d));
    cr_assert_not_null(f);
    cr_assert_eq(sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3)), d);
}

Test(hashcons, many_nodes_survive_table_growth)
{
    sr_expr *nodes[2000];
    for (int i = 0; i < 2000; i++)
        nodes[i] = sr_add(ctx, sr_vi(ctx, 0, 1), sr_intcst(ctx, i));
    for (int i = 0; i < 2000; i++)
        cr_assert_eq(sr_add(ctx, sr_vi(ctx, 0, 1), sr_intcst(ctx, i)), nodes[i], "node %d", i);
}

Test(hashcons, categories)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *g = sr_pm(ctx, 2, 1);
    cr_assert_eq(sr_expr_category(sr_intcst(ctx, 2)), SR_DEP_CONST);
    cr_assert_eq(sr_expr_category(g), SR_DEP_PARAM);
    cr_assert_eq(sr_expr_category(sr_mul(ctx, x, g)), SR_DEP_I);
    cr_assert_eq(sr_expr_category(sr_sqnorm2(ctx, y)), SR_DEP_J);
    cr_assert_eq(sr_expr_category(sr_sqdist(ctx, x, y)), SR_DEP_IJ);
}
