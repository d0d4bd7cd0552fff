/*
 * rules.c — the simplifier's rules: a table of (name, pass, root op, guard, rewrite).
 *
 * docs/simplifier.md lists every rule with its guard and the NaN/Inf policy. In short: a rule
 * may change rounding, but never turns a NaN or an infinity into a finite value or the reverse,
 * except where the documentation names an overflow exception.
 */
#include "formulas.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- building nodes ---- */

static sr_expr *mk2(struct simp_state *s, enum expr_op op, sr_expr *a, sr_expr *b)
{
    sr_expr *c[3] = {a, b, NULL};
    return expr_make(s->ctx, op, c, NULL, 0, 0.0);
}
static sr_expr *mk1(struct simp_state *s, enum expr_op op, sr_expr *a)
{
    return mk2(s, op, a, NULL);
}
static sr_expr *mk3(struct simp_state *s, enum expr_op op, sr_expr *a, sr_expr *b, sr_expr *c3)
{
    sr_expr *c[3] = {a, b, c3};
    return expr_make(s->ctx, op, c, NULL, 0, 0.0);
}
static sr_expr *mk_attr(struct simp_state *s, enum expr_op op, sr_expr *a, int64_t a0, int64_t a1)
{
    sr_expr *c[3] = {a, NULL, NULL};
    int64_t at[2] = {a0, a1};
    return expr_make(s->ctx, op, c, at, 0, 0.0);
}

/* ---- constants ---- */

static bool is_cst(const sr_expr *e)
{
    return e->op == OP_INTCST || e->op == OP_RATCST || e->op == OP_CST;
}

static double cst_val(const sr_expr *e)
{
    switch (e->op) {
    case OP_INTCST:
        return (double)e->iattr[0];
    case OP_RATCST:
        return (double)e->iattr[0] / (double)e->iattr[1];
    default:
        return e->fattr;
    }
}

/* The exact value p/q (q > 0) of an IntCst or RatCst. */
static bool cst_rat(const sr_expr *e, int64_t *p, int64_t *q)
{
    if (e->op == OP_INTCST) {
        *p = e->iattr[0];
        *q = 1;
        return true;
    }
    if (e->op == OP_RATCST) {
        *p = e->iattr[0];
        *q = e->iattr[1];
        return true;
    }
    return false;
}

static bool is_val(const sr_expr *e, double v) { return is_cst(e) && cst_val(e) == v; }

