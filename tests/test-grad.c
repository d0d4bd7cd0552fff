/*
 * test-grad.c — symbolic differentiation: the derivative of every op against central finite
 * differences in float64, on the reference backend and the CPU JIT; second derivatives and
 * Diff the same way; the text forms Grad, GradFromPos and Diff; and the errors.
 *
 * Every formula is evaluated at one pair (nx = ny = 1, Sum over j), which returns F(x_0, y_0).
 * All tests use one set of variables, so the gradient with respect to every variable of the
 * set is checked for every formula, including the variables a formula does not use (zero).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr/expr.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(grad, .init = setup, .fini = teardown);

/* The variables: index, category, dimension. Index NV is the gradient input (Vi, dim(F)), and
 * NV + 1 a direction (Vi, dimension of x) for second derivatives and Diff. */
#define NV 7
static const char *const aliases[NV] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "A=Vj(6)",
                                        "z=Vi(2)", "w=Pm(3)", "W=Pm(9)"};
static const int vdim[NV] = {3, 3, 1, 6, 2, 3, 9};
static const sr_cat vcat[NV] = {SR_CAT_I, SR_CAT_J,     SR_CAT_PARAM, SR_CAT_J,
                                SR_CAT_I, SR_CAT_PARAM, SR_CAT_PARAM};
#define MAXD   64
#define MAXARG (NV + 2)

struct point {
    double v[MAXARG][MAXD]; /* the value of each variable */
};

static sr_expr *var(int v) { return sr_var(ctx, v, vdim[v], vcat[v]); }

/* F at the point, by a kernel with nx = ny = 1 on the given device, float64. */
static int eval(const sr_expr *f, sr_device dev, const struct point *pt, double *out)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = SR_F64;
    d.device = dev;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "sr_kernel_new: %s", sr_ctx_error(ctx));
    const void *args[MAXARG];
    for (int v = 0; v < MAXARG; v++)
        args[v] = pt->v[v];
    cr_assert(sr_kernel_nargs(k) <= MAXARG);
    int od = sr_kernel_out_dim(k);
    cr_assert(od <= MAXD * NV);
    cr_assert_eq(sr_kernel_run(k, 1, 1, args, out), SR_OK, "run: %s", sr_ctx_error(ctx));
    sr_kernel_free(k);
    return od;
}

/* <F(pt), e> with F's kernel on the reference. */
static double dot_f(const sr_expr *f, const struct point *pt)
{
    double out[MAXD];
    int n = eval(f, SR_DEVICE_REFERENCE, pt, out);
    double s = 0.0;
    for (int c = 0; c < n; c++)
        s += out[c] * pt->v[NV][c];
    return s;
}

/* The central difference of <F, e> in variable v, component c. */
static double fd(const sr_expr *f, const struct point *pt, int v, int c)
{
    struct point q = *pt;
    double x = pt->v[v][c], h = 1e-5 * fmax(1.0, fabs(x));
    q.v[v][c] = x + h;
    double up = dot_f(f, &q);
    q.v[v][c] = x - h;
    double down = dot_f(f, &q);
    return (up - down) / (2 * h);
}

static void random_point(struct point *pt, double lo, double hi, uint64_t *seed)
{
    memset(pt, 0, sizeof *pt);
    for (int v = 0; v < MAXARG; v++)
        for (int c = 0; c < MAXD; c++)
            pt->v[v][c] = tu_uniform(seed, lo, hi);
    for (int c = 0; c < MAXD; c++) /* the gradient input and the direction */
        pt->v[NV][c] = tu_uniform(seed, -1.0, 1.0), pt->v[NV + 1][c] = tu_uniform(seed, -1, 1);
}

static sr_expr *parse(const char *formula)
{
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, formula, aliases, NV, &f), SR_OK, "%s: %s", formula,
                 sr_ctx_error(ctx));
    return f;
}

