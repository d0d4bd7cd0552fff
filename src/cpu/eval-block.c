/*
 * eval-block.c — sr_kernel_eval_block: the formula's values on a block of rows x columns.
 *
 * Two paths. A kernel on the CPU JIT's direct strategy has a block entry point in its own
 * generated module (sr_block, emitted with the kernel's sr_part by src/jit/emit-c.c: the same
 * placement, tiles and omp simd pair loop, storing F instead of reducing it), so the block costs
 * what the pair loop costs. That module is compiled on the first call, not with the kernel (a
 * reduction never needs it, and it would double the pair loops of the kernel's cold compile);
 * later calls find it under a lock of the kernel's, without a compile or cache lookup. The block's
 * output rows (and, when there are few of them, its reduced range too) are cut into pieces run over
 * OpenMP threads.
 *
 * A direct-strategy kernel whose calls the tile interpreter serves (tier 0: its module compiling
 * in the background, SYMRED_JIT=async, or its compile failed), and a kernel of the tile
 * interpreter's own backend (no C compiler, SYMRED_JIT=off), take the tile interpreter's block
 * instead (cpu_tile_block): the program of F alone, built per call on a private copy of the
 * kernel description, on the same pieces over the same threads, one frame per thread. No call
 * waits for a compiler, and the block costs what tier 0's pair loop costs.
 *
 * Every other kernel (the reference backend, gemm-epilogue, CUDA, a JIT that fell back, and a
 * kernel whose reduction the simplifier rewrote: its module computes the inner formula, not F)
 * runs the reference interpreter, one output row per call, as a Sum over the single row i of
 * F(x_i, y_j) for the block's columns j (axis 0), which is exactly row i of the block, written
 * in place. The interpreter is prepared on a private copy of the kernel description, so the
 * kernel itself is not touched and calls may run concurrently.
 */
#include "../jit/jit.h"
#include "cpu.h"

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
    /* The message names offsets and counts, never their sums, which may overflow. */
    if (i0 > nx - ni || j0 > ny - nj)
        return sr__error(ctx, SR_EINVAL,
                         "sr_kernel_eval_block: the block of %lld rows from row %lld and %lld "
                         "columns from column %lld is not inside the %lld x %lld matrix",
                         (long long)ni, (long long)i0, (long long)nj, (long long)j0, (long long)nx,
                         (long long)ny);
    size_t esz = sr_dtype_size(k->io);
    int64_t bytes;
    if (!sr__size_mul(ni, nj, k->fdim, &bytes) || !sr__size_mul(bytes, (int64_t)esz, 1, &bytes))
        return sr__error(ctx, SR_EOVERFLOW,
                         "sr_kernel_eval_block: the block (%lld x %lld x %d values) overflows the "
                         "address space",
                         (long long)ni, (long long)nj, k->fdim);
    sr_status st = sr__check_arrays(k, nx, ny, args);
    if (st != SR_OK)
        return st;
    if (ni > 0 && nj > 0 && !out)
        return sr__error(ctx, SR_EINVAL, "sr_kernel_eval_block: out is NULL");
    return SR_OK;
}

/* Whether a workspace of per_thread bytes (one thread) fits in the call's budget. */
static sr_status block_budget(const sr_kernel *k, int64_t per_thread)
{
    int64_t lim = sr__call_budget(k);
    if (lim > 0 && per_thread > lim)
        return sr__error(k->ctx, SR_EBUDGET,
                         "memory budget exceeded: sr_kernel_eval_block needs %lld bytes of "
                         "workspace, the budget is %lld bytes",
                         (long long)per_thread, (long long)lim);
    return SR_OK;
}

/* Output rows per piece: a few pieces per thread for balance, at most one block of the module
 * (its tile of reduced-index terms is reused by the rows of a block). With fewer pieces than
 * that, the reduced range is cut too, in pieces of at least BLOCK_MIN_REDUCED indices. */
#define BLOCK_PIECES_PER_THREAD 4
#define BLOCK_MIN_REDUCED       1024

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The generated path: the module's sr_block fn on pieces of the block, or (fn NULL) tier 0: the
 * tile interpreter's program tp of kernel tk, each thread with a frame of rb rows. The kernel's
 * output index o is i on axis 1 and j on axis 0; the block is row-major in (i, j) either way. */
static sr_status block_pieces(const sr_kernel *k, jit_block_fn fn, const sr_kernel *tk,
                              const struct tile_prog *tp, int64_t per_thread, int64_t rb,
                              const void *const *args, int64_t i0, int64_t ni, int64_t j0,
                              int64_t nj, void *out)
{
    sr_status st = block_budget(k, per_thread);
    if (st != SR_OK)
        return st;
    const bool ax1 = k->axis == 1;
    const int64_t nout = ax1 ? ni : nj, nred = ax1 ? nj : ni, o0 = ax1 ? i0 : j0,
                  r0 = ax1 ? j0 : i0, D = k->fdim;
    const int64_t so = ax1 ? nj * D : D, sr = ax1 ? D : nj * D;
    const size_t esz = sr_dtype_size(k->io_native ? k->io : k->dtype);
    const int nt = sr__threads(k->ctx, per_thread);
    const int64_t want = (int64_t)nt * BLOCK_PIECES_PER_THREAD;
    int64_t chunk = cdiv(nout, want);
    if (chunk > rb)
        chunk = rb;
    if (chunk < 1)
        chunk = 1;
    const int64_t nco = cdiv(nout, chunk);
    int64_t ncr = 1;
    if (nco < want) {
        ncr = cdiv(want, nco);
        int64_t most = nred / BLOCK_MIN_REDUCED;
        if (ncr > most)
            ncr = most > 1 ? most : 1;
    }
    const int64_t piece = cdiv(nred, ncr);
    ncr = cdiv(nred, piece);
    const int64_t ntask = nco * ncr;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && ntask > 1)
