/*
 * bench-gauss.c — symred's CPU JIT against hand-written OpenMP + simd loops on the low-dimensional
 * direct path, D = 3, N = M: those of handloop.c (compiled with the JIT's flags) and the faster
 * ones of handloop-fast.c (structure-of-arrays y, -ffast-math, libmvec: the strongest a user
 * would write):
 *   - the Gaussian kernel mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j, float32 and float64;
 *   - LogSumExp_j of -g |x_i - y_j|^2 (float32);
 *   - ArgKMin_j of |x_i - y_j|^2, K = 10 (float32).
 *
 * Usage: bench-gauss [N] [reps]     (N = M, default 40000)
 *
 * Prints, in one run: for each job G pairs/s of symred and of its hand loop (best times) and the
 * median over the rounds of the ratio hand time / symred time (each round runs every symred
 * kernel and every hand loop once, alternating, so a change of load hits both), the same for the
 * fast-math loop, with the largest relative difference of the results (the index sets for
 * ArgKMin); the cold first-call latency
 * of the float32 mat-vec (sr_kernel_new with an empty SYMRED_CACHE_DIR: emit + compile + load,
 * then the first run); and the warm kernel creation time (a new context, the same kernel, from
 * the disk cache). Then the cold sr_kernel_new of each float32 job (mat-vec, LogSumExp, ArgKMin)
 * over COLD_ROUNDS rounds, each in an empty cache directory of its own, alternating with the
 * yardstick: the system compiler building a shared object of one empty function with -O3
 * -march=native (what any compile costs on this machine: the compiler's processes starting, the
 * assembler, the linker); medians. The temporary cache directories are removed at the end.
 */
#define _GNU_SOURCE
#include "symred.h"

#include "bench.h"
#include "handloop.h"
#include "record.h"

#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { NJOB = 4, KNN = 10 };
static const char *const job_names[NJOB] = {"gauss-f32", "gauss-f64", "lse-f32", "argkmin-f32"};

/* The arrays a hand loop reads and writes: float32 and float64 copies of the same points. */
struct loop_io {
    int64_t n;
    const float *x, *y, *b;
    float g;
    const double *xd, *yd, *bd;
    double gd;
    float *out;
    double *out_d;
    int64_t *idx;
};

/* Runs job q of the loops L once; returns its seconds. */
static double run_loop(const struct bench_loops *L, int q, const struct loop_io *io)
{
    const int64_t n = io->n;
    double t0 = bench_now();
    if (q == 0)
        L->gauss(n, n, io->x, io->y, io->b, io->g, io->out);
    else if (q == 1)
        L->gauss_f64(n, n, io->xd, io->yd, io->bd, io->gd, io->out_d);
    else if (q == 2)
        L->lse(n, n, io->x, io->y, io->g, io->out);
    else
        L->argkmin(n, n, io->x, io->y, KNN, io->idx);
    return bench_now() - t0;
}

static const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
static const char *formula = "Exp(-SqDist(x,y)*g)*b";

