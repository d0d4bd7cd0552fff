/*
 * test-eval-block.c — sr_kernel_eval_block's generated path (the JIT module's sr_block) against
 * the reference interpreter's block: every op (the differential tests' op groups), both dtypes,
 * both axes, dim(F) > 1, blocks of sizes 0, 1 and primes at offsets, blocks wider than a tile and
 * taller than a block of rows, Grad formulas; a kernel whose reduction the simplifier rewrote
 * (its block must be F's values, not the inner formula's) and a gemm-epilogue kernel, which
 * both take the reference path. Concurrent calls on one kernel are in test-threads.c.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/cpu.h"
#include "jit/jit.h"
#include "diff.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(eval_block, .init = setup, .fini = teardown);

/* A block: the matrix nx x ny and the block's rows [i0, i0 + ni) x columns [j0, j0 + nj). */
struct blk {
    int64_t nx, ny, i0, ni, j0, nj;
};

/* Sizes 0 and 1, primes, offsets; a block wider than the widest tile (512) and taller than a
 * block of rows (64); few rows and many columns (the reduced range is cut into pieces). */
static const struct blk blocks[] = {
    {1, 1, 0, 1, 0, 1},       {0, 5, 0, 0, 0, 5},       {5, 0, 0, 5, 0, 0},
    {7, 11, 3, 0, 2, 5},      {37, 41, 3, 31, 5, 29},   {13, 541, 2, 7, 5, 523},
    {211, 23, 1, 199, 2, 19}, {3, 4999, 1, 2, 7, 4987},
};

/* Inputs on a grid of 1/64 in [-1.5, 1.5]: sums, differences and products of two are exact in
 * float32, so comparisons and Floor agree between float and double evaluation. */
static void *grid_fill(sr_dtype dt, int64_t n, uint64_t *s)
{
    size_t esz = dt == SR_F64 ? 8 : 4;
    void *p = malloc(esz * (size_t)(n > 0 ? n : 1));
    cr_assert_not_null(p);
    for (int64_t q = 0; q < n; q++) {
        double v = round(tu_uniform(s, -1.5, 1.5) * 64) / 64;
        if (dt == SR_F64)
            ((double *)p)[q] = v;
        else
            ((float *)p)[q] = (float)v;
    }
    return p;
}

static double at(const void *p, sr_dtype dt, int64_t q)
{
    return dt == SR_F64 ? ((const double *)p)[q] : ((const float *)p)[q];
}

/* Whether got agrees with the reference's want: NaN with NaN, equal infinities, else within
 * rtol |want| + atol. */
static bool agree(double got, double want, double rtol, double atol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= rtol * fabs(want) + atol;
}

/* Runs kernel kj (which must take the generated path) and the reference kernel kr of the same
 * formula on every block of blocks[], inputs drawn per variable from the grid, and compares. */
