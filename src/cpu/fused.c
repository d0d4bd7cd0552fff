/*
 * fused.c — the fused two-product strategy: wide outputs, out_o = RED_r F(o, r) B_r with F scalar
 * and B a variable of the reduced axis of width R (a kernel matrix times R right-hand sides; a
 * softmax-weighted sum of vectors, attention).
 *
 * Per thread, a block of TI output rows walks the reduced range in tiles of TJ indices:
 *   1. the TI x TJ tile of F, formed in cache by generated code (the JIT module of F alone, its
 *      sr_block entry point): per pair for a low-dimensional F, or, when F depends on the pair
 *      only through one inner product of dimension at least SR_GEMM_MIN_DIM, from a tile of
 *      inner products by symred's AVX-512 gemm plus the generated pointwise epilogue;
 *   2. SumSoftMaxWeight only: the online softmax, per row the running maximum m, the output row
 *      and the running sum rescaled by exp(m_old - m) when the maximum grows, and the tile
 *      replaced by exp(F - m) (0 where F is -inf);
 *   3. the tile (packed as the gemm's A operand) times the matching TJ x R block of B, added
 *      into the output rows by the AVX-512 micro-kernel (gemm-avx512.c, cpu_avx512_gemm_kn).
 * SumSoftMaxWeight divides each row by its sum at the end. The n x m matrix is never written:
 * a thread's workspace is the two tiles, their packed copies and TI row states, stated by
 * explain and bounded by the memory budget (tiles halve until they fit; SR_ENOTSUP when even
 * 14 x 16 does not, and the direct strategy then reports the budget).
 *
 * Sums accumulate in the output's own type, block by block (each tile's TJ products in
 * registers, then one addition per tile and output value: the "block" accumulation); the
 * float32 Kahan and float64 accumulations stay with the direct strategy.
 * NaN and infinities follow IEEE arithmetic through both products as they do in the direct
 * strategy: a NaN or an infinity times 0 in F or B makes the sums it enters NaN.
 */
#include "../formulas/formulas.h"
#include "../jit/jit.h"
#include "cpu.h"

#include <math.h>
#include <stdio.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The narrowest B for which the fused strategy beats the direct one, by reduction; below it
 * the direct strategy runs while it can take the formula. Measured in one process on the 2-core
 * VM (BLIS, N = M = 10 000, D = 3, float32, fused / direct time): Sum 1.18 at R = 2, 0.93 at 4,
 * 0.60 at 8, 0.49 at 16; SumSoftMaxWeight 0.43 at R = 1 and 0.09 at 16 (the direct strategy
 * buffers F and the weight and exponentiates in a second pass). */
#define FUSED_MIN_WIDTH_SUM  4
#define FUSED_MIN_WIDTH_SSMW 1

/* Columns of B per pass: a wider B is done in passes of this many columns, each forming the
 * tiles of F again, so that the block of the output (448 rows x 256 float32, 448 KiB) stays in
 * L2 and B's tile (256 x 256) beside it. In one pass, R = 1024 (a 1.8 MiB block) ran at 2.5x
 * the dense K @ B, against 1.1x for R = 256. */
#define FUSED_COLS 256

enum { KERN_AVX512, KERN_BLIS };

struct fused_kernel {
    int kern;           /* the products' gemm */
    int bvar;           /* the argument index of B */
    int R;              /* its width */
    int rc;             /* columns of B per pass over the reduced range */
    const sr_expr *f;   /* the scalar F */
    int gemm;           /* F's tile from a tile of inner products */
    int va, vb, dim;    /* the inner product's operands (gemm) */
    int ti, tj;         /* output rows per block, reduced indices per tile */
    int64_t per_thread; /* workspace bytes per thread */
    const char *why;    /* why this strategy was chosen */
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
};

