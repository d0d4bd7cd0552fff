/* build.c — the op table, the checked node constructor, and the public builders. */
#include "expr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const struct expr_opinfo expr_ops[OP_COUNT] = {
#define EXPR_OP_INFO_(id, name, arity, nattr, dimrule, infix, flops, c, cuda)                      \
    [OP_##id] = {name, arity, nattr, dimrule, infix, flops, c, cuda},
    EXPR_OP_MAP(EXPR_OP_INFO_)
#undef EXPR_OP_INFO_
};

/* Largest dimension of any node: keeps dim products far from int overflow. */
#define EXPR_MAX_DIM (1 << 24)
/* Largest variable index. */
#define EXPR_MAX_VAR 65535

int expr_op_by_name(const char *name, size_t len)
{
    for (int op = 0; op < OP_COUNT; op++) {
        const struct expr_opinfo *oi = &expr_ops[op];
        if (strlen(oi->name) == len && memcmp(oi->name, name, len) == 0)
            return op;
    }
    return -1;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0)
        a = -a;
    if (b < 0)
        b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* *dim = d, or an error naming the op when d exceeds the largest dimension. */
static sr_status dims_fit(sr_ctx *ctx, const char *name, int64_t d, int *dim)
{
    if (d > EXPR_MAX_DIM)
        return expr_builder_error(ctx, SR_EDIM, "%s: output dimension %lld exceeds the limit %d",
                                  name, (long long)d, EXPR_MAX_DIM);
    *dim = (int)d;
    return SR_OK;
}

