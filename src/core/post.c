/*
 * post.c — runs a kernel whose reduction the simplifier rewrote (k->simp.post): the kernel's
 * backend reduces the inner formula into a temporary R, and the post formula (the part that
 * moved out of the reduction: a factor, a shift, a linear map) is evaluated once per output row
 * from R. Both are ordinary kernels, so every backend benefits: the inner kernel is created
 * with the user's device and options, the post kernel is a Sum over a single reduced row on the
 * reference interpreter (its work is O(output rows), not O(pairs)).
 *
 * The kernel's own backend pointer is a per-kernel copy of simp_post_backend named after the
 * inner kernel's backend, so that `backend: cpu-jit` in explain and backend->name still say
 * which backend does the pair work.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

struct post_data {
    struct sr_backend_i vt; /* k->backend points here */
    sr_kernel *inner, *post;
};

static sr_status post_prepare(sr_kernel *k, const struct sr_plan *p, struct sr_realise *r)
{
    (void)p; /* the inner kernel plans its own */
    sr_ctx *ctx = k->ctx;
    struct post_data *d = calloc(1, sizeof *d);
    if (!d)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = k->red;
    desc.axis = k->axis;
    desc.k = k->k;
    desc.dtype = k->dtype;
    desc.device = k->device;
    desc.acc = k->acc;
    sr_status st = sr__kernel_new(ctx, (sr_expr *)k->simp.inner, &desc, k->budget, &d->inner);
    if (st == SR_OK) {
        desc = sr_kernel_desc_default();
        desc.axis = k->axis;
        desc.dtype = k->dtype;
        desc.device = SR_DEVICE_REFERENCE;
        st = sr__kernel_new(ctx, (sr_expr *)k->simp.post, &desc, k->budget, &d->post);
    }
    if (st == SR_OK &&
        (d->inner->nargs > k->nargs || d->post->nargs != k->nargs + 1 ||
         d->inner->out_dim != k->simp.inner->dim * k->k || d->post->out_dim != k->out_dim))
        st = sr__error(ctx, SR_EINTERNAL, "reduction rewrite: inconsistent inner/post kernels");
    if (st != SR_OK) {
        sr_kernel_free(d->inner);
        sr_kernel_free(d->post);
        free(d);
        return st;
    }
    d->vt = simp_post_backend;
    d->vt.name = d->inner->backend->name;
    /* The candidates the inner kernel chose among are k's (sr_kernel_plan_candidate). */
    memcpy(k->plans, d->inner->plans, sizeof k->plans);
    k->nplans = d->inner->nplans;
    k->backend_data = d;
    r->run = &d->vt;
    return SR_OK;
}

/* Output rows of R per chunk for nout output rows (at least 1): the temporary R stays within
 * SR_POST_CHUNK_BYTES (and a quarter of the call's memory budget, when there is one), so the
 * rewrite costs no O(output) memory. */
static int64_t post_chunk(const sr_kernel *k, int64_t rdim, int64_t nout)
{
    int64_t esz = (int64_t)sr_dtype_size(k->dtype), lim = sr__call_budget(k);
    int64_t cap = SR_POST_CHUNK_BYTES;
    if (lim > 0 && lim / 4 < cap)
        cap = lim / 4;
    int64_t chunk = cap / (rdim * esz);
    if (chunk < 1)
        chunk = 1;
    return chunk > nout ? nout : chunk;
}

int64_t simp_post_workspace(const sr_kernel *k)
{
    const struct post_data *d = k->backend_data;
    if (!d)
        return 0;
    int64_t rdim = d->inner->out_dim;
    return sr_kernel_workspace_bytes(d->inner) + sr_kernel_workspace_bytes(d->post) +
           post_chunk(k, rdim, INT64_MAX / 2) * rdim * (int64_t)sr_dtype_size(k->dtype);
}

void sr__chunk_args(const sr_kernel *k, const sr_run_desc *r, int64_t o0, const void **args)
{
    /* The variables of the output index advance with the chunk; the others stay. */
    sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    int64_t esz = (int64_t)sr_dtype_size(k->dtype);
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        args[v] = r->args[v];
        if (var->dim && var->cat == out_cat && r->args[v])
            args[v] = (const char *)r->args[v] + o0 * var->dim * esz;
    }
}