/* The reduced-axis variable argument that e is, or -1. */
static int reduced_var_arg(const sr_kernel *k, const sr_expr *e)
{
    unsigned cat = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    if (e->op != OP_VAR || e->iattr[1] != (int64_t)cat)
        return -1;
    return (int)e->iattr[0];
}

/* Whether k is a fused two-product: Sum of F * B or F * B (B first or second), or
 * SumSoftMaxWeight of F with weight B; F scalar, B a reduced-axis variable. Sets *f and *bvar. */
static bool fused_match(const sr_kernel *k, const sr_expr **f, int *bvar)
{
    if (k->red == SR_SUM && !k->weight && k->f->op == OP_MUL) {
        for (int c = 0; c < 2; c++) {
            const sr_expr *b = k->f->child[c], *s = k->f->child[1 - c];
            int v = reduced_var_arg(k, b);
            if (v >= 0 && s->dim == 1 && b->dim == k->fdim) {
                *f = s;
                *bvar = v;
                return true;
            }
        }
        return false;
    }
    if (k->red == SR_SUMSOFTMAXWEIGHT && k->weight && k->fdim == 1) {
        int v = reduced_var_arg(k, k->weight);
        if (v < 0)
            return false;
        *f = k->f;
        *bvar = v;
        return true;
    }
    return false;
}

/* The choice between the direct and the fused strategies, in one place: the fused one when B
 * is at least the measured crossover width, or when the direct strategy cannot take the formula
 * (more than 64 values of F and weight per pair). Returns why, or NULL for the direct one. */
static const char *fused_choose(const sr_kernel *k, int R)
{
    int DG = k->weight ? k->weight->dim : 0;
    if (k->fdim + DG > 64)
        return "output or weight wider than the direct strategy's 64 values per pair";
    int min = k->red == SR_SUM ? FUSED_MIN_WIDTH_SUM : FUSED_MIN_WIDTH_SSMW;
    if (R >= min)
        return k->red == SR_SUM ? "B at least 4 wide: the product beats the direct strategy"
                                : "softmax weight: the product beats the direct strategy";
    return NULL;
}

static int64_t al64(int64_t v) { return (v + 63) / 64 * 64; }

/* The row stride of a pass's output block and tile of B when B takes several passes: the pass's
 * columns and 16 more. Rows of a power-of-two stride (R = 1024: 4 KiB) all fall into the same
 * cache sets; R = 1024 ran at 2.9x K @ B in place, where R = 256 ran at 1.1x. */
static int64_t ld_pass(const struct fused_kernel *fk) { return fk->rc + 16; }

/* One thread's workspace for tiles ti x tj: the tile of F and its packed copy, the packed block
 * of B, the row states (maximum and sum), the module's own tile; gemm: the tile of inner
 * products and both packed operands. */
static int64_t thread_bytes(const sr_kernel *k, const struct fused_kernel *fk, int ti, int tj)
{
    int f64 = k->dtype == SR_F64;
    int64_t es = f64 ? 8 : 4, D = fk->gemm ? fk->dim : 0;
    int64_t b = al64((int64_t)ti * tj * es) + al64((int64_t)ti * 16) +
                al64(((int64_t)k->nargs + 2) * (int64_t)sizeof(void *)) + fk->plan.workspace_bytes +
                64;
    if (fk->gemm)
        b += al64((int64_t)ti * tj * es);
    if (fk->rc < fk->R)
        b += al64((int64_t)ti * ld_pass(fk) * es) + al64((int64_t)tj * ld_pass(fk) * es);
    if (fk->kern == KERN_AVX512) {
        b += al64(cpu_avx512_pack_a_bytes(ti, tj, f64)) +
             al64(cpu_avx512_pack_b_bytes(fk->rc, tj, f64));
        if (fk->gemm)
            b += al64(cpu_avx512_pack_a_bytes(ti, D, f64)) +
                 al64(cpu_avx512_pack_b_bytes(tj, D, f64));
    } else {
        /* BLIS packs into its own buffers: both operands of the larger product, an estimate. */
        int64_t kk = tj > D ? tj : D, nn = fk->rc > tj ? fk->rc : tj;
        b += ((int64_t)ti + nn + 32) * (kk < 512 ? kk : 512) * es + (64 << 10);
    }
    return b;
}