static void compare_blocks(sr_kernel *kj, sr_kernel *kr, const char *what)
{
    cr_assert_str_eq(kj->backend->name, "cpu-jit", "%s", what);
    cr_assert(tu_plan(kj).eval_block, "%s: %s", what, sr_kernel_explain(kj));
    int64_t ws;
    const struct jit_module *m;
    cr_assert_eq(cpu_jit_block_module(kj, &m, &ws), SR_OK, "%s: %s", what, sr_ctx_error(kj->ctx));
    cr_assert(m && m->block, "%s: no generated block", what);
    const sr_dtype dt = kj->dtype;
    const double rtol = dt == SR_F64 ? 1e-9 : 1e-4, atol = dt == SR_F64 ? 1e-9 : 1e-4;
    const int D = kj->fdim, nargs = sr_kernel_nargs(kj);
    cr_assert_eq(nargs, sr_kernel_nargs(kr));
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
        const struct blk *B = &blocks[b];
        uint64_t s = 1234 + b;
        void *args[8] = {0};
        cr_assert(nargs <= 8);
        for (int v = 0; v < nargs; v++) {
            const struct expr_var *var = &kj->vars[v];
            int64_t rows = var->cat == SR_CAT_I ? B->nx : var->cat == SR_CAT_J ? B->ny : 1;
            args[v] = grid_fill(dt, rows * var->dim, &s);
        }
        size_t esz = dt == SR_F64 ? 8 : 4, n = (size_t)(B->ni * B->nj * D);
        void *got = malloc(esz * n + 8), *want = malloc(esz * n + 8);
        memset(got, 0xab, esz * n + 8);
        sr_status st = sr_kernel_eval_block(kj, B->nx, B->ny, (const void *const *)args, B->i0,
                                            B->ni, B->j0, B->nj, got);
        cr_assert_eq(st, SR_OK, "%s block %zu: %s", what, b, sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_eval_block(kr, B->nx, B->ny, (const void *const *)args, B->i0, B->ni,
                                          B->j0, B->nj, want),
                     SR_OK, "%s", sr_ctx_error(ctx));
        int bad = 0;
        for (size_t q = 0; q < n && bad < 5; q++) {
            double g = at(got, dt, (int64_t)q), w = at(want, dt, (int64_t)q);
            if (!agree(g, w, rtol, atol)) {
                size_t ij = q / (size_t)D;
                cr_expect_fail("%s block %zu (%lldx%lld at %lld,%lld): (i %lld, j %lld)[%zu] got "
                               "%.17g, reference %.17g",
                               what, b, (long long)B->ni, (long long)B->nj, (long long)B->i0,
                               (long long)B->j0, (long long)(B->i0 + (int64_t)ij / B->nj),
                               (long long)(B->j0 + (int64_t)ij % B->nj), q % (size_t)D, g, w);
                bad++;
            }
        }
        /* Nothing past the block is written. */
        const unsigned char *tail = (const unsigned char *)got + esz * n;
        for (int q = 0; q < 8; q++)
            cr_assert_eq(tail[q], 0xab, "%s block %zu: wrote past the block", what, b);
        for (int v = 0; v < nargs; v++)
            free(args[v]);
        free(got);
        free(want);
        if (bad)
            return;
    }
}

static sr_kernel *make(sr_expr *f, sr_dtype dt, int axis, sr_reduction red, sr_device dev)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    d.axis = axis;
    d.reduction = red;
    d.k = 2;
    d.device = dev;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* One formula, both dtypes and axes; red is the kernels' reduction (it must not matter). */
static void formula_case(const char *text, const char *const *aliases, int naliases,
                         sr_reduction red, const char *what)
{
    sr_expr *f = diff_parse(ctx, text, aliases, naliases);
    for (int dt = 0; dt < 2; dt++)
        for (int axis = 1; axis >= 0; axis--) {
            sr_dtype t = dt ? SR_F64 : SR_F32;
            sr_kernel *kj = make(f, t, axis, red, SR_DEVICE_CPU),
                      *kr = make(f, t, axis, red, SR_DEVICE_REFERENCE);
            char w[128];
            snprintf(w, sizeof w, "%s, %s, axis %d", what, dt ? "f64" : "f32", axis);
            compare_blocks(kj, kr, w);
            sr_kernel_free(kj);
            sr_kernel_free(kr);
        }
}

/* Every op: the op groups of the differential tests, with the simplifier off so each op reaches
 * the emitter as written. */
static void op_group(int grp)
{
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    const char *const *aliases;
    const char *text = diff_op_group_formula(grp, &aliases);
    char what[32];
    snprintf(what, sizeof what, "op group %d", grp);
    formula_case(text, aliases, 4, grp % 2 ? SR_SUM : SR_MIN, what);
}

#define OP_TEST_(name, grp)                                                                        \
    Test(eval_block, ops_##name) { op_group(grp); }
DIFF_OP_TESTS(OP_TEST_)
#undef OP_TEST_

static const char *const aliases[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)",
                                      "e=Pm(1)", "u=Vi(1)", "b=Vj(1)"};

