/*
 * test-vjp.c — sr_kernel_vjp, the fused backward of attention, against the gradient kernels
 * (sr_kernel_grad) on the reference backend in float64: sizes 0, 1, primes and sizes that are
 * not multiples of the tiles, D = 1, 17, 64, weights of width 1, 16, 65, float32 and float64,
 * the forms of F it takes (a parameter or a constant factor on either side, the inner product's
 * operands in either order), NaN and infinities, the kernels it declines (SR_ENOTSUP), the
 * memory budget (SR_EBUDGET) and the argument errors; axis 0, where i and j exchange roles;
 * block-sparse ranges (sr_kernel_vjp_ranges, sr_kernel_run_lse_ranges) against the gradient
 * kernels run on the same ranges (sr_kernel_run_ranges).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(vjp, .init = setup, .fini = teardown);

/* Variables: q = Vi(0, D), k = Vj(1, D), s = Pm(2, 1), v = Vj(3, Dw). */
enum { NV = 4 };

struct job {
    const char *f, *w; /* formula and weight */
    int64_t n, m;
    int D, Dw;
    sr_dtype dt;
    double scale; /* s */
    int nan_row;  /* a row of q set to NaN (-1: none) */
    int inf_row;  /* a row of v whose first value is +inf (-1: none) */
    bool ax0;     /* axis 0: q = Vj, k and v = Vi, the output indexed by j */
};

struct arrays {
    void *a[NV];   /* the inputs in the job's dtype */
    double *d[NV]; /* the same as float64 */
    int64_t len[NV];
};

static sr_expr *parse(const struct job *j, const char *text)
{
    char al[NV][32];
    const char *o = j->ax0 ? "Vj" : "Vi", *red = j->ax0 ? "Vi" : "Vj";
    snprintf(al[0], sizeof al[0], "q=%s(0,%d)", o, j->D);
    snprintf(al[1], sizeof al[1], "k=%s(1,%d)", red, j->D);
    snprintf(al[2], sizeof al[2], "s=Pm(2,1)");
    snprintf(al[3], sizeof al[3], "v=%s(3,%d)", red, j->Dw);
    const char *aliases[NV] = {al[0], al[1], al[2], al[3]};
    sr_expr *e;
    cr_assert_eq(sr_parse(ctx, text, aliases, NV, &e), SR_OK, "%s: %s", text, sr_ctx_error(ctx));
    return e;
}

static sr_kernel *make(const struct job *j, sr_reduction red, sr_dtype dt, sr_device dev)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = j->ax0 ? 0 : 1;
    d.dtype = dt;
    d.device = dev;
    d.weight = red == SR_SUMSOFTMAXWEIGHT ? parse(j, j->w) : NULL;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, parse(j, j->f), &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

static size_t esize(sr_dtype dt) { return dt == SR_F64 ? 8 : 4; }

static void fill(const struct job *j, struct arrays *x, uint64_t *seed)
{
    const int64_t len[NV] = {j->n * j->D, j->m * j->D, 1, j->m * j->Dw};
    for (int v = 0; v < NV; v++) {
        x->len[v] = len[v];
        x->a[v] = calloc((size_t)len[v] + 1, esize(j->dt));
        x->d[v] = calloc((size_t)len[v] + 1, 8);
        tu_fill(x->a[v], j->dt, len[v], -1.5, 1.5, seed);
    }
    tu_set(x->a[2], j->dt, 0, j->scale);
    for (int t = 0; j->nan_row >= 0 && t < j->D; t++)
        tu_set(x->a[0], j->dt, j->nan_row * j->D + t, NAN);
    if (j->inf_row >= 0)
        tu_set(x->a[3], j->dt, j->inf_row * j->Dw, INFINITY);
    for (int v = 0; v < NV; v++)
        for (int64_t i = 0; i < len[v]; i++)
            x->d[v][i] = tu_get(x->a[v], j->dt, i);
}

/* Job j's arrays (filled from seed) in x and args, and its kernel on the CPU JIT. */
static sr_kernel *fixture(const struct job *j, uint64_t seed, struct arrays *x, const void **args)
{
    fill(j, x, &seed);
    for (int v = 0; v < NV; v++)
        args[v] = x->a[v];
    return make(j, SR_SUMSOFTMAXWEIGHT, j->dt, SR_DEVICE_CPU);
}

static void release(struct arrays *x)
{
    for (int v = 0; v < NV; v++)
        free(x->a[v]), free(x->d[v]);
}

/* The run of job j's arrays: n rows of q on the output side, m of k and v on the reduced side. */
static sr_run_desc job_run(const sr_kernel *k, const struct job *j, const void *const *args,
                           void *out)
{
    return (sr_run_desc){.nx = j->ax0 ? j->m : j->n,
                         .ny = j->ax0 ? j->n : j->m,
                         .nargs = sr_kernel_nargs(k),
                         .args = args,
                         .out = out};
}

