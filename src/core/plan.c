/*
 * plan.c — the planner: a kernel's device, its composed kernels, its plan among its backend's
 * candidates, and saying why.
 *
 * sr_kernel_new is validate -> plan -> realise (sr__plan_kernel): the device is decided
 * (SR_DEVICE_AUTO included), a composed kernel is made where the simplifier's rewrite or a sum
 * split serves, else the backend lists candidate plans (struct sr_plan: strategy, tiles,
 * workspace under the kernel's budget, estimated time, why) without compiling or allocating
 * anything, core chooses (the feasible plan of least estimated time, unless an option forces
 * one), the backend realises the choice or declines it for the next, and core assigns the
 * backend that runs the kernel. Rewrites that serve one strategy (the SqDist expansion for a
 * gemm) are taken by that strategy when it is realised (sr__simp_take_gemm_form), never before
 * the choice.
 *
 * sr_kernel_plan reports the realised plan as data (struct sr_plan_info): core's common members
 * here, the backend's through its plan_info member.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

/* Whether candidate p beats b (both feasible): a forced plan beats one that is not; then the
 * lesser estimated time, when both have one. */
static bool plan_beats(const struct sr_plan *p, const struct sr_plan *b)
{
    if (p->forced != b->forced)
        return p->forced;
    return p->est_ns > 0 && b->est_ns > 0 && p->est_ns < b->est_ns;
}

const struct sr_plan *sr__plan_best(const struct sr_plan *p, int n)
{
    const struct sr_plan *c = NULL;
    for (int i = 0; i < n; i++)
        if (p[i].feasible && (!c || plan_beats(&p[i], c)))
            c = &p[i];
    return c;
}

const struct sr_plan *sr__plan_choose(sr_kernel *k)
{
    for (int i = 0; i < k->nplans; i++)
        k->plans[i].chosen = false;
    const struct sr_plan *best = sr__plan_best(k->plans, k->nplans);
    if (!best)
        return NULL;
    struct sr_plan *c = &k->plans[best - k->plans];
    c->chosen = true;
    return c;
}

const struct sr_plan *sr__plan_reject(sr_kernel *k, const char *why)
{
    for (int i = 0; i < k->nplans; i++)
        if (k->plans[i].chosen) {
            k->plans[i].chosen = false;
            k->plans[i].feasible = false;
            snprintf(k->plans[i].why, sizeof k->plans[i].why, "%s", why);
        }
    return sr__plan_choose(k);
}

/* ---- the planner: device, composed kernels, then choose -> realise -> reject ---- */

/* The device of k: its desc's; for SR_DEVICE_AUTO the planner's choice, the device SYMRED_DEVICE
 * names, else the CPU. The GPU would be the choice where a device is present and a cost model
 * ranks it above the CPU; none ranks the devices, so AUTO neither probes for a GPU nor chooses
 * one. Records how it decided in k->device_why. */
static sr_device plan_device(sr_kernel *k)
{
    if (k->device != SR_DEVICE_AUTO) {
        k->device_why = "the kernel's desc names it";
        return k->device;
    }
    sr_device opt = (sr_device)k->ctx->opt.device; /* SYMRED_DEVICE */
    if (opt != SR_DEVICE_AUTO) {
        k->device_why = "the planner chose the device SYMRED_DEVICE names";
        return opt;
    }
    k->device_why = "the planner chose the CPU: SYMRED_DEVICE is auto or unset, and no cost "
                    "model ranks the GPU above it";
    return SR_DEVICE_CPU;
}

/* Realises k on backend be: its candidates chosen by sr__plan_choose, each realised by be's
 * prepare until one is not declined; *run is what runs k. */
