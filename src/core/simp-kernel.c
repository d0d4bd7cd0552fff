/*
 * simp-kernel.c — what the simplifier (src/formulas) does for a kernel: simplify F and the
 * weight, factor the part of a reduction that does not depend on the reduced index out of it
 * (the reduction rewrite that post.c runs), list the hoistable terms, and estimate the cost.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

/* ---- reduction rewrites: what moves out of the reduction ---- */

/* Terms of a product (factors) or of a signed sum, collected from the top of F. */
#define RW_MAX_TERMS 64
struct terms {
    sr_expr *t[RW_MAX_TERMS];
    bool neg[RW_MAX_TERMS]; /* sums: the term is subtracted */
    int n;
    bool overflow;
};

static void collect_factors(sr_expr *e, struct terms *ts)
{
    if (e->op == OP_MUL) {
        collect_factors(e->child[0], ts);
        collect_factors(e->child[1], ts);
        return;
    }
    if (ts->n == RW_MAX_TERMS) {
        ts->overflow = true;
        return;
    }
    ts->neg[ts->n] = false;
    ts->t[ts->n++] = e;
}

static void collect_addends(sr_expr *e, bool neg, struct terms *ts)
{
    if (e->op == OP_ADD || e->op == OP_SUB) {
        collect_addends(e->child[0], neg, ts);
        collect_addends(e->child[1], e->op == OP_SUB ? !neg : neg, ts);
        return;
    }
    if (e->op == OP_MINUS) {
        collect_addends(e->child[0], !neg, ts);
        return;
    }
    if (ts->n == RW_MAX_TERMS) {
        ts->overflow = true;
        return;
    }
    ts->neg[ts->n] = neg;
    ts->t[ts->n++] = e;
}

static sr_expr *mk2(sr_ctx *ctx, enum expr_op op, sr_expr *a, sr_expr *b)
{
    if (!a || !b)
        return NULL;
    return expr_make(ctx, op, (sr_expr *[]){a, b, NULL}, NULL, 0, 0.0);
}

/* acc * t, or t when acc is NULL; *fail on a build failure. */
static sr_expr *mul_acc(sr_ctx *ctx, sr_expr *acc, sr_expr *t, bool *fail)
{
    sr_expr *r = acc ? mk2(ctx, OP_MUL, acc, t) : t;
    *fail |= !r;
    return r;
}

/* acc ± t (t alone, or -t, when acc is NULL). */
static sr_expr *add_acc(sr_ctx *ctx, sr_expr *acc, sr_expr *t, bool neg, bool *fail)
{
    sr_expr *r;
    if (acc)
        r = mk2(ctx, neg ? OP_SUB : OP_ADD, acc, t);
    else
        r = neg ? expr_make(ctx, OP_MINUS, (sr_expr *[]){t, NULL, NULL}, NULL, 0, 0.0) : t;
    *fail |= !r;
    return r;
}

/* The result R of the inner reduction, seen by the post formula as a variable of the output
 * index at argument position nargs. */
static sr_expr *result_var(sr_kernel *k, int dim)
{
    int64_t at[2] = {k->nargs, k->axis == 1 ? SR_CAT_I : SR_CAT_J};
    return expr_make(k->ctx, OP_VAR, NULL, at, dim, 0.0);
}

/* A linear map applied to something of the reduced index: MatVecMult(A, v) or VecMatMult(v, A)
 * with A independent of it. *lin is the map's matrix side, *arg the vector. */
static bool linear_map(const sr_expr *e, unsigned red_dep, sr_expr **arg)
{
    if (e->op == OP_MATVECMULT && !(e->child[0]->deps & red_dep) && (e->child[1]->deps & red_dep)) {
        *arg = e->child[1];
        return true;
    }
    if (e->op == OP_VECMATMULT && !(e->child[1]->deps & red_dep) && (e->child[0]->deps & red_dep)) {
        *arg = e->child[0];
        return true;
    }
    return false;
}