static void run(const sr_kernel *k, const struct job *j, const void *const *args, void *out)
{
    sr_run_desc r = job_run(k, j, args, out);
    cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK, "%s", sr_ctx_error(ctx));
}

/* The gradient of variable v by its gradient kernel into want (a parameter's partial sums
 * added up): on the reference backend in float64 from the float64 copies, or (native) on the CPU
 * JIT in the job's dtype from its own arrays, where infinities and NaN come out as in that
 * dtype. G: the incoming gradient as the kernel reads it. */
static void expected(const struct job *j, const struct arrays *x, const void *G, int v,
                     double *want, bool native)
{
    const sr_dtype dt = native ? j->dt : SR_F64;
    const sr_device dev = native ? SR_DEVICE_CPU : SR_DEVICE_REFERENCE;
    sr_kernel *f = make(j, SR_SUMSOFTMAXWEIGHT, dt, dev);
    sr_kernel *lse = make(j, SR_LOGSUMEXP, dt, dev);
    void *out = calloc((size_t)(j->n * j->Dw + 1), 8), *lam = calloc((size_t)j->n + 1, 8);
    void *const *a = native ? x->a : (void *const *)x->d;
    const void *fa[NV] = {a[0], a[1], a[2], a[3]};
    run(f, j, fa, out);
    run(lse, j, fa, lam);
    sr_kernel *g;
    cr_assert_eq(sr_kernel_grad(f, v, &g), SR_OK, "%s", sr_ctx_error(ctx));
    const void *ga[NV + 3] = {a[0], a[1], a[2], a[3], G, out, lam};
    int64_t rows = v == 0 ? j->n : v == 2 ? j->n : j->m;
    int dim = v == 0 || v == 1 ? j->D : v == 2 ? 1 : j->Dw;
    void *res = calloc((size_t)(rows * dim + 1), 8);
    run(g, j, ga, res);
    want[0] = 0;
    for (int64_t i = 0; i < rows * dim; i++) {
        if (v == 2)
            want[0] += tu_get(res, dt, i);
        else
            want[i] = tu_get(res, dt, i);
    }
    free(res), free(out), free(lam);
    sr_kernel_free(g), sr_kernel_free(lse), sr_kernel_free(f);
}

/* lse (sr_kernel_run_lse's, the job's dtype) against a LogSumExp kernel of F on the reference
 * backend in float64 from the float64 copies; NaN where it is NaN. */
static void check_lse(const struct job *j, const struct arrays *x, const void *lse)
{
    sr_kernel *ref = make(j, SR_LOGSUMEXP, SR_F64, SR_DEVICE_REFERENCE);
    double *want = calloc((size_t)j->n + 1, 8);
    const void *a[NV] = {x->d[0], x->d[1], x->d[2], x->d[3]};
    run(ref, j, a, want);
    const double tol = j->dt == SR_F64 ? 1e-12 : 1e-5;
    for (int64_t i = 0; i < j->n; i++)
        cr_assert(tu_close(tu_get(lse, j->dt, i), want[i], tol, tol),
                  "n %lld m %lld D %d Dw %d %s axis %d: sr_kernel_run_lse's lse[%lld] = %.10g, "
                  "LogSumExp gives %.10g",
                  (long long)j->n, (long long)j->m, j->D, j->Dw, j->dt == SR_F64 ? "f64" : "f32",
                  j->ax0 ? 0 : 1, (long long)i, tu_get(lse, j->dt, i), want[i]);
    free(want);
    sr_kernel_free(ref);
}

/* Runs the job: the forward on the CPU JIT in its dtype, then sr_kernel_vjp for the variables
 * of mask (bit v), each compared with its gradient kernel's values. */
