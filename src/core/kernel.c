/* kernel.c — kernel creation, argument validation, and dispatch to a backend. */
#include "core.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The public spellings (SR_REDUCTION_MAP) and the rules (SR_REDUCTION_RULES), row by row. */
const struct sr_reduction_info sr_reductions[SR_REDUCTION_COUNT] = {
#define SR_REDUCTION_INFO_NAME_(red, keops) [SR_##red].name = keops,
    SR_REDUCTION_MAP(SR_REDUCTION_INFO_NAME_)
#undef SR_REDUCTION_INFO_NAME_
#define SR_REDUCTION_INFO_(red, fam, ord, emp, v, i, k, sf, w, part)                               \
    [SR_##red].family = SR_RED_FAM_##fam, [SR_##red].order = SR_RED_##ord,                         \
    [SR_##red].empty = SR_RED_EMPTY_##emp, [SR_##red].values = v, [SR_##red].indices = i,          \
    [SR_##red].uses_k = k, [SR_##red].scalar_f = sf, [SR_##red].weight = w,                        \
    [SR_##red].partial = SR_##part,
        SR_REDUCTION_RULES(SR_REDUCTION_INFO_)
#undef SR_REDUCTION_INFO_
};
#define SR_REDUCTION_ROW_(...) +1
_Static_assert(0 SR_REDUCTION_RULES(SR_REDUCTION_ROW_) == SR_REDUCTION_COUNT,
               "every reduction has one row in SR_REDUCTION_RULES");
#undef SR_REDUCTION_ROW_

/* The table above and the public SR_REDUCTION_MAP must spell every reduction alike. */
static const char *const reduction_spelling[] = {
#define SR_REDUCTION_NAME_(name, keops) keops,
    SR_REDUCTION_MAP(SR_REDUCTION_NAME_)
#undef SR_REDUCTION_NAME_
};
_Static_assert(sizeof reduction_spelling / sizeof *reduction_spelling == SR_REDUCTION_COUNT,
               "reduction table out of sync");

const char *sr_reduction_name(sr_reduction r)
{
    if ((int)r < 0 || r >= SR_REDUCTION_COUNT)
        return NULL;
    return reduction_spelling[r];
}

sr_status sr_reduction_combine(sr_reduction r, sr_combine *how, sr_reduction *partial)
{
    if ((int)r < 0 || r >= SR_REDUCTION_COUNT || !how || !partial)
        return SR_EINVAL;
    const struct sr_reduction_info *ri = &sr_reductions[r];
    switch (ri->family) {
    case SR_RED_FAM_SUM:
        *how = SR_COMBINE_SUM;
        break;
    case SR_RED_FAM_EXT:
    case SR_RED_FAM_ARGEXT:
        *how = ri->order == SR_RED_DESC ? SR_COMBINE_MAX : SR_COMBINE_MIN;
        break;
    case SR_RED_FAM_KSEL:
        *how = SR_COMBINE_KMIN;
        break;
    case SR_RED_FAM_LSE:
        *how = SR_COMBINE_LSE;
        break;
    case SR_RED_FAM_SSMW:
        *how = SR_COMBINE_SSW;
        break;
    case SR_RED_FAM_COUNT:
        return SR_EINVAL;
    }
    *partial = ri->partial;
    return SR_OK;
}

sr_status sr_reduction_from_name(const char *name, sr_reduction *out)
{
    if (!name || !out)
        return SR_EINVAL;
    for (int r = 0; r < SR_REDUCTION_COUNT; r++)
        if (strcmp(reduction_spelling[r], name) == 0) {
            *out = (sr_reduction)r;
            return SR_OK;
        }
    return SR_EINVAL;
}

sr_kernel_desc sr_kernel_desc_default(void)
{
    sr_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.reduction = SR_SUM;
    d.axis = 1;
    d.k = 1;
    d.dtype = SR_F32;
    d.device = SR_DEVICE_AUTO;
    d.weight = NULL;
    return d;
}

static const char *const cat_names[] = {"Vi", "Vj", "Pm"};
static const char *const device_names[] = {"auto", "cpu", "cuda", "reference"};

const char *sr__device_name(sr_device d) { return device_names[d]; }

/* Largest K of the K-reductions: the per-row state is K values and indices. */
#define SR_MAX_K (1 << 20)

static sr_status desc_check(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *d)
{
    if ((int)d->reduction < 0 || d->reduction >= SR_REDUCTION_COUNT)
        return sr__error(ctx, SR_EINVAL, "unknown reduction %d", (int)d->reduction);
    const struct sr_reduction_info *ri = &sr_reductions[d->reduction];
    if (d->axis != 0 && d->axis != 1)
        return sr__error(ctx, SR_EINVAL,
                         "axis must be 1 (reduce over j) or 0 (reduce over i), not %d", d->axis);
    if ((int)d->dtype < 0 || d->dtype > SR_BF16)
        return sr__error(ctx, SR_EINVAL, "dtype must be SR_F32, SR_F64, SR_F16 or SR_BF16, not %d",
                         (int)d->dtype);
    if ((int)d->acc < 0 || d->acc > SR_ACC_F64)
        return sr__error(ctx, SR_EINVAL, "unknown accumulation mode %d", (int)d->acc);
    if ((int)d->device < 0 || d->device > SR_DEVICE_REFERENCE)
        return sr__error(ctx, SR_EINVAL, "unknown device %d", (int)d->device);
    if (ri->uses_k && (d->k < 1 || d->k > SR_MAX_K))
        return sr__error(ctx, SR_EINVAL, "%s: k must be in [1, %d], not %d", ri->name, SR_MAX_K,
                         d->k);
    if (ri->uses_k && (int64_t)d->k * f->dim > SR_MAX_K)
        return sr__error(ctx, SR_EINVAL,
                         "%s: k * dim(F) = %d * %d values per row exceeds the limit %d", ri->name,
                         d->k, f->dim, SR_MAX_K);
    if (ri->scalar_f && f->dim != 1)
        return sr__error(ctx, SR_EDIM, "%s: the formula must have dimension 1, not %d", ri->name,
                         f->dim);
    if (ri->weight && !d->weight)
        return sr__error(ctx, SR_EINVAL, "%s needs a weight formula (desc.weight)", ri->name);
    if (!ri->weight && d->weight)
        return sr__error(ctx, SR_EINVAL,
                         "%s takes no weight formula (desc.weight is only for SumSoftMaxWeight)",
                         ri->name);
    if (d->weight && d->weight->ctx != ctx)
        return sr__error(ctx, SR_EINVAL, "the weight formula belongs to another context");
    return SR_OK;
}

static void build_explain(sr_kernel *k)
{
    struct expr_buf b = {0};
    /* The formulas as the user gave them; simp_kernel_explain adds the passes, the simplified
     * formulas the backend runs, the hoisted terms and the cost estimate. */
    expr_buf_printf(&b, "formula: ");
    expr_print_to(&b, k->simp.f_user);
    expr_buf_printf(&b, "\n");
    if (k->simp.weight_user) {
        expr_buf_printf(&b, "weight: ");
        expr_print_to(&b, k->simp.weight_user);
        expr_buf_printf(&b, "\n");
    }
    simp_kernel_explain(k, &b);
    expr_buf_printf(&b, "reduction: %s over %s", sr_reductions[k->red].name,
                    k->axis == 1 ? "j (axis 1, one result per i)" : "i (axis 0, one result per j)");
    if (sr_reductions[k->red].uses_k)
        expr_buf_printf(&b, ", k = %d", k->k);
    expr_buf_printf(&b, "\ndtype: %s%s\nformula dimension: %d, output values per row: %d\n",
                    sr__dtype_name(k->io),
                    k->io != k->dtype ? " (computed in float32: inputs widened, outputs rounded)"
                                      : "",
                    k->fdim, k->out_dim);
    expr_buf_printf(&b, "arguments:");
    for (int v = 0; v < k->nargs; v++) {
        if (k->vars[v].dim)
            expr_buf_printf(&b, " [%d] %s(%d)", v, cat_names[k->vars[v].cat], k->vars[v].dim);
        else
            expr_buf_printf(&b, " [%d] unused", v);
    }
    expr_buf_printf(&b, "\ndevice: %s", device_names[k->device]);
    if (k->device == SR_DEVICE_AUTO)
        expr_buf_printf(&b, " (%s)", k->device_why);
    expr_buf_printf(&b, "\nbackend: %s\n", k->backend->name);
    if (k->fallback_why)
        expr_buf_printf(&b, "why this backend: %s\n", k->fallback_why);
    if (k->split_why[0])
        expr_buf_printf(&b, "sum split not applied: %s\n", k->split_why);
    if (k->backend->explain)
        k->backend->explain(k, &b);
    sr__plan_explain(k, &b);
    sr__budget_explain(k, &b);
    k->explain = b.oom ? NULL : b.data;
    if (b.oom)
        free(b.data);
}

/* A new kernel of f (checked) under budget with its variables and simplified formulas, no
 * backend yet; *out is NULL when out of memory. */
static sr_status kernel_init(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc,
                             int64_t budget, sr_kernel **out)
{
    sr_kernel *k = calloc(1, sizeof *k);
    *out = k;
    if (!k)
        return sr__error(ctx, SR_ENOMEM, "sr_kernel_new: out of memory");
    k->ctx = ctx;
    k->f = f;
    k->weight = desc->weight;
    k->red = desc->reduction;
    k->axis = desc->axis;
    k->k = sr_reductions[desc->reduction].uses_k ? desc->k : 1;
    k->io = desc->dtype;
    k->dtype = desc->dtype == SR_F64 ? SR_F64 : SR_F32;
    k->device = desc->device;
    k->budget = budget;
    k->acc = desc->acc;
    k->fdim = f->dim;
    k->out_dim = k->weight ? k->weight->dim : k->k * k->fdim;
    const sr_expr *roots[2] = {f, desc->weight};
    sr_status st = expr_collect_vars(ctx, roots, 2, &k->vars, &k->nargs);
    if (st == SR_OK)
        st = simp_kernel(k); /* k->f and k->weight become the simplified formulas */
    return st;
}

sr_kernel_desc sr__sum_desc(const sr_kernel *k)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUM;
    d.axis = k->axis;
    d.dtype = k->dtype;
    d.device = k->device;
    d.acc = k->acc;
    return d;
}

sr_status sr__kernel_offer(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc,
                           int64_t budget, const struct sr_backend_i *be, struct sr_plan *best)
{
    memset(best, 0, sizeof *best);
    if (!be->offer)
        return SR_ENOTSUP;
    sr_status st = desc_check(ctx, f, desc);
    sr_kernel *k = NULL;
    if (st == SR_OK)
        st = kernel_init(ctx, f, desc, budget, &k);
    if (st == SR_OK) {
        k->nplans = be->offer(k, k->plans);
        const struct sr_plan *c = sr__plan_choose(k);
        if (c)
            *best = *c;
        else
            st = SR_ENOTSUP;
    }
    if (k) {
        simp_kernel_release(k);
        free(k->vars);
        free(k);
    }
    return st;
}

sr_status sr_kernel_new(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc, sr_kernel **out)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return SR_EINVAL;
    /* The budget the kernel is planned under: the context's now, read once (k->budget). */
    return sr__kernel_new(ctx, f, desc, ctx->mem_limit, out);
}

sr_status sr__kernel_new(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc, int64_t budget,
                         sr_kernel **out)
{
    if (out)
        *out = NULL;
    if (!out)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_new: out is NULL");
    if (!desc)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_new: desc is NULL");
    if (!f) {
        if (ctx->ir.err.pending != SR_OK) {
            sr_status st = ctx->ir.err.pending; /* the builder's own message stays */
            ctx->ir.err.pending = SR_OK;
            return st;
        }
        return sr__error(ctx, SR_EINVAL, "sr_kernel_new: the formula is NULL");
    }
    if (f->ctx != ctx)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_new: the formula belongs to another context");
    if (ctx->env_status != SR_OK)
        return sr__error(ctx, ctx->env_status, "%s", ctx->env_msg);
    sr_status st = desc_check(ctx, f, desc);
    if (st != SR_OK)
        return st;

    sr_kernel *k = NULL;
    st = kernel_init(ctx, f, desc, budget, &k);
    if (!k)
        return st;
    if (st == SR_OK)
        st = sr__plan_kernel(k);
    if (st != SR_OK) {
        simp_kernel_release(k);
        free(k->vars);
        free(k);
        return st;
    }
    k->explain_stage = sr__kernel_stage(k);
    pthread_mutex_init(&k->explain_lock, NULL);
    build_explain(k);
    *out = k;
    return SR_OK;
}

void sr_kernel_free(sr_kernel *k)
{
    if (!k)
        return;
    if (k->backend && k->backend->release)
        k->backend->release(k);
    simp_kernel_release(k);
    free(k->vars);
    free(k->explain);
    free(k->explain_old);
    pthread_mutex_destroy(&k->explain_lock);
    free(k);
}

int sr_kernel_nargs(const sr_kernel *k) { return k ? k->nargs : 0; }
int sr_kernel_out_dim(const sr_kernel *k) { return k ? k->out_dim : 0; }

sr_status sr_kernel_var(const sr_kernel *k, int index, sr_cat *cat, int *dim)
{
    if (!k || index < 0 || index >= k->nargs)
        return SR_EINVAL;
    const struct expr_var *v = &k->vars[index];
    if (cat)
        *cat = v->dim ? v->cat : SR_CAT_I;
    if (dim)
        *dim = v->dim;
    return SR_OK;
}

int sr__kernel_stage(const sr_kernel *k)
{
    return k->backend->stage ? k->backend->stage(k) : SR_STAGE_FINAL;
}

int sr__stage_combine(int a, int b)
{
    /* A compile still running counts first, then one that failed, then compiled code. */
    static const int rank[] = {[SR_STAGE_FINAL] = 0,
                               [SR_STAGE_COMPILED] = 1,
                               [SR_STAGE_FAILED] = 2,
                               [SR_STAGE_PENDING] = 3};
    return rank[a] >= rank[b] ? a : b;
}

int sr__call_stage(const sr_kernel *k)
{
    return k->ctx->log_level >= 1 ? sr__kernel_stage(k) : SR_STAGE_FINAL;
}

void sr__call_log(const sr_kernel *k, int stage)
{
    if (stage == SR_STAGE_FINAL)
        return;
    /* The call chose its tier once, between the two reads of the stage, and the stage leaves
     * PENDING once, for good: COMPILED before means compiled code ran, anything but COMPILED
     * after means tier 0 did; PENDING, then COMPILED is a call that raced the switch, which the
     * next call says. */
    const int after = sr__kernel_stage(k);
    const int tier = stage == SR_STAGE_COMPILED ? 1 : after != SR_STAGE_COMPILED ? 0 : -1;
    sr_kernel *mk = (sr_kernel *)k; /* the kernel is immutable but for this and its explain */
    if (tier < 0 || atomic_load(&mk->tier_logged) & (1 << tier))
        return;
    sr_plan_info info;
    memset(&info, 0, sizeof info);
    if (k->backend->plan_info)
        k->backend->plan_info(k, &info);
    if (info.strategy == SR_STRATEGY_SUM_SPLIT || info.strategy == SR_STRATEGY_POST_REWRITE) {
        atomic_fetch_or(&mk->tier_logged, 3); /* its inner kernels' calls say it */
        return;
    }
    if (atomic_fetch_or(&mk->tier_logged, 1 << tier) & (1 << tier))
        return;
    const char *name = sr_strategy_name(info.strategy);
    if (tier == 1)
        fprintf(stderr, "symred: calls of the %s kernel run compiled code (tier 1)\n", name);
    else if (after == SR_STAGE_FAILED)
        fprintf(stderr,
                "symred: calls of the %s kernel run on the tile interpreter (tier 0): its "
                "background compile failed\n",
                name);
    else
        fprintf(stderr,
                "symred: calls of the %s kernel run on the tile interpreter (tier 0) while its "
                "code compiles in the background\n",
                name);
}

sr_status sr_kernel_wait(const sr_kernel *k, double timeout_s)
{
    if (!k)
        return SR_EINVAL;
    return k->backend->wait ? k->backend->wait(k, timeout_s) : SR_OK;
}

const char *sr_kernel_explain(const sr_kernel *k)
{
    if (!k)
        return "";
    if (k->backend->stage) {
        /* explain_stage and the text change under the lock only: callers may race here. */
        sr_kernel *mk = (sr_kernel *)k; /* the kernel is immutable but for this text */
        pthread_mutex_lock(&mk->explain_lock);
        int stage = sr__kernel_stage(k);
        if (stage != mk->explain_stage && !mk->explain_old) {
            mk->explain_old = mk->explain;
            mk->explain_stage = stage;
            build_explain(mk);
        }
        pthread_mutex_unlock(&mk->explain_lock);
    }
    return k->explain ? k->explain : "(explain text unavailable: out of memory)";
}

int sr__reduced_var(const sr_kernel *k, const sr_expr *e)
{
    const sr_cat cat = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    if (e->op != OP_VAR || e->iattr[1] != (int64_t)cat)
        return -1;
    return (int)e->iattr[0];
}

bool sr__a_and_b(const sr_kernel *k, const sr_expr *e, int *avar, int *asign, int *bvar, int *bsign)
{
    if (e->op != OP_SUB && e->op != OP_ADD)
        return false;
    const sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    for (int c = 0; c < 2; c++) {
        const sr_expr *a = e->child[c], *b = e->child[1 - c];
        int bv = sr__reduced_var(k, b);
        if (a->dim != e->dim || b->dim != e->dim || a->op != OP_VAR ||
            a->iattr[1] != (int64_t)out_cat || bv < 0)
            continue;
        *avar = (int)a->iattr[0];
        *bvar = bv;
        *asign = e->op == OP_SUB && c == 1 ? -1 : 1;
        *bsign = e->op == OP_SUB && c == 0 ? -1 : 1;
        return true;
    }
    return false;
}

sr_status sr__check_arrays(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args)
{
    sr_ctx *ctx = k->ctx;
    int64_t bytes;
    if (k->nargs > 0 && !args)
        return sr__error(ctx, SR_EINVAL, "args is NULL but the kernel takes %d arrays", k->nargs);
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim)
            continue;
        int64_t rows = var->cat == SR_CAT_I ? nx : var->cat == SR_CAT_J ? ny : 1;
        if (!sr__size_mul(rows, var->dim, (int64_t)sr_dtype_size(k->io), &bytes))
            return sr__error(ctx, SR_EOVERFLOW,
                             "argument %d: %lld rows of dimension %d overflow the address space", v,
                             (long long)rows, var->dim);
        if (rows > 0 && !args[v])
            return sr__error(ctx, SR_EINVAL, "argument %d (%s of dimension %d) is NULL", v,
                             cat_names[var->cat], var->dim);
    }
    return SR_OK;
}

