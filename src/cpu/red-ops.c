/*
 * red-ops.c — the reductions' operations on double-precision row state, one row per family
 * (cpu_red_ops, cpu.h), built on the rules of red-rules.h. The reference interpreter pushes
 * values one at a time; the tile interpreter folds tiles of values by the vector loops of
 * tile-kern.h (sums of a tile in 32 float64 running sums, Min, Max and the K-selections skipping a
 * tile that cannot change the state, LogSumExp and SumSoftMaxWeight folding a tile through its
 * maximum) and merges the states of slices of the reduced range in index order.
 */
#include "cpu.h"

#include <string.h>

struct cpu_red_dims cpu_red_dims_of(const struct sr_kernel *k)
{
    return (struct cpu_red_dims){k->fdim, k->k, k->weight ? k->weight->dim : 0,
                                 sr_reductions[k->red].order};
}

static inline double elem(const struct cpu_red_tile *t, const void *x, int u)
{
    return t->es == 4 ? (double)((const float *)x)[u] : ((const double *)x)[u];
}

/* ---- Sum ---- */

static void sum_init(const struct cpu_red_dims *n, struct cpu_red_row r)
{
    for (int c = 0; c < n->D; c++)
        cpu_sum_init(&r.d[c]);
}
static void sum_push(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                     const double *w, int64_t j)
{
    for (int c = 0; c < n->D; c++)
        cpu_sum_push(&r.d[c], f[c]);
}
static void sum_tile(const struct cpu_red_dims *n, struct cpu_red_row r,
                     const struct cpu_red_tile *t)
{
    if (t->dot[0]) {
        cpu_sum_push(&r.d[0], t->isa->dot(t->dot[0], t->dot[1], t->n));
        return;
    }
    for (int c = 0; c < n->D; c++)
        cpu_sum_push(&r.d[c], t->isa->sum(t->comp(t, 0, c), t->n));
}
static void sum_merge(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b)
{
    for (int c = 0; c < n->D; c++)
        cpu_sum_combine(&a.d[c], b.d[c]);
}
static void sum_finish(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                       int64_t *out_idx)
{
    memcpy(out, r.d, (size_t)n->D * sizeof *out);
}

/* ---- Min, Max and their arg-reductions ---- */

static void ext_init(const struct cpu_red_dims *n, struct cpu_red_row r)
{
    for (int c = 0; c < n->D; c++)
        cpu_ext_init(n->order, &r.d[c], &r.ix[c]);
}
static void ext_push(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                     const double *w, int64_t j)
{
    for (int c = 0; c < n->D; c++)
        cpu_ext_push(n->order, &r.d[c], &r.ix[c], f[c], j);
}
static void ext_tile(const struct cpu_red_dims *n, struct cpu_red_row r,
                     const struct cpu_red_tile *t)
{
    const int desc = n->order == SR_RED_DESC;
    for (int c = 0; c < n->D; c++) {
        const void *x = t->comp(t, 0, c);
        const double v = t->isa->ext(x, t->n, desc), cur = r.d[c];
        /* Nothing in the tile ranks ahead of the state (later indices lose ties). */
        if (r.ix[c] >= 0 && (isnan(cur) || (!isnan(v) && !(desc ? v > cur : v < cur))))
            continue;
        for (int u = 0; u < t->n; u++)
            cpu_ext_push(n->order, &r.d[c], &r.ix[c], elem(t, x, u), t->r0 + u);
    }
}
static void ext_merge(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b)
{
    for (int c = 0; c < n->D; c++)
        cpu_ext_combine(n->order, &a.d[c], &a.ix[c], b.d[c], b.ix[c]);
}
static void ext_finish(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                       int64_t *out_idx)
{
    memcpy(out, r.d, (size_t)n->D * sizeof *out);
    memcpy(out_idx, r.ix, (size_t)n->D * sizeof *out_idx);
}

/* ---- KMin, ArgKMin: component c's list at d + c K ---- */

