/*
 * bench-budget.c — a GP kernel mat-vec in float64 at a size whose kernel matrix could never be
 * held (n = 1e5: 80 GB dense), under a 64 MB memory budget, with the peak resident set size.
 *
 *     out_i = sum_j exp(-g |x_i - y_j|^2) b_j,   x_i, y_j in R^D, float64
 *
 * The budget is set with sr_ctx_set_mem_limit (the same as SYMRED_MEM_LIMIT=64MB); the kernel's
 * workspace is printed from sr_kernel_workspace_bytes, the peak RSS from getrusage, and rows of
 * the result are checked against a plain double-precision loop (--rows of them, spread over the
 * output).
 *
 * Usage: bench-budget [n [D]] [--budget BYTES] [--rows R]   (default n = 100000, D = 3)
 * With SYMRED_BENCH_RECORD set, the figures are appended to that file as data (bench/record.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include "bench.h"
#include "record.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double *randd(int64_t n, uint64_t *s)
{
    double *p = bench_alloc(sizeof *p * (size_t)n);
    for (int64_t t = 0; t < n; t++)
        p[t] = bench_uniform(s);
    return p;
}

int main(int argc, char **argv)
{
    long long n = 100000, D = 3, budget = 64000000, rows = 20;
    int npos = 0;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--budget") == 0 && a + 1 < argc)
            budget = atoll(argv[++a]);
        else if (strcmp(argv[a], "--rows") == 0 && a + 1 < argc)
            rows = atoll(argv[++a]);
        else if (argv[a][0] != '-' && npos < 2)
            *(npos++ == 0 ? &n : &D) = atoll(argv[a]);
        else {
            fprintf(stderr, "usage: bench-budget [n [D]] [--budget BYTES] [--rows R]\n");
            return 2;
        }
    }
    bench_record rec;
    bench_record_open(&rec, "bench-budget", argc, argv);
    sr_ctx *ctx;
    sr_ctx_new(&ctx);
    sr_ctx_set_mem_limit(ctx, budget);
    char ax[32], ay[32];
    snprintf(ax, sizeof ax, "x=Vi(%lld)", D);
    snprintf(ay, sizeof ay, "y=Vj(%lld)", D);
    const char *aliases[] = {ax, ay, "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f;
    sr_kernel *k;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    if (sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", aliases, 4, &f) != SR_OK ||
        sr_kernel_new(ctx, f, &d, &k) != SR_OK) {
        fprintf(stderr, "bench-budget: %s\n", sr_ctx_error(ctx));
        return 1;
    }
    uint64_t s = 7;
    double *x = randd(n * D, &s), *y = randd(n * D, &s), *b = randd(n, &s), g = 2.0;
    double *out = bench_alloc(sizeof *out * (size_t)n);
    const void *args[] = {x, y, b, &g};
    double t0 = bench_now();
    if (sr_kernel_run(k, n, n, args, out) != SR_OK) {
        fprintf(stderr, "bench-budget: %s\n", sr_ctx_error(ctx));
        return 1;
    }
    double dt = bench_now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double inputs_mb = (double)(2 * n * D + 2 * n) * 8 / 1e6;
    double err = 0;
    for (long long r = 0; r < rows; r++) {
        long long i = r * (n / rows);
        double acc = 0;
        for (long long j = 0; j < n; j++) {
            double d2 = 0;
            for (long long c = 0; c < D; c++)
                d2 += (x[i * D + c] - y[j * D + c]) * (x[i * D + c] - y[j * D + c]);
            acc += exp(-d2 * g) * b[j];
        }
        err = fmax(err, fabs(acc - out[i]) / fmax(fabs(acc), 1e-300));
    }
    printf("GP mat-vec float64, n = %lld, D = %lld (dense kernel matrix: %.1f GB)\n", n, D,
           (double)n * (double)n * 8 / 1e9);
    printf("budget %lld bytes; kernel workspace %lld bytes; inputs + output %.1f MB\n", budget,
           (long long)sr_kernel_workspace_bytes(k), inputs_mb);
    printf("time %.2f s (%.2f G pairs/s); peak RSS (getrusage) %.1f MB\n", dt,
           (double)n * (double)n / dt / 1e9, (double)ru.ru_maxrss / 1024.0);
    printf("check: %lld rows against a double loop, max relative error %.2e %s\n", rows, err,
           err < 1e-10 ? "ok" : "FAILED");
    bench_record_row(&rec,
                     "\"n\": %lld, \"D\": %lld, \"dense_gb\": %.1f, \"budget_bytes\": %lld, "
                     "\"workspace_bytes\": %lld, \"inputs_mb\": %.1f, \"seconds\": %.3f, "
                     "\"gpairs_per_s\": %.3f, \"peak_rss_mb\": %.1f, \"check_rows\": %lld, "
                     "\"max_rel_err\": %.2e",
                     n, D, (double)n * (double)n * 8 / 1e9, budget,
                     (long long)sr_kernel_workspace_bytes(k), inputs_mb, dt,
                     (double)n * (double)n / dt / 1e9, (double)ru.ru_maxrss / 1024.0, rows, err);
    bench_record_close(&rec);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    free(x);
    free(y);
    free(b);
    free(out);
    return err < 1e-10 ? 0 : 1;
}