static void fused_free(sr_ctx *ctx, struct fused_kernel *fk)
{
    if (fk->m)
        jit_module_release(ctx, fk->m);
    free(fk);
}

sr_status cpu_fused_prepare(sr_kernel *k, int acc)
{
    sr_ctx *ctx = k->ctx;
    const sr_expr *f;
    int bvar;
    if (!fused_match(k, &f, &bvar))
        return SR_ENOTSUP;
    /* The products: symred's AVX-512 gemm where the CPU has it, else BLIS (SYMRED_GEMM_KERNEL). */
    int kern;
    sr_status st = cpu_gemm_kernel(ctx, &kern);
    if (st != SR_OK)
        return st;
    if (kern < 0)
        return SR_ENOTSUP;
    if (k->dtype == SR_F32 && acc != JIT_ACC_BLOCK)
        return SR_ENOTSUP; /* Kahan and float64 accumulation: the direct strategy */
    int R = k->vars[bvar].dim;
    const char *why = fused_choose(k, R);
    if (!why)
        return SR_ENOTSUP;
    struct fused_kernel *fk = calloc(1, sizeof *fk);
    if (!fk)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    fk->kern = kern;
    fk->bvar = bvar;
    fk->R = R;
    fk->rc = R < FUSED_COLS ? R : FUSED_COLS;
    fk->f = f;
    fk->why = why;
    /* The module of F alone: a scalar Sum, used through its sr_block. */
    sr_kernel kf = *k;
    kf.f = f;
    kf.fdim = 1;
    kf.out_dim = 1;
    kf.weight = NULL;
    kf.red = SR_SUM;
    kf.k = 0;
    double epi = 0;
    const sr_expr *S = cpu_gemm_find_node(&kf, &fk->va, &fk->vb, &epi);
    if (S && S->child[0]->dim >= SR_GEMM_MIN_DIM && epi <= S->child[0]->dim) {
        fk->gemm = 1;
        fk->dim = S->child[0]->dim;
    }
    /* Tiles: a multiple of the AVX-512 micro-kernel's 14 rows, and 256 reduced indices (one K
     * block of BLIS's zen3 sgemm, one of ours). Measured under load on this 2-core AVX2 VM with
     * BLIS (docs/wide.md): the Gaussian with R = 256 ran at 1.3-1.6x K @ B with tj = 512 and
     * 1.0-1.1x with 448 x 256; BLIS's small shapes (112 rows, K = 64) ran at 16 GFLOP/s where
     * 448 rows reached 21-26. */
    int64_t lim = ctx->mem_limit;
    fk->ti = 448;
    fk->tj = 256;
    if (kern == KERN_AVX512 && fk->tj > cpu_avx512_kc_max(k->dtype == SR_F64))
        fk->tj = (int)cpu_avx512_kc_max(k->dtype == SR_F64); /* one K block per tile */
    for (;;) {
        struct expr_buf src = {0};
        memset(&fk->plan, 0, sizeof fk->plan);
        fk->plan.ws_limit = lim > 0 ? lim / 4 : 0;
        if (fk->gemm) {
            fk->plan.gemm = S;
            fk->plan.gemm_arg = k->nargs;
            fk->plan.gemm_ld = fk->tj;
            fk->plan.gemm_rows = fk->ti;
        }
        st = jit_emit_c(&kf, JIT_ACC_BLOCK, &src, &fk->plan);
        if (st == SR_OK && src.oom)
            st = SR_ENOMEM;
        if (st != SR_OK) {
            free(src.data);
            fused_free(ctx, fk);
            return st == SR_ENOTSUP ? SR_ENOTSUP
                                    : sr__error(ctx, st, "fused two-product: cannot emit F's tile");
        }
        int ti = fk->ti, tj = fk->tj;
        while (lim > 0 && thread_bytes(k, fk, ti, tj) > lim && (ti > 14 || tj > 16)) {
            if (ti > 14)
                ti = ti / 28 * 14 > 14 ? ti / 28 * 14 : 14;
            else
                tj /= 2;
        }
        if (fk->gemm && (ti != fk->ti || tj != fk->tj)) {
            fk->ti = ti; /* the tile's leading dimension is compiled in: emit again */
            fk->tj = tj;
            free(src.data);
            continue;
        }
        fk->ti = ti;
        fk->tj = tj;
        fk->per_thread = thread_bytes(k, fk, ti, tj);
        if (lim > 0 && fk->per_thread > lim) {
            free(src.data);
            fused_free(ctx, fk);
            return SR_ENOTSUP; /* the direct strategy reports the budget */
        }
        st = jit_module_get(ctx, src.data, src.len, &fk->m, &fk->info);
        free(src.data);
        break;
    }
    if (st == SR_OK && !fk->m->block)
        st = SR_ENOTSUP;
    if (st != SR_OK) {
        fused_free(ctx, fk);
        return st == SR_ENODEV ? SR_ENOTSUP : st;
    }
    k->backend = &cpu_fused_backend;
    k->backend_data = fk;
    return SR_OK;
}

