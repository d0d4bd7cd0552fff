/*
 * cuda.h — the GPU path of the JIT: NVRTC and CUDA driver loaders, the CUDA emitter and the
 * CUDA backend's runtime.
 *
 * Neither libnvrtc nor libcuda is linked: both are dlopen()ed on first use, process-wide, behind
 * pthread_once, and only the entry points below are resolved. A library that cannot be found,
 * or a driver whose cuInit fails (no device, the toolkit's stub libcuda), gives SR_ENODEV with
 * a message that says which files were tried and what failed.
 *
 * The types mirror the public CUDA headers (cuda.h, nvrtc.h) so that this file builds where no
 * CUDA is installed; only the values used here are named.
 */
#ifndef SYMRED_JIT_CUDA_H
#define SYMRED_JIT_CUDA_H

#include "jit.h"

#include <stddef.h>
#include <stdint.h>

/* ---- NVRTC (nvrtc.c) ---------------------------------------------------------------------- */

typedef struct nvrtc_prog_ *nvrtc_prog;

struct nvrtc_api {
    int (*version)(int *major, int *minor);
    int (*create)(nvrtc_prog *prog, const char *src, const char *name, int nheaders,
                  const char *const *headers, const char *const *include_names);
    int (*destroy)(nvrtc_prog *prog);
    int (*compile)(nvrtc_prog prog, int nopts, const char *const *opts);
    int (*ptx_size)(nvrtc_prog prog, size_t *size);
    int (*ptx)(nvrtc_prog prog, char *ptx);
    int (*cubin_size)(nvrtc_prog prog, size_t *size); /* NULL before NVRTC 11.1 */
    int (*cubin)(nvrtc_prog prog, char *cubin);
    int (*log_size)(nvrtc_prog prog, size_t *size);
    int (*log)(nvrtc_prog prog, char *log);
    const char *(*error_string)(int result);
    int major, minor;
    char path[512]; /* the library that was loaded */
};

/* The NVRTC entry points, loaded once per process. SR_ENODEV with the reason (the names tried
 * and dlerror's text) in why when libnvrtc cannot be loaded. Thread-safe. */
sr_status jit_nvrtc_get(const struct nvrtc_api **out, const char **why);

/* What jit_nvrtc_compile produces. */
struct nvrtc_out {
    char *image; /* PTX (NUL-terminated) or cubin, malloc()ed */
    size_t size; /* bytes of image (PTX: including the NUL) */
    bool cubin;  /* image is a cubin, else PTX */
    char *log;   /* the compiler's log, malloc()ed, may be NULL */
    double compile_ms;
};

/* Compiles CUDA C++ source for arch ("compute_80": PTX; "sm_80": cubin, falling back to PTX of
 * the same compute capability when this NVRTC cannot make cubin for it). SR_ECOMPILE with the
 * log in out->log on a compile error, SR_ENODEV without NVRTC, SR_ENOMEM. The caller frees
 * out->image and out->log (also on failure). Thread-safe. */
sr_status jit_nvrtc_compile(const char *src, const char *name, const char *arch, bool fast_math,
                            struct nvrtc_out *out);

/* ---- CUDA driver (cuda-driver.c) ---------------------------------------------------------- */

typedef int cu_result;
typedef int cu_device;
typedef struct cu_ctx_ *cu_context;
typedef struct cu_mod_ *cu_module;
typedef struct cu_func_ *cu_function;
typedef struct cu_stream_ *cu_stream;
typedef unsigned long long cu_deviceptr;

#define CU_SUCCESS                       0
#define CU_ERROR_OUT_OF_MEMORY           2
#define CU_ERROR_NO_DEVICE               100
#define CU_ERROR_INVALID_PTX             218
#define CU_ERROR_STUB_LIBRARY            34
#define CU_ATTR_MAX_THREADS_PER_BLOCK    1
#define CU_ATTR_MAX_SHARED_PER_BLOCK     8
#define CU_ATTR_MULTIPROCESSOR_COUNT     16
#define CU_ATTR_CC_MAJOR                 75
#define CU_ATTR_CC_MINOR                 76
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_RANGE_START 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE  12
#define CU_MEMORYTYPE_DEVICE             2

