/*
 * fused-run.c — the fused two-product's drivers (fused.h): per thread, a block of output rows walks
 * the reduced range in tiles, forming each tile of F (by the modules, or on tier 0 by the tile
 * interpreter's programs), the online softmax for a SumSoftMaxWeight, and the product of the tile
 * by the tile of B, in chunks of rows over the OpenMP threads; the operands packed once per run;
 * and the symmetric driver, which forms each off-diagonal tile of F once for both triangles.
 */
#include "fused.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The AVX2 strip products' packed operands of the whole reduced range, packed once per run and
 * shared by the threads (fused_run, when the memory budget allows): for each tile of tj reduced
 * indices, each gemm factor's tile of K (cpu_avx2_pack_bt) at Kp[q] + t * kb[q] and the tile of B
 * (cpu_avx2_pack_v) at Vp + t * vb. Without it, every row block packs the tiles again. */
struct fused_pre {
    char *Kp[FUSED_MAX_FACTORS], *Vp;
    int64_t kb[FUSED_MAX_FACTORS], vb;
    int64_t ntiles;
    char *mem;
};

struct fused_ws {
    char *F, *F2, *Ap, *Bp;
    char *Bh; /* the tile of a formula B (fk->hoist) */
    char *G[FUSED_MAX_FACTORS], *Qp[FUSED_MAX_FACTORS], *Kp[FUSED_MAX_FACTORS];
    char *Cb, *Vb; /* passes over B's columns: the pass's output block and tile of B */
    double *m, *s; /* SumSoftMaxWeight: running maximum and sum per row */
    const void **args;
    char *mem;
    const struct fused_pre *pre; /* the AVX2 products' operands packed once per run, or NULL */
    const char *Kuse[FUSED_MAX_FACTORS]; /* the packed tile of K that the strips read */
    /* The call's tier: the modules of the factors and of a formula B, or (NULL) the tile
     * interpreter's frames. */
    const struct jit_module *fm[FUSED_MAX_FACTORS], *hm;
    struct tile_frame *tf[FUSED_MAX_FACTORS], *th;
    void *lse; /* SumSoftMaxWeight's log-normalizer per output row (fused_run_lse), or NULL */
};

static void ws_free(struct fused_ws *w)
{
    for (int q = 0; q < FUSED_MAX_FACTORS; q++)
        cpu_tile_frame_free(w->tf[q]);
    cpu_tile_frame_free(w->th);
    free(w->mem);
    memset(w, 0, sizeof *w);
}

/* The modules a call runs (the same for all its threads: a call runs one tier whole): the
 * kernel's own, the background compile's once ready, or none (the tile interpreter). */
struct fused_mods {
    const struct jit_module *f[FUSED_MAX_FACTORS], *h;
};

static struct fused_mods mods_of(const struct fused_kernel *fk)
{
    struct fused_mods md = {{NULL}, fk->hoist.m};
    bool ready = fk->bg && cpu_bg_module(fk->bg, 0);
    for (int q = 0; q < fk->nfac; q++)
        md.f[q] = fk->fac[q].m ? fk->fac[q].m : ready ? cpu_bg_module(fk->bg, q) : NULL;
    if (fk->hoist.b && !md.h && ready)
        md.h = cpu_bg_module(fk->bg, fk->nfac);
    return md;
}

