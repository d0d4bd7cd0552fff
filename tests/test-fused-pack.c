/*
 * test-fused-pack.c — the fused strategy's operands packed once per run (src/cpu/fused-run.c,
 * struct fused_pre) against the packing of each tile per row block, which a memory budget that
 * leaves no room beside the threads' workspaces selects: attention SumSoftMaxWeight((q|k) s, v)
 * over several row blocks and reduced tiles (sizes that are multiples of no tile, D = 64 and 40),
 * both runs the same bits, and both against softmax attention computed in double here.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Attention out = SumSoftMaxWeight((q|k) s, v) on a context with the memory budget lim (0:
 * none); returns the kernel's planned workspace bytes. */
static int64_t attention(int64_t lim, int64_t n, int64_t m, int d, const float *q, const float *k,
                         const float *v, float s, float *out)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    if (lim > 0)
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, lim), SR_OK);
    char a[4][32];
    snprintf(a[0], sizeof a[0], "q=Vi(%d)", d);
    snprintf(a[1], sizeof a[1], "k=Vj(%d)", d);
    snprintf(a[2], sizeof a[2], "s=Pm(1)");
    snprintf(a[3], sizeof a[3], "v=Vj(%d)", d);
    const char *al[4] = {a[0], a[1], a[2], a[3]};
    sr_expr *f, *w;
    cr_assert_eq(sr_parse(ctx, "(q|k)*s", al, 4, &f), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "v", al, 4, &w), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_SUMSOFTMAXWEIGHT;
    desc.weight = w;
    desc.device = SR_DEVICE_CPU;
    sr_kernel *kern;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &kern), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(tu_runs_fused(kern), "%s", sr_kernel_explain(kern));
    const void *args[4] = {q, k, &s, v};
    cr_assert_eq(sr_kernel_run(kern, n, m, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    const int64_t ws = sr_kernel_workspace_bytes(kern);
    sr_kernel_free(kern);
    sr_ctx_free(ctx);
    return ws;
}

static void pack_case(int64_t n, int64_t m, int d)
{
    float *q = malloc(sizeof(float) * (size_t)(n * d)),
          *k = malloc(sizeof(float) * (size_t)(m * d));
    float *v = malloc(sizeof(float) * (size_t)(m * d)),
          *o1 = malloc(sizeof(float) * (size_t)(n * d));
    float *o2 = malloc(sizeof(float) * (size_t)(n * d));
    uint64_t st = 12345 + (uint64_t)(n * 7 + m * 3 + d);
    for (int64_t t = 0; t < n * d; t++)
        q[t] = (float)tu_uniform(&st, -1, 1);
    for (int64_t t = 0; t < m * d; t++) {
        k[t] = (float)tu_uniform(&st, -1, 1);
        v[t] = (float)tu_uniform(&st, -1, 1);
    }
    const float s = 1.0f / sqrtf((float)d);
    const int64_t ws = attention(0, n, m, d, q, k, v, s, o1);
    attention(ws, n, m, d, q, k, v, s, o2); /* no room for the shared packing */
    cr_assert(memcmp(o1, o2, sizeof(float) * (size_t)(n * d)) == 0,
              "n %lld m %lld d %d: packed once and per tile differ", (long long)n, (long long)m, d);
    double *p = malloc(sizeof(double) * (size_t)m);
    for (int64_t i = 0; i < n; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < m; j++) {
            double t = 0;
            for (int c = 0; c < d; c++)
                t += (double)q[i * d + c] * k[j * d + c];
            p[j] = t * s;
            mx = p[j] > mx ? p[j] : mx;
        }
        for (int64_t j = 0; j < m; j++)
            sum += (p[j] = exp(p[j] - mx));
        for (int c = 0; c < d; c++) {
            double e = 0;
            for (int64_t j = 0; j < m; j++)
                e += p[j] * v[j * d + c];
            e /= sum;
            cr_assert(fabs(o1[i * d + c] - e) <= 1e-5,
                      "n %lld m %lld d %d: out[%lld][%d] = %.9g, expected %.9g", (long long)n,
                      (long long)m, d, (long long)i, c, (double)o1[i * d + c], e);
        }
    }
    free(p);
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
}

Test(fused_pack, attention_packed_once_matches_per_tile)
{
    pack_case(1031, 1301, 64);
    pack_case(523, 1031, 40);
}
