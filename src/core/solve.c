/*
 * solve.c — sr_kernel_solve: (alpha I + K) a = b by conjugate gradients whose mat-vecs are
 * runs of a Sum kernel (pykeops' KernelSolve / ConjugateGradientSolver).
 *
 * The kernel computes out_i = sum_j F(x_i, x_j) * v_j for the variable v of index b_index; the
 * solver runs it with nx = ny = n and v = the CG direction. The n x dim(v) right-hand sides
 * are one CG vector (the operator is block diagonal over the columns), as in pykeops. CG's
 * vectors and scalars are kept in double whatever the dtype; only the kernel's argument and
 * output are converted. docs/solve.md has the decisions.
 */
#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sr_solve_desc sr_solve_desc_default(void)
{
    return (sr_solve_desc){
        .b_index = 0, .alpha = 0.0, .eps = 1e-6, .max_iter = 0, .check_symmetry = 1};
}

/* Everything one mat-vec needs: the kernel, its arguments with b replaced by the direction. */
struct matvec {
    const sr_kernel *k;
    int64_t n, len; /* rows; n * dim(b) values */
    double alpha;
    const void **args; /* [nargs]; args[b_index] points at buf */
    void *buf, *out;   /* kernel-dtype copies of the direction and of K times it */
};

static void to_dtype(sr_dtype t, const double *src, void *dst, int64_t len)
{
    for (int64_t i = 0; i < len; i++)
        sr__dtype_put(t, dst, i, src[i]);
}

static void from_dtype(sr_dtype t, const void *src, double *dst, int64_t len)
{
    for (int64_t i = 0; i < len; i++)
        dst[i] = sr__dtype_get(t, src, i);
}

/* y = (alpha I + K) x. */
static sr_status apply(struct matvec *m, const double *x, double *y)
{
    to_dtype(m->k->io, x, m->buf, m->len);
    sr_status st = sr_kernel_run(m->k, m->n, m->n, (const void *const *)m->args, m->out);
    if (st != SR_OK)
        return st;
    from_dtype(m->k->io, m->out, y, m->len);
    for (int64_t i = 0; i < m->len; i++)
        y[i] += m->alpha * x[i];
    return SR_OK;
}

static double dot(const double *a, const double *b, int64_t len)
{
    double s = 0;
    for (int64_t i = 0; i < len; i++)
        s += a[i] * b[i];
    return s;
}

static sr_status check_input(const sr_kernel *k, const sr_solve_desc *d, int64_t n,
                             const void *const *args, const void *rhs, const void *out)
{
    sr_ctx *ctx = k->ctx;
    if (!d || !rhs || !out || (k->nargs > 1 && !args))
        return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: desc, rhs, out or args is NULL");
    if (k->red != SR_SUM)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_solve: the kernel must be a Sum reduction, "
                         "not %s",
                         sr_reduction_name(k->red));
    if (k->weight)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: the kernel has a weight formula");
    sr_cat reduced = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    if (d->b_index < 0 || d->b_index >= k->nargs || k->vars[d->b_index].dim == 0 ||
        k->vars[d->b_index].cat != reduced)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_solve: b_index %d is not a variable of the reduced index "
                         "(%s) of the kernel, which takes %d arrays",
                         d->b_index, reduced == SR_CAT_J ? "Vj for axis 1" : "Vi for axis 0",
                         k->nargs);
    if (k->vars[d->b_index].dim != k->out_dim)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_solve: the kernel's output has dimension %d, variable %d "
                         "(b) has %d: the formula must be F(x_i, x_j) * b",
                         k->out_dim, d->b_index, k->vars[d->b_index].dim);
    if (!(d->alpha >= 0) || !isfinite(d->alpha))
        return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: alpha must be finite and >= 0, not %g",
                         d->alpha);
    if (!(d->eps > 0) || !isfinite(d->eps))
        return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: eps must be finite and > 0, not %g",
                         d->eps);
    if (d->max_iter < 0 || n < 0)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: negative max_iter (%d) or n (%lld)",
                         d->max_iter, (long long)n);
    for (int v = 0; v < k->nargs; v++)
        if (v != d->b_index && k->vars[v].dim != 0 && !args[v])
            return sr__error(ctx, SR_EINVAL, "sr_kernel_solve: args[%d] is NULL", v);
    return SR_OK;
}

/* A deterministic pseudo-random vector in [-1, 1). */
static void fill_random(double *x, int64_t len, uint64_t seed)
{
    for (int64_t i = 0; i < len; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (double)(seed >> 11) / 4503599627370496.0 - 1.0;
    }
}