static bool ws_new(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                   const struct fused_mods *md, struct fused_ws *w)
{
    int f64 = k->dtype == SR_F64;
    int64_t es = f64 ? 8 : 4, ti = fk->ti, tj = fk->tj;
    memset(w, 0, sizeof *w);
    w->mem = malloc((size_t)fk->per_thread);
    if (!w->mem)
        return false;
    char *p = (char *)(((uintptr_t)w->mem + 63) & ~(uintptr_t)63);
#define TAKE(dst, bytes)                                                                           \
    do {                                                                                           \
        dst = (void *)p;                                                                           \
        p += al64(bytes);                                                                          \
    } while (0)
    const int64_t tr = fused_tile_rows(fk, ti);
    if (!fk->sdp) /* with sdp, the exponentials replace the tile of inner products */
        TAKE(w->F, tr * tj * es);
    TAKE(w->m, ti * 8);
    TAKE(w->s, ti * 8);
    TAKE(w->args, ((int64_t)k->nargs + 2) * (int64_t)sizeof(void *));
    if (fused_buffered(fk)) {
        TAKE(w->Cb, ti * fused_ld_pass(fk) * es);
        TAKE(w->Vb, tj * fused_ld_pass(fk) * es);
        memset(w->Vb, 0, (size_t)(tj * fused_ld_pass(fk) * es)); /* the padding columns: zeros */
    }
    if (fk->nfac > 1)
        TAKE(w->F2, tr * tj * es);
    if (fk->hoist.b)
        TAKE(w->Bh, tj * fk->R * es);
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        if (!fc->gemm)
            continue;
        TAKE(w->G[q], tr * tj * es);
        if (fk->kern == KERN_AVX512) {
            TAKE(w->Qp[q], cpu_avx512_pack_a_bytes(ti, fc->dim, f64));
            TAKE(w->Kp[q], cpu_avx512_pack_b_bytes(tj, fc->dim, f64));
        } else if (fk->kern == KERN_AVX2) {
            TAKE(w->Kp[q], cpu_avx2_pack_bt_bytes(tj, fc->dim));
        }
    }
    if (fk->kern == KERN_AVX512) {
        TAKE(w->Ap, cpu_avx512_pack_a_bytes(ti, tj, f64));
        TAKE(w->Bp, cpu_avx512_pack_b_bytes(fk->rc, tj, f64));
    } else if (fk->kern == KERN_AVX2) {
        TAKE(w->Bp, cpu_avx2_pack_bt_bytes(fk->rc, tj));
    }
#undef TAKE
    for (int v = 0; v < k->nargs; v++)
        w->args[v] = r->args[v];
    w->args[k->nargs] = NULL;
    w->args[k->nargs + 1] = NULL;
    bool ok = true;
    w->hm = md->h;
    for (int q = 0; q < fk->nfac; q++)
        w->fm[q] = md->f[q];
    if (fk->hoist.b && !w->hm)
        ok = (w->th = cpu_tile_frame_new(&fk->hoist.kt, fk->hoist.t, w->args, 1)) != NULL;
    for (int q = 0; q < fk->nfac && ok; q++)
        if (!w->fm[q])
            ok = (w->tf[q] = cpu_tile_frame_new(&fk->fac[q].kt, fk->fac[q].t, w->args, ti)) != NULL;
    if (!ok)
        ws_free(w);
    return ok;
}

/* The online softmax of rows [0, no) of the tile (row stride nj), rows [s0, s0 + no) of the block:
 * the running maximum, the rescaling of the row's output (cols values, row stride ldo) and sum, and
 * the tile replaced by exp(F - m). */
static void softmax_tile(const sr_kernel *k, const struct fused_kernel *fk, struct fused_ws *w,
                         int64_t s0, char *out, int64_t ldo, int64_t no, int64_t nj, int cols)
{
    double *wm = w->m + s0, *wsum = w->s + s0;
    for (int64_t o = 0; o < no; o++) {
        if (k->dtype == SR_F64) {
            double *F = (double *)w->F + o * nj, tm = -INFINITY;
            SIMD_MAX(tm)
            for (int64_t c = 0; c < nj; c++)
                tm = F[c] > tm ? F[c] : tm; /* NaN passes: it reaches the sums through exp */
            const double sa = cpu_softmax_grow(&wm[o], tm), mn = wm[o];
            if (sa != 1.0) {
                double *orow = (double *)out + o * ldo;
                for (int c = 0; c < cols; c++)
                    orow[c] *= sa;
                wsum[o] *= sa;
            }
            double ts = 0;
            for (int64_t c = 0; c < nj; c++) {
                F[c] = cpu_ssmw_weight(F[c], mn);
                ts += F[c];
            }
            wsum[o] += ts;
        } else {
            fused_softmax_row_f32(fk->kern, (float *)w->F + o * nj, nj, wm + o, wsum + o,
                                  (float *)out + o * ldo, cols);
        }
    }
}

/* softmax_tile for fk->sdp: the tile of inner products G (row stride tj) replaced by
 * exp(G a - m), a the scale of F = a G, without forming F: m from G's maximum (its minimum when
 * a < 0), which the scale's rounding keeps F's maximum. A row whose maximum is not finite, or a
 * scale that is not, takes F = G a and fused_softmax_row_f32. */
