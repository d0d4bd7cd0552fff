/*
 * omp-runtime.c — the CPU JIT backend: prepares a kernel (emit, compile or fetch from cache,
 * load) and runs it over OpenMP threads.
 *
 * Threads live here, in the library (which links the OpenMP runtime), not in the generated
 * code: the generated module is single-threaded and vectorised, and exports per-range entry
 * points (see src/jit/jit.h). Normally the output rows are split into chunks, one task each.
 * When there are few output rows and many reduced indices (fewer row chunks than threads), the
 * reduced range is split instead: each thread folds its slice into its own row states, and the
 * states are merged in index order with the reduction's combine rule, so ties resolve to the
 * lowest index exactly as in the reference.
 */
#include "../jit/jit.h"
#include "cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A direct-strategy kernel. Its module m has no sr_block: the block module bm (the same source
 * with sr_block) is built on the first sr_kernel_eval_block, under block_lock, as the kernel
 * may be used from many threads at once. With a background compile (bg), m is NULL and the
 * module comes from bg; until then the tile interpreter runs t0. */
struct jit_kernel {
    struct jit_module *m;
    struct cpu_bg *bg;
    struct tile_prog *t0;
    struct jit_plan plan;
    struct jit_load_info info;
    int acc;
    pthread_mutex_t block_lock;
    /* The fork generation (sr__fork_gen) block_lock belongs to: a thread of the parent may have
     * held it across a compile at the fork, so a child resets it on first use. */
    _Atomic unsigned block_gen;
    struct jit_module *bm;
};

/* Serialises the resets of kernels' block locks in a child of fork(). */
static pthread_mutex_t block_reset_lock = PTHREAD_MUTEX_INITIALIZER;

static void block_lock_take(struct jit_kernel *jk)
{
    unsigned gen = sr__fork_gen();
    if (atomic_load_explicit(&jk->block_gen, memory_order_acquire) != gen) {
        pthread_mutex_lock(&block_reset_lock);
        if (atomic_load_explicit(&jk->block_gen, memory_order_relaxed) != gen) {
            pthread_mutex_init(&jk->block_lock, NULL);
            atomic_store_explicit(&jk->block_gen, gen, memory_order_release);
        }
        pthread_mutex_unlock(&block_reset_lock);
    }
    pthread_mutex_lock(&jk->block_lock);
}

/* Fewer output rows than this many per thread: split the reduced range instead. */
#define SPLIT_ROWS_PER_THREAD 16
/* Reduced ranges shorter than this are never split. */
#define SPLIT_MIN_REDUCED 4096

/* The module the kernel's calls run: its own, or the background compile's once published;
 * NULL while the tile interpreter serves them. */
static struct jit_module *module_of(const struct jit_kernel *jk)
{
    return jk->m ? jk->m : cpu_bg_module(jk->bg, 0);
}

/* Whether splitting the reduced range (nt partial states of nout rows each, on top of the
 * threads' workspaces) fits in the budget. */
static bool split_fits(const sr_kernel *k, int nt, int64_t nout)
{
    const struct jit_kernel *jk = k->backend_data;
    int64_t lim = sr__call_budget(k);
    return lim <= 0 ||
           (int64_t)nt * (jk->plan.workspace_bytes + nout * jk->plan.state_bytes) <= lim;
}

static int64_t jit_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    const struct jit_kernel *jk = k->backend_data;
    int64_t pt = jk->plan.workspace_bytes;
    int nt = sr__threads(k->ctx, pt);
    /* The largest split: fewer than SPLIT_ROWS_PER_THREAD rows per thread, when it fits. */
    int64_t split_rows = (int64_t)nt * SPLIT_ROWS_PER_THREAD - 1;
    int64_t total = (int64_t)nt * pt;
    if (nt > 1 && split_fits(k, nt, split_rows))
        total = (int64_t)nt * (pt + split_rows * jk->plan.state_bytes);
    if (jk->t0) {
        /* Tier 0 serves the calls until the module is ready: the larger of the two. */
        int64_t tpt;
        int tnt;
        int64_t t = cpu_tile_workspace(k, jk->t0, &tpt, &tnt);
        if (t > total) {
            total = t;
            pt = tpt;
            nt = tnt;
        }
    }
    if (per_thread)
        *per_thread = pt;
    if (threads)
        *threads = nt;
    return total;
}

