/*
 * red-rules.h — the reductions' rules in double precision: how each family's running state
 * starts, takes one value with its index, merges a later state and finishes, exactly as
 * docs/semantics.md says, NaN, infinities and ties included. push(x) is merge with the
 * one-element state {x}, so a reduction split anywhere and merged in index order gives the same
 * result as one sequential pass.
 *
 * Readers: the CPU's table of per-family operations on row state (cpu_red_ops, red-ops.c), which
 * the reference interpreter and the tile interpreter reduce by; the fused strategies' online
 * softmax (fused.c, attn-grad.c: cpu_softmax_grow); and the MPI companion library's combine of
 * block results (mpi/combine.c). The MPI library links only libsymred's public symbols, so this
 * header is inline functions over reductions.h alone, like reductions.h itself, and mpi/ compiles
 * it in.
 */
#ifndef SYMRED_CPU_RED_RULES_H
#define SYMRED_CPU_RED_RULES_H

#include "../core/reductions.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- orders ---------------------------------------------------------------------------------
 * Each "before" says whether (va, ia) ranks ahead of (vb, ib) (sr_red_before, reductions.h).
 * Min, Max and their arg-reductions: a NaN wins (NumPy min/argmin), then the more extreme
 * value. KMin and ArgKMin: ascending with NaN after +inf (NumPy sort). */

static inline bool cpu_ext_before(enum sr_red_order order, double va, int64_t ia, double vb,
                                  int64_t ib)
{
    return sr_red_before(order, sr_red_family_nan(SR_RED_FAM_ARGEXT), va, ia, vb, ib);
}

static inline bool cpu_kmin_before(double va, int64_t ia, double vb, int64_t ib)
{
    return sr_red_before(SR_RED_ASC, sr_red_family_nan(SR_RED_FAM_KSEL), va, ia, vb, ib);
}

/* ---- Sum ---------------------------------------------------------------------------------- */

static inline void cpu_sum_init(double *acc) { *acc = 0.0; }
static inline void cpu_sum_push(double *acc, double x) { *acc += x; }
static inline void cpu_sum_combine(double *acc, double other) { *acc += other; }

/* ---- Min / Max with their index --------------------------------------------------------------
 * State (value, index) of a selection of order (SR_RED_ASC: Min, SR_RED_DESC: Max); index -1
 * marks the empty state, whose value is the identity. */

static inline void cpu_ext_init(enum sr_red_order order, double *v, int64_t *i)
{
    *v = sr_red_empty_value(SR_RED_EMPTY_ORDER, order);
    *i = -1;
}
static inline void cpu_ext_push(enum sr_red_order order, double *v, int64_t *i, double x, int64_t j)
{
    if (j >= 0 && (*i < 0 || cpu_ext_before(order, x, j, *v, *i))) {
        *v = x;
        *i = j;
    }
}
/* Combining is pushing the other state's element (an empty other has index -1: no-op). */
#define cpu_ext_combine cpu_ext_push

/* ---- KMin / ArgKMin -------------------------------------------------------------------------
 * State: the *n (<= K) best elements so far, sorted by cpu_kmin_before, in v[0..n) and
 * ix[0..n). Sorted insertion costs O(K) per element, fine for an oracle. Returns the new n. */

static inline int cpu_kmin_push(double *v, int64_t *ix, int n, int K, double x, int64_t j)
{
    if (n == K && !cpu_kmin_before(x, j, v[K - 1], ix[K - 1]))
        return n;
    int p = n < K ? n : K - 1; /* the slot that becomes free: the end, or the dropped last */
    while (p > 0 && cpu_kmin_before(x, j, v[p - 1], ix[p - 1])) {
        v[p] = v[p - 1];
        ix[p] = ix[p - 1];
        p--;
    }
    v[p] = x;
    ix[p] = j;
    return n < K ? n + 1 : n;
}

/* Merges the other state's elements into (v, ix, n). */
static inline int cpu_kmin_combine(double *v, int64_t *ix, int n, int K, const double *ov,
                                   const int64_t *oix, int on)
{
    for (int t = 0; t < on; t++)
        n = cpu_kmin_push(v, ix, n, K, ov[t], oix[t]);
    return n;
}

/* Merges two sorted lists, (av, ai) of na entries and (bv, bi) of nb, into the first
 * min(na + nb, K) entries of their union in (ov, oi), which alias neither; returns that count.
 * The result is that of pushing b's entries into a one by one, in linear time. */
static inline int cpu_kmin_merge(const double *av, const int64_t *ai, int na, const double *bv,
                                 const int64_t *bi, int nb, int K, double *ov, int64_t *oi)
{
    const int n = na + nb < K ? na + nb : K;
    for (int t = 0, a = 0, b = 0; t < n; t++) {
        const bool take_b = a >= na || (b < nb && cpu_kmin_before(bv[b], bi[b], av[a], ai[a]));
        if (take_b) {
            ov[t] = bv[b];
            oi[t] = bi[b++];
        } else {
            ov[t] = av[a];
            oi[t] = ai[a++];
        }
    }
    return n;
}

