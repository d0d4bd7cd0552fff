/*
 * test-cuda.c — the GPU differential suite: the CUDA backend against the reference interpreter
 * through the shared harness (diff.c: every op, every reduction on both axes in both dtypes,
 * sizes 0, 1, primes, nx << ny and nx >> ny, ties, NaN and Inf), plus what only the GPU has:
 * K up to the register limit, device pointers used in place (no copy crosses PCIe), the memory
 * budget on the device, out-of-memory and illegal-address errors that leave the next kernel
 * running. Needs an NVIDIA GPU: every test skips, saying why, where there is none.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "diff.h"
#include "jit/cuda.h"
#include "symred.h"
#include "util.h"

static sr_ctx *ctx;

static void setup(void)
{
    unsetenv("SYMRED_MEM_LIMIT");
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
}
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(cuda, .init = setup, .fini = teardown);

static const struct cuda_device *need_gpu(void)
{
    const struct cuda_device *dev;
    const char *why;
    if (jit_cuda_device(&dev, &why) != SR_OK) {
        /* Under the CUDA emulator (ctest test-cuda-emu) the device must open: a skip would
         * pass without testing anything. */
        if (getenv("SYMRED_TEST_CUDA_EMU"))
            cr_assert_fail("the CUDA emulator did not open: %s", why);
        cr_skip_test("no GPU, CUDA differential tests skipped: %s", why);
    }
    return dev;
}

/* ---- the shared differential harness ------------------------------------------------------ */

#define OPS(name, grp)                                                                             \
    Test(cuda, ops_##name##_f32)                                                                   \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_op_group(ctx, SR_DEVICE_CUDA, grp, SR_F32);                                           \
    }                                                                                              \
    Test(cuda, ops_##name##_f64)                                                                   \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_op_group(ctx, SR_DEVICE_CUDA, grp, SR_F64);                                           \
    }
DIFF_OP_TESTS(OPS)

#define RED(R, name)                                                                               \
    Test(cuda, red_##name##_f32)                                                                   \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_reduction(ctx, SR_DEVICE_CUDA, R, SR_F32);                                            \
    }                                                                                              \
    Test(cuda, red_##name##_f64)                                                                   \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_reduction(ctx, SR_DEVICE_CUDA, R, SR_F64);                                            \
    }                                                                                              \
    Test(cuda, red_##name##_f16)                                                                   \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_reduction(ctx, SR_DEVICE_CUDA, R, SR_F16);                                            \
    }                                                                                              \
    Test(cuda, red_##name##_bf16)                                                                  \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_reduction(ctx, SR_DEVICE_CUDA, R, SR_BF16);                                           \
    }
DIFF_RED_TESTS(RED)

#define SPECIAL(name, R, gen, k, f)                                                                \
    Test(cuda, name)                                                                               \
    {                                                                                              \
        need_gpu();                                                                                \
        diff_special(ctx, SR_DEVICE_CUDA, R, gen, k, f);                                           \
    }
DIFF_SPECIAL_TESTS(SPECIAL)

/* A vector formula with an i-only factor and a weight, every reduction, at sizes that take one
 * block, partial tiles, many blocks and (few rows, many columns) the split-j path. */
Test(cuda, every_reduction_vector_formula_split_j)
{
    need_gpu();
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)", "c=Vi(1)"};
    sr_expr *vec = diff_parse(ctx, "Concat(Exp(-SqDist(x,y)*g)*c, Sum(x*y))", al, 5);
    sr_expr *sca = diff_parse(ctx, "-SqDist(x,y)*g", al, 5);
    sr_expr *w = diff_parse(ctx, "b*c", al, 5);
    const int64_t sizes[][2] = {{1, 5}, {37, 300}, {1000, 777}, {5, 100000}};
    for (int red = 0; red < SR_REDUCTION_COUNT; red++)
        for (int axis = 0; axis < 2; axis++)
            for (int dt = 0; dt < 2; dt++) {
                sr_kernel_desc d = sr_kernel_desc_default();
                bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
                d.reduction = (sr_reduction)red;
                d.axis = axis;
                d.dtype = (sr_dtype)dt;
                d.k = 3;
                d.weight = ssmw ? w : NULL;
                sr_kernel *kc = diff_kernel(ctx, ssmw ? sca : vec, d, SR_DEVICE_CUDA);
                sr_kernel *kr = diff_kernel(ctx, ssmw ? sca : vec, d, SR_DEVICE_REFERENCE);
                for (int s = 0; s < 4; s++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s axis %d %s", sr_reduction_name(d.reduction),
                             axis, dt ? "f64" : "f32");
                    diff_run(ctx, kc, kr, axis ? sizes[s][0] : sizes[s][1],
                             axis ? sizes[s][1] : sizes[s][0], DIFF_UNIFORM, -1, 1, 42 + s,
                             diff_tol_of(d.dtype), what);
                }
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* K-min keeps K * dim(F) values per row in registers: up to 256. Ties (small integers) check
 * the order of equal values, NaN-free grid values the K smallest themselves. */
Test(cuda, kmin_up_to_the_limit)
{
    need_gpu();
    static const char *al[] = {"x=Vi(1)", "y=Vj(1)"};
    sr_expr *f1 = diff_parse(ctx, "Abs(x - y)", al, 2);
    sr_expr *f2 = diff_parse(ctx, "Concat(Abs(x - y), x * y)", al, 2);
    const struct {
        sr_expr *f;
        int k;
        sr_dtype dt;
    } cases[] = {{f1, 256, SR_F32}, {f2, 128, SR_F64}, {f1, 57, SR_F32}, {f1, 57, SR_F64}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = SR_KMIN_ARGKMIN;
        d.k = cases[c].k;
        d.dtype = cases[c].dt;
        sr_kernel *kc = diff_kernel(ctx, cases[c].f, d, SR_DEVICE_CUDA);
        sr_kernel *kr = diff_kernel(ctx, cases[c].f, d, SR_DEVICE_REFERENCE);
        char what[64];
        snprintf(what, sizeof what, "KMin_ArgKMin k=%d %s", d.k, d.dtype == SR_F64 ? "f64" : "f32");
        diff_run(ctx, kc, kr, 37, 1000, DIFF_GRID, -4, 4, 3, diff_tol_of(d.dtype), what);
        diff_run(ctx, kc, kr, 3, 9001, DIFF_SMALLINT, 0, 4, 4, diff_tol_of(d.dtype), what);
        sr_kernel_free(kc);
        sr_kernel_free(kr);
    }
    /* One more than the limit: a clear error, not a kernel that spills or fails to launch. */
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 257;
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k = NULL;
    cr_assert_eq(sr_kernel_new(ctx, f1, &d, &k), SR_ENOTSUP, "k = 257: %s", sr_ctx_error(ctx));
    cr_assert_null(k);
    cr_assert(strstr(sr_ctx_error(ctx), "K*dim > 256"), "message: %s", sr_ctx_error(ctx));
}

/* Gradient kernels (sr_kernel_grad) of CUDA kernels against those of the reference, on the same
 * random inputs (incoming gradients and forward outputs included): every variable (Vi, Vj, Pm),
 * Sum, LogSumExp and SumSoftMaxWeight, both axes, both dtypes; and a gradient of a gradient. */
