/*
 * chain.c — sr_chain: products of kernel matrices and dense matrices, such as K1·K2·V·W,
 * evaluated in the cheapest order found by matrix-chain dynamic programming, each kernel matrix
 * applied through a Sum reduction and never materialised.
 *
 * A kernel factor K (nx × ny, K_ij = f(x_i, y_j)) can only be multiplied by a dense operand:
 * K·B is Sum_j f(x_i, y_j)·B_j (the formula f·Var(nargs, cols B, Vj), axis 1) and D·K is the
 * transpose of Sum_i f(x_i, y_j)·(Dᵀ)_i (the formula f·Var(nargs, rows D, Vi), axis 0). Every
 * product of two or more factors is a dense intermediate. The DP charges a kernel application
 * nx·ny·(flops per pair of f + 2 per column of the dense side) and a dense product 2·a·b·c, and
 * forbids multiplying two bare kernel factors (that would materialise one of them).
 */
#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct chain_factor {
    bool kernel;
    int64_t rows, cols;
    /* kernel */
    const sr_expr *f;
    int nargs;
    const void **args;
    double pair_flops;
    /* dense */
    const void *data;
};

struct sr_chain {
    sr_ctx *ctx;
    sr_dtype dtype;
    struct chain_factor *fs;
    int n, cap;
    double *cost; /* [n*n]: best cost of the product of factors i..j */
    int *split;   /* [n*n]: its last multiplication is (i..split)(split+1..j) */
    bool planned;
    char *explain;
    char *order; /* the order alone, as in explain */
};

sr_status sr_chain_new(sr_ctx *ctx, sr_dtype dtype, sr_chain **out)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return SR_EINVAL;
    if (!out)
        return sr__error(ctx, SR_EINVAL, "sr_chain_new: out is NULL");
    if ((int)dtype < 0 || dtype > SR_BF16)
        return sr__error(ctx, SR_EINVAL,
                         "sr_chain_new: dtype must be SR_F32, SR_F64, SR_F16 or SR_BF16, not %d",
                         (int)dtype);
    sr_chain *c = calloc(1, sizeof *c);
    if (!c)
        return sr__error(ctx, SR_ENOMEM, "sr_chain_new: out of memory");
    c->ctx = ctx;
    c->dtype = dtype;
    *out = c;
    return SR_OK;
}

void sr_chain_free(sr_chain *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        free(c->fs[i].args);
    free(c->fs);
    free(c->cost);
    free(c->split);
    free(c->explain);
    free(c->order);
    free(c);
}

static sr_status push(sr_chain *c, struct chain_factor *f)
{
    if (c->n > 0 && c->fs[c->n - 1].cols != f->rows)
        return sr__error(c->ctx, SR_EDIM,
                         "sr_chain: factor %d has %lld rows, but the factor before it has %lld "
                         "columns",
                         c->n + 1, (long long)f->rows, (long long)c->fs[c->n - 1].cols);
    if (c->n == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 8;
        struct chain_factor *nf = realloc(c->fs, (size_t)ncap * sizeof *nf);
        if (!nf)
            return sr__error(c->ctx, SR_ENOMEM, "sr_chain: out of memory");
        c->fs = nf;
        c->cap = ncap;
    }
    c->fs[c->n++] = *f;
    c->planned = false;
    return SR_OK;
}

