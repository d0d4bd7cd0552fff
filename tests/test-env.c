/*
 * test-env.c — options from the environment and the kernel's accumulation option: a malformed
 * SYMRED_* value is an error naming the variable (never silently a default), and every
 * accumulation mode gives the reference's sums.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static const char *const vars[] = {
    "SYMRED_LOG",      "SYMRED_ACC",      "SYMRED_NUM_THREADS", "SYMRED_DEVICE",
    "SYMRED_SIMPLIFY", "SYMRED_JIT_KEEP", "SYMRED_MEM_LIMIT",   "SYMRED_JIT_IDLE_MODULES"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}
TestSuite(env, .init = clear_env, .fini = clear_env);

/* Creates a Gaussian Sum kernel in a new context with `name=value` set; returns its status and
 * copies the context's message into msg. */
static sr_status try_kernel(const char *name, const char *value, char *msg, size_t cap)
{
    setenv(name, value, 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = sr_exp(ctx, sr_neg(ctx, sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2))));
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    snprintf(msg, cap, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    unsetenv(name);
    return st;
}

static void expect_rejected(const char *name, const char *value)
{
    char msg[512];
    sr_status st = try_kernel(name, value, msg, sizeof msg);
    cr_assert_eq(st, SR_EINVAL, "%s=%s was accepted (status %d)", name, value, st);
    cr_assert(strstr(msg, name) && strstr(msg, value), "message does not name %s=%s: %s", name,
              value, msg);
}

static void expect_accepted(const char *name, const char *value)
{
    char msg[512];
    sr_status st = try_kernel(name, value, msg, sizeof msg);
    cr_assert_eq(st, SR_OK, "%s=%s rejected: %s", name, value, msg);
}

Test(env, malformed_log_level) { expect_rejected("SYMRED_LOG", "verbose"); }
Test(env, log_level_out_of_range) { expect_rejected("SYMRED_LOG", "9"); }
Test(env, malformed_acc) { expect_rejected("SYMRED_ACC", "double"); }
Test(env, malformed_threads) { expect_rejected("SYMRED_NUM_THREADS", "two"); }
Test(env, zero_threads) { expect_rejected("SYMRED_NUM_THREADS", "0"); }
Test(env, malformed_device) { expect_rejected("SYMRED_DEVICE", "gpu"); }
Test(env, malformed_simplify) { expect_rejected("SYMRED_SIMPLIFY", "false"); }
Test(env, malformed_keep) { expect_rejected("SYMRED_JIT_KEEP", "yes"); }
Test(env, negative_idle_modules) { expect_rejected("SYMRED_JIT_IDLE_MODULES", "-1"); }

Test(env, valid_values_accepted)
{
    expect_accepted("SYMRED_LOG", "0");
    expect_accepted("SYMRED_ACC", "kahan");
    expect_accepted("SYMRED_NUM_THREADS", "1");
    expect_accepted("SYMRED_DEVICE", "reference");
    expect_accepted("SYMRED_SIMPLIFY", "0");
    expect_accepted("SYMRED_ACC", ""); /* empty means unset */
}

Test(env, unknown_acc_in_desc)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.acc = (sr_acc)7;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, sr_vi(ctx, 0, 1), &d, &k), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "accumulation"), "%s", sr_ctx_error(ctx));
    sr_ctx_free(ctx);
}

/* A float32 Sum over 50 000 terms of mixed magnitude in every accumulation mode, against the
 * reference (which sums in double): the modes differ in error, all stay within float32 range of
 * the exact sum, and the mode is the one explain reports. */
Test(env, accumulation_modes_match_reference)
{
    const int64_t nx = 3, ny = 50000;
    uint64_t rng = 42;
    float *x = malloc(nx * sizeof *x), *y = malloc(ny * sizeof *y);
    tu_fill(x, SR_F32, nx, 0, 1, &rng);
    tu_fill(y, SR_F32, ny, -3, 3, &rng);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = sr_exp(ctx, sr_mul(ctx, sr_vi(ctx, 0, 1), sr_vj(ctx, 1, 1)));
    const void *args[] = {x, y};
    float ref[3], out[3];
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(k, nx, ny, args, ref), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
    static const struct {
        sr_acc acc;
        const char *name;
    } modes[] = {{SR_ACC_BLOCK, "block"}, {SR_ACC_KAHAN, "kahan"}, {SR_ACC_F64, "f64"}};
    for (int m = 0; m < 3; m++) {
        d = sr_kernel_desc_default();
        d.device = SR_DEVICE_CPU;
        d.acc = modes[m].acc;
        cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
        if (tu_runs_jit(k))
            cr_assert_eq(tu_plan(k).acc, modes[m].acc, "%s:\n%s", modes[m].name,
                         sr_kernel_explain(k));
        cr_assert_eq(sr_kernel_run(k, nx, ny, args, out), SR_OK, "%s", sr_ctx_error(ctx));
        for (int i = 0; i < nx; i++)
            cr_assert(tu_close(out[i], ref[i], 2e-5, 0), "%s row %d: %.9g vs reference %.9g",
                      modes[m].name, i, out[i], ref[i]);
        sr_kernel_free(k);
    }
    sr_ctx_free(ctx);
    free(x);
    free(y);
}

