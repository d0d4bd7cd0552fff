/*
 * grad-kernel.c — sr_kernel_grad: the kernel of a reduction's gradient.
 *
 * The gradient of a reduction with respect to one of its variables is itself a Sum reduction
 * of a formula built with sr_grad, over the same pairs: over the forward reduced index for a
 * variable of the output index or a parameter (one row per forward output row; a parameter's
 * rows are summed by the caller), and over the forward output index for a variable of the
 * reduced index (the transposed sum). The reductions differ only in the gradient input they
 * give sr_grad at each pair (docs/gradients.md has the derivations and the calling contract).
 */
#include "core.h"

#include <stdio.h>

/* What the gradient kernel of a reduction reads beyond the forward arrays. */
struct grad_extra {
    sr_expr *g;   /* args[n]: the incoming gradient, an output-index variable */
    sr_expr *o;   /* args[n + 1]: the forward output (values, or indices as values) */
    sr_expr *aux; /* args[n + 2]: the log-normalizer (SumSoftMaxWeight) or the reduced index
                     itself (Min, Max, KMin) */
};

/* sum_k [J == I_k] G_k over the K selected indices I (K x D, row-major) of each output row:
 * the gradient input of a pair for Min/Max (K = 1) and KMin. J is the pair's reduced index. */
static sr_expr *selected(sr_ctx *ctx, const sr_kernel *k, const struct grad_extra *x)
{
    int d = k->fdim;
    sr_expr *s = NULL;
    for (int t = 0; t < k->k; t++) {
        sr_expr *it = d * k->k == 1 ? x->o : sr_extract(ctx, x->o, t * d, d);
        sr_expr *gt = d * k->k == 1 ? x->g : sr_extract(ctx, x->g, t * d, d);
        sr_expr *term = sr_mul(ctx, sr_equal(ctx, x->aux, it), gt);
        s = s ? sr_add(ctx, s, term) : term;
    }
    return s;
}

/* The formula summed by the gradient kernel of k with respect to v. */
static sr_expr *grad_body(sr_ctx *ctx, const sr_kernel *k, sr_expr *v, const struct grad_extra *x)
{
    sr_expr *f = (sr_expr *)k->simp.f_user;
    switch (k->red) {
    case SR_SUM:
        return sr_grad(ctx, f, v, x->g);
    case SR_LOGSUMEXP: /* d LSE / dF_j = exp(F_j - LSE): the softmax weight, LSE = the output */
        return sr_grad(ctx, f, v, sr_mul(ctx, x->g, sr_exp(ctx, sr_sub(ctx, f, x->o))));
    case SR_SUMSOFTMAXWEIGHT: {
        /* out = sum_j s_j W_j with s_j = exp(F_j - L): d out = sum_j s_j (dW_j + (W_j - out)
         * dF_j), so the pair's inputs are s G for W and s (G | W - out) for F. */
        sr_expr *w = (sr_expr *)k->simp.weight_user;
        sr_expr *s = sr_exp(ctx, sr_sub(ctx, f, x->aux));
        sr_expr *gf =
            sr_grad(ctx, f, v, sr_mul(ctx, s, sr_scalprod(ctx, x->g, sr_sub(ctx, w, x->o))));
        sr_expr *gw = sr_grad(ctx, w, v, sr_mul(ctx, s, x->g));
        return sr_add(ctx, gf, gw);
    }
    case SR_MIN:
    case SR_MAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
    case SR_KMIN:
    case SR_KMIN_ARGKMIN:
        return sr_grad(ctx, f, v, selected(ctx, k, x));
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_ARGKMIN:
    default:
        return expr_zeros(ctx, v->dim); /* indices do not move with the inputs */
    }
}

sr_status sr_kernel_grad(const sr_kernel *k, int var_index, sr_kernel **out)
{
    if (out)
        *out = NULL;
    if (!k)
        return SR_EINVAL;
    sr_ctx *ctx = k->ctx;
    if (!out)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_grad: out is NULL");
    if (var_index < 0 || var_index >= k->nargs || !k->vars[var_index].dim)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_grad: the kernel has no variable of index %d (it uses %s "
                         "indices below %d)",
                         var_index, k->nargs ? "some" : "no", k->nargs);
    const struct expr_var *vv = &k->vars[var_index];
    sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    sr_cat red_cat = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    int n = k->nargs;
    bool selecting = k->red == SR_MIN || k->red == SR_MAX || k->red == SR_MIN_ARGMIN ||
                     k->red == SR_MAX_ARGMAX || k->red == SR_KMIN || k->red == SR_KMIN_ARGKMIN;
    struct grad_extra x = {
        .g = sr_var(ctx, n, k->out_dim, out_cat),
        .o = sr_var(ctx, n + 1, k->out_dim, out_cat),
        .aux = sr_var(ctx, n + 2, 1, selecting ? red_cat : out_cat),
    };
    sr_expr *v = sr_var(ctx, var_index, vv->dim, vv->cat);
    sr_expr *body = x.g && x.o && x.aux && v ? grad_body(ctx, k, v, &x) : NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUM;
    d.axis = vv->cat == red_cat ? 1 - k->axis : k->axis;
    d.dtype = k->io;
    d.device = k->device;
    d.acc = k->acc;
    /* A NULL body: sr_kernel_new reports the builder's error. */
    return sr_kernel_new(ctx, body, &d, out);
}
