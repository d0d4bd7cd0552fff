/*
 * test-budget.c — the memory budget (SYMRED_MEM_LIMIT, sr_ctx_set_mem_limit), the planner that
 * shrinks the workspace under it, SR_EBUDGET, and sr_kernel_eval_block.
 *
 * Kernels are cached on disk (SYMRED_CACHE_DIR: tu_jit_cache), so reruns do not compile.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_MEM_LIMIT");
    unsetenv("SYMRED_NUM_THREADS");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(budget, .init = setup, .fini = teardown);

/* ---- the parser ---- */

struct unit_case {
    const char *text;
    int64_t bytes;
};

Test(budget, parse_units)
{
    static const struct unit_case cases[] = {
        {"0", 0},
        {"12345", 12345},
        {"100B", 100},
        {"64MB", 64000000},
        {"64mb", 64000000},
        {"64 MB", 64000000},
        {"64M", 64000000},
        {"1GB", 1000000000},
        {"2GiB", 2147483648LL},
        {"512KiB", 524288},
        {"512kib", 524288},
        {"3KB", 3000},
        {"7MiB", 7340032},
        {"1TB", 1000000000000LL},
        {"1TiB", 1099511627776LL},
        {" 8GiB ", 8589934592LL},
    };
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        int64_t v = -1;
        sr_status st = sr__parse_bytes(cases[t].text, &v);
        cr_assert_eq(st, SR_OK, "'%s': status %d", cases[t].text, st);
        cr_assert_eq(v, cases[t].bytes, "'%s' gave %lld, expected %lld", cases[t].text,
                     (long long)v, (long long)cases[t].bytes);
    }
}

Test(budget, parse_malformed)
{
    static const char *const bad[] = {"",      "MB",   "-1",  "-64MB", "1.5GB", "64 XB",
                                      "64MBB", "0x10", "1e9", "GiB1",  "12 34", "64Mi"};
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        int64_t v = 42;
        cr_assert_eq(sr__parse_bytes(bad[t], &v), SR_EINVAL, "'%s' should be rejected", bad[t]);
    }
    int64_t v;
    cr_assert_eq(sr__parse_bytes("99999999999999999999", &v), SR_EOVERFLOW);
    cr_assert_eq(sr__parse_bytes("9000000000000TB", &v), SR_EOVERFLOW);
    cr_assert_eq(sr__parse_bytes(NULL, &v), SR_EINVAL);
}

Test(budget, env_sets_limit)
{
    sr_ctx *c;
    setenv("SYMRED_MEM_LIMIT", "64MB", 1);
    cr_assert_eq(sr_ctx_new(&c), SR_OK);
    unsetenv("SYMRED_MEM_LIMIT");
    cr_assert_eq(sr_ctx_mem_limit(c), 64000000, "limit %lld", (long long)sr_ctx_mem_limit(c));
    sr_ctx_free(c);
}

Test(budget, env_malformed_fails_kernel_new)
{
    sr_ctx *c;
    setenv("SYMRED_MEM_LIMIT", "64 megs", 1);
    cr_assert_eq(sr_ctx_new(&c), SR_OK);
    unsetenv("SYMRED_MEM_LIMIT");
    sr_expr *f = sr_sqdist(c, sr_vi(c, 0, 3), sr_vj(c, 1, 3));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(c, f, &d, &k), SR_EINVAL);
    cr_assert_null(k);
    const char *msg = sr_ctx_error(c);
    cr_assert(strstr(msg, "SYMRED_MEM_LIMIT") && strstr(msg, "64 megs"), "message: %s", msg);
    sr_ctx_free(c);
}

Test(budget, setter)
{
    cr_assert_eq(sr_ctx_mem_limit(ctx), 0);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 1 << 20), SR_OK);
    cr_assert_eq(sr_ctx_mem_limit(ctx), 1 << 20);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, -5), SR_EINVAL);
    cr_assert_eq(sr_ctx_mem_limit(ctx), 1 << 20, "a rejected value must not change the limit");
    cr_assert_eq(sr_ctx_set_mem_limit(NULL, 5), SR_EINVAL);
    cr_assert_eq(sr_ctx_mem_limit(NULL), 0);
}

/* ---- planning under a budget ---- */

static sr_kernel *knn_kernel(sr_ctx *c, int D, sr_reduction red, int K, sr_device dev)
{
    sr_expr *f = sr_sqdist(c, sr_vi(c, 0, D), sr_vj(c, 1, D));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = K;
    d.device = dev;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c, f, &d, &k);
    cr_assert_eq(st, SR_OK, "kernel_new: %s", sr_ctx_error(c));
    return k;
}

