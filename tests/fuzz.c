/*
 * fuzz.c — the differential fuzzer's generator, runner, comparator and shrinker (fuzz.h,
 * docs/fuzzing.md).
 *
 * Formulas are built with expr_make straight from the op table: an op whose row says how its
 * dimension follows from its operands (DIM_SAME, DIM_EW, DIM_TO1, DIM_PAIR1) and that has no
 * integer attributes is generated with no further help, so ops added to EXPR_OP_MAP later are
 * fuzzed as soon as they exist. The others need an entry in op_gens (their operand shapes and
 * attributes) or a line in FZ_EXCLUDED_OPS saying why they are left out.
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "jit/cuda.h"
#include "cpu/cpu.h"
#include "jit/jit.h"
#include "util.h"

const char *const fz_variant_names[FZ_NVARIANTS] = {
#define FZ_VARIANT_NAME_(id, name) name,
    FZ_VARIANT_MAP(FZ_VARIANT_NAME_)
#undef FZ_VARIANT_NAME_
};

/* Ops the fuzzer deliberately does not generate: X(op, reason). Empty today: every op of the
 * table is generated. An op added to EXPR_OP_MAP that needs operand shapes or attributes the
 * table does not give must get an op_gens entry or a line here (test-fuzz-regress checks). */
#define FZ_EXCLUDED_OPS(X)

/* ---- the generator ---------------------------------------------------------------------- */

#define FZ_MAX_VARS 12

struct gen {
    sr_ctx *ctx;
    uint64_t s;
    int nvars;
    int vdim[FZ_MAX_VARS];
    sr_cat vcat[FZ_MAX_VARS];
    int budget;   /* nodes left */
    sr_expr *ip;  /* the gemm shape's inner product (x_i | y_j), or NULL */
    bool ip_used; /* ip appears in the formula */
    /* Nodes made so far, reused now and then: x - x, Exp(a) * Exp(a), shared subexpressions,
     * which random formulas would almost never contain, are what the simplifier rewrites. */
    sr_expr *pool[64];
    int npool;
};

static uint64_t rnd(struct gen *g, uint64_t n) { return n ? tu_rand(&g->s) % n : 0; }
static bool chance(struct gen *g, double p) { return tu_uniform(&g->s, 0.0, 1.0) < p; }

/* Dimensions for operands whose dimension is free: mostly small, sometimes past the JIT's
 * unrolling limit (16). */
static int free_dim(struct gen *g)
{
    static const int dims[] = {1, 1, 2, 2, 3, 3, 4, 5, 7, 8, 16, 17};
    return dims[rnd(g, sizeof dims / sizeof *dims)];
}

static sr_expr *gen_expr(struct gen *g, int d, int depth);

static sr_expr *mk(struct gen *g, int op, sr_expr *a, sr_expr *b, sr_expr *c, int64_t at0,
                   int64_t at1)
{
    sr_expr *kids[3] = {a, b, c};
    int64_t at[2] = {at0, at1};
    g->budget--;
    return expr_make(g->ctx, (enum expr_op)op, kids, at, 0, 0.0);
}

static sr_expr *gen_const(struct gen *g)
{
    static const double csts[] = {0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -2.5, 0.1, 1e-3, 1e3, 7.0, 0.75};
    switch (rnd(g, 4)) {
    case 0:
        return sr_intcst(g->ctx, (int64_t)rnd(g, 9) - 3);
    case 1:
        return sr_ratcst(g->ctx, (int64_t)rnd(g, 7) - 3, 1 + (int64_t)rnd(g, 5));
    default:
        return sr_const(g->ctx, csts[rnd(g, sizeof csts / sizeof *csts)]);
    }
}

/* A variable of dimension d: an existing one of that dimension, or a new one. */
static sr_expr *gen_var(struct gen *g, int d)
{
    int pick = -1, seen = 0;
    for (int v = 0; v < g->nvars; v++)
        if (g->vdim[v] == d && rnd(g, (uint64_t)++seen) == 0)
            pick = v;
    if ((pick < 0 || chance(g, 0.3)) && g->nvars < FZ_MAX_VARS) {
        pick = g->nvars++;
        g->vdim[pick] = d;
        g->vcat[pick] = (sr_cat)(chance(g, 0.15) ? SR_CAT_PARAM : rnd(g, 2));
    }
    if (pick < 0)
        return sr_const(g->ctx, 1.5);
    return sr_var(g->ctx, pick, d, g->vcat[pick]);
}

static sr_expr *gen_leaf(struct gen *g, int d)
{
    if (g->ip && d == 1 && chance(g, 0.5)) {
        g->ip_used = true;
        return g->ip;
    }
    if (d == 1 && chance(g, 0.3))
        return gen_const(g);
    return gen_var(g, d);
}

/* Operand domains: where an op is defined on part of the line only, its operand is, half the
 * time, wrapped so that it lands there (the other half exercises the NaN side). */
enum dom { DOM_ANY, DOM_POS, DOM_UNIT };

static sr_expr *gen_arg(struct gen *g, int d, int depth, enum dom dom)
{
    sr_expr *e = gen_expr(g, d, depth);
    if (dom == DOM_POS && chance(g, 0.5))
        return mk(g, OP_ABS, e, NULL, NULL, 0, 0);
    if (dom == DOM_UNIT && chance(g, 0.5))
        return mk(g, OP_SIN, e, NULL, NULL, 0, 0);
    return e;
}

/* ---- the op generator table: ops that the op table alone cannot generate, and domains ---- */

struct op_gen {
    bool (*can)(int d);                                        /* NULL: by the dimension rule */
    sr_expr *(*make)(struct gen *g, int op, int d, int depth); /* NULL: generic */
    enum dom dom;                                              /* of the first operand */
};

static bool only1(int d) { return d == 1; }
static bool at_least2(int d) { return d >= 2; }

static sr_expr *make_pow(struct gen *g, int op, int d, int depth)
{
    static const int ex[] = {-3, -2, -1, 0, 1, 2, 3, 4, 5, 17, -19};
    return mk(g, op, gen_expr(g, d, depth), NULL, NULL, ex[rnd(g, 11)], 0);
}
static sr_expr *make_round(struct gen *g, int op, int d, int depth)
{
    return mk(g, op, gen_expr(g, d, depth), NULL, NULL, (int64_t)rnd(g, 5) - 1, 0);
}
static sr_expr *make_clampint(struct gen *g, int op, int d, int depth)
{
    int64_t lo = (int64_t)rnd(g, 4) - 2;
    return mk(g, op, gen_expr(g, d, depth), NULL, NULL, lo, lo + (int64_t)rnd(g, 4));
}
static sr_expr *make_elem(struct gen *g, int op, int d, int depth)
{
    int D = free_dim(g);
    return mk(g, op, gen_expr(g, D, depth), NULL, NULL, (int64_t)rnd(g, (uint64_t)D), 0);
}
static sr_expr *make_extract(struct gen *g, int op, int d, int depth)
{
    int D = d + (int)rnd(g, 4);
    return mk(g, op, gen_expr(g, D, depth), NULL, NULL, (int64_t)rnd(g, (uint64_t)(D - d + 1)), d);
}
static sr_expr *make_concat(struct gen *g, int op, int d, int depth)
{
    int a = 1 + (int)rnd(g, (uint64_t)(d - 1));
    return mk(g, op, gen_expr(g, a, depth), gen_expr(g, d - a, depth), NULL, 0, 0);
}
static sr_expr *make_onehot(struct gen *g, int op, int d, int depth)
{
    return mk(g, op, gen_expr(g, 1, depth), NULL, NULL, d, 0);
}
static sr_expr *make_matvec(struct gen *g, int op, int d, int depth)
{
    int n = 1 + (int)rnd(g, 4);
    return mk(g, op, gen_expr(g, d * n, depth), gen_expr(g, n, depth), NULL, 0, 0);
}
static sr_expr *make_vecmat(struct gen *g, int op, int d, int depth)
{
    int m = 1 + (int)rnd(g, 4);
    return mk(g, op, gen_expr(g, m, depth), gen_expr(g, m * d, depth), NULL, 0, 0);
}
static sr_expr *make_tensorprod(struct gen *g, int op, int d, int depth)
{
    int divs[32], n = 0;
    for (int a = 1; a <= d && n < 32; a++)
        if (d % a == 0)
            divs[n++] = a;
    int a = divs[rnd(g, (uint64_t)n)];
    return mk(g, op, gen_expr(g, a, depth), gen_expr(g, d / a, depth), NULL, 0, 0);
}
static sr_expr *make_weighted(struct gen *g, int op, int d, int depth)
{
    int D = 1 + (int)rnd(g, 4), wd = rnd(g, 3) == 0 ? 1 : rnd(g, 2) ? D : D * D;
    sr_expr *w = gen_expr(g, wd, depth), *a = gen_expr(g, D, depth);
    sr_expr *b = op == OP_WEIGHTEDSQDIST ? gen_expr(g, D, depth) : NULL;
    return mk(g, op, w, a, b, 0, 0);
}

static sr_expr *make_sumt(struct gen *g, int op, int d, int depth)
{
    return mk(g, op, gen_expr(g, 1, depth), NULL, NULL, d, 0);
}
static sr_expr *make_elemt(struct gen *g, int op, int d, int depth)
{
    return mk(g, op, gen_expr(g, 1, depth), NULL, NULL, d, (int64_t)rnd(g, (uint64_t)d));
}
static sr_expr *make_extractt(struct gen *g, int op, int d, int depth)
{
    int da = 1 + (int)rnd(g, (uint64_t)d);
    return mk(g, op, gen_expr(g, da, depth), NULL, NULL, (int64_t)rnd(g, (uint64_t)(d - da + 1)),
              d);
}
/* TensorDot: a (p x q) times b (q x r) contracted over q, or a's q x p transposed layout
 * contracted over its first axis; the p x r result in order or transposed (permute). */
static sr_expr *make_tensordot(struct gen *g, int op, int d, int depth)
{
    (void)op;
    int divs[32], n = 0;
    for (int a = 1; a <= d && n < 32; a++)
        if (d % a == 0)
            divs[n++] = a;
    int p = divs[rnd(g, (uint64_t)n)], r = d / p, q = 1 + (int)rnd(g, 3);
    bool ta = chance(g, 0.5), perm = chance(g, 0.3);
    sr_expr *a = gen_expr(g, p * q, depth), *b = gen_expr(g, q * r, depth);
    g->budget--;
    return sr_tensordot(g->ctx, a, b, 2, ta ? (int[]){q, p} : (int[]){p, q}, 2, (int[]){q, r}, 1,
                        ta ? (int[]){0} : (int[]){1}, (int[]){0}, perm ? (int[]){1, 0} : NULL);
}

/* Complex ops (pairs of interleaved reals): operands of the dimensions each needs, a complex
 * scalar (dimension 2) broadcast now and then. */
static bool even(int d) { return d % 2 == 0; }
static bool only2(int d) { return d == 2; }
static sr_expr *make_complex(struct gen *g, int op, int d, int depth)
{
    switch (op) {
    case OP_CADD:
    case OP_CSUB:
    case OP_CMULT:
    case OP_CDIV: {
        int da = d > 2 && chance(g, 0.25) ? 2 : d, db = da == 2 || !chance(g, 0.25) ? d : 2;
        return mk(g, op, gen_expr(g, da, depth), gen_expr(g, db, depth), NULL, 0, 0);
    }
    case OP_CSCAL:
    case OP_CREALSCAL: {
        /* either order: the builder puts the scalar first */
        sr_expr *a = gen_expr(g, op == OP_CSCAL ? 2 : 1, depth), *b = gen_expr(g, d, depth);
        return chance(g, 0.5) ? mk(g, op, a, b, NULL, 0, 0) : mk(g, op, b, a, NULL, 0, 0);
    }
    case OP_CONJ:
    case OP_CEXP:
        return mk(g, op, gen_expr(g, d, depth), NULL, NULL, 0, 0);
    case OP_CEXP1J:
    case OP_REAL2C:
    case OP_IMAG2C:
        return mk(g, op, gen_expr(g, d / 2, depth), NULL, NULL, 0, 0);
    case OP_CSUM:
        return mk(g, op, gen_expr(g, 2 * free_dim(g), depth), NULL, NULL, 0, 0);
    case OP_CSUMT:
        return mk(g, op, gen_expr(g, 2, depth), NULL, NULL, d, 0);
    default: /* ComplexReal, ComplexImag, ComplexAbs, ComplexSquareAbs, ComplexAngle */
        return mk(g, op, gen_expr(g, 2 * d, depth), NULL, NULL, 0, 0);
    }
}

