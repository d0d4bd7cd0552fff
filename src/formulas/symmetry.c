/*
 * symmetry.c — whether a formula F(x_i, y_j) is symmetric: F(x_i, y_j) = F(y_i, x_j) for every
 * value of its variables, once its i-variables and j-variables are paired up (x with y).
 *
 * The test is structural: F with the roles of each pair exchanged (every Vi(a) replaced by Vj(b)
 * and every Vj(b) by Vi(a)) and F itself are simplified by the same passes, whose canonical
 * ordering sorts the operands of commutative ops (Add, Mul, SqDist, scalar products); the two
 * results are the same node when F is symmetric in a way the canonical form sees. A formula that
 * is symmetric only through an identity the simplifier does not know is reported as not
 * symmetric, which is the safe answer: callers use symmetry to save work, never to change a
 * result.
 */
#include "formulas.h"

#include <stdlib.h>

struct swap_map {
    int n;
    const int *vi, *vj;
};

/* The variable that node v (a Var) becomes under the exchange m, or v itself. */
static sr_expr *swap_var(sr_ctx *ctx, const sr_expr *v, const struct swap_map *m)
{
    for (int p = 0; p < m->n; p++) {
        int64_t to[2] = {-1, -1};
        if (v->iattr[1] == SR_CAT_I && v->iattr[0] == m->vi[p])
            to[0] = m->vj[p], to[1] = SR_CAT_J;
        else if (v->iattr[1] == SR_CAT_J && v->iattr[0] == m->vj[p])
            to[0] = m->vi[p], to[1] = SR_CAT_I;
        if (to[0] >= 0)
            return expr_make(ctx, OP_VAR, NULL, to, v->dim, 0);
    }
    return (sr_expr *)v;
}

/* f with the exchange m applied, built bottom-up over its topological order; NULL when out of
 * memory. */
static sr_expr *swap_expr(sr_ctx *ctx, const sr_expr *f, const struct swap_map *m)
{
    size_t n = expr_toposort(f, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    sr_expr **img = malloc((n ? n : 1) * sizeof *img);
    sr_expr *res = NULL;
    if (!order || !img)
        goto done;
    expr_toposort(f, order, n);
    for (size_t t = 0; t < n; t++) {
        const sr_expr *e = order[t];
        if (e->op == OP_VAR) {
            img[t] = swap_var(ctx, e, m);
        } else {
            sr_expr *ch[EXPR_MAX_ARITY] = {0};
            for (int c = 0; c < expr_arity(e); c++)
                for (size_t u = 0; u < t; u++)
                    if (order[u] == e->child[c]) {
                        ch[c] = img[u];
                        break;
                    }
            img[t] = expr_make(ctx, (enum expr_op)e->op, ch, e->iattr, e->dim, e->fattr);
        }
        if (!img[t])
            goto done;
    }
    res = n ? img[n - 1] : NULL;
done:
    free(order);
    free(img);
    return res;
}

/* Tries every pairing of the i-variables with j-variables of the same dimension, in the order
 * of the j-variables' permutations (p: how many are placed). */
static bool try_pairings(sr_ctx *ctx, const sr_expr *fs, const sr_expr *f, const int *vi, int *vj,
                         const int *dims, int n, int p)
{
    if (p == n) {
        struct swap_map m = {n, vi, vj};
        sr_expr *g = swap_expr(ctx, f, &m), *gs = NULL;
        if (!g)
            return false;
        struct simp_opts o;
        simp_opts_default(&o);
        simp_expr(ctx, g, &o, &gs, NULL);
        return gs == fs;
    }
    for (int q = p; q < n; q++) {
        int t = vj[p];
        vj[p] = vj[q];
        vj[q] = t;
        if (dims[vi[p]] == dims[vj[p]] && try_pairings(ctx, fs, f, vi, vj, dims, n, p + 1))
            return true;
        vj[q] = vj[p];
        vj[p] = t;
    }
    return false;
}

int simp_symmetric_pairs(sr_ctx *ctx, const sr_expr *f, int *vi, int *vj, int max)
{
    struct expr_var *vars = NULL;
    int nvars = 0, ni = 0, nj = 0, res = -1;
    if (expr_collect_vars(ctx, &f, 1, &vars, &nvars) != SR_OK)
        return -1;
    int *dims = malloc(((size_t)nvars + 1) * sizeof *dims);
    if (!dims)
        goto done;
    for (int v = 0; v < nvars; v++) {
        dims[v] = vars[v].dim;
        if (vars[v].dim == 0 || vars[v].cat == SR_CAT_PARAM)
            continue;
        if ((vars[v].cat == SR_CAT_I ? ni : nj) == max)
            goto done;
        if (vars[v].cat == SR_CAT_I)
            vi[ni++] = v;
        else
            vj[nj++] = v;
    }
    if (ni != nj)
        goto done;
    struct simp_opts o;
    simp_opts_default(&o);
    sr_expr *fs = NULL;
    simp_expr(ctx, (sr_expr *)f, &o, &fs, NULL);
    if (try_pairings(ctx, fs, f, vi, vj, dims, ni, 0))
        res = ni;
done:
    free(dims);
    free(vars);
    return res;
}
