/*
 * mpi-knn.c — exact k nearest neighbours over queries and points sharded across MPI ranks,
 * with symred_mpi: KMin_ArgKMin_j SqDist(q_i, p_j), the point blocks travelling around the
 * ring, each rank getting the k nearest points (global indices) of its own queries.
 *
 * Usage: mpirun -np P mpi-knn [options] [nq [np [D]]]
 *   nq, np, D     queries and points in all, dimension (default 10000 × 100000, D = 16);
 *                 uniform in [0, 1)^D
 *   --k K         neighbours per query (default 10)
 *   --f64         compute in float64 (default float32)
 *   --repeat R    run R times and report the fastest (default 1)
 *   --check       gather everything on rank 0, run the single-process symred kernel there and
 *                 compare: the indices must be equal, except where the two distances are
 *                 exactly equal (a tie, which either order answers), and the distances equal
 *                 within 1e-12 (float64) or 1e-5 (float32) relative; prints "check: ok" and
 *                 exits 0 when they agree, 1 otherwise
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

static const char *prog = "mpi-knn";

#include "example.h"
#include "mpi-example.h"

static void usage(void)
{
    fprintf(stderr, "usage: %s [--k K] [--f64] [--repeat R] [--check] [--quiet] [nq [np [D]]]\n",
            prog);
    exit(2);
}

/* Compares the sharded answer with the single-process one on rank 0; returns the failures. */
static int compare(const void *got, const int64_t *got_idx, const void *want,
                   const int64_t *want_idx, int64_t nq, int k, int f64)
{
    double tol = f64 ? 1e-12 : 1e-5;
    int bad = 0;
    for (int64_t e = 0; e < nq * k && bad < 5; e++) {
        double a = get(got, f64, e), w = get(want, f64, e);
        int value_ok = fabs(a - w) <= tol * fabs(w);
        int index_ok = got_idx[e] == want_idx[e] || a == w;
        if (!value_ok || !index_ok) {
            fprintf(stderr,
                    "%s: CHECK FAILED: query %lld, neighbour %lld: sharded (%lld, %.17g), "
                    "single process (%lld, %.17g)\n",
                    prog, (long long)(e / k), (long long)(e % k), (long long)got_idx[e], a,
                    (long long)want_idx[e], w);
            bad++;
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    sr_ctx *ctx;
    sr_mpi *m = mpi_start(&argc, &argv, &ctx);
    int rank = sr_mpi_rank(m), P = sr_mpi_size(m);
    int64_t nq = 10000, np = 100000, dim = 16;
    mpi_opts o = {.repeat = 1};
    int npos = 0, k = 10;
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (common_option(argc, argv, &a, &o))
            continue;
        else if (strcmp(s, "--k") == 0 && a + 1 < argc) {
            int64_t v = parse_size(argv[++a]);
            k = v > (1 << 20) ? 1 << 20 : (int)v; /* symred reports k = 0 or k > np */
        } else if (s[0] == '-' && s[1] == '-')
            usage();
        else if (npos == 0 && ++npos)
            nq = parse_size(s);
        else if (npos == 1 && ++npos)
            np = parse_size(s);
        else if (npos == 2 && ++npos)
            dim = parse_size(s);
        else
            usage();
    }
    if (dim < 1 || dim > 1 << 16 || o.repeat < 1)
        usage();
    int f64 = o.f64;
    size_t esz = f64 ? sizeof(double) : sizeof(float);

    int64_t q0, qn, p0, pn;
    split_rows(nq, rank, P, &q0, &qn);
    split_rows(np, rank, P, &p0, &pn);
    void *q = xmalloc((size_t)(qn * dim) * esz), *p = xmalloc((size_t)(pn * dim) * esz);
    fill_rows(q, f64, q0, qn, dim, 11, 0.0, 1.0);
    fill_rows(p, f64, p0, pn, dim, 12, 0.0, 1.0);
    void *dist = xmalloc((size_t)(qn * k) * esz);
    int64_t *idx = xmalloc((size_t)(qn * k) * sizeof *idx);

    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, (int)dim), sr_vj(ctx, 1, (int)dim));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_KMIN_ARGKMIN;
    desc.k = k;
    desc.dtype = f64 ? SR_F64 : SR_F32;
    sr_mpi_kernel *kern;
    sr_status st = sr_mpi_kernel_new(m, f, &desc, &kern);
    if (st != SR_OK)
        mpi_fail(m, "sr_mpi_kernel_new", st);

    const void *args[] = {q, p};
    sr_run_desc run = {.nx = qn, .ny = pn, .nargs = 2, .args = args, .out = dist, .out_idx = idx};
    double cw[2];
    double best = run_timed(m, kern, &run, o.repeat, cw);
    if (!o.quiet && rank == 0)
        printf("%s: %d ranks, nq = %lld, np = %lld, D = %lld, k = %d, %s: %.4f s, %.1f GFLOP/s "
               "(3 flops per pair and dimension; per rank, at most: %.4f s computing, %.4f s "
               "waiting for the ring)\n",
               prog, P, (long long)nq, (long long)np, (long long)dim, k,
               f64 ? "float64" : "float32", best,
               3.0 * (double)nq * (double)np * (double)dim / best * 1e-9, cw[0], cw[1]);

    int bad = 0;
    if (o.check) {
        void *qa = gather_rows(q, qn, dim, esz, nq, MPI_COMM_WORLD);
        void *pa = gather_rows(p, pn, dim, esz, np, MPI_COMM_WORLD);
        void *got = gather_rows(dist, qn, k, esz, nq, MPI_COMM_WORLD);
        int64_t *got_idx = gather_rows(idx, qn, k, sizeof *idx, nq, MPI_COMM_WORLD);
        if (rank == 0) {
            sr_kernel *single;
            void *want = xmalloc((size_t)(nq * k) * esz);
            int64_t *want_idx = xmalloc((size_t)(nq * k) * sizeof *want_idx);
            const void *all[] = {qa, pa};
            sr_run_desc one = {nq, np, 2, all, want, want_idx};
            if ((st = sr_kernel_new(ctx, f, &desc, &single)) != SR_OK ||
                (st = sr_kernel_run_ex(single, &one)) != SR_OK)
                fail(ctx, "the single-process kernel", st);
            sr_kernel_free(single);
            bad = compare(got, got_idx, want, want_idx, nq, k, f64);
            printf("check: %s\n", bad ? "FAILED" : "ok");
            free(want);
            free(want_idx);
        }
        free(qa);
        free(pa);
        free(got);
        free(got_idx);
    }
    free(q);
    free(p);
    free(dist);
    free(idx);
    return mpi_finish(m, kern, ctx, bad);
}