static void ksel_init(const struct cpu_red_dims *n, struct cpu_red_row r)
{
    for (int c = 0; c < n->D; c++)
        r.cnt[c] = 0;
}
static void ksel_push(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                      const double *w, int64_t j)
{
    const int64_t K = n->K;
    for (int c = 0; c < n->D; c++)
        r.cnt[c] = cpu_kmin_push(r.d + c * K, r.ix + c * K, r.cnt[c], n->K, f[c], j);
}
static void ksel_tile(const struct cpu_red_dims *n, struct cpu_red_row r,
                      const struct cpu_red_tile *t)
{
    const int K = n->K;
    for (int c = 0; c < n->D; c++) {
        const void *x = t->comp(t, 0, c);
        double *v = r.d + (int64_t)c * K;
        int64_t *ix = r.ix + (int64_t)c * K;
        /* With K kept, what is not below the K-th (a NaN is neither, and NaN ranks last) cannot
         * enter: the tile's indices come after the state's, so ties stay out. */
        if (r.cnt[c] == K && t->isa->ext(x, t->n, 0) >= v[K - 1])
            continue;
        int u = 0;
        for (; u < t->n && r.cnt[c] < K; u++)
            r.cnt[c] = cpu_kmin_push(v, ix, r.cnt[c], K, elem(t, x, u), t->r0 + u);
        /* Then only the blocks of 16 holding a value below the K-th as it is now (it only
         * decreases), each value checked against the K-th as it is then. */
        for (int u0 = u; u0 < t->n; u0 += 1024) {
            const int m = t->n - u0 < 1024 ? t->n - u0 : 1024;
            const char *xb = (const char *)x + (int64_t)u0 * t->es;
            for (uint64_t bl = t->isa->below(xb, m, v[K - 1]); bl; bl &= bl - 1) {
                const int b0 = u0 + 16 * __builtin_ctzll(bl);
                const int b1 = b0 + 16 < u0 + m ? b0 + 16 : u0 + m;
                for (int w = b0; w < b1; w++) {
                    double xw = elem(t, x, w);
                    if (!(xw >= v[K - 1]))
                        r.cnt[c] = cpu_kmin_push(v, ix, r.cnt[c], K, xw, t->r0 + w);
                }
            }
        }
    }
}
static void ksel_merge(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b)
{
    for (int c = 0; c < n->D; c++) {
        const int64_t o = (int64_t)c * n->K;
        a.cnt[c] = cpu_kmin_combine(a.d + o, a.ix + o, a.cnt[c], n->K, b.d + o, b.ix + o, b.cnt[c]);
    }
}
/* Each component's list into the (K, D) row-major output. */
static void ksel_finish(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                        int64_t *out_idx)
{
    const int64_t D = n->D, K = n->K;
    for (int64_t c = 0; c < D; c++)
        for (int64_t u = 0; u < K; u++) {
            const bool have = u < r.cnt[c];
            out[u * D + c] = have ? r.d[c * K + u] : INFINITY;
            out_idx[u * D + c] = have ? r.ix[c * K + u] : -1;
        }
}

/* ---- LogSumExp: (m, s) of component c at d + 2 c ---- */

static void lse_init(const struct cpu_red_dims *n, struct cpu_red_row r)
{
    for (int c = 0; c < n->D; c++) {
        struct cpu_lse a;
        cpu_lse_init(&a);
        r.d[2 * c] = a.m;
        r.d[2 * c + 1] = a.s;
    }
}
static void lse_push(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                     const double *w, int64_t j)
{
    for (int c = 0; c < n->D; c++) {
        struct cpu_lse a = {r.d[2 * c], r.d[2 * c + 1]};
        cpu_lse_push(&a, f[c]);
        r.d[2 * c] = a.m;
        r.d[2 * c + 1] = a.s;
    }
}
static void lse_tile(const struct cpu_red_dims *n, struct cpu_red_row r,
                     const struct cpu_red_tile *t)
{
    for (int c = 0; c < n->D; c++) {
        const void *x = t->comp(t, 0, c);
        struct cpu_lse a = {r.d[2 * c], r.d[2 * c + 1]};
        int special;
        const double m = t->isa->max(x, t->n, &special);
        if (special) {
            for (int u = 0; u < t->n; u++)
                cpu_lse_push(&a, elem(t, x, u));
        } else {
            cpu_lse_combine(&a, (struct cpu_lse){m, t->isa->expsum(x, NULL, t->n, m)});
        }
        r.d[2 * c] = a.m;
        r.d[2 * c + 1] = a.s;
    }
}
static void lse_merge(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b)
{
    for (int c = 0; c < n->D; c++) {
        struct cpu_lse x = {a.d[2 * c], a.d[2 * c + 1]};
        cpu_lse_combine(&x, (struct cpu_lse){b.d[2 * c], b.d[2 * c + 1]});
        a.d[2 * c] = x.m;
        a.d[2 * c + 1] = x.s;
    }
}
static void lse_finish(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                       int64_t *out_idx)
{
    for (int c = 0; c < n->D; c++)
        out[c] = cpu_lse_finish((struct cpu_lse){r.d[2 * c], r.d[2 * c + 1]});
}

