/*
 * tile.c — the tile interpreter: tier 0 of the CPU, which serves any kernel at vector speed with
 * no compiler, while the JIT compiles (omp-runtime.c) or where there is none.
 *
 * The simplified formula (F and the weight, merged, in topological order) is split by what each
 * node depends on, as the JIT's emitter places it: constants and parameters (once per call), the
 * output row's terms (once per row), the reduced index's terms (once per tile, shared by a block
 * of rows) and the pair's (per row and tile). A thread takes a block of rb output rows at a time
 * and walks the reduced range in tiles of tj indices: it loads the tile's variables transposed
 * (component by component), evaluates the reduced-index nodes once, then for each row of the
 * block the pair nodes, one op over the whole tile at a time (tile-kern.h: vector loops compiled
 * for AVX-512, AVX2 or the baseline), and folds the tile of F into the row's reduction state.
 *
 * A few chains of elementwise ops run as one loop (fuse_chains), and a Sum of a product of two
 * tiles is folded as a dot product.
 *
 * Values are computed in the kernel's dtype like the compiled kernels, and reduced by the
 * family's operations on float64 state (cpu_red_ops, red-ops.c, the reference's rules): sums of a
 * tile are accumulated in float64 (32 running sums), Min, Max and the K-selections skip a tile that
 * cannot change the state, LogSumExp and SumSoftMaxWeight fold a tile through its maximum, and any
 * tile holding NaN or an infinity where those rules care goes element by element. With few output
 * rows and a long reduced range the threads split the reduced range and merge their states in
 * index order, so ties resolve to the lowest index as everywhere.
 */
#include "cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { ST_CONST, ST_OUTER, ST_INNER, ST_PAIR, NST };
static const char *const stage_names[NST] = {"constant", "per output row", "per reduced tile",
                                             "per pair"};

struct tile_node {
    const sr_expr *e;
    int stage;
    /* ST_CONST: first value in the call's constants; ST_OUTER: in a row's values; ST_INNER and
     * ST_PAIR: first tile row (a tile row holds tj values of one component). */
    int64_t off;
    int child[EXPR_MAX_ARITY];
    /* A squared norm of a reduced-index variable, computed from the variable's rows as they
     * are in memory: a variable read only that way is never loaded into the tile. */
    bool rowwise;
    /* A chain of elementwise ops ending at this node, run as one loop (enum tile_fuse): child
     * holds the chain's operands; the chain's inner nodes are dead (never evaluated). */
    int fuse;
    bool dead;
};

struct tile_prog {
    const struct tile_isa *isa;
    const char *isa_name;
    int64_t es; /* bytes per value */
    int n;
    struct tile_node *node;
    int *list[NST];
    int nlist[NST];
    int64_t ncst, nouter, nrows; /* constants, values per output row, tile rows */
    int f, w;                    /* node numbers of F and of the weight (-1: none) */
    int fdot[2];                 /* F = fdot[0] * fdot[1], folded as a dot product (-1: not) */
    int ext;                     /* the node read from the caller's tile (-1: none) */
    int tj_max;                  /* the widest tile of reduced indices */
    int64_t fcopy, wcopy, prow;  /* tile rows: F and the weight broadcast when they are not
                                    tiles (-1: they are), the softmax weights of a tile */
    int tj, rb;                  /* reduced indices per tile, output rows per block */
    int nscratch;                /* float64 scratch of the element-by-element ops */
    struct cpu_red_dims dims;    /* the reduction's state: its dims and operations */
    const struct cpu_red_ops *ops;
    int nsd, nsi, nsn;  /* per row state: doubles, indices, counts */
    int64_t state_b;    /* bytes of one row's state */
    int64_t odim;       /* values (and indices) per output row */
    int64_t per_thread; /* workspace bytes of one thread */
};

/* ---- the program ------------------------------------------------------------------------- */

/* The operands node nd reads: its op's, or its fused chain's. */
static int node_arity(const struct tile_node *nd)
{
    return nd->fuse == TILE_FUSE_EXP_NEG ? 1 : nd->fuse ? 2 : expr_arity(nd->e);
}

struct build {
    const sr_expr **order;
    int n, cap;
    int *at;            /* node id -> number + 1, 0 when not placed */
    const sr_expr *ext; /* placed without its operands */
};

static bool place(struct build *b, const sr_expr *e)
{
    if (b->at[e->id])
        return true;
    for (int c = 0; e != b->ext && c < expr_arity(e); c++)
        if (!place(b, e->child[c]))
            return false;
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        const sr_expr **o = realloc(b->order, (size_t)cap * sizeof *o);
        if (!o)
            return false;
        b->order = o;
        b->cap = cap;
    }
    b->order[b->n++] = e;
    b->at[e->id] = b->n;
    return true;
}

static int stage_of(const sr_expr *e, int axis)
{
    int red = axis == 1 ? DEP_J : DEP_I, outer = axis == 1 ? DEP_I : DEP_J;
    if (e->deps & red)
        return e->deps & outer ? ST_PAIR : ST_INNER;
    return e->deps & outer ? ST_OUTER : ST_CONST;
}

