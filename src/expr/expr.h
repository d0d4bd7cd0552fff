/*
 * expr.h — the intermediate representation: hash-consed expression nodes and the op table.
 *
 * Nodes are immutable and interned per context (find-or-insert on op, children and
 * attributes), so pointer equality is structural equality and shared subexpressions are
 * shared nodes. Every node records its output dimension and what it depends on (i, j,
 * parameters), computed once at construction.
 */
#ifndef SYMRED_EXPR_H
#define SYMRED_EXPR_H

#include "symred.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How an op's output dimension follows from its operands (the dimension check of build.c). */
enum expr_dimrule {
    DIM_LEAF,   /* Var and constants: stored in the node */
    DIM_SAME,   /* unary elementwise: dim(a) */
    DIM_EW,     /* elementwise over 2-3 operands: all equal, or 1 (broadcast) */
    DIM_TO1,    /* any vector to a scalar: SqNorm2, Sum, Max, ... */
    DIM_PAIR1,  /* two vectors of equal dimension to a scalar: SqDist, Scalprod */
    DIM_CAT,    /* two vectors to dim(a) + dim(b): Concat */
    DIM_OUTER,  /* two vectors to dim(a) * dim(b): TensorProd */
    DIM_CEW,    /* complex elementwise: equal even dimensions, or 2 (a complex scalar) broadcast */
    DIM_CSAME,  /* a complex vector (even dimension) to one of the same dimension */
    DIM_CHALF,  /* a complex vector to a real one, one component per complex value: dim(a) / 2 */
    DIM_CTO1,   /* a complex vector to a complex scalar: 2 */
    DIM_TOC,    /* a real vector to a complex one: 2 dim(a) */
    DIM_SPECIAL /* checked by its own rule in build.c (attributes, matrices, weights) */
};

/* How an op's cost in flop-equivalents follows from its dimensions (the cost column). */
enum expr_flops_rule {
    FLOPS_LINEAR,    /* per_out dim + per_a dim(a) + per_b dim(b) + fixed */
    FLOPS_POW,       /* Pow(a, n): square-and-multiply by the exponent, a division if n < 0 */
    FLOPS_TENSORDOT, /* 2 dim * the product of the contracted dimensions */
    FLOPS_WEIGHTED   /* WeightedSqNorm and WeightedSqDist: by the weight's shape */
};
struct expr_flops {
    enum expr_flops_rule rule;
    bool trans; /* transcendental (Exp, Log, Sin, ...): the CPU cost model prices these apart */
    double per_out, per_a, per_b, fixed;
};
/* The cost column's spellings: arithmetic, transcendental, and by a rule of its own. */
#define FLOPS(d, a, b, k)                                                                          \
    {                                                                                              \
        FLOPS_LINEAR, false, d, a, b, k                                                            \
    }
#define TRANS(d, a, b, k)                                                                          \
    {                                                                                              \
        FLOPS_LINEAR, true, d, a, b, k                                                             \
    }
#define FLOPS_BY(rule)                                                                             \
    {                                                                                              \
        FLOPS_##rule, false, 0, 0, 0, 0                                                            \
    }