static const struct op_gen op_gens[OP_COUNT] = {
    [OP_POW] = {NULL, make_pow, DOM_ANY},
    [OP_ROUND] = {NULL, make_round, DOM_ANY},
    [OP_CLAMPINT] = {NULL, make_clampint, DOM_ANY},
    [OP_DIFFCLAMPINT] = {NULL, make_clampint, DOM_ANY},
    [OP_ELEM] = {only1, make_elem, DOM_ANY},
    [OP_EXTRACT] = {NULL, make_extract, DOM_ANY},
    [OP_CONCAT] = {at_least2, make_concat, DOM_ANY},
    [OP_ONEHOT] = {NULL, make_onehot, DOM_ANY},
    [OP_MATVECMULT] = {NULL, make_matvec, DOM_ANY},
    [OP_VECMATMULT] = {NULL, make_vecmat, DOM_ANY},
    [OP_TENSORPROD] = {NULL, make_tensorprod, DOM_ANY},
    [OP_SUMT] = {NULL, make_sumt, DOM_ANY},
    [OP_ELEMT] = {NULL, make_elemt, DOM_ANY},
    [OP_EXTRACTT] = {NULL, make_extractt, DOM_ANY},
    [OP_TENSORDOT] = {NULL, make_tensordot, DOM_ANY},
    [OP_WEIGHTEDSQNORM] = {only1, make_weighted, DOM_ANY},
    [OP_WEIGHTEDSQDIST] = {only1, make_weighted, DOM_ANY},
    [OP_LOG] = {NULL, NULL, DOM_POS},
    [OP_SQRT] = {NULL, NULL, DOM_POS},
    [OP_RSQRT] = {NULL, NULL, DOM_POS},
    [OP_XLOGX] = {NULL, NULL, DOM_POS},
    [OP_POWF] = {NULL, NULL, DOM_POS},
    [OP_ASIN] = {NULL, NULL, DOM_UNIT},
    [OP_ACOS] = {NULL, NULL, DOM_UNIT},
    [OP_CADD] = {even, make_complex, DOM_ANY},
    [OP_CSUB] = {even, make_complex, DOM_ANY},
    [OP_CMULT] = {even, make_complex, DOM_ANY},
    [OP_CDIV] = {even, make_complex, DOM_ANY},
    [OP_CSCAL] = {even, make_complex, DOM_ANY},
    [OP_CREALSCAL] = {even, make_complex, DOM_ANY},
    [OP_CONJ] = {even, make_complex, DOM_ANY},
    [OP_CEXP] = {even, make_complex, DOM_ANY},
    [OP_CEXP1J] = {even, make_complex, DOM_ANY},
    [OP_REAL2C] = {even, make_complex, DOM_ANY},
    [OP_IMAG2C] = {even, make_complex, DOM_ANY},
    [OP_CSUMT] = {even, make_complex, DOM_ANY},
    [OP_CSUM] = {only2, make_complex, DOM_ANY},
    [OP_CREAL] = {NULL, make_complex, DOM_ANY},
    [OP_CIMAG] = {NULL, make_complex, DOM_ANY},
    [OP_CABS] = {NULL, make_complex, DOM_ANY},
    [OP_CSQUAREABS] = {NULL, make_complex, DOM_ANY},
    [OP_CANGLE] = {NULL, make_complex, DOM_ANY},
};

static bool is_excluded(int op, const char **reason)
{
#define FZ_EXCLUDED_CASE_(id, why)                                                                 \
    if (op == OP_##id) {                                                                           \
        if (reason)                                                                                \
            *reason = why;                                                                         \
        return true;                                                                               \
    }
    FZ_EXCLUDED_OPS(FZ_EXCLUDED_CASE_)
#undef FZ_EXCLUDED_CASE_
    (void)op;
    (void)reason;
    return false;
}

enum fz_cover fz_op_coverage(int op, const char **reason)
{
    if (reason)
        *reason = NULL;
    if (op < 0 || op >= OP_COUNT)
        return FZ_MISSING;
    if (is_excluded(op, reason))
        return FZ_EXCLUDED;
    const struct expr_opinfo *oi = &expr_ops[op];
    if (oi->dimrule == DIM_LEAF)
        return op == OP_VAR || op == OP_CST || op == OP_INTCST || op == OP_RATCST ? FZ_LEAF
                                                                                  : FZ_MISSING;
    if (op_gens[op].make)
        return FZ_ENTRY;
    if (oi->nattr == 0 && oi->arity >= 1 && oi->dimrule != DIM_SPECIAL)
        return FZ_GENERIC;
    return FZ_MISSING;
}

static bool can_make(int op, int d)
{
    enum fz_cover cv = fz_op_coverage(op, NULL);
    if (cv != FZ_GENERIC && cv != FZ_ENTRY)
        return false;
    if (op_gens[op].can)
        return op_gens[op].can(d);
    switch (expr_ops[op].dimrule) {
    case DIM_TO1:
    case DIM_PAIR1:
        return d == 1;
    default:
        return true;
    }
}

static sr_expr *make_generic(struct gen *g, int op, int d, int depth)
{
    const struct expr_opinfo *oi = &expr_ops[op];
    sr_expr *kids[EXPR_MAX_ARITY] = {NULL, NULL, NULL};
    enum dom dom = op_gens[op].dom;
    switch (oi->dimrule) {
    case DIM_SAME:
        kids[0] = gen_arg(g, d, depth, dom);
        for (int i = 1; i < oi->arity; i++)
            kids[i] = gen_expr(g, d, depth);
        break;
    case DIM_EW: {
        int full = (int)rnd(g, (uint64_t)oi->arity); /* this operand has dimension d */
        for (int i = 0; i < oi->arity; i++) {
            int di = i == full || (d > 1 && chance(g, 0.6)) ? d : 1;
            kids[i] = i == 0 ? gen_arg(g, di, depth, dom) : gen_expr(g, di, depth);
        }
        break;
    }
    case DIM_TO1:
        kids[0] = gen_arg(g, free_dim(g), depth, dom);
        for (int i = 1; i < oi->arity; i++)
            kids[i] = gen_expr(g, kids[0] ? kids[0]->dim : 1, depth);
        break;
    case DIM_PAIR1: {
        int D = free_dim(g);
        for (int i = 0; i < oi->arity; i++)
            kids[i] = gen_expr(g, D, depth);
        break;
    }
    default:
        return NULL;
    }
    return mk(g, op, kids[0], kids[1], kids[2], 0, 0);
}

static sr_expr *reuse(struct gen *g, int d)
{
    int seen = 0;
    sr_expr *pick = NULL;
    for (int i = 0; i < g->npool; i++)
        if (g->pool[i]->dim == d && rnd(g, (uint64_t)++seen) == 0)
            pick = g->pool[i];
    return pick;
}

static sr_expr *gen_expr(struct gen *g, int d, int depth)
{
    sr_expr *old = chance(g, 0.15) ? reuse(g, d) : NULL;
    if (old)
        return old;
    if (depth <= 0 || g->budget <= 0 || chance(g, 0.15))
        return gen_leaf(g, d);
    int cands[OP_COUNT], n = 0;
    for (int op = 0; op < OP_COUNT; op++)
        if (can_make(op, d))
            cands[n++] = op;
    for (int tries = 0; tries < 4 && n > 0; tries++) {
        int op = cands[rnd(g, (uint64_t)n)];
        sr_expr *e = op_gens[op].make ? op_gens[op].make(g, op, d, depth - 1)
                                      : make_generic(g, op, d, depth - 1);
        if (e && e->dim == d) {
            if (g->npool < 64)
                g->pool[g->npool++] = e;
            return e;
        }
    }
    return gen_leaf(g, d);
}

/* ---- drawing a case ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t a, uint64_t b)
{
    uint64_t x = a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return x ? x : 1;
}

static const char input_letters[] = {
#define FZ_INPUT_LETTER_(c, name) c,
    FZ_INPUT_MAP(FZ_INPUT_LETTER_)
#undef FZ_INPUT_LETTER_
};

void fz_case_draw(uint64_t seed, uint64_t index, struct fz_case *c)
{
    memset(c, 0, sizeof *c);
    struct gen g;
    memset(&g, 0, sizeof g);
    g.s = mix(seed, index);
    if (sr_ctx_new(&g.ctx) != SR_OK)
        return;
    c->red = (sr_reduction)rnd(&g, SR_REDUCTION_COUNT);
    c->axis = (int)rnd(&g, 2);
    c->dtype = rnd(&g, 2) ? SR_F64 : SR_F32;
    c->acc = (sr_acc)rnd(&g, 4);
    c->threads = (int)rnd(&g, 3);
    static const int64_t sizes[] = {0, 1, 1, 2, 3, 5, 7, 13, 17, 31, 64, 97, 128, 131, 257, 1000};
    c->nx = sizes[rnd(&g, sizeof sizes / sizeof *sizes)];
    c->ny = sizes[rnd(&g, sizeof sizes / sizeof *sizes)];
    if (c->nx * c->ny > 40000) /* the oracle interprets every pair several times */
        *(c->nx > c->ny ? &c->nx : &c->ny) = 40000 / (c->nx < c->ny ? c->nx : c->ny);
    if (chance(&g, 0.1)) { /* a long reduced range: the split paths */
        int64_t *out = c->axis == 1 ? &c->nx : &c->ny, *red = c->axis == 1 ? &c->ny : &c->nx;
        *out = 1 + (int64_t)rnd(&g, 4);
        *red = 3000 + (int64_t)rnd(&g, 6000);
    }
    bool gemm = chance(&g, 0.2);
    if (gemm) { /* the gemm-epilogue shape: the pair enters through one inner product */
        static const int gd[] = {3, 8, 24, 32, 41};
        int D = gd[rnd(&g, 5)];
        g.vdim[0] = g.vdim[1] = D;
        g.vcat[0] = SR_CAT_I;
        g.vcat[1] = SR_CAT_J;
        g.nvars = 2;
        g.ip = sr_scalprod(g.ctx, sr_vi(g.ctx, 0, D), sr_vj(g.ctx, 1, D));
    }
    int fdim = sr_reductions[c->red].scalar_f || chance(&g, 0.6) ? 1 : 1 + (int)rnd(&g, 4);
    /* One case in twelve has a wide F or weight (the direct strategy's loop mode, the fused
     * two-product), from a stream of its own so that the other cases stay as they were. The
     * sizes shrink so that pairs times width stays about what a narrow case costs. */
    static const int wide_dims[] = {15, 16, 17, 33, 63, 64, 65, 100, 255, 1100};
    uint64_t ws = mix(seed ^ 0x77696465ULL, index);
    int wdim = tu_uniform(&ws, 0.0, 1.0) < 1.0 / 12 ? wide_dims[tu_rand(&ws) % 10] : 0;
    if (wdim && !sr_reductions[c->red].scalar_f)
        fdim = wdim;
    if (wdim && (sr_reductions[c->red].weight || !sr_reductions[c->red].scalar_f))
        while (c->nx * c->ny * wdim > 320000)
            *(c->nx > c->ny ? &c->nx : &c->ny) /= 2;
    g.budget = 8 + (int)rnd(&g, 32);
    sr_expr *f = gen_expr(&g, fdim, 2 + (int)rnd(&g, 5));
    if (g.ip && !g.ip_used && f)
        f = fdim == 1 || chance(&g, 0.5) ? sr_mul(g.ctx, f, g.ip) : sr_add(g.ctx, f, g.ip);
    sr_expr *w = NULL;
    if (sr_reductions[c->red].weight) {
        g.budget = 4 + (int)rnd(&g, 8);
        w = gen_expr(&g, wdim ? wdim : 1 + (int)rnd(&g, 3), 1 + (int)rnd(&g, 3));
    }
    if (sr_reductions[c->red].uses_k) {
        int64_t nred = c->axis == 1 ? c->ny : c->nx;
        c->k = 1 + (int)rnd(&g, 4);
        if (nred > 0 && c->k > nred && chance(&g, 0.8))
            c->k = (int)nred;
    } else {
        c->k = 1;
    }
    sr_expr_print(f, c->formula, sizeof c->formula);
    if (w)
        sr_expr_print(w, c->weight, sizeof c->weight);
    for (int v = 0; v < g.nvars && v < 16; v++) {
        /* mostly finite values; edge values for one variable in four */
        int letter = chance(&g, 0.25) ? 4 : (int)rnd(&g, 4);
        c->inputs[v] = input_letters[letter];
    }
    c->input_seed = mix(seed ^ 0x5bd1e995, index);
    /* One float32 case in three becomes a float16 or bfloat16 one, drawn from a stream of its
     * own so that every other field is what the same seed and index always gave. */
    uint64_t hs = mix(seed ^ 0x16b16, index);
    if (c->dtype == SR_F32 && tu_rand(&hs) % 3 == 0)
        c->dtype = tu_rand(&hs) & 1 ? SR_BF16 : SR_F16;
    /* A formula too long for the text buffers becomes a plain one rather than a cut one. */
    if (!f || sr_expr_print(f, NULL, 0) >= sizeof c->formula ||
        (w && sr_expr_print(w, NULL, 0) >= sizeof c->weight))
        snprintf(c->formula, sizeof c->formula, "Var(0,1,0)*Var(1,1,1)");
    sr_ctx_free(g.ctx);
}

/* ---- inputs -------------------------------------------------------------------------------- */

