/*
 * test-xla-ffi.c — the XLA FFI handlers of symred-xla.c called with call frames built here, as
 * XLA builds them (no JAX): the metadata query, a run against sr_kernel_run_ex, int32 indices,
 * and every decoding error, each answered through the API's error function with a message,
 * never a crash or a write outside a result. The CUDA handler given a CPU kernel (and on a
 * machine without a GPU) must answer with an error too. Where a CUDA device opens (libcuda
 * loaded with dlopen, as libsymred does), the CUDA handler also runs SR_DEVICE_CUDA kernels on
 * device buffers with a real stream from XLA_FFI_Stream_Get, matching the CPU handler, and
 * fails cleanly on what the GPU does not support; elsewhere that part prints why it skipped.
 */
#include "xla/ffi/api/c_api.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"

XLA_FFI_Error *symred_xla_cpu(XLA_FFI_CallFrame *frame);
XLA_FFI_Error *symred_xla_cuda(XLA_FFI_CallFrame *frame);
typedef struct symred_xla_keeper symred_xla_keeper;
symred_xla_keeper *symred_xla_keeper_new(void);
int symred_xla_keeper_adopt(symred_xla_keeper *k, sr_ctx *ctx, sr_kernel *const *kernels, int n);
void symred_xla_keeper_release(void *k);
long symred_xla_keepers_alive(void);

static int failures;
static char last_error[1024];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* The API functions the handlers call: the error is the message, kept for the checks. */
static XLA_FFI_Error *error_create(XLA_FFI_Error_Create_Args *args)
{
    snprintf(last_error, sizeof last_error, "%s", args->message);
    return (XLA_FFI_Error *)last_error;
}

/* XLA's stream: NULL without a GPU, the harness's own CUstream in the GPU part. */
static void *xla_stream;

static XLA_FFI_Error *stream_get(XLA_FFI_Stream_Get_Args *args)
{
    args->stream = xla_stream;
    return NULL;
}

/* XLA's side of a stateful handler: the registered type's deleter and the state set. */
static const XLA_FFI_TypeInfo *registered_type;
static void *state_set;
static int64_t state_type;

static XLA_FFI_Error *type_register(XLA_FFI_Type_Register_Args *args)
{
    registered_type = args->type_info;
    args->type_id->type_id = 42;
    return NULL;
}

static XLA_FFI_Error *state_set_fn(XLA_FFI_State_Set_Args *args)
{
    state_set = args->state;
    state_type = args->type_id->type_id;
    return NULL;
}

static XLA_FFI_Api api;

/* A call frame under construction. */
typedef struct frame {
    XLA_FFI_CallFrame cf;
    XLA_FFI_ArgType arg_types[8];
    void *args[8];
    XLA_FFI_Buffer arg_bufs[8];
    int64_t arg_dims[8][2];
    XLA_FFI_RetType ret_types[2];
    void *rets[2];
    XLA_FFI_Buffer ret_bufs[2];
    int64_t ret_dims[2][2];
    XLA_FFI_AttrType attr_types[16];
    XLA_FFI_ByteSpan names[16], *name_ptrs[16];
    void *attrs[16];
    XLA_FFI_Scalar scalars[16];
    XLA_FFI_Array arrays[16];
    int64_t values[16];
} frame;

static void frame_init(frame *f)
{
    memset(f, 0, sizeof *f);
    f->cf.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    f->cf.api = &api;
    f->cf.stage = XLA_FFI_ExecutionStage_EXECUTE;
    f->cf.args.types = f->arg_types;
    f->cf.args.args = f->args;
    f->cf.rets.types = f->ret_types;
    f->cf.rets.rets = f->rets;
    f->cf.attrs.types = f->attr_types;
    f->cf.attrs.names = f->name_ptrs;
    f->cf.attrs.attrs = f->attrs;
}

static void add_buffer(XLA_FFI_Buffer *b, int64_t *dims, XLA_FFI_DataType t, void *data,
                       int64_t rows, int64_t cols)
{
    b->struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    b->dtype = t;
    b->data = data;
    b->rank = 2;
    dims[0] = rows;
    dims[1] = cols;
    b->dims = dims;
}

