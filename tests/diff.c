/* diff.c — the cross-backend differential harness (diff.h). */
#define _GNU_SOURCE
#include "diff.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "util.h"

struct inputs {
    void *buf[8];
    const void *args[8];
    int nargs;
};

struct diff_tol diff_tol_widen(sr_dtype dt, struct diff_tol f32)
{
    /* two units in the last place of the output dtype: u = 2^-11 (float16), 2^-8 (bfloat16) */
    const double ulp2 = dt == SR_F16 ? 0x1p-9 : dt == SR_BF16 ? 0x1p-6 : 0.0;
    return (struct diff_tol){f32.rtol + ulp2, f32.atol + ulp2};
}

struct diff_tol diff_tol_of(sr_dtype dt)
{
    return dt == SR_F64 ? (struct diff_tol){1e-10, 1e-10}
                        : diff_tol_widen(dt, (struct diff_tol){2e-4, 2e-4});
}

const char *diff_dtype_tag(sr_dtype dt)
{
    static const char *const tags[] = {"f32", "f64", "f16", "bf16"};
    return tags[dt];
}

const char *diff_backend_override;

const char *diff_backend_name(sr_device dev)
{
    if (diff_backend_override && dev == SR_DEVICE_CPU)
        return diff_backend_override;
    return dev == SR_DEVICE_CUDA ? "cuda" : dev == SR_DEVICE_REFERENCE ? "reference" : "cpu-jit";
}

static double draw(enum diff_gen g, uint64_t *s, double lo, double hi)
{
    switch (g) {
    case DIFF_GRID:
        return round(tu_uniform(s, lo, hi) * 64.0) / 64.0;
    case DIFF_SMALLINT:
        return floor(tu_uniform(s, 0.0, 4.0));
    case DIFF_SPECIAL: {
        double u = tu_uniform(s, 0.0, 1.0);
        if (u < 0.03)
            return NAN;
        if (u < 0.06)
            return INFINITY;
        if (u < 0.09)
            return -INFINITY;
        return round(tu_uniform(s, lo, hi) * 64.0) / 64.0;
    }
    default:
        return tu_uniform(s, lo, hi);
    }
}

static void make_inputs(const sr_kernel *k, int64_t nx, int64_t ny, enum diff_gen g, double lo,
                        double hi, uint64_t seed, struct inputs *in)
{
    memset(in, 0, sizeof *in);
    in->nargs = k->nargs;
    cr_assert(k->nargs <= 8);
    size_t esz = sr_dtype_size(k->io);
    for (int v = 0; v < k->nargs; v++) {
        if (!k->vars[v].dim)
            continue;
        int64_t rows = k->vars[v].cat == SR_CAT_I ? nx : k->vars[v].cat == SR_CAT_J ? ny : 1;
        int64_t n = rows * k->vars[v].dim;
        in->buf[v] = malloc((size_t)(n > 0 ? n : 1) * esz);
        uint64_t s = seed * 7919 + (uint64_t)v + 1;
        for (int64_t t = 0; t < n; t++) {
            double x = draw(k->vars[v].cat == SR_CAT_PARAM && g == DIFF_SPECIAL ? DIFF_GRID : g, &s,
                            lo, hi);
            sr__dtype_put(k->io, in->buf[v], t, x);
        }
        in->args[v] = in->buf[v];
    }
}

static void free_inputs(struct inputs *in)
{
    for (int v = 0; v < 8; v++)
        free(in->buf[v]);
}

sr_kernel *diff_kernel(sr_ctx *ctx, sr_expr *f, sr_kernel_desc d, sr_device dev)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    d.device = dev;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    cr_assert_eq(st, SR_OK, "sr_kernel_new (%s): %s", diff_backend_name(dev), sr_ctx_error(ctx));
    return k;
}

sr_expr *diff_parse(sr_ctx *ctx, const char *formula, const char *const *aliases, int n)
{
    sr_expr *f = NULL;
    sr_status st = sr_parse(ctx, formula, aliases, n, &f);
    cr_assert_eq(st, SR_OK, "parse %s: %s", formula, sr_ctx_error(ctx));
    return f;
}