static double edge_value(uint64_t *s, sr_dtype dt)
{
    /* Huge and tiny stay where their squares are finite and nonzero in the dtype. */
    double huge = dt == SR_F64 ? 1e150 : dt == SR_F16 ? 128 : 1e18;
    double tiny = dt == SR_F64 ? 1e-150 : dt == SR_F16 ? 0x1p-10 : 1e-18;
    const double vals[] = {0.0,  -0.0,  1.0, -1.0,     huge,     -huge,
                           tiny, -tiny, NAN, INFINITY, -INFINITY};
    if (tu_uniform(s, 0, 1) < 0.35)
        return vals[tu_rand(s) % (sizeof vals / sizeof *vals)];
    return round(tu_uniform(s, -2.0, 2.0) * 64.0) / 64.0;
}

static double draw_value(char mode, uint64_t *s, sr_dtype dt)
{
    switch (mode) {
    case 'G':
        return round(tu_uniform(s, -2.0, 2.0) * 64.0) / 64.0;
    case 'T':
        return floor(tu_uniform(s, 0.0, 4.0));
    case 'P':
        return tu_uniform(s, 0.1, 3.0);
    case 'E':
        return edge_value(s, dt);
    default:
        return tu_uniform(s, -2.0, 2.0);
    }
}

struct inputs {
    int n;
    void *buf[FZ_MAX_VARS + 4];
    const void *args[FZ_MAX_VARS + 4];
    int64_t count[FZ_MAX_VARS + 4];
};

static void inputs_free(struct inputs *in)
{
    for (int v = 0; v < in->n; v++)
        free(in->buf[v]);
    memset(in, 0, sizeof *in);
}

/* The case's arrays for kernel k, stored as values of dtype store; perturb != 0 multiplies
 * every value by (1 + perturb * eps), with eps of random sign when random is set. The values
 * of a float16 or bfloat16 case are of that dtype whatever the store: the oracle reads them as
 * float32 arrays. */
static bool inputs_make(const struct fz_case *c, const sr_kernel *k, sr_dtype store, double perturb,
                        bool random, struct inputs *in)
{
    memset(in, 0, sizeof *in);
    if (k->nargs > FZ_MAX_VARS + 4)
        return false;
    in->n = k->nargs;
    size_t es = sr_dtype_size(store);
    const bool half = c->dtype == SR_F16 || c->dtype == SR_BF16;
    double eps = c->dtype == SR_F64 ? DBL_EPSILON : FLT_EPSILON;
    uint64_t ps = c->input_seed ^ 0xabcdef;
    for (int v = 0; v < k->nargs; v++) {
        if (!k->vars[v].dim)
            continue;
        int64_t rows = k->vars[v].cat == SR_CAT_I ? c->nx : k->vars[v].cat == SR_CAT_J ? c->ny : 1;
        int64_t n = rows * k->vars[v].dim;
        in->count[v] = n;
        in->buf[v] = malloc((size_t)(n > 0 ? n : 1) * es);
        if (!in->buf[v])
            return false;
        char mode = v < 16 && c->inputs[v] ? c->inputs[v] : 'U';
        uint64_t s = mix(c->input_seed, (uint64_t)v + 1);
        for (int64_t t = 0; t < n; t++) {
            double x = draw_value(mode, &s, c->dtype);
            if (half) {
                uint16_t h;
                sr__dtype_put(c->dtype, &h, 0, x);
                x = sr__dtype_get(c->dtype, &h, 0);
            }
            if (perturb != 0.0) {
                double sign = random ? (tu_rand(&ps) & 1 ? 1.0 : -1.0) : 1.0;
                x *= 1.0 + sign * perturb * eps;
            }
            sr__dtype_put(store, in->buf[v], t, x);
        }
        in->args[v] = in->buf[v];
    }
    return true;
}

/* ---- running one kernel -------------------------------------------------------------------- */

struct result {
    sr_status st;
    int64_t nvals;
    double *val;  /* nvals, NULL when the reduction writes no values */
    int64_t *idx; /* nvals, NULL when it writes no indices */
    char msg[512];
};

static void result_free(struct result *r)
{
    free(r->val);
    free(r->idx);
    memset(r, 0, sizeof *r);
}

static void run_kernel(const sr_kernel *k, const struct fz_case *c, const struct inputs *in,
                       struct result *r)
{
    memset(r, 0, sizeof *r);
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    int64_t nout = (k->axis == 1 ? c->nx : c->ny) * k->out_dim;
    size_t es = sr_dtype_size(k->io), nb = (size_t)(nout > 0 ? nout : 1);
    void *vb = ri->values ? malloc(nb * es) : NULL;
    int64_t *ib = ri->indices ? malloc(nb * sizeof *ib) : NULL;
    /* A kernel of a rewritten formula may take fewer arrays (a variable simplified away). */
    int nargs = k->nargs < in->n ? k->nargs : in->n;
    sr_run_desc rd = {c->nx, c->ny, nargs, in->args, vb, ib};
    r->st = sr_kernel_run_ex(k, &rd);
    if (r->st != SR_OK)
        snprintf(r->msg, sizeof r->msg, "%s", sr_ctx_error(k->ctx));
    r->nvals = nout;
    if (vb) {
        r->val = malloc(nb * sizeof *r->val);
        for (int64_t t = 0; t < nout && r->val; t++)
            r->val[t] = sr__dtype_get(k->io, vb, t);
        free(vb);
    }
    r->idx = ib;
}

/* The oracle's values of a float16 or bfloat16 case, computed in float32, rounded to the
 * dtype as the backends' outputs are. */
static void round_result(sr_dtype dt, struct result *r)
{
    if ((dt != SR_F16 && dt != SR_BF16) || r->st != SR_OK)
        return;
    for (int64_t t = 0; r->val && t < r->nvals; t++) {
        uint16_t h;
        sr__dtype_put(dt, &h, 0, r->val[t]);
        r->val[t] = sr__dtype_get(dt, &h, 0);
    }
}

/* ---- building kernels ---------------------------------------------------------------------- */

struct built {
    sr_ctx *ctx;
    sr_expr *f, *w;
    sr_kernel_desc d;
};

/* A kernel of f (and weight w) with the case's reduction, under the given simplifier and BLIS
 * settings; NULL with the message in msg on failure. */
static sr_kernel *kernel_of(struct built *b, const sr_expr *f, const sr_expr *w, sr_reduction red,
                            sr_device dev, bool simplify, const char *blis, sr_status *st,
                            char *msg, size_t cap)
{
    sr_ctx_set_option(b->ctx, "SYMRED_SIMPLIFY", simplify ? "1" : "0");
    sr_ctx_set_option(b->ctx, "SYMRED_GEMM", blis);
    sr_kernel_desc d = b->d;
    d.reduction = red;
    d.device = dev;
    d.weight = (sr_expr *)w;
    if (dev == SR_DEVICE_REFERENCE)
        d.acc = SR_ACC_DEFAULT;
    sr_kernel *k = NULL;
    *st = sr_kernel_new(b->ctx, f, &d, &k);
    if (*st != SR_OK && msg)
        snprintf(msg, cap, "%s", sr_ctx_error(b->ctx));
    sr_ctx_set_option(b->ctx, "SYMRED_SIMPLIFY", NULL);
    sr_ctx_set_option(b->ctx, "SYMRED_GEMM", NULL);
    return k;
}

/* The reduction rewrite of kernel k (k->simp.post, src/core/simp-kernel.c) on the reference:
 * R = the reduction of the inner formula, then post once per output row (a Sum over a reduced
 * range of one index, R a variable of the output index at argument k->nargs). For reductions
 * that write values only, without a weight; false when it does not apply or fails. */
static bool rewrite_reference(struct built *b, const sr_kernel *k, const struct fz_case *c,
                              const struct inputs *in, struct result *out)
{
    const struct sr_simp_info *si = &k->simp;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    if (!si->post || !si->inner || k->weight || !ri->values || ri->indices ||
        k->nargs >= FZ_MAX_VARS + 4)
        return false;
    sr_status st;
    bool ok = false;
    struct result R;
    memset(&R, 0, sizeof R);
    void *rbuf = NULL, *vb = NULL;
    sr_kernel *kp = NULL;
    sr_kernel *ki =
        kernel_of(b, si->inner, NULL, k->red, SR_DEVICE_REFERENCE, false, NULL, &st, NULL, 0);
    if (!ki)
        return false;
    run_kernel(ki, c, in, &R);
    kp = kernel_of(b, si->post, NULL, SR_SUM, SR_DEVICE_REFERENCE, false, NULL, &st, NULL, 0);
    if (R.st != SR_OK || !R.val || !kp || kp->nargs != k->nargs + 1 || kp->out_dim != k->out_dim ||
        kp->vars[k->nargs].dim != ki->out_dim)
        goto done;
    int64_t nout = k->axis == 1 ? c->nx : c->ny, nr = R.nvals;
    size_t es = sr_dtype_size(k->dtype);
    rbuf = malloc((size_t)(nr > 0 ? nr : 1) * es);
    vb = malloc((size_t)(nout * k->out_dim > 0 ? nout * k->out_dim : 1) * es);
    if (!rbuf || !vb)
        goto done;
    for (int64_t t = 0; t < nr; t++) {
        if (k->dtype == SR_F64)
            ((double *)rbuf)[t] = R.val[t];
        else
            ((float *)rbuf)[t] = (float)R.val[t];
    }
    const void *args[FZ_MAX_VARS + 5];
    for (int v = 0; v < k->nargs; v++)
        args[v] = v < in->n ? in->args[v] : NULL;
    args[k->nargs] = rbuf;
    sr_run_desc rd = {
        k->axis == 1 ? c->nx : 1, k->axis == 1 ? 1 : c->ny, k->nargs + 1, args, vb, NULL};
    memset(out, 0, sizeof *out);
    out->st = sr_kernel_run_ex(kp, &rd);
    out->nvals = nout * k->out_dim;
    if (out->st == SR_OK &&
        (out->val = malloc((size_t)(out->nvals > 0 ? out->nvals : 1) * sizeof *out->val))) {
        for (int64_t t = 0; t < out->nvals; t++)
            out->val[t] = k->dtype == SR_F64 ? ((double *)vb)[t] : ((float *)vb)[t];
        ok = true;
    }
done:
    free(rbuf);
    free(vb);
    result_free(&R);
    sr_kernel_free(kp);
    sr_kernel_free(ki);
    return ok;
}

/* A bound of the rounding error of node e (whose operands, already perturbed, are kid),
 * divided by eps: the node's magnitude for the pointwise ops, the sum of the terms' magnitudes
 * for the ops that add (cancellation leaves their error relative to the terms, not to the
 * result). */
static sr_expr *magnitude(sr_ctx *ctx, const sr_expr *e, sr_expr **kid, sr_expr *n)
{
    switch (e->op) {
    case OP_ADD:
    case OP_SUB:
        return sr_add(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1]));
    case OP_SUM:
        return sr_sum(ctx, sr_abs(ctx, kid[0]));
    case OP_SCALPROD:
        return sr_scalprod(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1]));
    case OP_SQDIST:
        return sr_sqnorm2(ctx, sr_add(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1])));
    case OP_MATVECMULT:
        return sr_matvecmult(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1]));
    case OP_VECMATMULT:
        return sr_vecmatmult(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1]));
    case OP_WEIGHTEDSQNORM:
        return sr_weightedsqnorm(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1]));
    case OP_WEIGHTEDSQDIST:
        return sr_weightedsqnorm(ctx, sr_abs(ctx, kid[0]),
                                 sr_add(ctx, sr_abs(ctx, kid[1]), sr_abs(ctx, kid[2])));
    case OP_MOD:
        return sr_add(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, n));
    case OP_TENSORDOT: { /* a sum of products too */
        sr_expr *ab[2] = {sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1])};
        return expr_make(ctx, OP_TENSORDOT, ab, e->iattr, e->dim, e->fattr);
    }
    default:
        return sr_abs(ctx, n);
    }
}

/* The towards-zero run's "equal up to rounding, amplified": sqrt(eps) for rel = 8 eps. */
static sr_expr *near_tol(sr_ctx *ctx, double r) { return sr_const(ctx, sqrt(fabs(r) / 8.0)); }

/* The K-min reductions, which order NaN last (the pair-by-pair check takes NaN as +Inf). */
static bool nan_last_red(sr_reduction red)
{
    return red == SR_KMIN || red == SR_ARGKMIN || red == SR_KMIN_ARGKMIN;
}

static bool is_comparison(int op)
{
    return op == OP_LESS || op == OP_LESSEQ || op == OP_GREATER || op == OP_GREATEREQ ||
           op == OP_EQUAL || op == OP_NOTEQUAL;
}

/*
 * e as a backend computing in the dtype may see it: every constant and every node moved by
 * rel times its rounding-error bound (magnitude), with the sign of rel or, when signs is set,
 * a random sign per node. Infinite and NaN nodes stay as they are. The oracle run on this
 * formula (and on inputs moved the same way) shows how far rounding can move each output.
 */
/* n as float32 holds it: +-inf past FLT_MAX, 0 below half the smallest subnormal (n * 1e300 is
 * the infinity of n's sign, since constants are finite). */