static void add_arg_typed(frame *f, XLA_FFI_DataType t, void *data, int64_t rows, int64_t cols)
{
    int64_t i = f->cf.args.size++;
    add_buffer(&f->arg_bufs[i], f->arg_dims[i], t, data, rows, cols);
    f->arg_types[i] = XLA_FFI_ArgType_BUFFER;
    f->args[i] = &f->arg_bufs[i];
}

static void add_ret(frame *f, XLA_FFI_DataType t, void *data, int64_t rows, int64_t cols)
{
    int64_t i = f->cf.rets.size++;
    add_buffer(&f->ret_bufs[i], f->ret_dims[i], t, data, rows, cols);
    f->ret_types[i] = XLA_FFI_RetType_BUFFER;
    f->rets[i] = &f->ret_bufs[i];
}

static void add_attr(frame *f, const char *name, int64_t value)
{
    int64_t i = f->cf.attrs.size++;
    f->names[i] = (XLA_FFI_ByteSpan){name, strlen(name)};
    f->name_ptrs[i] = &f->names[i];
    f->values[i] = value;
    f->scalars[i] = (XLA_FFI_Scalar){XLA_FFI_DataType_S64, &f->values[i]};
    f->attr_types[i] = XLA_FFI_AttrType_SCALAR;
    f->attrs[i] = &f->scalars[i];
}

/* An int64 array attribute (the ranges) over data, which must outlive the call. */
static void add_array_attr(frame *f, const char *name, int64_t *data, size_t n)
{
    int64_t i = f->cf.attrs.size++;
    f->names[i] = (XLA_FFI_ByteSpan){name, strlen(name)};
    f->name_ptrs[i] = &f->names[i];
    f->arrays[i] = (XLA_FFI_Array){XLA_FFI_DataType_S64, n, data};
    f->attr_types[i] = XLA_FFI_AttrType_ARRAY;
    f->attrs[i] = &f->arrays[i];
}

enum { NX = 5, NY = 4 };
static double x[NX * 3], y[NY * 3], b[NY];

/* A frame for kernel k of dtype t over the arrays x, y, b (host or device addresses: void *), its
 * one result of type rt, rows x cols, at out. */
static void gpu_frame(frame *f, sr_ctx *ctx, sr_kernel *k, XLA_FFI_DataType t, int64_t nx,
                      int64_t ny, void *px, void *py, void *pb, XLA_FFI_DataType rt, void *out,
                      int64_t cols)
{
    frame_init(f);
    add_arg_typed(f, t, px, nx, 3);
    add_arg_typed(f, t, py, ny, 3);
    add_arg_typed(f, t, pb, ny, 1);
    add_attr(f, "context", (int64_t)(uintptr_t)ctx);
    add_attr(f, "kernel", (int64_t)(uintptr_t)k);
    add_attr(f, "dtype", t == XLA_FFI_DataType_F32 ? SR_F32 : SR_F64);
    add_attr(f, "nout", nx);
    add_attr(f, "nx", nx);
    add_attr(f, "ny", ny);
    add_ret(f, rt, out, nx, cols);
}

/* A frame for kernel k on x, y, b with the attributes of a correct call, its one result of
 * type t in out (NX rows). */
static void std_frame(frame *f, sr_ctx *ctx, sr_kernel *k, XLA_FFI_DataType t, void *out)
{
    gpu_frame(f, ctx, k, XLA_FFI_DataType_F64, NX, NY, x, y, b, t, out, 1);
}

static sr_kernel *kernel_on(sr_ctx *ctx, const char *formula, sr_reduction red, int k,
                            sr_dtype dtype, sr_device device)
{
    const char *aliases[] = {"x = Vi(3)", "y = Vj(3)", "b = Vj(1)"};
    sr_expr *e = NULL;
    if (sr_parse(ctx, formula, aliases, 3, &e) != SR_OK)
        return NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.k = k;
    d.dtype = dtype;
    d.device = device;
    sr_kernel *kern = NULL;
    return sr_kernel_new(ctx, e, &d, &kern) == SR_OK ? kern : NULL;
}

