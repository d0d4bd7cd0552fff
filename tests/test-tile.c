/*
 * test-tile.c — the tile interpreter (tier 0 of the CPU) against the reference interpreter.
 *
 * The context runs with SYMRED_JIT=off, so every CPU kernel is served by the tile interpreter:
 * every op (the differential harness's op groups, the simplifier off), every reduction on both
 * axes in every dtype at sizes 0, 1, primes and sizes no tile divides, the split of the reduced
 * range over threads, NaN/Inf inputs and ties, block-sparse ranges, tiles shrunk by the memory
 * budget, and a kernel built with no compiler at all.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "diff.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    unsetenv("SYMRED_NUM_THREADS");
    unsetenv("SYMRED_MEM_LIMIT");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "off"), SR_OK, "%s", sr_ctx_error(ctx));
    diff_backend_override = "tile interpreter";
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(tile, .init = setup, .fini = teardown);

#define OPS(name, grp)                                                                             \
    Test(tile, ops_##name##_f32) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_F32); }               \
    Test(tile, ops_##name##_f64) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_F64); }               \
    Test(tile, ops_##name##_bf16) { diff_op_group(ctx, SR_DEVICE_CPU, grp, SR_BF16); }
DIFF_OP_TESTS(OPS)

#define RED(R, name)                                                                               \
    Test(tile, red_##name##_f32) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F32); }                \
    Test(tile, red_##name##_f64) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F64); }                \
    Test(tile, red_##name##_f16) { diff_reduction(ctx, SR_DEVICE_CPU, R, SR_F16); }
DIFF_RED_TESTS(RED)

#define SPECIAL(name, R, gen, k, f)                                                                \
    Test(tile, name) { diff_special(ctx, SR_DEVICE_CPU, R, gen, k, f); }
DIFF_SPECIAL_TESTS(SPECIAL)

static sr_kernel *kernel(const char *formula, const char *const *al, int nal, sr_kernel_desc d,
                         sr_device dev)
{
    sr_expr *f = diff_parse(ctx, formula, al, nal);
    return diff_kernel(ctx, f, d, dev);
}

/* The simplified Gaussian (hoisted terms per row, per tile and per call), both axes, through
 * the row blocks and tiles at sizes that no tile divides. */
Test(tile, gaussian_simplified)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)"};
    for (int dt = 0; dt < 2; dt++)
        for (int axis = 1; axis >= 0; axis--) {
            sr_kernel_desc d = sr_kernel_desc_default();
            d.dtype = dt ? SR_F64 : SR_F32;
            d.axis = axis;
            sr_kernel *kt = kernel("Exp(-SqDist(x, y) * g) * b", al, 4, d, SR_DEVICE_CPU);
            sr_kernel *kr = kernel("Exp(-SqDist(x, y) * g) * b", al, 4, d, SR_DEVICE_REFERENCE);
            sr_plan_info p = tu_plan(kt);
            cr_assert(strcmp(p.backend, "tile interpreter") == 0 && p.tile_isa, "%s",
                      sr_kernel_explain(kt));
            /* Under a cap (the test-tile-avx2 and -baseline entries), the capped loops run. */
            const char *cap = getenv("SYMRED_TILE_ISA");
            if (cap && strcmp(cap, "avx2") == 0 && __builtin_cpu_supports("avx2"))
                cr_assert_str_eq(p.tile_isa, "AVX2");
            if (cap && strcmp(cap, "baseline") == 0)
                cr_assert_str_eq(p.tile_isa, "baseline");
            diff_run(ctx, kt, kr, 257, 515, DIFF_UNIFORM, 0, 1, 3, diff_tol_of(d.dtype),
                     "gaussian");
            diff_run(ctx, kt, kr, 33, 9001, DIFF_UNIFORM, 0, 1, 4, diff_tol_of(d.dtype),
                     "gaussian, reduced range split");
            sr_kernel_free(kt);
            sr_kernel_free(kr);
        }
}

/* A memory budget below the default tiles: the tiles shrink and the values stay; below the
 * smallest tile: SR_EBUDGET naming the bytes. */
