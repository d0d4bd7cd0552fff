/*
 * mpi-example.h — what the two MPI examples share: the split of n rows over the ranks, data
 * made per global row (so a rank makes only its shard, and the gathered data are the same
 * whatever the number of ranks), gathering shards on rank 0 for --check, and exiting on errors
 * on every rank. Include after example.h. Nothing here is part of the library.
 */
#ifndef SYMRED_MPI_EXAMPLE_H
#define SYMRED_MPI_EXAMPLE_H

#include <symred_mpi.h>

#include <math.h>

/* Rows [*first, *first + *count) of n go to rank r of P: n/P each, one more for the first n%P
 * ranks, so n need not divide by P. */
static inline void split_rows(int64_t n, int r, int P, int64_t *first, int64_t *count)
{
    int64_t q = n / P, rem = n % P;
    *count = q + (r < rem);
    *first = r * q + (r < rem ? r : rem);
}

/* Fills rows [first, first + count) of a dim-wide array with values uniform in [lo, hi) that
 * depend only on (seed, global row, column). */
static inline void fill_rows(void *a, int f64, int64_t first, int64_t count, int64_t dim,
                             uint64_t seed, double lo, double hi)
{
    for (int64_t i = 0; i < count; i++) {
        uint64_t s = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)(first + i) * 0xbf58476d1ce4e5b9ULL;
        for (int w = 0; w < 4; w++)
            uniform01(&s); /* mix the seed in */
        for (int64_t c = 0; c < dim; c++)
            set(a, f64, i * dim + c, lo + (hi - lo) * uniform01(&s));
    }
}

/* Gathers every rank's count rows of a dim-wide array (esz-byte values) into all on rank 0
 * (allocated there, n rows in rank order). */
static inline void *gather_rows(const void *mine, int64_t count, int64_t dim, size_t esz, int64_t n,
                                MPI_Comm comm)
{
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    int *counts = xmalloc((size_t)P * sizeof *counts),
        *displs = xmalloc((size_t)P * sizeof *displs);
    int bytes = (int)((size_t)(count * dim) * esz);
    MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, comm);
    for (int p = 0, at = 0; rank == 0 && p < P; p++) {
        displs[p] = at;
        at += counts[p];
    }
    void *all = rank == 0 ? xmalloc((size_t)(n * dim) * esz) : NULL;
    MPI_Gatherv(mine, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, comm);
    free(counts);
    free(displs);
    return all;
}

/* An error of the sharded kernel: the same status and message on every rank, printed once. */
static inline void mpi_fail(const sr_mpi *m, const char *what, sr_status st)
{
    if (sr_mpi_rank(m) == 0)
        fprintf(stderr, "%s: %s failed: %s: %s\n", prog, what, sr_status_str(st), sr_mpi_error(m));
    MPI_Finalize();
    exit(1);
}

/* The options both examples take. */
typedef struct mpi_opts {
    int f64, check, quiet;
    int64_t repeat;
} mpi_opts;

/* If argv[*a] is one of the common options, reads it (and its value) and returns 1. */
static inline int common_option(int argc, char **argv, int *a, mpi_opts *o)
{
    const char *s = argv[*a];
    if (strcmp(s, "--f64") == 0)
        o->f64 = 1;
    else if (strcmp(s, "--check") == 0)
        o->check = 1;
    else if (strcmp(s, "--quiet") == 0)
        o->quiet = 1;
    else if (strcmp(s, "--repeat") == 0 && *a + 1 < argc && (o->repeat = parse_size(argv[++*a])))
        ;
    else
        return 0;
    return 1;
}

/* MPI, a symred context and the MPI layer over MPI_COMM_WORLD; exits if any fails. */
static inline sr_mpi *mpi_start(int *argc, char ***argv, sr_ctx **ctx)
{
    MPI_Init(argc, argv);
    sr_mpi *m = NULL;
    sr_status st = sr_ctx_new(ctx);
    if (st != SR_OK || (st = sr_mpi_new(*ctx, MPI_COMM_WORLD, &m)) != SR_OK) {
        fprintf(stderr, "%s: cannot start: %s\n", prog, sr_status_str(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return m;
}

/* Runs the kernel `repeat` times and returns the fastest run's time (the slowest rank's); in
 * cw on rank 0, that run's seconds computing and waiting for the ring (the largest over the
 * ranks). Exits on an error. */
static inline double run_timed(sr_mpi *m, sr_mpi_kernel *k, const sr_run_desc *run, int64_t repeat,
                               double cw[2])
{
    double best = INFINITY, mine[2] = {0.0, 0.0};
    for (int64_t r = 0; r < repeat; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime(), tmax;
        sr_status st = sr_mpi_kernel_run(k, run);
        if (st != SR_OK)
            mpi_fail(m, "sr_mpi_kernel_run", st);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tmax < best) {
            best = tmax;
            sr_mpi_kernel_times(k, &mine[0], &mine[1]);
        }
    }
    MPI_Reduce(mine, cw, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return best;
}

/* Frees the kernel, the MPI layer and the context, finalizes MPI, and returns the exit status
 * of rank 0's check on every rank. */
static inline int mpi_finish(sr_mpi *m, sr_mpi_kernel *k, sr_ctx *ctx, int bad)
{
    sr_mpi_kernel_free(k);
    sr_mpi_free(m);
    sr_ctx_free(ctx);
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return bad ? 1 : 0;
}

#endif /* SYMRED_MPI_EXAMPLE_H */
