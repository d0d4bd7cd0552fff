/*
 * simplify.c — the rule engine: bottom-up rewriting to a fixed point, every firing counted.
 * What the simplifier does for a kernel (the reduction rewrite, hoisting, the cost estimate)
 * is in src/core/simp-kernel.c, the layer that knows kernels.
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
    sr_status pending = expr_ctx(ctx)->err.pending;
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
    expr_ctx(ctx)->err.pending = pending;
    *out = cur;
    return total;
}
