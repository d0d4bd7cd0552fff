/*
 * cost.c — the CPU strategies' cost model: the estimated time per (i, j) pair on one thread by
 * which the planner ranks the candidates (struct sr_plan's est_ns; docs/architecture.md).
 *
 *   time = NS_ARITH x a x (1 + a / ARITH_REGS), a the arithmetic flop-equivalents per pair of
 *                    generated code (the simplifier's count of the pair nodes, hoisted terms
 *                    left out): long formulas spill registers, so a pair costs more per flop
 *        + NS_TRANS x the flop-equivalents of transcendental functions (Exp, Log, Sin, ...:
 *                    10 to 20 per value in the simplifier's count)
 *        + NS_GEMM x flops of the tile products (the gemm micro-kernels; a product by B of R
 *                    columns costs as one of at least 16, the micro-kernels' panel); NS_STRIP
 *                    for symred's AVX2 strip products (the Gaussian at D = 784 times a 3-wide
 *                    b: 0.046 ns per flop on the fused two-product's strips, 0.043 on the
 *                    gemm-epilogue's BLIS)
 *        + NS_TILE_PAIR per pass of a pair through a tile in memory (written, packed, read; a
 *                    tile past L2, the gemm-epilogue's 2 MiB of inner products, counts twice)
 *        + NS_PACK x values packed per pair (operands' panels, once per block of rows)
 *        + NS_TILE / (ti tj) (a tile's calls and bookkeeping)
 *        + the direct strategy's accumulators: NS_OUT per output value per pair for the first
 *                    OUT_REGS = 8 values, NS_OUT_WIDE for the others (AVX2's 16 vector registers
 *                    hold the accumulators beside F's values: past 8 they spill)
 *        + NS_FOLD_SOFTMAX (+ NS_FOLD_WEIGHT per weight value) for the SumSoftMaxWeight and
 *                    LogSumExp folds of generated code (the direct strategy's, which is also the
 *                    gemm-epilogue's): F and the weight buffered, Exp in a second pass
 *
 * The constants were fitted by hand to single-thread times per pair (bench/plan-model.c and the
 * runs below; float32, n = m = 3000-4000, 2-vCPU AMD EPYC with AVX2 and BLIS 0.9 zen3, load 4-8,
 * so each figure within 20-50 %): the Gaussian D = 3, direct, at R = 1, 2, 4, 8, 16, 64: 6.2,
 * 5.6, 6.7, 8.5, 14.7, 75.7 ns; fused two-product at R = 4, 8, 16, 64: 6.6, 7.2, 9.8, 13.8;
 * Sum (x - y) g b (3 flops per value, the sum-factor rewrite: 3 outputs), direct 0.19-0.23,
 * fused 1.1-1.3; attention D = 64, R = 1, 2, 4: fused 5.6-7.3, gemm-epilogue 5.2-13.2; the
 * Gaussian D = 32 times b 3 wide: fused 2.2-2.9, gemm-epilogue 4.1-4.3; kNN D = 16, 32, 64:
 * direct 3.0, 11.6, 60.8, gemm-epilogue (D = 32, 64) 7.0, 10.1. The model need only rank the
 * candidates of one kernel, which compute the same F: it puts the Gaussian's direct / fused
 * crossover at R = 4 (with SYMRED_GEMM=off and =on, n = m = 4000: direct 2.1-2.4, 2.4-2.7,
 * 2.5-3.2, 3.2-3.4 ns at R = 1, 2, 3, 4; fused 3.0-3.1, 2.9-3.5, 3.4, 3.0-3.1) and the
 * attention's fused two-product ahead of the gemm-epilogue from R = 1. The accumulators past 8
 * are fitted to SGPR's derivative form (SqDist(z,x) + q) Exp(-g SqDist(z,x)) Exp(-g q), q an M-wide
 * formula of x, one thread, 640 x 4000 pairs (x 2000 at M = 20, 100), load 0.4-1: direct at M = 5,
 * 10, 20, 100 (float64) 4.4-4.5, 12.3-12.5, 41.8, 69.2 ns (at M = 100 the emitter's loop mode); at
 * M = 5, 10 (float32) 1.8-2.2, 4.0-4.4; its sum split's two fused parts together at M = 5, 10
 * (float64) 6.0-6.1, 6.7-7.1, (float32) 2.8-3.5, 3.0-3.3, at M = 20, 100 (float64) 8.5, 17.4. So
 * the split wins from M = 10 (estimates 7.8 + 7.7 against 16.4 direct) and the direct plan stays at
 * M = 5 (9.35).
 */