/* Checks the operand dimensions of op; on success *dim is the output dimension. */
static sr_status check_dims(sr_ctx *ctx, enum expr_op op, sr_expr *const *c, const int64_t *at,
                            int *dim)
{
    const char *name = expr_ops[op].name;
    int arity = expr_ops[op].arity;
    enum expr_dimrule rule = expr_ops[op].dimrule;
    switch (rule) {
    case DIM_LEAF:
        return SR_OK; /* set by the caller */
    case DIM_SAME:
        *dim = c[0]->dim;
        return SR_OK;
    case DIM_TO1:
        *dim = 1;
        return SR_OK;
    case DIM_EW: {
        int d = 1;
        for (int i = 0; i < arity; i++) {
            if (c[i]->dim == 1 || c[i]->dim == d)
                continue;
            if (d != 1)
                return expr_builder_error(ctx, SR_EDIM,
                                          "%s: operand dimensions %d and %d do not match "
                                          "(elementwise operands need equal dimensions, or "
                                          "dimension 1 to broadcast)",
                                          name, d, c[i]->dim);
            d = c[i]->dim;
        }
        *dim = d;
        return SR_OK;
    }
    case DIM_PAIR1:
        if (c[0]->dim != c[1]->dim)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: operand dimensions %d and %d must be equal", name,
                                      c[0]->dim, c[1]->dim);
        *dim = 1;
        return SR_OK;
    case DIM_CAT:
        return dims_fit(ctx, name, (int64_t)c[0]->dim + c[1]->dim, dim);
    case DIM_OUTER:
        return dims_fit(ctx, name, (int64_t)c[0]->dim * c[1]->dim, dim);
    case DIM_CEW: {
        /* KeOps' vectorised complex ops: equal dimensions, or one complex scalar (dimension 2)
         * broadcast over the other */
        int da = c[0]->dim, db = c[1]->dim;
        if (da % 2 != 0 || db % 2 != 0 || (da != db && da != 2 && db != 2))
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: operand dimensions %d and %d do not match (complex "
                                      "operands need equal even dimensions, or dimension 2 to "
                                      "broadcast)",
                                      name, da, db);
        *dim = da > db ? da : db;
        return SR_OK;
    }
    case DIM_CSAME:
    case DIM_CHALF:
    case DIM_CTO1:
        if (c[0]->dim % 2 != 0)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: the operand must be complex (an even dimension: "
                                      "interleaved real and imaginary parts), not dimension %d",
                                      name, c[0]->dim);
        *dim = rule == DIM_CSAME ? c[0]->dim : rule == DIM_CHALF ? c[0]->dim / 2 : 2;
        return SR_OK;
    case DIM_TOC:
        return dims_fit(ctx, name, 2 * (int64_t)c[0]->dim, dim);
    case DIM_SPECIAL:
        break;
    }
    int64_t da = c[0]->dim, db = arity > 1 ? c[1]->dim : 0;
    int64_t d = 0;
    switch (op) {
    case OP_ELEM:
        if (at[0] < 0 || at[0] >= da)
            return expr_builder_error(ctx, SR_EDIM,
                                      "Elem: index %lld is out of range for an operand of "
                                      "dimension %lld",
                                      (long long)at[0], (long long)da);
        d = 1;
        break;
    case OP_EXTRACT:
        if (at[0] < 0 || at[1] < 1 || at[0] > da || at[1] > da - at[0])
            return expr_builder_error(ctx, SR_EDIM,
                                      "Extract: start %lld and length %lld do not fit in an "
                                      "operand of dimension %lld",
                                      (long long)at[0], (long long)at[1], (long long)da);
        d = at[1];
        break;
    case OP_ONEHOT:
    case OP_SUMT: /* a scalar to a vector of dimension at[0] */
        if (da != 1)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: the operand must have dimension 1, not %lld", name,
                                      (long long)da);
        if (at[0] < 1)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: the output dimension must be >= 1, not %lld", name,
                                      (long long)at[0]);
        d = at[0];
        break;
    case OP_MATVECMULT: /* A (m*n), v (n) */
        if (da % db != 0)
            return expr_builder_error(ctx, SR_EDIM,
                                      "MatVecMult: matrix dimension %lld is not a multiple of "
                                      "the vector dimension %lld",
                                      (long long)da, (long long)db);
        d = da / db;
        break;
    case OP_VECMATMULT: /* v (m), A (m*n) */
        if (db % da != 0)
            return expr_builder_error(ctx, SR_EDIM,
                                      "VecMatMult: matrix dimension %lld is not a multiple of "
                                      "the vector dimension %lld",
                                      (long long)db, (long long)da);
        d = db / da;
        break;
    case OP_ELEMT:
        if (da != 1)
            return expr_builder_error(
                ctx, SR_EDIM, "ElemT: the operand must have dimension 1, not %lld", (long long)da);
        if (at[0] < 1 || at[1] < 0 || at[1] >= at[0])
            return expr_builder_error(ctx, SR_EDIM,
                                      "ElemT: index %lld is out of range for an output of "
                                      "dimension %lld",
                                      (long long)at[1], (long long)at[0]);
        d = at[0];
        break;
    case OP_EXTRACTT:
        if (at[0] < 0 || at[1] < 1 || at[1] > EXPR_MAX_DIM || at[0] > at[1] - da)
            return expr_builder_error(ctx, SR_EDIM,
                                      "ExtractT: an operand of dimension %lld does not fit at "
                                      "start %lld of an output of dimension %lld",
                                      (long long)da, (long long)at[0], (long long)at[1]);
        d = at[1];
        break;
    case OP_TENSORDOT: {
        const struct expr_tdot *t = expr_tdot_get(ctx, at[0]);
        if (!t)
            return expr_builder_error(ctx, SR_EINVAL,
                                      "TensorDot: attribute %lld names no index lists of this "
                                      "context (build TensorDot with sr_tensordot)",
                                      (long long)at[0]);
        if (t->dim_a != da || t->dim_b != db)
            return expr_builder_error(ctx, SR_EDIM,
                                      "TensorDot: the shapes hold %lld and %lld components but the "
                                      "operands have dimensions %lld and %lld",
                                      (long long)t->dim_a, (long long)t->dim_b, (long long)da,
                                      (long long)db);
        d = t->dim_out;
        break;
    }
    case OP_WEIGHTEDSQNORM:
    case OP_WEIGHTEDSQDIST: {
        int64_t dx = db;
        if (op == OP_WEIGHTEDSQDIST && c[2]->dim != dx)
            return expr_builder_error(ctx, SR_EDIM,
                                      "WeightedSqDist: the two points have dimensions %lld and "
                                      "%d; they must be equal",
                                      (long long)dx, c[2]->dim);
        if (da != 1 && da != dx && da != dx * dx)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: weight dimension %lld must be 1, %lld or %lld for "
                                      "points of dimension %lld",
                                      name, (long long)da, (long long)dx, (long long)(dx * dx),
                                      (long long)dx);
        d = 1;
        break;
    }
    case OP_CSCAL:
    case OP_CREALSCAL: {
        int64_t want = op == OP_CSCAL ? 2 : 1; /* a complex or a real scalar */
        if (da != want || db % 2 != 0)
            return expr_builder_error(ctx, SR_EDIM,
                                      "%s: needs a %s scalar (dimension %lld) and a complex vector "
                                      "(even dimension), not dimensions %lld and %lld",
                                      name, want == 2 ? "complex" : "real", (long long)want,
                                      (long long)da, (long long)db);
        d = db;
        break;
    }
    case OP_CSUMT:
        if (da != 2)
            return expr_builder_error(
                ctx, SR_EDIM,
                "ComplexSumT: the operand must be a complex scalar (dimension 2), "
                "not dimension %lld",
                (long long)da);
        if (at[0] < 2 || at[0] % 2 != 0)
            return expr_builder_error(ctx, SR_EDIM,
                                      "ComplexSumT: the output dimension must be even and >= 2 "
                                      "(interleaved real and imaginary parts), not %lld",
                                      (long long)at[0]);
        d = at[0];
        break;
    default:
        return expr_builder_error(ctx, SR_EINTERNAL, "%s: no dimension rule", name);
    }
    return dims_fit(ctx, name, d, dim);
}

