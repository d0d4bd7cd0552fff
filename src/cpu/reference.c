/*
 * reference.c — the reference backend: a portable interpreter of the expression DAG.
 *
 * It is the oracle for every other backend, so it implements docs/semantics.md literally and
 * favours obviously-right code over speed: every node is evaluated in double precision into a
 * per-call scratch vector, in topological order, and outputs are rounded to the kernel's dtype
 * once, when they are written. Nodes that do not depend on the reduced index are evaluated once
 * per output row (and constant or parameter-only nodes once per call); that changes no value,
 * because evaluation is deterministic, and keeps big problems from being pathological.
 *
 * The kernel holds only immutable state after prepare(): run() allocates its own scratch, so a
 * kernel may run concurrently from many threads.
 */
#include "cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- evaluators -------------------------------------------------------------------------------
 * One function per op. out has dim(e) slots; in[c] points at the values of child c. */

typedef void (*evalfn)(const sr_expr *e, double *out, const double *const *in);

/* Operand c of an elementwise op at component k, broadcasting an operand of dimension 1. */
#define EW(c, k) in[c][e->child[c]->dim == 1 ? 0 : (k)]

#define EV_UNARY(id, expr)                                                                         \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim; k++) {                                                         \
            double a = in[0][k];                                                                   \
            out[k] = (expr);                                                                       \
        }                                                                                          \
    }

#define EV_BINARY(id, expr)                                                                        \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim; k++) {                                                         \
            double a = EW(0, k), b = EW(1, k);                                                     \
            out[k] = (expr);                                                                       \
        }                                                                                          \
    }

#define EV_TERNARY(id, expr)                                                                       \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim; k++) {                                                         \
            double a = EW(0, k), b = EW(1, k), c = EW(2, k);                                       \
            out[k] = (expr);                                                                       \
        }                                                                                          \
    }

/* Variables are not evaluated: the row loop copies them from the caller's arrays (load_var). */
static void ev_VAR(const sr_expr *e, double *out, const double *const *in) {}

static void ev_INTCST(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = (double)e->iattr[0];
}
static void ev_RATCST(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = (double)e->iattr[0] / (double)e->iattr[1];
}
static void ev_CST(const sr_expr *e, double *out, const double *const *in) { out[0] = e->fattr; }

EV_BINARY(ADD, a + b)
EV_BINARY(SUB, a - b)
EV_BINARY(MUL, a *b)
EV_BINARY(DIV, a / b)
EV_UNARY(MINUS, -a)
EV_BINARY(POWF, pow(a, b))
EV_BINARY(ATAN2, atan2(a, b))
EV_BINARY(LESS, a < b ? 1.0 : 0.0)
EV_BINARY(LESSEQ, a <= b ? 1.0 : 0.0)
EV_BINARY(GREATER, a > b ? 1.0 : 0.0)
EV_BINARY(GREATEREQ, a >= b ? 1.0 : 0.0)
EV_BINARY(EQUAL, a == b ? 1.0 : 0.0)
EV_BINARY(NOTEQUAL, a != b ? 1.0 : 0.0)
EV_UNARY(INV, 1.0 / a)
EV_UNARY(SQUARE, a *a)
EV_UNARY(SQRT, sqrt(a))
EV_UNARY(RSQRT, a == 0.0 ? 0.0 : 1.0 / sqrt(a)) /* KeOps: 0 at 0, so Normalize(0) = 0 */
EV_UNARY(EXP, exp(a))
EV_UNARY(LOG, log(a))
EV_UNARY(XLOGX, a == 0.0 ? 0.0 : a * log(a))
EV_UNARY(SIN, sin(a))
EV_UNARY(COS, cos(a))
EV_UNARY(ASIN, asin(a))
EV_UNARY(ACOS, acos(a))
EV_UNARY(ATAN, atan(a))
EV_UNARY(ABS, fabs(a))
EV_UNARY(SIGN, a > 0.0 ? 1.0 : a < 0.0 ? -1.0 : a == 0.0 ? 0.0 : a) /* NaN stays NaN */
EV_UNARY(STEP, isnan(a) ? a : a >= 0.0 ? 1.0 : 0.0)
EV_UNARY(RELU, isnan(a) ? a : a > 0.0 ? a : 0.0)
EV_UNARY(FLOOR, floor(a))
EV_UNARY(SINXDIVX, a == 0.0 ? 1.0 : sin(a) / a)

