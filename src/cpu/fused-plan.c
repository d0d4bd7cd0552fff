/*
 * fused-plan.c — realising the fused two-product's plan (fused.h): the tiles and one thread's
 * workspace under the memory budget, the modules of F's factors and of a formula B (compiled now,
 * or in the background while tier 0's programs of the tile interpreter form the tiles), and
 * cpu_fused_prepare, cpu_fused_sym_prepare.
 */
#include "fused.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reduced indices per tile of the AVX2 strip products: 512, fewer when a panelled tile of K
 * (tj x D) or of B (tj x rc) would pass 128 KiB (float32), so that both stay in L2 while every
 * strip reads them; a multiple of 16, at least 16. Attention with its scale inside the
 * exponentials (fk->sdp), which forms no tile of F, takes tiles up to 192 KiB: at D = 128, 384
 * reduced indices against 256, both timed against PyTorch's SDPA in the same process (2 threads,
 * median of the per-round ratios, the order rotated every round, load 4-5), ran 1-3 % faster in 3
 * of 4 runs at N = M = 4096 (1 % slower in the fourth) and 4 % faster at 16 384. */
int fused_strip_tj(const struct fused_kernel *fk)
{
    int w = (fk->rc + 15) / 16 * 16;
    for (int q = 0; q < fk->nfac; q++)
        w = fk->fac[q].gemm && fk->fac[q].dim > w ? fk->fac[q].dim : w;
    int tj = ((fk->sdp ? 49152 : 32768) / w) / 16 * 16;
    return tj > 512 ? 512 : tj < 16 ? 16 : tj;
}

/* The rows of the tiles of F and of inner products for blocks of ti rows: one strip with the AVX2
 * products, which form them strip by strip. */
int64_t fused_tile_rows(const struct fused_kernel *fk, int64_t ti)
{
    return fk->kern == KERN_AVX2 && ti > FUSED_STRIP ? FUSED_STRIP : ti;
}

/* The columns of B that BLIS's product takes in a pass of `cols`: a multiple of 4. BLIS (0.9,
 * zen3 sub-configuration, AVX2) computes a product F Vt of 10, 11 or 14 columns by a slower
 * path than one of 12 or 16: for GPyTorch's 11 (K @ [y, 10 probes], d = 3), the product took
 * 0.8 of the time that forming the tile of F takes, and 0.45 with Vt padded by zero columns to
 * 12. */
int fused_pad_cols(const struct fused_kernel *fk, int cols)
{
    return fk->kern == KERN_BLIS ? (cols + 3) / 4 * 4 : cols;
}

/* Whether each pass's output block and tile of B go through buffers (Cb, Vb): when B takes
 * several passes, or when BLIS's product pads the columns. */
bool fused_buffered(const struct fused_kernel *fk)
{
    return fk->rc < fk->R || fused_pad_cols(fk, fk->rc) != fk->rc;
}

/* The row stride of a pass's output block and tile of B in their buffers: the pass's padded
 * columns and 16 more. Rows of a power-of-two stride (R = 1024: 4 KiB) all fall into the same
 * cache sets; R = 1024 ran at 2.9x K @ B in place, where R = 256 ran at 1.1x. */
int64_t fused_ld_pass(const struct fused_kernel *fk) { return fused_pad_cols(fk, fk->rc) + 16; }

/* One thread's workspace for tiles ti x tj: the tile of F (none with fk->sdp, whose exponentials
 * replace the tile of inner products) and its packed copy, the packed block of B, the row states
 * (maximum and sum), the modules' own tiles, the tile of each further factor of F; per factor
 * from a gemm: the tile of inner products and both packed operands. */
