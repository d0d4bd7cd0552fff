/*
 * bench-gemm.c — the gemm-epilogue strategy against the direct strategy, over the dimension D,
 * so that the crossover (GEMM_MIN_DIM in src/cpu/gemm.c) is visible, plus random-data kNN.
 *
 * Both strategies run the same simplified formula in the same process: the direct one with
 * SYMRED_BLIS=off, the gemm-epilogue one with SYMRED_BLIS=on (the planner's own choice, auto,
 * is printed too). Two jobs:
 *   matvec: Gaussian kernel mat-vec out_i = sum_j exp(-(|x_i|^2 + |y_j|^2 - 2 <x_i, y_j>) / D) b_j
 *           written with the inner product (so both strategies apply at every D), float32;
 *   knn:    ArgKMin (k = 10) of SqDist, random uniform data, float32 (SqDist is rewritten to
 *           norms + inner product from D = SR_GEMM_MIN_DIM = 24; below, only the direct
 *           strategy applies).
 *
 * Usage: bench-gemm [--quick] [--knn-n N]...  Prints a table; times are the best of 3 runs.
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static float *randf(int64_t n, uint64_t *s)
{
    float *p = bench_alloc(sizeof *p * (size_t)n);
    for (int64_t t = 0; t < n; t++)
        p[t] = (float)bench_uniform(s);
    return p;
}

/* Best of reps runs of the kernel built with SYMRED_BLIS=mode; strategy name in strat. */
static double timed(sr_ctx *ctx, sr_expr *f, const sr_kernel_desc *d, const char *mode, int64_t nx,
                    int64_t ny, const void *const *args, void *out, int reps, char *strat)
{
    setenv("SYMRED_BLIS", mode, 1);
    sr_kernel *k;
    if (sr_kernel_new(ctx, f, d, &k) != SR_OK) {
        fprintf(stderr, "bench-gemm: %s\n", sr_ctx_error(ctx));
        exit(1);
    }
    const char *s = strstr(sr_kernel_explain(k), "strategy: ");
    snprintf(strat, 16, "%s", s && strncmp(s + 10, "gemm", 4) == 0 ? "gemm" : "direct");
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (sr_kernel_run(k, nx, ny, args, out) != SR_OK) {
            fprintf(stderr, "bench-gemm: %s\n", sr_ctx_error(ctx));
            exit(1);
        }
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    sr_kernel_free(k);
    return best;
}

int main(int argc, char **argv)
{
    int quick = 0;
    int64_t knn_n[4] = {100000, 0, 0, 0};
    int nknn = 0;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[a], "--knn-n") == 0 && a + 1 < argc && nknn < 4)
            knn_n[nknn++] = atoll(argv[++a]);
        else {
            fprintf(stderr, "usage: bench-gemm [--quick] [--knn-n N]...\n");
            return 2;
        }
    }
    if (nknn == 0)
        nknn = 1;
    sr_ctx *ctx;
    sr_ctx_new(&ctx);
    uint64_t seed = 42;
    int reps = quick ? 1 : 3;

    printf("Gaussian mat-vec via the inner product, float32, N = M = sqrt(%.0e / 2D) (best of "
           "%d)\n",
           quick ? 2e9 : 2e10, reps);
    printf("%6s %7s %12s %12s %8s %8s\n", "D", "N", "direct (s)", "gemm (s)", "speedup", "auto");
    static const int dims[] = {8, 16, 24, 32, 48, 64, 128, 256, 512, 1024};
    for (size_t t = 0; t < sizeof dims / sizeof *dims; t++) {
        int D = dims[t];
        int64_t n = (int64_t)sqrt((quick ? 2e9 : 2e10) / (2.0 * D));
        if (n > 30000)
            n = 30000;
        char ax[32], ay[32];
        snprintf(ax, sizeof ax, "x=Vi(%d)", D);
        snprintf(ay, sizeof ay, "y=Vj(%d)", D);
        const char *aliases[] = {ax, ay, "b=Vj(1)", "g=Pm(1)"};
        sr_expr *f;
        if (sr_parse(ctx, "Exp(-(SqNorm2(x)+SqNorm2(y)-2*(x|y))*g)*b", aliases, 4, &f) != SR_OK) {
            fprintf(stderr, "bench-gemm: %s\n", sr_ctx_error(ctx));
            return 1;
        }
        float *x = randf(n * D, &seed), *y = randf(n * D, &seed), *b = randf(n, &seed);
        float g = 1.0f / (float)D, *out = bench_alloc(sizeof *out * (size_t)n);
        const void *args[] = {x, y, b, &g};
        sr_kernel_desc d = sr_kernel_desc_default();
        char s1[16], s2[16], s3[16];
        double td = timed(ctx, f, &d, "off", n, n, args, out, reps, s1);
        double tg = timed(ctx, f, &d, "on", n, n, args, out, reps, s2);
        timed(ctx, f, &d, "auto", n, n, args, out, 1, s3);
        printf("%6d %7lld %12.3f %12.3f %8.2f %8s\n", D, (long long)n, td, tg, td / tg, s3);
        free(x);
        free(y);
        free(b);
        free(out);
    }

    printf("\nkNN (ArgKMin k = 10 of SqDist), random uniform data, float32, m = 10000 queries\n");
    printf("%9s %6s %12s %12s %8s %8s\n", "n", "D", "direct (s)", "gemm (s)", "speedup", "auto");
    static const int kdims[] = {3, 10, 100};
    for (int q = 0; q < nknn; q++)
        for (size_t t = 0; t < 3; t++) {
            int64_t np = knn_n[q], nq = quick ? 2000 : 10000;
            int D = kdims[t];
            sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, D), sr_vj(ctx, 1, D));
            float *xq = randf(nq * D, &seed), *xp = randf(np * D, &seed);
            int64_t *idx = bench_alloc(sizeof *idx * (size_t)(nq * 10));
            const void *args[] = {xq, xp};
            sr_kernel_desc d = sr_kernel_desc_default();
            d.reduction = SR_ARGKMIN;
            d.k = 10;
            char s1[16], s2[16], s3[16];
            double td = timed(ctx, f, &d, "off", nq, np, args, idx, 1, s1);
            double tg = timed(ctx, f, &d, "on", nq, np, args, idx, 1, s2);
            timed(ctx, f, &d, "auto", nq, np, args, idx, 1, s3);
            if (strcmp(s2, "gemm") == 0)
                printf("%9lld %6d %12.3f %12.3f %8.2f %8s\n", (long long)np, D, td, tg, td / tg,
                       s3);
            else
                printf("%9lld %6d %12.3f %12s %8s %8s\n", (long long)np, D, td, "n/a", "", s3);
            free(xq);
            free(xp);
            free(idx);
        }
    unsetenv("SYMRED_BLIS");
    sr_ctx_free(ctx);
    return 0;
}