Test(budget, ebudget_message_has_bytes)
{
    /* 100 bytes cannot hold even one row of KMin state with k = 50. */
    sr_ctx_set_mem_limit(ctx, 100);
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_KMIN;
    d.k = 50;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_EBUDGET, "%s", sr_ctx_error(ctx));
    cr_assert_null(k);
    const char *msg = sr_ctx_error(ctx);
    cr_assert(strstr(msg, "needs") && strstr(msg, "bytes") && strstr(msg, "100 bytes"),
              "message: %s", msg);
    /* The number it states is enough: with that budget the kernel is created. */
    const char *p = strstr(msg, "needs ");
    cr_assert_not_null(p);
    long long need = atoll(p + 6);
    cr_assert_gt(need, 100, "need %lld", need);
    sr_ctx_set_mem_limit(ctx, need);
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_leq(sr_kernel_workspace_bytes(k), need);
    sr_kernel_free(k);
}

Test(budget, ebudget_reference)
{
    sr_ctx_set_mem_limit(ctx, 64);
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 30), sr_vj(ctx, 1, 30));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_EBUDGET);
    cr_assert(strstr(sr_ctx_error(ctx), "bytes"), "%s", sr_ctx_error(ctx));
}

Test(budget, workspace_under_budget)
{
    static const int64_t budgets[] = {0, 64 << 20, 1 << 20, 256 << 10, 64 << 10, 16 << 10};
    static const sr_reduction reds[] = {SR_SUM, SR_ARGKMIN, SR_LOGSUMEXP};
    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++)
        for (size_t r = 0; r < 3; r++) {
            sr_ctx_set_mem_limit(ctx, budgets[b]);
            sr_kernel *k = knn_kernel(ctx, 5, reds[r], 4, SR_DEVICE_CPU);
            int64_t ws = sr_kernel_workspace_bytes(k);
            cr_assert_gt(ws, 0);
            if (budgets[b])
                cr_assert_leq(ws, budgets[b], "budget %lld: workspace %lld", (long long)budgets[b],
                              (long long)ws);
            cr_assert_eq(tu_plan(k).workspace_bytes, ws, "%s", sr_kernel_explain(k));
            sr_kernel_free(k);
        }
}

/* A kernel is planned under the budget of its creation: a budget set afterwards leaves its plan
 * (its tiles) as it is and bounds its later calls (their threads), and a call under it gives the
 * same values. */
Test(budget, set_after_creation)
{
    sr_kernel *k = knn_kernel(ctx, 4, SR_SUM, 1, SR_DEVICE_CPU);
    cr_assert_eq(sr_kernel_wait(k, 60), SR_OK);
    const sr_plan_info p0 = tu_plan(k);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, p0.workspace_per_thread), SR_OK);
    const sr_plan_info p1 = tu_plan(k);
    cr_assert_eq(p1.tile_rows, p0.tile_rows);
    cr_assert_eq(p1.tile_cols, p0.tile_cols);
    cr_assert_eq(p1.workspace_per_thread, p0.workspace_per_thread);
    cr_assert_eq(p1.threads, 1, "%d threads under a budget of one thread's workspace", p1.threads);
    enum { NX = 37, NY = 5003 };
    float x[NX * 4], *y = malloc(sizeof(float) * NY * 4), o1[NX], o2[NX];
    uint64_t s = 11;
    tu_fill(x, SR_F32, NX * 4, -1, 1, &s);
    tu_fill(y, SR_F32, NY * 4, -1, 1, &s);
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, NX, NY, args, o1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    cr_assert_eq(tu_plan(k).threads, p0.threads);
    cr_assert_eq(sr_kernel_run(k, NX, NY, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    for (int i = 0; i < NX; i++)
        cr_assert(tu_close(o1[i], o2[i], 1e-5, 1e-5), "[%d] %g vs %g", i, o1[i], o2[i]);
    free(y);
    sr_kernel_free(k);
}

/* A reduction under a tiny budget gives the reference's results. */
static void tiny_budget_case(sr_reduction red, int K, int64_t nx, int64_t ny, int64_t budget)
{
    const int D = 4;
    uint64_t s = 7 + (uint64_t)red;
    float *x = malloc(sizeof(float) * (size_t)(nx * D)),
          *y = malloc(sizeof(float) * (size_t)(ny * D));
    tu_fill(x, SR_F32, nx * D, -1, 1, &s);
    tu_fill(y, SR_F32, ny * D, -1, 1, &s);
    sr_kernel *kr = knn_kernel(ctx, D, red, K, SR_DEVICE_REFERENCE);
    sr_ctx_set_mem_limit(ctx, budget);
    sr_kernel *kj = knn_kernel(ctx, D, red, K, SR_DEVICE_CPU);
    cr_assert_leq(sr_kernel_workspace_bytes(kj), budget);
    sr_ctx_set_mem_limit(ctx, 0);
    int od = sr_kernel_out_dim(kj);
    bool idx = red == SR_ARGKMIN || red == SR_ARGMIN;
    size_t esz = idx ? 8 : 4;
    void *o1 = calloc((size_t)(nx * od), esz), *o2 = calloc((size_t)(nx * od), esz);
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(kr, nx, ny, args, o1), SR_OK);
    cr_assert_eq(sr_kernel_run(kj, nx, ny, args, o2), SR_OK, "%s", sr_ctx_error(ctx));
    for (int64_t t = 0; t < nx * od; t++) {
        if (idx)
            cr_assert_eq(((int64_t *)o1)[t], ((int64_t *)o2)[t], "[%lld] %lld vs %lld",
                         (long long)t, (long long)((int64_t *)o1)[t],
                         (long long)((int64_t *)o2)[t]);
        else
            cr_assert(tu_close(((float *)o1)[t], ((float *)o2)[t], 1e-4, 1e-5), "[%lld] %g vs %g",
                      (long long)t, ((float *)o1)[t], ((float *)o2)[t]);
    }
    sr_kernel_free(kr);
    sr_kernel_free(kj);
    free(x);
    free(y);
    free(o1);
    free(o2);
}