Test(tile, budget_shrinks_tiles)
{
    static const char *al[] = {"x=Vi(16)", "y=Vj(16)"};
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 5;
    sr_kernel *kr = kernel("SqDist(x, y)", al, 2, d, SR_DEVICE_REFERENCE);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 4096), SR_OK);
    sr_kernel *kt = kernel("SqDist(x, y)", al, 2, d, SR_DEVICE_CPU);
    int tj = tu_plan(kt).tile_cols;
    cr_assert(tj == 32 || tj == 16, "%d reduced indices per tile:\n%s", tj, sr_kernel_explain(kt));
    diff_run(ctx, kt, kr, 41, 263, DIFF_GRID, -1, 1, 9, diff_tol_of(SR_F32), "argkmin budget");
    sr_kernel_free(kt);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 600), SR_OK);
    sr_kernel *k2 = NULL;
    sr_expr *f = diff_parse(ctx, "SqDist(x, y)", al, 2);
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k2), SR_EBUDGET);
    cr_assert(strstr(sr_ctx_error(ctx), "bytes"), "%s", sr_ctx_error(ctx));
    sr_kernel_free(kr);
}

/* Block-sparse ranges: only the blocks' pairs, the identity elsewhere, as the reference. */
Test(tile, ranges_match_reference)
{
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    for (int r = 0; r < 2; r++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = r ? SR_MIN_ARGMIN : SR_LOGSUMEXP;
        sr_kernel *kt = kernel("-SqDist(x, y)", al, 2, d, SR_DEVICE_CPU);
        sr_kernel *kr = kernel("-SqDist(x, y)", al, 2, d, SR_DEVICE_REFERENCE);
        enum { NX = 53, NY = 301 };
        float x[NX * 2], y[NY * 2];
        uint64_t seed = 7;
        for (int i = 0; i < NX * 2; i++)
            x[i] = (float)tu_uniform(&seed, -1, 1);
        for (int j = 0; j < NY * 2; j++)
            y[j] = (float)tu_uniform(&seed, -1, 1);
        /* Rows [0, 10) over [0, 40) and [100, 290); rows [20, 53) over [7, 301). */
        int64_t ranges_i[] = {0, 10, 20, 53}, slices_i[] = {2, 3};
        int64_t redranges_j[] = {0, 40, 100, 290, 7, 301};
        sr_ranges R = {0};
        R.ranges_i = ranges_i;
        R.nranges_i = 2;
        R.slices_i = slices_i;
        R.redranges_j = redranges_j;
        R.nredranges_j = 3;
        float ot[NX], orf[NX];
        int64_t it[NX], ir[NX];
        const void *args[] = {x, y};
        sr_run_desc rd = {NX, NY, 2, args, ot, r ? it : NULL};
        cr_assert_eq(sr_kernel_run_ranges(kt, &rd, &R), SR_OK, "%s", sr_ctx_error(ctx));
        rd.out = orf;
        rd.out_idx = r ? ir : NULL;
        cr_assert_eq(sr_kernel_run_ranges(kr, &rd, &R), SR_OK, "%s", sr_ctx_error(ctx));
        for (int i = 0; i < NX; i++) {
            if (isinf(orf[i]))
                cr_assert_eq(ot[i], orf[i], "row %d: %g vs %g", i, ot[i], orf[i]);
            else
                cr_assert_float_eq(ot[i], orf[i], 1e-5 * (1 + fabsf(orf[i])), "row %d: %g vs %g", i,
                                   ot[i], orf[i]);
            if (r)
                cr_assert_eq(it[i], ir[i], "row %d: index %lld vs %lld", i, (long long)it[i],
                             (long long)ir[i]);
        }
        sr_kernel_free(kt);
        sr_kernel_free(kr);
    }
}

/* No compiler at all (the default SYMRED_JIT): the CPU kernel is served by the tile
 * interpreter, and explain says why. */
Test(tile, no_compiler_serves_tier0)
{
    sr_ctx *c2 = NULL;
    setenv("SYMRED_CC", "/nonexistent/cc", 1);
    cr_assert_eq(sr_ctx_new(&c2), SR_OK);
    unsetenv("SYMRED_CC");
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)"};
    sr_expr *f = diff_parse(c2, "Exp(-SqDist(x, y))", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(c2, f, &d, &k), SR_OK, "%s", sr_ctx_error(c2));
    const char *ex = sr_kernel_explain(k);
    sr_plan_info p = tu_plan(k);
    cr_assert(strcmp(p.backend, "tile interpreter") == 0 && p.fallback &&
                  strstr(p.fallback, "compiler"),
              "%s", ex);
    float x[6] = {0, 0, 0, 1, 1, 1}, y[3] = {0, 0, 0}, out[2];
    const void *args[] = {x, y};
    cr_assert_eq(sr_kernel_run(k, 2, 1, args, out), SR_OK, "%s", sr_ctx_error(c2));
    cr_assert_float_eq(out[0], 1.0f, 1e-6, "%g", out[0]);
    cr_assert_float_eq(out[1], expf(-3.0f), 1e-6, "%g", out[1]);
    sr_kernel_free(k);
    sr_ctx_free(c2);
}

