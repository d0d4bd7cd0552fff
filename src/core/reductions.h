/*
 * reductions.h — the rules of every reduction, in one table: how it keeps its running state,
 * what that state starts as, in which order it picks values and where a NaN goes, what an empty
 * reduction gives, what it writes, and which reduction's outputs carry a block's whole partial
 * state. Adding a reduction means adding a row to SR_REDUCTION_RULES (and to the public
 * SR_REDUCTION_MAP, whose order it follows); a reduction with a new kind of state also adds a
 * row to SR_RED_FAMILY_MAP and the family's rules in each user below.
 *
 * Readers: core (kernel.c builds sr_reductions from it), the emitters (emit-state.c spells each
 * family's state, init, folds of a value and of a tile, merge and final for the C and CUDA
 * kernels), the CPU's double-precision rules (src/cpu/red-rules.h) with their table of
 * per-family operations on row state (cpu_red_ops: the reference and tile interpreters), core's
 * ranges (the empty result) and the MPI companion library (mpi/combine.c, on red-rules.h), which
 * sits above the public API: this header is macros and small inline functions and needs no other
 * internal header, so mpi/ compiles it in too without seeing the rest of core.
 */
#ifndef SYMRED_REDUCTIONS_H
#define SYMRED_REDUCTIONS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* X(family, NaN policy): the kinds of running state. Each family's state per output row is
 * its rows of SR_RED_SLOT_MAP; how it folds a value in, merges two partial states (tiles,
 * threads, CUDA blocks) and is finalised is spelled once per family for the generated kernels
 * (emit-state.c's family_rules) and for the CPU's double-precision rules (src/cpu/red-rules.h,
 * which MPI's combine of block results, mpi/combine.c, shares).
 *   SUM    add; merge adds the partial sums (Kahan compensation on request)
 *   EXT    Min, Max: keep the extreme, the first NaN wins
 *   ARGEXT the arg-reductions of Min and Max: the extreme and its index; ties keep the lower
 *          index, so a merge of states in index order equals one pass
 *   KSEL   the K smallest with their indices, sorted; merge two sorted lists
 *   LSE    (max m, sum of exp(v - m)): merge rescales to the larger maximum and adds
 *   SSMW   (max m, sum of exp(f - m), sum of exp(f - m) g): likewise, for the weights g
 * NaN policy: FIRST, a NaN ranks before every number and the first one is kept; LAST, a NaN
 * sorts after +inf (NumPy's sort); PROPAGATE, a NaN makes the result NaN (docs/semantics.md). */
#define SR_RED_FAMILY_MAP(X)                                                                       \
    X(SUM, PROPAGATE)                                                                              \
    X(EXT, FIRST)                                                                                  \
    X(ARGEXT, FIRST)                                                                               \
    X(KSEL, LAST)                                                                                  \
    X(LSE, PROPAGATE)                                                                              \
    X(SSMW, PROPAGATE)

enum sr_red_family {
#define SR_RED_FAMILY_ENUM_(fam, nan) SR_RED_FAM_##fam,
    SR_RED_FAMILY_MAP(SR_RED_FAMILY_ENUM_)
#undef SR_RED_FAMILY_ENUM_
        SR_RED_FAM_COUNT
};

enum sr_red_nan { SR_RED_NAN_PROPAGATE, SR_RED_NAN_FIRST, SR_RED_NAN_LAST };

static inline enum sr_red_nan sr_red_family_nan(enum sr_red_family fam)
{
    switch (fam) {
#define SR_RED_FAMILY_NAN_(f, nan)                                                                 \
    case SR_RED_FAM_##f:                                                                           \
        return SR_RED_NAN_##nan;
        SR_RED_FAMILY_MAP(SR_RED_FAMILY_NAN_)
#undef SR_RED_FAMILY_NAN_
    default:
        return SR_RED_NAN_PROPAGATE;
    }
}

/* The slots of each family's state, in layout order (8-byte members first where the types
 * allow: least padding): X(family, name, type, extent, start value). Types: ACC the
 * accumulator (sr_acc), VAL the computing type (sr_t), IDX an int64 index. Extents: D = dim(F),
 * DK = D lists of K, DG = dim(weight), ONE a scalar. Start values: ZERO, NONE (index -1),
 * ORDER (+inf ascending, -inf descending), NEG_INF. */
#define SR_RED_SLOT_MAP(X)                                                                         \
    X(SUM, s, ACC, D, ZERO)                                                                        \
    X(SUM, c, ACC, D, ZERO)                                                                        \
    X(EXT, m, VAL, D, ORDER)                                                                       \
    X(ARGEXT, i, IDX, D, NONE)                                                                     \
    X(ARGEXT, m, VAL, D, ORDER)                                                                    \
    X(KSEL, i, IDX, DK, NONE)                                                                      \
    X(KSEL, m, VAL, DK, ORDER)                                                                     \
    X(LSE, s, ACC, D, ZERO)                                                                        \
    X(LSE, m, VAL, D, NEG_INF)                                                                     \
    X(SSMW, s, ACC, ONE, ZERO)                                                                     \
    X(SSMW, w, ACC, DG, ZERO)                                                                      \
    X(SSMW, m, VAL, ONE, NEG_INF)

enum sr_red_type { SR_RED_T_ACC, SR_RED_T_VAL, SR_RED_T_IDX };
enum sr_red_count { SR_RED_N_D, SR_RED_N_DK, SR_RED_N_DG, SR_RED_N_ONE };
enum sr_red_start {
    SR_RED_START_ZERO,
    SR_RED_START_NONE,
    SR_RED_START_ORDER,
    SR_RED_START_NEG_INF
};

/* The order in which a reduction picks values: ascending (Min, the K-reductions), descending
 * (Max), or none (the sums). */
enum sr_red_order { SR_RED_DESC = -1, SR_RED_UNORDERED = 0, SR_RED_ASC = 1 };

/* Whether (va, ia) ranks before (vb, ib) for a selection of order (ascending or descending)
 * whose NaN policy is nan (FIRST or LAST); equal values rank by index, the lower first, so that
 * every backend picks the same element and states merged in index order equal one pass. The
 * double-precision rule of the CPU (src/cpu/red-rules.h) and of MPI's combine (mpi/combine.c); the
 * generated kernels spell it in the family rules of emit-state.c. */
static inline bool sr_red_before(enum sr_red_order order, enum sr_red_nan nan, double va,
                                 int64_t ia, double vb, int64_t ib)
{
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb)
        return nan == SR_RED_NAN_LAST ? nb : na;
    if (!na && va != vb)
        return order == SR_RED_DESC ? va > vb : va < vb;
    return ia < ib;
}

/* What an empty reduction writes (docs/semantics.md): the state's start value finalised. */
enum sr_red_empty {
    SR_RED_EMPTY_ZERO,    /* Sum */
    SR_RED_EMPTY_ORDER,   /* +inf ascending, -inf descending; index -1 */
    SR_RED_EMPTY_NEG_INF, /* LogSumExp */
    SR_RED_EMPTY_NAN      /* SumSoftMaxWeight: 0 / 0 */
};

/* The value an empty reduction writes, for a reduction of order order. */
static inline double sr_red_empty_value(enum sr_red_empty empty, enum sr_red_order order)
{
    switch (empty) {
    case SR_RED_EMPTY_ZERO:
        return 0.0;
    case SR_RED_EMPTY_ORDER:
        return order == SR_RED_DESC ? -INFINITY : INFINITY;
    case SR_RED_EMPTY_NEG_INF:
        return -INFINITY;
    default:
        return NAN;
    }
}

/* X(reduction, family, order, empty result, writes values, writes indices, uses k, F scalar,
 * needs a weight, partial): one row per sr_reduction, in SR_REDUCTION_MAP's order. partial is the
 * reduction whose outputs hold a block's whole partial state, from which blocks combine (MPI): a
 * Min's blocks need their ArgMin too, so that ties resolve to the lower index. */
#define SR_REDUCTION_RULES(X)                                                                      \
    X(SUM, SUM, UNORDERED, ZERO, 1, 0, 0, 0, 0, SUM)                                               \
    X(MIN, EXT, ASC, ORDER, 1, 0, 0, 0, 0, MIN_ARGMIN)                                             \
    X(MAX, EXT, DESC, ORDER, 1, 0, 0, 0, 0, MAX_ARGMAX)                                            \
    X(ARGMIN, ARGEXT, ASC, ORDER, 0, 1, 0, 0, 0, MIN_ARGMIN)                                       \
    X(ARGMAX, ARGEXT, DESC, ORDER, 0, 1, 0, 0, 0, MAX_ARGMAX)                                      \
    X(MIN_ARGMIN, ARGEXT, ASC, ORDER, 1, 1, 0, 0, 0, MIN_ARGMIN)                                   \
    X(MAX_ARGMAX, ARGEXT, DESC, ORDER, 1, 1, 0, 0, 0, MAX_ARGMAX)                                  \
    X(KMIN, KSEL, ASC, ORDER, 1, 0, 1, 0, 0, KMIN_ARGKMIN)                                         \
    X(ARGKMIN, KSEL, ASC, ORDER, 0, 1, 1, 0, 0, KMIN_ARGKMIN)                                      \
    X(KMIN_ARGKMIN, KSEL, ASC, ORDER, 1, 1, 1, 0, 0, KMIN_ARGKMIN)                                 \
    X(LOGSUMEXP, LSE, UNORDERED, NEG_INF, 1, 0, 0, 0, 0, LOGSUMEXP)                                \
    X(SUMSOFTMAXWEIGHT, SSMW, UNORDERED, NAN, 1, 0, 0, 1, 1, SUMSOFTMAXWEIGHT)

#endif /* SYMRED_REDUCTIONS_H */