/* Creates a Sum of SqDist in ctx: whether its plan says the simplifier ran in *simplified, the
 * explain text or the error message copied into ex (for messages). */
static sr_status simplified_in(sr_ctx *ctx, int *simplified, char *ex, size_t cap)
{
    sr_expr *f = sr_sum(ctx, sr_square(ctx, sr_sub(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2))));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    snprintf(ex, cap, "%s", st == SR_OK ? sr_kernel_explain(k) : sr_ctx_error(ctx));
    *simplified = st == SR_OK ? tu_plan(k).simplified : -1;
    sr_kernel_free(k);
    return st;
}

/* The environment is read when a context is created: a variable set afterwards, well-formed or
 * not, changes nothing in that context; a context created afterwards sees it. */
Test(env, read_once_at_context_creation)
{
    sr_ctx *before, *after;
    char ex[8192];
    int simp;
    cr_assert_eq(sr_ctx_new(&before), SR_OK);
    setenv("SYMRED_SIMPLIFY", "0", 1);
    cr_assert_eq(simplified_in(before, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    cr_assert_eq(simp, 1, "set after creation, yet applied:\n%s", ex);
    cr_assert_eq(sr_ctx_new(&after), SR_OK);
    cr_assert_eq(simplified_in(after, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    cr_assert_eq(simp, 0, "a new context ignores SYMRED_SIMPLIFY=0:\n%s", ex);
    sr_ctx_free(after);
    /* A malformed value set after creation does not fail the context that was created before. */
    setenv("SYMRED_DEVICE", "gpu", 1);
    cr_assert_eq(simplified_in(before, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    cr_assert_eq(sr_ctx_new(&after), SR_OK);
    cr_assert_eq(simplified_in(after, &simp, ex, sizeof ex), SR_EINVAL, "%s", ex);
    cr_assert(strstr(ex, "SYMRED_DEVICE=gpu"), "%s", ex);
    /* Setting that option fixes the context that read the malformed value. */
    cr_assert_eq(sr_ctx_set_option(after, "SYMRED_DEVICE", "cpu"), SR_OK, "%s",
                 sr_ctx_error(after));
    cr_assert_eq(simplified_in(after, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    sr_ctx_free(after);
    sr_ctx_free(before);
}

/* sr_ctx_set_option: the variables' names and values; NULL restores the default; unknown names,
 * per-process variables and malformed values are SR_EINVAL naming them. */
Test(env, set_option)
{
    sr_ctx *ctx;
    char ex[8192];
    int simp;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0"), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(simplified_in(ctx, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    cr_assert_eq(simp, 0, "%s", ex);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", NULL), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(simplified_in(ctx, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    cr_assert_eq(simp, 1, "%s", ex);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_MEM_LIMIT", "2KiB"), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_ctx_mem_limit(ctx), 2048);
    static const struct {
        const char *name, *value, *want;
    } bad[] = {
        {"SYMRED_SIMPLIFY", "false", "SYMRED_SIMPLIFY=false"},
        {"SYMRED_NUM_THREADS", "0", "SYMRED_NUM_THREADS=0"},
        {"SYMRED_MEM_LIMIT", "lots", "SYMRED_MEM_LIMIT=lots"},
        {"SYMRED_COLOUR", "blue", "no option named SYMRED_COLOUR"},
        {"SYMRED_CUDA_DEVICE", "1", "once per process"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(sr_ctx_set_option(ctx, bad[i].name, bad[i].value), SR_EINVAL, "%s=%s",
                     bad[i].name, bad[i].value);
        cr_assert(strstr(sr_ctx_error(ctx), bad[i].want), "%s", sr_ctx_error(ctx));
    }
    cr_assert_eq(sr_ctx_set_option(ctx, NULL, "1"), SR_EINVAL);
    cr_assert_eq(sr_ctx_set_option(NULL, "SYMRED_LOG", "1"), SR_EINVAL);
    /* The context stays usable. */
    cr_assert_eq(simplified_in(ctx, &simp, ex, sizeof ex), SR_OK, "%s", ex);
    sr_ctx_free(ctx);
}
