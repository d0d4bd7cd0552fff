/*
 * emit-c.h — the C emitter's internals, shared by its two halves: emit-ops.c (the op table: one
 * C spelling per op, and the helpers that name and reference a node's components) and emit-c.c
 * (placement and the skeletons of the generated entry points). Nothing outside these two files
 * includes it; other modules use jit.h.
 */
#ifndef SYMRED_JIT_EMIT_C_H
#define SYMRED_JIT_EMIT_C_H

#include "jit.h"

/* Where a node is evaluated. */
enum place { PL_UNIFORM, PL_OUTER, PL_INNER, PL_PAIR };

struct emitter {
    const struct sr_kernel *k;
    struct expr_buf *b;
    bool f32;
    const char *fs; /* libm suffix: "f" or "" */
    int outer_dep, inner_dep;
    const sr_expr **order;
    size_t n;
    enum place *place; /* by position in order */
    int *col;          /* inner frontier: first column in the tile, else -1 */
    bool *in_loop;     /* needed inside the simd loop */
    uint32_t *pos_of;  /* node id -> position + 1 (0: not in the DAG) */
    enum place scope;  /* where the code being emitted runs */
    sr_status fail;    /* set by ref() and friends */
    /* Loop mode: the formula is too wide or too large to unroll into the vectorised pair loop
     * (F and the weight more than JIT_MAX_OUT values per pair, more than JIT_MAX_SCALARS
     * scalar statements, or a pair node held in an array). The pair loop is then a plain loop,
     * pair nodes may be arrays, and F's values reach the reduction through the tile buffer in
     * loops over their components. */
    bool loops;
    bool pair_arrays; /* loop mode with pair nodes held in arrays (else only wide or large) */
    /* Compact emission, for formulas whose source would be too long to compile quickly: big
     * nodes are computed into arrays by loops instead of inlined where used, and contractions
     * of more than JIT_COMPACT_TERMS terms are loops. */
    bool compact;
    const sr_expr *gemm;      /* gemm-epilogue: this inner product is read from the tile sr_gt */
    const char *const *spell; /* [OP_COUNT] other targets' templates (CUDA), NULL = C's */
    char **strs;              /* expression strings, freed at the end */
    size_t nstr, capstr;
};

/* Nodes of dimension <= JIT_BIG are "small": one named scalar per component (v<id>_<c>), and
 * vector ops are unrolled. Larger ("big") nodes are arrays and their ops loops (see
 * emit-ops.c), except the sums of the pair loop, unrolled up to JIT_PAIR_UNROLL terms. */
#define JIT_BIG 16
/* Sums over a big node's components in the pair loop are unrolled up to this many terms. */
#define JIT_PAIR_UNROLL 64

/* Values of F and the weight per pair that the vectorised pair loop keeps in registers;
 * beyond, the emitter switches to loop mode. */
#define JIT_MAX_OUT 64
/* TensorDot (and MatVecMult/VecMatMult) with more terms than this are loops over the output and
 * the contracted components instead of one statement per term. */
#define JIT_UNROLL_TERMS 1024
/* Compact emission's contraction limit, and the length of source beyond which the emitters
 * switch to it (a C compiler's optimisation time grows faster than the code it is given: gcc
 * 12 needs minutes for a few hundred KB of unrolled kernel). */
#define JIT_COMPACT_TERMS  64
#define JIT_COMPACT_SOURCE (64 << 10)

/* Appends generated text to the emitter's buffer. */
#define P(...) expr_buf_printf(E->b, __VA_ARGS__)

static inline bool big(const sr_expr *e) { return e->dim > JIT_BIG; }
/* The C scalar type of the dtype. */
static inline const char *T(const struct emitter *E) { return E->f32 ? "float" : "double"; }
/* e's position in E->order. */
static inline size_t pos(const struct emitter *E, const sr_expr *e) { return E->pos_of[e->id] - 1; }

/* ---- emit-ops.c ---- */

/* A printf-formatted string owned by the emitter (freed with it); "0" and E->fail set on
 * out-of-memory. */
char *jit_sfmt(struct emitter *E, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The C expression of component idx (a number or a loop index) of e in the current scope. */
const char *jit_ref(struct emitter *E, const sr_expr *e, const char *idx);
const char *jit_ref_c(struct emitter *E, const sr_expr *e, int c);
/* The name of component c of the small node e, written into buf (32 bytes). */
const char *jit_nm(const sr_expr *e, int c, char *buf);
/* Whether a big node of e's op is inlined where used rather than computed into an array. */
bool jit_lazy_op(const struct emitter *E, const sr_expr *e);
/* The most terms of a contraction that the emitter unrolls (loops beyond). */
int64_t jit_unroll_limit(const struct emitter *E);
/* The terms a contraction node (TensorDot, MatVecMult, VecMatMult) has: it is unrolled up to
 * JIT_UNROLL_TERMS of them, loops beyond. 0 for the other ops. */
int64_t jit_unrolled_terms(const sr_expr *e);
/* Emits the definition of node e (its components) with the op's spelling. */
void jit_emit_node(struct emitter *E, const sr_expr *e);

#endif /* SYMRED_JIT_EMIT_C_H */
