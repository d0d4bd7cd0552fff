/*
 * test-nvrtc.c — the CUDA backend on a machine without a GPU: every op and every reduction
 * (both axes, float32 and float64) is emitted as CUDA C++ and compiled by NVRTC to PTX for
 * compute_80 and compute_90; the PTX has the expected entry points; the image cache stores and
 * reuses; asking for the GPU without one gives SR_ENODEV with a message naming what was
 * looked for, and the context stays usable. ctest label: nvrtc. The tests skip (saying so)
 * only when libnvrtc cannot be loaded.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/cuda.h"
#include "symred.h"
#include "diff.h"
#include "util.h"

static const char *const archs[] = {"compute_80", "compute_90"};

/* Where a CUDA toolkit is installed, the loader must find its libnvrtc: skipping there would
 * hide a broken search, so it is a failure. Elsewhere the tests skip, saying why. */
static bool toolkit_installed(void)
{
    const char *home = getenv("CUDA_HOME");
    char path[600];
    snprintf(path, sizeof path, "%s/lib64", home && *home ? home : "/usr/local/cuda");
    return access(path, F_OK) == 0;
}

static void need_nvrtc(void)
{
    const struct nvrtc_api *nv;
    const char *why;
    if (jit_nvrtc_get(&nv, &why) == SR_OK)
        return;
    if (toolkit_installed())
        cr_assert_fail("a CUDA toolkit is installed, yet libnvrtc was not loaded: %s", why);
    cr_skip_test("libnvrtc is not available, NVRTC compile tests skipped: %s", why);
}

/* Emits k's CUDA and compiles it for the architectures of archs_mask (bit a: archs[a]); fails
 * the test with NVRTC's log. Returns the PTX of the last compile when ptx is not NULL. */
static void compile_built_for(const sr_kernel *k, char **ptx, unsigned archs_mask)
{
    sr_reduction red = k->red;
    sr_dtype dt = k->dtype;
    int axis = k->axis;
    for (int acc = 0; acc < (red == SR_SUM && dt == SR_F32 ? 3 : 1); acc++) {
        struct expr_buf b = {0};
        struct cuda_plan plan;
        sr_status st = jit_emit_cuda(k, (enum jit_acc)acc, &b, &plan);
        cr_assert_eq(st, SR_OK, "emit %s axis %d: status %d", sr_reduction_name(red), axis, st);
        cr_assert(plan.block > 0 && plan.tile > 0 && plan.state_bytes > 0);
        for (int a = 0; a < 2; a++) {
            if (!(archs_mask >> a & 1))
                continue;
            struct nvrtc_out o;
            st = jit_nvrtc_compile(b.data, "t.cu", archs[a], false, &o);
            cr_assert_eq(st, SR_OK, "%s axis %d %s acc %d for %s: status %d\n%s\nsource:\n%s",
                         sr_reduction_name(red), axis, dt == SR_F64 ? "f64" : "f32", acc, archs[a],
                         st, o.log ? o.log : "", b.data);
            cr_assert(!o.cubin && o.size > 0);
            if (ptx && a == 1) {
                free(*ptx);
                *ptx = o.image;
            } else {
                free(o.image);
            }
            free(o.log);
        }
        free(b.data);
    }
}

static void compile_built(const sr_kernel *k, char **ptx) { compile_built_for(k, ptx, 3); }

/* Builds kernel (formula, reduction, axis, dtype) on the reference device and compiles its CUDA
 * for the architectures of archs_mask (compile_built_for). */
static void compile_kernel_for(sr_ctx *ctx, sr_expr *f, sr_expr *w, sr_reduction red, int axis,
                               sr_dtype dt, char **ptx, unsigned archs_mask)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.k = 3;
    d.weight = w;
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s: %s", sr_reduction_name(red),
                 sr_ctx_error(ctx));
    compile_built_for(k, ptx, archs_mask);
    sr_kernel_free(k);
}

/* The same, for both architectures. */
static void compile_kernel(sr_ctx *ctx, sr_expr *f, sr_expr *w, sr_reduction red, int axis,
                           sr_dtype dt, char **ptx)
{
    compile_kernel_for(ctx, f, w, red, axis, dt, ptx, 3);
}

/* Every op, batched into a few formulas (Concat of scalars), each small (unrolled) and with
 * dimension 20 vectors (the emitter's loop / lazy paths). The simplifier is off so that every
 * op reaches the emitter as written. */
