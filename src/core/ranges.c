/*
 * ranges.c — block-sparse ranges (pykeops' 6-tuple, include/symred.h, docs/ranges.md): the
 * checks, the normalised plan that the backends run (struct sr_rplan in core.h), and the
 * identity of the output rows that no block covers.
 *
 * The plan is built per call: its size is that of the user's ranges (O(Nc + Nr)), never of the
 * n x m matrix. Sorting the blocks and each block's intervals makes the checks for overlaps
 * O(N log N) and lets the backends fold the intervals in increasing index order, which the
 * reductions' tie rules (lowest index wins) and the merge of partial states rely on.
 */
#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An interval or block with its position in the user's array, for the messages. */
struct span {
    int64_t a, b, pos;
};

static int span_cmp(const void *x, const void *y)
{
    const struct span *s = x, *t = y;
    if (s->a != t->a)
        return s->a < t->a ? -1 : 1;
    return s->pos < t->pos ? -1 : s->pos > t->pos;
}

/* The triple of one axis, with the names the messages use. */
struct triple {
    int64_t nc, nr, nout, nred;
    const int64_t *ranges, *slices, *red;
    const char *rname, *sname, *qname, *oname, *pname;
};

/* Entry pos of array name, [ab[0], ab[1]), must lie in [0, n] with start <= end. */
static sr_status span_check(sr_ctx *ctx, const char *name, int64_t pos, const int64_t *ab,
                            const char *nname, int64_t n)
{
    if (ab[0] > ab[1])
        return sr__error(ctx, SR_EINVAL, "ranges: %s[%lld] = [%lld, %lld) has start > end", name,
                         (long long)pos, (long long)ab[0], (long long)ab[1]);
    if (ab[0] < 0 || ab[1] > n)
        return sr__error(ctx, SR_EINVAL,
                         "ranges: %s[%lld] = [%lld, %lld) is not inside [0, %s = %lld]", name,
                         (long long)pos, (long long)ab[0], (long long)ab[1], nname, (long long)n);
    return SR_OK;
}

static sr_status triple_check(sr_ctx *ctx, const struct triple *t)
{
    if (t->nc < 0 || t->nr < 0)
        return sr__error(ctx, SR_EINVAL, "ranges: negative count (%s: %lld, %s: %lld)", t->rname,
                         (long long)t->nc, t->qname, (long long)t->nr);
    if (t->nc > 0 && (!t->ranges || !t->slices))
        return sr__error(ctx, SR_EINVAL, "ranges: %s or %s is NULL but there are %lld blocks",
                         t->rname, t->sname, (long long)t->nc);
    if (t->nr > 0 && !t->red)
        return sr__error(ctx, SR_EINVAL, "ranges: %s is NULL but there are %lld intervals",
                         t->qname, (long long)t->nr);
    sr_status st;
    for (int64_t c = 0; c < t->nc; c++) {
        if ((st = span_check(ctx, t->rname, c, t->ranges + 2 * c, t->oname, t->nout)) != SR_OK)
            return st;
        int64_t prev = c > 0 ? t->slices[c - 1] : 0;
        if (t->slices[c] < prev || t->slices[c] > t->nr)
            return sr__error(ctx, SR_EINVAL,
                             "ranges: %s[%lld] = %lld must be in [%s, %lld] (slices are "
                             "non-decreasing end positions into %s, which has %lld intervals)",
                             t->sname, (long long)c, (long long)t->slices[c],
                             c > 0 ? "the previous slice" : "0", (long long)t->nr, t->qname,
                             (long long)t->nr);
    }
    for (int64_t q = 0; q < t->nr; q++)
        if ((st = span_check(ctx, t->qname, q, t->red + 2 * q, t->pname, t->nred)) != SR_OK)
            return st;
    return SR_OK;
}

