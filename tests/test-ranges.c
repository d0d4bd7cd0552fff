/*
 * test-ranges.c — block-sparse ranges (sr_kernel_run_ranges, pykeops' 6-tuple).
 *
 * Every reduction on both axes and both dtypes, on random block patterns (blocks and intervals
 * in random order, empty ones, uncovered rows, single-row blocks, sizes 0, 1 and primes, blocks
 * not aligned to any tile): the CPU JIT against the reference interpreter, and the reference
 * against an oracle that knows nothing of ranges: for each output row, the dense reference
 * reduction over the gathered reduced rows its block allows. Then the gemm-epilogue and
 * reduction-rewrite paths, a tiny memory budget, gradients against a direct masked sum, and
 * every malformed input.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "diff.h"
#include "util.h"

/* ---- random block patterns ------------------------------------------------------------------ */

/* One triple (blocks of the output side, intervals of the reduced side) and its mask. */
struct pattern {
    int64_t nout, nred, nc, nr;
    int64_t *ranges, *slices, *red;
    unsigned char *mask; /* nout x nred: pair (o, r) is reduced */
};

static int64_t rnd(uint64_t *s, int64_t n)
{
    return n > 0 ? (int64_t)(tu_rand(s) % (uint64_t)n) : 0;
}

/* Random cut points of [0, n): *ncut segments' bounds in cuts[0..ncut] (cuts[0] = 0). */
static int64_t cut(uint64_t *s, int64_t n, int64_t maxseg, int64_t *cuts)
{
    int64_t m = 0;
    cuts[0] = 0;
    while (cuts[m] < n && m < maxseg - 1) {
        int64_t step = 1 + rnd(s, n / 2 + 1);
        cuts[m + 1] = cuts[m] + step < n ? cuts[m] + step : n;
        m++;
    }
    if (cuts[m] < n)
        cuts[++m] = n;
    return m;
}

static void shuffle(uint64_t *s, int64_t *a, int64_t n, int width)
{
    for (int64_t t = n - 1; t > 0; t--) {
        int64_t u = rnd(s, t + 1);
        for (int w = 0; w < width; w++) {
            int64_t tmp = a[t * width + w];
            a[t * width + w] = a[u * width + w];
            a[u * width + w] = tmp;
        }
    }
}

/* style 0: random; 1: one block over everything; 2: one block per row, random intervals;
 * 3: no block at all. */
static void pattern_new(struct pattern *p, int64_t nout, int64_t nred, uint64_t seed, int style)
{
    uint64_t s = seed * 2654435761u + 17;
    memset(p, 0, sizeof *p);
    p->nout = nout;
    p->nred = nred;
    int64_t cap = nout + 16;
    int64_t *blocks = calloc((size_t)cap * 2, sizeof *blocks); /* [a, b) */
    int64_t *cuts = calloc((size_t)(nout + nred + 20), sizeof *cuts);
    int64_t nb = 0;
    if (style == 1) {
        blocks[0] = 0;
        blocks[1] = nout;
        nb = 1;
    } else if (style == 2) {
        for (int64_t o = 0; o < nout; o++, nb++) {
            blocks[2 * nb] = o;
            blocks[2 * nb + 1] = o + 1;
        }
    } else if (style == 0) {
        int64_t m = cut(&s, nout, 9, cuts);
        for (int64_t t = 0; t < m; t++)
            if (rnd(&s, 5) != 0) { /* one in five segments stays uncovered */
                blocks[2 * nb] = cuts[t];
                blocks[2 * nb + 1] = cuts[t + 1];
                nb++;
            }
        int64_t e = rnd(&s, nout + 1); /* an empty block */
        blocks[2 * nb] = e;
        blocks[2 * nb + 1] = e;
        nb++;
    }
    shuffle(&s, blocks, nb, 2);
    /* Each block: some of the segments of a random cut of [0, nred), shuffled, plus empty
     * intervals now and then. */
    int64_t rcap = nb * (nred + 8) + 8;
    p->ranges = calloc((size_t)(2 * nb + 2), sizeof(int64_t));
    p->slices = calloc((size_t)(nb + 1), sizeof(int64_t));
    p->red = calloc((size_t)(2 * rcap), sizeof(int64_t));
    p->mask = calloc((size_t)(nout * nred + 1), 1);
    int64_t nr = 0;
    for (int64_t c = 0; c < nb; c++) {
        p->ranges[2 * c] = blocks[2 * c];
        p->ranges[2 * c + 1] = blocks[2 * c + 1];
        int64_t q0 = nr;
        if (style == 1) {
            p->red[2 * nr] = 0;
            p->red[2 * nr + 1] = nred;
            nr++;
        } else {
            int64_t m = cut(&s, nred, 7, cuts);
            for (int64_t t = 0; t < m; t++)
                if (rnd(&s, 2)) {
                    p->red[2 * nr] = cuts[t];
                    p->red[2 * nr + 1] = cuts[t + 1];
                    nr++;
                }
            if (rnd(&s, 3) == 0) {
                int64_t e = rnd(&s, nred + 1);
                p->red[2 * nr] = e;
                p->red[2 * nr + 1] = e;
                nr++;
            }
            shuffle(&s, p->red + 2 * q0, nr - q0, 2);
        }
        p->slices[c] = nr;
        for (int64_t o = blocks[2 * c]; o < blocks[2 * c + 1]; o++)
            for (int64_t q = q0; q < nr; q++)
                for (int64_t r = p->red[2 * q]; r < p->red[2 * q + 1]; r++)
                    p->mask[o * nred + r] = 1;
    }
    p->nc = nb;
    p->nr = nr;
    free(blocks);
    free(cuts);
}