static sr_status run_check(const sr_kernel *k, const sr_run_desc *r)
{
    sr_ctx *ctx = k->ctx;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    if (r->nx < 0 || r->ny < 0)
        return sr__error(ctx, SR_EINVAL, "sizes must be >= 0 (nx = %lld, ny = %lld)",
                         (long long)r->nx, (long long)r->ny);
    if (r->nargs != k->nargs)
        return sr__error(ctx, SR_EINVAL, "the kernel takes %d arrays, %d were given", k->nargs,
                         r->nargs);
    sr_status st = sr__check_arrays(k, r->nx, r->ny, r->args);
    if (st != SR_OK)
        return st;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t nred = k->axis == 1 ? r->ny : r->nx;
    int64_t bytes;
    if (!sr__size_mul(nout, k->out_dim, 8, &bytes))
        return sr__error(ctx, SR_EOVERFLOW,
                         "the output (%lld rows of %d values) overflows the address space",
                         (long long)nout, k->out_dim);
    if (ri->uses_k && k->k > nred)
        return sr__error(ctx, SR_EINVAL,
                         "%s: k = %d exceeds the number of reduced rows (%s = %lld)", ri->name,
                         k->k, k->axis == 1 ? "ny" : "nx", (long long)nred);
    if (nout > 0 && ri->values && !r->out)
        return sr__error(ctx, SR_EINVAL, "%s writes values, but the value output is NULL",
                         ri->name);
    if (nout > 0 && ri->indices && !r->out_idx)
        return sr__error(ctx, SR_EINVAL, "%s writes indices, but the index output is NULL",
                         ri->name);
    return SR_OK;
}