/* Integer power by repeated multiplication, as docs/semantics.md says; a^0 = 1 even for NaN. */
static double ipow(double a, int64_t n)
{
    int64_t m = n < 0 ? -n : n;
    double r = 1.0;
    if (m > 0) {
        r = a;
        for (int64_t t = 1; t < m; t++)
            r *= a;
    }
    return n < 0 ? 1.0 / r : r;
}

static void ev_POW(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = ipow(in[0][k], e->iattr[0]);
}

static void ev_ROUND(const sr_expr *e, double *out, const double *const *in)
{
    double p = pow(10.0, (double)e->iattr[0]);
    for (int k = 0; k < e->dim; k++)
        out[k] = round(in[0][k] * p) / p;
}

/* min(max(a, lo), hi) with NaN propagating from any operand (not fmin/fmax, which drop it). */
static double clamp(double a, double lo, double hi)
{
    if (isnan(a) || isnan(lo) || isnan(hi))
        return a + lo + hi;
    double r = a < lo ? lo : a;
    return r > hi ? hi : r;
}

static void ev_CLAMPINT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = clamp(in[0][k], (double)e->iattr[0], (double)e->iattr[1]);
}
/* 1 on [lo, hi], 0 outside; a NaN is in no comparison's way: 1, as KeOps. */
static void ev_DIFFCLAMPINT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = in[0][k] < (double)e->iattr[0] || in[0][k] > (double)e->iattr[1] ? 0.0 : 1.0;
}

EV_TERNARY(CLAMP, clamp(a, b, c))
EV_TERNARY(IFELSE, a >= 0.0 ? b : c)            /* a NaN condition compares false: selects c */
EV_TERNARY(MOD, fma(-b, floor((a - c) / b), a)) /* one rounding: docs/semantics.md */

static double sqnorm(const double *a, int d)
{
    double s = 0.0;
    for (int k = 0; k < d; k++)
        s += a[k] * a[k];
    return s;
}

static void ev_SQNORM2(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = sqnorm(in[0], e->child[0]->dim);
}
static void ev_NORM2(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = sqrt(sqnorm(in[0], e->child[0]->dim));
}
static void ev_NORMALIZE(const sr_expr *e, double *out, const double *const *in)
{
    double s = sqnorm(in[0], e->dim);
    double r = s == 0.0 ? 0.0 : 1.0 / sqrt(s); /* Rsqrt, so the zero vector stays 0 */
    for (int k = 0; k < e->dim; k++)
        out[k] = in[0][k] * r;
}
static void ev_SQDIST(const sr_expr *e, double *out, const double *const *in)
{
    double s = 0.0;
    for (int k = 0; k < e->child[0]->dim; k++) {
        double d = in[0][k] - in[1][k];
        s += d * d;
    }
    out[0] = s;
}
static void ev_SCALPROD(const sr_expr *e, double *out, const double *const *in)
{
    double s = 0.0;
    for (int k = 0; k < e->child[0]->dim; k++)
        s += in[0][k] * in[1][k];
    out[0] = s;
}
static void ev_SUM(const sr_expr *e, double *out, const double *const *in)
{
    double s = 0.0;
    for (int k = 0; k < e->child[0]->dim; k++)
        s += in[0][k];
    out[0] = s;
}

/* The index of the first extreme component, or of the first NaN (NumPy argmin / argmax). */
static int vec_argext(const double *a, int d, enum sr_red_order order)
{
    int best = 0;
    for (int k = 1; k < d; k++)
        if (cpu_ext_before(order, a[k], k, a[best], best))
            best = k;
    return best;
}

static void ev_MAX(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = in[0][vec_argext(in[0], e->child[0]->dim, SR_RED_DESC)];
}
static void ev_MIN(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = in[0][vec_argext(in[0], e->child[0]->dim, SR_RED_ASC)];
}
static void ev_ARGMAX(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = (double)vec_argext(in[0], e->child[0]->dim, SR_RED_DESC);
}
static void ev_ARGMIN(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = (double)vec_argext(in[0], e->child[0]->dim, SR_RED_ASC);
}

