/*
 * emit-cuda-fused.c — the CUDA fused two-product strategy for wide outputs:
 * out_o = sum_r F(o, r) B_r with F a scalar formula and B of width R of the reduced side, a
 * variable or a formula (a kernel matrix times R right-hand sides), the same with A - B, B - A or
 * A + B in place of B, A an output-side variable (the radial kernel's gradient x_i - y_j, done as
 * A_o sum_r F - sum_r F B_r from the rows' sums of F), the sums times C_o componentwise, C a
 * formula of the output side (evaluated per output row at the end), and SumSoftMaxWeight of a
 * scalar F with a weight G of width R of the reduced side (attention). A formula B or G is
 * evaluated once per reduced index of each tile, its nodes emitted by the C emitter as those of
 * an output row of the other axis.
 *
 * A block of CUDA_FUSED_BS threads owns CUDA_FUSED_TI output rows and CUDA_FUSED_RC columns of
 * B (blockIdx.y: columns [y RC, y RC + RC) of R). Per tile of TJ reduced indices:
 *   1. the inner nodes of F into shared memory (tb, as the direct kernel) and the TJ x RC tile
 *      of B into shared memory (zeros past the last column);
 *   2. the TI x TJ tile of F formed cooperatively into shared memory: each thread forms pairs of
 *      one fixed row, whose outer nodes it computed once, with the C emitter's node code
 *      (jit_emit_nodes on F alone). When F holds an inner product (u_o | w_r) of an output-side
 *      and a reduced-side variable of CUDA_FUSED_MIN_DOT values or more, the block first
 *      computes its TI x TJ tile as a tile product (chunks of u and w in shared memory, 4 x TJ / 16
 *      micro-tiles in registers: emit_dot_tile) into the tile of F, and F's node code reads the
 *      inner product from there (jit_emit_nodes_gemm) before writing F's value over it;
 *   3. SumSoftMaxWeight: four threads per row (BS / TI) take the tile's maximum, the running
 *      maximum m, the rescale factor exp(m_old - m) when it grows, replace the tile by
 *      exp(F - m) (0 where F is -inf) and add it to the row's running sum, each on every fourth
 *      index of the tile, combining their partial maxima and sums through shared memory; m, the
 *      sum and the factor live in shared memory;
 *   4. the product: each thread owns a 4 x 4 micro-tile of the TI x RC output tile (rows
 *      ty + 16 p, columns tx + 16 q), sums the tile's TJ products in registers (the "block"
 *      accumulation, in sr_acc: double when float64 accumulation is asked for), then adds the
 *      tile's sum to its accumulators (SumSoftMaxWeight: after rescaling them).
 * SumSoftMaxWeight divides by the row's sum at the end. NaN and infinities follow IEEE
 * arithmetic through both products as in the direct kernel: a NaN or +inf F makes a
 * SumSoftMaxWeight row NaN (its sum is NaN), a -inf F has weight exactly 0 and 0 times an
 * infinite B is NaN (docs/semantics.md).
 *
 * Block-sparse ranges: a block takes at most TI rows of one range block and walks that block's
 * intervals of reduced indices in tiles, as the direct kernel does.
 * Split of the reduced range (few output rows): blockIdx.z takes a chunk of the reduced indices
 * and writes its unnormalised rows (SumSoftMaxWeight: with their maximum and sum) to a workspace;
 * sr_cuda_fused_combine merges the chunks of each row in order, SumSoftMaxWeight's by the
 * reference's rule (each chunk scaled by exp(m_z - m)).
 */
#include "cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P(...) expr_buf_printf(b, __VA_ARGS__)

/* Threads per block, output rows and columns of B per block; each thread's micro-tile is
 * (TI / 16) x (RC / 16) outputs (16 x 16 threads). */
#define CUDA_FUSED_BS 256
#define CUDA_FUSED_TI 64
#define CUDA_FUSED_RC 64
/* Reduced indices per tile at most (halved while the tiles exceed shared memory). */
#define CUDA_FUSED_TJ 32
/* Static shared memory the fused kernel allows itself (every device has 48 KiB per block). */
#define CUDA_FUSED_SHARED (40 << 10)

/* The narrowest B (or weight) for which the fused kernel is offered. The direct kernel keeps a
 * row's R sums in registers and reads one value of B from shared memory per multiply-add; the
 * fused kernel forms F once per pair for 64 columns and does 16 multiply-adds per two shared
 * loads, but pads B to 64 columns per block. From 16 columns on, the direct kernel's state
 * (16+ accumulators per thread, plus the formula's registers) and its shared-memory reads per
 * multiply-add dominate; below, the padding wastes more than the direct kernel loses. Chosen from
 * this count, not measured on a GPU. */
#define CUDA_FUSED_MIN_WIDTH 16