static void softmax_sdp(const struct fused_kernel *fk, struct fused_ws *w, int64_t s0, char *out,
                        int64_t ldo, int64_t no, int64_t nj, int cols, float a)
{
    double *wm = w->m + s0, *wsum = w->s + s0;
    for (int64_t o = 0; o < no; o++) {
        float *G = (float *)w->G[0] + o * fk->tj, *orow = (float *)out + o * ldo;
#if defined(__x86_64__) && defined(__GNUC__)
        float hi, lo;
        fused_minmax_avx2(G, nj, &hi, &lo);
        const float tm = a >= 0 ? hi * a : lo * a;
        if (isfinite(tm) && isfinite(a)) {
            const float mn = fused_grow_max_f32(wm + o, wsum + o, orow, cols, tm);
            wsum[o] += fused_expsum_scaled_avx2(G, nj, a, mn);
            continue;
        }
#endif
        for (int64_t c = 0; c < nj; c++)
            G[c] *= a;
        fused_softmax_row_f32(fk->kern, G, nj, wm + o, wsum + o, orow, cols);
    }
}

/* The tile of F on rows [o0, o1) x reduced indices [rt, rt + nj), row stride nj, in w->F: each
 * factor's tile by its module (from its tile of inner products G = Q Kt^T, of row stride tj,
 * when it has one), multiplied together. Nonzero when out of memory (a module's tile). */
static int factor_tiles(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                        struct fused_ws *w, int64_t o0, int64_t o1, int64_t rt, int64_t nj)
{
    const int f64 = k->dtype == SR_F64;
    const int64_t es = f64 ? 8 : 4, no = o1 - o0;
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        if (fc->gemm) {
            const int64_t D = fc->dim;
            const char *Q = (const char *)r->args[fc->va] + o0 * D * es;
            const char *Kt = (const char *)r->args[fc->vb] + rt * D * es;
            /* G (no x nj, row stride tj) = Q Kt^T, Kt stored nj x D row-major. */
            if (fk->kern == KERN_AVX512)
                cpu_avx512_gemm(f64, no, nj, D, w->Qp[q], Kt, w->Kp[q], w->G[q], fk->tj);
            else if (fk->kern == KERN_BLIS)
                cpu_blis_gemm(f64, no, nj, D, Q, D, 1, Kt, 1, D, 0, w->G[q], fk->tj);
            else /* Kt packed at w->Kuse[q] for the tile (fold_cols) */
                cpu_avx2_strip_abt(no, D, (const float *)Q, D, (const float *)w->Kuse[q], nj,
                                   (float *)w->G[q], fk->tj);
        }
        if (fk->sdp)
            return 0; /* the exponentials read G (softmax_sdp) */
        w->args[k->nargs] = w->G[q];
        if (!w->fm[q])
            cpu_tile_block(w->tf[q], o0, o1 - o0, rt, nj, fc->gemm ? w->G[q] : NULL, fk->tj,
                           q ? w->F2 : w->F, nj, 1);
        else if (w->fm[q]->block(o0, o1, rt, rt + nj, w->args, q ? w->F2 : w->F, nj, 1))
            return 1;
        if (q == 0)
            continue;
        const int64_t n = no * nj;
        if (f64) {
            double *F = (double *)w->F;
            const double *F2 = (const double *)w->F2;
#pragma omp simd
            for (int64_t c = 0; c < n; c++)
                F[c] *= F2[c];
        } else {
            float *F = (float *)w->F;
            const float *F2 = (const float *)w->F2;
#pragma omp simd
            for (int64_t c = 0; c < n; c++)
                F[c] *= F2[c];
        }
    }
    return 0;
}

/* wsum[o] += the sum of row o of the tile of F (row stride nj), o < no. */
static void row_sums(int f64, struct fused_ws *w, int64_t s0, int64_t no, int64_t nj)
{
    double *wsum = w->s + s0;
    for (int64_t o = 0; o < no; o++) {
        double t = 0;
        if (f64) {
            const double *F = (const double *)w->F + o * nj;
#pragma omp simd reduction(+ : t)
            for (int64_t c = 0; c < nj; c++)
                t += F[c];
        } else {
            const float *F = (const float *)w->F + o * nj;
            float tf = 0;
#pragma omp simd reduction(+ : tf)
            for (int64_t c = 0; c < nj; c++)
                tf += F[c];
            t = tf;
        }
        wsum[o] += t;
    }
}

/* out = bsign out + asign A_o sum_r F(o, r) on the pass's block (no rows, cols columns from
 * c0, row stride ldo): the A term of A - B, from the row sums of F. */
