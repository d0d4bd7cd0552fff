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

#include "../src/core/reductions.h"

#include <stdint.h>

/* The rules of one reduction, as its row of SR_REDUCTION_RULES (src/core/reductions.h, the
 * table every backend reduces by; this library takes that header alone, not the rest of the
 * core). Blocks are reduced by the partial reduction (Min's by Min_ArgMin, so that ties resolve
 * to the lower index across blocks) and combine by the family's rule:
 *   SUM     add
 *   EXT, ARGEXT  the extreme of the order, the lowest index on ties, the first NaN wins
 *   KSEL    merge of two ascending lists, NaN after +inf, ties by index
 *   LSE     a block's LogSumExp l is the state (max l, sum 1), merged as symred merges states
 *   SSMW    averages weighted by exp(LogSumExp of the block), merged likewise
 * (combine.c, by the double-precision rules of src/cpu/red-rules.h). */
typedef struct mpi_rules {
    sr_reduction partial;
    enum sr_red_family family;
    enum sr_red_order order;
    enum sr_red_empty empty;
    int values, indices;
} mpi_rules;

/* The rules of reduction red (a valid sr_reduction). */
const mpi_rules *mpi_rules_of(sr_reduction red);

/* Whether blocks of this family carry indices (their partial reduction writes them). */
static inline int mpi_family_indexed(enum sr_red_family f)
{
    return f == SR_RED_FAM_EXT || f == SR_RED_FAM_ARGEXT || f == SR_RED_FAM_KSEL;
}

typedef struct mpi_state {
    const mpi_rules *rules;
    int64_t n;      /* result rows */
    int dim;        /* components per list entry: dim(F), or dim(weight) for SSMW */
    int k;          /* list length of KSEL, else 1 */
    int64_t filled; /* KSEL: entries held per list; others: blocks folded in so far */
    double *val;    /* n * k * dim values */
    int64_t *idx;   /* n * k * dim global indices (mpi_family_indexed), else NULL */
    double *mx;     /* SSMW: the running max of the blocks' LogSumExp, n values */
    double *wsum;   /* SSMW: sum of exp(lse - mx) over the blocks, n values; LSE: n * dim sums
                       of exp(l - val) over the blocks' LogSumExp l (val: their maxima) */
    double *tv;     /* scratch: KSEL 3 k values (the merge), SSMW dim values */
    int64_t *ti;    /* scratch: KSEL 3 k indices */
} mpi_state;

/* Allocates the state of n rows (the identity: nothing folded yet). SR_ENOMEM, SR_EINVAL for a
 * family combine.c has no rules for, or SR_OK. */
sr_status mpi_state_init(mpi_state *st, const mpi_rules *rules, int64_t n, int dim, int k);
void mpi_state_free(mpi_state *st);

/*
 * Folds rows [r0, r0 + nr) of one block's partial result into the state. vals/idx are the
 * kernel's outputs for those rows (nr * kb * dim entries of dtype / int64_t; idx NULL where the
 * family has none), idx relative to the block, whose first reduced row has global index offset.
 * kb is the block's list length (KSEL: min(k, block rows); else 1). lse is SSMW's
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