static void ev_ELEM(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = in[0][e->iattr[0]];
}
static void ev_EXTRACT(const sr_expr *e, double *out, const double *const *in)
{
    memcpy(out, in[0] + e->iattr[0], (size_t)e->dim * sizeof *out);
}
static void ev_CONCAT(const sr_expr *e, double *out, const double *const *in)
{
    int da = e->child[0]->dim;
    memcpy(out, in[0], (size_t)da * sizeof *out);
    memcpy(out + da, in[1], (size_t)e->child[1]->dim * sizeof *out);
}
static void ev_ONEHOT(const sr_expr *e, double *out, const double *const *in)
{
    double r = round(in[0][0]); /* NaN fails both comparisons below */
    for (int k = 0; k < e->dim; k++)
        out[k] = 0.0;
    if (r >= 0.0 && r < (double)e->dim)
        out[(int)r] = 1.0;
}
static void ev_MATVECMULT(const sr_expr *e, double *out, const double *const *in)
{
    int n = e->child[1]->dim, m = e->dim;
    for (int r = 0; r < m; r++) {
        double s = 0.0;
        for (int c = 0; c < n; c++)
            s += in[0][(size_t)r * n + c] * in[1][c];
        out[r] = s;
    }
}
static void ev_VECMATMULT(const sr_expr *e, double *out, const double *const *in)
{
    int m = e->child[0]->dim, n = e->dim;
    for (int c = 0; c < n; c++) {
        double s = 0.0;
        for (int r = 0; r < m; r++)
            s += in[0][r] * in[1][(size_t)r * n + c];
        out[c] = s;
    }
}
static void ev_TENSORPROD(const sr_expr *e, double *out, const double *const *in)
{
    int da = e->child[0]->dim, db = e->child[1]->dim;
    for (int i = 0; i < da; i++)
        for (int j = 0; j < db; j++)
            out[(size_t)i * db + j] = in[0][i] * in[1][j];
}

/* WeightedSqNorm(w, a - b) with b NULL meaning 0: w of dimension 1, D or D*D. */
static double wsqnorm(const double *w, int dw, const double *a, const double *b, int d)
{
#define DIFF(k) (b ? a[k] - b[k] : a[k])
    double s = 0.0;
    if (dw == 1) {
        for (int k = 0; k < d; k++)
            s += DIFF(k) * DIFF(k);
        return w[0] * s;
    }
    if (dw == d) {
        for (int k = 0; k < d; k++)
            s += w[k] * DIFF(k) * DIFF(k);
        return s;
    }
    for (int r = 0; r < d; r++) {
        double t = 0.0;
        for (int c = 0; c < d; c++)
            t += w[(size_t)r * d + c] * DIFF(c);
        s += DIFF(r) * t;
    }
    return s;
#undef DIFF
}

static void ev_WEIGHTEDSQNORM(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = wsqnorm(in[0], e->child[0]->dim, in[1], NULL, e->child[1]->dim);
}
static void ev_WEIGHTEDSQDIST(const sr_expr *e, double *out, const double *const *in)
{
    out[0] = wsqnorm(in[0], e->child[0]->dim, in[1], in[2], e->child[1]->dim);
}

static void ev_SUMT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = in[0][0];
}
static void ev_ELEMT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = 0.0;
    out[e->iattr[1]] = in[0][0];
}
static void ev_EXTRACTT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = 0.0;
    memcpy(out + e->iattr[0], in[0], (size_t)e->child[0]->dim * sizeof *out);
}
/* Each output component sums its terms in increasing order of the contracted index. */
static void ev_TENSORDOT(const sr_expr *e, double *out, const double *const *in)
{
    const struct expr_tdot *t = expr_tdot_of(e);
    for (int64_t o = 0; o < e->dim; o++) {
        double s = 0.0;
        for (int64_t c = 0; c < t->ncont; c++) {
            int64_t ia, ib;
            expr_tdot_index(t, o, c, &ia, &ib);
            s += in[0][ia] * in[1][ib];
        }
        out[o] = s;
    }
}

/* ---- complex ops: pairs (re, im) of interleaved reals. CW(c, k) is the real part of pair k of
 * operand c, a broadcast complex scalar (dimension 2) giving its one pair; CW(c, k)[1] is the
 * imaginary part. */
