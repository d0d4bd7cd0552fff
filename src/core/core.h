/*
 * core.h — the context, kernels, errors and the backend interface.
 *
 * Every other module includes this header. A backend (the reference interpreter, later the
 * CPU JIT and CUDA) plugs in through struct sr_backend_i; the public entry points in kernel.c
 * validate every argument once, handle empty sizes, and only then call the backend, so
 * backends may assume sane input.
 */
#ifndef SYMRED_CORE_H
#define SYMRED_CORE_H

#include "symred.h"
#include "../expr/expr.h"

#include <pthread.h>
#include <stdbool.h>

#define SR_ERR_MAX 2048

struct sr_ctx {
    struct expr_store store;
    /* The last failure. Kernels may run (and fail) from several threads: the lock guards the
     * message, and sr_ctx_error() hands out a thread-local copy. */
    pthread_mutex_t err_lock;
    char err[SR_ERR_MAX];
    /* Set by a failed builder, consumed by sr_kernel_new(NULL) so it can report the first
     * failure of a builder chain. */
    sr_status pending;
    int log_level; /* SYMRED_LOG */
    /* A malformed SYMRED_* variable seen by sr_ctx_new: every sr_kernel_new of the context
     * fails with it, naming the variable, rather than silently using a default. */
    sr_status env_status;
    char env_msg[256];
    /* The memory budget for kernel workspaces, in bytes (SYMRED_MEM_LIMIT or
     * sr_ctx_set_mem_limit); 0 = unlimited. See src/core/budget.c. */
    int64_t mem_limit;
    int num_threads;     /* SYMRED_NUM_THREADS; 0 = as many as OpenMP offers */
    struct jit_ctx *jit; /* CPU JIT options and loaded modules (src/jit), created on use */
};

/* Records status and a printf-style message in ctx; returns status. ctx may be NULL. */
sr_status sr__error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same, also marking it as a builder failure (see sr_ctx.pending). */
sr_status sr__builder_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Environment options. Unset or empty gives dflt; a malformed value records an SR_EINVAL
 * naming the variable, the value and what was expected, and returns it (then *out = dflt). */
sr_status sr__env_int(sr_ctx *ctx, const char *name, long lo, long hi, long dflt, long *out);
sr_status sr__env_choice(sr_ctx *ctx, const char *name, const char *const *choices, int n, int dflt,
                         int *out);
/* Parses a byte count: digits with an optional unit B, KB, MB, GB, TB (powers of 1000) or KiB,
 * MiB, GiB, TiB (powers of 1024), case-insensitive, spaces allowed before the unit. SR_EINVAL on
 * anything else (nothing recorded), SR_EOVERFLOW past INT64_MAX. (budget.c) */
sr_status sr__parse_bytes(const char *s, int64_t *out);
/* How many threads a kernel of ctx runs: OpenMP's maximum, capped by SYMRED_NUM_THREADS and by
 * the memory budget when each thread needs per_thread bytes of workspace; at least 1. */
int sr__threads(const sr_ctx *ctx, int64_t per_thread);
/* Reads SYMRED_MEM_LIMIT into ctx->mem_limit at context creation; a malformed value is recorded
 * like the other SYMRED_* errors (ctx->env_status). */
void sr__mem_limit_init(sr_ctx *ctx);
/* Fails with SR_EBUDGET (and the bytes needed) when kernel k's workspace exceeds the budget;
 * kernel.c calls it after the backend's prepare. */
sr_status sr__budget_check(struct sr_kernel *k);
/* The reference interpreter's working set for kernel k, in bytes (one thread). */
int64_t sr__reference_workspace(const struct sr_kernel *k);
/* Appends the budget and the kernel's workspace to its explain text. */
void sr__budget_explain(const struct sr_kernel *k, struct expr_buf *b);
/* Copies the current message of ctx (for callers that re-report it with context). */
void sr__error_get(sr_ctx *ctx, char *buf, size_t cap);

/* What each reduction needs and produces. Indexed by sr_reduction. */
struct sr_reduction_info {
    const char *name;
    bool values;   /* writes values of the dtype */
    bool indices;  /* writes int64 indices */
    bool uses_k;   /* KMin, ArgKMin, KMin_ArgKMin */
    bool scalar_f; /* F must have dimension 1 (SumSoftMaxWeight) */
    bool weight;   /* needs desc.weight */
};
extern const struct sr_reduction_info sr_reductions[SR_REDUCTION_COUNT];

struct sr_kernel;

/*
 * A backend. Members other than name and run may be NULL.
 *   prepare — build backend state for a new kernel (compile, plan); may fail, with a message
 *   run     — compute; the arguments have been validated, nx > 0 and ny > 0
 *   release — free what prepare made
 *   explain — append backend-specific plan text to the explain buffer
 */
struct sr_backend_i {
    const char *name;
    sr_status (*prepare)(struct sr_kernel *k);
    sr_status (*run)(const struct sr_kernel *k, const sr_run_desc *run);
    void (*release)(struct sr_kernel *k);
    void (*explain)(const struct sr_kernel *k, struct expr_buf *b);
};