static uint32_t max_id(const sr_expr *e, uint32_t m)
{
    if (e->id > m)
        m = e->id;
    for (int c = 0; c < expr_arity(e); c++)
        m = max_id(e->child[c], m);
    return m;
}

void cpu_tile_free(struct tile_prog *t)
{
    if (!t)
        return;
    free(t->node);
    for (int s = 0; s < NST; s++)
        free(t->list[s]);
    free(t);
}

/* The tiles under the memory budget: tj from 256 down to 16 reduced indices, then rb from 64
 * output rows down to 1. false when even the smallest does not fit. */
static int64_t ws_bytes(const struct tile_prog *t, int tj, int rb)
{
    return t->nrows * tj * t->es + rb * (t->nouter * t->es + t->state_b) + t->ncst * t->es +
           (t->nscratch + 2 * t->odim) * 8 + 4 * 64;
}

static bool fit_tiles(struct tile_prog *t, int64_t lim)
{
    t->tj = 256;
    t->rb = 64;
    while (t->tj > 16 && t->tj / 2 >= t->tj_max)
        t->tj /= 2;
    while (lim > 0 && ws_bytes(t, t->tj, t->rb) > lim && t->tj > 16)
        t->tj /= 2;
    while (lim > 0 && ws_bytes(t, t->tj, t->rb) > lim && t->rb > 1)
        t->rb /= 2;
    t->per_thread = ws_bytes(t, t->tj, t->rb);
    return lim <= 0 || t->per_thread <= lim;
}

/* Fuses the elementwise chains that common kernels end in (exp(-(g d)), -(g d)), each into one
 * loop over the tile, and with fold_only a Sum of one component whose F is a product of two
 * tiles into a dot product of those tiles (F itself is then never formed). uses[i] counts the
 * readers of node i (F and the weight count as read); a node read elsewhere is never absorbed,
 * nor is the ext node or one computed row by row. */
static void fuse_chains(struct tile_prog *t, const sr_kernel *k, const int *uses, int ext,
                        bool fold_only)
{
    for (int i = 0; i < t->n; i++) {
        struct tile_node *nd = &t->node[i];
        int op = nd->e->op, c = nd->child[0];
        if (i == ext || nd->rowwise || (op != OP_EXP && op != OP_MINUS))
            continue;
        struct tile_node *cn = &t->node[c];
        if (uses[c] != 1 || c == ext || cn->rowwise)
            continue;
        int kind = TILE_FUSE_NONE;
        if (op == OP_MINUS && cn->e->op == OP_MUL && !cn->fuse)
            kind = TILE_FUSE_NEG_MUL;
        else if (op == OP_EXP && cn->e->op == OP_MUL && !cn->fuse)
            kind = TILE_FUSE_EXP_MUL;
        else if (op == OP_EXP && cn->fuse == TILE_FUSE_NEG_MUL)
            kind = TILE_FUSE_EXP_NEG_MUL;
        else if (op == OP_EXP && cn->e->op == OP_MINUS && !cn->fuse)
            kind = TILE_FUSE_EXP_NEG;
        if (kind == TILE_FUSE_NONE)
            continue;
        nd->fuse = kind;
        memcpy(nd->child, cn->child, sizeof nd->child);
        cn->dead = true;
    }
    const struct tile_node *fn = &t->node[t->f];
    if (fold_only && sr_reductions[k->red].family == SR_RED_FAM_SUM && k->fdim == 1 &&
        fn->e->op == OP_MUL && !fn->fuse && uses[t->f] == 1 && t->f != ext && !fn->rowwise &&
        t->node[fn->child[0]].stage >= ST_INNER && t->node[fn->child[1]].stage >= ST_INNER &&
        t->node[fn->child[0]].e->dim == 1 && t->node[fn->child[1]].e->dim == 1) {
        t->fdot[0] = fn->child[0];
        t->fdot[1] = fn->child[1];
        t->node[t->f].dead = true;
    }
}