/* The narrowest inner product (u_o | w_r) of F, u a variable of the output side and w one of the
 * reduced side, that the fused kernel computes as a tile product (and for which it takes narrow
 * outputs too): below, a thread's pair-by-pair loop over the components costs less than the
 * chunks' loads and barriers. Chosen from this count, not measured on a GPU. */
#define CUDA_FUSED_MIN_DOT 16
/* Components of u and w per chunk of the tile of inner products in shared memory. */
#define CUDA_FUSED_GK 16

/* Factors of a Sum's formula the fused form takes at most. */
#define CUDA_FUSED_TERMS 16

/* The sides a formula depends on. */
enum side { SIDE_OUT, SIDE_RED, SIDE_PAIR };

/* SIDE_OUT: not on the reduced side (the output side's variables, parameters, constants);
 * SIDE_RED: on the reduced side only; SIDE_PAIR: on both. */
static enum side side_of(const sr_kernel *k, const sr_expr *e)
{
    unsigned out = k->axis == 1 ? DEP_I : DEP_J, red = k->axis == 1 ? DEP_J : DEP_I;
    return !(e->deps & red) ? SIDE_OUT : e->deps & out ? SIDE_PAIR : SIDE_RED;
}

/* *p times e (e when *p is NULL); false when out of memory. */
static bool times(sr_ctx *ctx, sr_expr **p, const sr_expr *e)
{
    return (*p = *p ? sr_mul(ctx, *p, (sr_expr *)e) : (sr_expr *)e) != NULL;
}

bool cuda_fused_form(const sr_kernel *k, struct cuda_form *m)
{
    *m = (struct cuda_form){.bvar = -1, .avar = -1, .bsign = 1};
    if (k->red == SR_SUMSOFTMAXWEIGHT) {
        if (!k->weight || k->fdim != 1 || side_of(k, k->weight) != SIDE_RED)
            return false;
        m->f = k->f;
        if ((m->bvar = sr__reduced_var(k, k->weight)) < 0)
            m->bf = k->weight;
        return true;
    }
    if (k->red != SR_SUM || k->weight)
        return false;
    const sr_expr *fac[CUDA_FUSED_TERMS];
    int neg = 0, n = simp_mul_factors(k->f, fac, 0, CUDA_FUSED_TERMS, &neg);
    sr_expr *f = NULL, *B = NULL, *C = NULL;
    bool ab = false;
    for (int t = 0; t < n; t++) {
        const sr_expr *e = fac[t];
        enum side sd = side_of(k, e);
        /* Scalar F: B is its first reduced-side variable. */
        if (e->dim == 1 && (k->fdim > 1 || B || sr__reduced_var(k, e) < 0)) {
            if (!times(k->ctx, &f, e))
                return false; /* out of memory: not fused */
        } else if (e->dim != k->fdim) {
            return false;
        } else if (sd == SIDE_RED || sd == SIDE_OUT) {
            if (!times(k->ctx, sd == SIDE_RED ? &B : &C, e))
                return false;
        } else if (ab || !sr__a_and_b(k, e, &m->avar, &m->asign, &m->bvar, &m->bsign)) {
            return false; /* a vector of the pair that is not A - B */
        } else {
            ab = true;
        }
    }
    if (!f || ab == (B != NULL) || (ab && C))
        return false;
    if (B && (m->bvar = sr__reduced_var(k, B)) < 0)
        m->bf = B;
    m->cf = C;
    m->f = neg % 2 ? sr_neg(k->ctx, f) : f;
    return m->f != NULL;
}

/* The widest inner product (u | w) in f, u a variable of the output side and w one of the
 * reduced side, at least CUDA_FUSED_MIN_DOT wide, or NULL (also when out of memory); *uvar and
 * *wvar get their argument indices. */
static const sr_expr *wide_dot(const sr_kernel *k, const sr_expr *f, int *uvar, int *wvar)
{
    size_t n = expr_toposort(f, NULL, 0);
    const sr_expr **ord = malloc((n ? n : 1) * sizeof *ord), *best = NULL;
    if (!ord)
        return NULL;
    expr_toposort(f, ord, n);
    const sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    for (size_t i = 0; i < n; i++) {
        const sr_expr *e = ord[i];
        if (e->op != OP_SCALPROD || e->child[0]->dim < CUDA_FUSED_MIN_DOT ||
            (best && best->child[0]->dim >= e->child[0]->dim))
            continue;
        for (int c = 0; c < 2; c++) {
            const sr_expr *u = e->child[c];
            int w = sr__reduced_var(k, e->child[1 - c]);
            if (w >= 0 && u->op == OP_VAR && u->iattr[1] == (int64_t)out_cat) {
                best = e;
                *uvar = (int)u->iattr[0];
                *wvar = w;
                break;
            }
        }
    }
    free(ord);
    return best;
}

