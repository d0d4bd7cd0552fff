/*
 * bench-grad.c — the backward pass of the Gaussian kernel mat-vec against its forward pass, in
 * one run: out_i = sum_j exp(-g |x_i - y_j|^2) b_j (D = 3, float32, CPU JIT), and the gradient
 * kernels of sr_kernel_grad with respect to x (a sum over j, like the forward) and to y (the
 * transposed sum over i), given an incoming gradient G.
 *
 * Usage: bench-grad [N] [reps]     (N = M, default 40000)
 *
 * Prints the best time of each pass (the passes interleaved), the ratios backward/forward (target:
 * <= 1.3), and the gradient kernel's formula after the simplifier. Kernels are compiled
 * before timing.
 */
#define _POSIX_C_SOURCE 200809L
#include "symred.h"

#include "bench.h"
#include "record.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};

/* Runs each kernel once per round, interleaved, so that a change of load on a shared machine
 * hits every pass alike; best[] gets each kernel's best time. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* best[] gets each kernel's best wall time, cpu[] its best CPU time (all threads). */
static void best_times(sr_kernel *const *k, int nk, int64_t n, const void *const *args, void *out,
                       int reps, double *best, double *cpu)
{
    for (int q = 0; q < nk; q++) {
        best[q] = cpu[q] = 1e30;
        sr_kernel_run(k[q], n, n, args, out); /* warm up the threads and the caches */
    }
    for (int r = 0; r < reps; r++)
        for (int q = 0; q < nk; q++) {
            double t0 = bench_now(), c0 = cpu_now();
            if (sr_kernel_run(k[q], n, n, args, out) != SR_OK) {
                fprintf(stderr, "sr_kernel_run failed\n");
                exit(1);
            }
            double t = bench_now() - t0, c = cpu_now() - c0;
            best[q] = t < best[q] ? t : best[q];
            cpu[q] = c < cpu[q] ? c : cpu[q];
        }
}

/* The simplifier's cost estimate of k's formula (sr_plan_info). */
static void print_cost(const char *what, const sr_kernel *k)
{
    sr_plan_info p = bench_plan(k);
    printf("  %s cost estimate: %.0f flops per pair (as given: %.0f), %.0f bytes per pair\n", what,
           p.flops_per_pair, p.flops_per_pair_given, p.bytes_per_pair);
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
    bench_record_open(&rec, "bench-grad", argc, argv);
    float *x = bench_alloc(sizeof(float) * 3 * n), *y = bench_alloc(sizeof(float) * 3 * n);
    float *b = bench_alloc(sizeof(float) * n), *G = bench_alloc(sizeof(float) * n);
    float *out = bench_alloc(sizeof(float) * 3 * n), g = 2.0f;
    uint64_t s = 88172645463325252ULL;
    for (int64_t i = 0; i < 3 * n; i++) {
        x[i] = (float)bench_uniform(&s);
        y[i] = (float)bench_uniform(&s);
    }
    for (int64_t i = 0; i < n; i++) {
        b[i] = (float)bench_uniform(&s);
        G[i] = (float)bench_uniform(&s) - 0.5f;
    }
    sr_ctx *ctx;
    sr_expr *f;
    sr_kernel *fwd, *gx, *gy;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    if (sr_ctx_new(&ctx) != SR_OK ||
        sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", aliases, 4, &f) != SR_OK ||
        sr_kernel_new(ctx, f, &d, &fwd) != SR_OK || sr_kernel_grad(fwd, 0, &gx) != SR_OK ||
        sr_kernel_grad(fwd, 1, &gy) != SR_OK) {
        fprintf(stderr, "setup failed: %s\n", sr_ctx_error(ctx));
        return 1;
    }
    const void *args[] = {x, y, b, &g, G}; /* the forward arrays, then G (sr_kernel_grad) */
    sr_kernel *ks[3] = {fwd, gx, gy};
    double best[3], cpu[3];
    best_times(ks, 3, n, args, out, reps, best, cpu);
    double t_f = best[0], t_x = best[1], t_y = best[2];
    double pairs = (double)n * (double)n;
    printf("gaussian mat-vec, D=3, float32, N=M=%lld, CPU JIT, best of %d\n", (long long)n, reps);
    printf("forward            %.4f s  %.3f G pairs/s\n", t_f, pairs / t_f * 1e-9);
    printf("backward d/dx      %.4f s  %.3f G pairs/s  ratio backward/forward %.2f\n", t_x,
           pairs / t_x * 1e-9, t_x / t_f);
    printf("backward d/dy      %.4f s  %.3f G pairs/s  ratio backward/forward %.2f\n", t_y,
           pairs / t_y * 1e-9, t_y / t_f);
    printf("CPU time (all threads; steadier on a loaded machine): forward %.3f s, d/dx %.3f s "
           "(ratio %.2f), d/dy %.3f s (ratio %.2f)\n",
           cpu[0], cpu[1], cpu[1] / cpu[0], cpu[2], cpu[2] / cpu[0]);
    printf("gradient kernel d/dx:\n");
    char formula[4096] = "";
    const sr_expr *gf = bench_plan(gx).formula;
    if (gf)
        sr_expr_print(gf, formula, sizeof formula);
    printf("  simplified formula: %s\n", formula);
    print_cost("d/dx", gx);
    print_cost("forward", fwd);
    bench_record_row(&rec,
                     "\"N\": %lld, \"reps\": %d, \"forward_s\": %.4f, \"dx_s\": %.4f, "
                     "\"dy_s\": %.4f, \"dx_over_forward\": %.2f, \"dy_over_forward\": %.2f, "
                     "\"dx_over_forward_cpu\": %.2f, \"dy_over_forward_cpu\": %.2f",
                     (long long)n, reps, t_f, t_x, t_y, t_x / t_f, t_y / t_f, cpu[1] / cpu[0],
                     cpu[2] / cpu[0]);
    bench_record_close(&rec);
    if (getenv("BENCH_GRAD_EXPLAIN"))
        printf("%s\n%s\n", sr_kernel_explain(gx), sr_kernel_explain(gy));
    sr_kernel_free(gx);
    sr_kernel_free(gy);
    sr_kernel_free(fwd);
    sr_ctx_free(ctx);
    free(x), free(y), free(b), free(G), free(out);
    return 0;
}
