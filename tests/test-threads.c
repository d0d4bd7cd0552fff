/*
 * test-threads.c — what symred shares between threads (include/symred.h: "a compiled sr_kernel
 * is immutable and may be run concurrently from many threads"; contexts are independent).
 *
 * One kernel run from several threads at once on each CPU strategy (the JIT's direct one, the
 * gemm-epilogue, the reference), every thread getting the single-threaded result; the same for
 * sr_kernel_eval_block (the JIT's generated block and the reference's); failing runs
 * writing the context's message while other threads read it; contexts in many threads
 * compiling into one disk cache, loading BLIS and NVRTC through their process-wide once-only
 * set-up; a kernel compiling in the background (SYMRED_JIT=async) called from many threads
 * across the switch from the tile interpreter to its module (with sr_kernel_eval_block and
 * SYMRED_LOG=1's tier lines beside the runs), and kernels freed while their modules compile. These
 * are the tests the ThreadSanitizer build of scripts/test.sh runs (docs/fuzzing.md,
 * "ThreadSanitizer").
 */
#define _GNU_SOURCE
#ifdef SYMRED_MINI_CRITERION
#include "mini-criterion.h"
#else
#include <criterion/criterion.h>
#endif

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "cpu/cpu.h"
#include "jit/cuda.h"
#include "util.h"