static sr_kernel *make_job(sr_ctx *ctx, const char *form, int na, sr_reduction red, sr_dtype dt,
                           int k)
{
    sr_expr *f;
    sr_kernel *kern;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.dtype = dt;
    d.k = k;
    if (sr_parse(ctx, form, aliases, na, &f) != SR_OK ||
        sr_kernel_new(ctx, f, &d, &kern) != SR_OK) {
        fprintf(stderr, "setup failed: %s\n", sr_ctx_error(ctx));
        exit(1);
    }
    return kern;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

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

enum { COLD_ROUNDS = 5, NCOLD = 3 };

/* Seconds the system compiler (SYMRED_CC, else cc) takes to build a shared object of one empty
 * function from src into so, with -O3 -march=native; < 0 when it fails. */
static double empty_compile(const char *src, const char *so)
{
    const char *cc = getenv("SYMRED_CC");
    char *argv[] = {(char *)(cc && *cc ? cc : "cc"),
                    "-O3",
                    "-march=native",
                    "-fPIC",
                    "-shared",
                    "-o",
                    (char *)so,
                    (char *)src,
                    NULL};
    double t0 = bench_now();
    pid_t pid;
    int ws;
    if (posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ) != 0 ||
        waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        return -1;
    return bench_now() - t0;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Cold sr_kernel_new of the float32 jobs, each round in fresh cache directories under dir,
 * alternating with empty_compile: medians in cold_ms[NCOLD] and *empty_ms. */
static void cold_rounds(const char *dir, double cold_ms[NCOLD], double *empty_ms)
{
    static const char *const forms[NCOLD] = {"Exp(-SqDist(x,y)*g)*b", "-SqDist(x,y)*g",
                                             "SqDist(x,y)"};
    static const sr_reduction reds[NCOLD] = {SR_SUM, SR_LOGSUMEXP, SR_ARGKMIN};
    double t[NCOLD][COLD_ROUNDS], e[COLD_ROUNDS];
    char src[300], so[300];
    snprintf(src, sizeof src, "%s/empty.c", dir);
    snprintf(so, sizeof so, "%s/empty.so", dir);
    FILE *f = fopen(src, "w");
    if (!f || fputs("void sr_empty(void) {}\n", f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", src);
        exit(1);
    }
    for (int r = 0; r < COLD_ROUNDS; r++) {
        for (int q = 0; q < NCOLD; q++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s/cold-%d-%d", dir, r, q);
            setenv("SYMRED_CACHE_DIR", sub, 1);
            sr_ctx *c;
            sr_expr *fx;
            sr_kernel *k;
            sr_kernel_desc d = sr_kernel_desc_default();
            d.reduction = reds[q];
            d.k = q == 2 ? KNN : 1;
            if (sr_ctx_new(&c) != SR_OK ||
                sr_parse(c, forms[q], aliases, q == 2 ? 2 : 4, &fx) != SR_OK) {
                fprintf(stderr, "setup failed\n");
                exit(1);
            }
            double t0 = bench_now();
            if (sr_kernel_new(c, fx, &d, &k) != SR_OK) {
                fprintf(stderr, "cold %s: %s\n", forms[q], sr_ctx_error(c));
                exit(1);
            }
            t[q][r] = (bench_now() - t0) * 1e3;
            sr_kernel_free(k);
            sr_ctx_free(c);
        }
        e[r] = empty_compile(src, so) * 1e3;
        if (e[r] < 0) {
            fprintf(stderr, "the empty compile failed\n");
            exit(1);
        }
    }
    setenv("SYMRED_CACHE_DIR", dir, 1);
    for (int q = 0; q < NCOLD; q++)
        cold_ms[q] = median(t[q], COLD_ROUNDS);
    *empty_ms = median(e, COLD_ROUNDS);
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
    const char *module = bench_plan(k2).module;
    int disk_hit = module && strcmp(module, "disk") == 0;

    /* The other jobs' kernels, in the warm context (compiled before timing). */
    double *xd = bench_alloc(sizeof(double) * 3 * n), *yd = bench_alloc(sizeof(double) * 3 * n);
    double *bd = bench_alloc(sizeof(double) * n), *od1 = bench_alloc(sizeof(double) * n);
    double *od2 = bench_alloc(sizeof(double) * n), gd = g;
    int64_t *i1 = bench_alloc(sizeof(int64_t) * KNN * n),
            *i2 = bench_alloc(sizeof(int64_t) * KNN * n);
    for (int64_t i = 0; i < 3 * n; i++)
        xd[i] = x[i], yd[i] = y[i];
    for (int64_t i = 0; i < n; i++)
        bd[i] = b[i];
    sr_kernel *kj[NJOB] = {k2, make_job(ctx2, formula, 4, SR_SUM, SR_F64, 1),
                           make_job(ctx2, "-SqDist(x,y)*g", 4, SR_LOGSUMEXP, SR_F32, 1),
                           make_job(ctx2, "SqDist(x,y)", 2, SR_ARGKMIN, SR_F32, KNN)};
    const void *args_d[] = {xd, yd, bd, &gd}, *args_l[] = {x, y, NULL, &g};
    double best_sr[NJOB], best_hand[NJOB], best_fast[NJOB], ratio[NJOB][64], ratio_f[NJOB][64];
    for (int q = 0; q < NJOB; q++)
        best_sr[q] = best_hand[q] = best_fast[q] = 1e30;
    if (reps > 64)
        reps = 64;
    const struct loop_io io = {n, x, y, b, g, xd, yd, bd, gd, o2, od2, i2};
    run_loop(&bench_hand_loops, 0, &io); /* warm up the OpenMP threads */
    for (int r = 0; r < reps; r++)
        for (int q = 0; q < NJOB; q++) {
            t0 = bench_now();
            sr_status st = q == 0   ? sr_kernel_run(kj[q], n, n, args, o1)
                           : q == 1 ? sr_kernel_run(kj[q], n, n, args_d, od1)
                           : q == 2 ? sr_kernel_run(kj[q], n, n, args_l, o1)
                                    : sr_kernel_run(kj[q], n, n, args_l, i1);
            double ts = bench_now() - t0;
            if (st != SR_OK) {
                fprintf(stderr, "%s: %s\n", job_names[q], sr_ctx_error(ctx2));
                return 1;
            }
            double th = run_loop(&bench_hand_loops, q, &io);
            double tf = run_loop(&bench_fast_loops, q, &io);
            best_sr[q] = ts < best_sr[q] ? ts : best_sr[q];
            best_hand[q] = th < best_hand[q] ? th : best_hand[q];
            best_fast[q] = tf < best_fast[q] ? tf : best_fast[q];
            ratio[q][r] = th / ts;
            ratio_f[q][r] = tf / ts;
        }
    /* The largest relative difference of symred's results from each loop's (the share of
     * differing indices for ArgKMin), from one more run of each. */
    double maxrel[NJOB] = {0}, maxrel_f[NJOB] = {0};
    for (int w = 0; w < 2; w++) {
        double *mr = w ? maxrel_f : maxrel;
        const struct bench_loops *L = w ? &bench_fast_loops : &bench_hand_loops;
        sr_kernel_run(kj[0], n, n, args, o1);
        sr_kernel_run(kj[1], n, n, args_d, od1);
        run_loop(L, 0, &io);
        run_loop(L, 1, &io);
        for (int64_t i = 0; i < n; i++) {
            double d0 = fabs((double)o1[i] - o2[i]) / (fabs((double)o2[i]) + 1e-3);
            double d1 = fabs(od1[i] - od2[i]) / (fabs(od2[i]) + 1e-3);
            mr[0] = d0 > mr[0] ? d0 : mr[0];
            mr[1] = d1 > mr[1] ? d1 : mr[1];
        }
        sr_kernel_run(kj[2], n, n, args_l, o1);
        run_loop(L, 2, &io);
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)o1[i] - o2[i]) / (fabs((double)o2[i]) + 1e-3);
            mr[2] = d > mr[2] ? d : mr[2];
        }
        sr_kernel_run(kj[3], n, n, args_l, i1);
        run_loop(L, 3, &io);
        int64_t idx_diff = 0;
        for (int64_t i = 0; i < KNN * n; i++)
            idx_diff += i1[i] != i2[i];
        mr[3] = (double)idx_diff / (double)(KNN * n);
    }
    double pairs = (double)n * (double)n, med[NJOB], med_f[NJOB];
    printf("low-dimensional direct path, D=3, N=M=%lld, %d alternating rounds\n", (long long)n,
           reps);
    for (int q = 0; q < NJOB; q++) {
        qsort(ratio[q], (size_t)reps, sizeof(double), cmp_double);
        qsort(ratio_f[q], (size_t)reps, sizeof(double), cmp_double);
        med[q] = ratio[q][reps / 2];
        med_f[q] = ratio_f[q][reps / 2];
        printf("%-12s symred %.3f G pairs/s, hand loop %.3f, fast-math SoA loop %.3f (best); "
               "symred's speed over the hand loop's median %.3f (min %.3f, max %.3f), over the "
               "fast-math loop's %.3f (min %.3f, max %.3f); %s %.2e / %.2e\n",
               job_names[q], pairs / best_sr[q] * 1e-9, pairs / best_hand[q] * 1e-9,
               pairs / best_fast[q] * 1e-9, med[q], ratio[q][0], ratio[q][reps - 1], med_f[q],
               ratio_f[q][0], ratio_f[q][reps - 1], q == 3 ? "indices differing" : "max rel. diff.",
               maxrel[q], maxrel_f[q]);
    }
    printf("cold first call: sr_kernel_new %.1f ms (emit + compile + load) + first run %.1f ms\n",
           t_cold_new * 1e3, t_first_run * 1e3);
    printf("warm kernel creation (new context, disk cache%s): %.2f ms\n",
           disk_hit ? " hit" : ": NOT a hit", t_warm_new * 1e3);
    double cold_ms[NCOLD], empty_ms;
    cold_rounds(dir, cold_ms, &empty_ms);
    printf("cold sr_kernel_new, median of %d rounds (empty cache each): gauss-f32 %.1f ms, "
           "lse-f32 %.1f ms, argkmin-f32 %.1f ms; yardstick: cc -O3 -march=native -shared of an "
           "empty function %.1f ms (gauss-f32 = %.2fx it)\n",
           COLD_ROUNDS, cold_ms[0], cold_ms[1], cold_ms[2], empty_ms, cold_ms[0] / empty_ms);

    bench_record_row(
        &rec,
        "\"N\": %lld, \"reps\": %d, \"symred_gpairs\": %.3f, \"hand_gpairs\": %.3f, "
        "\"symred_over_hand\": %.3f, \"f64_over_hand\": %.3f, \"lse_over_hand\": %.3f, "
        "\"argkmin_over_hand\": %.3f, \"cold_ms\": %.1f, \"warm_ms\": %.2f, "
        "\"cold_median_ms\": %.1f, \"cold_lse_ms\": %.1f, \"cold_argkmin_ms\": %.1f, "
        "\"empty_compile_ms\": %.1f, \"fast_gpairs\": %.3f, \"symred_over_fast\": %.3f, "
        "\"f64_over_fast\": %.3f, \"lse_over_fast\": %.3f, \"argkmin_over_fast\": %.3f",
        (long long)n, reps, pairs / best_sr[0] * 1e-9, pairs / best_hand[0] * 1e-9, med[0], med[1],
        med[2], med[3], t_cold_new * 1e3, t_warm_new * 1e3, cold_ms[0], cold_ms[1], cold_ms[2],
        empty_ms, pairs / best_fast[0] * 1e-9, med_f[0], med_f[1], med_f[2], med_f[3]);
    bench_record_close(&rec);
    sr_kernel_free(k);
    for (int q = 0; q < NJOB; q++)
        sr_kernel_free(kj[q]);
    sr_ctx_free(ctx);
    sr_ctx_free(ctx2);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(x), free(y), free(b), free(o1), free(o2);
    free(xd), free(yd), free(bd), free(od1), free(od2), free(i1), free(i2);
    return 0;
}
