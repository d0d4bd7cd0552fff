/*
 * bench-gemm.c — the gemm-epilogue strategy against the direct strategy, over the dimension D,
 * so that the crossover (GEMM_MIN_DIM in src/cpu/gemm.c) is visible, plus random-data kNN.
 *
 * Both strategies run the same simplified formula in the same process: the direct one with
 * SYMRED_GEMM=off, the gemm-epilogue one with SYMRED_GEMM=on (the planner's own choice, auto,
 * is printed too). Two jobs:
 *   matvec: Gaussian kernel mat-vec out_i = sum_j exp(-(|x_i|^2 + |y_j|^2 - 2 <x_i, y_j>) / D) b_j
 *           written with the inner product (so both strategies apply at every D), float32;
 *   knn:    ArgKMin (k = 10) of SqDist, random uniform data, float32 (SqDist is rewritten to
 *           norms + inner product from D = SR_GEMM_MIN_DIM = 24; below, only the direct
 *           strategy applies).
 *
 * The tile's gemm is symred's AVX-512 one where the CPU has it (SYMRED_GEMM_KERNEL=auto) and
 * BLIS with SYMRED_GEMM_KERNEL=blis; the mat-vec table times both, and its GFLOP/s (2 D flops per
 * pair, the inner product) are given as a fraction of the FMA peak measured in the same run
 * (fma-peak.c, all threads).
 *
 * --fashion-mnist: exact kNN on Fashion-MNIST instead (60 000 training images as points, the
 * 10 000 test images as queries, D = 784, ArgKMin k = 10, float32), between two FMA-peak runs:
 * each gemm kernel R times (--reps R, default 3), min / median time, GFLOP/s (2 D nq np / t)
 * and their fraction of the peak, and whether the two kernels' neighbour sets agree (up to
 * float32 ties, checked in double precision). Each fraction is given twice: wall-clock GFLOP/s
 * over the wall-clock peak, and GFLOP per CPU-second over the peak's GFLOP per CPU-second (the
 * machine is shared; CPU time leaves out what other processes take). --no-blis: the AVX-512
 * gemm only.
 *
 * --dims D,D,...: the mat-vec table at those D only (no kNN table); --no-blis: without BLIS;
 * --cpu-time: the table's times in CPU seconds of the process, its % of the peak per CPU-second;
 * --scale S: S times the mat-vec's pairs (N = M up to 30 000 unless --gemm-only, which skips the
 * direct strategy).
 *
 * Usage: bench-gemm [--quick] [--no-blis] [--gemm-only] [--cpu-time] [--scale S] [--dims D,...]
 *                   [--knn-n N]...
 *        bench-gemm --fashion-mnist [--reps R] [--no-blis]
 * Prints tables; times are the best of 3 runs unless said otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include "bench.h"
#include "record.h"
#include "fma-peak.h"

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

/* --cpu-time: the mat-vec table's times are CPU seconds of the process (all threads) and its
 * peak is per CPU-second, so that other processes' load on the shared machine does not count. */
static int use_cpu_time;

/* Per-run figures of timed_kern: wall time, the mean wall-clock FMA peak around the run, and the
 * run's CPU time with the mean per-CPU-second peak around it. */
struct run_times {
    double *wall, *peak, *cpu, *cpu_peak;
};

/* Best of reps runs of the kernel built with SYMRED_GEMM=mode and SYMRED_GEMM_KERNEL=kern;
 * strategy name in strat. When rt is not NULL, every run's figures go there, and every run sits
 * between two short FMA-peak runs whose mean is its yardstick (the machine is shared: its speed
 * changes from one second to the next, so each run gets its own). */