struct cuda_api {
    cu_result (*init)(unsigned flags);
    cu_result (*driver_version)(int *v);
    cu_result (*device_count)(int *n);
    cu_result (*device_get)(cu_device *d, int ordinal);
    cu_result (*device_attr)(int *v, int attr, cu_device d);
    cu_result (*device_name)(char *name, int len, cu_device d);
    cu_result (*primary_retain)(cu_context *c, cu_device d);
    cu_result (*ctx_set_current)(cu_context c);
    cu_result (*module_load_data)(cu_module *m, const void *image);
    cu_result (*module_unload)(cu_module m);
    cu_result (*module_get_function)(cu_function *f, cu_module m, const char *name);
    cu_result (*mem_alloc)(cu_deviceptr *p, size_t bytes);
    cu_result (*mem_free)(cu_deviceptr p);
    cu_result (*memcpy_htod)(cu_deviceptr dst, const void *src, size_t bytes);
    cu_result (*memcpy_dtoh)(void *dst, cu_deviceptr src, size_t bytes);
    cu_result (*launch)(cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, cu_stream s, void **params,
                        void **extra);
    cu_result (*ctx_synchronize)(void);
    cu_result (*error_string)(cu_result r, const char **s);
    cu_result (*pointer_attr)(void *data, int attr, cu_deviceptr p); /* may be NULL */
    cu_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
};

/* The device the CUDA backend uses: device 0 (or $SYMRED_CUDA_DEVICE), its primary context. */
struct cuda_device {
    const struct cuda_api *api;
    cu_device dev;
    cu_context ctx;
    int cc_major, cc_minor, sm_count, max_shared;
    char name[256];
    char lib[512];
};

/* Loads libcuda, runs cuInit, picks the device and retains its primary context, once per
 * process. SR_ENODEV with the reason in why (the library names tried, or the failing call and
 * the driver's error string) when there is no usable GPU. Thread-safe. */
sr_status jit_cuda_device(const struct cuda_device **out, const char **why);

/* True for the driver errors after which the context is unusable for every later call
 * (illegal address, launch failure, misaligned address, illegal instruction, ...). */
bool jit_cuda_sticky(cu_result r);

/* Records that a sticky error (r, in call what) has lost the device's context: the CUDA
 * documentation says the process must be restarted, and on the H100 driver 580 a reset of the
 * primary context did not bring it back (cuDevicePrimaryCtxRetain kept returning error 700).
 * Later runs fail at once with jit_cuda_lost's message instead of a confusing driver error.
 * Thread-safe; the first error is kept. */
void jit_cuda_mark_lost(cu_result r, const char *what);
/* True (and the first sticky error's text in why) once the context has been lost. */
bool jit_cuda_lost(char *why, size_t cap);

/* The driver's text for r ("out of memory"), never NULL. */
const char *jit_cuda_error(cu_result r);

/* One entry point of a dlopen'ed library: where to store it, its name, whether it may lack. */
struct jit_sym {
    void **slot;
    const char *name;
    bool optional;
};
/* Resolves syms[0..n) in h (optional ones missing are left NULL). Returns NULL when every
 * required symbol was found, else the name of the first missing one. */
const char *jit_resolve(void *h, const struct jit_sym *syms, size_t n);

/* ---- CUDA emitter (emit-cuda.c) ----------------------------------------------------------- */

/* What emit-cuda decided, for launch and explain. */
struct cuda_plan {
    int block;        /* threads per block: one output row each */
    int tile;         /* reduced indices per shared-memory tile */
    int columns;      /* scalars per reduced index kept in the tile */
    int shared_bytes; /* static shared memory of the main kernel */
    int state_bytes;  /* sizeof(sr_state) on the device: one row's partial result */
    int pair_nodes, hoisted_outer, hoisted_inner;
};