static sr_status tile_new(const sr_kernel *k, const sr_expr *ext, int tj_max, bool fold_only,
                          struct tile_prog **out)
{
    *out = NULL;
    sr_ctx *ctx = k->ctx;
    struct tile_prog *t = calloc(1, sizeof *t);
    uint32_t mid = max_id(k->f, 0);
    if (k->weight)
        mid = max_id(k->weight, mid);
    struct build b = {NULL, 0, 0, calloc((size_t)mid + 1, sizeof(int)), ext};
    bool ok = t && b.at && place(&b, k->f) && (!k->weight || place(&b, k->weight));
    if (ok)
        t->node = calloc((size_t)b.n, sizeof *t->node);
    for (int s = 0; ok && s < NST; s++)
        ok = (t->list[s] = malloc((size_t)b.n * sizeof(int))) != NULL;
    if (!ok || !t->node) {
        free(b.order);
        free(b.at);
        cpu_tile_free(t);
        return sr__error(ctx, SR_ENOMEM, "tile interpreter: out of memory");
    }
    t->isa = cpu_tile_isa(k->dtype, &t->isa_name);
    t->es = (int64_t)sr_dtype_size(k->dtype);
    t->n = b.n;
    int maxdims = 0;
    for (int i = 0; i < b.n; i++) {
        const sr_expr *e = b.order[i];
        struct tile_node *nd = &t->node[i];
        nd->e = e;
        nd->stage = stage_of(e, k->axis);
        int dims = e->dim;
        for (int c = 0; c < expr_arity(e); c++) {
            nd->child[c] = b.at[e->child[c]->id] - 1;
            dims += e->child[c]->dim;
        }
        if (dims > maxdims)
            maxdims = dims;
        nd->rowwise = nd->stage == ST_INNER && e->op == OP_SQNORM2 && e->child[0]->op == OP_VAR;
    }
    t->f = b.at[k->f->id] - 1;
    t->w = k->weight ? b.at[k->weight->id] - 1 : -1;
    t->fdot[0] = t->fdot[1] = -1;
    int exti = ext ? b.at[ext->id] - 1 : -1;
    /* The reduced-index variables that some node reads from the tile. */
    bool *loaded = calloc((size_t)b.n, sizeof *loaded);
    int *uses = calloc((size_t)b.n, sizeof *uses);
    if (loaded && uses) {
        for (int i = 0; i < b.n; i++)
            for (int c = 0; i != exti && c < expr_arity(t->node[i].e); c++)
                uses[t->node[i].child[c]]++;
        uses[t->f]++;
        if (t->w >= 0)
            uses[t->w]++;
        fuse_chains(t, k, uses, exti, fold_only);
    }
    free(uses);
    if (!loaded) {
        free(b.order);
        free(b.at);
        cpu_tile_free(t);
        return sr__error(ctx, SR_ENOMEM, "tile interpreter: out of memory");
    }
    for (int i = 0; i < b.n; i++) {
        const struct tile_node *nd = &t->node[i];
        for (int c = 0; i != exti && !nd->rowwise && !nd->dead && c < node_arity(nd); c++)
            loaded[nd->child[c]] = true;
    }
    for (int q = 0; q < 2; q++)
        if (t->fdot[q] >= 0)
            loaded[t->fdot[q]] = true;
    if (!t->node[t->f].dead)
        loaded[t->f] = true;
    if (t->w >= 0)
        loaded[t->w] = true;
    for (int i = 0; i < b.n; i++) {
        const sr_expr *e = b.order[i];
        struct tile_node *nd = &t->node[i];
        /* The variables of the call and of the output row are read where they are, and so is a
         * reduced-index variable of one component (its values are a tile as they lie), the ext
         * node from the caller's tile: none takes room nor a place in the lists; nor does a
         * reduced-index variable that only squared norms read. */
        if (e == ext || nd->dead ||
            (e->op == OP_VAR && (nd->stage <= ST_OUTER || !loaded[i] || e->dim == 1)))
            continue;
        int64_t *slot = nd->stage == ST_CONST   ? &t->ncst
                        : nd->stage == ST_OUTER ? &t->nouter
                                                : &t->nrows;
        nd->off = *slot;
        *slot += e->dim;
        t->list[nd->stage][t->nlist[nd->stage]++] = i;
    }
    free(loaded);
    t->ext = exti;
    t->tj_max = tj_max > 0 ? tj_max : 256;
    free(b.order);
    free(b.at);
    t->nscratch = maxdims;
    /* F and the weight are folded as tiles: when one does not depend on the reduced index, it
     * is broadcast into tile rows of its own. SumSoftMaxWeight needs a row for its weights. */
    t->fcopy = t->wcopy = t->prow = -1;
    if (t->node[t->f].stage < ST_INNER) {
        t->fcopy = t->nrows;
        t->nrows += k->fdim;
    }
    if (t->w >= 0 && t->node[t->w].stage < ST_INNER) {
        t->wcopy = t->nrows;
        t->nrows += k->weight->dim;
    }
    if (t->w >= 0)
        t->prow = t->nrows++;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    t->dims = cpu_red_dims_of(k);
    t->ops = &cpu_red_ops[ri->family];
    t->nsd = (int)cpu_red_count(t->ops->nd, &t->dims);
    t->nsi = (int)cpu_red_count(t->ops->ni, &t->dims);
    t->nsn = (int)cpu_red_count(t->ops->nc, &t->dims);
    /* The float64 scratch also holds the softmax's weighted sums and one set of weights. */
    t->nscratch += 2 * t->dims.W;
    t->state_b = t->nsd * 8 + t->nsi * 8 + t->nsn * 4;
    t->state_b = (t->state_b + 7) / 8 * 8;
    t->odim = k->out_dim;
    if (!fit_tiles(t, k->budget)) {
        int64_t need = t->per_thread;
        cpu_tile_free(t);
        return sr__error(ctx, SR_EBUDGET,
                         "memory budget exceeded: the tile interpreter needs at least %lld bytes "
                         "of workspace (one thread, tiles of 16 reduced indices x 1 row), the "
                         "budget is %lld bytes (SYMRED_MEM_LIMIT or sr_ctx_set_mem_limit)",
                         (long long)need, (long long)k->budget);
    }
    *out = t;
    return SR_OK;
}

sr_status cpu_tile_new_ext(const sr_kernel *k, const sr_expr *ext, int tj_max,
                           struct tile_prog **out)
{
    return tile_new(k, ext, tj_max, false, out);
}