static void check_vs(const struct job *j, unsigned mask, bool native)
{
    uint64_t seed = 0x5eed + (uint64_t)(j->n * 31 + j->m * 7 + j->D * 3 + j->Dw);
    struct arrays x;
    fill(j, &x, &seed);
    sr_kernel *k = make(j, SR_SUMSOFTMAXWEIGHT, j->dt, SR_DEVICE_CPU);
    const size_t es = esize(j->dt);
    void *out = calloc((size_t)(j->n * j->Dw + 1), es), *G = calloc((size_t)(j->n * j->Dw + 1), es);
    tu_fill(G, j->dt, j->n * j->Dw, -1, 1, &seed);
    double *Gd = calloc((size_t)(j->n * j->Dw + 1), 8);
    for (int64_t i = 0; i < j->n * j->Dw; i++)
        Gd[i] = tu_get(G, j->dt, i);
    const void *args[NV] = {x.a[0], x.a[1], x.a[2], x.a[3]};
    run(k, j, args, out);
    const int64_t glen[NV] = {x.len[0], x.len[1], 1, x.len[3]};
    const double rtol = j->dt == SR_F64 ? 1e-10 : 2e-4;
    /* The log-normalizer formed by sr_kernel_vjp (lse NULL), then the values and log-normalizer
     * of sr_kernel_run_lse: its values as the kernel's, and the same gradients. */
    void *out2 = calloc((size_t)(j->n * j->Dw + 1), es), *lse = calloc((size_t)j->n + 1, es);
    sr_run_desc r = job_run(k, j, args, out2);
    cr_assert_eq(sr_kernel_run_lse(k, &r, lse), SR_OK, "%s", sr_ctx_error(ctx));
    /* On the fused two-product strategy the kernel's own plan: the same values, bit for bit. */
    const bool same = tu_runs_fused(k);
    for (int64_t i = 0; i < j->n * j->Dw; i++)
        cr_assert(
            same ? memcmp((char *)out2 + i * (int64_t)es, (char *)out + i * (int64_t)es, es) == 0
                 : tu_close(tu_get(out2, j->dt, i), tu_get(out, j->dt, i), rtol, rtol),
            "sr_kernel_run_lse's value [%lld] = %.10g, the kernel's %.10g", (long long)i,
            tu_get(out2, j->dt, i), tu_get(out, j->dt, i));
    check_lse(j, &x, lse);
    for (int pass = 0; pass < 2; pass++) {
        void *grads[NV] = {0};
        for (int v = 0; v < NV; v++)
            if (mask >> v & 1) {
                grads[v] = malloc(es * (size_t)glen[v] + 1);
                memset(grads[v], 0x7f, es * (size_t)glen[v] + 1); /* overwritten, zeros too */
            }
        cr_assert_eq(sr_kernel_vjp(k, &r, G, pass ? out2 : out, pass ? lse : NULL, grads), SR_OK,
                     "%s", sr_ctx_error(ctx));
        for (int v = 0; v < NV; v++) {
            if (!grads[v])
                continue;
            double *want = calloc((size_t)glen[v] + 1, 8), big = 0;
            expected(j, &x, native ? G : (const void *)Gd, v, want, native);
            for (int64_t i = 0; i < glen[v]; i++)
                big = isfinite(want[i]) && fabs(want[i]) > big ? fabs(want[i]) : big;
            for (int64_t i = 0; i < glen[v]; i++) {
                double got = tu_get(grads[v], j->dt, i);
                cr_assert(tu_close(got, want[i], rtol, rtol * (big > 1 ? big : 1)),
                          "%s s = %g, n %lld m %lld D %d Dw %d %s, lse %s: variable %d [%lld] = "
                          "%.10g, the gradient kernel gives %.10g",
                          j->f, j->scale, (long long)j->n, (long long)j->m, j->D, j->Dw,
                          j->dt == SR_F64 ? "f64" : "f32", pass ? "given" : "formed", v,
                          (long long)i, got, want[i]);
            }
            free(want), free(grads[v]);
        }
    }
    free(out2), free(lse);
    sr_kernel_free(k);
    free(out), free(G), free(Gd);
    release(&x);
}

static void check(const struct job *j, unsigned mask) { check_vs(j, mask, false); }

/* Every gradient of (q|k)*s with weight v for sizes[ns] x dims[nd], float32 and float64. */
static void sweep(const int64_t (*sizes)[2], size_t ns, const int (*dims)[2], size_t nd, bool ax0)
{
    for (int dt = 0; dt < 2; dt++)
        for (size_t s = 0; s < ns; s++)
            for (size_t d = 0; d < nd; d++) {
                struct job j = {"(q|k)*s",
                                "v",
                                sizes[s][0],
                                sizes[s][1],
                                dims[d][0],
                                dims[d][1],
                                dt ? SR_F64 : SR_F32,
                                0.3,
                                -1,
                                -1,
                                ax0};
                check(&j, 0xf);
            }
}

Test(vjp, sizes_dims_widths_dtypes)
{
    const int64_t sizes[][2] = {{1, 1}, {13, 7}, {131, 97}, {97, 300}};
    /* (512, 1): the first pass's tiles are larger than the second's before its copy of dx */
    const int dims[][2] = {{1, 1}, {17, 16}, {64, 65}, {64, 16}, {512, 1}};
    sweep(sizes, sizeof sizes / sizeof *sizes, dims, sizeof dims / sizeof *dims, false);
}

