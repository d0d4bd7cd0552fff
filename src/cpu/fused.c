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

/* Columns of B per pass: a wider B is done in passes of this many columns, each forming the
 * tiles of F again, so that the block of the output (448 rows x 256 float32, 448 KiB) stays in
 * L2 and B's tile (256 x 256) beside it. In one pass, R = 1024 (a 1.8 MiB block) ran at 2.5x
 * the dense K @ B, against 1.1x for R = 256. */
#define FUSED_COLS 256

/* The products' gemm: symred's AVX-512 one on whole tiles, BLIS on whole tiles, or symred's AVX2
 * strip products (gemm-avx2.c) on strips of FUSED_STRIP rows of the tile. */
enum { KERN_AVX512, KERN_BLIS, KERN_AVX2 };

/* Output rows per strip with the AVX2 products: two micro-kernel strips, so that each panel of the
 * tile of K or B is read from L2 once per two micro-kernel strips, and a strip's inner products
 * and F (2 x 12 x 512 float32, 48 KiB) stay close, in L1 and L2. Strips of 6, 18 and 24 rows ran
 * within the noise of 12 (attention, N = M = 4096, alternating in one process, load 9-10). */
#define FUSED_STRIP (2 * CPU_AVX2_MR)

/* F as a product of at most this many factors, each of which depends on the pair through at
 * most one inner product of two variables that a gemm computes (attention's gradient:
 * exp((q|k) s - L) times (G|v) - (G|o)). */
#define FUSED_MAX_FACTORS 2

/* Pairs of variables exchanged by the symmetry of F that the symmetric driver looks for, and the
 * side of its square tiles of F: one K block of BLIS's sgemm, as the fused tiles' tj. Measured
 * for K(x, x) @ V (n = 20 000, d = 3, 11 columns, float32, BLIS, 2-vCPU AMD EPYC, alternating
 * in separate processes, load 7): tiles of 128 took 1.09-1.23x the CPU time of 256. */
#define FUSED_SYM_MAX 4
#define FUSED_SYM_T   256

/* Without a memory budget, the symmetric driver's accumulators (one output-sized array per
 * thread) stay under this many bytes; larger runs take the fused two-product. */
#define FUSED_SYM_MAX_BYTES ((int64_t)1 << 30)

/* Without a memory budget, the operands packed once per run (struct fused_pre) stay under this
 * many bytes; larger runs pack each tile for each row block. */
#define FUSED_PRE_MAX_BYTES ((int64_t)1 << 30)

/* One factor of F: the JIT module that forms its tile. */
struct fused_factor {
    const sr_expr *f;
    int gemm;        /* its tile from a tile of inner products */
    int va, vb, dim; /* the inner product's operands (gemm) */
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
    /* Tier 0: the tile interpreter's program of the factor (kernel kt), instead of m. */
    sr_kernel kt;
    struct tile_prog *t;
};

/* A B that is a formula of the reduced side only (no variable of the output axis: k(x_j, U)
 * for all inducing points U, a parameter): its tile, TJ x R, is evaluated into the workspace
 * by generated code (the module of B alone, its sr_block on one output row) once per tile of
 * reduced indices, before the products read it as they read a variable's. */
struct fused_hoist {
    const sr_expr *b; /* the formula, or NULL when B is a variable */
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
    sr_kernel kt; /* tier 0: the tile interpreter's program of B, instead of m */
    struct tile_prog *t;
};

struct fused_kernel {
    int kern; /* the products' gemm */
    int bvar; /* the argument index of B; -1 when B is a formula (hoist) */
    struct fused_hoist hoist;
    int avar;         /* A (struct fused_form), or -1 */
    int bsign, asign; /* the signs of B's and A's terms */
    int R;            /* its width */
    int rc;           /* columns of B per pass over the reduced range */
    const sr_expr *f; /* the scalar F */
    int nfac;         /* factors of F, each with its module */
    struct fused_factor fac[FUSED_MAX_FACTORS];
    int ti, tj; /* output rows per block, reduced indices per tile */
    /* A SumSoftMaxWeight of F = c (x|y) on the AVX2 strip products (attention): the exponentials
     * read the tile of inner products, exp(c G - m) with c the parameter sdp_var (of dimension 1)
     * or, when sdp_var < 0, the constant sdp_c, and F's module is not called (sdp). */
    bool sdp;
    int sdp_var;
    float sdp_c;
    int64_t per_thread; /* workspace bytes per thread */
    const char *why;    /* why this strategy was chosen */
    /* The tiles of F and B formed by the tile interpreter (programs fac[q].t, hoist.t): for good
     * (tier0, no modules), or until bg, the background compile of the factors' modules and
     * then B's, has them ready. */
    bool tier0;
    struct cpu_bg *bg;
    /* The symmetric driver (fused_run_sym): F(o, r) = F(r, o) with argument sym_i[p] paired with
     * sym_j[p], p < nsym; it runs when each pair is the same array and tiles of sym_t rows. */
    bool sym;
    int nsym, sym_t;
    int sym_i[FUSED_SYM_MAX], sym_j[FUSED_SYM_MAX];
};

#define FUSED_MAX_TERMS 16

/* What fused_match found: out_o = bsign sum_r F(o, r) B_r + asign A_o sum_r F(o, r), with A an
 * output-index variable of B's width or none (avar < 0). */
struct fused_form {
    const sr_expr *f; /* the scalar F */
    int bvar, avar;   /* argument indices of B and A; bvar -1 when B is the formula bf */
    int bsign, asign;
    const sr_expr *bf;
};

/* Whether e is a formula of the reduced axis's variables (and parameters) only, not a variable
 * itself: a B whose tile is evaluated once per tile of reduced indices (struct fused_hoist). */