/* One formula per op at least, with its inputs' range (away from kinks and poles). */
struct op_case {
    const char *formula;
    double lo, hi;
};
static const struct op_case op_cases[] = {
    {"x", -1, 1},
    {"x*IntCst(3)+RatCst(1,3)*y-2.5*p", -1, 1},
    {"Cst(0.25)*x", -1, 1},
    {"x+y", -1, 1},
    {"x-y+p", -1, 1},
    {"x*y", -1, 1},
    {"x*p", -1, 1},
    {"x/y", 0.5, 2},
    {"p/x", 0.5, 2},
    {"-x", -1, 1},
    {"Powf(x,y)", 0.5, 2},
    {"Powf(x,p)", 0.5, 2},
    {"Atan2(x,y)", -1, 1},
    {"Less(x,y)", -1, 1},
    {"LessEq(x,y)", -1, 1},
    {"Greater(x,y)", -1, 1},
    {"GreaterEq(x,p)", -1, 1},
    {"Equal(x,y)", -1, 1},
    {"NotEqual(x,y)", -1, 1},
    {"Inv(x)", 0.5, 2},
    {"Square(x)", -1, 1},
    {"Sqrt(x)", 0.5, 2},
    {"Rsqrt(x)", 0.5, 2},
    {"Exp(x)", -1, 1},
    {"Log(x)", 0.5, 2},
    {"XLogX(x)", 0.5, 2},
    {"Sin(x)", -2, 2},
    {"Cos(x)", -2, 2},
    {"Asin(x)", -0.8, 0.8},
    {"Acos(x)", -0.8, 0.8},
    {"Atan(x)", -2, 2},
    {"Abs(x)", -2, 2},
    {"Sign(x)", -2, 2},
    {"Step(x)", -2, 2},
    {"ReLU(x)", -2, 2},
    {"Floor(x*3)", -2, 2},
    {"SinXDivX(x)", -2, 2},
    {"Pow(x,3)", -1, 1},
    {"Pow(x,-2)", 0.5, 2},
    {"Pow(x,1)+Pow(y,0)", 0.5, 2},
    {"Round(x,2)", -2, 2},
    {"ClampInt(x*4,-1,1)", -1, 1},
    {"DiffClampInt(x*4,-1,1)*y", -1, 1},
    {"Clamp(x*4-2,y-1,p)", 0, 1},
    {"IfElse(x-0.5,y,p)", 0, 1},
    {"Mod(x+2,y*0.3+1,p*0.05)", 0.1, 0.9},
    {"SqNorm2(x)", -1, 1},
    {"Norm2(x-y)", -1, 1},
    {"Normalize(x+y)", -1, 1},
    {"SqDist(x,y)", -1, 1},
    {"(x|y)", -1, 1},
    {"Sum(x*y)", -1, 1},
    {"Max(x*y)", -1, 1},
    {"Min(x-y)", -1, 1},
    {"ArgMax(x)", -1, 1},
    {"ArgMin(x)", -1, 1},
    {"Elem(x*y,1)", -1, 1},
    {"Extract(x*y,1,1)", -1, 1},
    {"Extract(x,0,2)*z", -1, 1},
    {"Concat(x*p,z)", -1, 1},
    {"OneHot(p*2,3)*x", 0, 1},
    {"MatVecMult(A,x)", -1, 1},
    {"VecMatMult(z,A)", -1, 1},
    {"TensorProd(x,z)", -1, 1},
    {"WeightedSqNorm(p,x)", -1, 1},
    {"WeightedSqNorm(w,x-y)", -1, 1},
    {"WeightedSqNorm(W,x)", -1, 1},
    {"WeightedSqDist(p,x,y)", -1, 1},
    {"WeightedSqDist(w,x,y)", -1, 1},
    {"WeightedSqDist(W,x,y)", -1, 1},
    {"Exp(-SqDist(x,y)*p)*Sum(A)", -1, 1},
    {"SumT(p*Sum(x),4)*Concat(y,p)", -1, 1},
    {"ElemT(Sum(x*y),4,2)*Concat(y,p)", -1, 1},
    {"ExtractT(x*y,1,5)*Concat(z,y)", -1, 1},
    /* A (3x2) contracted with x over its rows; then a rank-3 product, permuted */
    {"TensorDot(A,x*y,[3,2],[3],[0],[0])", -1, 1},
    {"TensorDot(A,Concat(z,p),[3,2],[3],[],[],[2,0,1])", -1, 1},
    {"TensorDot(z*p,A,[2],[3,2],[0],[1])", -1, 1},
    {"TensorDot(W,A*A,[3,1,3],[3,2],[0],[0],[2,0,1])", -1, 1},
    {"TensorDot(x,y,[3],[3],[0],[0])*Kron(z,A,[2],[6])", -1, 1},
    /* complex ops on (re, im) pairs: A is 3 complex numbers, z one (broadcast) */
    {"ComplexAdd(A,Concat(x,y)*p)", -1, 1},
    {"ComplexAdd(z,A)*A", -1, 1},
    {"ComplexSubtract(A*A,z)", -1, 1},
    {"ComplexMult(A,Concat(x,y))", -1, 1},
    {"ComplexMult(z,A)", -1, 1},
    {"ComplexMult(A,z*p)", -1, 1},
    {"ComplexDivide(A,Concat(x,y)+2)", -1, 1},
    {"ComplexDivide(z,A+2)", -1, 1},
    {"ComplexDivide(A,z+2)", -1, 1},
    {"ComplexScal(z,A*A)", -1, 1},
    {"ComplexRealScal(A,p*Sum(x))", -1, 1},
    {"Conj(A*A)*A", -1, 1},
    {"ComplexExp(A*p)", -1, 1},
    {"ComplexExp1j(x*y)*A", -1, 1},
    {"ComplexReal(ComplexMult(A,A))", -1, 1},
    {"ComplexImag(ComplexMult(A,Concat(x,y)))", -1, 1},
    {"ComplexAbs(A+Concat(x,w))", 0.2, 1},
    {"ComplexSquareAbs(A-Concat(x,y))", -1, 1},
    {"ComplexAngle(A*p)", 0.2, 1},
    {"ComplexAngle(ComplexSubtract(z,A))", -1, 1},
    {"Real2Complex(x*y)*A", -1, 1},
    {"Imag2Complex(x)*A", -1, 1},
    {"ComplexSum(ComplexMult(A,A))*z", -1, 1},
    {"ComplexSumT(ComplexMult(z,z*p),6)*A", -1, 1},
};
#define NCASES ((int)(sizeof op_cases / sizeof *op_cases))