static void add_a_term(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                       struct fused_ws *w, char *out, int64_t ldo, int64_t o0, int64_t no, int c0,
                       int cols)
{
    const int R = fk->R;
    for (int64_t o = 0; o < no; o++) {
        const double sa = fk->asign * w->s[o], sb = fk->bsign;
        if (k->dtype == SR_F64) {
            const double *A = (const double *)r->args[fk->avar] + (o0 + o) * R + c0;
            double *orow = (double *)out + o * ldo;
            for (int c = 0; c < cols; c++)
                orow[c] = sb * orow[c] + sa * A[c];
        } else {
            const float *A = (const float *)r->args[fk->avar] + (o0 + o) * R + c0;
            float *orow = (float *)out + o * ldo;
            for (int c = 0; c < cols; c++)
                orow[c] = (float)(sb * orow[c] + sa * A[c]);
        }
    }
}

/* lse[o0 + o] = m_o + log s_o from the online softmax's running maximum and sum of the block's
 * rows o < no (-inf for a row whose every F is -inf: m = -inf and s = 0). */
static void write_lse(int f64, const struct fused_ws *w, int64_t o0, int64_t no)
{
    for (int64_t o = 0; o < no; o++) {
        const double l = w->m[o] + log(w->s[o]);
        if (f64)
            ((double *)w->lse)[o0 + o] = l;
        else
            ((float *)w->lse)[o0 + o] = (float)l;
    }
}

/* Factor f's tile of K for the AVX2 strip products: reduced indices [rt, rt + nj), packed at Kp. */
static void pack_k_tile(const struct fused_kernel *fk, const sr_run_desc *r, int f, int64_t rt,
                        int64_t nj, char *Kp)
{
    const int64_t D = fk->fac[f].dim;
    cpu_avx2_pack_bt(nj, D, (const float *)r->args[fk->fac[f].vb] + rt * D, D, (float *)Kp);
}

/* Output rows [o0, o1) (at most ti), columns [c0, c0 + cols) of B, over the reduced intervals
 * iv[2q], iv[2q + 1], q < niv: those outputs are overwritten. Nonzero when out of memory (the
 * module's tile). */