static bool reduced_formula(const sr_kernel *k, const sr_expr *e)
{
    unsigned out = k->axis == 1 ? DEP_I : DEP_J, red = k->axis == 1 ? DEP_J : DEP_I;
    return e->op != OP_VAR && (e->deps & out) == 0 && (e->deps & red) != 0;
}

/* Whether e depends on the reduced axis and not on the output axis (a variable or a formula). */
static bool reduced_side(const sr_kernel *k, const sr_expr *e)
{
    return sr__reduced_var(k, e) >= 0 || reduced_formula(k, e);
}

/* The width of B in m. */
static int form_width(const sr_kernel *k, const struct fused_form *m)
{
    return m->bf ? m->bf->dim : k->vars[m->bvar].dim;
}

/* Whether the vector factor e is B, or A - B, B - A, A + B (the gradient of a radial kernel:
 * x_i - y_j); sets m's variables and signs. */
static bool vector_factor(const sr_kernel *k, const sr_expr *e, struct fused_form *m)
{
    m->bsign = 1;
    m->avar = -1;
    m->asign = 0;
    m->bf = NULL;
    if ((m->bvar = sr__reduced_var(k, e)) >= 0)
        return true;
    if (reduced_formula(k, e)) {
        m->bf = e;
        return true;
    }
    return sr__a_and_b(k, e, &m->avar, &m->asign, &m->bvar, &m->bsign);
}

/* Whether k is a fused two-product: Sum of a product of scalars and one vector factor (B, or
 * A - B, ... as vector_factor) in any order and nesting, with negations (F * B, s k_j Exp(..)
 * (G|v), 2 g (b|G) (x - y) Exp(..)), or of several vector factors that all depend on the
 * reduced side only (B is then their product, a formula), or SumSoftMaxWeight of a scalar F
 * with weight B. Sets m; F is built as the product of the scalar factors. */
static bool fused_match(const sr_kernel *k, struct fused_form *m)
{
    if (k->red == SR_SUM && !k->weight) {
        const sr_expr *fac[FUSED_MAX_TERMS];
        int neg = 0, n = simp_mul_factors(k->f, fac, 0, FUSED_MAX_TERMS, &neg), b = -1;
        unsigned inb = 0; /* bit t: fac[t] is a factor of B */
        for (int t = 0; t < n; t++) {
            /* Scalar F (the formula of one value): B is its first reduced-axis variable. */
            if (fac[t]->dim == 1 && (b >= 0 || k->fdim > 1 || sr__reduced_var(k, fac[t]) < 0))
                continue;
            if (fac[t]->dim != k->fdim)
                return false; /* a vector that is not B */
            if (b < 0) {
                if (!vector_factor(k, fac[t], m))
                    return false;
                b = t;
            } else if (m->avar >= 0 || !reduced_side(k, fac[b]) || !reduced_side(k, fac[t])) {
                return false; /* two vectors, not both of the reduced side */
            }
            inb |= 1u << t;
        }
        if (n < 2 || b < 0)
            return false;
        sr_ctx *ctx = k->ctx;
        sr_expr *F = NULL, *B = NULL;
        for (int t = 0; t < n; t++) {
            sr_expr **p = inb >> t & 1 ? &B : &F;
            if (!(*p = *p ? sr_mul(ctx, *p, (sr_expr *)fac[t]) : (sr_expr *)fac[t]))
                return false; /* out of memory: not fused */
        }
        if (B != fac[b]) { /* several vectors of the reduced side: B is their product */
            m->bf = B;
            m->bvar = -1;
        }
        m->f = F && neg % 2 ? sr_neg(ctx, F) : F;
        return m->f != NULL;
    }
    if (k->red == SR_SUMSOFTMAXWEIGHT && k->weight && k->fdim == 1) {
        m->f = k->f;
        m->avar = -1;
        m->bsign = 1;
        m->asign = 0;
        m->bf = reduced_formula(k, k->weight) ? k->weight : NULL;
        return (m->bvar = sr__reduced_var(k, k->weight)) >= 0 || m->bf != NULL;
    }
    return false;
}

/* The inner product of two variables, one per side, of dimension at least SR_GEMM_MIN_DIM,
 * that e depends on; NULL if none; *several when there is more than one. */
