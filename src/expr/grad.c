/*
 * grad.c — symbolic differentiation: the derivative rule of every op, sr_grad and sr_diff.
 *
 * sr_grad(F, V, E) is KeOps' Grad(F, V, E): the gradient with respect to the variable V of the
 * scalar <F, E>, an expression of dimension dim(V). It is built by reverse-mode accumulation
 * over the DAG of F: the adjoint of F is E; walking the nodes from the root down, each node's
 * rule turns the node's adjoint into contributions to the adjoints of its children, which add
 * up; the adjoint of V is the result. Only nodes that depend on V are visited, so no rule
 * builds a term for a constant operand. The rules build ordinary nodes with the public
 * builders, so a gradient is a formula like any other: it prints, parses back, simplifies and
 * runs on every backend.
 *
 * Values at kinks and other conventions are in docs/gradients.md; in short: the
 * piecewise-constant ops (comparisons, Sign, Step, Floor, Round, ArgMin/ArgMax, OneHot) have
 * derivative 0, Abs uses Sign (0 at 0), ReLU uses Step (1 at 0, as KeOps), Min/Max pass the
 * gradient to the first extreme component, Clamp to whichever operand the value equals (the
 * operand a at the bounds), and Sqrt, Rsqrt, Norm2, Normalize, Asin, Acos use Rsqrt, so their
 * derivatives are 0 where Rsqrt's argument is 0 (KeOps).
 */
#include "expr.h"

#include <stdlib.h>
#include <string.h>

struct grad {
    sr_ctx *ctx;
    const sr_expr *var;
    uint32_t *pos_of; /* node id -> position in order + 1 (0: not in F's DAG) */
    uint32_t nids;
    bool *dep;     /* by position: the node depends on var */
    sr_expr **adj; /* by position: the adjoint so far; NULL = zero */
    bool failed;
};

sr_expr *expr_zeros(sr_ctx *ctx, int d)
{
    if (d == 1)
        return sr_intcst(ctx, 0);
    return sr_onehot(ctx, sr_intcst(ctx, -1), d);
}

static size_t posn(const struct grad *G, const sr_expr *e)
{
    return e->id < G->nids ? G->pos_of[e->id] : 0;
}

/* Whether child k of e depends on the variable (so that its contribution is needed). */
static bool need(const struct grad *G, const sr_expr *e, int k)
{
    size_t p = posn(G, e->child[k]);
    return p && G->dep[p - 1];
}

/* Adds c to the adjoint of child k of e. A contribution of a vector to a scalar child (the
 * child was broadcast) is summed; a scalar contribution to a vector child is broadcast. A NULL
 * c means a builder failed: the error is recorded in the context. */
static void acc(struct grad *G, const sr_expr *e, int k, sr_expr *c)
{
    sr_expr *child = e->child[k];
    if (!c) {
        G->failed = true;
        return;
    }
    if (c->dim != child->dim) {
        if (child->dim == 1)
            c = sr_sum(G->ctx, c);
        else if (c->dim == 1)
            c = sr_add(G->ctx, c, expr_zeros(G->ctx, child->dim));
        else
            c = NULL;
        if (!c || c->dim != child->dim) {
            if (c)
                expr_builder_error(G->ctx, SR_EINTERNAL,
                                   "Grad: the rule of %s gave a term of dimension %d for an "
                                   "operand of dimension %d",
                                   expr_ops[e->op].name, c->dim, child->dim);
            G->failed = true;
            return;
        }
    }
    size_t p = posn(G, child) - 1;
    G->adj[p] = G->adj[p] ? sr_add(G->ctx, G->adj[p], c) : c;
    if (!G->adj[p])
        G->failed = true;
}

/* ---- the rules -------------------------------------------------------------------------------
 * One function per op: gr_<id>(G, e, g) adds to the adjoints of e's children the contributions
 * of the adjoint g (dimension dim(e)). ACC(k, expr) evaluates expr only when child k depends on
 * the variable. */