static sr_kernel *kernel(sr_ctx *ctx, const char *formula, sr_reduction red)
{
    return kernel_on(ctx, formula, red, 0, SR_F64, SR_DEVICE_REFERENCE);
}

static void expect_error(XLA_FFI_Error *err, const char *needle)
{
    CHECK(err != NULL && strstr(last_error, needle) != NULL,
          "want an error mentioning \"%s\", got %s \"%s\"", needle, err ? "error" : "success",
          err ? last_error : "");
}

/* ---- the CUDA handler on a GPU ----------------------------------------------------------- */

/* The driver API entry points the GPU part uses, loaded with dlopen as libsymred loads them
 * ($SYMRED_LIBCUDA, else libcuda.so.1), so the harness builds and runs without CUDA. */
typedef unsigned long long cu_ptr;
typedef struct cuda {
    int (*init)(unsigned flags);
    int (*device_count)(int *n);
    int (*device_get)(int *dev, int ordinal);
    int (*primary_retain)(void **ctx, int dev);
    int (*ctx_set_current)(void *ctx);
    int (*stream_create)(void **stream, unsigned flags);
    int (*stream_destroy)(void *stream);
    int (*stream_sync)(void *stream);
    int (*mem_alloc)(cu_ptr *p, size_t bytes);
    int (*mem_free)(cu_ptr p);
    int (*memcpy_htod_async)(cu_ptr dst, const void *src, size_t bytes, void *stream);
    int (*memcpy_dtoh)(void *dst, cu_ptr src, size_t bytes);
    int (*memset_d8)(cu_ptr dst, unsigned char value, size_t bytes);
    void *stream;
} cuda;

/* Opens device $SYMRED_CUDA_DEVICE (default 0) as libsymred does, its primary context current
 * and a stream of the harness's own (XLA's, for the handler); false with the reason in why. */
static int cuda_open(cuda *cu, char *why, size_t whylen)
{
    memset(cu, 0, sizeof *cu);
    const char *name = getenv("SYMRED_LIBCUDA");
    void *h =
        dlopen(name != NULL && name[0] != '\0' ? name : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, whylen, "no CUDA driver library (%s)", dlerror());
        return 0;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&cu->init, "cuInit"},
        {(void **)&cu->device_count, "cuDeviceGetCount"},
        {(void **)&cu->device_get, "cuDeviceGet"},
        {(void **)&cu->primary_retain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu->ctx_set_current, "cuCtxSetCurrent"},
        {(void **)&cu->stream_create, "cuStreamCreate"},
        {(void **)&cu->stream_destroy, "cuStreamDestroy_v2"},
        {(void **)&cu->stream_sync, "cuStreamSynchronize"},
        {(void **)&cu->mem_alloc, "cuMemAlloc_v2"},
        {(void **)&cu->mem_free, "cuMemFree_v2"},
        {(void **)&cu->memcpy_htod_async, "cuMemcpyHtoDAsync_v2"},
        {(void **)&cu->memcpy_dtoh, "cuMemcpyDtoH_v2"},
        {(void **)&cu->memset_d8, "cuMemsetD8_v2"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (*syms[i].slot == NULL) {
            snprintf(why, whylen, "the CUDA driver library has no %s", syms[i].name);
            return 0;
        }
    }
    const char *env = getenv("SYMRED_CUDA_DEVICE");
    int ordinal = env != NULL && env[0] != '\0' ? atoi(env) : 0, n = 0, dev = 0, r;
    void *ctx = NULL;
    if ((r = cu->init(0)) != 0 || (r = cu->device_count(&n)) != 0 || n <= ordinal) {
        snprintf(why, whylen, "no CUDA device (cuInit/cuDeviceGetCount: error %d, %d devices)", r,
                 n);
        return 0;
    }
    if ((r = cu->device_get(&dev, ordinal)) != 0 || (r = cu->primary_retain(&ctx, dev)) != 0 ||
        (r = cu->ctx_set_current(ctx)) != 0 || (r = cu->stream_create(&cu->stream, 1)) != 0) {
        snprintf(why, whylen, "opening CUDA device %d failed: error %d", ordinal, r);
        return 0;
    }
    return 1;
}