sr_status cpu_tile_new(const sr_kernel *k, struct tile_prog **out)
{
    return tile_new(k, NULL, 0, true, out);
}

/* ---- evaluation -------------------------------------------------------------------------- */

/* One thread's buffers. */
struct tile_frame {
    const sr_kernel *k;
    const struct tile_prog *t;
    const void *const *args;
    const char *cbuf; /* the call's constants (shared) */
    char *obuf;       /* rb rows of output-row values */
    char *tbuf;       /* the tile rows */
    double *scratch;  /* nscratch values */
    double *row;      /* one output row's values and indices, before they are stored */
    int64_t *row_idx;
    char *state;     /* rb rows of reduction state */
    int64_t o0;      /* the output row of row slot 0 */
    int64_t r0;      /* the reduced index of the tile's first element */
    int64_t nb;      /* rows begun (cpu_tile_begin) */
    const char *ext; /* the ext node's values for the row slot being evaluated */
    void *mem;
    char *cown; /* the constants of a frame made by cpu_tile_frame_new */
};

/* Where node i's values are for row slot s: component k at *p + k * *cs. */
static void *node_at(const struct tile_frame *fr, int i, int s, int64_t *cs)
{
    const struct tile_prog *t = fr->t;
    const struct tile_node *nd = &t->node[i];
    if (i == t->ext) {
        *cs = 0;
        return (void *)fr->ext;
    }
    if (nd->e->op == OP_VAR && (nd->stage <= ST_OUTER || nd->e->dim == 1)) {
        int64_t row = nd->stage == ST_OUTER   ? (fr->o0 + s) * nd->e->dim
                      : nd->stage == ST_CONST ? 0
                                              : fr->r0;
        *cs = 1;
        return (char *)fr->args[nd->e->iattr[0]] + row * t->es;
    }
    switch (nd->stage) {
    case ST_CONST:
        *cs = 1;
        return (char *)fr->cbuf + nd->off * t->es;
    case ST_OUTER:
        *cs = 1;
        return fr->obuf + ((int64_t)s * t->nouter + nd->off) * t->es;
    default:
        *cs = t->tj;
        return fr->tbuf + nd->off * t->tj * t->es;
    }
}

/* Loads variable e (node i) of the reduced index: indices [r0, r0 + n) transposed into tile rows.
 * (The other variables are read where they are, node_at.) */
static void load_var(const struct tile_frame *fr, int i, int64_t r0, int n)
{
    const struct tile_prog *t = fr->t;
    const sr_expr *e = t->node[i].e;
    int64_t cs, d = e->dim;
    char *dst = node_at(fr, i, 0, &cs);
    const char *a = fr->args[e->iattr[0]];
    /* In blocks of 16 components: each index's row is read a cache line at a time. */
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
        int64_t c1 = c0 + 16 < d ? c0 + 16 : d;
        if (t->es == 4) {
            const float *src = (const float *)a + r0 * d;
            float *o4 = (float *)dst;
            for (int u = 0; u < n; u++)
                for (int64_t c = c0; c < c1; c++)
                    o4[c * cs + u] = src[u * d + c];
        } else {
            const double *src = (const double *)a + r0 * d;
            double *o8 = (double *)dst;
            for (int u = 0; u < n; u++)
                for (int64_t c = c0; c < c1; c++)
                    o8[c * cs + u] = src[u * d + c];
        }
    }
}

/* Evaluates node i (not a variable) for row slot s over n elements (reduced indices from r0). */
static void eval_node(const struct tile_frame *fr, int i, int s, int64_t r0, int n)
{
    const struct tile_prog *t = fr->t;
    const struct tile_node *nd = &t->node[i];
    if (nd->rowwise) {
        int64_t ocs, d = nd->e->child[0]->dim;
        void *out = node_at(fr, i, s, &ocs);
        const char *a = (const char *)fr->args[nd->e->child[0]->iattr[0]] + r0 * d * t->es;
        for (int u = 0; u < n; u++) {
            const char *row = a + u * d * t->es;
            double q = t->isa->dot(row, row, (int)d);
            if (t->es == 4)
                ((float *)out)[u] = (float)q;
            else
                ((double *)out)[u] = q;
        }
        return;
    }
    struct tile_opnds opd = {{NULL, NULL, NULL}, {0, 0, 0}, {0, 0, 0}};
    for (int c = 0; c < node_arity(nd); c++) {
        int ch = nd->child[c];
        opd.p[c] = node_at(fr, ch, s, &opd.cs[c]);
        opd.es[c] = t->node[ch].stage >= ST_INNER;
        if (t->node[ch].e->dim == 1)
            opd.cs[c] = 0;
    }
    int64_t ocs;
    void *out = node_at(fr, i, s, &ocs);
    if (nd->fuse)
        t->isa->fused(nd->fuse, nd->e->dim, out, ocs, &opd, nd->stage >= ST_INNER ? n : 1);
    else
        t->isa->op(nd->e, out, ocs, &opd, nd->stage >= ST_INNER ? n : 1, fr->scratch);
}