static const sr_expr *wide_scalprod(const sr_kernel *k, const sr_expr *e, bool *several)
{
    sr_kernel ke = *k;
    ke.f = e;
    ke.weight = NULL;
    int va, vb;
    double epi;
    const sr_expr *S = cpu_gemm_find_node(&ke, &va, &vb, &epi);
    *several = false;
    if (S)
        return S->child[0]->dim >= SR_GEMM_MIN_DIM ? S : NULL;
    /* NULL: none, or more than one; tell them apart by the pair-dependent products. */
    size_t n = expr_toposort(e, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return NULL;
    expr_toposort(e, order, n);
    int found = 0;
    for (size_t t = 0; t < n; t++)
        found += order[t]->op == OP_SCALPROD && order[t]->child[0]->op == OP_VAR &&
                 order[t]->child[1]->op == OP_VAR &&
                 (order[t]->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J);
    free(order);
    *several = found > 1;
    return NULL;
}

/* Splits the scalar F into at most FUSED_MAX_FACTORS factors, each depending on the pair
 * through at most one wide inner product (so that each factor's tile can come from one gemm):
 * the first takes the factors with no wide inner product, or with several. Sets fk->nfac and
 * each factor's formula. */
static void split_factors(const sr_kernel *k, struct fused_kernel *fk)
{
    const sr_expr *fac[FUSED_MAX_TERMS], *S[FUSED_MAX_FACTORS] = {0};
    sr_expr *g[FUSED_MAX_FACTORS] = {0};
    int neg = 0, n = simp_mul_factors(fk->f, fac, 0, FUSED_MAX_TERMS, &neg);
    fk->nfac = 1;
    fk->fac[0].f = fk->f;
    if (n < 2)
        return;
    for (int t = 0; t < n; t++) {
        bool several;
        const sr_expr *s = wide_scalprod(k, fac[t], &several);
        int q = 0;
        if (s && !several) {
            for (q = 0; q < FUSED_MAX_FACTORS && S[q] && S[q] != s; q++)
                ;
            if (q == FUSED_MAX_FACTORS)
                q = 0;
            else if (!S[q])
                S[q] = s;
        }
        g[q] = g[q] ? sr_mul(k->ctx, g[q], (sr_expr *)fac[t]) : (sr_expr *)fac[t];
        if (!g[q])
            return; /* out of memory: F as one factor */
    }
    if (!g[0] || !g[1] || !S[1])
        return; /* one factor is enough */
    if (neg % 2 && !(g[0] = sr_neg(k->ctx, g[0])))
        return;
    for (int q = 0; q < FUSED_MAX_FACTORS; q++)
        fk->fac[q].f = g[q];
    fk->nfac = FUSED_MAX_FACTORS;
}

/* Why the fused strategy runs k (the planner chose it by its estimated time): the width of B,
 * or, for A - B, F's inner products by the gemm. */
static const char *fused_why(const sr_kernel *k, const struct fused_kernel *fk)
{
    int DG = k->weight ? k->weight->dim : 0;
    if (k->fdim + DG > 64)
        return "output or weight wider than the direct strategy's 64 values per pair";
    for (int q = 0; q < fk->nfac && fk->avar >= 0; q++)
        if (fk->fac[q].gemm)
            return "F's inner products by the gemm";
    return k->red == SR_SUM ? "B wide enough that the product beats the direct strategy"
                            : "softmax weight: the product beats the direct strategy";
}

static int64_t al64(int64_t v) { return (v + 63) / 64 * 64; }

/* The reduced indices per tile of the AVX2 strip products: 512, fewer when a panelled tile of K
 * (tj x D) or of B (tj x rc) would pass 128 KiB (float32), so that both stay in L2 while every
 * strip reads them; a multiple of 16, at least 16. Attention with its scale inside the
 * exponentials (fk->sdp), which forms no tile of F, takes tiles up to 192 KiB: at D = 128, 384
 * reduced indices against 256, both timed against PyTorch's SDPA in the same process (2 threads,
 * median of the per-round ratios, the order rotated every round, load 4-5), ran 1-3 % faster in 3
 * of 4 runs at N = M = 4096 (1 % slower in the fourth) and 4 % faster at 16 384. */
static int strip_tj(const struct fused_kernel *fk)
{
    int w = (fk->rc + 15) / 16 * 16;
    for (int q = 0; q < fk->nfac; q++)
        w = fk->fac[q].gemm && fk->fac[q].dim > w ? fk->fac[q].dim : w;
    int tj = ((fk->sdp ? 49152 : 32768) / w) / 16 * 16;
    return tj > 512 ? 512 : tj < 16 ? 16 : tj;
}

/* The rows of the tiles of F and of inner products for blocks of ti rows: one strip with the AVX2
 * products, which form them strip by strip. */
static int64_t tile_rows(const struct fused_kernel *fk, int64_t ti)
{
    return fk->kern == KERN_AVX2 && ti > FUSED_STRIP ? FUSED_STRIP : ti;
}

/* The columns of B that BLIS's product takes in a pass of `cols`: a multiple of 4. BLIS (0.9,
 * zen3 sub-configuration, AVX2) computes a product F Vt of 10, 11 or 14 columns by a slower
 * path than one of 12 or 16: for GPyTorch's 11 (K @ [y, 10 probes], d = 3), the product took
 * 0.8 of the time that forming the tile of F takes, and 0.45 with Vt padded by zero columns to
 * 12. */
static int pad_cols(const struct fused_kernel *fk, int cols)
{
    return fk->kern == KERN_BLIS ? (cols + 3) / 4 * 4 : cols;
}

/* Whether each pass's output block and tile of B go through buffers (Cb, Vb): when B takes
 * several passes, or when BLIS's product pads the columns. */
static bool buffered(const struct fused_kernel *fk)
{
    return fk->rc < fk->R || pad_cols(fk, fk->rc) != fk->rc;
}

/* The row stride of a pass's output block and tile of B in their buffers: the pass's padded
 * columns and 16 more. Rows of a power-of-two stride (R = 1024: 4 KiB) all fall into the same
 * cache sets; R = 1024 ran at 2.9x K @ B in place, where R = 256 ran at 1.1x. */
static int64_t ld_pass(const struct fused_kernel *fk) { return pad_cols(fk, fk->rc) + 16; }

/* One thread's workspace for tiles ti x tj: the tile of F (none with fk->sdp, whose exponentials
 * replace the tile of inner products) and its packed copy, the packed block of B, the row states
 * (maximum and sum), the modules' own tiles, the tile of each further factor of F; per factor
 * from a gemm: the tile of inner products and both packed operands. */
static int64_t thread_bytes(const sr_kernel *k, const struct fused_kernel *fk, int ti, int tj)
{
    int f64 = k->dtype == SR_F64;
    int64_t es = f64 ? 8 : 4, D = 0;
    const int64_t tr = tile_rows(fk, ti);
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
    if (buffered(fk))
        b += al64((int64_t)ti * ld_pass(fk) * es) + al64((int64_t)tj * ld_pass(fk) * es);
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

static void fused_free(sr_ctx *ctx, struct fused_kernel *fk)
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

/* Sets fk->sdp when k is a float32 SumSoftMaxWeight on the AVX2 strip products whose F is its one
 * factor's inner product S, or S times a parameter of dimension 1 or a constant, in either order:
 * then the exponentials scale the tile of inner products themselves (softmax_sdp). */
static void sdp_match(const sr_kernel *k, struct fused_kernel *fk, const sr_expr *S)
{
    fk->sdp = false;
    if (k->red != SR_SUMSOFTMAXWEIGHT || k->dtype != SR_F32 || fk->kern != KERN_AVX2 ||
        fk->nfac != 1 || !fk->fac[0].gemm || fk->avar >= 0 || !S)
        return;
    const sr_expr *f = fk->fac[0].f, *c = NULL;
    if (f != S) {
        if (f->op != OP_MUL || (f->child[0] != S && f->child[1] != S))
            return;
        c = f->child[f->child[0] == S ? 1 : 0];
    }
    fk->sdp_var = -1;
    fk->sdp_c = 1;
    if (c && c->dim == 1 && c->op == OP_VAR && c->iattr[1] == SR_CAT_PARAM)
        fk->sdp_var = (int)c->iattr[0];
    else if (c && c->dim == 1 && c->op == OP_CST)
        fk->sdp_c = (float)c->fattr;
    else if (c)
        return;
    fk->sdp = true;
}

/* Plans k on the fused strategy with the formulas of km (k's own, or with SqDist expanded for a
 * gemm; with gemm_form, only when a factor of F then comes from a gemm), without compiling or
 * allocating anything: fills fk's form, factors, products' gemm and its tiles before the memory
 * budget shrinks them (S[q]: factor q's inner product). Returns why it cannot, or NULL. */
static const char *plan_form(const sr_kernel *k, const sr_kernel *km, int acc, bool gemm_form,
                             struct fused_kernel *fk, const sr_expr **S)
{
    memset(fk, 0, sizeof *fk);
    struct fused_form fm = {NULL, -1, -1, 1, 0, NULL};
    if (!fused_match(km, &fm))
        return "F is not a Sum of F * B or a SumSoftMaxWeight with a scalar F";
    /* The products: symred's AVX-512 gemm where the CPU has it, else BLIS (SYMRED_GEMM_KERNEL). */
    int kern;
    bool forced_blis;
    if (cpu_gemm_kernel(k->ctx, &kern, &forced_blis) != SR_OK || kern < 0)
        return "no tile gemm (SYMRED_GEMM=off, or no AVX-512F and no BLIS)";
    if (k->dtype == SR_F32 && acc != JIT_ACC_BLOCK)
        return "Kahan and float64 accumulation of float32 run on the direct strategy";
    int R = form_width(k, &fm);
    fk->kern = kern;
    fk->bvar = fm.bvar;
    fk->hoist.b = fm.bf;
    fk->avar = fm.avar;
    fk->bsign = fm.bsign;
    fk->asign = fm.asign;
    fk->R = R;
    fk->rc = R < FUSED_COLS ? R : FUSED_COLS;
    fk->f = fm.f;
    split_factors(k, fk);
    /* Each factor's tile from a tile of inner products when it depends on the pair through
     * one, of dimension at least SR_GEMM_MIN_DIM, and little else. */
    bool gemm_factor = false;
    for (int q = 0; q < fk->nfac; q++) {
        struct fused_factor *fc = &fk->fac[q];
        sr_kernel kf = *k;
        kf.f = fc->f;
        kf.weight = NULL;
        double epi = 0;
        S[q] = cpu_gemm_find_node(&kf, &fc->va, &fc->vb, &epi);
        if (S[q] && S[q]->child[0]->dim >= SR_GEMM_MIN_DIM && epi <= S[q]->child[0]->dim) {
            fc->gemm = 1;
            fc->dim = S[q]->child[0]->dim;
            gemm_factor = true;
        }
    }
    if (gemm_form && !gemm_factor)
        return "F's expanded form gives no factor its gemm";
    /* Without AVX-512F, float32 with a factor of F from a gemm (attention and its gradients):
     * the AVX2 strip products, unless SYMRED_GEMM_KERNEL=blis asks for BLIS. */
    if (kern == KERN_BLIS && !forced_blis && gemm_factor && k->dtype == SR_F32 && cpu_avx2_usable())
        fk->kern = KERN_AVX2;
    /* Tiles: a multiple of the AVX-512 micro-kernel's 14 rows, and 256 reduced indices (one K
     * block of BLIS's zen3 sgemm, one of ours). Measured under load on this 2-core AVX2 VM with
     * BLIS (docs/wide.md): the Gaussian with R = 256 ran at 1.3-1.6x K @ B with tj = 512 and
     * 1.0-1.1x with 448 x 256; BLIS's small shapes (112 rows, K = 64) ran at 16 GFLOP/s where
     * 448 rows reached 21-26. The AVX2 strip products take 512 reduced indices (their tiles of F
     * are one strip: 2 x 12 x 512 float32): attention N = M = 4096 ran 0-8 % faster than with
     * 256 (alternating in one process, median of 7-9, load 9-10). */
    fk->ti = 448;
    sdp_match(k, fk, S[0]);
    fk->tj = fk->kern == KERN_AVX2 ? strip_tj(fk) : 256;
    if (kern == KERN_AVX512 && fk->tj > cpu_avx512_kc_max(k->dtype == SR_F64))
        fk->tj = (int)cpu_avx512_kc_max(k->dtype == SR_F64); /* one K block per tile */
    return NULL;
}

/* The tiles under the memory budget lim (0: none), from fk's: rows first, then reduced indices;
 * the reduced indices first for the AVX2 strip products, whose tiles of F are one strip whatever
 * ti, their tiles of K and B tj long, and tj a multiple of their 16-column panels (they write
 * whole panels of the tile of inner products, of row stride tj). At least 14 x 16. */
static void fit_tiles(const sr_kernel *k, const struct fused_kernel *fk, int64_t lim, int *ti_,
                      int *tj_)
{
    int ti = fk->ti, tj = fk->tj;
    const bool rows_first = fk->kern != KERN_AVX2;
    while (lim > 0 && thread_bytes(k, fk, ti, tj) > lim && (ti > 14 || tj > 16)) {
        if ((rows_first || tj <= 16) && ti > 14)
            ti = ti / 28 * 14 > 14 ? ti / 28 * 14 : 14;
        else
            tj = tj / 32 * 16 > 16 ? tj / 32 * 16 : 16;
    }
    *ti_ = ti;
    *tj_ = tj;
}

/* Realises k on the fused strategy with the formulas of km (as plan_form). */
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

static sr_status prepare_form(sr_kernel *k, const sr_kernel *km, int acc, bool gemm_form,
                              enum cpu_compile mode)
{
    const bool tier0 = mode == CPU_COMPILE_NEVER;
    sr_ctx *ctx = k->ctx;
    struct fused_kernel *fk = calloc(1, sizeof *fk);
    if (!fk)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    const sr_expr *S[FUSED_MAX_FACTORS] = {0};
    if (plan_form(k, km, acc, gemm_form, fk, S)) {
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
        fit_tiles(k, fk, lim, &ti, &tj);
        if (any_gemm && (ti != fk->ti || tj != fk->tj)) {
            fk->ti = ti; /* the tile's leading dimension is compiled in: emit again */
            fk->tj = tj;
            continue;
        }
        fk->ti = ti;
        fk->tj = tj;
        fk->per_thread = thread_bytes(k, fk, ti, tj);
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

/* ---- the symmetric driver: planning ---------------------------------------------------------- */

/* Why the fused form fm of k cannot run on the symmetric driver, or NULL; sets the pairs of
 * exchanged arguments in vi, vj and their number in *np. */
static const char *sym_form(const sr_kernel *k, const struct fused_form *fm, int *vi, int *vj,
                            int *np)
{
    if (k->red != SR_SUM || k->weight || fm->avar >= 0 || fm->bsign != 1 || fm->bf != NULL)
        return "not a Sum of F * B with B a variable";
    if (k->vars[fm->bvar].dim > FUSED_COLS)
        return "B is wider than one pass of the fused two-product";
    if ((*np = simp_symmetric_pairs(k->ctx, fm->f, vi, vj, FUSED_SYM_MAX)) < 0)
        return "F is not symmetric under exchanging its i- and j-variables";
    return NULL;
}

/* The cost model's terms of the fused plan fk of k, its tiles ti x tj and its factors' inner
 * products S (src/cpu/cost.c): per pass over B's columns, F's tile formed again (its factors'
 * generated code and inner products), and the product of the tile by the pass's columns of B. */
static void fused_cost(const sr_kernel *k, const struct fused_kernel *fk, const sr_expr **S, int ti,
                       int tj, struct cpu_cost *c)
{
    double passes = (fk->R + fk->rc - 1) / fk->rc, m = 0, tiles = 1;
    memset(c, 0, sizeof *c);
    for (int q = 0; q < fk->nfac; q++) {
        const struct fused_factor *fc = &fk->fac[q];
        cpu_cost_gen(&fc->f, 1, fc->gemm ? S[q] : NULL, c);
        if (fc->gemm) {
            m += 2.0 * fc->dim;
            c->pack_per_pair += (double)fc->dim / ti;
            tiles++; /* its tile of inner products */
        }
    }
    c->arith += fk->nfac - 1;            /* the factors' product */
    c->arith += fk->avar >= 0;           /* the row sums of F beside the product */
    if (k->red == SR_SUMSOFTMAXWEIGHT) { /* the online softmax: maximum, exp(F - m) */
        c->arith += 2;
        c->trans += 10;
    }
    c->arith *= passes;
    c->trans *= passes;
    double prod = (m + cpu_cost_product_flops(fk->rc)) * passes;
    if (fk->kern == KERN_AVX2)
        c->strip_flops = prod;
    else
        c->gemm_flops = prod;
    c->tile_passes = passes * tiles;
    c->pack_per_pair += (double)fk->R / ti;
    c->ti = ti;
    c->tj = tj;
}

/* The fused plan of k (plan_form on the gemm form first, as cpu_fused_prepare), into fk and S;
 * why not, or NULL. */
static const char *offer_plan(const sr_kernel *k, int acc, struct fused_kernel *fk,
                              const sr_expr **S)
{
    sr_kernel kx;
    const sr_kernel *km = cpu_gemm_form(k, &kx);
    if (km != k && !plan_form(k, km, acc, true, fk, S))
        return NULL;
    return plan_form(k, k, acc, false, fk, S);
}

/* The offer of the fused two-product, or with sym of its symmetric driver. The symmetric
 * driver forms each off-diagonal tile of F once for two pairs when x and y are the same array,
 * which is known only when it runs; otherwise it runs the fused two-product: its estimate is
 * the fused two-product's, and it comes first on the tie. */
static void offer(const sr_kernel *k, int acc, struct sr_plan *p, bool sym)
{
    memset(p, 0, sizeof *p);
    p->strategy = sym ? "symmetric fused two-product" : "fused two-product";
    struct fused_kernel fk;
    const sr_expr *S[FUSED_MAX_FACTORS] = {0};
    const char *why = offer_plan(k, acc, &fk, S);
    struct fused_form fm = {fk.f, fk.bvar, fk.avar, fk.bsign, fk.asign, fk.hoist.b};
    int vi[FUSED_SYM_MAX], vj[FUSED_SYM_MAX], np = 0;
    if (!why && sym && (fk.nfac != 1 || fk.fac[0].gemm))
        why = "F's tile comes from a tile of inner products";
    else if (!why && sym && (fk.kern == KERN_AVX2 || !cpu_blis_usable(NULL)))
        why = "no BLIS for the transposed product";
    else if (!why && sym)
        why = sym_form(k, &fm, vi, vj, &np);
    p->flops = k->simp.cost.flops_pair;
    if (why) {
        snprintf(p->why, sizeof p->why, "%s", why);
        return;
    }
    /* The workspace: the smallest tiles must fit in the budget; the modules' own workspace,
     * known once they are emitted, comes on top of this lower bound. */
    int64_t lim = k->budget, least = thread_bytes(k, &fk, 14, 16);
    if (lim > 0 && least > lim) {
        snprintf(p->why, sizeof p->why,
                 "needs at least %lld bytes per thread (tiles 14 x 16), the budget allows %lld",
                 (long long)least, (long long)lim);
        return;
    }
    fit_tiles(k, &fk, lim, &p->ti, &p->tj);
    p->workspace = thread_bytes(k, &fk, p->ti, p->tj);
    struct cpu_cost c;
    fused_cost(k, &fk, S, p->ti, p->tj, &c);
    p->flops = c.arith + c.trans;
    p->gemm_flops = c.gemm_flops + c.strip_flops;
    p->est_ns = cpu_cost_ns(&c);
    p->feasible = true;
    p->forced = k->ctx->opt.gemm == 1;
    snprintf(p->why, sizeof p->why, "%s",
             sym ? "F(x, y) = F(y, x): when x and y are the same array at run time (n = m), each "
                   "off-diagonal tile of F is formed once for both triangles (estimated as the "
                   "fused two-product, which it runs otherwise)"
                 : "a tile of F formed in cache times the tile of B by the gemm");
}

void cpu_fused_offer(const sr_kernel *k, int acc, struct sr_plan *p) { offer(k, acc, p, false); }

void cpu_fused_sym_offer(const sr_kernel *k, int acc, struct sr_plan *p) { offer(k, acc, p, true); }

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
        why = sym_form(k, &fm, fk->sym_i, fk->sym_j, &fk->nsym);
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

/* ---- run ----------------------------------------------------------------------------------- */

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
    const int64_t tr = tile_rows(fk, ti);
    if (!fk->sdp) /* with sdp, the exponentials replace the tile of inner products */
        TAKE(w->F, tr * tj * es);
    TAKE(w->m, ti * 8);
    TAKE(w->s, ti * 8);
    TAKE(w->args, ((int64_t)k->nargs + 2) * (int64_t)sizeof(void *));
    if (buffered(fk)) {
        TAKE(w->Cb, ti * ld_pass(fk) * es);
        TAKE(w->Vb, tj * ld_pass(fk) * es);
        memset(w->Vb, 0, (size_t)(tj * ld_pass(fk) * es)); /* the padding columns: zeros */
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

/* The row maximum as an OpenMP simd max-reduction. gcc vectorises it; clang cannot (the
 * comparison's NaN order forbids its reordering) and, asked to, fails the build under -Werror
 * (-Wpass-failed), so clang gets the plain loop. */
#define SIMD_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define SIMD_MAX(v)
#else
#define SIMD_MAX(v) SIMD_PRAGMA(omp simd reduction(max : v))
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* The CPU JIT's exponential (sr_exp, src/jit/emit-c.c) of eight float32 values with AVX2 and
 * FMA, its constants and steps: within 1.1 ulp, 0 where the result is below 1.7e-38 (and for
 * -inf), NaN for NaN, +inf above 88.72283 (docs/semantics.md, "The CPU JIT's Exp"); with
 * nonpos, only for values a <= 0 (and NaN), one step less. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
exp_avx2(__m256 a, bool nonpos)
{
    const __m256 sh = _mm256_set1_ps(0x1.8p23f), hi = _mm256_set1_ps(0x1.62e42ep+6f);
    __m256 x = _mm256_max_ps(_mm256_set1_ps(-87.5f), a); /* a NaN stays */
    if (!nonpos)
        x = _mm256_min_ps(hi, x);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), sh);
    const __m256 k = _mm256_sub_ps(t, sh);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.62e4p-1f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.7f7d1cp-20f), r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(0x1.6d10fcp-10f), r, _mm256_set1_ps(0x1.120b62p-7f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.55551ap-5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.5554dep-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1p-1f));
    const __m256 p = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1));
    /* 2^k added to the exponent: k + 127 in the low bits of t. */
    __m256 e = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
    e = _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(1.7e-38f), _CMP_LT_OQ), e);
    /* A NaN's payload bits may have moved the exponent: all ones (a NaN) where a is NaN. */
    e = _mm256_or_ps(e, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    if (!nonpos)
        e = _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(a, hi, _CMP_GT_OQ));
    return e;
}

