/*
 * bench-simplify.c — what the simplifier buys.
 *
 * Part 1, naive vs canonical spellings: the same kernel written the way users often write it
 * (Sum(Square(x-y)), Sum(x*y)/(Norm2(x)*Norm2(y)), Sum(Square(x-y)*w)) and with symred's
 * canonical ops (SqDist, Normalize, WeightedSqDist). The simplifier should make them run alike:
 * the target is naive within 15% of canonical (ratio <= 1.15).
 *
 * Part 2, hoisting: Exp(Sqrt(SqNorm2(x)))*Exp(-SqDist(x,y))*b has an expensive i-only factor.
 * Timed with SYMRED_SIMPLIFY=0 (the formula as given) and with the simplifier (the factor moves
 * out of the reduction and is applied once per output row after it).
 *
 * Usage: bench-simplify [scale] [reps]   (scale multiplies the problem sizes, default 1)
 *
 * Prints best-of-reps wall times (kernel creation excluded: the JIT compiles once per kernel)
 * and the ratios. float32, Sum over j, device AUTO (the CPU JIT), all threads. With
 * SYMRED_BENCH_RECORD set, the figures are appended to that file as data (bench/record.h).
 */
#define _GNU_SOURCE
#include "symred.h"

#include "bench.h"
#include "record.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 88172645463325252ULL;
static float *rand_array(int64_t n, float lo, float hi)
{
    float *a = bench_alloc((size_t)n * sizeof *a);
    for (int64_t t = 0; t < n; t++)
        a[t] = lo + (hi - lo) * (float)bench_uniform(&rng_state);
    return a;
}

/* The arguments of every benchmark formula: x, y, b, g, w (see aliases()). */
struct inputs {
    int64_t n, m;
    int d;
    float *x, *y, *b, *g, *w;
};

static void inputs_make(struct inputs *in, int64_t n, int64_t m, int d)
{
    in->n = n;
    in->m = m;
    in->d = d;
    /* Points in a cube of side ~sqrt(3/d)... scaled so |x - y|^2 is O(1) at every d. */
    float s = (float)(1.0 / sqrt((double)d));
    in->x = rand_array(n * d, -s, s);
    in->y = rand_array(m * d, -s, s);
    in->b = rand_array(m, -1, 1);
    in->g = rand_array(1, 0.5f, 1.5f);
    in->w = rand_array(d, 0.5f, 1.5f);
}

static void inputs_free(struct inputs *in)
{
    free(in->x);
    free(in->y);
    free(in->b);
    free(in->g);
    free(in->w);
}

struct bk {
    sr_ctx *ctx;
    sr_kernel *k;
};

static struct bk make_kernel(const char *formula, int d, int simplify)
{
    char al[5][32];
    snprintf(al[0], 32, "x=Vi(%d)", d);
    snprintf(al[1], 32, "y=Vj(%d)", d);
    snprintf(al[2], 32, "b=Vj(1)");
    snprintf(al[3], 32, "g=Pm(1)");
    snprintf(al[4], 32, "w=Pm(%d)", d);
    const char *aliases[5] = {al[0], al[1], al[2], al[3], al[4]};
    struct bk r;
    sr_expr *f;
    if (sr_ctx_new(&r.ctx) != SR_OK || sr_parse(r.ctx, formula, aliases, 5, &f) != SR_OK) {
        fprintf(stderr, "%s: %s\n", formula, sr_ctx_error(r.ctx));
        exit(1);
    }
    if (!simplify)
        setenv("SYMRED_SIMPLIFY", "0", 1);
    sr_kernel_desc desc = sr_kernel_desc_default();
    sr_status st = sr_kernel_new(r.ctx, f, &desc, &r.k);
    unsetenv("SYMRED_SIMPLIFY");
    if (st != SR_OK) {
        fprintf(stderr, "%s: %s\n", formula, sr_ctx_error(r.ctx));
        exit(1);
    }
    return r;
}

static void free_kernel(struct bk *b)
{
    sr_kernel_free(b->k);
    sr_ctx_free(b->ctx);
}

static double run_once(const struct bk *b, const struct inputs *in, float *out)
{
    const void *all[5] = {in->x, in->y, in->b, in->g, in->w};
    double t0 = bench_now();
    if (sr_kernel_run(b->k, in->n, in->m, all, out) != SR_OK) {
        fprintf(stderr, "run: %s\n", sr_ctx_error(b->ctx));
        exit(1);
    }
    return bench_now() - t0;
}

/* Best-of-reps times of two kernels, their runs interleaved (a warm-up run each first) so that
 * the load of a shared machine hits both alike. */
static void time_pair(const struct bk *a, const struct bk *b, const struct inputs *in, int reps,
                      float *oa, float *ob, double *ta, double *tb)
{
    *ta = *tb = 1e300;
    for (int r = 0; r < reps + 1; r++) {
        double t = run_once(a, in, oa);
        if (r > 0 && t < *ta)
            *ta = t;
        t = run_once(b, in, ob);
        if (r > 0 && t < *tb)
            *tb = t;
    }
}

/* The formula the kernel runs (sr_plan_info.formula), printed into buf. */
static const char *simplified(const struct bk *b, char *buf, size_t cap)
{
    const sr_expr *f = bench_plan(b->k).formula;
    buf[0] = 0;
    if (f)
        sr_expr_print(f, buf, cap);
    return buf;
}

static double max_rel_diff(const float *a, const float *b, int64_t n)
{
    double scale = 0, diff = 0;
    for (int64_t t = 0; t < n; t++) {
        scale = fmax(scale, fabs((double)b[t]));
        diff = fmax(diff, fabs((double)a[t] - (double)b[t]));
    }
    return scale > 0 ? diff / scale : diff;
}

