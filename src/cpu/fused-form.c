/*
 * fused-form.c — the fused two-product's form of F and its candidate plans (fused.h): whether k
 * is a Sum of F * B (or A - B, a product of factors, a formula B) or a SumSoftMaxWeight of a
 * scalar F, F split into factors that each take one inner product from a gemm, the symmetric
 * driver's pairs of exchanged variables, and the offers of both plans with the cost model's
 * terms (src/cpu/cost.c).
 */
#include "../formulas/formulas.h"
#include "fused.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most factors of F * B that fused_match and split_factors look at. */
#define FUSED_MAX_TERMS 16

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
const char *fused_why(const sr_kernel *k, const struct fused_kernel *fk)
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
const char *fused_plan_form(const sr_kernel *k, const sr_kernel *km, int acc, bool gemm_form,
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
    fk->tj = fk->kern == KERN_AVX2 ? fused_strip_tj(fk) : 256;
    if (kern == KERN_AVX512 && fk->tj > cpu_avx512_kc_max(k->dtype == SR_F64))
        fk->tj = (int)cpu_avx512_kc_max(k->dtype == SR_F64); /* one K block per tile */
    return NULL;
}

/* ---- the symmetric driver's form ------------------------------------------------------------ */

/* Why the fused form fm of k cannot run on the symmetric driver, or NULL; sets the pairs of
 * exchanged arguments in vi, vj and their number in *np. */
const char *fused_sym_form(const sr_kernel *k, const struct fused_form *fm, int *vi, int *vj,
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

/* ---- the offers ------------------------------------------------------------------------------ */

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

/* The fused plan of k (fused_plan_form on the gemm form first, as cpu_fused_prepare), into fk and
 * S; why not, or NULL. */
static const char *offer_plan(const sr_kernel *k, int acc, struct fused_kernel *fk,
                              const sr_expr **S)
{
    sr_kernel kx;
    const sr_kernel *km = cpu_gemm_form(k, &kx);
    if (km != k && !fused_plan_form(k, km, acc, true, fk, S))
        return NULL;
    return fused_plan_form(k, k, acc, false, fk, S);
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
        why = fused_sym_form(k, &fm, vi, vj, &np);
    p->flops = k->simp.cost.flops_pair;
    if (why) {
        snprintf(p->why, sizeof p->why, "%s", why);
        return;
    }
    /* The workspace: the smallest tiles must fit in the budget; the modules' own workspace,
     * known once they are emitted, comes on top of this lower bound. */
    int64_t lim = k->budget, least = fused_thread_bytes(k, &fk, 14, 16);
    if (lim > 0 && least > lim) {
        snprintf(p->why, sizeof p->why,
                 "needs at least %lld bytes per thread (tiles 14 x 16), the budget allows %lld",
                 (long long)least, (long long)lim);
        return;
    }
    fused_fit_tiles(k, &fk, lim, &p->ti, &p->tj);
    p->workspace = fused_thread_bytes(k, &fk, p->ti, p->tj);
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