Test(vjp, axis_0)
{
    /* out_j = sum_i softmax_i((q_j|k_i) s) v_i: the same passes with i and j exchanged */
    const int64_t sizes[][2] = {{1, 1}, {13, 7}, {97, 300}};
    const int dims[][2] = {{1, 1}, {17, 16}, {64, 65}};
    sweep(sizes, sizeof sizes / sizeof *sizes, dims, sizeof dims / sizeof *dims, true);
    for (int dt = 0; dt < 2; dt++) {
        struct job j = {"(k|q)", "v", 50, 41, 17, 5, dt ? SR_F64 : SR_F32, 1, -1, -1, true};
        check(&j, 0xb);
        struct job nan = {"(q|k)*s", "v", 29, 37, 17, 16, dt ? SR_F64 : SR_F32, 0.5, 3, -1, true};
        check(&nan, 0xf);
    }
}

Test(vjp, forms_of_f_and_subsets)
{
    const char *forms[] = {"(q|k)*s", "s*(q|k)",     "(k|q)*s",
                           "(q|k)",   "(q|k)*0.125", "IntCst(2)*(q|k)"};
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++)
        for (int dt = 0; dt < 2; dt++) {
            struct job j = {forms[f], "v", 50, 41, 17, 5, dt ? SR_F64 : SR_F32, 0.7, -1, -1, false};
            bool has_s = strstr(forms[f], "*s") || strstr(forms[f], "s*");
            check(&j, has_s ? 0xf : 0xb);
            check(&j, 0x1); /* dq alone */
            check(&j, 0xa); /* dk and dv */
            if (has_s)
                check(&j, 0x4); /* ds alone */
        }
}

Test(vjp, empty_sizes_write_zeros)
{
    for (int dt = 0; dt < 2; dt++)
        for (int c = 0; c < 2; c++) {
            struct job j = {"(q|k)*s", "v", c ? 0 : 5, c ? 6 : 0, 3, 2, dt ? SR_F64 : SR_F32,
                            1.0,       -1,  -1,        false};
            struct arrays x;
            uint64_t seed = 1;
            fill(&j, &x, &seed);
            sr_kernel *k = make(&j, SR_SUMSOFTMAXWEIGHT, j.dt, SR_DEVICE_CPU);
            double G[16] = {0}, out[16] = {0}, gq[32], gk[32], gs[2], gv[32];
            memset(gq, 0x7f, sizeof gq), memset(gk, 0x7f, sizeof gk);
            memset(gs, 0x7f, sizeof gs), memset(gv, 0x7f, sizeof gv);
            void *grads[NV] = {gq, gk, gs, gv};
            const void *args[NV] = {x.a[0], x.a[1], x.a[2], x.a[3]};
            sr_run_desc r = {.nx = j.n, .ny = j.m, .nargs = NV, .args = args};
            cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, grads), SR_OK, "%s", sr_ctx_error(ctx));
            for (int64_t i = 0; i < j.n * j.D; i++)
                cr_assert_eq(tu_get(gq, j.dt, i), 0.0);
            for (int64_t i = 0; i < j.m * j.D; i++)
                cr_assert_eq(tu_get(gk, j.dt, i), 0.0);
            for (int64_t i = 0; i < j.m * j.Dw; i++)
                cr_assert_eq(tu_get(gv, j.dt, i), 0.0);
            cr_assert_eq(tu_get(gs, j.dt, 0), 0.0);
            double lse[8];
            r.out = out;
            cr_assert_eq(sr_kernel_run_lse(k, &r, lse), SR_OK, "%s", sr_ctx_error(ctx));
            for (int64_t i = 0; i < j.n; i++) {
                cr_assert_eq(tu_get(lse, j.dt, i), -INFINITY); /* no pairs */
                for (int t = 0; t < j.Dw; t++)
                    cr_assert_eq(tu_get(out, j.dt, i * j.Dw + t), 0.0);
            }
            sr_kernel_free(k);
            release(&x);
        }
}

Test(vjp, nan_and_infinity_as_the_gradient_kernels)
{
    for (int dt = 0; dt < 2; dt++) {
        struct job j = {"(q|k)*s", "v", 29, 37, 17, 16, dt ? SR_F64 : SR_F32, 0.5, 3, -1, false};
        check(&j, 0xf); /* NaN in row 3 of q: NaN where the gradient kernels have NaN */
        struct job inf = {"(q|k)*s", "v", 29, 37, 17, 16, dt ? SR_F64 : SR_F32, 0.5, -1, 4, false};
        check_vs(&inf, 0xf, true); /* +inf in v: infinities and NaN where theirs are */
    }
}