/*
 * Sum_j F with F a product: the factors that do not depend on j (outer) leave the reduction,
 * Sum_j o_i g_ij = o_i Sum_j g_ij; and a linear map A(.) of the j-side with only scalar
 * co-factors leaves it when that shrinks what is reduced, Sum_j s_ij A v_j = A Sum_j s_ij v_j
 * (dim v < dim A v; when A v is the smaller, the map already sits where it is cheapest).
 */
static bool plan_sum(sr_kernel *k, unsigned red_dep, struct terms *ts, sr_expr **post,
                     const char **rule)
{
    sr_ctx *ctx = k->ctx;
    sr_expr *out = NULL, *in = NULL, *lin = NULL, *arg = NULL;
    bool fail = false;
    int nin_wide = 0;
    for (int i = 0; i < ts->n; i++)
        if ((ts->t[i]->deps & red_dep) && ts->t[i]->dim > 1)
            nin_wide++;
    for (int i = 0; i < ts->n; i++) {
        sr_expr *t = ts->t[i], *v;
        if (!(t->deps & red_dep))
            out = mul_acc(ctx, out, t, &fail);
        else if (!lin && nin_wide == 1 && linear_map(t, red_dep, &v) && v->dim < t->dim) {
            lin = t;
            arg = v;
        } else
            in = mul_acc(ctx, in, t, &fail);
    }
    if (lin)
        in = mul_acc(ctx, in, arg, &fail);
    if (fail || !in || (!out && !lin))
        return false;
    sr_expr *R = result_var(k, in->dim), *p = R;
    if (lin)
        p = lin->op == OP_MATVECMULT ? mk2(ctx, OP_MATVECMULT, lin->child[0], R)
                                     : mk2(ctx, OP_VECMATMULT, R, lin->child[1]);
    if (out)
        p = mk2(ctx, OP_MUL, out, p);
    if (!p || p->dim != k->fdim)
        return false;
    k->simp.outer = out;
    k->simp.inner = in;
    *post = p;
    *rule = lin ? (out ? "sum-factor+linear-map" : "linear-map-out-of-sum") : "sum-factor";
    return true;
}

/*
 * Min/Max/KMin of a product: factors that do not depend on the reduced index and are never
 * negative leave it (a factor f >= 0 is monotone: Min_j f g_j = f Min_j g_j, and sorted order is
 * kept for KMin). Factors of unknown sign stay inside: a negative one would turn Min into Max,
 * and ArgMin into ArgMax — not done, nor for the Arg reductions, whose indices a zero factor
 * (Exp underflowing, say) would change.
 */
static bool plan_minmax_mul(sr_kernel *k, unsigned red_dep, struct terms *ts, sr_expr **post,
                            const char **rule)
{
    sr_ctx *ctx = k->ctx;
    sr_expr *out = NULL, *in = NULL;
    bool fail = false;
    for (int i = 0; i < ts->n; i++) {
        sr_expr *t = ts->t[i];
        if (!(t->deps & red_dep) && simp_nonneg(t))
            out = mul_acc(ctx, out, t, &fail);
        else
            in = mul_acc(ctx, in, t, &fail);
    }
    if (fail || !out || !in || !(in->deps & red_dep))
        return false;
    sr_expr *p = mk2(ctx, OP_MUL, out, result_var(k, in->dim * k->k));
    if (!p || p->dim != k->out_dim)
        return false;
    k->simp.outer = out;
    k->simp.inner = in;
    *post = p;
    *rule = "minmax-nonneg-factor";
    return true;
}

/* Min/Max/KMin/LogSumExp of a sum: the terms that do not depend on the reduced index shift every
 * value alike, RED_j (f_i + g_ij) = f_i + RED_j g_ij (LogSumExp: log Σ e^(f+g) = f + log Σ e^g). */
