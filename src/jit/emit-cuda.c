/*
 * emit-cuda.c — lowers a kernel to CUDA C++ for NVRTC: the direct strategy.
 *
 * The formula's code comes from the C emitter (jit_emit_nodes in emit-c.c): the same placement
 * of every node (per call, per output row, per reduced index, per pair), the same names and the
 * same op spellings, with a few CUDA overrides (cuda_spell). This file only writes the skeleton
 * around it:
 *   - each thread owns one output row o (threads of a block: consecutive rows);
 *   - the reduced indices are walked in tiles of SR_TJ: the block computes the inner nodes of a
 *     tile cooperatively into shared memory (structure of arrays, tb[column * SR_TJ + jj]),
 *     then every thread folds the tile into its row's state, which lives in registers;
 *   - Sum accumulates each tile into a partial sum first (block summation; Kahan or a double
 *     accumulator on request), Min/Max/Arg keep the first extreme or the first NaN, KMin/ArgKMin
 *     keep a sorted list in registers (insertion by bubbling, ties keep the lower index),
 *     LogSumExp and SumSoftMaxWeight rescale online by the running maximum — each family's
 *     fold rule of emit-state.c (the rules of docs/semantics.md, shared with the C kernels);
 *   - split-j: blockIdx.y takes a chunk of the reduced indices and writes its row states to a
 *     workspace; sr_cuda_combine merges the chunks of each row in index order and finalises.
 *     The runtime uses it when there are too few rows to fill the GPU.
 */
#include "cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P(...) expr_buf_printf(b, __VA_ARGS__)

/* The CUDA spellings that differ from C's: the cuda column of the op table (expr.h). */
static const char *const cuda_spell[] = {
#define CUDA_SPELL_ENTRY_(id, name, arity, nattr, dimrule, infix, flops, c, cuda) [OP_##id] = cuda,
    EXPR_OP_MAP(CUDA_SPELL_ENTRY_)
#undef CUDA_SPELL_ENTRY_
};
_Static_assert(sizeof cuda_spell / sizeof *cuda_spell == OP_COUNT, "a CUDA spelling per op");

/* Largest K * D of the K-reductions: their state lives in registers (or local memory). */
#define CUDA_MAX_KD 256
/* Static shared memory we allow ourselves (every device has 48 KiB per block). */
#define CUDA_SHARED_MAX (40 << 10)

/* Component c's index as text, in buf (16 bytes). */
static const char *cidx(int c, char *buf)
{
    snprintf(buf, 16, "%d", c);
    return buf;
}

static void prelude(struct expr_buf *b, bool f32, const char *acc_t)
{
    const char *t = f32 ? "float" : "double";
    /* NVRTC has no stdint.h; the shared state code (emit-state.c) uses int64_t. */
    P("typedef long long int64_t;\n");
    P("#define SR_FN static __device__ __forceinline__\n#define SR_UNROLL _Pragma(\"unroll\")\n");
    P("typedef %s sr_t;\ntypedef %s sr_acc;\n", t, acc_t);
    /* The arrays are of the computing type (the 16-bit dtypes reach CUDA widened). */
    P("typedef sr_t sr_io;\n#define SR_LD(x) (x)\n#define SR_ST(x) (x)\n");
    if (f32)
        P("#define SR_INF __int_as_float(0x7f800000)\n#define SR_NAN __int_as_float(0x7fc00000)\n");
    else
        P("#define SR_INF __longlong_as_double(0x7ff0000000000000LL)\n"
          "#define SR_NAN __longlong_as_double(0x7ff8000000000000LL)\n");
    /* The C emitter spells infinite and NaN constants with GCC builtins, which NVRTC lacks. */
    P("#define __builtin_inf() __longlong_as_double(0x7ff0000000000000LL)\n"
      "#define __builtin_nan(s) __longlong_as_double(0x7ff8000000000000LL)\n"
      "#define __builtin_inff() __int_as_float(0x7f800000)\n"
      "#define __builtin_nanf(s) __int_as_float(0x7fc00000)\n");
    P("static __device__ __forceinline__ sr_t sr_sq(sr_t a) { return a * a; }\n"
      "#define SR_FMA(a, b, c) fma(a, b, c)\n");
    /* The C spelling of Exp calls sr_exp (emit-c.c works around libmvec there); CUDA's exp has
     * no slow underflow path. */
    P("static __device__ __forceinline__ sr_t sr_exp(sr_t a) { return exp(a); }\n");
    /* The complex ops' names for sin and cos (emit-c.c keeps gcc from merging them there). */
    P("static __device__ __forceinline__ sr_t sr_sin(sr_t a) { return sin(a); }\n");
    P("static __device__ __forceinline__ sr_t sr_cos(sr_t a) { return cos(a); }\n\n");
}