sr_status sr_kernel_run_ex(const sr_kernel *k, const sr_run_desc *r)
{
    return sr_kernel_run_ranges(k, r, NULL);
}

/* The run of a checked call, in the kernel's computing dtype. */
static sr_status run_checked(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *ranges)
{
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t nred = k->axis == 1 ? r->ny : r->nx;
    sr_status st = SR_OK;
    if (ranges) {
        struct sr_rplan p;
        if ((st = sr__rplan_new(k, r, ranges, &p)) != SR_OK)
            return st;
        if (nout > 0 && nred == 0)
            sr__fill_identity(k, r, 0, nout);
        else if (nout > 0)
            st = sr__run_ranges(k, r, &p);
        sr__rplan_free(&p);
        return st;
    }
    if (nout == 0)
        return SR_OK;
    if (nred == 0) {
        sr__fill_identity(k, r, 0, nout);
        return SR_OK;
    }
    const int stage = sr__call_stage(k);
    st = k->backend->run(k, r);
    sr__call_log(k, stage);
    return st;
}

/* A float16 or bfloat16 call: the float32 kernel on widened copies, its values rounded into
 * the caller's output (indices are written in place). */
static sr_status run_widened(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *ranges)
{
    const int64_t nout = k->axis == 1 ? r->nx : r->ny;
    const int64_t nval = sr_reductions[k->red].values ? nout * k->out_dim : 0;
    struct sr_io_copy c;
    sr_status st = sr__io_widen(k, r->nx, r->ny, r->args, nval, &c);
    if (st != SR_OK)
        return st;
    sr_run_desc w = *r;
    w.args = c.args;
    w.out = nval ? c.out : NULL;
    st = run_checked(k, &w, ranges);
    if (st == SR_OK && nval)
        sr__narrow(k->io, c.out, r->out, nval);
    sr__io_free(&c);
    return st;
}