/* ---- run ----------------------------------------------------------------------------------- */

struct fused_ws {
    char *F, *Ap, *Bp, *G, *Qp, *Kp;
    char *Cb, *Vb; /* passes over B's columns: the pass's output block and tile of B */
    double *m, *s; /* SumSoftMaxWeight: running maximum and sum per row */
    const void **args;
    char *mem;
};

static bool ws_new(const sr_kernel *k, const struct fused_kernel *fk, const sr_run_desc *r,
                   struct fused_ws *w)
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
    TAKE(w->F, ti * tj * es);
    TAKE(w->m, ti * 8);
    TAKE(w->s, ti * 8);
    TAKE(w->args, ((int64_t)k->nargs + 2) * (int64_t)sizeof(void *));
    if (fk->rc < fk->R) {
        TAKE(w->Cb, ti * ld_pass(fk) * es);
        TAKE(w->Vb, tj * ld_pass(fk) * es);
    }
    if (fk->gemm)
        TAKE(w->G, ti * tj * es);
    if (fk->kern == KERN_AVX512) {
        TAKE(w->Ap, cpu_avx512_pack_a_bytes(ti, tj, f64));
        TAKE(w->Bp, cpu_avx512_pack_b_bytes(fk->rc, tj, f64));
        if (fk->gemm) {
            TAKE(w->Qp, cpu_avx512_pack_a_bytes(ti, fk->dim, f64));
            TAKE(w->Kp, cpu_avx512_pack_b_bytes(tj, fk->dim, f64));
        }
    }
#undef TAKE
    for (int v = 0; v < k->nargs; v++)
        w->args[v] = r->args[v];
    w->args[k->nargs] = w->G;
    w->args[k->nargs + 1] = NULL;
    return true;
}

/* F[c] = exp(F[c] - m) (0 where F[c] is -inf), c < n; returns their sum. The algorithm of
 * cpu_avx512_expsum_f32 (gemm-avx512.c) in portable C, vectorised by the compiler: 2^n as two
 * factors built from their exponent bits, so that subnormal results come out right. */
