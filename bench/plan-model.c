/*
 * plan-model.c — the measurements behind the CPU planner's cost model (src/cpu/cost.c): time
 * per (i, j) pair on one thread of each strategy on the jobs that decide the crossovers, next to
 * the planner's estimate for the same kernel (the "est." of its plan line in explain).
 *
 * Each job is built three times in one process: in a context with SYMRED_GEMM=off (the direct
 * strategy), with SYMRED_GEMM=on (a tile strategy, fused two-product or gemm-epilogue, where the
 * formula allows one, whatever the estimates) and with the default options (the planner's
 * choice). Every context runs one thread (SYMRED_NUM_THREADS=1), so the figures are per-thread
 * rates as the model's constants are. Each time is the best of --reps runs after a warm-up, the
 * three kernels alternating.
 * Jobs, float32:
 *   gauss R   Sum of Exp(-SqDist(x, y) g) b, D = 3, b of width R (the direct/fused crossover)
 *   attn R    SumSoftMaxWeight of (q|k) s with weight v of width R, D = 64
 *   knn D     ArgKMin (k = 5) of SqDist at dimension D (the direct/gemm-epilogue crossover)
 * The constants are fitted by hand from the printed ns per pair (docs/architecture.md, "The
 * cost model"): the direct strategy's ns per flop from gauss R = 1, the fused two-product's
 * per-pair overhead and product rate from gauss R = 16 and 64 and attn, the gemm-epilogue's from
 * knn.
 *
 * Usage: plan-model [--n N] [--reps R]
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum job { GAUSS, ATTN, KNN };

static sr_ctx *ctx_new(const char *gemm)
{
    sr_ctx *c;
    if (sr_ctx_new(&c) != SR_OK || sr_ctx_set_option(c, "SYMRED_NUM_THREADS", "1") != SR_OK ||
        (gemm && sr_ctx_set_option(c, "SYMRED_GEMM", gemm) != SR_OK)) {
        fprintf(stderr, "plan-model: cannot set up a context\n");
        exit(1);
    }
    return c;
}

static sr_kernel *job_kernel(sr_ctx *c, enum job j, int w)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_expr *f;
    if (j == GAUSS) {
        sr_expr *x = sr_vi(c, 0, 3), *y = sr_vj(c, 1, 3), *b = sr_vj(c, 2, w), *g = sr_pm(c, 3, 1);
        f = sr_mul(c, sr_exp(c, sr_neg(c, sr_mul(c, sr_sqdist(c, x, y), g))), b);
    } else if (j == ATTN) {
        sr_expr *q = sr_vi(c, 0, 64), *k = sr_vj(c, 1, 64), *s = sr_pm(c, 3, 1);
        f = sr_mul(c, sr_scalprod(c, q, k), s);
        d.reduction = SR_SUMSOFTMAXWEIGHT;
        d.weight = sr_vj(c, 2, w);
    } else {
        f = sr_sqdist(c, sr_vi(c, 0, w), sr_vj(c, 1, w));
        d.reduction = SR_ARGKMIN;
        d.k = 5;
    }
    sr_kernel *k;
    if (sr_kernel_new(c, f, &d, &k) != SR_OK) {
        fprintf(stderr, "plan-model: %s\n", sr_ctx_error(c));
        exit(1);
    }
    return k;
}

/* The chosen plan's strategy and estimate (sr_kernel_plan_candidate), into buf. */
static void chosen_line(sr_kernel *k, char *buf, size_t n)
{
    sr_plan_candidate c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    if (bench_plan(k).plans < 1 || sr_kernel_plan_candidate(k, 0, &c) != SR_OK || !c.chosen) {
        snprintf(buf, n, "?");
        return;
    }
    snprintf(buf, n,
             "%s: est. %.3g ns per pair (%.0f flops per pair in the tile product + %.0f "
             "in generated code)",
             sr_strategy_name(c.strategy), c.est_ns, c.gemm_flops, c.flops);
}

static double run_best(sr_kernel *k, int64_t n, const void **args, void *out, int reps)
{
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t = bench_now();
        if (sr_kernel_run(k, n, n, args, out) != SR_OK) {
            fprintf(stderr, "plan-model: run failed\n");
            exit(1);
        }
        t = bench_now() - t;
        if (r > 0 && t < best)
            best = t; /* run 0 warms up */
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t n = 4000;
    int reps = 3;
    for (int a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--n"))
            n = atoll(argv[a + 1]);
        else if (!strcmp(argv[a], "--reps"))
            reps = atoi(argv[a + 1]);
    }
    sr_ctx *off = ctx_new("off"), *on = ctx_new("on"), *dflt = ctx_new(NULL);
    static const struct {
        enum job j;
        int w;
        const char *name;
    } jobs[] = {{GAUSS, 1, "gauss"},  {GAUSS, 2, "gauss"}, {GAUSS, 3, "gauss"},
                {GAUSS, 4, "gauss"},  {GAUSS, 8, "gauss"}, {GAUSS, 16, "gauss"},
                {GAUSS, 64, "gauss"}, {ATTN, 1, "attn"},   {ATTN, 16, "attn"},
                {ATTN, 64, "attn"},   {KNN, 16, "knn"},    {KNN, 32, "knn"},
                {KNN, 64, "knn"}};
    uint64_t s = 1;
    int64_t cap = n * 64;
    float *x = bench_alloc((size_t)cap * 4), *y = bench_alloc((size_t)cap * 4);
    float *b = bench_alloc((size_t)cap * 4), *out = bench_alloc((size_t)cap * 8), g = 0.5f;
    for (int64_t t = 0; t < cap; t++) {
        x[t] = (float)bench_uniform(&s);
        y[t] = (float)bench_uniform(&s);
        b[t] = (float)bench_uniform(&s);
    }
    const void *args[4] = {x, y, b, &g};
    printf("n = m = %lld, 1 thread, float32, best of %d; ns per pair\n", (long long)n, reps);
    printf("%-6s %5s %8s %8s %8s  %s\n", "job", "width", "direct", "tile", "planner",
           "planner's choice");
    for (size_t t = 0; t < sizeof jobs / sizeof jobs[0]; t++) {
        sr_kernel *kd = job_kernel(off, jobs[t].j, jobs[t].w);
        sr_kernel *kt = job_kernel(on, jobs[t].j, jobs[t].w);
        sr_kernel *kp = job_kernel(dflt, jobs[t].j, jobs[t].w);
        double td = 1e30, tt = 1e30, tp = 1e30;
        for (int r = 0; r < reps; r++) { /* alternating, so the machine's load hits all */
            double a = run_best(kd, n, args, out, 1), b2 = run_best(kt, n, args, out, 1);
            double c = run_best(kp, n, args, out, 1);
            td = a < td ? a : td;
            tt = b2 < tt ? b2 : tt;
            tp = c < tp ? c : tp;
        }
        char line[200];
        chosen_line(kp, line, sizeof line);
        double pairs = (double)n * (double)n;
        printf("%-6s %5d %8.3f %8.3f %8.3f  %s\n", jobs[t].name, jobs[t].w, td / pairs * 1e9,
               tt / pairs * 1e9, tp / pairs * 1e9, line);
        sr_kernel_free(kd);
        sr_kernel_free(kt);
        sr_kernel_free(kp);
    }
    free(x);
    free(y);
    free(b);
    free(out);
    sr_ctx_free(off);
    sr_ctx_free(on);
    sr_ctx_free(dflt);
    return 0;
}