Test(budget, tiny_budget_sum) { tiny_budget_case(SR_SUM, 1, 131, 5003, 8 << 10); }
Test(budget, tiny_budget_argkmin) { tiny_budget_case(SR_ARGKMIN, 5, 7, 9001, 8 << 10); }
Test(budget, tiny_budget_argmin_few_rows) { tiny_budget_case(SR_ARGMIN, 1, 3, 20011, 4 << 10); }

/* ---- eval_block ---- */

static void block_case(sr_dtype dt, int64_t nx, int64_t ny, int64_t i0, int64_t ni, int64_t j0,
                       int64_t nj)
{
    const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)"};
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, "Concat(Exp(-SqDist(x,y)*g), x*y)", aliases, 3, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    d.reduction = SR_MIN; /* the reduction does not matter to eval_block */
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    size_t esz = dt == SR_F64 ? 8 : 4;
    uint64_t s = 99;
    void *x = malloc(esz * (size_t)(nx * 3)), *y = malloc(esz * (size_t)(ny * 3));
    double g64 = 0.7;
    float g32 = 0.7f;
    tu_fill(x, dt, nx * 3, -1, 1, &s);
    tu_fill(y, dt, ny * 3, -1, 1, &s);
    const void *args[] = {x, y, dt == SR_F64 ? (const void *)&g64 : (const void *)&g32};
    void *out = malloc(esz * (size_t)(ni * nj * 4) + 1);
    cr_assert_eq(sr_kernel_eval_block(k, nx, ny, args, i0, ni, j0, nj, out), SR_OK, "%s",
                 sr_ctx_error(ctx));
    for (int64_t i = 0; i < ni; i++)
        for (int64_t j = 0; j < nj; j++) {
            double xv[3], yv[3], d2 = 0;
            for (int c = 0; c < 3; c++) {
                xv[c] =
                    dt == SR_F64 ? ((double *)x)[(i0 + i) * 3 + c] : ((float *)x)[(i0 + i) * 3 + c];
                yv[c] =
                    dt == SR_F64 ? ((double *)y)[(j0 + j) * 3 + c] : ((float *)y)[(j0 + j) * 3 + c];
                d2 += (xv[c] - yv[c]) * (xv[c] - yv[c]);
            }
            double want[4] = {exp(-d2 * 0.7), xv[0] * yv[0], xv[1] * yv[1], xv[2] * yv[2]};
            for (int c = 0; c < 4; c++) {
                size_t at = (size_t)((i * nj + j) * 4 + c);
                double got = dt == SR_F64 ? ((double *)out)[at] : ((float *)out)[at];
                cr_assert(tu_close(got, want[c], dt == SR_F64 ? 1e-12 : 1e-5, 1e-6),
                          "(%lld,%lld)[%d]: %g vs %g", (long long)i, (long long)j, c, got, want[c]);
            }
        }
    sr_kernel_free(k);
    free(x);
    free(y);
    free(out);
}

Test(budget, eval_block_f32) { block_case(SR_F32, 50, 70, 3, 17, 11, 29); }
Test(budget, eval_block_f64_whole) { block_case(SR_F64, 13, 7, 0, 13, 0, 7); }
Test(budget, eval_block_single) { block_case(SR_F32, 5, 5, 4, 1, 4, 1); }

Test(budget, eval_block_errors)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2));
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK);
    float x[8] = {0}, y[8] = {0}, out[16];
    const void *args[] = {x, y};
    const void *nulls[] = {x, NULL};
    cr_assert_eq(sr_kernel_eval_block(NULL, 4, 4, args, 0, 1, 0, 1, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 2, 3, 0, 1, out), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "not inside"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 0, 1, 3, 2, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, -1, 1, 0, 1, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 0, -1, 0, 1, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, nulls, 0, 1, 0, 1, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, NULL, 0, 1, 0, 1, out), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 0, 1, 0, 1, NULL), SR_EINVAL);
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 0, 0, 0, 1, NULL), SR_OK, "empty block");
    cr_assert_eq(sr_kernel_eval_block(k, 4, 4, args, 1, 3, 1, 3, out), SR_OK);
    sr_kernel_free(k);
}
