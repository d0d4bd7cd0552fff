/*
 * split.c — the sum split: a Sum kernel of F = (A + C) P run as two Sum kernels, of F1 = A P and
 * F2 = C P (simp_split_sum: A the addends that depend on the output index, C the others), whose
 * outputs add. It pays where each part runs on the fused two-product strategy (a scalar pair
 * formula times a wide formula of the reduced side) while F as a whole only runs direct: SGPR's
 * derivative in the lengthscale, (SqDist(z,x) + q) Exp(-g SqDist(z,x)) Exp(-g q) with q an
 * M-wide formula of x, is two fused kernels (C = q joins the wide side B).
 *
 * The split is kept only when both parts' chosen plans are the fused strategy and their estimated
 * times per pair add up to less than the best plan of F whole (the backend's candidates, offered
 * without compiling anything); otherwise the kernel is left to its backend. The parts run on the
 * kernel's backend, under the same memory budget; the second one's output goes to a chunk of
 * output rows that is added into the first's.
 */
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct split_data {
    struct sr_backend_i vt; /* k->backend points here */
    sr_kernel *part[2];
    double est[2], est_whole;
    char whole[64];    /* the strategy of F's best plan */
    int64_t chunk_cap; /* bytes of the second part's output chunk */
};

/* The parts' background compiles are the kernel's: pending while either's is, and a wait waits
 * for each in turn (each up to timeout_s). */
static int split_stage(const sr_kernel *k)
{
    const struct split_data *d = k->backend_data;
    return sr__stage_combine(sr__kernel_stage(d->part[0]), sr__kernel_stage(d->part[1]));
}

static sr_status split_wait(const sr_kernel *k, double timeout_s)
{
    const struct split_data *d = k->backend_data;
    sr_status st = sr_kernel_wait(d->part[0], timeout_s);
    return st == SR_OK ? sr_kernel_wait(d->part[1], timeout_s) : st;
}

/* Rows of output per chunk (at least 1, at most nout). */
static int64_t split_chunk(const sr_kernel *k, const struct split_data *d, int64_t nout)
{
    int64_t row = (int64_t)k->out_dim * (int64_t)sr_dtype_size(k->dtype);
    int64_t c = d->chunk_cap / row;
    if (c < 1)
        c = 1;
    return c > nout ? nout : c;
}

/* out[0..n) += add[0..n) in the kernel's dtype. */
static void add_into(sr_dtype dt, void *out, const void *add, int64_t n)
{
    if (dt == SR_F64) {
        double *o = out;
        const double *a = add;
        for (int64_t i = 0; i < n; i++)
            o[i] += a[i];
    } else {
        float *o = out;
        const float *a = add;
        for (int64_t i = 0; i < n; i++)
            o[i] += a[i];
    }
}

/* Runs part p on chunk ri, through the window of plan for output rows [o0, o0 + n) when there
 * are ranges (the rows no block covers get the identity, 0). */
static sr_status run_part(const sr_kernel *p, sr_run_desc *ri, const struct sr_rplan *win)
{
    ri->nargs = p->nargs;
    return win ? sr__run_ranges(p, ri, win) : sr_kernel_run_ex(p, ri);
}

static sr_status split_reduce(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *plan)
{
    const struct split_data *d = k->backend_data;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t esz = (int64_t)sr_dtype_size(k->dtype), row = (int64_t)k->out_dim * esz;
    int64_t chunk = split_chunk(k, d, nout);
    /* The chunk of the second part's output, then the chunk's arrays. */
    size_t nb = (size_t)(chunk * row);
    nb += (sizeof(void *) - nb % sizeof(void *)) % sizeof(void *);
    char *tmp = malloc(nb + ((size_t)k->nargs + 1) * sizeof(void *));
    if (!tmp)
        return sr__error(k->ctx, SR_ENOMEM, "out of memory for the %lld x %d chunk of a sum split",
                         (long long)chunk, k->out_dim);
    const void **args = (const void **)(void *)(tmp + nb);
    sr_status st = SR_OK;
    for (int64_t o0 = 0; o0 < nout && st == SR_OK; o0 += chunk) {
        int64_t n = nout - o0 < chunk ? nout - o0 : chunk;
        sr__chunk_args(k, r, o0, args);
        sr_run_desc ri = {
            .nx = k->axis == 1 ? n : r->nx,
            .ny = k->axis == 1 ? r->ny : n,
            .args = args,
            .out = (char *)r->out + o0 * row,
        };
        struct sr_rplan win, *w = NULL;
        if (plan) {
            if (sr__rplan_window(plan, o0, o0 + n, &win) != SR_OK) {
                st = sr__error(k->ctx, SR_ENOMEM, "out of memory for the ranges of a chunk");
                break;
            }
            w = &win;
        }
        if (!w || win.nblocks > 0) { /* else no row of the chunk is reduced */
            st = run_part(d->part[0], &ri, w);
            ri.out = tmp;
            if (st == SR_OK)
                st = run_part(d->part[1], &ri, w);
            if (st == SR_OK)
                add_into(k->dtype, (char *)r->out + o0 * row, tmp, n * k->out_dim);
        }
        if (w)
            sr__rplan_free(w);
    }
    free(tmp);
    return st;
}