/* The exponential's argument: F - m, or with `scaled`, F a - m by one rounding (an FMA). */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
exp_arg(__m256 F, __m256 a, __m256 m, bool scaled)
{
    return scaled ? _mm256_fmsub_ps(F, a, m) : _mm256_sub_ps(F, m);
}

/* F[c] = exp(F[c] - m) by exp_avx2, c < n, and their sum; m is not -inf or NaN (F[c] - m would
 * be NaN for F[c] = -inf, whose weight is 0), and with nonpos at least every F[c] that is not NaN.
 * With `scaled`, exp(F[c] a - m) (m at least every F[c] a then). Two vectors at a time; the tail
 * under a mask. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) double
expsum_vec(float *F, int64_t n, float m, bool nonpos, float a, bool scaled)
{
    const __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(a);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m256 e0 = exp_avx2(exp_arg(_mm256_loadu_ps(F + c), va, vm, scaled), nonpos);
        const __m256 e1 = exp_avx2(exp_arg(_mm256_loadu_ps(F + c + 8), va, vm, scaled), nonpos);
        _mm256_storeu_ps(F + c, e0);
        _mm256_storeu_ps(F + c + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    for (; c < n; c += 8) {
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const int64_t left = n - c < 8 ? n - c : 8;
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), idx);
        __m256 e = exp_avx2(exp_arg(_mm256_maskload_ps(F + c, mk), va, vm, scaled), nonpos);
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(F + c, mk, e);
        s0 = _mm256_add_ps(s0, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(s0, s1));
    double t = 0;
    for (int l = 0; l < 8; l++)
        t += lanes[l];
    return t;
}

__attribute__((target("avx2,fma"))) static double expsum_avx2(float *F, int64_t n, float m)
{
    return expsum_vec(F, n, m, false, 1, false);
}

/* expsum_avx2 where m is at least every F[c] that is not NaN (the online softmax's row maximum). */
__attribute__((target("avx2,fma"))) static double expsum_max_avx2(float *F, int64_t n, float m)
{
    return expsum_vec(F, n, m, true, 1, false);
}

