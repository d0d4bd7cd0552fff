/*
 * XLA FFI handlers for symred.jax: a symred kernel run as an XLA custom call.
 *
 * Written against the plain-C header xla/ffi/api/c_api.h (no C++): each handler receives XLA's
 * call frame, answers the metadata query XLA sends when the target is registered, decodes the
 * frame's buffers and attributes and runs the kernel. symred.jax registers them with
 * jax.ffi.register_ffi_target through ctypes and jax.ffi.pycapsule.
 *
 * The call's contract, set by symred/jax.py:
 *   attributes  kernel (u64): the sr_kernel pointer; context (u64): its sr_ctx, for error
 *               messages; dtype (s64): the kernel's sr_dtype, which every argument and the
 *               values must have; nx, ny (s64): the sizes of sr_run_desc; nout (s64): output
 *               rows (nx for axis 1, ny for axis 0); optionally ranges_i, slices_i, redranges_j,
 * ranges_j, slices_j, redranges_i (arrays of s64): block-sparse ranges for sr_kernel_run_ranges.
 *   arguments   sr_kernel_nargs(kernel) buffers, argument v being the array of variable index v
 *               (any placeholder for an index the formula does not use: the kernel never reads
 *               it), in the kernel's dtype.
 *   results     one or two buffers: the values (F32/F64), the indices (S64, or S32 when JAX runs
 *               without 64-bit types: converted from int64 here), or both in that order.
 * The Python side builds these from the kernel itself; the handler still checks the counts,
 * dtypes and result sizes so that a mismatch is an error, never a write outside a result. The
 * arguments' sizes are not checked here (the C API does not state a kernel's variables): the
 * Python side checks the shapes at trace time.
 * Errors are returned through XLA's error API with symred's message; JAX raises them as
 * Python exceptions.
 *
 * Lifetime. A compiled XLA program holds the kernel's address, and may outlive the Genred that
 * made it (a Genred created while tracing a jitted function, say). So a Genred's context and
 * kernels belong to a keeper (symred_xla_keeper_new) with a reference count: one reference
 * for the Genred (released by its finalizer, which hands the context and kernels over), and
 * one for every XLA executable whose custom call names the keeper (attribute keeper, u64):
 * the handler's instantiate stage, run when XLA builds the executable, takes it and stores
 * the keeper as the call's state, and XLA's state deleter releases it when the executable is
 * destroyed. The last release frees the kernels, then the context.
 */
#include "xla/ffi/api/c_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"

#define SRX_API __attribute__((visibility("default")))

SRX_API XLA_FFI_Error *symred_xla_cpu(XLA_FFI_CallFrame *frame);
SRX_API XLA_FFI_Error *symred_xla_cuda(XLA_FFI_CallFrame *frame);

/* A reference-counted owner of a Genred's context and kernels (see Lifetime above). */
typedef struct symred_xla_keeper symred_xla_keeper;
/* A new keeper holding one reference (the caller's); NULL when out of memory. */
SRX_API symred_xla_keeper *symred_xla_keeper_new(void);
/* Hands the context and n kernels over to the keeper, which frees them after its last
 * release; returns 0, or -1 when out of memory or called twice (nothing is taken then). */
SRX_API int symred_xla_keeper_adopt(symred_xla_keeper *k, sr_ctx *ctx, sr_kernel *const *kernels,
                                    int n);
/* Drops one reference; the last frees what the keeper holds. NULL is ignored. */
SRX_API void symred_xla_keeper_release(void *k);
/* The number of keepers not yet freed in this process (for tests and diagnostics). */
SRX_API long symred_xla_keepers_alive(void);

enum { NRANGES = 6 };

struct symred_xla_keeper {
    atomic_long refs;
    sr_ctx *ctx;
    sr_kernel **kernels;
    int nkernels;
};

/* Process-wide count of live keepers: diagnostic only (symred_xla_keepers_alive). */
static atomic_long keepers_alive;

symred_xla_keeper *symred_xla_keeper_new(void)
{
    symred_xla_keeper *k = calloc(1, sizeof *k);
    if (k == NULL)
        return NULL;
    atomic_init(&k->refs, 1);
    atomic_fetch_add(&keepers_alive, 1);
    return k;
}