/* plan: block-sparse ranges (NULL: dense). The inner kernel reduces each chunk's blocks (the plan
 * restricted to the chunk); the post formula runs on every row of the chunk, and the caller
 * (sr__run_ranges) then writes the identity into the rows no block covers. */
static sr_status post_reduce(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *plan)
{
    const struct post_data *d = k->backend_data;
    /* Device arrays never reach this backend: sr_kernel_run_device accepts them only for
     * kernels whose backend is cuda_backend itself. */
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t esz = (int64_t)sr_dtype_size(k->dtype);
    int64_t rdim = d->inner->out_dim;
    int64_t chunk = post_chunk(k, rdim, nout);
    void *red = malloc((size_t)(chunk * rdim * esz));
    const void **args = malloc(((size_t)k->nargs + 1) * sizeof *args);
    if (!red || !args) {
        free(red);
        free(args);
        return sr__error(k->ctx, SR_ENOMEM, "out of memory for the %lld x %lld reduction result",
                         (long long)chunk, (long long)rdim);
    }
    sr_status st = SR_OK;
    for (int64_t o0 = 0; o0 < nout && st == SR_OK; o0 += chunk) {
        int64_t n = nout - o0 < chunk ? nout - o0 : chunk;
        sr__chunk_args(k, r, o0, args);
        args[k->nargs] = red;
        sr_run_desc ri = {
            .nx = k->axis == 1 ? n : r->nx,
            .ny = k->axis == 1 ? r->ny : n,
            .nargs = d->inner->nargs,
            .args = args,
            .out = red,
        };
        if (plan) {
            struct sr_rplan win;
            if (sr__rplan_window(plan, o0, o0 + n, &win) != SR_OK) {
                st = sr__error(k->ctx, SR_ENOMEM, "out of memory for the ranges of a chunk");
                break;
            }
            if (win.nblocks == 0) { /* no row of the chunk is reduced */
                sr__rplan_free(&win);
                continue;
            }
            st = sr__run_ranges(d->inner, &ri, &win);
            sr__rplan_free(&win);
        } else {
            st = sr_kernel_run_ex(d->inner, &ri);
        }
        if (st != SR_OK)
            break;
        /* One reduced row: the post formula reads nothing of the reduced index. */
        sr_run_desc rp = {
            .nx = k->axis == 1 ? n : 1,
            .ny = k->axis == 1 ? 1 : n,
            .nargs = k->nargs + 1,
            .args = args,
            .out = (char *)r->out + o0 * k->out_dim * esz,
        };
        st = sr_kernel_run_ex(d->post, &rp);
    }
    free(red);
    free(args);
    return st;
}

static sr_status post_run(const sr_kernel *k, const sr_run_desc *r)
{
    return post_reduce(k, r, NULL);
}

static void post_release(sr_kernel *k)
{
    struct post_data *d = k->backend_data;
    if (!d)
        return;
    sr_kernel_free(d->inner);
    sr_kernel_free(d->post);
    free(d);
    k->backend_data = NULL;
}

static void post_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct post_data *d = k->backend_data;
    expr_buf_printf(b,
                    "reduction rewrite applied: the %s backend reduces the inner formula, the "
                    "reference evaluates the post formula once per output row\n",
                    d->inner->backend->name);
    if (d->inner->backend->explain)
        d->inner->backend->explain(d->inner, b);
    /* The candidates the inner kernel chose among (k itself has none: it runs the inner one). */
    sr__plan_explain(d->inner, b);
}

static void post_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct post_data *d = k->backend_data;
    sr__plan_info_composed(d->inner, SR_STRATEGY_POST_REWRITE, info);
}

/* The inner kernel's background compile is the kernel's. */
static int post_stage(const sr_kernel *k)
{
    const struct post_data *d = k->backend_data;
    return sr__kernel_stage(d->inner);
}

static sr_status post_wait(const sr_kernel *k, double timeout_s)
{
    const struct post_data *d = k->backend_data;
    return sr_kernel_wait(d->inner, timeout_s);
}

const struct sr_backend_i simp_post_backend = {
    .name = "post",
    .prepare = post_prepare,
    .run = post_run,
    .release = post_release,
    .explain = post_explain,
    .run_ranges = post_reduce,
    .plan_info = post_plan_info,
    .stage = post_stage,
    .wait = post_wait,
};