typedef void (*grad_rule)(struct grad *G, const sr_expr *e, sr_expr *g);

#define ACC(k, expr)                                                                               \
    do {                                                                                           \
        if (need(G, e, (k)))                                                                       \
            acc(G, e, (k), (expr));                                                                \
    } while (0)

#define X       (G->ctx)
#define A       (e->child[0])
#define B       (e->child[1])
#define C       (e->child[2])
#define SELF    ((sr_expr *)e)
#define I(n)    sr_intcst(X, (n))
#define R(p, q) sr_ratcst(X, (p), (q))

/* Leaves, and the ops that are piecewise constant: derivative 0 (KeOps uses 0 as well). */
static void gr_zero(struct grad *G, const sr_expr *e, sr_expr *g) {}
#define gr_VAR       gr_zero
#define gr_INTCST    gr_zero
#define gr_RATCST    gr_zero
#define gr_CST       gr_zero
#define gr_LESS      gr_zero
#define gr_LESSEQ    gr_zero
#define gr_GREATER   gr_zero
#define gr_GREATEREQ gr_zero
#define gr_EQUAL     gr_zero
#define gr_NOTEQUAL  gr_zero
#define gr_SIGN      gr_zero
#define gr_STEP      gr_zero
#define gr_FLOOR     gr_zero
#define gr_ROUND     gr_zero
#define gr_ARGMAX    gr_zero
#define gr_ARGMIN    gr_zero
#define gr_ONEHOT    gr_zero

/* DiffClampInt, the mask of ClampInt's derivative, is piecewise constant too. */
#define gr_DIFFCLAMPINT gr_zero