/* Distances and inner products over many components (the blocked loops: sums kept in registers
 * across components, 32 reduced indices at a time, the tail per component): an output-row
 * operand against a tile, two tiles, both axes, at sizes that leave partial tiles and blocks. */
Test(tile, many_component_distances)
{
    static const char *al[] = {"x=Vi(16)", "y=Vj(16)", "z=Vj(16)"};
    static const char *const forms[] = {"SqDist(x, y) + SqDist(y, z) * (x | z)",
                                        "Exp(-SqDist(x, y) * 0.05) * (y | z)"};
    for (int q = 0; q < 2; q++)
        for (int dt = 0; dt < 2; dt++)
            for (int axis = 1; axis >= 0; axis--) {
                sr_kernel_desc d = sr_kernel_desc_default();
                d.dtype = dt ? SR_F64 : SR_F32;
                d.axis = axis;
                d.reduction = q ? SR_SUM : SR_ARGKMIN;
                d.k = 3;
                sr_kernel *kt = kernel(forms[q], al, 3, d, SR_DEVICE_CPU);
                sr_kernel *kr = kernel(forms[q], al, 3, d, SR_DEVICE_REFERENCE);
                diff_run(ctx, kt, kr, axis ? 37 : 1031, axis ? 1031 : 37, DIFF_GRID, -1, 1, 21,
                         diff_tol_of(d.dtype), forms[q]);
                sr_kernel_free(kt);
                sr_kernel_free(kr);
            }
}

/* SqDist, SqNorm2 and Norm2 of up to 16 components (one operand a parameter, or both variables)
 * fuse each square into the sum as the generated C does, and Exp is the same polynomial: the
 * values of F, so a Min over them, are bitwise those of the compiled kernel, whichever tier
 * serves a call. */