/* The width of B in m. */
static int form_width(const sr_kernel *k, const struct cuda_form *m)
{
    return m->bf ? m->bf->dim : k->vars[m->bvar].dim;
}

int cuda_plans(const sr_kernel *k, int acc, struct sr_plan *out)
{
    struct sr_plan *f = &out[CUDA_PLAN_FUSED], *d = &out[CUDA_PLAN_DIRECT];
    memset(out, 0, CUDA_PLAN_COUNT * sizeof *out);
    f->strategy = "fused two-product";
    d->strategy = "direct";
    struct cuda_form m;
    bool form = cuda_fused_form(k, &m);
    int R = form ? form_width(k, &m) : 0, uvar, wvar;
    const sr_expr *dot = form ? wide_dot(k, m.f, &uvar, &wvar) : NULL;
    const int dd = dot ? dot->child[0]->dim : 0;
    f->ti = CUDA_FUSED_TI;
    /* The inner product's 2 dd flops per pair move from the generated code to a tile product. */
    f->flops = k->simp.cost.flops_pair > 2.0 * dd ? k->simp.cost.flops_pair - 2.0 * dd : 0;
    f->gemm_flops = 2.0 * R + 2.0 * dd;
    if (!form)
        snprintf(f->why, sizeof f->why,
                 "not a Sum of a scalar F times B of the reduced side (or A - B with A of the "
                 "output side), nor SumSoftMaxWeight of a scalar F with a weight of the reduced "
                 "side");
    else if (R < CUDA_FUSED_MIN_WIDTH && !dot)
        snprintf(f->why, sizeof f->why,
                 "B has %d columns, fewer than %d, and F no inner product of an output-side and "
                 "a reduced-side variable of %d or more values: the direct kernel",
                 R, CUDA_FUSED_MIN_WIDTH, CUDA_FUSED_MIN_DOT);
    else if (acc == JIT_ACC_KAHAN)
        snprintf(f->why, sizeof f->why, "Kahan summation is the direct kernel's");
    else {
        f->feasible = true;
        if (dot)
            snprintf(f->why, sizeof f->why,
                     "F's inner product of %d values (arguments %d, %d) as a tile product, then "
                     "tiles of F times tiles of B (%d columns, padded to %d per block)",
                     dd, uvar, wvar, R, CUDA_FUSED_RC);
        else
            snprintf(f->why, sizeof f->why,
                     "B has %d columns: tiles of F in shared memory times tiles of B", R);
    }
    d->feasible = true;
    d->flops = k->simp.cost.flops_pair;
    snprintf(d->why, sizeof d->why, "one output row per thread, F per pair in registers");
    for (int i = 0; i < CUDA_PLAN_COUNT; i++)
        out[i].id = i;
    return CUDA_PLAN_COUNT;
}

/* The nodes of e, a formula of one side's variables and parameters (B's or C's of struct
 * cuda_form), as the output-row nodes of index o: a formula of the reduced side is emitted as if
 * its side were the output's. SR_ENOTSUP when some node is not of that scope. */
static sr_status side_nodes(const sr_kernel *k, const sr_expr *e, bool reduced,
                            struct jit_nodes *nd)
{
    sr_kernel ke = *k;
    ke.f = e;
    ke.weight = NULL;
    ke.red = SR_SUM;
    ke.fdim = ke.out_dim = e->dim;
    ke.k = 1;
    if (reduced)
        ke.axis = 1 - k->axis;
    sr_status st = jit_emit_nodes(&ke, jit_cuda_spell(), nd);
    if (st == SR_OK && (nd->inner.len || nd->pair.len || (!nd->floop && !nd->f[0]))) {
        jit_nodes_free(nd);
        return SR_ENOTSUP;
    }
    return st;
}

/* A block that evaluates the side formula of nd at index idx, then, in the loop that head opens
 * (it defines the column sr_c), runs stmt with component sr_c of the formula in sr_v. */
static void side_eval(struct expr_buf *b, const struct jit_nodes *nd, const char *idx,
                      const char *head, const char *stmt)
{
    P("      {\n        const long long o = %s;\n        (void)o;\n%s%s      %s\n"
      "          const sr_acc sr_v = (sr_acc)(",
      idx, nd->uniform.data ? nd->uniform.data : "", nd->outer.data ? nd->outer.data : "", head);
    if (nd->floop)
        P("%s", nd->floop);
    else
        for (int c = 0; nd->f[c]; c++)
            P("sr_c == %d ? %s : ", c, nd->f[c]);
    P("%s);\n          %s\n        }\n      }\n", nd->floop ? "" : "(sr_t)0", stmt);
}

/* Shared memory of the fused kernel with ncol columns of F's inner nodes and tiles of tj, and
 * with the chunks of u and w of an inner product computed as a tile product (dot). */