static void eval_list(struct tile_frame *fr, int stage, int s, int64_t r0, int n)
{
    const struct tile_prog *t = fr->t;
    if (stage == ST_INNER)
        fr->r0 = r0;
    for (int q = 0; q < t->nlist[stage]; q++) {
        int i = t->list[stage][q];
        if (t->node[i].e->op == OP_VAR)
            load_var(fr, i, r0, n);
        else
            eval_node(fr, i, s, r0, n);
    }
}

/* Component c of node i (F or the weight) as a tile of n values for row slot s: the node's own
 * tile row, or its value broadcast into tile row copy + c. */
static const void *tile_of(const struct tile_frame *fr, int i, int64_t copy, int c, int s, int n)
{
    const struct tile_prog *t = fr->t;
    int64_t cs;
    char *p = node_at(fr, i, s, &cs);
    if (copy < 0)
        return p + c * cs * t->es;
    char *dst = fr->tbuf + (copy + c) * t->tj * t->es;
    const char *v = p + c * t->es;
    for (int u = 0; u < n; u++)
        memcpy(dst + u * t->es, v, (size_t)t->es);
    return dst;
}

/* ---- reduction state ----------------------------------------------------------------------
 * Row state at st: nsd doubles, then nsi indices, then nsn counts, reduced by the family's
 * operations (cpu_red_ops, red-ops.c). */

static struct cpu_red_row row_state(const struct tile_prog *t, char *base, int64_t s)
{
    char *p = base + s * t->state_b;
    return (struct cpu_red_row){(double *)p, (int64_t *)(p + t->nsd * 8),
                                (int *)(p + t->nsd * 8 + t->nsi * 8)};
}

/* What the family's tile fold reads: the frame and the row slot whose tile it is. */
struct fold_at {
    const struct tile_frame *fr;
    int s;
};

static const void *fold_comp(const struct cpu_red_tile *rt, int weight, int c)
{
    const struct fold_at *at = rt->ctx;
    const struct tile_prog *t = at->fr->t;
    return weight ? tile_of(at->fr, t->w, t->wcopy, c, at->s, rt->n)
                  : tile_of(at->fr, t->f, t->fcopy, c, at->s, rt->n);
}

/* Folds the tile of reduced indices [r0, r0 + n) of row slot s into its state. */
static void fold(const struct tile_frame *fr, struct cpu_red_row r, int s, int64_t r0, int n)
{
    const struct tile_prog *t = fr->t;
    struct fold_at at = {fr, s};
    struct cpu_red_tile rt = {
        .isa = t->isa,
        .es = (int)t->es,
        .n = n,
        .r0 = r0,
        .comp = fold_comp,
        .ctx = &at,
        .p = t->prow >= 0 ? fr->tbuf + t->prow * t->tj * t->es : NULL,
        .scratch = fr->scratch,
    };
    if (t->fdot[0] >= 0) {
        int64_t cs;
        rt.dot[0] = node_at(fr, t->fdot[0], s, &cs);
        rt.dot[1] = node_at(fr, t->fdot[1], s, &cs);
    }
    t->ops->tile(&t->dims, r, &rt);
}

/* Writes output row o from its state. */
static void state_final(const sr_kernel *k, const struct tile_prog *t, struct cpu_red_row r,
                        const sr_run_desc *run, int64_t o, double *row, int64_t *row_idx)
{
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    int64_t odim = k->out_dim;
    t->ops->finish(&t->dims, r, row, row_idx);
    if (ri->values) {
        if (t->es == 8)
            memcpy((double *)run->out + o * odim, row, (size_t)odim * sizeof *row);
        else
            for (int64_t u = 0; u < odim; u++)
                ((float *)run->out)[o * odim + u] = (float)row[u];
    }
    if (ri->indices)
        memcpy(run->out_idx + o * odim, row_idx, (size_t)odim * sizeof *row_idx);
}

/* Folds the reduced intervals iv[0 .. 2 niv) into the states (at st, one per row) of output rows
 * [o0, o0 + nb), nb <= rb; init: start from the empty state. */
static void fold_rows(struct tile_frame *fr, char *st, int64_t o0, int nb, const int64_t *iv,
                      int64_t niv, bool init)
{
    const struct tile_prog *t = fr->t;
    fr->o0 = o0;
    for (int s = 0; s < nb; s++) {
        eval_list(fr, ST_OUTER, s, 0, 1);
        if (init)
            t->ops->init(&t->dims, row_state(t, st, s));
    }
    for (int64_t q = 0; q < niv; q++)
        for (int64_t r0 = iv[2 * q]; r0 < iv[2 * q + 1]; r0 += t->tj) {
            int n = (int)(iv[2 * q + 1] - r0 < t->tj ? iv[2 * q + 1] - r0 : t->tj);
            eval_list(fr, ST_INNER, 0, r0, n);
            for (int s = 0; s < nb; s++) {
                eval_list(fr, ST_PAIR, s, r0, n);
                fold(fr, row_state(t, st, s), s, r0, n);
            }
        }
}