const struct jit_module *cpu_jit_module(const sr_kernel *k)
{
    if (k->backend != &cpu_jit_backend || !k->backend_data)
        return NULL;
    const struct jit_kernel *jk = k->backend_data;
    return module_of(jk);
}

bool cpu_jit_tier0(const sr_kernel *k)
{
    if (k->backend != &cpu_jit_backend || !k->backend_data)
        return false;
    const struct jit_kernel *jk = k->backend_data;
    return jk->bg && !module_of(jk);
}

sr_status cpu_jit_block_module(const sr_kernel *k, const struct jit_module **out,
                               int64_t *per_thread)
{
    *out = NULL;
    if (k->backend != &cpu_jit_backend || !k->backend_data)
        return SR_OK;
    struct jit_kernel *jk = k->backend_data;
    *per_thread = jk->plan.workspace_bytes;
    /* While a background compile runs, no call waits for a compiler: the caller evaluates the
     * block on tier 0 (cpu_jit_tier0). */
    if (jk->bg && !module_of(jk))
        return SR_OK;
    sr_status st = SR_OK;
    block_lock_take(jk);
    if (!jk->bm) {
        struct jit_plan plan = jk->plan;
        plan.no_block = false;
        struct expr_buf src = {0};
        struct jit_load_info info;
        st = jit_emit_c(k, (enum jit_acc)jk->acc, &src, &plan);
        if (st == SR_OK && src.oom)
            st = SR_ENOMEM;
        if (st == SR_OK)
            st = jit_module_get(k->ctx, src.data, src.len, &jk->bm, &info);
        else
            st =
                sr__error(k->ctx, st, "CPU JIT: cannot emit the block module (status %d)", (int)st);
        free(src.data);
    }
    *out = jk->bm;
    pthread_mutex_unlock(&jk->block_lock);
    return st;
}

/* Runs k on the tile interpreter (r->run); why (a static string) goes to explain, detail (NULL:
 * why) to the log. */
static sr_status fall_back(sr_kernel *k, const char *why, const char *detail, struct sr_realise *r)
{
    struct jit_ctx *jc = jit_ctx_of(k->ctx);
    if (k->ctx->log_level >= 1 && jc && !jc->logged_fallback) {
        fprintf(stderr, "symred: CPU JIT unavailable (%s); using the tile interpreter\n",
                detail ? detail : why);
        jc->logged_fallback = true;
    }
    r->run = &cpu_tile_backend;
    k->nplans = 0; /* the JIT's candidates do not apply to the interpreter */
    k->fallback_why = why;
    return cpu_tile_backend.prepare(k, NULL, r);
}

/* The accumulation of k's generated code (enum jit_acc): the kernel's own choice wins over
 * SYMRED_ACC (sr_acc is enum jit_acc plus one). */
static int acc_of(const sr_kernel *k, const struct jit_ctx *jc)
{
    return k->acc != SR_ACC_DEFAULT ? (int)k->acc - 1 : jc->acc;
}

_Static_assert(SR_ACC_BLOCK - 1 == JIT_ACC_BLOCK && SR_ACC_KAHAN - 1 == JIT_ACC_KAHAN &&
                   SR_ACC_F64 - 1 == JIT_ACC_F64,
               "sr_acc and enum jit_acc out of step");

