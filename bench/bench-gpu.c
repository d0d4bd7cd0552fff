/*
 * bench-gpu.c — the CUDA backend's benchmarks: Gaussian mat-vec, D = 3, float32, at
 * N = 1e5, 1e6, 1e7 (nx = ny = N), and ArgKMin (k = 10) with nx = 1e6 queries, ny = 1e4 points,
 * D = 3, 10, 100, 784; wide outputs (the fused two-product strategy): the Gaussian mat-vec with
 * B of width R = 16, 64, 256 at N = 1e5 and attention, SumSoftMaxWeight((q|k) s, v) with D = 64,
 * N = 16 384, with the rate of the product's flops (2 N M R). Times are wall-clock for
 * sr_kernel_run (host arrays copied in and out, the kernel compiled beforehand), best of 3. Prints
 * one line per case and writes JSON to the file named by --json. Without a GPU it says so and exits
 * 0. The PyTorch baseline is bench/gpu_torch.py (docs/gpu.md).
 */
#define _GNU_SOURCE
#include "symred.h"

#include "bench.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void fill(float *a, int64_t n, uint64_t *s)
{
    for (int64_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        a[i] = (float)((*s >> 40) * (1.0 / (1 << 24)));
    }
}

/* Best of 3 runs of k; -1 on failure (message printed). */
static double best_run(sr_ctx *ctx, sr_kernel *k, const sr_run_desc *r)
{
    double best = -1;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now();
        if (sr_kernel_run_ex(k, r) != SR_OK) {
            fprintf(stderr, "bench-gpu: %s\n", sr_ctx_error(ctx));
            return -1;
        }
        double t = bench_now() - t0;
        if (best < 0 || t < best)
            best = t;
    }
    return best;
}

/* Runs kernel f (reduction red, weight w; arguments args of nx + ny rows) on nx x ny pairs with
 * an output of width R, prints its time and the product's rate, adds a JSON case. */
static void wide_case(sr_ctx *ctx, sr_expr *f, sr_expr *w, const void **args, int nargs, int64_t n,
                      int R, const char *name, FILE *js, const char **sep)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    d.reduction = w ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
    d.weight = w;
    sr_kernel *k;
    if (sr_kernel_new(ctx, f, &d, &k) != SR_OK) {
        printf("%s R=%d: %s\n", name, R, sr_ctx_error(ctx));
        return;
    }
    float *out = bench_alloc((size_t)n * (size_t)R * 4);
    if (!out)
        return;
    sr_run_desc r = {.nx = n, .ny = n, .nargs = nargs, .args = args, .out = out};
    double t = best_run(ctx, k, &r);
    sr_plan_info plan = {0};
    plan.size = sizeof plan;
    sr_kernel_plan(k, &plan);
    printf("%s R=%d N=%lld: %.4f s (%.0f GFLOP/s in the product, %s)\n", name, R, (long long)n, t,
           2.0 * (double)n * (double)n * R / t * 1e-9,
           plan.inner == SR_STRATEGY_FUSED ? "fused" : "direct");
    if (js)
        fprintf(js, "%s  {\"case\": \"%s\", \"R\": %d, \"N\": %lld, \"seconds\": %.6f}", *sep, name,
                R, (long long)n, t),
            *sep = ",\n";
    free(out);
    sr_kernel_free(k);
}

