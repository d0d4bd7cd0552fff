/*
 * fused.c — the fused two-product strategy: wide outputs, out_o = RED_r F(o, r) B_r with F scalar
 * and B a variable of the reduced axis of width R (a kernel matrix times R right-hand sides; a
 * softmax-weighted sum of vectors, attention). The gradients of these reductions have the same
 * shape: attention's dq, dk and dv are Sums of F B with F the product of two factors, each a
 * function of one inner product (exp((q|k) s - L) and (G|v) - (G|o)); the Gaussian mat-vec's
 * dx is a Sum of F (x_i - y_j), done as x_i sum_j F - sum_j F y_j (the row sums of F beside the
 * product), with F holding the inner product (G_i|b_j) of the incoming gradient and B.
 *
 * Per thread, a block of TI output rows walks the reduced range in tiles of TJ indices:
 *   1. the TI x TJ tile of F, formed in cache by generated code (the JIT module of F alone, its
 *      sr_block entry point): per pair for a low-dimensional F, or, when F depends on the pair
 *      only through one inner product of dimension at least SR_GEMM_MIN_DIM, from a tile of
 *      inner products by symred's AVX-512 gemm plus the generated pointwise epilogue; an F that
 *      is a product of factors over two such inner products is formed as the elementwise
 *      product of one tile per factor, each from its own gemm and module;
 *   2. SumSoftMaxWeight only: the online softmax, per row the running maximum m, the output row
 *      and the running sum rescaled by exp(m_old - m) when the maximum grows, and the tile
 *      replaced by exp(F - m) (0 where F is -inf);
 *   3. the tile (packed as the gemm's A operand) times the matching TJ x R block of B, added
 *      into the output rows by the AVX-512 micro-kernel (gemm-avx512.c, cpu_avx512_gemm_kn).
 * SumSoftMaxWeight divides each row by its sum at the end. The n x m matrix is never written:
 * a thread's workspace is the two tiles, their packed copies and TI row states, stated by
 * explain and bounded by the memory budget (tiles halve until they fit; the planner rejects
 * the strategy, saying how much it needs, when even 14 x 16 does not).
 *
 * Sums accumulate in the output's own type, block by block (each tile's TJ products in
 * registers, then one addition per tile and output value: the "block" accumulation); the
 * float32 Kahan and float64 accumulations stay with the direct strategy.
 * NaN and infinities follow IEEE arithmetic through both products as they do in the direct
 * strategy: a NaN or an infinity times 0 in F or B makes the sums it enters NaN.
 *
 * This file is the strategy's backend (workspace, release, explain, the plan, the background
 * compile's stage); fused.h lists the others: the form of F and the offers (fused-form.c),
 * the tiles, the modules and the prepare (fused-plan.c), the drivers (fused-run.c) and the
 * vectorised softmax steps (fused-simd.c).
 */
#include "fused.h"

#include <stdio.h>
#include <stdlib.h>

static int64_t fused_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    const struct fused_kernel *fk = k->backend_data;
    int nt = sr__threads(k->ctx, fk->per_thread);
    if (per_thread)
        *per_thread = fk->per_thread;
    if (threads)
        *threads = nt;
    return (int64_t)nt * fk->per_thread;
}

static void fused_release(sr_kernel *k)
{
    struct fused_kernel *fk = k->backend_data;
    if (!fk)
        return;
    fused_free(k->ctx, fk);
    k->backend_data = NULL;
}