/* F[c] = exp(F[c] a - m), c < n, and their sum; m is finite and at least every F[c] a that is not
 * NaN, but for the rounding of one product (the row maximum of the scaled tile). */
__attribute__((target("avx2,fma"))) static double expsum_scaled_avx2(float *F, int64_t n, float a,
                                                                     float m)
{
    return expsum_vec(F, n, m, true, a, true);
}

/* F[c] = exp(F[c] a - m), c < n, and their sum, for any finite m (the clamp above and the
 * infinities of exp_avx2 kept). */
__attribute__((target("avx2,fma"))) static double expsum_vec_scaled_avx2(float *F, int64_t n,
                                                                         float a, float m)
{
    return expsum_vec(F, n, m, false, a, true);
}

/* The largest and the smallest value of F[c], c < n, in *hi and *lo (-inf and +inf when n is 0 or
 * every F[c] is NaN: a NaN never wins). */
__attribute__((target("avx2,fma"))) static void minmax_avx2(const float *F, int64_t n, float *hi,
                                                            float *lo)
{
    __m256 h0 = _mm256_set1_ps(-INFINITY), h1 = h0, l0 = _mm256_set1_ps(INFINITY), l1 = l0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m256 f0 = _mm256_loadu_ps(F + c), f1 = _mm256_loadu_ps(F + c + 8);
        h0 = _mm256_max_ps(f0, h0);
        h1 = _mm256_max_ps(f1, h1);
        l0 = _mm256_min_ps(f0, l0);
        l1 = _mm256_min_ps(f1, l1);
    }
    float lh[8], ll[8], th = -INFINITY, tl = INFINITY;
    _mm256_storeu_ps(lh, _mm256_max_ps(h0, h1));
    _mm256_storeu_ps(ll, _mm256_min_ps(l0, l1));
    for (int l = 0; l < 8; l++) {
        th = lh[l] > th ? lh[l] : th;
        tl = ll[l] < tl ? ll[l] : tl;
    }
    for (; c < n; c++) {
        th = F[c] > th ? F[c] : th;
        tl = F[c] < tl ? F[c] : tl;
    }
    *hi = th;
    *lo = tl;
}