static const char *const small_aliases[] = {"x=Vi(3)", "y=Vj(3)", "p=Pm(1)", "A=Pm(9)", "M=Pm(6)"};
static const char *const small_terms[] = {"Sum(x+y)",
                                          "Sum(x-y)",
                                          "Sum(x*y)",
                                          "Sum(x/y)",
                                          "Sum(-x+y)",
                                          "Sum(Powf(Abs(x-y), y))",
                                          "Sum(Atan2(x, y))",
                                          "Sum(Less(x, y))",
                                          "Sum(LessEq(x, y))",
                                          "Sum(Greater(x, y))",
                                          "Sum(GreaterEq(x, y))",
                                          "Sum(Equal(x, y))",
                                          "Sum(NotEqual(x, y))",
                                          "Sum(Inv(x-y))",
                                          "Sum(Square(x-y))",
                                          "Sum(Sqrt(x*y))",
                                          "Sum(Rsqrt(x*y))",
                                          NULL,
                                          "Sum(Exp(x-y))",
                                          "Sum(Log(x*y))",
                                          "Sum(XLogX(x*y))",
                                          "Sum(Sin(x-y))",
                                          "Sum(Cos(x-y))",
                                          "Sum(Asin(x-y))",
                                          "Sum(Acos(x-y))",
                                          "Sum(Atan(x-y))",
                                          "Sum(Abs(x-y))",
                                          "Sum(Sign(x-y))",
                                          "Sum(Step(x-y))",
                                          "Sum(ReLU(x-y))",
                                          "Sum(Floor(x-y))",
                                          "Sum(SinXDivX(x-y))",
                                          "Sum(Pow(x-y, 3))",
                                          "Sum(Pow(x-y, -2))",
                                          "Sum(Pow(x-y, 20))",
                                          "Sum(Round(x-y, 2))",
                                          NULL,
                                          "Sum(ClampInt(x-y, -1, 1))",
                                          "Sum(DiffClampInt(x-y, -1, 1))",
                                          "Sum(Clamp(x, y, x+p))",
                                          "Sum(IfElse(x-y, x, y))",
                                          "Sum(Mod(x, y, p))",
                                          "SqNorm2(x-y)",
                                          "Norm2(x-y)",
                                          "Sum(Normalize(x-y))",
                                          "SqDist(x, y)",
                                          "(x|y)",
                                          "Max(x-y)",
                                          "Min(x-y)",
                                          "ArgMax(x-y)",
                                          "ArgMin(x-y)",
                                          "Elem(x-y, 1)",
                                          "Sum(Extract(x-y, 1, 2))",
                                          "Sum(OneHot(Elem(x-y, 0), 4))",
                                          "Sum(MatVecMult(A, x-y))",
                                          "Sum(VecMatMult(x-y, M))",
                                          "Sum(TensorProd(x, y))",
                                          "WeightedSqNorm(A, x-y)",
                                          "WeightedSqDist(p, x, y)",
                                          "WeightedSqDist(x, x, y)",
                                          "IntCst(3)*RatCst(1, 3)*x",
                                          "p*2.5",
                                          "Sum(SumT(p, 3)*x)",
                                          "Sum(ElemT(Elem(x, 0), 4, 2))",
                                          "Sum(ExtractT(x-y, 1, 5))",
                                          "Sum(TensorDot(A, x-y, [3,3], [3], [1], [0]))",
                                          "Sum(TensorDot(Extract(x, 0, 2), M, [2], [2,3], [], [],"
                                          " [2,0,1]))",
                                          NULL,
                                          NULL};
/* The complex ops on interleaved (re, im) pairs: u, v of 2 complex numbers, c a complex scalar. */
static const char *const complex_aliases[] = {"u=Vi(4)", "v=Vj(4)", "c=Pm(2)", "p=Pm(1)",
                                              "x=Vi(3)"};
static const char *const complex_terms[] = {"ComplexAdd(u, v)",
                                            "ComplexSubtract(u, v)",
                                            "ComplexMult(u, v)",
                                            "ComplexDivide(u, v)",
                                            "ComplexScal(c, v)",
                                            "ComplexRealScal(p, u)",
                                            "Conj(u-v)",
                                            "ComplexExp(u-v)",
                                            NULL,
                                            "ComplexExp1j(x)",
                                            "ComplexReal(ComplexMult(u, v))",
                                            "ComplexImag(ComplexMult(u, v))",
                                            "ComplexAbs(u-v)",
                                            "ComplexSquareAbs(u-v)",
                                            "ComplexAngle(u-v)",
                                            "Real2Complex(x)",
                                            "Imag2Complex(x)",
                                            "ComplexSum(ComplexMult(u, v))",
                                            "ComplexSumT(ComplexSum(u-v), 6)",
                                            NULL,
                                            NULL};
static const char *const big_aliases[] = {"x=Vi(20)", "y=Vj(20)", "p=Pm(1)", "W=Pm(400)"};
static const char *const big_terms[] = {"Sum(Exp(x-y)*Sqrt(x*y)+Pow(x, 2)-Round(y, 1))",
                                        "(Normalize(x)|Normalize(y))",
                                        "Max(Concat(x, y))",
                                        "ArgMin(Extract(x-y, 2, 17))",
                                        "SqDist(x, y)",
                                        "(x|y)",
                                        "WeightedSqNorm(W, x-y)",
                                        "WeightedSqDist(x, x, y)",
                                        "Norm2(Clamp(x, y, x+p))",
                                        "Sum(IfElse(x-y, Sin(x), Mod(x, y, p)))",
                                        "Sum(OneHot(Elem(x, 3), 20)*y)",
                                        "Sum(ExtractT(x, 2, 24)) + Sum(SumT(p, 20)*y)",
                                        "Sum(ElemT(Elem(x, 3), 20, 7)*y)",
                                        "Sum(TensorDot(x, y, [4,5], [5,4], [0,1], [1,0]))",
                                        NULL,
                                        NULL};

/* Concat(t0, Concat(t1, ... tn)) of the terms up to the next NULL; *pos moves past it. */
static char *batch(const char *const *terms, int *pos)
{
    struct expr_buf b = {0};
    int n = 0;
    for (; terms[*pos]; (*pos)++, n++)
        expr_buf_printf(&b, "%s%s%s", terms[*pos + 1] ? "Concat(" : "", terms[*pos],
                        terms[*pos + 1] ? ", " : "");
    (*pos)++;
    for (int i = 1; i < n; i++)
        expr_buf_printf(&b, ")");
    cr_assert(!b.oom && n > 0);
    return b.data;
}