static bool plan_shift(sr_kernel *k, unsigned red_dep, struct terms *ts, sr_expr **post,
                       const char **rule)
{
    sr_ctx *ctx = k->ctx;
    sr_expr *out = NULL, *in = NULL;
    bool fail = false;
    /* Positive terms first, so that each side starts without a negation when it can. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < ts->n; i++) {
            sr_expr *t = ts->t[i];
            if (ts->neg[i] != (pass == 1))
                continue;
            if (t->deps & red_dep)
                in = add_acc(ctx, in, t, ts->neg[i], &fail);
            else
                out = add_acc(ctx, out, t, ts->neg[i], &fail);
        }
    if (fail || !out || !in)
        return false;
    sr_expr *p = mk2(ctx, OP_ADD, out, result_var(k, in->dim * k->k));
    if (!p || p->dim != k->out_dim)
        return false;
    k->simp.outer = out;
    k->simp.inner = in;
    *post = p;
    *rule = k->red == SR_LOGSUMEXP ? "logsumexp-shift" : "minmax-shift";
    return true;
}

/*
 * Decides the reduction rewrite of the kernel, if any: k->simp.inner is what the backend reduces
 * (its result is R), k->simp.post computes the output from R and the output index's side
 * (simp_post_backend applies it after the reduction). The KMin reductions need R laid out as
 * F's values are (dim inner == dim F) and an outer part that is the same for all K slots.
 */
static void plan_reduction(sr_kernel *k)
{
    unsigned red_dep = k->axis == 1 ? DEP_J : DEP_I;
    sr_expr *f = (sr_expr *)k->f;
    if (!(f->deps & red_dep))
        return;
    struct terms ts = {.n = 0};
    sr_expr *post = NULL;
    const char *rule = NULL;
    bool ok = false;
    bool kmin = k->red == SR_KMIN;
    switch (k->red) {
    case SR_SUM: {
        /* Sum_j -(P) = -(Sum_j P) exactly (negation is exact and commutes with rounding): the
         * factoring looks through a negated product with a factor of the output row (the
         * gradient of a kernel in x_i, -(... G_i ... g)). Not for a negated product whose
         * free factors are parameters only (the gradient in a parameter, SGPR's dK/dg): that
         * saves one product per pair but would send sr_kernel_eval_block of the kernel, whose
         * module then computes the inner formula, to the reference interpreter. */
        unsigned out_dep = k->axis == 1 ? DEP_I : DEP_J;
        sr_expr *p = f->op == OP_MINUS ? f->child[0] : f;
        if (p->op == OP_MUL || p->op == OP_MATVECMULT || p->op == OP_VECMATMULT) {
            collect_factors(p, &ts);
            bool row_factor = false;
            for (int i = 0; i < ts.n; i++)
                row_factor |= (ts.t[i]->deps & out_dep) && !(ts.t[i]->deps & red_dep);
            ok = !ts.overflow && (p == f || row_factor) && plan_sum(k, red_dep, &ts, &post, &rule);
            if (ok && p != f) {
                post = expr_make(k->ctx, OP_MINUS, (sr_expr *[]){post, NULL, NULL}, NULL, 0, 0.0);
                ok = post != NULL;
            }
        }
        break;
    }
    case SR_MIN:
    case SR_MAX:
    case SR_KMIN:
    case SR_LOGSUMEXP:
        if (f->op == OP_MUL && k->red != SR_LOGSUMEXP) {
            collect_factors(f, &ts);
            ok = !ts.overflow && plan_minmax_mul(k, red_dep, &ts, &post, &rule);
        } else if (f->op == OP_ADD || f->op == OP_SUB) {
            collect_addends(f, false, &ts);
            ok = !ts.overflow && plan_shift(k, red_dep, &ts, &post, &rule);
        }
        break;
    default:
        break;
    }
    if (ok && kmin && (k->simp.inner->dim != k->fdim || (k->simp.outer->dim != 1 && k->k != 1)))
        ok = false;
    if (!ok) {
        k->simp.outer = k->simp.inner = NULL;
        return;
    }
    k->simp.post = post;
    k->simp.post_rule = rule;
}

/* The product of the factors of ts other than skip that depend on dep (want) or not (!want),
 * times acc (acc first). */
static sr_expr *mul_factors(sr_ctx *ctx, sr_expr *acc, const struct terms *ts, int skip,
                            unsigned dep, bool want, bool *fail)
{
    for (int i = 0; i < ts->n; i++)
        if (i != skip && ((ts->t[i]->deps & dep) != 0) == want)
            acc = mul_acc(ctx, acc, ts->t[i], fail);
    return acc;
}

bool simp_split_sum(const sr_kernel *k, const sr_expr **f1, const sr_expr **f2)
{
    sr_ctx *ctx = k->ctx;
    unsigned out_dep = k->axis == 1 ? DEP_I : DEP_J, red_dep = k->axis == 1 ? DEP_J : DEP_I;
    sr_expr *f = (sr_expr *)k->f;
    if (k->red != SR_SUM || k->weight || f->op != OP_MUL || !(f->deps & red_dep))
        return false;
    struct terms ts = {.n = 0};
    collect_factors(f, &ts);
    if (ts.overflow)
        return false;
    /* The first factor that is a sum of addends of both kinds. */
    for (int s = 0; s < ts.n; s++) {
        sr_expr *t = ts.t[s];
        if (t->op != OP_ADD && t->op != OP_SUB)
            continue;
        struct terms as = {.n = 0};
        collect_addends(t, false, &as);
        sr_expr *a = NULL, *c = NULL;
        bool fail = as.overflow;
        /* Positive addends first, so that each side starts without a negation when it can. */
        for (int pass = 0; pass < 2 && !fail; pass++)
            for (int i = 0; i < as.n; i++) {
                if (as.neg[i] != (pass == 1))
                    continue;
                if (as.t[i]->deps & out_dep)
                    a = add_acc(ctx, a, as.t[i], as.neg[i], &fail);
                else
                    c = add_acc(ctx, c, as.t[i], as.neg[i], &fail);
            }
        if (fail || !a || !c)
            continue;
        /* F1 = A P_out P_rest; F2 = P_out (C P_rest): the factors of the output index stay
         * together, and C joins the factors that do not depend on it (the side B of the fused
         * strategy's F * B). */
        sr_expr *p1 = mul_factors(ctx, a, &ts, s, out_dep, true, &fail);
        p1 = mul_factors(ctx, p1, &ts, s, out_dep, false, &fail);
        sr_expr *b2 = mul_factors(ctx, c, &ts, s, out_dep, false, &fail);
        sr_expr *p2 = mul_factors(ctx, NULL, &ts, s, out_dep, true, &fail);
        p2 = p2 ? mul_acc(ctx, p2, b2, &fail) : b2;
        if (fail || !p1 || !p2 || p1->dim != k->fdim || p2->dim != k->fdim)
            return false;
        *f1 = p1;
        *f2 = p2;
        return true;
    }
    return false;
}

static bool trivial(const sr_expr *e) { return e->op == OP_VAR || !e->deps; }

/* Maximal non-trivial subexpressions that do not depend on the pair, children of pair nodes
 * (or the root itself when it does not depend on the pair). */
static void collect_hoisted(sr_kernel *k, const sr_expr *root)
{
    if (!root)
        return;
    size_t cnt = expr_toposort(root, NULL, 0);
    const sr_expr **order = malloc((cnt ? cnt : 1) * sizeof *order);
    if (!order)
        return;
    expr_toposort(root, order, cnt);
    for (size_t i = 0; i < cnt; i++) {
        const sr_expr *e = order[i];
        bool pair = (e->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J);
        for (int c = 0; c <= expr_arity(e); c++) {
            const sr_expr *h = c < expr_arity(e) ? e->child[c] : (e == root ? e : NULL);
            if (!h || (!pair && h != root) || trivial(h) ||
                (h->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J))
                continue;
            bool seen = false;
            for (int q = 0; q < k->simp.nhoisted; q++)
                seen |= k->simp.hoisted[q] == h;
            if (seen)
                continue;
            const sr_expr **nh =
                realloc(k->simp.hoisted, (size_t)(k->simp.nhoisted + 1) * sizeof *nh);
            if (!nh)
                break;
            k->simp.hoisted = nh;
            k->simp.hoisted[k->simp.nhoisted++] = h;
        }
    }
    free(order);
}

static void estimate(sr_kernel *k)
{
    unsigned red_dep = k->axis == 1 ? DEP_J : DEP_I;
    size_t esz = sr_dtype_size(k->dtype);
    const sr_expr *user[2] = {k->simp.f_user, k->simp.weight_user};
    const sr_expr *run[2] = {k->f, k->weight};
    bool on = k->simp.enabled;
    simp_cost_estimate(user, 2, red_dep, esz, false, &k->simp.cost_user);
    simp_cost_estimate(run, 2, red_dep, esz, on, &k->simp.cost);
    /* With a reduction rewrite, the backend reduces the inner formula and the post formula is
     * computed once per output row. */
    if (on && k->simp.post) {
        const sr_expr *in[2] = {k->simp.inner, k->weight};
        const sr_expr *post[1] = {k->simp.post};
        struct sr_cost c, pc;
        simp_cost_estimate(in, 2, red_dep, esz, true, &c);
        simp_cost_estimate(post, 1, red_dep, esz, true, &pc);
        c.flops_row += pc.flops_row + pc.flops_pair + pc.flops_call;
        k->simp.cost = c;
    }
}

/* f and weight simplified with options o: returns f's form, *w2 the weight's (NULL without
 * one), *log the rules that fired (NULL when out of memory). */
static const sr_expr *simplify_into(sr_kernel *k, const sr_expr *f, const sr_expr *w,
                                    const struct simp_opts *o, sr_expr **w2, char **log)
{
    struct expr_buf b = {0};
    sr_expr *f2;
    simp_expr(k->ctx, (sr_expr *)f, o, &f2, &b);
    *w2 = NULL;
    if (w) {
        expr_buf_printf(&b, "  weight:\n");
        simp_expr(k->ctx, (sr_expr *)w, o, w2, &b);
    }
    if (b.oom)
        free(b.data);
    *log = b.oom ? NULL : b.data;
    return f2;
}

sr_status simp_kernel(sr_kernel *k)
{
    k->simp.f_user = k->f;
    k->simp.weight_user = k->weight;
    k->simp.enabled = k->ctx->opt.simplify != 0;
    if (k->simp.enabled) {
        /* The expansions that serve a gemm are left out here: a strategy that takes them asks
         * for the second form (sr__simp_take_gemm_form). */
        struct simp_opts o, og;
        simp_opts_default(&og);
        o = og;
        o.gemm_min_dim = 0;
        sr_expr *w2 = NULL;
        k->f = simplify_into(k, k->f, k->weight, &o, &w2, &k->simp.log);
        k->weight = w2;
        char *logg = NULL;
        const sr_expr *fg = simplify_into(k, k->f, k->weight, &og, &w2, &logg);
        if (fg != k->f || w2 != k->weight) {
            k->simp.f_gemm = fg;
            k->simp.weight_gemm = w2;
            k->simp.log_gemm = logg;
        } else {
            free(logg);
        }
        sr_status pending = expr_ctx(k->ctx)->err.pending;
        plan_reduction(k);
        collect_hoisted(k, k->f);
        collect_hoisted(k, k->weight);
        expr_ctx(k->ctx)->err.pending = pending;
    }
    estimate(k);
    return SR_OK;
}

void sr__simp_take_gemm_form(sr_kernel *k)
{
    if (!k->simp.f_gemm || k->simp.gemm_form)
        return;
    k->f = k->simp.f_gemm;
    k->weight = k->simp.weight_gemm;
    k->simp.gemm_form = true;
    free(k->simp.hoisted);
    k->simp.hoisted = NULL;
    k->simp.nhoisted = 0;
    sr_status pending = expr_ctx(k->ctx)->err.pending;
    collect_hoisted(k, k->f);
    collect_hoisted(k, k->weight);
    expr_ctx(k->ctx)->err.pending = pending;
    estimate(k);
}

void simp_kernel_release(sr_kernel *k)
{
    free(k->simp.log_gemm);
    k->simp.log_gemm = NULL;
    free(k->simp.log);
    free(k->simp.hoisted);
    k->simp.log = NULL;
    k->simp.hoisted = NULL;
    k->simp.nhoisted = 0;
}

static const char *hoist_class(const sr_expr *e, int axis)
{
    if (e->deps & DEP_I)
        return axis == 1 ? "i-only, once per output row" : "i-only, once per reduced row";
    if (e->deps & DEP_J)
        return axis == 1 ? "j-only, once per reduced row" : "j-only, once per output row";
    return "parameter-only, once per call";
}

void simp_kernel_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct sr_simp_info *si = &k->simp;
    if (!si->enabled) {
        expr_buf_printf(b, "simplifier: off (SYMRED_SIMPLIFY=0)\n");
    } else {
        expr_buf_printf(b, "simplifier: passes canonical, identities, match, cost to a fixed "
                           "point (SYMRED_SIMPLIFY=0 turns it off)\n");
        if (si->log && *si->log)
            expr_buf_printf(b, "%s", si->log);
        else
            expr_buf_printf(b, "  no rule applies\n");
        if (si->gemm_form)
            expr_buf_printf(b, "for the gemm (the strategy below):\n%s",
                            si->log_gemm ? si->log_gemm : "");
        else if (si->f_gemm)
            expr_buf_printf(b, "not applied (no gemm strategy runs this kernel): the expansion "
                               "of SqDist into norms and an inner product\n");
        expr_buf_printf(b, "simplified formula: ");
        expr_print_to(b, k->f);
        expr_buf_printf(b, "\n");
        if (k->weight) {
            expr_buf_printf(b, "simplified weight: ");
            expr_print_to(b, k->weight);
            expr_buf_printf(b, "\n");
        }
        if (si->post) {
            const char *idx = k->axis == 1 ? "j" : "i";
            const char *rn = sr_reductions[k->red].name;
            expr_buf_printf(b, "reduction rewrite (%s): %s_%s F = ", si->post_rule, rn, idx);
            expr_print_to(b, si->post);
            expr_buf_printf(b, "\n  where R = Var(%d,%d,%d) = %s_%s (", k->nargs,
                            si->inner->dim * k->k, k->axis == 1 ? 0 : 1, rn, idx);
            expr_print_to(b, si->inner);
            expr_buf_printf(b, ")\n  (the backend reduces the inner formula; the rest is applied "
                               "once per output row after the reduction, except on the reference "
                               "backend, which runs the formula as given)\n");
        }
        expr_buf_printf(b, "hoisted terms:%s\n", si->nhoisted ? "" : " none");
        for (int i = 0; i < si->nhoisted; i++) {
            expr_buf_printf(b, "  [%s] ", hoist_class(si->hoisted[i], k->axis));
            expr_print_to(b, si->hoisted[i]);
            expr_buf_printf(b, "\n");
        }
    }
    expr_buf_printf(b,
                    "cost estimate: %.0f flops per pair (as given: %.0f), %.0f bytes per pair; "
                    "%.0f flops per output row, %.0f per reduced row, %.0f per call\n",
                    si->cost.flops_pair, si->cost_user.flops_pair, si->cost.bytes_pair,
                    si->cost.flops_row, si->cost.flops_col, si->cost.flops_call);
}