enum { NTHREADS = 8, REPS = 5, NX = 67, NY = 203 };

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/symred-threads-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    setenv("SYMRED_CACHE_DIR", dir, 1);
}
static void close_fixture(void);
static void teardown(void)
{
    close_fixture();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(threads, .init = setup, .fini = teardown);

struct job {
    const sr_kernel *k;
    const void *const *args;
    int64_t nx, ny;
    double *out; /* NX * out_dim values (f64 kernels) */
    int64_t *idx;
    sr_status st;
};

static void *job_run(void *p)
{
    struct job *j = p;
    sr_run_desc r = {j->nx, j->ny, sr_kernel_nargs(j->k), j->args, j->out, j->idx};
    for (int rep = 0; rep < REPS && j->st == SR_OK; rep++)
        j->st = sr_kernel_run_ex(j->k, &r);
    return NULL;
}

/* Runs k from NTHREADS threads at once and compares every thread's output with one run made
 * alone, bit for bit (each run computes in the same order whatever else runs). */
static void run_shared(const sr_kernel *k, const void *const *args, int64_t nout)
{
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    double *alone = calloc((size_t)nout, sizeof *alone);
    int64_t *alone_idx = calloc((size_t)nout, sizeof *alone_idx);
    sr_run_desc r = {NX,
                     NY,
                     sr_kernel_nargs(k),
                     args,
                     ri->values ? alone : NULL,
                     ri->indices ? alone_idx : NULL};
    cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK, "%s", sr_ctx_error(k->ctx));
    struct job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (struct job){k,
                               args,
                               NX,
                               NY,
                               ri->values ? calloc((size_t)nout, sizeof(double)) : NULL,
                               ri->indices ? calloc((size_t)nout, sizeof(int64_t)) : NULL,
                               SR_OK};
        cr_assert_eq(pthread_create(&th[t], NULL, job_run, &jobs[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(jobs[t].st, SR_OK, "thread %d", t);
        if (ri->values)
            cr_expect(memcmp(jobs[t].out, alone, (size_t)nout * sizeof *alone) == 0,
                      "thread %d: values differ from the run alone", t);
        if (ri->indices)
            cr_expect(memcmp(jobs[t].idx, alone_idx, (size_t)nout * sizeof *alone_idx) == 0,
                      "thread %d: indices differ from the run alone", t);
        free(jobs[t].out);
        free(jobs[t].idx);
    }
    free(alone);
    free(alone_idx);
}

struct data {
    double *x, *y, *b, g;
    const void *args[4];
};

static void data_make(struct data *d, int dim)
{
    uint64_t s = 17;
    d->x = malloc(sizeof(double) * NX * dim);
    d->y = malloc(sizeof(double) * NY * dim);
    d->b = malloc(sizeof(double) * NY);
    tu_fill(d->x, SR_F64, NX * dim, -1, 1, &s);
    tu_fill(d->y, SR_F64, NY * dim, -1, 1, &s);
    tu_fill(d->b, SR_F64, NY, -1, 1, &s);
    d->g = 0.7;
    d->args[0] = d->x;
    d->args[1] = d->y;
    d->args[2] = d->b;
    d->args[3] = &d->g;
}

static void data_free(struct data *d)
{
    free(d->x);
    free(d->y);
    free(d->b);
}

static sr_kernel *kernel(sr_ctx *ctx, const char *formula, int dim, sr_reduction red, sr_device dev)
{
    char ax[32], ay[32];
    snprintf(ax, sizeof ax, "x=Vi(%d)", dim);
    snprintf(ay, sizeof ay, "y=Vj(%d)", dim);
    const char *aliases[] = {ax, ay, "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(ctx, formula, aliases, 4, &f), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    d.reduction = red;
    d.k = 3;
    d.device = dev;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* The context and data of one test: opened by the test, closed by the suite's teardown (also
 * after a failed assertion or a skip). */
static sr_ctx *ctx;
static struct data D;

/* Kernels compiled by sr_kernel_new (SYMRED_JIT=sync): a run compared bit for bit with another
 * must run the same code, not the tile interpreter first and the module later. */
static void open_fixture(int dim)
{
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "sync"), SR_OK);
    data_make(&D, dim);
}

static void close_fixture(void)
{
    if (!ctx)
        return;
    data_free(&D);
    sr_ctx_free(ctx);
    ctx = NULL;
}

Test(threads, jit_kernel_shared)
{
    open_fixture(3);
    sr_kernel *k = kernel(ctx, "Exp(-SqDist(x, y) * g) * b", 3, SR_SUM, SR_DEVICE_CPU);
    cr_assert_str_eq(k->backend->name, "cpu-jit");
    run_shared(k, D.args, NX);
    sr_kernel_free(k);
    k = kernel(ctx, "SqDist(x, y) - b", 3, SR_KMIN_ARGKMIN, SR_DEVICE_CPU);
    run_shared(k, D.args, NX * 3);
    sr_kernel_free(k);
}

/* One CUDA kernel run from many threads at once (each run with device buffers of its own), where
 * a GPU exists or on the CUDA emulator (ctest test-threads-cuda-emu). */
Test(threads, cuda_kernel_shared)
{
    const struct cuda_device *dev;
    const char *why;
    if (jit_cuda_device(&dev, &why) != SR_OK) {
        /* On the emulator a skip would test nothing. */
        cr_assert(!getenv("SYMRED_TEST_CUDA_EMU"), "the CUDA emulator did not open: %s", why);
        cr_skip_test("no GPU, the CUDA kernel is not run: %s", why);
    }
    open_fixture(3);
    sr_kernel *k = kernel(ctx, "Exp(-SqDist(x, y) * g) * b", 3, SR_SUM, SR_DEVICE_CUDA);
    run_shared(k, D.args, NX);
    sr_kernel_free(k);
    k = kernel(ctx, "SqDist(x, y) - b", 3, SR_KMIN_ARGKMIN, SR_DEVICE_CUDA);
    run_shared(k, D.args, NX * 3);
    sr_kernel_free(k);
}

Test(threads, gemm_kernel_shared)
{
    open_fixture(32);
    sr_ctx_set_option(ctx, "SYMRED_GEMM", "on");
    sr_kernel *k = kernel(ctx, "Exp((x|y) * g) * b", 32, SR_SUM, SR_DEVICE_CPU);
    sr_ctx_set_option(ctx, "SYMRED_GEMM", NULL);
    if (k->backend != &cpu_gemm_backend) {
        sr_kernel_free(k);
        cr_skip_test("no gemm for the gemm-epilogue path (no AVX-512F and no BLIS)");
    }
    run_shared(k, D.args, NX);
    sr_kernel_free(k);
}

Test(threads, reference_kernel_shared)
{
    open_fixture(3);
    sr_kernel *k = kernel(ctx, "Exp(-SqDist(x, y) * g) * b", 3, SR_LOGSUMEXP, SR_DEVICE_REFERENCE);
    run_shared(k, D.args, NX);
    sr_kernel_free(k);
}

/* sr_kernel_eval_block from NTHREADS threads on one kernel: the block of rows [BI0, NX - 2) x
 * columns [BJ0, NY - 4), every thread's equal to the block computed alone, bit for bit. */
enum { BI0 = 3, BJ0 = 7, BNI = NX - 2 - BI0, BNJ = NY - 4 - BJ0 };

struct block_job {
    const sr_kernel *k;
    const void *const *args;
    double *out;
    sr_status st;
};

static void *block_run(void *p)
{
    struct block_job *j = p;
    for (int rep = 0; rep < REPS && j->st == SR_OK; rep++)
        j->st = sr_kernel_eval_block(j->k, NX, NY, j->args, BI0, BNI, BJ0, BNJ, j->out);
    return NULL;
}

/* meanwhile (NULL: none) runs on this thread while the others compute; without it the block is
 * computed alone first, with it afterwards (the threads then make the kernel's first calls). */
static void block_shared(const sr_kernel *k, const void *const *args, void (*meanwhile)(void))
{
    size_t n = (size_t)BNI * BNJ * (size_t)k->fdim;
    double *alone = calloc(n, sizeof *alone);
    if (!meanwhile)
        cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, BI0, BNI, BJ0, BNJ, alone), SR_OK, "%s",
                     sr_ctx_error(k->ctx));
    struct block_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (struct block_job){k, args, calloc(n, sizeof(double)), SR_OK};
        cr_assert_eq(pthread_create(&th[t], NULL, block_run, &jobs[t]), 0);
    }
    if (meanwhile)
        meanwhile();
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    if (meanwhile)
        cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, BI0, BNI, BJ0, BNJ, alone), SR_OK, "%s",
                     sr_ctx_error(k->ctx));
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(jobs[t].st, SR_OK, "thread %d", t);
        cr_expect(memcmp(jobs[t].out, alone, n * sizeof *alone) == 0,
                  "thread %d: the block differs from the one computed alone", t);
        free(jobs[t].out);
    }
    free(alone);
}