static void pattern_free(struct pattern *p)
{
    free(p->ranges);
    free(p->slices);
    free(p->red);
    free(p->mask);
}

/* The 6-tuple with p as the triple of axis (the other triple left zero: only the kernel's
 * triple may be read). */
static sr_ranges ranges_of(const struct pattern *p, int axis)
{
    sr_ranges R;
    memset(&R, 0, sizeof R);
    if (axis == 1) {
        R.nranges_i = p->nc;
        R.ranges_i = p->ranges;
        R.slices_i = p->slices;
        R.nredranges_j = p->nr;
        R.redranges_j = p->red;
    } else {
        R.nranges_j = p->nc;
        R.ranges_j = p->ranges;
        R.slices_j = p->slices;
        R.nredranges_i = p->nr;
        R.redranges_i = p->red;
    }
    return R;
}

/* ---- inputs and outputs ------------------------------------------------------------------------
 */

struct io {
    void *buf[8];
    const void *args[8];
    size_t esz;
};

/* Grid values (multiples of 1/64 in [-2, 2)): F is exact in float32, so the JIT and the
 * reference pick the same indices. */
static void io_new(struct io *in, const sr_kernel *k, int64_t nx, int64_t ny, uint64_t seed)
{
    memset(in, 0, sizeof *in);
    in->esz = sr_dtype_size(k->dtype);
    uint64_t s = seed + 99;
    for (int v = 0; v < k->nargs; v++) {
        int64_t rows = k->vars[v].cat == SR_CAT_I ? nx : k->vars[v].cat == SR_CAT_J ? ny : 1;
        int64_t n = rows * k->vars[v].dim;
        in->buf[v] = malloc((size_t)(n + 1) * in->esz);
        for (int64_t t = 0; t < n; t++) {
            double x = round(tu_uniform(&s, -2.0, 2.0) * 64.0) / 64.0;
            if (k->dtype == SR_F64)
                ((double *)in->buf[v])[t] = x;
            else
                ((float *)in->buf[v])[t] = (float)x;
        }
        in->args[v] = in->buf[v];
    }
}

static void io_free(struct io *in)
{
    for (int v = 0; v < 8; v++)
        free(in->buf[v]);
}

static double val(const sr_kernel *k, const void *out, int64_t t)
{
    return k->dtype == SR_F64 ? ((const double *)out)[t] : ((const float *)out)[t];
}

/* Runs k with ranges R; outputs into fresh buffers (filled with garbage first, so that every
 * value must be written). */