static sr_status plan_realise(sr_kernel *k, const struct sr_backend_i *be,
                              const struct sr_backend_i **run)
{
    k->nplans = be->plans ? be->plans(k, k->plans) : 0;
    struct sr_realise r = {0};
    for (const struct sr_plan *p = sr__plan_choose(k);;) {
        r.run = be;
        r.declined = NULL;
        sr_status st = be->prepare ? be->prepare(k, p, &r) : SR_OK;
        if (st == SR_ENOTSUP && r.declined && p) {
            p = sr__plan_reject(k, r.declined);
            continue;
        }
        if (st == SR_OK)
            *run = r.run;
        return st;
    }
}

sr_status sr__plan_kernel(sr_kernel *k)
{
    sr_device dev = plan_device(k);
    const struct sr_backend_i *be = sr__backend_for(dev), *run = NULL;
    if (!be)
        return sr__error(k->ctx, SR_EINTERNAL, "no backend is registered for device %s",
                         sr__device_name(dev));
    /* CUDA's prepare fails with SR_ENODEV, naming what it looked for, without a GPU; the CPU JIT
     * runs on the tile interpreter (saying so once at SYMRED_LOG >= 1) when no C compiler can be
     * run. A reduction rewrite of the simplifier: a kernel on the backend reduces the inner
     * formula and the rest is applied after the reduction, on host arrays (post.c); backends
     * whose post_rewrite is false (the reference, CUDA) run k->f whole. A Sum of a sum that runs
     * faster as two kernels: the split backend with both kernels prepared (split.c). */
    sr_status st = SR_OK;
    if (k->simp.post && be->post_rewrite)
        be = &simp_post_backend;
    else if (be->post_rewrite && be->offer)
        st = sr__split_sum(k, be, &run);
    if (st == SR_OK && !run)
        st = plan_realise(k, be, &run);
    if (st != SR_OK)
        return st;
    k->backend = run;
    /* The backends plan under the memory budget; this check is the guarantee. */
    if ((st = sr__budget_check(k)) != SR_OK && k->backend->release)
        k->backend->release(k);
    return st;
}

/* Why feasible candidate p lost to the chosen plan c. */
static void lost_line(const struct sr_plan *p, const struct sr_plan *c, struct expr_buf *b)
{
    if (c->forced && !p->forced)
        expr_buf_printf(b, "; lost: an option forces %s", c->strategy);
    else if (p->est_ns > 0 && c->est_ns > 0 && p->est_ns > c->est_ns)
        expr_buf_printf(b, "; lost: estimated %.2fx the time of %s", p->est_ns / c->est_ns,
                        c->strategy);
    else
        expr_buf_printf(b, "; lost: %s comes first at an equal or unknown estimate", c->strategy);
}

static void plan_line(const struct sr_plan *p, const struct sr_plan *c, struct expr_buf *b)
{
    expr_buf_printf(b, "  %s %s: ",
                    p->chosen     ? "chosen:"
                    : p->feasible ? "alternative:"
                                  : "rejected:",
                    p->strategy);
    if (p->est_ns > 0)
        expr_buf_printf(b, "est. %.3g ns per pair (", p->est_ns);
    if (p->gemm_flops > 0)
        expr_buf_printf(b, "%.0f flops per pair in the tile product + %.0f in generated code",
                        p->gemm_flops, p->flops);
    else if (p->flops > 0)
        expr_buf_printf(b, "%.0f flops per pair in generated code", p->flops);
    else
        expr_buf_printf(b, "no cost estimate");
    if (p->est_ns > 0)
        expr_buf_printf(b, ")");
    if (p->ti > 0)
        expr_buf_printf(b, ", tiles %d x %d", p->ti, p->tj);
    if (p->workspace > 0)
        expr_buf_printf(b, ", workspace at least %lld bytes per thread", (long long)p->workspace);
    if (p->why[0])
        expr_buf_printf(b, "; %s", p->why);
    if (p->feasible && !p->chosen && c)
        lost_line(p, c, b);
    expr_buf_printf(b, "\n");
}