/* The output rows [o0, o1) over intervals iv, finished into the outputs. */
static void reduce_rows(struct tile_frame *fr, const sr_run_desc *run, int64_t o0, int64_t o1,
                        const int64_t *iv, int64_t niv)
{
    const struct tile_prog *t = fr->t;
    for (int64_t b = o0; b < o1; b += t->rb) {
        int nb = (int)(o1 - b < t->rb ? o1 - b : t->rb);
        fold_rows(fr, fr->state, b, nb, iv, niv, true);
        for (int s = 0; s < nb; s++)
            state_final(fr->k, t, row_state(t, fr->state, s), run, b + s, fr->row, fr->row_idx);
    }
}

/* A frame's bytes: tile rows, rows output rows' values, scratch, rb rows of state. */
static size_t frame_bytes(const sr_kernel *k, const struct tile_prog *t, int64_t rows)
{
    size_t tb = (size_t)(t->nrows * t->tj * t->es), ob = (size_t)(rows * t->nouter * t->es);
    size_t sb = (size_t)(t->nscratch + 2 * k->out_dim) * 8;
    size_t stb = (size_t)(t->rb * t->state_b);
    return ((tb + ob + sb + stb + 4 * 64) + 63) / 64 * 64;
}

static bool frame_new(struct tile_frame *fr, const sr_kernel *k, const struct tile_prog *t,
                      const void *const *args, const char *cbuf, int64_t rows)
{
    memset(fr, 0, sizeof *fr);
    fr->k = k;
    fr->t = t;
    fr->args = args;
    fr->cbuf = cbuf;
    int64_t odim = k->out_dim;
    if (rows < t->rb)
        rows = t->rb;
    size_t tb = (size_t)(t->nrows * t->tj * t->es), ob = (size_t)(rows * t->nouter * t->es);
    size_t sb = (size_t)(t->nscratch + 2 * odim) * 8;
    char *m = aligned_alloc(64, frame_bytes(k, t, rows));
    if (!m)
        return false;
    fr->mem = m;
    fr->tbuf = m;
    fr->obuf = m + (tb + 63) / 64 * 64;
    fr->scratch = (double *)(fr->obuf + (ob + 63) / 64 * 64);
    fr->row = fr->scratch + t->nscratch;
    fr->row_idx = (int64_t *)(fr->row + odim);
    fr->state = (char *)fr->scratch + (sb + 63) / 64 * 64;
    return true;
}

/* The constants of a call, evaluated once (cbuf: ncst values). */
static bool eval_consts(const sr_kernel *k, const struct tile_prog *t, const sr_run_desc *run,
                        char *cbuf)
{
    struct tile_frame fr;
    if (!frame_new(&fr, k, t, run->args, cbuf, t->rb))
        return false;
    fr.cbuf = cbuf;
    eval_list(&fr, ST_CONST, 0, 0, 1);
    free(fr.mem);
    return true;
}

/* Fewer output rows than this many per thread: the threads split the reduced range. */
#define SPLIT_ROWS_PER_THREAD 16
#define SPLIT_MIN_REDUCED     4096

int64_t cpu_tile_workspace(const sr_kernel *k, const struct tile_prog *t, int64_t *per_thread,
                           int *threads)
{
    int nt = sr__threads(k->ctx, t->per_thread);
    int64_t split = (int64_t)nt * SPLIT_ROWS_PER_THREAD * t->state_b;
    if (per_thread)
        *per_thread = t->per_thread;
    if (threads)
        *threads = nt;
    return (int64_t)nt * t->per_thread + (nt > 1 ? split : 0);
}

