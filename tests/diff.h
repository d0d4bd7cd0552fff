/*
 * diff.h — the cross-backend differential harness: a backend's kernels against the reference
 * interpreter on the same inputs, with per-dtype tolerances. test-jit.c runs it on the CPU JIT,
 * test-cuda.c on the GPU; every op, every reduction on both axes in both dtypes, sizes 0, 1,
 * primes and sizes that are not multiples of any tile, NaN/Inf inputs and ties.
 */
#ifndef SYMRED_TEST_DIFF_H
#define SYMRED_TEST_DIFF_H

#include "symred.h"

#include <stdbool.h>
#include <stdint.h>

/* How inputs are drawn. */
enum diff_gen {
    DIFF_UNIFORM,  /* uniform in [lo, hi) */
    DIFF_GRID,     /* multiples of 1/64: SqDist and products are exact in float32 */
    DIFF_SMALLINT, /* 0..3: many ties */
    DIFF_SPECIAL   /* 3% NaN, 3% +inf, 3% -inf, else grid values */
};

struct diff_tol {
    double rtol, atol;
};

/* 1e-10 for float64, 2e-4 for float32 (docs/semantics.md: sums of positive terms); float16
 * and bfloat16 (computed in float32): float32's plus two units in the last place of the
 * output, 2^-9 and 2^-6. */
struct diff_tol diff_tol_of(sr_dtype dt);
/* A float32 tolerance widened for dtype dt's output rounding, as diff_tol_of does. */
struct diff_tol diff_tol_widen(sr_dtype dt, struct diff_tol f32);
/* "f32", "f64", "f16", "bf16". */
const char *diff_dtype_tag(sr_dtype dt);

/* The backend name a kernel made for dev must report ("cpu-jit", "cuda"); for SR_DEVICE_CPU,
 * diff_backend_override when set (a test file whose context runs the CPU on another backend). */
const char *diff_backend_name(sr_device dev);
extern const char *diff_backend_override;

/* Parses formula with the aliases; fails the test with the message otherwise. */
sr_expr *diff_parse(sr_ctx *ctx, const char *formula, const char *const *aliases, int n);

/* sr_kernel_new on dev with desc d; fails the test with the message otherwise. */
sr_kernel *diff_kernel(sr_ctx *ctx, sr_expr *f, sr_kernel_desc d, sr_device dev);

/* Runs kb (the backend under test) and kr (the reference) on the same inputs and compares
 * statuses, values (within tol) and indices (exactly). Returns the number of outputs. */
int64_t diff_run(sr_ctx *ctx, sr_kernel *kb, sr_kernel *kr, int64_t nx, int64_t ny, enum diff_gen g,
                 double lo, double hi, uint64_t seed, struct diff_tol tol, const char *what);

/* The op groups: together they use every op of the op table (the simplifier is turned off
 * while they run, so each op reaches the backend as written). */
#define DIFF_OP_GROUPS 9
void diff_op_group(sr_ctx *ctx, sr_device dev, int grp, sr_dtype dt);
/* Op group grp's formula and its 4 aliases (x=Vi, y=Vj, g=Pm(1), and b=Vj(1) or w=Pm(20)). */
const char *diff_op_group_formula(int grp, const char *const **aliases);

/* Sets seen[op] for every op of the DAG of e (seen has one entry per op of the op table). */
void diff_mark_ops(const sr_expr *e, bool *seen);

/* Every reduction at sizes 1, 7, primes, 0, nx << ny and nx >> ny (the split paths). */
void diff_reduction(sr_ctx *ctx, sr_device dev, sr_reduction red, sr_dtype dt);

/* One reduction of a scalar formula of x=Vi(1), y=Vj(1) with inputs drawn by g, every dtype,
 * at 37 x 1500 and 3 x 9000 (split of the reduced range). */
void diff_special(sr_ctx *ctx, sr_device dev, sr_reduction red, enum diff_gen g, int k,
                  const char *ftext);

/* The test lists, as X-macro tables, so every backend's test file runs the same cases:
 * X(test name, group) / X(reduction, test name) / X(test name, reduction, gen, k, formula). */
#define DIFF_OP_TESTS(X)                                                                           \
    X(unary, 0)                                                                                    \
    X(unary2, 1)                                                                                   \
    X(binary, 2)                                                                                   \
    X(vector, 3)                                                                                   \
    X(weighted, 4)                                                                                 \
    X(tensor, 5)                                                                                   \
    X(complex, 6)                                                                                  \
    X(complex2, 7)                                                                                 \
    X(big_dims, 8)
#define DIFF_RED_TESTS(X)                                                                          \
    X(SR_SUM, sum)                                                                                 \
    X(SR_MIN, min)                                                                                 \
    X(SR_MAX, max)                                                                                 \
    X(SR_ARGMIN, argmin)                                                                           \
    X(SR_ARGMAX, argmax)                                                                           \
    X(SR_MIN_ARGMIN, min_argmin)                                                                   \
    X(SR_MAX_ARGMAX, max_argmax)                                                                   \
    X(SR_KMIN, kmin)                                                                               \
    X(SR_ARGKMIN, argkmin)                                                                         \
    X(SR_KMIN_ARGKMIN, kmin_argkmin)                                                               \
    X(SR_LOGSUMEXP, logsumexp)                                                                     \
    X(SR_SUMSOFTMAXWEIGHT, sumsoftmaxweight)
#define DIFF_SPECIAL_TESTS(X)                                                                      \
    X(argkmin_ties, SR_ARGKMIN, DIFF_SMALLINT, 5, "Abs(x - y)")                                    \
    X(kmin_argkmin_ties, SR_KMIN_ARGKMIN, DIFF_SMALLINT, 4, "Abs(x - y)")                          \
    X(argmin_ties, SR_MIN_ARGMIN, DIFF_SMALLINT, 1, "Abs(x - y)")                                  \
    X(argmax_ties, SR_MAX_ARGMAX, DIFF_SMALLINT, 1, "Abs(x - y)")                                  \
    X(nan_inf_sum, SR_SUM, DIFF_SPECIAL, 1, "x * y")                                               \
    X(nan_inf_min_argmin, SR_MIN_ARGMIN, DIFF_SPECIAL, 1, "x - y")                                 \
    X(nan_inf_max_argmax, SR_MAX_ARGMAX, DIFF_SPECIAL, 1, "x + y")                                 \
    X(nan_inf_kmin, SR_KMIN_ARGKMIN, DIFF_SPECIAL, 4, "x - y")                                     \
    X(nan_inf_logsumexp, SR_LOGSUMEXP, DIFF_SPECIAL, 1, "x + y")                                   \
    X(nan_inf_softmax, SR_SUMSOFTMAXWEIGHT, DIFF_SPECIAL, 1, "x + y")                              \
    X(nan_inf_tensor, SR_SUM, DIFF_SPECIAL, 1,                                                     \
      "TensorDot(Concat(x, y), Concat(y, x), [2], [2], [0], [0]) + Elem(ExtractT(x*y, 1, 3), 0)"   \
      " + Elem(ElemT(x, 2, 1), 0) + Elem(SumT(y, 2), 1)")

#endif