#define CW(c, k) (in[c] + (e->child[c]->dim == 2 ? 0 : 2 * (k)))

#define EV_CBINARY(id, re, im)                                                                     \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim / 2; k++) {                                                     \
            const double *a = CW(0, k), *b = CW(1, k);                                             \
            out[2 * k] = (re);                                                                     \
            out[2 * k + 1] = (im);                                                                 \
        }                                                                                          \
    }
/* Pair k of a complex output from component k of a real operand. */
#define EV_TOCOMPLEX(id, re, im)                                                                   \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim / 2; k++) {                                                     \
            double x = in[0][k];                                                                   \
            out[2 * k] = (re);                                                                     \
            out[2 * k + 1] = (im);                                                                 \
        }                                                                                          \
    }
/* Component k of a real output from pair k of a complex operand. */
#define EV_FROMCOMPLEX(id, expr)                                                                   \
    static void ev_##id(const sr_expr *e, double *out, const double *const *in)                    \
    {                                                                                              \
        for (int k = 0; k < e->dim; k++) {                                                         \
            double re = in[0][2 * k], im = in[0][2 * k + 1];                                       \
            (void)re;                                                                              \
            (void)im;                                                                              \
            out[k] = (expr);                                                                       \
        }                                                                                          \
    }

EV_CBINARY(CADD, a[0] + b[0], a[1] + b[1])
EV_CBINARY(CSUB, a[0] - b[0], a[1] - b[1])
EV_CBINARY(CMULT, a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0])
#define ev_CSCAL ev_CMULT /* the complex scalar is operand 0, broadcast */
/* a conj(b) / |b|^2 (KeOps' ComplexDivide) */
EV_CBINARY(CDIV, (a[0] * b[0] + a[1] * b[1]) * (1.0 / (b[0] * b[0] + b[1] * b[1])),
           (a[1] * b[0] - a[0] * b[1]) * (1.0 / (b[0] * b[0] + b[1] * b[1])))
static void ev_CREALSCAL(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = in[0][0] * in[1][k];
}
static void ev_CONJ(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = k % 2 ? -in[0][k] : in[0][k];
}
static void ev_CEXP(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k += 2) {
        double r = exp(in[0][k]);
        out[k] = r * cos(in[0][k + 1]);
        out[k + 1] = r * sin(in[0][k + 1]);
    }
}
EV_TOCOMPLEX(CEXP1J, cos(x), sin(x))
EV_TOCOMPLEX(REAL2C, x, 0.0)
EV_TOCOMPLEX(IMAG2C, 0.0, x)
EV_FROMCOMPLEX(CREAL, re)
EV_FROMCOMPLEX(CIMAG, im)
EV_FROMCOMPLEX(CABS, sqrt(re *re + im * im))
EV_FROMCOMPLEX(CSQUAREABS, re *re + im * im)
EV_FROMCOMPLEX(CANGLE, atan2(im, re))
static void ev_CSUM(const sr_expr *e, double *out, const double *const *in)
{
    double re = 0.0, im = 0.0;
    for (int k = 0; k < e->child[0]->dim; k += 2) {
        re += in[0][k];
        im += in[0][k + 1];
    }
    out[0] = re;
    out[1] = im;
}
static void ev_CSUMT(const sr_expr *e, double *out, const double *const *in)
{
    for (int k = 0; k < e->dim; k++)
        out[k] = in[0][k % 2];
}

/* A missing evaluator is a compile error (undeclared ev_<id>), never an empty slot. */
static const evalfn evaluators[OP_COUNT] = {
#define REF_EVAL_ENTRY_(id, ...) [OP_##id] = ev_##id,
    EXPR_OP_MAP(REF_EVAL_ENTRY_)
#undef REF_EVAL_ENTRY_
};

void cpu_ref_eval(const sr_expr *e, double *out, const double *const *in)
{
    evaluators[e->op](e, out, in);
}

/* ---- the program ------------------------------------------------------------------------------
 * The DAG of F and of the weight formula, merged and in topological order, split in three
 * stages by what a node depends on: 0 = constants and parameters (once per call), 1 = the
 * output row's variables (once per output row), 2 = the reduced index (once per pair). */