sr_status cpu_tile_run(const sr_kernel *k, const struct tile_prog *t, const sr_run_desc *run,
                       const struct sr_rplan *p)
{
    int64_t nout = k->axis == 1 ? run->nx : run->ny;
    int64_t nred = k->axis == 1 ? run->ny : run->nx;
    int nt = sr__threads(k->ctx, t->per_thread);
    char *cbuf = malloc((size_t)(t->ncst * t->es) + 8);
    if (!cbuf || !eval_consts(k, t, run, cbuf)) {
        free(cbuf);
        return sr__error(k->ctx, SR_ENOMEM, "tile interpreter: out of memory");
    }
    int failed = 0;
    int64_t lim = sr__call_budget(k);
    bool split = !p && nt > 1 && nout < (int64_t)nt * SPLIT_ROWS_PER_THREAD &&
                 nred >= SPLIT_MIN_REDUCED &&
                 (lim <= 0 || (int64_t)nt * (t->per_thread + nout * t->state_b) <= lim);
    if (split) {
        /* Each thread folds its slice of the reduced range into states of every row; the
         * slices' states merge in index order. */
        char *states = malloc((size_t)(nout * t->state_b) * (size_t)nt);
        if (!states) {
            free(cbuf);
            return sr__error(k->ctx, SR_ENOMEM, "tile interpreter: out of memory");
        }
        int64_t slice = (nred + nt - 1) / nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(nt)
#endif
        for (int q = 0; q < nt; q++) {
            struct tile_frame fr;
            if (!frame_new(&fr, k, t, run->args, cbuf, t->rb)) {
                failed = 1;
                continue;
            }
            int64_t iv[2] = {(int64_t)q * slice, (int64_t)(q + 1) * slice};
            if (iv[0] > nred)
                iv[0] = nred;
            if (iv[1] > nred)
                iv[1] = nred;
            char *st = states + (size_t)(nout * t->state_b) * (size_t)q;
            for (int64_t b = 0; b < nout; b += t->rb) {
                int nb = (int)(nout - b < t->rb ? nout - b : t->rb);
                fold_rows(&fr, st + b * t->state_b, b, nb, iv, 1, true);
            }
            free(fr.mem);
        }
        if (!failed) {
            struct tile_frame fr;
            if (frame_new(&fr, k, t, run->args, cbuf, t->rb)) {
                for (int64_t o = 0; o < nout; o++) {
                    struct cpu_red_row a = row_state(t, states, (int)o);
                    for (int q = 1; q < nt; q++)
                        t->ops->merge(
                            &t->dims, a,
                            row_state(t, states + (size_t)(nout * t->state_b) * (size_t)q, (int)o));
                    state_final(k, t, a, run, o, fr.row, fr.row_idx);
                }
                free(fr.mem);
            } else {
                failed = 1;
            }
        }
        free(states);
    } else {
        /* Pieces of at most one block of rows (flat rows of the ranges' blocks). */
        int64_t rows = p ? p->nrows : nout;
        int64_t piece = cpu_row_piece(rows, nt, t->rb);
        int64_t npieces = (rows + piece - 1) / piece;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && npieces > 1)
#endif
        {
            struct tile_frame fr;
            bool have = frame_new(&fr, k, t, run->args, cbuf, t->rb);
            if (!have)
                failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t q = 0; q < npieces; q++) {
                if (!have)
                    continue;
                int64_t f0 = q * piece, f1 = f0 + piece < rows ? f0 + piece : rows;
                if (!p) {
                    const int64_t dense[2] = {0, nred};
                    reduce_rows(&fr, run, f0, f1, dense, 1);
                    continue;
                }
                for (int64_t c = sr__rplan_block(p, f0); c < p->nblocks && p->rows[c] < f1; c++) {
                    int64_t o0, o1;
                    sr__rplan_seg(p, c, f0, f1, &o0, &o1);
                    reduce_rows(&fr, run, o0, o1, p->iv + 2 * p->ivoff[c],
                                p->ivoff[c + 1] - p->ivoff[c]);
                }
            }
            if (have)
                free(fr.mem);
        }
    }
    free(cbuf);
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "tile interpreter: out of memory for the workspace");
    return SR_OK;
}

void cpu_tile_explain(const sr_kernel *k, const struct tile_prog *t, struct expr_buf *b)
{
    int fused = 0, absorbed = 0;
    for (int i = 0; i < t->n; i++) {
        fused += t->node[i].fuse != TILE_FUSE_NONE && !t->node[i].dead;
        absorbed += t->node[i].dead;
    }
    expr_buf_printf(
        b, "tile interpreter (tier 0, no compiler): %d nodes of the simplified formula (", t->n);
    for (int s = 0; s < NST; s++)
        expr_buf_printf(b, "%s%d %s", s ? ", " : "", t->nlist[s], stage_names[s]);
    expr_buf_printf(b, "; %d chains fused into one loop each, %d nodes absorbed%s)", fused,
                    absorbed, t->fdot[0] >= 0 ? ", F folded as a dot product" : "");
    expr_buf_printf(b,
                    ", tiles of %d output rows x %d reduced indices, %s loops in %s, sums "
                    "accumulated in float64, %lld bytes of workspace per thread\n",
                    t->rb, t->tj, t->isa_name, sr__dtype_name(k->dtype), (long long)t->per_thread);
}

void cpu_tile_plan_info(const sr_kernel *k, const struct tile_prog *t, sr_plan_info *info)
{
    info->strategy = SR_STRATEGY_DIRECT;
    info->device = SR_DEVICE_CPU;
    info->tile_rows = t->rb;
    info->tile_cols = t->tj;
    info->tier = 0;
    info->eval_block = 2;
    info->tile_isa = t->isa_name;
}

/* ---- driving a program by hand (the gemm-epilogue's tier 0) ------------------------------- */

int64_t cpu_tile_state_bytes(const struct tile_prog *t) { return t->state_b; }

int64_t cpu_tile_frame_bytes(const struct tile_prog *t, int64_t rows)
{
    int64_t odim = t->odim, r = rows > t->rb ? rows : t->rb;
    return t->nrows * t->tj * t->es + r * t->nouter * t->es + (t->nscratch + 2 * odim) * 8 +
           t->rb * t->state_b + t->ncst * t->es + 6 * 64 + (int64_t)sizeof(struct tile_frame);
}

struct tile_frame *cpu_tile_frame_new(const sr_kernel *k, const struct tile_prog *t,
                                      const void *const *args, int64_t rows)
{
    struct tile_frame *f = malloc(sizeof *f);
    char *cbuf = calloc(1, (size_t)(t->ncst * t->es) + 8);
    if (!f || !cbuf || !frame_new(f, k, t, args, cbuf, rows)) {
        free(f);
        free(cbuf);
        return NULL;
    }
    f->cown = cbuf;
    eval_list(f, ST_CONST, 0, 0, 1);
    return f;
}

void cpu_tile_frame_free(struct tile_frame *f)
{
    if (!f)
        return;
    free(f->mem);
    free(f->cown);
    free(f);
}