Test(vjp, declines_other_kernels)
{
    struct job j = {"(q|k)*s", "v", 4, 5, 3, 2, SR_F32, 1.0, -1, -1, false};
    struct arrays x;
    uint64_t seed = 2;
    fill(&j, &x, &seed);
    const void *args[NV] = {x.a[0], x.a[1], x.a[2], x.a[3]};
    float G[16] = {0}, out[16] = {0}, gq[16];
    void *grads[NV] = {gq, NULL, NULL, NULL};
    sr_run_desc r = {.nx = 4, .ny = 5, .nargs = NV, .args = args};
    const struct {
        const char *f, *w;
        sr_reduction red;
        sr_device dev;
        const char *why;
    } no[] = {
        {"(q|k)*s", "v", SR_LOGSUMEXP, SR_DEVICE_CPU, "SumSoftMaxWeight"},
        {"(q|k)*s", "k", SR_SUMSOFTMAXWEIGHT, SR_DEVICE_CPU, "the weight is the variable y"},
        {"-SqDist(q,k)*s", "v", SR_SUMSOFTMAXWEIGHT, SR_DEVICE_CPU, "no fused backward"},
        {"(q|k)*s*s", "v", SR_SUMSOFTMAXWEIGHT, SR_DEVICE_CPU, "scalar parameter or constant"},
        {"(q|k)*s", "v", SR_SUMSOFTMAXWEIGHT, SR_DEVICE_REFERENCE, "reference"},
    };
    for (size_t c = 0; c < sizeof no / sizeof *no; c++) {
        struct job jc = j;
        jc.f = no[c].f, jc.w = no[c].w;
        sr_kernel *k = make(&jc, no[c].red, SR_F32, no[c].dev);
        r.nargs = sr_kernel_nargs(k);
        cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, grads), SR_ENOTSUP, "%s: %s", no[c].f,
                     sr_ctx_error(ctx));
        cr_assert(strstr(sr_ctx_error(ctx), no[c].why), "%s: %s", no[c].f, sr_ctx_error(ctx));
        float lse[8];
        r.out = out;
        cr_assert_eq(sr_kernel_run_lse(k, &r, lse), SR_ENOTSUP, "%s", no[c].f);
        r.out = NULL;
        sr_kernel_free(k);
    }
    /* axis 0: the weight must be of the reduced side (Vi), other than the inner product's */
    const struct {
        const char *w, *why;
    } ax0[] = {{"q", "the weight is the variable y"}, {"k", "the weight is not a Vi variable"}};
    for (size_t c = 0; c < sizeof ax0 / sizeof *ax0; c++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = SR_SUMSOFTMAXWEIGHT;
        d.axis = 0;
        d.weight = parse(&j, ax0[c].w);
        sr_kernel *k;
        cr_assert_eq(sr_kernel_new(ctx, parse(&j, "(q|k)*s"), &d, &k), SR_OK, "%s",
                     sr_ctx_error(ctx));
        r.nargs = sr_kernel_nargs(k);
        cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, grads), SR_ENOTSUP);
        cr_assert(strstr(sr_ctx_error(ctx), ax0[c].why), "%s", sr_ctx_error(ctx));
        sr_kernel_free(k);
    }
    release(&x);
}

Test(vjp, budget_and_argument_errors)
{
    struct job j = {"(q|k)*s", "v", 300, 20, 64, 4, SR_F32, 1.0, -1, -1, false};
    struct arrays x;
    const void *args[NV];
    sr_kernel *k = fixture(&j, 3, &x, args);
    float *G = calloc(300 * 4, 4), *out = calloc(300 * 4, 4), *gq = calloc(300 * 64, 4);
    void *grads[NV] = {gq, NULL, NULL, NULL};
    sr_run_desc r = {.nx = 300, .ny = 20, .nargs = NV, .args = args};
    /* a thread's copy of dq alone is 300 x 64 x 4 bytes */
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 50000), SR_OK);
    cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, grads), SR_EBUDGET);
    cr_assert(strstr(sr_ctx_error(ctx), "memory budget"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, grads), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_vjp(NULL, &r, G, out, NULL, grads), SR_EINVAL);
    cr_assert_eq(sr_kernel_vjp(k, NULL, G, out, NULL, grads), SR_EINVAL);
    cr_assert_eq(sr_kernel_vjp(k, &r, G, out, NULL, NULL), SR_EINVAL);
    cr_assert_eq(sr_kernel_vjp(k, &r, NULL, out, NULL, grads), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "gout"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_vjp(k, &r, G, NULL, NULL, grads), SR_EINVAL);
    r.out = out;
    cr_assert_eq(sr_kernel_run_lse(k, &r, NULL), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "lse"), "%s", sr_ctx_error(ctx));
    sr_run_desc bad = r;
    bad.nargs = 3;
    cr_assert_eq(sr_kernel_vjp(k, &bad, G, out, NULL, grads), SR_EINVAL);
    bad = r;
    bad.nx = -1;
    cr_assert_eq(sr_kernel_vjp(k, &bad, G, out, NULL, grads), SR_EINVAL);
    const void *missing[NV] = {x.a[0], NULL, x.a[2], x.a[3]};
    bad = r;
    bad.args = missing;
    cr_assert_eq(sr_kernel_vjp(k, &bad, G, out, NULL, grads), SR_EINVAL);
    sr_kernel_free(k);
    free(G), free(out), free(gq);
    release(&x);
}