/* The wide-output cases: Gaussian mat-vec with R right-hand sides, and attention. */
static int wide_cases(sr_ctx *ctx, FILE *js, const char **sep, uint64_t *s)
{
    const int64_t n = 100000, na = 16384;
    const int widths[] = {16, 64, 256};
    float *x = bench_alloc((size_t)n * 12), *y = bench_alloc((size_t)n * 12),
          *b = bench_alloc((size_t)n * 256 * 4), g = 1.0f;
    if (!x || !y || !b)
        return 1;
    fill(x, 3 * n, s), fill(y, 3 * n, s), fill(b, 256 * n, s);
    for (int w = 0; w < 3; w++) {
        sr_expr *f = sr_mul(
            ctx,
            sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3)),
                                           sr_pm(ctx, 3, 1)))),
            sr_vj(ctx, 2, widths[w]));
        const void *args[] = {x, y, b, &g};
        wide_case(ctx, f, NULL, args, 4, n, widths[w], "gauss-matvec-wide", js, sep);
    }
    free(x), free(y), free(b);
    float *q = bench_alloc((size_t)na * 64 * 4), *kk = bench_alloc((size_t)na * 64 * 4),
          *v = bench_alloc((size_t)na * 64 * 4), sc = 0.125f;
    if (!q || !kk || !v)
        return 1;
    fill(q, 64 * na, s), fill(kk, 64 * na, s), fill(v, 64 * na, s);
    sr_expr *f =
        sr_mul(ctx, sr_scalprod(ctx, sr_vi(ctx, 0, 64), sr_vj(ctx, 1, 64)), sr_pm(ctx, 3, 1));
    const void *args[] = {q, kk, v, &sc};
    wide_case(ctx, f, sr_vj(ctx, 2, 64), args, 4, na, 64, "attention-d64", js, sep);
    free(q), free(kk), free(v);
    return 0;
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int64_t nmax = 10000000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc)
            nmax = atoll(argv[++i]);
    }
    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return 1;
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f;
    sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4, &f);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    if (st == SR_ENODEV) {
        printf("bench-gpu: skipped, no GPU: %s\n", sr_ctx_error(ctx));
        sr_ctx_free(ctx);
        return 0;
    }
    if (st != SR_OK) {
        fprintf(stderr, "bench-gpu: %s\n", sr_ctx_error(ctx));
        return 1;
    }
    FILE *js = json ? fopen(json, "w") : NULL;
    if (js)
        fprintf(js, "{\"cases\": [\n");
    const char *sep = "";
    uint64_t s = 1;
    for (int64_t n = 100000; n <= nmax; n *= 10) {
        float *x = bench_alloc((size_t)n * 12), *y = bench_alloc((size_t)n * 12),
              *b = bench_alloc((size_t)n * 4);
        float *out = bench_alloc((size_t)n * 4), g = 1.0f;
        if (!x || !y || !b || !out)
            return 1;
        fill(x, 3 * n, &s), fill(y, 3 * n, &s), fill(b, n, &s);
        const void *args[] = {x, y, b, &g};
        sr_run_desc r = {.nx = n, .ny = n, .nargs = 4, .args = args, .out = out};
        double t = best_run(ctx, k, &r);
        printf("gauss-matvec D=3 f32 N=%lld: %.4f s (%.1f G pairs/s)\n", (long long)n, t,
               (double)n * (double)n / t * 1e-9);
        if (js)
            fprintf(js, "%s  {\"case\": \"gauss\", \"N\": %lld, \"seconds\": %.6f}", sep,
                    (long long)n, t),
                sep = ",\n";
        free(x), free(y), free(b), free(out);
    }
    sr_kernel_free(k);
    const int dims[] = {3, 10, 100, 784};
    const int64_t nq = 1000000, np = 10000;
    for (int di = 0; di < 4; di++) {
        int D = dims[di];
        sr_expr *q = sr_vi(ctx, 0, D), *p = sr_vj(ctx, 1, D);
        sr_kernel_desc kd = sr_kernel_desc_default();
        kd.device = SR_DEVICE_CUDA;
        kd.reduction = SR_ARGKMIN;
        kd.k = 10;
        if (sr_kernel_new(ctx, sr_sqdist(ctx, q, p), &kd, &k) != SR_OK) {
            printf("knn D=%d: not supported: %s\n", D, sr_ctx_error(ctx));
            continue;
        }
        float *qs = bench_alloc((size_t)(nq * D) * 4), *ps = bench_alloc((size_t)(np * D) * 4);
        int64_t *idx = bench_alloc((size_t)nq * 10 * 8);
        if (!qs || !ps || !idx)
            return 1;
        fill(qs, nq * D, &s), fill(ps, np * D, &s);
        const void *args[] = {qs, ps};
        sr_run_desc r = {.nx = nq, .ny = np, .nargs = 2, .args = args, .out_idx = idx};
        double t = best_run(ctx, k, &r);
        printf("knn k=10 D=%d nq=%lld np=%lld: %.4f s\n", D, (long long)nq, (long long)np, t);
        if (js)
            fprintf(js, "%s  {\"case\": \"knn\", \"D\": %d, \"seconds\": %.6f}", sep, D, t),
                sep = ",\n";
        free(qs), free(ps), free(idx);
        sr_kernel_free(k);
    }
    if (wide_cases(ctx, js, &sep, &s))
        return 1;
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    sr_ctx_free(ctx);
    return 0;
}