sr_status sr_kernel_run_ranges(const sr_kernel *k, const sr_run_desc *r, const sr_ranges *ranges)
{
    if (!k)
        return SR_EINVAL;
    if (!r)
        return sr__error(k->ctx, SR_EINVAL, "%s: run is NULL",
                         ranges ? "sr_kernel_run_ranges" : "sr_kernel_run_ex");
    sr_status st = run_check(k, r);
    if (st != SR_OK)
        return st;
    if (k->io != k->dtype && !k->io_native)
        return run_widened(k, r, ranges);
    return run_checked(k, r, ranges);
}

sr_status sr_kernel_run_device(const sr_kernel *k, const sr_run_desc *r, uint64_t device_args,
                               int device_out)
{
    if (!device_args && !device_out)
        return sr_kernel_run_ex(k, r);
    if (!k)
        return SR_EINVAL;
    if (!r)
        return sr__error(k->ctx, SR_EINVAL, "sr_kernel_run_device: run is NULL");
    if (!k->backend->run_device)
        return sr__error(k->ctx, SR_EINVAL,
                         "device pointers need a kernel created with SR_DEVICE_CUDA; this kernel "
                         "runs on the %s backend",
                         k->backend->name);
    if (k->io != k->dtype)
        return sr__error(k->ctx, SR_ENOTSUP,
                         "device pointers are float32 or float64 only; this kernel's dtype is %s "
                         "(run it with host arrays)",
                         sr__dtype_name(k->io));
    sr_status st = run_check(k, r);
    if (st != SR_OK)
        return st;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    if (nout == 0)
        return SR_OK;
    /* An empty reduction too: the device writes the identity into device outputs. */
    return k->backend->run_device(k, r, device_args, device_out);
}

sr_status sr_kernel_run(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                        void *out)
{
    if (!k)
        return SR_EINVAL;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    if (ri->values && ri->indices)
        return sr__error(k->ctx, SR_EINVAL,
                         "%s has two outputs (values and indices): use sr_kernel_run_ex", ri->name);
    sr_run_desc r = {
        .nx = nx,
        .ny = ny,
        .nargs = k->nargs,
        .args = args,
        .out = ri->values ? out : NULL,
        .out_idx = ri->indices ? (int64_t *)out : NULL,
    };
    return sr_kernel_run_ex(k, &r);
}