static int64_t gcd(int64_t a, int64_t b)
{
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* IntCst(p) or RatCst(p, q); NULL when a value is out of the representable range. */
static sr_expr *make_rat(struct simp_state *s, int64_t p, int64_t q)
{
    if (q == 0 || p == INT64_MIN || q == INT64_MIN)
        return NULL;
    if (q < 0) {
        p = -p;
        q = -q;
    }
    int64_t g = gcd(p, q);
    if (g > 1) {
        p /= g;
        q /= g;
    }
    if (q == 1) {
        int64_t at[1] = {p};
        return expr_make(s->ctx, OP_INTCST, NULL, at, 1, 0.0);
    }
    int64_t at[2] = {p, q};
    return expr_make(s->ctx, OP_RATCST, NULL, at, 1, 0.0);
}

static sr_expr *make_num(struct simp_state *s, double v)
{
    if (!isfinite(v) || (v == 0.0 && signbit(v)))
        return NULL;
    if (v == floor(v) && fabs(v) < 9.0e15)
        return make_rat(s, (int64_t)v, 1);
    return expr_make(s->ctx, OP_CST, NULL, NULL, 1, v);
}

/* Exact rational arithmetic; false on overflow. */
static bool rat_add(int64_t p1, int64_t q1, int64_t p2, int64_t q2, int64_t *p, int64_t *q)
{
    int64_t a, b, d;
    if (__builtin_mul_overflow(p1, q2, &a) || __builtin_mul_overflow(p2, q1, &b) ||
        __builtin_add_overflow(a, b, p) || __builtin_mul_overflow(q1, q2, &d))
        return false;
    *q = d;
    return true;
}
static bool rat_mul(int64_t p1, int64_t q1, int64_t p2, int64_t q2, int64_t *p, int64_t *q)
{
    return !__builtin_mul_overflow(p1, p2, p) && !__builtin_mul_overflow(q1, q2, q);
}

/* The value of a scalar op on scalar operands, as docs/semantics.md defines it. */
static double eval_scalar(const sr_expr *e, const double *v)
{
    double a = v[0], b = v[1], c = v[2];
    switch ((enum expr_op)e->op) {
    case OP_ADD:
        return a + b;
    case OP_SUB:
        return a - b;
    case OP_MUL:
        return a * b;
    case OP_DIV:
        return a / b;
    case OP_MINUS:
        return -a;
    case OP_POWF:
        return pow(a, b);
    case OP_ATAN2:
        return atan2(a, b);
    case OP_LESS:
        return a < b;
    case OP_LESSEQ:
        return a <= b;
    case OP_GREATER:
        return a > b;
    case OP_GREATEREQ:
        return a >= b;
    case OP_EQUAL:
        return a == b;
    case OP_NOTEQUAL:
        return a != b;
    case OP_INV:
        return 1.0 / a;
    case OP_SQUARE:
    case OP_SQNORM2:
        return a * a;
    case OP_SQRT:
        return sqrt(a);
    case OP_RSQRT:
        return a == 0.0 ? 0.0 : 1.0 / sqrt(a);
    case OP_EXP:
        return exp(a);
    case OP_LOG:
        return log(a);
    case OP_XLOGX:
        return a == 0.0 ? 0.0 : a * log(a);
    case OP_SIN:
        return sin(a);
    case OP_COS:
        return cos(a);
    case OP_ASIN:
        return asin(a);
    case OP_ACOS:
        return acos(a);
    case OP_ATAN:
        return atan(a);
    case OP_ABS:
        return fabs(a);
    case OP_SIGN:
        return a > 0 ? 1.0 : a < 0 ? -1.0 : a == 0 ? 0.0 : a;
    case OP_STEP:
        return a >= 0 ? 1.0 : a < 0 ? 0.0 : a;
    case OP_RELU:
        return a > 0 ? a : a <= 0 ? 0.0 : a;
    case OP_FLOOR:
        return floor(a);
    case OP_SINXDIVX:
        return a == 0.0 ? 1.0 : sin(a) / a;
    case OP_POW: {
        int64_t n = e->iattr[0];
        double r = 1.0;
        for (int64_t k = 0; k < (n < 0 ? -n : n); k++)
            r *= a;
        return n < 0 ? 1.0 / r : r;
    }
    case OP_ROUND: {
        double sc = pow(10.0, (double)e->iattr[0]);
        return round(a * sc) / sc;
    }
    case OP_CLAMPINT:
        return isnan(a) ? a : fmin(fmax(a, (double)e->iattr[0]), (double)e->iattr[1]);
    case OP_CLAMP:
        return isnan(a) ? a : fmin(fmax(a, b), c);
    case OP_IFELSE:
        return a >= 0 ? b : c;
    case OP_MOD:
        return fma(-b, floor((a - c) / b), a); /* as the reference: one rounding */
    case OP_NORM2:
        return sqrt(a * a);
    case OP_NORMALIZE:
        return a == 0.0 ? 0.0 * a : a * (1.0 / sqrt(a * a));
    case OP_SQDIST:
        return (a - b) * (a - b);
    case OP_SCALPROD:
        return a * b;
    case OP_SUM:
    case OP_MAX:
    case OP_MIN:
    case OP_ELEM:
        return a;
    case OP_ARGMAX:
    case OP_ARGMIN:
        return 0.0;
    case OP_WEIGHTEDSQNORM:
        return a * b * b;
    case OP_WEIGHTEDSQDIST:
        return a * (b - c) * (b - c);
    default:
        return NAN; /* not folded: see foldable() */
    }
}

static bool foldable(const sr_expr *e)
{
    switch ((enum expr_op)e->op) {
    case OP_VAR:
    case OP_INTCST:
    case OP_RATCST:
    case OP_CST:
    case OP_EXTRACT:
    case OP_CONCAT:
    case OP_ONEHOT:
    case OP_MATVECMULT:
    case OP_VECMATMULT:
    case OP_TENSORPROD:
        return false;
    default:
        break;
    }
    if (e->dim != 1)
        return false;
    for (int i = 0; i < expr_arity(e); i++)
        if (!is_cst(e->child[i]))
            return false;
    return true;
}

static bool g_fold(struct simp_state *s, sr_expr *e) { return foldable(e); }

/* Exact when every operand is IntCst/RatCst and the op is rational arithmetic; else the value
 * in double precision, which is what the reference computes, kept only when finite. */
static sr_expr *r_fold(struct simp_state *s, sr_expr *e)
{
    double v[3] = {0, 0, 0};
    int ar = expr_arity(e);
    for (int i = 0; i < ar; i++)
        v[i] = cst_val(e->child[i]);
    double d = eval_scalar(e, v);
    if (!isfinite(d) || (d == 0.0 && signbit(d)))
        return NULL; /* keep -0.0, infinities and NaN as computations, as the user wrote them */
    int64_t p1 = 0, q1 = 1, p2 = 0, q2 = 1, p = 0, q = 1;
    bool r1 = cst_rat(e->child[0], &p1, &q1);
    bool r2 = ar < 2 || cst_rat(e->child[1], &p2, &q2);
    if (r1 && r2) {
        switch ((enum expr_op)e->op) {
        case OP_ADD:
            if (rat_add(p1, q1, p2, q2, &p, &q))
                return make_rat(s, p, q);
            break;
        case OP_SUB:
            if (p2 != INT64_MIN && rat_add(p1, q1, -p2, q2, &p, &q))
                return make_rat(s, p, q);
            break;
        case OP_MUL:
        case OP_SCALPROD:
            if (rat_mul(p1, q1, p2, q2, &p, &q))
                return make_rat(s, p, q);
            break;
        case OP_DIV:
            if (p2 != 0 && rat_mul(p1, q1, q2, p2, &p, &q))
                return make_rat(s, p, q);
            break;
        case OP_INV:
            if (p1 != 0)
                return make_rat(s, q1, p1);
            break;
        case OP_MINUS:
            if (p1 != INT64_MIN)
                return make_rat(s, -p1, q1);
            break;
        case OP_SQUARE:
        case OP_SQNORM2:
            if (rat_mul(p1, q1, p1, q1, &p, &q))
                return make_rat(s, p, q);
            break;
        case OP_ABS:
            if (p1 != INT64_MIN)
                return make_rat(s, p1 < 0 ? -p1 : p1, q1);
            break;
        case OP_SUM:
        case OP_MAX:
        case OP_MIN:
        case OP_ELEM:
            return e->child[0];
        case OP_POW: {
            int64_t n = e->iattr[0], an = n < 0 ? -n : n;
            p = 1;
            q = 1;
            bool ok = true;
            for (int64_t k = 0; k < an && ok; k++)
                ok = rat_mul(p, q, p1, q1, &p, &q);
            if (ok && n < 0 && p != 0)
                return make_rat(s, q, p);
            if (ok && n >= 0)
                return make_rat(s, p, q);
            break;
        }
        default:
            break;
        }
    }
    return make_num(s, d);
}

/* ---- chains: nested Add (or Mult) nodes read as one list of terms ---- */

#define CHAIN_MAX 256

/* Collects the operands of the op-chain rooted at e, left to right; -1 if longer than cap. */
static int chain_gather(sr_expr *e, enum expr_op op, sr_expr **out, int cap)
{
    sr_expr *stack[CHAIN_MAX + 2];
    int sp = 0, n = 0;
    stack[sp++] = e;
    while (sp) {
        sr_expr *t = stack[--sp];
        if (t->op == op) {
            if (sp + 2 > CHAIN_MAX + 2)
                return -1;
            stack[sp++] = t->child[1];
            stack[sp++] = t->child[0];
        } else {
            if (n == cap)
                return -1;
            out[n++] = t;
        }
    }
    return n;
}

/* Left-deep chain ((t0 op t1) op t2) ...; NULL for no terms. */
static sr_expr *chain_build(struct simp_state *s, enum expr_op op, sr_expr **t, int n)
{
    if (n <= 0)
        return NULL;
    sr_expr *acc = t[0];
    for (int i = 1; i < n && acc; i++)
        acc = mk2(s, op, acc, t[i]);
    return acc;
}

static int struct_cmp(const sr_expr *a, const sr_expr *b)
{
    if (a == b)
        return 0;
    if (a->op != b->op)
        return a->op < b->op ? -1 : 1;
    if (a->dim != b->dim)
        return a->dim < b->dim ? -1 : 1;
    for (int i = 0; i < EXPR_MAX_ATTR; i++)
        if (a->iattr[i] != b->iattr[i])
            return a->iattr[i] < b->iattr[i] ? -1 : 1;
    if (a->fattr != b->fattr)
        return a->fattr < b->fattr ? -1 : 1;
    for (int i = 0; i < expr_arity(a); i++) {
        int c = struct_cmp(a->child[i], b->child[i]);
        if (c)
            return c;
    }
    return 0;
}

int simp_cmp(const sr_expr *a, const sr_expr *b)
{
    if (a == b)
        return 0;
    int ka = is_cst(a) ? 0 : 1, kb = is_cst(b) ? 0 : 1;
    if (ka != kb)
        return ka - kb;
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return struct_cmp(a, b);
}

static int cmp_qsort(const void *pa, const void *pb)
{
    return simp_cmp(*(sr_expr *const *)pa, *(sr_expr *const *)pb);
}

static bool chain_sorted(sr_expr **t, int n)
{
    for (int i = 1; i < n; i++)
        if (simp_cmp(t[i - 1], t[i]) > 0)
            return false;
    return true;
}

/* ---- facts about nodes ---- */

bool simp_nonneg(const sr_expr *e)
{
    switch ((enum expr_op)e->op) {
    case OP_INTCST:
    case OP_RATCST:
    case OP_CST:
        return cst_val(e) >= 0;
    case OP_SQUARE:
    case OP_SQRT:
    case OP_RSQRT:
    case OP_EXP:
    case OP_ABS:
    case OP_SQNORM2:
    case OP_NORM2:
    case OP_SQDIST:
    case OP_RELU:
    case OP_STEP:
    case OP_LESS:
    case OP_LESSEQ:
    case OP_GREATER:
    case OP_GREATEREQ:
    case OP_EQUAL:
    case OP_NOTEQUAL:
    case OP_ONEHOT:
    case OP_ARGMAX:
    case OP_ARGMIN:
    case OP_CABS:
    case OP_CSQUAREABS:
        return true;
    case OP_POW:
        return e->iattr[0] % 2 == 0 || simp_nonneg(e->child[0]);
    case OP_POWF:
    case OP_INV:
    case OP_SUM:
    case OP_MAX:
    case OP_MIN:
    case OP_ELEM:
    case OP_EXTRACT:
        return simp_nonneg(e->child[0]);
    case OP_ADD:
    case OP_MUL:
    case OP_DIV:
    case OP_CONCAT:
    case OP_TENSORPROD:
        return simp_nonneg(e->child[0]) && simp_nonneg(e->child[1]);
    default:
        return false;
    }
}

/* An upper bound of |e| valid for every input (NaN and Inf included), or +inf if there is
 * none. */
static double finite_bound(const sr_expr *e)
{
    double a = INFINITY, b = INFINITY;
    int ar = expr_arity(e);
    if (ar >= 1)
        a = finite_bound(e->child[0]);
    if (ar >= 2)
        b = finite_bound(e->child[1]);
    double d = ar >= 1 ? e->child[0]->dim : 1;
    switch ((enum expr_op)e->op) {
    case OP_INTCST:
    case OP_RATCST:
    case OP_CST:
        return fabs(cst_val(e));
    case OP_LESS:
    case OP_LESSEQ:
    case OP_GREATER:
    case OP_GREATEREQ:
    case OP_EQUAL:
    case OP_NOTEQUAL:
    case OP_ONEHOT:
        return 1.0;
    case OP_SIN:
    case OP_COS:
        return ar && isfinite(a) ? 1.0 : INFINITY; /* sin(Inf) is NaN */
    case OP_ATAN:
        return isfinite(a) ? 1.6 : INFINITY;
    case OP_ADD:
    case OP_SUB:
        return a + b;
    case OP_MUL:
        return a * b;
    case OP_MINUS:
    case OP_ABS:
    case OP_RELU:
    case OP_SUM:
    case OP_MAX:
    case OP_MIN:
    case OP_ELEM:
    case OP_EXTRACT:
        return e->op == OP_SUM ? d * a : a;
    case OP_FLOOR:
        return a + 1.0;
    case OP_SQUARE:
        return a * a;
    case OP_SQNORM2:
        return d * a * a;
    case OP_SCALPROD:
        return d * a * b;
    case OP_SQDIST:
        return d * (a + b) * (a + b);
    case OP_CONCAT:
        return fmax(a, b);
    case OP_IFELSE: /* the value is one of the two branches, whatever the condition */
        return fmax(b, finite_bound(e->child[2]));
    default:
        return INFINITY;
    }
}

bool simp_always_finite(const sr_expr *e) { return finite_bound(e) < 1e300; }

int simp_mul_factors(const sr_expr *e, const sr_expr **fac, int n, int nmax, int *neg)
{
    if (n < 0)
        return n;
    if (e->op == OP_MUL)
        return simp_mul_factors(e->child[1], fac, simp_mul_factors(e->child[0], fac, n, nmax, neg),
                                nmax, neg);
    if (e->op == OP_MINUS) {
        ++*neg;
        return simp_mul_factors(e->child[0], fac, n, nmax, neg);
    }
    if (n == nmax)
        return -1;
    fac[n] = e;
    return n + 1;
}

/* Whether e depends on nothing that changes across pairs on one side: used to keep Exp(a) and
 * Exp(b) apart when merging them would make a hoistable factor per-pair work. */
static unsigned dep_class(const sr_expr *e) { return e->deps & (DEP_I | DEP_J); }

/* ---- canonical pass ---- */

static bool g_sort_add(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_ADD, t, CHAIN_MAX);
    return n > 1 && !chain_sorted(t, n);
}
static bool g_sort_mul(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX);
    return n > 1 && !chain_sorted(t, n);
}
static sr_expr *r_sort_chain(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, (enum expr_op)e->op, t, CHAIN_MAX);
    if (n < 2)
        return NULL;
    qsort(t, (size_t)n, sizeof *t, cmp_qsort);
    return chain_build(s, (enum expr_op)e->op, t, n);
}

