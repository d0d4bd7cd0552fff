/*
 * simplify.c — the rule engine (bottom-up rewriting to a fixed point, every firing counted),
 * and what the simplifier does for a kernel: simplify F and the weight, factor the part of a
 * Sum that does not depend on the reduced index out of the reduction, list the hoistable
 * terms, and estimate the cost.
 */
#include "formulas.h"

#include <stdlib.h>
#include <string.h>

const char *const simp_pass_names[SIMP_PASS_COUNT] = {
    [SIMP_PASS_CANON] = "canonical",
    [SIMP_PASS_IDENT] = "identities",
    [SIMP_PASS_MATCH] = "match",
    [SIMP_PASS_COST] = "cost",
};

/* Bounds that make the engine finish whatever the rules do: stopping early is always correct,
 * since every intermediate formula equals the original. */
#define SIMP_FUEL       20000
#define SIMP_MAX_DEPTH  2000
#define SIMP_MAX_ROUNDS 8

void simp_opts_default(struct simp_opts *o) { o->gemm_min_dim = simp_cost_gemm_min_dim(); }

bool simp_enabled(void)
{
    const char *v = getenv("SYMRED_SIMPLIFY");
    return !(v && strcmp(v, "0") == 0);
}

/* ---- the memo ---- */

static size_t ptr_slot(const void *p, size_t cap)
{
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 7) & (cap - 1);
}

static sr_expr *memo_get(const struct simp_memo *m, const sr_expr *k)
{
    if (!m->cap)
        return NULL;
    for (size_t i = ptr_slot(k, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (!m->key[i])
            return NULL;
        if (m->key[i] == k)
            return m->val[i];
    }
}

static void memo_put(struct simp_memo *m, const sr_expr *k, sr_expr *v)
{
    if (m->count + 1 > m->cap / 2) {
        size_t ncap = m->cap ? m->cap * 2 : 256;
        const sr_expr **nk = calloc(ncap, sizeof *nk);
        sr_expr **nv = calloc(ncap, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return; /* the memo only saves work */
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i]) {
                size_t j = ptr_slot(m->key[i], ncap);
                while (nk[j])
                    j = (j + 1) & (ncap - 1);
                nk[j] = m->key[i];
                nv[j] = m->val[i];
            }
        free(m->key);
        free(m->val);
        m->key = nk;
        m->val = nv;
        m->cap = ncap;
    }
    size_t i = ptr_slot(k, m->cap);
    while (m->key[i] && m->key[i] != k)
        i = (i + 1) & (m->cap - 1);
    if (!m->key[i])
        m->count++;
    m->key[i] = k;
    m->val[i] = v;
}

static void memo_clear(struct simp_memo *m)
{
    if (m->cap) {
        memset(m->key, 0, m->cap * sizeof *m->key);
        m->count = 0;
    }
}