/* ---- block-sparse ranges ---- */

enum { MAXB = 40 };

/* A block pattern of job j: the n output rows in blocks of bo rows, the m reduced rows in
 * blocks of br, pairs where keep(a, b) for output block a and reduced block b. Output block 1
 * has no pair (listed with no interval) and block 2 is in no range (a gap): both uncovered. The
 * triple of the output side (blocks of output rows, reduced intervals) and its transpose. */
struct pattern {
    int64_t ob[2 * MAXB], os[MAXB], oi[2 * MAXB * MAXB], no, noi;
    int64_t rb[2 * MAXB], rs[MAXB], ri[2 * MAXB * MAXB], nr, nri;
    sr_ranges R;
};

static bool keep(int64_t a, int64_t b) { return a != 1 && a != 2 && (a * 7 + b * 3) % 5 < 3; }

/* Block a of size b of [0, n) into d[0], d[1]. */
static void span(int64_t a, int64_t b, int64_t n, int64_t *d)
{
    d[0] = a * b, d[1] = a * b + b < n ? a * b + b : n;
}

/* The triple of one side (n rows in blocks of bn) against the other (m rows in blocks of bm):
 * blocks, slices, intervals and their counts; out: the output side (else keep transposed). */
static void triple(int64_t n, int64_t bn, int64_t m, int64_t bm, bool out, int64_t *blk,
                   int64_t *sl, int64_t *iv, int64_t *nblk, int64_t *niv)
{
    for (int64_t a = 0; a < (n + bn - 1) / bn; a++) {
        if (out && a == 2)
            continue;
        span(a, bn, n, blk + 2 * *nblk);
        for (int64_t b = 0; b < (m + bm - 1) / bm; b++)
            if (out ? keep(a, b) : keep(b, a))
                span(b, bm, m, iv + 2 * (*niv)++);
        sl[(*nblk)++] = *niv;
    }
}

static void make_pattern(const struct job *j, int64_t bo, int64_t br, struct pattern *p)
{
    memset(p, 0, sizeof *p);
    cr_assert((j->n + bo - 1) / bo <= MAXB && (j->m + br - 1) / br <= MAXB);
    triple(j->n, bo, j->m, br, true, p->ob, p->os, p->oi, &p->no, &p->noi);
    triple(j->m, br, j->n, bo, false, p->rb, p->rs, p->ri, &p->nr, &p->nri);
    sr_ranges out = {p->no, p->ob, p->os, p->noi, p->oi, p->nr, p->rb, p->rs, p->nri, p->ri};
    sr_ranges red = {p->nr, p->rb, p->rs, p->nri, p->ri, p->no, p->ob, p->os, p->noi, p->oi};
    p->R = j->ax0 ? red : out; /* axis 0: the output side is j's, read from ranges_j */
}

/* Runs k on job j's arrays with ranges R. */
static void run_ranges(const sr_kernel *k, const struct job *j, const void *const *args, void *out,
                       const sr_ranges *R)
{
    sr_run_desc r = job_run(k, j, args, out);
    cr_assert_eq(sr_kernel_run_ranges(k, &r, R), SR_OK, "%s", sr_ctx_error(ctx));
}

/* sr_kernel_run_lse_ranges and sr_kernel_vjp_ranges (every variable, lse formed and given)
 * against the forward and the gradient kernels on the reference backend in float64, all with
 * the ranges of make_pattern(j, bo, br). */