static void split_release(sr_kernel *k)
{
    struct split_data *d = k->backend_data;
    k->backend_data = NULL;
    if (d) {
        sr_kernel_free(d->part[0]);
        sr_kernel_free(d->part[1]);
        free(d);
    }
}

/* The parts run one after the other: the larger workspace of the two, and the chunk. */
static int64_t split_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    const struct split_data *d = k->backend_data;
    int64_t best = -1;
    for (int i = 0; i < 2; i++) {
        const sr_kernel *p = d->part[i];
        int64_t pt = 0;
        int nt = 1;
        int64_t ws = p->backend->workspace && p->backend_data ? p->backend->workspace(p, &pt, &nt)
                                                              : sr_kernel_workspace_bytes(p);
        if (ws > best) {
            best = ws;
            if (per_thread)
                *per_thread = pt ? pt : ws;
            if (threads)
                *threads = nt;
        }
    }
    return best + d->chunk_cap;
}

static void split_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct split_data *d = k->backend_data;
    const char *idx = k->axis == 1 ? "j" : "i";
    expr_buf_printf(b,
                    "sum split applied: Sum_%s F = Sum_%s F1 + Sum_%s F2, two kernels on the %s "
                    "backend whose outputs add; the fused two-product strategy runs both, est. "
                    "%.3g + %.3g ns per pair against %.3g for F whole (%s)\n",
                    idx, idx, idx, d->part[0]->backend->name, d->est[0], d->est[1], d->est_whole,
                    d->whole);
    for (int i = 0; i < 2; i++) {
        const sr_kernel *p = d->part[i];
        expr_buf_printf(b, "sum split part F%d: ", i + 1);
        expr_print_to(b, p->f);
        expr_buf_printf(b, "\n");
        if (p->backend->explain)
            p->backend->explain(p, b);
        sr__plan_explain(p, b);
    }
}

/* The first part's plan stands for both (each runs a fused two-product); the parts' strategies
 * are the ones they run. */
static void split_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct split_data *d = k->backend_data;
    sr__plan_info_composed(d->part[0], SR_STRATEGY_SUM_SPLIT, info);
    for (int i = 0; i < 2; i++) {
        sr_plan_info p = {.size = sizeof p};
        if (sr_kernel_plan(d->part[i], &p) == SR_OK)
            info->split_strategy[i] = p.strategy;
    }
}

static sr_status split_run(const sr_kernel *k, const sr_run_desc *r)
{
    return split_reduce(k, r, NULL);
}

/* Whether plan p is one of the fused two-product strategies. */
static bool fused_plan(const struct sr_plan *p)
{
    return p->strategy && strstr(p->strategy, "fused two-product") != NULL;
}

/* The chosen plan of a prepared kernel (NULL: none). */
static const struct sr_plan *chosen(const sr_kernel *k)
{
    for (int i = 0; i < k->nplans; i++)
        if (k->plans[i].chosen)
            return &k->plans[i];
    return NULL;
}

/* Records in k why the split its formula admits is not applied (explain and sr_kernel_plan
 * report it); SR_OK. */
__attribute__((format(printf, 2, 3))) static sr_status declined(sr_kernel *k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->split_why, sizeof k->split_why, fmt, ap);
    va_end(ap);
    return SR_OK;
}