static void gr_ADD(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, g);
    ACC(1, g);
}
static void gr_SUB(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, g);
    ACC(1, sr_neg(X, g));
}
static void gr_MUL(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, B));
    ACC(1, sr_mul(X, g, A));
}
static void gr_DIV(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_div(X, g, B));
    ACC(1, sr_neg(X, sr_div(X, sr_mul(X, g, SELF), B))); /* -g a/b^2 = -g (a/b) / b */
}
static void gr_MINUS(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_neg(X, g)); }
static void gr_POWF(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* d(a^b)/da = b a^(b-1); d(a^b)/db = a^b log(a) (NaN for a < 0, as for KeOps' Exp(b Log a)) */
    ACC(0, sr_mul(X, g, sr_mul(X, B, sr_powf(X, A, sr_sub(X, B, I(1))))));
    ACC(1, sr_mul(X, g, sr_mul(X, SELF, sr_log(X, A))));
}
static void gr_ATAN2(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* atan2(y, x): d/dy = x / (x^2 + y^2), d/dx = -y / (x^2 + y^2) */
    sr_expr *r = sr_add(X, sr_square(X, A), sr_square(X, B));
    ACC(0, sr_div(X, sr_mul(X, g, B), r));
    ACC(1, sr_neg(X, sr_div(X, sr_mul(X, g, A), r)));
}
static void gr_INV(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_neg(X, sr_mul(X, g, sr_square(X, SELF))));
}
static void gr_SQUARE(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, I(2), sr_mul(X, g, A)));
}
static void gr_SQRT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* 1/(2 sqrt(a)) written with Rsqrt, as KeOps: 0 (not +inf) at a = 0 */
    ACC(0, sr_mul(X, R(1, 2), sr_mul(X, g, sr_rsqrt(X, A))));
}
static void gr_RSQRT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* -1/2 a^(-3/2) = -1/2 Rsqrt(a)^3: 0 at a = 0, where Rsqrt is 0 by convention */
    ACC(0, sr_mul(X, R(-1, 2), sr_mul(X, g, sr_pow(X, SELF, 3))));
}
static void gr_EXP(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_mul(X, g, SELF)); }
static void gr_LOG(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_div(X, g, A)); }
static void gr_XLOGX(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_add(X, sr_log(X, A), I(1))));
}
static void gr_SIN(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_cos(X, A)));
}
static void gr_COS(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_neg(X, sr_mul(X, g, sr_sin(X, A))));
}
static sr_expr *rsqrt_one_minus_sq(sr_ctx *ctx, sr_expr *a)
{
    return sr_rsqrt(ctx, sr_sub(ctx, sr_intcst(ctx, 1), sr_square(ctx, a)));
}
static void gr_ASIN(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, rsqrt_one_minus_sq(X, A)));
}
static void gr_ACOS(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_neg(X, sr_mul(X, g, rsqrt_one_minus_sq(X, A))));
}
static void gr_ATAN(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_div(X, g, sr_add(X, I(1), sr_square(X, A))));
}
static void gr_ABS(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_sign(X, A))); /* 0 at 0 */
}
static void gr_RELU(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_step(X, A))); /* 1 at 0 (Step(0) = 1), as KeOps */
}
static void gr_SINXDIVX(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* (cos a - sin(a)/a) / a, and its limit 0 at a = 0: IfElse(-|a|, 0, ...) selects 0 only
     * there */
    sr_expr *d = sr_div(X, sr_sub(X, sr_cos(X, A), SELF), A);
    ACC(0, sr_mul(X, g, sr_ifelse(X, sr_neg(X, sr_abs(X, A)), I(0), d)));
}
static void gr_POW(struct grad *G, const sr_expr *e, sr_expr *g)
{
    int p = (int)e->iattr[0];
    if (p == 0)
        return;
    if (p == 1)
        ACC(0, g);
    else
        ACC(0, sr_mul(X, I(p), sr_mul(X, g, sr_pow(X, A, p - 1))));
}
/* a inside [lo, hi] (inclusive): the value is a there. */
static sr_expr *inside(sr_ctx *ctx, sr_expr *a, sr_expr *lo, sr_expr *hi)
{
    return sr_mul(ctx, sr_greatereq(ctx, a, lo), sr_lesseq(ctx, a, hi));
}
static void gr_CLAMPINT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, inside(X, A, I(e->iattr[0]), I(e->iattr[1]))));
}
static void gr_CLAMP(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* The value is a where lo <= a <= hi, lo where a < lo <= hi, and hi elsewhere (a > hi, or
     * lo > hi): the three masks add up to 1. */
    sr_expr *ma = inside(X, A, B, C);
    sr_expr *ml = sr_mul(X, sr_less(X, A, B), sr_lesseq(X, B, C));
    ACC(0, sr_mul(X, g, ma));
    ACC(1, sr_mul(X, g, ml));
    ACC(2, sr_mul(X, g, sr_sub(X, sr_sub(X, I(1), ma), ml)));
}
static void gr_IFELSE(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(1, sr_ifelse(X, A, g, I(0)));
    ACC(2, sr_ifelse(X, A, I(0), g));
}
static void gr_MOD(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* a - m floor((a - o)/m): the floor is piecewise constant */
    ACC(0, g);
    ACC(1, sr_neg(X, sr_mul(X, g, sr_floor(X, sr_div(X, sr_sub(X, A, C), B)))));
}
static void gr_SQNORM2(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, I(2), sr_mul(X, g, A)));
}
static void gr_NORM2(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_normalize(X, A))); /* a/|a|, 0 at a = 0 */
}
static void gr_NORMALIZE(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* n = a r, r = Rsqrt(|a|^2): the adjoint is r (g - n (n|g)), 0 at a = 0 */
    sr_expr *r = sr_rsqrt(X, sr_sqnorm2(X, A));
    ACC(0, sr_mul(X, r, sr_sub(X, g, sr_mul(X, SELF, sr_scalprod(X, SELF, g)))));
}
static void gr_SQDIST(struct grad *G, const sr_expr *e, sr_expr *g)
{
    sr_expr *d = sr_mul(X, sr_mul(X, I(2), g), sr_sub(X, A, B));
    ACC(0, d);
    ACC(1, sr_neg(X, d));
}
static void gr_SCALPROD(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, B));
    ACC(1, sr_mul(X, g, A));
}
static void gr_SUM(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, g); }
/* Min and Max pass the gradient to the component they select (the first extreme one). */
static void gr_MAX(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_onehot(X, sr_argmax(X, A), A->dim)));
}
static void gr_MIN(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_onehot(X, sr_argmin(X, A), A->dim)));
}
static void gr_ELEM(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_mul(X, g, sr_onehot(X, I(e->iattr[0]), A->dim)));
}
static void gr_EXTRACT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    int s = (int)e->iattr[0], l = (int)e->iattr[1], rest = A->dim - s - l;
    if (!need(G, e, 0))
        return;
    sr_expr *t = g;
    if (s > 0)
        t = sr_concat(X, expr_zeros(X, s), t);
    if (rest > 0)
        t = sr_concat(X, t, expr_zeros(X, rest));
    acc(G, e, 0, t);
}
static void gr_CONCAT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_extract(X, g, 0, A->dim));
    ACC(1, sr_extract(X, g, A->dim, B->dim));
}
static void gr_MATVECMULT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* out = A v, A m x n: dA = g v^T (row-major), dv = g^T A */
    ACC(0, sr_tensorprod(X, g, B));
    ACC(1, sr_vecmatmult(X, g, A));
}
static void gr_VECMATMULT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* out = v^T A, A m x n: dv = A g, dA = v g^T */
    ACC(0, sr_matvecmult(X, B, g));
    ACC(1, sr_tensorprod(X, A, g));
}
static void gr_TENSORPROD(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* out[i db + j] = a_i b_j: g is a da x db matrix; da = g b, db = g^T a */
    ACC(0, sr_matvecmult(X, g, B));
    ACC(1, sr_vecmatmult(X, A, g));
}