sr_status jit_emit_cuda(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                        struct cuda_plan *plan)
{
    const bool f32 = k->dtype == SR_F32;
    const sr_reduction red = k->red;
    const int D = k->fdim, K = k->k, DG = k->weight ? k->weight->dim : 0;
    const int ts = f32 ? 4 : 8;
    if (!f32 && acc == JIT_ACC_F64)
        acc = JIT_ACC_BLOCK; /* float64 kernels accumulate in float64 anyway */
    const char *A = (f32 && acc != JIT_ACC_F64) ? "float" : "double";
    const enum sr_red_family fam = sr_reductions[red].family;
    if (fam == SR_RED_FAM_KSEL && (int64_t)K * D > CUDA_MAX_KD)
        return SR_ENOTSUP;

    struct jit_nodes nd;
    sr_status st = jit_emit_nodes(k, cuda_spell, &nd);
    if (st != SR_OK)
        return st;

    /* Tile: one reduced index per thread when the columns fit in shared memory; fewer for wide
     * columns, down to one. */
    int BS = 128, TJ = 128;
    int ncol = nd.ncol;
    while (TJ > 1 && (int64_t)TJ * ncol * ts > CUDA_SHARED_MAX)
        TJ /= 2;
    if ((int64_t)TJ * ncol * ts > CUDA_SHARED_MAX) {
        jit_nodes_free(&nd);
        return SR_ENOTSUP;
    }

    P("/* symred generated CUDA kernel\n * formula: ");
    expr_print_to(b, k->f);
    if (k->weight) {
        P("\n * weight: ");
        expr_print_to(b, k->weight);
    }
    P("\n * reduction: %s, axis %d, k %d, dtype %s, accumulation %s\n */\n",
      sr_reductions[red].name, k->axis, K, f32 ? "float" : "double", jit_acc_names[acc]);
    prelude(b, f32, A);
    P("#define SR_TJ %d\n#define SR_BS %d\n#define SR_D %d\n#define SR_K %d\n#define SR_DG %d\n"
      "#define SR_OUTD %d\n#define SR_NCOL %d\n\n",
      TJ, BS, D, K, DG, k->out_dim, ncol > 0 ? ncol : 1);
    P("struct sr_args { const void *p[%d]; };\n", k->nargs + 1);

    /* ---- state, init, fold helpers, per-row merge and final: shared with C ---- */
    st = jit_emit_state(k, acc, b);
    if (st != SR_OK) {
        jit_nodes_free(&nd);
        return st;
    }

    /* ---- the main kernel ---- */
    P("extern \"C\" __global__ void __launch_bounds__(SR_BS)\n" CUDA_KERNEL_MAIN
      "(const sr_args sr_a, const long long no, const long long nr, const long long chunk,\n"
      "             sr_t *__restrict__ out, long long *__restrict__ out_idx, sr_state *part,\n"
      "             const long long *__restrict__ sr_lb, const long long *__restrict__ sr_iv)\n"
      "{\n");
    P("    __shared__ sr_t tb[SR_NCOL * SR_TJ];\n");
    /* Dense: block x covers rows [x BS, x BS + BS) of [0, no) and the chunk y of the reduced
     * range. Block-sparse ranges: rows of one range block, at most SR_BS of them; every thread
     * of a block sees the same intervals, so the tiles are shared as in the dense case. */
    jit_cuda_emit_block(k, b, "SR_BS", "sr_ob");
    P("    const long long sr_o = sr_ob + threadIdx.x;\n"
      "    const bool sr_active = sr_o < sr_oe;\n"
      "    /* Threads past the block's last row compute that row (so they read valid memory and\n"
      "     * can help load the tiles) and write nothing. */\n"
      "    const long long o = sr_active ? sr_o : sr_oe - 1;\n"
      "    (void)o; (void)tb;\n");
    P("    /* per call */\n%s", nd.uniform.data ? nd.uniform.data : "");
    P("    /* per output row */\n%s", nd.outer.data ? nd.outer.data : "");
    P("    sr_state st;\n    st_init(&st);\n");
    P("    for (long long sr_q = sr_q0; sr_q < sr_q1; sr_q++) {\n"
      "    const long long sr_r0 = sr_lb ? sr_iv[2 * sr_q] : (long long)blockIdx.y * chunk;\n"
      "    const long long sr_r1 = sr_lb ? sr_iv[2 * sr_q + 1]\n"
      "                                  : (nr < sr_r0 + chunk ? nr : sr_r0 + chunk);\n"
      "    for (long long rt = sr_r0; rt < sr_r1; rt += SR_TJ) {\n"
      "      const int nj = (int)(sr_r1 - rt < SR_TJ ? sr_r1 - rt : SR_TJ);\n"
      "      __syncthreads();\n"
      "      for (int jj = threadIdx.x; jj < nj; jj += SR_BS) {\n"
      "        const long long r = rt + jj;\n        (void)r;\n%s"
      "      }\n"
      "      __syncthreads();\n"
      "      if (!sr_active) continue;\n",
      nd.inner.data ? nd.inner.data : "");
    const char *pair = nd.pair.data ? nd.pair.data : "";
    char num[16], pnum[24]; /* component c's index and partial sum, unrolled */
    if (fam == SR_RED_FAM_SUM) {
        /* A wide F (nd.floop) sums into an array, in loops over its components. */
        if (nd.floop)
            P("      sr_acc sr_p[SR_D];\n"
              "      for (int sr_c = 0; sr_c < SR_D; sr_c++) sr_p[sr_c] = 0;\n"
              "      for (int jj = 0; jj < nj; jj++) {\n%s"
              "        for (int sr_c = 0; sr_c < SR_D; sr_c++) sr_p[sr_c] += (sr_acc)(%s);\n"
              "      }\n"
              "      for (int sr_c = 0; sr_c < SR_D; sr_c++)\n",
              pair, nd.floop);
        else {
            P("      sr_acc ");
            for (int c = 0; c < D; c++)
                P("%ssr_p%d = 0", c ? ", " : "", c);
            P(";\n      for (int jj = 0; jj < nj; jj++) {\n%s", pair);
            for (int c = 0; c < D; c++)
                P("        sr_p%d += (sr_acc)(%s);\n", c, nd.f[c]);
            P("      }\n");
        }
        for (int c = 0; c < (nd.floop ? 1 : D); c++) {
            const char *ci = nd.floop ? "sr_c" : cidx(c, num);
            snprintf(pnum, sizeof pnum, "sr_p%d", c);
            P("      ");
            jit_emit_fold(k, acc, b, "st.", ci, nd.floop ? "sr_p[sr_c]" : pnum, NULL);
            P("\n");
        }
    } else {
        P("      for (int jj = 0; jj < nj; jj++) {\n%s", pair);
        P("        const long long sr_r = rt + jj;\n        (void)sr_r;\n");
        /* A wide F (nd.floop): one loop over its components, c the loop index sr_c. */
        if (nd.floop)
            P("        for (int sr_c = 0; sr_c < SR_D; sr_c++)\n");
        for (int c = 0; c < (nd.floop ? 1 : D); c++) {
            const char *ci = nd.floop ? "sr_c" : cidx(c, num);
            P("        {\n        const sr_t sr_v = %s;\n", nd.floop ? nd.floop : nd.f[c]);
            if (fam == SR_RED_FAM_SSMW) { /* D == 1; the weight's values for the fold */
                P("        sr_acc sr_g[SR_DG];\n");
                if (nd.wloop)
                    P("        for (int sr_c = 0; sr_c < SR_DG; sr_c++) sr_g[sr_c] = "
                      "(sr_acc)(%s);\n",
                      nd.wloop);
                else
                    for (int g = 0; g < DG; g++)
                        P("        sr_g[%d] = (sr_acc)(%s);\n", g, nd.w[g]);
            }
            P("        ");
            jit_emit_fold(k, acc, b, "st.", ci, "sr_v", "sr_r");
            P("\n");
            P("        }\n");
        }
        P("      }\n");
    }
    P("    }\n    }\n"
      "    if (!sr_active) return;\n"
      "    if (part) part[(long long)blockIdx.y * no + o] = st;\n"
      "    else st_final(&st, o, out, out_idx);\n}\n\n");

    /* ---- the combine kernel of split-j ---- */
    P("extern \"C\" __global__ void " CUDA_KERNEL_COMBINE
      "(const sr_state *part, const long long no, const int nsplit,\n"
      "             sr_t *out, long long *out_idx)\n{\n"
      "    const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
      "    if (o >= no) return;\n"
      "    sr_state d = part[o];\n"
      "    sr_t tm[SR_K]; int64_t ti[SR_K]; /* st_merge's scratch (K-reductions) */\n"
      "    for (int y = 1; y < nsplit; y++) st_merge(&d, &part[(long long)y * no + o], tm, ti);\n"
      "    st_final(&d, o, out, out_idx);\n}\n");

    if (plan) {
        plan->block = BS;
        plan->tile = TJ;
        plan->columns = nd.ncol;
        plan->shared_bytes = (ncol > 0 ? ncol : 1) * TJ * ts;
        plan->state_bytes = (int)jit_state_bytes(k, acc);
        plan->pair_nodes = nd.npair;
        plan->hoisted_outer = nd.nouter;
        plan->hoisted_inner = nd.ninner;
    }
    jit_nodes_free(&nd);
    return b->oom ? SR_ENOMEM : SR_OK;
}

const char *const *jit_cuda_spell(void) { return cuda_spell; }

void jit_cuda_emit_block(const struct sr_kernel *k, struct expr_buf *b, const char *rows,
                         const char *first)
{
    for (int v = 0; v < k->nargs; v++)
        if (k->vars[v].dim)
            P("    const sr_t *__restrict__ a%d = (const sr_t *)sr_a.p[%d];\n", v, v);
    P("    long long %s = (long long)blockIdx.x * %s, sr_oe = no, sr_q0 = 0, sr_q1 = 1;\n"
      "    if (sr_lb) {\n"
      "        %s = sr_lb[4 * blockIdx.x]; sr_oe = sr_lb[4 * blockIdx.x + 1];\n"
      "        sr_q0 = sr_lb[4 * blockIdx.x + 2]; sr_q1 = sr_lb[4 * blockIdx.x + 3];\n"
      "    }\n",
      first, rows, first);
}

void jit_cuda_prelude(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b)
{
    const bool f32 = k->dtype == SR_F32;
    prelude(b, f32, f32 && acc == JIT_ACC_F64 ? "double" : f32 ? "float" : "double");
}