sr_status sr__rplan_new(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *R,
                        struct sr_rplan *p)
{
    sr_ctx *ctx = k->ctx;
    memset(p, 0, sizeof *p);
    struct triple t;
    if (k->axis == 1)
        t = (struct triple){R->nranges_i, R->nredranges_j, r->nx,          r->ny,
                            R->ranges_i,  R->slices_i,     R->redranges_j, "ranges_i",
                            "slices_i",   "redranges_j",   "nx",           "ny"};
    else
        t = (struct triple){R->nranges_j, R->nredranges_i, r->ny,          r->nx,
                            R->ranges_j,  R->slices_j,     R->redranges_i, "ranges_j",
                            "slices_j",   "redranges_i",   "ny",           "nx"};
    /* The plan below takes at most (nc + nr + 1) * unit bytes; each count below half the limit
     * keeps the sum in range too. */
    const int64_t unit = 4 * sizeof(int64_t) + sizeof(struct span);
    int64_t bytes;
    if (!sr__size_mul(t.nc < 0 ? 0 : t.nc, 2, unit, &bytes) ||
        !sr__size_mul(t.nr < 0 ? 0 : t.nr, 2, unit, &bytes))
        return sr__error(ctx, SR_EOVERFLOW,
                         "ranges: %lld blocks and %lld intervals overflow the address space",
                         (long long)t.nc, (long long)t.nr);
    sr_status st = triple_check(ctx, &t);
    if (st != SR_OK)
        return st;
    /* One allocation: the plan (blk, rows, ivoff, iv), then the sort buffers. */
    size_t nc = (size_t)t.nc, nr = (size_t)t.nr;
    size_t plan = (2 * nc + 2 * (nc + 1) + 2 * nr) * sizeof(int64_t);
    char *mem = malloc(plan + (nc + nr) * sizeof(struct span) + 1);
    if (!mem)
        return sr__error(ctx, SR_ENOMEM, "ranges: out of memory for %lld blocks, %lld intervals",
                         (long long)t.nc, (long long)t.nr);
    p->mem = mem;
    p->blk = (int64_t *)mem;
    p->rows = p->blk + 2 * nc;
    p->ivoff = p->rows + nc + 1;
    p->iv = p->ivoff + nc + 1;
    struct span *blocks = (struct span *)(mem + plan), *ivs = blocks + nc;
    for (size_t c = 0; c < nc; c++)
        blocks[c] = (struct span){t.ranges[2 * c], t.ranges[2 * c + 1], (int64_t)c};
    qsort(blocks, nc, sizeof *blocks, span_cmp);
    int64_t last = -1; /* the previous non-empty block */
    for (size_t c = 0; c < nc; c++) {
        if (blocks[c].a == blocks[c].b)
            continue;
        if (last >= 0 && blocks[c].a < blocks[last].b) {
            sr_status e = sr__error(ctx, SR_EINVAL,
                                    "ranges: %s[%lld] = [%lld, %lld) and %s[%lld] = [%lld, %lld) "
                                    "overlap (each output row may belong to one block only)",
                                    t.rname, (long long)blocks[last].pos, (long long)blocks[last].a,
                                    (long long)blocks[last].b, t.rname, (long long)blocks[c].pos,
                                    (long long)blocks[c].a, (long long)blocks[c].b);
            sr__rplan_free(p);
            return e;
        }
        last = (int64_t)c;
    }
    /* Each block's intervals: sorted, checked for overlaps, coalesced, empty ones dropped. The
     * blocks are visited in row order, so the plan comes out sorted. */
    int64_t nb = 0, niv = 0;
    p->rows[0] = 0;
    p->ivoff[0] = 0;
    for (size_t c = 0; c < nc; c++) {
        int64_t pos = blocks[c].pos, q0 = pos > 0 ? t.slices[pos - 1] : 0, q1 = t.slices[pos];
        size_t n = 0;
        for (int64_t q = q0; q < q1; q++)
            if (t.red[2 * q] < t.red[2 * q + 1])
                ivs[n++] = (struct span){t.red[2 * q], t.red[2 * q + 1], q};
        qsort(ivs, n, sizeof *ivs, span_cmp);
        for (size_t u = 1; u < n; u++)
            if (ivs[u].a < ivs[u - 1].b) {
                sr_status e = sr__error(
                    ctx, SR_EINVAL,
                    "ranges: block %s[%lld] reduces over %s[%lld] = [%lld, %lld) and %s[%lld] = "
                    "[%lld, %lld), which overlap (their common indices would count twice)",
                    t.rname, (long long)pos, t.qname, (long long)ivs[u - 1].pos,
                    (long long)ivs[u - 1].a, (long long)ivs[u - 1].b, t.qname,
                    (long long)ivs[u].pos, (long long)ivs[u].a, (long long)ivs[u].b);
                sr__rplan_free(p);
                return e;
            }
        if (n == 0 || blocks[c].a == blocks[c].b)
            continue; /* the identity, written by sr__run_ranges */
        int64_t first = niv;
        for (size_t u = 0; u < n; u++) {
            if (niv > first && p->iv[2 * niv - 1] == ivs[u].a) {
                p->iv[2 * niv - 1] = ivs[u].b;
                continue;
            }
            p->iv[2 * niv] = ivs[u].a;
            p->iv[2 * niv + 1] = ivs[u].b;
            niv++;
        }
        p->blk[2 * nb] = blocks[c].a;
        p->blk[2 * nb + 1] = blocks[c].b;
        p->rows[nb + 1] = p->rows[nb] + (blocks[c].b - blocks[c].a);
        p->ivoff[nb + 1] = niv;
        nb++;
    }
    p->nblocks = nb;
    p->nrows = p->rows[nb];
    return SR_OK;
}