enum { STAGE_CONST, STAGE_OUTER, STAGE_PAIR, NSTAGES };

struct ref_node {
    const sr_expr *e;
    size_t off;      /* first scratch slot */
    size_t child[3]; /* scratch offsets of the children */
};

struct ref_prog {
    size_t nnodes;
    struct ref_node *node;  /* topological order */
    size_t *stage[NSTAGES]; /* node numbers of each stage, in topological order */
    size_t nstage[NSTAGES];
    size_t nslots;       /* scratch doubles */
    size_t f_off, w_off; /* where F and the weight formula end up */
};

static void prog_free(struct ref_prog *p)
{
    if (!p)
        return;
    free(p->node);
    for (int s = 0; s < NSTAGES; s++)
        free(p->stage[s]);
    free(p);
}

/* Appends the topological order of root to *list, skipping nodes already there. */
static sr_status topo_append(sr_ctx *ctx, const sr_expr *root, const sr_expr ***list, size_t *n)
{
    size_t cnt = expr_toposort(root, NULL, 0);
    const sr_expr **order = malloc((cnt ? cnt : 1) * sizeof *order);
    if (!order || expr_toposort(root, order, cnt) != cnt || cnt == 0 || order[cnt - 1] != root) {
        free(order);
        return sr__error(ctx, SR_ENOMEM, "reference backend: out of memory sorting the formula");
    }
    const sr_expr **grown = realloc(*list, (*n + cnt) * sizeof *grown);
    if (!grown) {
        free(order);
        return sr__error(ctx, SR_ENOMEM, "reference backend: out of memory");
    }
    *list = grown;
    size_t base = *n;
    for (size_t t = 0; t < cnt; t++) {
        bool seen = false;
        /* Only the weight formula is appended after F; a linear scan at prepare time is fine
         * for formulas of any realistic size. */
        for (size_t u = 0; u < base && !seen; u++)
            seen = grown[u] == order[t];
        if (!seen)
            grown[(*n)++] = order[t];
    }
    free(order);
    return SR_OK;
}

static int stage_of(const sr_expr *e, int axis)
{
    int reduced = axis == 1 ? DEP_J : DEP_I, outer = axis == 1 ? DEP_I : DEP_J;
    if (e->deps & reduced)
        return STAGE_PAIR;
    return e->deps & outer ? STAGE_OUTER : STAGE_CONST;
}

/* The position in the program of each node, indexed by node id (ids are dense per context), so
 * that placing n nodes takes O(n + largest id), not a search per child. */
struct node_pos {
    size_t *at; /* [nid]: SIZE_MAX where not placed */
    uint32_t nid;
};

static bool node_pos_init(struct node_pos *np, const sr_expr *const *list, size_t n)
{
    np->nid = 0;
    for (size_t t = 0; t < n; t++)
        if (list[t]->id + 1 > np->nid)
            np->nid = list[t]->id + 1;
    np->at = malloc((np->nid ? np->nid : 1) * sizeof *np->at);
    for (uint32_t i = 0; np->at && i < np->nid; i++)
        np->at[i] = SIZE_MAX;
    return np->at != NULL;
}

static size_t find_node(const struct node_pos *np, const sr_expr *e)
{
    return e->id < np->nid ? np->at[e->id] : SIZE_MAX;
}