static sr_status check_leaf(sr_ctx *ctx, enum expr_op op, int64_t *at, int dim, double fattr)
{
    switch (op) {
    case OP_VAR:
        if (at[0] < 0 || at[0] > EXPR_MAX_VAR)
            return expr_builder_error(ctx, SR_EINVAL, "Var: index %lld is not in [0, %d]",
                                      (long long)at[0], EXPR_MAX_VAR);
        if (at[1] < 0 || at[1] > 2)
            return expr_builder_error(ctx, SR_EINVAL,
                                      "Var: category %lld is not 0 (i), 1 (j) or 2 (parameter)",
                                      (long long)at[1]);
        if (dim < 1 || dim > EXPR_MAX_DIM)
            return expr_builder_error(ctx, SR_EDIM, "Var: dimension %d is not in [1, %d]", dim,
                                      EXPR_MAX_DIM);
        return SR_OK;
    case OP_RATCST: {
        if (at[1] == 0)
            return expr_builder_error(ctx, SR_EINVAL, "RatCst: the denominator is 0");
        if (at[0] == INT64_MIN || at[1] == INT64_MIN)
            return expr_builder_error(ctx, SR_EINVAL, "RatCst: value out of range");
        int64_t g = gcd64(at[0], at[1]);
        if (g > 1) {
            at[0] /= g;
            at[1] /= g;
        }
        if (at[1] < 0) {
            at[0] = -at[0];
            at[1] = -at[1];
        }
        return SR_OK;
    }
    case OP_CST:
        if (!isfinite(fattr))
            return expr_builder_error(ctx, SR_EINVAL, "Cst: constants must be finite, not %g",
                                      fattr);
        return SR_OK;
    default:
        return SR_OK;
    }
}

static sr_status check_attrs(sr_ctx *ctx, enum expr_op op, const int64_t *at)
{
    switch (op) {
    case OP_POW:
        if (at[0] < -1024 || at[0] > 1024)
            return expr_builder_error(ctx, SR_EINVAL, "Pow: exponent %lld is not in [-1024, 1024]",
                                      (long long)at[0]);
        return SR_OK;
    case OP_ROUND:
        if (at[0] < -300 || at[0] > 300)
            return expr_builder_error(ctx, SR_EINVAL, "Round: %lld decimals is not in [-300, 300]",
                                      (long long)at[0]);
        return SR_OK;
    case OP_CLAMPINT:
        if (at[0] > at[1])
            return expr_builder_error(ctx, SR_EINVAL,
                                      "ClampInt: lower bound %lld is above upper bound %lld",
                                      (long long)at[0], (long long)at[1]);
        return SR_OK;
    default:
        return SR_OK;
    }
}