/* The gradient with respect to every variable of the set, concatenated. */
static sr_expr *all_grads(sr_expr *f)
{
    sr_expr *e = sr_vi(ctx, NV, sr_expr_dim(f)), *g = NULL;
    for (int v = 0; v < NV; v++) {
        sr_expr *gv = sr_grad(ctx, f, var(v), e);
        cr_assert_not_null(gv, "Grad by variable %d: %s", v, sr_ctx_error(ctx));
        cr_assert_eq(sr_expr_dim(gv), vdim[v]);
        g = g ? sr_concat(ctx, g, gv) : gv;
    }
    return g;
}

/* Checks the concatenated gradient values got against finite differences of <f, e>. */
static void check_fd(const char *what, const sr_expr *f, const struct point *pt, const double *got)
{
    int t = 0;
    for (int v = 0; v < NV; v++)
        for (int c = 0; c < vdim[v]; c++, t++) {
            double want = fd(f, pt, v, c);
            cr_expect(tu_close(got[t], want, 1e-6, 1e-6),
                      "%s: d/d%s[%d]: got %.12g, finite differences %.12g", what, aliases[v], c,
                      got[t], want);
        }
}

Test(grad, every_op_against_finite_differences)
{
    bool seen[OP_COUNT] = {0};
    uint64_t seed = 42;
    for (int i = 0; i < NCASES; i++) {
        const struct op_case *oc = &op_cases[i];
        sr_expr *f = parse(oc->formula);
        const sr_expr *order[256];
        size_t n = expr_toposort(f, order, 256);
        cr_assert(n <= 256);
        for (size_t k = 0; k < n; k++)
            seen[order[k]->op] = true;
        sr_expr *g = all_grads(f);
        for (int rep = 0; rep < 2; rep++) {
            struct point pt;
            random_point(&pt, oc->lo, oc->hi, &seed);
            double ref[MAXD * NV], jit[MAXD * NV];
            int nr = eval(g, SR_DEVICE_REFERENCE, &pt, ref);
            int nj = eval(g, SR_DEVICE_CPU, &pt, jit);
            cr_assert_eq(nr, nj);
            check_fd(oc->formula, f, &pt, ref);
            for (int t = 0; t < nr; t++)
                cr_expect(tu_close(jit[t], ref[t], 1e-12, 1e-12),
                          "%s: JIT %.17g, reference %.17g at %d", oc->formula, jit[t], ref[t], t);
        }
    }
    for (int op = 0; op < OP_COUNT; op++)
        cr_expect(seen[op], "no test formula uses %s", expr_ops[op].name);
}

