/*
 * grad-kernel.c — sr_kernel_grad and sr_kernel_jvp: the kernels of a reduction's gradient
 * (reverse mode) and of its directional derivative (forward mode).
 *
 * The gradient of a reduction with respect to one of its variables is itself a Sum reduction
 * of a formula built with sr_grad, over the same pairs: over the forward reduced index for a
 * variable of the output index or a parameter (one row per forward output row; a parameter's
 * rows are summed by the caller), and over the forward output index for a variable of the
 * reduced index (the transposed sum). The reductions differ only in the gradient input they
 * give sr_grad at each pair (docs/gradients.md has the derivations and the calling contract).
 *
 * The directional derivative of a reduction along tangents of some of its variables is a Sum
 * reduction too, over the forward reduced index: each pair contributes dF = sum_v Diff(F, v,
 * dv) (sr_diff), weighted as the reduction weights its pairs (1 for Sum, the softmax weight for
 * LogSumExp and SumSoftMaxWeight, the selected pairs only for Min, Max and KMin).
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

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
         * dF_j), so the pair's inputs are s G for W and s (G | W - out) for F. That inner
         * product is written (G | W) - (G | out): the first is a product of an output-index
         * and a reduced-index variable (a tile of them is a gemm in the fused strategy), the
         * second depends on the output row only. A term that is zero (v not in F, or not in
         * W) is left out, so that the body is one product of scalars and a variable. */
        sr_expr *w = (sr_expr *)k->simp.weight_user;
        sr_expr *s = sr_exp(ctx, sr_sub(ctx, f, x->aux));
        sr_expr *gw_in = sr_sub(ctx, sr_scalprod(ctx, x->g, w), sr_scalprod(ctx, x->g, x->o));
        sr_expr *gf = sr_grad(ctx, f, v, sr_mul(ctx, s, gw_in));
        sr_expr *gw = sr_grad(ctx, w, v, sr_mul(ctx, s, x->g));
        sr_expr *zero = expr_zeros(ctx, v->dim);
        return gw == zero ? gf : gf == zero ? gw : sr_add(ctx, gf, gw);
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

/* The directional derivative of F along the tangents of the variables in mask: the sum of
 * Diff(F, v, dv) with dv the variable of index n + v (NULL on a builder error). */
static sr_expr *tangent_of(sr_ctx *ctx, const sr_kernel *k, sr_expr *f, uint64_t mask)
{
    sr_expr *s = NULL;
    for (int v = 0; v < k->nargs && v < 64; v++) {
        if (!(mask >> v & 1))
            continue;
        const struct expr_var *vv = &k->vars[v];
        sr_expr *d = sr_diff(ctx, f, sr_var(ctx, v, vv->dim, vv->cat),
                             sr_var(ctx, k->nargs + v, vv->dim, vv->cat));
        s = s ? sr_add(ctx, s, d) : d;
    }
    return s;
}

/* The formula summed by the tangent kernel of k (x->g unused: the tangents are its inputs). */
static sr_expr *jvp_body(sr_ctx *ctx, const sr_kernel *k, uint64_t mask, const struct grad_extra *x)
{
    sr_expr *f = (sr_expr *)k->simp.f_user;
    sr_expr *df = tangent_of(ctx, k, f, mask);
    switch (k->red) {
    case SR_SUM:
        return df;
    case SR_LOGSUMEXP: /* sum_j exp(F_j - LSE) dF_j, componentwise */
        return sr_mul(ctx, sr_exp(ctx, sr_sub(ctx, f, x->o)), df);
    case SR_SUMSOFTMAXWEIGHT: { /* sum_j s_j (dW_j + (W_j - out) dF_j), s_j = exp(F_j - L) */
        sr_expr *w = (sr_expr *)k->simp.weight_user;
        sr_expr *dw = tangent_of(ctx, k, w, mask);
        sr_expr *s = sr_exp(ctx, sr_sub(ctx, f, x->aux));
        return sr_mul(ctx, s, sr_add(ctx, dw, sr_mul(ctx, sr_sub(ctx, w, x->o), df)));
    }
    default: { /* Min, Max, KMin and their _Arg variants: dF at the selected pairs */
        int d = k->fdim;
        sr_expr *s = NULL;
        for (int t = 0; t < k->k; t++) {
            sr_expr *it = d * k->k == 1 ? x->o : sr_extract(ctx, x->o, t * d, d);
            sr_expr *term = sr_mul(ctx, sr_equal(ctx, x->aux, it), df);
            s = s ? sr_concat(ctx, s, term) : term;
        }
        return s;
    }
    }
}