/* The SGPR benchmark's two blocks: K_uf and its derivative in the lengthscale parameter. */
Test(eval_block, sgpr_grad_g)
{
    formula_case("Exp(-g*SqDist(x,y))", aliases, 6, SR_SUM, "Exp(-g*SqDist(x,y))");
    formula_case("Grad(Exp(-g*SqDist(x,y)), g, e)", aliases, 6, SR_SUM, "Grad in g");
}

/* A gradient with respect to a vector variable (dim(F) = 3), simplified. */
Test(eval_block, grad_x)
{
    formula_case("Grad(Exp(-SqDist(x,y)*g)*b, x, u)", aliases, 6, SR_LOGSUMEXP, "Grad in x");
    formula_case("Grad(Sqrt(SqDist(x,y)+g), y, u)", aliases, 6, SR_KMIN, "Grad in y");
}

/* A kernel whose reduction the simplifier rewrote (the i-only factor Exp(u) moves out of the
 * Sum): its module computes the inner formula, so eval_block takes the reference path and
 * gives F's values, factor included. */
Test(eval_block, reduction_rewrite)
{
    sr_expr *f = diff_parse(ctx, "Exp(u) * Exp(-SqDist(x,y)*g) * b", aliases, 6);
    sr_kernel *k = make(f, SR_F64, 1, SR_SUM, SR_DEVICE_CPU);
    sr_kernel *kr = make(f, SR_F64, 1, SR_SUM, SR_DEVICE_REFERENCE);
    cr_assert_not_null(k->simp.post, "the rewrite was expected to fire: %s", sr_kernel_explain(k));
    enum { NX = 9, NY = 13 };
    double x[NX * 3], y[NY * 3], u[NX], b[NY], g = 0.4, got[NX * NY], want[NX * NY];
    uint64_t s = 5;
    tu_fill(x, SR_F64, NX * 3, -1, 1, &s);
    tu_fill(y, SR_F64, NY * 3, -1, 1, &s);
    tu_fill(u, SR_F64, NX, -1, 1, &s);
    tu_fill(b, SR_F64, NY, -1, 1, &s);
    const void *args[] = {x, y, &g, NULL, u, b};
    cr_assert_eq(sr_kernel_nargs(k), 6);
    cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, 0, NX, 0, NY, got), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_eval_block(kr, NX, NY, args, 0, NX, 0, NY, want), SR_OK);
    for (int q = 0; q < NX * NY; q++) {
        int i = q / NY, j = q % NY;
        double d2 = 0;
        for (int c = 0; c < 3; c++)
            d2 += (x[i * 3 + c] - y[j * 3 + c]) * (x[i * 3 + c] - y[j * 3 + c]);
        double f_ij = exp(u[i]) * exp(-d2 * g) * b[j];
        cr_assert(tu_close(got[q], f_ij, 1e-12, 1e-14), "(%d, %d): %g, F = %g", i, j, got[q], f_ij);
        cr_assert(tu_close(got[q], want[q], 1e-12, 1e-14));
    }
    sr_kernel_free(k);
    sr_kernel_free(kr);
}

/* A gemm-epilogue kernel (high D, its module reads inner products from a gemm tile, so it has
 * no sr_block): eval_block takes the reference path, with the reference's values. */