static bool g_sort_args(struct simp_state *s, sr_expr *e)
{
    return simp_cmp(e->child[0], e->child[1]) > 0;
}
static sr_expr *r_sort_args(struct simp_state *s, sr_expr *e)
{
    return mk2(s, (enum expr_op)e->op, e->child[1], e->child[0]);
}

static bool g_neg_neg(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_MINUS; }
static sr_expr *r_neg_neg(struct simp_state *s, sr_expr *e) { return e->child[0]->child[0]; }

/* Whether a term of the op-chain at e (a flattened sum or product) is a negation. */
static bool chain_has_minus(sr_expr *e, enum expr_op op)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, op, t, CHAIN_MAX);
    for (int i = 0; i < n; i++)
        if (t[i]->op == OP_MINUS)
            return true;
    return false;
}

/* a + b + (-c) + (-d) -> (a + b) - (c + d); all negated: -(c + d). */
static bool g_add_neg(struct simp_state *s, sr_expr *e) { return chain_has_minus(e, OP_ADD); }
static sr_expr *r_add_neg(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX], *pos[CHAIN_MAX], *neg[CHAIN_MAX];
    int n = chain_gather(e, OP_ADD, t, CHAIN_MAX), np = 0, nn = 0;
    for (int i = 0; i < n; i++) {
        if (t[i]->op == OP_MINUS)
            neg[nn++] = t[i]->child[0];
        else
            pos[np++] = t[i];
    }
    sr_expr *nsum = chain_build(s, OP_ADD, neg, nn);
    if (!np)
        return nsum ? mk1(s, OP_MINUS, nsum) : NULL;
    return mk2(s, OP_SUB, chain_build(s, OP_ADD, pos, np), nsum);
}