static void fused_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct fused_kernel *fk = k->backend_data;
    if (!fk)
        return;
    char desc[200];
    if (fk->kern == KERN_AVX512) {
        char d[160];
        cpu_avx512_describe(k->dtype == SR_F64, fk->tj, d, sizeof d);
        snprintf(desc, sizeof desc, "symred's AVX-512 gemm, %s", d);
    } else if (fk->kern == KERN_AVX2) {
        snprintf(desc, sizeof desc,
                 "symred's AVX2 strip products, micro-kernel %dx16, strips of %d rows, the tile of "
                 "B packed once per tile",
                 CPU_AVX2_MR, FUSED_STRIP);
    } else {
        snprintf(desc, sizeof desc, "BLIS, sub-configuration %s, one thread per call",
                 cpu_blis_arch()[0] ? cpu_blis_arch() : "?");
    }
    expr_buf_printf(b, "strategy: fused two-product (%s)\n", fk->why);
    expr_buf_printf(b, "  F: ");
    expr_print_to(b, fk->f);
    bool any_gemm = false;
    if (fk->nfac > 1)
        expr_buf_printf(b, ", scalar, the product of %d factors, a tile of each:\n", fk->nfac);
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        any_gemm |= fc->gemm != 0;
        if (fk->nfac > 1) {
            expr_buf_printf(b, "  factor %d: ", q + 1);
            expr_print_to(b, fc->f);
            expr_buf_printf(b, ", its tile ");
        } else {
            expr_buf_printf(b, ", scalar, its tile ");
        }
        expr_buf_printf(b, "%s\n",
                        fk->sdp    ? "the tile of inner products, its scale applied inside the "
                                     "softmax's exponentials"
                        : fc->gemm ? "from a tile of inner products and the generated epilogue"
                                   : "by generated code per pair (sr_block)");
        if (fc->gemm && fk->kern == KERN_AVX512) {
            char d[160];
            cpu_avx512_describe(k->dtype == SR_F64, fc->dim, d, sizeof d);
            expr_buf_printf(b,
                            "  inner products: arguments [%d] and [%d], symred's AVX-512 gemm, "
                            "%s\n",
                            fc->va, fc->vb, d);
        } else if (fc->gemm) {
            expr_buf_printf(b, "  inner products: arguments [%d] and [%d], %s\n", fc->va, fc->vb,
                            fk->kern == KERN_AVX2 ? "symred's AVX2 strip products" : "BLIS");
        }
    }
    if (fk->hoist.b) {
        expr_buf_printf(b, "  B: hoisted, the reduced-side formula ");
        expr_print_to(b, fk->hoist.b);
        expr_buf_printf(b,
                        ", %d wide, evaluated once per tile of reduced indices into the workspace "
                        "by %s (module %s, cache %s, %.1f ms)\n",
                        fk->R,
                        fk->tier0 ? "the tile interpreter"
                        : fk->bg  ? "generated code (the tile interpreter until it compiles)"
                                  : "generated code",
                        fk->hoist.m ? fk->hoist.info.origin
                        : fk->bg    ? "background"
                                    : "none",
                        fk->hoist.m ? fk->hoist.info.cache : "unused", fk->hoist.info.compile_ms);
        expr_buf_printf(b, "  ");
    } else {
        expr_buf_printf(b, "  B: argument [%d], %d wide; ", fk->bvar, fk->R);
    }
    expr_buf_printf(b, "tile of F times tile of B by the gemm (%s)\n", desc);
    if (fused_pad_cols(fk, fk->rc) != fk->rc)
        expr_buf_printf(b, "  tile of B padded with zero columns to %d for BLIS's product\n",
                        fused_pad_cols(fk, fk->rc));
    if (k->red == SR_SUMSOFTMAXWEIGHT)
        expr_buf_printf(b, "  online softmax: running row maximum, rescaled output rows, "
                           "divided by the row sums at the end\n");
    expr_buf_printf(b,
                    "tiles: %d output rows x %d reduced indices, %d columns of B per pass\n"
                    "workspace %lld bytes per thread (tile of F and its packed copy, packed B, "
                    "row states%s%s%s)\n"
                    "threads: %d (OpenMP over blocks of output rows)\n"
                    "accumulation: %s\n",
                    fk->ti, fk->tj, fk->rc, (long long)fk->per_thread,
                    fk->nfac > 1 ? ", the second factor's tile" : "",
                    fk->hoist.b ? ", the hoisted tile of B" : "",
                    any_gemm ? ", tile of inner products and the packed operands" : "",
                    sr__threads(k->ctx, fk->per_thread),
                    k->dtype == SR_F64 ? "float64" : "block (float32, one addition per tile)");
    if (fk->sym) {
        expr_buf_printf(b, "symmetric: F(x, y) = F(y, x), exchanging arguments");
        for (int p = 0; p < fk->nsym; p++)
            expr_buf_printf(b, " [%d] and [%d]%s", fk->sym_i[p], fk->sym_j[p],
                            p + 1 < fk->nsym ? "," : "");
        expr_buf_printf(b,
                        "; when each pair is the same array and n = m > %d, tiles of %d x %d, "
                        "each off-diagonal tile of F formed once and used for both triangles "
                        "(out_I += F_IJ B_J, out_J += F_IJ^T B_I, BLIS), into one accumulator "
                        "of n x %lld values per thread, added at the end; otherwise%s as above\n",
                        fk->sym_t, fk->sym_t, fk->sym_t, (long long)fused_sym_ld(fk),
                        fk->bg ? ", and on tier 0 (until the module of F is loaded)," : "");
    }
    if (fk->tier0) {
        expr_buf_printf(b, "tier: 0, the tiles of F formed by the tile interpreter (no compiled "
                           "code): ");
        cpu_tile_explain(&fk->fac[0].kt, fk->fac[0].t, b);
        return;
    }
    struct jit_load_info bi;
    if (fk->bg) {
        if (cpu_bg_explain(fk->bg, b, &bi) != SR_STAGE_COMPILED) {
            expr_buf_printf(b, "tiles of F meanwhile: ");
            cpu_tile_explain(&fk->fac[0].kt, fk->fac[0].t, b);
        }
        expr_buf_printf(b, "modules (compiled in the background): %s, cache %s, %.1f ms\n",
                        bi.origin, bi.cache, bi.compile_ms);
        return;
    }
    expr_buf_printf(b, "tier: 1, compiled code\n");
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        if (fk->nfac > 1)
            expr_buf_printf(b, "module of factor %d: ", q + 1);
        else
            expr_buf_printf(b, "module of F: ");
        expr_buf_printf(b, "%s, cache %s, %.1f ms\n", fc->info.origin, fc->info.cache,
                        fc->info.compile_ms);
        if (fc->info.path[0])
            expr_buf_printf(b, "path: %s\n", fc->info.path);
    }
}