/*
 * The op table: every fact about an op that is data. X(id, name, arity, nattr, dimrule, infix,
 * flops, c, cuda)
 *   id      — OP_<id>
 *   name    — the KeOps spelling, used by the parser and the printer for function syntax
 *   arity   — number of expression operands (0..3)
 *   nattr   — number of integer attributes written after the operands: Pow(f,3), Elem(f,2)
 *   dimrule — enum expr_dimrule
 *   infix   — the operator symbol for ops printed infix or prefix, else NULL
 *   flops   — the cost in flop-equivalents (src/formulas/cost.c): FLOPS(per output component,
 *             per component of a, per component of b, fixed), TRANS(...) for a transcendental
 *             function, FLOPS_BY(rule) where the cost needs a rule of its own
 *   c       — the C spelling of one output component, for ops computed component by component:
 *             $a $b $c are the operands' components (broadcast), $F the libm suffix of the
 *             dtype, $T the scalar type, $0 $1 the integer attributes. NULL: the C emitter has
 *             an emitter function for the op (src/jit/emit-ops.c, c_fns), which must exist
 *   cuda    — the CUDA spelling where C's does not suit CUDA, else NULL (C's). Rsqrt uses
 *             libdevice's rsqrt (within 2 ulp in float, 1 in double); Atan's C spelling calls
 *             sr_atan, the C prelude's name for libm's. The fast intrinsics (__expf, __sinf, ...)
 *             lose accuracy for large arguments, so the libdevice functions (C's names) stay.
 *
 * The columns that are functions of higher layers are not here: each layer token-pastes its own
 * from the id, so a missing one is a compile error there — the derivative gr_<id>
 * (src/expr/grad.c) and the reference evaluator ev_<id> (src/cpu/reference.c).
 *
 * Attributes (iattr): Var (index, cat) with the dimension in dim; IntCst (n); RatCst (p, q),
 * reduced, q > 0; Cst keeps its value in fattr; Pow (p); Round (decimals); ClampInt and
 * DiffClampInt (lo, hi); Elem (m); Extract (start, len); OneHot (dim); ElemT (n, m); ExtractT
 * (start, dim); SumT (dim); TensorDot (the index of its interned index lists in the context, see
 * struct expr_tdot, and their hash); ComplexSumT (dim, in reals).
 *
 * Complex values are interleaved reals: a complex vector of dimension d is a real vector of
 * dimension 2d (re, im, re, im, ...), as in KeOps. The Complex* ops, Conj, Real2Complex and
 * Imag2Complex read and write that layout; to the rest of the IR they are real maps.
 */