int symred_xla_keeper_adopt(symred_xla_keeper *k, sr_ctx *ctx, sr_kernel *const *kernels, int n)
{
    if (k == NULL || k->ctx != NULL || n < 0)
        return -1;
    sr_kernel **copy = calloc((size_t)(n > 0 ? n : 1), sizeof *copy);
    if (copy == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        copy[i] = kernels[i];
    k->kernels = copy;
    k->nkernels = n;
    k->ctx = ctx;
    return 0;
}

void symred_xla_keeper_release(void *p)
{
    symred_xla_keeper *k = p;
    if (k == NULL || atomic_fetch_sub(&k->refs, 1) != 1)
        return;
    for (int i = 0; i < k->nkernels; i++)
        sr_kernel_free(k->kernels[i]);
    free(k->kernels);
    sr_ctx_free(k->ctx);
    free(k);
    atomic_fetch_sub(&keepers_alive, 1);
}

long symred_xla_keepers_alive(void) { return atomic_load(&keepers_alive); }

/* The range attributes, in the order of struct sr_ranges. */
static const char *const range_names[NRANGES] = {"ranges_i", "slices_i", "redranges_j",
                                                 "ranges_j", "slices_j", "redranges_i"};

/* One decoded call. */
typedef struct call {
    sr_kernel *kernel;
    sr_ctx *ctx;
    int64_t nx, ny, nout;
    symred_xla_keeper *keeper;            /* NULL when the call names none */
    XLA_FFI_DataType dtype;               /* of the arrays and values: the kernel's */
    const XLA_FFI_Array *ranges[NRANGES]; /* all NULL without ranges */
    const void **args;
    XLA_FFI_Buffer *values, *indices;
} call;

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = msg; /* copied by XLA */
    args.errc = code;
    return api->XLA_FFI_Error_Create(&args);
}

/* XLA asks each handler, when the target is registered, which FFI version it was built
 * against and which traits it has: it passes a metadata extension instead of a call. */
static int is_metadata_query(XLA_FFI_CallFrame *frame)
{
    return frame->extension_start != NULL &&
           frame->extension_start->type == XLA_FFI_Extension_Metadata;
}

static XLA_FFI_Error *keeper_type_id(const XLA_FFI_Api *api, XLA_FFI_TypeId *out);

static XLA_FFI_Error *answer_metadata(XLA_FFI_CallFrame *frame)
{
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)frame->extension_start;
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
        ext->metadata == NULL || ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: XLA's metadata structs are smaller than this handler's headers");
    ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    ext->metadata->api_version.extension_start = NULL;
    ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    ext->metadata->traits = 0;
    if (ext->metadata->struct_size >=
        offsetof(XLA_FFI_Metadata, state_type_id) + sizeof(XLA_FFI_TypeId))
        return keeper_type_id(frame->api, &ext->metadata->state_type_id);
    return NULL;
}

static int name_is(const XLA_FFI_ByteSpan *name, const char *want)
{
    size_t n = strlen(want);
    return name->len == n && memcmp(name->ptr, want, n) == 0;
}

/* An integer scalar attribute as int64 (XLA passes Python ints as S64, NumPy uint64 as U64). */
static int scalar_i64(XLA_FFI_AttrType type, void *attr, int64_t *out)
{
    if (type != XLA_FFI_AttrType_SCALAR)
        return 0;
    const XLA_FFI_Scalar *s = attr;
    switch (s->dtype) {
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
        memcpy(out, s->value, sizeof *out);
        return 1;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32: {
        int32_t v;
        memcpy(&v, s->value, sizeof v);
        *out = v;
        return 1;
    }
    default:
        return 0;
    }
}

