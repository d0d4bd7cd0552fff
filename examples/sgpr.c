/*
 * sgpr.c — the K_uf K_fu product of a sparse (inducing-point) Gaussian process, in chunks sized
 * from a memory budget.
 *
 *     A = K_uf K_fu = sum over chunks C of K_uC K_uC^T,   (K_uf)_pt = exp(-g |z_p - x_t|^2)
 *
 * for m inducing points z_p and n data points x_t in R^D. The m x n matrix K_uf is never held:
 * sr_kernel_eval_block writes one m x c block of it at a time, with c chosen so that the block
 * fits the budget (--budget, else the context's SYMRED_MEM_LIMIT, else 64 MB), and the block's
 * Gram matrix is added to A (m x m, float64). This is the split-and-accumulate that SGPR
 * training needs when m is large (eXLA's motivating example).
 *
 * Usage: sgpr [options] [n [m [D]]]
 *   n, m, D         data points, inducing points, dimension (default 20000, 500, 8)
 *   --f64           evaluate the kernel in float64 (default float32)
 *   --budget BYTES  bytes for one block of K_uf (default: SYMRED_MEM_LIMIT, else 64 MB)
 *   --seed S        seed of the random points (default 1)
 *   --check         compare A against a dense double-precision computation; exit 1 if the
 *                   relative error (max abs difference / max |A|) exceeds the tolerance
 *   --tol T         the tolerance for --check (default 1e-5 for float32, 1e-12 for float64)
 *   --quiet         print only the summary
 *
 * Exit status: 0 on success, 1 on a symred error or a failed check, 2 on a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *prog = "sgpr";

#include "example.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: %s [--f64] [--budget BYTES] [--seed S] [--check] [--tol T] [--quiet]\n"
            "       [n [m [D]]]\n",
            prog);
    exit(2);
}

int main(int argc, char **argv)
{
    long long n = 20000, m = 500, D = 8, budget = 0, seed = 1;
    int f64 = 0, check = 0, quiet = 0, npos = 0;
    double tol = -1;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--f64") == 0)
            f64 = 1;
        else if (strcmp(argv[a], "--check") == 0)
            check = 1;
        else if (strcmp(argv[a], "--quiet") == 0)
            quiet = 1;
        else if (strcmp(argv[a], "--budget") == 0 && a + 1 < argc)
            budget = atoll(argv[++a]);
        else if (strcmp(argv[a], "--seed") == 0 && a + 1 < argc)
            seed = atoll(argv[++a]);
        else if (strcmp(argv[a], "--tol") == 0 && a + 1 < argc)
            tol = atof(argv[++a]);
        else if (argv[a][0] != '-' && npos < 3) {
            long long v = atoll(argv[a]);
            if (v < 1)
                usage();
            *(npos == 0 ? &n : npos == 1 ? &m : &D) = v;
            npos++;
        } else
            usage();
    }
    if (tol < 0)
        tol = f64 ? 1e-12 : 1e-5;

    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return 1;
    if (budget <= 0)
        budget = sr_ctx_mem_limit(ctx) > 0 ? sr_ctx_mem_limit(ctx) : 64LL << 20;
    char ax[32], ay[32];
    snprintf(ax, sizeof ax, "z=Vi(%lld)", D);
    snprintf(ay, sizeof ay, "x=Vj(%lld)", D);
    const char *aliases[] = {ax, ay, "g=Pm(1)"};
    sr_expr *f;
    sr_kernel *k;
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = f64 ? SR_F64 : SR_F32;
    if (sr_parse(ctx, "Exp(-SqDist(z,x)*g)", aliases, 3, &f) != SR_OK ||
        sr_kernel_new(ctx, f, &desc, &k) != SR_OK) {
        fprintf(stderr, "%s: %s\n", prog, sr_ctx_error(ctx));
        sr_ctx_free(ctx);
        return 1;
    }

    size_t esz = f64 ? 8 : 4;
    /* The block of K_uf: m rows, c columns, within the budget. */
    long long c = budget / (m * (long long)esz);
    if (c > n)
        c = n;
    if (c < 1) {
        fprintf(stderr, "%s: a budget of %lld bytes cannot hold one column of %lld values\n", prog,
                budget, m);
        return 1;
    }
    uint64_t s = (uint64_t)seed;
    void *z = malloc(esz * (size_t)(m * D)), *x = malloc(esz * (size_t)(n * D));
    void *blk = malloc(esz * (size_t)(m * c));
    double *A = calloc((size_t)(m * m), sizeof *A);
    if (!z || !x || !blk || !A) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    for (long long t = 0; t < m * D; t++) {
        double v = uniform01(&s) * 2 - 1;
        f64 ? (void)(((double *)z)[t] = v) : (void)(((float *)z)[t] = (float)v);
    }
    for (long long t = 0; t < n * D; t++) {
        double v = uniform01(&s) * 2 - 1;
        f64 ? (void)(((double *)x)[t] = v) : (void)(((float *)x)[t] = (float)v);
    }
    double g64 = 1.0 / (double)D;
    float g32 = (float)g64;
    const void *args[] = {z, x, f64 ? (const void *)&g64 : (const void *)&g32};

    double t0 = now_s();
    long long nchunks = 0;
    for (long long j0 = 0; j0 < n; j0 += c, nchunks++) {
        long long nj = j0 + c <= n ? c : n - j0;
        if (sr_kernel_eval_block(k, m, n, args, 0, m, j0, nj, blk) != SR_OK) {
            fprintf(stderr, "%s: sr_kernel_eval_block failed: %s\n", prog, sr_ctx_error(ctx));
            return 1;
        }
        /* A += B B^T, the upper triangle; mirrored at the end. */
        for (long long p = 0; p < m; p++)
            for (long long q = p; q < m; q++) {
                double acc = 0;
                for (long long t = 0; t < nj; t++)
                    acc +=
                        get(blk, f64, (size_t)(p * nj + t)) * get(blk, f64, (size_t)(q * nj + t));
                A[p * m + q] += acc;
            }
    }
    for (long long p = 0; p < m; p++)
        for (long long q = 0; q < p; q++)
            A[p * m + q] = A[q * m + p];
    double dt = now_s() - t0;
    double amax = 0;
    for (long long t = 0; t < m * m; t++)
        amax = fmax(amax, fabs(A[t]));
    printf("%s: K_uf K_fu for n = %lld, m = %lld, D = %lld (%s): %lld chunks of %lld columns "
           "(budget %lld bytes), %.3f s, max |A| = %.6g\n",
           prog, n, m, D, f64 ? "float64" : "float32", nchunks, c, budget, dt, amax);
    if (!quiet)
        printf("%s\n", sr_kernel_explain(k));

    int rc = 0;
    if (check) {
        /* The dense reference: the whole m x n matrix in double precision. */
        double *K = malloc(sizeof *K * (size_t)(m * n));
        if (!K) {
            fprintf(stderr, "%s: --check needs the dense %lld x %lld matrix\n", prog, m, n);
            return 1;
        }
        for (long long p = 0; p < m; p++)
            for (long long t = 0; t < n; t++) {
                double d2 = 0;
                for (long long e = 0; e < D; e++) {
                    double dv = get(z, f64, (size_t)(p * D + e)) - get(x, f64, (size_t)(t * D + e));
                    d2 += dv * dv;
                }
                K[p * n + t] = exp(-d2 * (f64 ? g64 : (double)g32));
            }
        double err = 0;
        for (long long p = 0; p < m; p++)
            for (long long q = 0; q < m; q++) {
                double acc = 0;
                for (long long t = 0; t < n; t++)
                    acc += K[p * n + t] * K[q * n + t];
                err = fmax(err, fabs(acc - A[p * m + q]));
            }
        free(K);
        double rel = amax > 0 ? err / amax : err;
        printf("%s: check against the dense product: relative error %.3g (tolerance %.3g) %s\n",
               prog, rel, tol, rel <= tol ? "ok" : "FAILED");
        rc = rel <= tol ? 0 : 1;
    }
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    free(z);
    free(x);
    free(blk);
    free(A);
    return rc;
}