static int fold_cols(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                     struct fused_ws *w, int64_t o0, int64_t o1, int c0, int cols,
                     const int64_t *iv, int64_t niv)
{
    const int f64 = k->dtype == SR_F64, R = fk->R;
    const int64_t es = f64 ? 8 : 4, no = o1 - o0;
    const bool ssmw = k->red == SR_SUMSOFTMAXWEIGHT;
    const float sc = !fk->sdp           ? 0
                     : fk->sdp_var >= 0 ? *(const float *)r->args[fk->sdp_var]
                                        : fk->sdp_c;
    char *dst = (char *)r->out + (o0 * R + c0) * es;
    /* The pass's block of the output: in place, or in Cb with a stride of no power of two. */
    char *out = w->Cb ? w->Cb : dst;
    const int64_t ldo = w->Cb ? fused_ld_pass(fk) : R;
    /* The product's columns: in the buffers, padded for BLIS (zeros in Vb's padding). */
    const int pcols = w->Cb ? fused_pad_cols(fk, cols) : cols;
    for (int64_t o = 0; o < no; o++) {
        memset(out + o * ldo * es, 0, (size_t)(pcols * es));
        w->m[o] = -INFINITY;
        w->s[o] = 0;
    }
    const char *V = fk->hoist.b ? w->Bh + c0 * es : (const char *)r->args[fk->bvar] + c0 * es;
    const bool avx = fk->kern == KERN_AVX512, strips = fk->kern == KERN_AVX2;
    const int64_t sh = strips ? FUSED_STRIP : no;
    for (int q = 0; q < fk->nfac; q++)
        if (fk->fac[q].gemm && avx)
            cpu_avx512_pack_a(f64, no, fk->fac[q].dim,
                              (const char *)r->args[fk->fac[q].va] + o0 * fk->fac[q].dim * es,
                              w->Qp[q]);
    for (int64_t q = 0; q < niv; q++)
        for (int64_t rt = iv[2 * q], r1 = iv[2 * q + 1]; rt < r1; rt += fk->tj) {
            const int64_t nj = r1 - rt < fk->tj ? r1 - rt : fk->tj;
            /* A formula B: its tile, evaluated here, once for all the tile's rows. */
            if (fk->hoist.b && !w->hm)
                cpu_tile_block(w->th, 0, 1, rt, nj, NULL, 0, w->Bh, nj * R, R);
            else if (fk->hoist.b && w->hm->block(0, 1, rt, rt + nj, w->args, w->Bh, nj * R, R))
                return 1;
            const char *Vt = fk->hoist.b ? V : V + rt * R * es;
            int64_t ldv = R;
            if (w->Vb && !strips) { /* the tile of B's pass columns, at stride fused_ld_pass */
                for (int64_t j = 0; j < nj; j++)
                    memcpy(w->Vb + j * fused_ld_pass(fk) * es, Vt + j * R * es,
                           (size_t)(cols * es));
                Vt = w->Vb;
                ldv = fused_ld_pass(fk);
            }
            /* The tiles of B and K that every strip reads: packed once per run, or here. */
            const char *Vp = w->Bp;
            if (strips && w->pre) {
                const int64_t t = rt / fk->tj;
                Vp = w->pre->Vp + t * w->pre->vb;
                for (int f = 0; f < fk->nfac; f++)
                    w->Kuse[f] = fk->fac[f].gemm ? w->pre->Kp[f] + t * w->pre->kb[f] : NULL;
            } else if (strips) {
                cpu_avx2_pack_v(nj, cols, (const float *)Vt, ldv, (float *)w->Bp);
                for (int f = 0; f < fk->nfac; f++)
                    if ((w->Kuse[f] = fk->fac[f].gemm ? w->Kp[f] : NULL))
                        pack_k_tile(fk, r, f, rt, nj, w->Kp[f]);
            }
            /* The tile's rows in strips (whole with the AVX-512 gemm and BLIS). */
            for (int64_t s0 = 0; s0 < no; s0 += sh) {
                const int64_t h = no - s0 < sh ? no - s0 : sh;
                char *os = out + s0 * ldo * es;
                if (factor_tiles(k, fk, r, w, o0 + s0, o0 + s0 + h, rt, nj))
                    return 1;
                if (fk->avar >= 0)
                    row_sums(f64, w, s0, h, nj);
                if (fk->sdp)
                    softmax_sdp(fk, w, s0, os, ldo, h, nj, cols, sc);
                else if (ssmw)
                    softmax_tile(k, fk, w, s0, os, ldo, h, nj, cols);
                /* os (h x cols, row stride ldo) += F (h x nj) Vt (nj x cols, row stride ldv). */
                if (avx) {
                    cpu_avx512_pack_a(f64, h, nj, w->F, w->Ap);
                    cpu_avx512_gemm_kn(f64, h, cols, nj, w->Ap, Vt, ldv, w->Bp, os, ldo, 1);
                } else if (!strips) {
                    cpu_blis_gemm(f64, h, pcols, nj, w->F, nj, 1, Vt, ldv, 1, 1, os, ldo);
                } else {
                    /* The weights: the tile of F, or the tile of inner products with sdp. */
                    const char *P = fk->sdp ? w->G[0] : w->F;
                    cpu_avx2_strip_av(h, nj, (const float *)P, fk->sdp ? fk->tj : nj,
                                      (const float *)Vp, cols, (float *)os, ldo);
                }
            }
        }
    if (ssmw)
        for (int64_t o = 0; o < no; o++) {
            for (int c = 0; c < cols; c++) {
                if (f64)
                    ((double *)out)[o * ldo + c] /= w->s[o];
                else
                    ((float *)out)[o * ldo + c] = (float)(((float *)out)[o * ldo + c] / w->s[o]);
            }
        }
    if (ssmw && w->lse)
        write_lse(f64, w, o0, no);
    if (fk->avar >= 0)
        add_a_term(k, fk, r, w, out, ldo, o0, no, c0, cols);
    for (int64_t o = 0; w->Cb && o < no; o++)
        memcpy(dst + o * R * es, out + o * ldo * es, (size_t)(cols * es));
    return 0;
}

/* All the columns of B, rc at a time: the tile of F is formed again for each pass, which keeps
 * the block of the output and of B that the product updates in cache. */
static int fold_rows(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                     struct fused_ws *w, int64_t o0, int64_t o1, const int64_t *iv, int64_t niv)
{
    for (int c0 = 0; c0 < fk->R; c0 += fk->rc)
        if (fold_cols(k, fk, r, w, o0, o1, c0, fk->R - c0 < fk->rc ? fk->R - c0 : fk->rc, iv, niv))
            return 1;
    return 0;
}

/* The shared packed operands of a whole run over [0, nred) (struct fused_pre): with the AVX2
 * strip products, B a variable in one pass, and the memory: within the budget beside the
 * threads' workspaces, or without a budget under FUSED_PRE_MAX_BYTES. False to pack per tile. */
