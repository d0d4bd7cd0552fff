/*
 * test-async.c — tiered execution (SYMRED_JIT=async): a kernel is served by the tile interpreter
 * from its creation while its module compiles on a background thread, then by the compiled code.
 *
 * The values agree with the reference on both tiers; sr_kernel_wait and explain follow the
 * switch; a kernel freed while its module compiles, a context freed while compiles run, a
 * compiler that fails, one that hangs past the timeout, and calls from many threads across the
 * switch neither change a result nor block a call. The compiles go to a cache directory of this
 * test's own, emptied first, so that they really run.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "symred.h"
#include "diff.h"
#include "util.h"

static char cache[] = "/tmp/symred-async-XXXXXX";

static void setup(void)
{
    cr_assert(mkdtemp(cache) != NULL);
    setenv("SYMRED_CACHE_DIR", cache, 1);
    setenv("SYMRED_JIT", "async", 1);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_COMPILE_TIMEOUT");
}
static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(async, .init = setup, .fini = teardown);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *const al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)"};
static const char *const gauss = "Exp(-SqDist(x, y) * g) * b";

enum { NX = 301, NY = 517 };
static float xs[NX * 3], ys[NY * 3], bs[NY * 2], gs = 0.7f;

static void fill(void)
{
    uint64_t seed = 3;
    for (int i = 0; i < NX * 3; i++)
        xs[i] = (float)tu_uniform(&seed, 0, 1);
    for (int j = 0; j < NY * 3; j++)
        ys[j] = (float)tu_uniform(&seed, 0, 1);
    for (int j = 0; j < NY * 2; j++)
        bs[j] = (float)tu_uniform(&seed, -1, 1);
}

static void run(const sr_kernel *k, sr_ctx *ctx, float *out)
{
    const void *args[] = {xs, ys, bs, &gs};
    cr_assert_eq(sr_kernel_run(k, NX, NY, args, out), SR_OK, "%s", sr_ctx_error(ctx));
}

static void expect_close(const float *a, const float *b, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 2e-4f * (1 + fabsf(b[i])), "%s [%d]: %g vs %g", what, i,
                  a[i], b[i]);
}

static sr_kernel *make(sr_ctx *ctx, sr_device dev)
{
    sr_expr *f = diff_parse(ctx, gauss, al, 4);
    return diff_kernel(ctx, f, sr_kernel_desc_default(), dev);
}

/* A script standing for the compiler: --version answers, anything else runs body. */
static void script(char *path, const char *body)
{
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "#!/bin/sh\ncase \"$1\" in --version) echo fake-cc 1.0; exit 0;; esac\n%s\n", body);
    fclose(f);
    chmod(path, 0700);
}

static sr_plan_info plan_of(const sr_kernel *k)
{
    sr_plan_info p = {0};
    p.size = sizeof p;
    cr_assert_eq(sr_kernel_plan(k, &p), SR_OK);
    return p;
}

/* A context whose compiler is a script running body (path: its mkstemp template), with the
 * reference and the CPU kernel of the Gaussian made and run once each into ref and out. */
static sr_ctx *ctx_with_cc(char *path, const char *body, sr_kernel **kr, sr_kernel **k, float *ref,
                           float *out)
{
    fill();
    script(path, body);
    setenv("SYMRED_CC", path, 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    unsetenv("SYMRED_CC");
    *kr = make(ctx, SR_DEVICE_REFERENCE);
    run(*kr, ctx, ref);
    *k = make(ctx, SR_DEVICE_CPU);
    run(*k, ctx, out);
    return ctx;
}

/* Creation does not wait; the calls run the tile interpreter while the module compiles (a
 * compiler that takes two seconds), then the compiled code, both equal to the reference; the
 * plan and explain say which tier serves the calls. */
Test(async, tier0_then_compiled)
{
    char path[] = "/tmp/symred-slowcc-XXXXXX";
    static float ref[NX * 2], out[NX * 2];
    sr_kernel *kr, *k;
    sr_ctx *ctx = ctx_with_cc(path, "sleep 2; exec cc \"$@\"", &kr, &k, ref, out);
    expect_close(out, ref, NX * 2, "tier 0");
    sr_plan_info p = plan_of(k);
    cr_assert(p.tier == 0 && p.compiling == 1, "tier %d, compiling %d", p.tier, p.compiling);
    cr_assert(!p.module && !p.compile_error, "module %s, error %s", p.module, p.compile_error);
    /* The text of the pending stage stays valid once the stage changed (a caller may hold it). */
    const char *pending = sr_kernel_explain(k);
    cr_assert_eq(sr_kernel_wait(k, 120), SR_OK);
    p = plan_of(k);
    cr_assert(p.tier == 1 && p.compiling == 0, "tier %d, compiling %d", p.tier, p.compiling);
    cr_assert(p.module && strcmp(p.module, "compiled") == 0 && p.compile_ms > 0,
              "module from %s in %.1f ms", p.module ? p.module : "nowhere", p.compile_ms);
    /* explain follows the stage: its text is rebuilt once the compile has landed. */
    cr_assert(strcmp(sr_kernel_explain(k), pending) != 0, "%s", pending);
    memset(out, 0, sizeof out);
    run(k, ctx, out);
    expect_close(out, ref, NX * 2, "compiled");
    cr_assert_eq(sr_kernel_wait(NULL, 0), SR_EINVAL);
    sr_kernel_free(k);
    sr_kernel_free(kr);
    sr_ctx_free(ctx);
    unlink(path);
}

/* Kernels freed while their modules compile, and the context freed right after: nothing leaks
 * or crashes (the sanitizer build runs this), and the context's free waits for the compiles. */
Test(async, free_while_compiling)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const char *const forms[] = {"Exp(-SqDist(x, y) * g) * b", "Exp(-Norm2(x - y)) * b",
                                        "Inv(1 + SqDist(x, y) * g) * b"};
    for (int i = 0; i < 3; i++) {
        sr_expr *f = diff_parse(ctx, forms[i], al, 4);
        sr_kernel *k = diff_kernel(ctx, f, sr_kernel_desc_default(), SR_DEVICE_CPU);
        sr_kernel_free(k);
    }
    sr_ctx_free(ctx);
}