void sr__rplan_free(struct sr_rplan *p)
{
    free(p->mem);
    p->mem = NULL;
}

int64_t sr__rplan_block(const struct sr_rplan *p, int64_t f)
{
    int64_t lo = 0, hi = p->nblocks - 1; /* the last block whose first flat row is <= f */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (p->rows[mid] <= f)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

sr_status sr__rplan_window(const struct sr_rplan *p, int64_t o0, int64_t o1, struct sr_rplan *out)
{
    memset(out, 0, sizeof *out);
    /* the blocks meeting [o0, o1): blk is sorted by rows */
    int64_t c0 = 0, c1;
    while (c0 < p->nblocks && p->blk[2 * c0 + 1] <= o0)
        c0++;
    for (c1 = c0; c1 < p->nblocks && p->blk[2 * c1] < o1;)
        c1++;
    size_t n = (size_t)(c1 - c0);
    int64_t *mem = malloc((2 * n + n + 1 + 1) * sizeof *mem);
    if (!mem)
        return SR_ENOMEM;
    out->mem = mem;
    out->blk = mem;
    out->rows = mem + 2 * n;
    out->ivoff = p->ivoff + c0; /* shared: the offsets index p->iv */
    out->iv = p->iv;
    out->rows[0] = 0;
    for (size_t c = 0; c < n; c++) {
        int64_t a = p->blk[2 * (c0 + (int64_t)c)], b = p->blk[2 * (c0 + (int64_t)c) + 1];
        a = (a > o0 ? a : o0) - o0;
        b = (b < o1 ? b : o1) - o0;
        out->blk[2 * c] = a;
        out->blk[2 * c + 1] = b;
        out->rows[c + 1] = out->rows[c] + (b - a);
    }
    out->nblocks = (int64_t)n;
    out->nrows = out->rows[n];
    return SR_OK;
}

void sr__fill_identity(const sr_kernel *k, const sr_run_desc *r, int64_t o0, int64_t o1)
{
    size_t a = (size_t)o0 * (size_t)k->out_dim, b = (size_t)o1 * (size_t)k->out_dim;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    if (ri->indices)
        for (size_t i = a; i < b; i++)
            r->out_idx[i] = -1;
    if (!ri->values)
        return;
    /* What the empty reduction writes (the rules table's empty column). */
    const double v = sr_red_empty_value(ri->empty, ri->order);
    const sr_dtype dt = k->io_native ? k->io : k->dtype;
    for (size_t i = a; i < b; i++)
        sr__dtype_put(dt, r->out, (int64_t)i, v);
}

sr_status sr__run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p)
{
    if (!k->backend->run_ranges)
        return sr__error(k->ctx, SR_ENOTSUP,
                         "block-sparse ranges are not supported on the %s backend (yet): run the "
                         "kernel on the CPU (SR_DEVICE_CPU) or without ranges",
                         k->backend->name);
    sr_status st = SR_OK;
    if (p->nblocks > 0) {
        const int stage = sr__call_stage(k);
        st = k->backend->run_ranges(k, r, p);
        sr__call_log(k, stage);
    }
    if (st != SR_OK)
        return st;
    /* The gaps between the blocks (and blocks with no interval, which the plan dropped). */
    int64_t nout = k->axis == 1 ? r->nx : r->ny, o = 0;
    for (int64_t c = 0; c <= p->nblocks; c++) {
        int64_t next = c < p->nblocks ? p->blk[2 * c] : nout;
        if (next > o)
            sr__fill_identity(k, r, o, next);
        if (c < p->nblocks)
            o = p->blk[2 * c + 1];
    }
    return SR_OK;
}