static bool pre_new(const sr_kernel *k, const struct fused_kernel *fk, int64_t nred, int nt,
                    struct fused_pre *pre)
{
    memset(pre, 0, sizeof *pre);
    if (fk->kern != KERN_AVX2 || fk->bvar < 0 || fk->hoist.b || fk->rc != fk->R || nred <= fk->tj)
        return false;
    const int64_t tj = fk->tj, lim = sr__call_budget(k);
    pre->ntiles = (nred + tj - 1) / tj;
    pre->vb = al64(cpu_avx2_pack_bt_bytes(fk->R, tj));
    int64_t bytes = pre->ntiles * pre->vb + 64;
    for (int q = 0; q < fk->nfac; q++)
        if (fk->fac[q].gemm) {
            pre->kb[q] = al64(cpu_avx2_pack_bt_bytes(tj, fk->fac[q].dim));
            bytes += pre->ntiles * pre->kb[q];
        }
    if (lim > 0 ? (int64_t)nt * fk->per_thread + bytes > lim : bytes > FUSED_PRE_MAX_BYTES)
        return false;
    if (!(pre->mem = malloc((size_t)bytes)))
        return false;
    char *p = (char *)(((uintptr_t)pre->mem + 63) & ~(uintptr_t)63);
    pre->Vp = p;
    p += pre->ntiles * pre->vb;
    for (int q = 0; q < fk->nfac; q++)
        if (fk->fac[q].gemm) {
            pre->Kp[q] = p;
            p += pre->ntiles * pre->kb[q];
        }
    return true;
}

/* Tile t of the shared packed operands, as fold_cols packs it. */
static void pre_pack_tile(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                          const struct fused_pre *pre, int64_t t)
{
    const int64_t nred = k->axis == 1 ? r->ny : r->nx, rt = t * fk->tj;
    const int64_t nj = nred - rt < fk->tj ? nred - rt : fk->tj;
    cpu_avx2_pack_v(nj, fk->R, (const float *)r->args[fk->bvar] + rt * fk->R, fk->R,
                    (float *)(pre->Vp + t * pre->vb));
    for (int q = 0; q < fk->nfac; q++)
        if (fk->fac[q].gemm)
            pack_k_tile(fk, r, q, rt, nj, pre->Kp[q] + t * pre->kb[q]);
}

/* Runs plan p in chunks of at most `chunk` flat rows, over the threads: each segment of a block
 * in a chunk folds that block's intervals; a SumSoftMaxWeight writes its log-normalizer into lse
 * unless it is NULL. */
static sr_status run_chunks(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                            int64_t chunk, const struct fused_pre *pre, void *lse)
{
    const struct fused_kernel *fk = k->backend_data;
    int nt = sr__threads(k->ctx, fk->per_thread);
    int64_t nchunks = chunk ? (p->nrows + chunk - 1) / chunk : 0;
    const struct fused_mods md = mods_of(fk);
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && nchunks > 1)
#endif
    {
        struct fused_ws w;
        bool ok = ws_new(k, fk, r, &md, &w);
        w.pre = pre;
        w.lse = lse;
        if (pre) {
            /* The shared packed tiles, split over the threads; the barrier ends the packing. */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t t = 0; t < pre->ntiles; t++)
                pre_pack_tile(k, fk, r, pre, t);
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t f0 = c * chunk, f1 = f0 + chunk < p->nrows ? f0 + chunk : p->nrows;
            for (int64_t b = sr__rplan_block(p, f0); b < p->nblocks && p->rows[b] < f1; b++) {
                int64_t o0, o1;
                sr__rplan_seg(p, b, f0, f1, &o0, &o1);
                if (o0 < o1 && (!ok || fold_rows(k, fk, r, &w, o0, o1, p->iv + 2 * p->ivoff[b],
                                                 p->ivoff[b + 1] - p->ivoff[b]))) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                }
            }
        }
        ws_free(&w);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "fused two-product: out of memory for the workspace");
    return SR_OK;
}

/* ---- the symmetric driver: running ----------------------------------------------------------- */

/* The row stride of the symmetric driver's accumulators and padded B: B's columns padded to a
 * multiple of 4 (BLIS's fast shapes, fused_pad_cols). */
int64_t fused_sym_ld(const struct fused_kernel *fk) { return (fk->R + 3) / 4 * 4; }

/* The symmetric driver's memory for n rows: per thread the tile of F, the arguments and an
 * accumulator of n x fused_sym_ld values (*per_thread), and B padded once when its width is not
 * fused_sym_ld (*shared). */