static XLA_FFI_Error *decode_attrs(XLA_FFI_CallFrame *frame, call *c)
{
    const XLA_FFI_Attrs *a = &frame->attrs;
    int64_t kernel = 0, ctx = 0, dtype = -1, keeper = 0;
    static const char *const scalar_names[] = {"kernel", "context", "dtype", "nx",
                                               "ny",     "nout",    "keeper"};
    int64_t *slots[] = {&kernel, &ctx, &dtype, &c->nx, &c->ny, &c->nout, &keeper};
    enum { NSCALARS = 7, REQUIRED = (1 << 6) - 1 }; /* keeper is optional */
    int have = 0;                                   /* bit s: scalar_names[s] was given */
    for (int64_t i = 0; i < a->size; i++) {
        const XLA_FFI_ByteSpan *name = a->names[i];
        int s = 0;
        while (s < NSCALARS && !name_is(name, scalar_names[s]))
            s++;
        if (s < NSCALARS) {
            if (!scalar_i64(a->types[i], a->attrs[i], slots[s]))
                return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                            "symred: attribute %s must be an integer scalar", scalar_names[s]);
            have |= 1 << s;
            continue;
        }
        int r = 0;
        while (r < NRANGES && !name_is(name, range_names[r]))
            r++;
        if (r == NRANGES)
            return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "symred: unknown attribute %.*s", (int)name->len, name->ptr);
        const XLA_FFI_Array *arr = a->attrs[i];
        if (a->types[i] != XLA_FFI_AttrType_ARRAY || arr->dtype != XLA_FFI_DataType_S64)
            return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "symred: attribute %s must be an int64 array", range_names[r]);
        c->ranges[r] = arr;
    }
    if ((have & REQUIRED) != REQUIRED)
        return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: the call lacks one of the attributes kernel, context, dtype, nx, ny, "
                    "nout");
    if (dtype != SR_F32 && dtype != SR_F64)
        return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: attribute dtype must be 0 (float32) or 1 (float64), not %lld",
                    (long long)dtype);
    c->dtype = dtype == SR_F32 ? XLA_FFI_DataType_F32 : XLA_FFI_DataType_F64;
    int nr = 0;
    for (int r = 0; r < NRANGES; r++)
        nr += c->ranges[r] != NULL;
    if (nr != 0 && nr != NRANGES)
        return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: block-sparse ranges need all six arrays, %d were given", nr);
    if (kernel == 0 || ctx == 0)
        return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: NULL kernel or context");
    c->kernel = (sr_kernel *)(uintptr_t)kernel;
    c->ctx = (sr_ctx *)(uintptr_t)ctx;
    c->keeper = (symred_xla_keeper *)(uintptr_t)keeper;
    return NULL;
}

/* The XLA type of a keeper held as an executable's state: registered once per process with
 * the API XLA hands the handler, its deleter releasing the keeper. */
static pthread_mutex_t keeper_type_lock = PTHREAD_MUTEX_INITIALIZER;
static XLA_FFI_TypeId keeper_type; /* 0 until registered */

static XLA_FFI_Error *keeper_type_id(const XLA_FFI_Api *api, XLA_FFI_TypeId *out)
{
    static const XLA_FFI_TypeInfo info = {
        .struct_size = XLA_FFI_TypeInfo_STRUCT_SIZE,
        .deleter = symred_xla_keeper_release,
    };
    static const char name[] = "symred_xla_keeper";
    XLA_FFI_Error *err = NULL;
    pthread_mutex_lock(&keeper_type_lock);
    if (keeper_type.type_id == 0) {
        XLA_FFI_TypeId id = {0};
        XLA_FFI_Type_Register_Args args;
        memset(&args, 0, sizeof args);
        args.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
        args.name.ptr = name;
        args.name.len = sizeof name - 1;
        args.type_id = &id;
        args.type_info = &info;
        err = api->XLA_FFI_Type_Register(&args);
        if (err == NULL)
            keeper_type = id;
    }
    *out = keeper_type;
    pthread_mutex_unlock(&keeper_type_lock);
    return err;
}

/* The instantiate stage, run once when XLA builds an executable with this call: the
 * executable takes a reference to the call's keeper, as its state, which XLA's deleter
 * releases with the executable. */
static XLA_FFI_Error *instantiate(XLA_FFI_CallFrame *frame)
{
    call c;
    memset(&c, 0, sizeof c);
    XLA_FFI_Error *err = decode_attrs(frame, &c);
    if (err != NULL || c.keeper == NULL)
        return err;
    XLA_FFI_TypeId id;
    err = keeper_type_id(frame->api, &id);
    if (err != NULL)
        return err;
    XLA_FFI_State_Set_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_State_Set_Args_STRUCT_SIZE;
    args.ctx = frame->ctx;
    args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    args.type_id = &id;
    args.state = c.keeper;
    atomic_fetch_add(&c.keeper->refs, 1);
    err = frame->api->XLA_FFI_State_Set(&args);
    if (err != NULL)
        symred_xla_keeper_release(c.keeper);
    return err;
}

static int64_t elements(const XLA_FFI_Buffer *b)
{
    int64_t n = 1;
    for (int64_t d = 0; d < b->rank; d++)
        n *= b->dims[d];
    return n;
}

static int is_index_type(XLA_FFI_DataType t)
{
    return t == XLA_FFI_DataType_S64 || t == XLA_FFI_DataType_S32;
}

