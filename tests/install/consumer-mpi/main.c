/*
 * main.c — a tiny MPI program built against an installed symred_mpi (tests/install/run.sh).
 *
 * Every rank holds one row of x and one row of y; out_i = Sum_j SqDist(x_i, y_j) over the rows
 * of all ranks is checked against the value worked out by hand.
 */
#include <symred_mpi.h>

#include <math.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, P, bad = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    sr_ctx *ctx = NULL;
    sr_mpi *m = NULL;
    sr_mpi_kernel *k = NULL;
    sr_expr *f = NULL;
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = SR_F64;
    double x = rank, y = 2.0 * rank, out = 0.0;
    const void *args[] = {&x, &y};
    sr_run_desc run = {.nx = 1, .ny = 1, .nargs = 2, .args = args, .out = &out};
    if (sr_ctx_new(&ctx) == SR_OK && sr_mpi_new(ctx, MPI_COMM_WORLD, &m) == SR_OK &&
        (f = sr_sqdist(ctx, sr_vi(ctx, 0, 1), sr_vj(ctx, 1, 1))) &&
        sr_mpi_kernel_new(m, f, &desc, &k) == SR_OK && sr_mpi_kernel_run(k, &run) == SR_OK) {
        double want = 0.0;
        for (int p = 0; p < P; p++)
            want += (x - 2.0 * p) * (x - 2.0 * p);
        bad = fabs(out - want) > 1e-12;
        printf("consumer_mpi: rank %d of %d: %g (want %g)\n", rank, P, out, want);
    } else {
        fprintf(stderr, "consumer_mpi: %s\n", m ? sr_mpi_error(m) : "cannot start");
    }
    sr_mpi_kernel_free(k);
    sr_mpi_free(m);
    sr_ctx_free(ctx);
    MPI_Finalize();
    return bad;
}