/* WeightedSqNorm(w, d) with d = the point (or the difference of the two points): the
 * contributions to w and to d. */
static void wsq_parts(sr_ctx *ctx, sr_expr *w, sr_expr *d, sr_expr *g, bool want_w, bool want_d,
                      sr_expr **gw, sr_expr **gd)
{
    int dw = w->dim, n = d->dim;
    *gw = *gd = NULL;
    if (dw == n * n && n > 1) { /* d^T W d */
        if (want_w)
            *gw = sr_mul(ctx, g, sr_tensorprod(ctx, d, d));
        if (want_d)
            *gd = sr_mul(ctx, g, sr_add(ctx, sr_matvecmult(ctx, w, d), sr_vecmatmult(ctx, d, w)));
        return;
    }
    /* w scalar (w |d|^2) or diagonal (sum w_k d_k^2) */
    if (want_w)
        *gw = sr_mul(ctx, g, dw == 1 ? sr_sqnorm2(ctx, d) : sr_square(ctx, d));
    if (want_d)
        *gd = sr_mul(ctx, sr_mul(ctx, sr_intcst(ctx, 2), g), sr_mul(ctx, w, d));
}
static void gr_WEIGHTEDSQNORM(struct grad *G, const sr_expr *e, sr_expr *g)
{
    sr_expr *gw, *gd;
    wsq_parts(X, A, B, g, need(G, e, 0), need(G, e, 1), &gw, &gd);
    ACC(0, gw);
    ACC(1, gd);
}
static void gr_WEIGHTEDSQDIST(struct grad *G, const sr_expr *e, sr_expr *g)
{
    sr_expr *gw, *gd;
    wsq_parts(X, A, sr_sub(X, B, C), g, need(G, e, 0), need(G, e, 1) || need(G, e, 2), &gw, &gd);
    ACC(0, gw);
    ACC(1, gd);
    ACC(2, sr_neg(X, gd));
}