static bool g_sub_neg(struct simp_state *s, sr_expr *e) { return e->child[1]->op == OP_MINUS; }
static sr_expr *r_sub_neg(struct simp_state *s, sr_expr *e)
{
    return mk2(s, OP_ADD, e->child[0], e->child[1]->child[0]);
}

static bool g_sub_neg_left(struct simp_state *s, sr_expr *e)
{
    return e->child[0]->op == OP_MINUS && e->child[1]->op != OP_MINUS;
}
static sr_expr *r_sub_neg_left(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_MINUS, mk2(s, OP_ADD, e->child[0]->child[0], e->child[1]));
}

/* Minus factors leave a product: (-a) * b -> -(a * b), exact in IEEE arithmetic. */
static bool g_mul_neg(struct simp_state *s, sr_expr *e) { return chain_has_minus(e, OP_MUL); }
static sr_expr *r_mul_neg(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX), neg = 0;
    for (int i = 0; i < n; i++)
        if (t[i]->op == OP_MINUS) {
            t[i] = t[i]->child[0];
            neg ^= 1;
        }
    sr_expr *p = chain_build(s, OP_MUL, t, n);
    return neg ? mk1(s, OP_MINUS, p) : p;
}

/* a / c with c an exact nonzero IntCst/RatCst -> a * (1/c): exact reciprocal, one rounding. */
static bool g_div_const(struct simp_state *s, sr_expr *e)
{
    int64_t p, q;
    return !is_cst(e->child[0]) && cst_rat(e->child[1], &p, &q) && p != 0 && p != INT64_MIN &&
           !(p == 1 && q == 1);
}
static sr_expr *r_div_const(struct simp_state *s, sr_expr *e)
{
    int64_t p = 1, q = 1;
    cst_rat(e->child[1], &p, &q);
    sr_expr *r = make_rat(s, q, p);
    return r ? mk2(s, OP_MUL, r, e->child[0]) : NULL;
}