Test(nvrtc, every_op_compiles_for_sm80_and_sm90)
{
    need_nvrtc();
    setenv("SYMRED_SIMPLIFY", "0", 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    bool seen[OP_COUNT] = {false};
    for (int set = 0; set < 3; set++) {
        const char *const *al = set == 2 ? complex_aliases : set ? big_aliases : small_aliases;
        int nal = set == 1 ? 4 : 5;
        const char *const *terms = set == 2 ? complex_terms : set ? big_terms : small_terms;
        for (int pos = 0; terms[pos];) {
            char *text = batch(terms, &pos);
            sr_expr *f;
            cr_assert_eq(sr_parse(ctx, text, al, nal, &f), SR_OK, "%s: %s", text,
                         sr_ctx_error(ctx));
            free(text);
            diff_mark_ops(f, seen);
            /* float32 over j and float64 over i: both skeletons, both dtypes. */
            compile_kernel(ctx, f, NULL, SR_SUM, 1, SR_F32, NULL);
            compile_kernel(ctx, f, NULL, SR_SUM, 0, SR_F64, NULL);
        }
    }
    for (int op = 0; op < OP_COUNT; op++)
        cr_expect(seen[op], "op %s is not covered by the batches", expr_ops[op].name);
    sr_ctx_free(ctx);
}

Test(nvrtc, every_reduction_both_axes_both_dtypes)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)", "c=Vi(1)"};
    sr_expr *vec, *sca, *w;
    cr_assert_eq(sr_parse(ctx, "Concat(Exp(-SqDist(x,y)*g)*c, Sum(x*y))", al, 5, &vec), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "-SqDist(x,y)*g", al, 5, &sca), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "b*c", al, 5, &w), SR_OK, "%s", sr_ctx_error(ctx));
    for (int red = 0; red < SR_REDUCTION_COUNT; red++)
        for (int axis = 0; axis < 2; axis++)
            for (int dt = 0; dt < 2; dt++) {
                bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
                compile_kernel(ctx, ssmw ? sca : vec, ssmw ? w : NULL, (sr_reduction)red, axis,
                               (sr_dtype)dt, NULL);
            }
    sr_ctx_free(ctx);
}

/* Wide formulas (the emitters' loop mode, docs/wide.md): F of 65 components with a wide array
 * node in the pair loop under every reduction, F and a weight of 1100 components, a TensorDot
 * of more than 1024 terms; both axes, dtypes and architectures in turn (the emitted source has
 * no architecture-dependent code; the op, reduction and gradient tests compile for both). */
Test(nvrtc, wide_formulas_compile)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)",    "y=Vj(3)",    "g=Pm(1)", "u=Vi(65)",
                        "v=Vj(65)",   "M=Vi(130)",  "z=Vj(2)", "U=Vi(1100)",
                        "V=Vj(1100)", "A=Vi(1600)", "B=Vj(40)"};
    sr_expr *f65, *sca, *w65, *f1100, *w1100, *td;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*v + Cos(u-v) + MatVecMult(M,z)", al, 11, &f65),
                 SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "-SqDist(x,y)*g", al, 11, &sca), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "Cos(u-v)*v + MatVecMult(M,z)", al, 11, &w65), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*V + Cos(U-V)", al, 11, &f1100), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "Cos(U-V)*V", al, 11, &w1100), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "TensorDot(A,B,[40,40],[40],[1],[0])*g", al, 11, &td), SR_OK, "%s",
                 sr_ctx_error(ctx));
    for (int red = 0; red < SR_REDUCTION_COUNT; red++) {
        bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
        compile_kernel_for(ctx, ssmw ? sca : f65, ssmw ? w65 : NULL, (sr_reduction)red, red % 2,
                           (sr_dtype)(red / 2 % 2), NULL, 1u << (red / 4 % 2));
    }
    compile_kernel_for(ctx, f1100, NULL, SR_SUM, 1, SR_F32, NULL, 1);
    compile_kernel_for(ctx, f1100, NULL, SR_MAX_ARGMAX, 0, SR_F64, NULL, 2);
    compile_kernel_for(ctx, sca, w1100, SR_SUMSOFTMAXWEIGHT, 0, SR_F32, NULL, 1);
    compile_kernel_for(ctx, td, NULL, SR_LOGSUMEXP, 1, SR_F64, NULL, 2);
    sr_ctx_free(ctx);
}

/* The gradient kernels of sr_kernel_grad and the tangent kernels of sr_kernel_jvp
 * (docs/gradients.md) are ordinary kernels: those of every reduction kind, with respect to a
 * Vi, a Vj and a parameter variable (the tangent kernel: along all four), compile. */
Test(nvrtc, gradient_kernels_compile)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f, *sca, *w;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b*y", al, 4, &f), SR_OK, "%s",
                 sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "-SqDist(x,y)*g", al, 4, &sca), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_parse(ctx, "Normalize(y)*b", al, 4, &w), SR_OK, "%s", sr_ctx_error(ctx));
    static const sr_reduction reds[] = {SR_SUM, SR_LOGSUMEXP, SR_SUMSOFTMAXWEIGHT, SR_MIN, SR_KMIN};
    for (size_t r = 0; r < sizeof reds / sizeof *reds; r++) {
        bool ssmw = reds[r] == SR_SUMSOFTMAXWEIGHT;
        sr_kernel_desc d = sr_kernel_desc_default();
        d.reduction = reds[r];
        d.k = 2;
        d.weight = ssmw ? w : NULL;
        d.device = SR_DEVICE_REFERENCE;
        sr_kernel *k, *gk;
        cr_assert_eq(sr_kernel_new(ctx, ssmw ? sca : f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
        for (int v = 0; v < 4; v++) {
            cr_assert_eq(sr_kernel_grad(k, v, &gk), SR_OK, "%s", sr_ctx_error(ctx));
            compile_built(gk, NULL);
            sr_kernel_free(gk);
        }
        cr_assert_eq(sr_kernel_jvp(k, 0xf, &gk), SR_OK, "%s", sr_ctx_error(ctx));
        compile_built(gk, NULL);
        sr_kernel_free(gk);
        sr_kernel_free(k);
    }
    sr_ctx_free(ctx);
}

Test(nvrtc, ptx_has_the_entry_points)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4, &f), SR_OK);
    char *ptx = NULL;
    compile_kernel(ctx, f, NULL, SR_SUM, 1, SR_F32, &ptx);
    cr_assert(ptx);
    cr_expect(strstr(ptx, ".entry " CUDA_KERNEL_MAIN) != NULL, "no .entry %s in the PTX",
              CUDA_KERNEL_MAIN);
    cr_expect(strstr(ptx, ".entry " CUDA_KERNEL_COMBINE) != NULL, "no .entry %s in the PTX",
              CUDA_KERNEL_COMBINE);
    cr_expect(strstr(ptx, ".target sm_90") != NULL, "PTX not for sm_90");
    cr_expect(strstr(ptx, ".shared") != NULL, "no shared-memory tile in the PTX");
    free(ptx);
    sr_ctx_free(ctx);
}