/* The symmetric driver's kernels report SYMMETRIC whether or not a call's arrays let it run. */
static void fused_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct fused_kernel *fk = k->backend_data;
    info->strategy = fk->sym ? SR_STRATEGY_SYMMETRIC : SR_STRATEGY_FUSED;
    info->device = SR_DEVICE_CPU;
    info->tile_rows = fk->ti;
    info->tile_cols = fk->tj;
    int stage = fk->tier0 ? SR_STAGE_FAILED : cpu_bg_stage(fk->bg);
    info->tier = stage == SR_STAGE_FINAL || stage == SR_STAGE_COMPILED;
    info->compiling = stage == SR_STAGE_PENDING;
    info->acc = k->dtype == SR_F64 ? SR_ACC_F64 : SR_ACC_BLOCK;
    info->product = fk->kern == KERN_AVX512 ? "avx512" : fk->kern == KERN_AVX2 ? "avx2" : "blis";
    info->b_hoisted = fk->hoist.b != NULL;
    for (int q = 0; q < fk->nfac && !info->dot_dim; q++)
        if (fk->fac[q].gemm)
            info->dot_dim = fk->fac[q].dim;
    if (info->dot_dim && fk->kern == KERN_AVX512)
        cpu_avx512_dot_info(k->dtype == SR_F64, info->dot_dim, info);
    info->scale_in_exp = fk->sdp;
    info->b_padded = fused_pad_cols(fk, fk->rc) != fk->rc ? fused_pad_cols(fk, fk->rc) : 0;
    if (fk->bg)
        cpu_bg_plan_info(fk->bg, info);
    else if (!fk->tier0)
        cpu_module_plan_info(&fk->fac[0].info, info);
}

static int fused_stage(const sr_kernel *k)
{
    const struct fused_kernel *fk = k->backend_data;
    return fk ? cpu_bg_stage(fk->bg) : SR_STAGE_FINAL;
}

static sr_status fused_wait(const sr_kernel *k, double timeout_s)
{
    const struct fused_kernel *fk = k->backend_data;
    return fk ? cpu_bg_wait(fk->bg, timeout_s) : SR_OK;
}

const struct sr_backend_i cpu_fused_backend = {
    /* .name = */ "cpu-jit",
    /* .prepare = */ NULL,
    /* .run = */ fused_run,
    /* .release = */ fused_release,
    /* .explain = */ fused_explain,
    /* .run_ranges = */ fused_run_ranges,
    /* .workspace = */ fused_workspace,
    /* .run_device = */ NULL,
    /* .ctx_free = */ NULL,
    /* .post_rewrite = */ false,
    /* .vjp = */ cpu_attn_vjp,
    /* .run_lse = */ fused_run_lse,
    /* .offer = */ NULL,
    /* .stage = */ fused_stage,
    /* .wait = */ fused_wait,
    /* .plan_info = */ fused_plan_info,
    /* .plans = */ NULL,
};