int64_t diff_run(sr_ctx *ctx, sr_kernel *kb, sr_kernel *kr, int64_t nx, int64_t ny, enum diff_gen g,
                 double lo, double hi, uint64_t seed, struct diff_tol tl, const char *what)
{
    cr_assert_str_neq(kb->backend->name, "reference", "%s: the backend under test is not in use",
                      what);
    struct inputs in;
    make_inputs(kb, nx, ny, g, lo, hi, seed, &in);
    const struct sr_reduction_info *ri = &sr_reductions[kb->red];
    int64_t nout = (kb->axis == 1 ? nx : ny) * kb->out_dim;
    size_t esz = sr_dtype_size(kb->io);
    size_t nb = (size_t)(nout > 0 ? nout : 1);
    void *vb = malloc(nb * esz), *vr = malloc(nb * esz);
    int64_t *ib = malloc(nb * 8), *ir = malloc(nb * 8);
    sr_run_desc r = {nx, ny, in.nargs, in.args, ri->values ? vb : NULL, ri->indices ? ib : NULL};
    sr_status sb = sr_kernel_run_ex(kb, &r);
    r.out = ri->values ? vr : NULL;
    r.out_idx = ri->indices ? ir : NULL;
    sr_status sref = sr_kernel_run_ex(kr, &r);
    cr_assert_eq(sb, sref, "%s nx=%lld ny=%lld: status %s %d, reference %d (%s)", what,
                 (long long)nx, (long long)ny, kb->backend->name, sb, sref, sr_ctx_error(ctx));
    if (sb == SR_OK) {
        for (int64_t t = 0; t < nout; t++) {
            if (ri->values) {
                double a = sr__dtype_get(kb->io, vb, t), b = sr__dtype_get(kb->io, vr, t);
                cr_assert(tu_close(a, b, tl.rtol, tl.atol),
                          "%s nx=%lld ny=%lld: value %lld: %s %.9g, reference %.9g", what,
                          (long long)nx, (long long)ny, (long long)t, kb->backend->name, a, b);
            }
            if (ri->indices)
                cr_assert_eq(ib[t], ir[t], "%s nx=%lld ny=%lld: index %lld: %s %lld, ref %lld",
                             what, (long long)nx, (long long)ny, (long long)t, kb->backend->name,
                             (long long)ib[t], (long long)ir[t]);
        }
    }
    free(vb);
    free(vr);
    free(ib);
    free(ir);
    free_inputs(&in);
    return nout;
}

/* ---- every op ---------------------------------------------------------------------------- */