/* The largest value of F[c], c < n, at least lo; a NaN never wins (as tm = F > tm ? F : tm): the
 * maximum instruction returns its second operand when either is NaN. */
__attribute__((target("avx2,fma"))) static float rowmax_avx2(const float *F, int64_t n, float lo)
{
    __m256 m0 = _mm256_set1_ps(lo), m1 = m0, m2 = m0, m3 = m0;
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(F + c), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(F + c + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(F + c + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(F + c + 24), m3);
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float lanes[8], tm = lo;
    _mm256_storeu_ps(lanes, m0);
    for (int l = 0; l < 8; l++)
        tm = lanes[l] > tm ? lanes[l] : tm;
    for (; c < n; c++)
        tm = F[c] > tm ? F[c] : tm;
    return tm;
}
#endif

/* The largest value of F[c], c < n, and -inf; a NaN never wins. */
static float rowmax_f32(const float *F, int64_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2"))
        return rowmax_avx2(F, n, -INFINITY);
#endif
    float tm = -INFINITY;
    SIMD_MAX(tm)
    for (int64_t c = 0; c < n; c++)
        tm = F[c] > tm ? F[c] : tm;
    return tm;
}

/* F[c] = exp(F[c] - m) and their sum; with is_max, m is at least every F[c] that is not NaN. */
static double expsum_f32(float *F, int64_t n, float m, bool is_max)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (m > -INFINITY && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return is_max ? expsum_max_avx2(F, n, m) : expsum_avx2(F, n, m);
#else
    (void)is_max;
#endif
    return expsum_body(F, n, m);
}

double cpu_expsum_f32(float *F, int64_t n, float m) { return expsum_f32(F, n, m, false); }

double cpu_expsum_scaled_f32(float *F, int64_t n, float a, float m)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (isfinite(a) && isfinite(m) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return expsum_vec_scaled_avx2(F, n, a, m);
#endif
    for (int64_t c = 0; c < n; c++)
        F[c] *= a;
    return expsum_f32(F, n, m, false);
}

float cpu_rowmax_f32(const float *F, int64_t n) { return rowmax_f32(F, n); }

/* The online softmax's running maximum *wm of a float32 row grown to tm, the row's maximum in
 * this tile: the row's output (cols values) and sum *wsum rescaled as cpu_softmax_grow says.
 * Returns the new maximum. */
static float grow_max_f32(double *wm, double *wsum, float *orow, int cols, float tm)
{
    const float sa = (float)cpu_softmax_grow(wm, tm);
    if (sa != 1.0f) {
        for (int c = 0; c < cols; c++)
            orow[c] *= sa;
        *wsum *= sa;
    }
    return (float)*wm;
}

/* The online softmax of one float32 row F of the tile (n values): the maximum grown
 * (grow_max_f32) and F replaced by exp(F - m), its sum added to *wsum. */
static void softmax_row_f32(int kern, float *F, int64_t n, double *wm, double *wsum, float *orow,
                            int cols)
{
    const float mn = grow_max_f32(wm, wsum, orow, cols, rowmax_f32(F, n));
    *wsum += kern == KERN_AVX512 ? cpu_avx512_expsum_f32(F, F, n, mn) : expsum_f32(F, n, mn, true);
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
            softmax_row_f32(fk->kern, (float *)w->F + o * nj, nj, wm + o, wsum + o,
                            (float *)out + o * ldo, cols);
        }
    }
}