static sr_expr *f32_range(sr_ctx *ctx, sr_expr *n)
{
    sr_expr *a = sr_abs(ctx, n), *half = sr_const(ctx, 0.5);
    sr_expr *big = sr_sub(ctx, sr_less(ctx, a, sr_const(ctx, (double)FLT_MAX)), half);
    sr_expr *tiny = sr_sub(ctx, sr_less(ctx, a, sr_const(ctx, (double)FLT_TRUE_MIN / 2)), half);
    /* ... and float32's precision: n rounded to 24 significant bits (Veltkamp's split, t - (t -
     * n) with t = n (2^29 + 1); the reference does not contract it), as each float32 node is:
     * asin(sin(1)) is 1 in double and 0.99999994 in float32, and a comparison with 1 tells. */
    sr_expr *t = sr_mul(ctx, n, sr_const(ctx, 536870913.0));
    sr_expr *r24 = sr_sub(ctx, t, sr_sub(ctx, t, n));
    sr_expr *in = sr_ifelse(ctx, tiny, sr_mul(ctx, n, sr_const(ctx, 0.0)), r24);
    return sr_ifelse(ctx, big, in, sr_mul(ctx, n, sr_const(ctx, 1e300)));
}

static sr_expr *perturb_formula(sr_ctx *ctx, const sr_expr *e, double rel, uint64_t *signs,
                                bool to_zero, bool f32, double exp_flush)
{
    if (!e)
        return NULL;
    double r = signs ? (tu_rand(signs) & 1 ? rel : -rel) : rel;
    switch (e->op) {
    case OP_VAR:
        return (sr_expr *)e;
    case OP_CST:
        return sr_const(ctx, e->fattr * (1.0 + r));
    case OP_INTCST:
        return sr_const(ctx, (double)e->iattr[0] * (1.0 + r));
    case OP_RATCST:
        return sr_const(ctx, (double)e->iattr[0] / (double)e->iattr[1] * (1.0 + r));
    default:
        break;
    }
    sr_expr *kid[EXPR_MAX_ARITY] = {NULL, NULL, NULL};
    for (int i = 0; i < expr_arity(e); i++)
        if (!(kid[i] = perturb_formula(ctx, e->child[i], rel, signs, to_zero, f32, exp_flush)))
            return NULL;
    if (to_zero && is_comparison(e->op)) {
        /* Compare a - b moved towards zero by sqrt(eps) times the operands: operands equal up
         * to rounding (amplified by the ill-conditioning of what computed them, up to
         * 1/sqrt(eps)) compare equal, as they may in the dtype. */
        sr_expr *d = sr_sub(ctx, kid[0], kid[1]);
        sr_expr *derr =
            sr_mul(ctx, near_tol(ctx, r), sr_add(ctx, sr_abs(ctx, kid[0]), sr_abs(ctx, kid[1])));
        sr_expr *dz[2] = {sr_sub(ctx, d, sr_clamp(ctx, d, sr_neg(ctx, derr), derr)),
                          sr_const(ctx, 0.0)};
        return expr_make(ctx, (enum expr_op)e->op, dz, NULL, 0, 0.0);
    }
    if (to_zero && e->op == OP_POWF) {
        /* pow is discontinuous where a rounding may land: pow(1, y) is 1 for every y (NaN and
         * infinities included) and pow(1 + d, y) is not; pow(x, y) of a negative x is finite
         * at an integer y only. A base within sqrt(eps) of 1 is made 1 and an exponent within
         * sqrt(eps) of an integer that integer, as they may be in the dtype (Normalize of a
         * scalar is +-1 up to its rounding). */
        sr_expr *one = sr_const(ctx, 1.0), *c = near_tol(ctx, r);
        sr_expr *tb = sr_mul(ctx, c, sr_add(ctx, sr_abs(ctx, kid[0]), one));
        kid[0] =
            sr_ifelse(ctx, sr_sub(ctx, tb, sr_abs(ctx, sr_sub(ctx, kid[0], one))), one, kid[0]);
        sr_expr *ry = sr_round(ctx, kid[1], 0);
        sr_expr *ty = sr_mul(ctx, c, sr_add(ctx, sr_abs(ctx, kid[1]), one));
        kid[1] = sr_ifelse(ctx, sr_sub(ctx, ty, sr_abs(ctx, sr_sub(ctx, kid[1], ry))), ry, kid[1]);
    }
    if (to_zero && (e->op == OP_ARGMAX || e->op == OP_ARGMIN)) {
        /* The comparisons inside ArgMax and ArgMin: another component within sqrt(eps) of
         * the extreme may be the extreme in the dtype (Cos of 3.8e-5 and of 1.1e-5 are both 1
         * in float32; s v_k / Normalize(v)_k is s |v| for every k up to rounding, equal in
         * double and not in float32), so the index has no defined value there: NaN, which
         * makes the output unstable. A NaN extreme leaves the op as it is. */
        bool mx = e->op == OP_ARGMAX;
        sr_expr *a = kid[0], *m = mx ? sr_max(ctx, a) : sr_min(ctx, a);
        sr_expr *tol = sr_mul(ctx, near_tol(ctx, r), sr_add(ctx, sr_abs(ctx, m), sr_abs(ctx, a)));
        sr_expr *gap = mx ? sr_sub(ctx, m, a) : sr_sub(ctx, a, m);
        /* how many components lie within tol of the extreme, itself included: 2 or more, and
         * which is the extreme in the dtype is not defined */
        sr_expr *near = sr_sum(ctx, sr_greatereq(ctx, tol, gap));
        sr_expr *op = expr_make(ctx, (enum expr_op)e->op, kid, e->iattr, e->dim, e->fattr);
        sr_expr *nan = sr_sqrt(ctx, sr_const(ctx, -1.0)); /* constants must be finite */
        return sr_ifelse(ctx, sr_sub(ctx, sr_const(ctx, 1.5), near), op, nan);
    }
    if (f32) { /* float32's range: an intermediate value past it overflows there */
        sr_expr *n;
        if (e->op == OP_NORMALIZE) /* its sum of squares overflows first */
            n = sr_mul(ctx, kid[0], sr_rsqrt(ctx, f32_range(ctx, sr_sqnorm2(ctx, kid[0]))));
        else if (e->op == OP_NORM2)
            n = sr_sqrt(ctx, f32_range(ctx, sr_sqnorm2(ctx, kid[0])));
        else if (e->op == OP_CABS) /* sqrt(re^2 + im^2): re^2 overflows first */
            n = sr_sqrt(ctx, f32_range(ctx, sr_complex_squareabs(ctx, kid[0])));
        else
            n = expr_make(ctx, (enum expr_op)e->op, kid, e->iattr, e->dim, e->fattr);
        return n ? f32_range(ctx, n) : NULL;
    }
    sr_expr *n = expr_make(ctx, (enum expr_op)e->op, kid, e->iattr, e->dim, e->fattr);
    if (to_zero && exp_flush > 0 && e->op == OP_EXP)
        /* The JIT's Exp is 0 below exp_flush (docs/semantics.md, "Exp's underflow"): 0 where
         * n <= exp_flush, n where it is above or NaN (IfElse of a NaN selects the last). */
        n = sr_ifelse(ctx, sr_sub(ctx, sr_const(ctx, exp_flush), n), sr_const(ctx, 0.0), n);
    sr_expr *err = sr_mul(ctx, sr_const(ctx, fabs(r)), magnitude(ctx, e, kid, n)), *moved;
    if (to_zero) /* n - Clamp(n, -err, err): 0 when |n| <= err, the value a cancellation gives */
        moved = sr_sub(ctx, n, sr_clamp(ctx, n, sr_neg(ctx, err), err));
    else
        moved = r > 0 ? sr_add(ctx, n, err) : sr_sub(ctx, n, err);
    /* IfElse(|n| < 1e300 - 0.5 ... ): a finite n moves, an infinite or NaN one stays. */
    sr_expr *finite =
        sr_sub(ctx, sr_less(ctx, sr_abs(ctx, n), sr_const(ctx, 1e300)), sr_const(ctx, 0.5));
    return sr_ifelse(ctx, finite, moved, n);
}

/* ---- comparing ------------------------------------------------------------------------------ */

#define FZ_NPERT    5    /* perturbed oracle runs (the last for float32 only) */
#define FZ_NWIDE    3    /* the first three again, FZ_K_SPREAD times as large (pair_intervals) */
#define FZ_K_SPREAD 16.0 /* how far past the perturbed spread a backend may be */

/* What the oracle knows about each output: its value, the spread of the oracle under
 * perturbed inputs, constants and nodes, and the scale its rounding error is relative to. */
struct oracle {
    struct result ref;
    struct result pert[FZ_NPERT];
    int npert;
    double *scale; /* per value output: sum |F| (Sum), max |F| (LogSumExp), ...; NULL: |ref| */
    double rel;    /* tolerance, in units of the scale */
    /* float16 and bfloat16: the oracle runs in float32 and its outputs are rounded to the
     * dtype; a backend's float32 result, rounded, may land one unit in the last place away:
     * out_ulp relative (2^-10, 2^-7), out_tiny absolute (float16's subnormal spacing). */
    double out_ulp, out_tiny;
    /* float32: the reduction's own sums (of nterms terms of the scale's size) may overflow
     * float32 where the double reference does not; such outputs are not compared. 0: none. */
    double range_limit, nterms;
    sr_kernel *kf; /* the oracle kernel, for F's values at an index (sr_kernel_eval_block) */
    const struct inputs *in;
    sr_kernel *pk[FZ_NPERT]; /* the perturbed oracles and their inputs, for the same */
    struct inputs pin[FZ_NPERT];
    /* SumSoftMaxWeight: kernels of the weight formula G alone, as given and perturbed (the
     * same perturbations as pk), for G's values at a pair. NULL otherwise. */
    sr_kernel *kg, *pkg[FZ_NPERT];
    /* The up, down and random perturbations again, FZ_K_SPREAD times as large, for F's (wk) and
     * G's (wkg) values at a pair only (pair_intervals), on their inputs win. */
    sr_kernel *wk[FZ_NWIDE], *wkg[FZ_NWIDE];
    struct inputs win[FZ_NWIDE];
    /* For a variant with the simplifier on, where the oracle has a NaN or an infinity: the
     * reference on the variant's simplified formula (its k->f, k->weight), else NULL. */
    const struct result *simp;
};

static bool nonfinite(double x) { return isnan(x) || isinf(x); }

/* Whether the oracle's value t is unstable: a perturbed run gives another class of value
 * (NaN, an infinity, a finite number). */
static bool unstable_at(const struct oracle *o, int64_t t, double r)
{
    for (int p = 0; p < o->npert; p++) {
        if (o->pert[p].st != SR_OK || !o->pert[p].val)
            return true;
        double q = o->pert[p].val[t];
        if (isnan(q) != isnan(r) || (isinf(q) || isinf(r) ? q != r : false))
            return true;
    }
    return false;
}

static bool has_nonfinite(const struct result *r)
{
    for (int64_t t = 0; r->val && t < r->nvals; t++)
        if (nonfinite(r->val[t]))
            return true;
    return false;
}

static double tol_at(const struct oracle *o, int64_t t, double r)
{
    double spread = 0;
    for (int p = 0; p < o->npert; p++)
        if (o->pert[p].val)
            spread = fmax(spread, fabs(o->pert[p].val[t] - r));
    double scale = o->scale && isfinite(o->scale[t]) ? fmax(o->scale[t], fabs(r)) : fabs(r);
    return o->rel * scale + FZ_K_SPREAD * spread + o->out_ulp * fabs(r) + o->out_tiny + 1e-300;
}

static bool value_ok(const struct oracle *o, int64_t t, double got, double *tol)
{
    double r = o->ref.val[t];
    *tol = 0;
    double big = o->scale && !isnan(o->scale[t]) ? fmax(o->scale[t], fabs(r)) : fabs(r);
    if (o->range_limit > 0 && isfinite(r) && !(big * o->nterms < o->range_limit))
        return true;
    /* float32: where the value overflows (the oracle's is an infinity), NaN is the inf - inf of
     * a sum whose terms overflowed with both signs (WeightedSqDist with huge weights of both
     * signs); the double oracle adds them before rounding. */
    if (o->range_limit > 0 && isinf(r) && isnan(got))
        return true;
    /* The simplifier's documented exceptions (docs/simplifier.md, "NaN / Inf policy"): a rewrite
     * that removes an intermediate overflow (Log(Exp(x)) -> x with Exp(x) out of range), or a
     * reduction rewrite that drops a 0 * Inf term (Min_i 0 * g_i = 0 * Min_i g_i), is not NaN or
     * infinite where the formula as given is. Accepted when the reference, run on the simplified
     * formula (and its reduction rewrite), gives that value. */
    if (nonfinite(r) && o->simp && o->simp->val) {
        double s = o->simp->val[t];
        *tol = o->rel * fabs(s) + o->out_ulp * fabs(s) + o->out_tiny + 1e-300;
        if (isnan(s) ? isnan(got) : isinf(s) ? got == s : fabs(got - s) <= *tol)
            return true;
    }
    if (nonfinite(r) || nonfinite(got)) {
        if (isnan(r) && isnan(got))
            return true;
        if (!isnan(r) && !isnan(got) && r == got)
            return true;
        return unstable_at(o, t, r);
    }
    if (unstable_at(o, t, r))
        return true;
    *tol = tol_at(o, t, r);
    return fabs(got - r) <= *tol;
}