sr_expr *expr_make(sr_ctx *ctx, enum expr_op op, sr_expr *const *child, const int64_t *iattr,
                   int dim, double fattr)
{
    if (!ctx)
        return NULL;
    if ((int)op < 0 || op >= OP_COUNT) {
        expr_builder_error(ctx, SR_EINVAL, "unknown op %d", (int)op);
        return NULL;
    }
    const struct expr_opinfo *oi = &expr_ops[op];
    sr_expr proto;
    memset(&proto, 0, sizeof proto);
    proto.op = (uint16_t)op;
    for (int i = 0; i < oi->arity; i++) {
        if (!child || !child[i])
            return NULL; /* an earlier builder failed and said why */
        if (child[i]->ctx != ctx) {
            expr_builder_error(ctx, SR_EINVAL, "%s: operand %d belongs to another context",
                               oi->name, i + 1);
            return NULL;
        }
        proto.child[i] = child[i];
        proto.deps |= child[i]->deps;
    }
    for (int i = 0; i < oi->nattr; i++)
        proto.iattr[i] = iattr ? iattr[i] : 0;
    if (oi->dimrule == DIM_LEAF) {
        if (op == OP_CST)
            proto.fattr = fattr + 0.0; /* -0.0 and 0.0 are one constant */
        if (check_leaf(ctx, op, proto.iattr, dim, proto.fattr) != SR_OK)
            return NULL;
        proto.dim = op == OP_VAR ? dim : 1;
        if (op == OP_VAR)
            proto.deps = proto.iattr[1] == SR_CAT_I   ? DEP_I
                         : proto.iattr[1] == SR_CAT_J ? DEP_J
                                                      : DEP_P;
    } else {
        int d = 0;
        /* ComplexScal and ComplexRealScal take the scalar first; given second, the operands
         * swap (KeOps' ComplexRealScal does the same), so both orders are one node. */
        if ((op == OP_CSCAL || op == OP_CREALSCAL) &&
            proto.child[1]->dim == (op == OP_CSCAL ? 2 : 1) &&
            proto.child[0]->dim != proto.child[1]->dim) {
            sr_expr *t = proto.child[0];
            proto.child[0] = proto.child[1];
            proto.child[1] = t;
        }
        if (op == OP_TENSORDOT) { /* the lists' hash goes with their index */
            const struct expr_tdot *t = expr_tdot_get(ctx, proto.iattr[0]);
            proto.iattr[1] = t ? (int64_t)t->hash : 0;
        }
        if (check_attrs(ctx, op, proto.iattr) != SR_OK)
            return NULL;
        if (check_dims(ctx, op, proto.child, proto.iattr, &d) != SR_OK)
            return NULL;
        proto.dim = d;
    }
    sr_expr *e = expr_intern(ctx, &proto);
    if (!e)
        expr_builder_error(ctx, SR_ENOMEM, "%s: out of memory", oi->name);
    return e;
}

/* ---- public builders ---- */

static sr_expr *make0(sr_ctx *ctx, enum expr_op op, int64_t a0, int64_t a1, int dim, double f)
{
    int64_t at[2] = {a0, a1};
    return expr_make(ctx, op, NULL, at, dim, f);
}
static sr_expr *make1(sr_ctx *ctx, enum expr_op op, sr_expr *a, int64_t a0, int64_t a1)
{
    sr_expr *c[1] = {a};
    int64_t at[2] = {a0, a1};
    return expr_make(ctx, op, c, at, 0, 0.0);
}
static sr_expr *make2(sr_ctx *ctx, enum expr_op op, sr_expr *a, sr_expr *b)
{
    sr_expr *c[2] = {a, b};
    return expr_make(ctx, op, c, NULL, 0, 0.0);
}
static sr_expr *make3(sr_ctx *ctx, enum expr_op op, sr_expr *a, sr_expr *b, sr_expr *c3)
{
    sr_expr *c[3] = {a, b, c3};
    return expr_make(ctx, op, c, NULL, 0, 0.0);
}

sr_expr *sr_var(sr_ctx *ctx, int index, int dim, sr_cat cat)
{
    return make0(ctx, OP_VAR, index, (int64_t)cat, dim, 0.0);
}
sr_expr *sr_vi(sr_ctx *ctx, int index, int dim) { return sr_var(ctx, index, dim, SR_CAT_I); }
sr_expr *sr_vj(sr_ctx *ctx, int index, int dim) { return sr_var(ctx, index, dim, SR_CAT_J); }
sr_expr *sr_pm(sr_ctx *ctx, int index, int dim) { return sr_var(ctx, index, dim, SR_CAT_PARAM); }
sr_expr *sr_const(sr_ctx *ctx, double v) { return make0(ctx, OP_CST, 0, 0, 1, v); }
sr_expr *sr_intcst(sr_ctx *ctx, int64_t v) { return make0(ctx, OP_INTCST, v, 0, 1, 0.0); }
sr_expr *sr_ratcst(sr_ctx *ctx, int64_t p, int64_t q)
{
    return make0(ctx, OP_RATCST, p, q, 1, 0.0);
}