sr_status sr__split_sum(sr_kernel *k, const struct sr_backend_i *be,
                        const struct sr_backend_i **run)
{
    sr_ctx *ctx = k->ctx;
    if (!k->simp.enabled || k->red != SR_SUM || k->weight || !be->offer)
        return SR_OK;
    sr_status pending = expr_ctx(ctx)->err.pending;
    const sr_expr *f[2];
    bool split = simp_split_sum(k, &f[0], &f[1]);
    expr_ctx(ctx)->err.pending = pending;
    if (!split)
        return SR_OK;
    /* F whole: the plan its backend would choose (nothing compiled). */
    struct sr_plan whole[SR_MAX_PLANS];
    const struct sr_plan *bw = sr__plan_best(whole, be->offer(k, whole));
    if (bw) {
        k->split.whole = sr__strategy_of(bw->strategy);
        k->split.whole_est = bw->est_ns;
    }
    if (bw && bw->forced)
        return declined(k, "an option forces the %s strategy", bw->strategy ? bw->strategy : "?");
    if (!bw || !(bw->est_ns > 0))
        return declined(k, "no estimated plan of F whole");
    /* The parts' best plans, before compiling them. */
    sr_kernel_desc desc = sr__sum_desc(k);
    const double *est = k->split.est;
    for (int i = 0; i < 2; i++) {
        struct sr_plan p;
        sr_status pst = sr__kernel_offer(ctx, f[i], &desc, k->budget, be, &p);
        expr_ctx(ctx)->err.pending = pending;
        if (pst != SR_OK || !(p.est_ns > 0))
            return declined(k, "part F%d has no estimated plan", i + 1);
        k->split.strategy[i] = sr__strategy_of(p.strategy);
        k->split.est[i] = p.est_ns;
        k->split.parts = i + 1;
        if (!fused_plan(&p))
            return declined(k, "part F%d would run %s, not the fused two-product", i + 1,
                            p.strategy ? p.strategy : "?");
    }
    if (est[0] + est[1] >= bw->est_ns)
        return declined(k,
                        "est. %.3g + %.3g ns per pair for its parts, not below %.3g for F whole "
                        "(%s)",
                        est[0], est[1], bw->est_ns, bw->strategy ? bw->strategy : "?");
    struct split_data *d = calloc(1, sizeof *d);
    if (!d)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    d->est[0] = est[0];
    d->est[1] = est[1];
    d->est_whole = bw->est_ns;
    snprintf(d->whole, sizeof d->whole, "%s", bw->strategy ? bw->strategy : "?");
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++) {
        ok = sr__kernel_new(ctx, f[i], &desc, k->budget, &d->part[i]) == SR_OK &&
             d->part[i]->nargs <= k->nargs && d->part[i]->out_dim == k->out_dim;
        /* A realisation may have declined the fused plan (its modules' own workspace). */
        ok = ok && chosen(d->part[i]) && fused_plan(chosen(d->part[i]));
    }
    /* The chunk of the second part's output, within the budget beside the larger workspace. */
    int64_t row = (int64_t)k->out_dim * (int64_t)sr_dtype_size(k->dtype);
    d->chunk_cap = SR_POST_CHUNK_BYTES;
    if (ok && k->budget > 0) {
        int64_t w0 = sr_kernel_workspace_bytes(d->part[0]),
                w1 = sr_kernel_workspace_bytes(d->part[1]);
        int64_t room = k->budget - (w0 > w1 ? w0 : w1);
        d->chunk_cap = room < d->chunk_cap ? room : d->chunk_cap;
        ok = d->chunk_cap >= row;
    }
    if (!ok) {
        sr_kernel_free(d->part[0]);
        sr_kernel_free(d->part[1]);
        free(d);
        expr_ctx(ctx)->err.pending = pending;
        return declined(k, "its parts, once built, did not both run the fused two-product within "
                           "the memory budget");
    }
    d->chunk_cap -= d->chunk_cap % row;
    d->vt = (struct sr_backend_i){
        .name = be->name,
        .run = split_run,
        .release = split_release,
        .explain = split_explain,
        .run_ranges = split_reduce,
        .workspace = split_workspace,
        .plan_info = split_plan_info,
        .stage = split_stage,
        .wait = split_wait,
    };
    k->backend_data = d;
    *run = &d->vt;
    return SR_OK;
}