/* F's component comp at output row row and reduced index red, as kernel k computes it (the
 * reference, on the inputs in). */
static double f_at(const sr_kernel *k, const struct inputs *in, const struct fz_case *c,
                   int64_t row, int64_t red, int comp)
{
    if (!k || red < 0)
        return NAN;
    int64_t i = k->axis == 1 ? row : red, j = k->axis == 1 ? red : row;
    void *out = malloc((size_t)k->fdim * sr_dtype_size(k->dtype));
    double v = NAN;
    if (out && sr_kernel_eval_block(k, c->nx, c->ny, in->args, i, 1, j, 1, out) == SR_OK)
        v = k->dtype == SR_F64 ? ((double *)out)[comp] : ((float *)out)[comp];
    free(out);
    return v;
}

static bool tied(double a, double b, double eps)
{
    if (isfinite(a) && isfinite(b))
        return fabs(a - b) <= 64 * eps * fmax(fabs(a), fabs(b));
    return a == b; /* equal infinities */
}

/* Index t: equal to the oracle's, or a tie by value (docs/semantics.md, "Comparing backends"),
 * or the index a perturbed oracle picked, or one that a perturbed oracle ties with the oracle's
 * or ranks the other way round, or (two-output reductions) the index of the value returned. */
static bool index_ok(const struct oracle *o, const struct fz_case *c, int64_t t, int64_t got,
                     double vgot, char *why, size_t cap)
{
    int64_t want = o->ref.idx[t];
    if (got == want)
        return true;
    int64_t nred = c->axis == 1 ? c->ny : c->nx;
    if (got < -1 || got >= nred) {
        snprintf(why, cap, "index %lld out of range [-1, %lld)", (long long)got, (long long)nred);
        return false;
    }
    for (int p = 0; p < o->npert; p++)
        if (o->pert[p].idx && o->pert[p].idx[t] == got)
            return true;
    const sr_kernel *k = o->kf;
    int per_row = k->out_dim, comp = (int)(t % per_row) % k->fdim;
    int64_t row = t / per_row;
    double fg = f_at(k, o->in, c, row, got, comp), fw = f_at(k, o->in, c, row, want, comp);
    double eps = c->dtype == SR_F64 ? DBL_EPSILON : FLT_EPSILON;
    /* A two-output reduction: the index points at the value it returned with it, which was
     * compared with the oracle's value already. */
    if (tied(fg, fw, eps) || (!isnan(vgot) && tied(fg, vgot, eps)))
        return true;
    double sg = 0, sw = 0; /* how far the perturbed oracles move F at got and at want */
    for (int p = 0; p < FZ_NPERT; p++) {
        if (!o->pk[p])
            continue;
        double pg = f_at(o->pk[p], &o->pin[p], c, row, got, comp);
        double pw = f_at(o->pk[p], &o->pin[p], c, row, want, comp);
        if (tied(pg, pw, eps) || (fg < fw) != (pg < pw))
            return true;
        if (isfinite(pg) && isfinite(fg))
            sg = fmax(sg, fabs(pg - fg));
        if (isfinite(pw) && isfinite(fw))
            sw = fmax(sw, fabs(pw - fw));
    }
    /* Two values that rounding moves by more than their difference have no defined order (Sin
     * of a huge, cancelling argument), with the same allowance
     * past the perturbed spread as the values (tol_at). */
    if (isfinite(fg) && isfinite(fw) && fabs(fg - fw) <= FZ_K_SPREAD * (sg + sw))
        return true;
    snprintf(why, cap, "index %lld (F = %.9g), oracle %lld (F = %.9g)", (long long)got, fg,
             (long long)want, fw);
    return false;
}

/* ---- outputs checked pair by pair ----------------------------------------------------------- */

/* Min, Max, KMin and their index forms: the output is F at the picked pairs. */
static bool is_selection(sr_reduction red)
{
    switch (red) {
    case SR_MIN:
    case SR_MAX:
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
    case SR_KMIN:
    case SR_ARGKMIN:
    case SR_KMIN_ARGKMIN:
        return true;
    default:
        return false;
    }
}

/* F of kernel k at output row row and every reduced index (nred x fdim values, row-major), as
 * the reference computes it on the inputs in. */
static bool f_row(const sr_kernel *k, const struct inputs *in, const struct fz_case *c, int64_t row,
                  int64_t nred, double *out)
{
    int64_t n = nred * k->fdim;
    void *buf = malloc((size_t)(n > 0 ? n : 1) * sr_dtype_size(k->dtype));
    bool ok =
        buf && (c->axis == 1 ? sr_kernel_eval_block(k, c->nx, c->ny, in->args, row, 1, 0, nred, buf)
                             : sr_kernel_eval_block(k, c->nx, c->ny, in->args, 0, nred, row, 1,
                                                    buf)) == SR_OK;
    for (int64_t t = 0; ok && t < n; t++)
        out[t] = k->dtype == SR_F64 ? ((double *)buf)[t] : ((float *)buf)[t];
    free(buf);
    return ok;
}

/*
 * The values a correct dtype computation may give F (weight: SumSoftMaxWeight's G) at each
 * reduced index of output row row, component comp: the interval [lo, hi] around the oracle's
 * value v of 64 eps |v| (a few roundings per node and libm's errors) plus how far rounding may
 * move v at that pair: FZ_K_SPREAD times how far the perturbed oracles move it there (s), as for
 * the outputs (tol_at), but no more than twice how far the wide perturbations (FZ_K_SPREAD times
 * as large) move it (w). Each perturbed node moves by its bound at that pair, so where v is
 * rounding noise (Cos of a huge argument) the interval covers the noise of that pair and no
 * other; where v depends linearly on the roundings, w = FZ_K_SPREAD s and the first bound holds;
 * where it is noise, s is already as large as the noise, and w keeps the interval to twice the
 * noise's own range instead of sixteen times (Cos stays in [-1, 1]). An infinity that every
 * perturbed run keeps is an interval of its own. False when some pair has no interval: a NaN,
 * or a perturbed run that changes its class (no bound applies) — except for the K-min
 * reductions, where a NaN is +Inf, a pair between finite and infinite spans its runs' values,
 * and a pair that is NaN in some runs only (an undefined value: an ambiguous ArgMax, pow at a
 * discontinuity) may be anything.
 */
static bool pair_intervals(const struct oracle *o, bool weight, const struct fz_case *c,
                           int64_t row, int comp, int64_t nred, double *lo, double *hi)
{
    const sr_kernel *k0 = weight ? o->kg : o->kf;
    sr_kernel *const *kp = weight ? o->pkg : o->pk, *const *kw = weight ? o->wkg : o->wk;
    int fd = k0 ? k0->fdim : 1;
    /* The K-min reductions order NaN last: there a NaN is +Inf, and a pair whose class the
     * perturbed runs change may lie anywhere between their values (wild). */
    bool nan_last = !weight && nan_last_red(c->red);
    size_t nb = (size_t)(nred > 0 ? nred : 1) * (size_t)fd * sizeof(double);
    size_t nw = (size_t)(nred > 0 ? nred : 1) * sizeof(double);
    double *f = malloc(nb), *fp = malloc(nb), *mn = malloc(nw), *mx = malloc(nw);
    double *fmn = malloc(nw), *fmx = malloc(nw), *nans = malloc(nw);
    double eps = c->dtype == SR_F64 ? DBL_EPSILON : FLT_EPSILON;
    bool ok = k0 && f && fp && mn && mx && fmn && fmx && nans && f_row(k0, o->in, c, row, nred, f);
    int runs = 1;
    for (int64_t j = 0; ok && j < nred; j++) {
        double *v = &f[j * fd + comp];
        nans[j] = isnan(*v);
        if (nan_last && isnan(*v))
            *v = INFINITY;
        ok = !isnan(*v);
        lo[j] = 0;        /* s */
        hi[j] = INFINITY; /* w, until the wide runs say */
        mn[j] = mx[j] = *v;
        fmn[j] = isfinite(*v) ? *v : INFINITY; /* the finite values' range */
        fmx[j] = isfinite(*v) ? *v : -INFINITY;
    }
    for (int p = 0; ok && p < FZ_NPERT; p++) {
        if (!kp[p])
            continue;
        ok = f_row(kp[p], &o->pin[p], c, row, nred, fp);
        runs++;
        for (int64_t j = 0; ok && j < nred; j++) {
            double v = f[j * fd + comp], q = fp[j * fd + comp];
            nans[j] += isnan(q);
            if (nan_last && isnan(q))
                q = INFINITY;
            if (isnan(q)) {
                ok = false;
                break;
            }
            mn[j] = fmin(mn[j], q);
            mx[j] = fmax(mx[j], q);
            if (isfinite(q)) {
                fmn[j] = fmin(fmn[j], q);
                fmx[j] = fmax(fmx[j], q);
            }
            if (isinf(v) || isinf(q))
                ok = q == v || nan_last;
            else
                lo[j] = fmax(lo[j], fabs(q - v));
        }
    }
    bool wide = true; /* all the wide runs are there (else no cap) */
    for (int p = 0; p < FZ_NWIDE; p++)
        wide = wide && kw[p];
    for (int p = 0; ok && wide && p < FZ_NWIDE; p++) {
        if (!f_row(kw[p], &o->win[p], c, row, nred, fp)) {
            for (int64_t j = 0; j < nred; j++)
                hi[j] = INFINITY;
            break;
        }
        for (int64_t j = 0; j < nred; j++) {
            double v = f[j * fd + comp], q = fp[j * fd + comp];
            if (isfinite(q) && isfinite(v))
                hi[j] = p == 0 ? fabs(q - v) : isinf(hi[j]) ? hi[j] : fmax(hi[j], fabs(q - v));
            else
                hi[j] = INFINITY; /* a wide run past the range or the domain: no cap */
        }
    }
    for (int64_t j = 0; ok && j < nred; j++) {
        double v = f[j * fd + comp];
        if (nans[j] > 0 && nans[j] < runs) { /* NaN in some runs only: no defined value */
            lo[j] = -INFINITY;
            hi[j] = INFINITY;
            continue;
        }
        if (mn[j] != mx[j] && (isinf(mn[j]) || isinf(mx[j]))) { /* wild: a class change */
            if (mn[j] < 0 && mx[j] > 0) {
                /* An infinity and a value of the other sign: a pole lies between the runs (a
                 * divisor whose sign rounding decides, such as an inner product of cancelling
                 * huge terms), and a correct computation may land on either side of it. */
                lo[j] = -INFINITY;
                hi[j] = INFINITY;
                continue;
            }
            double span = fmx[j] >= fmn[j] ? fmx[j] - fmn[j] : 0;
            double big = fmx[j] >= fmn[j] ? fmax(fabs(fmn[j]), fabs(fmx[j])) : 0;
            double a = 64 * eps * big + FZ_K_SPREAD * span;
            lo[j] = mn[j] - a;
            hi[j] = mx[j] + a;
            continue;
        }
        double a = isinf(v) ? 0 : 64 * eps * fabs(v) + fmin(FZ_K_SPREAD * lo[j], 2 * hi[j]);
        lo[j] = v - a;
        hi[j] = v + a;
    }
    free(f);
    free(fp);
    free(mn);
    free(mx);
    free(fmn);
    free(fmx);
    free(nans);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/*
 * A selection's output row row, component comp, checked pair by pair (docs/fuzzing.md,
 * "Outputs checked pair by pair"): each F value a correct computation may give lies in its pair's
 * interval (pair_intervals), and the output must be the K smallest (largest for Max) of some choice
 * of values in those intervals. With indices: the picked indices are distinct and in range, each
 * returned value lies in its own pair's interval, the values ascend, and no other pair must be
 * below the K-th value whatever its rounding (its interval's top is not below it); without
 * values the least ascending choice inside the picked pairs' intervals is the K-th value.
 * Values alone: the r-th value lies between the r-th smallest bottom and the r-th smallest top
 * of the intervals (the range of the r-th order statistic). Pairs whose F the oracle has as NaN,
 * or that a perturbed run moves to another class, are not judged here (false), except in the
 * K-min reductions, which order NaN last: there NaN is +Inf (pair_intervals).
 */
static bool selection_ok(const struct oracle *o, const struct fz_case *c, const struct result *r,
                         int64_t t, char *why, size_t cap)
{
    const sr_kernel *k = o->kf;
    int fd = k->fdim, K = k->k, comp = (int)(t % k->out_dim) % fd;
    int64_t row = t / k->out_dim, nred = c->axis == 1 ? c->ny : c->nx, base = row * k->out_dim;
    bool max = c->red == SR_MAX || c->red == SR_ARGMAX || c->red == SR_MAX_ARGMAX;
    bool kmin = nan_last_red(c->red);
    if (nred <= 0 || K > nred)
        return false;
    size_t nb = (size_t)nred * sizeof(double);
    double *lo = malloc(nb), *hi = malloc(nb), *slo = malloc(nb), *shi = malloc(nb);
    bool ok = lo && hi && slo && shi && pair_intervals(o, false, c, row, comp, nred, lo, hi);
    if (!ok)
        snprintf(why, cap, "pair by pair: no interval (a NaN or a class change)");
    /* Max is Min of -F. */
    for (int64_t j = 0; ok && max && j < nred; j++) {
        double l = lo[j];
        lo[j] = -hi[j];
        hi[j] = -l;
    }
    double prev = -INFINITY; /* the least ascending choice of the ranks' values so far */
    for (int q = 0; ok && q < K; q++) {
        int64_t s = base + (int64_t)q * fd + comp;
        double v = r->val ? (max ? -r->val[s] : r->val[s]) : NAN;
        if (r->val && isnan(v) && kmin)
            v = INFINITY; /* the K-min reductions order NaN last (pair_intervals) */
        if (r->idx) {
            int64_t g = r->idx[s];
            for (int q2 = 0; q2 < q && ok; q2++)
                ok = r->idx[base + (int64_t)q2 * fd + comp] != g;
            if (!ok || g < 0 || g >= nred) {
                snprintf(why, cap, "pair by pair: rank %d index %lld repeated or out of range", q,
                         (long long)g);
                ok = false;
                break;
            }
            double pick = r->val ? v : fmax(prev, lo[g]);
            if (!(pick >= prev && pick >= lo[g] && pick <= hi[g])) {
                snprintf(why, cap,
                         "pair by pair: rank %d value %.9g at index %lld outside its pair's "
                         "[%.9g, %.9g] or below the rank before (%.9g)",
                         q, max ? -pick : pick, (long long)g, max ? -hi[g] : lo[g],
                         max ? -lo[g] : hi[g], max ? -prev : prev);
                ok = false;
            }
            prev = pick;
        } else {
            if (q == 0) {
                memcpy(slo, lo, nb);
                memcpy(shi, hi, nb);
                qsort(slo, (size_t)nred, sizeof *slo, cmp_double);
                qsort(shi, (size_t)nred, sizeof *shi, cmp_double);
            }
            if (!(v >= prev && v >= slo[q] && v <= shi[q])) {
                snprintf(why, cap,
                         "pair by pair: rank %d value %.9g outside [%.9g, %.9g] (the range of "
                         "the rank's order statistic) or below the rank before",
                         q, max ? -v : v, max ? -shi[q] : slo[q], max ? -slo[q] : shi[q]);
                ok = false;
            }
            prev = v;
        }
    }
    /* With indices: every pair not picked may lie at or above the K-th value. */
    for (int64_t j = 0; ok && r->idx && j < nred; j++) {
        bool picked = false;
        for (int q = 0; q < K && !picked; q++)
            picked = r->idx[base + (int64_t)q * fd + comp] == j;
        if (!picked && hi[j] < prev) {
            snprintf(why, cap,
                     "pair by pair: index %lld not picked, but its F (%.9g at most) is %s than "
                     "the value picked at rank %d (%.9g)",
                     (long long)j, max ? -lo[j] : hi[j], max ? "larger" : "smaller", K - 1,
                     max ? -prev : prev);
            ok = false;
        }
    }
    free(lo);
    free(hi);
    free(slo);
    free(shi);
    return ok;
}

/* log Σ exp(x) over n values, with the max shift (an infinite max is the result). */
static double lse_of(const double *x, int64_t n)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++)
        m = fmax(m, x[j]);
    if (isinf(m))
        return m;
    for (int64_t j = 0; j < n; j++)
        s += exp(x[j] - m);
    return m + log(s);
}