static inline __attribute__((always_inline)) double expsum_body(float *F, int64_t n, float m)
{
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; c++) {
        const float f = F[c];
        float x = f - m;
        x = x < -104.0f ? -104.0f : x; /* NaN fails both tests and stays NaN */
        x = x > 89.0f ? 89.0f : x;
        float nn = __builtin_rintf(x * 1.44269504088896341f);
        nn = nn == nn ? nn : 0;
        const float r = (x - nn * 0.693359375f) - nn * -2.12194440e-4f;
        float p = 1.0f / 5040;
        p = p * r + 1.0f / 720;
        p = p * r + 1.0f / 120;
        p = p * r + 1.0f / 24;
        p = p * r + 1.0f / 6;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        const int32_t ni = (int32_t)nn, a = ni / 2, b = ni - a;
        union {
            int32_t i;
            float f;
        } sa = {.i = (a + 127) << 23}, sb = {.i = (b + 127) << 23};
        const float e = f == -__builtin_inff() ? 0.0f : p * sa.f * sb.f;
        F[c] = e;
        sum += e;
    }
    return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* expsum_body with AVX2 and FMA, eight values at a time; the tail by expsum_body. */
__attribute__((target("avx2,fma"))) static double expsum_avx2(float *F, int64_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m), lo = _mm256_set1_ps(-104.0f), hi = _mm256_set1_ps(89.0f);
    const __m256 l2e = _mm256_set1_ps(1.44269504088896341f), c1 = _mm256_set1_ps(0.693359375f),
                 c2 = _mm256_set1_ps(-2.12194440e-4f), ninf = _mm256_set1_ps(-__builtin_inff());
    static const float tc[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                1.0f / 6,    0.5f,       1.0f,       1.0f};
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 sum = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 f = _mm256_loadu_ps(F + c);
        __m256 x = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_sub_ps(f, vm)));
        const __m256 nn =
            _mm256_round_ps(_mm256_mul_ps(x, l2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fnmadd_ps(nn, c1, x);
        r = _mm256_fnmadd_ps(nn, c2, r);
        __m256 p = _mm256_set1_ps(tc[0]);
        for (int t = 1; t < 8; t++)
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(tc[t]));
        const __m256i ni = _mm256_cvtps_epi32(nn), a = _mm256_srai_epi32(ni, 1);
        const __m256i b = _mm256_sub_epi32(ni, a);
        const __m256 sa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
        const __m256 sb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
        p = _mm256_mul_ps(_mm256_mul_ps(p, sa), sb);
        p = _mm256_andnot_ps(_mm256_cmp_ps(f, ninf, _CMP_EQ_OQ), p);
        _mm256_storeu_ps(F + c, p);
        sum = _mm256_add_ps(sum, p);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    double t = expsum_body(F + c, n - c, m);
    for (int l = 0; l < 8; l++)
        t += lanes[l];
    return t;
}
#endif

static double expsum_f32(float *F, int64_t n, float m)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return expsum_avx2(F, n, m);
#endif
    return expsum_body(F, n, m);
}

/* The row maximum as an OpenMP simd max-reduction. gcc vectorises it; clang cannot (the
 * comparison's NaN order forbids its reordering) and, asked to, fails the build under -Werror
 * (-Wpass-failed), so clang gets the plain loop. */
#define SIMD_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define SIMD_MAX(v)
#else
#define SIMD_MAX(v) SIMD_PRAGMA(omp simd reduction(max : v))
#endif

/* The online softmax of rows [0, no) of the tile (row stride nj): the running maximum, the
 * rescaling of the row's output (cols values, row stride ldo) and sum, and the tile replaced by
 * exp(F - m). */