int cpu_plans(const sr_kernel *k, int acc, struct sr_plan *out)
{
    cpu_fused_sym_offer(k, acc, &out[CPU_PLAN_SYM]);
    cpu_fused_offer(k, acc, &out[CPU_PLAN_FUSED]);
    cpu_gemm_offer(k, &out[CPU_PLAN_GEMM]);
    struct sr_plan *d = &out[CPU_PLAN_DIRECT];
    memset(d, 0, sizeof *d);
    d->strategy = "direct";
    d->flops = k->simp.cost.flops_pair;
    const sr_expr *roots[2] = {k->f, k->weight};
    struct cpu_cost c = {0};
    cpu_cost_gen(roots, 2, NULL, &c);
    cpu_cost_fold(k, &c);
    c.direct_outs = k->out_dim;
    d->est_ns = cpu_cost_ns(&c);
    /* Every formula has generated code. Its workspace's lower bound: one row's state, the
     * K-selections' scratch and the alignment slack (the emitter adds the tile of 16 reduced
     * indices' operands and states the exact figure). */
    int64_t es = (int64_t)sr_dtype_size(k->dtype), lim = k->budget;
    int64_t least = 64 + jit_state_bytes(k, (enum jit_acc)acc) +
                    (sr_reductions[k->red].uses_k ? (int64_t)k->k * (es + 8) : 0);
    d->workspace = least;
    d->feasible = lim <= 0 || least <= lim;
    if (d->feasible)
        snprintf(d->why, sizeof d->why,
                 "F evaluated per pair in registers (tiles set by the emitter)");
    else
        snprintf(d->why, sizeof d->why,
                 "needs at least %lld bytes per thread (one row, its state), the budget allows "
                 "%lld",
                 (long long)least, (long long)lim);
    for (int i = 0; i < CPU_PLAN_COUNT; i++)
        out[i].id = i;
    return CPU_PLAN_COUNT;
}

/* k's candidates with compiled code (none without a compiler), for the sum split. */
static int jit_offer(const sr_kernel *k, struct sr_plan *out)
{
    struct jit_ctx *jc = NULL;
    if (k->ctx->opt.jit == SR_JIT_OFF || jit_ctx_get(k->ctx, &jc) != SR_OK || jit_no_compiler(jc))
        return 0;
    return cpu_plans(k, acc_of(k, jc), out);
}

/* k's candidates for the planner, with or without compiled code (tier 0 realises them on the
 * tile interpreter); none when the JIT's state cannot be made (jit_prepare says why). */
static int jit_plans(const sr_kernel *k, struct sr_plan *out)
{
    struct jit_ctx *jc = NULL;
    if (jit_ctx_get(k->ctx, &jc) != SR_OK)
        return 0;
    return cpu_plans(k, acc_of(k, jc), out);
}

/* Serves k on the tile interpreter and compiles src on a thread of its own (src passes to the
 * thread). SR_OK: started; otherwise nothing changed and src is still the caller's. */
static sr_status bg_start(sr_kernel *k, struct jit_kernel *jk, struct expr_buf *src)
{
    struct tile_prog *t0 = NULL;
    sr_status st = cpu_tile_new(k, &t0);
    if (st != SR_OK)
        return st;
    struct cpu_bg *bg = NULL;
    st = cpu_bg_start(k->ctx, src, 1, &bg);
    if (st != SR_OK) {
        cpu_tile_free(t0);
        return st;
    }
    jk->bg = bg;
    jk->t0 = t0;
    return SR_OK;
}

/* Without compiled code (why as fall_back's, r->note its detail): plan p realised on what tier 0
 * runs, its pair work done by the tile interpreter: the fused two-product (its tiles of F formed
 * by the interpreter), the gemm-epilogue (the interpreter's epilogue on the gemm's tiles) or the
 * interpreter's direct evaluation (p direct or NULL). */