/* lit() spells infinite and NaN constants with __builtin_inf / __builtin_nan, which NVRTC
 * lacks: the CUDA prelude defines them. A kernel appended to an emitted module uses them. */
Test(nvrtc, special_constants_compile)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    for (int dt = 0; dt < 2; dt++) {
        sr_expr *f = sr_mul(ctx, sr_vi(ctx, 0, 1), sr_vj(ctx, 1, 1));
        sr_kernel_desc d = sr_kernel_desc_default();
        d.device = SR_DEVICE_REFERENCE;
        d.dtype = (sr_dtype)dt;
        sr_kernel *k;
        cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
        struct expr_buf b = {0};
        cr_assert_eq(jit_emit_cuda(k, JIT_ACC_BLOCK, &b, NULL), SR_OK);
        expr_buf_printf(&b,
                        "extern \"C\" __global__ void k(sr_t *o) {\n"
                        "  o[0] = (sr_t)__builtin_nan(\"\"); o[1] = (sr_t)(-__builtin_inf());\n"
                        "  o[2] = (sr_t)__builtin_nanf(\"\"); o[3] = (sr_t)(__builtin_inff());\n"
                        "  o[4] = (sr_t)0x1.8p+1; o[5] = (sr_t)-0x1.5555555555555p-2;\n}\n");
        for (int a = 0; a < 2; a++) {
            struct nvrtc_out o;
            sr_status st = jit_nvrtc_compile(b.data, "c.cu", archs[a], false, &o);
            cr_expect_eq(st, SR_OK, "%s: %s", archs[a], o.log ? o.log : "");
            free(o.image);
            free(o.log);
        }
        free(b.data);
        sr_kernel_free(k);
    }
    sr_ctx_free(ctx);
}

Test(nvrtc, compile_errors_report_the_log)
{
    need_nvrtc();
    struct nvrtc_out o;
    sr_status st = jit_nvrtc_compile("this is not CUDA", "bad.cu", "compute_80", false, &o);
    cr_assert_eq(st, SR_ECOMPILE, "status %d", st);
    cr_assert(o.log && strstr(o.log, "error"), "log: %s", o.log ? o.log : "(none)");
    free(o.image);
    free(o.log);
}