/* Second derivatives: Grad(Grad(F, x, e), x, u) = H u, against the difference of first
 * gradients; and the same built from text. */
Test(grad, second_derivatives)
{
    static const char *const formulas[] = {
        "Exp(-SqDist(x,y)*p)*Sum(A)",
        "Sin(x)*Cos(y)",
        "Log(SqNorm2(x)+p)",
        "Normalize(x)*p",
        "Pow(x,3)/y",
        "Norm2(x-y)",
        "Powf(x,y)",
        "Atan2(x,y)",
        "WeightedSqDist(W,x,y)",
        "Sqrt(x*x+1)",
        "Rsqrt(x*x+1)",
        "XLogX(x*x+1)",
    };
    uint64_t seed = 7;
    for (size_t i = 0; i < sizeof formulas / sizeof *formulas; i++) {
        sr_expr *f = parse(formulas[i]);
        sr_expr *e = sr_vi(ctx, NV, sr_expr_dim(f)), *u = sr_vi(ctx, NV + 1, 3);
        sr_expr *g = sr_grad(ctx, f, var(0), e);
        sr_expr *h = sr_grad(ctx, g, var(0), u);
        char text[512];
        snprintf(text, sizeof text, "Grad(Grad(%s,x,Vi(%d,%d)),x,Vi(%d,3))", formulas[i], NV,
                 sr_expr_dim(f), NV + 1);
        cr_expect_eq(parse(text), h, "%s: the text form builds another formula", text);
        struct point pt;
        random_point(&pt, 0.5, 1.5, &seed);
        double ref[MAXD], jit[MAXD], up[MAXD], down[MAXD];
        eval(h, SR_DEVICE_REFERENCE, &pt, ref);
        eval(h, SR_DEVICE_CPU, &pt, jit);
        /* H u is the derivative of the x-gradient <., e> in direction u: g(x + t u) . u */
        for (int c = 0; c < 3; c++) {
            /* d/dx_c <g, u> = (H u)_c */
            struct point q = pt;
            double hh = 1e-5;
            q.v[0][c] = pt.v[0][c] + hh;
            eval(g, SR_DEVICE_REFERENCE, &q, up);
            q.v[0][c] = pt.v[0][c] - hh;
            eval(g, SR_DEVICE_REFERENCE, &q, down);
            double want = 0.0;
            for (int k = 0; k < 3; k++)
                want += (up[k] - down[k]) / (2 * hh) * pt.v[NV + 1][k];
            cr_expect(tu_close(ref[c], want, 1e-6, 1e-6), "%s: (Hu)[%d] = %.12g, fd %.12g",
                      formulas[i], c, ref[c], want);
            cr_expect(tu_close(jit[c], ref[c], 1e-12, 1e-12), "%s: JIT %.17g, reference %.17g",
                      formulas[i], jit[c], ref[c]);
        }
    }
}