Test(cuda, gradient_kernels_match_the_reference)
{
    need_gpu();
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_expr *s = diff_parse(ctx, "-SqDist(x,y)*g+Elem(x,0)*b", al, 4);
    sr_expr *w = diff_parse(ctx, "Concat(b, Sin(Elem(x,1)))", al, 4);
    const sr_reduction reds[] = {SR_SUM, SR_LOGSUMEXP, SR_SUMSOFTMAXWEIGHT};
    for (int r = 0; r < 3; r++)
        for (int axis = 0; axis < 2; axis++)
            for (int dt = 0; dt < 2; dt++)
                for (int v = 0; v < 4; v++) {
                    sr_kernel_desc d = sr_kernel_desc_default();
                    d.reduction = reds[r];
                    d.axis = axis;
                    d.dtype = (sr_dtype)dt;
                    d.weight = reds[r] == SR_SUMSOFTMAXWEIGHT ? w : NULL;
                    sr_expr *fr = reds[r] == SR_SUM ? f : s;
                    sr_kernel *kc = diff_kernel(ctx, fr, d, SR_DEVICE_CUDA);
                    sr_kernel *kr = diff_kernel(ctx, fr, d, SR_DEVICE_REFERENCE);
                    sr_kernel *gc = NULL, *gr = NULL, *hc = NULL, *hr = NULL;
                    cr_assert_eq(sr_kernel_grad(kc, v, &gc), SR_OK, "%s", sr_ctx_error(ctx));
                    cr_assert_eq(sr_kernel_grad(kr, v, &gr), SR_OK, "%s", sr_ctx_error(ctx));
                    char what[96];
                    snprintf(what, sizeof what, "gradient of %s axis %d %s w.r.t. argument %d",
                             sr_reduction_name(reds[r]), axis, dt ? "f64" : "f32", v);
                    diff_run(ctx, gc, gr, 37, 1000, DIFF_UNIFORM, 0.1, 1, 5 + v,
                             diff_tol_of(d.dtype), what);
                    diff_run(ctx, gc, gr, 3, 9001, DIFF_UNIFORM, 0.1, 1, 6 + v,
                             diff_tol_of(d.dtype), what);
                    if (reds[r] == SR_SUM && v == 0) {
                        cr_assert_eq(sr_kernel_grad(gc, 1, &hc), SR_OK, "%s", sr_ctx_error(ctx));
                        cr_assert_eq(sr_kernel_grad(gr, 1, &hr), SR_OK, "%s", sr_ctx_error(ctx));
                        diff_run(ctx, hc, hr, 41, 700, DIFF_UNIFORM, 0.1, 1, 7,
                                 diff_tol_of(d.dtype), "second derivative (x then y)");
                        sr_kernel_free(hc);
                        sr_kernel_free(hr);
                    }
                    sr_kernel_free(gc);
                    sr_kernel_free(gr);
                    sr_kernel_free(kc);
                    sr_kernel_free(kr);
                }
}

/* ---- device pointers ------------------------------------------------------------------------ */

static sr_kernel *gauss_kernel(sr_dtype dt)
{
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.dtype = dt;
    return diff_kernel(ctx, f, d, SR_DEVICE_CUDA);
}

enum { NX = 300, NY = 200 };

struct gauss_data {
    float x[NX * 3], y[NY * 3], b[NY], g, ref[NX];
};

static void gauss_data(struct gauss_data *gd)
{
    uint64_t rng = 7;
    tu_fill(gd->x, SR_F32, NX * 3, -1, 1, &rng);
    tu_fill(gd->y, SR_F32, NY * 3, -1, 1, &rng);
    tu_fill(gd->b, SR_F32, NY, -1, 1, &rng);
    gd->g = 0.5f;
    for (int i = 0; i < NX; i++) {
        double s = 0;
        for (int j = 0; j < NY; j++) {
            double d2 = 0;
            for (int c = 0; c < 3; c++) {
                double t = (double)gd->x[3 * i + c] - gd->y[3 * j + c];
                d2 += t * t;
            }
            s += exp(-d2 * gd->g) * gd->b[j];
        }
        gd->ref[i] = (float)s;
    }
}

static void check_gauss(const float *out, const struct gauss_data *gd, const char *what)
{
    for (int i = 0; i < NX; i++)
        cr_assert(tu_close(out[i], gd->ref[i], 1e-5, 1e-5), "%s [%d]: %g vs %g", what, i, out[i],
                  gd->ref[i]);
}

Test(cuda, device_pointers_in_place_no_copies)
{
    const struct cuda_device *dev = need_gpu();
    const struct cuda_api *cu = dev->api;
    sr_kernel *k = gauss_kernel(SR_F32);
    struct gauss_data gd;
    gauss_data(&gd);
    float out[NX];
    /* Host arrays: every input crosses once, the output once. */
    const void *hargs[] = {gd.x, gd.y, gd.b, &gd.g};
    cr_assert_eq(sr_kernel_run(k, NX, NY, hargs, out), SR_OK, "%s", sr_ctx_error(ctx));
    check_gauss(out, &gd, "host arrays");
    uint64_t h0, d0, h1, d1;
    cuda_kernel_copies(k, &h0, &d0);
    cr_assert_eq(h0, sizeof gd.x + sizeof gd.y + sizeof gd.b + sizeof gd.g, "htod %llu",
                 (unsigned long long)h0);
    cr_assert_eq(d0, sizeof out, "dtoh %llu", (unsigned long long)d0);

    /* Everything on the device: nothing crosses. */
    cr_assert_eq(cu->ctx_set_current(dev->ctx), CU_SUCCESS);
    cu_deviceptr dx, dy, db, dg, dout;
    cr_assert_eq(cu->mem_alloc(&dx, sizeof gd.x), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dy, sizeof gd.y), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&db, sizeof gd.b), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dg, sizeof gd.g), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dout, sizeof out), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(dx, gd.x, sizeof gd.x), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(dy, gd.y, sizeof gd.y), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(db, gd.b, sizeof gd.b), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(dg, &gd.g, sizeof gd.g), CU_SUCCESS);
    const void *dargs[] = {(const void *)(uintptr_t)dx, (const void *)(uintptr_t)dy,
                           (const void *)(uintptr_t)db, (const void *)(uintptr_t)dg};
    sr_run_desc r = {.nx = NX, .ny = NY, .nargs = 4, .args = dargs, .out = (void *)(uintptr_t)dout};
    cr_assert_eq(sr_kernel_run_device(k, &r, 0xf, 1), SR_OK, "%s", sr_ctx_error(ctx));
    cuda_kernel_copies(k, &h1, &d1);
    cr_assert_eq(h1, h0, "device pointers: %llu bytes copied to the device",
                 (unsigned long long)(h1 - h0));
    cr_assert_eq(d1, d0, "device pointers: %llu bytes copied back", (unsigned long long)(d1 - d0));
    memset(out, 0, sizeof out);
    cr_assert_eq(cu->memcpy_dtoh(out, dout, sizeof out), CU_SUCCESS);
    check_gauss(out, &gd, "device arrays");

    /* Mixed: y on the device, the rest on the host; the output on the device. */
    const void *margs[] = {gd.x, (const void *)(uintptr_t)dy, gd.b, &gd.g};
    r.args = margs;
    cr_assert_eq(sr_kernel_run_device(k, &r, 1u << 1, 1), SR_OK, "%s", sr_ctx_error(ctx));
    cuda_kernel_copies(k, &h0, &d0);
    cr_assert_eq(h0 - h1, sizeof gd.x + sizeof gd.b + sizeof gd.g, "mixed: htod %llu",
                 (unsigned long long)(h0 - h1));
    cr_assert_eq(d0, d1, "mixed: the device output was copied back");
    cr_assert_eq(cu->memcpy_dtoh(out, dout, sizeof out), CU_SUCCESS);
    check_gauss(out, &gd, "mixed");
    cu->mem_free(dx), cu->mem_free(dy), cu->mem_free(db), cu->mem_free(dg), cu->mem_free(dout);
    sr_kernel_free(k);
}

/* ---- memory -------------------------------------------------------------------------------- */

/* Under a budget the output rows go through the device in passes; the result is the same. */
Test(cuda, memory_budget_passes)
{
    need_gpu();
    struct gauss_data gd;
    gauss_data(&gd);
    const void *hargs[] = {gd.x, gd.y, gd.b, &gd.g};
    float out[NX];
    /* y and b copied whole (2400 + 800 + 4 bytes), then 16 bytes a row: 1000 bytes of rows. */
    const int64_t budgets[] = {3204 + 1000, 3204 + 16, 3204 + 16 * 299, 1 << 20};
    for (size_t t = 0; t < sizeof budgets / sizeof *budgets; t++) {
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, budgets[t]), SR_OK);
        sr_kernel *k = gauss_kernel(SR_F32);
        memset(out, 0, sizeof out);
        cr_assert_eq(sr_kernel_run(k, NX, NY, hargs, out), SR_OK, "budget %lld: %s",
                     (long long)budgets[t], sr_ctx_error(ctx));
        char what[64];
        snprintf(what, sizeof what, "budget %lld", (long long)budgets[t]);
        check_gauss(out, &gd, what);
        sr_kernel_free(k);
    }
    /* Too small for the arrays copied whole: SR_EBUDGET saying how much is needed. */
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 3000), SR_OK);
    sr_kernel *k = gauss_kernel(SR_F32);
    sr_status st = sr_kernel_run(k, NX, NY, hargs, out);
    cr_assert_eq(st, SR_EBUDGET, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "3204 bytes"), "message: %s", sr_ctx_error(ctx));
    /* The split-j workspace stays under the budget too: few rows, many columns. */
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    sr_kernel_free(k);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 200000 * 16 + 4 + 5 * 16 + 4 * 5 * 8), SR_OK);
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *kc = diff_kernel(ctx, f, d, SR_DEVICE_CUDA);
    sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
    diff_run(ctx, kc, kr, 5, 200000, DIFF_UNIFORM, -1, 1, 9, (struct diff_tol){2e-4, 1e-4},
             "split-j under a budget");
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}