static sr_status tier0_prepare(sr_kernel *k, const struct sr_plan *p, int acc, const char *why,
                               struct sr_realise *r)
{
    /* The symmetric driver's tiles of F are generated code only. */
    if (p && p->id == CPU_PLAN_SYM) {
        r->declined = "tier 0 (no compiled code) has no symmetric driver";
        return SR_ENOTSUP;
    }
    if (p && (p->id == CPU_PLAN_FUSED || p->id == CPU_PLAN_GEMM)) {
        bool fused = p->id == CPU_PLAN_FUSED;
        sr_status st = fused ? cpu_fused_prepare(k, acc, CPU_COMPILE_NEVER)
                             : cpu_gemm_prepare(k, acc, CPU_COMPILE_NEVER);
        if (st == SR_OK) {
            k->fallback_why = why;
            r->run = fused ? &cpu_fused_backend : &cpu_gemm_backend;
        }
        if (st == SR_ENOTSUP)
            r->declined = "declined when realised on tier 0";
        return st;
    }
    return fall_back(k, why, r->note, r);
}

/* Why k has no compiled code (SYMRED_JIT=off, no C compiler), NULL when it has. A background
 * compile learns late that there is no compiler; a missing one is seen now, so the kernel says so
 * from its creation, and r->note keeps the detail for the log across k's realisations. */
static const char *tier0_why(const sr_kernel *k, struct jit_ctx *jc, struct sr_realise *r)
{
    if (k->ctx->opt.jit == SR_JIT_OFF)
        return "SYMRED_JIT=off";
    if (jit_no_compiler(jc))
        return "no C compiler";
    if (k->ctx->opt.jit == SR_JIT_ASYNC && !jit_compiler_found(jc->cc)) {
        jit_ctx_lock(jc);
        jc->no_compiler = true;
        jit_ctx_unlock(jc);
        r->note = "the C compiler was not found (SYMRED_CC, PATH)";
        return "no C compiler";
    }
    return NULL;
}

/* Realises plan p, chosen by the planner among cpu_plans' candidates (jit_plans): the symmetric
 * driver or the fused two-product (src/cpu/fused.c), the gemm-epilogue (src/cpu/gemm.c), or the
 * direct strategy (p direct, or NULL when no plan is feasible: its emitter states the exact
 * need, SR_EBUDGET). A realisation that declines (SR_ENOTSUP: its modules' own workspace past the
 * budget, a module without its block entry point) hands over to the planner's next choice. */