/* A compiler that fails, or hangs past SYMRED_COMPILE_TIMEOUT: the calls never wait, their
 * values stay right, the tile interpreter keeps serving, explain says why, and the context's own
 * error message is not the compiler's. */
Test(async, failing_or_hanging_compiler)
{
    fill();
    for (int mode = 0; mode < 2; mode++) {
        char path[] = "/tmp/symred-fakecc-XXXXXX";
        script(path, mode ? "sleep 30" : "echo 'fake-cc: error: no' >&2; exit 1");
        setenv("SYMRED_CC", path, 1);
        setenv("SYMRED_COMPILE_TIMEOUT", "1", 1);
        sr_ctx *ctx;
        cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
        unsetenv("SYMRED_CC");
        unsetenv("SYMRED_COMPILE_TIMEOUT");
        static float ref[NX * 2], out[NX * 2];
        sr_kernel *kr = make(ctx, SR_DEVICE_REFERENCE);
        run(kr, ctx, ref);
        double t0 = now_s();
        sr_kernel *k = make(ctx, SR_DEVICE_CPU);
        run(k, ctx, out);
        /* The hanging compiler sleeps 30 s and its timeout is 1 s: creation and the call
         * return long before either. */
        cr_assert(now_s() - t0 < 10.0, "the call waited %.3f s", now_s() - t0);
        expect_close(out, ref, NX * 2, mode ? "hanging compiler" : "failing compiler");
        cr_assert_eq(sr_kernel_wait(k, 60), SR_OK);
        sr_plan_info p = plan_of(k);
        const char *why = p.compile_error;
        cr_assert(p.tier == 0 && !p.compiling && why, "tier %d, compiling %d:\n%s", p.tier,
                  p.compiling, sr_kernel_explain(k));
        cr_assert(mode ? strstr(why, "timeout") || strstr(why, "timed out") || strstr(why, "killed")
                       : strstr(why, "fake-cc: error") != NULL,
                  "%s", why);
        cr_assert(!strstr(sr_ctx_error(ctx), "fake-cc"), "%s", sr_ctx_error(ctx));
        run(k, ctx, out);
        expect_close(out, ref, NX * 2, "after the failure");
        sr_kernel_free(k);
        sr_kernel_free(kr);
        sr_ctx_free(ctx);
        unlink(path);
    }
}

/* Many threads calling one kernel across the switch from the tile interpreter to the compiled
 * module: every call's values are right (a call runs one tier whole). */
struct caller {
    const sr_kernel *k;
    sr_ctx *ctx;
    const float *ref;
    int bad;
};

static void *call_loop(void *arg)
{
    struct caller *c = arg;
    float *out = malloc(sizeof(float) * NX * 2);
    const void *args[] = {xs, ys, bs, &gs};
    for (int it = 0; it < 40; it++) {
        if (sr_kernel_run(c->k, NX, NY, args, out) != SR_OK)
            c->bad++;
        for (int i = 0; i < NX * 2; i++)
            if (!(fabsf(out[i] - c->ref[i]) <= 2e-4f * (1 + fabsf(c->ref[i]))))
                c->bad++;
    }
    free(out);
    return NULL;
}

Test(async, threads_across_the_switch)
{
    fill();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_NUM_THREADS", "1"), SR_OK);
    static float ref[NX * 2];
    sr_kernel *kr = make(ctx, SR_DEVICE_REFERENCE);
    run(kr, ctx, ref);
    sr_kernel *k = make(ctx, SR_DEVICE_CPU);
    pthread_t th[4];
    struct caller c[4];
    for (int t = 0; t < 4; t++) {
        c[t] = (struct caller){k, ctx, ref, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, call_loop, &c[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(c[t].bad, 0, "thread %d: %d wrong values or failed calls", t, c[t].bad);
    }
    sr_kernel_free(k);
    sr_kernel_free(kr);
    sr_ctx_free(ctx);
}

/* A context freed while its compiles hang: after its grace period the compilers are killed,
 * so sr_ctx_free returns in seconds (not after the compiler's 30 s or SYMRED_COMPILE_TIMEOUT),
 * and the kernel served right until then. */
Test(async, context_freed_while_compiler_hangs)
{
    char path[] = "/tmp/symred-fakecc-XXXXXX";
    static float ref[NX * 2], out[NX * 2];
    sr_kernel *kr, *k;
    sr_ctx *ctx = ctx_with_cc(path, "sleep 30", &kr, &k, ref, out);
    expect_close(out, ref, NX * 2, "before the free");
    cr_assert_eq(sr_kernel_wait(k, 0.2), SR_ETIMEDOUT);
    sr_kernel_free(k);
    sr_kernel_free(kr);
    double t0 = now_s();
    sr_ctx_free(ctx);
    /* Not the compiler's 30 s, nor the 120 s timeout. */
    cr_assert(now_s() - t0 < 10.0, "sr_ctx_free took %.2f s", now_s() - t0);
    unlink(path);
}