Test(tile, squared_sums_bitwise_as_compiled)
{
    sr_ctx *cc_ctx;
    cr_assert_eq(sr_ctx_new(&cc_ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(cc_ctx, "SYMRED_JIT", "sync"), SR_OK);
    cr_assert_eq(sr_ctx_set_option(cc_ctx, "SYMRED_CACHE_DIR", tu_jit_cache()), SR_OK);
    /* The loops without FMA (SYMRED_TILE_ISA=baseline) round each square and each step of the
     * exponential's polynomial, as the generated C does on a CPU without FMA: on one with it,
     * they agree to a few ulps only. */
    const char *isa = getenv("SYMRED_TILE_ISA");
    bool exact = !isa || strcmp(isa, "baseline") != 0;
    static const int dims[] = {2, 3, 7, 16};
    enum { NX = 37, NY = 131 };
    for (int q = 0; q < 4; q++)
        for (int dt = 0; dt < 2; dt++) {
            char a0[32], a1[32], a2[32];
            snprintf(a0, sizeof a0, "x=Vi(%d)", dims[q]);
            snprintf(a1, sizeof a1, "y=Vj(%d)", dims[q]);
            snprintf(a2, sizeof a2, "p=Pm(%d)", dims[q]);
            const char *al[] = {a0, a1, a2};
            const char *form = "Concat(Concat(SqDist(x, y), SqDist(y, p)), Concat(SqNorm2(x * y), "
                               "Concat(Norm2(x - y), Exp(-SqDist(x, y) * 0.3))))";
            sr_kernel_desc d = sr_kernel_desc_default();
            d.dtype = dt ? SR_F64 : SR_F32;
            d.reduction = SR_MIN;
            sr_kernel *kt = kernel(form, al, 3, d, SR_DEVICE_CPU);
            sr_kernel *kc = diff_kernel(cc_ctx, diff_parse(cc_ctx, form, al, 3), d, SR_DEVICE_CPU);
            cr_assert_eq(tu_plan(kt).tier, 0);
            cr_assert_eq(tu_plan(kc).tier, 1, "%s", sr_kernel_explain(kc));
            size_t es = dt ? sizeof(double) : sizeof(float);
            uint64_t st = 7 + (uint64_t)q;
            void *x = malloc(NX * dims[q] * es), *y = malloc(NY * dims[q] * es),
                 *p = malloc(dims[q] * es), *ot = malloc(NX * 5 * es), *oc = malloc(NX * 5 * es);
            cr_assert(x && y && p && ot && oc);
            tu_fill(x, d.dtype, NX * dims[q], -3, 3, &st);
            tu_fill(y, d.dtype, NY * dims[q], -3, 3, &st);
            tu_fill(p, d.dtype, dims[q], -3, 3, &st);
            const void *args[] = {x, y, p};
            cr_assert_eq(sr_kernel_run(kt, NX, NY, args, ot), SR_OK, "%s", sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_run(kc, NX, NY, args, oc), SR_OK, "%s", sr_ctx_error(cc_ctx));
            for (int i = 0; i < NX * 5; i++) {
                double vt = tu_get(ot, d.dtype, i), vc = tu_get(oc, d.dtype, i);
                cr_assert(exact ? vt == vc : tu_close(vt, vc, dt ? 1e-13 : 1e-5, 0),
                          "D = %d, %s, value %d: %.17g on tier 0, %.17g compiled", dims[q],
                          dt ? "f64" : "f32", i, vt, vc);
            }
            free(x), free(y), free(p), free(ot), free(oc);
            sr_kernel_free(kt);
            sr_kernel_free(kc);
        }
    sr_ctx_free(cc_ctx);
}

/* KMin when a NaN fills the list's last place after one tile: a later tile of numbers, whose
 * least is larger than every number so far, still replaces it (NaN ranks after +inf). */
Test(tile, kmin_nan_then_numbers)
{
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_KMIN_ARGKMIN;
    d.k = 2;
    d.dtype = SR_F64;
    sr_kernel *kt = kernel("x + y", al, 2, d, SR_DEVICE_CPU);
    enum { NY = 300 };
    double x[1] = {0}, y[NY], out[2];
    int64_t idx[2];
    for (int j = 0; j < NY; j++)
        y[j] = j == 3 ? 10.0 : j < 256 ? NAN : 20.0 + j;
    const void *args[] = {x, y};
    sr_run_desc rd = {1, NY, 2, args, out, idx};
    cr_assert_eq(sr_kernel_run_ex(kt, &rd), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(out[0] == 10.0 && idx[0] == 3, "first: %g at %lld", out[0], (long long)idx[0]);
    cr_assert(out[1] == 276.0 && idx[1] == 256, "second: %g at %lld", out[1], (long long)idx[1]);
    sr_kernel_free(kt);
}

/* The chains run as one loop (-(a b), exp(a b), exp(-(a b)), exp(-a)), a Sum of a product of two
 * tiles folded as a dot product, one-component reduced-index variables read where they lie,
 * distances over 1 to 4 components in one pass; beside them, the same shapes where a chain's
 * inner node has a second reader (so it is not absorbed), over several components (an operand
 * of one component broadcast), per output row and per reduced tile. Both axes, both dtypes,
 * sizes from 1 to past a tile; special values through the Gaussian. */
Test(tile, fused_chains_match_reference)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)",
                               "u=Vi(1)", "v=Vj(1)", "p=Vi(2)", "q=Vj(2)"};
    static const struct {
        const char *f;
        sr_reduction red;
    } cases[] = {
        {"Exp(-SqDist(x, y) * g) * b", SR_SUM},
        {"-SqDist(x, y) * g", SR_LOGSUMEXP},
        {"Exp(SqDist(p, q) * g)", SR_MAX},
        {"Exp(-Sqrt(SqDist(x, y))) * b", SR_SUM},
        {"Exp(-(SqDist(u, v) * g)) + SqDist(u, v) * g", SR_SUM},
        {"Exp(-(x - y) * g)", SR_SUM},
        {"Exp(-(y * g)) * SqDist(x, y)", SR_SUM},
        {"Exp(-(u * g)) + SqDist(u, v)", SR_SUM},
        {"SqDist(p, q) * b", SR_SUM},
        {"Exp(-SqDist(u, v)) * v", SR_MIN},
    };
    static const int64_t sizes[][2] = {{1, 1}, {1, 300}, {257, 515}, {31, 9001}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int dt = 0; dt < 2; dt++)
            for (int axis = 1; axis >= 0; axis--) {
                sr_kernel_desc d = sr_kernel_desc_default();
                d.dtype = dt ? SR_F64 : SR_F32;
                d.axis = axis;
                d.reduction = cases[c].red;
                d.k = 3;
                sr_kernel *kt = kernel(cases[c].f, al, 8, d, SR_DEVICE_CPU);
                sr_kernel *kr = kernel(cases[c].f, al, 8, d, SR_DEVICE_REFERENCE);
                for (int s = 0; s < 4; s++) {
                    int64_t nx = sizes[s][axis ? 0 : 1], ny = sizes[s][axis ? 1 : 0];
                    diff_run(ctx, kt, kr, nx, ny, DIFF_UNIFORM, -1, 1, 5 + (uint64_t)s,
                             diff_tol_of(d.dtype), cases[c].f);
                }
                if (c == 0)
                    diff_run(ctx, kt, kr, 37, 600, DIFF_SPECIAL, 0, 0, 11, diff_tol_of(d.dtype),
                             "gaussian, special values");
                sr_kernel_free(kt);
                sr_kernel_free(kr);
            }
}