static void sym_bytes(const sr_kernel *k, const struct fused_kernel *fk, int64_t n,
                      int64_t *per_thread, int64_t *shared)
{
    const int64_t es = k->dtype == SR_F64 ? 8 : 4, acc = al64(n * fused_sym_ld(fk) * es);
    *per_thread = al64((int64_t)fk->sym_t * fk->sym_t * es) +
                  al64(((int64_t)k->nargs + 2) * (int64_t)sizeof(void *)) + acc + 64;
    *shared = fused_sym_ld(fk) != fk->R ? acc + 64 : 0;
}

bool cpu_fused_symmetric(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args)
{
    const struct fused_kernel *fk = k->backend == &cpu_fused_backend ? k->backend_data : NULL;
    /* Tier 0 (the module of F still compiling, or its compile failed) runs the fused
     * two-product: the driver's tiles of F are generated code only. */
    if (!fk || !fk->sym || nx != ny || nx <= fk->sym_t || !mods_of(fk).f[0])
        return false;
    for (int p = 0; p < fk->nsym; p++)
        if (args[fk->sym_i[p]] != args[fk->sym_j[p]])
            return false;
    int64_t per, shared, lim = sr__call_budget(k);
    sym_bytes(k, fk, nx, &per, &shared);
    int64_t total = sr__threads(k->ctx, per) * per + shared;
    return total <= (lim > 0 ? lim : FUSED_SYM_MAX_BYTES);
}

/* One thread's share of the symmetric run: row blocks I of sym_t rows, in turn, each with the
 * tiles J >= I of its row; acc (row stride ld) += F_IJ B_J and, off the diagonal, F_IJ^T B_I.
 * Nonzero when the module's tile ran out of memory. */
static int sym_rows(const sr_kernel *k, const struct fused_kernel *fk, const struct jit_module *m,
                    const void **args, const char *V, char *acc, char *F, int64_t n, int64_t I)
{
    const int f64 = k->dtype == SR_F64;
    const int64_t es = f64 ? 8 : 4, T = fk->sym_t, ld = fused_sym_ld(fk);
    const int64_t i0 = I * T, ni = n - i0 < T ? n - i0 : T;
    for (int64_t j0 = i0; j0 < n; j0 += T) {
        const int64_t nj = n - j0 < T ? n - j0 : T;
        if (m->block(i0, i0 + ni, j0, j0 + nj, args, F, nj, 1))
            return 1;
        cpu_blis_gemm(f64, ni, ld, nj, F, nj, 1, V + j0 * ld * es, ld, 1, 1, acc + i0 * ld * es,
                      ld);
        if (j0 != i0)
            cpu_blis_gemm(f64, nj, ld, ni, F, 1, nj, V + i0 * ld * es, ld, 1, 1, acc + j0 * ld * es,
                          ld);
    }
    return 0;
}

/* out = acc_0 + ... + acc_{nacc-1} on rows [0, n): the accumulators' first R of ld columns. */
static void sym_merge(int f64, const char *acc, int64_t accb, int nacc, int64_t i, int R,
                      int64_t ld, char *out)
{
    for (int c = 0; c < R; c++) {
        double t = 0;
        float tf = 0;
        for (int a = 0; a < nacc; a++) {
            if (f64)
                t += ((const double *)(acc + a * accb))[i * ld + c];
            else
                tf += ((const float *)(acc + a * accb))[i * ld + c];
        }
        if (f64)
            ((double *)out)[i * R + c] = t;
        else
            ((float *)out)[i * R + c] = tf;
    }
}

/* The symmetric reduction (cpu_fused_symmetric said yes), with m the module of F: every thread
 * accumulates into its own n x ld array, both triangles' products of each tile of F it forms;
 * the arrays are added into the output at the end. B is read through a copy padded to ld
 * columns when R is not ld. */
static sr_status fused_run_sym(const sr_kernel *k, const sr_run_desc *r, const struct jit_module *m)
{
    const struct fused_kernel *fk = k->backend_data;
    const int f64 = k->dtype == SR_F64, R = fk->R;
    const int64_t es = f64 ? 8 : 4, n = r->nx, ld = fused_sym_ld(fk), T = fk->sym_t;
    int64_t per, shared;
    sym_bytes(k, fk, n, &per, &shared);
    const int nt = sr__threads(k->ctx, per);
    const int64_t accb = al64(n * ld * es), nb = (n + T - 1) / T;
    char *mem = malloc((size_t)(nt * accb + shared + 64));
    if (!mem)
        return sr__error(k->ctx, SR_ENOMEM,
                         "symmetric fused two-product: out of memory for %d "
                         "accumulators of %lld bytes",
                         nt, (long long)accb);
    char *acc = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63), *Vp = acc + nt * accb;
    const char *B = r->args[fk->bvar];
    const char *V = shared ? Vp : B;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        char *F = malloc((size_t)(T * T * es));
        const void **args = malloc(((size_t)k->nargs + 2) * sizeof *args);
        if (args) {
            for (int v = 0; v < k->nargs; v++)
                args[v] = r->args[v];
            args[k->nargs] = args[k->nargs + 1] = NULL;
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int a = 0; a < nt; a++)
            memset(acc + a * accb, 0, (size_t)accb);
        if (shared) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t i = 0; i < n; i++) {
                memcpy(Vp + i * ld * es, B + i * R * es, (size_t)(R * es));
                memset(Vp + (i * ld + R) * es, 0, (size_t)((ld - R) * es));
            }
        }
        /* Row blocks dealt in turn (block I has nb - I tiles, so each thread gets long and
         * short ones): a static deal, so that each thread's accumulator sums the same tiles in
         * every call and the result does not vary from one call to the next. */
