/*
 * combine.c — the combine rule of every reduction family (see combine.h).
 *
 * The rules reproduce docs/semantics.md across blocks: a Min over the union of two blocks is the
 * Min of their Mins with the same tie and NaN rules, and so on. Indices arrive relative to their
 * block and are stored global.
 */
#include "combine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const mpi_rules rule_table[SR_REDUCTION_COUNT] = {
#define MPI_RULES_ROW_(red, fam, ord, emp, v, i, k, sf, w, part)                                   \
    [SR_##red] = {SR_##part, SR_RED_FAM_##fam, SR_RED_##ord, SR_RED_EMPTY_##emp, v, i},
    SR_REDUCTION_RULES(MPI_RULES_ROW_)
#undef MPI_RULES_ROW_
};

const mpi_rules *mpi_rules_of(sr_reduction red) { return &rule_table[red]; }

struct block;

/* How each family combines blocks: its fold of a block's row br into row r, whether its state
 * is K sorted entries per component (filled then counts the entries of each list) and whether
 * it carries the softmax's running maximum and weight sum per row (its values are written
 * divided by that sum). Defined below the folds. */
struct family_combine {
    void (*fold)(mpi_state *st, int64_t r, int64_t br, const struct block *bk);
    bool lists, softmax;
};
static const struct family_combine combine_of[SR_RED_FAM_COUNT];

/* The family's rules, or NULL for a family this library does not know. */
static const struct family_combine *combine_rules(const mpi_rules *rules)
{
    const int fam = (int)rules->family;
    return fam >= 0 && fam < SR_RED_FAM_COUNT && combine_of[fam].fold ? &combine_of[fam] : NULL;
}

static double load(const void *a, int64_t i, sr_dtype dtype)
{
    return dtype == SR_F64 ? ((const double *)a)[i] : (double)((const float *)a)[i];
}

sr_status mpi_state_init(mpi_state *st, const mpi_rules *rules, int64_t n, int dim, int k)
{
    const struct family_combine *fc = combine_rules(rules);
    memset(st, 0, sizeof *st);
    if (!fc)
        return SR_EINVAL;
    st->rules = rules;
    st->n = n;
    st->dim = dim;
    st->k = fc->lists ? k : 1;
    size_t len = (size_t)n * (size_t)st->k * (size_t)dim;
    int with_idx = mpi_family_indexed(rules->family);
    st->val = calloc(len ? len : 1, sizeof *st->val);
    if (with_idx)
        st->idx = calloc(len ? len : 1, sizeof *st->idx);
    if (fc->softmax) {
        st->mx = malloc((n ? (size_t)n : 1) * sizeof *st->mx);
        st->wsum = calloc(n ? (size_t)n : 1, sizeof *st->wsum);
        for (int64_t r = 0; st->mx && r < n; r++)
            st->mx[r] = -INFINITY;
    }
    if (fc->lists) {
        st->tv = malloc((size_t)st->k * sizeof *st->tv);
        st->ti = malloc((size_t)st->k * sizeof *st->ti);
    }
    if (!st->val || (with_idx && !st->idx) || (fc->softmax && (!st->mx || !st->wsum)) ||
        (fc->lists && (!st->tv || !st->ti))) {
        mpi_state_free(st);
        return SR_ENOMEM;
    }
    return SR_OK;
}

void mpi_state_free(mpi_state *st)
{
    free(st->val);
    free(st->idx);
    free(st->mx);
    free(st->wsum);
    free(st->tv);
    free(st->ti);
    memset(st, 0, sizeof *st);
}

/* log(e^a + e^b), exact for infinities, NaN if either is. */
static double logaddexp(double a, double b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == b)
        return a + 0.69314718055994530942; /* + log 2; also right for +-inf */
    double hi = a > b ? a : b, lo = a > b ? b : a;
    return hi + log1p(exp(lo - hi));
}

/* Merges the st->filled entries of list (row r, component c) with the block's kb entries. */
static void kmin_merge(mpi_state *st, int64_t r, int c, const void *vals, const int64_t *idx,
                       int64_t br, int kb, int64_t offset, sr_dtype dtype)
{
    int K = st->k, dim = st->dim;
    int64_t na = st->filled, nb = kb, a = 0, b = 0;
    int nout = (int)(na + nb < K ? na + nb : K);
    double *sv = st->val + (size_t)r * K * dim;
    int64_t *si = st->idx + (size_t)r * K * dim;
    for (int t = 0; t < nout; t++) {
        int take_b = a >= na;
        double bv = 0.0;
        int64_t bi = 0;
        if (b < nb) {
            bv = load(vals, (br * kb + b) * dim + c, dtype);
            bi = idx[(br * kb + b) * dim + c] + offset;
            if (!take_b)
                take_b = sr_red_before(SR_RED_ASC, sr_red_family_nan(SR_RED_FAM_KSEL), bv, bi,
                                       sv[a * dim + c], si[a * dim + c]);
        }
        if (take_b) {
            st->tv[t] = bv;
            st->ti[t] = bi;
            b++;
        } else {
            st->tv[t] = sv[a * dim + c];
            st->ti[t] = si[a * dim + c];
            a++;
        }
    }
    for (int t = 0; t < nout; t++) {
        sv[t * dim + c] = st->tv[t];
        si[t * dim + c] = st->ti[t];
    }
}