int64_t fused_thread_bytes(const sr_kernel *k, const struct fused_kernel *fk, int ti, int tj)
{
    int f64 = k->dtype == SR_F64;
    int64_t es = f64 ? 8 : 4, D = 0;
    const int64_t tr = fused_tile_rows(fk, ti);
    int64_t b = (fk->sdp ? 0 : al64(tr * tj * es)) + al64((int64_t)ti * 16) +
                al64(((int64_t)k->nargs + 2) * (int64_t)sizeof(void *)) + 64;
    if (fk->nfac > 1)
        b += al64(tr * tj * es);
    if (fk->hoist.b) /* B's tile and its module's own (or the tile interpreter's frame) */
        b += al64((int64_t)tj * fk->R * es) + fk->hoist.plan.workspace_bytes +
             (fk->hoist.t ? cpu_tile_frame_bytes(fk->hoist.t, 1) : 0);
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        b += fc->plan.workspace_bytes + (fc->t ? cpu_tile_frame_bytes(fc->t, ti) : 0);
        if (!fc->gemm)
            continue;
        D = fc->dim > D ? fc->dim : D;
        b += al64(tr * tj * es);
        if (fk->kern == KERN_AVX512)
            b += al64(cpu_avx512_pack_a_bytes(ti, fc->dim, f64)) +
                 al64(cpu_avx512_pack_b_bytes(tj, fc->dim, f64));
        else if (fk->kern == KERN_AVX2)
            b += al64(cpu_avx2_pack_bt_bytes(tj, fc->dim));
    }
    if (fused_buffered(fk))
        b +=
            al64((int64_t)ti * fused_ld_pass(fk) * es) + al64((int64_t)tj * fused_ld_pass(fk) * es);
    if (fk->kern == KERN_AVX512) {
        b += al64(cpu_avx512_pack_a_bytes(ti, tj, f64)) +
             al64(cpu_avx512_pack_b_bytes(fk->rc, tj, f64));
    } else if (fk->kern == KERN_AVX2) {
        b += al64(cpu_avx2_pack_bt_bytes(fk->rc, tj));
    } else {
        /* BLIS packs into its own buffers: both operands of the larger product, an estimate. */
        int64_t kk = tj > D ? tj : D, nn = fk->rc > tj ? fk->rc : tj;
        b += ((int64_t)ti + nn + 32) * (kk < 512 ? kk : 512) * es + (64 << 10);
    }
    return b;
}

void fused_free(sr_ctx *ctx, struct fused_kernel *fk)
{
    if (fk->hoist.m)
        jit_module_release(ctx, fk->hoist.m);
    cpu_bg_release(ctx, fk->bg);
    cpu_tile_free(fk->hoist.t);
    for (int q = 0; q < fk->nfac; q++) {
        if (fk->fac[q].m)
            jit_module_release(ctx, fk->fac[q].m);
        cpu_tile_free(fk->fac[q].t);
    }
    free(fk);
}

/* The plan of a module of one part of k (a factor of F, or B), used only through its
 * sr_block: the workspace limited to a quarter of the budget, otherwise zero. */
static void part_plan(const sr_kernel *k, struct jit_plan *plan)
{
    int64_t lim = k->budget;
    memset(plan, 0, sizeof *plan);
    plan->ws_limit = lim > 0 ? lim / 4 : 0;
    plan->block_only = true;
}

/* The source of f alone as a Sum of its values (k's variables and tiles otherwise), used
 * through its sr_block. */
static void part_kernel(const sr_kernel *k, const sr_expr *f, sr_kernel *kf)
{
    *kf = *k;
    kf->f = f;
    kf->fdim = f->dim;
    kf->out_dim = f->dim;
    kf->weight = NULL;
    kf->red = SR_SUM;
    kf->k = 0;
}

static sr_status emit_part(const sr_kernel *k, const sr_expr *f, struct jit_plan *plan,
                           struct expr_buf *src)
{
    sr_kernel kf;
    part_kernel(k, f, &kf);
    sr_status st = jit_emit_c(&kf, JIT_ACC_BLOCK, src, plan);
    if (st == SR_OK && src->oom)
        st = SR_ENOMEM;
    return st;
}

/* The source of factor q's module for tiles fk->ti x fk->tj: F's factor alone as a scalar Sum,
 * used through its sr_block, reading its inner products from args[nargs] when from a gemm. */
static sr_status emit_factor(const sr_kernel *k, struct fused_kernel *fk, int q, const sr_expr *S,
                             struct expr_buf *src)
{
    struct fused_factor *fc = &fk->fac[q];
    part_plan(k, &fc->plan);
    if (fc->gemm) {
        fc->plan.gemm = S;
        fc->plan.gemm_arg = k->nargs;
        fc->plan.gemm_ld = fk->tj;
        fc->plan.gemm_rows = fk->ti;
    }
    return emit_part(k, fc->f, &fc->plan, src);
}