/* One problem on the device: x (nx x 3), y (ny x 3), b (ny x 1) and a result of rows x cols
 * elements of esize bytes, in device memory. */
typedef struct gpu_case {
    int64_t nx, ny;
    cu_ptr x, y, b, out;
    size_t out_bytes;
} gpu_case;

static int gpu_case_new(cuda *cu, gpu_case *g, const void *hx, const void *hy, const void *hb,
                        size_t esize, size_t out_bytes)
{
    size_t bx = (size_t)g->nx * 3 * esize, by = (size_t)g->ny * 3 * esize,
           bb = (size_t)g->ny * esize;
    g->out_bytes = out_bytes;
    /* The inputs are copied on XLA's stream and not waited for: the handler must wait. */
    return cu->mem_alloc(&g->x, bx) == 0 && cu->mem_alloc(&g->y, by) == 0 &&
           cu->mem_alloc(&g->b, bb) == 0 && cu->mem_alloc(&g->out, out_bytes) == 0 &&
           cu->memset_d8(g->out, 0xAB, out_bytes) == 0 &&
           cu->memcpy_htod_async(g->x, hx, bx, cu->stream) == 0 &&
           cu->memcpy_htod_async(g->y, hy, by, cu->stream) == 0 &&
           cu->memcpy_htod_async(g->b, hb, bb, cu->stream) == 0;
}

static void gpu_case_free(cuda *cu, gpu_case *g)
{
    cu->stream_sync(cu->stream);
    cu->mem_free(g->x), cu->mem_free(g->y), cu->mem_free(g->b), cu->mem_free(g->out);
}

static double elem(const void *p, int f32, int64_t i)
{
    return f32 ? ((const float *)p)[i] : ((const double *)p)[i];
}

/* SqDist(x_i, y_j) + b_j in double, for comparing the rankings of two ArgKMins. */
static double score(const void *hx, const void *hy, const void *hb, int f32, int64_t i, int64_t j)
{
    double s = elem(hb, f32, j);
    for (int d = 0; d < 3; d++) {
        double t = elem(hx, f32, i * 3 + d) - elem(hy, f32, j * 3 + d);
        s += t * t;
    }
    return s;
}

/* The Gaussian mat-vec and the ArgKMin of one dtype and size on the GPU through the CUDA
 * handler, against the CPU handler on the same data; then the GPU's error paths. */
