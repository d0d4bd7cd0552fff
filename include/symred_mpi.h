/*
 * symred_mpi.h — symred reductions over data sharded across the ranks of an MPI communicator.
 *
 * A companion library (libsymred_mpi, CMake target symred::symred_mpi, pkg-config symred_mpi),
 * built only when CMake finds MPI; the core library never links MPI. It sits above the public
 * header symred.h and uses nothing else of symred.
 *
 * Each rank holds its own block of rows of every i-variable ("Vi") and its own block of rows of
 * every j-variable ("Vj"); blocks may have any sizes, including 0. For a reduction over j
 * (axis 1) each rank gets the results of its own rows i, reduced over the j rows of all ranks:
 * the j-blocks travel around a ring of the ranks (non-blocking sends and receives of the next
 * block overlap the computation on the current one), each rank runs the symred kernel of the
 * formula on (its i-block, the visiting j-block), and combines that partial result into its
 * running state with the reduction's own rule (Sum: add; Min/Max: the extreme value, lowest
 * index on ties; K-min: merge of sorted lists; LogSumExp: log(e^a + e^b) with a max shift;
 * SumSoftMaxWeight: partial averages weighted by their LogSumExp). Indices returned are global:
 * the position of the row in the concatenation of the blocks in rank order. Axis 0 is the
 * mirror image: the i-blocks travel and each rank gets the results of its own j rows.
 * Parameters ("Pm") are broadcast from rank 0. Design notes and the cost model: docs/scale-out.md.
 *
 * Every function marked collective must be called by all ranks of the communicator, in the
 * same order, with the same formula and description. An error on one rank (a bad argument, a
 * failed allocation or compile) becomes the same status on every rank, with the failing rank's
 * message, "rank R: ...", in sr_mpi_error(); no rank is left waiting. An MPI failure itself
 * (a dead peer) is beyond that: MPI's own error handling then applies.
 *
 * Example: the Gaussian mat-vec of symred.h, with x, y, b the rank's own blocks.
 *
 *     sr_mpi *m;
 *     sr_mpi_kernel *k;
 *     sr_mpi_new(ctx, MPI_COMM_WORLD, &m);                        // collective
 *     sr_mpi_kernel_new(m, f, &desc, &k);                         // collective
 *     const void *args[] = {x, y, b, &g};                         // g read on rank 0 only
 *     sr_run_desc run = {.nx = nx_mine, .ny = ny_mine, .nargs = 4, .args = args, .out = out};
 *     if (sr_mpi_kernel_run(k, &run) != SR_OK)                    // collective; out: nx_mine
 *         fprintf(stderr, "%s\n", sr_mpi_error(m));               // the same on every rank
 *     sr_mpi_kernel_free(k);
 *     sr_mpi_free(m);                                             // collective
 */
#ifndef SYMRED_MPI_H
#define SYMRED_MPI_H

#include <mpi.h>
#include <symred.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SYMRED_MPI_BUILDING) && defined(__GNUC__)
#define SR_MPI_API __attribute__((visibility("default")))
#else
#define SR_MPI_API
#endif

typedef struct sr_mpi sr_mpi;               /* a communicator and a symred context */
typedef struct sr_mpi_kernel sr_mpi_kernel; /* a reduction over sharded data */

/* Collective. Creates the MPI layer over comm (which it duplicates, so its messages never mix
 * with the caller's) and ctx (which it borrows: ctx must outlive it, and kernels are built
 * there). MPI errors on the duplicate return codes instead of aborting. Returns SR_EINVAL for a
 * NULL ctx or out or MPI_COMM_NULL, SR_ENOMEM, or SR_EIO when MPI fails; *out is then NULL. An
 * sr_mpi and its kernels are used by one thread at a time. */
SR_MPI_API sr_status sr_mpi_new(sr_ctx *ctx, MPI_Comm comm, sr_mpi **out);
/* sr_mpi_new for a communicator given by its Fortran handle (MPI_Comm_c2f; mpi4py's
 * comm.py2f()), which is how the Python bindings pass one. */