static double timed_kern(sr_ctx *ctx, sr_expr *f, const sr_kernel_desc *d, const char *mode,
                         const char *kern, int64_t nx, int64_t ny, const void *const *args,
                         void *out, int reps, char *strat, const struct run_times *rt)
{
    setenv("SYMRED_GEMM", mode, 1);
    setenv("SYMRED_GEMM_KERNEL", kern, 1);
    sr_kernel *k;
    if (sr_kernel_new(ctx, f, d, &k) != SR_OK) {
        fprintf(stderr, "bench-gemm: %s\n", sr_ctx_error(ctx));
        exit(1);
    }
    sr_plan_info plan = {0};
    plan.size = sizeof plan;
    sr_kernel_plan(k, &plan);
    /* The pair work's strategy (a reduction rewrite's inner kernel's); "fused" for either fused
     * two-product. */
    snprintf(strat, 16, "%s",
             plan.inner == SR_STRATEGY_GEMM_EPILOGUE                                  ? "gemm"
             : plan.inner == SR_STRATEGY_FUSED || plan.inner == SR_STRATEGY_SYMMETRIC ? "fused"
                                                                                      : plan.name);
    double best = 1e30, c0 = 0, c1 = 0, p0 = rt ? bench_fma_peak(0.5, NULL, &c0) : 0;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now(), u0 = bench_cpu_now();
        if (sr_kernel_run(k, nx, ny, args, out) != SR_OK) {
            fprintf(stderr, "bench-gemm: %s\n", sr_ctx_error(ctx));
            exit(1);
        }
        double t = bench_now() - t0, u = bench_cpu_now() - u0;
        best = (use_cpu_time ? u : t) < best ? (use_cpu_time ? u : t) : best;
        if (rt) {
            double p1 = bench_fma_peak(0.5, NULL, &c1);
            rt->wall[r] = t;
            rt->peak[r] = (p0 + p1) / 2;
            rt->cpu[r] = u;
            rt->cpu_peak[r] = (c0 + c1) / 2;
            p0 = p1;
            c0 = c1;
        }
    }
    sr_kernel_free(k);
    return best;
}