/* Writes the K results; slots past n (impossible when K <= the reduced count, which kernel.c
 * checks) get the empty identity +inf / -1. */
static inline void cpu_kmin_finish(const double *v, const int64_t *ix, int n, int K, double *out_v,
                                   int64_t *out_ix)
{
    for (int t = 0; t < K; t++) {
        out_v[t] = t < n ? v[t] : INFINITY;
        out_ix[t] = t < n ? ix[t] : -1;
    }
}

/* ---- LogSumExp ----------------------------------------------------------------------------
 * State (m, s) stands for m + log(s), s = sum exp(x - m), with m the running maximum. Rules of
 * docs/semantics.md: NaN propagates and beats everything; otherwise an +inf term makes the
 * result +inf; -inf terms add nothing and all -inf (or empty) gives -inf. The special values
 * are settled before any exp() so that exp(-inf - -inf) and exp(inf - inf) (NaN) never occur. */

struct cpu_lse {
    double m, s;
};

static inline void cpu_lse_init(struct cpu_lse *a)
{
    a->m = -INFINITY;
    a->s = 0.0;
}

static inline void cpu_lse_combine(struct cpu_lse *a, struct cpu_lse b)
{
    if (isnan(a->m) || b.m == -INFINITY)
        return;
    if (isnan(b.m) || a->m == -INFINITY) {
        *a = b;
        return;
    }
    if (a->m == INFINITY)
        return;
    if (b.m == INFINITY) {
        *a = b;
        return;
    }
    if (b.m > a->m) {
        a->s = a->s * exp(a->m - b.m) + b.s;
        a->m = b.m;
    } else {
        a->s += b.s * exp(b.m - a->m);
    }
}

static inline void cpu_lse_push(struct cpu_lse *a, double x)
{
    struct cpu_lse one = {x, 1.0};
    cpu_lse_combine(a, one);
}

static inline double cpu_lse_finish(struct cpu_lse a)
{
    if (isnan(a.m) || isinf(a.m))
        return a.m;
    return a.m + log(a.s);
}

/* ---- the online softmax ---------------------------------------------------------------------
 * A row's running maximum *m meets tm, the maximum of the terms about to be added: *m becomes the
 * larger, and the row's sum and weighted sums so far are to be multiplied by the returned factor,
 * exp(m_old - m_new) when the maximum grows from a finite value, else 1 (a row that held only
 * -inf terms holds zero sums, or NaN ones that stay NaN). A NaN tm never wins: NaN terms reach
 * the sums through exp(). The one rescale rule of every online softmax on the CPU
 * (SumSoftMaxWeight's push, the fused two-product, attention's forward); the CUDA fused kernel
 * spells the same rule in its template (emit-cuda-fused.c). */
static inline double cpu_softmax_grow(double *m, double tm)
{
    const double mo = *m, mn = tm > mo ? tm : mo;
    *m = mn;
    return mn > mo && mo > -INFINITY ? exp(mo - mn) : 1.0;
}

/* ---- SumSoftMaxWeight ------------------------------------------------------------------------
 * State (m, s, acc[W]): s = sum exp(f - m), acc = sum exp(f - m) g, m the running maximum of
 * the scalar f. The result acc / s is the literal formula of docs/semantics.md with m = max f:
 * it is NaN when a term is NaN, when max f is +inf (exp(inf - inf)) and when every f is -inf
 * (0 / 0, like the empty reduction). A -inf term has weight exactly 0 (its 0 * g still makes a
 * non-finite g NaN, as the formula does). */

static inline void cpu_ssmw_init(double *m, double *s, double *acc, int W)
{
    *m = -INFINITY;
    *s = 0.0;
    for (int c = 0; c < W; c++)
        acc[c] = 0.0;
}

/* Weight of a term f under the maximum m. */
static inline double cpu_ssmw_weight(double f, double m)
{
    return f == -INFINITY ? 0.0 : exp(f - m);
}

static inline void cpu_ssmw_push(double *m, double *s, double *acc, int W, double f,
                                 const double *g)
{
    const double scale = cpu_softmax_grow(m, f);
    double w = cpu_ssmw_weight(f, *m);
    *s = *s * scale + w;
    for (int c = 0; c < W; c++)
        acc[c] = acc[c] * scale + w * g[c];
}

static inline void cpu_ssmw_combine(double *m, double *s, double *acc, int W, double om, double os,
                                    const double *oacc)
{
    double mm = om > *m ? om : *m;
    double sa = *m == mm ? 1.0 : exp(*m - mm), sb = om == mm ? 1.0 : exp(om - mm);
    *m = mm;
    *s = *s * sa + os * sb;
    for (int c = 0; c < W; c++)
        acc[c] = acc[c] * sa + oacc[c] * sb;
}

static inline void cpu_ssmw_finish(double s, const double *acc, int W, double *out)
{
    for (int c = 0; c < W; c++)
        out[c] = acc[c] / s;
}

#endif /* SYMRED_CPU_RED_RULES_H */