static const char *const op_aliases[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", "b=Vj(1)"};

/* The op groups: each a Concat of many ops, over a = (x - y) / 2 in [-1, 1], plus terms that
 * depend on one index only (hoisted) and on parameters. */
static const char *const op_groups[DIFF_OP_GROUPS - 1] = {
    /* unary */
    "Concat(Concat(Concat(Concat(-(x-y)*0.5, Inv(x-y)), Concat(Square(x-y), Sqrt(x-y))),"
    " Concat(Concat(Rsqrt(x-y), Exp(x-y)), Concat(Log(x-y), XLogX(x-y)))),"
    " Concat(Concat(Concat(Sin(x-y), Cos(x-y)), Concat(Asin((x-y)*0.5), Acos((x-y)*0.5))),"
    " Concat(Concat(Atan(x-y), Abs(x-y)), Concat(Sign(x-y), Step(x-y)))))",
    /* unary, continued, and the special points */
    "Concat(Concat(Concat(ReLU(x-y), Floor(x*2-y)), Concat(SinXDivX(x-y), Pow(x-y,3))),"
    " Concat(Concat(Pow(x-y,-2), Pow(x-y,0)), Concat(Round(x-y,2), Concat(ClampInt((x-y)*3,-1,1),"
    " DiffClampInt((x-y)*3,-1,1)))))"
    " + Concat(Concat(Concat(Rsqrt(x*0), XLogX(y*0)), Concat(SinXDivX(x*0), Pow(y,17))),"
    " Concat(Concat(Round(y,0), Pow(x-y,-19)), Concat(IntCst(3)*x, Concat(RatCst(-1,3)*y,"
    " DiffClampInt(Floor(y*2),0,0)))))",
    /* binary, ternary, broadcasting */
    "Concat(Concat(Concat(Concat(x+y, x-y), Concat(x*y, x/y)), Concat(Concat(Powf(Abs(x), y),"
    " Atan2(x, y)), Concat(Less(x, y), LessEq(x, Floor(y))))), Concat(Concat(Concat(Greater(x,"
    " y), GreaterEq(Floor(x), y)), Concat(Equal(Floor(x*2), Floor(y*2)), NotEqual(Floor(x),"
    " Floor(y)))), Concat(Concat(x*g, Clamp(x, y, y+0.5)), Concat(IfElse(x-y, x, y*b),"
    " Mod(x, g+1.5, y)))))",
    /* vector ops */
    "Concat(Concat(Concat(Concat(SqNorm2(x-y), Norm2(x-y)), Concat(Normalize(x-y),"
    " Normalize(x*0))), Concat(Concat(SqDist(x, y), (x|y)), Concat(Sum(x-y), Max(x-y)))),"
    " Concat(Concat(Concat(Min(x-y), ArgMax(x-y)), Concat(ArgMin(x-y), Elem(x-y, 2))),"
    " Concat(Concat(Extract(x-y, 1, 2), OneHot(Elem(x,0)*2+2, 4)), Concat(MatVecMult("
    "TensorProd(x, y), x-y), VecMatMult(x-y, TensorProd(y, x))))))",
    "Concat(Concat(TensorProd(x-y, Extract(y, 0, 2)), WeightedSqNorm(g, x-y)),"
    " Concat(Concat(WeightedSqNorm(Abs(y), x), WeightedSqNorm(TensorProd(x, y), x-y)),"
    " Concat(WeightedSqDist(Abs(x), x, y), WeightedSqDist(TensorProd(y, y), x, y))))",
    /* the adjoints of Sum/Elem/Extract, and TensorDot: contractions, outer products, permutes */
    "Concat(Concat(Concat(SumT(g*b, 3), ElemT(Elem(x-y, 1), 4, 3)), Concat(ExtractT(x-y, 1, 5),"
    " TensorDot(TensorProd(x, y), x-y, [3,3], [3], [0], [0]))), Concat(Concat(TensorDot("
    "TensorProd(x, y), TensorProd(y, x), [3,3], [3,3], [1,0], [0,1]), TensorDot(x, Extract(y, 0,"
    " 2)*g, [3], [2], [], [], [1,0])), Concat(Kron(Extract(x, 0, 2), Extract(y, 1, 2), [2,1],"
    " [1,2]), TensorDot(x*b, y, [1,3], [3], [], [], [2,0,1]))))",
    /* complex ops with complex outputs, on (re, im) pairs of Concat(x, y) and friends; complex
     * scalars (Extract(.., 2)) broadcast, on either side */
    "Concat(Concat(Concat(ComplexMult(Concat(x, y), Concat(y*g, x-y)), ComplexAdd(Extract(x, 0,"
    " 2), Concat(x, y))), Concat(ComplexSubtract(Concat(y, x), Extract(y, 1, 2)),"
    " ComplexDivide(Concat(x, y), Concat(y, x)+2))), Concat(Concat(ComplexScal(Concat(y, x-y),"
    " Extract(x, 1, 2)), ComplexRealScal(b, Concat(x, y))), Concat(Conj(Concat(x, y)),"
    " ComplexExp(Concat(x, y)))))",
    /* complex ops with real outputs or real operands */
    "Concat(Concat(Concat(Concat(ComplexExp1j(x*y), Real2Complex(x-y)), Concat(Imag2Complex(b),"
    " ComplexReal(Concat(x, y)))), Concat(Concat(ComplexImag(Concat(x, y)), ComplexAbs(Concat(x,"
    " y))), Concat(ComplexSquareAbs(Concat(y, x)), ComplexAngle(Concat(x, y))))),"
    " Concat(Concat(ComplexSum(Concat(x, y)), ComplexSumT(Extract(x*y, 0, 2)*g, 4)),"
    " Concat(ComplexDivide(Extract(x, 0, 2), Concat(y, x)+2), ComplexMult(Extract(y, 1, 2),"
    " Extract(x, 1, 2)))))",
};

/* Dimensions above the JIT's unrolling limit (16): loops over components, lazy elementwise
 * nodes, arrays in the per-row scope. */
static const char *const big_aliases[] = {"x=Vi(20)", "y=Vj(20)", "g=Pm(1)", "w=Pm(20)"};
static const char *const big_group =
    "Concat(Concat(Concat(Concat(SqDist(x, y), (x|y)), Concat(SqNorm2(x-y), Norm2(Abs(x)-y*0.5))),"
    " Concat(Concat(Sum(Exp(-(x-y)*(x-y))), Max(x-y)), Concat(Min(Sin(x)*y), ArgMax(x*y)))),"
    " Concat(Concat(Concat(ArgMin(x+y), Elem(x*y, 19)), Concat(Extract(Concat(x, y), 18, 4),"
    " WeightedSqNorm(w, x-y))), Concat(Concat(WeightedSqDist(g, x, y), Normalize(x)|y),"
    " Concat(Sum(Extract(x-y, 2, 17)), SqNorm2(Concat(x*g, y))))))"
    " + Sum(Round(x-y, 1)) + Sum(Pow(x, 3)) + Max(Concat(x, Abs(y)))"
    " + Sum(ExtractT(x, 2, 24)) + Sum(SumT(g, 20)*y) + Sum(ElemT(Elem(x, 3), 20, 7)*y)"
    " + Sum(ExtractT(Extract(x, 0, 3)*g, 5, 20)*y) + Sum(ExtractT(x-y, 0, 21)*Concat(y, g))"
    " + TensorDot(x, y, [4,5], [5,4], [0,1], [1,0])"
    " + (TensorDot(Extract(x, 0, 4), Extract(w, 0, 5), [4], [5], [], [], [1,0])|y)"
    " + Sum(ComplexReal(ComplexMult(ComplexExp(x*0.1), Conj(w))))"
    " + Elem(ComplexMult(ComplexSum(ComplexExp1j(x)), ComplexDivide(Extract(y, 0, 2),"
    " ComplexSum(Concat(w, g*y))+3)), 1)"
    /* big complex nodes in the pair loop: lazy, like elementwise ones */
    " + Sum(ComplexReal(ComplexMult(x, Conj(y)))) + Sum(ComplexAngle(x+y))"
    " + ComplexAbs(ComplexSum(ComplexDivide(ComplexExp(x*0.1), y+3)))"
    " + Sum(ComplexSquareAbs(ComplexAdd(ComplexScal(Extract(y, 0, 2), x),"
    " Real2Complex(Extract(w, 0, 10)*g))))"
    " + Sum(Concat(ComplexExp1j(Extract(x, 0, 9)*g), Imag2Complex(Extract(y, 0, 1))))"
    " + Sum(ComplexRealScal(g, ComplexSubtract(y, ComplexSumT(ComplexSum(x), 20))))";

const char *diff_op_group_formula(int grp, const char *const **aliases)
{
    *aliases = grp < DIFF_OP_GROUPS - 1 ? op_aliases : big_aliases;
    return grp < DIFF_OP_GROUPS - 1 ? op_groups[grp] : big_group;
}

void diff_op_group(sr_ctx *ctx, sr_device dev, int grp, sr_dtype dt)
{
    /* The backend must see every op as written, so the simplifier is off here. */
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    sr_expr *f = grp < DIFF_OP_GROUPS - 1 ? diff_parse(ctx, op_groups[grp], op_aliases, 4)
                                          : diff_parse(ctx, big_group, big_aliases, 4);
    for (int axis = 1; axis >= 0; axis--) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.dtype = dt;
        d.axis = axis;
        sr_kernel *kb = diff_kernel(ctx, f, d, dev),
                  *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
        /* The backend under test runs the group itself, not the reference it may fall back to. */
        const char *want = diff_backend_name(dev);
        cr_assert_str_eq(tu_plan(kb).backend, want, "op group %d: %s expected:\n%s", grp, want,
                         sr_kernel_explain(kb));
        char what[64];
        snprintf(what, sizeof what, "op group %d %s axis %d", grp, diff_dtype_tag(dt), axis);
        /* One pair per output: Sum over a single index is F itself, so no cancellation. */
        struct diff_tol tl = dt == SR_F64 ? (struct diff_tol){1e-9, 1e-12}
                                          : diff_tol_widen(dt, (struct diff_tol){1e-4, 1e-5});
        diff_run(ctx, kb, kr, axis ? 129 : 1, axis ? 1 : 129, DIFF_UNIFORM, -1.5, 1.5, 11 + grp, tl,
                 what);
        diff_run(ctx, kb, kr, axis ? 7 : 2, axis ? 2 : 7, DIFF_UNIFORM, -1.5, 1.5, 17 + grp,
                 dt == SR_F64 ? (struct diff_tol){1e-9, 1e-9}
                              : diff_tol_widen(dt, (struct diff_tol){1e-4, 1e-4}),
                 what);
        sr_kernel_free(kb);
        sr_kernel_free(kr);
    }
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", NULL);
}