/* The module of a formula B (fk->hoist.b): B alone as a Sum of its R values, used through its
 * sr_block on one output row (B does not depend on it), written TJ x R, row stride R. */
static sr_status hoist_module(const sr_kernel *k, struct fused_kernel *fk, struct expr_buf *keep)
{
    struct fused_hoist *h = &fk->hoist;
    struct expr_buf src = {0};
    part_plan(k, &h->plan);
    sr_status st = emit_part(k, h->b, &h->plan, &src);
    if (st == SR_OK && keep) { /* compiled in the background */
        *keep = src;
        return SR_OK;
    }
    if (st == SR_OK)
        st = jit_module_get(k->ctx, src.data, src.len, &h->m, &h->info);
    if (st == SR_OK && !h->m->block)
        st = SR_ENOTSUP;
    free(src.data);
    return st;
}

/* The tiles under the memory budget lim (0: none), from fk's: rows first, then reduced indices;
 * the reduced indices first for the AVX2 strip products, whose tiles of F are one strip whatever
 * ti, their tiles of K and B tj long, and tj a multiple of their 16-column panels (they write
 * whole panels of the tile of inner products, of row stride tj). At least 14 x 16. */
void fused_fit_tiles(const sr_kernel *k, const struct fused_kernel *fk, int64_t lim, int *ti_,
                     int *tj_)
{
    int ti = fk->ti, tj = fk->tj;
    const bool rows_first = fk->kern != KERN_AVX2;
    while (lim > 0 && fused_thread_bytes(k, fk, ti, tj) > lim && (ti > 14 || tj > 16)) {
        if ((rows_first || tj <= 16) && ti > 14)
            ti = ti / 28 * 14 > 14 ? ti / 28 * 14 : 14;
        else
            tj = tj / 32 * 16 > 16 ? tj / 32 * 16 : 16;
    }
    *ti_ = ti;
    *tj_ = tj;
}

/* Tier 0's programs of the factors of F (each reading its inner product from its gemm's tile)
 * and of a formula B. */
static sr_status tier0_programs(const sr_kernel *k, struct fused_kernel *fk,
                                const sr_expr *const *S)
{
    sr_status st = SR_OK;
    if (fk->hoist.b) {
        part_kernel(k, fk->hoist.b, &fk->hoist.kt);
        st = cpu_tile_new_ext(&fk->hoist.kt, NULL, 0, &fk->hoist.t);
    }
    for (int q = 0; q < fk->nfac && st == SR_OK; q++) {
        struct fused_factor *fc = &fk->fac[q];
        part_kernel(k, fc->f, &fc->kt);
        st = cpu_tile_new_ext(&fc->kt, fc->gemm ? S[q] : NULL, 0, &fc->t);
    }
    return st;
}