/* The generated block (the JIT module's sr_block) and the reference's. */
Test(threads, eval_block_shared)
{
    open_fixture(3);
    const char *f = "Concat(Exp(-SqDist(x, y) * g) * b, x - y)";
    sr_kernel *k = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_CPU);
    cr_assert_str_eq(k->backend->name, "cpu-jit");
    block_shared(k, D.args, NULL);
    sr_kernel_free(k);
    k = kernel(ctx, f, 3, SR_KMIN, SR_DEVICE_CPU);
    block_shared(k, D.args, NULL);
    sr_kernel_free(k);
    k = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_REFERENCE);
    block_shared(k, D.args, NULL);
    sr_kernel_free(k);
}

/* Kernels made on the context's own thread (its module cache) while others use it. */
static void make_other_kernels(void)
{
    sr_kernel *k2 = kernel(ctx, "Exp(-SqDist(x, y) * g) * b + x", 3, SR_SUM, SR_DEVICE_CPU);
    sr_kernel *k3 = kernel(ctx, "Exp(-SqDist(x, y) * g) * b - x", 3, SR_MAX, SR_DEVICE_CPU);
    sr_kernel_free(k2);
    sr_kernel_free(k3);
}

/* The first sr_kernel_eval_block of a direct JIT kernel builds its block module: from
 * NTHREADS threads at once, while the context's own thread creates other kernels (both use the
 * context's module cache); every thread gets the block computed alone afterwards. */
Test(threads, eval_block_first_call_shared)
{
    open_fixture(3);
    sr_kernel *k = kernel(ctx, "Exp(-SqDist(x, y) * g) * b - x", 3, SR_SUM, SR_DEVICE_CPU);
    cr_assert_str_eq(k->backend->name, "cpu-jit");
    block_shared(k, D.args, make_other_kernels);
    sr_kernel_free(k);
}

/* Runs that fail (k > ny) record the context's message while other threads read it. */
struct err_job {
    const sr_kernel *k;
    const void *const *args;
    sr_status st;
    int bad_messages;
};

static void *err_run(void *p)
{
    struct err_job *j = p;
    int64_t idx[NX * 3];
    for (int rep = 0; rep < 50; rep++) {
        j->st = sr_kernel_run(j->k, NX, 2, j->args, idx);
        const char *msg = sr_ctx_error(j->k->ctx);
        if (!strstr(msg, "k = 3"))
            j->bad_messages++;
    }
    return NULL;
}