static void gpu_one(cuda *cu, sr_ctx *ctx, int f32, int64_t nx, int64_t ny)
{
    const char *dt = f32 ? "float32" : "float64";
    sr_dtype sdt = f32 ? SR_F32 : SR_F64;
    XLA_FFI_DataType t = f32 ? XLA_FFI_DataType_F32 : XLA_FFI_DataType_F64;
    size_t es = f32 ? sizeof(float) : sizeof(double);
    int kk = ny < 4 ? (int)ny : 4;
    void *hx = malloc((size_t)nx * 3 * es), *hy = malloc((size_t)ny * 3 * es),
         *hb = malloc((size_t)ny * es), *cpu_out = malloc((size_t)nx * (size_t)kk * 8),
         *gpu_out = malloc((size_t)nx * (size_t)kk * 8);
    CHECK(hx && hy && hb && cpu_out && gpu_out, "out of memory");
    if (!(hx && hy && hb && cpu_out && gpu_out))
        goto done;
    for (int64_t i = 0; i < nx * 3; i++)
        f32 ? (void)(((float *)hx)[i] = (float)sin(0.37 * i + 1.0))
            : (void)(((double *)hx)[i] = sin(0.37 * i + 1.0));
    for (int64_t i = 0; i < ny * 3; i++)
        f32 ? (void)(((float *)hy)[i] = (float)cos(0.91 * i + 2.0))
            : (void)(((double *)hy)[i] = cos(0.91 * i + 2.0));
    for (int64_t i = 0; i < ny; i++)
        f32 ? (void)(((float *)hb)[i] = (float)(0.01 * (double)(i % 17) - 0.05))
            : (void)(((double *)hb)[i] = 0.01 * (double)(i % 17) - 0.05);

    static const char *const formulas[] = {"Exp(-SqDist(x, y)) * b", "SqDist(x, y) + b"};
    for (int which = 0; which < 2; which++) {
        int argk = which == 1;
        sr_reduction red = argk ? SR_ARGKMIN : SR_SUM;
        int cols = argk ? kk : 1;
        XLA_FFI_DataType rt = argk ? XLA_FFI_DataType_S64 : t;
        size_t out_bytes = (size_t)nx * (size_t)cols * (argk ? sizeof(int64_t) : es);
        sr_kernel *kc = kernel_on(ctx, formulas[which], red, kk, sdt, SR_DEVICE_CPU);
        sr_kernel *kg = kernel_on(ctx, formulas[which], red, kk, sdt, SR_DEVICE_CUDA);
        CHECK(kc != NULL && kg != NULL, "%s %s kernels: %s", dt, formulas[which],
              sr_ctx_error(ctx));
        if (kc == NULL || kg == NULL) {
            sr_kernel_free(kc), sr_kernel_free(kg);
            continue;
        }
        frame f;
        gpu_frame(&f, ctx, kc, t, nx, ny, hx, hy, hb, rt, cpu_out, cols);
        XLA_FFI_Error *err = symred_xla_cpu(&f.cf);
        CHECK(err == NULL, "%s %s nx=%lld: CPU handler: %s", dt, formulas[which], (long long)nx,
              last_error);
        gpu_case g = {.nx = nx, .ny = ny};
        int have = gpu_case_new(cu, &g, hx, hy, hb, es, out_bytes);
        CHECK(have, "%s %s nx=%lld: device buffers", dt, formulas[which], (long long)nx);
        if (!have) {
            gpu_case_free(cu, &g);
            sr_kernel_free(kc), sr_kernel_free(kg);
            continue;
        }
        gpu_frame(&f, ctx, kg, t, nx, ny, (void *)(uintptr_t)g.x, (void *)(uintptr_t)g.y,
                  (void *)(uintptr_t)g.b, rt, (void *)(uintptr_t)g.out, cols);
        err = symred_xla_cuda(&f.cf);
        CHECK(err == NULL, "%s %s nx=%lld: CUDA handler: %s", dt, formulas[which], (long long)nx,
              last_error);
        CHECK(cu->memcpy_dtoh(gpu_out, g.out, out_bytes) == 0, "copy back");
        int bad = 0;
        for (int64_t i = 0; i < nx && err == NULL && bad < 5; i++) {
            if (!argk) {
                double a = elem(gpu_out, f32, i), w = elem(cpu_out, f32, i);
                double tol = (f32 ? 1e-5 : 1e-12) * (1.0 + fabs(w));
                if (!(fabs(a - w) <= tol)) {
                    bad++;
                    CHECK(0, "%s Sum nx=%lld row %lld: GPU %.17g, CPU %.17g", dt, (long long)nx,
                          (long long)i, a, w);
                }
                continue;
            }
            /* Indices: in range, and ranking the same scores (ties may order differently). */
            for (int r = 0; r < cols; r++) {
                int64_t gi = ((int64_t *)gpu_out)[i * cols + r];
                int64_t ci = ((int64_t *)cpu_out)[i * cols + r];
                int ok = gi >= 0 && gi < ny;
                if (ok) {
                    double sg = score(hx, hy, hb, f32, i, gi), sc = score(hx, hy, hb, f32, i, ci);
                    ok = fabs(sg - sc) <= (f32 ? 1e-5 : 1e-12) * (1.0 + fabs(sc));
                }
                if (!ok) {
                    bad++;
                    CHECK(0, "%s ArgKMin nx=%lld row %lld rank %d: GPU %lld, CPU %lld", dt,
                          (long long)nx, (long long)i, r, (long long)gi, (long long)ci);
                }
            }
        }

        /* The GPU's error paths: an error with its message, the device result untouched. */
        CHECK(cu->memset_d8(g.out, 0xAB, out_bytes) == 0, "memset");
        if (argk) {
            gpu_frame(&f, ctx, kg, t, nx, ny, (void *)(uintptr_t)g.x, (void *)(uintptr_t)g.y,
                      (void *)(uintptr_t)g.b, XLA_FFI_DataType_S32, (void *)(uintptr_t)g.out, cols);
            expect_error(symred_xla_cuda(&f.cf), "indices on the GPU need int64");
        }
        int64_t ranges_i[2] = {0, nx}, slices[1] = {1}, red_j[2] = {0, ny}, ranges_j[2] = {0, ny},
                red_i[2] = {0, nx};
        gpu_frame(&f, ctx, kg, t, nx, ny, (void *)(uintptr_t)g.x, (void *)(uintptr_t)g.y,
                  (void *)(uintptr_t)g.b, rt, (void *)(uintptr_t)g.out, cols);
        add_array_attr(&f, "ranges_i", ranges_i, 2);
        add_array_attr(&f, "slices_i", slices, 1);
        add_array_attr(&f, "redranges_j", red_j, 2);
        add_array_attr(&f, "ranges_j", ranges_j, 2);
        add_array_attr(&f, "slices_j", slices, 1);
        add_array_attr(&f, "redranges_i", red_i, 2);
        expect_error(symred_xla_cuda(&f.cf), "block-sparse ranges");
        gpu_frame(&f, ctx, kg, t, nx, ny, (void *)(uintptr_t)g.x, (void *)(uintptr_t)g.y,
                  (void *)(uintptr_t)g.b, rt, (void *)(uintptr_t)g.out, cols);
        f.values[4] = -1; /* nx < 0: the library's own message */
        expect_error(symred_xla_cuda(&f.cf), "symred: ");
        unsigned char *back = malloc(out_bytes);
        CHECK(back != NULL && cu->memcpy_dtoh(back, g.out, out_bytes) == 0, "copy back");
        for (size_t i = 0; back != NULL && i < out_bytes; i++)
            if (back[i] != 0xAB) {
                CHECK(0, "%s %s: a failed GPU call wrote byte %zu", dt, formulas[which], i);
                break;
            }
        free(back);
        gpu_case_free(cu, &g);
        sr_kernel_free(kc), sr_kernel_free(kg);
    }
done:
    free(hx), free(hy), free(hb), free(cpu_out), free(gpu_out);
}