#define SR_BUILDER2_(fn, op)                                                                       \
    sr_expr *fn(sr_ctx *ctx, sr_expr *a, sr_expr *b) { return make2(ctx, op, a, b); }
#define SR_BUILDER1_(fn, op)                                                                       \
    sr_expr *fn(sr_ctx *ctx, sr_expr *a) { return make1(ctx, op, a, 0, 0); }

SR_BUILDER2_(sr_add, OP_ADD)
SR_BUILDER2_(sr_sub, OP_SUB)
SR_BUILDER2_(sr_mul, OP_MUL)
SR_BUILDER2_(sr_div, OP_DIV)
SR_BUILDER2_(sr_powf, OP_POWF)
SR_BUILDER2_(sr_atan2, OP_ATAN2)
SR_BUILDER2_(sr_less, OP_LESS)
SR_BUILDER2_(sr_lesseq, OP_LESSEQ)
SR_BUILDER2_(sr_greater, OP_GREATER)
SR_BUILDER2_(sr_greatereq, OP_GREATEREQ)
SR_BUILDER2_(sr_equal, OP_EQUAL)
SR_BUILDER2_(sr_notequal, OP_NOTEQUAL)
SR_BUILDER2_(sr_sqdist, OP_SQDIST)
SR_BUILDER2_(sr_scalprod, OP_SCALPROD)
SR_BUILDER2_(sr_concat, OP_CONCAT)
SR_BUILDER2_(sr_matvecmult, OP_MATVECMULT)
SR_BUILDER2_(sr_vecmatmult, OP_VECMATMULT)
SR_BUILDER2_(sr_tensorprod, OP_TENSORPROD)
SR_BUILDER2_(sr_weightedsqnorm, OP_WEIGHTEDSQNORM)

SR_BUILDER2_(sr_complex_add, OP_CADD)
SR_BUILDER2_(sr_complex_sub, OP_CSUB)
SR_BUILDER2_(sr_complex_mult, OP_CMULT)
SR_BUILDER2_(sr_complex_div, OP_CDIV)
SR_BUILDER2_(sr_complex_scal, OP_CSCAL)
SR_BUILDER2_(sr_complex_realscal, OP_CREALSCAL)

SR_BUILDER1_(sr_neg, OP_MINUS)
SR_BUILDER1_(sr_inv, OP_INV)
SR_BUILDER1_(sr_square, OP_SQUARE)
SR_BUILDER1_(sr_sqrt, OP_SQRT)
SR_BUILDER1_(sr_rsqrt, OP_RSQRT)
SR_BUILDER1_(sr_exp, OP_EXP)
SR_BUILDER1_(sr_log, OP_LOG)
SR_BUILDER1_(sr_xlogx, OP_XLOGX)
SR_BUILDER1_(sr_sin, OP_SIN)
SR_BUILDER1_(sr_cos, OP_COS)
SR_BUILDER1_(sr_asin, OP_ASIN)
SR_BUILDER1_(sr_acos, OP_ACOS)
SR_BUILDER1_(sr_atan, OP_ATAN)
SR_BUILDER1_(sr_abs, OP_ABS)
SR_BUILDER1_(sr_sign, OP_SIGN)
SR_BUILDER1_(sr_step, OP_STEP)
SR_BUILDER1_(sr_relu, OP_RELU)
SR_BUILDER1_(sr_floor, OP_FLOOR)
SR_BUILDER1_(sr_sinxdivx, OP_SINXDIVX)
SR_BUILDER1_(sr_sqnorm2, OP_SQNORM2)
SR_BUILDER1_(sr_norm2, OP_NORM2)
SR_BUILDER1_(sr_normalize, OP_NORMALIZE)
SR_BUILDER1_(sr_sum, OP_SUM)
SR_BUILDER1_(sr_max, OP_MAX)
SR_BUILDER1_(sr_min, OP_MIN)
SR_BUILDER1_(sr_argmax, OP_ARGMAX)
SR_BUILDER1_(sr_argmin, OP_ARGMIN)
SR_BUILDER1_(sr_conj, OP_CONJ)
SR_BUILDER1_(sr_complex_exp, OP_CEXP)
SR_BUILDER1_(sr_complex_exp1j, OP_CEXP1J)
SR_BUILDER1_(sr_complex_real, OP_CREAL)
SR_BUILDER1_(sr_complex_imag, OP_CIMAG)
SR_BUILDER1_(sr_complex_abs, OP_CABS)
SR_BUILDER1_(sr_complex_squareabs, OP_CSQUAREABS)
SR_BUILDER1_(sr_complex_angle, OP_CANGLE)
SR_BUILDER1_(sr_real2complex, OP_REAL2C)
SR_BUILDER1_(sr_imag2complex, OP_IMAG2C)
SR_BUILDER1_(sr_complex_sum, OP_CSUM)