Test(nvrtc, image_cache_stores_and_reuses)
{
    need_nvrtc();
    char dir[] = "/tmp/symred-nvrtc-XXXXXX";
    cr_assert(mkdtemp(dir));
    setenv("SYMRED_CACHE_DIR", dir, 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *src = "extern \"C\" __global__ void sr_cache_probe(float *o) { o[0] = 1; }\n";
    struct nvrtc_out a, b;
    struct cuda_image_info ia, ib;
    cr_assert_eq(jit_cuda_image(ctx, src, "compute_80", &a, &ia), SR_OK, "%s", sr_ctx_error(ctx));
    cr_expect_str_eq(ia.origin, "compiled");
    cr_expect(strstr(ia.cache, "stored") != NULL, "cache: %s", ia.cache);
    cr_assert_eq(jit_cuda_image(ctx, src, "compute_80", &b, &ib), SR_OK, "%s", sr_ctx_error(ctx));
    cr_expect_str_eq(ib.origin, "disk");
    cr_assert_eq(a.size, b.size);
    cr_expect(memcmp(a.image, b.image, a.size) == 0, "the cached image differs");
    /* Another architecture is another entry. */
    struct nvrtc_out c;
    struct cuda_image_info ic;
    cr_assert_eq(jit_cuda_image(ctx, src, "compute_90", &c, &ic), SR_OK);
    cr_expect_str_eq(ic.origin, "compiled");
    /* A corrupt entry is rebuilt, never trusted. */
    FILE *fp = fopen(ib.path, "r+b");
    cr_assert(fp, "cannot open %s", ib.path);
    fputs("garbage", fp);
    fclose(fp);
    struct nvrtc_out d;
    struct cuda_image_info id;
    cr_assert_eq(jit_cuda_image(ctx, src, "compute_80", &d, &id), SR_OK);
    cr_expect_str_eq(id.origin, "compiled");
    cr_expect(memcmp(a.image, d.image, a.size) == 0);
    struct stat sb;
    cr_expect(stat(ib.path, &sb) == 0, "the rebuilt entry was stored");
    free(a.image), free(b.image), free(c.image), free(d.image);
    free(a.log), free(b.log), free(c.log), free(d.log);
    unlink(ib.path);
    unlink(ic.path);
    rmdir(dir);
    sr_ctx_free(ctx);
}

/* Runs a small Gaussian mat-vec on the CPU: the context still works after a failure. */
static void context_still_usable(sr_ctx *ctx, sr_expr *f)
{
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    float x[6] = {0, 0, 0, 1, 1, 1}, y[3] = {0, 0, 0}, b = 2, g = 1, out[2];
    const void *args[] = {x, y, &b, &g};
    cr_assert_eq(sr_kernel_run(k, 2, 1, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    cr_expect(tu_close(out[0], 2.0, 1e-6, 0) && tu_close(out[1], 2.0 * exp(-3.0), 1e-5, 0),
              "out = %g %g", out[0], out[1]);
    sr_kernel_free(k);
}

static sr_expr *gauss(sr_ctx *ctx)
{
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", al, 4, &f), SR_OK);
    return f;
}

Test(nvrtc, cuda_without_gpu_is_enodev)
{
    if (jit_cuda_available())
        cr_skip_test("a GPU is present: the no-GPU path is not testable here");
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = gauss(ctx);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k = (sr_kernel *)1;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_ENODEV, "status: %s", sr_ctx_error(ctx));
    cr_expect_null(k);
    const char *msg = sr_ctx_error(ctx);
    /* Either the driver was not found (the names tried) or it failed (the call and why). */
    cr_expect(strstr(msg, "libcuda.so.1") != NULL || strstr(msg, "cuInit") != NULL ||
                  strstr(msg, "device(s)") != NULL,
              "message does not say what was looked for: %s", msg);
    cr_expect(strstr(msg, "cuda") != NULL, "message: %s", msg);
    context_still_usable(ctx, f);
    /* Twice: the process-wide set-up is not retried into a crash. */
    cr_expect_eq(sr_kernel_new(ctx, f, &d, &k), SR_ENODEV);
    sr_ctx_free(ctx);
}

Test(nvrtc, symred_device_cuda_env_without_gpu)
{
    if (jit_cuda_available())
        cr_skip_test("a GPU is present");
    setenv("SYMRED_DEVICE", "cuda", 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = gauss(ctx);
    sr_kernel_desc d = sr_kernel_desc_default(); /* AUTO: the environment decides */
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_ENODEV, "%s", sr_ctx_error(ctx));
    unsetenv("SYMRED_DEVICE");
    context_still_usable(ctx, f);
    sr_ctx_free(ctx);
}

/* The toolkit's stub libcuda loads but its cuInit fails: SR_ENODEV, not a crash. */
Test(nvrtc, stub_driver_is_enodev)
{
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) != 0)
        cr_skip_test("no stub driver at %s", stub);
    setenv("SYMRED_LIBCUDA", stub, 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = gauss(ctx);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_ENODEV, "%s", sr_ctx_error(ctx));
    const char *msg = sr_ctx_error(ctx);
    cr_expect(strstr(msg, "cuInit") && strstr(msg, stub), "message: %s", msg);
    context_still_usable(ctx, f);
    sr_ctx_free(ctx);
}

Test(nvrtc, device_pointers_need_a_cuda_kernel)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = gauss(ctx);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    float x[3] = {0}, y[3] = {0}, b = 1, g = 1, out[1] = {-1};
    const void *args[] = {x, y, &b, &g};
    sr_run_desc r = {.nx = 1, .ny = 1, .nargs = 4, .args = args, .out = out};
    cr_expect_eq(sr_kernel_run_device(k, &r, 1, 0), SR_EINVAL);
    cr_expect(strstr(sr_ctx_error(ctx), "SR_DEVICE_CUDA") != NULL, "%s", sr_ctx_error(ctx));
    cr_expect_eq(sr_kernel_run_device(k, &r, 0, 1), SR_EINVAL);
    cr_expect_eq(out[0], -1.0f, "the output was written: %g", out[0]);
    /* No flags: an ordinary run. */
    cr_expect_eq(sr_kernel_run_device(k, &r, 0, 0), SR_OK, "%s", sr_ctx_error(ctx));
    cr_expect(tu_close(out[0], 1.0, 1e-6, 0), "out = %g", out[0]);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}

/* ---- the fused two-product strategy -------------------------------------------------------- */

/* Kernel f with desc d on the reference device. */
static sr_kernel *ref_kernel(sr_ctx *ctx, sr_expr *f, sr_kernel_desc d)
{
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    return k;
}

/* A kernel on the reference device: Sum of -Exp(-g |x - y|^2) b (B of width R, negated) or
 * SumSoftMaxWeight of (q|k) g with weight b; b on the reduced side of axis. */
