/*
 * named.c — the named kernel formulas (sr_formula): Gaussian, Laplace, Matérn, Cauchy, ...
 * built from primitives, so that they go through the simplifier like any user formula.
 */
#include "formulas.h"

#include <math.h>
#include <string.h>

enum named_param { NP_NONE, NP_SCALE, NP_DEGREE };

struct named_formula {
    const char *name;
    enum named_param param;
    sr_expr *(*build)(sr_ctx *ctx, sr_expr *x, sr_expr *y, sr_expr *g);
};

/* r^2 * g and r * g, with r = |x - y|. */
static sr_expr *sq_scaled(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_mul(c, sr_sqdist(c, x, y), g);
}
static sr_expr *r_scaled(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_mul(c, sr_norm2(c, sr_sub(c, x, y)), g);
}

static sr_expr *gaussian(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_exp(c, sr_neg(c, sq_scaled(c, x, y, g)));
}
static sr_expr *laplace(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_exp(c, sr_neg(c, r_scaled(c, x, y, g)));
}
/* Matérn ν = 3/2 and 5/2 with s = r·g: (1 + √3 s) e^{−√3 s}, (1 + √5 s + 5/3 s²) e^{−√5 s}. */
static sr_expr *matern32(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    sr_expr *t = sr_mul(c, sr_const(c, sqrt(3.0)), r_scaled(c, x, y, g));
    return sr_mul(c, sr_add(c, sr_intcst(c, 1), t), sr_exp(c, sr_neg(c, t)));
}
static sr_expr *matern52(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    sr_expr *t = sr_mul(c, sr_const(c, sqrt(5.0)), r_scaled(c, x, y, g));
    sr_expr *poly =
        sr_add(c, sr_add(c, sr_intcst(c, 1), t), sr_mul(c, sr_ratcst(c, 1, 3), sr_square(c, t)));
    return sr_mul(c, poly, sr_exp(c, sr_neg(c, t)));
}
static sr_expr *cauchy(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_inv(c, sr_add(c, sr_intcst(c, 1), sq_scaled(c, x, y, g)));
}
static sr_expr *imq(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_rsqrt(c, sr_add(c, sr_intcst(c, 1), sq_scaled(c, x, y, g)));
}
static sr_expr *polynomial(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *d)
{
    return sr_powf(c, sr_add(c, sr_scalprod(c, x, y), sr_intcst(c, 1)), d);
}
static sr_expr *linear(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_scalprod(c, x, y);
}
static sr_expr *cosine(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_scalprod(c, sr_normalize(c, x), sr_normalize(c, y));
}
static sr_expr *l1(sr_ctx *c, sr_expr *x, sr_expr *y, sr_expr *g)
{
    return sr_sum(c, sr_abs(c, sr_sub(c, x, y)));
}

static const struct named_formula named[] = {
    {"gaussian", NP_SCALE, gaussian},      {"rbf", NP_SCALE, gaussian},
    {"laplace", NP_SCALE, laplace},        {"matern12", NP_SCALE, laplace},
    {"matern32", NP_SCALE, matern32},      {"matern52", NP_SCALE, matern52},
    {"cauchy", NP_SCALE, cauchy},          {"imq", NP_SCALE, imq},
    {"polynomial", NP_DEGREE, polynomial}, {"linear", NP_NONE, linear},
    {"cosine", NP_NONE, cosine},           {"l1", NP_NONE, l1},
};

sr_expr *sr_formula(sr_ctx *ctx, const char *name, sr_expr *x, sr_expr *y, sr_expr *param)
{
    if (!ctx)
        return NULL;
    if (!name) {
        expr_builder_error(ctx, SR_EINVAL, "sr_formula: the name is NULL");
        return NULL;
    }
    const struct named_formula *nf = NULL;
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if (strcmp(named[i].name, name) == 0)
            nf = &named[i];
    if (!nf) {
        expr_builder_error(ctx, SR_EINVAL,
                           "sr_formula: unknown formula \"%s\" (known: gaussian, rbf, laplace, "
                           "matern12, matern32, matern52, cauchy, imq, polynomial, linear, "
                           "cosine, l1)",
                           name);
        return NULL;
    }
    if (!x || !y)
        return NULL; /* an earlier builder failed and said why */
    if (nf->param != NP_NONE) {
        if (!param) {
            if (expr_ctx(ctx)->err.pending == SR_OK)
                expr_builder_error(ctx, SR_EINVAL, "sr_formula(%s): the parameter is NULL", name);
            return NULL;
        }
        if (param->dim != 1) {
            expr_builder_error(ctx, SR_EDIM,
                               "sr_formula(%s): the parameter must have dimension 1, not %d", name,
                               param->dim);
            return NULL;
        }
    }
    if (x->dim != y->dim) {
        expr_builder_error(ctx, SR_EDIM, "sr_formula(%s): x and y have dimensions %d and %d", name,
                           x->dim, y->dim);
        return NULL;
    }
    return nf->build(ctx, x, y, param);
}