/*
 * a / b with b free of the pair (one-sided or parameter-only) and a of the pair -> a * Inv(b),
 * and a / (b1 * ... * bn) with each bk free of the pair (while their product is not: an i-only
 * times a j-only norm, say) -> a * Inv(b1) * ... * Inv(bn). The reciprocals are then hoisted
 * (and an i-only one leaves a Sum), and the pair pays a multiplication instead of a division.
 * Same NaN/Inf class: a / ±0 and a * Inv(±0) are both ±Inf (NaN for a = 0), a / Inf and
 * a * Inv(Inf) both ±0; only the rounding (and a product's overflow) differ.
 */
static bool is_pair(const sr_expr *e) { return (e->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J); }
static bool g_div_onesided(struct simp_state *s, sr_expr *e)
{
    sr_expr *b = e->child[1];
    if (!is_pair(e) || is_cst(b))
        return false;
    if (!is_pair(b))
        return true;
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(b, OP_MUL, t, CHAIN_MAX);
    if (n < 2 || n >= CHAIN_MAX)
        return false;
    for (int i = 0; i < n; i++)
        if (is_pair(t[i]))
            return false;
    return true;
}
static sr_expr *r_div_onesided(struct simp_state *s, sr_expr *e)
{
    sr_expr *b = e->child[1], *t[CHAIN_MAX];
    int n = 1;
    t[0] = b;
    if (is_pair(b))
        n = chain_gather(b, OP_MUL, t, CHAIN_MAX);
    sr_expr *r = e->child[0];
    for (int i = 0; i < n && r; i++)
        r = mk2(s, OP_MUL, r, mk1(s, OP_INV, t[i]));
    return r;
}

/* ---- identities ---- */

/* Drops the chain terms equal to the constant v (x + 0, x * 1). */
static bool chain_has_val(sr_expr *e, enum expr_op op, double v)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, op, t, CHAIN_MAX);
    if (n < 2)
        return false;
    for (int i = 0; i < n; i++)
        if (is_val(t[i], v))
            return true;
    return false;
}
static sr_expr *chain_drop_val(struct simp_state *s, sr_expr *e, enum expr_op op, double v)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, op, t, CHAIN_MAX), m = 0;
    for (int i = 0; i < n; i++)
        if (!is_val(t[i], v))
            t[m++] = t[i];
    return chain_build(s, op, t, m);
}

static bool g_add_zero(struct simp_state *s, sr_expr *e) { return chain_has_val(e, OP_ADD, 0.0); }
static sr_expr *r_add_zero(struct simp_state *s, sr_expr *e)
{
    return chain_drop_val(s, e, OP_ADD, 0.0);
}
static bool g_mul_one(struct simp_state *s, sr_expr *e) { return chain_has_val(e, OP_MUL, 1.0); }
static sr_expr *r_mul_one(struct simp_state *s, sr_expr *e)
{
    return chain_drop_val(s, e, OP_MUL, 1.0);
}
static bool g_mul_minus_one(struct simp_state *s, sr_expr *e)
{
    return chain_has_val(e, OP_MUL, -1.0);
}
static sr_expr *r_mul_minus_one(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX), m = 0;
    bool dropped = false;
    for (int i = 0; i < n; i++) {
        if (!dropped && is_val(t[i], -1.0))
            dropped = true;
        else
            t[m++] = t[i];
    }
    return mk1(s, OP_MINUS, chain_build(s, OP_MUL, t, m));
}

/* x * 0 -> 0 only where x cannot be NaN or infinite, whatever the inputs, nor negative: a
 * negative x makes the IEEE product -0, whose sign Inv, Atan2 or Powf then show. */
static bool g_mul_zero(struct simp_state *s, sr_expr *e)
{
    if (e->dim != 1)
        return false;
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX);
    bool zero = false;
    for (int i = 0; i < n; i++) {
        if (is_val(t[i], 0.0))
            zero = true;
        else if (!simp_always_finite(t[i]) || !simp_nonneg(t[i]))
            return false;
    }
    return zero;
}
static sr_expr *r_zero(struct simp_state *s, sr_expr *e) { return make_rat(s, 0, 1); }

/* x - x -> 0 under the same guard. */
static bool g_sub_self(struct simp_state *s, sr_expr *e)
{
    return e->dim == 1 && e->child[0] == e->child[1] && simp_always_finite(e->child[0]);
}

static bool g_sub_zero(struct simp_state *s, sr_expr *e) { return is_val(e->child[1], 0.0); }
static sr_expr *r_sub_zero(struct simp_state *s, sr_expr *e) { return e->child[0]; }
static bool g_zero_sub(struct simp_state *s, sr_expr *e) { return is_val(e->child[0], 0.0); }
static sr_expr *r_zero_sub(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_MINUS, e->child[1]);
}
static bool g_div_one(struct simp_state *s, sr_expr *e) { return is_val(e->child[1], 1.0); }

/* x * x -> Square(x) (one product, the same rounding). */
static bool g_mul_self(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX);
    for (int i = 1; i < n; i++)
        if (t[i] == t[i - 1] && !is_cst(t[i]))
            return true;
    return false;
}
static sr_expr *r_mul_self(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX), m = 0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && t[i] == t[i + 1] && !is_cst(t[i])) {
            t[m++] = mk1(s, OP_SQUARE, t[i]);
            i++;
        } else {
            t[m++] = t[i];
        }
    }
    return chain_build(s, OP_MUL, t, m);
}

/* Exp(a) * Exp(b) -> Exp(a + b), for exponents of the same dependency class. */
static bool g_exp_mul(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[i]->op == OP_EXP && t[j]->op == OP_EXP && dep_class(t[i]) == dep_class(t[j]))
                return true;
    return false;
}
static sr_expr *r_exp_mul(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int n = chain_gather(e, OP_MUL, t, CHAIN_MAX);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[i]->op == OP_EXP && t[j]->op == OP_EXP && dep_class(t[i]) == dep_class(t[j])) {
                t[i] = mk1(s, OP_EXP, mk2(s, OP_ADD, t[i]->child[0], t[j]->child[0]));
                memmove(t + j, t + j + 1, (size_t)(n - j - 1) * sizeof *t);
                return chain_build(s, OP_MUL, t, n - 1);
            }
    return NULL;
}