/* More device memory than the card has: SR_ENOMEM with the driver's figures; the context and
 * the device stay usable. The host array is never read: the allocation fails first. */
Test(cuda, out_of_device_memory)
{
    need_gpu();
    if (getenv("SYMRED_TEST_NO_FAULTS"))
        cr_skip_test("SYMRED_TEST_NO_FAULTS is set (a planted fault is not run under a sanitizer)");
    sr_kernel *k = gauss_kernel(SR_F32);
    struct gauss_data gd;
    gauss_data(&gd);
    float out[NX];
    const void *hargs[] = {gd.x, gd.y, gd.b, &gd.g};
    /* 2^40 points of y: 12 TiB. */
    sr_run_desc r = {.nx = NX, .ny = (int64_t)1 << 40, .nargs = 4, .args = hargs, .out = out};
    sr_status st = sr_kernel_run_ex(k, &r);
    cr_assert_eq(st, SR_ENOMEM, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "out of device memory"), "message: %s", sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "bytes free"), "message: %s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run(k, NX, NY, hargs, out), SR_OK, "after OOM: %s", sr_ctx_error(ctx));
    check_gauss(out, &gd, "after out-of-memory");
    sr_kernel_free(k);
}

/* Device pointers are checked before the launch: one the driver does not know, and one whose
 * allocation is too small, are SR_EINVAL with a message, and nothing faults on the GPU. */
Test(cuda, bad_device_pointers_are_refused_before_launch)
{
    const struct cuda_device *dev = need_gpu();
    if (getenv("SYMRED_TEST_NO_FAULTS"))
        cr_skip_test("SYMRED_TEST_NO_FAULTS is set (the driver errors planted here would be "
                     "reported by the sanitizer)");
    const struct cuda_api *cu = dev->api;
    sr_kernel *k = gauss_kernel(SR_F32);
    struct gauss_data gd;
    gauss_data(&gd);
    float out[NX];
    const void *bad[] = {gd.x, (const void *)(uintptr_t)0x100, gd.b, &gd.g};
    sr_run_desc r = {.nx = NX, .ny = NY, .nargs = 4, .args = bad, .out = out};
    sr_status st = sr_kernel_run_device(k, &r, 1u << 1, 0);
    cr_assert_eq(st, SR_EINVAL, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "argument 1 (0x100) is marked as a device pointer"),
              "message: %s", sr_ctx_error(ctx));
    /* y needs NY * 3 floats; give one row less. */
    cr_assert_eq(cu->ctx_set_current(dev->ctx), CU_SUCCESS);
    cu_deviceptr dy, dout;
    cr_assert_eq(cu->mem_alloc(&dy, sizeof gd.y - 12), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dout, sizeof out - 4), CU_SUCCESS);
    const void *small[] = {gd.x, (const void *)(uintptr_t)dy, gd.b, &gd.g};
    r.args = small;
    st = sr_kernel_run_device(k, &r, 1u << 1, 0);
    cr_assert_eq(st, SR_EINVAL, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "needs 2400 bytes"), "message: %s", sr_ctx_error(ctx));
    const void *hargs[] = {gd.x, gd.y, gd.b, &gd.g};
    r.args = hargs;
    r.out = (void *)(uintptr_t)dout;
    st = sr_kernel_run_device(k, &r, 0, 1);
    cr_assert_eq(st, SR_EINVAL, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "the values"), "message: %s", sr_ctx_error(ctx));
    /* Nothing faulted: the kernel runs. */
    cr_assert_eq(sr_kernel_run(k, NX, NY, hargs, out), SR_OK, "after: %s", sr_ctx_error(ctx));
    check_gauss(out, &gd, "after refused device pointers");
    cu->mem_free(dy);
    cu->mem_free(dout);
    sr_kernel_free(k);
}

/* After a sticky driver error (an illegal address inside a kernel) CUDA cannot recover the
 * context; symred then fails every GPU run at once with the first error's text, and the CPU
 * backends of the same context keep working. The fault itself cannot be planted through the
 * public API any more (pointers are checked), so the test records it as the runtime does. Each
 * Criterion test runs in its own process, so the others are not affected. */
Test(cuda, lost_context_is_reported_and_cpu_still_works)
{
    need_gpu();
    sr_kernel *k = gauss_kernel(SR_F32);
    struct gauss_data gd;
    gauss_data(&gd);
    float out[NX];
    const void *hargs[] = {gd.x, gd.y, gd.b, &gd.g};
    jit_cuda_mark_lost(700, "the kernel (cuCtxSynchronize)");
    sr_status st = sr_kernel_run(k, NX, NY, hargs, out);
    cr_assert_eq(st, SR_EINTERNAL, "status %d: %s", st, sr_ctx_error(ctx));
    cr_assert(strstr(sr_ctx_error(ctx), "lost earlier in this process") &&
                  strstr(sr_ctx_error(ctx), "error 700"),
              "message: %s", sr_ctx_error(ctx));
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f = diff_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4);
    sr_kernel *kc = diff_kernel(ctx, f, sr_kernel_desc_default(), SR_DEVICE_CPU);
    cr_assert_eq(sr_kernel_run(kc, NX, NY, hargs, out), SR_OK, "cpu: %s", sr_ctx_error(ctx));
    check_gauss(out, &gd, "cpu after a lost GPU context");
    sr_kernel_free(kc);
    sr_kernel_free(k);
}

/* ---- block-sparse ranges -------------------------------------------------------------------- */

/* Every reduction on both axes against the reference with the same ranges: blocks given out of
 * order, an empty block, uncovered rows, empty and touching intervals, blocks longer than a
 * CUDA block of rows, and (under a budget) output rows in passes, each with its part of the
 * ranges. Never run in the session that wrote it (no GPU there). */
