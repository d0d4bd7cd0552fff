/*
 * bench-gauss.c — symred's CPU JIT against a hand-written OpenMP + simd loop on the Gaussian
 * kernel mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j (D = 3, float32).
 *
 * Usage: bench-gauss [N] [reps]     (N = M, default 40000)
 *
 * Prints, in one run: G pairs/s of symred and of the hand loop (handloop.c, compiled with the
 * same flags as the JIT), their ratio and the largest relative difference of the results; the
 * cold first-call latency (sr_kernel_new with an empty SYMRED_CACHE_DIR: emit + compile + load,
 * then the first run); and the warm kernel creation time (a new context, the same kernel, from
 * the disk cache). The temporary cache directory is removed at the end.
 */
#define _GNU_SOURCE
#include "symred.h"

#include "bench.h"
#include "record.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void bench_hand_gauss(int64_t n, int64_t m, const float *x, const float *y, const float *b, float g,
                      float *out);

static const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
static const char *formula = "Exp(-SqDist(x,y)*g)*b";

static sr_kernel *make(sr_ctx **ctx, double *seconds)
{
    sr_expr *f;
    if (sr_ctx_new(ctx) != SR_OK || sr_parse(*ctx, formula, aliases, 4, &f) != SR_OK) {
        fprintf(stderr, "setup failed: %s\n", sr_ctx_error(*ctx));
        exit(1);
    }
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k;
    double t0 = bench_now();
    if (sr_kernel_new(*ctx, f, &d, &k) != SR_OK) {
        fprintf(stderr, "sr_kernel_new: %s\n", sr_ctx_error(*ctx));
        exit(1);
    }
    *seconds = bench_now() - t0;
    return k;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 40000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || reps < 1) {
        fprintf(stderr, "usage: %s [N] [reps]\n", argv[0]);
        return 2;
    }
    char dir[] = "/tmp/symred-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("SYMRED_CACHE_DIR", dir, 1);
    bench_record rec;
    bench_record_open(&rec, "bench-gauss", argc, argv);

    float *x = bench_alloc(sizeof(float) * 3 * n), *y = bench_alloc(sizeof(float) * 3 * n);
    float *b = bench_alloc(sizeof(float) * n), *o1 = bench_alloc(sizeof(float) * n);
    float *o2 = bench_alloc(sizeof(float) * n), g = 2.0f;
    uint64_t s = 88172645463325252ULL;
    for (int64_t i = 0; i < 3 * n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((s >> 40) * (1.0 / 16777216.0));
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        y[i] = (float)((s >> 40) * (1.0 / 16777216.0));
    }
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        b[i] = (float)((s >> 40) * (1.0 / 16777216.0));
    }
    const void *args[] = {x, y, b, &g};

    /* Cold: empty cache directory. */
    sr_ctx *ctx;
    double t_cold_new;
    sr_kernel *k = make(&ctx, &t_cold_new);
    double t0 = bench_now();
    sr_kernel_run(k, n, n, args, o1);
    double t_first_run = bench_now() - t0;

    /* Warm: a new context, the same kernel, from the disk cache. */
    sr_ctx *ctx2;
    double t_warm_new;
    sr_kernel *k2 = make(&ctx2, &t_warm_new);
    int disk_hit = strstr(sr_kernel_explain(k2), "module: disk") != NULL;

    double best_sr = 1e30, best_hand = 1e30;
    bench_hand_gauss(n, n, x, y, b, g, o2); /* warm up the OpenMP threads */
    for (int r = 0; r < reps; r++) {
        t0 = bench_now();
        sr_kernel_run(k2, n, n, args, o1);
        double t = bench_now() - t0;
        best_sr = t < best_sr ? t : best_sr;
        t0 = bench_now();
        bench_hand_gauss(n, n, x, y, b, g, o2);
        t = bench_now() - t0;
        best_hand = t < best_hand ? t : best_hand;
    }
    double maxrel = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)o1[i] - o2[i]) / (fabs((double)o2[i]) + 1e-3);
        maxrel = d > maxrel ? d : maxrel;
    }
    double pairs = (double)n * (double)n;
    printf("gaussian mat-vec, D=3, float32, N=M=%lld, best of %d\n", (long long)n, reps);
    printf("symred:    %.3f G pairs/s (%.4f s)\n", pairs / best_sr * 1e-9, best_sr);
    printf("hand loop: %.3f G pairs/s (%.4f s)\n", pairs / best_hand * 1e-9, best_hand);
    printf("ratio symred/hand: %.3f   (max rel. difference %.2e)\n", best_hand / best_sr, maxrel);
    printf("cold first call: sr_kernel_new %.1f ms (emit + compile + load) + first run %.1f ms\n",
           t_cold_new * 1e3, t_first_run * 1e3);
    printf("warm kernel creation (new context, disk cache%s): %.2f ms\n",
           disk_hit ? " hit" : ": NOT a hit", t_warm_new * 1e3);

    bench_record_row(&rec,
                     "\"N\": %lld, \"reps\": %d, \"symred_gpairs\": %.3f, \"hand_gpairs\": %.3f, "
                     "\"symred_over_hand\": %.3f, \"cold_ms\": %.1f, \"warm_ms\": %.2f",
                     (long long)n, reps, pairs / best_sr * 1e-9, pairs / best_hand * 1e-9,
                     best_hand / best_sr, t_cold_new * 1e3, t_warm_new * 1e3);
    bench_record_close(&rec);
    sr_kernel_free(k);
    sr_kernel_free(k2);
    sr_ctx_free(ctx);
    sr_ctx_free(ctx2);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(x), free(y), free(b), free(o1), free(o2);
    return 0;
}