Test(threads, errors_from_many_threads)
{
    open_fixture(3);
    sr_kernel *k = kernel(ctx, "SqDist(x, y)", 3, SR_ARGKMIN, SR_DEVICE_CPU);
    struct err_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (struct err_job){k, D.args, SR_OK, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, err_run, &jobs[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(jobs[t].st, SR_EINVAL);
        cr_expect_eq(jobs[t].bad_messages, 0, "thread %d read a message that is not its error", t);
    }
    sr_kernel_free(k);
}

/* One context per thread, all compiling the same and different kernels into one disk cache at
 * once, and loading NVRTC (process-wide, once) where it exists. */
static void *ctx_run(void *p)
{
    intptr_t t = (intptr_t)p;
    sr_ctx *c;
    if (sr_ctx_new(&c) != SR_OK)
        return (void *)1;
    const char *aliases[] = {"x=Vi(2)", "y=Vj(2)"};
    char formula[64];
    snprintf(formula, sizeof formula, "Exp(-SqDist(x, y) * %d)", (int)(t % 2) + 1);
    sr_expr *f = NULL;
    sr_kernel *k = NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    float x[4] = {0, 0, 1, 1}, y[2] = {0, 0}, out[2];
    const void *args[] = {x, y};
    intptr_t bad = sr_parse(c, formula, aliases, 2, &f) != SR_OK ||
                   sr_kernel_new(c, f, &d, &k) != SR_OK ||
                   sr_kernel_run(k, 2, 1, args, out) != SR_OK || out[0] != 1.0f;
    const struct nvrtc_api *nv;
    const char *why;
    jit_nvrtc_get(&nv, &why);
    sr_kernel_free(k);
    sr_ctx_free(c);
    return (void *)bad;
}

Test(threads, contexts_in_many_threads)
{
    pthread_t th[NTHREADS];
    for (intptr_t t = 0; t < NTHREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, ctx_run, (void *)t), 0);
    for (int t = 0; t < NTHREADS; t++) {
        void *bad;
        pthread_join(th[t], &bad);
        cr_expect_null(bad, "thread %d failed", t);
    }
}

/* ---- background compiles (SYMRED_JIT=async) ---- */

struct swap_job {
    const sr_kernel *k;
    const double *ref;
    int calls, bad, after; /* calls made, wrong results, calls on the compiled module */
};

/* Calls k until it has run a few times on its compiled module (or for 120 s), checking each
 * result against the reference: a call runs one tier whole, whichever it is. */
static void *swap_run(void *p)
{
    struct swap_job *j = p;
    double out[NX];
    for (time_t t0 = time(NULL); j->after < 3 && time(NULL) - t0 < 120; j->calls++) {
        sr_plan_info pi = {.size = sizeof pi};
        bool compiled = sr_kernel_plan(j->k, &pi) == SR_OK && pi.tier == 1;
        if (sr_kernel_run(j->k, NX, NY, D.args, out) != SR_OK)
            j->bad++;
        for (int i = 0; i < NX; i++)
            if (!(fabs(out[i] - j->ref[i]) <= 1e-12 * (1 + fabs(j->ref[i]))))
                j->bad++;
        j->after += compiled;
    }
    return NULL;
}

Test(threads, async_kernel_across_the_switch)
{
    open_fixture(3);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "async"), SR_OK);
    const char *f = "Exp(-SqDist(x, y) * g) * b - Sqrt(SqDist(x, y) + 1)";
    sr_kernel *kr = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_REFERENCE);
    double ref[NX];
    cr_assert_eq(sr_kernel_run(kr, NX, NY, D.args, ref), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel *k = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_CPU);
    struct swap_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (struct swap_job){k, ref, 0, 0, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, swap_run, &jobs[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(jobs[t].bad, 0, "thread %d: %d wrong values or failed calls", t, jobs[t].bad);
        cr_expect(jobs[t].after >= 3, "thread %d: %d calls, none on the compiled module", t,
                  jobs[t].calls);
    }
    cr_assert_eq(sr_kernel_wait(k, 0), SR_OK);
    sr_kernel_free(k);
    sr_kernel_free(kr);
}

/* The same with SYMRED_LOG=1 (the first call on each tier says so once, whichever thread makes
 * it: sr__call_log) and sr_kernel_eval_block beside the runs: the tile interpreter's block while
 * the module compiles, the generated one after the switch (its module built by the first block
 * after it), both with the reference's values. stderr goes to /dev/null meanwhile. */
struct swap_block_job {
    const sr_kernel *k;
    const double *ref, *bref;
    int calls, bad, after;
};