static sr_status run_ranges(sr_kernel *k, int64_t nx, int64_t ny, const struct io *in,
                            const sr_ranges *R, void **vals, int64_t **idx)
{
    int64_t n = (k->axis == 1 ? nx : ny) * k->out_dim + 1;
    *vals = malloc((size_t)n * 8);
    *idx = malloc((size_t)n * 8);
    memset(*vals, 0x7b, (size_t)n * 8);
    memset(*idx, 0x7b, (size_t)n * 8);
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    sr_run_desc r = {.nx = nx,
                     .ny = ny,
                     .nargs = k->nargs,
                     .args = in->args,
                     .out = ri->values ? *vals : NULL,
                     .out_idx = ri->indices ? *idx : NULL};
    return sr_kernel_run_ranges(k, &r, R);
}

/* ---- the oracle: dense reductions over the gathered reduced rows of each output row -----------
 */

/* kref[kk] (kk = 1..K): reference kernels of the same reduction with k = kk (one for the
 * non-K reductions). Writes the expected outputs of every output row into vals / idx. */
static void oracle(sr_kernel *const *kref, int K, int64_t nx, int64_t ny, const struct io *in,
                   const struct pattern *p, void *vals, int64_t *idx)
{
    const sr_kernel *k = kref[K];
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    int64_t nout = p->nout, nred = p->nred, D = k->fdim, od = k->out_dim;
    sr_cat ocat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    int64_t *list = malloc((size_t)(nred + 1) * sizeof *list);
    void *gath[8] = {0};
    const void *args[8];
    for (int v = 0; v < k->nargs; v++)
        gath[v] = malloc((size_t)((nred + 1) * k->vars[v].dim) * in->esz);
    void *ov = malloc((size_t)od * 8);
    int64_t *oi = malloc((size_t)od * 8);
    for (int64_t o = 0; o < nout; o++) {
        int64_t n = 0;
        for (int64_t r = 0; r < nred; r++)
            if (p->mask[o * nred + r])
                list[n++] = r;
        sr_run_desc rd = {0};
        if (n == 0) {
            sr__fill_identity(k, &(sr_run_desc){.out = vals, .out_idx = idx}, o, o + 1);
            continue;
        }
        for (int v = 0; v < k->nargs; v++) {
            size_t rowb = (size_t)k->vars[v].dim * in->esz;
            if (k->vars[v].cat == SR_CAT_PARAM) {
                args[v] = in->args[v];
            } else if (k->vars[v].cat == ocat) {
                args[v] = (const char *)in->args[v] + (size_t)o * rowb;
            } else {
                for (int64_t t = 0; t < n; t++)
                    memcpy((char *)gath[v] + (size_t)t * rowb,
                           (const char *)in->args[v] + (size_t)list[t] * rowb, rowb);
                args[v] = gath[v];
            }
        }
        int kk = ri->uses_k && n < K ? (int)n : K;
        const sr_kernel *kr = kref[kk];
        rd = (sr_run_desc){.nx = k->axis == 1 ? 1 : n,
                           .ny = k->axis == 1 ? n : 1,
                           .nargs = k->nargs,
                           .args = args,
                           .out = ri->values ? ov : NULL,
                           .out_idx = ri->indices ? oi : NULL};
        cr_assert_eq(sr_kernel_run_ex(kr, &rd), SR_OK, "oracle: %s", sr_ctx_error(k->ctx));
        /* kk < K: the first kk rows of the K x D result, then the padding */
        for (int64_t t = 0; t < od; t++) {
            int64_t q = t / D, c = t % D;
            bool have = !ri->uses_k || q < kk;
            int64_t src = q * D + c;
            if (ri->values) {
                double v = have ? (k->dtype == SR_F64 ? ((double *)ov)[src] : ((float *)ov)[src])
                                : INFINITY;
                if (k->dtype == SR_F64)
                    ((double *)vals)[o * od + t] = v;
                else
                    ((float *)vals)[o * od + t] = (float)v;
            }
            if (ri->indices)
                idx[o * od + t] = have && oi[src] >= 0 ? list[oi[src]] : -1;
        }
    }
    for (int v = 0; v < k->nargs; v++)
        free(gath[v]);
    free(list);
    free(ov);
    free(oi);
}

