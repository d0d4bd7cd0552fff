/*
 * test-jit.c — the CPU JIT backend against the reference interpreter.
 *
 * Every op (several ops per kernel, joined with Concat, so the number of compiled kernels stays
 * small), every reduction on both axes in float32 and float64, sizes 0, 1, 7, 129 and 1000+ (not
 * multiples of any tile), the split of the reduced range over threads, NaN/Inf inputs, ties, the
 * accumulation modes, and the fallback when there is no compiler. The kernels are cached on disk
 * (SYMRED_CACHE_DIR: tu_jit_cache), so reruns do not compile.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/jit.h"
#include "symred.h"
#include "diff.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_ACC");
    unsetenv("SYMRED_NUM_THREADS");
    unsetenv("SYMRED_COMPILE_TIMEOUT");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(jit, .init = setup, .fini = teardown);

static sr_kernel *new_kernel(sr_expr *f, sr_kernel_desc d, sr_device dev)
{
    return diff_kernel(ctx, f, d, dev);
}

static sr_expr *parse(const char *formula, const char *const *aliases, int n)
{
    return diff_parse(ctx, formula, aliases, n);
}

/* ---- every op, every reduction, ties, NaN and Inf: the shared harness (diff.c) ------------ */

#define OPS(name, grp)                                                                             \
    Test(jit, ops_##name##_f32) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_F32); }                \
    Test(jit, ops_##name##_f64) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_F64); }                \
    Test(jit, ops_##name##_f16) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_F16); }                \
    Test(jit, ops_##name##_bf16) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_BF16); }
DIFF_OP_TESTS(OPS)

/* The op groups above (run by the CUDA emulator's test-cuda too) use every op of the table. */
Test(jit, op_groups_use_every_op)
{
    bool seen[OP_COUNT] = {false};
    for (int grp = 0; grp < DIFF_OP_GROUPS; grp++) {
        const char *const *al;
        const char *text = diff_op_group_formula(grp, &al);
        diff_mark_ops(parse(text, al, 4), seen);
    }
    for (int op = 0; op < OP_COUNT; op++)
        cr_expect(seen[op], "no op group of tests/diff.c uses %s", expr_ops[op].name);
}

Test(jit, knn_big_dim)
{
    static const char *al[] = {"q=Vi(64)", "p=Vj(64)"};
    sr_expr *f = parse("SqDist(q, p)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_KMIN_ARGKMIN;
    d.k = 7;
    for (int axis = 1; axis >= 0; axis--) {
        d.axis = axis;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        diff_run(ctx, kj, kr, 57, 1030, DIFF_GRID, -1, 1, 5, diff_tol_of(SR_F32), "knn D=64");
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
}

#define RED(R, name)                                                                               \
    Test(jit, red_##name##_f32) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F32); }                 \
    Test(jit, red_##name##_f64) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F64); }                 \
    Test(jit, red_##name##_f16) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F16); }                 \
    Test(jit, red_##name##_bf16) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_BF16); }
DIFF_RED_TESTS(RED)

#define SPECIAL(name, R, gen, k, f)                                                                \
    Test(jit, name) { diff_special(ctx, SR_DEVICE_CPU, R, gen, k, f); }
DIFF_SPECIAL_TESTS(SPECIAL)

/* Rows where every term is -inf, +inf, or a NaN: the LogSumExp special cases. */
Test(jit, logsumexp_all_infinite)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = parse("x + y", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_LOGSUMEXP;
    d.dtype = SR_F64;
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_CPU);
    double x[4] = {-INFINITY, INFINITY, NAN, 0.0}, y[3] = {1.0, 2.0, -5.0}, out[4];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, 4, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    double lse0 = log(exp(1.0) + exp(2.0) + exp(-5.0));
    cr_assert(isinf(out[0]) && out[0] < 0, "all -inf: got %g", out[0]);
    cr_assert(isinf(out[1]) && out[1] > 0, "+inf terms: got %g", out[1]);
    cr_assert(isnan(out[2]), "NaN terms: got %g", out[2]);
    cr_assert(tu_close(out[3], lse0, 1e-12, 0), "finite: got %.17g, expected %.17g", out[3], lse0);
    sr_kernel_free(k);
}

/* Exp in its underflow range (docs/semantics.md, "Exp"): the JIT returns 0 where the result
 * would be below 1.7e-38 (float32) / 3.4e-308 (float64), exactly the C library's value above,
 * and NaN, +-inf as the C library. Each argument is its own row, so every SIMD lane pattern of
 * in-range and out-of-range arguments occurs across the 16-wide vectors. */
static void exp_underflow(sr_dtype dt)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = parse("Exp(x + y)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_CPU);
    const bool f32 = dt == SR_F32;
    const double lim = f32 ? 1.7e-38 : 3.4e-308, lo = f32 ? -87.0 : -708.0;
    static const double special[] = {NAN, -INFINITY, INFINITY, -1e30, -1000.0, -200.0, 0.0, 1.0};
    enum { N = 611 };
    double xd[N], yd[1] = {0.0}, od[N];
    float xf[N], yf[1] = {0.0f}, of[N];
    for (int i = 0; i < N; i++) {
        /* A sweep through [lo - 40, lo + 20] with the special values mixed in. */
        xd[i] = i % 13 == 0 ? special[(i / 13) % 8] : lo - 40.0 + 60.0 * i / N;
        xf[i] = (float)xd[i];
    }
    const void *args[] = {f32 ? (const void *)xf : xd, f32 ? (const void *)yf : yd};
    cr_assert_eq(sr_kernel_run(k, N, 1, args, f32 ? (void *)of : od), SR_OK, "%s",
                 sr_ctx_error(ctx));
    for (int i = 0; i < N; i++) {
        const double a = f32 ? (double)xf[i] : xd[i], got = f32 ? (double)of[i] : od[i];
        const double want = f32 ? (double)expf((float)a) : exp(a);
        if (isnan(a))
            cr_assert(isnan(got), "Exp(NaN) = %g", got);
        else if (want < lim)
            cr_assert(got == 0.0 || got == want, "Exp(%.9g) = %g, expected 0 (C library %g)", a,
                      got, want);
        else
            cr_assert(tu_close(got, want, f32 ? 1e-6 : 1e-14, 0), "Exp(%.9g) = %.17g, not %.17g", a,
                      got, want);
        if (a < lo - 0.5)
            cr_assert(got == 0.0, "Exp(%.9g) = %g: below the clamp it must be 0", a, got);
    }
    sr_kernel_free(k);
}
Test(jit, exp_underflow_f32) { exp_underflow(SR_F32); }
Test(jit, exp_underflow_f64) { exp_underflow(SR_F64); }

/* A scalar weight multiplies the finished sum (docs/semantics.md): w = +inf and a vector with
 * a zero component give +inf, not inf * 0 = NaN, through WeightedSqNorm (SqNormIso),
 * WeightedSqDist and an i-only norm, unrolled (D = 3) and as a loop (D = 70), in
 * sr_kernel_run and sr_kernel_eval_block. Row 1 has a finite weight: w * sum of squares. */
static void weighted_scalar(sr_dtype dt, int D)
{
    char ax[32], ay[32];
    snprintf(ax, sizeof ax, "x=Vi(%d)", D);
    snprintf(ay, sizeof ay, "y=Vj(%d)", D);
    const char *al[] = {ax, ay, "w=Vi(1)"};
    sr_expr *f = parse("Concat(Concat(SqNormIso(w, x - y), WeightedSqDist(w, x, y)), "
                       "SqNormIso(w, x))",
                       al, 3);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_CPU);
    enum { DMAX = 70 };
    double x[2 * DMAX], y[DMAX], w[2] = {INFINITY, 2.0};
    double sx = 0, sd = 0; /* row 1's sums of squares of x and of x - y */
    for (int c = 0; c < D; c++) {
        y[c] = c == 1 ? 0.0 : 0.5 * c;
        x[c] = c == 0 ? 0.0 : y[c] + 1.0; /* row 0: x_0 = 0 = y_0, the other components differ */
        x[D + c] = 0.25 * c;
        sx += x[D + c] * x[D + c];
        sd += (x[D + c] - y[c]) * (x[D + c] - y[c]);
    }
    float xf[2 * DMAX], yf[DMAX], wf[2] = {INFINITY, 2.0f};
    for (int c = 0; c < 2 * D; c++)
        xf[c] = (float)x[c];
    for (int c = 0; c < D; c++)
        yf[c] = (float)y[c];
    const bool f32 = dt == SR_F32;
    const void *args[] = {f32 ? (const void *)xf : x, f32 ? (const void *)yf : y,
                          f32 ? (const void *)wf : w};
    const double want[2][3] = {{INFINITY, INFINITY, INFINITY}, {2 * sd, 2 * sd, 2 * sx}};
    for (int how = 0; how < 2; how++) {
        double od[6];
        float of[6];
        void *out = f32 ? (void *)of : od;
        sr_status st = how == 0 ? sr_kernel_run(k, 2, 1, args, out)
                                : sr_kernel_eval_block(k, 2, 1, args, 0, 2, 0, 1, out);
        cr_assert_eq(st, SR_OK, "%s", sr_ctx_error(ctx));
        for (int i = 0; i < 2; i++)
            for (int c = 0; c < 3; c++) {
                double got = f32 ? (double)of[i * 3 + c] : od[i * 3 + c];
                cr_assert(got == want[i][c] || tu_close(got, want[i][c], 1e-5, 0),
                          "%s D=%d %s row %d output %d: %g, expected %g", f32 ? "f32" : "f64", D,
                          how ? "eval_block" : "run", i, c, got, want[i][c]);
            }
    }
    sr_kernel_free(k);
}
Test(jit, weighted_scalar_f32) { weighted_scalar(SR_F32, 3); }
Test(jit, weighted_scalar_f64) { weighted_scalar(SR_F64, 3); }
Test(jit, weighted_scalar_loop_f32) { weighted_scalar(SR_F32, 70); }
Test(jit, weighted_scalar_loop_f64) { weighted_scalar(SR_F64, 70); }

/* ---- accumulation, threads, explain ----------------------------------------------------- */

/* A Sum on the CPU JIT in a context created with var=value, against the reference; acc: the
 * accumulation its plan must state (SR_ACC_DEFAULT: any). */
static void sum_with_env(const char *var, const char *value, sr_acc acc)
{
    setenv(var, value, 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_ctx *save = ctx;
    ctx = c2;
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    sr_expr *f = parse("Exp(-SqDist(x, y)) + 1e-3", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU), *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
    const char *ex = sr_kernel_explain(kj);
    if (acc != SR_ACC_DEFAULT)
        cr_assert_eq(tu_plan(kj).acc, acc, "%s", ex);
    if (strcmp(var, "SYMRED_NUM_THREADS") == 0)
        cr_assert_eq(tu_plan(kj).threads, atoi(value), "%s", ex);
    diff_run(ctx, kj, kr, 5, 100000, DIFF_UNIFORM, -1, 1, 3, (struct diff_tol){2e-5, 0}, value);
    diff_run(ctx, kj, kr, 300, 3000, DIFF_UNIFORM, -1, 1, 4, (struct diff_tol){2e-5, 0}, value);
    sr_kernel_free(kj);
    sr_kernel_free(kr);
    ctx = save;
    sr_ctx_free(c2);
    unsetenv(var);
}

Test(jit, acc_block) { sum_with_env("SYMRED_ACC", "block", SR_ACC_BLOCK); }
Test(jit, acc_kahan) { sum_with_env("SYMRED_ACC", "kahan", SR_ACC_KAHAN); }
Test(jit, acc_f64) { sum_with_env("SYMRED_ACC", "f64", SR_ACC_F64); }
Test(jit, one_thread) { sum_with_env("SYMRED_NUM_THREADS", "1", SR_ACC_DEFAULT); }

/* Register blocking of the fused Sum: several output rows per pass over a tile, the rest by the
 * single-row loop; row counts around the rows per pass and the block of 64 rows, both
 * accumulations of float32, float64, a scalar and a vector formula (inputs in [0, 1]; the vector
 * sums cancel, hence the absolute tolerance). */
static void blocked_sum(const char *formula, int rows_per_pass)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = parse(formula, al, 4);
    static const int64_t nx[] = {1, 2, 3, 4, 5, 7, 64, 65, 67, 131};
    for (int v = 0; v < 3; v++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.dtype = v == 2 ? SR_F64 : SR_F32;
        d.acc = v == 1 ? SR_ACC_KAHAN : SR_ACC_BLOCK;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        cr_assert_eq(tu_plan(kj).rows_per_pass, rows_per_pass, "%s", sr_kernel_explain(kj));
        for (size_t q = 0; q < sizeof nx / sizeof *nx; q++)
            diff_run(ctx, kj, kr, nx[q], 1000 + (int64_t)q, DIFF_UNIFORM, 0, 1, 7 + q,
                     (struct diff_tol){2e-5, 1e-4}, formula);
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
}

Test(jit, register_blocking_scalar) { blocked_sum("SqDist(x,y)*g*b", 3); }
Test(jit, register_blocking_vector) { blocked_sum("(x-y)*g*b", 2); }
Test(jit, register_blocking_not_for_the_gaussian) { blocked_sum("Exp(-SqDist(x,y)*g)*b", 1); }

Test(jit, direct_plan)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = parse("Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_AUTO);
    const char *ex = sr_kernel_explain(k);
    sr_plan_info p = tu_plan(k);
    cr_assert(tu_runs_jit(k) && p.strategy == SR_STRATEGY_DIRECT && p.tier == 1, "%s", ex);
    cr_assert(p.tile_rows > 0 && p.tile_cols > 0 && p.threads >= 1, "%s", ex);
    cr_assert_eq(p.acc, SR_ACC_BLOCK, "%s", ex);
    cr_assert(p.module && p.module_cache && p.compile_ms >= 0, "%s", ex);
    /* The generated code is compiled without fast-math, whose reassociations the accumulation
     * modes and the NaN and infinity semantics forbid. */
    const char *flags = jit_cflags_text();
    cr_assert(strstr(flags, "-fno-math-errno"), "%s", flags);
    cr_assert_null(strstr(flags, "ffast-math"), "fast-math must not be used: %s", flags);
    sr_kernel_free(k);
}

/* The same kernel twice in one context: the second comes from the context's memory. */
Test(jit, memory_cache_hit)
{
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    sr_expr *f = parse("SqDist(x, y)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_MIN;
    sr_kernel *k1 = new_kernel(f, d, SR_DEVICE_CPU), *k2 = new_kernel(f, d, SR_DEVICE_CPU);
    const char *m = tu_plan(k2).module;
    cr_assert(m && strcmp(m, "memory") == 0, "second kernel's module from %s:\n%s",
              m ? m : "nowhere", sr_kernel_explain(k2));
    sr_kernel_free(k1);
    float x[4] = {0, 0, 1, 1}, y[2] = {1, 0}, out[2];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k2, 2, 1, args, out), SR_OK);
    cr_assert(out[0] == 1.0f && out[1] == 1.0f, "got %g %g", out[0], out[1]);
    sr_kernel_free(k2);
}

/* ---- no compiler, failing compiler --------------------------------------------------------- */

Test(jit, no_compiler_falls_back)
{
    setenv("SYMRED_CC", "/nonexistent/cc", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_ctx *save = ctx;
    ctx = c2;
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = parse("Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_str_eq(k->backend->name, "tile interpreter");
    float x[3] = {0, 0, 0}, y[6] = {0, 0, 0, 1, 0, 0}, b[2] = {1, 2}, g = 1, out[1];
    const void *args[] = {x, y, b, &g};
    cr_assert_eq(sr_kernel_run(k, 1, 2, args, out), SR_OK);
    float expect = 1.0f + 2.0f * expf(-1.0f);
    cr_assert(fabsf(out[0] - expect) < 1e-6f, "got %g, expected %g", out[0], expect);
    sr_kernel_free(k);
    ctx = save;
    sr_ctx_free(c2);
    unsetenv("SYMRED_CC");
}

Test(jit, failing_compiler_reports_ecompile)
{
    /* A compiler that runs and fails (with diagnostics) is an error, not a silent fallback. */
    char script[] = "/tmp/symred-badcc-XXXXXX";
    int fd = mkstemp(script);
    cr_assert(fd >= 0);
    const char *text = "#!/bin/sh\necho 'kernel.c:1: error: something broke' >&2\nexit 1\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(script, 0700);
    setenv("SYMRED_CC", script, 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(c2, "x*y", al, 2, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c2, f, &d, &k);
    cr_assert_eq(st, SR_ECOMPILE, "status %d (%s)", st, sr_ctx_error(c2));
    cr_assert_null(k);
    cr_assert(strstr(sr_ctx_error(c2), "something broke"), "message: %s", sr_ctx_error(c2));
    /* The context stays usable: the reference still works. */
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(c2, f, &d, &k), SR_OK);
    sr_kernel_free(k);
    sr_ctx_free(c2);
    unlink(script);
    unsetenv("SYMRED_CC");
}

/* ---- a compiler that hangs: timeout and interruption ---------------------------------------- */

/* A fake compiler at script: it answers --version at once unless hang_version, and otherwise
 * writes its process id (its process group's, as symred starts it in a group of its own) to
 * pidfile and sleeps far longer than any test may run. */
static void hanging_cc(char *script, char *pidfile, bool hang_version)
{
    int fd = mkstemp(script);
    cr_assert(fd >= 0);
    close(fd);
    fd = mkstemp(pidfile);
    cr_assert(fd >= 0);
    close(fd);
    unlink(pidfile);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\n%secho $$ > %s.tmp && mv %s.tmp %s\nsleep 300\n",
            hang_version ? "" : "case \"$1\" in --version) echo fakecc 1.0; exit 0;; esac\n",
            pidfile, pidfile, pidfile);
    fclose(f);
    chmod(script, 0700);
    setenv("SYMRED_CC", script, 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
}

static long read_pid(const char *pidfile)
{
    long pid = 0;
    FILE *f = fopen(pidfile, "r");
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

/* Nothing of the compiler's process group is left (its children were killed with it; a
 * killed orphan may take a moment to be reaped by init, hence the bounded retries). */
static void assert_group_gone(const char *pidfile)
{
    long pid = read_pid(pidfile);
    cr_assert(pid > 1, "the fake compiler did not write its pid to %s", pidfile);
    int tries = 0;
    while (kill(-(pid_t)pid, 0) == 0 && tries++ < 500)
        usleep(10000);
    cr_assert(kill(-(pid_t)pid, 0) != 0 && errno == ESRCH,
              "process group %ld of the compiler is still there", pid);
    unlink(pidfile);
}

static sr_status new_kernel_status(sr_ctx *c, sr_kernel **k)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(c, "x*y", al, 2, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    *k = NULL;
    return sr_kernel_new(c, f, &d, k);
}

/* Kernel creation in a fresh context (reading the environment as set now) fails with want and
 * a message containing needle. */
static void expect_new_kernel_fails(sr_status want, const char *needle)
{
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_kernel *k;
    sr_status st = new_kernel_status(c2, &k);
    cr_assert_eq(st, want, "status %d (%s)", st, sr_ctx_error(c2));
    cr_assert_null(k);
    cr_assert(strstr(sr_ctx_error(c2), needle), "message: %s", sr_ctx_error(c2));
    sr_ctx_free(c2);
}

static void compile_times_out(bool hang_version)
{
    char script[] = "/tmp/symred-hangcc-XXXXXX", pidfile[] = "/tmp/symred-hangpid-XXXXXX";
    hanging_cc(script, pidfile, hang_version);
    setenv("SYMRED_COMPILE_TIMEOUT", "1", 1);
    expect_new_kernel_fails(SR_ECOMPILE, "timed out");
    assert_group_gone(pidfile);
    unlink(script);
    unsetenv("SYMRED_COMPILE_TIMEOUT");
    unsetenv("SYMRED_CC");
}
/* The criterion timeout fails a test whose compile waits for the fake compiler's 300 s. */
Test(jit, hanging_compiler_times_out, .timeout = 60) { compile_times_out(false); }
Test(jit, hanging_version_query_times_out, .timeout = 60) { compile_times_out(true); }

static void on_usr1(int sig) { (void)sig; }
struct interrupter {
    pthread_t target;
    const char *pidfile;
};
/* Waits until the fake compiler runs, then signals the thread that waits for it. */
static void *interrupt_when_running(void *arg)
{
    const struct interrupter *in = arg;
    for (int i = 0; i < 3000 && read_pid(in->pidfile) <= 0; i++)
        usleep(10000);
    pthread_kill(in->target, SIGUSR1);
    return NULL;
}

/* A signal whose handler does not restart system calls (as Python's SIGINT handler) ends the
 * wait for the compiler: the compiler is killed and kernel creation returns at once. */
Test(jit, interrupted_compile_returns, .timeout = 60)
{
    char script[] = "/tmp/symred-hangcc-XXXXXX", pidfile[] = "/tmp/symred-hangpid-XXXXXX";
    hanging_cc(script, pidfile, false);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; /* no SA_RESTART */
    sigaction(SIGUSR1, &sa, NULL);
    struct interrupter in = {pthread_self(), pidfile};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, interrupt_when_running, &in), 0);
    expect_new_kernel_fails(SR_ECOMPILE, "interrupted");
    pthread_join(th, NULL);
    assert_group_gone(pidfile);
    unlink(script);
    unsetenv("SYMRED_CC");
}

/* A compiler killed midway (by a signal, as the OOM killer would) is SR_ECOMPILE naming the
 * signal, and the next kernel of another context with a working compiler is fine. */
static void compiler_killed_by(int sig)
{
    char script[] = "/tmp/symred-killedcc-XXXXXX";
    int fd = mkstemp(script);
    cr_assert(fd >= 0);
    char text[200];
    snprintf(text, sizeof text,
             "#!/bin/sh\ncase \"$1\" in --version) echo fakecc 1.0; exit 0;; esac\nkill -%d $$\n",
             sig);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(script, 0700);
    setenv("SYMRED_CC", script, 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    char want[64];
    snprintf(want, sizeof want, "killed by signal %d", sig);
    expect_new_kernel_fails(SR_ECOMPILE, want);
    unlink(script);
    unsetenv("SYMRED_CC");
    sr_kernel *k;
    cr_assert_eq(new_kernel_status(ctx, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
}
Test(jit, compiler_killed_midway) { compiler_killed_by(SIGKILL); }
Test(jit, compiler_crashing) { compiler_killed_by(SIGSEGV); }

/* A program that handles SIGCHLD (without SA_RESTART) still gets its kernels: the compiler's
 * own exit does not count as an interruption of the wait. */
static void on_chld(int sig) { (void)sig; }
Test(jit, sigchld_handler_does_not_interrupt)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_chld;
    sigaction(SIGCHLD, &sa, &old);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    for (int i = 0; i < 3; i++) {
        sr_kernel *k;
        sr_status st = new_kernel_status(c2, &k);
        cr_assert_eq(st, SR_OK, "kernel %d: %s", i, sr_ctx_error(c2));
        sr_kernel_free(k);
        sr_ctx_free(c2);
        cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    }
    sr_ctx_free(c2);
    sigaction(SIGCHLD, &old, NULL);
}

Test(jit, bad_compile_timeout_is_einval)
{
    setenv("SYMRED_COMPILE_TIMEOUT", "0", 1);
    expect_new_kernel_fails(SR_EINVAL, "SYMRED_COMPILE_TIMEOUT");
    unsetenv("SYMRED_COMPILE_TIMEOUT");
}

Test(jit, false_compiler_reports_ecompile)
{
    setenv("SYMRED_CC", "false", 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(c2, "x-y", al, 2, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c2, f, &d, &k);
    cr_assert_eq(st, SR_ECOMPILE, "status %d (%s)", st, sr_ctx_error(c2));
    sr_ctx_free(c2);
    unsetenv("SYMRED_CC");
}
