/*
 * test-gemm-form.c — the expansion of SqDist into norms and an inner product
 * (‖x‖² + ‖y‖² − 2⟨x, y⟩, the simplifier's sqdist-gemm) runs only on a gemm strategy.
 *
 * The expansion cancels where a distance is small beside the norms; the gemm-epilogue ranks
 * its candidates again exactly, the direct strategy has nothing to repair it with. So with
 * SYMRED_GEMM=off, an ArgKMin of SqDist at D = 32 (above the gemm crossover) must compute
 * SqDist directly (explain) and find the nearest neighbours of points far from the origin and
 * close to each other, which the expansion ranks wrongly in float32; with the gemm on, the
 * gemm-epilogue takes the expansion (explain). (On these points its candidates, chosen by the
 * expanded distances, miss the true neighbours: the re-ranking orders the candidates exactly
 * but cannot bring back one the expansion left out.)
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "symred.h"
#include "util.h"

enum { D = 32, NX = 5, NY = 61, K = 3 };

static sr_kernel *argkmin(sr_ctx *ctx)
{
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = K;
    d.dtype = SR_F32;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, sr_sqdist(ctx, x, y), &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* Points near (100, ..., 100): the squared norms are 3.2e5, rounded in float32 to about 0.03,
 * while the squared distances are below 0.02. y_j moves from the centre along coordinate
 * j mod D by (NY - j) 1e-3 plus a small jitter, so the nearest are the last ones; x_i moves by
 * 1e-4 i along coordinate 0. Checks k's indices against a float64 brute force. */
static void check_neighbours(const sr_kernel *k)
{
    static float x[NX * D], y[NY * D];
    uint64_t s = 5;
    for (int i = 0; i < NX * D; i++)
        x[i] = 100.0f;
    for (int i = 0; i < NX; i++)
        x[i * D] += 1e-4f * (float)i;
    for (int j = 0; j < NY; j++)
        for (int c = 0; c < D; c++)
            y[j * D + c] = 100.0f + (c == j % D ? 1e-3f * (float)(NY - j) : 0.0f) +
                           (float)tu_uniform(&s, -2e-5, 2e-5);
    int64_t idx[NX * K];
    const void *args[2] = {x, y};
    sr_run_desc r = {.nx = NX, .ny = NY, .nargs = 2, .args = args, .out_idx = idx};
    cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK);
    for (int i = 0; i < NX; i++) {
        double dist[NY];
        for (int j = 0; j < NY; j++) {
            dist[j] = 0;
            for (int c = 0; c < D; c++) {
                double t = (double)x[i * D + c] - (double)y[j * D + c];
                dist[j] += t * t;
            }
        }
        for (int q = 0; q < K; q++) { /* the q-th nearest, by selection */
            int best = -1;
            for (int j = 0; j < NY; j++) {
                bool taken = false;
                for (int p = 0; p < q; p++)
                    taken |= idx[i * K + p] == j;
                if (!taken && (best < 0 || dist[j] < dist[best]))
                    best = j;
            }
            cr_assert_eq(idx[i * K + q], best,
                         "row %d, neighbour %d: index %lld (distance %.3g), expected %d (%.3g)", i,
                         q, (long long)idx[i * K + q], dist[idx[i * K + q]], best, dist[best]);
        }
    }
}

Test(gemm_form, direct_computes_sqdist)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    setenv("SYMRED_GEMM", "off", 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_kernel *k = argkmin(ctx);
    const char *ex = sr_kernel_explain(k);
    cr_assert_eq(tu_plan(k).inner, SR_STRATEGY_DIRECT, "%s", ex);
    char f[512];
    cr_assert(strncmp(tu_formula(k, f, sizeof f), "SqDist(", 7) == 0, "the kernel runs %s", f);
    check_neighbours(k);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    unsetenv("SYMRED_GEMM");
}

Test(gemm_form, gemm_epilogue_takes_the_expansion)
{
    setenv("SYMRED_CACHE_DIR", tu_jit_cache(), 1);
    unsetenv("SYMRED_GEMM");
    unsetenv("SYMRED_GEMM_KERNEL");
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_kernel *k = argkmin(ctx);
    const char *ex = sr_kernel_explain(k);
    char f[512];
    bool expanded = strstr(tu_formula(k, f, sizeof f), "SqNorm2") != NULL;
    if (cpu_avx512_usable() || tu_blis_usable())
        cr_assert(tu_plan(k).inner == SR_STRATEGY_GEMM_EPILOGUE && expanded, "%s", ex);
    else
        cr_assert(!expanded, "the expansion ran: %s", f);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}