/*
 * LogSumExp's output t checked pair by pair: it grows with every term, so whatever values in
 * their pairs' intervals (pair_intervals) a correct computation gives F, it lies between
 * LogSumExp of the intervals' bottoms and of their tops, give or take the rounding of the sum
 * of exponentials ((n + 64) eps relative, so absolute after the log) and of the result.
 */
static bool lse_ok(const struct oracle *o, const struct fz_case *c, const struct result *r,
                   int64_t t, char *why, size_t cap)
{
    int64_t nred = c->axis == 1 ? c->ny : c->nx, row = t / o->kf->out_dim;
    int comp = (int)(t % o->kf->out_dim);
    size_t nb = (size_t)(nred > 0 ? nred : 1) * sizeof(double);
    double *lo = malloc(nb), *hi = malloc(nb);
    bool ok = nred > 0 && lo && hi && pair_intervals(o, false, c, row, comp, nred, lo, hi);
    if (!ok) {
        snprintf(why, cap, "pair by pair: no interval (a NaN or a class change)");
    } else {
        double a = lse_of(lo, nred), b = lse_of(hi, nred), v = r->val[t];
        double slack = o->rel * (1 + fmax(fabs(a), fabs(b)));
        ok = isfinite(a) && isfinite(b) && v >= a - slack && v <= b + slack;
        if (!ok)
            snprintf(why, cap, "pair by pair: %.9g outside [%.9g, %.9g]", v, a - slack, b + slack);
    }
    free(lo);
    free(hi);
    return ok;
}

/* Ascending order of the indices in ord by keys[index]; NaN keys last. */
static int cmp_by_key(const void *a, const void *b, void *keys)
{
    const double *key = keys;
    double x = key[*(const int64_t *)a], y = key[*(const int64_t *)b];
    if (isnan(x) || isnan(y))
        return isnan(x) - isnan(y);
    return x < y ? -1 : x > y;
}

/* The largest softmax average Σ w g / Σ w with each weight w_j in [wlo_j, whi_j] and the
 * values g_j fixed, ord the pairs by increasing g: the optimum gives the top weight to the
 * pairs whose g is above it and the bottom one to the others, so it is one of the n + 1
 * suffixes of ord at the top weights. */
double fz_softmax_top(const double *g, const double *wlo, const double *whi, const int64_t *ord,
                      int64_t n)
{
    double num = 0, den = 0, best = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        num += wlo[j] * g[j];
        den += wlo[j];
    }
    for (int64_t q = 0; q <= n; q++) {
        if (den > 0)
            best = fmax(best, num / den);
        if (q < n) {
            int64_t j = ord[n - 1 - q];
            num += (whi[j] - wlo[j]) * g[j];
            den += whi[j] - wlo[j];
        }
    }
    return best;
}

/*
 * SumSoftMaxWeight's output t (component comp of G) checked pair by pair: with F and G in
 * their pairs' intervals (pair_intervals, G's from the weight kernels), the weights exp(F - m)
 * lie in [exp(lo - m), exp(hi - m)] and the output between the least and the largest softmax
 * average over those boxes (softmax_top, of G's tops and of minus G's bottoms), give or take
 * the rounding of the sums ((n + 64) eps of the largest |G|). Only rows where every F and G is
 * finite are judged (the others have the NaN rules of docs/semantics.md).
 */
static bool ssmw_ok(const struct oracle *o, const struct fz_case *c, const struct result *r,
                    int64_t t, char *why, size_t cap)
{
    int64_t nred = c->axis == 1 ? c->ny : c->nx, row = t / o->kf->out_dim;
    int comp = (int)(t % o->kf->out_dim);
    size_t nb = (size_t)(nred > 0 ? nred : 1) * sizeof(double);
    double *lo = malloc(nb), *hi = malloc(nb), *glo = malloc(nb), *ghi = malloc(nb);
    double *wlo = malloc(nb), *whi = malloc(nb);
    int64_t *ord = malloc((size_t)(nred > 0 ? nred : 1) * sizeof *ord);
    bool ok = nred > 0 && lo && hi && glo && ghi && wlo && whi && ord &&
              pair_intervals(o, false, c, row, 0, nred, lo, hi) &&
              pair_intervals(o, true, c, row, comp, nred, glo, ghi);
    double m = -INFINITY, gmax = 0;
    for (int64_t j = 0; ok && j < nred; j++) {
        ok = isfinite(lo[j]) && isfinite(hi[j]) && isfinite(glo[j]) && isfinite(ghi[j]);
        m = fmax(m, hi[j]);
        gmax = fmax(gmax, fmax(fabs(glo[j]), fabs(ghi[j])));
    }
    if (!ok) {
        snprintf(why, cap, "pair by pair: no interval (a NaN, an infinity or a class change)");
    } else {
        for (int64_t j = 0; j < nred; j++) {
            wlo[j] = exp(lo[j] - m);
            whi[j] = exp(hi[j] - m);
            ord[j] = j;
        }
        qsort_r(ord, (size_t)nred, sizeof *ord, cmp_by_key, ghi);
        double top = fz_softmax_top(ghi, wlo, whi, ord, nred);
        for (int64_t j = 0; j < nred; j++) {
            glo[j] = -glo[j];
            ord[j] = j;
        }
        qsort_r(ord, (size_t)nred, sizeof *ord, cmp_by_key, glo);
        double bottom = -fz_softmax_top(glo, wlo, whi, ord, nred);
        double slack = o->rel * gmax, v = r->val[t];
        ok = v >= bottom - slack && v <= top + slack;
        if (!ok)
            snprintf(why, cap, "pair by pair: %.9g outside [%.9g, %.9g]", v, bottom - slack,
                     top + slack);
    }
    free(lo);
    free(hi);
    free(glo);
    free(ghi);
    free(wlo);
    free(whi);
    free(ord);
    return ok;
}

/* Output t of r checked pair by pair, for the reductions that pick or weigh pairs by F's
 * values (docs/fuzzing.md, "Outputs checked pair by pair"): false with why empty for the
 * others. */
static bool pairwise_ok(const struct oracle *o, const struct fz_case *c, const struct result *r,
                        int64_t t, char *why, size_t cap)
{
    why[0] = '\0';
    if (is_selection(c->red))
        return selection_ok(o, c, r, t, why, cap);
    if (c->red == SR_LOGSUMEXP && r->val)
        return lse_ok(o, c, r, t, why, cap);
    if (c->red == SR_SUMSOFTMAXWEIGHT && r->val && o->kg)
        return ssmw_ok(o, c, r, t, why, cap);
    return false;
}

/* Testing the fuzzer itself (fz_opts.inject_selection): a selection that is wrong by one rank.
 * Every output row and component of r gets, at rank q, the pair of rank q + 1 in the oracle's
 * order of F (the smallest is skipped; the largest for Max), with the oracle's F there as its
 * value: values consistent with their indices, the wrong pairs picked. */
static void inject_wrong_selection(const struct oracle *o, const struct fz_case *c,
                                   struct result *r)
{
    const sr_kernel *k = o->kf;
    int fd = k->fdim, K = k->k;
    int64_t nred = c->axis == 1 ? c->ny : c->nx, nout = r->nvals / k->out_dim;
    bool max = c->red == SR_MAX || c->red == SR_ARGMAX || c->red == SR_MAX_ARGMAX;
    double *f = malloc((size_t)(nred > 0 ? nred : 1) * (size_t)fd * sizeof *f);
    double *key = malloc((size_t)(nred > 0 ? nred : 1) * sizeof *key);
    int64_t *ord = malloc((size_t)(nred > 0 ? nred : 1) * sizeof *ord);
    for (int64_t row = 0; f && key && ord && K < nred && row < nout; row++) {
        if (!f_row(k, o->in, c, row, nred, f))
            break;
        for (int comp = 0; comp < fd; comp++) {
            for (int64_t j = 0; j < nred; j++) {
                key[j] = max ? -f[j * fd + comp] : f[j * fd + comp];
                ord[j] = j;
            }
            qsort_r(ord, (size_t)nred, sizeof *ord, cmp_by_key, key);
            for (int q = 0; q < K; q++) {
                int64_t s = row * k->out_dim + (int64_t)q * fd + comp;
                if (r->val)
                    r->val[s] = f[ord[q + 1] * fd + comp];
                if (r->idx)
                    r->idx[s] = ord[q + 1];
            }
        }
    }
    free(f);
    free(key);
    free(ord);
}