/* The adjoints of SumT, ElemT and ExtractT are Sum, Elem and Extract (and the other way
 * round: see gr_SUM, gr_ELEM, gr_EXTRACT). */
static void gr_SUMT(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_sum(X, g)); }
static void gr_ELEMT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_elem(X, g, (int)e->iattr[1]));
}
static void gr_EXTRACTT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_extract(X, g, (int)e->iattr[0], A->dim));
}

/* ---- complex ops: the transposed Jacobians of the real maps on the (re, im) pairs. For a
 * holomorphic op h the adjoint of a pair is conj(h') times the adjoint of the output (KeOps'
 * rules); a complex scalar broadcast over a vector receives the ComplexSum of its terms. */

/* Contribution c for child k of e: summed when the child is a broadcast complex scalar. */
static sr_expr *cfit(sr_ctx *ctx, const sr_expr *e, int k, sr_expr *c)
{
    return c && e->child[k]->dim == 2 && c->dim > 2 ? sr_complex_sum(ctx, c) : c;
}
#define CACC(k, expr) ACC(k, cfit(X, e, (k), (expr)))

static void gr_CADD(struct grad *G, const sr_expr *e, sr_expr *g)
{
    CACC(0, g);
    CACC(1, g);
}
static void gr_CSUB(struct grad *G, const sr_expr *e, sr_expr *g)
{
    CACC(0, g);
    CACC(1, sr_neg(X, g));
}
static void gr_CMULT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    CACC(0, sr_complex_mult(X, sr_conj(X, B), g));
    CACC(1, sr_complex_mult(X, sr_conj(X, A), g));
}
#define gr_CSCAL gr_CMULT
static void gr_CDIV(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* d(a/b) = da / b - (a/b) db / b */
    sr_expr *cb = sr_conj(X, B);
    CACC(0, sr_complex_div(X, g, cb));
    CACC(1, sr_neg(X, sr_complex_div(X, sr_complex_mult(X, sr_conj(X, SELF), g), cb)));
}
static void gr_CREALSCAL(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_scalprod(X, g, B));
    ACC(1, sr_mul(X, A, g));
}
static void gr_CONJ(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_conj(X, g)); }
static void gr_CEXP(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_complex_mult(X, sr_conj(X, SELF), g));
}
static void gr_CEXP1J(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* d(cos a + i sin a) = i e^{ia} da: the adjoint is Im(conj(e^{ia}) g) */
    ACC(0, sr_complex_imag(X, sr_complex_mult(X, sr_conj(X, SELF), g)));
}
static void gr_CREAL(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_real2complex(X, g));
}
static void gr_CIMAG(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_imag2complex(X, g));
}
static void gr_CSQUAREABS(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_complex_mult(X, sr_real2complex(X, sr_mul(X, I(2), g)), A));
}
static void gr_CABS(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* a / |a| written with Rsqrt, as KeOps' Sqrt(ComplexSquareAbs(a)): 0 at a = 0 */
    sr_expr *r = sr_rsqrt(X, sr_complex_squareabs(X, A));
    ACC(0, sr_complex_mult(X, sr_real2complex(X, sr_mul(X, g, r)), A));
}
static void gr_CANGLE(struct grad *G, const sr_expr *e, sr_expr *g)
{
    /* atan2(im, re): the gradient (-im, re) / |a|^2 of each pair is i a / |a|^2 */
    ACC(0, sr_complex_mult(X, sr_imag2complex(X, sr_div(X, g, sr_complex_squareabs(X, A))), A));
}
static void gr_REAL2C(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_complex_real(X, g));
}
static void gr_IMAG2C(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_complex_imag(X, g));
}
static void gr_CSUM(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, sr_complex_sumt(X, g, A->dim));
}
static void gr_CSUMT(struct grad *G, const sr_expr *e, sr_expr *g) { ACC(0, sr_complex_sum(X, g)); }
#undef CACC