void cpu_tile_begin(struct tile_frame *f, void *st, int64_t o0, int64_t n, bool init)
{
    f->o0 = o0;
    f->nb = n;
    for (int64_t s = 0; s < n; s++) {
        eval_list(f, ST_OUTER, (int)s, 0, 1);
        if (init)
            f->t->ops->init(&f->t->dims, row_state(f->t, st, s));
    }
}

void cpu_tile_fold(struct tile_frame *f, void *st, int64_t r0, int64_t n, const void *G,
                   int64_t ldg)
{
    const struct tile_prog *t = f->t;
    for (int64_t c0 = 0; c0 < n; c0 += t->tj) {
        int m = (int)(n - c0 < t->tj ? n - c0 : t->tj);
        eval_list(f, ST_INNER, 0, r0 + c0, m);
        for (int64_t s = 0; s < f->nb; s++) {
            if (G)
                f->ext = (const char *)G + (s * ldg + c0) * t->es;
            eval_list(f, ST_PAIR, (int)s, r0 + c0, m);
            fold(f, row_state(t, st, (int)s), (int)s, r0 + c0, m);
        }
    }
}

void cpu_tile_final(struct tile_frame *f, const void *st, int64_t n, void *out, int64_t *out_idx,
                    int64_t orow)
{
    sr_run_desc run = {0, 0, 0, NULL, out, out_idx};
    for (int64_t s = 0; s < n; s++)
        state_final(f->k, f->t, row_state(f->t, (char *)st, (int)s), &run, orow + s, f->row,
                    f->row_idx);
}

void cpu_tile_block(struct tile_frame *f, int64_t o0, int64_t nrows, int64_t r0, int64_t n,
                    const void *G, int64_t ldg, void *out, int64_t ldr, int64_t ldu)
{
    const struct tile_prog *t = f->t;
    if (t->fdot[0] >= 0)
        abort(); /* a folding program (cpu_tile_new): F's tile is never formed */
    int64_t es = t->es;
    cpu_tile_begin(f, NULL, o0, nrows, false);
    for (int64_t c0 = 0; c0 < n; c0 += t->tj) {
        int m = (int)(n - c0 < t->tj ? n - c0 : t->tj);
        eval_list(f, ST_INNER, 0, r0 + c0, m);
        for (int64_t s = 0; s < nrows; s++) {
            if (G)
                f->ext = (const char *)G + (s * ldg + c0) * es;
            eval_list(f, ST_PAIR, (int)s, r0 + c0, m);
            for (int c = 0; c < t->dims.D; c++) {
                const char *x = tile_of(f, t->f, t->fcopy, c, (int)s, m);
                char *o = (char *)out + (s * ldr + c0 * ldu + c) * es;
                if (ldu == 1)
                    memcpy(o, x, (size_t)(m * es));
                else
                    for (int u = 0; u < m; u++)
                        memcpy(o + u * ldu * es, x + u * es, (size_t)es);
            }
        }
    }
}

void cpu_tile_merge(const sr_kernel *k, const struct tile_prog *t, void *a, const void *b,
                    int64_t rows)
{
    for (int64_t s = 0; s < rows; s++)
        t->ops->merge(&t->dims, row_state(t, a, s), row_state(t, (char *)b, s));
}

/* ---- the backend ----------------------------------------------------------------------- */

static sr_status tile_prepare(sr_kernel *k, const struct sr_plan *p, struct sr_realise *r)
{
    (void)p; /* one way, no candidates */
    (void)r;
    struct tile_prog *t = NULL;
    sr_status st = cpu_tile_new(k, &t);
    if (st == SR_OK)
        k->backend_data = t;
    return st;
}

static void tile_release(sr_kernel *k)
{
    cpu_tile_free(k->backend_data);
    k->backend_data = NULL;
}

static sr_status tile_run(const sr_kernel *k, const sr_run_desc *r)
{
    return cpu_tile_run(k, k->backend_data, r, NULL);
}

static sr_status tile_run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p)
{
    return cpu_tile_run(k, k->backend_data, r, p);
}

static int64_t tile_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    return cpu_tile_workspace(k, k->backend_data, per_thread, threads);
}

static void tile_explain(const sr_kernel *k, struct expr_buf *b)
{
    cpu_tile_explain(k, k->backend_data, b);
}

static void tile_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    cpu_tile_plan_info(k, k->backend_data, info);
}

const struct sr_backend_i cpu_tile_backend = {
    /* .name = */ "tile interpreter",
    /* .prepare = */ tile_prepare,
    /* .run = */ tile_run,
    /* .release = */ tile_release,
    /* .explain = */ tile_explain,
    /* .run_ranges = */ tile_run_ranges,
    /* .workspace = */ tile_workspace,
    /* .run_device = */ NULL,
    /* .ctx_free = */ NULL,
    /* .post_rewrite = */ true,
    /* .vjp = */ NULL,
    /* .run_lse = */ NULL,
    /* .offer = */ NULL,
    /* .stage = */ NULL,
    /* .wait = */ NULL,
    /* .plan_info = */ tile_plan_info,
    /* .plans = */ NULL,
};