static sr_status jit_prepare(sr_kernel *k, const struct sr_plan *p, struct sr_realise *r)
{
    sr_ctx *ctx = k->ctx;
    struct jit_ctx *jc = NULL;
    sr_status st0 = jit_ctx_get(ctx, &jc);
    if (st0 != SR_OK)
        return st0;
    const int acc = acc_of(k, jc);
    const char *why = tier0_why(k, jc, r);
    if (why)
        return tier0_prepare(k, p, acc, why, r);
    if (p && p->id != CPU_PLAN_DIRECT) {
        enum cpu_compile mode =
            ctx->opt.jit == SR_JIT_ASYNC ? CPU_COMPILE_BACKGROUND : CPU_COMPILE_NOW;
        sr_status sg = p->id == CPU_PLAN_SYM     ? cpu_fused_sym_prepare(k, acc, mode)
                       : p->id == CPU_PLAN_FUSED ? cpu_fused_prepare(k, acc, mode)
                                                 : cpu_gemm_prepare(k, acc, mode);
        if (sg == SR_OK)
            r->run = p->id == CPU_PLAN_GEMM ? &cpu_gemm_backend : &cpu_fused_backend;
        if (sg == SR_ENOTSUP)
            r->declined = "declined when realised: the memory budget is too small for its tiles "
                          "with its modules' own workspace, or a module has no block entry point";
        return sg;
    }
    struct jit_kernel *jk = calloc(1, sizeof *jk);
    if (!jk)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    jk->acc = acc;
    /* One thread's workspace must fit in the memory budget; the emitter shrinks the tiles. */
    jk->plan.ws_limit = k->budget;
    /* sr_block waits for the first sr_kernel_eval_block (cpu_jit_block_module). */
    jk->plan.no_block = true;
    /* The direct strategy's generated code reads and writes float16 and bfloat16 arrays itself
     * (no float32 copies); every failure below leaves the kernel to core's copies again. A
     * kernel served by the tile interpreter first runs on core's copies throughout. */
    bool async = ctx->opt.jit == SR_JIT_ASYNC;
    k->io_native = k->io != k->dtype && !async;
    struct expr_buf src = {0};
    sr_status st = jit_emit_c(k, (enum jit_acc)jk->acc, &src, &jk->plan);
    if (st == SR_OK && src.oom)
        st = SR_ENOMEM;
    if (st != SR_OK) {
        free(src.data);
        free(jk);
        k->io_native = false;
        if (st == SR_ENOMEM)
            return sr__error(ctx, st, "CPU JIT: out of memory emitting the kernel source");
        /* Every formula has generated code (wide ones in loop mode): anything else is a bug. */
        return sr__error(ctx, SR_EINTERNAL, "CPU JIT: cannot emit the kernel source (status %d)",
                         (int)st);
    }
    if (k->budget > 0 && jk->plan.workspace_bytes > k->budget) {
        free(src.data);
        int64_t need = jk->plan.workspace_bytes;
        free(jk);
        k->io_native = false;
        return sr__error(ctx, SR_EBUDGET,
                         "memory budget exceeded: the smallest plan of this kernel needs %lld "
                         "bytes of workspace (one thread, tiles of 16 reduced indices x 1 row), "
                         "the budget is %lld bytes (SYMRED_MEM_LIMIT or sr_ctx_set_mem_limit)",
                         (long long)need, (long long)k->budget);
    }
    atomic_init(&jk->block_gen, sr__fork_gen());
    if (async && pthread_mutex_init(&jk->block_lock, NULL) == 0) {
        if (bg_start(k, jk, &src) == SR_OK) {
            k->backend_data = jk;
            return SR_OK;
        }
        pthread_mutex_destroy(&jk->block_lock);
    }
    st = jit_module_get(ctx, src.data, src.len, &jk->m, &jk->info);
    free(src.data);
    if (st == SR_ENODEV) {
        free(jk);
        k->io_native = false;
        char detail[600];
        sr__error_get(ctx, detail, sizeof detail);
        return fall_back(
            k, "the C compiler could not be started (SYMRED_CC; SYMRED_LOG=1 says why)", detail, r);
    }
    if (st != SR_OK) {
        free(jk);
        k->io_native = false;
        return st;
    }
    if (pthread_mutex_init(&jk->block_lock, NULL) != 0) {
        jit_module_release(ctx, jk->m);
        free(jk);
        k->io_native = false;
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    }
    k->backend_data = jk;
    return SR_OK;
}

static void jit_release(sr_kernel *k)
{
    struct jit_kernel *jk = k->backend_data;
    if (!jk)
        return;
    cpu_bg_release(k->ctx, jk->bg);
    cpu_tile_free(jk->t0);
    jit_module_release(k->ctx, jk->m);
    jit_module_release(k->ctx, jk->bm);
    pthread_mutex_destroy(&jk->block_lock);
    free(jk);
    k->backend_data = NULL;
}