#ifdef _OPENMP
#pragma omp for schedule(static, 1)
#endif
        for (int64_t I = 0; I < nb; I++)
            if (!F || !args || sym_rows(k, fk, m, args, V, acc + tid * accb, F, n, I)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                failed = 1;
            }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < n; i++)
            sym_merge(f64, acc, accb, nt, i, R, ld, r->out);
        free(F);
        free(args);
    }
    free(mem);
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM,
                         "symmetric fused two-product: out of memory for the workspace");
    return SR_OK;
}

/* The whole reduction without the symmetric driver: one block of all the output rows over
 * [0, nred), in chunks of at most ti rows, of one size, as many as a multiple of the threads (no
 * thread idles at the end); lse as run_chunks. */
static sr_status fused_run_dense(const sr_kernel *k, const sr_run_desc *r, void *lse)
{
    const struct fused_kernel *fk = k->backend_data;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t nred = k->axis == 1 ? r->ny : r->nx;
    int nt = sr__threads(k->ctx, fk->per_thread);
    int64_t nblocks = (nout + fk->ti - 1) / fk->ti;
    if (nblocks > nt)
        nblocks = (nblocks + nt - 1) / nt * nt;
    int64_t ti = nblocks ? (nout + nblocks - 1) / nblocks : 0;
    int64_t blk[2] = {0, nout}, rows[2] = {0, nout}, ivoff[2] = {0, 1}, iv[2] = {0, nred};
    struct sr_rplan p = {1, nout, blk, rows, ivoff, iv, NULL};
    struct fused_pre pre;
    const bool packed = pre_new(k, fk, nred, nt, &pre);
    sr_status st = run_chunks(k, r, &p, ti, packed ? &pre : NULL, lse);
    if (packed)
        free(pre.mem);
    return st;
}

sr_status fused_run(const sr_kernel *k, const sr_run_desc *r)
{
    /* The module of F, once cpu_fused_symmetric has seen it, stays for the kernel's life. */
    if (cpu_fused_symmetric(k, r->nx, r->ny, r->args))
        return fused_run_sym(k, r, mods_of(k->backend_data).f[0]);
    return fused_run_dense(k, r, NULL);
}

/* sr_kernel_run_lse (_ranges with plan p) on the kernel's own plan: the values that fused_run
 * (fused_run_ranges and the gaps of sr__run_ranges) writes, and the log-normalizer from the online
 * softmax's maximum and sum (-inf in the gaps). Empty sides, the symmetric driver and ranges
 * under a memory budget (whose block lists sr_kernel_vjp_ranges counts against it) go to
 * attn-grad.c's forward (cpu_attn_run_lse), which also declines the other kernels. */
sr_status fused_run_lse(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                        void *lse)
{
    if (r->nx == 0 || r->ny == 0 || !cpu_attn_covers(k) || (p && sr__call_budget(k) > 0) ||
        (!p && cpu_fused_symmetric(k, r->nx, r->ny, r->args)))
        return cpu_attn_run_lse(k, r, p, lse);
    if (!p)
        return fused_run_dense(k, r, lse);
    const struct fused_kernel *fk = k->backend_data;
    sr_status st = p->nblocks > 0 ? run_chunks(k, r, p, fk->ti, NULL, lse) : SR_OK;
    if (st == SR_OK)
        cpu_attn_fill_gaps(k, r, p, k->axis == 1 ? r->nx : r->ny, lse);
    return st;
}

sr_status fused_run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p)
{
    const struct fused_kernel *fk = k->backend_data;
    return run_chunks(k, r, p, fk->ti, NULL, NULL);
}
