/*
 * eval-block.c — sr_kernel_eval_block: the formula's values on a block of rows x columns.
 *
 * Correctness first: the block is computed by the reference interpreter (the test oracle), one
 * output row per call, as a Sum over the single row i of F(x_i, y_j) for the block's columns j
 * (axis 0), which is exactly row i of the block, written in place. Rows are spread over OpenMP
 * threads. The interpreter is prepared on a private copy of the kernel description, so the
 * kernel itself is not touched and calls may run concurrently.
 */
#include "../core/core.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static sr_status block_check(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                             int64_t i0, int64_t ni, int64_t j0, int64_t nj, const void *out)
{
    sr_ctx *ctx = k->ctx;
    if (nx < 0 || ny < 0 || ni < 0 || nj < 0 || i0 < 0 || j0 < 0)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_eval_block: sizes and offsets must be >= 0 (nx = %lld, ny = "
                         "%lld, i0 = %lld, ni = %lld, j0 = %lld, nj = %lld)",
                         (long long)nx, (long long)ny, (long long)i0, (long long)ni, (long long)j0,
                         (long long)nj);
    if (i0 > nx - ni || j0 > ny - nj)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_eval_block: the block rows [%lld, %lld) x columns [%lld, %lld) "
                         "is not inside the %lld x %lld matrix",
                         (long long)i0, (long long)i0 + ni, (long long)j0, (long long)j0 + nj,
                         (long long)nx, (long long)ny);
    size_t esz = sr_dtype_size(k->dtype);
    if (ni > 0 && nj > 0 && (nj > PTRDIFF_MAX / (int64_t)esz / k->fdim / ni))
        return sr__error(ctx, SR_EOVERFLOW,
                         "sr_kernel_eval_block: the block (%lld x %lld x %d values) overflows the "
                         "address space",
                         (long long)ni, (long long)nj, k->fdim);
    if (k->nargs > 0 && !args)
        return sr__error(ctx, SR_EINVAL, "args is NULL but the kernel takes %d arrays", k->nargs);
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim)
            continue;
        int64_t rows = var->cat == SR_CAT_I ? nx : var->cat == SR_CAT_J ? ny : 1;
        if (rows > 0 && rows > PTRDIFF_MAX / (int64_t)esz / var->dim)
            return sr__error(ctx, SR_EOVERFLOW,
                             "argument %d: %lld rows of dimension %d overflow the address space", v,
                             (long long)rows, var->dim);
        if (rows > 0 && !args[v])
            return sr__error(ctx, SR_EINVAL, "argument %d (dimension %d) is NULL", v, var->dim);
    }
    if (ni > 0 && nj > 0 && !out)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_eval_block: out is NULL");
    return SR_OK;
}

sr_status sr_kernel_eval_block(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                               int64_t i0, int64_t ni, int64_t j0, int64_t nj, void *out)
{
    if (!k)
        return SR_EINVAL;
    sr_status st = block_check(k, nx, ny, args, i0, ni, j0, nj, out);
    if (st != SR_OK || ni == 0 || nj == 0)
        return st;

    /* Threads, within the memory budget: each runs the interpreter with its own working set. */
    int64_t per_thread = sr__reference_workspace(k) + (int64_t)k->nargs * (int64_t)sizeof(void *);
    int64_t lim = k->ctx->mem_limit;
    if (lim > 0 && per_thread > lim)
        return sr__error(k->ctx, SR_EBUDGET,
                         "memory budget exceeded: sr_kernel_eval_block needs %lld bytes of "
                         "workspace, the budget is %lld bytes",
                         (long long)per_thread, (long long)lim);
    int nt = sr__threads(k->ctx, per_thread);
    if (nt > ni)
        nt = (int)ni;
    if (nt < 1)
        nt = 1;

    /* F alone, as a Sum over one reduced row on axis 0: row i of the block in one call. */
    struct sr_kernel t = *k;
    t.red = SR_SUM;
    t.axis = 0;
    t.k = 1;
    t.weight = NULL;
    t.simp.weight_user = NULL;
    t.out_dim = k->fdim;
    t.backend = &cpu_reference_backend;
    t.backend_data = NULL;
    t.explain = NULL;
    st = cpu_reference_backend.prepare(&t);
    if (st != SR_OK)
        return st;

    size_t esz = sr_dtype_size(k->dtype), rowbytes = (size_t)nj * (size_t)k->fdim * esz;
    const void **targs = malloc(((size_t)k->nargs + 1) * (size_t)nt * sizeof *targs);
    if (!targs) {
        cpu_reference_backend.release(&t);
        return sr__error(k->ctx, SR_ENOMEM, "sr_kernel_eval_block: out of memory");
    }
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4) num_threads(nt) if (nt > 1)
#endif
    for (int64_t ii = 0; ii < ni; ii++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        const void **a = targs + (size_t)tid * ((size_t)k->nargs + 1);
        for (int v = 0; v < k->nargs; v++) {
            const struct expr_var *var = &k->vars[v];
            const char *base = args ? args[v] : NULL;
            size_t row = (size_t)var->dim * esz;
            if (base && var->dim && var->cat == SR_CAT_I)
                base += (size_t)(i0 + ii) * row;
            else if (base && var->dim && var->cat == SR_CAT_J)
                base += (size_t)j0 * row;
            a[v] = base;
        }
        sr_run_desc r = {0};
        r.nx = 1;
        r.ny = nj;
        r.nargs = k->nargs;
        r.args = a;
        r.out = (char *)out + (size_t)ii * rowbytes;
        if (cpu_reference_backend.run(&t, &r) != SR_OK)
            failed = 1;
    }
    free(targs);
    cpu_reference_backend.release(&t);
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "sr_kernel_eval_block: out of memory");
    return SR_OK;
}