/* The K-selections past their first K values scan only the blocks of 16 that hold a value below
 * the K-th: many tiles, many ties (small integers), values of a grid, both dtypes and axes. */
Test(tile, kmin_scans_blocks_below_threshold)
{
    static const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    for (int dt = 0; dt < 2; dt++)
        for (int axis = 1; axis >= 0; axis--)
            for (int g = 0; g < 2; g++) {
                sr_kernel_desc d = sr_kernel_desc_default();
                d.dtype = dt ? SR_F64 : SR_F32;
                d.axis = axis;
                d.reduction = SR_KMIN_ARGKMIN;
                d.k = 7;
                sr_kernel *kt = kernel("SqDist(x, y)", al, 2, d, SR_DEVICE_CPU);
                sr_kernel *kr = kernel("SqDist(x, y)", al, 2, d, SR_DEVICE_REFERENCE);
                diff_run(ctx, kt, kr, axis ? 19 : 3001, axis ? 3001 : 19,
                         g ? DIFF_SMALLINT : DIFF_GRID, -1, 1, 31, diff_tol_of(d.dtype),
                         "kmin over many tiles");
                sr_kernel_free(kt);
                sr_kernel_free(kr);
            }
}

/* sr_kernel_eval_block on a kernel the tile interpreter serves: F's values, those of the
 * reference's block, also for a product of two tiles (which the Sum itself folds without forming
 * F) and an F of two components; both dtypes, a block that no tile divides. */
Test(tile, eval_block_matches_reference)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)", "w=Vj(2)"};
    static const char *const forms[] = {"Exp(-SqDist(x, y) * g) * b", "Exp(-SqDist(x, y)) * w"};
    enum { NX = 70, NY = 300, I0 = 3, NI = 66, J0 = 5, NJ = 290 };
    for (int q = 0; q < 2; q++)
        for (int dt = 0; dt < 2; dt++) {
            sr_kernel_desc d = sr_kernel_desc_default();
            d.dtype = dt ? SR_F64 : SR_F32;
            sr_kernel *kt = kernel(forms[q], al, 5, d, SR_DEVICE_CPU);
            sr_kernel *kr = kernel(forms[q], al, 5, d, SR_DEVICE_REFERENCE);
            cr_assert_eq(tu_plan(kt).tier, 0);
            cr_assert_eq(tu_plan(kt).eval_block, 2);
            const size_t es = dt ? 8 : 4;
            void *x = malloc(NX * 3 * es), *y = malloc(NY * 3 * es), *b = malloc(NY * es),
                 *w = malloc(NY * 2 * es), *ot = malloc(NI * NJ * 2 * es),
                 *orf = malloc(NI * NJ * 2 * es);
            uint64_t s = 17;
            tu_fill(x, d.dtype, NX * 3, -1, 1, &s);
            tu_fill(y, d.dtype, NY * 3, -1, 1, &s);
            tu_fill(b, d.dtype, NY, -1, 1, &s);
            tu_fill(w, d.dtype, NY * 2, -1, 1, &s);
            double g64 = 0.7;
            float g32 = 0.7f;
            const void *args[] = {x, y, b, dt ? (const void *)&g64 : (const void *)&g32, w};
            cr_assert_eq(sr_kernel_eval_block(kt, NX, NY, args, I0, NI, J0, NJ, ot), SR_OK, "%s",
                         sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_eval_block(kr, NX, NY, args, I0, NI, J0, NJ, orf), SR_OK, "%s",
                         sr_ctx_error(ctx));
            const struct diff_tol tl = diff_tol_of(d.dtype);
            const int64_t nv = (int64_t)NI * NJ * (q ? 2 : 1);
            for (int64_t t = 0; t < nv; t++) {
                double a = dt ? ((double *)ot)[t] : ((float *)ot)[t];
                double r = dt ? ((double *)orf)[t] : ((float *)orf)[t];
                cr_assert(tu_close(a, r, tl.rtol, tl.atol), "%s %s [%lld]: %.9g, reference %.9g",
                          forms[q], dt ? "f64" : "f32", (long long)t, a, r);
            }
            free(x), free(y), free(b), free(w), free(ot), free(orf);
            sr_kernel_free(kt);
            sr_kernel_free(kr);
        }
}