static int fused_shared(int ncol, int tj, int ts, int as, bool ssmw, bool dot)
{
    int64_t n = (int64_t)(ncol > 0 ? ncol : 1) * tj * ts + (int64_t)CUDA_FUSED_TI * (tj + 1) * ts +
                (int64_t)tj * CUDA_FUSED_RC * ts;
    if (dot)
        n += (int64_t)(CUDA_FUSED_TI + tj) * (CUDA_FUSED_GK + 1) * ts;
    if (ssmw)
        n += (int64_t)CUDA_FUSED_TI * (ts + 2 * as) + (int64_t)CUDA_FUSED_BS * as;
    return n > CUDA_FUSED_SHARED ? -1 : (int)n;
}

/* The tile of inner products (u_o | w_r) of the block's rows and the tile's reduced indices,
 * written into sr_F (where F's pass reads each value, through sr_gt, before it writes F's value
 * over it): per chunk of SR_GK components, the block loads u's chunk of its SR_FTI rows (clamped
 * as the rows whose pairs are formed) and w's of the tile's indices (zeros past the last index
 * and past the last component) into shared memory, and each thread sums a 4 x SR_GQ micro-tile
 * (rows ty + 16 p, reduced indices tx + 16 q) in registers. */
static void emit_dot_tile(struct expr_buf *b, int uvar, int wvar)
{
    P("      __syncthreads();\n"
      "      {\n"
      "        sr_acc sr_gp[4][SR_GQ];\n"
      "SR_UNROLL\n        for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "          for (int q = 0; q < SR_GQ; q++) sr_gp[p][q] = 0;\n"
      "        for (int sr_k0 = 0; sr_k0 < SR_GD; sr_k0 += SR_GK) {\n"
      "          if (sr_k0) __syncthreads();\n"
      "          for (int sr_e = threadIdx.x; sr_e < SR_FTI * SR_GK; sr_e += SR_FBS) {\n"
      "            const int sr_i = sr_e / SR_GK, sr_d = sr_k0 + sr_e %% SR_GK;\n"
      "            const long long sr_ur = sr_o0 + sr_i < sr_oe ? sr_o0 + sr_i : sr_oe - 1;\n"
      "            sr_U[sr_i * SR_GKP + sr_e %% SR_GK] = sr_d < SR_GD ? a%d[sr_ur * SR_GD + sr_d] "
      ": (sr_t)0;\n"
      "          }\n"
      "          for (int sr_e = threadIdx.x; sr_e < SR_TJ * SR_GK; sr_e += SR_FBS) {\n"
      "            const int jj = sr_e / SR_GK, sr_d = sr_k0 + sr_e %% SR_GK;\n"
      "            sr_W[jj * SR_GKP + sr_e %% SR_GK] = jj < nj && sr_d < SR_GD ? "
      "a%d[(rt + jj) * SR_GD + sr_d] : (sr_t)0;\n"
      "          }\n"
      "          __syncthreads();\n"
      "          for (int sr_d = 0; sr_d < SR_GK; sr_d++) {\n"
      "            sr_acc sr_u[4], sr_w1[SR_GQ];\n"
      "SR_UNROLL\n            for (int p = 0; p < 4; p++) sr_u[p] = (sr_acc)sr_U[(sr_ty + 16 * p) "
      "* SR_GKP + sr_d];\n"
      "SR_UNROLL\n            for (int q = 0; q < SR_GQ; q++)\n"
      "              sr_w1[q] = sr_tx + 16 * q < SR_TJ ? (sr_acc)sr_W[(sr_tx + 16 * q) * SR_GKP "
      "+ sr_d] : (sr_acc)0;\n"
      "SR_UNROLL\n            for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "              for (int q = 0; q < SR_GQ; q++) sr_gp[p][q] = fma(sr_u[p], sr_w1[q], "
      "sr_gp[p][q]);\n"
      "          }\n"
      "        }\n"
      "SR_UNROLL\n        for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "          for (int q = 0; q < SR_GQ; q++)\n"
      "            if (sr_tx + 16 * q < SR_TJ)\n"
      "              sr_F[(sr_ty + 16 * p) * SR_FLD + sr_tx + 16 * q] = (sr_t)sr_gp[p][q];\n"
      "      }\n",
      uvar, wvar);
}

sr_status jit_emit_cuda_fused(const sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                              struct cuda_plan *plan, struct cuda_fused *fp)
{
    struct cuda_form m;
    if (!cuda_fused_form(k, &m))
        return SR_ENOTSUP;
    const int bvar = m.bvar;
    const bool ab = m.avar >= 0; /* out = bsign sum F B + asign A sum F */
    const bool f32 = k->dtype == SR_F32, ssmw = k->red == SR_SUMSOFTMAXWEIGHT;
    if (acc == JIT_ACC_KAHAN)
        return SR_ENOTSUP;
    const int R = form_width(k, &m), ts = f32 ? 4 : 8;
    const int as = f32 && acc != JIT_ACC_F64 ? 4 : 8;

    /* F alone, as a Sum of one value: its nodes by the C emitter. */
    sr_kernel kf = *k;
    kf.f = m.f;
    kf.weight = NULL;
    kf.red = SR_SUM;
    kf.fdim = kf.out_dim = 1;
    kf.k = 1;
    /* A wide inner product of F: its tile is computed by the block before F is formed. */
    int uvar = -1, wvar = -1;
    const sr_expr *dot = wide_dot(k, m.f, &uvar, &wvar);
    const int dd = dot ? dot->child[0]->dim : 0;
    struct jit_nodes nd, nb = {0}, nc = {0};
    sr_status st = jit_emit_nodes_gemm(&kf, jit_cuda_spell(), dot, &nd);
    if (st != SR_OK)
        return st;
    if (m.bf)
        st = side_nodes(k, m.bf, true, &nb);
    if (st == SR_OK && m.cf)
        st = side_nodes(k, m.cf, false, &nc);
    int tj = CUDA_FUSED_TJ, shared;
    while ((shared = fused_shared(nd.ncol, tj, ts, as, ssmw, dot)) < 0 && tj > 1)
        tj /= 2;
    if (st != SR_OK || shared < 0 || !nd.f || !nd.f[0]) {
        jit_nodes_free(&nd);
        jit_nodes_free(&nb);
        jit_nodes_free(&nc);
        return st != SR_OK ? st : SR_ENOTSUP;
    }
    P("/* symred generated CUDA kernel: fused two-product, F formed in tiles of %d x %d, times B\n"
      " * formula: ",
      CUDA_FUSED_TI, tj);
    expr_print_to(b, k->f);
    if (k->weight) {
        P("\n * weight: ");
        expr_print_to(b, k->weight);
    }
    P("\n * reduction: %s, axis %d, dtype %s, accumulation %s\n */\n", sr_reductions[k->red].name,
      k->axis, f32 ? "float" : "double", jit_acc_names[acc]);
    jit_cuda_prelude(k, acc, b);
    P("struct sr_args { const void *p[%d]; };\n", k->nargs + 1);
    P("#define SR_TJ %d\n#define SR_FBS %d\n#define SR_FTI %d\n#define SR_FRC %d\n"
      "#define SR_FR %d\n#define SR_FNCOL %d\n#define SR_FLD (SR_TJ + 1)\n"
      "#define SR_FSP (SR_FBS / SR_FTI)\n\n",
      tj, CUDA_FUSED_BS, CUDA_FUSED_TI, CUDA_FUSED_RC, R, nd.ncol > 0 ? nd.ncol : 1);
    if (dot)
        P("#define SR_GD %d\n#define SR_GK %d\n#define SR_GKP (SR_GK + 1)\n"
          "#define SR_GQ ((SR_TJ + 15) / 16)\n#define SR_GLD SR_FLD\n\n",
          dd, CUDA_FUSED_GK);
    P("extern \"C\" __global__ void __launch_bounds__(SR_FBS)\n" CUDA_KERNEL_FUSED
      "(const sr_args sr_a, const long long no, const long long nr, const long long chunk,\n"
      "              sr_t *__restrict__ out, sr_acc *__restrict__ part,\n"
      "              const long long *__restrict__ sr_lb, const long long *__restrict__ sr_iv)\n{\n"
      "    __shared__ sr_t tb[SR_FNCOL * SR_TJ];\n"
      "    __shared__ sr_t sr_F[SR_FTI * SR_FLD];\n"
      "    __shared__ sr_t sr_B[SR_TJ * SR_FRC];\n");
    if (dot)
        P("    __shared__ sr_t sr_U[SR_FTI * SR_GKP], sr_W[SR_TJ * SR_GKP];\n");
    if (ssmw)
        P("    __shared__ sr_t sr_m[SR_FTI];\n    __shared__ sr_acc sr_s[SR_FTI], "
          "sr_sa[SR_FTI], sr_pr[SR_FBS];\n");
    jit_cuda_emit_block(k, b, "SR_FTI", "sr_o0");
    P("    const int sr_tid = threadIdx.x, sr_tx = sr_tid %% 16, sr_ty = sr_tid / 16;\n"
      "    const int sr_c0 = blockIdx.y * SR_FRC;\n"
      "    /* The row whose pairs this thread forms (clamped: rows past the end are formed from\n"
      "     * the last row, and never written). */\n"
      "    const int sr_fi = sr_tid / (SR_FBS / SR_FTI), sr_fj = sr_tid %% (SR_FBS / SR_FTI);\n"
      "    const long long o = sr_o0 + sr_fi < sr_oe ? sr_o0 + sr_fi : sr_oe - 1;\n"
      "    (void)o; (void)tb;\n");
    P("    /* per call */\n%s", nd.uniform.data ? nd.uniform.data : "");
    P("    /* per output row */\n%s", nd.outer.data ? nd.outer.data : "");
    P("    sr_acc sr_w[4][4];\n"
      "SR_UNROLL\n    for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "        for (int q = 0; q < 4; q++) sr_w[p][q] = 0;\n");
    if (ab)
        P("    sr_acc sr_fs[4] = {0, 0, 0, 0}; /* the rows' sums of F, for A's term */\n");
    if (ab || m.cf)
        P("    bool sr_any = false; /* whether the block saw a reduced index */\n");
    if (ssmw)
        P("    if (sr_tid < SR_FTI) { sr_m[sr_tid] = -SR_INF; sr_s[sr_tid] = 0; }\n");
    P("    for (long long sr_q = sr_q0; sr_q < sr_q1; sr_q++) {\n"
      "    const long long sr_r0 = sr_lb ? sr_iv[2 * sr_q] : (long long)blockIdx.z * chunk;\n"
      "    const long long sr_r1 = sr_lb ? sr_iv[2 * sr_q + 1]\n"
      "                                  : (nr < sr_r0 + chunk ? nr : sr_r0 + chunk);\n"
      "    for (long long rt = sr_r0; rt < sr_r1; rt += SR_TJ) {\n"
      "      const int nj = (int)(sr_r1 - rt < SR_TJ ? sr_r1 - rt : SR_TJ);\n%s"
      "      __syncthreads();\n"
      "      for (int jj = threadIdx.x; jj < nj; jj += SR_FBS) {\n"
      "        const long long r = rt + jj;\n        (void)r;\n%s"
      "      }\n"
      "      for (int sr_e = threadIdx.x; sr_e < SR_TJ * SR_FRC; sr_e += SR_FBS) {\n"
      "        const int jj = sr_e / SR_FRC, sr_c = sr_c0 + sr_e %% SR_FRC;\n"
      "        (void)jj, (void)sr_c;\n",
      ab || m.cf ? "      sr_any = true;\n" : "", nd.inner.data ? nd.inner.data : "");
    if (m.bf) {
        /* B's formula: per reduced index of the tile, its nodes once, then the block's columns */
        P("        if (jj >= nj || sr_c >= SR_FR) sr_B[sr_e] = (sr_t)0;\n      }\n"
          "      for (int jj = threadIdx.x; jj < nj; jj += SR_FBS)\n");
        side_eval(b, &nb, "rt + jj",
                  "for (int sr_c = sr_c0; sr_c < SR_FR && sr_c < sr_c0 + SR_FRC; sr_c++) {",
                  "sr_B[jj * SR_FRC + sr_c - sr_c0] = (sr_t)sr_v;");
    } else {
        P("        sr_B[sr_e] = jj < nj && sr_c < SR_FR ? a%d[(rt + jj) * SR_FR + sr_c] : "
          "(sr_t)0;\n      }\n",
          bvar);
    }
    if (dot)
        emit_dot_tile(b, uvar, wvar);
    P("      __syncthreads();\n"
      "%s"
      "      for (int jj = sr_fj; jj < nj; jj += SR_FBS / SR_FTI) {\n%s"
      "        sr_F[sr_fi * SR_FLD + jj] = (sr_t)(%s);\n"
      "      }\n"
      "      __syncthreads();\n",
      dot ? "      const long long o0 = o - sr_fi, r0 = rt;\n"
            "      const sr_t *sr_gt = sr_F; /* the tile of inner products */\n"
            "      (void)o0, (void)r0, (void)sr_gt;\n"
          : "",
      nd.pair.data ? nd.pair.data : "", nd.f[0]);
    if (ssmw)
        /* The online softmax of the tile, SR_FBS / SR_FTI threads per row, each on every
         * such index of the tile: the partial maxima, then the row's maximum and the partial
         * sums of exp(F - m) through sr_pr; the row's first thread adds the partial sums in
         * order and updates the row's state once every thread has read it. The rescale factor
         * sr_a1 is the online softmax's one rule (cpu_softmax_grow, src/cpu/red-rules.h) in the
         * kernel's types. */
        P("      {\n"
          "        const int sr_sr = sr_tid / SR_FSP, sr_sp = sr_tid %% SR_FSP;\n"
          "        sr_t *sr_fr = sr_F + sr_sr * SR_FLD, sr_tm = -SR_INF;\n"
          "        for (int jj = sr_sp; jj < nj; jj += SR_FSP)\n"
          "          sr_tm = sr_fr[jj] > sr_tm ? sr_fr[jj] : sr_tm;\n"
          "        sr_pr[sr_tid] = (sr_acc)sr_tm;\n"
          "        __syncthreads();\n"
          "        for (int t = 0; t < SR_FSP; t++) {\n"
          "          const sr_t sr_x = (sr_t)sr_pr[sr_sr * SR_FSP + t];\n"
          "          sr_tm = sr_x > sr_tm ? sr_x : sr_tm;\n        }\n"
          "        const sr_t sr_mo = sr_m[sr_sr], sr_mn = sr_tm > sr_mo ? sr_tm : sr_mo;\n"
          "        const sr_acc sr_a1 = sr_mn > sr_mo && sr_mo > -SR_INF ? (sr_acc)sr_exp(sr_mo - "
          "sr_mn) : (sr_acc)1;\n"
          "        sr_acc sr_ts = 0;\n"
          "        for (int jj = sr_sp; jj < nj; jj += SR_FSP) {\n"
          "          const sr_t sr_x = sr_fr[jj] == -SR_INF ? (sr_t)0 : sr_exp(sr_fr[jj] - "
          "sr_mn);\n"
          "          sr_fr[jj] = sr_x;\n          sr_ts += (sr_acc)sr_x;\n        }\n"
          "        __syncthreads();\n"
          "        sr_pr[sr_tid] = sr_ts;\n"
          "        __syncthreads();\n"
          "        if (sr_sp == 0) {\n"
          "          sr_acc sr_s1 = 0;\n"
          "          for (int t = 0; t < SR_FSP; t++) sr_s1 += sr_pr[sr_tid + t];\n"
          "          sr_m[sr_sr] = sr_mn;\n"
          "          sr_s[sr_sr] = sr_s[sr_sr] * sr_a1 + sr_s1;\n"
          "          sr_sa[sr_sr] = sr_a1;\n        }\n      }\n"
          "      __syncthreads();\n");
    P("      sr_acc sr_p[4][4];\n"
      "SR_UNROLL\n      for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "        for (int q = 0; q < 4; q++) sr_p[p][q] = 0;\n%s"
      "      for (int jj = 0; jj < nj; jj++) {\n"
      "        sr_acc sr_f[4], sr_g[4];\n"
      "SR_UNROLL\n        for (int p = 0; p < 4; p++) sr_f[p] = (sr_acc)sr_F[(sr_ty + 16 * p) * "
      "SR_FLD + jj];\n%s"
      "SR_UNROLL\n        for (int q = 0; q < 4; q++) sr_g[q] = (sr_acc)sr_B[jj * SR_FRC + sr_tx + "
      "16 * q];\n"
      "SR_UNROLL\n        for (int p = 0; p < 4; p++)\nSR_UNROLL\n"
      "          for (int q = 0; q < 4; q++) sr_p[p][q] = fma(sr_f[p], sr_g[q], sr_p[p][q]);\n"
      "      }\n"
      "SR_UNROLL\n      for (int p = 0; p < 4; p++) {\n%s",
      ab ? "      sr_acc sr_ps[4] = {0, 0, 0, 0};\n" : "",
      ab ? "SR_UNROLL\n        for (int p = 0; p < 4; p++) sr_ps[p] += sr_f[p];\n" : "",
      ab ? "        sr_fs[p] += sr_ps[p];\n" : "");
    if (ssmw)
        P("        const sr_acc sr_r1 = sr_sa[sr_ty + 16 * p];\n"
          "SR_UNROLL\n        for (int q = 0; q < 4; q++) sr_w[p][q] = sr_w[p][q] * sr_r1 + "
          "sr_p[p][q];\n");
    else
        P("SR_UNROLL\n        for (int q = 0; q < 4; q++) sr_w[p][q] += sr_p[p][q];\n");
    /* The rows' sums were written by other threads (and, with no reduced index, only set). */
    P("      }\n    }\n    }\n    __syncthreads();\n");
    P("SR_UNROLL\n    for (int p = 0; p < 4; p++) {\n"
      "      const long long sr_row = sr_o0 + sr_ty + 16 * p;\n"
      "      if (sr_row >= sr_oe) break;\n");
    /* Split of the reduced range (part non-NULL): the chunk's unnormalised row (and, for
     * SumSoftMaxWeight, its maximum and sum) into record z * no + row of SR_FR + 2 values. */
    P("      sr_acc *sr_rec = part ? part + ((long long)blockIdx.z * no + sr_row) * (SR_FR + 2) : "
      "0;\n");
    if (ssmw)
        P("      const sr_acc sr_den = sr_s[sr_ty + 16 * p];\n"
          "      if (sr_rec && blockIdx.y == 0 && sr_tx == 0) {\n"
          "        sr_rec[SR_FR] = (sr_acc)sr_m[sr_ty + 16 * p];\n"
          "        sr_rec[SR_FR + 1] = sr_den;\n      }\n");
    /* C's values in the thread's columns of the row (1 where the block saw no reduced index:
     * the sum is 0 whatever C is) */
    if (m.cf) {
        P("      sr_acc sr_cv[4] = {1, 1, 1, 1};\n      if (sr_any)\n");
        side_eval(b, &nc, "sr_row",
                  "for (int q = 0; q < 4; q++) {\n          const int sr_c = sr_c0 + sr_tx + 16 * "
                  "q;\n          if (sr_c >= SR_FR) continue;",
                  "sr_cv[q] = sr_v;");
    }
    P("SR_UNROLL\n      for (int q = 0; q < 4; q++) {\n"
      "        const int sr_c = sr_c0 + sr_tx + 16 * q;\n"
      "        if (sr_c >= SR_FR) continue;\n%s",
      m.cf ? "        sr_w[p][q] *= sr_cv[q];\n" : "");
    /* A's term, linear in the row's sum of F (so that the chunks' records add up); none where
     * the block saw no reduced index, whose sum is 0 whatever A is. */
    if (ab)
        P("        if (sr_any) sr_w[p][q] = %ssr_w[p][q] %c (sr_acc)a%d[sr_row * SR_FR + sr_c] * "
          "sr_fs[p];\n",
          m.bsign < 0 ? "-" : "", m.asign < 0 ? '-' : '+', m.avar);
    P("        if (sr_rec) sr_rec[sr_c] = sr_w[p][q];\n"
      "        else out[sr_row * SR_FR + sr_c] = (sr_t)(sr_w[p][q]%s);\n"
      "      }\n    }\n}\n\n",
      ssmw ? " / sr_den" : "");
    /* The combine kernel: one thread per row merges the chunks in order. */
    P("extern \"C\" __global__ void " CUDA_KERNEL_FUSED_COMBINE
      "(const sr_acc *part, const long long no, const int nsplit,\n"
      "             sr_t *out, long long *out_idx)\n{\n"
      "    const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
      "    (void)out_idx;\n"
      "    if (o >= no) return;\n");
    if (ssmw)
        /* The reference's merge (ssmw_fold): each chunk scaled by exp(m_z - m), 1 when m_z is
         * the maximum, so that a chunk of -inf terms adds its 0 * G (NaN for infinite G). */
        P("    sr_acc sr_m = -SR_INF, sr_s = 0;\n"
          "    for (int z = 0; z < nsplit; z++) {\n"
          "      const sr_acc mz = part[((long long)z * no + o) * (SR_FR + 2) + SR_FR];\n"
          "      sr_m = mz > sr_m ? mz : sr_m;\n    }\n"
          "    for (int z = 0; z < nsplit; z++) {\n"
          "      const sr_acc *rz = part + ((long long)z * no + o) * (SR_FR + 2);\n"
          "      sr_s += rz[SR_FR + 1] * (rz[SR_FR] == sr_m ? (sr_acc)1 : (sr_acc)exp(rz[SR_FR] - "
          "sr_m));\n    }\n");
    P("    for (int c = 0; c < SR_FR; c++) {\n"
      "      sr_acc sr_v = 0;\n"
      "      for (int z = 0; z < nsplit; z++) {\n"
      "        const sr_acc *rz = part + ((long long)z * no + o) * (SR_FR + 2);\n");
    if (ssmw)
        P("        sr_v += rz[c] * (rz[SR_FR] == sr_m ? (sr_acc)1 : (sr_acc)exp(rz[SR_FR] - "
          "sr_m));\n");
    else
        P("        sr_v += rz[c];\n");
    P("      }\n      out[o * SR_FR + c] = (sr_t)(sr_v%s);\n    }\n}\n", ssmw ? " / sr_s" : "");
    if (plan) {
        memset(plan, 0, sizeof *plan);
        plan->block = CUDA_FUSED_TI; /* output rows per block, for the launch blocks of ranges */
        plan->tile = tj;
        plan->columns = nd.ncol;
        plan->shared_bytes = shared;
        plan->state_bytes = (R + 2) * as; /* one row's record of a chunk (split) */
        plan->pair_nodes = nd.npair;
        plan->hoisted_outer = nd.nouter;
        plan->hoisted_inner = nd.ninner;
    }
    if (fp) {
        fp->bvar = bvar;
        fp->avar = m.avar;
        fp->cfactor = m.cf != NULL;
        fp->R = R;
        fp->block = CUDA_FUSED_BS;
        fp->ti = CUDA_FUSED_TI;
        fp->tj = tj;
        fp->rc = CUDA_FUSED_RC;
        fp->columns = nd.ncol;
        fp->shared_bytes = shared;
        fp->pair_nodes = nd.npair;
        fp->dot = dd;
        fp->uvar = uvar;
        fp->wvar = wvar;
    }
    jit_nodes_free(&nd);
    jit_nodes_free(&nb);
    jit_nodes_free(&nc);
    return b->oom ? SR_ENOMEM : SR_OK;
}