/* The cost model's estimate for a kernel (src/formulas/cost.c), in flop-equivalents. */
struct sr_cost {
    double flops_pair; /* per (i, j) pair */
    double flops_row;  /* per output row: hoisted terms of the output index */
    double flops_col;  /* per reduced row: hoisted terms of the reduced index */
    double flops_call; /* once per call: parameter-only terms */
    double bytes_pair; /* bytes of reduced-index operands read per pair */
};

/*
 * What the simplifier (src/formulas) did for a kernel. sr_kernel.f and .weight are the
 * simplified formulas the backends run; f_user and weight_user are what the user passed (the
 * variables and argument count come from those). Backends may use the factoring and the
 * hoisted terms to save work, and stay correct if they ignore them.
 */
struct sr_simp_info {
    bool enabled; /* SYMRED_SIMPLIFY is not 0 */
    const sr_expr *f_user, *weight_user;
    /* The reduction rewrite (src/formulas/simplify.c), all NULL when there is none: the
     * reduction of F equals post evaluated once per output row, where post reads the output
     * index's variables, the parameters and R = the reduction of inner (a variable of the
     * output index at argument position nargs, dimension k * dim(inner)). outer is the part
     * that moved out (factors for Sum/Min/Max/KMin, added terms for the shifts). Backends other
     * than the reference run it through simp_post_backend, which kernel.c installs. */
    const sr_expr *outer, *inner, *post;
    const char *post_rule;
    /* Maximal non-trivial subexpressions of f and weight that do not depend on the pair: each
     * depends on i only, j only, or parameters only (see its deps), and may be computed once
     * per row, column or call instead of once per pair. */
    const sr_expr **hoisted;
    int nhoisted;
    struct sr_cost cost, cost_user; /* as run (hoisting included), and as given */
    char *log;                      /* the passes and the rules that fired, for explain */
};

struct sr_kernel {
    sr_ctx *ctx;
    const sr_expr *f;
    const sr_expr *weight; /* SumSoftMaxWeight only */
    sr_reduction red;
    int axis;
    int k; /* 1 for the non-K reductions */
    sr_dtype dtype;
    sr_device device;
    sr_acc acc;  /* the desc's choice; SR_ACC_DEFAULT leaves it to SYMRED_ACC */
    int fdim;    /* dim(F) */
    int out_dim; /* values per output row */
    int nargs;
    struct expr_var *vars; /* [nargs]; dim 0 = unused index */
    const struct sr_backend_i *backend;
    void *backend_data;
    char *explain;
    struct sr_simp_info simp;
};

/*
 * The dimension from which inner products go through BLIS tiles (src/cpu/gemm.c).
 * The crossover, measured on this machine (2-core AMD EPYC with AVX-512, Debian BLIS 0.9.0
 * picking zen3, 2 threads, other jobs running: load average 2-3) with bench/bench-gemm, which
 * runs the same kernel with SYMRED_BLIS=off and =on: a Gaussian mat-vec written with the inner
 * product, Exp(-(SqNorm2(x)+SqNorm2(y)-2(x|y))*g)*b, float32, N = M = sqrt(F / 2D), best of 3.
 * Direct / gemm time ratio, F = 2e10 (bench/README.md has the times):
 *     D = 8: 0.49   16: 0.80   24: 1.45   32: 2.58   64: 4.57   256: 4.52   1024: 4.98
 * Two earlier runs under heavier load gave 1.05 / 2.58 and 0.54 / 1.07 at D = 16 / 24: the
 * crossover is between 16 and 24 in every run, so gemm-epilogue is chosen from D = 24 on, and the
 * simplifier rewrites SqDist into norms and an inner product (the form that path needs) from the
 * same D. (kNN, ArgKMin k = 10 of SqDist at D = 100, 10000 x 100000: direct 104.7 s, gemm 3.4 s.)
 * Re-measured with symred's AVX-512 gemm (issue 14, Zen 5 EPYC, load 2-3): direct / gemm 0.72-1.46
 * at D = 8, 1.30 at 12, 1.55-3.47 at 16, 2.67-3.83 at 24: on AVX-512 CPUs the crossover moved
 * to between 8 and 16. The constant stays 24 (the BLIS crossover, and the simplifier's rewrite
 * threshold, which cannot ask the backend which gemm will run); docs/avx512-gemm.md.
 */
#define SR_GEMM_MIN_DIM 24

static inline size_t sr_dtype_size(sr_dtype t) { return t == SR_F64 ? 8 : 4; }

/* Backends. */
extern const struct sr_backend_i cpu_reference_backend;
extern const struct sr_backend_i cpu_jit_backend; /* falls back to the reference */
extern const struct sr_backend_i cuda_backend;    /* src/jit/cuda-runtime.c: SR_ENODEV w/o GPU */
/* The CUDA backend's run with device-pointer flags (sr_kernel_run_device); validated input,
 * nout > 0, nred >= 0. */
sr_status cuda_run_device(const struct sr_kernel *k, const sr_run_desc *run, uint64_t device_args,
                          int device_out);
/* Unloads the context's JIT modules (ctx.c calls it from sr_ctx_free). */
void cpu_jit_ctx_free(sr_ctx *ctx);

#endif /* SYMRED_CORE_H */