#endif
    {
        struct tile_frame *fr = fn ? NULL : cpu_tile_frame_new(tk, tp, args, chunk);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < ntask; t++) {
            const int64_t a = (t / ncr) * chunk, b = a + chunk < nout ? a + chunk : nout;
            const int64_t ra = (t % ncr) * piece, rz = ra + piece < nred ? ra + piece : nred;
            char *dst = (char *)out + ((size_t)a * (size_t)so + (size_t)ra * (size_t)sr) * esz;
            if (fr)
                cpu_tile_block(fr, o0 + a, b - a, r0 + ra, rz - ra, NULL, 0, dst, so, sr);
            else if (!fn || fn(o0 + a, o0 + b, r0 + ra, r0 + rz, args, dst, so, sr)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                failed = 1;
            }
        }
        cpu_tile_frame_free(fr);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "sr_kernel_eval_block: out of memory");
    return SR_OK;
}

/* Tier 0: the tile interpreter's program of F alone (a Sum of F, on a private copy of k) on the
 * pieces of block_pieces. */
static sr_status block_tile(const sr_kernel *k, const void *const *args, int64_t i0, int64_t ni,
                            int64_t j0, int64_t nj, void *out)
{
    struct sr_kernel t = *k;
    t.red = SR_SUM;
    t.k = 1;
    t.weight = NULL;
    t.out_dim = k->fdim;
    /* cpu_tile_new_ext: F formed (cpu_tile_new may fold a Sum of a product as a dot product). */
    struct tile_prog *tp = NULL;
    sr_status st = cpu_tile_new_ext(&t, NULL, 0, &tp);
    if (st != SR_OK)
        return st;
    sr_plan_info pi;
    memset(&pi, 0, sizeof pi);
    cpu_tile_plan_info(&t, tp, &pi); /* its rows per block */
    const int64_t rb = pi.tile_rows > 0 ? pi.tile_rows : 1;
    st = block_pieces(k, NULL, &t, tp, cpu_tile_frame_bytes(tp, rb), rb, args, i0, ni, j0, nj, out);
    cpu_tile_free(tp);
    return st;
}

/* A checked, non-empty block in the kernel's computing dtype (io_native: in its arrays' dtype). */
static sr_status eval_block(const sr_kernel *k, const void *const *args, int64_t i0, int64_t ni,
                            int64_t j0, int64_t nj, void *out)
{
    sr_status st;
    int64_t jit_ws = 0;
    const struct jit_module *m;
    if ((st = cpu_jit_block_module(k, &m, &jit_ws)) != SR_OK)
        return st;
    if (m && m->block)
        return block_pieces(k, m->block, NULL, NULL, jit_ws, m->rows_per_block, args, i0, ni, j0,
                            nj, out);
    if (cpu_jit_tier0(k) || k->backend == &cpu_tile_backend)
        return block_tile(k, args, i0, ni, j0, nj, out);

    /* Threads, within the memory budget: each runs the interpreter with its own working set. */
    int64_t per_thread = sr__reference_workspace(k) + (int64_t)k->nargs * (int64_t)sizeof(void *);
    if ((st = block_budget(k, per_thread)) != SR_OK)
        return st;
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
    t.backend_data = NULL;
    t.explain = NULL;
    struct sr_realise real = {0};
    st = cpu_reference_backend.prepare(&t, NULL, &real);
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

sr_status sr_kernel_eval_block(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                               int64_t i0, int64_t ni, int64_t j0, int64_t nj, void *out)
{
    if (!k)
        return SR_EINVAL;
    sr_status st = block_check(k, nx, ny, args, i0, ni, j0, nj, out);
    if (st != SR_OK || ni == 0 || nj == 0)
        return st;
    /* the generated block reads the 16-bit arrays (io_native: a direct JIT kernel) */
    if (k->io == k->dtype || k->io_native)
        return eval_block(k, args, i0, ni, j0, nj, out);
    /* float16 / bfloat16: the float32 block from widened copies, rounded into out */
    struct sr_io_copy c;
    const int64_t nval = ni * nj * k->fdim;
    if ((st = sr__io_widen(k, nx, ny, args, nval, &c)) != SR_OK)
        return st;
    st = eval_block(k, c.args, i0, ni, j0, nj, c.out);
    if (st == SR_OK)
        sr__narrow(k->io, c.out, out, nval);
    sr__io_free(&c);
    return st;
}