static sr_status jit_run(const sr_kernel *k, const sr_run_desc *r)
{
    const struct jit_kernel *jk = k->backend_data;
    const struct jit_module *m = module_of(jk);
    if (!m)
        return cpu_tile_run(k, jk->t0, r, NULL);
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t nred = k->axis == 1 ? r->ny : r->nx;
    int nt = sr__threads(k->ctx, jk->plan.workspace_bytes);
    int failed = 0;
    if (nt == 1 || nout >= (int64_t)nt * SPLIT_ROWS_PER_THREAD || nred < SPLIT_MIN_REDUCED ||
        !split_fits(k, nt, nout)) {
        /* Row chunks: a few per thread for balance, at most one block of the module. */
        int64_t chunk = cpu_row_piece(nout, nt, m->rows_per_block);
        int64_t nchunks = (nout + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nchunks > 1)
#endif
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t o0 = c * chunk, o1 = o0 + chunk < nout ? o0 + chunk : nout;
            if (m->run(o0, o1, nred, r->args, r->out, r->out_idx))
                failed = 1;
        }
    } else {
        /* Split the reduced range in nt slices; merge their row states in index order. */
        size_t sb = (size_t)m->state_bytes, rowbytes = sb * (size_t)nout;
        char *states = malloc(rowbytes * (size_t)nt);
        if (!states)
            return sr__error(k->ctx, SR_ENOMEM, "CPU JIT: out of memory for %d partial states", nt);
        int64_t slice = (nred + nt - 1) / nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(nt)
#endif
        for (int p = 0; p < nt; p++) {
            int64_t r0 = (int64_t)p * slice, r1 = r0 + slice < nred ? r0 + slice : nred;
            if (r0 > nred)
                r0 = nred;
            if (m->part(0, nout, r0, r1, r->args, states + rowbytes * (size_t)p))
                failed = 1;
        }
        if (!failed) {
            for (int p = 1; p < nt && !failed; p++)
                failed = m->merge(states, states + rowbytes * (size_t)p, nout) != 0;
            if (!failed)
                m->final(states, 0, nout, r->out, r->out_idx);
        }
        free(states);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "CPU JIT: out of memory for the kernel workspace");
    return SR_OK;
}

/* Block-sparse ranges: the flat rows of the plan's blocks are cut into equal chunks (a few per
 * thread, at most one block of the module each), and each chunk folds its rows' intervals with
 * sr_part_iv. The reduced range is never split here: a block's rows all see the same intervals,
 * so the work per chunk is even within a block and chunks are small enough for balance. */
static sr_status jit_run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p)
{
    const struct jit_kernel *jk = k->backend_data;
    const struct jit_module *m = module_of(jk);
    if (!m)
        return cpu_tile_run(k, jk->t0, r, p);
    int nt = sr__threads(k->ctx, jk->plan.workspace_bytes);
    int64_t chunk = cpu_row_piece(p->nrows, nt, m->rows_per_block);
    int64_t nchunks = (p->nrows + chunk - 1) / chunk;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && nchunks > 1)
#endif
    {
        char *st = malloc((size_t)(m->state_bytes * chunk));
        if (!st) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t f0 = c * chunk, f1 = f0 + chunk < p->nrows ? f0 + chunk : p->nrows;
            for (int64_t b = sr__rplan_block(p, f0); st && b < p->nblocks && p->rows[b] < f1; b++) {
                int64_t o0, o1;
                sr__rplan_seg(p, b, f0, f1, &o0, &o1);
                if (o0 == o1)
                    continue;
                if (m->part_iv(o0, o1, p->iv + 2 * p->ivoff[b], p->ivoff[b + 1] - p->ivoff[b],
                               r->args, st)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                } else {
                    m->final(st, o0, o1, r->out, r->out_idx);
                }
            }
        }
        free(st);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "CPU JIT: out of memory for the kernel workspace");
    return SR_OK;
}

static sr_status jit_wait(const sr_kernel *k, double timeout_s)
{
    const struct jit_kernel *jk = k->backend_data;
    return jk ? cpu_bg_wait(jk->bg, timeout_s) : SR_OK;
}

static int jit_stage(const sr_kernel *k)
{
    const struct jit_kernel *jk = k->backend_data;
    return jk ? cpu_bg_stage(jk->bg) : SR_STAGE_FINAL;
}