static bool g_square_neg(struct simp_state *s, sr_expr *e)
{
    return e->child[0]->op == OP_MINUS || e->child[0]->op == OP_ABS;
}
static sr_expr *r_square_inner(struct simp_state *s, sr_expr *e)
{
    return mk1(s, (enum expr_op)e->op, e->child[0]->child[0]);
}
static bool g_abs_neg(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_MINUS; }

/* Abs(x) -> x where x is never negative. */
static bool g_abs_nonneg(struct simp_state *s, sr_expr *e) { return simp_nonneg(e->child[0]); }
static sr_expr *r_child0(struct simp_state *s, sr_expr *e) { return e->child[0]; }

/* Square(Sqrt(x)) -> x on non-negative x (elsewhere Sqrt gives NaN and x does not). */
static bool g_sqrt_square(struct simp_state *s, sr_expr *e)
{
    return e->child[0]->op == OP_SQRT && simp_nonneg(e->child[0]->child[0]);
}
static sr_expr *r_grandchild(struct simp_state *s, sr_expr *e) { return e->child[0]->child[0]; }

/* Sqrt(Square(x)) -> Abs(x). */
static bool g_square_sqrt(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_SQUARE; }
static sr_expr *r_square_sqrt(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_ABS, e->child[0]->child[0]);
}

static bool g_log_exp(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_EXP; }

/* Conj(Conj(a)) -> a, ComplexReal(Real2Complex(a)) -> a, ComplexImag(Imag2Complex(a)) -> a:
 * exact (the parts are copied, NaN and Inf included); gradients of complex formulas make them. */
static bool g_conj_conj(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_CONJ; }
static bool g_real_real2c(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_REAL2C; }
static bool g_imag_imag2c(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_IMAG2C; }

static bool g_pow_small(struct simp_state *s, sr_expr *e)
{
    int64_t n = e->iattr[0];
    return n == 1 || n == 2 || n == -1 || (n == 0 && e->dim == 1);
}
static sr_expr *r_pow_small(struct simp_state *s, sr_expr *e)
{
    switch (e->iattr[0]) {
    case 0:
        return make_rat(s, 1, 1);
    case 1:
        return e->child[0];
    case 2:
        return mk1(s, OP_SQUARE, e->child[0]);
    default:
        return mk1(s, OP_INV, e->child[0]);
    }
}

/* Powf(x, c) for constant c: 2 -> Square, 1 -> x, 1/2 -> Sqrt (only where x cannot be -inf:
 * pow(-inf, 0.5) is +inf but sqrt(-inf) is NaN), other small integers -> Pow(x, n). */
static bool g_powf_const(struct simp_state *s, sr_expr *e)
{
    sr_expr *c = e->child[1];
    if (!is_cst(c) || is_cst(e->child[0]))
        return false;
    double v = cst_val(c);
    if (v == 0.5)
        return simp_nonneg(e->child[0]) || simp_always_finite(e->child[0]);
    return v == floor(v) && fabs(v) <= 16 && (v != 0 || e->dim == e->child[0]->dim);
}
static sr_expr *r_powf_const(struct simp_state *s, sr_expr *e)
{
    double v = cst_val(e->child[1]);
    sr_expr *x = e->child[0];
    if (v == 0.5)
        return mk1(s, OP_SQRT, x);
    if (v == 1.0)
        return x;
    if (v == 2.0)
        return mk1(s, OP_SQUARE, x);
    return mk_attr(s, OP_POW, x, (int64_t)v, 0);
}

static bool g_sqrt_sqnorm(struct simp_state *s, sr_expr *e)
{
    return e->child[0]->op == OP_SQNORM2;
}
static sr_expr *r_sqrt_sqnorm(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_NORM2, e->child[0]->child[0]);
}
static bool g_square_norm(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_NORM2; }
static sr_expr *r_square_norm(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_SQNORM2, e->child[0]->child[0]);
}

/* ---- match-and-replace ---- */

static bool g_sum_scalar(struct simp_state *s, sr_expr *e) { return e->child[0]->dim == 1; }

static bool is_diff(const sr_expr *e)
{
    return e->op == OP_SUB && e->child[0]->dim == e->child[1]->dim;
}

/*
 * Sum over a product: finds the factor Square(a - b) (-> SqDist / WeightedSqDist), else
 * Square(a) (-> SqNorm2 / WeightedSqNorm), else two factors of the full dimension
 * (-> Scalprod). *w is the product of the other factors (NULL if none).
 */
enum sum_kind { SUM_NONE, SUM_SQDIST, SUM_SQNORM, SUM_SCALPROD };

static enum sum_kind sum_match(struct simp_state *s, sr_expr *e, int *which, sr_expr **t, int *n)
{
    sr_expr *a = e->child[0];
    int D = a->dim;
    if (D < 2)
        return SUM_NONE;
    *n = chain_gather(a, OP_MUL, t, CHAIN_MAX);
    if (*n < 1)
        return SUM_NONE;
    for (int i = 0; i < *n; i++)
        if (t[i]->op == OP_SQUARE && t[i]->dim == D && is_diff(t[i]->child[0])) {
            *which = i;
            return SUM_SQDIST;
        }
    for (int i = 0; i < *n; i++)
        if (t[i]->op == OP_SQUARE && t[i]->dim == D) {
            *which = i;
            return SUM_SQNORM;
        }
    if (*n >= 2)
        for (int i = 0; i < *n; i++)
            if (t[i]->dim == D) {
                *which = i;
                return SUM_SCALPROD;
            }
    return SUM_NONE;
}

