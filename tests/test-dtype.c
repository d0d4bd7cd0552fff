/*
 * test-dtype.c — the 16-bit dtypes, float16 and bfloat16: the conversions (every float16 value
 * round trips; narrowing rounds to nearest even, checked against the compiler's _Float16 and an
 * exact bfloat16 rounding), and kernels of these dtypes on the reference and the CPU JIT against
 * a float64 computation on the same (widened) inputs, through every entry point that takes
 * arrays: run, run_ex with indices, ranges, eval_block, the gradient kernel, solve, sr_chain,
 * with each accumulation mode, and on the gemm-epilogue and fused strategies (the float32
 * kernel's outputs on the widened inputs, rounded, to within one unit). The differential tests of
 * every op and reduction in these dtypes are in test-jit.c (diff.c), the fuzzer's in fuzz.c.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/cpu.h"
#include "diff.h"
#include "util.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(dtype, .init = setup, .fini = teardown);

static const sr_dtype halves[2] = {SR_F16, SR_BF16};
static const sr_device devices[2] = {SR_DEVICE_REFERENCE, SR_DEVICE_CPU};

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- conversions ---------------------------------------------------------------------------- */

Test(dtype, f16_every_value_round_trips)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sr__f16_to_f32((uint16_t)h);
        uint16_t back = sr__f32_to_f16(f);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) { /* NaN: stays a quiet NaN, same sign */
            cr_assert(isnan(f), "0x%04x widened to %g", h, f);
            cr_assert_eq(back & 0xfe00u, (h & 0x8000u) | 0x7e00u, "NaN 0x%04x -> 0x%04x", h, back);
        } else {
            cr_assert_eq(back, h, "0x%04x -> %.9g -> 0x%04x", h, f, back);
        }
    }
    cr_assert_eq(sr__f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(sr__f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(sr__f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(sr__f16_to_f32(0xfc00), -INFINITY);
}

Test(dtype, f16_narrowing_rounds_to_nearest_even)
{
    /* ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (even: 1); 1 + 3*2^-11 goes up */
    cr_assert_eq(sr__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(sr__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert_eq(sr__f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(sr__f32_to_f16(65520.0f), 0x7c00); /* the tie above the largest: infinity */
    cr_assert_eq(sr__f32_to_f16(0x1p-25f), 0x0000); /* half the smallest subnormal: even 0 */
    cr_assert_eq(sr__f32_to_f16(0x1.8p-24f), 0x0002);
    cr_assert_eq(sr__f32_to_f16(-0.0f), 0x8000);
#ifdef __FLT16_MAX__
    /* the compiler's conversion (correctly rounded) over a spread of float32 bit patterns */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        float f = from_bits((uint32_t)u);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, 2);
        cr_assert_eq(sr__f32_to_f16(f), want, "%a: 0x%04x, _Float16 0x%04x", (double)f,
                     sr__f32_to_f16(f), want);
    }
#endif
}

Test(dtype, bf16_narrowing_rounds_to_nearest_even)
{
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) {
        float f = from_bits((uint32_t)u);
        uint16_t got = sr__f32_to_bf16(f);
        if (isnan(f)) {
            cr_assert(isnan(sr__bf16_to_f32(got)), "NaN %08llx -> 0x%04x", (unsigned long long)u,
                      got);
            continue;
        }
        /* the two neighbours, chosen by distance in double, ties to the even one; above the
         * largest finite value the upper neighbour is 2^128, which rounds to infinity */
        uint32_t lo = (uint32_t)u & 0xffff0000u, hi = lo + 0x10000u;
        if (isinf(from_bits(lo)))
            hi = lo;
        double hv = isinf(from_bits(hi)) && !isinf(from_bits(lo)) ? copysign(0x1p128, f)
                                                                  : (double)from_bits(hi);
        double dl = fabs((double)f - (double)from_bits(lo)), dh = fabs(hv - (double)f);
        uint16_t want =
            (uint16_t)((dl < dh || (dl == dh && !((lo >> 16) & 1))) ? lo >> 16 : hi >> 16);
        cr_assert_eq(got, want, "%a: 0x%04x, want 0x%04x", (double)f, got, want);
        cr_assert_eq(sr__bf16_to_f32(got), from_bits((uint32_t)got << 16));
    }
    cr_assert_eq(sr__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie: even */
    cr_assert_eq(sr__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie: even, up */
    cr_assert_eq(sr__f32_to_bf16(INFINITY), 0x7f80);
}

/* ---- kernels -------------------------------------------------------------------------------- */

static const char *const al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)"};

/* Arrays of the dtype with values drawn uniformly, and their values as doubles. */
struct arr {
    void *h;
    double *d;
    int64_t n;
};

static struct arr arr_new(sr_dtype dt, int64_t n, double lo, double hi, uint64_t seed)
{
    struct arr a = {malloc((size_t)(n ? n : 1) * 8), malloc((size_t)(n ? n : 1) * 8), n};
    for (int64_t t = 0; t < n; t++) {
        sr__dtype_put(dt, a.h, t, tu_uniform(&seed, lo, hi));
        a.d[t] = sr__dtype_get(dt, a.h, t);
    }
    return a;
}

static void arr_free(struct arr *a)
{
    free(a->h);
    free(a->d);
}

static sr_kernel *kernel(const char *formula, sr_reduction red, int axis, sr_dtype dt,
                         sr_device dev, sr_acc acc)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.acc = acc;
    d.k = 3;
    return diff_kernel(ctx, diff_parse(ctx, formula, al, 4), d, dev);
}

/* The Gaussian mat-vec in float64 from the widened inputs. */
static double gauss(const struct arr *x, const struct arr *y, const struct arr *b, double g,
                    int64_t i, int64_t j, int c)
{
    double r2 = 0;
    for (int q = 0; q < 3; q++)
        r2 += (x->d[i * 3 + q] - y->d[j * 3 + q]) * (x->d[i * 3 + q] - y->d[j * 3 + q]);
    return exp(-g * r2) * b->d[j * 2 + c];
}

static const char *const gauss_f = "Exp(-g * SqDist(x, y)) * b";

Test(dtype, gaussian_sum_matches_float64)
{
    static const int64_t sizes[][2] = {{1, 1}, {131, 257}, {7, 4099}, {1009, 13}};
    static const sr_acc accs[] = {SR_ACC_BLOCK, SR_ACC_KAHAN, SR_ACC_F64};
    for (int t = 0; t < 2; t++)
        for (int dv = 0; dv < 2; dv++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                const sr_dtype dt = halves[t];
                const int64_t nx = sizes[s][0], ny = sizes[s][1];
                struct arr x = arr_new(dt, nx * 3, -1, 1, 1 + s), y = arr_new(dt, ny * 3, -1, 1, 2),
                           b = arr_new(dt, ny * 2, 0, 1, 3), g = arr_new(dt, 1, 0.5, 0.5, 4);
                sr_kernel *k = kernel(gauss_f, SR_SUM, 1, dt, devices[dv], accs[s % 3]);
                uint16_t *out = malloc((size_t)nx * 2 * 2);
                const void *args[] = {x.h, y.h, b.h, g.h};
                cr_assert_eq(sr_kernel_run(k, nx, ny, args, out), SR_OK, "%s", sr_ctx_error(ctx));
                const struct diff_tol tl = diff_tol_of(dt);
                for (int64_t i = 0; i < nx; i++)
                    for (int c = 0; c < 2; c++) {
                        double want = 0;
                        for (int64_t j = 0; j < ny; j++)
                            want += gauss(&x, &y, &b, 0.5, i, j, c);
                        /* the output is the float64 value rounded to the dtype, to within the
                         * float32 computation's error */
                        double got = sr__dtype_get(dt, out, i * 2 + c);
                        cr_assert(tu_close(got, want, tl.rtol, 0),
                                  "%s %s %lldx%lld [%lld,%d]: %.6g, float64 %.6g",
                                  diff_dtype_tag(dt), k->backend->name, (long long)nx,
                                  (long long)ny, (long long)i, c, got, want);
                    }
                free(out);
                sr_kernel_free(k);
                arr_free(&x);
                arr_free(&y);
                arr_free(&b);
                arr_free(&g);
            }
}

/* Sums exact in float32 that lie halfway between two values of the dtype, or just above: the
 * stores round to nearest with ties to even (truncation, or ties away, gives other bits). */
Test(dtype, outputs_round_to_nearest_even)
{
    static const char *const yal[] = {"y=Vj(1)"};
    static const struct {
        sr_dtype dt;
        double y[3];
        uint16_t want;
    } cases[] = {
        {SR_BF16, {1, 0x1p-7, 0x1p-8}, 0x3f82},  /* 1 + 3 2^-8: the tie goes to even, up */
        {SR_BF16, {1, 0x1p-8, 0x1p-12}, 0x3f81}, /* above the tie: up */
        {SR_BF16, {1, 0x1p-8, 0}, 0x3f80},       /* the tie: even, down */
        {SR_F16, {1, 0x1p-10, 0x1p-11}, 0x3c02}, /* 1 + 3 2^-11 */
        {SR_F16, {1, 0x1p-11, 0x1p-15}, 0x3c01}, {SR_F16, {1, 0x1p-11, 0}, 0x3c00},
    };
    for (int dv = 0; dv < 2; dv++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            sr_kernel_desc d = sr_kernel_desc_default();
            d.dtype = cases[c].dt;
            sr_kernel *k = diff_kernel(ctx, diff_parse(ctx, "y", yal, 1), d, devices[dv]);
            uint16_t y[3], out[2] = {0, 0};
            for (int j = 0; j < 3; j++)
                sr__dtype_put(cases[c].dt, y, j, cases[c].y[j]);
            const void *args[] = {y};
            cr_assert_eq(sr_kernel_run(k, 2, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
            for (int i = 0; i < 2; i++)
                cr_assert_eq(out[i], cases[c].want, "%s %s case %zu: 0x%04x, want 0x%04x",
                             diff_dtype_tag(cases[c].dt), k->backend->name, c, out[i],
                             cases[c].want);
            sr_kernel_free(k);
        }
}

Test(dtype, plan_states_the_accumulation_and_the_conversion)
{
    sr_kernel *k = kernel(gauss_f, SR_SUM, 1, SR_BF16, SR_DEVICE_CPU, SR_ACC_KAHAN);
    const char *e = sr_kernel_explain(k);
    sr_plan_info p = tu_plan(k);
    cr_assert_eq(p.acc, SR_ACC_KAHAN, "%s", e);
    /* the direct strategy converts in its generated code, without float32 copies */
    cr_assert(k->io_native);
    cr_assert(p.io_native, "%s", e);
    sr_kernel_free(k);
}

Test(dtype, empty_reductions_give_the_identities)
{
    static const struct {
        sr_reduction red;
        uint16_t f16, bf16;
    } cases[] = {{SR_SUM, 0x0000, 0x0000},
                 {SR_MIN, 0x7c00, 0x7f80},
                 {SR_MAX, 0xfc00, 0xff80},
                 {SR_LOGSUMEXP, 0xfc00, 0xff80}};
    for (int t = 0; t < 2; t++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            sr_kernel *k = kernel("SqDist(x, y)", cases[c].red, 1, halves[t], SR_DEVICE_CPU, 0);
            struct arr x = arr_new(halves[t], 9, -1, 1, 5);
            uint16_t out[3] = {1, 1, 1};
            const void *args[] = {x.h, NULL};
            cr_assert_eq(sr_kernel_run(k, 3, 0, args, out), SR_OK, "%s", sr_ctx_error(ctx));
            for (int i = 0; i < 3; i++)
                cr_assert_eq(out[i], t ? cases[c].bf16 : cases[c].f16, "%s %s: 0x%04x",
                             diff_dtype_tag(halves[t]), sr_reduction_name(cases[c].red), out[i]);
            sr_kernel_free(k);
            arr_free(&x);
        }
}

/* Ties broken towards the lower index, values and indices of KMin_ArgKMin in both dtypes on the
 * reference and the JIT against a float64 selection. Grid inputs: SqDist is exact. */
Test(dtype, kmin_argkmin_matches_float64)
{
    for (int t = 0; t < 2; t++)
        for (int dv = 0; dv < 2; dv++) {
            const sr_dtype dt = halves[t];
            const int64_t nx = 37, ny = 1031;
            struct arr x = arr_new(dt, nx * 3, 0, 8, 6), y = arr_new(dt, ny * 3, 0, 8, 7);
            for (int64_t q = 0; q < x.n; q++)
                sr__dtype_put(dt, x.h, q, x.d[q] = floor(x.d[q]));
            for (int64_t q = 0; q < y.n; q++)
                sr__dtype_put(dt, y.h, q, y.d[q] = floor(y.d[q]));
            sr_kernel *k = kernel("SqDist(x, y)", SR_KMIN_ARGKMIN, 1, dt, devices[dv], 0);
            uint16_t *v = malloc((size_t)nx * 3 * 2);
            int64_t *ix = malloc((size_t)nx * 3 * 8);
            const void *args[] = {x.h, y.h};
            sr_run_desc r = {nx, ny, 2, args, v, ix};
            cr_assert_eq(sr_kernel_run_ex(k, &r), SR_OK, "%s", sr_ctx_error(ctx));
            for (int64_t i = 0; i < nx; i++) {
                double last = -1;
                int64_t lastj = -1;
                for (int q = 0; q < 3; q++) {
                    /* the q-th smallest (value, index) pair after (last, lastj) */
                    double best = INFINITY;
                    int64_t bj = -1;
                    for (int64_t j = 0; j < ny; j++) {
                        double d2 = 0;
                        for (int c = 0; c < 3; c++)
                            d2 += (x.d[i * 3 + c] - y.d[j * 3 + c]) *
                                  (x.d[i * 3 + c] - y.d[j * 3 + c]);
                        bool after = d2 > last || (d2 == last && j > lastj);
                        if (after && (d2 < best || (d2 == best && j < bj)))
                            best = d2, bj = j;
                    }
                    cr_assert_eq(ix[i * 3 + q], bj, "%s row %lld k %d: %lld, want %lld",
                                 diff_dtype_tag(dt), (long long)i, q, (long long)ix[i * 3 + q],
                                 (long long)bj);
                    cr_assert_eq(sr__dtype_get(dt, v, i * 3 + q), best);
                    last = best, lastj = bj;
                }
            }
            free(v);
            free(ix);
            sr_kernel_free(k);
            arr_free(&x);
            arr_free(&y);
        }
}

/* A float32 kernel of the same formula on the widened inputs, its outputs rounded: what a
 * 16-bit kernel must give, to within one unit in the last place. Not bit for bit: a kernel of
 * the direct strategy reads the 16-bit arrays in its own generated code, which gcc may
 * vectorise otherwise than float32's (libmvec's expf where float32's calls the scalar one, or
 * the reverse), and a last-bit difference of the float32 value moves its rounding across a
 * halfway point now and then. */
static void widen_all(sr_dtype dt, const struct arr *a, int n, float **w, const void **args)
{
    for (int v = 0; v < n; v++) {
        w[v] = malloc((size_t)(a[v].n ? a[v].n : 1) * 4);
        sr__widen(dt, a[v].h, w[v], a[v].n);
        args[v] = w[v];
    }
}

static void free_all(struct arr *a, float **w, int n)
{
    for (int v = 0; v < n; v++) {
        free(w[v]);
        arr_free(&a[v]);
    }
}

static void assert_narrowed(sr_dtype dt, const uint16_t *got, const float *f32, int64_t n,
                            const char *what)
{
    for (int64_t t = 0; t < n; t++) {
        uint16_t want = dt == SR_F16 ? sr__f32_to_f16(f32[t]) : sr__f32_to_bf16(f32[t]);
        /* adjacent values of one sign have adjacent bit patterns */
        cr_assert(got[t] == want || ((got[t] ^ want) < 0x8000u && abs(got[t] - want) == 1),
                  "%s %s value %lld: 0x%04x, float32 %.9g rounds to 0x%04x", what,
                  diff_dtype_tag(dt), (long long)t, got[t], f32[t], want);
    }
}

Test(dtype, ranges_run_as_float32_on_widened_inputs)
{
    const int64_t nx = 300, ny = 200;
    const int64_t ri[] = {0, 100, 150, 300}, si[] = {2, 3}, rj[] = {0, 50, 120, 200, 10, 20};
    const int64_t rj_[] = {0, 120, 120, 200}, sj[] = {1, 3}, rix[] = {0, 100, 150, 300, 20, 40};
    sr_ranges R = {2, ri, si, 3, rj, 2, rj_, sj, 3, rix};
    for (int t = 0; t < 2; t++)
        for (int axis = 0; axis < 2; axis++) {
            const sr_dtype dt = halves[t];
            struct arr a[4] = {arr_new(dt, nx * 3, -1, 1, 8), arr_new(dt, ny * 3, -1, 1, 9),
                               arr_new(dt, ny * 2, -1, 1, 10), arr_new(dt, 1, 1, 1, 0)};
            float *w[4];
            const void *hargs[4], *fargs[4];
            for (int v = 0; v < 4; v++)
                hargs[v] = a[v].h;
            widen_all(dt, a, 4, w, fargs);
            sr_kernel *kh = kernel(gauss_f, SR_SUM, axis, dt, SR_DEVICE_CPU, 0),
                      *kf = kernel(gauss_f, SR_SUM, axis, SR_F32, SR_DEVICE_CPU, 0);
            const int64_t n = (axis ? nx : ny) * 2;
            uint16_t *oh = malloc((size_t)n * 2);
            float *of = malloc((size_t)n * 4);
            sr_run_desc rh = {nx, ny, 4, hargs, oh, NULL}, rf = {nx, ny, 4, fargs, of, NULL};
            cr_assert_eq(sr_kernel_run_ranges(kh, &rh, &R), SR_OK, "%s", sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_run_ranges(kf, &rf, &R), SR_OK, "%s", sr_ctx_error(ctx));
            assert_narrowed(dt, oh, of, n, "ranges");
            free(oh);
            free(of);
            sr_kernel_free(kh);
            sr_kernel_free(kf);
            free_all(a, w, 4);
        }
}

/* The gemm-epilogue (a Gaussian through the inner product of D = 32, forced on) and the fused
 * two-product (16 output columns) strategies, where a GEMM is available: explain names them for
 * the 16-bit kernels too, whose outputs are float32's on the widened inputs, rounded. */
Test(dtype, gemm_epilogue_and_fused_strategies)
{
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    const bool have_gemm = cpu_avx512_usable() || (h != NULL && !getenv("BLIS_ARCH_TYPE"));
    static const char *const gal[] = {"x=Vi(32)", "y=Vj(32)", "b=Vj(16)"};
    static const struct {
        const char *f;
        sr_strategy strategy;
        const char *gemm_env;
        int out_dim;
    } cases[] = {{"Exp(-SqDist(x, y)) * Elem(b, 0)", SR_STRATEGY_GEMM_EPILOGUE, "on", 1},
                 {"Exp(-SqDist(x, y) * Elem(b, 1)) * b", SR_STRATEGY_FUSED, NULL, 16}};
    const int64_t nx = 131, ny = 257;
    for (int t = 0; t < 2; t++)
        for (size_t c = 0; c < 2; c++) {
            const sr_dtype dt = halves[t];
            struct arr a[3] = {arr_new(dt, nx * 32, -0.3, 0.3, 20),
                               arr_new(dt, ny * 32, -0.3, 0.3, 21), arr_new(dt, ny * 16, 0, 1, 22)};
            float *w[3];
            const void *hargs[3], *fargs[3];
            for (int v = 0; v < 3; v++)
                hargs[v] = a[v].h;
            widen_all(dt, a, 3, w, fargs);
            if (cases[c].gemm_env)
                sr_ctx_set_option(ctx, "SYMRED_GEMM", cases[c].gemm_env);
            sr_kernel_desc d = sr_kernel_desc_default();
            sr_expr *f = diff_parse(ctx, cases[c].f, gal, 3);
            d.dtype = dt;
            sr_kernel *kh = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
            d.dtype = SR_F32;
            sr_kernel *kf = diff_kernel(ctx, f, d, SR_DEVICE_CPU);
            sr_ctx_set_option(ctx, "SYMRED_GEMM", NULL);
            const char *ex = sr_kernel_explain(kh);
            if (have_gemm) {
                cr_assert_eq(tu_plan(kh).inner, cases[c].strategy, "%s: expected %s:\n%s",
                             diff_dtype_tag(dt), sr_strategy_name(cases[c].strategy), ex);
                cr_assert(!kh->io_native, "%s runs on float32 copies",
                          sr_strategy_name(cases[c].strategy));
            }
            const int64_t n = nx * cases[c].out_dim;
            uint16_t *oh = malloc((size_t)n * 2);
            float *of = malloc((size_t)n * 4);
            cr_assert_eq(sr_kernel_run(kh, nx, ny, hargs, oh), SR_OK, "%s", sr_ctx_error(ctx));
            cr_assert_eq(sr_kernel_run(kf, nx, ny, fargs, of), SR_OK, "%s", sr_ctx_error(ctx));
            assert_narrowed(dt, oh, of, n, sr_strategy_name(cases[c].strategy));
            free(oh);
            free(of);
            sr_kernel_free(kh);
            sr_kernel_free(kf);
            free_all(a, w, 3);
        }
    if (h)
        dlclose(h);
}

Test(dtype, eval_block_and_gradient_run_as_float32_on_widened_inputs)
{
    const int64_t nx = 41, ny = 67;
    for (int t = 0; t < 2; t++) {
        const sr_dtype dt = halves[t];
        struct arr a[5] = {arr_new(dt, nx * 3, -1, 1, 11), arr_new(dt, ny * 3, -1, 1, 12),
                           arr_new(dt, ny * 2, -1, 1, 13), arr_new(dt, 1, 0.7, 0.7, 0),
                           arr_new(dt, nx * 2, -1, 1, 14)};
        float *w[5];
        const void *hargs[5], *fargs[5];
        for (int v = 0; v < 5; v++)
            hargs[v] = a[v].h;
        widen_all(dt, a, 5, w, fargs);
        sr_kernel *kh = kernel(gauss_f, SR_SUM, 1, dt, SR_DEVICE_CPU, 0),
                  *kf = kernel(gauss_f, SR_SUM, 1, SR_F32, SR_DEVICE_CPU, 0);
        /* a block of F's values */
        uint16_t *oh = malloc((size_t)nx * ny * 2 * 2);
        float *of = malloc((size_t)nx * ny * 2 * 4);
        cr_assert_eq(sr_kernel_eval_block(kh, nx, ny, hargs, 3, 30, 5, 60, oh), SR_OK, "%s",
                     sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_eval_block(kf, nx, ny, fargs, 3, 30, 5, 60, of), SR_OK, "%s",
                     sr_ctx_error(ctx));
        assert_narrowed(dt, oh, of, 30 * 60 * 2, "eval_block");
        /* the gradient with respect to x, of the same dtype; args[4] is the output's gradient */
        sr_kernel *gh, *gf;
        cr_assert_eq(sr_kernel_grad(kh, 0, &gh), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_grad(kf, 0, &gf), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(gh->io, dt);
        cr_assert_eq(sr_kernel_run(gh, nx, ny, hargs, oh), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_kernel_run(gf, nx, ny, fargs, of), SR_OK, "%s", sr_ctx_error(ctx));
        assert_narrowed(dt, oh, of, nx * 3, "gradient");
        sr_kernel_free(gh);
        sr_kernel_free(gf);
        free(oh);
        free(of);
        sr_kernel_free(kh);
        sr_kernel_free(kf);
        free_all(a, w, 5);
    }
}

Test(dtype, solve_and_chain)
{
    static const char *const sal[] = {"x=Vi(2)", "y=Vj(2)", "b=Vj(1)"};
    const int64_t n = 60;
    for (int t = 0; t < 2; t++) {
        const sr_dtype dt = halves[t];
        struct arr x = arr_new(dt, n * 2, -2, 2, 15), rhs = arr_new(dt, n, -1, 1, 16);
        sr_kernel_desc d = sr_kernel_desc_default();
        d.dtype = dt;
        sr_kernel *k =
            diff_kernel(ctx, diff_parse(ctx, "Exp(-SqDist(x, y)) * b", sal, 3), d, SR_DEVICE_CPU);
        sr_solve_desc sd = sr_solve_desc_default();
        sd.b_index = 2;
        sd.alpha = 1.0;
        sd.eps = 1e-3;
        uint16_t *a = malloc((size_t)n * 2);
        const void *args[] = {x.h, x.h, NULL};
        cr_assert_eq(sr_kernel_solve(k, &sd, n, args, rhs.h, a), SR_OK, "%s", sr_ctx_error(ctx));
        /* the residual of (I + K) a = rhs in float64, relative to |rhs| */
        double res = 0, nb = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = sr__dtype_get(dt, a, i);
            for (int64_t j = 0; j < n; j++) {
                double r2 = 0;
                for (int c = 0; c < 2; c++)
                    r2 += (x.d[i * 2 + c] - x.d[j * 2 + c]) * (x.d[i * 2 + c] - x.d[j * 2 + c]);
                s += exp(-r2) * sr__dtype_get(dt, a, j);
            }
            res += (s - rhs.d[i]) * (s - rhs.d[i]);
            nb += rhs.d[i] * rhs.d[i];
        }
        /* a is rounded to the dtype: the residual is a few of its units */
        cr_assert(sqrt(res / nb) < (dt == SR_F16 ? 5e-3 : 4e-2), "%s: relative residual %g",
                  diff_dtype_tag(dt), sqrt(res / nb));

        /* sr_chain: K (n x n) times the dense rhs (n x 1), in the dtype */
        sr_chain *c;
        cr_assert_eq(sr_chain_new(ctx, dt, &c), SR_OK, "%s", sr_ctx_error(ctx));
        static const char *const cal[] = {"x=Vi(2)", "y=Vj(2)"};
        const void *cargs[] = {x.h, x.h};
        cr_assert_eq(
            sr_chain_kernel(c, diff_parse(ctx, "Exp(-SqDist(x, y))", cal, 2), n, n, 2, cargs),
            SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_chain_dense(c, n, 1, rhs.h), SR_OK, "%s", sr_ctx_error(ctx));
        cr_assert_eq(sr_chain_eval(c, a), SR_OK, "%s", sr_ctx_error(ctx));
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t j = 0; j < n; j++) {
                double r2 = 0;
                for (int q = 0; q < 2; q++)
                    r2 += (x.d[i * 2 + q] - x.d[j * 2 + q]) * (x.d[i * 2 + q] - x.d[j * 2 + q]);
                s += exp(-r2) * rhs.d[j];
            }
            cr_assert(tu_close(sr__dtype_get(dt, a, i), s, diff_tol_of(dt).rtol, 1e-3),
                      "%s chain row %lld: %g, float64 %g", diff_dtype_tag(dt), (long long)i,
                      sr__dtype_get(dt, a, i), s);
        }
        sr_chain_free(c);
        free(a);
        sr_kernel_free(k);
        arr_free(&x);
        arr_free(&rhs);
    }
}

Test(dtype, unknown_dtypes_are_rejected)
{
    static const int bad[] = {-1, 4, 99};
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.dtype = (sr_dtype)bad[t];
        sr_kernel *k = (sr_kernel *)1;
        cr_assert_eq(sr_kernel_new(ctx, diff_parse(ctx, "SqDist(x, y)", al, 4), &d, &k), SR_EINVAL);
        cr_assert_null(k);
        cr_assert(strstr(sr_ctx_error(ctx), "SR_BF16"), "%s", sr_ctx_error(ctx));
        sr_chain *c;
        cr_assert_eq(sr_chain_new(ctx, (sr_dtype)bad[t], &c), SR_EINVAL);
        cr_assert(strstr(sr_ctx_error(ctx), "SR_BF16"), "%s", sr_ctx_error(ctx));
    }
}