Test(eval_block, gemm_epilogue_reference_path)
{
    const char *al[] = {"x=Vi(32)", "y=Vj(32)", "g=Pm(1)", "b=Vj(1)"};
    sr_expr *f = diff_parse(ctx, "Exp((x|y) * g) * b", al, 4);
    sr_kernel *k = make(f, SR_F64, 1, SR_SUM, SR_DEVICE_CPU);
    if (k->backend != &cpu_gemm_backend) {
        sr_kernel_free(k);
        cr_skip_test("no gemm for the gemm-epilogue path (no AVX-512F and no BLIS)");
    }
    cr_assert_null(cpu_jit_module(k));
    const struct jit_module *m;
    int64_t ws;
    cr_assert_eq(cpu_jit_block_module(k, &m, &ws), SR_OK);
    cr_assert_null(m);
    sr_kernel *kr = make(f, SR_F64, 1, SR_SUM, SR_DEVICE_REFERENCE);
    enum { NX = 11, NY = 17 };
    double x[NX * 32], y[NY * 32], b[NY], g = 0.05, got[6 * 9], want[6 * 9];
    uint64_t s = 3;
    tu_fill(x, SR_F64, NX * 32, -1, 1, &s);
    tu_fill(y, SR_F64, NY * 32, -1, 1, &s);
    tu_fill(b, SR_F64, NY, -1, 1, &s);
    const void *args[] = {x, y, &g, b};
    cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, 4, 6, 7, 9, got), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_eval_block(kr, NX, NY, args, 4, 6, 7, 9, want), SR_OK);
    for (int q = 0; q < 6 * 9; q++)
        cr_assert_eq(got[q], want[q], "%d: %.17g vs %.17g", q, got[q], want[q]);
    sr_kernel_free(k);
    sr_kernel_free(kr);
}

/* A direct kernel's module has no sr_block: the first eval_block obtains the module with it
 * (one compile, disk or memory hit), later ones reuse it; the reductions keep the first module. */
Test(eval_block, block_module_on_first_call)
{
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x,y)*g)*b", aliases, 6);
    sr_kernel *k = make(f, SR_F32, 1, SR_SUM, SR_DEVICE_CPU);
    cr_assert_str_eq(k->backend->name, "cpu-jit");
    const struct jit_module *m0 = cpu_jit_module(k);
    cr_assert(m0 && !m0->block, "the kernel's module has an sr_block");
    const struct jit_ctx *jc = jit_ctx_of(ctx);
    const unsigned long gets0 = jc->compiles + jc->disk_hits + jc->mem_hits;
    enum { NX = 9, NY = 13 };
    float x[NX * 3], y[NY * 3], b[NY], g = 0.4f, got[NX * NY], again[NX * NY], red[NX];
    uint64_t s = 7;
    tu_fill(x, SR_F32, NX * 3, -1, 1, &s);
    tu_fill(y, SR_F32, NY * 3, -1, 1, &s);
    tu_fill(b, SR_F32, NY, -1, 1, &s);
    const void *args[] = {x, y, &g, NULL, NULL, b};
    cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, 0, NX, 0, NY, got), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(jc->compiles + jc->disk_hits + jc->mem_hits, gets0 + 1);
    cr_assert_eq(sr_kernel_eval_block(k, NX, NY, args, 0, NX, 0, NY, again), SR_OK);
    cr_assert_eq(jc->compiles + jc->disk_hits + jc->mem_hits, gets0 + 1);
    cr_assert(memcmp(got, again, sizeof got) == 0);
    const struct jit_module *m;
    int64_t ws;
    cr_assert_eq(cpu_jit_block_module(k, &m, &ws), SR_OK);
    cr_assert(m && m->block && m != m0);
    cr_assert_eq(cpu_jit_module(k), m0);
    cr_assert_eq(sr_kernel_run(k, NX, NY, args, red), SR_OK);
    for (int i = 0; i < NX; i++) {
        double want = 0;
        for (int j = 0; j < NY; j++) {
            double d2 = 0;
            for (int c = 0; c < 3; c++)
                d2 += ((double)x[i * 3 + c] - y[j * 3 + c]) * ((double)x[i * 3 + c] - y[j * 3 + c]);
            double f_ij = exp(-d2 * g) * b[j];
            cr_assert(tu_close(got[i * NY + j], f_ij, 1e-5, 1e-6), "(%d, %d): %g, F = %g", i, j,
                      got[i * NY + j], f_ij);
            want += f_ij;
        }
        cr_assert(tu_close(red[i], want, 1e-5, 1e-6), "row %d: %g, want %g", i, red[i], want);
    }
    sr_kernel_free(k);
}