/* ---- SumSoftMaxWeight: d[0] the maximum, d[1] the sum, d + 2 the weighted sums ---- */

static void ssmw_init(const struct cpu_red_dims *n, struct cpu_red_row r)
{
    cpu_ssmw_init(&r.d[0], &r.d[1], r.d + 2, n->W);
}
static void ssmw_push(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                      const double *w, int64_t j)
{
    cpu_ssmw_push(&r.d[0], &r.d[1], r.d + 2, n->W, f[0], w);
}
static void ssmw_tile(const struct cpu_red_dims *n, struct cpu_red_row r,
                      const struct cpu_red_tile *t)
{
    const void *x = t->comp(t, 0, 0);
    const int W = n->W;
    int special;
    double m = t->isa->max(x, t->n, &special), *acc = t->scratch, *g = acc + W;
    if (special) {
        for (int u = 0; u < t->n; u++) {
            for (int c = 0; c < W; c++)
                g[c] = elem(t, t->comp(t, 1, c), u);
            cpu_ssmw_push(&r.d[0], &r.d[1], r.d + 2, W, elem(t, x, u), g);
        }
        return;
    }
    const double sum = t->isa->expsum(x, t->p, t->n, m);
    for (int c = 0; c < W; c++)
        acc[c] = t->isa->dot(t->p, t->comp(t, 1, c), t->n);
    cpu_ssmw_combine(&r.d[0], &r.d[1], r.d + 2, W, m, sum, acc);
}
static void ssmw_merge(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b)
{
    cpu_ssmw_combine(&a.d[0], &a.d[1], a.d + 2, n->W, b.d[0], b.d[1], b.d + 2);
}
static void ssmw_finish(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                        int64_t *out_idx)
{
    cpu_ssmw_finish(r.d[1], r.d + 2, n->W, out);
}

/* X(family, prefix, doubles, indices, counts): the extents of a row's state (d D, dk D K, w W,
 * one), then the family's operations prefix_init, _push, _tile, _merge, _finish. Min and Max
 * differ from their arg-reductions only by what the reduction writes. */
#define CPU_RED_OPS_MAP(X)                                                                         \
    X(SUM, sum, E(1, 0, 0, 0), E(0, 0, 0, 0), E(0, 0, 0, 0))                                       \
    X(EXT, ext, E(1, 0, 0, 0), E(1, 0, 0, 0), E(0, 0, 0, 0))                                       \
    X(ARGEXT, ext, E(1, 0, 0, 0), E(1, 0, 0, 0), E(0, 0, 0, 0))                                    \
    X(KSEL, ksel, E(0, 1, 0, 0), E(0, 1, 0, 0), E(1, 0, 0, 0))                                     \
    X(LSE, lse, E(2, 0, 0, 0), E(0, 0, 0, 0), E(0, 0, 0, 0))                                       \
    X(SSMW, ssmw, E(0, 0, 1, 2), E(0, 0, 0, 0), E(0, 0, 0, 0))

#define E(d, dk, w, one)                                                                           \
    {                                                                                              \
        d, dk, w, one                                                                              \
    }
#define CPU_RED_OPS_ROW_(fam, p, nd, ni, nc)                                                       \
    [SR_RED_FAM_##fam] = {nd, ni, nc, p##_init, p##_push, p##_tile, p##_merge, p##_finish},
const struct cpu_red_ops cpu_red_ops[SR_RED_FAM_COUNT] = {CPU_RED_OPS_MAP(CPU_RED_OPS_ROW_)};
#undef CPU_RED_OPS_ROW_
#undef E

/* Every family has its row. */
#define CPU_RED_OPS_ONE_(fam, p, nd, ni, nc) +1
_Static_assert(0 CPU_RED_OPS_MAP(CPU_RED_OPS_ONE_) == SR_RED_FAM_COUNT,
               "cpu_red_ops: one row per reduction family");
#undef CPU_RED_OPS_ONE_
