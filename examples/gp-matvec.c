/*
 * gp-matvec.c — a Gaussian-process kernel mat-vec with symred.
 *
 *     out_i = sum_j exp(-g |x_i - y_j|^2) b_j,    x_i, y_j in R^3, b_j in R, g > 0
 *
 * The formula is parsed from KeOps-style text; the nx × ny kernel matrix is never built.
 *
 * Usage: gp-matvec [options] [nx [ny]]
 *   nx, ny          number of points x_i and y_j (default 4000 × 4000)
 *   --f64           compute in float64 (default float32)
 *   --gamma G       the kernel's g (default 2)
 *   --device NAME   auto, cpu, reference or cuda (default auto: SYMRED_DEVICE, else the best)
 *   --seed S        seed of the random points (default 1)
 *   --check         compare rows against a plain double-precision C loop; exit 1 if the relative
 *                   error exceeds the dtype's tolerance (all rows when nx*ny <= 4e6, else a
 *                   sample of rows)
 *   --tol T         the tolerance for --check (default 1e-4 for float32, 1e-10 for float64)
 *   --quiet         do not print the kernel's explain text
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

static const char *prog = "gp-matvec";

#include "example.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: %s [--f64] [--gamma G] [--device auto|cpu|reference|cuda] [--seed S]\n"
            "       [--check] [--tol T] [--quiet] [nx [ny]]\n",
            prog);
    exit(2);
}

/* The next row to check: i + step, but the last row is always checked. */
static int64_t next_row(int64_t i, int64_t step, int64_t n)
{
    if (i == n - 1)
        return n;
    return i + step < n ? i + step : n - 1;
}

/* Row i of the mat-vec by a plain double-precision loop over the same (rounded) inputs. Sets
 * *want to the exact sum and returns |got - want| relative to the sum of the terms' magnitudes,
 * which is what a summation of ny rounded terms can promise. */
static double check_row(const void *x, const void *y, const void *b, double g, int f64, int64_t i,
                        int64_t ny, double got, double *want)
{
    double sum = 0.0, sumabs = 0.0;
    for (int64_t j = 0; j < ny; j++) {
        double d2 = 0.0;
        for (int c = 0; c < 3; c++) {
            double dc = get(x, f64, i * 3 + c) - get(y, f64, j * 3 + c);
            d2 += dc * dc;
        }
        double term = exp(-d2 * g) * get(b, f64, j);
        sum += term;
        sumabs += fabs(term);
    }
    *want = sum;
    return fabs(got - sum) / (sumabs > 0 ? sumabs : 1.0);
}