/* softmax_tile for fk->sdp: the tile of inner products G (row stride tj) replaced by
 * exp(G a - m), a the scale of F = a G, without forming F: m from G's maximum (its minimum when
 * a < 0), which the scale's rounding keeps F's maximum. A row whose maximum is not finite, or a
 * scale that is not, takes F = G a and softmax_row_f32. */
static void softmax_sdp(const struct fused_kernel *fk, struct fused_ws *w, int64_t s0, char *out,
                        int64_t ldo, int64_t no, int64_t nj, int cols, float a)
{
    double *wm = w->m + s0, *wsum = w->s + s0;
    for (int64_t o = 0; o < no; o++) {
        float *G = (float *)w->G[0] + o * fk->tj, *orow = (float *)out + o * ldo;
#if defined(__x86_64__) && defined(__GNUC__)
        float hi, lo;
        minmax_avx2(G, nj, &hi, &lo);
        const float tm = a >= 0 ? hi * a : lo * a;
        if (isfinite(tm) && isfinite(a)) {
            const float mn = grow_max_f32(wm + o, wsum + o, orow, cols, tm);
            wsum[o] += expsum_scaled_avx2(G, nj, a, mn);
            continue;
        }
#endif
        for (int64_t c = 0; c < nj; c++)
            G[c] *= a;
        softmax_row_f32(fk->kern, G, nj, wm + o, wsum + o, orow, cols);
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
    const int64_t ldo = w->Cb ? ld_pass(fk) : R;
    /* The product's columns: in the buffers, padded for BLIS (zeros in Vb's padding). */
    const int pcols = w->Cb ? pad_cols(fk, cols) : cols;
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
            if (w->Vb && !strips) { /* the tile of B's pass columns, at stride ld_pass */
                for (int64_t j = 0; j < nj; j++)
                    memcpy(w->Vb + j * ld_pass(fk) * es, Vt + j * R * es, (size_t)(cols * es));
                Vt = w->Vb;
                ldv = ld_pass(fk);
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
 * multiple of 4 (BLIS's fast shapes, pad_cols). */
static int64_t sym_ld(const struct fused_kernel *fk) { return (fk->R + 3) / 4 * 4; }

/* The symmetric driver's memory for n rows: per thread the tile of F, the arguments and an
 * accumulator of n x sym_ld values (*per_thread), and B padded once when its width is not
 * sym_ld (*shared). */
static void sym_bytes(const sr_kernel *k, const struct fused_kernel *fk, int64_t n,
                      int64_t *per_thread, int64_t *shared)
{
    const int64_t es = k->dtype == SR_F64 ? 8 : 4, acc = al64(n * sym_ld(fk) * es);
    *per_thread = al64((int64_t)fk->sym_t * fk->sym_t * es) +
                  al64(((int64_t)k->nargs + 2) * (int64_t)sizeof(void *)) + acc + 64;
    *shared = sym_ld(fk) != fk->R ? acc + 64 : 0;
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
    const int64_t es = f64 ? 8 : 4, T = fk->sym_t, ld = sym_ld(fk);
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
    const int64_t es = f64 ? 8 : 4, n = r->nx, ld = sym_ld(fk), T = fk->sym_t;
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

static sr_status fused_run(const sr_kernel *k, const sr_run_desc *r)
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
static sr_status fused_run_lse(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
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

static sr_status fused_run_ranges(const sr_kernel *k, const sr_run_desc *r,
                                  const struct sr_rplan *p)
{
    const struct fused_kernel *fk = k->backend_data;
    return run_chunks(k, r, p, fk->ti, NULL, NULL);
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
    if (pad_cols(fk, fk->rc) != fk->rc)
        expr_buf_printf(b, "  tile of B padded with zero columns to %d for BLIS's product\n",
                        pad_cols(fk, fk->rc));
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
                        fk->sym_t, fk->sym_t, fk->sym_t, (long long)sym_ld(fk),
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
