/* tensordot.c — TensorDot's index lists: checking, interning in the context, and the index
 * arithmetic that the reference interpreter, the JIT emitter and the derivative rule share. */
#include "expr.h"

#include <stdlib.h>
#include <string.h>

/* Whether the n entries of v are distinct values in [0, lim). */
static bool distinct_in(const int *v, int n, int lim)
{
    bool seen[2 * EXPR_TDOT_MAXRANK] = {false};
    for (int k = 0; k < n; k++) {
        if (v[k] < 0 || v[k] >= lim || seen[v[k]])
            return false;
        seen[v[k]] = true;
    }
    return true;
}

static bool contains(const int32_t *v, int n, int x)
{
    for (int k = 0; k < n; k++)
        if (v[k] == x)
            return true;
    return false;
}

/* The derived arrays: sizes and strides of the output axes and of the contracted axes. */
static void derive(struct expr_tdot *t)
{
    const int ra = t->key.ra, rb = t->key.rb, nc = t->key.nc;
    int64_t sa[EXPR_TDOT_MAXRANK], sb[EXPR_TDOT_MAXRANK]; /* row-major strides */
    int64_t s = 1;
    for (int k = ra; k-- > 0;) {
        sa[k] = s;
        s *= t->key.da[k];
    }
    t->dim_a = s;
    s = 1;
    for (int k = rb; k-- > 0;) {
        sb[k] = s;
        s *= t->key.db[k];
    }
    t->dim_b = s;
    /* Kept axes: a's then b's, increasing; kept axis k goes to output position perm[k]. */
    int nk = 0;
    for (int k = 0; k < ra; k++)
        if (!contains(t->key.ca, nc, k)) {
            int p = t->key.perm[nk++];
            t->osize[p] = t->key.da[k];
            t->ostride_a[p] = sa[k];
            t->ostride_b[p] = 0;
        }
    for (int k = 0; k < rb; k++)
        if (!contains(t->key.cb, nc, k)) {
            int p = t->key.perm[nk++];
            t->osize[p] = t->key.db[k];
            t->ostride_a[p] = 0;
            t->ostride_b[p] = sb[k];
        }
    t->nout = nk;
    t->dim_out = 1;
    for (int p = 0; p < nk; p++)
        t->dim_out *= t->osize[p];
    t->ncont = 1;
    for (int k = 0; k < nc; k++) {
        t->csize[k] = t->key.da[t->key.ca[k]];
        t->cstride_a[k] = sa[t->key.ca[k]];
        t->cstride_b[k] = sb[t->key.cb[k]];
        t->ncont *= t->csize[k];
    }
}

/* Checks the shape of operand `name` (dims >= 1, at most 2^24 components) and copies it. */
static sr_status check_shape(sr_ctx *ctx, char name, int r, const int *d, int32_t *out)
{
    int64_t prod = 1;
    for (int k = 0; k < r; k++) {
        if (d[k] < 1)
            return expr_builder_error(ctx, SR_EDIM, "TensorDot: dimension %d of %c is %d, not >= 1",
                                      k, name, d[k]);
        prod *= d[k];
        if (prod > (1 << 24))
            return expr_builder_error(ctx, SR_EDIM, "TensorDot: the shape of %c is too large",
                                      name);
        out[k] = d[k];
    }
    return SR_OK;
}