static int worst_fail;

static void compare(bench_record *rec, const char *name, int d, const char *naive,
                    const char *canon, int64_t n, int reps)
{
    struct inputs in;
    inputs_make(&in, n, n, d);
    float *o1 = bench_alloc((size_t)n * sizeof *o1), *o2 = bench_alloc((size_t)n * sizeof *o2);
    struct bk kn = make_kernel(naive, d, 1), kc = make_kernel(canon, d, 1);
    char s1[4096], s2[4096];
    bool same = strcmp(simplified(&kn, s1, sizeof s1), simplified(&kc, s2, sizeof s2)) == 0;
    double tn, tc;
    time_pair(&kn, &kc, &in, reps, o1, o2, &tn, &tc);
    double ratio = tn / tc, diff = max_rel_diff(o1, o2, n);
    printf("%-9s D=%-4d N=M=%-6lld naive %8.2f ms  canonical %8.2f ms  ratio %.3f %s  "
           "(%s simplified formula; max rel diff %.1e)\n",
           name, d, (long long)n, 1e3 * tn, 1e3 * tc, ratio, ratio <= 1.15 ? "ok" : "SLOW",
           same ? "same" : "different", diff);
    bench_record_row(rec,
                     "\"table\": \"spellings\", \"kernel\": \"%s\", \"D\": %d, \"N\": %lld, "
                     "\"naive_ms\": %.2f, \"canonical_ms\": %.2f, \"ratio\": %.3f, "
                     "\"same_simplified\": %s, \"max_rel_diff\": %.1e",
                     name, d, (long long)n, 1e3 * tn, 1e3 * tc, ratio, same ? "true" : "false",
                     diff);
    worst_fail |= ratio > 1.15;
    free_kernel(&kn);
    free_kernel(&kc);
    free(o1);
    free(o2);
    inputs_free(&in);
}

int main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (scale <= 0 || reps < 1) {
        fprintf(stderr, "usage: %s [scale] [reps]\n", argv[0]);
        return 2;
    }
    bench_record rec;
    bench_record_open(&rec, "bench-simplify", argc, argv);
    printf("naive vs canonical spellings (float32, Sum over j, best of %d)\n", reps);
    static const int dims[] = {3, 16, 64, 256};
    for (int t = 0; t < 4; t++) {
        int d = dims[t];
        /* about 1.5e9 / (d + 2) pairs: similar work at every d */
        int64_t n = (int64_t)(scale * sqrt(1.5e9 / (d + 2.0)));
        compare(&rec, "gaussian", d, "Exp(-Sum(Square(x-y))*g)*b", "Exp(-SqDist(x,y)*g)*b", n,
                reps);
    }
    for (int t = 0; t < 2; t++) {
        int d = t ? 64 : 16;
        int64_t n = (int64_t)(scale * sqrt(1.5e9 / (d + 2.0)));
        compare(&rec, "cosine", d, "Sum(x*y)/(Norm2(x)*Norm2(y))*b",
                "(Normalize(x)|Normalize(y))*b", n, reps);
        compare(&rec, "weighted", d, "Exp(-Sum(Square(x-y)*w))*b", "Exp(-WeightedSqDist(w,x,y))*b",
                n, reps);
    }

    printf("\nhoisting: Exp(Sqrt(SqNorm2(x)))*Exp(-SqDist(x,y))*b, SYMRED_SIMPLIFY=0 vs 1\n");
    static const int hd[] = {3, 64};
    for (int t = 0; t < 2; t++) {
        int d = hd[t];
        int64_t n = (int64_t)(scale * sqrt(1.5e9 / (d + 2.0)));
        struct inputs in;
        inputs_make(&in, n, n, d);
        float *o1 = bench_alloc((size_t)n * sizeof *o1), *o2 = bench_alloc((size_t)n * sizeof *o2);
        const char *f = "Exp(Sqrt(SqNorm2(x)))*Exp(-SqDist(x,y))*b";
        struct bk koff = make_kernel(f, d, 0), kon = make_kernel(f, d, 1);
        /* The floor: the same kernel without the i-only factor. */
        struct bk kfl = make_kernel("Exp(-SqDist(x,y))*b", d, 1);
        double t0, t1, tf, t1b;
        time_pair(&kfl, &kon, &in, reps, o1, o2, &tf, &t1b);
        time_pair(&koff, &kon, &in, reps, o1, o2, &t0, &t1); /* o1, o2: off and on results */
        t1 = t1 < t1b ? t1 : t1b;
        free_kernel(&koff);
        free_kernel(&kon);
        free_kernel(&kfl);
        double diff = max_rel_diff(o2, o1, n);
        printf("hoist     D=%-4d N=M=%-6lld off %8.2f ms  on %8.2f ms  off/on %.3f  (without the "
               "factor: %.2f ms; max rel diff %.1e)\n",
               d, (long long)n, 1e3 * t0, 1e3 * t1, t0 / t1, 1e3 * tf, diff);
        bench_record_row(&rec,
                         "\"table\": \"hoisting\", \"D\": %d, \"N\": %lld, \"off_ms\": %.2f, "
                         "\"on_ms\": %.2f, \"off_over_on\": %.3f, \"without_factor_ms\": %.2f, "
                         "\"max_rel_diff\": %.1e",
                         d, (long long)n, 1e3 * t0, 1e3 * t1, t0 / t1, 1e3 * tf, diff);
        free(o1);
        free(o2);
        inputs_free(&in);
    }
    bench_record_close(&rec);
    return worst_fail;
}
