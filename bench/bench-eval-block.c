/*
 * bench-eval-block — sr_kernel_eval_block on the reference interpreter against the JIT's
 * generated block (the module's sr_block), in one process: nanoseconds per value, and beside
 * them the same kernel's Sum reduction (sr_kernel_run, ns per pair) as the yardstick of what
 * the generated pair loop costs. The formulas are the SGPR benchmark's two blocks
 * (bench/exla/sgpr_model.py, docs/sgpr.md): K_uf = Exp(-g*SqDist(z,x)) and its derivative in g,
 * Grad(Exp(-g*SqDist(z,x)), g, e), with z = Vi(3) (M inducing points, the rows) and x = Vj(3)
 * (a block of b data points, the columns).
 *
 *   bench-eval-block [M] [b] [reps]      (default 400 10000 5)
 *
 * The kernels compile into a fresh cache directory (unless SYMRED_CACHE_DIR is set), so
 * "compile" is the cold compile of the module that holds both the reduction and the block
 * (bench/eval-block-compile.sh measures what the block adds to it). Times are the best of reps
 * calls. With SYMRED_BENCH_RECORD set, the figures are appended to that file as data
 * (bench/record.h).
 */
#define _GNU_SOURCE
#include "bench.h"
#include "record.h"
#include "symred.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check(sr_status st, sr_ctx *ctx, const char *what)
{
    if (st != SR_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, sr_status_str(st), sr_ctx_error(ctx));
        exit(1);
    }
}

static sr_kernel *make(sr_ctx *ctx, const char *formula, sr_dtype dt, sr_device dev)
{
    const char *aliases[] = {"z=Vi(3)", "x=Vj(3)", "g=Pm(1)", "e=Pm(1)"};
    sr_expr *f;
    check(sr_parse(ctx, formula, aliases, 4, &f), ctx, "parse");
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    d.device = dev;
    sr_kernel *k;
    check(sr_kernel_new(ctx, f, &d, &k), ctx, "sr_kernel_new");
    return k;
}

/* The compile time of the kernel's module (sr_plan_info), or -1 when it was not compiled for
 * it (a cache hit). */
static double compile_ms(const sr_kernel *k)
{
    sr_plan_info p = bench_plan(k);
    return p.module && strcmp(p.module, "compiled") == 0 ? p.compile_ms : -1;
}