/* Decodes everything but the run itself; c->args is allocated here (freed by the caller). */
static XLA_FFI_Error *decode(XLA_FFI_CallFrame *frame, call *c)
{
    memset(c, 0, sizeof *c);
    XLA_FFI_Error *err = decode_attrs(frame, c);
    if (err != NULL)
        return err;
    const XLA_FFI_Api *api = frame->api;
    int nargs = sr_kernel_nargs(c->kernel);
    if (frame->args.size != nargs)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: the kernel takes %d arrays, the call passes %lld", nargs,
                    (long long)frame->args.size);
    if (frame->rets.size < 1 || frame->rets.size > 2)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: a call has one or two results, not %lld", (long long)frame->rets.size);
    for (int64_t i = 0; i < frame->args.size; i++)
        if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER ||
            ((XLA_FFI_Buffer *)frame->args.args[i])->dtype != c->dtype)
            return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "symred: argument %lld is not a buffer of the kernel's dtype",
                        (long long)i);
    XLA_FFI_Buffer *r0 = frame->rets.rets[0];
    if (frame->rets.size == 2) {
        c->values = r0;
        c->indices = frame->rets.rets[1];
    } else if (is_index_type(r0->dtype)) {
        c->indices = r0;
    } else {
        c->values = r0;
    }
    int64_t want = c->nout * sr_kernel_out_dim(c->kernel);
    if (c->values != NULL && (c->values->dtype != c->dtype || elements(c->values) != want))
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: the values result must hold %lld values of the kernel's dtype",
                    (long long)want);
    if (c->indices != NULL && (!is_index_type(c->indices->dtype) || elements(c->indices) != want))
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "symred: the indices result must hold %lld integers", (long long)want);
    c->args = calloc((size_t)(nargs > 0 ? nargs : 1), sizeof *c->args);
    if (c->args == NULL)
        return fail(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "symred: out of memory");
    for (int v = 0; v < nargs; v++)
        c->args[v] = ((XLA_FFI_Buffer *)frame->args.args[v])->data;
    return NULL;
}

/* sr_ranges over the attribute arrays (the counts are the arrays' lengths over 2 or 1). */
static sr_ranges ranges_of(const call *c)
{
    const XLA_FFI_Array *const *r = c->ranges;
    sr_ranges rg = {
        .nranges_i = (int64_t)r[0]->size / 2,
        .ranges_i = r[0]->data,
        .slices_i = r[1]->data,
        .nredranges_j = (int64_t)r[2]->size / 2,
        .redranges_j = r[2]->data,
        .nranges_j = (int64_t)r[3]->size / 2,
        .ranges_j = r[3]->data,
        .slices_j = r[4]->data,
        .nredranges_i = (int64_t)r[5]->size / 2,
        .redranges_i = r[5]->data,
    };
    return rg;
}

static XLA_FFI_Error *symred_failure(const XLA_FFI_Api *api, const call *c, sr_status st)
{
    const char *msg = sr_ctx_error(c->ctx);
    if (msg == NULL || msg[0] == '\0')
        msg = sr_status_str(st);
    XLA_FFI_Error_Code code =
        st == SR_EINVAL || st == SR_EDIM || st == SR_EPARSE ? XLA_FFI_Error_Code_INVALID_ARGUMENT
        : st == SR_ENOMEM || st == SR_EBUDGET               ? XLA_FFI_Error_Code_RESOURCE_EXHAUSTED
                                                            : XLA_FFI_Error_Code_INTERNAL;
    return fail(api, code, "symred: %s (%s)", msg, sr_status_str(st));
}

XLA_FFI_Error *symred_xla_cpu(XLA_FFI_CallFrame *frame)
{
    if (is_metadata_query(frame))
        return answer_metadata(frame);
    if (frame->stage == XLA_FFI_ExecutionStage_INSTANTIATE)
        return instantiate(frame);
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    call c;
    XLA_FFI_Error *err = decode(frame, &c);
    if (err != NULL) {
        free(c.args);
        return err;
    }
    /* Indices into an int32 result go through an int64 scratch array. */
    int64_t *idx = NULL, *scratch = NULL;
    if (c.indices != NULL) {
        if (c.indices->dtype == XLA_FFI_DataType_S64) {
            idx = c.indices->data;
        } else {
            size_t n = (size_t)elements(c.indices);
            idx = scratch = malloc((n > 0 ? n : 1) * sizeof *scratch);
            if (scratch == NULL) {
                free(c.args);
                return fail(frame->api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                            "symred: out of memory");
            }
        }
    }
    sr_run_desc run = {
        .nx = c.nx,
        .ny = c.ny,
        .nargs = (int)frame->args.size,
        .args = c.args,
        .out = c.values != NULL ? c.values->data : NULL,
        .out_idx = idx,
    };
    sr_status st;
    if (c.ranges[0] != NULL) {
        sr_ranges rg = ranges_of(&c);
        st = sr_kernel_run_ranges(c.kernel, &run, &rg);
    } else {
        st = sr_kernel_run_ex(c.kernel, &run);
    }
    if (st == SR_OK && scratch != NULL) {
        int32_t *dst = c.indices->data;
        for (int64_t i = 0; i < elements(c.indices); i++)
            dst[i] = (int32_t)scratch[i];
    }
    free(scratch);
    free(c.args);
    return st == SR_OK ? NULL : symred_failure(frame->api, &c, st);
}