static void jit_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct jit_kernel *jk = k->backend_data;
    if (!jk)
        return;
    struct jit_load_info info = jk->info;
    if (jk->bg) {
        if (cpu_bg_explain(jk->bg, b, &info) != SR_STAGE_COMPILED)
            cpu_tile_explain(k, jk->t0, b);
    } else {
        expr_buf_printf(b, "tier: 1, compiled code\n");
    }
    const struct jit_plan *p = &jk->plan;
    expr_buf_printf(b,
                    "strategy: direct (generated C, %s)\n"
                    "tiles: %d reduced indices x %d output rows; %d tile columns (hoisted "
                    "reduced-index terms), %d buffered values per index\n"
                    "hoisted: %d output-row nodes, %d reduced-index nodes; %d pair nodes\n"
                    "register blocking: %d output rows per pass over a tile (%d vector "
                    "registers counted per row, %d shared, of %d)\n"
                    "state: %lld bytes per output row; workspace %lld bytes per thread\n"
                    "threads: %d (OpenMP; reduced range split when fewer than %d output rows "
                    "per thread)\n"
                    "accumulation: %s\n"
                    "compiler: %s %s\n"
                    "module: %s, cache %s, %.1f ms\n"
                    "eval_block: generated (sr_block, the same tiles, rows over OpenMP threads; "
                    "its module is compiled on the first call%s)\n",
                    p->loops ? "loop mode: a plain loop over the reduced index, loops over wide "
                               "values and large contractions, F through the tile buffer"
                             : "omp simd over the reduced index",
                    p->tile_j, p->rows_per_block, p->columns, p->fbuf, p->hoisted_outer,
                    p->hoisted_inner, p->pair_nodes, p->rows_per_pass, p->row_regs, p->shared_regs,
                    JIT_VREGS, (long long)p->state_bytes, (long long)p->workspace_bytes,
                    sr__threads(k->ctx, p->workspace_bytes), SPLIT_ROWS_PER_THREAD,
                    k->dtype == SR_F64 ? "float64" : jit_acc_names[jk->acc],
                    jit_ctx_of(k->ctx) ? jit_ctx_of(k->ctx)->cc : "cc", jit_cflags_text(),
                    info.origin, info.cache, info.compile_ms,
                    jk->bg ? "; on tier 0, the tile interpreter's block of F" : "");
    if (k->io_native)
        expr_buf_printf(b,
                        "arrays: %s, read and written by the generated code (no float32 "
                        "copies)\n",
                        sr__dtype_name(k->io));
    if (info.path[0])
        expr_buf_printf(b, "path: %s\n", info.path);
}

static void jit_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct jit_kernel *jk = k->backend_data;
    info->strategy = SR_STRATEGY_DIRECT;
    info->device = SR_DEVICE_CPU;
    info->tile_rows = jk->plan.rows_per_block;
    info->tile_cols = jk->plan.tile_j;
    int stage = jit_stage(k);
    info->tier = stage == SR_STAGE_FINAL || stage == SR_STAGE_COMPILED;
    info->compiling = stage == SR_STAGE_PENDING;
    info->acc = k->dtype == SR_F64 ? SR_ACC_F64 : (sr_acc)(jk->acc + 1);
    info->io_native = k->io_native;
    info->eval_block = info->tier ? 1 : 2;
    info->loop_mode = jk->plan.loops;
    info->rows_per_pass = jk->plan.rows_per_pass;
    if (jk->bg)
        cpu_bg_plan_info(jk->bg, info);
    else
        cpu_module_plan_info(&jk->info, info);
    if (!info->tier)
        cpu_tile_plan_info(k, jk->t0, info);
}

const struct sr_backend_i cpu_jit_backend = {
    /* .name = */ "cpu-jit",
    /* .prepare = */ jit_prepare,
    /* .run = */ jit_run,
    /* .release = */ jit_release,
    /* .explain = */ jit_explain,
    /* .run_ranges = */ jit_run_ranges,
    /* .workspace = */ jit_workspace,
    /* .run_device = */ NULL,
    /* .ctx_free = */ jit_ctx_free,
    /* .post_rewrite = */ true,
    /* .vjp = */ cpu_attn_vjp,
    /* .run_lse = */ cpu_attn_run_lse,
    /* .offer = */ jit_offer,
    /* .stage = */ jit_stage,
    /* .wait = */ jit_wait,
    /* .plan_info = */ jit_plan_info,
    /* .plans = */ jit_plans,
};