static sr_kernel *fused_kernel(sr_ctx *ctx, sr_reduction red, int R, sr_dtype dt, int axis)
{
    char bal[32];
    snprintf(bal, sizeof bal, "b=V%c(%d)", axis ? 'j' : 'i', R);
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", bal, "q=Vi(16)", "k=Vj(16)"};
    bool ssmw = red == SR_SUMSOFTMAXWEIGHT;
    sr_expr *f, *w = NULL;
    cr_assert_eq(sr_parse(ctx, ssmw ? "(q|k)*g" : "-Exp(-SqDist(x,y)*g)*b", al, 6, &f), SR_OK, "%s",
                 sr_ctx_error(ctx));
    if (ssmw)
        cr_assert_eq(sr_parse(ctx, "b", al, 6, &w), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.axis = axis;
    d.dtype = dt;
    d.weight = w;
    return ref_kernel(ctx, f, d);
}

/* Sum of f, or SumSoftMaxWeight of f with weight w when w is not NULL, over the five aliases al,
 * on the reference device. */
static sr_kernel *form_kernel(sr_ctx *ctx, const char *f, const char *w, const char *const *al,
                              int axis, sr_dtype dt)
{
    sr_expr *e, *wt = NULL;
    cr_assert_eq(sr_parse(ctx, f, al, 5, &e), SR_OK, "%s", sr_ctx_error(ctx));
    if (w)
        cr_assert_eq(sr_parse(ctx, w, al, 5, &wt), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.axis = axis;
    d.dtype = dt;
    d.weight = wt;
    d.reduction = wt ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
    return ref_kernel(ctx, e, d);
}

/* The fused emitter declines k (SR_ENOTSUP, nothing written); frees k. */
static void fused_declines(sr_kernel *k)
{
    struct expr_buf b = {0};
    struct cuda_fused fp;
    cr_assert_eq(jit_emit_cuda_fused(k, JIT_ACC_BLOCK, &b, NULL, &fp), SR_ENOTSUP);
    cr_assert_eq(b.len, 0);
    free(b.data);
    sr_kernel_free(k);
}

/* The fused modules of Sum and SumSoftMaxWeight compile for every width (one, a tile of
 * columns, one past it, several blocks of columns), both dtypes, both axes in turn, with the
 * float64 accumulation of float32 too; their PTX exports the fused kernel and no direct one. */
Test(nvrtc, fused_kernels_compile)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const int widths[] = {1, 16, 17, 64, 65, 256, 1100};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
        for (int red = 0; red < 2; red++)
            for (int dt = 0; dt < 2; dt++) {
                sr_reduction rd = red ? SR_SUMSOFTMAXWEIGHT : SR_SUM;
                sr_kernel *k = fused_kernel(ctx, rd, widths[w], (sr_dtype)dt, (int)(w % 2));
                enum jit_acc acc = dt == 0 && w % 3 == 1 ? JIT_ACC_F64 : JIT_ACC_BLOCK;
                struct expr_buf b = {0};
                struct cuda_plan plan;
                struct cuda_fused fp;
                sr_status st = jit_emit_cuda_fused(k, acc, &b, &plan, &fp);
                cr_assert_eq(st, SR_OK, "emit %s R %d: status %d", sr_reduction_name(rd), widths[w],
                             st);
                cr_assert_eq(fp.R, widths[w]);
                cr_assert(fp.shared_bytes > 0 && fp.shared_bytes <= 48 << 10 && fp.tj > 0,
                          "shared %d bytes, tile %d", fp.shared_bytes, fp.tj);
                struct nvrtc_out o;
                const char *arch = archs[w % 2];
                st = jit_nvrtc_compile(b.data, "t.cu", arch, false, &o);
                cr_assert_eq(st, SR_OK, "%s R %d %s for %s: %s\nsource:\n%s", sr_reduction_name(rd),
                             widths[w], dt ? "f64" : "f32", arch, o.log ? o.log : "", b.data);
                cr_assert(strstr(o.image, ".entry " CUDA_KERNEL_FUSED) &&
                              !strstr(o.image, ".entry " CUDA_KERNEL_MAIN),
                          "entry points in the PTX");
                free(o.image);
                free(o.log);
                free(b.data);
                sr_kernel_free(k);
            }
    sr_ctx_free(ctx);
}

/* Whether the fused two-product candidate among k's plans (sr_kernel_plan_candidate) is chosen
 * (fused) or rejected (!fused). */
static bool fused_candidate_is(const sr_kernel *k, bool fused)
{
    for (int i = 0; i < k->nplans; i++) {
        sr_plan_candidate c = {.size = sizeof c};
        cr_assert_eq(sr_kernel_plan_candidate(k, i, &c), SR_OK);
        if (c.strategy == SR_STRATEGY_FUSED)
            return c.chosen == fused && c.feasible == fused;
    }
    return false;
}

/* The CUDA backend's plans: the fused kernel for a wide B or weight (or an F with an inner product
 * of 16 or more values), the direct one for a narrow one, for float32 Kahan summation and for a
 * formula that is not F * B; the candidates list the chosen plan and the rejected one. */
Test(nvrtc, cuda_plan_picks_fused_for_wide_b)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const struct {
        sr_reduction red;
        int R, acc, fused;
    } cases[] = {{SR_SUM, 1, JIT_ACC_BLOCK, 0},
                 {SR_SUM, 15, JIT_ACC_BLOCK, 0},
                 {SR_SUM, 16, JIT_ACC_BLOCK, 1},
                 {SR_SUM, 64, JIT_ACC_BLOCK, 1},
                 {SR_SUM, 64, JIT_ACC_KAHAN, 0},
                 {SR_SUM, 64, JIT_ACC_F64, 1},
                 /* F = (q|k) g, an inner product of 16 values: fused for one column too */
                 {SR_SUMSOFTMAXWEIGHT, 1, JIT_ACC_BLOCK, 1},
                 {SR_SUMSOFTMAXWEIGHT, 64, JIT_ACC_BLOCK, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sr_kernel *k = fused_kernel(ctx, cases[c].red, cases[c].R, SR_F32, 1);
        sr_kernel kc = *k;
        kc.nplans = cuda_plans(&kc, cases[c].acc, kc.plans);
        const struct sr_plan *p = sr__plan_choose(&kc);
        cr_assert(p, "no plan");
        cr_assert_eq(p->id, cases[c].fused ? CUDA_PLAN_FUSED : CUDA_PLAN_DIRECT,
                     "case %zu: %s chosen (%s)", c, p->strategy, p->why);
        cr_assert(fused_candidate_is(&kc, cases[c].fused), "case %zu: the fused candidate %s (%s)",
                  c, cases[c].fused ? "not chosen" : "not rejected", p->why);
        sr_kernel_free(k);
    }
    /* Kahan summation stays with the direct kernel in float64 too. */
    sr_kernel *k64 = fused_kernel(ctx, SR_SUM, 64, SR_F64, 1);
    sr_kernel kc64 = *k64;
    kc64.nplans = cuda_plans(&kc64, JIT_ACC_KAHAN, kc64.plans);
    cr_assert_eq(sr__plan_choose(&kc64)->id, CUDA_PLAN_DIRECT);
    sr_kernel_free(k64);
    /* Not of the form: a sum of two products. */
    const char *al[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", "b=Vj(64)"};
    sr_expr *f;
    cr_assert_eq(sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b + b", al, 4, &f), SR_OK);
    sr_kernel *k = ref_kernel(ctx, f, sr_kernel_desc_default());
    sr_kernel kc = *k;
    kc.nplans = cuda_plans(&kc, JIT_ACC_BLOCK, kc.plans);
    cr_assert_eq(sr__plan_choose(&kc)->id, CUDA_PLAN_DIRECT);
    fused_declines(k);
    sr_ctx_free(ctx);
}

/* The fused forms beyond F * B: F (A - B), F (B - A), F (A + B) with A of the output side (the
 * radial kernel's gradient), B a formula of the reduced side, the sums times C of the output
 * side, and SumSoftMaxWeight with a weight formula: the plan picks the fused kernel from 16
 * columns, explain says so, the emitter names A's and B's arguments (B's -1 for a formula) and
 * C, and the module compiles for both architectures, both dtypes, both axes. */
Test(nvrtc, fused_forms)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const struct {
        const char *f, *w;
        int bvar, avar;
        bool cfactor;
    } forms[] = {{"Exp(-SqDist(x,y)*g)*(a-b)", NULL, 3, 4, false},
                 {"(b-a)*Exp(-SqDist(x,y)*g)", NULL, 3, 4, false},
                 {"-g*(b+a)*Exp(-SqDist(x,y)*g)", NULL, 3, 4, false},
                 {"Exp(-SqDist(x,y)*g)*Exp(-b)*b", NULL, -1, -1, false},
                 {"Exp(-SqDist(x,y)*g)*b*Exp(-a)", NULL, 3, -1, true},
                 {"-(Sin(b)*(a*a))*g*Exp(-SqDist(x,y)*g)", NULL, -1, -1, true},
                 {"-SqDist(x,y)*g", "Exp(b)*g", -1, -1, false}};
    enum { NF = sizeof forms / sizeof *forms };
    static const int widths[] = {15, 16, 65, 300};
    for (int w = 0; w < 4; w++)
        for (int c = 0; c < NF; c++)
            for (int dt = 0; dt < 2; dt++) {
                int axis = (w + c) % 2;
                char bal[32], aal[32];
                snprintf(bal, sizeof bal, "b=V%c(%d)", axis ? 'j' : 'i', widths[w]);
                snprintf(aal, sizeof aal, "a=V%c(%d)", axis ? 'i' : 'j', widths[w]);
                const char *al[] = {"x=Vi(3)", "y=Vj(3)", "g=Pm(1)", bal, aal};
                sr_kernel *k = form_kernel(ctx, forms[c].f, forms[c].w, al, axis, (sr_dtype)dt);
                sr_kernel kc = *k;
                kc.nplans = cuda_plans(&kc, JIT_ACC_BLOCK, kc.plans);
                bool wide = widths[w] >= 16;
                cr_assert_eq(sr__plan_choose(&kc)->id, wide ? CUDA_PLAN_FUSED : CUDA_PLAN_DIRECT,
                             "%s R %d", forms[c].f, widths[w]);
                cr_assert(fused_candidate_is(&kc, wide), "%s R %d: the fused candidate %s",
                          forms[c].f, widths[w], wide ? "not chosen" : "not rejected");
                struct expr_buf b = {0};
                struct cuda_plan plan;
                struct cuda_fused fp;
                cr_assert_eq(jit_emit_cuda_fused(k, JIT_ACC_BLOCK, &b, &plan, &fp), SR_OK);
                cr_assert_eq(fp.avar, forms[c].avar, "%s: A is argument %d", forms[c].f, fp.avar);
                cr_assert_eq(fp.bvar, forms[c].bvar, "%s: B is argument %d", forms[c].f, fp.bvar);
                cr_assert_eq(fp.cfactor, forms[c].cfactor, "%s: C", forms[c].f);
                struct nvrtc_out o;
                const char *arch = archs[(w + dt) % 2];
                sr_status st = jit_nvrtc_compile(b.data, "t.cu", arch, false, &o);
                cr_assert_eq(st, SR_OK, "%s R %d for %s: %s\nsource:\n%s", forms[c].f, widths[w],
                             arch, o.log ? o.log : "", b.data);
                free(o.image);
                free(o.log);
                free(b.data);
                sr_kernel_free(k);
            }
    sr_ctx_free(ctx);
}

/* An F whose reduced-index terms exceed shared memory even with tiles of one index (float64
 * squared distance of dimension 6000, alone or beside an inner product of the same variables):
 * the plan is the fused one, and its emitter declines, so the runtime falls back. */
Test(nvrtc, fused_declines_beyond_shared_memory)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    const char *al[] = {"q=Vi(6000)", "k=Vj(6000)", "v=Vj(64)"};
    sr_expr *f, *w;
    cr_assert_eq(sr_parse(ctx, "v", al, 3, &w), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_SUMSOFTMAXWEIGHT;
    d.weight = w;
    d.dtype = SR_F64;
    /* the second with a wide inner product (a tile product) beside the squared distance */
    static const char *const fs[] = {"-SqDist(q,k)", "(q|k)-SqDist(q,k)"};
    for (int c = 0; c < 2; c++) {
        cr_assert_eq(sr_parse(ctx, fs[c], al, 3, &f), SR_OK);
        sr_kernel *k = ref_kernel(ctx, f, d);
        sr_kernel kc = *k;
        kc.nplans = cuda_plans(&kc, JIT_ACC_BLOCK, kc.plans);
        const struct sr_plan *p = sr__plan_choose(&kc);
        cr_assert_eq(p->id, CUDA_PLAN_FUSED, "%s", fs[c]);
        cr_assert_eq(strstr(p->why, "inner product of 6000 values") != NULL, c == 1, "%s: %s",
                     fs[c], p->why);
        fused_declines(k);
    }
    sr_ctx_free(ctx);
}

/* F with a wide inner product (u_o | w_r) of an output-side and a reduced-side variable: the
 * fused plan is chosen from 16 values on whatever the output's width (the Gaussian's d/dx at
 * D = 3 with the incoming gradient G and b of R values: (G|b); (x|y) of D values with B of one
 * or three columns, A - B, a softmax's narrow weight), the direct plan below; the fused module
 * computes the inner product as a tile product (fp.dot, u and w the arguments), its tiles shrink
 * to 16 reduced indices in float64 (the chunks of u and w beside the tiles of F and B), and it
 * compiles for compute_80 and compute_90; (q|k) of 6000 float64 values, whose operands would
 * exceed shared memory as columns, fits as chunks. */
Test(nvrtc, fused_dot_compiles)
{
    need_nvrtc();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    static const struct {
        const char *f, *w;
        int D, R, grad, dot; /* grad: the kernel is the gradient w.r.t. x; dot: u's width */
        int uvar, wvar;      /* u and w: x and y (output side, reduced side), or G and b */
    } cases[] = {{"Exp(-SqDist(x,y)*g)*b", NULL, 3, 15, 1, 0, -1, -1},
                 {"Exp(-SqDist(x,y)*g)*b", NULL, 3, 16, 1, 16, 4, 3},
                 {"Exp(-SqDist(x,y)*g)*b", NULL, 3, 1100, 1, 1100, 4, 3},
                 {"Exp(-(x|y)*g)*b", NULL, 15, 1, 0, 0, -1, -1},
                 {"Exp(-(x|y)*g)*b", NULL, 16, 1, 0, 16, 0, 1},
                 {"Exp(-(y|x)*g)*(a-b)", NULL, 128, 3, 0, 128, 0, 1},
                 {"(x|y)*g", "b", 17, 3, 0, 17, 0, 1},
                 {"(x|y)", "b", 6000, 64, 0, 6000, 0, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int axis = 1; axis >= 0; axis--)
            for (int dt = 0; dt < 2; dt++) {
                char o = axis ? 'i' : 'j', r = axis ? 'j' : 'i', al[4][32];
                snprintf(al[0], sizeof al[0], "x=V%c(%d)", o, cases[c].D);
                snprintf(al[1], sizeof al[1], "y=V%c(%d)", r, cases[c].D);
                snprintf(al[2], sizeof al[2], "b=V%c(%d)", r, cases[c].R);
                snprintf(al[3], sizeof al[3], "a=V%c(%d)", o, cases[c].R);
                const char *alias[] = {al[0], al[1], "g=Pm(1)", al[2], al[3]};
                sr_kernel *k0 = form_kernel(ctx, cases[c].f, cases[c].w, alias, axis, (sr_dtype)dt);
                sr_kernel *k = k0;
                if (cases[c].grad)
                    cr_assert_eq(sr_kernel_grad(k0, 0, &k), SR_OK, "%s", sr_ctx_error(ctx));
                char what[128];
                snprintf(what, sizeof what, "%s D %d R %d%s axis %d %s", cases[c].f, cases[c].D,
                         cases[c].R, cases[c].grad ? " d/dx" : "", axis, dt ? "f64" : "f32");
                sr_kernel kc = *k;
                kc.nplans = cuda_plans(&kc, JIT_ACC_BLOCK, kc.plans);
                const bool dot = cases[c].dot > 0;
                cr_assert_eq(sr__plan_choose(&kc)->id, dot ? CUDA_PLAN_FUSED : CUDA_PLAN_DIRECT,
                             "%s", what);
                struct expr_buf b = {0};
                struct cuda_plan plan;
                struct cuda_fused fp;
                if (!dot) {
                    sr_kernel_free(k);
                    if (k != k0)
                        sr_kernel_free(k0);
                    continue;
                }
                cr_assert_eq(jit_emit_cuda_fused(k, JIT_ACC_BLOCK, &b, &plan, &fp), SR_OK, "%s",
                             what);
                cr_assert_eq(fp.dot, cases[c].dot, "%s: dot %d", what, fp.dot);
                cr_assert(fp.uvar == cases[c].uvar && fp.wvar == cases[c].wvar, "%s: u %d, w %d",
                          what, fp.uvar, fp.wvar);
                cr_assert_eq(fp.tj, dt ? 16 : 32, "%s: tj %d", what, fp.tj);
                struct nvrtc_out no;
                const char *arch = archs[(c + (size_t)dt) % 2];
                sr_status st = jit_nvrtc_compile(b.data, "t.cu", arch, false, &no);
                cr_assert_eq(st, SR_OK, "%s for %s: %s\nsource:\n%s", what, arch,
                             no.log ? no.log : "", b.data);
                free(no.image);
                free(no.log);
                free(b.data);
                sr_kernel_free(k);
                if (k != k0)
                    sr_kernel_free(k0);
            }
    sr_ctx_free(ctx);
}