static void softmax_tile(const sr_kernel *k, const struct fused_kernel *fk, struct fused_ws *w,
                         char *out, int64_t ldo, int64_t no, int64_t nj, int cols)
{
    for (int64_t o = 0; o < no; o++) {
        if (k->dtype == SR_F64) {
            double *F = (double *)w->F + o * nj, tm = -INFINITY;
            SIMD_MAX(tm)
            for (int64_t c = 0; c < nj; c++)
                tm = F[c] > tm ? F[c] : tm; /* NaN passes: it reaches the sums through exp */
            double mn = tm > w->m[o] ? tm : w->m[o];
            if (mn > w->m[o] && w->m[o] > -INFINITY) {
                double sa = exp(w->m[o] - mn);
                double *orow = (double *)out + o * ldo;
                for (int c = 0; c < cols; c++)
                    orow[c] *= sa;
                w->s[o] *= sa;
            }
            w->m[o] = mn;
            double ts = 0;
            for (int64_t c = 0; c < nj; c++) {
                F[c] = F[c] == -INFINITY ? 0 : exp(F[c] - mn);
                ts += F[c];
            }
            w->s[o] += ts;
        } else {
            float *F = (float *)w->F + o * nj, tm = -INFINITY;
            SIMD_MAX(tm) /* a NaN never wins, as in the loop above */
            for (int64_t c = 0; c < nj; c++)
                tm = F[c] > tm ? F[c] : tm;
            float mo = (float)w->m[o], mn = tm > mo ? tm : mo;
            if (mn > mo && mo > -INFINITY) {
                float sa = expf(mo - mn);
                float *orow = (float *)out + o * ldo;
                for (int c = 0; c < cols; c++)
                    orow[c] *= sa;
                w->s[o] *= sa;
            }
            w->m[o] = mn;
            w->s[o] += fk->kern == KERN_AVX512 ? cpu_avx512_expsum_f32(F, F, nj, mn)
                                               : expsum_f32(F, nj, mn);
        }
    }
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
    char *dst = (char *)r->out + (o0 * R + c0) * es;
    /* The pass's block of the output: in place, or in Cb with a stride of no power of two. */
    char *out = w->Cb ? w->Cb : dst;
    const int64_t ldo = w->Cb ? ld_pass(fk) : R;
    for (int64_t o = 0; o < no; o++) {
        memset(out + o * ldo * es, 0, (size_t)(cols * es));
        w->m[o] = -INFINITY;
        w->s[o] = 0;
    }
    const char *V = (const char *)r->args[fk->bvar] + c0 * es;
    const bool avx = fk->kern == KERN_AVX512;
    const int64_t D = fk->dim;
    const char *Q = fk->gemm ? (const char *)r->args[fk->va] + o0 * D * es : NULL;
    if (fk->gemm && avx)
        cpu_avx512_pack_a(f64, no, D, Q, w->Qp);
    for (int64_t q = 0; q < niv; q++)
        for (int64_t rt = iv[2 * q], r1 = iv[2 * q + 1]; rt < r1; rt += fk->tj) {
            const int64_t nj = r1 - rt < fk->tj ? r1 - rt : fk->tj;
            const char *Kt = fk->gemm ? (const char *)r->args[fk->vb] + rt * D * es : NULL;
            const char *Vt = V + rt * R * es;
            int64_t ldv = R;
            if (w->Vb) { /* the tile of B's pass columns, at stride ld_pass */
                for (int64_t j = 0; j < nj; j++)
                    memcpy(w->Vb + j * ld_pass(fk) * es, Vt + j * R * es, (size_t)(cols * es));
                Vt = w->Vb;
                ldv = ld_pass(fk);
            }
            /* G (no x nj, row stride tj) = Q Kt^T, Kt stored nj x D row-major. */
            if (fk->gemm && avx)
                cpu_avx512_gemm(f64, no, nj, D, w->Qp, Kt, w->Kp, w->G, fk->tj);
            else if (fk->gemm)
                cpu_blis_gemm(f64, no, nj, D, Q, D, 1, Kt, 1, D, 0, w->G, fk->tj);
            /* The tile of F, row stride nj. */
            if (fk->m->block(o0, o1, rt, rt + nj, w->args, w->F, nj, 1))
                return 1;
            if (ssmw)
                softmax_tile(k, fk, w, out, ldo, no, nj, cols);
            /* out (no x cols, row stride ldo) += F (no x nj) Vt (nj x cols, row stride ldv). */
            if (avx) {
                cpu_avx512_pack_a(f64, no, nj, w->F, w->Ap);
                cpu_avx512_gemm_kn(f64, no, cols, nj, w->Ap, Vt, ldv, w->Bp, out, ldo, 1);
            } else {
                cpu_blis_gemm(f64, no, cols, nj, w->F, nj, 1, Vt, ldv, 1, 1, out, ldo);
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

/* Runs plan p in chunks of at most `chunk` flat rows, over the threads: each segment of a block
 * in a chunk folds that block's intervals. */
static sr_status run_chunks(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                            int64_t chunk)
{
    const struct fused_kernel *fk = k->backend_data;
    int nt = sr__threads(k->ctx, fk->per_thread);
    int64_t nchunks = chunk ? (p->nrows + chunk - 1) / chunk : 0;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && nchunks > 1)
#endif
    {
        struct fused_ws w;
        bool ok = ws_new(k, fk, r, &w);
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
        free(w.mem);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "fused two-product: out of memory for the workspace");
    return SR_OK;
}

/* The whole reduction: one block of all the output rows over [0, nred), in chunks of at most
 * ti rows, of one size, as many as a multiple of the threads (no thread idles at the end). */
static sr_status fused_run(const sr_kernel *k, const sr_run_desc *r)
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
    return run_chunks(k, r, &p, ti);
}

static sr_status fused_run_ranges(const sr_kernel *k, const sr_run_desc *r,
                                  const struct sr_rplan *p)
{
    const struct fused_kernel *fk = k->backend_data;
    return run_chunks(k, r, p, fk->ti);
}

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
    } else {
        snprintf(desc, sizeof desc, "BLIS, sub-configuration %s, one thread per call",
                 cpu_blis_arch()[0] ? cpu_blis_arch() : "?");
    }
    expr_buf_printf(b, "strategy: fused two-product (%s)\n", fk->why);
    expr_buf_printf(b, "  F: ");
    expr_print_to(b, fk->f);
    expr_buf_printf(b, ", scalar, its tile %s\n",
                    fk->gemm ? "from a tile of inner products and the generated epilogue"
                             : "by generated code per pair (sr_block)");
    if (fk->gemm && fk->kern == KERN_AVX512) {
        char d[160];
        cpu_avx512_describe(k->dtype == SR_F64, fk->dim, d, sizeof d);
        expr_buf_printf(b, "  inner products: arguments [%d] and [%d], symred's AVX-512 gemm, %s\n",
                        fk->va, fk->vb, d);
    } else if (fk->gemm) {
        expr_buf_printf(b, "  inner products: arguments [%d] and [%d], BLIS\n", fk->va, fk->vb);
    }
    expr_buf_printf(b, "  B: argument [%d], %d wide; tile of F times tile of B by the gemm (%s)\n",
                    fk->bvar, fk->R, desc);
    if (k->red == SR_SUMSOFTMAXWEIGHT)
        expr_buf_printf(b, "  online softmax: running row maximum, rescaled output rows, "
                           "divided by the row sums at the end\n");
    expr_buf_printf(b,
                    "tiles: %d output rows x %d reduced indices, %d columns of B per pass\n"
                    "workspace %lld bytes per thread (tile of F and its packed copy, packed B, "
                    "row states%s)\n"
                    "threads: %d (OpenMP over blocks of output rows)\n"
                    "accumulation: %s\n"
                    "module of F: %s, cache %s, %.1f ms\n",
                    fk->ti, fk->tj, fk->rc, (long long)fk->per_thread,
                    fk->gemm ? ", tile of inner products and the packed operands" : "",
                    sr__threads(k->ctx, fk->per_thread),
                    k->dtype == SR_F64 ? "float64" : "block (float32, one addition per tile)",
                    fk->info.origin, fk->info.cache, fk->info.compile_ms);
    if (fk->info.path[0])
        expr_buf_printf(b, "path: %s\n", fk->info.path);
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
};
