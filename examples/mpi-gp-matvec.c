/*
 * mpi-gp-matvec.c — the Gaussian-process kernel mat-vec out_i = sum_j exp(-g |x_i - y_j|^2) b_j
 * over points sharded across MPI ranks, with symred_mpi.
 *
 * Each rank makes only its shard of x (nx rows in all) and of y and b (ny rows in all); the y
 * blocks travel around the ring of ranks, and each rank gets out_i for its own rows of x.
 *
 * Usage: mpirun -np P mpi-gp-matvec [options] [nx [ny]]
 *   nx, ny        rows of x and of y in all (default 100000 × 100000); D = 3 unless --dim
 *   --dim D       dimension of the points
 *   --f64         compute in float64 (default float32)
 *   --repeat R    run R times and report the fastest (default 1; the first run also compiles)
 *   --check       gather x, y, b and the results on rank 0, run the single-process symred
 *                 kernel there and compare: prints "check: ok" and exits 0 when every value
 *                 agrees within 1e-12 (float64) or 1e-5 (float32) of the largest |out_i|,
 *                 exits 1 otherwise
 *   --quiet       print only the check's verdict and errors
 * Exit status: 0 on success, 1 on a symred error or a failed check, 2 on a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <symred_mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "mpi-gp-matvec";

#include "example.h"
#include "mpi-example.h"

static void usage(void)
{
    fprintf(stderr, "usage: %s [--dim D] [--f64] [--repeat R] [--check] [--quiet] [nx [ny]]\n",
            prog);
    exit(2);
}

int main(int argc, char **argv)
{
    sr_ctx *ctx;
    sr_mpi *m = mpi_start(&argc, &argv, &ctx);
    int rank = sr_mpi_rank(m), P = sr_mpi_size(m);
    int64_t nx = 100000, ny = 100000, dim = 3;
    mpi_opts o = {.repeat = 1};
    int npos = 0;
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (common_option(argc, argv, &a, &o))
            continue;
        else if (strcmp(s, "--dim") == 0 && a + 1 < argc)
            dim = parse_size(argv[++a]);
        else if (s[0] == '-' && s[1] == '-')
            usage();
        else if (npos == 0 && ++npos)
            nx = parse_size(s);
        else if (npos == 1 && ++npos)
            ny = parse_size(s);
        else
            usage();
    }
    if (dim < 1 || dim > 4096 || o.repeat < 1)
        usage();
    int f64 = o.f64;
    size_t esz = f64 ? sizeof(double) : sizeof(float);

    /* This rank's shards. */
    int64_t x0, xn, y0, yn;
    split_rows(nx, rank, P, &x0, &xn);
    split_rows(ny, rank, P, &y0, &yn);
    void *x = xmalloc((size_t)(xn * dim) * esz), *y = xmalloc((size_t)(yn * dim) * esz);
    void *b = xmalloc((size_t)yn * esz), *out = xmalloc((size_t)xn * esz);
    fill_rows(x, f64, x0, xn, dim, 1, 0.0, 1.0);
    fill_rows(y, f64, y0, yn, dim, 2, 0.0, 1.0);
    fill_rows(b, f64, y0, yn, 1, 3, -1.0, 1.0);
    double gval = 1.0 / (2.0 * 0.25 * (double)dim);
    float g32 = (float)gval;
    const void *g = f64 ? (const void *)&gval : (const void *)&g32;

    sr_expr *xi = sr_vi(ctx, 0, (int)dim), *yj = sr_vj(ctx, 1, (int)dim);
    sr_expr *f =
        sr_mul(ctx, sr_formula(ctx, "gaussian", xi, yj, sr_pm(ctx, 3, 1)), sr_vj(ctx, 2, 1));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = f64 ? SR_F64 : SR_F32;
    sr_mpi_kernel *k;
    sr_status st = sr_mpi_kernel_new(m, f, &desc, &k);
    if (st != SR_OK)
        mpi_fail(m, "sr_mpi_kernel_new", st);

    const void *args[] = {x, y, b, g};
    sr_run_desc run = {.nx = xn, .ny = yn, .nargs = 4, .args = args, .out = out};
    double cw[2];
    double best = run_timed(m, k, &run, o.repeat, cw);
    if (!o.quiet && rank == 0)
        printf("%s: %d ranks, nx = %lld, ny = %lld, D = %lld, %s: %.4f s, %.3f G pairs/s "
               "(per rank, at most: %.4f s computing, %.4f s waiting for the ring)\n",
               prog, P, (long long)nx, (long long)ny, (long long)dim, f64 ? "float64" : "float32",
               best, (double)nx * (double)ny / best * 1e-9, cw[0], cw[1]);

    int bad = 0;
    if (o.check) {
        void *xa = gather_rows(x, xn, dim, esz, nx, MPI_COMM_WORLD);
        void *ya = gather_rows(y, yn, dim, esz, ny, MPI_COMM_WORLD);
        void *ba = gather_rows(b, yn, 1, esz, ny, MPI_COMM_WORLD);
        void *got = gather_rows(out, xn, 1, esz, nx, MPI_COMM_WORLD);
        if (rank == 0) {
            sr_kernel *single;
            void *want = xmalloc((size_t)nx * esz);
            const void *all[] = {xa, ya, ba, g};
            if ((st = sr_kernel_new(ctx, f, &desc, &single)) != SR_OK ||
                (st = sr_kernel_run(single, nx, ny, all, want)) != SR_OK)
                fail(ctx, "the single-process kernel", st);
            sr_kernel_free(single);
            /* Relative to the largest |out_i|: b has both signs, and a sum near zero cannot be
             * held to a relative error of its own. */
            double tol = f64 ? 1e-12 : 1e-5, scale = 0.0;
            for (int64_t i = 0; i < nx; i++)
                scale = fmax(scale, fabs(get(want, f64, i)));
            for (int64_t i = 0; i < nx && bad < 5; i++) {
                double av = get(got, f64, i), w = get(want, f64, i);
                if (!(fabs(av - w) <= tol * scale)) {
                    fprintf(stderr, "%s: CHECK FAILED: row %lld: %d ranks %.17g, one %.17g\n", prog,
                            (long long)i, P, av, w);
                    bad++;
                }
            }
            printf("check: %s\n", bad ? "FAILED" : "ok");
            free(want);
        }
        free(xa);
        free(ya);
        free(ba);
        free(got);
    }
    free(x);
    free(y);
    free(b);
    free(out);
    return mpi_finish(m, k, ctx, bad);
}