/*
 * TensorDot is bilinear: the adjoint of a is the TensorDot of g (shaped as the output) with b
 * that contracts b's kept axes with the output axes they went to, and whose kept axes (g's
 * other axes, in increasing order, then b's contracted axes, in increasing order) are permuted
 * back to the a axes they stand for. Likewise for b with a. `first` selects the operand whose
 * adjoint is built: 0 for a, 1 for b.
 */
static sr_expr *tdot_adjoint(sr_ctx *ctx, const sr_expr *e, sr_expr *g, int first)
{
    const struct expr_tdot *t = expr_tdot_of(e);
    const int ra = t->key.ra, rb = t->key.rb, nc = t->key.nc;
    const int *ca = t->key.ca, *cb = t->key.cb;
    int keep[2][EXPR_TDOT_MAXRANK], nkeep[2] = {0, 0};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < (s ? rb : ra); k++) {
            bool contracted = false;
            for (int q = 0; q < nc; q++)
                contracted |= (s ? cb[q] : ca[q]) == k;
            if (!contracted)
                keep[s][nkeep[s]++] = k;
        }
    const int nout = t->nout, off[2] = {0, nkeep[0]};
    int odims[2 * EXPR_TDOT_MAXRANK], inv[2 * EXPR_TDOT_MAXRANK];
    for (int p = 0; p < nout; p++)
        odims[p] = (int)t->osize[p];
    for (int k = 0; k < nout; k++)
        inv[t->key.perm[k]] = k;
    if (nout > EXPR_TDOT_MAXRANK) {
        expr_builder_error(ctx, SR_ENOTSUP,
                           "Grad: the gradient of a TensorDot with %d output axes needs a tensor "
                           "of rank above %d",
                           nout, EXPR_TDOT_MAXRANK);
        return NULL;
    }
    const int self = first, other = 1 - first;
    const int *cself = self ? cb : ca, *cother = self ? ca : cb;
    /* Contract g's axes holding the other operand's kept axes with those axes. */
    int cg[EXPR_TDOT_MAXRANK], co[EXPR_TDOT_MAXRANK], perm[2 * EXPR_TDOT_MAXRANK];
    for (int j = 0; j < nkeep[other]; j++) {
        cg[j] = t->key.perm[off[other] + j];
        co[j] = keep[other][j];
    }
    /* The result's kept axes: g's positions of self's kept axes, increasing ... */
    int r = 0;
    for (int p = 0; p < nout; p++) {
        int k = inv[p];
        if (k >= off[self] && k < off[self] + nkeep[self])
            perm[r++] = keep[self][k - off[self]];
    }
    /* ... then the other operand's contracted axes, increasing, each standing for its partner. */
    for (int ax = 0; ax < (other ? rb : ra); ax++)
        for (int q = 0; q < nc; q++)
            if (cother[q] == ax)
                perm[r++] = cself[q];
    return sr_tensordot(ctx, g, e->child[other], nout, odims, other ? rb : ra,
                        other ? t->key.db : t->key.da, nkeep[other], cg, co, perm);
}
static void gr_TENSORDOT(struct grad *G, const sr_expr *e, sr_expr *g)
{
    ACC(0, tdot_adjoint(X, e, g, 0));
    ACC(1, tdot_adjoint(X, e, g, 1));
}

/* The derivative column of the op table: a missing rule is a compile error (gr_<id>
 * undeclared), and the assertion keeps the table as long as the op list. */
static const grad_rule grad_rules[] = {
#define GRAD_RULE_ENTRY_(id, ...) [OP_##id] = gr_##id,
    EXPR_OP_MAP(GRAD_RULE_ENTRY_)
#undef GRAD_RULE_ENTRY_
};
_Static_assert(sizeof grad_rules / sizeof *grad_rules == OP_COUNT, "every op needs a grad rule");

#undef X
#undef A
#undef B
#undef C
#undef SELF
#undef I
#undef R

/* ---- the walk -------------------------------------------------------------------------------- */