static void ranges_case(sr_reduction red, int axis, sr_dtype dt, int64_t budget)
{
    static const char *const al[] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "b=Vj(2)"};
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.k = 3;
    const char *ftext = "Concat(SqDist(x, y), (x|y) - p)";
    if (red == SR_SUMSOFTMAXWEIGHT) {
        ftext = "-SqDist(x, y) * p";
        d.weight = diff_parse(ctx, "Concat(b, Elem(x, 0) * Elem(y, 1))", al, 4);
    }
    sr_expr *f = diff_parse(ctx, ftext, al, 4);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, budget), SR_OK);
    sr_kernel *kc = diff_kernel(ctx, f, d, SR_DEVICE_CUDA);
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
    enum { NO = 700, NR = 900 };
    int64_t nx = axis ? NO : NR, ny = axis ? NR : NO;
    /* output blocks (unsorted; [650, 700) in none) and their intervals */
    static const int64_t rg[] = {300, 640, 0, 5, 5, 5, 5, 300, 640, 650};
    static const int64_t sl[] = {3, 4, 4, 7, 8};
    static const int64_t red_iv[] = {0, 10, 10, 400, 800, 900, 3, 4, 0, 5, 5, 5, 17, 900, 450, 451};
    sr_ranges R = {0};
    if (axis == 1) {
        R = (sr_ranges){.nranges_i = 5,
                        .ranges_i = rg,
                        .slices_i = sl,
                        .nredranges_j = 8,
                        .redranges_j = red_iv};
    } else {
        R.nranges_j = 5;
        R.ranges_j = rg;
        R.slices_j = sl;
        R.nredranges_i = 8;
        R.redranges_i = red_iv;
    }
    float *buf[4];
    int64_t rows[4] = {nx, ny, 1, ny};
    int dims[4] = {3, 3, 1, 2};
    size_t es = sr_dtype_size(dt);
    uint64_t s = 77;
    const void *args[4];
    for (int v = 0; v < 4; v++) {
        buf[v] = malloc((size_t)(rows[v] * dims[v]) * es);
        tu_fill(buf[v], dt, rows[v] * dims[v], -1, 1, &s);
        args[v] = buf[v];
    }
    int64_t n = (int64_t)NO * kc->out_dim;
    void *vc = calloc((size_t)n, 8), *vr = calloc((size_t)n, 8);
    int64_t *ic = calloc((size_t)n, 8), *ir = calloc((size_t)n, 8);
    const struct sr_reduction_info *ri = &sr_reductions[red];
    sr_run_desc r = {.nx = nx,
                     .ny = ny,
                     .nargs = kc->nargs,
                     .args = args,
                     .out = ri->values ? vc : NULL,
                     .out_idx = ri->indices ? ic : NULL};
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, budget), SR_OK);
    cr_assert_eq(sr_kernel_run_ranges(kc, &r, &R), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    r.out = ri->values ? vr : NULL;
    r.out_idx = ri->indices ? ir : NULL;
    cr_assert_eq(sr_kernel_run_ranges(kr, &r, &R), SR_OK, "%s", sr_ctx_error(ctx));
    struct diff_tol tl = diff_tol_of(dt);
    for (int64_t t = 0; t < n; t++) {
        if (ri->values) {
            double a = dt == SR_F64 ? ((double *)vc)[t] : ((float *)vc)[t];
            double b = dt == SR_F64 ? ((double *)vr)[t] : ((float *)vr)[t];
            cr_assert(tu_close(a, b, tl.rtol, tl.atol), "%s axis %d: value %lld: %g, ref %g",
                      ri->name, axis, (long long)t, a, b);
        }
        if (ri->indices)
            cr_assert_eq(ic[t], ir[t], "%s axis %d: index %lld: %lld, ref %lld", ri->name, axis,
                         (long long)t, (long long)ic[t], (long long)ir[t]);
    }
    for (int v = 0; v < 4; v++)
        free(buf[v]);
    free(vc);
    free(vr);
    free(ic);
    free(ir);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}

