/*
 * test-xla-ffi.c — the XLA FFI handlers of symred-xla.c called with call frames built here, as
 * XLA builds them (no JAX): the metadata query, a run against sr_kernel_run_ex, int32 indices,
 * and every decoding error, each answered through the API's error function with a message,
 * never a crash or a write outside a result. The CUDA handler, on a machine without a GPU (or
 * with a CPU kernel), must answer with an error too.
 */
#include "xla/ffi/api/c_api.h"

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

static XLA_FFI_Error *stream_get(XLA_FFI_Stream_Get_Args *args)
{
    args->stream = NULL;
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
    XLA_FFI_AttrType attr_types[8];
    XLA_FFI_ByteSpan names[8], *name_ptrs[8];
    void *attrs[8];
    XLA_FFI_Scalar scalars[8];
    int64_t values[8];
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

static void add_arg(frame *f, void *data, int64_t rows, int64_t cols)
{
    int64_t i = f->cf.args.size++;
    add_buffer(&f->arg_bufs[i], f->arg_dims[i], XLA_FFI_DataType_F64, data, rows, cols);
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

enum { NX = 5, NY = 4 };
static double x[NX * 3], y[NY * 3], b[NY];

/* A frame for kernel k on x, y, b with the attributes of a correct call, its one result of
 * type t in out (NX rows). */
static void std_frame(frame *f, sr_ctx *ctx, sr_kernel *k, XLA_FFI_DataType t, void *out)
{
    frame_init(f);
    add_arg(f, x, NX, 3);
    add_arg(f, y, NY, 3);
    add_arg(f, b, NY, 1);
    add_attr(f, "context", (int64_t)(uintptr_t)ctx);
    add_attr(f, "kernel", (int64_t)(uintptr_t)k);
    add_attr(f, "dtype", SR_F64);
    add_attr(f, "nout", NX);
    add_attr(f, "nx", NX);
    add_attr(f, "ny", NY);
    add_ret(f, t, out, NX, 1);
}

static sr_kernel *kernel(sr_ctx *ctx, const char *formula, sr_reduction red)
{
    const char *aliases[] = {"x = Vi(3)", "y = Vj(3)", "b = Vj(1)"};
    sr_expr *e = NULL;
    if (sr_parse(ctx, formula, aliases, 3, &e) != SR_OK)
        return NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = red;
    d.dtype = SR_F64;
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k = NULL;
    return sr_kernel_new(ctx, e, &d, &k) == SR_OK ? k : NULL;
}

static void expect_error(XLA_FFI_Error *err, const char *needle)
{
    CHECK(err != NULL && strstr(last_error, needle) != NULL,
          "want an error mentioning \"%s\", got %s \"%s\"", needle, err ? "error" : "success",
          err ? last_error : "");
}

int main(void)
{
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

    /* The CUDA handler: no GPU here, or a CPU kernel: an error either way. */
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