/* Entry points of the generated module. */
#define CUDA_KERNEL_MAIN    "sr_cuda_main"
#define CUDA_KERNEL_COMBINE "sr_cuda_combine"

/* Emits the CUDA C++ source of kernel k (accumulation acc) into b. SR_ENOTSUP when the formula
 * does not fit the direct strategy (too large, or its tile exceeds shared memory), SR_ENOMEM.
 * The module exports, with T the dtype and S the opaque row state:
 *   extern "C" __global__ void sr_cuda_main(sr_args a, long long no, long long nr,
 *                                           long long chunk, T *out, long long *out_idx, S *part)
 *     grid (ceil(no / block), nsplit): block y folds reduced indices [y*chunk, min(nr,
 *     (y+1)*chunk)); with part == NULL it writes the outputs, else its row states at
 *     part[y * no + o].
 *   extern "C" __global__ void sr_cuda_combine(const S *part, long long no, int nsplit, T *out,
 *                                              long long *out_idx)
 *     merges the nsplit states of each row in index order and writes the outputs.
 * sr_args is a struct of nargs + 1 device pointers, passed by value. */
sr_status jit_emit_cuda(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                        struct cuda_plan *plan);

/* ---- the fused two-product strategy (emit-cuda-fused.c) ----------------------------------- */

/* The CUDA backend's candidate plans (struct sr_plan, in its order of preference). */
enum { CUDA_PLAN_FUSED, CUDA_PLAN_DIRECT, CUDA_PLAN_COUNT };

/* What the fused emitter decided, for launch and explain. */
struct cuda_fused {
    int bvar;         /* the argument index of B (SumSoftMaxWeight: of the weight); -1: a formula */
    int avar;         /* the argument index of A (struct cuda_form), or -1 */
    bool cfactor;     /* C multiplies the sums (struct cuda_form) */
    int R;            /* its width: values per output row */
    int block;        /* threads per block */
    int ti, tj, rc;   /* output rows per block, reduced indices per tile, columns per block */
    int columns;      /* scalars per reduced index of F's inner nodes kept in the tile */
    int shared_bytes; /* static shared memory of the fused kernel */
    int pair_nodes;
    /* F's inner product (u | w) computed as a tile product: its width (0: none) and the
     * argument indices of u (output side) and w (reduced side) */
    int dot, uvar, wvar;
};

#define CUDA_KERNEL_FUSED         "sr_cuda_fused"
#define CUDA_KERNEL_FUSED_COMBINE "sr_cuda_fused_combine"

/* A kernel of the fused form: out_o = C_o (bsign sum_r F(o, r) B_r + asign A_o sum_r F(o, r)),
 * componentwise, with F scalar, B of the reduced side (a variable or a formula), A an
 * output-side variable of B's width or none, C a formula of the output side or none (1). */
struct cuda_form {
    const sr_expr *f;  /* the scalar F (built in the kernel's context) */
    int bvar;          /* the argument index of B (SumSoftMaxWeight: of the weight); -1: bf */
    const sr_expr *bf; /* B as a formula of the reduced side's variables and parameters */
    int avar;          /* the argument index of A, or -1 */
    int asign, bsign;  /* 0 when there is no A */
    const sr_expr *cf; /* C, a formula of the output side's variables and parameters, or NULL */
};

/* Whether k is of the fused form: a Sum of a product of scalar factors, negations, and vector
 * factors of dimension dim(F): one or more of the reduced side only (B, their product: a
 * variable or a formula such as b_j * c_j), and any of the output side only (C: the gradient
 * with respect to a variable inside B's formula); or one vector factor A - B, B - A, A + B with
 * A an output-side and B a reduced-side variable (the gradient of a radial kernel: x_i - y_j);
 * or SumSoftMaxWeight of a scalar F with a weight of the reduced side only (a variable or a
 * formula); sets m. */
bool cuda_fused_form(const struct sr_kernel *k, struct cuda_form *m);