void sr__plan_explain(const sr_kernel *k, struct expr_buf *b)
{
    if (k->nplans == 0)
        return;
    const struct sr_plan *c = NULL;
    for (int i = 0; i < k->nplans; i++)
        c = k->plans[i].chosen ? &k->plans[i] : c;
    expr_buf_printf(b, "plans (the feasible one of least estimated time chosen, unless an option "
                       "forces one; estimated time per (i, j) pair on one thread):\n");
    if (c)
        plan_line(c, c, b);
    for (int i = 0; i < k->nplans; i++)
        if (&k->plans[i] != c)
            plan_line(&k->plans[i], c, b);
}

/* ---- sr_kernel_plan ---- */

static const char *const strategy_names[] = {
#define SR_STRATEGY_NAME_(name, value, text) [value] = text,
    SR_STRATEGY_MAP(SR_STRATEGY_NAME_)
#undef SR_STRATEGY_NAME_
};

const char *sr_strategy_name(sr_strategy s)
{
    if ((int)s < 0 || (size_t)s >= sizeof strategy_names / sizeof *strategy_names)
        return NULL;
    return strategy_names[s];
}

void sr__plan_info_composed(const sr_kernel *inner, sr_strategy outer, sr_plan_info *info)
{
    sr_plan_info in = {0};
    in.size = sizeof in;
    info->strategy = outer;
    if (sr_kernel_plan(inner, &in) != SR_OK)
        return;
    info->inner = in.inner;
    info->backend = in.backend;
    info->device = in.device;
    info->tile_rows = in.tile_rows;
    info->tile_cols = in.tile_cols;
    info->tier = in.tier;
    info->compiling = in.compiling;
    if (!info->fallback)
        info->fallback = in.fallback;
    info->module = in.module;
    info->module_cache = in.module_cache;
    info->module_path = in.module_path;
    info->compile_ms = in.compile_ms;
    info->compile_error = in.compile_error;
    info->acc = in.acc;
    info->io_native = in.io_native;
    info->loop_mode = in.loop_mode;
    info->rows_per_pass = in.rows_per_pass;
    info->tile_isa = in.tile_isa;
    info->product = in.product;
    info->b_hoisted = in.b_hoisted;
    info->rerank = in.rerank;
    info->dot_dim = in.dot_dim;
    info->dot_mr = in.dot_mr;
    info->dot_nr = in.dot_nr;
    info->dot_kc = in.dot_kc;
    info->scale_in_exp = in.scale_in_exp;
    info->b_padded = in.b_padded;
}

sr_status sr__sized_check(sr_ctx *ctx, const char *fn, const char *name, const void *arg, size_t v1,
                          const char *type)
{
    if (!arg)
        return sr__error(ctx, SR_EINVAL, "%s: %s is NULL", fn, name);
    size_t size = *(const size_t *)arg;
    if (size < v1)
        return sr__error(ctx, SR_EINVAL,
                         "%s: %s->size is %zu, at least %zu expected (set it to sizeof(%s))", fn,
                         name, size, v1, type);
    return SR_OK;
}

void sr__sized_fill(void *out, size_t *out_size, void *r, size_t *r_size, size_t r_bytes)
{
    size_t cap = *out_size, n = cap < r_bytes ? cap : r_bytes;
    *r_size = n;
    memset(out, 0, cap);
    memcpy(out, r, n);
}

/* The chosen candidate of k, or NULL. */
static const struct sr_plan *chosen_plan(const sr_kernel *k)
{
    for (int i = 0; i < k->nplans; i++)
        if (k->plans[i].chosen)
            return &k->plans[i];
    return NULL;
}

/* The bytes of the first version of sr_plan_info, the least size a caller may pass. */
#define PLAN_INFO_V1 (offsetof(sr_plan_info, fallback) + sizeof(const char *))