SR_MPI_API sr_status sr_mpi_new_f(sr_ctx *ctx, MPI_Fint comm, sr_mpi **out);
/* Collective. Frees m (its kernels must have been freed) and its communicator; after
 * MPI_Finalize (a garbage-collected caller), only the memory. NULL: no-op. */
SR_MPI_API void sr_mpi_free(sr_mpi *m);
/* The message of the last failure on m or on one of its kernels ("rank R: ..."), or "". Valid
 * until the next call on m. */
SR_MPI_API const char *sr_mpi_error(const sr_mpi *m);
/* This process's rank and the number of ranks of m's communicator (0 and 0 for NULL). */
SR_MPI_API int sr_mpi_rank(const sr_mpi *m);
SR_MPI_API int sr_mpi_size(const sr_mpi *m);

/* Collective. Creates the sharded kernel of desc->reduction of f (any reduction, axis 0 or 1,
 * SR_F32 or SR_F64 (SR_ENOTSUP for SR_F16 and SR_BF16), any device), as sr_kernel_new would.
 * Every rank must pass the same formula and description: they are compared with rank 0's (SR_EINVAL
 * otherwise). Inside, the kernels that give combinable partial states are built in m's context: the
 * value-and-index form for Min/Max/ArgMin/ArgMax and for the K-reductions (so that blocks merge by
 * value, then index), and for SumSoftMaxWeight a LogSumExp of F beside it (the partial averages are
 * weighted by exp(LogSumExp)); every reduction's errors are those of sr_kernel_new. *out is NULL on
 * failure. */
SR_MPI_API sr_status sr_mpi_kernel_new(sr_mpi *m, const sr_expr *f, const sr_kernel_desc *desc,
                                       sr_mpi_kernel **out);
/* Local (not collective). Frees the kernel; NULL is a no-op. */
SR_MPI_API void sr_mpi_kernel_free(sr_mpi_kernel *kernel);
/* Values per result row, as sr_kernel_out_dim of the same reduction (0 for NULL). */
SR_MPI_API int sr_mpi_kernel_out_dim(const sr_mpi_kernel *kernel);
/* Arrays sr_mpi_kernel_run expects, as sr_kernel_nargs (0 for NULL). */
SR_MPI_API int sr_mpi_kernel_nargs(const sr_mpi_kernel *kernel);

/* Collective. Runs the kernel on this rank's blocks: run->nx rows of every i-variable and
 * run->ny rows of every j-variable in run->args (nargs = sr_kernel_nargs of the formula, as for
 * sr_kernel_run_ex); parameters are read on rank 0 only (other ranks may pass NULL). Outputs, as
 * for sr_kernel_run_ex, cover this rank's own rows: run->nx * out_dim values / indices for axis
 * 1, run->ny * out_dim for axis 0; value reductions write run->out (the dtype), arg reductions
 * run->out_idx (global int64_t indices), Min_ArgMin, Max_ArgMax and KMin_ArgKMin both. Sums of
 * float32 kernels are accumulated across blocks in double. The K-reductions need K <= the total
 * reduced count over all ranks. Errors on any rank (SR_EINVAL for bad arguments, SR_EOVERFLOW
 * for a block MPI cannot send in one message, SR_ENOMEM, a kernel's error, SR_EIO for MPI)
 * are returned on every rank, and the outputs are then unspecified. */
SR_MPI_API sr_status sr_mpi_kernel_run(sr_mpi_kernel *kernel, const sr_run_desc *run);

/* Seconds this rank spent, in its last sr_mpi_kernel_run, computing on the blocks and then
 * waiting for the ring's messages to complete (the communication that did not hide behind the
 * computation). Zeros for NULL or before the first run. */
SR_MPI_API void sr_mpi_kernel_times(const sr_mpi_kernel *kernel, double *compute_s, double *wait_s);

#ifdef __cplusplus
}
#endif
#endif /* SYMRED_MPI_H */