static double timed(sr_ctx *ctx, sr_expr *f, const sr_kernel_desc *d, const char *mode, int64_t nx,
                    int64_t ny, const void *const *args, void *out, int reps, char *strat)
{
    return timed_kern(ctx, f, d, mode, "auto", nx, ny, args, out, reps, strat, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The first n images of a gzip-compressed IDX file, scaled to [0, 1]; NULL if unreadable. */
static float *read_idx(const char *path, int64_t n, int64_t *dim)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *fp = popen(cmd, "r");
    if (!fp)
        return NULL;
    unsigned char h[16];
    float *a = NULL;
    if (fread(h, 1, 16, fp) == 16 && h[2] == 8 && h[3] == 3) {
        *dim = (int64_t)(h[8] << 24 | h[9] << 16 | h[10] << 8 | h[11]) *
               (int64_t)(h[12] << 24 | h[13] << 16 | h[14] << 8 | h[15]);
        size_t bytes = (size_t)(n * *dim);
        unsigned char *raw = bench_alloc(bytes);
        if (fread(raw, 1, bytes, fp) == bytes) {
            a = bench_alloc(bytes * sizeof *a);
            for (size_t t = 0; t < bytes; t++)
                a[t] = raw[t] / 255.0f;
        }
        free(raw);
    }
    pclose(fp);
    return a;
}

static double sqdist_f64(const float *a, const float *b, int64_t dim)
{
    double s = 0;
    for (int64_t c = 0; c < dim; c++)
        s += ((double)a[c] - b[c]) * ((double)a[c] - b[c]);
    return s;
}

/* The 1, 5 and 15 minute load averages, "?" where /proc/loadavg cannot be read. */
static const char *loadavg(void)
{
    static char buf[64];
    FILE *fp = fopen("/proc/loadavg", "r");
    float a = 0, b = 0, c = 0;
    if (!fp || fscanf(fp, "%f %f %f", &a, &b, &c) != 3)
        snprintf(buf, sizeof buf, "?");
    else
        snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
    if (fp)
        fclose(fp);
    return buf;
}

/* kNN on Fashion-MNIST with the AVX-512 gemm (and with BLIS when nkern is 2), between two
 * FMA-peak runs. */
static int fashion_mnist(sr_ctx *ctx, int reps, int nkern, bench_record *rec)
{
    const char *dir = "/usr/share/datasets/fashion-mnist";
    char pp[256], pq[256];
    snprintf(pp, sizeof pp, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(pq, sizeof pq, "%s/t10k-images-idx3-ubyte.gz", dir);
    int64_t np = 60000, nq = 10000, D = 0, D2 = 0;
    float *xp = read_idx(pp, np, &D), *xq = read_idx(pq, nq, &D2);
    if (!xp || !xq || D != D2) {
        fprintf(stderr,
                "bench-gemm: cannot read Fashion-MNIST from %s (Debian package "
                "dataset-fashion-mnist)\n",
                dir);
        return 1;
    }
    int K = 10, width;
    double flops = 2.0 * (double)D * (double)np * (double)nq;
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, (int)D), sr_vj(ctx, 1, (int)D));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = K;
    const void *args[] = {xq, xp};
    static const char *const kerns[] = {"auto", "blis"};
    int64_t *idx[2] = {NULL, NULL};
    double med[2], best[2];
    bench_fma_peak(0.1, &width, NULL);
    printf("kNN Fashion-MNIST, %lld points x %lld queries, D = %lld, k = %d, float32; each run "
           "between two FMA-peak runs (float32, %d-bit, all threads), its fraction of their "
           "mean, in wall-clock time and in CPU time (GFLOP per CPU-second: what other processes "
           "take from this one does not count); load average %s\n",
           (long long)np, (long long)nq, (long long)D, K, width, loadavg());
    printf("%-16s %4s %9s %9s %11s %8s %9s %8s\n", "gemm kernel", "run", "time (s)", "GFLOP/s",
           "peak GF/s", "% peak", "CPU (s)", "% CPU pk");
    static const char *const names[] = {"symred AVX-512", "BLIS"};
    struct run_times rt = {
        bench_alloc(sizeof(double) * (size_t)reps), bench_alloc(sizeof(double) * (size_t)reps),
        bench_alloc(sizeof(double) * (size_t)reps), bench_alloc(sizeof(double) * (size_t)reps)};
    double *frac = bench_alloc(sizeof *frac * (size_t)reps);
    double *cfrac = bench_alloc(sizeof *cfrac * (size_t)reps);
    double medfrac[2], maxfrac[2], medcfrac[2];
    for (int q = 0; q < nkern; q++) {
        idx[q] = bench_alloc(sizeof *idx[q] * (size_t)(nq * K));
        char strat[16];
        best[q] = timed_kern(ctx, f, &d, "auto", kerns[q], nq, np, args, idx[q], reps, strat, &rt);
        for (int r = 0; r < reps; r++) {
            frac[r] = flops / rt.wall[r] / 1e9 / rt.peak[r];
            cfrac[r] = flops / rt.cpu[r] / 1e9 / rt.cpu_peak[r];
            printf("%-16s %4d %9.3f %9.1f %11.1f %7.1f%% %9.3f %7.1f%%\n", names[q], r + 1,
                   rt.wall[r], flops / rt.wall[r] / 1e9, rt.peak[r], 100 * frac[r], rt.cpu[r],
                   100 * cfrac[r]);
        }
        qsort(rt.wall, (size_t)reps, sizeof *rt.wall, cmp_double);
        qsort(frac, (size_t)reps, sizeof *frac, cmp_double);
        qsort(cfrac, (size_t)reps, sizeof *cfrac, cmp_double);
        med[q] = rt.wall[reps / 2];
        medfrac[q] = frac[reps / 2];
        maxfrac[q] = frac[reps - 1];
        medcfrac[q] = cfrac[reps / 2];
    }
    free(rt.wall);
    free(rt.peak);
    free(rt.cpu);
    free(rt.cpu_peak);
    free(frac);
    free(cfrac);
    printf("\n%-16s %9s %9s %12s %12s %10s %10s %10s\n", "gemm kernel", "min (s)", "med (s)",
           "GFLOP/s max", "GFLOP/s med", "%peak med", "%peak max", "%CPU med");
    for (int q = 0; q < nkern; q++)
        printf("%-16s %9.3f %9.3f %12.1f %12.1f %9.1f%% %9.1f%% %9.1f%%\n", names[q], best[q],
               med[q], flops / best[q] / 1e9, flops / med[q] / 1e9, 100 * medfrac[q],
               100 * maxfrac[q], 100 * medcfrac[q]);
    printf("load average at the end: %s\n", loadavg());
    for (int q = 0; q < nkern; q++)
        bench_record_row(rec,
                         "\"table\": \"fashion-mnist\", \"kernel\": \"%s\", \"n\": %lld, "
                         "\"m\": %lld, \"D\": %lld, \"k\": %d, \"min_s\": %.4f, "
                         "\"median_s\": %.4f, \"peak_fraction_median\": %.3f, "
                         "\"cpu_peak_fraction_median\": %.3f",
                         names[q], (long long)np, (long long)nq, (long long)D, K, best[q], med[q],
                         medfrac[q], medcfrac[q]);
    if (nkern < 2) {
        free(idx[0]);
        free(xp);
        free(xq);
        return 0;
    }
    printf("AVX-512 / BLIS speed (min times): %.2f\n", best[1] / best[0]);
    /* The neighbour sets: the same, or different only where distances tie within float32. */
    int64_t differ = 0, untied = 0;
    for (int64_t i = 0; i < nq; i++) {
        const int64_t *a = idx[0] + i * K, *b = idx[1] + i * K;
        int same = 1;
        for (int r = 0; r < K && same; r++)
            same = a[r] == b[r];
        if (same)
            continue;
        differ++;
        for (int r = 0; r < K; r++) {
            double da = sqdist_f64(xq + i * D, xp + a[r] * D, D);
            double db = sqdist_f64(xq + i * D, xp + b[r] * D, D);
            if (fabs(da - db) > 1e-5 * (da + db + 1)) {
                untied++;
                break;
            }
        }
    }
    printf("neighbour lists that differ between the kernels: %lld of %lld, %lld of them beyond "
           "float32 ties\n",
           (long long)differ, (long long)nq, (long long)untied);
    free(idx[0]);
    free(idx[1]);
    free(xp);
    free(xq);
    return untied != 0;
}

