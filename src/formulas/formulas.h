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

#include "../core/core.h"

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

/* Whether SYMRED_SIMPLIFY (0 or 1, default 1) allows the simplifier; SR_EINVAL, naming the
 * variable, for any other value (then *on is true). */
sr_status simp_enabled(sr_ctx *ctx, bool *on);

/* Kernel hooks, called by kernel.c: simp_kernel replaces k->f and k->weight by their simplified
 * forms and fills k->simp; release frees what it allocated; explain appends its text. */
sr_status simp_kernel(sr_kernel *k);
void simp_kernel_release(sr_kernel *k);
void simp_kernel_explain(const sr_kernel *k, struct expr_buf *b);
/* The backend of a kernel with a reduction rewrite (k->simp.post; post.c): an inner kernel on
 * the user's device reduces k->simp.inner, then the post formula gives the output. kernel.c
 * installs it in place of any backend but the reference. */
extern const struct sr_backend_i simp_post_backend;
/* The most workspace one run of such a kernel uses: the inner and post kernels' workspaces and
 * the chunk of R (for the memory budget, src/core/budget.c; k->backend->run equals
 * simp_post_backend.run for these kernels). */
int64_t simp_post_workspace(const sr_kernel *k);

/* ---- facts about nodes (rules.c) ---- */

/* Structural total order, the same in every process: constants first, then by structural
 * hash, then by structure. 0 only for the same node. */
int simp_cmp(const sr_expr *a, const sr_expr *b);
/* e is never negative (it may be NaN, +0, -0 or +Inf) whatever the inputs. */
bool simp_nonneg(const sr_expr *e);
/* e is finite whatever the inputs, NaN and Inf inputs included (comparisons, OneHot, bounded
 * arithmetic on them and on constants). */
bool simp_always_finite(const sr_expr *e);

/* ---- cost model (cost.c); struct sr_cost is in core.h ---- */

/* Flop-equivalents to compute node e once from its operands. */
double simp_op_flops(const sr_expr *e);
/* Estimates the cost of computing the roots (NULL ones skipped) for a reduction over the index
 * whose dependency bit is red_dep (DEP_J for axis 1). With hoist, terms that do not depend on
 * the pair are charged per row, column or call; without, every non-constant node per pair. */
void simp_cost_estimate(const sr_expr *const *roots, int nroots, unsigned red_dep, size_t esize,
                        bool hoist, struct sr_cost *c);
/* The smallest dimension at which the norms + inner product form of SqDist beats the direct
 * form in the model (32 with the constants in cost.c). */
int simp_cost_gemm_min_dim(void);
/* Whether SqDist(a, b) should become norms + inner product: a and b separable (one depends on
 * i only, the other on j only) and their dimension at least o->gemm_min_dim. */
bool simp_cost_gemm_wins(const sr_expr *a, const sr_expr *b, const struct simp_opts *o);

#endif /* SYMRED_FORMULAS_H */