/* ---- CUDA ------------------------------------------------------------------------------- */

/* cuStreamSynchronize from the driver library that libsymred also dlopens ($SYMRED_LIBCUDA,
 * else libcuda.so.1): loaded once per process, so the handler library itself needs no CUDA to
 * build or load. */
typedef int (*stream_sync_fn)(void *stream);
static stream_sync_fn stream_sync;
static pthread_once_t stream_sync_once = PTHREAD_ONCE_INIT;

static void load_stream_sync(void)
{
    const char *name = getenv("SYMRED_LIBCUDA"); /* as libsymred's own loader */
    void *h =
        dlopen(name != NULL && name[0] != '\0' ? name : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h != NULL)
        *(void **)&stream_sync = dlsym(h, "cuStreamSynchronize");
}

/* The CUDA handler: XLA's buffers are device pointers, used in place by sr_kernel_run_device.
 * symred launches on its own stream of the primary context and synchronises the context before
 * returning, so the handler first waits for XLA's stream (the inputs are written) and the
 * results are complete when it returns. Ranges and int32 indices are not supported here. */
XLA_FFI_Error *symred_xla_cuda(XLA_FFI_CallFrame *frame)
{
    if (is_metadata_query(frame))
        return answer_metadata(frame);
    if (frame->stage == XLA_FFI_ExecutionStage_INSTANTIATE)
        return instantiate(frame);
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    const XLA_FFI_Api *api = frame->api;
    call c;
    XLA_FFI_Error *err = decode(frame, &c);
    if (err == NULL && c.ranges[0] != NULL)
        err = fail(api, XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "symred: block-sparse ranges (and so vmap) are not supported on the GPU by "
                   "symred.jax");
    if (err == NULL && c.indices != NULL && c.indices->dtype != XLA_FFI_DataType_S64)
        err = fail(api, XLA_FFI_Error_Code_UNIMPLEMENTED,
                   "symred: indices on the GPU need int64 (jax_enable_x64)");
    XLA_FFI_Stream_Get_Args sargs;
    memset(&sargs, 0, sizeof sargs);
    sargs.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    sargs.ctx = frame->ctx;
    if (err == NULL)
        err = api->XLA_FFI_Stream_Get(&sargs);
    pthread_once(&stream_sync_once, load_stream_sync);
    if (err == NULL && stream_sync == NULL)
        err = fail(api, XLA_FFI_Error_Code_UNAVAILABLE,
                   "symred: cuStreamSynchronize not found (no CUDA driver library: libcuda.so.1 "
                   "or $SYMRED_LIBCUDA)");
    if (err == NULL && stream_sync(sargs.stream) != 0)
        err = fail(api, XLA_FFI_Error_Code_INTERNAL,
                   "symred: cuStreamSynchronize on XLA's stream failed");
    if (err != NULL) {
        free(c.args);
        return err;
    }
    int nargs = (int)frame->args.size;
    if (nargs > 64) {
        free(c.args);
        return fail(api, XLA_FFI_Error_Code_UNIMPLEMENTED,
                    "symred: more than 64 arrays on the GPU (%d)", nargs);
    }
    uint64_t device_args = 0;
    for (int v = 0; v < nargs && v < 64; v++)
        device_args |= (uint64_t)1 << v;
    sr_run_desc run = {
        .nx = c.nx,
        .ny = c.ny,
        .nargs = nargs,
        .args = c.args,
        .out = c.values != NULL ? c.values->data : NULL,
        .out_idx = c.indices != NULL ? c.indices->data : NULL,
    };
    sr_status st = sr_kernel_run_device(c.kernel, &run, device_args, 1);
    free(c.args);
    return st == SR_OK ? NULL : symred_failure(api, &c, st);
}