sr_status sr_chain_kernel(sr_chain *c, const sr_expr *f, int64_t nx, int64_t ny, int nargs,
                          const void *const *args)
{
    if (!c)
        return SR_EINVAL;
    sr_ctx *ctx = c->ctx;
    if (!f)
        return sr__error(ctx, SR_EINVAL, "sr_chain_kernel: the formula is NULL");
    if (f->ctx != ctx)
        return sr__error(ctx, SR_EINVAL, "sr_chain_kernel: the formula belongs to another context");
    if (f->dim != 1)
        return sr__error(
            ctx, SR_EDIM,
            "sr_chain_kernel: a kernel matrix needs a scalar formula, not dimension %d", f->dim);
    if (nx < 1 || ny < 1)
        return sr__error(ctx, SR_EINVAL, "sr_chain_kernel: sizes must be >= 1 (nx %lld, ny %lld)",
                         (long long)nx, (long long)ny);
    struct expr_var *vars = NULL;
    int nv = 0;
    sr_status st = expr_collect_vars(ctx, &f, 1, &vars, &nv);
    if (st != SR_OK)
        return st;
    free(vars);
    if (nargs != nv)
        return sr__error(ctx, SR_EINVAL, "sr_chain_kernel: the formula takes %d arrays, %d given",
                         nv, nargs);
    if (nargs > 0 && !args)
        return sr__error(ctx, SR_EINVAL, "sr_chain_kernel: args is NULL");
    struct chain_factor cf = {.kernel = true, .rows = nx, .cols = ny, .f = f, .nargs = nargs};
    cf.args = malloc(((size_t)nargs + 1) * sizeof *cf.args);
    if (!cf.args)
        return sr__error(ctx, SR_ENOMEM, "sr_chain: out of memory");
    for (int v = 0; v < nargs; v++)
        cf.args[v] = args[v];
    /* Flops per pair of f as the simplifier will run it. */
    sr_expr *fs = (sr_expr *)f;
    if (ctx->env_status != SR_OK) {
        free(cf.args);
        return sr__error(ctx, ctx->env_status, "%s", ctx->env_msg);
    }
    if (ctx->opt.simplify)
        simp_expr(ctx, (sr_expr *)f, NULL, &fs, NULL);
    struct sr_cost cost;
    const sr_expr *roots[1] = {fs};
    simp_cost_estimate(roots, 1, DEP_J, sr_dtype_size(c->dtype), true, &cost);
    cf.pair_flops = cost.flops_pair > 1 ? cost.flops_pair : 1;
    st = push(c, &cf);
    if (st != SR_OK)
        free(cf.args);
    return st;
}

sr_status sr_chain_dense(sr_chain *c, int64_t rows, int64_t cols, const void *a)
{
    if (!c)
        return SR_EINVAL;
    if (rows < 1 || cols < 1 || !a)
        return sr__error(c->ctx, SR_EINVAL,
                         "sr_chain_dense: need rows, cols >= 1 and data (%lld x %lld, %s)",
                         (long long)rows, (long long)cols, a ? "data" : "NULL");
    int64_t bytes;
    if (!sr__size_mul(rows, cols, (int64_t)sr_dtype_size(c->dtype), &bytes))
        return sr__error(c->ctx, SR_EOVERFLOW,
                         "sr_chain_dense: a %lld x %lld matrix overflows the address space",
                         (long long)rows, (long long)cols);
    struct chain_factor cf = {.kernel = false, .rows = rows, .cols = cols, .data = a};
    return push(c, &cf);
}

/* ---- the plan ---- */

static bool bare_kernel(const sr_chain *c, int i, int j) { return i == j && c->fs[i].kernel; }

/* Cost of multiplying the products i..k and k+1..j (each already computed). */
static double combine_cost(const sr_chain *c, int i, int k, int j)
{
    bool lk = bare_kernel(c, i, k), rk = bare_kernel(c, k + 1, j);
    double rows = (double)c->fs[i].rows, mid = (double)c->fs[k].cols, cols = (double)c->fs[j].cols;
    if (lk && rk)
        return INFINITY;
    if (lk)
        return rows * mid * (c->fs[i].pair_flops + 2 * cols);
    if (rk)
        return mid * cols * (c->fs[j].pair_flops + 2 * rows);
    return 2 * rows * mid * cols;
}

static void order_text(const sr_chain *c, int i, int j, struct expr_buf *b)
{
    if (i == j) {
        expr_buf_printf(b, "%s%d", c->fs[i].kernel ? "K" : "M", i + 1);
        return;
    }
    int k = c->split[i * c->n + j];
    expr_buf_printf(b, "(");
    order_text(c, i, k, b);
    expr_buf_printf(b, "*");
    order_text(c, k + 1, j, b);
    expr_buf_printf(b, ")");
}

