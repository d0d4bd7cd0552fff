/*
 * combine.h — partial reduction states of the MPI layer and the rules that combine them.
 *
 * A block's partial result (what a symred kernel returns for one block of the reduced rows) is
 * folded into a running state kept in double precision; once every block has been folded, the
 * state is written out in the kernel's dtype. No MPI here: these are plain functions of arrays.
 */
#ifndef SYMRED_MPI_COMBINE_H
#define SYMRED_MPI_COMBINE_H

#include <symred.h>

#include <stdint.h>

/* How partial results combine. */
typedef enum mpi_family {
    FAM_SUM,  /* add */
    FAM_MIN,  /* smallest value, lowest index on ties, the first NaN wins (docs/semantics.md) */
    FAM_MAX,  /* largest value, likewise */
    FAM_KMIN, /* merge of two ascending lists, NaN after +inf, ties by index */
    FAM_LSE,  /* log(e^a + e^b) with the max shifted out */
    FAM_SSMW  /* averages weighted by exp(LogSumExp of the block) */
} mpi_family;

typedef struct mpi_state {
    mpi_family family;
    int64_t n;      /* result rows */
    int dim;        /* components per list entry: dim(F), or dim(weight) for FAM_SSMW */
    int k;          /* list length of FAM_KMIN, else 1 */
    int64_t filled; /* FAM_KMIN: entries held per list; others: blocks folded in so far */
    double *val;    /* n * k * dim values */
    int64_t *idx;   /* n * k * dim global indices (FAM_MIN, FAM_MAX, FAM_KMIN), else NULL */
    double *mx;     /* FAM_SSMW: the running max of the blocks' LogSumExp, n values */
    double *wsum;   /* FAM_SSMW: sum of exp(lse - mx) over the blocks, n values */
    double *tv;     /* FAM_KMIN: merge scratch, k values */
    int64_t *ti;    /* FAM_KMIN: merge scratch, k indices */
} mpi_state;

/* Allocates the state of n rows (the identity: nothing folded yet). SR_ENOMEM or SR_OK. */
sr_status mpi_state_init(mpi_state *st, mpi_family family, int64_t n, int dim, int k);
void mpi_state_free(mpi_state *st);

/*
 * Folds rows [r0, r0 + nr) of one block's partial result into the state. vals/idx are the
 * kernel's outputs for those rows (nr * kb * dim entries of dtype / int64_t; idx NULL where the
 * family has none), idx relative to the block, whose first reduced row has global index offset.
 * kb is the block's list length (FAM_KMIN: min(k, block rows); else 1). lse is FAM_SSMW's
 * LogSumExp of F over the block (nr values of dtype), NULL otherwise. The caller folds all
 * rows of a block before calling mpi_state_next_block.
 */
void mpi_state_fold(mpi_state *st, int64_t r0, int64_t nr, const void *vals, const int64_t *idx,
                    const void *lse, int kb, int64_t offset, sr_dtype dtype);
/* Marks the end of a block of kb entries per list. */
void mpi_state_next_block(mpi_state *st, int kb);

/* Writes the final results: values (dtype) into out when out is not NULL, indices into out_idx
 * when not NULL. */
void mpi_state_write(const mpi_state *st, void *out, int64_t *out_idx, sr_dtype dtype);

#endif /* SYMRED_MPI_COMBINE_H */