/* Realises k on the fused strategy with the formulas of km (as fused_plan_form). */
static sr_status prepare_form(sr_kernel *k, const sr_kernel *km, int acc, bool gemm_form,
                              enum cpu_compile mode)
{
    const bool tier0 = mode == CPU_COMPILE_NEVER;
    sr_ctx *ctx = k->ctx;
    struct fused_kernel *fk = calloc(1, sizeof *fk);
    if (!fk)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    const sr_expr *S[FUSED_MAX_FACTORS] = {0};
    if (fused_plan_form(k, km, acc, gemm_form, fk, S)) {
        free(fk);
        return SR_ENOTSUP;
    }
    fk->why = fused_why(k, fk);
    sr_status st = SR_OK;
    int64_t lim = k->budget;
    struct expr_buf src[FUSED_MAX_FACTORS + 1] = {{0}}; /* the factors', then B's */
    fk->tier0 = tier0;
    if (mode != CPU_COMPILE_NOW)
        st = tier0_programs(k, fk, S);
    if (st == SR_OK && !tier0 && fk->hoist.b)
        st = hoist_module(k, fk, mode == CPU_COMPILE_BACKGROUND ? &src[fk->nfac] : NULL);
    if (st != SR_OK) {
        fused_free(ctx, fk);
        return st == SR_ENOTSUP || st == SR_ENODEV ? SR_ENOTSUP : st;
    }
    for (;;) {
        bool any_gemm = false;
        for (int q = 0; q < fk->nfac && st == SR_OK && !tier0; q++) {
            free(src[q].data);
            memset(&src[q], 0, sizeof src[q]);
            st = emit_factor(k, fk, q, S[q], &src[q]);
            any_gemm |= fk->fac[q].gemm != 0;
        }
        if (st != SR_OK)
            break;
        int ti, tj;
        fused_fit_tiles(k, fk, lim, &ti, &tj);
        if (any_gemm && (ti != fk->ti || tj != fk->tj)) {
            fk->ti = ti; /* the tile's leading dimension is compiled in: emit again */
            fk->tj = tj;
            continue;
        }
        fk->ti = ti;
        fk->tj = tj;
        fk->per_thread = fused_thread_bytes(k, fk, ti, tj);
        if (lim > 0 && fk->per_thread > lim)
            st = SR_ENOTSUP; /* the direct strategy reports the budget */
        break;
    }
    if (st == SR_OK && mode == CPU_COMPILE_BACKGROUND &&
        cpu_bg_start(ctx, src, fk->nfac + (fk->hoist.b != NULL), &fk->bg) != SR_OK) {
        /* No thread: compile now. */
        if (fk->hoist.b) {
            st = jit_module_get(ctx, src[fk->nfac].data, src[fk->nfac].len, &fk->hoist.m,
                                &fk->hoist.info);
            if (st == SR_OK && !fk->hoist.m->block)
                st = SR_ENOTSUP;
        }
        mode = CPU_COMPILE_NOW;
    }
    free(src[fk->nfac].data);
    for (int q = 0; q < fk->nfac && st == SR_OK && mode == CPU_COMPILE_NOW; q++) {
        struct fused_factor *fc = &fk->fac[q];
        st = jit_module_get(ctx, src[q].data, src[q].len, &fc->m, &fc->info);
        if (st == SR_OK && !fc->m->block)
            st = SR_ENOTSUP;
    }
    for (int q = 0; q < fk->nfac; q++)
        free(src[q].data);
    if (st != SR_OK) {
        fused_free(ctx, fk);
        if (st == SR_ENOTSUP || st == SR_ENODEV)
            return SR_ENOTSUP;
        return st == SR_ENOMEM ? sr__error(ctx, st, "fused two-product: cannot emit F's tile") : st;
    }
    if (gemm_form)
        sr__simp_take_gemm_form(k);
    k->backend_data = fk;
    return SR_OK;
}

sr_status cpu_fused_prepare(sr_kernel *k, int acc, enum cpu_compile mode)
{
    /* F with SqDist expanded into norms and an inner product (the simplifier's gemm form) when
     * that gives a factor of F its gemm: an absolute error of about the rounding of the norms
     * in each distance (docs/wide.md), which a smooth F and a sum take as they take rounding;
     * else F as simplified. */
    sr_kernel kx;
    const sr_kernel *km = cpu_gemm_form(k, &kx);
    if (km != k) {
        sr_status st = prepare_form(k, km, acc, true, mode);
        if (st != SR_ENOTSUP)
            return st;
    }
    return prepare_form(k, k, acc, false, mode);
}

sr_status cpu_fused_sym_prepare(sr_kernel *k, int acc, enum cpu_compile mode)
{
    sr_status st = cpu_fused_prepare(k, acc, mode);
    if (st != SR_OK)
        return st;
    struct fused_kernel *fk = k->backend_data;
    struct fused_form fm = {fk->f, fk->bvar, fk->avar, fk->bsign, fk->asign, fk->hoist.b};
    const char *why = NULL;
    if (fk->nfac != 1 || fk->fac[0].gemm)
        why = "F's tile comes from a tile of inner products";
    else if (fk->kern == KERN_AVX2 || !cpu_blis_usable(NULL))
        why = "no BLIS for the transposed product";
    else
        why = fused_sym_form(k, &fm, fk->sym_i, fk->sym_j, &fk->nsym);
    if (why) {
        char msg[200];
        snprintf(msg, sizeof msg, "realised as the fused two-product: %s", why);
        sr__plan_reject(k, msg);
        return SR_OK;
    }
    fk->sym = true;
    fk->sym_t = FUSED_SYM_T < fk->ti ? FUSED_SYM_T : fk->ti;
    fk->sym_t = fk->sym_t < fk->tj ? fk->sym_t : fk->tj;
    return SR_OK;
}