static sr_status ref_prepare(struct sr_kernel *k, const struct sr_plan *plan, struct sr_realise *r)
{
    (void)plan; /* one way, no candidates */
    (void)r;
    sr_ctx *ctx = k->ctx;
    /* The oracle interprets the formulas as the user wrote them, not the simplifier's output,
     * so that differential tests against it check the simplifier too. */
    const sr_expr *f = k->simp.f_user ? k->simp.f_user : k->f;
    const sr_expr *w = k->simp.f_user ? k->simp.weight_user : k->weight;
    const sr_expr **list = NULL;
    size_t n = 0;
    sr_status st = topo_append(ctx, f, &list, &n);
    if (st == SR_OK && w)
        st = topo_append(ctx, w, &list, &n);
    if (st != SR_OK) {
        free(list);
        return st;
    }
    struct ref_prog *p = calloc(1, sizeof *p);
    struct node_pos np = {NULL, 0};
    if (p)
        p->node = calloc(n, sizeof *p->node);
    for (int s = 0; p && s < NSTAGES; s++)
        p->stage[s] = malloc(n * sizeof *p->stage[s]);
    if (!p || !p->node || !p->stage[0] || !p->stage[1] || !p->stage[2] ||
        !node_pos_init(&np, list, n)) {
        free(list);
        free(np.at);
        prog_free(p);
        return sr__error(ctx, SR_ENOMEM, "reference backend: out of memory");
    }
    for (size_t t = 0; t < n; t++) {
        const sr_expr *e = list[t];
        struct ref_node *nd = &p->node[t];
        nd->e = e;
        nd->off = p->nslots;
        for (int c = 0; c < expr_arity(e); c++) {
            size_t ci = find_node(&np, e->child[c]);
            if (ci == SIZE_MAX) {
                free(list);
                free(np.at);
                prog_free(p);
                return sr__error(ctx, SR_EINTERNAL, "reference backend: child missing in order");
            }
            nd->child[c] = p->node[ci].off;
        }
        p->nnodes = t + 1;
        np.at[e->id] = t;
        p->nslots += (size_t)e->dim;
        int s = stage_of(e, k->axis);
        p->stage[s][p->nstage[s]++] = t;
    }
    free(list);
    p->f_off = p->node[find_node(&np, f)].off;
    p->w_off = w ? p->node[find_node(&np, w)].off : 0;
    free(np.at);
    k->backend_data = p;
    return SR_OK;
}

static void ref_release(struct sr_kernel *k)
{
    prog_free(k->backend_data);
    k->backend_data = NULL;
}

static void ref_explain(const struct sr_kernel *k, struct expr_buf *b)
{
    const struct ref_prog *p = k->backend_data;
    expr_buf_printf(b,
                    "reference interpreter: %zu nodes (%zu constant, %zu per output row, %zu per "
                    "pair) of the formula as given (not the simplified one), %zu scratch doubles, "
                    "evaluated in float64\n",
                    p->nnodes, p->nstage[STAGE_CONST], p->nstage[STAGE_OUTER],
                    p->nstage[STAGE_PAIR], p->nslots);
}

/* ---- reductions ---------------------------------------------------------------------------
 * Per output row: init, push the value of F (and of the weight) for each reduced index in
 * increasing order, finish into a row of doubles and indices that run() rounds and stores: the
 * family's operations of cpu_red_ops (red-ops.c). */

/* ---- run ---------------------------------------------------------------------------------- */

struct ref_call {
    const struct sr_kernel *k;
    const struct ref_prog *p;
    const sr_run_desc *run;
    double *scratch;
};

/* Copies row `row` of variable e (converted to double) into its scratch slots. */
static void load_var(const struct ref_call *c, const sr_expr *e, double *dst, int64_t i, int64_t j)
{
    sr_cat cat = (sr_cat)e->iattr[1];
    int64_t row = cat == SR_CAT_I ? i : cat == SR_CAT_J ? j : 0;
    size_t d = (size_t)e->dim, base = (size_t)row * d;
    const void *src = c->run->args[e->iattr[0]];
    if (c->k->dtype == SR_F64)
        memcpy(dst, (const double *)src + base, d * sizeof *dst);
    else
        for (size_t t = 0; t < d; t++)
            dst[t] = (double)((const float *)src)[base + t];
}

static void eval_stage(const struct ref_call *c, int stage, int64_t i, int64_t j)
{
    const struct ref_prog *p = c->p;
    for (size_t t = 0; t < p->nstage[stage]; t++) {
        const struct ref_node *nd = &p->node[p->stage[stage][t]];
        double *out = c->scratch + nd->off;
        if (nd->e->op == OP_VAR) {
            load_var(c, nd->e, out, i, j);
            continue;
        }
        const double *in[3] = {c->scratch + nd->child[0], c->scratch + nd->child[1],
                               c->scratch + nd->child[2]};
        evaluators[nd->e->op](nd->e, out, in);
    }
}

/* Reduces output rows [o0, o1) over the reduced intervals iv[0 .. 2 niv) (plan p, NULL for
 * the dense reduction: all rows over [0, nred)). */
