/*
 * combine.c — the combine rule of every reduction family (see combine.h).
 *
 * The rules reproduce docs/semantics.md across blocks: a Min over the union of two blocks is the
 * Min of their Mins with the same tie and NaN rules, and so on. They are the reductions'
 * double-precision rules of src/cpu/red-rules.h, the ones symred's CPU interpreters reduce by:
 * this library links only symred's public symbols, and that header is inline functions over
 * reductions.h alone, compiled in here. Indices arrive relative to their block and are stored
 * global.
 */
#include "combine.h"

#include "../src/cpu/red-rules.h"

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

/* How each family combines blocks, by the reductions' double-precision rules
 * (src/cpu/red-rules.h): the state's start values, its fold of a block's row br into row r, the
 * value it writes at entry e, and whether its state is K sorted entries per component (filled
 * then counts the entries of each list). Defined below the folds. */
struct family_combine {
    void (*init)(mpi_state *st);
    void (*fold)(mpi_state *st, int64_t r, int64_t br, const struct block *bk);
    double (*value)(const mpi_state *st, int64_t e);
    bool lists;
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

/* The softmax sums per row: LSE one per value, SSMW one. */
static size_t sums_per_row(const mpi_state *st)
{
    const enum sr_red_family f = st->rules->family;
    return f == SR_RED_FAM_LSE ? (size_t)st->dim : f == SR_RED_FAM_SSMW ? 1 : 0;
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
    size_t len = (size_t)n * (size_t)st->k * (size_t)dim, nr = n ? (size_t)n : 1;
    size_t nsum = sums_per_row(st) * nr, nmx = rules->family == SR_RED_FAM_SSMW ? nr : 0;
    size_t nscratch = fc->lists                          ? 3 * (size_t)st->k
                      : rules->family == SR_RED_FAM_SSMW ? (size_t)dim
                                                         : 0;
    int with_idx = mpi_family_indexed(rules->family);
    st->val = calloc(len ? len : 1, sizeof *st->val);
    if (with_idx)
        st->idx = calloc(len ? len : 1, sizeof *st->idx);
    if (nsum)
        st->wsum = calloc(nsum, sizeof *st->wsum);
    if (nmx)
        st->mx = malloc(nmx * sizeof *st->mx);
    if (nscratch)
        st->tv = malloc(nscratch * sizeof *st->tv);
    if (fc->lists)
        st->ti = malloc(nscratch * sizeof *st->ti);
    if (!st->val || (with_idx && !st->idx) || (nsum && !st->wsum) || (nmx && !st->mx) ||
        (nscratch && !st->tv) || (fc->lists && !st->ti)) {
        mpi_state_free(st);
        return SR_ENOMEM;
    }
    if (fc->init)
        fc->init(st);
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

/* The state's entries: n rows of k lists of dim values; the value entry e writes where the
 * state holds it as it is (SUM, EXT, ARGEXT, KSEL). */
static int64_t state_len(const mpi_state *st) { return st->n * st->k * st->dim; }
static double value_of(const mpi_state *st, int64_t e) { return st->val[e]; }

/* SUM: the values add (the state starts at 0). */
static void fold_sum(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    double *v = st->val + (size_t)r * st->dim;
    for (int c = 0; c < st->dim; c++)
        cpu_sum_combine(&v[c], load(bk->vals, br * st->dim + c, bk->dtype));
}

/* EXT and ARGEXT: the block's extreme replaces the row's when it ranks before it. */
static void init_ext(mpi_state *st)
{
    for (int64_t e = 0; e < state_len(st); e++)
        cpu_ext_init(st->rules->order, &st->val[e], &st->idx[e]);
}

static void fold_ext(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    double *v = st->val + (size_t)r * st->dim;
    int64_t *ix = st->idx + (size_t)r * st->dim;
    for (int c = 0; c < st->dim; c++) {
        const int64_t e = br * st->dim + c;
        cpu_ext_combine(st->rules->order, &v[c], &ix[c], load(bk->vals, e, bk->dtype),
                        bk->idx[e] + bk->offset);
    }
}

/* KSEL: the row's list of component c (st->filled entries, at stride dim) merged with the
 * block's kb entries, through three lists of scratch. */
static void init_ksel(mpi_state *st)
{
    for (int64_t e = 0; e < state_len(st); e++) {
        st->val[e] = sr_red_empty_value(st->rules->empty, st->rules->order);
        st->idx[e] = -1;
    }
}

static void fold_ksel(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    const int K = st->k, dim = st->dim, na = (int)st->filled, nb = bk->kb;
    double *sv = st->val + (size_t)r * K * dim, *av = st->tv, *bv = av + K, *ov = bv + K;
    int64_t *si = st->idx + (size_t)r * K * dim, *ai = st->ti, *bi = ai + K, *oi = bi + K;
    for (int c = 0; c < dim; c++) {
        for (int t = 0; t < na; t++) {
            av[t] = sv[t * dim + c];
            ai[t] = si[t * dim + c];
        }
        for (int t = 0; t < nb; t++) {
            bv[t] = load(bk->vals, (br * nb + t) * dim + c, bk->dtype);
            bi[t] = bk->idx[(br * nb + t) * dim + c] + bk->offset;
        }
        const int n = cpu_kmin_merge(av, ai, na, bv, bi, nb, K, ov, oi);
        for (int t = 0; t < n; t++) {
            sv[t * dim + c] = ov[t];
            si[t * dim + c] = oi[t];
        }
    }
}

/* LSE: each value's state (maximum in val, sum of exp(v - maximum) in wsum); a block's
 * LogSumExp l is the state (l, 1). */
static void init_lse(mpi_state *st)
{
    for (int64_t e = 0; e < state_len(st); e++) {
        struct cpu_lse a;
        cpu_lse_init(&a);
        st->val[e] = a.m;
        st->wsum[e] = a.s;
    }
}

static void fold_lse(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    for (int c = 0; c < st->dim; c++) {
        const int64_t e = r * st->dim + c;
        struct cpu_lse a = {st->val[e], st->wsum[e]};
        cpu_lse_combine(&a, (struct cpu_lse){load(bk->vals, br * st->dim + c, bk->dtype), 1.0});
        st->val[e] = a.m;
        st->wsum[e] = a.s;
    }
}

static double value_lse(const mpi_state *st, int64_t e)
{
    return cpu_lse_finish((struct cpu_lse){st->val[e], st->wsum[e]});
}

/* SSMW: per row the maximum mx, the sum wsum and the weighted sums in val. A block whose
 * softmax-weighted average is w and whose LogSumExp of F is l is the state (l, 1, w); one whose
 * every term is -inf (l = -inf) has weight exactly 0 and changes nothing. */
static void init_ssmw(mpi_state *st)
{
    for (int64_t r = 0; r < st->n; r++)
        cpu_ssmw_init(&st->mx[r], &st->wsum[r], st->val + (size_t)r * st->dim, st->dim);
}

static void fold_ssmw(mpi_state *st, int64_t r, int64_t br, const struct block *bk)
{
    const double l = load(bk->lse, br, bk->dtype);
    if (l == -INFINITY)
        return;
    for (int c = 0; c < st->dim; c++)
        st->tv[c] = load(bk->vals, br * st->dim + c, bk->dtype);
    cpu_ssmw_combine(&st->mx[r], &st->wsum[r], st->val + (size_t)r * st->dim, st->dim, l, 1.0,
                     st->tv);
}

static double value_ssmw(const mpi_state *st, int64_t e)
{
    double v;
    cpu_ssmw_finish(st->wsum[e / st->dim], &st->val[e], 1, &v);
    return v;
}

static const struct family_combine combine_of[SR_RED_FAM_COUNT] = {
    [SR_RED_FAM_SUM] = {NULL, fold_sum, value_of, false},
    [SR_RED_FAM_EXT] = {init_ext, fold_ext, value_of, false},
    [SR_RED_FAM_ARGEXT] = {init_ext, fold_ext, value_of, false},
    [SR_RED_FAM_KSEL] = {init_ksel, fold_ksel, value_of, true},
    [SR_RED_FAM_LSE] = {init_lse, fold_lse, value_lse, false},
    [SR_RED_FAM_SSMW] = {init_ssmw, fold_ssmw, value_ssmw, false},
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
    /* A state with nothing folded holds the reduction's empty result (docs/semantics.md). */
    const struct family_combine *fc = combine_rules(st->rules);
    for (int64_t e = 0; e < state_len(st); e++) {
        const double v = fc->value(st, e);
        if (out && dtype == SR_F64)
            ((double *)out)[e] = v;
        else if (out)
            ((float *)out)[e] = (float)v;
        if (out_idx)
            out_idx[e] = st->idx ? st->idx[e] : -1;
    }
}