static void check_ranges(const struct job *j, int64_t bo, int64_t br)
{
    struct pattern *p = malloc(sizeof *p);
    make_pattern(j, bo, br, p);
    uint64_t seed = 0x7a6e + (uint64_t)(j->n * 31 + j->m * 7 + bo * 3 + br);
    struct arrays x;
    fill(j, &x, &seed);
    const size_t es = esize(j->dt);
    const int64_t no = j->n * j->Dw;
    sr_kernel *k = make(j, SR_SUMSOFTMAXWEIGHT, j->dt, SR_DEVICE_CPU);
    sr_kernel *f = make(j, SR_SUMSOFTMAXWEIGHT, SR_F64, SR_DEVICE_REFERENCE);
    sr_kernel *lk = make(j, SR_LOGSUMEXP, SR_F64, SR_DEVICE_REFERENCE);
    void *G = calloc((size_t)no + 1, es), *out = calloc((size_t)no + 1, es);
    void *lse = calloc((size_t)j->n + 1, es);
    double *Gd = calloc((size_t)no + 1, 8), *outd = calloc((size_t)no + 1, 8);
    double *lamd = calloc((size_t)j->n + 1, 8);
    tu_fill(G, j->dt, no, -1, 1, &seed);
    for (int64_t i = 0; i < no; i++)
        Gd[i] = tu_get(G, j->dt, i);
    const void *args[NV] = {x.a[0], x.a[1], x.a[2], x.a[3]};
    const void *argd[NV] = {x.d[0], x.d[1], x.d[2], x.d[3]};
    run_ranges(f, j, argd, outd, &p->R);
    run_ranges(lk, j, argd, lamd, &p->R);
    sr_run_desc r = job_run(k, j, args, out);
    cr_assert_eq(sr_kernel_run_lse_ranges(k, &r, &p->R, lse), SR_OK, "%s", sr_ctx_error(ctx));
    const double rtol = j->dt == SR_F64 ? 1e-10 : 2e-4;
    /* On the fused two-product strategy, the kernel's own values with the ranges, bit for bit. */
    if (tu_runs_fused(k)) {
        void *own = calloc((size_t)no + 1, es);
        run_ranges(k, j, args, own, &p->R);
        cr_assert(memcmp(own, out, es * (size_t)no) == 0,
                  "n %lld m %lld blocks %lld x %lld: sr_kernel_run_lse_ranges's values are not "
                  "sr_kernel_run_ranges's",
                  (long long)j->n, (long long)j->m, (long long)bo, (long long)br);
        free(own);
    }
    for (int64_t i = 0; i < no; i++)
        cr_assert(tu_close(tu_get(out, j->dt, i), outd[i], rtol, rtol),
                  "n %lld m %lld blocks %lld x %lld: value [%lld] = %.10g, the reference's %.10g",
                  (long long)j->n, (long long)j->m, (long long)bo, (long long)br, (long long)i,
                  tu_get(out, j->dt, i), outd[i]);
    for (int64_t i = 0; i < j->n; i++)
        cr_assert(tu_close(tu_get(lse, j->dt, i), lamd[i], rtol, rtol),
                  "lse [%lld] = %.10g, the LogSumExp kernel's %.10g", (long long)i,
                  tu_get(lse, j->dt, i), lamd[i]);
    const int64_t glen[NV] = {x.len[0], x.len[1], 1, x.len[3]};
    for (int pass = 0; pass < 2; pass++) {
        void *grads[NV];
        for (int v = 0; v < NV; v++) {
            grads[v] = malloc(es * (size_t)glen[v] + 1);
            memset(grads[v], 0x7f, es * (size_t)glen[v] + 1); /* overwritten, zeros too */
        }
        cr_assert_eq(sr_kernel_vjp_ranges(k, &r, &p->R, G, out, pass ? lse : NULL, grads), SR_OK,
                     "%s", sr_ctx_error(ctx));
        for (int v = 0; v < NV; v++) {
            sr_kernel *g;
            cr_assert_eq(sr_kernel_grad(f, v, &g), SR_OK, "%s", sr_ctx_error(ctx));
            const void *ga[NV + 3] = {x.d[0], x.d[1], x.d[2], x.d[3], Gd, outd, lamd};
            const int64_t rows = v == 1 || v == 3 ? j->m : j->n;
            const int dim = v == 0 || v == 1 ? j->D : v == 2 ? 1 : j->Dw;
            double *res = calloc((size_t)(rows * dim) + 1, 8), want0 = 0, big = 0;
            run_ranges(g, j, ga, res, &p->R);
            for (int64_t i = 0; v == 2 && i < rows; i++)
                want0 += res[i];
            const double *want = v == 2 ? &want0 : res;
            for (int64_t i = 0; i < glen[v]; i++)
                big = fabs(want[i]) > big ? fabs(want[i]) : big;
            for (int64_t i = 0; i < glen[v]; i++) {
                double got = tu_get(grads[v], j->dt, i);
                cr_assert(tu_close(got, want[i], rtol, rtol * (big > 1 ? big : 1)),
                          "n %lld m %lld D %d Dw %d %s axis %d blocks %lld x %lld, lse %s: "
                          "variable %d [%lld] = %.10g, the gradient kernel gives %.10g",
                          (long long)j->n, (long long)j->m, j->D, j->Dw,
                          j->dt == SR_F64 ? "f64" : "f32", j->ax0 ? 0 : 1, (long long)bo,
                          (long long)br, pass ? "given" : "formed", v, (long long)i, got, want[i]);
            }
            free(res), free(grads[v]);
            sr_kernel_free(g);
        }
    }
    sr_kernel_free(k), sr_kernel_free(f), sr_kernel_free(lk);
    free(G), free(out), free(lse), free(Gd), free(outd), free(lamd), free(p);
    release(&x);
}