static double best_block(const sr_kernel *k, int64_t M, int64_t b, const void *const *args,
                         void *out, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        check(sr_kernel_eval_block(k, M, b, args, 0, M, 0, b, out), NULL, "eval_block");
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t M = argc > 1 ? atoll(argv[1]) : 400, b = argc > 2 ? atoll(argv[2]) : 10000;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (M < 1 || b < 1 || reps < 1) {
        fprintf(stderr, "usage: bench-eval-block [M] [b] [reps]\n");
        return 2;
    }
    bench_record rec;
    bench_record_open(&rec, "bench-eval-block", argc, argv);
    /* A fresh cache directory (removed at the end) unless SYMRED_CACHE_DIR names one, e.g. to
     * keep the sources with SYMRED_JIT_KEEP=1 for bench/eval-block-compile.sh. */
    char dir[] = "/tmp/symred-bench-eb-XXXXXX";
    bool own_dir = !getenv("SYMRED_CACHE_DIR");
    if (own_dir && !mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    if (own_dir)
        setenv("SYMRED_CACHE_DIR", dir, 1);
    sr_ctx *ctx;
    check(sr_ctx_new(&ctx), NULL, "sr_ctx_new");
    static const char *const formulas[2] = {"Exp(-g*SqDist(z,x))",
                                            "Grad(Exp(-g*SqDist(z,x)), g, e)"};
    printf("eval_block of an M x b block, M = %lld, b = %lld, best of %d; ns per value "
           "(all threads together)\n",
           (long long)M, (long long)b, reps);
    printf("%-34s %-7s %10s %10s %8s %12s %10s %12s\n", "formula", "dtype", "reference", "jit",
           "ref/jit", "Sum ns/pair", "compile ms", "max |diff|");
    for (int fi = 0; fi < 2; fi++)
        for (int dti = 0; dti < 2; dti++) {
            sr_dtype dt = dti ? SR_F32 : SR_F64;
            size_t esz = dt == SR_F64 ? 8 : 4;
            uint64_t s = 7;
            void *z = bench_alloc(esz * (size_t)M * 3), *x = bench_alloc(esz * (size_t)b * 3);
            for (int64_t q = 0; q < M * 3; q++) {
                double v = bench_uniform(&s);
                if (dt == SR_F64)
                    ((double *)z)[q] = v;
                else
                    ((float *)z)[q] = (float)v;
            }
            for (int64_t q = 0; q < b * 3; q++) {
                double v = bench_uniform(&s);
                if (dt == SR_F64)
                    ((double *)x)[q] = v;
                else
                    ((float *)x)[q] = (float)v;
            }
            double g64 = 1.0 / (2 * 0.2 * 0.2), e64 = 1;
            float g32 = (float)g64, e32 = 1;
            const void *args[4] = {z, x, dt == SR_F64 ? (void *)&g64 : (void *)&g32,
                                   dt == SR_F64 ? (void *)&e64 : (void *)&e32};
            sr_kernel *kr = make(ctx, formulas[fi], dt, SR_DEVICE_REFERENCE),
                      *kj = make(ctx, formulas[fi], dt, SR_DEVICE_CPU);
            if (!bench_plan(kj).eval_block) {
                fprintf(stderr, "the JIT kernel has no generated block:\n%s",
                        sr_kernel_explain(kj));
                return 1;
            }
            size_t n = (size_t)(M * b);
            void *outr = bench_alloc(esz * n), *outj = bench_alloc(esz * n);
            void *red = bench_alloc(esz * (size_t)M);
            double tr = best_block(kr, M, b, args, outr, reps < 2 ? reps : 2);
            double tj = best_block(kj, M, b, args, outj, reps);
            double ts = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = bench_now();
                check(sr_kernel_run(kj, M, b, args, red), ctx, "sr_kernel_run");
                double t = bench_now() - t0;
                ts = t < ts ? t : ts;
            }
            double md = 0;
            for (size_t q = 0; q < n; q++) {
                double a = dt == SR_F64 ? ((double *)outr)[q] : ((float *)outr)[q];
                double c = dt == SR_F64 ? ((double *)outj)[q] : ((float *)outj)[q];
                md = fabs(a - c) > md ? fabs(a - c) : md;
            }
            const char *dtn = dt == SR_F64 ? "float64" : "float32";
            double cms = compile_ms(kj);
            printf("%-34s %-7s %10.2f %10.3f %7.1fx %12.3f %10.1f %12.2e\n", formulas[fi], dtn,
                   1e9 * tr / (double)n, 1e9 * tj / (double)n, tr / tj, 1e9 * ts / (double)n, cms,
                   md);
            bench_record_row(&rec,
                             "\"formula\": \"%s\", \"dtype\": \"%s\", \"M\": %lld, \"b\": %lld, "
                             "\"reference_ns\": %.2f, \"jit_ns\": %.3f, \"ref_over_jit\": %.1f, "
                             "\"sum_ns_per_pair\": %.3f, \"compile_ms\": %.1f, "
                             "\"max_abs_diff\": %.2e",
                             formulas[fi], dtn, (long long)M, (long long)b, 1e9 * tr / (double)n,
                             1e9 * tj / (double)n, tr / tj, 1e9 * ts / (double)n, cms, md);
            sr_kernel_free(kr);
            sr_kernel_free(kj);
            free(z);
            free(x);
            free(outr);
            free(outj);
            free(red);
        }
    sr_ctx_free(ctx);
    bench_record_close(&rec);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (own_dir && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}
