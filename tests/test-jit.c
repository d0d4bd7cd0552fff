/*
 * test-jit.c — the CPU JIT backend against the reference interpreter.
 *
 * Every op (several ops per kernel, joined with Concat, so the number of compiled kernels stays
 * small), every reduction on both axes in float32 and float64, sizes 0, 1, 7, 129 and 1000+ (not
 * multiples of any tile), the split of the reduced range over threads, NaN/Inf inputs, ties, the
 * accumulation modes, and the fallback when there is no compiler. The kernels are cached on disk
 * (SYMRED_CACHE_DIR in the working directory), so reruns do not compile.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    setenv("SYMRED_CACHE_DIR", "jit-test-cache", 1);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_ACC");
    unsetenv("SYMRED_NUM_THREADS");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(jit, .init = setup, .fini = teardown);

/* How inputs are drawn. */
enum gen { GEN_UNIFORM, GEN_GRID, GEN_SMALLINT, GEN_SPECIAL };

struct inputs {
    void *buf[8];
    const void *args[8];
    int nargs;
};

static double draw(enum gen g, uint64_t *s, double lo, double hi)
{
    switch (g) {
    case GEN_GRID: /* multiples of 1/64: SqDist and products are exact in float32 */
        return round(tu_uniform(s, lo, hi) * 64.0) / 64.0;
    case GEN_SMALLINT: /* many ties */
        return floor(tu_uniform(s, 0.0, 4.0));
    case GEN_SPECIAL: {
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

static void make_inputs(const sr_kernel *k, int64_t nx, int64_t ny, enum gen g, double lo,
                        double hi, uint64_t seed, struct inputs *in)
{
    memset(in, 0, sizeof *in);
    in->nargs = k->nargs;
    cr_assert(k->nargs <= 8);
    size_t esz = sr_dtype_size(k->dtype);
    for (int v = 0; v < k->nargs; v++) {
        if (!k->vars[v].dim)
            continue;
        int64_t rows = k->vars[v].cat == SR_CAT_I ? nx : k->vars[v].cat == SR_CAT_J ? ny : 1;
        int64_t n = rows * k->vars[v].dim;
        in->buf[v] = malloc((size_t)(n > 0 ? n : 1) * esz);
        uint64_t s = seed * 7919 + (uint64_t)v + 1;
        for (int64_t t = 0; t < n; t++) {
            double x =
                draw(k->vars[v].cat == SR_CAT_PARAM && g == GEN_SPECIAL ? GEN_GRID : g, &s, lo, hi);
            if (k->dtype == SR_F64)
                ((double *)in->buf[v])[t] = x;
            else
                ((float *)in->buf[v])[t] = (float)x;
        }
        in->args[v] = in->buf[v];
    }
}

static void free_inputs(struct inputs *in)
{
    for (int v = 0; v < 8; v++)
        free(in->buf[v]);
}

static sr_kernel *new_kernel(sr_expr *f, sr_kernel_desc d, sr_device dev)
{
    cr_assert_not_null(f, "building the formula failed: %s", sr_ctx_error(ctx));
    d.device = dev;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    cr_assert_eq(st, SR_OK, "sr_kernel_new (%s): %s", dev == SR_DEVICE_CPU ? "cpu" : "ref",
                 sr_ctx_error(ctx));
    return k;
}

struct tol {
    double rtol, atol;
};
static struct tol tol_of(sr_dtype dt)
{
    return dt == SR_F64 ? (struct tol){1e-10, 1e-10} : (struct tol){2e-4, 2e-4};
}

/* Runs the JIT kernel kj and the reference kernel kr on the same inputs and compares. Returns
 * the number of outputs compared. */
static int64_t compare_run(sr_kernel *kj, sr_kernel *kr, int64_t nx, int64_t ny, enum gen g,
                           double lo, double hi, uint64_t seed, struct tol tl, const char *what)
{
    cr_assert_str_eq(kj->backend->name, "cpu-jit", "%s: the JIT is not in use", what);
    struct inputs in;
    make_inputs(kj, nx, ny, g, lo, hi, seed, &in);
    const struct sr_reduction_info *ri = &sr_reductions[kj->red];
    int64_t nout = (kj->axis == 1 ? nx : ny) * kj->out_dim;
    size_t esz = sr_dtype_size(kj->dtype);
    size_t nb = (size_t)(nout > 0 ? nout : 1);
    void *vj = malloc(nb * esz), *vr = malloc(nb * esz);
    int64_t *ij = malloc(nb * 8), *ir = malloc(nb * 8);
    sr_run_desc r = {nx, ny, in.nargs, in.args, ri->values ? vj : NULL, ri->indices ? ij : NULL};
    sr_status sj = sr_kernel_run_ex(kj, &r);
    r.out = ri->values ? vr : NULL;
    r.out_idx = ri->indices ? ir : NULL;
    sr_status sref = sr_kernel_run_ex(kr, &r);
    cr_assert_eq(sj, sref, "%s nx=%lld ny=%lld: status jit %d, reference %d (%s)", what,
                 (long long)nx, (long long)ny, sj, sref, sr_ctx_error(ctx));
    if (sj == SR_OK) {
        for (int64_t t = 0; t < nout; t++) {
            if (ri->values) {
                double a = kj->dtype == SR_F64 ? ((double *)vj)[t] : ((float *)vj)[t];
                double b = kj->dtype == SR_F64 ? ((double *)vr)[t] : ((float *)vr)[t];
                cr_assert(tu_close(a, b, tl.rtol, tl.atol),
                          "%s nx=%lld ny=%lld: value %lld: jit %.9g, reference %.9g", what,
                          (long long)nx, (long long)ny, (long long)t, a, b);
            }
            if (ri->indices)
                cr_assert_eq(ij[t], ir[t], "%s nx=%lld ny=%lld: index %lld: jit %lld, ref %lld",
                             what, (long long)nx, (long long)ny, (long long)t, (long long)ij[t],
                             (long long)ir[t]);
        }
    }
    free(vj);
    free(vr);
    free(ij);
    free(ir);
    free_inputs(&in);
    return nout;
}

static sr_expr *parse(const char *formula, const char *const *aliases, int n)
{
    sr_expr *f = NULL;
    sr_status st = sr_parse(ctx, formula, aliases, n, &f);
    cr_assert_eq(st, SR_OK, "parse %s: %s", formula, sr_ctx_error(ctx));
    return f;
}

/* ---- every op ---------------------------------------------------------------------------- */

static const char *op_aliases[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", "b=Vj(1)"};

/* The op groups: each a Concat of many ops, over a = (x - y) / 2 in [-1, 1], plus terms that
 * depend on one index only (hoisted) and on parameters. */
static const char *const op_groups[] = {
    /* unary */
    "Concat(Concat(Concat(Concat(-(x-y)*0.5, Inv(x-y)), Concat(Square(x-y), Sqrt(x-y))),"
    " Concat(Concat(Rsqrt(x-y), Exp(x-y)), Concat(Log(x-y), XLogX(x-y)))),"
    " Concat(Concat(Concat(Sin(x-y), Cos(x-y)), Concat(Asin((x-y)*0.5), Acos((x-y)*0.5))),"
    " Concat(Concat(Atan(x-y), Abs(x-y)), Concat(Sign(x-y), Step(x-y)))))",
    /* unary, continued, and the special points */
    "Concat(Concat(Concat(ReLU(x-y), Floor(x*2-y)), Concat(SinXDivX(x-y), Pow(x-y,3))),"
    " Concat(Concat(Pow(x-y,-2), Pow(x-y,0)), Concat(Round(x-y,2), ClampInt((x-y)*3,-1,1))))"
    " + Concat(Concat(Concat(Rsqrt(x*0), XLogX(y*0)), Concat(SinXDivX(x*0), Pow(y,17))),"
    " Concat(Concat(Round(y,0), Pow(x-y,-19)), Concat(IntCst(3)*x, RatCst(-1,3)*y)))",
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
};

/* Dimensions above the JIT's unrolling limit (16): loops over components, lazy elementwise
 * nodes, arrays in the per-row scope. */
static const char *big_aliases[] = {"x=Vi(20)", "y=Vj(20)", "g=Pm(1)", "w=Pm(20)"};
static const char *const big_group =
    "Concat(Concat(Concat(Concat(SqDist(x, y), (x|y)), Concat(SqNorm2(x-y), Norm2(Abs(x)-y*0.5))),"
    " Concat(Concat(Sum(Exp(-(x-y)*(x-y))), Max(x-y)), Concat(Min(Sin(x)*y), ArgMax(x*y)))),"
    " Concat(Concat(Concat(ArgMin(x+y), Elem(x*y, 19)), Concat(Extract(Concat(x, y), 18, 4),"
    " WeightedSqNorm(w, x-y))), Concat(Concat(WeightedSqDist(g, x, y), Normalize(x)|y),"
    " Concat(Sum(Extract(x-y, 2, 17)), SqNorm2(Concat(x*g, y))))))"
    " + Sum(Round(x-y, 1)) + Sum(Pow(x, 3)) + Max(Concat(x, Abs(y)))";

static void op_group(int grp, sr_dtype dt)
{
    /* The JIT must see every op as written, so the simplifier is off here. */
    setenv("SYMRED_SIMPLIFY", "0", 1);
    sr_expr *f = grp < 5 ? parse(op_groups[grp], op_aliases, 4) : parse(big_group, big_aliases, 4);
    for (int axis = 1; axis >= 0; axis--) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.dtype = dt;
        d.axis = axis;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        char what[64];
        snprintf(what, sizeof what, "op group %d %s axis %d", grp, dt == SR_F64 ? "f64" : "f32",
                 axis);
        /* One pair per output: Sum over a single index is F itself, so no cancellation. */
        struct tol tl = dt == SR_F64 ? (struct tol){1e-9, 1e-12} : (struct tol){1e-4, 1e-5};
        compare_run(kj, kr, axis ? 129 : 1, axis ? 1 : 129, GEN_UNIFORM, -1.5, 1.5, 11 + grp, tl,
                    what);
        compare_run(kj, kr, axis ? 7 : 2, axis ? 2 : 7, GEN_UNIFORM, -1.5, 1.5, 17 + grp,
                    dt == SR_F64 ? (struct tol){1e-9, 1e-9} : (struct tol){1e-4, 1e-4}, what);
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
    unsetenv("SYMRED_SIMPLIFY");
}

Test(jit, ops_unary_f32) { op_group(0, SR_F32); }
Test(jit, ops_unary_f64) { op_group(0, SR_F64); }
Test(jit, ops_unary2_f32) { op_group(1, SR_F32); }
Test(jit, ops_unary2_f64) { op_group(1, SR_F64); }
Test(jit, ops_binary_f32) { op_group(2, SR_F32); }
Test(jit, ops_binary_f64) { op_group(2, SR_F64); }
Test(jit, ops_vector_f32) { op_group(3, SR_F32); }
Test(jit, ops_vector_f64) { op_group(3, SR_F64); }
Test(jit, ops_weighted_f32) { op_group(4, SR_F32); }
Test(jit, ops_weighted_f64) { op_group(4, SR_F64); }
Test(jit, ops_big_dims_f32) { op_group(5, SR_F32); }
Test(jit, ops_big_dims_f64) { op_group(5, SR_F64); }

/* kNN in dimension 64: the loop over components inside the vectorised loop. */
Test(jit, knn_big_dim)
{
    static const char *al[] = {"q=Vi(64)", "p=Vj(64)"};
    sr_expr *f = parse("SqDist(q, p)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_KMIN_ARGKMIN;
    d.k = 7;
    for (int axis = 1; axis >= 0; axis--) {
        d.axis = axis;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        compare_run(kj, kr, 57, 1030, GEN_GRID, -1, 1, 5, tol_of(SR_F32), "knn D=64");
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
}

/* ---- every reduction, both axes, both dtypes, many sizes ---------------------------------- */

static const char *red_aliases[] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "b=Vj(2)"};

static void reduction(sr_reduction red, sr_dtype dt)
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
        d.weight = parse("Concat(b, Elem(x, 0) * Elem(y, 1))", red_aliases, 4);
    }
    if (red == SR_LOGSUMEXP)
        ftext = "Concat(-SqDist(x, y) * p, (x|y))";
    sr_expr *f = parse(ftext, red_aliases, 4);
    static const int64_t sizes[][2] = {{1, 1},    {7, 7},    {129, 1000}, {1000, 129},
                                       {3, 5000}, {5000, 2}, {0, 4},      {4, 0}};
    for (int axis = 1; axis >= 0; axis--) {
        d.axis = axis;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s axis %d", sr_reduction_name(red),
                     dt == SR_F64 ? "f64" : "f32", axis);
            compare_run(kj, kr, sizes[s][0], sizes[s][1], GEN_GRID, -2.0, 2.0, 100 + s, tol_of(dt),
                        what);
        }
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
}

#define RED_TESTS(R, name)                                                                         \
    Test(jit, red_##name##_f32) { reduction(R, SR_F32); }                                          \
    Test(jit, red_##name##_f64) { reduction(R, SR_F64); }
RED_TESTS(SR_SUM, sum)
RED_TESTS(SR_MIN, min)
RED_TESTS(SR_MAX, max)
RED_TESTS(SR_ARGMIN, argmin)
RED_TESTS(SR_ARGMAX, argmax)
RED_TESTS(SR_MIN_ARGMIN, min_argmin)
RED_TESTS(SR_MAX_ARGMAX, max_argmax)
RED_TESTS(SR_KMIN, kmin)
RED_TESTS(SR_ARGKMIN, argkmin)
RED_TESTS(SR_KMIN_ARGKMIN, kmin_argkmin)
RED_TESTS(SR_LOGSUMEXP, logsumexp)
RED_TESTS(SR_SUMSOFTMAXWEIGHT, sumsoftmaxweight)

/* ---- ties, NaN and Inf ---------------------------------------------------------------------- */

static void special(sr_reduction red, enum gen g, int k, const char *ftext)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = parse(ftext, al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = k;
    if (red == SR_SUMSOFTMAXWEIGHT)
        d.weight = parse("y + 1", al, 2);
    for (int dt = 0; dt < 2; dt++) {
        d.dtype = (sr_dtype)dt;
        sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU),
                  *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
        char what[96];
        snprintf(what, sizeof what, "%s of %s (%s)", sr_reduction_name(red), ftext,
                 dt ? "f64" : "f32");
        compare_run(kj, kr, 37, 1500, g, -2.0, 2.0, 7, tol_of((sr_dtype)dt), what);
        compare_run(kj, kr, 3, 9000, g, -2.0, 2.0, 8, tol_of((sr_dtype)dt), what); /* split */
        sr_kernel_free(kj);
        sr_kernel_free(kr);
    }
}

Test(jit, argkmin_ties) { special(SR_ARGKMIN, GEN_SMALLINT, 5, "Abs(x - y)"); }
Test(jit, kmin_argkmin_ties) { special(SR_KMIN_ARGKMIN, GEN_SMALLINT, 4, "Abs(x - y)"); }
Test(jit, argmin_ties) { special(SR_MIN_ARGMIN, GEN_SMALLINT, 1, "Abs(x - y)"); }
Test(jit, argmax_ties) { special(SR_MAX_ARGMAX, GEN_SMALLINT, 1, "Abs(x - y)"); }
Test(jit, nan_inf_sum) { special(SR_SUM, GEN_SPECIAL, 1, "x * y"); }
Test(jit, nan_inf_min_argmin) { special(SR_MIN_ARGMIN, GEN_SPECIAL, 1, "x - y"); }
Test(jit, nan_inf_max_argmax) { special(SR_MAX_ARGMAX, GEN_SPECIAL, 1, "x + y"); }
Test(jit, nan_inf_kmin) { special(SR_KMIN_ARGKMIN, GEN_SPECIAL, 4, "x - y"); }
Test(jit, nan_inf_logsumexp) { special(SR_LOGSUMEXP, GEN_SPECIAL, 1, "x + y"); }
Test(jit, nan_inf_softmax) { special(SR_SUMSOFTMAXWEIGHT, GEN_SPECIAL, 1, "x + y"); }

/* Rows where every term is -inf, +inf, or a NaN: the LogSumExp special cases. */
Test(jit, logsumexp_all_infinite)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = parse("x + y", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_LOGSUMEXP;
    d.dtype = SR_F64;
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_CPU);
    double x[4] = {-INFINITY, INFINITY, NAN, 0.0}, y[3] = {1.0, 2.0, -5.0}, out[4];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, 4, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    double lse0 = log(exp(1.0) + exp(2.0) + exp(-5.0));
    cr_assert(isinf(out[0]) && out[0] < 0, "all -inf: got %g", out[0]);
    cr_assert(isinf(out[1]) && out[1] > 0, "+inf terms: got %g", out[1]);
    cr_assert(isnan(out[2]), "NaN terms: got %g", out[2]);
    cr_assert(tu_close(out[3], lse0, 1e-12, 0), "finite: got %.17g, expected %.17g", out[3], lse0);
    sr_kernel_free(k);
}

/* ---- accumulation, threads, explain ----------------------------------------------------- */

static void sum_with_env(const char *var, const char *value, const char *expect_in_explain)
{
    setenv(var, value, 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_ctx *save = ctx;
    ctx = c2;
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    sr_expr *f = parse("Exp(-SqDist(x, y)) + 1e-3", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *kj = new_kernel(f, d, SR_DEVICE_CPU), *kr = new_kernel(f, d, SR_DEVICE_REFERENCE);
    const char *ex = sr_kernel_explain(kj);
    cr_assert(strstr(ex, expect_in_explain), "explain lacks \"%s\":\n%s", expect_in_explain, ex);
    compare_run(kj, kr, 5, 100000, GEN_UNIFORM, -1, 1, 3, (struct tol){2e-5, 0}, value);
    compare_run(kj, kr, 300, 3000, GEN_UNIFORM, -1, 1, 4, (struct tol){2e-5, 0}, value);
    sr_kernel_free(kj);
    sr_kernel_free(kr);
    ctx = save;
    sr_ctx_free(c2);
    unsetenv(var);
}

Test(jit, acc_block) { sum_with_env("SYMRED_ACC", "block", "accumulation: block"); }
Test(jit, acc_kahan) { sum_with_env("SYMRED_ACC", "kahan", "accumulation: kahan"); }
Test(jit, acc_f64) { sum_with_env("SYMRED_ACC", "f64", "accumulation: f64"); }
Test(jit, one_thread) { sum_with_env("SYMRED_NUM_THREADS", "1", "threads: 1 "); }

Test(jit, explain_plan)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = parse("Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = new_kernel(f, d, SR_DEVICE_AUTO);
    const char *ex = sr_kernel_explain(k);
    static const char *const want[] = {"backend: cpu-jit", "strategy: direct",    "tiles: ",
                                       "threads: ",        "accumulation: block", "-fno-math-errno",
                                       "module: "};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(ex, want[i]), "explain lacks \"%s\":\n%s", want[i], ex);
    cr_assert_null(strstr(ex, "ffast-math"), "fast-math must not be used:\n%s", ex);
    sr_kernel_free(k);
}

/* The same kernel twice in one context: the second comes from the context's memory. */
Test(jit, memory_cache_hit)
{
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    sr_expr *f = parse("SqDist(x, y)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_MIN;
    sr_kernel *k1 = new_kernel(f, d, SR_DEVICE_CPU), *k2 = new_kernel(f, d, SR_DEVICE_CPU);
    cr_assert(strstr(sr_kernel_explain(k2), "module: memory"), "second kernel:\n%s",
              sr_kernel_explain(k2));
    sr_kernel_free(k1);
    float x[4] = {0, 0, 1, 1}, y[2] = {1, 0}, out[2];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k2, 2, 1, args, out), SR_OK);
    cr_assert(out[0] == 1.0f && out[1] == 1.0f, "got %g %g", out[0], out[1]);
    sr_kernel_free(k2);
}

/* ---- no compiler, failing compiler --------------------------------------------------------- */

Test(jit, no_compiler_falls_back)
{
    setenv("SYMRED_CC", "/nonexistent/cc", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    sr_ctx *save = ctx;
    ctx = c2;
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = parse("Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_str_eq(k->backend->name, "reference");
    float x[3] = {0, 0, 0}, y[6] = {0, 0, 0, 1, 0, 0}, b[2] = {1, 2}, g = 1, out[1];
    const void *args[] = {x, y, b, &g};
    cr_assert_eq(sr_kernel_run(k, 1, 2, args, out), SR_OK);
    float expect = 1.0f + 2.0f * expf(-1.0f);
    cr_assert(fabsf(out[0] - expect) < 1e-6f, "got %g, expected %g", out[0], expect);
    sr_kernel_free(k);
    ctx = save;
    sr_ctx_free(c2);
    unsetenv("SYMRED_CC");
}

Test(jit, failing_compiler_reports_ecompile)
{
    /* A compiler that runs and fails (with diagnostics) is an error, not a silent fallback. */
    char script[] = "/tmp/symred-badcc-XXXXXX";
    int fd = mkstemp(script);
    cr_assert(fd >= 0);
    const char *text = "#!/bin/sh\necho 'kernel.c:1: error: something broke' >&2\nexit 1\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(script, 0700);
    setenv("SYMRED_CC", script, 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(c2, "x*y", al, 2, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c2, f, &d, &k);
    cr_assert_eq(st, SR_ECOMPILE, "status %d (%s)", st, sr_ctx_error(c2));
    cr_assert_null(k);
    cr_assert(strstr(sr_ctx_error(c2), "something broke"), "message: %s", sr_ctx_error(c2));
    /* The context stays usable: the reference still works. */
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(c2, f, &d, &k), SR_OK);
    sr_kernel_free(k);
    sr_ctx_free(c2);
    unlink(script);
    unsetenv("SYMRED_CC");
}

Test(jit, false_compiler_reports_ecompile)
{
    setenv("SYMRED_CC", "false", 1);
    setenv("SYMRED_CACHE_DIR", "off", 1);
    sr_ctx *c2;
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(c2, "x-y", al, 2, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c2, f, &d, &k);
    cr_assert_eq(st, SR_ECOMPILE, "status %d (%s)", st, sr_ctx_error(c2));
    sr_ctx_free(c2);
    unsetenv("SYMRED_CC");
}
