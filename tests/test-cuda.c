/*
 * test-cuda.c — the GPU differential suite: every reduction, both axes, both dtypes, on the
 * CUDA backend against the reference interpreter, at sizes that take the one-row-per-thread
 * path, partial tiles and the split-j path; device pointers. Needs an NVIDIA GPU: every test
 * skips, saying why, where there is none (NOT run on the machine this was written on).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/cuda.h"
#include "symred.h"
#include "util.h"

static const struct cuda_device *need_gpu(void)
{
    const struct cuda_device *dev;
    const char *why;
    if (jit_cuda_device(&dev, &why) != SR_OK)
        cr_skip_test("no GPU, CUDA differential tests skipped: %s", why);
    return dev;
}

/* Runs f with reduction red on CUDA and on the reference; compares. */
static void diff(sr_ctx *ctx, sr_expr *f, sr_expr *w, sr_reduction red, int axis, sr_dtype dt,
                 int64_t nx, int64_t ny)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.k = 3;
    d.weight = w;
    sr_kernel *kc, *kr;
    d.device = SR_DEVICE_CUDA;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kc), SR_OK, "%s", sr_ctx_error(ctx));
    d.device = SR_DEVICE_REFERENCE;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &kr), SR_OK, "%s", sr_ctx_error(ctx));
    int nargs = sr_kernel_nargs(kc);
    void *bufs[8] = {0};
    const void *args[8];
    uint64_t rng = 42;
    size_t esz = dt == SR_F64 ? 8 : 4;
    for (int v = 0; v < nargs; v++) {
        const struct expr_var *var = &kc->vars[v];
        int64_t rows = var->cat == SR_CAT_I ? nx : var->cat == SR_CAT_J ? ny : 1;
        bufs[v] = malloc((size_t)(rows * var->dim) * esz + 8);
        tu_fill(bufs[v], dt, rows * var->dim, -1, 1, &rng);
        args[v] = bufs[v];
    }
    int64_t nout = (axis == 1 ? nx : ny) * sr_kernel_out_dim(kc);
    void *vc = calloc((size_t)nout, 8), *vr = calloc((size_t)nout, 8);
    int64_t *ic = calloc((size_t)nout, 8), *ir = calloc((size_t)nout, 8);
    const struct sr_reduction_info *ri = &sr_reductions[red];
    sr_run_desc rc = {nx, ny, nargs, args, ri->values ? vc : NULL, ri->indices ? ic : NULL};
    sr_run_desc rr = {nx, ny, nargs, args, ri->values ? vr : NULL, ri->indices ? ir : NULL};
    cr_assert_eq(sr_kernel_run_ex(kc, &rc), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_run_ex(kr, &rr), SR_OK, "%s", sr_ctx_error(ctx));
    double rtol = dt == SR_F64 ? 1e-10 : 2e-4, atol = dt == SR_F64 ? 1e-10 : 1e-4;
    for (int64_t q = 0; q < nout; q++) {
        if (ri->values) {
            double a = dt == SR_F64 ? ((double *)vc)[q] : ((float *)vc)[q];
            double b = dt == SR_F64 ? ((double *)vr)[q] : ((float *)vr)[q];
            cr_assert(tu_close(a, b, rtol, atol) || (isnan(a) && isnan(b)),
                      "%s axis %d nx %lld ny %lld [%lld]: cuda %.9g reference %.9g", ri->name, axis,
                      (long long)nx, (long long)ny, (long long)q, a, b);
        }
        if (ri->indices)
            cr_assert_eq(ic[q], ir[q], "%s axis %d [%lld]: cuda %lld reference %lld", ri->name,
                         axis, (long long)q, (long long)ic[q], (long long)ir[q]);
    }
    for (int v = 0; v < nargs; v++)
        free(bufs[v]);
    free(vc), free(vr), free(ic), free(ir);
    sr_kernel_free(kc);
    sr_kernel_free(kr);
}

Test(cuda, every_reduction_matches_the_reference)
{
    need_gpu();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)", "c=Vi(1)"};
    sr_expr *vec, *sca, *w;
    cr_assert_eq(sr_parse(ctx, "Concat(Exp(-SqDist(x,y)*g)*c, Sum(x*y))", al, 5, &vec), SR_OK);
    cr_assert_eq(sr_parse(ctx, "-SqDist(x,y)*g", al, 5, &sca), SR_OK);
    cr_assert_eq(sr_parse(ctx, "b*c", al, 5, &w), SR_OK);
    /* one block, partial tiles, many blocks; few rows and many columns: split-j */
    const int64_t sizes[][2] = {{1, 5}, {37, 300}, {1000, 777}, {5, 100000}};
    for (int s = 0; s < 4; s++)
        for (int red = 0; red < SR_REDUCTION_COUNT; red++)
            for (int axis = 0; axis < 2; axis++)
                for (int dt = 0; dt < 2; dt++) {
                    bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
                    int64_t nx = axis ? sizes[s][0] : sizes[s][1];
                    int64_t ny = axis ? sizes[s][1] : sizes[s][0];
                    diff(ctx, ssmw ? sca : vec, ssmw ? w : NULL, (sr_reduction)red, axis,
                         (sr_dtype)dt, nx, ny);
                }
    sr_ctx_free(ctx);
}

Test(cuda, device_pointers_in_place)
{
    const struct cuda_device *dev = need_gpu();
    const struct cuda_api *cu = dev->api;
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    enum { NX = 300, NY = 200 };
    float x[NX * 3], y[NY * 3], b[NY], g = 0.5f, out[NX], ref[NX];
    uint64_t rng = 7;
    tu_fill(x, SR_F32, NX * 3, -1, 1, &rng);
    tu_fill(y, SR_F32, NY * 3, -1, 1, &rng);
    tu_fill(b, SR_F32, NY, -1, 1, &rng);
    const void *hargs[] = {x, y, b, &g};
    cr_assert_eq(sr_kernel_run(k, NX, NY, hargs, ref), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(cu->ctx_set_current(dev->ctx), CU_SUCCESS);
    cu_deviceptr dy, dout;
    cr_assert_eq(cu->mem_alloc(&dy, sizeof y), CU_SUCCESS);
    cr_assert_eq(cu->mem_alloc(&dout, sizeof out), CU_SUCCESS);
    cr_assert_eq(cu->memcpy_htod(dy, y, sizeof y), CU_SUCCESS);
    const void *args[] = {x, (const void *)(uintptr_t)dy, b, &g};
    sr_run_desc r = {.nx = NX, .ny = NY, .nargs = 4, .args = args, .out = (void *)(uintptr_t)dout};
    cr_assert_eq(sr_kernel_run_device(k, &r, 1u << 1, 1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(cu->memcpy_dtoh(out, dout, sizeof out), CU_SUCCESS);
    for (int i = 0; i < NX; i++)
        cr_assert(tu_close(out[i], ref[i], 1e-5, 1e-6), "[%d] %g vs %g", i, out[i], ref[i]);
    cu->mem_free(dy);
    cu->mem_free(dout);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}