/* Compares r with the oracle; false with the first difference in why. */
static bool compare(const struct oracle *o, const struct fz_case *c, const struct result *r,
                    char *why, size_t cap, struct fz_stats *stats)
{
    if (r->st != o->ref.st) {
        snprintf(why, cap, "status %d (%.250s), oracle %d (%.250s)", r->st, r->msg, o->ref.st,
                 o->ref.msg);
        return false;
    }
    if (r->st != SR_OK)
        return true;
    int64_t ok_row = -1; /* the last row of a selection checked pair by pair, its components */
    uint64_t ok_comps = 0;
    for (int64_t t = 0; t < r->nvals; t++) {
        char w[512] = "";
        if (o->ref.val) {
            double tol;
            if (stats) {
                stats->outputs++;
                if (unstable_at(o, t, o->ref.val[t]))
                    stats->unstable_outputs++;
            }
            if (!value_ok(o, t, r->val[t], &tol)) {
                double pv[FZ_NPERT] = {NAN, NAN, NAN, NAN, NAN};
                for (int p = 0; p < o->npert; p++)
                    pv[p] = o->pert[p].val ? o->pert[p].val[t] : NAN;
                snprintf(w, sizeof w,
                         "value %lld: %.17g, oracle %.17g (tolerance %.3g; perturbed oracle "
                         "%.9g %.9g %.9g %.9g %.9g)",
                         (long long)t, r->val[t], o->ref.val[t], tol, pv[0], pv[1], pv[2], pv[3],
                         pv[4]);
            }
        }
        if (!w[0] && o->ref.idx) {
            char iw[256];
            if (!index_ok(o, c, t, r->idx[t], r->val ? r->val[t] : NAN, iw, sizeof iw))
                snprintf(w, sizeof w, "output %lld: %s", (long long)t, iw);
        }
        /* A selection (or a softmax) picks pairs by F's values: where they are rounding noise
         * that differs pair by pair, other picks than the oracle's are right when they are
         * consistent pair by pair. */
        char sw[256] = "";
        int64_t row = t / o->kf->out_dim;
        int comp = (int)(t % o->kf->out_dim) % o->kf->fdim;
        if (w[0] && stats)
            stats->pairwise++; /* accepted below, or the case fails */
        if (w[0] && row == ok_row && comp < 64 && (ok_comps >> comp & 1))
            continue; /* its row and component were checked pair by pair already */
        if (w[0] && !pairwise_ok(o, c, r, t, sw, sizeof sw)) {
            snprintf(why, cap, "%s%s%s", w, sw[0] ? "; " : "", sw);
            return false;
        }
        if (w[0] && is_selection(c->red) && comp < 64) { /* all its ranks were checked */
            ok_comps = row == ok_row ? ok_comps | 1ULL << comp : 1ULL << comp;
            ok_row = row;
        }
    }
    return true;
}

/* ---- running a case ------------------------------------------------------------------------- */

static void oracle_free(struct oracle *o)
{
    result_free(&o->ref);
    for (int p = 0; p < o->npert; p++)
        result_free(&o->pert[p]);
    for (int p = 0; p < FZ_NPERT; p++) {
        sr_kernel_free(o->pk[p]);
        sr_kernel_free(o->pkg[p]);
        inputs_free(&o->pin[p]);
    }
    sr_kernel_free(o->kg);
    for (int p = 0; p < FZ_NWIDE; p++) {
        sr_kernel_free(o->wk[p]);
        sr_kernel_free(o->wkg[p]);
        inputs_free(&o->win[p]);
    }
    free(o->scale);
}

/* The scale kernel's reduction and formulas: sum |F| for Sum, max |F| for LogSumExp, the
 * softmax average of |G| for SumSoftMaxWeight; none for Min/Max/KMin (|value| is the scale). */
static void scale_of(struct built *b, const struct fz_case *c, struct oracle *o)
{
    sr_expr *f = b->f, *w = b->w;
    sr_reduction red;
    switch (c->red) {
    case SR_SUM:
        red = SR_SUM;
        f = sr_abs(b->ctx, f);
        break;
    case SR_LOGSUMEXP:
        red = SR_MAX;
        f = sr_abs(b->ctx, f);
        break;
    case SR_SUMSOFTMAXWEIGHT:
        red = SR_SUMSOFTMAXWEIGHT;
        w = sr_abs(b->ctx, w);
        break;
    default:
        return;
    }
    sr_status st;
    sr_kernel *k = kernel_of(b, f, w, red, SR_DEVICE_REFERENCE, false, NULL, &st, NULL, 0);
    if (!k)
        return;
    struct result r;
    run_kernel(k, c, o->in, &r);
    if (r.st == SR_OK && r.val) {
        o->scale = r.val;
        r.val = NULL;
    }
    result_free(&r);
    sr_kernel_free(k);
}

static void count_ops(const sr_expr *e, struct fz_stats *stats, bool *seen)
{
    if (!e || !stats)
        return;
    size_t n = expr_toposort(e, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return;
    expr_toposort(e, order, n);
    for (size_t t = 0; t < n; t++)
        if (order[t]->op < 128 && !seen[order[t]->op]) {
            seen[order[t]->op] = true;
            stats->op_used[order[t]->op]++;
        }
    free(order);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CUDA source of kernel k (its simplified formula), compiled by NVRTC. */
static bool nvrtc_check(const sr_kernel *k, char *why, size_t cap, struct fz_stats *stats)
{
    const struct nvrtc_api *nv;
    const char *reason;
    if (jit_nvrtc_get(&nv, &reason) != SR_OK) {
        if (stats)
            stats->nvrtc_unavailable++;
        return true;
    }
    int acc = k->acc != SR_ACC_DEFAULT ? k->acc - 1 : JIT_ACC_BLOCK;
    struct expr_buf b = {0};
    struct cuda_plan plan;
    sr_status st = jit_emit_cuda(k, (enum jit_acc)acc, &b, &plan);
    if (st == SR_ENOTSUP) {
        if (stats)
            stats->cuda_enotsup++;
        free(b.data);
        return true;
    }
    if (st != SR_OK) {
        snprintf(why, cap, "jit_emit_cuda: status %d", st);
        free(b.data);
        return false;
    }
    struct nvrtc_out out;
    memset(&out, 0, sizeof out);
    st = jit_nvrtc_compile(b.data, "fuzz.cu", "compute_80", false, &out);
    bool ok = st == SR_OK;
    if (!ok)
        snprintf(why, cap, "NVRTC compile failed (status %d): %.400s", st, out.log ? out.log : "");
    free(out.image);
    free(out.log);
    free(b.data);
    return ok;
}

static bool run_case(const struct fz_case *c, const struct fz_opts *opt, struct fz_stats *stats,
                     char *why, size_t cap, int *failed_variant, int only)
{
    why[0] = '\0';
    if (failed_variant)
        *failed_variant = -1;
    char threads[16];
    snprintf(threads, sizeof threads, "%d", c->threads);
    struct built b;
    memset(&b, 0, sizeof b);
    sr_status st = sr_ctx_new(&b.ctx);
    if (st != SR_OK) {
        snprintf(why, cap, "sr_ctx_new failed");
        return false;
    }
    sr_ctx_set_option(b.ctx, "SYMRED_NUM_THREADS", c->threads > 0 ? threads : NULL);
    /* The JIT variants check compiled code: a kernel's module is built by sr_kernel_new, not in
     * the background while the tile interpreter serves the calls (the tile variant checks that
     * tier on its own). */
    sr_ctx_set_option(b.ctx, "SYMRED_JIT", "sync");
    bool ok = true;
    sr_kernel *kr = NULL;
    struct oracle o;
    memset(&o, 0, sizeof o);
    struct inputs in;
    memset(&in, 0, sizeof in);
    b.d = sr_kernel_desc_default();
    b.d.reduction = c->red;
    b.d.axis = c->axis;
    b.d.k = c->k;
    /* The oracle of a float16 or bfloat16 case: float32 kernels on the same values */
    const sr_dtype odt = c->dtype == SR_F64 ? SR_F64 : SR_F32;
    struct inputs hin; /* the case's arrays in its 16-bit dtype, for the backends */
    memset(&hin, 0, sizeof hin);
    b.d.dtype = odt;
    b.d.acc = c->acc;
    if (sr_parse(b.ctx, c->formula, NULL, 0, &b.f) != SR_OK ||
        (c->weight[0] && sr_parse(b.ctx, c->weight, NULL, 0, &b.w) != SR_OK)) {
        snprintf(why, cap, "the case does not parse: %s", sr_ctx_error(b.ctx));
        ok = false;
        goto done;
    }
    char msg[512];
    kr = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_REFERENCE, false, NULL, &st, msg, sizeof msg);
    if (!kr || !inputs_make(c, kr, odt, 0, false, &in) ||
        (odt != c->dtype && !inputs_make(c, kr, c->dtype, 0, false, &hin))) {
        if (stats)
            stats->skipped++;
        goto done;
    }
    bool seen[128] = {false};
    count_ops(b.f, stats, seen);
    count_ops(b.w, stats, seen);
    o.kf = kr;
    o.in = &in;
    run_kernel(kr, c, &in, &o.ref);
    round_result(c->dtype, &o.ref);
    o.out_ulp = c->dtype == SR_F16 ? 0x1p-10 : c->dtype == SR_BF16 ? 0x1p-7 : 0;
    o.out_tiny = c->dtype == SR_F16 ? 0x1p-24 : 0;
    double eps = c->dtype == SR_F64 ? DBL_EPSILON : FLT_EPSILON;
    int64_t nred = c->axis == 1 ? c->ny : c->nx;
    /* Rounding error bound in units of eps times the scale: recursive summation of nred terms
     * (Higham's gamma_n), plus a few roundings per formula node and libm's last-place errors. */
    o.rel = (double)(nred + 64) * eps;
    o.range_limit = c->dtype != SR_F64 ? FLT_MAX / 4 : 0;
    o.nterms = (double)nred + 1;
    if (o.ref.st == SR_OK) {
        scale_of(&b, c, &o);
        sr_status gst;
        if (b.w)
            o.kg =
                kernel_of(&b, b.w, NULL, SR_SUM, SR_DEVICE_REFERENCE, false, NULL, &gst, NULL, 0);
        /* The oracle on perturbed inputs, constants and nodes: up, down, random signs, and
         * towards zero (where a sum that cancels may land, whatever its rounding). */
        const double pert[FZ_NPERT][4] = {
            {8, 0, 0, 0}, {-8, 0, 0, 0}, {8, 1, 0, 0}, {-8, 0, 1, 0}, {0, 0, 0, 1}};
        for (int p = 0; p < FZ_NPERT; p++) {
            uint64_t signs = c->input_seed + (uint64_t)p, *sp = pert[p][1] != 0 ? &signs : NULL;
            bool tz = pert[p][2] != 0, f32 = pert[p][3] != 0;
            if (f32 && c->dtype == SR_F64)
                continue;
            double flush = tz ? (c->dtype != SR_F64 ? 1.7e-38 : 3.4e-308) : 0;
            sr_expr *pf = perturb_formula(b.ctx, b.f, pert[p][0] * eps, sp, tz, f32, flush);
            sr_expr *pw =
                b.w ? perturb_formula(b.ctx, b.w, pert[p][0] * eps, sp, tz, f32, flush) : NULL;
            sr_status pst;
            sr_kernel *kp = pf ? kernel_of(&b, pf, b.w ? pw : NULL, c->red, SR_DEVICE_REFERENCE,
                                           false, NULL, &pst, NULL, 0)
                               : NULL;
            if (kp && inputs_make(c, kp, odt, pert[p][0], pert[p][1] != 0, &o.pin[p])) {
                run_kernel(kp, c, &o.pin[p], &o.pert[o.npert]);
                round_result(c->dtype, &o.pert[o.npert++]);
            }
            o.pk[p] = kp;
            if (pw)
                o.pkg[p] = kernel_of(&b, pw, NULL, SR_SUM, SR_DEVICE_REFERENCE, false, NULL, &pst,
                                     NULL, 0);
        }
        /* For the values at a pair only (pair_intervals): up, down and random signs again,
         * FZ_K_SPREAD times as large. */
        for (int p = 0; p < FZ_NWIDE; p++) {
            double rel = pert[p][0] * FZ_K_SPREAD;
            uint64_t signs = c->input_seed + (uint64_t)p, *sp = pert[p][1] != 0 ? &signs : NULL;
            sr_expr *pf = perturb_formula(b.ctx, b.f, rel * eps, sp, false, false, 0);
            sr_expr *pw = b.w ? perturb_formula(b.ctx, b.w, rel * eps, sp, false, false, 0) : NULL;
            sr_status pst;
            if (!pf || (b.w && !pw))
                continue;
            o.wk[p] =
                kernel_of(&b, pf, pw, c->red, SR_DEVICE_REFERENCE, false, NULL, &pst, NULL, 0);
            if (o.wk[p] && !inputs_make(c, o.wk[p], odt, rel, pert[p][1] != 0, &o.win[p])) {
                sr_kernel_free(o.wk[p]);
                o.wk[p] = NULL;
            }
            if (pw)
                o.wkg[p] = kernel_of(&b, pw, NULL, SR_SUM, SR_DEVICE_REFERENCE, false, NULL, &pst,
                                     NULL, 0);
        }
    }

    for (int v = 0; v < FZ_NVARIANTS && ok; v++) {
        if (only >= 0 && v != only)
            continue;
        sr_kernel *k = NULL;
        st = SR_OK;
        msg[0] = '\0';
        b.d.dtype = c->dtype; /* the backends under test run the case's dtype */
        switch (v) {
        case FZ_REF_SIMP:
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_REFERENCE, true, NULL, &st, msg,
                          sizeof msg);
            break;
        case FZ_JIT:
        case FZ_JIT_SIMP:
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_CPU, v == FZ_JIT_SIMP, NULL, &st, msg,
                          sizeof msg);
            /* The JIT hands a formula to the reference only when no C compiler can be
             * started (wide and large formulas run in the direct strategy's loop mode):
             * counted, not a failure (test-fuzz-regress checks that drawn formulas plan onto
             * generated code). */
            if (k && strcmp(k->backend->name, "cpu-jit") != 0 && stats)
                stats->jit_fallback++;
            break;
        case FZ_GEMM:
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_CPU, true, "on", &st, msg, sizeof msg);
            if (k && k->backend != &cpu_gemm_backend) {
                sr_kernel_free(k);
                continue; /* the formula has not the shape: not applicable */
            }
            if (stats && k)
                stats->gemm_shaped++;
            break;
        case FZ_TILE: {
            /* Tier 0: the kernel the tile interpreter serves while a module compiles, or where
             * there is no compiler; every drawn formula must run there. */
            sr_ctx_set_option(b.ctx, "SYMRED_JIT", "off");
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_CPU, true, NULL, &st, msg, sizeof msg);
            sr_ctx_set_option(b.ctx, "SYMRED_JIT", "sync");
            sr_plan_info pi = {.size = sizeof pi};
            if (k &&
                (sr_kernel_plan(k, &pi) != SR_OK || pi.tier != 0 || pi.device != SR_DEVICE_CPU)) {
                snprintf(why, cap, "%s: the kernel is not served by the tile interpreter (%s)",
                         fz_variant_names[v], pi.backend ? pi.backend : "no plan");
                ok = false;
            }
            break;
        }
        case FZ_NVRTC:
            if (!opt->cuda)
                continue;
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_REFERENCE, true, NULL, &st, msg,
                          sizeof msg);
            if (k && !nvrtc_check(k, why, cap, stats))
                ok = false;
            sr_kernel_free(k);
            if (stats)
                stats->variants[v]++;
            if (!ok && failed_variant)
                *failed_variant = v;
            continue;
        case FZ_CUDA:
            if (!opt->cuda || !jit_cuda_available())
                continue;
            k = kernel_of(&b, b.f, b.w, c->red, SR_DEVICE_CUDA, true, NULL, &st, msg, sizeof msg);
            /* The CUDA backend declines what its emitter declines (the K-reduction state or the
             * tile's columns too large): SR_ENOTSUP, as documented, not a failure. */
            if (!k && st == SR_ENOTSUP && strstr(msg, "does not fit the direct CUDA strategy")) {
                if (stats)
                    stats->cuda_enotsup++;
                continue;
            }
            break;
        default:
            continue;
        }
        b.d.dtype = odt;
        if (stats)
            stats->variants[v]++;
        if (ok && !k) {
            snprintf(why, cap, "%s: sr_kernel_new failed (status %d): %.300s", fz_variant_names[v],
                     st, msg);
            ok = false;
        }
        struct result sref;
        memset(&sref, 0, sizeof sref);
        sr_kernel *ks = NULL;
        o.simp = NULL;
        if (ok && (v == FZ_JIT_SIMP || v == FZ_GEMM || v == FZ_TILE || v == FZ_CUDA) &&
            has_nonfinite(&o.ref)) {
            sr_status sst;
            if (k->simp.post) {
                if (rewrite_reference(&b, k, c, &in, &sref))
                    o.simp = &sref;
            } else if ((ks = kernel_of(&b, k->f, k->weight, c->red, SR_DEVICE_REFERENCE, false,
                                       NULL, &sst, NULL, 0))) {
                run_kernel(ks, c, &in, &sref);
                if (sref.st == SR_OK)
                    o.simp = &sref;
            }
            round_result(c->dtype, &sref);
        }
        if (ok) {
            struct result r;
            run_kernel(k, c, odt != c->dtype ? &hin : &in, &r);
            if (opt->inject && v == FZ_JIT_SIMP && r.st == SR_OK && r.nvals > 0) {
                if (r.val)
                    r.val[0] = isfinite(r.val[0]) ? r.val[0] * 1.01 + 0.01 : 0.5;
                if (r.idx)
                    r.idx[0] = r.idx[0] == 0 ? -1 : 0;
            }
            if (opt->inject_selection && v == FZ_JIT_SIMP && r.st == SR_OK && is_selection(c->red))
                inject_wrong_selection(&o, c, &r);
            char w[700];
            if (!compare(&o, c, &r, w, sizeof w, v == FZ_JIT_SIMP ? stats : NULL)) {
                snprintf(why, cap, "%s: %s", fz_variant_names[v], w);
                ok = false;
            }
            result_free(&r);
        }
        if (!ok && failed_variant)
            *failed_variant = v;
        o.simp = NULL;
        result_free(&sref);
        sr_kernel_free(ks);
        sr_kernel_free(k);
    }