static void compare(const sr_kernel *k, int64_t n, const void *va, const int64_t *ia,
                    const void *vb, const int64_t *ib, struct diff_tol tl, const char *what)
{
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    for (int64_t t = 0; t < n * k->out_dim; t++) {
        if (ri->values)
            cr_assert(tu_close(val(k, va, t), val(k, vb, t), tl.rtol, tl.atol),
                      "%s: value %lld (row %lld): %.9g, expected %.9g", what, (long long)t,
                      (long long)(t / k->out_dim), val(k, va, t), val(k, vb, t));
        if (ri->indices)
            cr_assert_eq(ia[t], ib[t], "%s: index %lld (row %lld): %lld, expected %lld", what,
                         (long long)t, (long long)(t / k->out_dim), (long long)ia[t],
                         (long long)ib[t]);
    }
}

/* ---- every reduction --------------------------------------------------------------------------
 */

static const char *const aliases[] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "b=Vj(2)"};

static void check_reduction(sr_reduction red)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *ftext = "Concat(SqDist(x, y), (x|y) - p)";
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    const int K = sr_reductions[red].uses_k ? 3 : 1;
    if (red == SR_SUMSOFTMAXWEIGHT) {
        ftext = "-SqDist(x, y) * p";
        d.weight = diff_parse(ctx, "Concat(b, Elem(x, 0) * Elem(y, 1))", aliases, 4);
    }
    if (red == SR_LOGSUMEXP)
        ftext = "Concat(-SqDist(x, y) * p, (x|y))";
    sr_expr *f = diff_parse(ctx, ftext, aliases, 4);
    static const int64_t sizes[][2] = {{0, 5},    {5, 0},    {1, 3},    {3, 1},   {7, 7},
                                       {13, 101}, {101, 13}, {97, 257}, {2, 1031}};
    for (int dt = 0; dt < 2; dt++)
        for (int axis = 1; axis >= 0; axis--) {
            d.dtype = (sr_dtype)dt;
            d.axis = axis;
            d.k = K;
            sr_kernel *kj = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
            sr_kernel *kref[4] = {0};
            for (int kk = 1; kk <= K; kk++) {
                d.k = kk;
                kref[kk] = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
            }
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                for (int style = 0; style < 4; style++) {
                    int64_t nx = sizes[s][0], ny = sizes[s][1];
                    int64_t nout = axis == 1 ? nx : ny, nred = axis == 1 ? ny : nx;
                    if (K > nred)
                        continue; /* k <= the reduced count, ranges or not */
                    struct pattern p;
                    pattern_new(&p, nout, nred, 31 * s + (uint64_t)style, style);
                    sr_ranges R = ranges_of(&p, axis);
                    struct io in;
                    io_new(&in, kj, nx, ny, s);
                    void *vj, *vr, *vo;
                    int64_t *ij, *ir, *io_;
                    char what[128];
                    snprintf(what, sizeof what, "%s %s axis %d %lldx%lld pattern %d",
                             sr_reduction_name(red), dt ? "f64" : "f32", axis, (long long)nx,
                             (long long)ny, style);
                    cr_assert_eq(run_ranges(kj, nx, ny, &in, &R, &vj, &ij), SR_OK, "%s: %s", what,
                                 sr_ctx_error(ctx));
                    cr_assert_eq(run_ranges(kref[K], nx, ny, &in, &R, &vr, &ir), SR_OK, "%s: %s",
                                 what, sr_ctx_error(ctx));
                    vo = malloc((size_t)(nout * kj->out_dim + 1) * 8);
                    io_ = malloc((size_t)(nout * kj->out_dim + 1) * 8);
                    oracle(kref, K, nx, ny, &in, &p, vo, io_);
                    /* the reference reduces the gathered rows in the same order: the same
                     * values to the last bit, up to the float32 rounding of one output */
                    compare(kj, nout, vr, ir, vo, io_, (struct diff_tol){1e-12, 0}, what);
                    compare(kj, nout, vj, ij, vr, ir, diff_tol_of(d.dtype), what);
                    free(vj);
                    free(vr);
                    free(vo);
                    free(ij);
                    free(ir);
                    free(io_);
                    io_free(&in);
                    pattern_free(&p);
                }
            sr_kernel_free(kj);
            for (int kk = 1; kk <= K; kk++)
                sr_kernel_free(kref[kk]);
        }
    sr_ctx_free(ctx);
}

#define RANGES_RED_TEST_(red, name)                                                                \
    Test(ranges, name) { check_reduction(red); }
DIFF_RED_TESTS(RANGES_RED_TEST_)
#undef RANGES_RED_TEST_