/* Diff(F, x, u) = J u against (F(x + t u) - F(x - t u)) / 2t, also from text. */
Test(grad, diff_is_the_directional_derivative)
{
    static const char *const formulas[] = {"Exp(-SqDist(x,y)*p)*A", "Sin(x)*Cos(y)",
                                           "TensorProd(x,z)", "Normalize(x)*p", "Max(x*y)"};
    uint64_t seed = 11;
    for (size_t i = 0; i < sizeof formulas / sizeof *formulas; i++) {
        sr_expr *f = parse(formulas[i]);
        sr_expr *u = sr_vi(ctx, NV + 1, 3);
        sr_expr *d = sr_diff(ctx, f, var(0), u);
        cr_assert_not_null(d, "%s: %s", formulas[i], sr_ctx_error(ctx));
        cr_assert_eq(sr_expr_dim(d), sr_expr_dim(f));
        char text[256];
        snprintf(text, sizeof text, "Diff(%s,x,Vi(%d,3))", formulas[i], NV + 1);
        cr_expect_eq(parse(text), d, "%s: the text form builds another formula", text);
        struct point pt, q;
        random_point(&pt, -1, 1, &seed);
        double got[MAXD], jit[MAXD], up[MAXD], down[MAXD], t = 1e-5;
        int n = eval(d, SR_DEVICE_REFERENCE, &pt, got);
        eval(d, SR_DEVICE_CPU, &pt, jit);
        q = pt;
        for (int c = 0; c < 3; c++)
            q.v[0][c] = pt.v[0][c] + t * pt.v[NV + 1][c];
        eval(f, SR_DEVICE_REFERENCE, &q, up);
        for (int c = 0; c < 3; c++)
            q.v[0][c] = pt.v[0][c] - t * pt.v[NV + 1][c];
        eval(f, SR_DEVICE_REFERENCE, &q, down);
        for (int c = 0; c < n; c++) {
            double want = (up[c] - down[c]) / (2 * t);
            cr_expect(tu_close(got[c], want, 1e-6, 1e-6), "%s: [%d] %.12g, fd %.12g", formulas[i],
                      c, got[c], want);
            cr_expect(tu_close(jit[c], got[c], 1e-12, 1e-12), "%s: JIT %.17g, reference %.17g",
                      formulas[i], jit[c], got[c]);
        }
    }
}

/* The text forms expand to the builders' formulas. */
Test(grad, text_forms)
{
    sr_expr *f = parse("Exp(-SqDist(x,y)*p)");
    sr_expr *e = sr_vi(ctx, NV, 1);
    sr_expr *g = sr_grad(ctx, f, var(0), e);
    cr_expect_eq(parse("Grad(Exp(-SqDist(x,y)*p),x,Vi(7,1))"), g);
    cr_expect_eq(parse("Grad(Exp(-SqDist(x,y)*p),Var(0,3,0),Var(7,1,0))"), g);
    /* KeOps' GradFromPos(F, v, I): the gradient input is Var(I, dim(F), Vi) */
    cr_expect_eq(parse("GradFromPos(Exp(-SqDist(x,y)*p),x,7)"), g);
    /* GradFromPos(F, pos, e): with respect to the variable of index pos */
    cr_expect_eq(parse("GradFromPos(Exp(-SqDist(x,y)*p),0,Vi(7,1))"), g);
    cr_expect_eq(parse("GradFromPos(Exp(-SqDist(x,y)*p), 2, Vi(7,1))"), sr_grad(ctx, f, var(2), e));
    /* an alias's variable that F does not use: zeros of its dimension */
    sr_expr *z = parse("GradFromPos(Exp(-SqDist(x,y)*p),4,Vi(7,1))");
    cr_expect_eq(sr_expr_dim(z), 2);
    /* the printed gradient parses back to itself */
    char buf[4096];
    size_t len = sr_expr_print(g, buf, sizeof buf);
    cr_assert(len < sizeof buf);
    sr_expr *back;
    cr_assert_eq(sr_parse(ctx, buf, NULL, 0, &back), SR_OK, "%s: %s", buf, sr_ctx_error(ctx));
    cr_expect_eq(back, g, "%s", buf);
    /* a kernel runs it, as the simplifier leaves it */
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, g, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_plan_info p = tu_plan(k);
    cr_expect(p.simplified && p.formula, "%s", sr_kernel_explain(k));
    sr_kernel_free(k);
}