/* The GPU part: skipped, with a message, where no CUDA device can be opened (a failure with
 * --require-gpu, as scripts/gpu-check.sh runs it on the GPU machine). */
static void gpu_checks(sr_ctx *ctx, int require_gpu)
{
    cuda cu;
    char why[512];
    if (!cuda_open(&cu, why, sizeof why)) {
        printf("test-xla-ffi: GPU part skipped: %s\n", why);
        CHECK(!require_gpu, "--require-gpu: %s", why);
        return;
    }
    xla_stream = cu.stream;
    int before = failures;
    static const int64_t sizes[][2] = {{1, 1}, {1009, 997}};
    for (int f32 = 0; f32 < 2; f32++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            gpu_one(&cu, ctx, f32, sizes[s][0], sizes[s][1]);
    xla_stream = NULL;
    cu.stream_destroy(cu.stream);
    printf("test-xla-ffi: GPU part: %s\n", failures == before ? "passed" : "FAILED");
}

int main(int argc, char **argv)
{
    int require_gpu = argc > 1 && strcmp(argv[1], "--require-gpu") == 0;
    api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    api.XLA_FFI_Error_Create = error_create;
    api.XLA_FFI_Stream_Get = stream_get;
    api.XLA_FFI_Type_Register = type_register;
    api.XLA_FFI_State_Set = state_set_fn;
    for (int i = 0; i < NX * 3; i++)
        x[i] = sin(i + 1.0);
    for (int i = 0; i < NY * 3; i++)
        y[i] = cos(i + 2.0);
    for (int i = 0; i < NY; i++)
        b[i] = i - 1.5;
    sr_ctx *ctx = NULL;
    if (sr_ctx_new(&ctx) != SR_OK)
        return 1;
    sr_kernel *sum = kernel(ctx, "Exp(-SqDist(x, y)) * b", SR_SUM);
    sr_kernel *amin = kernel(ctx, "SqDist(x, y) + b", SR_ARGMIN);
    CHECK(sum != NULL && amin != NULL, "kernels: %s", sr_ctx_error(ctx));
    if (sum == NULL || amin == NULL)
        return 1;
    frame f;

    /* The metadata query: answered with the headers' version, no run. */
    XLA_FFI_Metadata md;
    memset(&md, 0, sizeof md);
    md.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
    XLA_FFI_Metadata_Extension ext;
    memset(&ext, 0, sizeof ext);
    ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
    ext.extension_base.type = XLA_FFI_Extension_Metadata;
    ext.metadata = &md;
    for (int h = 0; h < 2; h++) {
        frame_init(&f);
        f.cf.extension_start = &ext.extension_base;
        XLA_FFI_Error *err = (h ? symred_xla_cuda : symred_xla_cpu)(&f.cf);
        CHECK(err == NULL && md.api_version.major_version == XLA_FFI_API_MAJOR &&
                  md.api_version.minor_version == XLA_FFI_API_MINOR,
              "metadata: %s %d.%d", err ? last_error : "ok", md.api_version.major_version,
              md.api_version.minor_version);
    }

    /* A run: the handler's output equals sr_kernel_run_ex's. */
    double want[NX], got[NX];
    const void *args[] = {x, y, b};
    sr_run_desc run = {.nx = NX, .ny = NY, .nargs = 3, .args = args, .out = want};
    CHECK(sr_kernel_run_ex(sum, &run) == SR_OK, "%s", sr_ctx_error(ctx));
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, got);
    XLA_FFI_Error *err = symred_xla_cpu(&f.cf);
    CHECK(err == NULL, "run: %s", last_error);
    for (int i = 0; i < NX; i++)
        CHECK(got[i] == want[i], "row %d: %g, want %g", i, got[i], want[i]);

    /* Indices into an int32 result. */
    int64_t want_idx[NX];
    int32_t idx32[NX];
    run.out = NULL;
    run.out_idx = want_idx;
    CHECK(sr_kernel_run_ex(amin, &run) == SR_OK, "%s", sr_ctx_error(ctx));
    std_frame(&f, ctx, amin, XLA_FFI_DataType_S32, idx32);
    err = symred_xla_cpu(&f.cf);
    CHECK(err == NULL, "argmin: %s", last_error);
    for (int i = 0; i < NX; i++)
        CHECK(idx32[i] == want_idx[i], "row %d: %d, want %lld", i, idx32[i],
              (long long)want_idx[i]);

    /* Decoding errors: each an error with a message, the result untouched. */
    double untouched[NX + 1];
    for (int i = 0; i <= NX; i++)
        untouched[i] = -7.0;
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.ret_dims[0][0] = NX + 1; /* one row too many */
    expect_error(symred_xla_cpu(&f.cf), "must hold 5 values");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F32, untouched); /* not the values' dtype */
    expect_error(symred_xla_cpu(&f.cf), "must hold 5 values");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.arg_bufs[1].dtype = XLA_FFI_DataType_F32; /* an array of another dtype */
    expect_error(symred_xla_cpu(&f.cf), "argument 1 is not a buffer of the kernel's dtype");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.values[2] = 7; /* not a dtype */
    expect_error(symred_xla_cpu(&f.cf), "dtype must be 0 (float32) or 1 (float64)");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.cf.args.size = 2; /* an array missing */
    expect_error(symred_xla_cpu(&f.cf), "takes 3 arrays, the call passes 2");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.cf.attrs.size = 5; /* no "ny" */
    expect_error(symred_xla_cpu(&f.cf), "lacks one of the attributes");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    add_attr(&f, "bogus", 1);
    expect_error(symred_xla_cpu(&f.cf), "unknown attribute bogus");
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, untouched);
    f.values[1] = 0; /* a NULL kernel */
    expect_error(symred_xla_cpu(&f.cf), "NULL kernel");
    for (int i = 0; i <= NX; i++)
        CHECK(untouched[i] == -7.0, "a failed call wrote row %d", i);

    /* A failure of the library itself: its message, through the error API. */
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, got);
    f.values[4] = -1; /* nx < 0 */
    expect_error(symred_xla_cpu(&f.cf), "symred: ");

    gpu_checks(ctx, require_gpu);

    /* The CUDA handler with a CPU kernel on host pointers: an error, GPU or not. */
    std_frame(&f, ctx, sum, XLA_FFI_DataType_F64, got);
    err = symred_xla_cuda(&f.cf);
    CHECK(err != NULL, "the CUDA handler ran a CPU kernel on host pointers");
    if (err != NULL)
        printf("CUDA handler without a GPU kernel: %s\n", last_error);

    sr_kernel_free(sum);
    sr_kernel_free(amin);
    /* Lifetime: a keeper adopts a context and its kernels; the instantiate stage makes the
     * executable hold a reference (its state), and the kernels are freed after the last of
     * the two releases. */
    sr_ctx *ctx2 = NULL;
    CHECK(sr_ctx_new(&ctx2) == SR_OK, "second context");
    sr_kernel *owned = kernel(ctx2, "Exp(-SqDist(x, y)) * b", SR_SUM);
    long alive0 = symred_xla_keepers_alive();
    symred_xla_keeper *keeper = symred_xla_keeper_new();
    CHECK(keeper != NULL && symred_xla_keepers_alive() == alive0 + 1, "keeper_new");
    CHECK(symred_xla_keeper_adopt(keeper, ctx2, &owned, 1) == 0, "adopt");
    CHECK(symred_xla_keeper_adopt(keeper, ctx2, &owned, 1) == -1, "adopt twice is refused");
    double out[NX];
    std_frame(&f, ctx2, owned, XLA_FFI_DataType_F64, out);
    f.cf.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    XLA_FFI_Error *ierr = symred_xla_cpu(&f.cf);
    CHECK(ierr == NULL && state_set == NULL, "instantiate without a keeper: no state (%s)",
          ierr ? last_error : "ok");
    add_attr(&f, "keeper", (int64_t)(uintptr_t)keeper);
    ierr = symred_xla_cpu(&f.cf);
    CHECK(ierr == NULL && state_set == keeper && state_type == 42 && registered_type != NULL,
          "instantiate: %s", ierr ? last_error : "state not set");
    f.cf.stage = XLA_FFI_ExecutionStage_EXECUTE; /* the keeper attribute is accepted */
    CHECK(symred_xla_cpu(&f.cf) == NULL, "run with a keeper attribute: %s", last_error);
    symred_xla_keeper_release(keeper); /* the Genred's reference */
    CHECK(symred_xla_keepers_alive() == alive0 + 1, "the executable still holds the keeper");
    CHECK(symred_xla_cpu(&f.cf) == NULL, "run after the Genred's release: %s", last_error);
    if (registered_type != NULL && state_set != NULL)
        registered_type->deleter(state_set); /* XLA destroys the executable */
    CHECK(symred_xla_keepers_alive() == alive0, "the last release frees the keeper");

    sr_ctx_free(ctx);
    if (failures == 0)
        printf("test-xla-ffi: all checks passed\n");
    return failures != 0;
}