int main(int argc, char **argv)
{
    int64_t nx = 4000, ny = 4000;
    int f64 = 0, check = 0, quiet = 0, npos = 0;
    double gamma = 2.0, tol = -1.0;
    uint64_t seed = 1;
    sr_device device = SR_DEVICE_AUTO;

    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (strcmp(s, "--f64") == 0)
            f64 = 1;
        else if (strcmp(s, "--check") == 0)
            check = 1;
        else if (strcmp(s, "--quiet") == 0)
            quiet = 1;
        else if (strcmp(s, "--gamma") == 0 && a + 1 < argc)
            gamma = parse_real(argv[++a]);
        else if (strcmp(s, "--tol") == 0 && a + 1 < argc)
            tol = parse_real(argv[++a]);
        else if (strcmp(s, "--seed") == 0 && a + 1 < argc)
            seed = (uint64_t)parse_size(argv[++a]);
        else if (strcmp(s, "--device") == 0 && a + 1 < argc) {
            if (!parse_device(argv[++a], &device)) {
                fprintf(stderr, "%s: unknown device '%s'\n", prog, argv[a]);
                usage();
            }
        } else if (s[0] == '-' && s[1] == '-')
            usage();
        else if (npos == 0) {
            nx = parse_size(s);
            ny = nx;
            npos++;
        } else if (npos == 1) {
            ny = parse_size(s);
            npos++;
        } else
            usage();
    }
    if (tol < 0)
        tol = f64 ? 1e-10 : 1e-4;
    size_t esz = f64 ? sizeof(double) : sizeof(float);

    /* Random points in the unit cube and weights in [0, 1): every term of the sum is positive,
     * so a relative error is meaningful. */
    void *x = xmalloc((size_t)nx * 3 * esz), *y = xmalloc((size_t)ny * 3 * esz);
    void *b = xmalloc((size_t)ny * esz), *out = xmalloc((size_t)nx * esz);
    for (int64_t i = 0; i < nx * 3; i++) {
        double v = uniform01(&seed);
        if (f64)
            ((double *)x)[i] = v;
        else
            ((float *)x)[i] = (float)v;
    }
    for (int64_t j = 0; j < ny * 3; j++) {
        double v = uniform01(&seed);
        if (f64)
            ((double *)y)[j] = v;
        else
            ((float *)y)[j] = (float)v;
    }
    for (int64_t j = 0; j < ny; j++) {
        double v = uniform01(&seed);
        if (f64)
            ((double *)b)[j] = v;
        else
            ((float *)b)[j] = (float)v;
    }
    double g64 = gamma;
    float g32 = (float)gamma;

    sr_ctx *ctx = NULL;
    sr_status st = sr_ctx_new(&ctx);
    if (st != SR_OK) {
        fprintf(stderr, "%s: sr_ctx_new failed: %s\n", prog, sr_status_str(st));
        return 1;
    }

    const char *formula = "Exp(-SqDist(x,y)*g)*b";
    const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = NULL;
    st = sr_parse(ctx, formula, aliases, 4, &f);
    if (st != SR_OK)
        fail(ctx, "sr_parse", st);

    sr_kernel_desc desc = sr_kernel_desc_default(); /* Sum over j */
    desc.dtype = f64 ? SR_F64 : SR_F32;
    desc.device = device;
    sr_kernel *k = NULL;
    double t0 = now_s();
    st = sr_kernel_new(ctx, f, &desc, &k);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_new", st);
    double t_new = now_s() - t0;

    /* The first call does not wait for the compiler: the tile interpreter serves it while the
     * kernel's module compiles in the background (SYMRED_JIT=async, the default). */
    const void *args[] = {x, y, b, f64 ? (const void *)&g64 : (const void *)&g32};
    t0 = now_s();
    st = sr_kernel_run(k, nx, ny, args, out);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_run", st);
    double t_first = now_s() - t0;
    /* Then the compiled code, once it is ready. */
    t0 = now_s();
    sr_kernel_wait(k, -1);
    double t_wait = now_s() - t0;
    t0 = now_s();
    st = sr_kernel_run(k, nx, ny, args, out);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_run", st);
    double t_run = now_s() - t0;

    printf("symred %s: %s, nx = %lld, ny = %lld, %s\n", sr_version(), formula, (long long)nx,
           (long long)ny, f64 ? "float64" : "float32");
    if (!quiet)
        printf("---- sr_kernel_explain ----\n%s---------------------------\n",
               sr_kernel_explain(k));
    double pairs = (double)nx * (double)ny;
    printf("kernel creation: %.3f ms\n", 1e3 * t_new);
    printf("first call: %.3f s, %.1f M pairs/s (the tile interpreter unless the module was "
           "ready)\n",
           t_first, t_first > 0 ? pairs / t_first * 1e-6 : 0.0);
    printf("waited %.3f s more for the compiled module\n", t_wait);
    printf("run: %.3f s, %.1f M pairs/s\n", t_run, t_run > 0 ? pairs / t_run * 1e-6 : 0.0);
    if (nx > 0)
        printf("out[0] = %.9g, out[%lld] = %.9g\n", get(out, f64, 0), (long long)(nx - 1),
               get(out, f64, nx - 1));

    int status = 0;
    if (check) {
        /* Every row when the whole check is cheap, else about 200 rows spread over the range,
         * always including the last one. */
        int64_t step = pairs <= 4e6 ? 1 : (nx + 199) / 200;
        double gv = f64 ? g64 : (double)g32, worst = 0.0;
        int64_t checked = 0;
        for (int64_t i = 0; i < nx && status == 0; i = next_row(i, step, nx)) {
            double want = 0.0;
            double err = check_row(x, y, b, gv, f64, i, ny, get(out, f64, i), &want);
            if (!(err <= tol)) { /* also catches NaN */
                fprintf(stderr,
                        "%s: CHECK FAILED at row %lld: symred %.9g, double-precision loop %.9g, "
                        "relative error %.3g > tolerance %.3g\n",
                        prog, (long long)i, get(out, f64, i), want, err, tol);
                status = 1;
            }
            worst = err > worst ? err : worst;
            checked++;
        }
        if (status == 0)
            printf("check: %lld rows match the double-precision loop (largest relative error "
                   "%.3g, tolerance %.3g)\n",
                   (long long)checked, worst, tol);
    }

    sr_kernel_free(k);
    sr_ctx_free(ctx);
    free(x);
    free(y);
    free(b);
    free(out);
    return status;
}