Test(vjp, block_sparse_ranges)
{
    /* n, m, D, Dw, output and reduced block sizes: one pair; primes; blocks across the tiles of
     * both passes (96 and 192 rows, 128 and 512 reduced indices) and intervals that do not
     * cover a tile */
    const int64_t cases[][6] = {{1, 1, 1, 1, 1, 1},
                                {13, 7, 3, 2, 2, 3},
                                {131, 97, 17, 16, 13, 11},
                                {200, 300, 64, 65, 97, 37},
                                {250, 700, 8, 5, 100, 150}};
    for (int ax = 0; ax < 2; ax++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
                struct job j = {"(q|k)*s",
                                "v",
                                cases[c][0],
                                cases[c][1],
                                (int)cases[c][2],
                                (int)cases[c][3],
                                dt ? SR_F64 : SR_F32,
                                0.3,
                                -1,
                                -1,
                                ax == 1};
                check_ranges(&j, cases[c][4], cases[c][5]);
            }
}

Test(vjp, ranges_empty_and_errors)
{
    struct job j = {"(q|k)*s", "v", 6, 5, 3, 2, SR_F32, 1.0, -1, -1, false};
    struct arrays x;
    const void *args[NV];
    sr_kernel *k = fixture(&j, 4, &x, args);
    float G[12] = {0}, out[12], lse[6], gq[18], gk[15], gs[1], gv[10];
    void *grads[NV] = {gq, gk, gs, gv};
    sr_run_desc r = {.nx = 6, .ny = 5, .nargs = NV, .args = args, .out = out};
    /* no block: every row uncovered, the values of sr_kernel_run_ranges, every gradient 0 */
    sr_ranges none = {0};
    cr_assert_eq(sr_kernel_run_lse_ranges(k, &r, &none, lse), SR_OK, "%s", sr_ctx_error(ctx));
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(lse[i], -INFINITY);
        cr_assert(isnan(out[2 * i]) && isnan(out[2 * i + 1]));
    }
    memset(gq, 0x7f, sizeof gq), memset(gk, 0x7f, sizeof gk);
    memset(gs, 0x7f, sizeof gs), memset(gv, 0x7f, sizeof gv);
    cr_assert_eq(sr_kernel_vjp_ranges(k, &r, &none, G, out, NULL, grads), SR_OK, "%s",
                 sr_ctx_error(ctx));
    for (int i = 0; i < 18; i++)
        cr_assert_eq(gq[i], 0.0f);
    for (int i = 0; i < 15; i++)
        cr_assert_eq(gk[i], 0.0f);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(gv[i], 0.0f);
    cr_assert_eq(gs[0], 0.0f);
    /* bad ranges: the message of sr_kernel_run_ranges */
    const int64_t ri[] = {0, 7}, si[] = {1}, rj[] = {0, 5};
    sr_ranges bad = {1, ri, si, 1, rj, 0, NULL, NULL, 0, NULL};
    cr_assert_eq(sr_kernel_vjp_ranges(k, &r, &bad, G, out, NULL, grads), SR_EINVAL);
    cr_assert(strstr(sr_ctx_error(ctx), "ranges_i[0]"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_lse_ranges(k, &r, &bad, lse), SR_EINVAL);
    /* one block per row: the block lists (16 bytes per block and tile) count against the budget */
    int64_t rows[12], sl[6];
    for (int i = 0; i < 6; i++)
        rows[2 * i] = i, rows[2 * i + 1] = i + 1, sl[i] = i + 1;
    const int64_t alls[12] = {0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5};
    sr_ranges each = {6, rows, sl, 6, alls, 0, NULL, NULL, 0, NULL};
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 200), SR_OK);
    cr_assert_eq(sr_kernel_vjp_ranges(k, &r, &each, G, out, NULL, grads), SR_EBUDGET);
    cr_assert(strstr(sr_ctx_error(ctx), "block lists"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_lse_ranges(k, &r, &each, lse), SR_EBUDGET);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    cr_assert_eq(sr_kernel_run_lse_ranges(k, &r, &each, lse), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_vjp_ranges(k, &r, &each, G, out, lse, grads), SR_OK, "%s",
                 sr_ctx_error(ctx));
    /* the reference backend has no fused backward, with or without ranges */
    sr_kernel *ref = make(&j, SR_SUMSOFTMAXWEIGHT, SR_F32, SR_DEVICE_REFERENCE);
    cr_assert_eq(sr_kernel_vjp_ranges(ref, &r, &none, G, out, NULL, grads), SR_ENOTSUP);
    sr_kernel_free(ref);
    sr_kernel_free(k);
    release(&x);
}