sr_status sr_kernel_jvp(const sr_kernel *k, uint64_t var_mask, sr_kernel **out)
{
    if (out)
        *out = NULL;
    if (!k)
        return SR_EINVAL;
    sr_ctx *ctx = k->ctx;
    if (!out)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_jvp: out is NULL");
    if (k->red == SR_ARGMIN || k->red == SR_ARGMAX || k->red == SR_ARGKMIN)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_jvp: %s returns indices only, which have no derivative",
                         sr_reduction_name(k->red));
    if (!var_mask)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_jvp: var_mask names no variable");
    for (int v = 0; v < 64; v++)
        if ((var_mask >> v & 1) && (v >= k->nargs || !k->vars[v].dim))
            return sr__error(ctx, SR_EINVAL,
                             "sr_kernel_jvp: var_mask names index %d, which the kernel's formula "
                             "does not use (it has %d argument indices)",
                             v, k->nargs);
    sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    sr_cat red_cat = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    int n = k->nargs;
    bool selecting = k->red != SR_SUM && k->red != SR_LOGSUMEXP && k->red != SR_SUMSOFTMAXWEIGHT;
    struct grad_extra x = {
        .o = sr_var(ctx, 2 * n, k->out_dim, out_cat),
        .aux = sr_var(ctx, 2 * n + 1, 1, selecting ? red_cat : out_cat),
    };
    sr_expr *body = x.o && x.aux ? jvp_body(ctx, k, var_mask, &x) : NULL;
    sr_kernel_desc d = sr__sum_desc(k);
    return sr_kernel_new(ctx, body, &d, out);
}

/* The checks shared by sr_kernel_vjp and sr_kernel_run_lse (name: the caller's). */
static sr_status vjp_check(const sr_kernel *k, const sr_run_desc *r, const char *name)
{
    sr_ctx *ctx = k->ctx;
    if (!r)
        return sr__error(ctx, SR_EINVAL, "%s: run is NULL", name);
    if (r->nx < 0 || r->ny < 0)
        return sr__error(ctx, SR_EINVAL, "%s: sizes must be >= 0 (nx = %lld, ny = %lld)", name,
                         (long long)r->nx, (long long)r->ny);
    if (r->nargs != k->nargs)
        return sr__error(ctx, SR_EINVAL, "%s: the kernel takes %d arrays, %d were given", name,
                         k->nargs, r->nargs);
    return sr__check_arrays(k, r->nx, r->ny, r->args);
}

/* The block-sparse plan of ranges R for the call (p->mem NULL when R is NULL). */
static sr_status vjp_plan(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *R,
                          struct sr_rplan *p)
{
    memset(p, 0, sizeof *p);
    return R ? sr__rplan_new(k, r, R, p) : SR_OK;
}

sr_status sr_kernel_vjp_ranges(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *R,
                               const void *gout, const void *out, const void *lse,
                               void *const *grads)
{
    if (!k)
        return SR_EINVAL;
    sr_ctx *ctx = k->ctx;
    const char *name = R ? "sr_kernel_vjp_ranges" : "sr_kernel_vjp";
    sr_status st = vjp_check(k, r, name);
    if (st != SR_OK)
        return st;
    if (!grads)
        return sr__error(ctx, SR_EINVAL, "%s: grads is NULL", name);
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    if (nout > 0 && (!gout || !out))
        return sr__error(ctx, SR_EINVAL, "%s: %s is NULL", name, gout ? "out" : "gout");
    if (!k->backend->vjp)
        return sr__error(ctx, SR_ENOTSUP,
                         "%s: the %s backend has no fused backward (use sr_kernel_grad)", name,
                         k->backend->name);
    struct sr_rplan p;
    if ((st = vjp_plan(k, r, R, &p)) != SR_OK)
        return st;
    st = k->backend->vjp(k, r, R ? &p : NULL, gout, out, lse, grads);
    sr__rplan_free(&p);
    return st;
}

sr_status sr_kernel_vjp(const sr_kernel *k, const sr_run_desc *r, const void *gout, const void *out,
                        const void *lse, void *const *grads)
{
    return sr_kernel_vjp_ranges(k, r, NULL, gout, out, lse, grads);
}

sr_status sr_kernel_run_lse_ranges(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *R,
                                   void *lse)
{
    if (!k)
        return SR_EINVAL;
    sr_ctx *ctx = k->ctx;
    const char *name = R ? "sr_kernel_run_lse_ranges" : "sr_kernel_run_lse";
    sr_status st = vjp_check(k, r, name);
    if (st != SR_OK)
        return st;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    if (nout > 0 && (!r->out || !lse))
        return sr__error(ctx, SR_EINVAL, "%s: %s is NULL", name, lse ? "out" : "lse");
    if (!k->backend->run_lse)
        return sr__error(ctx, SR_ENOTSUP,
                         "%s: the %s backend has no fused backward (run the kernel "
                         "and a LogSumExp kernel)",
                         name, k->backend->name);
    struct sr_rplan p;
    if ((st = vjp_plan(k, r, R, &p)) != SR_OK)
        return st;
    st = k->backend->run_lse(k, r, R ? &p : NULL, lse);
    sr__rplan_free(&p);
    return st;
}

sr_status sr_kernel_run_lse(const sr_kernel *k, const sr_run_desc *r, void *lse)
{
    return sr_kernel_run_lse_ranges(k, r, NULL, lse);
}