sr_expr *expr_grad(sr_ctx *ctx, const sr_expr *f, const sr_expr *var, sr_expr *gradin)
{
    if (!f || !var || !gradin)
        return NULL;
    size_t n = expr_toposort(f, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    struct grad G = {.ctx = ctx, .var = var, .nids = expr_ctx(ctx)->store.next_id};
    G.pos_of = calloc(G.nids ? G.nids : 1, sizeof *G.pos_of);
    G.dep = calloc(n ? n : 1, sizeof *G.dep);
    G.adj = calloc(n ? n : 1, sizeof *G.adj);
    sr_expr *res = NULL;
    if (!order || !G.pos_of || !G.dep || !G.adj || expr_toposort(f, order, n) != n) {
        expr_builder_error(ctx, SR_ENOMEM, "Grad: out of memory");
        goto done;
    }
    for (size_t p = 0; p < n; p++) {
        const sr_expr *e = order[p];
        if (e->op == OP_VAR && e != var && e->iattr[0] == var->iattr[0]) {
            static const char *const cats[] = {"Vi", "Vj", "Pm"};
            expr_builder_error(
                ctx, SR_EDIM,
                "Grad: the variable of index %lld is %s of dimension %d in the "
                "formula, but %s of dimension %d in the variable to differentiate by",
                (long long)e->iattr[0], cats[e->iattr[1]], e->dim, cats[var->iattr[1]], var->dim);
            goto done;
        }
        G.pos_of[e->id] = (uint32_t)(p + 1);
        G.dep[p] = e == var;
        for (int k = 0; k < expr_arity(e); k++)
            G.dep[p] = G.dep[p] || G.dep[G.pos_of[e->child[k]->id] - 1];
    }
    if (n == 0 || !G.dep[n - 1]) {
        res = expr_zeros(ctx, var->dim); /* V does not occur in F: a zero gradient, as KeOps */
        goto done;
    }
    G.adj[n - 1] = gradin;
    for (size_t p = n; p-- > 0 && !G.failed;) {
        const sr_expr *e = order[p];
        if (G.dep[p] && G.adj[p] && e != var)
            grad_rules[e->op](&G, e, G.adj[p]);
    }
    if (!G.failed) {
        res = G.adj[G.pos_of[var->id] - 1];
        if (!res)
            res = expr_zeros(ctx, var->dim); /* every path goes through a piecewise-constant op */
    }
done:
    free(order);
    free(G.pos_of);
    free(G.dep);
    free(G.adj);
    return res;
}

/* Checks shared by sr_grad and sr_diff: operands non-NULL (else NULL, no new error), of this
 * context, var a variable, and the other operand of dimension want. */
static bool grad_check(sr_ctx *ctx, const char *fn, sr_expr *f, sr_expr *var, sr_expr *other,
                       int want, const char *other_name, const char *want_name)
{
    if (!ctx || !f || !var || !other)
        return false;
    if (f->ctx != ctx || var->ctx != ctx || other->ctx != ctx) {
        expr_builder_error(ctx, SR_EINVAL, "%s: an operand belongs to another context", fn);
        return false;
    }
    if (var->op != OP_VAR) {
        expr_builder_error(ctx, SR_EINVAL,
                           "%s: the variable to differentiate by must be a variable (Vi, Vj, Pm "
                           "or Var), not %s",
                           fn, expr_ops[var->op].name);
        return false;
    }
    if (other->dim != want) {
        expr_builder_error(ctx, SR_EDIM,
                           "%s: the %s has dimension %d, but the %s has dimension %d; they must "
                           "be equal",
                           fn, other_name, other->dim, want_name, want);
        return false;
    }
    return true;
}

sr_expr *sr_grad(sr_ctx *ctx, sr_expr *f, sr_expr *var, sr_expr *gradin)
{
    if (!grad_check(ctx, "Grad", f, var, gradin, f ? f->dim : 0, "gradient input", "formula"))
        return NULL;
    return expr_grad(ctx, f, var, gradin);
}

sr_expr *sr_diff(sr_ctx *ctx, sr_expr *f, sr_expr *var, sr_expr *dir)
{
    if (!grad_check(ctx, "Diff", f, var, dir, var ? var->dim : 0, "direction", "variable"))
        return NULL;
    /* Diff(F, V, U) = Grad(Grad(F, V, E), E, U) for a fresh variable E of dimension dim(F):
     * Grad(F, V, E) = J^T E is linear in E, so its gradient with respect to E in the
     * direction U is J U, which no longer contains E. E takes the first index that F, V and U
     * leave free (KeOps does the same). */
    const sr_expr *roots[3] = {f, var, dir};
    struct expr_var *vars;
    int nvars;
    sr_status st = expr_collect_vars(ctx, roots, 3, &vars, &nvars);
    if (st != SR_OK) {
        expr_ctx(ctx)->err.pending = st; /* reported by sr_kernel_new(NULL), as a builder error */
        return NULL;
    }
    free(vars);
    sr_expr *e = sr_pm(ctx, nvars, f->dim);
    return expr_grad(ctx, expr_grad(ctx, f, var, e), e, dir);
}

/* GradMatrix and Divergence build one gradient of F per component: a formula grows with each,
 * so the count is bounded (a clear error, not minutes of building a formula no kernel could
 * compile). */
#define EXPR_MAX_EXPANDED 1024

static bool expansion_check(sr_ctx *ctx, const char *fn, int n)
{
    if (n <= EXPR_MAX_EXPANDED)
        return true;
    expr_builder_error(ctx, SR_EDIM,
                       "%s: the formula has dimension %d; %s builds one gradient per component, "
                       "at most %d",
                       fn, n, fn, EXPR_MAX_EXPANDED);
    return false;
}

/* The standard basis vector e_k of dimension d (KeOps' ElemT(1, d, k)). */
static sr_expr *basis(sr_ctx *ctx, int d, int k) { return sr_elemt(ctx, sr_intcst(ctx, 1), d, k); }

sr_expr *sr_gradmatrix(sr_ctx *ctx, sr_expr *f, sr_expr *var)
{
    if (!grad_check(ctx, "GradMatrix", f, var, f, f ? f->dim : 0, "formula", "formula") ||
        !expansion_check(ctx, "GradMatrix", f->dim))
        return NULL;
    /* Row k is the gradient of f_k: Grad(f, var, e_k), the rows concatenated (KeOps). */
    sr_expr *res = NULL;
    for (int k = 0; k < f->dim; k++) {
        sr_expr *row = expr_grad(ctx, f, var, basis(ctx, f->dim, k));
        res = res ? sr_concat(ctx, res, row) : row;
        if (!res)
            return NULL;
    }
    return res;
}

sr_expr *sr_divergence(sr_ctx *ctx, sr_expr *f, sr_expr *var)
{
    if (!grad_check(ctx, "Divergence", f, var, f, var ? var->dim : 0, "formula", "variable") ||
        !expansion_check(ctx, "Divergence", f->dim))
        return NULL;
    /* sum_k d f_k / d v_k = sum_k Elem(Grad(f, var, e_k), k) */
    sr_expr *res = NULL;
    for (int k = 0; k < f->dim; k++) {
        sr_expr *t = sr_elem(ctx, expr_grad(ctx, f, var, basis(ctx, f->dim, k)), k);
        res = res ? sr_add(ctx, res, t) : t;
        if (!res)
            return NULL;
    }
    return res;
}

sr_expr *sr_laplacian(sr_ctx *ctx, sr_expr *f, sr_expr *var)
{
    if (!grad_check(ctx, "Laplacian", f, var, f, 1, "formula", "scalar dimension"))
        return NULL;
    return sr_divergence(ctx, expr_grad(ctx, f, var, sr_intcst(ctx, 1)), var);
}