/* SSMW: folds a block whose softmax-weighted average is w (dim values) and whose
 * LogSumExp of F is l into row r. */
static void ssmw_fold(mpi_state *st, int64_t r, double l, const void *w, int64_t wr, sr_dtype dtype)
{
    int dim = st->dim;
    double *acc = st->val + (size_t)r * dim;
    if (l == -INFINITY)
        return; /* every term of the block has weight exactly 0 */
    double scale = 1.0, e = 1.0;
    if (isnan(l) || isnan(st->mx[r])) {
        st->mx[r] = NAN;
        st->wsum[r] = NAN;
        return;
    }
    if (l > st->mx[r]) {
        scale = exp(st->mx[r] - l); /* 0 when nothing was folded yet */
        st->mx[r] = l;
    } else {
        e = exp(l - st->mx[r]);
    }
    st->wsum[r] = st->wsum[r] * scale + e;
    for (int c = 0; c < dim; c++)
        acc[c] = acc[c] * scale + e * load(w, wr * dim + c, dtype);
}

/* Where a block's row br lands: the block's values, indices and LogSumExp of F (SSMW), its K
 * (KSEL) and the offset of its indices. */
struct block {
    const void *vals;
    const int64_t *idx;
    const void *lse;
    int kb;
    int64_t offset;
    sr_dtype dtype;
};

/* The folds of a block's row br into row r, one per family. */
static void fold_sum(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    double *v = st->val + (size_t)r * st->dim;
    for (int c = 0; c < st->dim; c++)
        v[c] += load(bk->vals, br * st->dim + c, bk->dtype);
}

/* EXT and ARGEXT: the block's extreme replaces the row's when it ranks before it. */
static void fold_ext(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    double *v = st->val + (size_t)r * st->dim;
    int64_t *ix = st->idx + (size_t)r * st->dim;
    for (int c = 0; c < st->dim; c++) {
        const int64_t e = br * st->dim + c;
        const double bv = load(bk->vals, e, bk->dtype);
        const int64_t bi = bk->idx[e] + bk->offset;
        if (st->filled == 0 || sr_red_before(st->rules->order, sr_red_family_nan(st->rules->family),
                                             bv, bi, v[c], ix[c])) {
            v[c] = bv;
            ix[c] = bi;
        }
    }
}

static void fold_ksel(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    for (int c = 0; c < st->dim; c++)
        kmin_merge(st, r, c, bk->vals, bk->idx, br, bk->kb, bk->offset, bk->dtype);
}

static void fold_lse(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    double *v = st->val + (size_t)r * st->dim;
    for (int c = 0; c < st->dim; c++) {
        const double bv = load(bk->vals, br * st->dim + c, bk->dtype);
        v[c] = st->filled == 0 ? bv : logaddexp(v[c], bv);
    }
}

static void fold_ssmw(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    ssmw_fold(st, r, load(bk->lse, br, bk->dtype), bk->vals, br, bk->dtype);
}

static const struct family_combine combine_of[SR_RED_FAM_COUNT] = {
    [SR_RED_FAM_SUM] = {fold_sum, false, false},    [SR_RED_FAM_EXT] = {fold_ext, false, false},
    [SR_RED_FAM_ARGEXT] = {fold_ext, false, false}, [SR_RED_FAM_KSEL] = {fold_ksel, true, false},
    [SR_RED_FAM_LSE] = {fold_lse, false, false},    [SR_RED_FAM_SSMW] = {fold_ssmw, false, true},
};

void mpi_state_fold(mpi_state *st, int64_t r0, int64_t nr, const void *vals, const int64_t *idx,
                    const void *lse, int kb, int64_t offset, sr_dtype dtype)
{
    const struct block bk = {vals, idx, lse, kb, offset, dtype};
    const struct family_combine *fc = combine_rules(st->rules);
    for (int64_t br = 0; fc && br < nr; br++)
        fc->fold(st, r0 + br, br, &bk);
}

void mpi_state_next_block(mpi_state *st, int kb)
{
    if (combine_rules(st->rules)->lists)
        st->filled = st->filled + kb < st->k ? st->filled + kb : st->k;
    else
        st->filled++;
}

void mpi_state_write(const mpi_state *st, void *out, int64_t *out_idx, sr_dtype dtype)
{
    int64_t len = st->n * st->k * st->dim;
    /* What the reduction writes when no block was folded. */
    const double none = sr_red_empty_value(st->rules->empty, st->rules->order);
    const bool softmax = combine_rules(st->rules)->softmax;
    for (int64_t e = 0; e < len; e++) {
        double v = st->val[e];
        if (softmax)
            v /= st->wsum[e / st->dim]; /* 0/0 = NaN when nothing was folded, as symred */
        else if (st->filled == 0)
            v = none;
        if (out && dtype == SR_F64)
            ((double *)out)[e] = v;
        else if (out)
            ((float *)out)[e] = (float)v;
        if (out_idx)
            out_idx[e] = st->idx && st->filled > 0 ? st->idx[e] : -1;
    }
}