// clang-format off
#define EXPR_OP_MAP(X)                                                                             \
    X(VAR,            "Var",              0, 2, DIM_LEAF,    NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(INTCST,         "IntCst",           0, 1, DIM_LEAF,    NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(RATCST,         "RatCst",           0, 2, DIM_LEAF,    NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CST,            "Cst",              0, 0, DIM_LEAF,    NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ADD,            "Add",              2, 0, DIM_EW,      "+",  FLOPS(1, 0, 0, 0),              \
      "$a + $b", NULL)                                                                             \
    X(SUB,            "Subtract",         2, 0, DIM_EW,      "-",  FLOPS(1, 0, 0, 0),              \
      "$a - $b", NULL)                                                                             \
    X(MUL,            "Mult",             2, 0, DIM_EW,      "*",  FLOPS(1, 0, 0, 0),              \
      "$a * $b", NULL)                                                                             \
    X(DIV,            "Divide",           2, 0, DIM_EW,      "/",  FLOPS(4, 0, 0, 0),              \
      "$a / $b", NULL)                                                                             \
    X(MINUS,          "Minus",            1, 0, DIM_SAME,    "-",  FLOPS(1, 0, 0, 0),              \
      "-$a", NULL)                                                                                 \
    X(POWF,           "Powf",             2, 0, DIM_EW,      NULL, TRANS(20, 0, 0, 0),             \
      "pow$F($a, $b)", NULL)                                                                       \
    X(ATAN2,          "Atan2",            2, 0, DIM_EW,      NULL, TRANS(20, 0, 0, 0),             \
      "atan2$F($a, $b)", NULL)                                                                     \
    X(LESS,           "Less",             2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a < $b ? ($T)1 : ($T)0", NULL)                                                             \
    X(LESSEQ,         "LessEq",           2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a <= $b ? ($T)1 : ($T)0", NULL)                                                            \
    X(GREATER,        "Greater",          2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a > $b ? ($T)1 : ($T)0", NULL)                                                             \
    X(GREATEREQ,      "GreaterEq",        2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a >= $b ? ($T)1 : ($T)0", NULL)                                                            \
    X(EQUAL,          "Equal",            2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a == $b ? ($T)1 : ($T)0", NULL)                                                            \
    X(NOTEQUAL,       "NotEqual",         2, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a != $b ? ($T)1 : ($T)0", NULL)                                                            \
    X(INV,            "Inv",              1, 0, DIM_SAME,    NULL, FLOPS(4, 0, 0, 0),              \
      "($T)1 / $a", NULL)                                                                          \
    X(SQUARE,         "Square",           1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "$a * $a", NULL)                                                                             \
    X(SQRT,           "Sqrt",             1, 0, DIM_SAME,    NULL, FLOPS(4, 0, 0, 0),              \
      "sqrt$F($a)", NULL)                                                                          \
    X(RSQRT,          "Rsqrt",            1, 0, DIM_SAME,    NULL, FLOPS(4, 0, 0, 0),              \
      "$a == 0 ? ($T)0 : ($T)1 / sqrt$F($a)", "$a == 0 ? ($T)0 : rsqrt$F($a)")                     \
    X(EXP,            "Exp",              1, 0, DIM_SAME,    NULL, TRANS(10, 0, 0, 0),             \
      "sr_exp($a)", NULL)                                                                          \
    X(LOG,            "Log",              1, 0, DIM_SAME,    NULL, TRANS(10, 0, 0, 0),             \
      "log$F($a)", NULL)                                                                           \
    X(XLOGX,          "XLogX",            1, 0, DIM_SAME,    NULL, TRANS(11, 0, 0, 0),             \
      "$a == 0 ? ($T)0 : $a * log$F($a)", NULL)                                                    \
    X(SIN,            "Sin",              1, 0, DIM_SAME,    NULL, TRANS(15, 0, 0, 0),             \
      "sin$F($a)", NULL)                                                                           \
    X(COS,            "Cos",              1, 0, DIM_SAME,    NULL, TRANS(15, 0, 0, 0),             \
      "cos$F($a)", NULL)                                                                           \
    X(ASIN,           "Asin",             1, 0, DIM_SAME,    NULL, TRANS(15, 0, 0, 0),             \
      "asin$F($a)", NULL)                                                                          \
    X(ACOS,           "Acos",             1, 0, DIM_SAME,    NULL, TRANS(15, 0, 0, 0),             \
      "acos$F($a)", NULL)                                                                          \
    X(ATAN,           "Atan",             1, 0, DIM_SAME,    NULL, TRANS(15, 0, 0, 0),             \
      "sr_atan$F($a)", "atan$F($a)")                                                               \
    X(ABS,            "Abs",              1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "fabs$F($a)", NULL)                                                                          \
    X(SIGN,           "Sign",             1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "$a > 0 ? ($T)1 : $a < 0 ? ($T)-1 : $a == 0 ? ($T)0 : $a", NULL)                             \
    X(STEP,           "Step",             1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "$a >= 0 ? ($T)1 : $a < 0 ? ($T)0 : $a", NULL)                                               \
    X(RELU,           "ReLU",             1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "$a > 0 ? $a : $a <= 0 ? ($T)0 : $a", NULL)                                                  \
    X(FLOOR,          "Floor",            1, 0, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "floor$F($a)", NULL)                                                                         \
    X(SINXDIVX,       "SinXDivX",         1, 0, DIM_SAME,    NULL, TRANS(20, 0, 0, 0),             \
      "$a == 0 ? ($T)1 : sin$F($a) / $a", NULL)                                                    \
    X(POW,            "Pow",              1, 1, DIM_SAME,    NULL, FLOPS_BY(POW),                  \
      NULL, NULL)                                                                                  \
    X(ROUND,          "Round",            1, 1, DIM_SAME,    NULL, FLOPS(4, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CLAMPINT,       "ClampInt",         1, 2, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "($a < ($T)$0 ? ($T)$0 : $a) > ($T)$1 ? ($T)$1 : ($a < ($T)$0 ? ($T)$0 : $a)", NULL)         \
    X(DIFFCLAMPINT,   "DiffClampInt",     1, 2, DIM_SAME,    NULL, FLOPS(1, 0, 0, 0),              \
      "$a < ($T)$0 || $a > ($T)$1 ? ($T)0 : ($T)1", NULL)                                          \
    X(CLAMP,          "Clamp",            3, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$b != $b || $c != $c ? $a + $b + $c : ($a < $b ? $b : $a) > $c ? $c : "                     \
      "($a < $b ? $b : $a)", NULL)                                                                 \
    X(IFELSE,         "IfElse",           3, 0, DIM_EW,      NULL, FLOPS(1, 0, 0, 0),              \
      "$a >= 0 ? $b : $c", NULL)                                                                   \
    X(MOD,            "Mod",              3, 0, DIM_EW,      NULL, FLOPS(6, 0, 0, 0),              \
      "fma$F(-($b), floor$F(($a - $c) / $b), $a)", NULL)                                           \
    X(SQNORM2,        "SqNorm2",          1, 0, DIM_TO1,     NULL, FLOPS(0, 2, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(NORM2,          "Norm2",            1, 0, DIM_TO1,     NULL, FLOPS(0, 2, 0, 4),              \
      NULL, NULL)                                                                                  \
    X(NORMALIZE,      "Normalize",        1, 0, DIM_SAME,    NULL, FLOPS(0, 3, 0, 4),              \
      NULL, NULL)                                                                                  \
    X(SQDIST,         "SqDist",           2, 0, DIM_PAIR1,   NULL, FLOPS(0, 3, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(SCALPROD,       "Scalprod",         2, 0, DIM_PAIR1,   "|",  FLOPS(0, 2, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(SUM,            "Sum",              1, 0, DIM_TO1,     NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(MAX,            "Max",              1, 0, DIM_TO1,     NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(MIN,            "Min",              1, 0, DIM_TO1,     NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ARGMAX,         "ArgMax",           1, 0, DIM_TO1,     NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ARGMIN,         "ArgMin",           1, 0, DIM_TO1,     NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ELEM,           "Elem",             1, 1, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(EXTRACT,        "Extract",          1, 2, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CONCAT,         "Concat",           2, 0, DIM_CAT,     NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ONEHOT,         "OneHot",           1, 1, DIM_SPECIAL, NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(MATVECMULT,     "MatVecMult",       2, 0, DIM_SPECIAL, NULL, FLOPS(0, 2, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(VECMATMULT,     "VecMatMult",       2, 0, DIM_SPECIAL, NULL, FLOPS(0, 0, 2, 0),              \
      NULL, NULL)                                                                                  \
    X(TENSORPROD,     "TensorProd",       2, 0, DIM_OUTER,   NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(WEIGHTEDSQNORM, "WeightedSqNorm",   2, 0, DIM_SPECIAL, NULL, FLOPS_BY(WEIGHTED),             \
      NULL, NULL)                                                                                  \
    X(WEIGHTEDSQDIST, "WeightedSqDist",   3, 0, DIM_SPECIAL, NULL, FLOPS_BY(WEIGHTED),             \
      NULL, NULL)                                                                                  \
    X(SUMT,           "SumT",             1, 1, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(ELEMT,          "ElemT",            1, 2, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(EXTRACTT,       "ExtractT",         1, 2, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(TENSORDOT,      "TensorDot",        2, 2, DIM_SPECIAL, NULL, FLOPS_BY(TENSORDOT),            \
      NULL, NULL)                                                                                  \
    X(CADD,           "ComplexAdd",       2, 0, DIM_CEW,     NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CSUB,           "ComplexSubtract",  2, 0, DIM_CEW,     NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CMULT,          "ComplexMult",      2, 0, DIM_CEW,     NULL, FLOPS(3, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CDIV,           "ComplexDivide",    2, 0, DIM_CEW,     NULL, FLOPS(8, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CSCAL,          "ComplexScal",      2, 0, DIM_SPECIAL, NULL, FLOPS(3, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CREALSCAL,      "ComplexRealScal",  2, 0, DIM_SPECIAL, NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CONJ,           "Conj",             1, 0, DIM_CSAME,   NULL, FLOPS(1, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CEXP,           "ComplexExp",       1, 0, DIM_CSAME,   NULL, FLOPS(21, 0, 0, 0),             \
      NULL, NULL)                                                                                  \
    X(CEXP1J,         "ComplexExp1j",     1, 0, DIM_TOC,     NULL, FLOPS(15, 0, 0, 0),             \
      NULL, NULL)                                                                                  \
    X(CREAL,          "ComplexReal",      1, 0, DIM_CHALF,   NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CIMAG,          "ComplexImag",      1, 0, DIM_CHALF,   NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CABS,           "ComplexAbs",       1, 0, DIM_CHALF,   NULL, FLOPS(7, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CSQUAREABS,     "ComplexSquareAbs", 1, 0, DIM_CHALF,   NULL, FLOPS(3, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CANGLE,         "ComplexAngle",     1, 0, DIM_CHALF,   NULL, FLOPS(20, 0, 0, 0),             \
      NULL, NULL)                                                                                  \
    X(REAL2C,         "Real2Complex",     1, 0, DIM_TOC,     NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(IMAG2C,         "Imag2Complex",     1, 0, DIM_TOC,     NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CSUM,           "ComplexSum",       1, 0, DIM_CTO1,    NULL, FLOPS(0, 1, 0, 0),              \
      NULL, NULL)                                                                                  \
    X(CSUMT,          "ComplexSumT",      1, 1, DIM_SPECIAL, NULL, FLOPS(0, 0, 0, 0),              \
      NULL, NULL)
// clang-format on

enum expr_op {
#define EXPR_OP_ENUM_(id, ...) OP_##id,
    EXPR_OP_MAP(EXPR_OP_ENUM_)
#undef EXPR_OP_ENUM_
        OP_COUNT
};

#define EXPR_MAX_ARITY 3
#define EXPR_MAX_ATTR  2

struct expr_opinfo {
    const char *name;
    int arity;
    int nattr;
    enum expr_dimrule dimrule;
    const char *infix;
    struct expr_flops flops;
    const char *c;    /* NULL: an emitter function */
    const char *cuda; /* NULL: the C spelling */
};

/* Indexed by enum expr_op. */
extern const struct expr_opinfo expr_ops[OP_COUNT];

/* What a node depends on: a bit set. */
enum { DEP_I = 1, DEP_J = 2, DEP_P = 4 };

struct sr_expr {
    sr_ctx *ctx;
    struct sr_expr *next; /* hash chain */
    uint64_t hash;
    uint32_t id;  /* creation order within the context: a deterministic total order */
    uint16_t op;  /* enum expr_op */
    uint8_t deps; /* DEP_* bits */
    int32_t dim;
    int64_t iattr[EXPR_MAX_ATTR];
    double fattr;
    sr_expr *child[EXPR_MAX_ARITY];
};

/* Number of children of e (its op's arity). */
static inline int expr_arity(const sr_expr *e) { return expr_ops[e->op].arity; }

/* The op whose KeOps function name is name[0..len), or -1. The ops printed infix have
 * function spellings too (Add(a,b), Minus(a): keopscore reads them, and pykeops writes
 * Minus). */
int expr_op_by_name(const char *name, size_t len);

/*
 * The one constructor: checks the operands (non-NULL, same context), the attributes and the
 * dimensions, then finds or inserts the node. Returns NULL on failure, having recorded the
 * error (SR_EINVAL / SR_EDIM / SR_ENOMEM, with a message naming the op and the dimensions) in
 * ctx. A NULL child makes it return NULL without touching the recorded error, so that the
 * first failure of a builder chain is the one reported.
 * iattr may be NULL when the op has no attributes; for Var, dim is the variable's dimension
 * (it is ignored for other ops); fattr is Cst's value.
 */
sr_expr *expr_make(sr_ctx *ctx, enum expr_op op, sr_expr *const *child, const int64_t *iattr,
                   int dim, double fattr);

/* Finds the node equal to *proto (op, dim, attributes, fattr and children filled in), or
 * copies it into the arena and inserts it. No checks: expr_make is the checked entry point.
 * NULL on out-of-memory. */
sr_expr *expr_intern(sr_ctx *ctx, const sr_expr *proto);

/* The variables an expression uses, one entry per index: dim 0 where unused. */
struct expr_var {
    int dim; /* 0: index not used */
    sr_cat cat;
};

/*
 * Collects the variables of the given roots into vars[0..*nvars): *nvars = 1 + the largest
 * index used (0 if none). Fails with SR_EDIM if one index is used with two dimensions or two
 * categories. On success *vars is malloc'd (NULL when *nvars is 0) and the caller frees it.
 */
sr_status expr_collect_vars(sr_ctx *ctx, const sr_expr *const *roots, int nroots,
                            struct expr_var **vars, int *nvars);

/* Topological order of the DAG under root (children before parents, each node once):
 * writes up to cap nodes, returns the count (which may exceed cap: call again with more
 * room). */
size_t expr_toposort(const sr_expr *root, const sr_expr **order, size_t cap);

/* The gradient of <f, gradin> with respect to the variable var (src/expr/grad.c), without
 * sr_grad's argument checks: gradin must have dimension dim(f) and var be a Var node. NULL
 * (with the error recorded as a builder error) on failure, or when an operand is NULL. */
sr_expr *expr_grad(sr_ctx *ctx, const sr_expr *f, const sr_expr *var, sr_expr *gradin);

/* The zero vector of dimension d: the constant 0 for d = 1, else OneHot(-1, d), which is all
 * zeros by the definition of OneHot (an index outside [0, d)). NULL on failure. */
sr_expr *expr_zeros(sr_ctx *ctx, int d);

/*
 * TensorDot's attributes (src/expr/tensordot.c). KeOps' TensorDot(a, b, dimsa, dimsb, conta,
 * contb, permute) views a and b as row-major tensors of shapes dimsa and dimsb, contracts axis
 * conta[k] of a with axis contb[k] of b (as numpy.tensordot), and lays the kept axes out (a's
 * then b's, each in increasing order) with kept axis k at output position permute[k]. The lists
 * do not fit in a node's two attributes, so they are interned in the context: a TensorDot node
 * holds the index of its lists (iattr[0]) and their hash (iattr[1]), so equal lists are one
 * index and the node hash does not depend on the order in which lists were made.
 */
#define EXPR_TDOT_MAXRANK 16
struct expr_tdot {
    struct {
        int32_t ra, rb, nc; /* ranks of a and b, number of contracted axis pairs */
        int32_t da[EXPR_TDOT_MAXRANK], db[EXPR_TDOT_MAXRANK];
        int32_t ca[EXPR_TDOT_MAXRANK], cb[EXPR_TDOT_MAXRANK];
        int32_t perm[2 * EXPR_TDOT_MAXRANK]; /* the identity when none was given */
    } key;
    uint64_t hash;
    int64_t dim_a, dim_b, dim_out, ncont; /* ncont = product of the contracted dims (>= 1) */
    /* Output axes (row-major, last fastest): size and the stride each moves a and b by; then
     * the contracted axes in conta order (row-major too). */
    int32_t nout;
    int64_t osize[2 * EXPR_TDOT_MAXRANK], ostride_a[2 * EXPR_TDOT_MAXRANK],
        ostride_b[2 * EXPR_TDOT_MAXRANK];
    int64_t csize[EXPR_TDOT_MAXRANK], cstride_a[EXPR_TDOT_MAXRANK], cstride_b[EXPR_TDOT_MAXRANK];
};

/*
 * Checks the lists (ranks <= EXPR_TDOT_MAXRANK, dims >= 1, contracted axes in range, distinct
 * and of equal sizes, permute a permutation of the kept axes; perm NULL = the identity) and
 * interns them in ctx. Returns their index, or -1 with SR_EDIM / SR_EINVAL / SR_ENOMEM recorded
 * as a builder error naming the problem.
 */
int expr_tdot_intern(sr_ctx *ctx, int ra, const int *da, int rb, const int *db, int nc,
                     const int *ca, const int *cb, const int *perm);
/* The lists of index idx of ctx, or NULL if there is none. */
const struct expr_tdot *expr_tdot_get(const sr_ctx *ctx, int64_t idx);
/* The lists of a TensorDot node. */
const struct expr_tdot *expr_tdot_of(const sr_expr *e);
/* Output component o = sum over c < ncont of a[*ia] * b[*ib]: the pair of components that the
 * c-th term of o multiplies. */
void expr_tdot_index(const struct expr_tdot *t, int64_t o, int64_t c, int64_t *ia, int64_t *ib);

/* Mixes the word v into the running hash h (splitmix64-style): node and TensorDot hashes. */
uint64_t expr_hash_mix(uint64_t h, uint64_t v);

/* Internal store (lives in the context). */
struct expr_store {
    struct arena_block *arena;
    size_t arena_used;
    sr_expr **buckets;
    size_t nbuckets;
    size_t count;
    uint32_t next_id;
    struct expr_tdot **tdots; /* TensorDot lists, interned: see expr_tdot_intern */
    int ntdots, captdots;
};

void expr_store_init(struct expr_store *s);
void expr_store_free(struct expr_store *s);

/*
 * The error sink (src/expr/error.c): the context's last failure message and the first failure of
 * a builder chain. The IR records its errors here itself; the layers above (core, the backends)
 * write to the same sink through sr__error, so sr_ctx_error() shows whichever failed last.
 * Kernels may run (and fail) from several threads: the lock guards the message.
 */
#define EXPR_ERR_MAX 2048
struct expr_errors {
    pthread_mutex_t lock;
    char msg[EXPR_ERR_MAX];
    /* Set by a failed builder, consumed by sr_kernel_new(NULL) so it can report the first
     * failure of a builder chain. */
    sr_status pending;
};

/*
 * What the IR keeps per context: its node store and its error sink. The context (struct sr_ctx,
 * src/core/core.h) holds it as its first member, so the IR reaches its own state from an
 * sr_ctx pointer without knowing the rest of the context.
 */
struct expr_ctx {
    struct expr_store store;
    struct expr_errors err;
};

static inline struct expr_ctx *expr_ctx(sr_ctx *ctx) { return (struct expr_ctx *)(void *)ctx; }
static inline const struct expr_ctx *expr_ctx_c(const sr_ctx *ctx)
{
    return (const struct expr_ctx *)(const void *)ctx;
}

/* Sets up and tears down the IR state of a new context; init fails (SR_ENOMEM) only when the
 * lock cannot be made. */
sr_status expr_ctx_init(struct expr_ctx *c);
void expr_ctx_free(struct expr_ctx *c);

/* Records status and a printf-style message in ctx's sink; returns status. ctx may be NULL.
 * A builder error also marks the status pending (see struct expr_errors). */
sr_status expr_verror(sr_ctx *ctx, sr_status status, bool builder, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
sr_status expr_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
sr_status expr_builder_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sends the calling thread's error messages (not the builders') to buf instead of the context's
 * sink until called again with cap 0: a library thread working for a context (a background
 * compile) keeps its failures out of the message that sr_ctx_error shows the user. */
void expr_error_redirect(char *buf, size_t cap);
/* Copies the current message of ctx (for callers that re-report it with context); a shorter
 * buffer gets the message's start. */
void expr_error_get(sr_ctx *ctx, char *buf, size_t cap);

/* Bump allocation from the context arena (freed with the context); zeroed; NULL on OOM. */
void *expr_arena_alloc(struct expr_store *s, size_t size);

/* Printer: appends the formula text of e to a growable buffer. */
struct expr_buf {
    char *data;
    size_t len, cap;
    bool oom;
};
void expr_buf_printf(struct expr_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void expr_print_to(struct expr_buf *b, const sr_expr *e);

#endif /* SYMRED_EXPR_H */