Test(grad, variable_not_in_formula_gives_zeros)
{
    sr_expr *f = parse("SqDist(x,y)");
    sr_expr *g = sr_grad(ctx, f, var(3), sr_vi(ctx, NV, 1));
    cr_assert_not_null(g);
    cr_assert_eq(sr_expr_dim(g), 6);
    struct point pt;
    uint64_t seed = 3;
    random_point(&pt, -1, 1, &seed);
    double out[MAXD];
    cr_assert_eq(eval(g, SR_DEVICE_REFERENCE, &pt, out), 6);
    for (int c = 0; c < 6; c++)
        cr_expect_eq(out[c], 0.0);
    /* through a piecewise-constant op only: zeros as well */
    g = sr_grad(ctx, parse("Floor(x)+Sign(y)"), var(0), sr_vi(ctx, NV, 3));
    cr_assert_eq(eval(g, SR_DEVICE_REFERENCE, &pt, out), 3);
    for (int c = 0; c < 3; c++)
        cr_expect_eq(out[c], 0.0);
}

/* Values at the kinks, as docs/gradients.md states them. */
Test(grad, values_at_kinks)
{
    static const struct {
        const char *formula;
        double at, want;
    } kinks[] = {
        {"Abs(x)", 0, 0},          {"ReLU(x)", 0, 1},
        {"Sqrt(x)", 0, 0},         {"Rsqrt(x)", 0, 0},
        {"SinXDivX(x)", 0, 0},     {"Norm2(x)", 0, 0},
        {"Step(x)", 0, 0},         {"ClampInt(x,0,1)", 0, 1},
        {"ClampInt(x,0,1)", 1, 1}, {"DiffClampInt(x,0,1)", 0, 0},
        {"Asin(x)", 1, 0},         {"Clamp(x,Elem(x,1),p)", 0, 1},
    };
    for (size_t i = 0; i < sizeof kinks / sizeof *kinks; i++) {
        sr_expr *f = parse(kinks[i].formula);
        sr_expr *g = sr_grad(ctx, f, var(0), sr_vi(ctx, NV, sr_expr_dim(f)));
        struct point pt;
        memset(&pt, 0, sizeof pt);
        for (int c = 0; c < 3; c++)
            pt.v[0][c] = kinks[i].at;
        pt.v[2][0] = 5; /* p */
        for (int c = 0; c < MAXD; c++)
            pt.v[NV][c] = 1;
        double ref[MAXD], jit[MAXD];
        eval(g, SR_DEVICE_REFERENCE, &pt, ref);
        eval(g, SR_DEVICE_CPU, &pt, jit);
        cr_expect_eq(ref[0], kinks[i].want, "%s at %g: %g, documented %g", kinks[i].formula,
                     kinks[i].at, ref[0], kinks[i].want);
        cr_expect_eq(jit[0], ref[0], "%s: JIT %g, reference %g", kinks[i].formula, jit[0], ref[0]);
    }
}

