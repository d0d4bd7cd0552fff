/*
 * formulas.h — the algebraic simplifier, its cost model, and the named formulas.
 *
 * The simplifier rewrites an expression DAG into an equivalent one that is cheaper to run. Rules
 * are data (struct simp_rule: a name, the op at the root they apply to, a guard and a rewrite),
 * grouped into passes; each pass rewrites the DAG bottom-up until no rule applies, and the
 * passes repeat until a whole round changes nothing. Every firing is counted so that
 * sr_kernel_explain can show the formula after each pass with the rules that fired.
 *
 * Every rewrite gives the same values as the original under docs/semantics.md up to rounding;
 * the NaN/Inf policy and the documented exceptions are in docs/simplifier.md. New nodes are
 * only built through expr_make, so a rewrite can never produce a formula with bad dimensions,
 * and a rewrite whose result has another dimension than the node it replaces is discarded.
 */
#ifndef SYMRED_FORMULAS_H
#define SYMRED_FORMULAS_H

#include "../expr/expr.h"

#include <stdbool.h>
#include <stddef.h>

/* The passes, in the order each round runs them. */
enum simp_pass {
    SIMP_PASS_CANON,
    SIMP_PASS_IDENT,
    SIMP_PASS_MATCH,
    SIMP_PASS_COST,
    SIMP_PASS_COUNT
};

extern const char *const simp_pass_names[SIMP_PASS_COUNT];

struct simp_opts {
    /* SqDist(x,y) -> SqNorm2(x)+SqNorm2(y)-2(x|y) from this dimension on (the cost model's
     * threshold, simp_cost_gemm_min_dim()); 0 never. */
    int gemm_min_dim;
};

/* Defaults: the cost model's threshold. */
void simp_opts_default(struct simp_opts *o);

/* Pointer-keyed memo of one pass: node -> its rewritten form (process-local by design). */
struct simp_memo {
    const sr_expr **key;
    sr_expr **val;
    size_t cap, count;
};

#define SIMP_MAX_RULES 96

/* The state a pass runs with; rules read ctx and opts. */
struct simp_state {
    sr_ctx *ctx;
    const struct simp_opts *opts;
    enum simp_pass pass;
    struct simp_memo memo;
    int counts[SIMP_MAX_RULES]; /* firings of each rule in the current pass */
    long fuel;                  /* firings left: a bound that makes termination certain */
    int depth;
};

/*
 * A rule. op is the root op it looks at (-1: any). guard says whether it applies; rewrite
 * builds the replacement, or returns NULL when it cannot (an allocation failed, a constant
 * would not be finite, ...). The engine ignores a result equal to the node or of another
 * dimension.
 */
struct simp_rule {
    const char *name;
    enum simp_pass pass;
    int op;
    bool (*guard)(struct simp_state *s, sr_expr *e);
    sr_expr *(*rewrite)(struct simp_state *s, sr_expr *e);
};

extern const struct simp_rule simp_rules[];
extern const int simp_nrules;

/*
 * Simplifies e to a fixed point. *out is the result (e itself when nothing applies; always a
 * valid node). When log is not NULL, a line per pass that changed something is appended to it,
 * naming the rules that fired and giving the formula after the pass. Returns the number of
 * firings. Never fails: on allocation failure the rules concerned simply do not fire. The
 * context's pending builder error is left as it was.
 */
int simp_expr(sr_ctx *ctx, sr_expr *e, const struct simp_opts *o, sr_expr **out,
              struct expr_buf *log);

/* Whether f(x_i, y_j) = f(y_i, x_j) for every value of its variables, with its i-variables
 * paired with j-variables of the same dimension (symmetry.c): returns the number of pairs and
 * writes the argument indices of pair p to vi[p] (i) and vj[p] (j), or -1 when f is not
 * symmetric under any pairing, has more than max variables of one category, or memory ran out.
 * Structural (the canonical forms of f and of f with each pair exchanged are the same node), so
 * a symmetry the simplifier cannot see is reported as none. Parameters are left in place. */
int simp_symmetric_pairs(sr_ctx *ctx, const sr_expr *f, int *vi, int *vj, int max);

/* ---- facts about nodes (rules.c) ---- */