sr_expr *sr_pow(sr_ctx *ctx, sr_expr *a, int p) { return make1(ctx, OP_POW, a, p, 0); }
sr_expr *sr_round(sr_ctx *ctx, sr_expr *a, int d) { return make1(ctx, OP_ROUND, a, d, 0); }
sr_expr *sr_clampint(sr_ctx *ctx, sr_expr *a, int lo, int hi)
{
    return make1(ctx, OP_CLAMPINT, a, lo, hi);
}
sr_expr *sr_elem(sr_ctx *ctx, sr_expr *a, int m) { return make1(ctx, OP_ELEM, a, m, 0); }
sr_expr *sr_extract(sr_ctx *ctx, sr_expr *a, int start, int len)
{
    return make1(ctx, OP_EXTRACT, a, start, len);
}
sr_expr *sr_onehot(sr_ctx *ctx, sr_expr *a, int dim) { return make1(ctx, OP_ONEHOT, a, dim, 0); }
sr_expr *sr_clamp(sr_ctx *ctx, sr_expr *a, sr_expr *lo, sr_expr *hi)
{
    return make3(ctx, OP_CLAMP, a, lo, hi);
}
sr_expr *sr_ifelse(sr_ctx *ctx, sr_expr *c, sr_expr *a, sr_expr *b)
{
    return make3(ctx, OP_IFELSE, c, a, b);
}
sr_expr *sr_mod(sr_ctx *ctx, sr_expr *a, sr_expr *m, sr_expr *o)
{
    return make3(ctx, OP_MOD, a, m, o);
}
sr_expr *sr_weightedsqdist(sr_ctx *ctx, sr_expr *w, sr_expr *a, sr_expr *b)
{
    return make3(ctx, OP_WEIGHTEDSQDIST, w, a, b);
}
sr_expr *sr_sumt(sr_ctx *ctx, sr_expr *a, int dim) { return make1(ctx, OP_SUMT, a, dim, 0); }
sr_expr *sr_complex_sumt(sr_ctx *ctx, sr_expr *a, int dim)
{
    return make1(ctx, OP_CSUMT, a, dim, 0);
}
sr_expr *sr_elemt(sr_ctx *ctx, sr_expr *a, int dim, int m)
{
    return make1(ctx, OP_ELEMT, a, dim, m);
}
sr_expr *sr_extractt(sr_ctx *ctx, sr_expr *a, int start, int dim)
{
    return make1(ctx, OP_EXTRACTT, a, start, dim);
}
sr_expr *sr_tensordot(sr_ctx *ctx, sr_expr *a, sr_expr *b, int rank_a, const int *dims_a,
                      int rank_b, const int *dims_b, int ncont, const int *cont_a,
                      const int *cont_b, const int *permute)
{
    if (!ctx || !a || !b)
        return NULL;
    int idx = expr_tdot_intern(ctx, rank_a, dims_a, rank_b, dims_b, ncont, cont_a, cont_b, permute);
    if (idx < 0)
        return NULL;
    sr_expr *c[2] = {a, b};
    int64_t at[2] = {idx, 0};
    return expr_make(ctx, OP_TENSORDOT, c, at, 0, 0.0);
}

int sr_expr_dim(const sr_expr *e) { return e ? e->dim : 0; }

sr_status sr_expr_var(const sr_expr *e, int *index, sr_cat *cat, int *dim)
{
    if (!e || e->op != OP_VAR)
        return SR_EINVAL;
    if (index)
        *index = (int)e->iattr[0];
    if (cat)
        *cat = (sr_cat)e->iattr[1];
    if (dim)
        *dim = e->dim;
    return SR_OK;
}

sr_category sr_expr_category(const sr_expr *e)
{
    if (!e)
        return SR_DEP_CONST;
    if ((e->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J))
        return SR_DEP_IJ;
    if (e->deps & DEP_I)
        return SR_DEP_I;
    if (e->deps & DEP_J)
        return SR_DEP_J;
    if (e->deps & DEP_P)
        return SR_DEP_PARAM;
    return SR_DEP_CONST;
}