#define RANGES(R, name)                                                                            \
    Test(cuda, ranges_##name)                                                                      \
    {                                                                                              \
        need_gpu();                                                                                \
        for (int axis = 1; axis >= 0; axis--)                                                      \
            for (int dt = 0; dt < 2; dt++)                                                         \
                ranges_case(R, axis, (sr_dtype)dt, 0);                                             \
    }
DIFF_RED_TESTS(RANGES)

/* Output rows in passes of a few dozen rows: each pass launches its part of the ranges. */
Test(cuda, ranges_in_passes)
{
    need_gpu();
    ranges_case(SR_SUM, 1, SR_F32, 900 * 5 * 4 + 4 + 40 * 64);
    ranges_case(SR_MIN_ARGMIN, 0, SR_F64, 900 * 5 * 8 + 8 + 40 * 64);
}

/* ---- the fused two-product strategy -------------------------------------------------------- */

/* Sum of the formula form (NULL: Exp(-g |x - y|^2) b, a Gaussian times R right-hand sides) or
 * SumSoftMaxWeight of -g |x - y|^2 with weight form (NULL: b; attention's shape), b of width R
 * on the reduced side, on CUDA (*kc) and on the reference (*kr). Arguments: x (3), y (3), g (1),
 * b (R), a (R, on the output side). */
static void fused_form_kernels(const char *form, sr_reduction red, int R, sr_dtype dt, int axis,
                               sr_kernel **kc, sr_kernel **kr)
{
    char bal[32], aal[32];
    snprintf(bal, sizeof bal, "b=V%c(%d)", axis ? 'j' : 'i', R);
    snprintf(aal, sizeof aal, "a=V%c(%d)", axis ? 'i' : 'j', R);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", bal, aal};
    bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
    sr_expr *f = diff_parse(ctx,
                            ssmw   ? "-SqDist(x,y)*g"
                            : form ? form
                                   : "Exp(-SqDist(x,y)*g)*b",
                            al, 5);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.weight = ssmw ? diff_parse(ctx, form ? form : "b", al, 5) : NULL;
    *kc = diff_kernel(ctx, f, d, SR_DEVICE_CUDA);
    *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
}

static void fused_kernels(sr_reduction red, int R, sr_dtype dt, int axis, sr_kernel **kc,
                          sr_kernel **kr)
{
    fused_form_kernels(NULL, red, R, dt, axis, kc, kr);
}

/* sr_kernel_plan of CUDA kernels: the direct kernel for one right-hand side, the fused one for
 * 64, each on the GPU in compiled code, its tile the block's rows by the shared-memory tile's
 * reduced indices. */
Test(cuda, plan_info)
{
    need_gpu();
    for (int wide = 0; wide < 2; wide++) {
        sr_kernel *kc, *kr;
        fused_kernels(SR_SUM, wide ? 64 : 1, SR_F32, 1, &kc, &kr);
        const sr_plan_info p = tu_plan(kc);
        const char *ex = sr_kernel_explain(kc);
        cr_assert_eq(p.strategy, wide ? SR_STRATEGY_FUSED : SR_STRATEGY_DIRECT, "%s:\n%s", p.name,
                     ex);
        cr_assert_str_eq(p.backend, "cuda", "%s", ex);
        cr_assert_eq(p.device, SR_DEVICE_CUDA, "%s", ex);
        cr_assert_eq(p.tier, 1, "%s", ex);
        cr_assert_null(p.fallback, "%s", ex);
        cr_assert(p.tile_rows > 0 && p.tile_cols > 0, "tiles %d x %d:\n%s", p.tile_rows,
                  p.tile_cols, ex);
        cr_assert_eq(tu_plan(kr).strategy, SR_STRATEGY_REFERENCE);
        sr_kernel_free(kc);
        sr_kernel_free(kr);
    }
}

/* Whether kernel k runs the fused kernel on the GPU (its plan says so). */
static bool runs_fused(sr_kernel *k)
{
    sr_plan_info p = tu_plan(k);
    return p.inner == SR_STRATEGY_FUSED && p.device == SR_DEVICE_CUDA;
}

/* Every width on both axes in both dtypes, at sizes 0, 1, primes and sizes no tile divides
 * (64 rows per block, 32 or 16 reduced indices per tile, 64 columns of B per block); from 16
 * columns on the kernels are the fused ones (explain), below the direct ones. */
static void fused_widths(const char *form, sr_reduction red, enum diff_gen gen, double lo,
                         const int *widths, int nw)
{
    static const int64_t sizes[][2] = {{0, 7},    {1, 1},    {7, 0},    {1, 131},
                                       {67, 131}, {131, 67}, {257, 211}};
    for (int w = 0; w < nw; w++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                sr_kernel *kc, *kr;
                fused_form_kernels(form, red, widths[w], (sr_dtype)dt, axis, &kc, &kr);
                cr_assert_eq(runs_fused(kc), widths[w] >= 16, "R = %d: %s", widths[w],
                             sr_kernel_explain(kc));
                cr_assert_eq(tu_plan(kc).inner,
                             widths[w] >= 16 ? SR_STRATEGY_FUSED : SR_STRATEGY_DIRECT, "R = %d: %s",
                             widths[w], sr_kernel_explain(kc));
                for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                    char what[160];
                    snprintf(what, sizeof what, "%s %s R %d axis %d %s", sr_reduction_name(red),
                             form ? form : "", widths[w], axis, dt ? "f64" : "f32");
                    int64_t no = sizes[s][0], nr = sizes[s][1];
                    diff_run(ctx, kc, kr, axis ? no : nr, axis ? nr : no, gen, lo, 1, 100 + s,
                             diff_tol_of((sr_dtype)dt), what);
                }
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

static const int fused_all_widths[] = {1, 2, 15, 16, 17, 63, 64, 65, 255, 1100};
#define NWIDTHS (int)(sizeof fused_all_widths / sizeof *fused_all_widths)

Test(cuda, fused_sum_every_width)
{
    need_gpu();
    /* inputs in [0, 1): positive terms, whose sums the tolerance is relative to */
    fused_widths(NULL, SR_SUM, DIFF_UNIFORM, 0, fused_all_widths, NWIDTHS);
}

Test(cuda, fused_softmax_every_width)
{
    need_gpu();
    fused_widths(NULL, SR_SUMSOFTMAXWEIGHT, DIFF_UNIFORM, -1, fused_all_widths, NWIDTHS);
}

/* Sum of F (A - B), F (B - A), F (A + B) with A on the output side (the gradient of a radial
 * kernel: x_i - y_j): done as A sum F - sum F B from the rows' sums of F. Inputs in [0, 1). */
Test(cuda, fused_a_minus_b_every_width)
{
    need_gpu();
    fused_widths("Exp(-SqDist(x,y)*g)*(a-b)", SR_SUM, DIFF_UNIFORM, 0, fused_all_widths, NWIDTHS);
    static const int w[] = {16, 65};
    fused_widths("(b-a)*g*Exp(-SqDist(x,y)*g)", SR_SUM, DIFF_UNIFORM, 0, w, 2);
    fused_widths("-Exp(-SqDist(x,y)*g)*(b+a)", SR_SUM, DIFF_UNIFORM, 0, w, 2);
}

/* Sum of f (SumSoftMaxWeight of f with weight w when w is not NULL) over x, y of D values, a
 * parameter g, b of R on the reduced side and a of R on the output side, on CUDA (*kc) and on the
 * reference (*kr), on the given axis. */
static void xyb_kernels(const char *f, const char *w, int D, int R, int axis, sr_dtype dt,
                        sr_kernel **kc, sr_kernel **kr)
{
    char o = axis ? 'i' : 'j', r = axis ? 'j' : 'i', al[4][32];
    snprintf(al[0], sizeof al[0], "x=V%c(%d)", o, D);
    snprintf(al[1], sizeof al[1], "y=V%c(%d)", r, D);
    snprintf(al[2], sizeof al[2], "b=V%c(%d)", r, R);
    snprintf(al[3], sizeof al[3], "a=V%c(%d)", o, R);
    const char *alias[] = {al[0], al[1], "g=Pm(1)", al[2], al[3]};
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = w ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
    d.axis = axis;
    d.dtype = dt;
    d.weight = w ? diff_parse(ctx, w, alias, 5) : NULL;
    sr_expr *e = diff_parse(ctx, f, alias, 5);
    *kc = diff_kernel(ctx, e, d, SR_DEVICE_CUDA);
    *kr = diff_kernel(ctx, e, d, SR_DEVICE_REFERENCE);
}

/* The gradient kernels (sr_kernel_grad) of the Gaussian mat-vec Sum(Exp(-g |x - y|^2) b) with
 * points of D values and b of width R, and of attention SumSoftMaxWeight(F, v) with F = (q|k) s
 * or -|q - k|^2 s and v of width R, on CUDA against the reference's, both axes (axis 0: the
 * categories swapped), both dtypes, sizes 0, 1, primes: the gradient with respect to a variable
 * of at least 16 values runs the fused kernel (explain) — d/dx and d/dy as A sum F - sum F B
 * (x_i - y_j), d/db and dv with the incoming gradient as B, dq and dk with k and q as B (or
 * q_i - k_j), the weight's variable inside a formula (Exp(v)) with the incoming gradient as B
 * times Exp(v) of the output side; also d/dx, d/dy, dq, dk of narrow points where F holds the
 * inner product (G|b) or (G|v) of R >= 16 values (computed as a tile product) — the others (a
 * parameter's, narrow variables') the direct one. */
Test(cuda, fused_gradient_kernels)
{
    need_gpu();
    static const struct {
        const char *f, *w; /* F and the weight (SumSoftMaxWeight), over x, y, g, b */
        int D, R;
    } cases[] = {{"Exp(-SqDist(x,y)*g)*b", NULL, 17, 1},
                 {"Exp(-SqDist(x,y)*g)*b", NULL, 33, 65},
                 {"(x|y)*g", "b", 16, 17},
                 {"-SqDist(x,y)*g", "b", 65, 16},
                 {"(x|y)*g", "Exp(b)", 16, 17},
                 {"(x|y)*g", "b", 3, 17},
                 {"-SqDist(x,y)*g", "b", 3, 16}};
    static const int64_t sizes[][2] = {{0, 7}, {1, 1}, {7, 0}, {1, 131}, {67, 131}, {257, 211}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                sr_kernel *kc, *kr;
                xyb_kernels(cases[c].f, cases[c].w, cases[c].D, cases[c].R, axis, (sr_dtype)dt, &kc,
                            &kr);
                for (int v = 0; v < 4; v++) {
                    sr_kernel *gc = NULL, *gr = NULL;
                    cr_assert_eq(sr_kernel_grad(kc, v, &gc), SR_OK, "%s", sr_ctx_error(ctx));
                    cr_assert_eq(sr_kernel_grad(kr, v, &gr), SR_OK, "%s", sr_ctx_error(ctx));
                    int width = v == 2 ? 1 : v == 3 ? cases[c].R : cases[c].D;
                    char what[160];
                    snprintf(what, sizeof what, "gradient %d of %s (D %d, R %d) axis %d %s", v,
                             cases[c].f, cases[c].D, cases[c].R, axis, dt ? "f64" : "f32");
                    bool dot = v < 2 && cases[c].R >= 16; /* (G|b) or (G|v) of R values */
                    cr_assert_eq(runs_fused(gc), width >= 16 || dot, "%s: %s", what,
                                 sr_kernel_explain(gc));
                    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                        diff_run(ctx, gc, gr, axis ? sizes[s][0] : sizes[s][1],
                                 axis ? sizes[s][1] : sizes[s][0], DIFF_UNIFORM, 0.1, 1, 31 + s,
                                 diff_tol_of((sr_dtype)dt), what);
                    sr_kernel_free(gc);
                    sr_kernel_free(gr);
                }
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* Whether kernel k's fused kernel computes F's inner product of d values as a tile product. */
static bool runs_dot_tile(sr_kernel *k, int d) { return runs_fused(k) && tu_plan(k).dot_dim == d; }

/* The gradients d/dx and d/dy of the Gaussian mat-vec Sum(Exp(-g |x - y|^2) b) at D = 3 with b
 * of width R, against the reference's, both axes and dtypes, sizes 0, 1, primes and sizes no
 * tile divides: the width enters through F's inner product (G | b) of the incoming gradient and
 * b, which from R = 16 on the fused kernel computes as a tile product (explain: the chosen plan
 * and the tile), as A sum F - sum F B (x_i - y_j, 3 columns); below, the direct kernel. */
static void dot_gradients(enum diff_gen gen, double lo, const int *widths, int nw)
{
    static const int64_t sizes[][2] = {{0, 7},    {1, 1},    {7, 0},    {1, 131},
                                       {67, 131}, {131, 67}, {257, 211}};
    for (int w = 0; w < nw; w++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                const int R = widths[w];
                sr_kernel *kc, *kr;
                xyb_kernels("Exp(-SqDist(x,y)*g)*b", NULL, 3, R, axis, (sr_dtype)dt, &kc, &kr);
                for (int v = 0; v < 2; v++) {
                    sr_kernel *gc = NULL, *gr = NULL;
                    cr_assert_eq(sr_kernel_grad(kc, v, &gc), SR_OK, "%s", sr_ctx_error(ctx));
                    cr_assert_eq(sr_kernel_grad(kr, v, &gr), SR_OK, "%s", sr_ctx_error(ctx));
                    char what[160];
                    snprintf(what, sizeof what, "gradient %d of the Gaussian, R %d, axis %d %s", v,
                             R, axis, dt ? "f64" : "f32");
                    const char *ex = sr_kernel_explain(gc);
                    cr_assert_eq(runs_dot_tile(gc, R), R >= 16, "%s: %s", what, ex);
                    cr_assert_eq(tu_plan(gc).inner,
                                 R >= 16 ? SR_STRATEGY_FUSED : SR_STRATEGY_DIRECT, "%s: %s", what,
                                 ex);
                    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                        diff_run(ctx, gc, gr, axis ? sizes[s][0] : sizes[s][1],
                                 axis ? sizes[s][1] : sizes[s][0], gen, lo, 1, 41 + s,
                                 diff_tol_of((sr_dtype)dt), what);
                    sr_kernel_free(gc);
                    sr_kernel_free(gr);
                }
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

Test(cuda, fused_dot_gaussian_gradients)
{
    need_gpu();
    static const int w[] = {1, 15, 16, 17, 64, 255, 1100};
    dot_gradients(DIFF_UNIFORM, 0.1, w, (int)(sizeof w / sizeof *w));
}

/* Arrays for the arguments of kernel k (at most 8; rows no on the output side of k's axis, nr
 * on the reduced side), uniform in [0.1, 1); *gv and *bv get the arguments of R values on the
 * output and the reduced side (the Gaussian's gradient: G and b). Returns their number. */
static int gauss_grad_args(sr_kernel *k, int axis, int64_t no, int64_t nr, sr_dtype dt, int R,
                           void **buf, int *gv, int *bv)
{
    const int n = sr_kernel_nargs(k);
    uint64_t seed = 5;
    cr_assert(n <= 8);
    for (int v = 0; v < n; v++) {
        sr_cat cat;
        int dim;
        cr_assert_eq(sr_kernel_var(k, v, &cat, &dim), SR_OK);
        int64_t rows = cat == SR_CAT_PARAM ? 1 : (cat == SR_CAT_I) == (axis == 1) ? no : nr;
        int64_t len = rows * (dim > 0 ? dim : 1);
        buf[v] = malloc((size_t)len * sr_dtype_size(dt));
        cr_assert(buf[v]);
        tu_fill(buf[v], dt, len, 0.1, 1, &seed);
        if (dim == R && cat != SR_CAT_PARAM)
            *(rows == no ? gv : bv) = v;
    }
    return n;
}

/* NaN and infinities in G and in b, with x, y and g finite (so that F's other factors do not
 * make every row NaN): the gradients d/dx (axis 1: of the rows' side) on CUDA and on the
 * reference with G of rows 3, 10, 11 holding NaN, +inf, -inf (those rows non-finite, the others
 * finite: asserted of the reference), then with +inf in b at one reduced index: every row is
 * infinite pair by pair, and the fused kernel's A sum F - sum F B may give NaN there (inf - inf,
 * docs/gpu.md). */
Test(cuda, fused_dot_gaussian_gradients_nan_inf)
{
    need_gpu();
    static const int widths[] = {16, 65};
    enum { NO_ROWS = 67, NR_ROWS = 131 };
    for (int w = 0; w < 2; w++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                const int R = widths[w];
                sr_kernel *kc, *kr;
                xyb_kernels("Exp(-SqDist(x,y)*g)*b", NULL, 3, R, axis, (sr_dtype)dt, &kc, &kr);
                sr_kernel *gc = NULL, *gr = NULL;
                cr_assert_eq(sr_kernel_grad(kc, 0, &gc), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert_eq(sr_kernel_grad(kr, 0, &gr), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert(runs_dot_tile(gc, R), "%s", sr_kernel_explain(gc));
                const int64_t no = axis ? NO_ROWS : NR_ROWS, nr = axis ? NR_ROWS : NO_ROWS;
                void *buf[8];
                int gv = -1, bv = -1; /* G (output side) and b (reduced side), R wide */
                const int n = gauss_grad_args(gc, axis, no, nr, (sr_dtype)dt, R, buf, &gv, &bv);
                cr_assert(gv >= 0 && bv >= 0);
                void *vc = calloc((size_t)no * 3, 8), *vr = calloc((size_t)no * 3, 8);
                for (int run = 0; run < 2; run++) {
                    static const double sp[] = {NAN, INFINITY, -INFINITY};
                    static const int64_t at[] = {3 * 65 + 7, 10 * 65 + 15, 11 * 65};
                    for (int t = 0; t < 3; t++) {
                        int v = run ? bv : gv;
                        int64_t e = run ? 5 * R + 2 : at[t] / 65 * R + at[t] % 65 % R;
                        if (run && t)
                            break;
                        if (dt)
                            ((double *)buf[v])[e] = run ? INFINITY : sp[t];
                        else
                            ((float *)buf[v])[e] = run ? INFINITY : (float)sp[t];
                    }
                    const int64_t nx = axis ? no : nr, ny = axis ? nr : no;
                    const void *const *args = (const void *const *)buf;
                    cr_assert_eq(sr_kernel_run(gc, nx, ny, args, vc), SR_OK, "%s",
                                 sr_ctx_error(ctx));
                    cr_assert_eq(sr_kernel_run(gr, nx, ny, args, vr), SR_OK, "%s",
                                 sr_ctx_error(ctx));
                    int finite = 0, special = 0;
                    for (int64_t t = 0; t < no * 3; t++) {
                        double a = dt ? ((double *)vc)[t] : ((float *)vc)[t];
                        double b = dt ? ((double *)vr)[t] : ((float *)vr)[t];
                        *(isfinite(b) ? &finite : &special) += 1;
                        /* A sum F - sum F B with an infinite F on the row: inf - inf */
                        cr_assert(tu_close(a, b, 2e-4, 2e-4) || (run && isinf(b) && isnan(a)),
                                  "R %d axis %d %s run %d: value %lld: %g, reference %g", R, axis,
                                  dt ? "f64" : "f32", run, (long long)t, a, b);
                    }
                    cr_assert(special > 0 && (run || finite > 0), "finite %d, not %d", finite,
                              special);
                }
                for (int v = 0; v < n; v++)
                    free(buf[v]);
                free(vc);
                free(vr);
                sr_kernel_free(gc);
                sr_kernel_free(gr);
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* Block-sparse ranges of the ranges tests: blocks out of order, an empty one, uncovered rows,
 * empty and touching intervals, a block longer than a CUDA block's 64 rows (300 output rows, 400
 * reduced indices). */
static const int64_t ranges_rg[] = {100, 240, 0, 5, 5, 5, 5, 100, 240, 250};
static const int64_t ranges_sl[] = {3, 4, 4, 7, 8};
static const int64_t ranges_iv[] = {0, 10, 10, 200, 300, 400, 3, 4, 0, 5, 5, 5, 17, 400, 150, 151};

/* Runs kc (CUDA) and kr (the reference) of the given axis with the ranges above on the arrays
 * buf (no output rows, nr reduced indices, nargs arrays, outw values per output row) and compares
 * the outputs; scaled: float32's absolute tolerance relative to the largest output. */
static void ranges_compare(sr_kernel *kc, sr_kernel *kr, int axis, int64_t no, int64_t nr,
                           void **buf, int nargs, int outw, bool scaled, const char *what)
{
    sr_ranges rr = axis ? (sr_ranges){.nranges_i = 5,
                                      .ranges_i = ranges_rg,
                                      .slices_i = ranges_sl,
                                      .nredranges_j = 8,
                                      .redranges_j = ranges_iv}
                        : (sr_ranges){.nranges_j = 5,
                                      .ranges_j = ranges_rg,
                                      .slices_j = ranges_sl,
                                      .nredranges_i = 8,
                                      .redranges_i = ranges_iv};
    const bool f64 = kc->dtype == SR_F64;
    const int64_t nout = no * outw;
    void *vc = calloc((size_t)nout, 8), *vr = calloc((size_t)nout, 8);
    cr_assert(vc && vr);
    sr_run_desc r = {.nx = axis ? no : nr,
                     .ny = axis ? nr : no,
                     .nargs = nargs,
                     .args = (const void *const *)buf,
                     .out = vc};
    cr_assert_eq(sr_kernel_run_ranges(kc, &r, &rr), SR_OK, "%s", sr_ctx_error(ctx));
    r.out = vr;
    cr_assert_eq(sr_kernel_run_ranges(kr, &r, &rr), SR_OK, "%s", sr_ctx_error(ctx));
    struct diff_tol tl = diff_tol_of(kc->dtype);
    double big = 1;
    for (int64_t t = 0; t < nout && scaled && !f64; t++)
        big = fmax(big, fabs(((float *)vr)[t]));
    for (int64_t t = 0; t < nout; t++) {
        double a = f64 ? ((double *)vc)[t] : ((float *)vc)[t];
        double b = f64 ? ((double *)vr)[t] : ((float *)vr)[t];
        cr_assert(tu_close(a, b, tl.rtol, tl.atol * big), "%s: value %lld: %g, ref %g", what,
                  (long long)t, a, b);
    }
    free(vc);
    free(vr);
}

/* Block-sparse ranges on the Gaussian's d/dx and d/dy at D = 3 with b of 65 values (F's inner
 * product a tile product): blocks out of order, an empty one, uncovered rows, empty and touching
 * intervals, a block longer than a CUDA block's 64 rows, against the reference. */
Test(cuda, fused_dot_ranges)
{
    need_gpu();
    enum { NO_ROWS = 300, NR_ROWS = 400, R = 65 };
    for (int v = 0; v < 2; v++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                sr_kernel *kc, *kr, *gc = NULL, *gr = NULL;
                xyb_kernels("Exp(-SqDist(x,y)*g)*b", NULL, 3, R, axis, (sr_dtype)dt, &kc, &kr);
                cr_assert_eq(sr_kernel_grad(kc, v, &gc), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert_eq(sr_kernel_grad(kr, v, &gr), SR_OK, "%s", sr_ctx_error(ctx));
                cr_assert(runs_dot_tile(gc, R), "%s", sr_kernel_explain(gc));
                const int ga = v ? 1 - axis : axis; /* d/dy: one result per y, the other axis */
                void *buf[8];
                int gv = -1, bv = -1;
                const int n =
                    gauss_grad_args(gc, ga, NO_ROWS, NR_ROWS, (sr_dtype)dt, R, buf, &gv, &bv);
                char what[64];
                snprintf(what, sizeof what, "d/d%c axis %d %s", v ? 'y' : 'x', axis,
                         dt ? "f64" : "f32");
                /* float32: A sum F - sum F B cancels (x and y in [0.1, 1), up to 300 terms of F
                 * about 10): the absolute tolerance is relative to the largest output */
                ranges_compare(gc, gr, ga, NO_ROWS, NR_ROWS, buf, n, 3, true, what);
                for (int a = 0; a < n; a++)
                    free(buf[a]);
                sr_kernel_free(gc);
                sr_kernel_free(gr);
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* A formula with an inner product (x|y) of D values and a narrow output (B of 1 or 3 columns,
 * A - B, a softmax with a narrow weight): from D = 16 on the fused kernel with the tile of inner
 * products (explain), below the direct kernel. Inputs in [0, 1), D = 15, 16, 17, 128. */
Test(cuda, fused_dot_narrow_outputs)
{
    need_gpu();
    static const struct {
        const char *f, *w;
        int R;
    } cases[] = {{"Exp(-(x|y)*g)*b", NULL, 1},
                 {"Exp(-(x|y)*g)*b", NULL, 3},
                 {"Exp(-(y|x)*g)*(a-b)", NULL, 3},
                 {"-(x|y)*g", "b", 3}};
    static const int dims[] = {15, 16, 17, 128};
    static const int64_t sizes[][2] = {{0, 7},    {1, 1},    {7, 0},    {1, 131},
                                       {67, 131}, {131, 67}, {257, 211}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
            for (int axis = 1; axis >= 0; axis--)
                for (int dt = 0; dt < 2; dt++) {
                    const int D = dims[di];
                    sr_kernel *kc, *kr;
                    xyb_kernels(cases[c].f, cases[c].w, D, cases[c].R, axis, (sr_dtype)dt, &kc,
                                &kr);
                    char what[160];
                    snprintf(what, sizeof what, "%s, D %d, R %d, axis %d %s", cases[c].f, D,
                             cases[c].R, axis, dt ? "f64" : "f32");
                    cr_assert_eq(runs_dot_tile(kc, D), D >= 16, "%s: %s", what,
                                 sr_kernel_explain(kc));
                    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                        diff_run(ctx, kc, kr, axis ? sizes[s][0] : sizes[s][1],
                                 axis ? sizes[s][1] : sizes[s][0], DIFF_UNIFORM,
                                 cases[c].w ? -1 : 0, 1, 51 + s, diff_tol_of((sr_dtype)dt), what);
                    sr_kernel_free(kc);
                    sr_kernel_free(kr);
                }
}

/* B a formula of the reduced side (the product of two vector factors), a weight that is one,
 * and the sums times C, a formula of the output side, componentwise. */
Test(cuda, fused_formula_b_and_c_every_width)
{
    need_gpu();
    fused_widths("Exp(-SqDist(x,y)*g)*Exp(-b)*b", SR_SUM, DIFF_UNIFORM, 0, fused_all_widths,
                 NWIDTHS);
    fused_widths("Exp(b)*g", SR_SUMSOFTMAXWEIGHT, DIFF_UNIFORM, -1, fused_all_widths, NWIDTHS);
    fused_widths("Exp(-SqDist(x,y)*g)*b*Exp(-a)", SR_SUM, DIFF_UNIFORM, 0, fused_all_widths,
                 NWIDTHS);
    static const int w[] = {16, 65};
    fused_widths("-(Sin(b)*(a*a))*g*Exp(-SqDist(x,y)*g)", SR_SUM, DIFF_UNIFORM, 0, w, 2);
}

/* float16 and bfloat16 arrays (computed in float32): the fused kernels on core's copies. */
Test(cuda, fused_half_precision)
{
    need_gpu();
    for (int red = 0; red < 2; red++)
        for (int h = 0; h < 2; h++) {
            sr_reduction rd = red ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
            sr_dtype dt = h ? SR_BF16 : SR_F16;
            sr_kernel *kc, *kr;
            fused_kernels(rd, 65, dt, 1, &kc, &kr);
            cr_assert(runs_fused(kc), "%s", sr_kernel_explain(kc));
            char what[64];
            snprintf(what, sizeof what, "%s R 65 %s", sr_reduction_name(rd), diff_dtype_tag(dt));
            diff_run(ctx, kc, kr, 67, 131, DIFF_UNIFORM, red ? -1 : 0, 1, 21, diff_tol_of(dt),
                     what);
            sr_kernel_free(kc);
            sr_kernel_free(kr);
        }
}

/* NaN, +inf and -inf in x, y, g and b: in F and in B (semantics.md: IEEE through the products;
 * SumSoftMaxWeight NaN where a term is NaN or +inf, -inf terms of weight 0 with 0 * inf NaN). */
Test(cuda, fused_nan_inf)
{
    need_gpu();
    static const int w[] = {16, 65};
    fused_widths(NULL, SR_SUM, DIFF_SPECIAL, 0, w, 2);
    fused_widths(NULL, SR_SUMSOFTMAXWEIGHT, DIFF_SPECIAL, 0, w, 2);
    /* A - B with A in F too (the radial kernel's gradient): an infinite A makes F 0 on its row */
    fused_widths("Exp(-SqDist(a,b)*g)*(a-b)", SR_SUM, DIFF_SPECIAL, 0, w, 2);
}

/* Few output rows and a long reduced range: the fused kernel splits the reduced range over
 * blockIdx.z and the combine kernel merges the chunks in order (SumSoftMaxWeight by their
 * maxima); also with NaN and infinities, and under a budget that bounds the chunks' records. */
Test(cuda, fused_split_reduced_range)
{
    need_gpu();
    static const int64_t sizes[][2] = {{5, 20011}, {70, 5003}};
    for (int red = 0; red < 2; red++)
        for (int w = 0; w < 2; w++)
            for (int dt = 0; dt < 2; dt++) {
                sr_reduction rd = red ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
                int R = w ? 65 : 16;
                sr_kernel *kc, *kr;
                fused_kernels(rd, R, (sr_dtype)dt, 1, &kc, &kr);
                cr_assert(runs_fused(kc), "%s", sr_kernel_explain(kc));
                for (int s = 0; s < 2; s++) {
                    char what[96];
                    snprintf(what, sizeof what, "split %s R %d %s", sr_reduction_name(rd), R,
                             dt ? "f64" : "f32");
                    diff_run(ctx, kc, kr, sizes[s][0], sizes[s][1], DIFF_UNIFORM, red ? -1 : 0, 1,
                             7 + s, diff_tol_of((sr_dtype)dt), what);
                    diff_run(ctx, kc, kr, sizes[s][0], sizes[s][1], DIFF_SPECIAL, 0, 1, 9 + s,
                             diff_tol_of((sr_dtype)dt), what);
                }
                /* y, b and g whole, x and the outputs per row, and room for two chunks' records */
                int64_t es = dt ? 8 : 4, no = 5, nr = 20011;
                int64_t whole = nr * (3 + R) * es + es, rows = no * (3 + R) * es;
                cr_assert_eq(sr_ctx_set_mem_limit(ctx, whole + rows + 2 * no * (R + 2) * es),
                             SR_OK);
                diff_run(ctx, kc, kr, no, nr, DIFF_UNIFORM, red ? -1 : 0, 1, 3,
                         diff_tol_of((sr_dtype)dt), "split under a budget");
                cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* Under a memory budget the fused kernel runs over passes of output rows; a budget below the
 * arrays copied whole is SR_EBUDGET. */
Test(cuda, fused_memory_budget)
{
    need_gpu();
    enum { R = 70, NO = 300, NR = 111 };
    for (int red = 0; red < 2; red++) {
        sr_reduction rd = red ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
        /* y and b copied whole, g; then x and the outputs per row: 37 rows per pass */
        int64_t whole = NR * (3 + R) * 4 + 4, row = (3 + R) * 4;
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, whole + 37 * row), SR_OK);
        sr_kernel *kc, *kr;
        fused_kernels(rd, R, SR_F32, 1, &kc, &kr);
        cr_assert(runs_fused(kc), "%s", sr_kernel_explain(kc));
        diff_run(ctx, kc, kr, NO, NR, DIFF_UNIFORM, -1, 1, 5, diff_tol_of(SR_F32),
                 "fused under a budget");
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, whole - 1), SR_OK);
        float *buf = calloc((size_t)NO * (3 + R) + (size_t)NR * (3 + R) + 1, sizeof *buf);
        cr_assert(buf);
        const void *args[] = {buf, buf + NO * 3, buf + NO * 3 + NR * 3, buf + NO * 3 + NR * 3 + 1};
        float *out = calloc((size_t)NO * R, sizeof *out);
        sr_status st = sr_kernel_run(kc, NO, NR, args, out);
        cr_assert_eq(st, SR_EBUDGET, "status %d: %s", st, sr_ctx_error(ctx));
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
        free(buf);
        free(out);
        sr_kernel_free(kc);
        sr_kernel_free(kr);
    }
}

/* Block-sparse ranges on the fused kernel: blocks out of order, an empty one, uncovered rows,
 * empty and touching intervals, a block longer than a CUDA block's 64 rows; Sum, SumSoftMaxWeight
 * and Sum of F (A - B) (inputs in [0, 1): A's rows read at the range blocks' rows). */
Test(cuda, fused_ranges)
{
    need_gpu();
    enum { NO = 300, NR = 400, R = 65 };
    for (int red = 0; red < 3; red++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                sr_reduction rd = red == 1 ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
                const int nargs = red == 2 ? 5 : 4;
                sr_kernel *kc, *kr;
                fused_form_kernels(red == 2 ? "Exp(-SqDist(x,y)*g)*(a-b)" : NULL, rd, R,
                                   (sr_dtype)dt, axis, &kc, &kr);
                cr_assert(runs_fused(kc), "%s", sr_kernel_explain(kc));
                int64_t nx = axis ? NO : NR, ny = axis ? NR : NO;
                int64_t n[5] = {nx * 3, ny * 3, 1, (axis ? ny : nx) * R, (axis ? nx : ny) * R};
                size_t es = sr_dtype_size((sr_dtype)dt);
                uint64_t seed = 11;
                void *buf[5];
                for (int v = 0; v < nargs; v++) {
                    buf[v] = malloc((size_t)n[v] * es);
                    cr_assert(buf[v]);
                    tu_fill(buf[v], (sr_dtype)dt, n[v], red == 2 ? 0 : -1, 1, &seed);
                }
                char what[64];
                snprintf(what, sizeof what, "%s %d axis %d %s", sr_reduction_name(rd), red, axis,
                         dt ? "f64" : "f32");
                ranges_compare(kc, kr, axis, NO, NR, buf, nargs, R, false, what);
                for (int v = 0; v < nargs; v++)
                    free(buf[v]);
                sr_kernel_free(kc);
                sr_kernel_free(kr);
            }
}

/* Device pointers with host arrays beside them, under a budget: the output-side variable (y,
 * axis 0) on the host goes through the device in passes while the outputs are written in place
 * on the device at each pass's offset; with room for all rows, few rows and many reduced
 * indices take split-j, whose combine writes the device outputs. Min_ArgMin in float64 against
 * the reference on host arrays. */
Test(cuda, device_outputs_in_passes_and_split_j)
{
    const struct cuda_device *dev = need_gpu();
    const struct cuda_api *cu = dev->api;
    static const char *al[] = {"x=Vi(3)", "y=Vj(3)"};
    sr_expr *f = diff_parse(ctx, "SqDist(x,y)", al, 2);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_MIN_ARGMIN;
    d.axis = 0;
    d.dtype = SR_F64;
    sr_kernel *kc = diff_kernel(ctx, f, d, SR_DEVICE_CUDA);
    sr_kernel *kr = diff_kernel(ctx, f, d, SR_DEVICE_REFERENCE);
    enum { NXR = 5000, NYO = 333 };
    double *x = malloc(sizeof(double) * NXR * 3), *y = malloc(sizeof(double) * NYO * 3);
    uint64_t rng = 11;
    tu_fill(x, SR_F64, NXR * 3, -1, 1, &rng);
    tu_fill(y, SR_F64, NYO * 3, -1, 1, &rng);
    double vr[NYO], vc[NYO];
    int64_t ir[NYO], ic[NYO];
    const void *hargs[] = {x, y};
    sr_run_desc r = {.nx = NXR, .ny = NYO, .nargs = 2, .args = hargs, .out = vr, .out_idx = ir};
    cr_assert_eq(sr_kernel_run_ex(kr, &r), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(cu->ctx_set_current(dev->ctx), CU_SUCCESS);
    cu_deviceptr dx, dv, di;
    cr_assert_eq(cu->mem_alloc(&dx, sizeof(double) * NXR * 3), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dv, sizeof vc), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&di, sizeof ic), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(dx, x, sizeof(double) * NXR * 3), CU_SUCCESS);
    const void *dargs[] = {(const void *)(uintptr_t)dx, y};
    /* 24 bytes a row of y: 40 rows a pass; then all 333 rows and 6 chunks of 16-byte states. */
    const int64_t budgets[] = {24 * 40, 24 * NYO + 16 * NYO * 6};
    for (int b = 0; b < 2; b++) {
        cr_assert_eq(sr_ctx_set_mem_limit(ctx, budgets[b]), SR_OK);
        sr_run_desc rd = {.nx = NXR,
                          .ny = NYO,
                          .nargs = 2,
                          .args = dargs,
                          .out = (void *)(uintptr_t)dv,
                          .out_idx = (int64_t *)(uintptr_t)di};
        cr_assert_eq(sr_kernel_run_device(kc, &rd, 1u << 0, 1), SR_OK, "budget %lld: %s",
                     (long long)budgets[b], sr_ctx_error(ctx));
        cr_assert_eq(cu->memcpy_dtoh(vc, dv, sizeof vc), CU_SUCCESS);
        cr_assert_eq(cu->memcpy_dtoh(ic, di, sizeof ic), CU_SUCCESS);
        for (int o = 0; o < NYO; o++) {
            cr_assert(tu_close(vc[o], vr[o], 1e-12, 1e-12), "budget %lld row %d: %g vs %g",
                      (long long)budgets[b], o, vc[o], vr[o]);
            cr_assert_eq(ic[o], ir[o], "budget %lld row %d: index %lld vs %lld",
                         (long long)budgets[b], o, (long long)ic[o], (long long)ir[o]);
        }
    }
    cr_assert_eq(sr_ctx_set_mem_limit(ctx, 0), SR_OK);
    cu->mem_free(dx), cu->mem_free(dv), cu->mem_free(di);
    free(x);
    free(y);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}