/* Structural total order, the same in every process: constants first, then by structural
 * hash, then by structure. 0 only for the same node. */
int simp_cmp(const sr_expr *a, const sr_expr *b);
/* e is never negative (it may be NaN, +0, -0 or +Inf) whatever the inputs. */
bool simp_nonneg(const sr_expr *e);
/* e is finite whatever the inputs, NaN and Inf inputs included (comparisons, OneHot, bounded
 * arithmetic on them and on constants). */
bool simp_always_finite(const sr_expr *e);
/* The factors of e through products and negations, appended to fac from index n (at most nmax
 * in all): the new count, or -1 when there are more than nmax; *neg counts the negations. */
int simp_mul_factors(const sr_expr *e, const sr_expr **fac, int n, int nmax, int *neg);

/* ---- cost model (cost.c) ---- */

/* The cost model's estimate for a kernel (src/formulas/cost.c), in flop-equivalents. */
struct sr_cost {
    double flops_pair; /* per (i, j) pair */
    double flops_row;  /* per output row: hoisted terms of the output index */
    double flops_col;  /* per reduced row: hoisted terms of the reduced index */
    double flops_call; /* once per call: parameter-only terms */
    double bytes_pair; /* bytes of reduced-index operands read per pair */
};

/*
 * The dimension from which inner products go through the gemm-epilogue path's tiles
 * (src/cpu/gemm.c). The crossover, measured on the 2-core AMD EPYC AVX-512 development VM with
 * BLIS 0.9.0 picking zen3 (2 threads, load average 2-3) with bench/bench-gemm, which
 * runs the same kernel with SYMRED_GEMM=off and =on: a Gaussian mat-vec written with the inner
 * product, Exp(-(SqNorm2(x)+SqNorm2(y)-2(x|y))*g)*b, float32, N = M = sqrt(F / 2D), best of 3.
 * Direct / gemm time ratio, F = 2e10 (bench/README.md has the times):
 *     D = 8: 0.49   16: 0.80   24: 1.45   32: 2.58   64: 4.57   256: 4.52   1024: 4.98
 * Two earlier runs under heavier load gave 1.05 / 2.58 and 0.54 / 1.07 at D = 16 / 24: the
 * crossover is between 16 and 24 in every run, so gemm-epilogue is chosen from D = 24 on, and the
 * simplifier rewrites SqDist into norms and an inner product (the form that path needs) from the
 * same D. (kNN, ArgKMin k = 10 of SqDist at D = 100, 10000 x 100000: direct 104.7 s, gemm 3.4 s.)
 * Measured with symred's AVX-512 gemm (Zen 5 EPYC, load 2-3): direct / gemm 0.72-1.46
 * at D = 8, 1.30 at 12, 1.55-3.47 at 16, 2.67-3.83 at 24: on AVX-512 CPUs the crossover is
 * between 8 and 16. The constant stays 24 (the BLIS crossover, and the simplifier's rewrite
 * threshold, which cannot ask the backend which gemm will run); docs/avx512-gemm.md.
 */
#define SR_GEMM_MIN_DIM 24

/* Flop-equivalents to compute node e once from its operands. */
double simp_op_flops(const sr_expr *e);
/* Estimates the cost of computing the roots (NULL ones skipped) for a reduction over the index
 * whose dependency bit is red_dep (DEP_J for axis 1). With hoist, terms that do not depend on
 * the pair are charged per row, column or call; without, every non-constant node per pair. */
void simp_cost_estimate(const sr_expr *const *roots, int nroots, unsigned red_dep, size_t esize,
                        bool hoist, struct sr_cost *c);
/* The smallest dimension at which SqDist becomes norms + an inner product: SR_GEMM_MIN_DIM,
 * the measured crossover of the gemm-epilogue path. */
int simp_cost_gemm_min_dim(void);
/* Whether SqDist(a, b) should become norms + inner product: a and b separable (one depends on
 * i only, the other on j only) and their dimension at least o->gemm_min_dim. */
bool simp_cost_gemm_wins(const sr_expr *a, const sr_expr *b, const struct simp_opts *o);

#endif /* SYMRED_FORMULAS_H */
