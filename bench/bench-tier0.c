/*
 * bench-tier0.c — the tile interpreter (tier 0) against the compiled kernel and the reference
 * interpreter on the same jobs, in one process, and what tiered execution gives a new formula:
 * its first call in a process with an empty kernel cache, and a run of ten calls from creation
 * against ten calls of a kernel already compiled.
 *
 * Jobs (float32): the Gaussian mat-vec Sum of Exp(-g SqDist(x, y)) b at D = 3 and its LogSumExp,
 * ArgKMin (K = 10) of SqDist at D = 16, and kNN at D = 784 (the compiled kernel takes the
 * gemm-epilogue strategy there; the tile interpreter evaluates the distances itself).
 *
 * Usage: bench-tier0 [N] [reps]   (N = M for the D = 3 jobs, default 20000; reps default 5).
 * SYMRED_BENCH_RECORD=file appends the figures (bench/record.h).
 */
#define _GNU_SOURCE
#include "bench.h"
#include "record.h"
#include "symred.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NJOB = 4 };
static const char *const job_names[NJOB] = {"gauss-d3", "lse-d3", "argkmin-d16", "knn-d784"};

struct job {
    const char *formula;
    const char *aliases[4];
    int naliases, dim;
    sr_reduction red;
    int k;
};

static const struct job jobs[NJOB] = {
    {"Exp(-SqDist(x, y) * g) * b", {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"}, 4, 3, SR_SUM, 1},
    {"-SqDist(x, y) * g", {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"}, 4, 3, SR_LOGSUMEXP, 1},
    {"SqDist(x, y)", {"x=Vi(16)", "y=Vj(16)"}, 2, 16, SR_ARGKMIN, 10},
    {"SqDist(x, y)", {"x=Vi(784)", "y=Vj(784)"}, 2, 784, SR_ARGKMIN, 10},
};

static void die(sr_ctx *ctx, const char *what)
{
    fprintf(stderr, "bench-tier0: %s: %s\n", what, ctx ? sr_ctx_error(ctx) : "");
    exit(1);
}

/* A context in SYMRED_JIT mode jit ("reference": the reference device), its cache in dir. */
static sr_ctx *context(const char *jit, const char *dir)
{
    sr_ctx *c = NULL;
    if (sr_ctx_new(&c) != SR_OK)
        die(c, "sr_ctx_new");
    bool ref = strcmp(jit, "reference") == 0;
    if (sr_ctx_set_option(c, ref ? "SYMRED_DEVICE" : "SYMRED_JIT", jit) != SR_OK ||
        (dir && sr_ctx_set_option(c, "SYMRED_CACHE_DIR", dir) != SR_OK))
        die(c, "sr_ctx_set_option");
    return c;
}

static sr_kernel *kernel(sr_ctx *c, const struct job *jb)
{
    sr_expr *f = NULL;
    if (sr_parse(c, jb->formula, jb->aliases, jb->naliases, &f) != SR_OK)
        die(c, "sr_parse");
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = jb->red;
    d.k = jb->k;
    sr_kernel *k = NULL;
    if (sr_kernel_new(c, f, &d, &k) != SR_OK)
        die(c, "sr_kernel_new");
    return k;
}

struct data {
    float *x, *y, *b, g;
    float *out;
    int64_t *idx;
};

static struct data data_new(int64_t n, int64_t m, int dim, uint64_t seed)
{
    struct data d;
    d.x = bench_alloc((size_t)(n * dim) * sizeof(float));
    d.y = bench_alloc((size_t)(m * dim) * sizeof(float));
    d.b = bench_alloc((size_t)m * sizeof(float));
    d.out = bench_alloc((size_t)n * 10 * sizeof(float));
    d.idx = bench_alloc((size_t)n * 10 * sizeof(int64_t));
    d.g = 0.5f;
    for (int64_t i = 0; i < n * dim; i++)
        d.x[i] = (float)bench_uniform(&seed);
    for (int64_t j = 0; j < m * dim; j++)
        d.y[j] = (float)bench_uniform(&seed);
    for (int64_t j = 0; j < m; j++)
        d.b[j] = (float)bench_uniform(&seed) - 0.5f;
    return d;
}

static void data_free(struct data *d)
{
    free(d->x);
    free(d->y);
    free(d->b);
    free(d->out);
    free(d->idx);
}

static double run(sr_kernel *k, struct data *d, int64_t n, int64_t m)
{
    const void *args[] = {d->x, d->y, d->b, &d->g};
    sr_run_desc r = {n, m, sr_kernel_nargs(k), args, d->out, d->idx};
    double t0 = bench_now();
    if (sr_kernel_run_ex(k, &r) != SR_OK)
        die(NULL, "sr_kernel_run_ex");
    return bench_now() - t0;
}

static double best_of(sr_kernel *k, struct data *d, int64_t n, int64_t m, int reps)
{
    run(k, d, n, m);
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        double t = run(k, d, n, m);
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 20000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1000 || reps < 1) {
        fprintf(stderr, "usage: bench-tier0 [N >= 1000] [reps >= 1]\n");
        return 2;
    }
    bench_record rec;
    bench_record_open(&rec, "bench-tier0", argc, argv);
    char dir[] = "/tmp/symred-bench-tier0-XXXXXX";
    if (!mkdtemp(dir))
        die(NULL, "mkdtemp");

    /* Throughput: the same kernel on each tier (best of reps, after one warm-up call). */
    const int64_t sizes[NJOB][2] = {{n, n}, {n, n}, {n / 2, n / 2}, {n / 20, n / 2}};
    const int64_t ref_div = 8; /* the reference runs an eighth of the rows */
    double pps[NJOB][3];       /* pairs per second: tier 0, compiled, reference */
    sr_ctx *c_t0 = context("off", dir), *c_jit = context("sync", dir);
    sr_ctx *c_ref = context("reference", dir);
    for (int q = 0; q < NJOB; q++) {
        int64_t nq = sizes[q][0], mq = sizes[q][1];
        struct data d = data_new(nq, mq, jobs[q].dim, 7 + (uint64_t)q);
        sr_kernel *kt = kernel(c_t0, &jobs[q]), *kj = kernel(c_jit, &jobs[q]);
        sr_kernel *kr = kernel(c_ref, &jobs[q]);
        pps[q][0] = (double)nq * (double)mq / best_of(kt, &d, nq, mq, reps);
        pps[q][1] = (double)nq * (double)mq / best_of(kj, &d, nq, mq, reps);
        int64_t nr = nq / ref_div > 0 ? nq / ref_div : 1;
        pps[q][2] = (double)nr * (double)mq / best_of(kr, &d, nr, mq, 1);
        sr_kernel_free(kt);
        sr_kernel_free(kj);
        sr_kernel_free(kr);
        data_free(&d);
    }
    sr_ctx_free(c_t0);
    sr_ctx_free(c_jit);
    sr_ctx_free(c_ref);

    /* A new formula's first call at N = M = 1000, empty cache: async (the default) against sync
     * (creation waits for the compiler). A fresh cache directory for each. */
    double first_ms[2];
    for (int mode = 0; mode < 2; mode++) {
        char fdir[64];
        snprintf(fdir, sizeof fdir, "%s/first-%d", dir, mode);
        sr_ctx *c = context(mode ? "sync" : "async", fdir);
        struct data d = data_new(1000, 1000, 3, 11);
        double t0 = bench_now();
        sr_kernel *k = kernel(c, &jobs[0]);
        run(k, &d, 1000, 1000);
        first_ms[mode] = 1e3 * (bench_now() - t0);
        sr_kernel_free(k);
        sr_ctx_free(c);
        data_free(&d);
    }

    /* Ten calls at N = M = 40000 from creation with an empty cache (async: the first calls on
     * tier 0, the rest compiled) against ten calls of a kernel already compiled. */
    double ten[2];
    {
        const int64_t nl = 40000;
        struct data d = data_new(nl, nl, 3, 13);
        char ldir[64];
        snprintf(ldir, sizeof ldir, "%s/long", dir);
        sr_ctx *c = context("async", ldir);
        double t0 = bench_now();
        sr_kernel *k = kernel(c, &jobs[0]);
        for (int r = 0; r < 10; r++)
            run(k, &d, nl, nl);
        ten[0] = bench_now() - t0;
        sr_kernel_wait(k, -1);
        ten[1] = 0;
        for (int r = 0; r < 10; r++)
            ten[1] += run(k, &d, nl, nl);
        sr_kernel_free(k);
        sr_ctx_free(c);
        data_free(&d);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench-tier0: could not remove %s\n", dir);

    printf("bench-tier0: N = %lld, best of %d\n", (long long)n, reps);
    printf("%-12s %14s %14s %14s %12s %12s\n", "job", "tier0 Mpair/s", "JIT Mpair/s", "ref Mpair/s",
           "tier0/JIT", "tier0/ref");
    for (int q = 0; q < NJOB; q++)
        printf("%-12s %14.1f %14.1f %14.2f %12.3f %12.1f\n", job_names[q], pps[q][0] * 1e-6,
               pps[q][1] * 1e-6, pps[q][2] * 1e-6, pps[q][0] / pps[q][1], pps[q][0] / pps[q][2]);
    printf("first call of a new formula at N = M = 1000, empty cache: async %.1f ms, sync %.1f ms "
           "(creation waits for the compiler)\n",
           first_ms[0], first_ms[1]);
    printf("ten calls at N = M = 40000 from creation (async, empty cache): %.3f s; ten calls of "
           "the compiled kernel: %.3f s; ratio %.3f\n",
           ten[0], ten[1], ten[0] / ten[1]);
    bench_record_row(&rec,
                     "\"N\": %lld, \"reps\": %d, \"gauss_t0_over_jit\": %.3f, "
                     "\"lse_t0_over_jit\": %.3f, \"argkmin_t0_over_jit\": %.3f, "
                     "\"knn784_t0_over_jit\": %.3f, \"gauss_t0_over_ref\": %.1f, "
                     "\"lse_t0_over_ref\": %.1f, \"argkmin_t0_over_ref\": %.1f, "
                     "\"knn784_t0_over_ref\": %.1f, \"gauss_t0_mpairs\": %.1f, "
                     "\"first_call_async_ms\": %.1f, \"first_call_sync_ms\": %.1f, "
                     "\"ten_calls_over_compiled\": %.3f",
                     (long long)n, reps, pps[0][0] / pps[0][1], pps[1][0] / pps[1][1],
                     pps[2][0] / pps[2][1], pps[3][0] / pps[3][1], pps[0][0] / pps[0][2],
                     pps[1][0] / pps[1][2], pps[2][0] / pps[2][2], pps[3][0] / pps[3][2],
                     pps[0][0] * 1e-6, first_ms[0], first_ms[1], ten[0] / ten[1]);
    bench_record_close(&rec);
    return 0;
}