/* ---- every reduction, both axes, both dtypes, many sizes ---------------------------------- */

static const char *const red_aliases[] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "b=Vj(2)"};

void diff_reduction(sr_ctx *ctx, sr_device dev, sr_reduction red, sr_dtype dt)
{
    /* Grid inputs make F exact in float32, so arg reductions agree index for index; the
     * vector F checks the component-wise reduction. */
    const char *ftext = "Concat(SqDist(x, y), (x|y) - p)";
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.dtype = dt;
    d.k = 3;
    if (red == SR_SUMSOFTMAXWEIGHT) {
        ftext = "-SqDist(x, y) * p";
        d.weight = diff_parse(ctx, "Concat(b, Elem(x, 0) * Elem(y, 1))", red_aliases, 4);
    }
    if (red == SR_LOGSUMEXP)
        ftext = "Concat(-SqDist(x, y) * p, (x|y))";
    sr_expr *f = diff_parse(ctx, ftext, red_aliases, 4);
    static const int64_t sizes[][2] = {{1, 1},    {7, 7},    {129, 1000}, {1000, 129},
                                       {3, 5000}, {5000, 2}, {0, 4},      {4, 0},
                                       {1009, 3}, {2, 4099}, {131, 257}};
    for (int axis = 1; axis >= 0; axis--) {
        d.axis = axis;
        sr_kernel *kb = diff_kernel(ctx, f, d, dev),
                  *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s axis %d", sr_reduction_name(red), diff_dtype_tag(dt),
                     axis);
            diff_run(ctx, kb, kr, sizes[s][0], sizes[s][1], DIFF_GRID, -2.0, 2.0, 100 + s,
                     diff_tol_of(dt), what);
        }
        sr_kernel_free(kb);
        sr_kernel_free(kr);
    }
}