/* One random test of symmetry: u.(A v) against v.(A u), relative to |u||Av| + |v||Au|. */
static sr_status check_symmetric(struct matvec *m, double *u, double *v, double *au, double *av)
{
    fill_random(u, m->len, 1);
    fill_random(v, m->len, 2);
    sr_status st = apply(m, u, au);
    if (st == SR_OK)
        st = apply(m, v, av);
    if (st != SR_OK)
        return st;
    double a = dot(u, av, m->len), b = dot(v, au, m->len);
    double scale = sqrt(dot(u, u, m->len) * dot(av, av, m->len)) +
                   sqrt(dot(v, v, m->len) * dot(au, au, m->len));
    /* a few units of the dtype's roundoff of the outputs, relative to the scale */
    static const double tols[] = {
        [SR_F32] = 1e-3, [SR_F64] = 1e-8, [SR_F16] = 1e-2, [SR_BF16] = 5e-2};
    double tol = tols[m->k->io];
    if (fabs(a - b) > tol * scale)
        return sr__error(m->k->ctx, SR_EINVAL,
                         "sr_kernel_solve: the operator is not symmetric: u.(Kv) = %g but v.(Ku) "
                         "= %g for random u, v (the i and j variables must hold the same data "
                         "and F(x_i, x_j) = F(x_j, x_i))",
                         a, b);
    return SR_OK;
}

static sr_status cg(struct matvec *m, const sr_solve_desc *d, const double *b, double *a,
                    double *work)
{
    int64_t len = m->len;
    double *r = work, *p = work + len, *ap = work + 2 * len;
    /* pykeops' rule: stop when |r|^2 < size(b) eps^2, an RMS residual below eps. */
    double delta = (double)len * d->eps * d->eps;
    int max_iter = d->max_iter ? d->max_iter : (int)(len < 100000 ? 10 * len + 10 : 1000000);
    memset(a, 0, (size_t)len * sizeof *a);
    memcpy(r, b, (size_t)len * sizeof *r);
    memcpy(p, b, (size_t)len * sizeof *p);
    double nr2 = dot(r, r, len);
    int it = 0;
    while (nr2 >= delta) {
        if (it == max_iter)
            return sr__error(m->k->ctx, SR_ENOCONV,
                             "sr_kernel_solve: no convergence after %d iterations: residual "
                             "norm %g, asked below %g (sqrt(size(b)) * eps)",
                             it, sqrt(nr2), sqrt(delta));
        sr_status st = apply(m, p, ap);
        if (st != SR_OK)
            return st;
        double pap = dot(p, ap, len);
        if (!(pap > 0))
            return sr__error(m->k->ctx, SR_EINVAL,
                             "sr_kernel_solve: alpha I + K is not positive definite "
                             "(p.(Ap) = %g at iteration %d)",
                             pap, it);
        double step = nr2 / pap;
        for (int64_t i = 0; i < len; i++) {
            a[i] += step * p[i];
            r[i] -= step * ap[i];
        }
        double nr2new = dot(r, r, len);
        for (int64_t i = 0; i < len; i++)
            p[i] = r[i] + nr2new / nr2 * p[i];
        nr2 = nr2new;
        it++;
    }
    return SR_OK;
}

sr_status sr_kernel_solve(const sr_kernel *k, const sr_solve_desc *d, int64_t n,
                          const void *const *args, const void *rhs, void *out)
{
    if (!k)
        return SR_EINVAL;
    sr_status st = check_input(k, d, n, args, rhs, out);
    if (st != SR_OK)
        return st;
    /* len values of the kernel's dtype, twice, and five double vectors of len. */
    int64_t len, bytes;
    if (!sr__size_mul(n, k->out_dim, 5 * sizeof(double), &bytes))
        return sr__error(
            k->ctx, SR_EOVERFLOW,
            "sr_kernel_solve: n = %lld rows of dimension %d overflow the address space",
            (long long)n, k->out_dim);
    len = n * k->out_dim;
    if (len == 0)
        return SR_OK;
    size_t es = sr_dtype_size(k->io);
    struct matvec m = {.k = k, .n = n, .len = len, .alpha = d->alpha};
    m.args = calloc((size_t)k->nargs, sizeof *m.args);
    m.buf = malloc((size_t)len * es);
    m.out = malloc((size_t)len * es);
    double *work = malloc((size_t)len * 5 * sizeof *work); /* b, a, r, p, Ap */
    if (!m.args || !m.buf || !m.out || !work) {
        st =
            sr__error(k->ctx, SR_ENOMEM, "sr_kernel_solve: out of memory (n = %lld)", (long long)n);
        goto done;
    }
    for (int v = 0; v < k->nargs; v++)
        m.args[v] = args ? args[v] : NULL;
    m.args[d->b_index] = m.buf;
    double *b = work, *a = work + len;
    from_dtype(k->io, rhs, b, len);
    if (d->check_symmetry)
        st = check_symmetric(&m, work + 2 * len, work + 3 * len, a, work + 4 * len);
    if (st == SR_OK)
        st = cg(&m, d, b, a, work + 2 * len);
    if (st == SR_OK)
        to_dtype(k->io, a, out, len);
done:
    free(work);
    free(m.out);
    free(m.buf);
    free(m.args);
    return st;
}