/* The match for Sum(e) if it is of kind k, weighted (other factors) or not; else false. */
static bool sum_is(struct simp_state *s, sr_expr *e, enum sum_kind want, bool weighted)
{
    sr_expr *t[CHAIN_MAX];
    int which, n;
    enum sum_kind k = sum_match(s, e, &which, t, &n);
    if (k != want || (n > 1) != weighted)
        return false;
    if (n == 1)
        return k != SUM_SCALPROD;
    /* The other factors form the weight (or the second operand of Scalprod): its dimension
     * must be 1 or D for a weight, D for Scalprod. */
    int D = e->child[0]->dim, wd = 1;
    for (int i = 0; i < n; i++)
        if (i != which && t[i]->dim != 1)
            wd = t[i]->dim;
    return k == SUM_SCALPROD ? wd == D : (wd == 1 || wd == D);
}
static bool g_sum_sqdist(struct simp_state *s, sr_expr *e)
{
    return sum_is(s, e, SUM_SQDIST, false);
}
static bool g_sum_wsqdist(struct simp_state *s, sr_expr *e)
{
    return sum_is(s, e, SUM_SQDIST, true);
}
static bool g_sum_sqnorm(struct simp_state *s, sr_expr *e)
{
    return sum_is(s, e, SUM_SQNORM, false);
}
static bool g_sum_wsqnorm(struct simp_state *s, sr_expr *e)
{
    return sum_is(s, e, SUM_SQNORM, true);
}
static bool g_sum_scalprod(struct simp_state *s, sr_expr *e)
{
    return sum_is(s, e, SUM_SCALPROD, true);
}
static sr_expr *r_sum_match(struct simp_state *s, sr_expr *e)
{
    sr_expr *t[CHAIN_MAX];
    int which, n;
    enum sum_kind k = sum_match(s, e, &which, t, &n);
    sr_expr *f = t[which];
    memmove(t + which, t + which + 1, (size_t)(n - which - 1) * sizeof *t);
    sr_expr *w = chain_build(s, OP_MUL, t, n - 1);
    switch (k) {
    case SUM_SQDIST:
        if (!w)
            return mk2(s, OP_SQDIST, f->child[0]->child[0], f->child[0]->child[1]);
        return mk3(s, OP_WEIGHTEDSQDIST, w, f->child[0]->child[0], f->child[0]->child[1]);
    case SUM_SQNORM:
        if (!w)
            return mk1(s, OP_SQNORM2, f->child[0]);
        return mk2(s, OP_WEIGHTEDSQNORM, w, f->child[0]);
    case SUM_SCALPROD:
        return mk2(s, OP_SCALPROD, f, w);
    default:
        return NULL;
    }
}

static bool g_sqnorm_diff(struct simp_state *s, sr_expr *e) { return is_diff(e->child[0]); }
static sr_expr *r_sqnorm_diff(struct simp_state *s, sr_expr *e)
{
    return mk2(s, OP_SQDIST, e->child[0]->child[0], e->child[0]->child[1]);
}
static bool g_sqrt_sqdist(struct simp_state *s, sr_expr *e) { return e->child[0]->op == OP_SQDIST; }
static sr_expr *r_sqrt_sqdist(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_NORM2, mk2(s, OP_SUB, e->child[0]->child[0], e->child[0]->child[1]));
}
static bool g_scalprod_self(struct simp_state *s, sr_expr *e) { return e->child[0] == e->child[1]; }
static sr_expr *r_scalprod_self(struct simp_state *s, sr_expr *e)
{
    return mk1(s, OP_SQNORM2, e->child[0]);
}

/* (Normalize(x) | Normalize(y)) -> (x|y) * Rsqrt(SqNorm2(x)) * Rsqrt(SqNorm2(y)): the two
 * factors depend on one side each and are hoisted. */
static bool g_scalprod_normalize(struct simp_state *s, sr_expr *e)
{
    return e->child[0]->op == OP_NORMALIZE && e->child[1]->op == OP_NORMALIZE;
}
static sr_expr *r_scalprod_normalize(struct simp_state *s, sr_expr *e)
{
    sr_expr *x = e->child[0]->child[0], *y = e->child[1]->child[0];
    sr_expr *rx = mk1(s, OP_RSQRT, mk1(s, OP_SQNORM2, x));
    sr_expr *ry = mk1(s, OP_RSQRT, mk1(s, OP_SQNORM2, y));
    return mk2(s, OP_MUL, mk2(s, OP_MUL, mk2(s, OP_SCALPROD, x, y), rx), ry);
}

/* ---- cost-guarded rewrites ---- */

/* ReLU(SqNorm2(a) + SqNorm2(b) - 2 (a|b)): the ReLU keeps the value >= 0 when rounding makes
 * the difference slightly negative (a following Sqrt would give NaN), and passes NaN on. */
static sr_expr *expand_sqdist(struct simp_state *s, sr_expr *a, sr_expr *b)
{
    sr_expr *norms = mk2(s, OP_ADD, mk1(s, OP_SQNORM2, a), mk1(s, OP_SQNORM2, b));
    sr_expr *ip = mk2(s, OP_MUL, make_rat(s, 2, 1), mk2(s, OP_SCALPROD, a, b));
    return mk1(s, OP_RELU, mk2(s, OP_SUB, norms, ip));
}
static bool g_sqdist_gemm(struct simp_state *s, sr_expr *e)
{
    return simp_cost_gemm_wins(e->child[0], e->child[1], s->opts);
}
static sr_expr *r_sqdist_gemm(struct simp_state *s, sr_expr *e)
{
    return expand_sqdist(s, e->child[0], e->child[1]);
}
static bool g_norm2diff_gemm(struct simp_state *s, sr_expr *e)
{
    sr_expr *d = e->child[0];
    return is_diff(d) && simp_cost_gemm_wins(d->child[0], d->child[1], s->opts);
}
static sr_expr *r_norm2diff_gemm(struct simp_state *s, sr_expr *e)
{
    sr_expr *d = e->child[0];
    return mk1(s, OP_SQRT, expand_sqdist(s, d->child[0], d->child[1]));
}