static sr_status plan(sr_chain *c)
{
    if (c->planned)
        return SR_OK;
    sr_ctx *ctx = c->ctx;
    int n = c->n;
    if (n == 0)
        return sr__error(ctx, SR_EINVAL, "sr_chain: the chain is empty");
    bool dense = false;
    for (int i = 0; i < n; i++)
        dense |= !c->fs[i].kernel;
    if (!dense)
        return sr__error(
            ctx, SR_EINVAL,
            "sr_chain: a chain of kernel matrices only would have to materialise one "
            "of them; add a dense factor (e.g. the vectors the product is applied to)");
    free(c->cost);
    free(c->split);
    c->cost = calloc((size_t)n * (size_t)n, sizeof *c->cost);
    c->split = calloc((size_t)n * (size_t)n, sizeof *c->split);
    if (!c->cost || !c->split)
        return sr__error(ctx, SR_ENOMEM, "sr_chain: out of memory");
    for (int len = 2; len <= n; len++)
        for (int i = 0; i + len - 1 < n; i++) {
            int j = i + len - 1;
            double best = INFINITY;
            int bs = i;
            for (int k = i; k < j; k++) {
                double t = c->cost[i * n + k] + c->cost[(k + 1) * n + j] + combine_cost(c, i, k, j);
                if (t < best) {
                    best = t;
                    bs = k;
                }
            }
            c->cost[i * n + j] = best;
            c->split[i * n + j] = bs;
        }
    struct expr_buf o = {0}, b = {0};
    order_text(c, 0, n - 1, &o);
    expr_buf_printf(&b, "chain of %d factors (", n);
    for (int i = 0; i < n; i++)
        expr_buf_printf(&b, "%s%s%d %lldx%lld", i ? ", " : "", c->fs[i].kernel ? "K" : "M", i + 1,
                        (long long)c->fs[i].rows, (long long)c->fs[i].cols);
    expr_buf_printf(&b, ")\norder: %s\nestimated cost: %.4g flop-equivalents\n",
                    o.data ? o.data : "", c->cost[n - 1]);
    if (b.oom || o.oom) {
        free(b.data);
        free(o.data);
        return sr__error(ctx, SR_ENOMEM, "sr_chain: out of memory");
    }
    free(c->explain);
    free(c->order);
    c->explain = b.data;
    c->order = o.data;
    c->planned = true;
    return SR_OK;
}

sr_status sr_chain_plan(sr_chain *c)
{
    if (!c)
        return SR_EINVAL;
    return plan(c);
}

const char *sr_chain_explain(const sr_chain *c)
{
    if (!c)
        return "";
    return c->planned && c->explain ? c->explain : "(not planned yet: call sr_chain_plan)";
}

/* The bytes of the first version of sr_chain_order_info. */
#define CHAIN_ORDER_V1 (offsetof(sr_chain_order_info, cost) + sizeof(double))

sr_status sr_chain_order(const sr_chain *c, sr_chain_order_info *info)
{
    if (!c)
        return SR_EINVAL;
    sr_status st = sr__sized_check(c->ctx, "sr_chain_order", "info", info, CHAIN_ORDER_V1,
                                   "sr_chain_order_info");
    if (st != SR_OK)
        return st;
    if (!c->planned)
        return sr__error(c->ctx, SR_EINVAL,
                         "sr_chain_order: the chain is not planned yet (call sr_chain_plan)");
    sr_chain_order_info r;
    memset(&r, 0, sizeof r);
    r.factors = c->n;
    for (int i = 0; i < c->n; i++)
        r.kernels += c->fs[i].kernel;
    r.order = c->order;
    r.split = c->n > 1 ? c->split[c->n - 1] + 1 : 0;
    r.cost = c->cost[c->n - 1];
    sr__sized_fill(info, &info->size, &r, &r.size, sizeof r);
    return SR_OK;
}

/* ---- evaluation ---- */

static double ld(const sr_chain *c, const void *a, int64_t t)
{
    return sr__dtype_get(c->dtype, a, t);
}

static void st(const sr_chain *c, void *a, int64_t t, double v)
{
    sr__dtype_put(c->dtype, a, t, v);
}

static void *alloc_mat(sr_chain *c, int64_t rows, int64_t cols)
{
    size_t esz = sr_dtype_size(c->dtype);
    int64_t bytes;
    if (!sr__size_mul(rows, cols, (int64_t)esz, &bytes)) {
        sr__error(c->ctx, SR_EOVERFLOW, "sr_chain: a %lld x %lld intermediate is too large",
                  (long long)rows, (long long)cols);
        return NULL;
    }
    void *m = malloc((size_t)bytes);
    if (!m)
        sr__error(c->ctx, SR_ENOMEM, "sr_chain: out of memory for a %lld x %lld intermediate",
                  (long long)rows, (long long)cols);
    return m;
}

/* K (factor kf) times the dense B (ny x cols), or D (rows x nx) times K when left; the result
 * goes to out (nx x cols, or rows x ny). */