static void memo_free(struct simp_memo *m)
{
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- the engine ---- */

/* The first rule of the current pass that applies at e, its result, or NULL. */
static sr_expr *apply_one(struct simp_state *s, sr_expr *e)
{
    for (int r = 0; r < simp_nrules; r++) {
        const struct simp_rule *rule = &simp_rules[r];
        if (rule->pass != s->pass || (rule->op >= 0 && rule->op != e->op))
            continue;
        if (!rule->guard(s, e))
            continue;
        sr_expr *n = rule->rewrite(s, e);
        if (!n || n == e || n->dim != e->dim)
            continue;
        s->counts[r]++;
        s->fuel--;
        return n;
    }
    return NULL;
}

/* Rewrites e bottom-up: children first, then the rules at the root; a rule's result is
 * rewritten again, so the returned node is a fixed point of the pass. */
static sr_expr *rw(struct simp_state *s, sr_expr *e)
{
    sr_expr *m = memo_get(&s->memo, e);
    if (m)
        return m;
    if (s->depth >= SIMP_MAX_DEPTH || s->fuel <= 0)
        return e;
    s->depth++;
    sr_expr *cur = e;
    int ar = expr_arity(e);
    if (ar) {
        sr_expr *ch[EXPR_MAX_ARITY] = {NULL, NULL, NULL};
        bool changed = false;
        for (int i = 0; i < ar; i++) {
            ch[i] = rw(s, e->child[i]);
            changed |= ch[i] != e->child[i];
        }
        if (changed) {
            sr_expr *n = expr_make(s->ctx, (enum expr_op)e->op, ch, e->iattr, e->dim, e->fattr);
            if (n && n->dim == e->dim)
                cur = n;
        }
    }
    sr_expr *r = apply_one(s, cur);
    if (r)
        cur = rw(s, r);
    s->depth--;
    memo_put(&s->memo, e, cur);
    return cur;
}

static void log_pass(struct simp_state *s, struct expr_buf *log, int round, sr_expr *result)
{
    expr_buf_printf(log, "  round %d, pass %s:", round, simp_pass_names[s->pass]);
    const char *sep = " ";
    /* Rules sharing a name (one entry per root op) are reported once. */
    for (int r = 0; r < simp_nrules; r++) {
        bool first = true;
        for (int q = 0; q < r && first; q++)
            first = strcmp(simp_rules[q].name, simp_rules[r].name) != 0;
        if (!first)
            continue;
        int n = 0;
        for (int q = r; q < simp_nrules; q++)
            if (strcmp(simp_rules[q].name, simp_rules[r].name) == 0)
                n += s->counts[q];
        if (!n)
            continue;
        expr_buf_printf(log, "%s%s x%d", sep, simp_rules[r].name, n);
        sep = ", ";
    }
    expr_buf_printf(log, "\n    -> ");
    expr_print_to(log, result);
    expr_buf_printf(log, "\n");
}

int simp_expr(sr_ctx *ctx, sr_expr *e, const struct simp_opts *o, sr_expr **out,
              struct expr_buf *log)
{
    struct simp_opts dflt;
    if (!o) {
        simp_opts_default(&dflt);
        o = &dflt;
    }
    *out = e;
    if (!e)
        return 0;
    sr_status pending = ctx->pending;
    struct simp_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.opts = o;
    s.fuel = SIMP_FUEL;
    int total = 0;
    sr_expr *cur = e;
    for (int round = 1; round <= SIMP_MAX_ROUNDS; round++) {
        bool changed = false;
        for (int p = 0; p < SIMP_PASS_COUNT; p++) {
            s.pass = (enum simp_pass)p;
            memo_clear(&s.memo);
            memset(s.counts, 0, sizeof s.counts);
            s.depth = 0;
            sr_expr *n = rw(&s, cur);
            int fired = 0;
            for (int r = 0; r < simp_nrules; r++)
                fired += s.counts[r];
            total += fired;
            if (fired && log)
                log_pass(&s, log, round, n);
            changed |= n != cur;
            cur = n;
        }
        if (!changed || s.fuel <= 0)
            break;
    }
    memo_free(&s.memo);
    /* A rewrite that failed to build a node may have recorded a builder error; the user's
     * builder chain did not fail, so its pending status is restored. */
    ctx->pending = pending;
    *out = cur;
    return total;
}

/* ---- what the simplifier does for a kernel ---- */

/* f == outer * inner, with outer the factors of a top-level product that do not depend on
 * the reduced index: Sum over it of f == outer * Sum of inner. */
static void factor_reduction(sr_kernel *k)
{
    if (k->red != SR_SUM)
        return;
    unsigned red_dep = k->axis == 1 ? DEP_J : DEP_I;
    sr_expr *f = (sr_expr *)k->f;
    if (f->op != OP_MUL || !(f->deps & red_dep))
        return;
    /* Left-deep chain walk: the factors are the right operands down the left spine. */
    enum { FMAX = 64 };
    sr_expr *t[FMAX];
    int n = 0;
    sr_expr *c = f;
    while (c->op == OP_MUL && n < FMAX - 1) {
        t[n++] = c->child[1];
        c = c->child[0];
    }
    t[n++] = c;
    sr_expr *out = NULL, *in = NULL;
    for (int i = n - 1; i >= 0; i--) {
        sr_expr **acc = (t[i]->deps & red_dep) ? &in : &out;
        *acc =
            *acc ? expr_make(k->ctx, OP_MUL, (sr_expr *[]){*acc, t[i], NULL}, NULL, 0, 0.0) : t[i];
        if (!*acc)
            return;
    }
    if (!out || !in)
        return;
    k->simp.outer = out;
    k->simp.inner = in;
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
    /* With the reduction factored, the outer factor is computed once per output row. */
    if (on && k->simp.inner) {
        const sr_expr *in[2] = {k->simp.inner, k->weight};
        struct sr_cost c;
        simp_cost_estimate(in, 2, red_dep, esz, true, &c);
        c.flops_row += k->simp.cost.flops_row + simp_op_flops(k->f);
        k->simp.cost = c;
    }
}

sr_status simp_kernel(sr_kernel *k)
{
    k->simp.f_user = k->f;
    k->simp.weight_user = k->weight;
    k->simp.enabled = simp_enabled();
    if (k->simp.enabled) {
        struct simp_opts o;
        simp_opts_default(&o);
        struct expr_buf log = {0};
        sr_expr *f2, *w2;
        simp_expr(k->ctx, (sr_expr *)k->f, &o, &f2, &log);
        if (k->weight) {
            expr_buf_printf(&log, "  weight:\n");
            simp_expr(k->ctx, (sr_expr *)k->weight, &o, &w2, &log);
            k->weight = w2;
        }
        k->f = f2;
        if (log.oom)
            free(log.data);
        else
            k->simp.log = log.data;
        sr_status pending = k->ctx->pending;
        factor_reduction(k);
        collect_hoisted(k, k->f);
        collect_hoisted(k, k->weight);
        k->ctx->pending = pending;
    }
    estimate(k);
    return SR_OK;
}

void simp_kernel_release(sr_kernel *k)
{
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
        expr_buf_printf(b, "simplified formula: ");
        expr_print_to(b, k->f);
        expr_buf_printf(b, "\n");
        if (k->weight) {
            expr_buf_printf(b, "simplified weight: ");
            expr_print_to(b, k->weight);
            expr_buf_printf(b, "\n");
        }
        if (si->outer) {
            const char *idx = k->axis == 1 ? "j" : "i";
            expr_buf_printf(b, "reduction factoring: Sum_%s F = (", idx);
            expr_print_to(b, si->outer);
            expr_buf_printf(b, ") * Sum_%s (", idx);
            expr_print_to(b, si->inner);
            expr_buf_printf(b, ")\n");
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