/* ---- the table ---- */

#define C SIMP_PASS_CANON
#define I SIMP_PASS_IDENT
#define M SIMP_PASS_MATCH
#define K SIMP_PASS_COST

const struct simp_rule simp_rules[] = {
    /* canonical: fold constants, order operands, move signs outward */
    {"fold-const", C, -1, g_fold, r_fold},
    {"sort-add", C, OP_ADD, g_sort_add, r_sort_chain},
    {"sort-mul", C, OP_MUL, g_sort_mul, r_sort_chain},
    {"sort-args", C, OP_SCALPROD, g_sort_args, r_sort_args},
    {"sort-args", C, OP_SQDIST, g_sort_args, r_sort_args},
    {"sort-args", C, OP_EQUAL, g_sort_args, r_sort_args},
    {"sort-args", C, OP_NOTEQUAL, g_sort_args, r_sort_args},
    {"neg-neg", C, OP_MINUS, g_neg_neg, r_neg_neg},
    {"add-neg", C, OP_ADD, g_add_neg, r_add_neg},
    {"sub-neg", C, OP_SUB, g_sub_neg, r_sub_neg},
    {"sub-neg-left", C, OP_SUB, g_sub_neg_left, r_sub_neg_left},
    {"mul-neg", C, OP_MUL, g_mul_neg, r_mul_neg},
    {"div-const", C, OP_DIV, g_div_const, r_div_const},
    /* algebraic identities */
    {"add-zero", I, OP_ADD, g_add_zero, r_add_zero},
    {"sub-zero", I, OP_SUB, g_sub_zero, r_sub_zero},
    {"zero-sub", I, OP_SUB, g_zero_sub, r_zero_sub},
    {"sub-self", I, OP_SUB, g_sub_self, r_zero},
    {"mul-one", I, OP_MUL, g_mul_one, r_mul_one},
    {"mul-zero", I, OP_MUL, g_mul_zero, r_zero},
    {"mul-minus-one", I, OP_MUL, g_mul_minus_one, r_mul_minus_one},
    {"mul-self", I, OP_MUL, g_mul_self, r_mul_self},
    {"exp-mul", I, OP_MUL, g_exp_mul, r_exp_mul},
    {"div-one", I, OP_DIV, g_div_one, r_sub_zero},
    {"square-neg", I, OP_SQUARE, g_square_neg, r_square_inner},
    {"abs-neg", I, OP_ABS, g_abs_neg, r_square_inner},
    {"abs-nonneg", I, OP_ABS, g_abs_nonneg, r_child0},
    {"sqrt-square", I, OP_SQUARE, g_sqrt_square, r_grandchild},
    {"square-sqrt", I, OP_SQRT, g_square_sqrt, r_square_sqrt},
    {"log-exp", I, OP_LOG, g_log_exp, r_grandchild},
    {"conj-conj", I, OP_CONJ, g_conj_conj, r_grandchild},
    {"real-real2complex", I, OP_CREAL, g_real_real2c, r_grandchild},
    {"imag-imag2complex", I, OP_CIMAG, g_imag_imag2c, r_grandchild},
    {"pow-small", I, OP_POW, g_pow_small, r_pow_small},
    {"powf-const", I, OP_POWF, g_powf_const, r_powf_const},
    {"sqrt-sqnorm", I, OP_SQRT, g_sqrt_sqnorm, r_sqrt_sqnorm},
    {"square-norm", I, OP_SQUARE, g_square_norm, r_square_norm},
    /* match-and-replace */
    {"sum-scalar", M, OP_SUM, g_sum_scalar, r_child0},
    {"sum-sqdist", M, OP_SUM, g_sum_sqdist, r_sum_match},
    {"sum-wsqdist", M, OP_SUM, g_sum_wsqdist, r_sum_match},
    {"sum-sqnorm", M, OP_SUM, g_sum_sqnorm, r_sum_match},
    {"sum-wsqnorm", M, OP_SUM, g_sum_wsqnorm, r_sum_match},
    {"sum-scalprod", M, OP_SUM, g_sum_scalprod, r_sum_match},
    {"sqnorm-diff", M, OP_SQNORM2, g_sqnorm_diff, r_sqnorm_diff},
    {"sqrt-sqdist", M, OP_SQRT, g_sqrt_sqdist, r_sqrt_sqdist},
    {"scalprod-self", M, OP_SCALPROD, g_scalprod_self, r_scalprod_self},
    {"scalprod-normalize", M, OP_SCALPROD, g_scalprod_normalize, r_scalprod_normalize},
    {"div-onesided", M, OP_DIV, g_div_onesided, r_div_onesided},
    /* cost-guarded */
    {"sqdist-gemm", K, OP_SQDIST, g_sqdist_gemm, r_sqdist_gemm},
    {"norm2diff-gemm", K, OP_NORM2, g_norm2diff_gemm, r_norm2diff_gemm},
};

#undef C
#undef I
#undef M
#undef K

const int simp_nrules = (int)(sizeof simp_rules / sizeof *simp_rules);
_Static_assert(sizeof simp_rules / sizeof *simp_rules <= SIMP_MAX_RULES, "raise SIMP_MAX_RULES");