static sr_status apply_kernel(sr_chain *c, const struct chain_factor *kf, const void *dense,
                              int64_t other, bool left, void *out)
{
    sr_ctx *ctx = c->ctx;
    sr_status s = SR_OK;
    void *tmp = NULL, *res = out;
    const void *side = dense;
    if (left) {
        /* Dᵀ (nx x rows) as a variable of i; the axis-0 result is (D K)ᵀ (ny x rows). */
        tmp = alloc_mat(c, kf->rows, other);
        res = alloc_mat(c, kf->cols, other);
        if (!tmp || !res) {
            free(tmp);
            if (res != out)
                free(res);
            return SR_ENOMEM;
        }
        for (int64_t r = 0; r < other; r++)
            for (int64_t q = 0; q < kf->rows; q++)
                st(c, tmp, q * other + r, ld(c, dense, r * kf->rows + q));
        side = tmp;
    }
    if (other > INT32_MAX) {
        s = sr__error(ctx, SR_EOVERFLOW, "sr_chain: %lld columns", (long long)other);
        goto done;
    }
    sr_expr *v = sr_var(ctx, kf->nargs, (int)other, left ? SR_CAT_I : SR_CAT_J);
    sr_expr *g = sr_mul(ctx, (sr_expr *)kf->f, v);
    if (!g) {
        s = expr_ctx(ctx)->err.pending != SR_OK ? expr_ctx(ctx)->err.pending : SR_ENOMEM;
        expr_ctx(ctx)->err.pending = SR_OK;
        goto done;
    }
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = c->dtype;
    d.axis = left ? 0 : 1;
    sr_kernel *k;
    s = sr_kernel_new(ctx, g, &d, &k);
    if (s != SR_OK)
        goto done;
    kf->args[kf->nargs] = side;
    sr_run_desc r = {
        .nx = kf->rows, .ny = kf->cols, .nargs = kf->nargs + 1, .args = kf->args, .out = res};
    s = sr_kernel_run_ex(k, &r);
    sr_kernel_free(k);
    if (s == SR_OK && left)
        for (int64_t q = 0; q < kf->cols; q++)
            for (int64_t rr = 0; rr < other; rr++)
                st(c, out, rr * kf->cols + q, ld(c, res, q * other + rr));
done:
    free(tmp);
    if (res != out)
        free(res);
    return s;
}

/* A dense product, accumulated in double (the dense factors are small next to the kernels). */
static sr_status dense_mul(sr_chain *c, const void *a, const void *b, int64_t m, int64_t k,
                           int64_t n, void *out)
{
    double *row = malloc((size_t)n * sizeof *row);
    if (!row)
        return sr__error(c->ctx, SR_ENOMEM, "sr_chain: out of memory");
    for (int64_t i = 0; i < m; i++) {
        memset(row, 0, (size_t)n * sizeof *row);
        for (int64_t q = 0; q < k; q++) {
            double aq = ld(c, a, i * k + q);
            for (int64_t j = 0; j < n; j++)
                row[j] += aq * ld(c, b, q * n + j);
        }
        for (int64_t j = 0; j < n; j++)
            st(c, out, i * n + j, row[j]);
    }
    free(row);
    return SR_OK;
}

/* The product of factors i..j into out (rows_i x cols_j); never called on a bare kernel. */
static sr_status eval(sr_chain *c, int i, int j, void *out)
{
    if (i == j) {
        size_t bytes = (size_t)(c->fs[i].rows * c->fs[i].cols) * sr_dtype_size(c->dtype);
        memcpy(out, c->fs[i].data, bytes);
        return SR_OK;
    }
    int n = c->n, k = c->split[i * n + j];
    bool lk = bare_kernel(c, i, k), rk = bare_kernel(c, k + 1, j);
    int64_t rows = c->fs[i].rows, mid = c->fs[k].cols, cols = c->fs[j].cols;
    void *L = NULL, *R = NULL;
    sr_status s = SR_OK;
    if (!lk) {
        L = alloc_mat(c, rows, mid);
        s = L ? eval(c, i, k, L) : SR_ENOMEM;
    }
    if (s == SR_OK && !rk) {
        R = alloc_mat(c, mid, cols);
        s = R ? eval(c, k + 1, j, R) : SR_ENOMEM;
    }
    if (s == SR_OK) {
        if (lk)
            s = apply_kernel(c, &c->fs[i], R, cols, false, out);
        else if (rk)
            s = apply_kernel(c, &c->fs[j], L, rows, true, out);
        else
            s = dense_mul(c, L, R, rows, mid, cols, out);
    }
    free(L);
    free(R);
    return s;
}

sr_status sr_chain_eval(sr_chain *c, void *out)
{
    if (!c)
        return SR_EINVAL;
    if (!out)
        return sr__error(c->ctx, SR_EINVAL, "sr_chain_eval: out is NULL");
    sr_status s = plan(c);
    if (s != SR_OK)
        return s;
    if (c->n == 1) /* one dense factor */
        return eval(c, 0, 0, out);
    return eval(c, 0, c->n - 1, out);
}
