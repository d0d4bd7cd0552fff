/*
 * bench-half.c — the Gaussian kernel mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j (D = 3) on
 * the CPU in bfloat16 and float16 against float32, on the same values (the float32 arrays hold
 * the bfloat16 values widened), in one process.
 *
 * Usage: bench-half [N] [reps]     (N = M, default 40000; reps default 5)
 *
 * The dtypes run in turn, reps rounds, and each keeps its best time; prints G pairs/s of each,
 * the ratios bfloat16/float32 and float16/float32 of the times (below 1: faster than float32),
 * and the largest relative difference of the 16-bit results from float32's. Records the row
 * with bench/record.h when SYMRED_BENCH_RECORD is set.
 */
#define _GNU_SOURCE
#include "symred.h"

#include "bench.h"
#include "record.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
static const char *formula = "Exp(-SqDist(x,y)*g)*b";

static sr_kernel *make(sr_ctx *ctx, sr_dtype dt)
{
    sr_expr *f;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    sr_kernel *k;
    if (sr_parse(ctx, formula, aliases, 4, &f) != SR_OK || sr_kernel_new(ctx, f, &d, &k) != SR_OK) {
        fprintf(stderr, "sr_kernel_new: %s\n", sr_ctx_error(ctx));
        exit(1);
    }
    return k;
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 40000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || reps < 1) {
        fprintf(stderr, "usage: %s [N] [reps]\n", argv[0]);
        return 2;
    }
    bench_record rec;
    bench_record_open(&rec, "bench-half", argc, argv);

    /* bfloat16 values (the top half of a float32 drawn uniformly in [0, 1)), the same values
     * as float32, and as float16 (which holds them to its own 11 bits) */
    const int64_t nv[4] = {3 * n, 3 * n, n, 1};
    uint16_t *hb[4], *hf[4];
    float *f32[4];
    uint64_t s = 88172645463325252ULL;
    for (int v = 0; v < 4; v++) {
        hb[v] = bench_alloc(2 * (size_t)nv[v]);
        hf[v] = bench_alloc(2 * (size_t)nv[v]);
        f32[v] = bench_alloc(4 * (size_t)nv[v]);
        for (int64_t i = 0; i < nv[v]; i++) {
            float x = v == 3 ? 2.0f : (float)bench_uniform(&s);
            uint32_t u;
            memcpy(&u, &x, 4);
            hb[v][i] = (uint16_t)(u >> 16);
            f32[v][i] = bf16_value(hb[v][i]);
            _Float16 h = (_Float16)f32[v][i];
            memcpy(&hf[v][i], &h, 2);
        }
    }
    const void *a32[] = {f32[0], f32[1], f32[2], f32[3]};
    const void *abf[] = {hb[0], hb[1], hb[2], hb[3]};
    const void *af16[] = {hf[0], hf[1], hf[2], hf[3]};
    float *o32 = bench_alloc(4 * (size_t)n);
    uint16_t *obf = bench_alloc(2 * (size_t)n), *of16 = bench_alloc(2 * (size_t)n);

    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return 1;
    sr_kernel *k32 = make(ctx, SR_F32), *kbf = make(ctx, SR_BF16), *kf16 = make(ctx, SR_F16);
    /* a first run of each: threads started, pages touched */
    sr_kernel_run(k32, n, n, a32, o32);
    sr_kernel_run(kbf, n, n, abf, obf);
    sr_kernel_run(kf16, n, n, af16, of16);
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < reps; r++) {
        sr_kernel *ks[3] = {k32, kbf, kf16};
        const void *const *as[3] = {a32, abf, af16};
        void *os[3] = {o32, obf, of16};
        for (int t = 0; t < 3; t++) {
            double t0 = bench_now();
            if (sr_kernel_run(ks[t], n, n, as[t], os[t]) != SR_OK) {
                fprintf(stderr, "run: %s\n", sr_ctx_error(ctx));
                return 1;
            }
            double dt = bench_now() - t0;
            best[t] = dt < best[t] ? dt : best[t];
        }
    }
    double relbf = 0, relf16 = 0;
    for (int64_t i = 0; i < n; i++) {
        _Float16 h;
        memcpy(&h, &of16[i], 2);
        double ref = fabs((double)o32[i]) + 1e-30;
        relbf = fmax(relbf, fabs(bf16_value(obf[i]) - (double)o32[i]) / ref);
        relf16 = fmax(relf16, fabs((double)h - (double)o32[i]) / ref);
    }
    double pairs = (double)n * (double)n;
    printf("gaussian mat-vec, D=3, N=M=%lld, best of %d rounds (float32, bfloat16, float16 in "
           "turn)\n",
           (long long)n, reps);
    printf("float32:  %.3f G pairs/s (%.4f s)\n", pairs / best[0] * 1e-9, best[0]);
    printf("bfloat16: %.3f G pairs/s (%.4f s)   max rel. difference from float32 %.2e\n",
           pairs / best[1] * 1e-9, best[1], relbf);
    printf("float16:  %.3f G pairs/s (%.4f s)   max rel. difference from float32 %.2e\n",
           pairs / best[2] * 1e-9, best[2], relf16);
    printf("time ratio bfloat16/float32: %.3f   float16/float32: %.3f\n", best[1] / best[0],
           best[2] / best[0]);
    bench_record_row(&rec,
                     "\"N\": %lld, \"reps\": %d, \"f32_gpairs\": %.3f, \"bf16_gpairs\": %.3f, "
                     "\"f16_gpairs\": %.3f, \"bf16_over_f32_time\": %.3f, "
                     "\"f16_over_f32_time\": %.3f, \"bf16_max_rel\": %.2e, \"f16_max_rel\": %.2e",
                     (long long)n, reps, pairs / best[0] * 1e-9, pairs / best[1] * 1e-9,
                     pairs / best[2] * 1e-9, best[1] / best[0], best[2] / best[0], relbf, relf16);
    bench_record_close(&rec);
    sr_kernel_free(k32);
    sr_kernel_free(kbf);
    sr_kernel_free(kf16);
    sr_ctx_free(ctx);
    for (int v = 0; v < 4; v++) {
        free(hb[v]);
        free(hf[v]);
        free(f32[v]);
    }
    free(o32);
    free(obf);
    free(of16);
    return 0;
}