/* Fills out[0 .. CUDA_PLAN_COUNT) with the fused and the direct plans of k (accumulation acc,
 * an enum jit_acc); nothing is compiled. The fused plan is feasible for the forms above with B
 * at least 16 wide, or of any width when F holds an inner product of an output-side and a
 * reduced-side variable at least 16 wide (computed as a tile product), and not for Kahan
 * summation. Returns CUDA_PLAN_COUNT. */
int cuda_plans(const struct sr_kernel *k, int acc, struct sr_plan *out);

/* Emits the module of the fused kernel of k, with A the accumulator type:
 *   extern "C" __global__ void sr_cuda_fused(sr_args a, long long no, long long nr,
 *                                            long long chunk, T *out, A *part,
 *                                            const long long *lb, const long long *iv)
 *     grid (ceil(no / ti), ceil(R / rc), nsplit), block threads: block z reduces over
 *     [z chunk, min(nr, (z + 1) chunk)); with part NULL it writes the outputs of [0, no), else
 *     its records of R + 2 values (the unnormalised row; SumSoftMaxWeight's maximum and sum)
 *     at part[(z no + o) (R + 2)]. With block-sparse ranges (lb non-NULL, nsplit 1) grid
 *     (launch blocks, ceil(R / rc)) as the direct kernel's, each of at most ti rows.
 *   extern "C" __global__ void sr_cuda_fused_combine(const A *part, long long no, int nsplit,
 *                                                    T *out, long long *out_idx)
 *     one thread per row: merges the nsplit records in order and writes the outputs.
 * plan gets block = ti (rows per block), tile = tj and state_bytes = one record's bytes.
 * SR_ENOTSUP when k is not of the fused form, for Kahan summation, or when the tiles
 * exceed shared memory; SR_ENOMEM. */
sr_status jit_emit_cuda_fused(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                              struct cuda_plan *plan, struct cuda_fused *fp);

/* The prelude of every generated module (types sr_t and sr_acc, constants, helpers). */
void jit_cuda_prelude(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b);

/* The start of a kernel body: the argument arrays a<v>, and the block's rows [first, sr_oe) and
 * intervals [sr_q0, sr_q1): dense, rows [x rows, x rows + rows) of [0, no) (clipped by the
 * caller) and one interval, the kernel's chunk; with block-sparse ranges (sr_lb non-NULL),
 * rows [sr_lb[4x], sr_lb[4x + 1]) of one range block and the intervals sr_iv[2q .. 2q + 1] for
 * q in [sr_lb[4x + 2], sr_lb[4x + 3]). */
void jit_cuda_emit_block(const struct sr_kernel *k, struct expr_buf *b, const char *rows,
                         const char *first);

/* The CUDA spellings of the ops that differ from C's (OP_COUNT entries, NULL = C's). */
const char *const *jit_cuda_spell(void);

/* ---- runtime (cuda-runtime.c) ------------------------------------------------------------- */

/* True when a usable GPU is present (loads the driver once per process). */
bool jit_cuda_available(void);

/* Bytes the runs of kernel k have copied host to device and device to host so far (0 for a
 * kernel of another backend). Thread-safe. */
void cuda_kernel_copies(const struct sr_kernel *k, uint64_t *htod, uint64_t *dtoh);

/* Where a kernel's image came from, for explain and tests. */
struct cuda_image_info {
    const char *origin; /* "disk" or "compiled" */
    char cache[256];    /* "hit", "miss (stored)", or why the disk cache was not used */
    char path[2400];    /* the cache entry, "" if none */
    char key[33];
    char arch[16];
    bool cubin;
    size_t bytes;
    double compile_ms;
};

/* The compiled image of CUDA source src for arch ("sm_90", or "compute_90" for PTX): from the
 * disk cache (SYMRED_CACHE_DIR rules, <key>.cuda) or compiled by NVRTC and stored. The caller
 * frees out->image and out->log. SR_ENODEV without NVRTC, SR_ECOMPILE with NVRTC's log in the
 * message. */
sr_status jit_cuda_image(sr_ctx *ctx, const char *src, const char *arch, struct nvrtc_out *out,
                         struct cuda_image_info *info);

#endif /* SYMRED_JIT_CUDA_H */