Test(grad, errors)
{
    sr_expr *f = parse("SqDist(x,y)"), *x = var(0);
    /* a gradient input of the wrong dimension */
    cr_expect_null(sr_grad(ctx, f, x, sr_vi(ctx, NV, 2)));
    cr_expect(strstr(sr_ctx_error(ctx), "dimension 2") != NULL, "%s", sr_ctx_error(ctx));
    sr_kernel *k;
    sr_kernel_desc d = sr_kernel_desc_default();
    cr_expect_eq(sr_kernel_new(ctx, NULL, &d, &k), SR_EDIM);
    /* not a variable */
    cr_expect_null(sr_grad(ctx, f, sr_exp(ctx, x), sr_vi(ctx, NV, 1)));
    cr_expect(strstr(sr_ctx_error(ctx), "must be a variable") != NULL, "%s", sr_ctx_error(ctx));
    cr_expect_eq(sr_kernel_new(ctx, NULL, &d, &k), SR_EINVAL);
    /* NULL operands: NULL, the earlier error kept */
    cr_expect_null(sr_grad(ctx, NULL, x, x));
    cr_expect_null(sr_grad(ctx, f, NULL, x));
    cr_expect_null(sr_grad(ctx, f, x, NULL));
    cr_expect_null(sr_grad(NULL, f, x, x));
    cr_expect_null(sr_diff(ctx, f, x, NULL));
    /* the variable's index used in F with another dimension or category */
    cr_expect_null(sr_grad(ctx, f, sr_vi(ctx, 0, 2), sr_vi(ctx, NV, 1)));
    cr_expect(strstr(sr_ctx_error(ctx), "Vi of dimension 3 in the formula") != NULL, "%s",
              sr_ctx_error(ctx));
    cr_expect_null(sr_grad(ctx, f, sr_vj(ctx, 0, 3), sr_vi(ctx, NV, 1)));
    /* a direction of the wrong dimension */
    cr_expect_null(sr_diff(ctx, f, x, sr_vi(ctx, NV, 1)));
    cr_expect(strstr(sr_ctx_error(ctx), "direction") != NULL, "%s", sr_ctx_error(ctx));

    /* text errors */
    static const struct {
        const char *text;
        sr_status st;
        const char *msg;
    } bad[] = {
        {"Grad(SqDist(x,y),x,z)", SR_EDIM, "column 1"},
        {"Grad(SqDist(x,y),x+y,p)", SR_EPARSE, "must be a variable"},
        {"Grad(SqDist(x,y),x)", SR_EPARSE, "takes 3 arguments"},
        {"Grad(SqDist(x,y),x,p,p)", SR_EPARSE, "takes 3 arguments"},
        {"GradFromPos(SqDist(x,y),9,p)", SR_EPARSE, "no variable has index 9"},
        {"GradFromPos(SqDist(x,y),-1,p)", SR_EPARSE, "no variable has index -1"},
        {"GradFromPos(SqDist(x,y),x,0)", SR_EDIM, "index 0"},
        {"Diff(SqDist(x,y),x,p)", SR_EDIM, "direction"},
        {"Grad", SR_EPARSE, "expected '('"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sr_expr *e = (sr_expr *)1;
        cr_expect_eq(sr_parse(ctx, bad[i].text, aliases, NV, &e), bad[i].st, "%s: %s", bad[i].text,
                     sr_ctx_error(ctx));
        cr_expect_null(e);
        cr_expect(strstr(sr_ctx_error(ctx), bad[i].msg) != NULL, "%s: message '%s'", bad[i].text,
                  sr_ctx_error(ctx));
    }
    /* a derivative name cannot be an alias */
    const char *al[] = {"Grad=Vi(3)"};
    sr_expr *e;
    cr_expect_eq(sr_parse(ctx, "Grad", al, 1, &e), SR_EPARSE);
}