/* Checks the lists into *t (zeroed by the caller); SR_OK or the error, recorded. */
static sr_status check(sr_ctx *ctx, struct expr_tdot *t, int ra, const int *da, int rb,
                       const int *db, int nc, const int *ca, const int *cb, const int *perm)
{
    const int M = EXPR_TDOT_MAXRANK;
    if (ra < 0 || rb < 0 || ra > M || rb > M)
        return expr_builder_error(
            ctx, SR_EINVAL, "TensorDot: tensor ranks %d and %d must be in [0, %d]", ra, rb, M);
    if (nc < 0 || nc > ra || nc > rb)
        return expr_builder_error(ctx, SR_EINVAL,
                                  "TensorDot: %d contracted axes for tensors of ranks %d and %d",
                                  nc, ra, rb);
    if ((ra && !da) || (rb && !db) || (nc && (!ca || !cb)))
        return expr_builder_error(ctx, SR_EINVAL,
                                  "TensorDot: a list of dimensions or axes is NULL");
    sr_status st = check_shape(ctx, 'a', ra, da, t->key.da);
    if (st == SR_OK)
        st = check_shape(ctx, 'b', rb, db, t->key.db);
    if (st != SR_OK)
        return st;
    if (!distinct_in(ca, nc, ra) || !distinct_in(cb, nc, rb))
        return expr_builder_error(ctx, SR_EINVAL,
                                  "TensorDot: contracted axes must be distinct axes of their "
                                  "tensor (a has rank %d, b has rank %d)",
                                  ra, rb);
    for (int k = 0; k < nc; k++) {
        if (da[ca[k]] != db[cb[k]])
            return expr_builder_error(ctx, SR_EDIM,
                                      "TensorDot: contracted axis %d of a has size %d but axis %d "
                                      "of b has size %d",
                                      ca[k], da[ca[k]], cb[k], db[cb[k]]);
        t->key.ca[k] = ca[k];
        t->key.cb[k] = cb[k];
    }
    int nk = ra + rb - 2 * nc;
    if (perm && !distinct_in(perm, nk, nk))
        return expr_builder_error(ctx, SR_EINVAL,
                                  "TensorDot: permute must be a permutation of 0..%d (the %d kept "
                                  "axes)",
                                  nk - 1, nk);
    for (int k = 0; k < nk; k++)
        t->key.perm[k] = perm ? perm[k] : k;
    t->key.ra = ra;
    t->key.rb = rb;
    t->key.nc = nc;
    return SR_OK;
}

int expr_tdot_intern(sr_ctx *ctx, int ra, const int *da, int rb, const int *db, int nc,
                     const int *ca, const int *cb, const int *perm)
{
    struct expr_tdot t;
    memset(&t, 0, sizeof t);
    if (check(ctx, &t, ra, da, rb, db, nc, ca, cb, perm) != SR_OK)
        return -1;
    struct expr_store *s = &expr_ctx(ctx)->store;
    for (int i = 0; i < s->ntdots; i++)
        if (memcmp(&s->tdots[i]->key, &t.key, sizeof t.key) == 0)
            return i;
    uint64_t h = 0x7444ULL;
    const int32_t *w = (const int32_t *)&t.key;
    for (size_t i = 0; i < sizeof t.key / sizeof *w; i++)
        h = expr_hash_mix(h, (uint64_t)(uint32_t)w[i]);
    t.hash = h;
    derive(&t);
    if (s->ntdots == s->captdots) {
        int cap = s->captdots ? 2 * s->captdots : 8;
        struct expr_tdot **p = realloc(s->tdots, (size_t)cap * sizeof *p);
        if (!p) {
            expr_builder_error(ctx, SR_ENOMEM, "TensorDot: out of memory");
            return -1;
        }
        s->tdots = p;
        s->captdots = cap;
    }
    struct expr_tdot *n = expr_arena_alloc(s, sizeof *n);
    if (!n) {
        expr_builder_error(ctx, SR_ENOMEM, "TensorDot: out of memory");
        return -1;
    }
    *n = t;
    s->tdots[s->ntdots] = n;
    return s->ntdots++;
}

const struct expr_tdot *expr_tdot_get(const sr_ctx *ctx, int64_t idx)
{
    return idx >= 0 && idx < expr_ctx_c(ctx)->store.ntdots ? expr_ctx_c(ctx)->store.tdots[idx]
                                                           : NULL;
}

const struct expr_tdot *expr_tdot_of(const sr_expr *e)
{
    return expr_tdot_get(e->ctx, e->iattr[0]);
}

void expr_tdot_index(const struct expr_tdot *t, int64_t o, int64_t c, int64_t *ia, int64_t *ib)
{
    int64_t a = 0, b = 0;
    for (int p = t->nout; p-- > 0;) {
        int64_t q = o % t->osize[p];
        o /= t->osize[p];
        a += q * t->ostride_a[p];
        b += q * t->ostride_b[p];
    }
    for (int k = t->key.nc; k-- > 0;) {
        int64_t q = c % t->csize[k];
        c /= t->csize[k];
        a += q * t->cstride_a[k];
        b += q * t->cstride_b[k];
    }
    *ia = a;
    *ib = b;
}