int main(int argc, char **argv)
{
    int quick = 0, fmnist = 0, fm_reps = 3, fm_kerns = 2, ndims = 12, matvec_only = 0,
        gemm_only = 0;
    double scale = 1;
    int dims[12] = {8, 12, 16, 20, 24, 32, 48, 64, 128, 256, 512, 1024};
    int64_t knn_n[4] = {100000, 0, 0, 0};
    int nknn = 0;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[a], "--fashion-mnist") == 0)
            fmnist = 1;
        else if (strcmp(argv[a], "--no-blis") == 0)
            fm_kerns = 1;
        else if (strcmp(argv[a], "--reps") == 0 && a + 1 < argc && atoi(argv[a + 1]) > 0)
            fm_reps = atoi(argv[++a]);
        else if (strcmp(argv[a], "--gemm-only") == 0)
            gemm_only = 1;
        else if (strcmp(argv[a], "--scale") == 0 && a + 1 < argc && atof(argv[a + 1]) > 0)
            scale = atof(argv[++a]);
        else if (strcmp(argv[a], "--cpu-time") == 0)
            use_cpu_time = 1;
        else if (strcmp(argv[a], "--dims") == 0 && a + 1 < argc) {
            ndims = 0;
            matvec_only = 1;
            for (char *p = argv[++a]; *p && ndims < 12; p += *p == ',')
                dims[ndims++] = (int)strtol(p, &p, 10);
        } else if (strcmp(argv[a], "--knn-n") == 0 && a + 1 < argc && nknn < 4)
            knn_n[nknn++] = atoll(argv[++a]);
        else {
            fprintf(stderr, "usage: bench-gemm [--quick] [--no-blis] [--cpu-time] [--dims D,D,...] "
                            "[--knn-n N]... "
                            "| bench-gemm --fashion-mnist [--reps R] [--no-blis]\n");
            return 2;
        }
    }
    if (nknn == 0)
        nknn = 1;
    bench_record rec;
    bench_record_open(&rec, "bench-gemm", argc, argv);
    sr_ctx *ctx;
    sr_ctx_new(&ctx);
    if (fmnist) {
        int rc = fashion_mnist(ctx, fm_reps, fm_kerns, &rec);
        bench_record_close(&rec);
        sr_ctx_free(ctx);
        return rc;
    }
    uint64_t seed = 42;
    int reps = quick ? 1 : 3, width;
    double flop_budget = (quick ? 2e9 : 2e10) * scale;
    double cpu_peak, peak = bench_fma_peak(1.0, &width, &cpu_peak);
    printf("FMA peak (float32, %d-bit, all threads): %.1f GFLOP/s, %.1f GFLOP per CPU-second; "
           "load average %s\n\n",
           width, peak, cpu_peak, loadavg());
    if (use_cpu_time) {
        peak = cpu_peak;
        printf("times below: CPU seconds of the process (all threads), %% peak per CPU-second\n");
    }

    printf("Gaussian mat-vec via the inner product, float32, N = M = sqrt(%.0e / 2D) (best of "
           "%d)\n",
           flop_budget, reps);
    printf("%6s %7s %11s %11s %11s %8s %8s %8s %8s\n", "D", "N", "direct (s)", "avx512 (s)",
           "blis (s)", "dir/avx", "blis/avx", "% peak", "auto");
    for (int t = 0; t < ndims; t++) {
        int D = dims[t];
        if (D < 1)
            continue;
        int64_t n = (int64_t)sqrt(flop_budget / (2.0 * D));
        if (n > 30000 && !gemm_only)
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
        double td = gemm_only ? NAN : timed(ctx, f, &d, "off", n, n, args, out, reps, s1);
        double tg = timed(ctx, f, &d, "on", n, n, args, out, reps, s2);
        double tb = fm_kerns == 2
                        ? timed_kern(ctx, f, &d, "on", "blis", n, n, args, out, reps, s2, NULL)
                        : NAN;
        timed(ctx, f, &d, "auto", n, n, args, out, 1, s3);
        printf("%6d %7lld %11.3f %11.3f %11.3f %8.2f %8.2f %7.1f%% %8s\n", D, (long long)n, td, tg,
               tb, td / tg, tb / tg, 100 * 2.0 * D * (double)n * (double)n / tg / 1e9 / peak, s3);
        bench_record_row(&rec,
                         "\"table\": \"matvec\", \"D\": %d, \"N\": %lld, \"direct_s\": %.4f, "
                         "\"avx512_s\": %.4f, \"blis_s\": %.4f, \"auto\": \"%s\", "
                         "\"cpu_time\": %d",
                         D, (long long)n, isnan(td) ? -1.0 : td, tg, isnan(tb) ? -1.0 : tb, s3,
                         use_cpu_time);
        free(x);
        free(y);
        free(b);
        free(out);
    }

    if (matvec_only) { /* --dims: the mat-vec table only */
        bench_record_close(&rec);
        unsetenv("SYMRED_GEMM");
        unsetenv("SYMRED_GEMM_KERNEL");
        sr_ctx_free(ctx);
        return 0;
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
            bench_record_row(&rec,
                             "\"table\": \"knn\", \"n\": %lld, \"m\": %lld, \"D\": %d, "
                             "\"direct_s\": %.4f, \"gemm_s\": %.4f, \"auto\": \"%s\"",
                             (long long)np, (long long)nq, D, td,
                             strcmp(s2, "gemm") == 0 ? tg : -1.0, s3);
            if (strcmp(s2, "gemm") == 0)
                printf("%9lld %6d %12.3f %12.3f %8.2f %8s\n", (long long)np, D, td, tg, td / tg,
                       s3);
            else
                printf("%9lld %6d %12.3f %12s %8s %8s\n", (long long)np, D, td, "n/a", "", s3);
            free(xq);
            free(xp);
            free(idx);
        }
    bench_record_close(&rec);
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_GEMM_KERNEL");
    sr_ctx_free(ctx);
    return 0;
}