sr_status sr_kernel_plan(const sr_kernel *k, sr_plan_info *info)
{
    if (!k)
        return SR_EINVAL;
    sr_status st =
        sr__sized_check(k->ctx, "sr_kernel_plan", "info", info, PLAN_INFO_V1, "sr_plan_info");
    if (st != SR_OK)
        return st;
    sr_plan_info p;
    memset(&p, 0, sizeof p);
    p.strategy = SR_STRATEGY_REFERENCE;
    p.inner = (sr_strategy)-1;
    p.backend = k->backend->name;
    p.device = SR_DEVICE_REFERENCE;
    p.workspace_bytes = sr__kernel_workspace(k, &p.workspace_per_thread, &p.threads);
    p.fallback = k->fallback_why;
    p.device_why = k->device_why;
    p.plans = k->nplans;
    const struct sr_plan *c = chosen_plan(k);
    p.est_ns = c ? c->est_ns : 0;
    p.simplified = k->simp.enabled;
    p.formula = k->f;
    p.rewrite = k->simp.post_rule;
    p.hoisted = k->simp.nhoisted;
    p.flops_per_pair = k->simp.cost.flops_pair;
    p.flops_per_pair_given = k->simp.cost_user.flops_pair;
    p.bytes_per_pair = k->simp.cost.bytes_pair;
    p.split_why = k->split_why[0] ? k->split_why : NULL;
    p.split_parts = k->split.parts;
    for (int i = 0; i < k->split.parts; i++) {
        p.split_strategy[i] = k->split.strategy[i];
        p.split_est_ns[i] = k->split.est[i];
    }
    p.split_whole = k->split.whole;
    p.split_whole_est_ns = k->split.whole_est;
    if (k->backend->plan_info)
        k->backend->plan_info(k, &p);
    if ((int)p.inner < 0)
        p.inner = p.strategy;
    p.name = sr_strategy_name(p.strategy);
    sr__sized_fill(info, &info->size, &p, &p.size, sizeof p);
    return SR_OK;
}

sr_strategy sr__strategy_of(const char *name)
{
    for (size_t s = 0; name && s < sizeof strategy_names / sizeof *strategy_names; s++)
        if (strategy_names[s] && strcmp(strategy_names[s], name) == 0)
            return (sr_strategy)s;
    return (sr_strategy)-1;
}

/* The bytes of the first version of sr_plan_candidate. */
#define PLAN_CANDIDATE_V1 (offsetof(sr_plan_candidate, why) + sizeof(const char *))

sr_status sr_kernel_plan_candidate(const sr_kernel *k, int i, sr_plan_candidate *c)
{
    if (!k)
        return SR_EINVAL;
    sr_status st = sr__sized_check(k->ctx, "sr_kernel_plan_candidate", "c", c, PLAN_CANDIDATE_V1,
                                   "sr_plan_candidate");
    if (st != SR_OK)
        return st;
    if (i < 0 || i >= k->nplans)
        return sr__error(k->ctx, SR_EINVAL,
                         "sr_kernel_plan_candidate: candidate %d of %d (sr_plan_info.plans)", i,
                         k->nplans);
    /* The chosen plan first, then the others in the backend's order (as explain lists them). */
    const struct sr_plan *ch = chosen_plan(k), *p = ch;
    if (!ch || i > 0)
        for (int q = 0, n = ch ? 1 : 0; q < k->nplans; q++)
            if (&k->plans[q] != ch && n++ == i) {
                p = &k->plans[q];
                break;
            }
    sr_plan_candidate r;
    memset(&r, 0, sizeof r);
    r.strategy = sr__strategy_of(p->strategy);
    r.chosen = p->chosen;
    r.feasible = p->feasible;
    r.forced = p->forced;
    r.est_ns = p->est_ns;
    r.flops = p->flops;
    r.gemm_flops = p->gemm_flops;
    r.tile_rows = p->ti;
    r.tile_cols = p->tj;
    r.workspace_per_thread = p->workspace;
    r.why = p->why;
    sr__sized_fill(c, &c->size, &r, &r.size, sizeof r);
    return SR_OK;
}