/* ---- ties, NaN and Inf ---------------------------------------------------------------------- */

void diff_special(sr_ctx *ctx, sr_device dev, sr_reduction red, enum diff_gen g, int k,
                  const char *ftext)
{
    static const char *const al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = diff_parse(ctx, ftext, al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = k;
    if (red == SR_SUMSOFTMAXWEIGHT)
        d.weight = diff_parse(ctx, "y + 1", al, 2);
    for (int dt = SR_F32; dt <= SR_BF16; dt++) {
        d.dtype = (sr_dtype)dt;
        sr_kernel *kb = diff_kernel(ctx, f, d, dev),
                  *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
        char what[96];
        snprintf(what, sizeof what, "%s of %s (%s)", sr_reduction_name(red), ftext,
                 diff_dtype_tag((sr_dtype)dt));
        diff_run(ctx, kb, kr, 37, 1500, g, -2.0, 2.0, 7, diff_tol_of((sr_dtype)dt), what);
        diff_run(ctx, kb, kr, 3, 9000, g, -2.0, 2.0, 8, diff_tol_of((sr_dtype)dt), what);
        sr_kernel_free(kb);
        sr_kernel_free(kr);
    }
}

void diff_mark_ops(const sr_expr *e, bool *seen)
{
    size_t n = expr_toposort(e, NULL, 0);
    const sr_expr **v = malloc((n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    expr_toposort(e, v, n);
    for (size_t i = 0; i < n; i++)
        seen[v[i]->op] = true;
    free(v);
}