/* ---- the other CPU paths ----------------------------------------------------------------------
 */

/* kj (the path under test) against the reference kernel kr on random patterns of both sizes. */
static void check_path(sr_kernel *kj, sr_kernel *kr, int64_t nx, int64_t ny, const char *name)
{
    for (int style = 0; style < 3; style++) {
        int64_t nout = kj->axis == 1 ? nx : ny, nred = kj->axis == 1 ? ny : nx;
        struct pattern p;
        pattern_new(&p, nout, nred, 7 + (uint64_t)style, style);
        sr_ranges R = ranges_of(&p, kj->axis);
        struct io in;
        io_new(&in, kj, nx, ny, 3);
        void *vj, *vr;
        int64_t *ij, *ir;
        char what[128];
        snprintf(what, sizeof what, "%s axis %d pattern %d", name, kj->axis, style);
        cr_assert_eq(run_ranges(kj, nx, ny, &in, &R, &vj, &ij), SR_OK, "%s: %s", what,
                     sr_ctx_error(kj->ctx));
        cr_assert_eq(run_ranges(kr, nx, ny, &in, &R, &vr, &ir), SR_OK, "%s: %s", what,
                     sr_ctx_error(kj->ctx));
        compare(kj, nout, vj, ij, vr, ir, (struct diff_tol){1e-3, 1e-3}, what);
        free(vj);
        free(vr);
        free(ij);
        free(ir);
        io_free(&in);
        pattern_free(&p);
    }
}

Test(ranges, gemm_epilogue)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const char *const al[] = {"x=Vi(40)", "y=Vj(40)", "b=Vj(1)"};
    static const struct {
        const char *f;
        sr_reduction red;
        int k;
    } cases[] = {{"Exp(-SqDist(x, y) * 0.01) * b", SR_SUM, 1},
                 {"SqDist(x, y)", SR_ARGKMIN, 4},
                 {"SqDist(x, y)", SR_MIN_ARGMIN, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int axis = 1; axis >= 0; axis--) {
            sr_expr *f = diff_parse(ctx, cases[c].f, al, 3);
            sr_kernel_desc d = sr_kernel_desc_default();
            d.reduction = cases[c].red;
            d.k = cases[c].k;
            d.axis = axis;
            sr_kernel *kj = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
            sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
            cr_assert_eq(tu_plan(kj).inner, SR_STRATEGY_GEMM_EPILOGUE,
                         "%s axis %d: not the gemm-epilogue path:\n%s", cases[c].f, axis,
                         sr_kernel_explain(kj));
            check_path(kj, kr, 601, 577, cases[c].f);
            sr_kernel_free(kj);
            sr_kernel_free(kr);
        }
    sr_ctx_free(ctx);
}

Test(ranges, reduction_rewrite)
{
    /* The i-only factor moves out of the Sum and the shift out of the Min: the inner kernel
     * reduces chunk by chunk with the ranges of each chunk. A small budget makes the chunks
     * small (post.c sizes them from it). */
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const char *const al[] = {"x=Vi(2)", "y=Vj(2)", "a=Vi(1)"};
    static const struct {
        const char *f;
        sr_reduction red;
    } cases[] = {{"a * Exp(-SqDist(x, y))", SR_SUM}, {"SqDist(x, y) + a", SR_MIN}};
    for (int budget = 0; budget < 2; budget++)
        for (size_t c = 0; c < 2; c++) {
            cr_assert_eq(sr_ctx_set_mem_limit(ctx, budget ? 60000 : 0), SR_OK);
            sr_expr *f = diff_parse(ctx, cases[c].f, al, 3);
            sr_kernel_desc d = sr_kernel_desc_default();
            d.reduction = cases[c].red;
            d.dtype = SR_F64;
            sr_kernel *kj = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
            sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
            cr_assert_eq(tu_plan(kj).strategy, SR_STRATEGY_POST_REWRITE, "%s: no rewrite:\n%s",
                         cases[c].f, sr_kernel_explain(kj));
            check_path(kj, kr, 1999, 301, cases[c].f);
            sr_kernel_free(kj);
            sr_kernel_free(kr);
        }
    sr_ctx_free(ctx);
}