static void *swap_block_run(void *p)
{
    struct swap_block_job *j = p;
    double out[NX], *blk = malloc(sizeof(double) * BNI * BNJ);
    for (time_t t0 = time(NULL); blk && j->after < 3 && time(NULL) - t0 < 120; j->calls++) {
        sr_plan_info pi = {.size = sizeof pi};
        bool compiled = sr_kernel_plan(j->k, &pi) == SR_OK && pi.tier == 1;
        if (sr_kernel_run(j->k, NX, NY, D.args, out) != SR_OK ||
            sr_kernel_eval_block(j->k, NX, NY, D.args, BI0, BNI, BJ0, BNJ, blk) != SR_OK)
            j->bad++;
        for (int i = 0; i < NX; i++)
            if (!(fabs(out[i] - j->ref[i]) <= 1e-12 * (1 + fabs(j->ref[i]))))
                j->bad++;
        for (int q = 0; q < BNI * BNJ; q++)
            if (!(fabs(blk[q] - j->bref[q]) <= 1e-12 * (1 + fabs(j->bref[q]))))
                j->bad++;
        j->after += compiled;
    }
    j->bad += blk == NULL;
    free(blk);
    return NULL;
}

Test(threads, async_log_and_eval_block_across_the_switch)
{
    open_fixture(3);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "async"), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_LOG", "1"), SR_OK);
    const char *f = "Exp(-SqDist(x, y) * g) * b + Sqrt(SqDist(x, y) + 2)";
    sr_kernel *kr = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_REFERENCE);
    double ref[NX], *bref = malloc(sizeof(double) * BNI * BNJ);
    cr_assert_not_null(bref);
    cr_assert_eq(sr_kernel_run(kr, NX, NY, D.args, ref), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_eval_block(kr, NX, NY, D.args, BI0, BNI, BJ0, BNJ, bref), SR_OK);
    fflush(stderr);
    int saved = dup(2), dn = open("/dev/null", O_WRONLY);
    cr_assert(saved >= 0 && dn >= 0);
    dup2(dn, 2);
    close(dn);
    sr_kernel *k = kernel(ctx, f, 3, SR_SUM, SR_DEVICE_CPU);
    struct swap_block_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        jobs[t] = (struct swap_block_job){k, ref, bref, 0, 0, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, swap_block_run, &jobs[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(jobs[t].bad, 0, "thread %d: %d wrong values or failed calls", t, jobs[t].bad);
        cr_expect(jobs[t].after >= 3, "thread %d: %d calls, none on the compiled module", t,
                  jobs[t].calls);
    }
    sr_kernel_free(k);
    sr_kernel_free(kr);
    free(bref);
}

/* Contexts in many threads (a context is one thread's), each creating kernels and freeing them
 * while their modules compile (some after a call, some at once, some waited for), then freed at
 * once: the compiles end on their own, publishing into kernels that are gone, and the context
 * waits for them. */
static sr_kernel *kernel_try(sr_ctx *c, const char *formula)
{
    const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = NULL;
    sr_kernel *k = NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    d.device = SR_DEVICE_CPU;
    if (sr_parse(c, formula, aliases, 4, &f) != SR_OK || sr_kernel_new(c, f, &d, &k) != SR_OK)
        return NULL;
    return k;
}

static void *churn_run(void *p)
{
    intptr_t t = (intptr_t)p, bad = 0;
    static const char *const forms[] = {"Exp(-SqDist(x, y) * g) * b", "Inv(1 + SqDist(x, y)) * b",
                                        "Sqrt(SqDist(x, y) * g) * b"};
    sr_ctx *c;
    if (sr_ctx_new(&c) != SR_OK || sr_ctx_set_option(c, "SYMRED_JIT", "async") != SR_OK)
        return (void *)1;
    for (int i = 0; i < 3; i++) {
        sr_kernel *k = kernel_try(c, forms[(t + i) % 3]);
        double out[NX];
        bad += k == NULL;
        if ((t + i) % 3 == 1)
            bad += sr_kernel_run(k, NX, NY, D.args, out) != SR_OK;
        if ((t + i) % 3 == 2)
            bad += sr_kernel_wait(k, 120) != SR_OK;
        sr_kernel_free(k);
    }
    sr_ctx_free(c);
    return (void *)bad;
}

Test(threads, async_kernels_freed_while_compiling)
{
    open_fixture(3);
    pthread_t th[NTHREADS];
    for (intptr_t t = 0; t < NTHREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, churn_run, (void *)t), 0);
    for (int t = 0; t < NTHREADS; t++) {
        void *bad;
        pthread_join(th[t], &bad);
        cr_expect_null(bad, "thread %d: a kernel, a call or a wait failed", t);
    }
}