static sr_status ref_reduce(const struct sr_kernel *k, const sr_run_desc *run,
                            const struct sr_rplan *rp)
{
    const struct ref_prog *p = k->backend_data;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    const struct cpu_red_ops *ops = &cpu_red_ops[ri->family];
    const struct cpu_red_dims dims = cpu_red_dims_of(k);
    int64_t nout = k->axis == 1 ? run->nx : run->ny;
    int64_t nred = k->axis == 1 ? run->ny : run->nx;
    size_t odim = (size_t)k->out_dim;

    /* Everything of one call in one allocation: scratch, reduction state, one output row. */
    size_t nsd = (size_t)cpu_red_count(ops->nd, &dims), nsi = (size_t)cpu_red_count(ops->ni, &dims);
    size_t nd = p->nslots + nsd + odim, ni = nsi + odim, nn = (size_t)cpu_red_count(ops->nc, &dims);
    double *dbl = malloc(nd * sizeof *dbl);
    int64_t *idx = malloc(ni * sizeof *idx);
    int *cnt = malloc((nn ? nn : 1) * sizeof *cnt);
    if (!dbl || !idx || !cnt) {
        free(dbl);
        free(idx);
        free(cnt);
        return sr__error(k->ctx, SR_ENOMEM,
                         "reference backend: out of memory for the %zu-value working set", nd);
    }
    struct ref_call call = {k, p, run, dbl};
    const struct cpu_red_row rs = {dbl + p->nslots, idx, cnt};
    double *row = rs.d + nsd;
    int64_t *row_idx = idx + nsi;

    eval_stage(&call, STAGE_CONST, 0, 0);
    const int64_t dense[2] = {0, nred};
    int64_t nblocks = rp ? rp->nblocks : 1;
    for (int64_t c = 0; c < nblocks; c++) {
        int64_t o0 = rp ? rp->blk[2 * c] : 0, o1 = rp ? rp->blk[2 * c + 1] : nout;
        const int64_t *iv = rp ? rp->iv + 2 * rp->ivoff[c] : dense;
        int64_t niv = rp ? rp->ivoff[c + 1] - rp->ivoff[c] : 1;
        for (int64_t o = o0; o < o1; o++) {
            int64_t i = k->axis == 1 ? o : 0, j = k->axis == 1 ? 0 : o;
            eval_stage(&call, STAGE_OUTER, i, j);
            ops->init(&dims, rs);
            for (int64_t q = 0; q < niv; q++)
                for (int64_t r = iv[2 * q]; r < iv[2 * q + 1]; r++) {
                    if (k->axis == 1)
                        j = r;
                    else
                        i = r;
                    eval_stage(&call, STAGE_PAIR, i, j);
                    ops->push(&dims, rs, dbl + p->f_off, k->weight ? dbl + p->w_off : NULL, r);
                }
            ops->finish(&dims, rs, row, row_idx);
            size_t base = (size_t)o * odim;
            if (ri->values) {
                if (k->dtype == SR_F64)
                    memcpy((double *)run->out + base, row, odim * sizeof *row);
                else
                    for (size_t t = 0; t < odim; t++)
                        ((float *)run->out)[base + t] = (float)row[t];
            }
            if (ri->indices)
                memcpy(run->out_idx + base, row_idx, odim * sizeof *row_idx);
        }
    }
    free(dbl);
    free(idx);
    free(cnt);
    return SR_OK;
}

static sr_status ref_run(const struct sr_kernel *k, const sr_run_desc *run)
{
    return ref_reduce(k, run, NULL);
}

const struct sr_backend_i cpu_reference_backend = {
    /* .name = */ "reference",
    /* .prepare = */ ref_prepare,
    /* .run = */ ref_run,
    /* .release = */ ref_release,
    /* .explain = */ ref_explain,
    /* .run_ranges = */ ref_reduce,
    /* .workspace = */ NULL, /* core's sr__reference_workspace */
    /* .run_device = */ NULL,
    /* .ctx_free = */ NULL,
    /* .post_rewrite = */ false,
    /* .vjp = */ NULL,
    /* .run_lse = */ NULL,
    /* .offer = */ NULL,
    /* .stage = */ NULL,
    /* .wait = */ NULL,
    /* .plan_info = */ NULL, /* core's default: the reference interpreter's plan */
    /* .plans = */ NULL,
};