Test(ranges, small_budget)
{
    /* Tiles of 16 reduced indices and a few rows: intervals cross many tile boundaries. */
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 4000), SR_OK);
    sr_expr *f = diff_parse(ctx, "Concat(SqDist(x, y), (x|y) - p)", aliases, 4);
    for (int axis = 1; axis >= 0; axis--) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = SR_KMIN_ARGKMIN;
        d.k = 2;
        d.axis = axis;
        sr_kernel *kj = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
        sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
        check_path(kj, kr, 211, 389, "KMin_ArgKMin under a 4000-byte budget");
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
    sr_ctx_free(ctx);
}

Test(ranges, full_block_is_dense)
{
    /* One block over everything gives the dense result, on a size with a split reduced range
     * in the dense path. */
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = diff_parse(ctx, "Concat(SqDist(x, y), (x|y) - p)", aliases, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_MIN_ARGMIN;
    sr_kernel *k = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
    int64_t nx = 3, ny = 9001;
    struct io in;
    io_new(&in, k, nx, ny, 5);
    int64_t rg[2] = {0, nx}, sl[1] = {1}, rd[2] = {0, ny};
    sr_ranges R = {
        .nranges_i = 1, .ranges_i = rg, .slices_i = sl, .nredranges_j = 1, .redranges_j = rd};
    void *vr, *vd;
    int64_t *ir, *id;
    cr_assert_eq(run_ranges(k, nx, ny, &in, &R, &vr, &ir), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(run_ranges(k, nx, ny, &in, NULL, &vd, &id), SR_OK, "%s", sr_ctx_error(ctx));
    compare(k, nx, vr, ir, vd, id, (struct diff_tol){0, 0}, "one full block");
    free(vr);
    free(vd);
    free(ir);
    free(id);
    io_free(&in);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}

/* ---- gradients --------------------------------------------------------------------------------
 */

/* Both triples of one block pattern, as pykeops' from_matrix builds them: row clusters,
 * column clusters and a keep matrix. */
struct both {
    int64_t rc[16], cc[16], nrc, ncc;
    unsigned char keep[16][16];
    int64_t ri[32], si[16], rj[512], rj_[32], sj[16], ri_[512];
    sr_ranges R;
};

static void both_new(struct both *b, int64_t nx, int64_t ny, uint64_t seed)
{
    uint64_t s = seed;
    memset(b, 0, sizeof *b);
    b->nrc = cut(&s, nx, 15, b->rc);
    b->ncc = cut(&s, ny, 15, b->cc);
    for (int64_t a = 0; a < b->nrc; a++)
        for (int64_t c = 0; c < b->ncc; c++)
            b->keep[a][c] = rnd(&s, 3) != 0;
    int64_t nq = 0;
    for (int64_t a = 0; a < b->nrc; a++) {
        b->ri[2 * a] = b->rc[a];
        b->ri[2 * a + 1] = b->rc[a + 1];
        for (int64_t c = 0; c < b->ncc; c++)
            if (b->keep[a][c]) {
                b->rj[2 * nq] = b->cc[c];
                b->rj[2 * nq + 1] = b->cc[c + 1];
                nq++;
            }
        b->si[a] = nq;
    }
    b->R.nranges_i = b->nrc;
    b->R.ranges_i = b->ri;
    b->R.slices_i = b->si;
    b->R.nredranges_j = nq;
    b->R.redranges_j = b->rj;
    nq = 0;
    for (int64_t c = 0; c < b->ncc; c++) {
        b->rj_[2 * c] = b->cc[c];
        b->rj_[2 * c + 1] = b->cc[c + 1];
        for (int64_t a = 0; a < b->nrc; a++)
            if (b->keep[a][c]) {
                b->ri_[2 * nq] = b->rc[a];
                b->ri_[2 * nq + 1] = b->rc[a + 1];
                nq++;
            }
        b->sj[c] = nq;
    }
    b->R.nranges_j = b->ncc;
    b->R.ranges_j = b->rj_;
    b->R.slices_j = b->sj;
    b->R.nredranges_i = nq;
    b->R.redranges_i = b->ri_;
}

static bool both_keeps(const struct both *b, int64_t i, int64_t j)
{
    int64_t a = 0, c = 0;
    while (b->rc[a + 1] <= i)
        a++;
    while (b->cc[c + 1] <= j)
        c++;
    return b->keep[a][c];
}

Test(ranges, gradients)
{
    /* F = exp(-g |x_i - y_j|^2) b_j, Sum over j; L = sum_i G_i out_i. dL/db_j (a reduction over
     * i: the transposed triple) and dL/dx_i against the masked sums written out here. */
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const char *const al[] = {"x=Vi(2)", "y=Vj(2)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x, y) * g) * b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    enum { NX = 157, NY = 211 };
    static double x[NX * 2], y[NY * 2], b[NY], G[NX], g = 0.7;
    uint64_t s = 5;
    tu_fill(x, SR_F64, NX * 2, -1, 1, &s);
    tu_fill(y, SR_F64, NY * 2, -1, 1, &s);
    tu_fill(b, SR_F64, NY, -1, 1, &s);
    tu_fill(G, SR_F64, NX, -1, 1, &s);
    struct both P;
    both_new(&P, NX, NY, 12);
    for (int dev = 0; dev < 2; dev++) {
        sr_kernel *fk = diff_kernel(ctx, f, d, dev ? SR_DEVICE_REFERENCE : SR_DEVICE_CPU);
        sr_kernel *gb, *gx;
        cr_assert_eq(sr_kernel_grad(fk, 2, &gb), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_grad(fk, 0, &gx), SR_OK, "%s", sr_ctx_error(ctx));
        const void *args[] = {x, y, b, &g, G};
        static double outb[NY], outx[NX * 2];
        sr_run_desc rb = {
            .nx = NX, .ny = NY, .nargs = sr_kernel_nargs(gb), .args = args, .out = outb};
        sr_run_desc rx = {
            .nx = NX, .ny = NY, .nargs = sr_kernel_nargs(gx), .args = args, .out = outx};
        cr_assert_eq(sr_kernel_run_ranges(gb, &rb, &P.R), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_run_ranges(gx, &rx, &P.R), SR_OK, "%s", sr_ctx_error(ctx));
        for (int64_t j = 0; j < NY; j++) {
            double want = 0;
            for (int64_t i = 0; i < NX; i++)
                if (both_keeps(&P, i, j)) {
                    double d0 = x[2 * i] - y[2 * j], d1 = x[2 * i + 1] - y[2 * j + 1];
                    want += G[i] * exp(-g * (d0 * d0 + d1 * d1));
                }
            cr_assert(tu_close(outb[j], want, 1e-10, 1e-12), "dL/db_%lld: %.12g, want %.12g",
                      (long long)j, outb[j], want);
        }
        for (int64_t i = 0; i < NX; i++)
            for (int c = 0; c < 2; c++) {
                double want = 0;
                for (int64_t j = 0; j < NY; j++)
                    if (both_keeps(&P, i, j)) {
                        double d0 = x[2 * i] - y[2 * j], d1 = x[2 * i + 1] - y[2 * j + 1];
                        double e = exp(-g * (d0 * d0 + d1 * d1));
                        want += G[i] * b[j] * e * -2 * g * (x[2 * i + c] - y[2 * j + c]);
                    }
                cr_assert(tu_close(outx[2 * i + c], want, 1e-10, 1e-12),
                          "dL/dx_%lld,%d: %.12g, want %.12g", (long long)i, c, outx[2 * i + c],
                          want);
            }
        sr_kernel_free(gb);
        sr_kernel_free(gx);
        sr_kernel_free(fk);
    }
    sr_ctx_free(ctx);
}

/* ---- malformed ranges ---------------------------------------------------------------------------
 */

Test(ranges, invalid)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = diff_parse(ctx, "Concat(SqDist(x, y), (x|y) - p)", aliases, 4);
    enum { NX = 10, NY = 8 };
    static float x[NX * 3], y[NY * 3], bb[NY * 2], out[NX * 2], p = 1;
    const void *args[] = {x, y, &p, bb};
    static const struct {
        int64_t nc, nr;
        int64_t ranges[4], slices[2], red[4];
        bool null_ranges, null_red;
        const char *msg;
    } bad[] = {
        {-1, 0, {0}, {0}, {0}, false, false, "negative count"},
        {1, -2, {0, 1}, {0}, {0}, false, false, "negative count"},
        {1, 1, {0, 1}, {1}, {0, 1}, true, false, "ranges_i or slices_i is NULL"},
        {1, 1, {0, 1}, {1}, {0, 1}, false, true, "redranges_j is NULL"},
        {1, 1, {3, 2}, {1}, {0, 1}, false, false, "ranges_i[0] = [3, 2) has start > end"},
        {1, 1, {0, 11}, {1}, {0, 1}, false, false, "is not inside [0, nx = 10]"},
        {1, 1, {-1, 2}, {1}, {0, 1}, false, false, "is not inside [0, nx = 10]"},
        {2, 2, {0, 2, 2, 4}, {2, 1}, {0, 1, 1, 2}, false, false, "slices_i[1] = 1 must be in"},
        {1, 1, {0, 2}, {2}, {0, 1}, false, false, "slices_i[0] = 2 must be in"},
        {1, 1, {0, 2}, {1}, {0, 9}, false, false, "redranges_j[0] = [0, 9) is not inside [0, ny"},
        {1, 1, {0, 2}, {1}, {5, 4}, false, false, "redranges_j[0] = [5, 4) has start > end"},
        {2, 1, {0, 5, 4, 8}, {1, 1}, {0, 1}, false, false, "overlap (each output row"},
        {1, 2, {0, 5}, {2}, {0, 4, 3, 6}, false, false, "count twice"},
    };
    sr_kernel_desc d = sr_kernel_desc_default();
    for (int dev = 0; dev < 2; dev++) {
        sr_kernel *k = diff_kernel(ctx, f, d, dev ? SR_DEVICE_REFERENCE : SR_DEVICE_CPU);
        sr_run_desc r = {.nx = NX, .ny = NY, .nargs = 3, .args = args, .out = out};
        for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
            sr_ranges R = {.nranges_i = bad[t].nc,
                           .ranges_i = bad[t].null_ranges ? NULL : bad[t].ranges,
                           .slices_i = bad[t].slices,
                           .nredranges_j = bad[t].nr,
                           .redranges_j = bad[t].null_red ? NULL : bad[t].red};
            sr_status st = sr_kernel_run_ranges(k, &r, &R);
            cr_assert_eq(st, SR_EINVAL, "case %zu: status %d, want SR_EINVAL", t, st);
            cr_assert(strstr(sr_ctx_error(ctx), bad[t].msg), "case %zu: message '%s' lacks '%s'", t,
                      sr_ctx_error(ctx), bad[t].msg);
            /* the same ranges are checked on an axis-0 kernel's triple */
        }
        /* Still usable; empty blocks and intervals are fine; NULL arrays with zero counts too. */
        int64_t rg[4] = {0, 2, 2, 2}, sl[2] = {2, 3}, rd[6] = {0, 3, 3, 3, 5, 5};
        sr_ranges ok = {
            .nranges_i = 2, .ranges_i = rg, .slices_i = sl, .nredranges_j = 3, .redranges_j = rd};
        cr_assert_eq(sr_kernel_run_ranges(k, &r, &ok), SR_OK, "%s", sr_ctx_error(ctx));
        sr_ranges none = {0};
        cr_assert_eq(sr_kernel_run_ranges(k, &r, &none), SR_OK, "%s", sr_ctx_error(ctx));
        for (int t = 0; t < NX * 2; t++)
            cr_assert_eq(out[t], 0.0f, "no block: out[%d] = %g, want 0", t, out[t]);
        cr_assert_eq(sr_kernel_run_ranges(k, NULL, &ok), SR_EINVAL);
        sr_kernel_free(k);
    }
    /* Axis 0 reads the transposed triple and names its arrays. */
    d.axis = 0;
    sr_kernel *k0 = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
    int64_t rg[2] = {0, 9}, sl[1] = {1}, rd[2] = {0, 1};
    sr_ranges R = {
        .nranges_j = 1, .ranges_j = rg, .slices_j = sl, .nredranges_i = 1, .redranges_i = rd};
    float out0[NY * 2];
    sr_run_desc r0 = {.nx = NX, .ny = NY, .nargs = 3, .args = args, .out = out0};
    cr_assert_eq(sr_kernel_run_ranges(k0, &r0, &R), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "ranges_j[0] = [0, 9) is not inside [0, ny = 8]"), "%s",
              sr_ctx_error(ctx));
    sr_kernel_free(k0);
    sr_ctx_free(ctx);
}