#include "../formulas/formulas.h"
#include "cpu.h"

#include <stdlib.h>

#define NS_ARITH        0.04  /* per arithmetic flop-equivalent of generated code */
#define ARITH_REGS      48    /* the flops per pair from which the cost per flop doubles */
#define NS_TRANS        0.5   /* per transcendental flop-equivalent (5 ns per Exp) */
#define NS_GEMM         0.03  /* per flop of the tile products */
#define NS_STRIP        0.032 /* the same by symred's AVX2 strip products */
#define NS_TILE_PAIR    1.2   /* per pair written to a tile in memory and read back */
#define NS_PACK         0.3   /* per value packed */
#define NS_TILE         2000  /* per tile: the module's call, the micro-kernels' start-up */
#define NS_OUT          0.55  /* per output value per pair accumulated by the direct strategy */
#define NS_OUT_WIDE     2.0   /* the same past OUT_REGS values per pair */
#define NS_FOLD_SOFTMAX 8.0   /* SumSoftMaxWeight's and LogSumExp's buffered second pass */
#define NS_FOLD_WEIGHT  0.5   /* the same per weight value */
#define OUT_REGS        8     /* accumulators that AVX2's 16 vector registers hold beside F */
#define PANEL           16

void cpu_cost_gen(const sr_expr *const *roots, int nroots, const sr_expr *skip, struct cpu_cost *c)
{
    for (int r = 0; r < nroots; r++) {
        if (!roots[r])
            continue;
        size_t n = expr_toposort(roots[r], NULL, 0);
        const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
        if (!order)
            return; /* out of memory: an estimate without this formula */
        expr_toposort(roots[r], order, n);
        for (size_t t = 0; t < n; t++) {
            const sr_expr *e = order[t];
            if (e == skip || (e->deps & (DEP_I | DEP_J)) != (DEP_I | DEP_J))
                continue; /* the tile's inner product, or a hoisted term */
            if (expr_ops[e->op].flops.trans)
                c->trans += simp_op_flops(e);
            else
                c->arith += simp_op_flops(e);
        }
        free(order);
    }
}

double cpu_cost_ns(const struct cpu_cost *c)
{
    double t = NS_ARITH * c->arith * (1 + c->arith / ARITH_REGS) + NS_TRANS * c->trans +
               NS_GEMM * c->gemm_flops + NS_STRIP * c->strip_flops + NS_TILE_PAIR * c->tile_passes +
               NS_PACK * c->pack_per_pair;
    if (c->ti > 0 && c->tj > 0)
        t += NS_TILE * (c->tile_passes > 1 ? c->tile_passes : 1) / ((double)c->ti * c->tj);
    double o = c->direct_outs;
    t += o <= OUT_REGS ? NS_OUT * o : NS_OUT * OUT_REGS + NS_OUT_WIDE * (o - OUT_REGS);
    if (c->fold)
        t += NS_FOLD_SOFTMAX + NS_FOLD_WEIGHT * c->fold_weight;
    return t;
}

double cpu_cost_product_flops(int R) { return 2.0 * (R < PANEL ? PANEL : R); }

void cpu_cost_fold(const struct sr_kernel *k, struct cpu_cost *c)
{
    c->fold = k->red == SR_SUMSOFTMAXWEIGHT || k->red == SR_LOGSUMEXP;
    c->fold_weight = k->weight ? k->weight->dim : 0;
}