done:
    inputs_free(&in);
    inputs_free(&hin);
    oracle_free(&o);
    sr_kernel_free(kr);
    sr_ctx_free(b.ctx);
    return ok;
}

bool fz_case_run(const struct fz_case *c, const struct fz_opts *o, struct fz_stats *stats,
                 char *why, size_t whycap, int *failed_variant)
{
    if (stats)
        stats->cases++;
    int only = -1;
    for (int v = 0; o->variant && v < FZ_NVARIANTS; v++)
        if (strcmp(o->variant, fz_variant_names[v]) == 0)
            only = v;
    bool ok = run_case(c, o, stats, why, whycap, failed_variant, only);
    if (!ok && stats)
        stats->failed++;
    return ok;
}

/* ---- shrinking ------------------------------------------------------------------------------ */

/* e with every occurrence of target replaced by repl; NULL when an op no longer fits. */
static sr_expr *replace(sr_ctx *ctx, const sr_expr *e, const sr_expr *target, sr_expr *repl)
{
    if (e == target)
        return repl;
    if (expr_arity(e) == 0)
        return (sr_expr *)e;
    sr_expr *kids[EXPR_MAX_ARITY] = {NULL, NULL, NULL};
    for (int i = 0; i < expr_arity(e); i++)
        if (!(kids[i] = replace(ctx, e->child[i], target, repl)))
            return NULL;
    return expr_make(ctx, (enum expr_op)e->op, kids, e->iattr, e->dim, e->fattr);
}

static bool still_fails(const struct fz_case *c, const struct fz_opts *o, int variant)
{
    char why[1024];
    struct fz_opts q = *o;
    q.log = NULL;
    return !run_case(c, &q, NULL, why, sizeof why, NULL, variant);
}

/* Tries the smaller formulas obtained by replacing one node of the formula (weight when
 * weight is set) by one of its operands, a variable of its dimension or a constant. */
static bool shrink_formula(struct fz_case *c, const struct fz_opts *o, int variant, bool weight,
                           double deadline)
{
    char *text = weight ? c->weight : c->formula;
    size_t textcap = weight ? sizeof c->weight : sizeof c->formula;
    if (!text[0])
        return false;
    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return false;
    sr_expr *f = NULL;
    bool progress = false;
    if (sr_parse(ctx, text, NULL, 0, &f) != SR_OK) {
        sr_ctx_free(ctx);
        return false;
    }
    size_t n = expr_toposort(f, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) {
        sr_ctx_free(ctx);
        return false;
    }
    expr_toposort(f, order, n);
    /* Variables of the formula, to stand in for a node of their dimension. */
    const sr_expr *vars[16];
    int nv = 0;
    for (size_t t = 0; t < n && nv < 16; t++)
        if (order[t]->op == OP_VAR)
            vars[nv++] = order[t];
    /* From the root down: replacing a big node first saves the most. */
    for (size_t t = n; t-- > 0 && !progress && now_s() < deadline;) {
        const sr_expr *e = order[t];
        if (expr_arity(e) == 0)
            continue;
        sr_expr *cands[EXPR_MAX_ARITY + 18];
        int nc = 0;
        for (int i = 0; i < expr_arity(e); i++)
            cands[nc++] = e->child[i];
        for (int v = 0; v < nv; v++)
            if (vars[v]->dim == e->dim)
                cands[nc++] = (sr_expr *)vars[v];
        if (e->dim == 1) {
            cands[nc++] = sr_const(ctx, 1.0);
            cands[nc++] = sr_const(ctx, 0.0);
        }
        for (int i = 0; i < nc && !progress; i++) {
            sr_expr *g = cands[i] ? replace(ctx, f, e, cands[i]) : NULL;
            if (!g || g == f || g->dim != f->dim)
                continue;
            struct fz_case trial = *c;
            char *tt = weight ? trial.weight : trial.formula;
            if (sr_expr_print(g, tt, textcap) >= textcap)
                continue;
            if (still_fails(&trial, o, variant)) {
                *c = trial;
                progress = true;
            }
        }
    }
    free(order);
    sr_ctx_free(ctx);
    return progress;
}

static bool shrink_scalars(struct fz_case *c, const struct fz_opts *o, int variant)
{
    struct fz_case trial;
    int64_t *sizes[2] = {&c->nx, &c->ny};
    for (int s = 0; s < 2; s++) {
        const int64_t tries[] = {1, 2, 3, *sizes[s] / 2};
        for (int i = 0; i < 4; i++) {
            if (tries[i] >= *sizes[s] || tries[i] < 1)
                continue;
            trial = *c;
            *(s ? &trial.ny : &trial.nx) = tries[i];
            if (sr_reductions[trial.red].uses_k) {
                int64_t nred = trial.axis == 1 ? trial.ny : trial.nx;
                if (trial.k > nred)
                    continue;
            }
            if (still_fails(&trial, o, variant)) {
                *c = trial;
                return true;
            }
        }
    }
    for (int v = 0; v < 16 && c->inputs[v]; v++) {
        const char simpler[] = {'G', 'U'};
        for (int i = 0; i < 2; i++) {
            if (c->inputs[v] == simpler[i] || (c->inputs[v] == 'U' && simpler[i] == 'G'))
                continue;
            trial = *c;
            trial.inputs[v] = simpler[i];
            if (still_fails(&trial, o, variant)) {
                *c = trial;
                return true;
            }
        }
    }
    if (c->acc != SR_ACC_DEFAULT || c->threads != 1) {
        trial = *c;
        trial.acc = SR_ACC_DEFAULT;
        trial.threads = 1;
        if (still_fails(&trial, o, variant)) {
            *c = trial;
            return true;
        }
    }
    return false;
}

int fz_case_shrink(struct fz_case *c, const struct fz_opts *o, int variant)
{
    double deadline = now_s() + (o->shrink_s > 0 ? o->shrink_s : 60);
    int steps = 0;
    while (now_s() < deadline) {
        bool p = shrink_formula(c, o, variant, false, deadline) ||
                 shrink_formula(c, o, variant, true, deadline) || shrink_scalars(c, o, variant);
        if (!p)
            break;
        steps++;
    }
    return steps;
}

/* ---- printing ------------------------------------------------------------------------------- */

static const char *const red_ids[] = {
#define FZ_RED_ID_(name, keops) "SR_" #name,
    SR_REDUCTION_MAP(FZ_RED_ID_)
#undef FZ_RED_ID_
};

void fz_case_print(FILE *f, const struct fz_case *c)
{
    static const char *const dtype_ids[] = {"SR_F32", "SR_F64", "SR_F16", "SR_BF16"};
    static const char *const accs[] = {"SR_ACC_DEFAULT", "SR_ACC_BLOCK", "SR_ACC_KAHAN",
                                       "SR_ACC_F64"};
    fprintf(f, "X(name, \"%s\", \"%s\", %s, %d, %d, %s, %s, %lld, %lld, \"%s\", 0x%llxULL, %d)\n",
            c->formula, c->weight, red_ids[c->red], c->axis, c->k, dtype_ids[c->dtype],
            accs[c->acc], (long long)c->nx, (long long)c->ny, c->inputs,
            (unsigned long long)c->input_seed, c->threads);
}

int fz_print_coverage(FILE *f)
{
    int missing = 0, generic = 0, entry = 0, leaf = 0;
    for (int op = 0; op < OP_COUNT; op++) {
        const char *reason;
        switch (fz_op_coverage(op, &reason)) {
        case FZ_GENERIC:
            generic++;
            break;
        case FZ_ENTRY:
            entry++;
            break;
        case FZ_LEAF:
            leaf++;
            break;
        case FZ_EXCLUDED:
            fprintf(f, "fuzz-diff: op %s excluded: %s\n", expr_ops[op].name, reason);
            break;
        case FZ_MISSING:
            fprintf(f,
                    "fuzz-diff: op %s is NOT generated: it needs an entry in op_gens or "
                    "FZ_EXCLUDED_OPS (tests/fuzz.c)\n",
                    expr_ops[op].name);
            missing++;
            break;
        }
    }
    fprintf(f,
            "fuzz-diff: op table: %d ops: %d generated from the table alone, %d by op_gens "
            "entries, %d leaves, %d excluded, %d missing\n",
            OP_COUNT, generic, entry, leaf, OP_COUNT - generic - entry - leaf - missing, missing);
    return missing;
}
