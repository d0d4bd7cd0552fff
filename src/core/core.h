/*
 * core.h — the context, kernels, errors, the backend interface and the backend registry.
 *
 * The backends (src/cpu, src/jit) include this header; core includes none of theirs
 * (docs/architecture.md). A backend plugs in through struct sr_backend_i and a row of
 * SR_BACKEND_MAP; the public entry points in kernel.c validate every argument once, handle
 * empty sizes, and only then call the backend, so backends may assume sane input.
 */
#ifndef SYMRED_CORE_H
#define SYMRED_CORE_H

#include "symred.h"
#include "../formulas/formulas.h"
#include "reductions.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SR_ERR_MAX EXPR_ERR_MAX

/*
 * The backend registry: X(id, backend, device), one row per backend that a kernel desc's device
 * can pick (registry.c). id gives SR_BACKEND_<id>, the backend's slot for per-context state
 * (sr_ctx.backend_state); backend is its struct sr_backend_i, defined by the backend's own
 * module; device is the sr_device that picks it (SR_DEVICE_AUTO is decided by the planner,
 * plan.c). Core names these objects only here and calls backends only through their members. A
 * backend that another backend's prepare hands a kernel to (the gemm-epilogue, by the JIT) needs
 * no row.
 */
#define SR_BACKEND_MAP(X)                                                                          \
    X(JIT, cpu_jit_backend, SR_DEVICE_CPU)                   /* src/cpu/omp-runtime.c */           \
    X(REFERENCE, cpu_reference_backend, SR_DEVICE_REFERENCE) /* src/cpu/reference.c */             \
    X(CUDA, cuda_backend, SR_DEVICE_CUDA)                    /* src/jit/cuda-runtime.c */

enum sr_backend_id {
#define SR_BACKEND_ID_(id, backend, device) SR_BACKEND_##id,
    SR_BACKEND_MAP(SR_BACKEND_ID_)
#undef SR_BACKEND_ID_
        SR_BACKEND_COUNT
};

/*
 * The options of a context other than the three that struct sr_ctx holds itself (log_level,
 * num_threads, mem_limit): read from the SYMRED_* environment once, by sr_ctx_new, and changed
 * afterwards only by sr_ctx_set_option (options.c). Nothing after sr_ctx_new reads a SYMRED_*
 * variable that a context owns: planning, compiling and running read these fields.
 */
/* SYMRED_JIT: how the CPU JIT meets its compiler. async: a kernel is served by the tile
 * interpreter from its creation and by the compiled code once a background compile has made it;
 * sync: creation waits for the compiled code; off: the tile interpreter serves every call. */
enum sr_jit_mode { SR_JIT_ASYNC, SR_JIT_SYNC, SR_JIT_OFF };

struct sr_options {
    int device;           /* SYMRED_DEVICE: the sr_device of SR_DEVICE_AUTO kernels */
    int jit;              /* SYMRED_JIT: enum sr_jit_mode */
    int simplify;         /* SYMRED_SIMPLIFY: 0 or 1 */
    int acc;              /* SYMRED_ACC: 0 block, 1 kahan, 2 f64 (sr_acc - 1) */
    int jit_keep;         /* SYMRED_JIT_KEEP: 0 or 1 */
    int compile_timeout;  /* SYMRED_COMPILE_TIMEOUT, seconds */
    int jit_idle_modules; /* SYMRED_JIT_IDLE_MODULES: modules no kernel uses kept loaded */
    int gemm;             /* SYMRED_GEMM (or SYMRED_BLIS): 0 auto, 1 on, 2 off */
    const char *gemm_var; /* the name gemm was read from, for messages and explain */
    int gemm_kernel;      /* SYMRED_GEMM_KERNEL: 0 auto, 1 avx512, 2 blis */
    int gemm_refine;      /* SYMRED_GEMM_REFINE: 0 on, 1 off */
    char cc[512];         /* SYMRED_CC, default "cc" */
    /* SYMRED_CACHE_DIR, else $XDG_CACHE_HOME/symred, else $HOME/.cache/symred, as resolved
     * when read; "off" disables the disk cache, "" means there is no cache directory. */
    char cache_dir[2048];
};

struct sr_ctx {
    /* The IR's state: the node store and the error sink (the last failure, which
     * sr_ctx_error() hands out as a thread-local copy, and the pending builder failure). It
     * must stay the first member: the IR finds it by casting the sr_ctx pointer (expr_ctx). */
    struct expr_ctx ir;
    int log_level; /* SYMRED_LOG */
    /* A malformed SYMRED_* variable seen by sr_ctx_new: every sr_kernel_new of the context
     * fails with it, naming the variable, rather than silently using a default, until
     * sr_ctx_set_option sets that variable's option (env_var names it). */
    sr_status env_status;
    const char *env_var;
    char env_msg[256];
    /* The memory budget for kernel workspaces, in bytes (SYMRED_MEM_LIMIT or
     * sr_ctx_set_mem_limit); 0 = unlimited. See src/core/budget.c. */
    int64_t mem_limit;
    int num_threads; /* SYMRED_NUM_THREADS; 0 = as many as OpenMP offers */
    struct sr_options opt;
    /* Each registered backend's per-context state, indexed by enum sr_backend_id: created by
     * the backend on use, freed by its ctx_free in sr_ctx_free. */
    void *backend_state[SR_BACKEND_COUNT];
};
_Static_assert(offsetof(struct sr_ctx, ir) == 0, "expr_ctx() needs the IR state first");

/* Records status and a printf-style message in ctx's error sink (the IR's: core and the
 * backends report to the same sink through these names); returns status. ctx may be NULL.
 * sr__builder_error also marks it as a builder failure (see struct expr_errors, pending). */
#define sr__error         expr_error
#define sr__builder_error expr_builder_error
/* Reads every option of ctx from the environment (options.c; sr_ctx_new calls it once): unset or
 * empty variables give the defaults; the first malformed one is recorded in ctx->env_status. */
void sr__options_read(sr_ctx *ctx);
/* Parses a byte count: digits with an optional unit B, KB, MB, GB, TB (powers of 1000) or KiB,
 * MiB, GiB, TiB (powers of 1024), case-insensitive, spaces allowed before the unit. SR_EINVAL on
 * anything else (nothing recorded), SR_EOVERFLOW past INT64_MAX. (budget.c) */
sr_status sr__parse_bytes(const char *s, int64_t *out);
/* How many threads a kernel of ctx runs: OpenMP's maximum, capped by SYMRED_NUM_THREADS and by
 * the budget in force (the context's now, as sr__call_budget) when each thread needs per_thread
 * bytes of workspace; at least 1, and 1 in a child of fork(). */
int sr__threads(const sr_ctx *ctx, int64_t per_thread);
/* The fork generation: 0 in the process that created the first context, one more in each child
 * of fork() than in its parent (counted once sr_ctx_new has run). State stamped with an older
 * generation was left behind by threads that are not in this process (a background compile's):
 * it must be reset, never waited for. In a child of fork() the CPU work runs on one thread
 * (sr__threads). */
unsigned sr__fork_gen(void);
/* The arrays of a call of k on nx x ny: args given when the kernel takes any, each variable's
 * nx, ny or 1 rows of its dimension within the address space (SR_EOVERFLOW), and no NULL array
 * with rows to read (SR_EINVAL); the message names the argument. Shared by every entry point
 * that takes a kernel's arrays (kernel.c, eval-block.c). */
sr_status sr__check_arrays(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args);
/* The argument index of e when it is a variable of k's reduced side (Vj on axis 1, Vi on axis
 * 0), else -1. */
int sr__reduced_var(const sr_kernel *k, const sr_expr *e);
/* Whether e is A - B, B - A or A + B with A a variable of k's output side and B one of its
 * reduced side, both of e's dimension (the gradient of a radial kernel: x_i - y_j): sets their
 * argument indices and signs (e = asign A + bsign B). */
bool sr__a_and_b(const sr_kernel *k, const sr_expr *e, int *avar, int *asign, int *bvar,
                 int *bsign);
/* Fails with SR_EBUDGET (and the bytes needed) when kernel k's workspace exceeds the budget it
 * was planned under (k->budget); the planner calls it after the backend's prepare. */
sr_status sr__budget_check(struct sr_kernel *k);
/* The budget a call of k runs under: the context's as it is at the call. A budget set after k's
 * creation bounds its later calls (fewer threads, no split of the reduced range, more passes
 * through the GPU, or SR_EBUDGET from a call whose workspace grows with its sizes), while k's
 * plan, its tiles, keeps k->budget. Run-time code reads the budget only through this. */
int64_t sr__call_budget(const struct sr_kernel *k);
/* The reference interpreter's working set for kernel k, in bytes (one thread). */
int64_t sr__reference_workspace(const struct sr_kernel *k);
/* The most workspace one call of k uses, all threads together, with the per-thread part and the
 * thread count (either pointer may be NULL): the backend's workspace member, else the reference
 * interpreter's estimate on one thread. (budget.c) */
int64_t sr__kernel_workspace(const struct sr_kernel *k, int64_t *per_thread, int *threads);
/* Appends the budget and the kernel's workspace to its explain text. */
void sr__budget_explain(const struct sr_kernel *k, struct expr_buf *b);
/* Copies the current message of ctx (for callers that re-report it with context). */
#define sr__error_get expr_error_get

/* What each reduction needs and produces, and how it reduces: SR_REDUCTION_RULES
 * (reductions.h) as a struct. Indexed by sr_reduction. */
struct sr_reduction_info {
    const char *name;
    enum sr_red_family family;
    enum sr_red_order order; /* ascending (Min, K-reductions), descending (Max), or none */
    enum sr_red_empty empty; /* what an empty reduction writes */
    bool values;             /* writes values of the dtype */
    bool indices;            /* writes int64 indices */
    bool uses_k;             /* KMin, ArgKMin, KMin_ArgKMin */
    bool scalar_f;           /* F must have dimension 1 (SumSoftMaxWeight) */
    bool weight;             /* needs desc.weight */
    sr_reduction partial;    /* whose outputs hold a block's whole partial state */
};
extern const struct sr_reduction_info sr_reductions[SR_REDUCTION_COUNT];

struct sr_kernel;

/*
 * Block-sparse ranges after validation (ranges.c), in the kernel's own terms: output rows o
 * and reduced indices r, whatever the axis. Only blocks with at least one row and one reduced
 * index are kept, sorted by first row; the output rows of all blocks, laid end to end, are
 * numbered 0..nrows-1 ("flat rows"), so that a backend can cut the work into equal chunks
 * whatever the block sizes. Each block's intervals are non-empty, sorted, disjoint and
 * coalesced where they touch. Rows outside every block are not the backend's business: the
 * caller writes the identity there after the backend ran (sr__run_ranges).
 */
struct sr_rplan {
    int64_t nblocks;
    int64_t nrows;  /* rows[nblocks] */
    int64_t *blk;   /* [2 nblocks]: block c is output rows [blk[2c], blk[2c + 1]) */
    int64_t *rows;  /* [nblocks + 1]: flat row of each block's first row */
    int64_t *ivoff; /* [nblocks + 1]: block c's intervals are iv[2 ivoff[c] .. 2 ivoff[c + 1]) */
    int64_t *iv;    /* [2 intervals]: reduced indices [iv[2q], iv[2q + 1]) */
    void *mem;      /* what sr__rplan_free frees */
};

/* Checks ranges R for kernel k run as r (the triple of k's axis) and builds the plan; SR_EINVAL
 * with a message naming the array and entry, SR_ENOMEM. r's sizes must have been checked. */
sr_status sr__rplan_new(const struct sr_kernel *k, const sr_run_desc *r, const sr_ranges *R,
                        struct sr_rplan *p);
/* The plan restricted to output rows [o0, o1), renumbered from 0 (the intervals are shared
 * with p, which must outlive the window). SR_ENOMEM. */
sr_status sr__rplan_window(const struct sr_rplan *p, int64_t o0, int64_t o1, struct sr_rplan *out);
void sr__rplan_free(struct sr_rplan *p);
/* The block holding flat row f (0 <= f < nrows). */
int64_t sr__rplan_block(const struct sr_rplan *p, int64_t f);
/* Output rows [*o0, *o1) of block c that lie in flat rows [f0, f1) (possibly empty). */
static inline void sr__rplan_seg(const struct sr_rplan *p, int64_t c, int64_t f0, int64_t f1,
                                 int64_t *o0, int64_t *o1)
{
    int64_t a = f0 > p->rows[c] ? f0 : p->rows[c], b = f1 < p->rows[c + 1] ? f1 : p->rows[c + 1];
    *o0 = p->blk[2 * c] + (a - p->rows[c]);
    *o1 = b > a ? p->blk[2 * c] + (b - p->rows[c]) : *o0;
}
/* Runs kernel k with plan p on its backend (SR_ENOTSUP when the backend has no run_ranges),
 * then writes the identity into the output rows that no block covers. r has been validated. */
sr_status sr__run_ranges(const struct sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p);
/* Writes the empty-reduction identity into output rows [o0, o1) of r. */
void sr__fill_identity(const struct sr_kernel *k, const sr_run_desc *r, int64_t o0, int64_t o1);

/*
 * A backend. Members other than name and run may be NULL.
 *   prepare      — realise plan p of a new kernel (see struct sr_realise): build its state in
 *                  k->backend_data (compile, size tiles under k->budget); may fail, with a
 *                  message, or decline p
 *   run          — compute; the arguments have been validated, nx > 0 and ny > 0
 *   release      — free what prepare made
 *   explain      — append backend-specific plan text to the explain buffer
 *   run_ranges   — compute the block-sparse reduction of plan p (validated, nx > 0 and ny > 0):
 *                  write the output rows of p's blocks only; NULL = ranges not supported
 *   workspace    — the most workspace one run uses, all threads together, with the per-thread
 *                  part and the thread count in *per_thread and *threads (either may be NULL),
 *                  for the memory budget and explain; called only while k->backend_data is set;
 *                  NULL = the reference interpreter's estimate (sr__reference_workspace)
 *   run_device   — run with device-pointer flags (sr_kernel_run_device): validated input,
 *                  nout > 0, nred >= 0; NULL = host arrays only
 *   ctx_free     — free this backend's per-context state (sr_ctx.backend_state[its id], never
 *                  NULL when called) at sr_ctx_free
 *   post_rewrite — a kernel that the simplifier gave a reduction rewrite (k->simp.post) runs as an
 *                  inner kernel on this backend plus the post formula (simp_post_backend); false:
 *                  the backend runs the kernel's formula whole
 */
struct sr_plan;
struct sr_backend_i;
/*
 * One realisation of a kernel's plan (the planner's loop, sr__plan_kernel in plan.c): core
 * chooses a candidate plan p among those of the backend's plans member (NULL when it lists none
 * or none is feasible: the backend's last resort, which states what the budget lacks) and calls
 * prepare(k, p, r). On SR_OK the backend has set r->run, preset to itself, to the interface that
 * runs the kernel (the CPU JIT hands its strategies to the gemm-epilogue's, the fused
 * two-product's and the tile interpreter's); core assigns it to k->backend, the one place that
 * does. SR_ENOTSUP with r->declined set (a static string): p is declined, core rejects it with
 * that reason and realises its next choice. r lives across one kernel's realisations: note is
 * the backend's own (the CPU JIT keeps there why it has no compiled code).
 */
struct sr_realise {
    const struct sr_backend_i *run;
    const char *declined;
    const char *note;
};
enum { SR_STAGE_FINAL, SR_STAGE_PENDING, SR_STAGE_COMPILED, SR_STAGE_FAILED };
/* k's stage (its backend's stage member, SR_STAGE_FINAL without one), and the stage of a kernel
 * composed of two whose stages are a and b (kernel.c). */
int sr__kernel_stage(const struct sr_kernel *k);
int sr__stage_combine(int a, int b);
/* SYMRED_LOG >= 1 says which tier ran a kernel's calls (kernel.c): sr__call_stage(k) before a
 * call of the backend's run or run_ranges (SR_STAGE_FINAL below that level: nothing to say),
 * sr__call_log(k, stage) after it, which prints one line the first time a call of k ran on
 * tier 0 and one the first time a call ran compiled code, naming the strategy (plan_info). Only
 * kernels with a background compile (a stage other than SR_STAGE_FINAL) have lines; a kernel
 * composed of inner kernels leaves them to its inner kernels, whose calls come through here. */
int sr__call_stage(const struct sr_kernel *k);
void sr__call_log(const struct sr_kernel *k, int stage);
struct sr_backend_i {
    const char *name;
    sr_status (*prepare)(struct sr_kernel *k, const struct sr_plan *p, struct sr_realise *r);
    sr_status (*run)(const struct sr_kernel *k, const sr_run_desc *run);
    void (*release)(struct sr_kernel *k);
    void (*explain)(const struct sr_kernel *k, struct expr_buf *b);
    sr_status (*run_ranges)(const struct sr_kernel *k, const sr_run_desc *run,
                            const struct sr_rplan *p);
    int64_t (*workspace)(const struct sr_kernel *k, int64_t *per_thread, int *threads);
    sr_status (*run_device)(const struct sr_kernel *k, const sr_run_desc *run, uint64_t device_args,
                            int device_out);
    void (*ctx_free)(void *state);
    bool post_rewrite;
    /* sr_kernel_vjp: all the wanted gradients in one call, for the kernels that have a fused
     * backward (NULL, or SR_ENOTSUP with the reason: the caller uses sr_kernel_grad); lse may
     * be NULL. run_lse: sr_kernel_run_lse, the forward with its log-normalizer, for the same
     * kernels. p: NULL, or the block-sparse plan of sr_kernel_vjp_ranges / _run_lse_ranges
     * (only the pairs of its blocks). The arguments are checked by core. */
    sr_status (*vjp)(const struct sr_kernel *k, const sr_run_desc *run, const struct sr_rplan *p,
                     const void *gout, const void *out, const void *lse, void *const *grads);
    sr_status (*run_lse)(const struct sr_kernel *k, const sr_run_desc *run,
                         const struct sr_rplan *p, void *lse);
    /* The candidate plans of compiled code for a kernel that has not been prepared (simplified),
     * without side effects; returns their number (0: none, e.g. no compiler). NULL: the backend
     * offers none. The sum split (split.c) compares estimates through it. */
    int (*offer)(const struct sr_kernel *k, struct sr_plan *out);
    /* Where a kernel with a background compile stands: SR_STAGE_PENDING (an interpreter serves
     * the calls while the compile runs), SR_STAGE_COMPILED (compiled code serves them),
     * SR_STAGE_FAILED (the interpreter serves them for good). Its explain text is rebuilt when
     * the stage changes. NULL: the backend has no background compiles (SR_STAGE_FINAL). */
    int (*stage)(const struct sr_kernel *k);
    /* sr_kernel_wait: blocks until the tier is final or timeout_s (>= 0) passes (SR_ETIMEDOUT);
     * NULL: the tier is always final. */
    sr_status (*wait)(const struct sr_kernel *k, double timeout_s);
    /* sr_kernel_plan (plan.c): core fills info's common members (backend = name, the
     * workspace and threads, fallback = k->fallback_why) and the reference interpreter's plan
     * (strategy REFERENCE, device SR_DEVICE_REFERENCE, tier 0, no tiles); this member, called
     * on a prepared kernel, overrides what differs for the backend: strategy, inner (left
     * alone, it becomes strategy), device, tiles, tier, fallback. NULL: the reference's plan. */
    void (*plan_info)(const struct sr_kernel *k, sr_plan_info *info);
    /* The candidates the planner realises a kernel from (struct sr_realise), without side
     * effects: offer's, and also where the backend runs without compiled code (the CPU JIT's
     * tier 0) or offers nothing to compare (CUDA). Returns their number; 0 (NULL member too):
     * prepare is called with p NULL. */
    int (*plans)(const struct sr_kernel *k, struct sr_plan *out);
};

/* The registered backends' interface objects (SR_BACKEND_MAP), by id (registry.c). */
#define SR_BACKEND_DECL_(id, backend, device) extern const struct sr_backend_i backend;
SR_BACKEND_MAP(SR_BACKEND_DECL_)
#undef SR_BACKEND_DECL_
extern const struct sr_backend_i *const sr__backends[SR_BACKEND_COUNT];
/* The backend that device picks (SR_DEVICE_AUTO must have been decided, plan.c). */
const struct sr_backend_i *sr__backend_for(sr_device device);
/* Frees every backend's per-context state of ctx (sr_ctx_free). */
void sr__backends_ctx_free(sr_ctx *ctx);

/*
 * What the simplifier (src/formulas) did for a kernel. sr_kernel.f and .weight are the
 * simplified formulas the backends run; f_user and weight_user are what the user passed (the
 * variables and argument count come from those). Backends may use the factoring and the
 * hoisted terms to save work, and stay correct if they ignore them.
 */
struct sr_simp_info {
    bool enabled; /* the context's SYMRED_SIMPLIFY option is not 0 */
    const sr_expr *f_user, *weight_user;
    /* The reduction rewrite (src/core/simp-kernel.c), all NULL when there is none: the
     * reduction of F equals post evaluated once per output row, where post reads the output
     * index's variables, the parameters and R = the reduction of inner (a variable of the
     * output index at argument position nargs, dimension k * dim(inner)). outer is the part
     * that moved out (factors for Sum/Min/Max/KMin, added terms for the shifts). Backends other
     * than the reference run it through simp_post_backend, which the planner chooses. */
    const sr_expr *outer, *inner, *post;
    const char *post_rule;
    /* Maximal non-trivial subexpressions of f and weight that do not depend on the pair: each
     * depends on i only, j only, or parameters only (see its deps), and may be computed once
     * per row, column or call instead of once per pair. */
    const sr_expr **hoisted;
    int nhoisted;
    struct sr_cost cost, cost_user; /* as run (hoisting included), and as given */
    char *log;                      /* the passes and the rules that fired, for explain */
    /* f and weight with the expansions that serve a gemm (sqdist-gemm, norm2diff-gemm:
     * SqDist as norms and an inner product), NULL when none applies. Not run unless a gemm
     * strategy takes them (sr__simp_take_gemm_form): the expansion cancels where the distance
     * is small beside the norms, which the gemm-epilogue's exact re-ranking repairs. */
    const sr_expr *f_gemm, *weight_gemm;
    char *log_gemm;
    bool gemm_form; /* k->f and k->weight are f_gemm and weight_gemm */
};

/*
 * One candidate plan of a kernel: what a backend offers before anything is compiled or
 * allocated (offering has no side effect on the kernel or the context): its tiles, a lower bound
 * of its workspace checked against the kernel's budget (k->budget), and an estimated time by the
 * backend's cost model. Core chooses among them in one place (sr__plan_choose, plan.c): a plan
 * that an option forces, else the feasible plan of least estimated time; the backend realises
 * the chosen one (struct sr_realise), and explain lists them all with their estimates and why
 * each lost.
 */
struct sr_plan {
    const char *strategy; /* "fused two-product", "gemm-epilogue", "direct", ... */
    int id;               /* the backend's number for the strategy */
    bool feasible;        /* false: why says why it was rejected */
    bool chosen;
    int ti, tj;        /* tile: output rows x reduced indices; 0 = set when realised */
    int64_t workspace; /* bytes per thread known before realising (a lower bound); 0 = not */
    /* The estimated cost per (i, j) pair: flops of generated code, and flops done by the tile
     * product (the gemm micro-kernel, several times faster per flop). */
    double flops, gemm_flops;
    char why[200]; /* why chosen or rejected */
    /* The estimated time per (i, j) pair on one thread, in nanoseconds (the backend's cost
     * model, src/cpu/cost.c for the CPU); 0 = not estimated (ranked by its place in the list). */
    double est_ns;
    bool forced; /* an option asks for this strategy (SYMRED_GEMM=on): chosen before any cost */
};
#define SR_MAX_PLANS 4

struct sr_kernel {
    sr_ctx *ctx;
    const sr_expr *f;
    const sr_expr *weight; /* SumSoftMaxWeight only */
    sr_reduction red;
    int axis;
    int k;          /* 1 for the non-K reductions */
    sr_dtype dtype; /* what the backends compute in: SR_F32 or SR_F64 */
    sr_dtype io;    /* the caller's arrays: dtype, or SR_F16 / SR_BF16 (dtype SR_F32) */
    /* The backend reads and writes the 16-bit io arrays itself (the CPU JIT's direct strategy);
     * otherwise core runs it on float32 copies. Set by the backend's prepare. */
    bool io_native;
    sr_device device; /* the desc's: SR_DEVICE_AUTO stays, the planner decides it */
    /* How the planner decided the device (a static string; explain and sr_plan_info). */
    const char *device_why;
    /* The memory budget the kernel is planned under, in bytes (0 = unlimited): the context's when
     * sr_kernel_new began, read there once; the inner kernels of a composed kernel share it.
     * Offers and realisations fit their tiles to it; calls read sr__call_budget. */
    int64_t budget;
    sr_acc acc;  /* the desc's choice; SR_ACC_DEFAULT leaves it to SYMRED_ACC */
    int fdim;    /* dim(F) */
    int out_dim; /* values per output row */
    int nargs;
    struct expr_var *vars; /* [nargs]; dim 0 = unused index */
    const struct sr_backend_i *backend;
    void *backend_data;
    /* Why the kernel runs on a fallback (the reference interpreter while the JIT was asked
     * for): a static string that explain prints, NULL otherwise. */
    const char *fallback_why;
    /* Why a sum split that the formula admits was not applied (split.c), or empty. */
    char split_why[160];
    /* The split's weighing (split.c; sr_plan_info's split members): the parts' plans found, and
     * F whole's best. */
    struct {
        int parts;
        sr_strategy strategy[2];
        double est[2];
        sr_strategy whole;
        double whole_est;
    } split;
    char *explain;
    struct sr_simp_info simp;
    struct sr_plan plans[SR_MAX_PLANS]; /* the backend's candidates (plan.c) */
    int nplans;
    /* The explain text follows the backend's stage: rebuilt, under explain_lock, the first time
     * sr_kernel_explain sees the stage changed (once at most: pending to compiled or failed); the
     * text it replaced stays valid until the kernel is freed (a caller may still hold it). */
    int explain_stage;
    char *explain_old;
    pthread_mutex_t explain_lock;
    /* sr__call_log: bit t set once a call on tier t has been said. */
    _Atomic int tier_logged;
};

/* ---- planning (plan.c) ---- */

/* Plans and realises a new kernel k (simplified, k->budget set), the one place k->backend is
 * assigned: the device (SR_DEVICE_AUTO decided here, k->device_why), then the composed kernels
 * (a reduction rewrite on a backend that takes it, simp_post_backend; a sum split, split.c),
 * else the backend's candidates chosen, realised and, when a realisation declines, rejected
 * for the next choice (struct sr_realise); then the budget check. On failure nothing is left to
 * release. */
sr_status sr__plan_kernel(sr_kernel *k);
/* Creates a kernel as sr_kernel_new does, planned under budget rather than the context's: the
 * inner kernels of a composed kernel (post.c, split.c) share its budget. (kernel.c) */
sr_status sr__kernel_new(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc, int64_t budget,
                         sr_kernel **out);
/* "auto", "cpu", "cuda", "reference" (kernel.c). */
const char *sr__device_name(sr_device d);

/* Chooses k's plan among k->plans: among the feasible candidates, the forced ones if any, and
 * of those the one of least estimated time (est_ns; the earlier in the list on a tie or where
 * either has no estimate). Marks it chosen and returns it; NULL when none is feasible. */
const struct sr_plan *sr__plan_choose(sr_kernel *k);
/* The plan sr__plan_choose would choose among p[0 .. n), without marking it; NULL when none is
 * feasible. */
const struct sr_plan *sr__plan_best(const struct sr_plan *p, int n);
/* Rejects the chosen plan (its realisation declined, for why) and chooses again. */
const struct sr_plan *sr__plan_reject(sr_kernel *k, const char *why);
/* Appends the candidates, chosen first, with their costs, tiles, workspace and reasons. */
void sr__plan_explain(const sr_kernel *k, struct expr_buf *b);
/* The plan_info of a kernel composed of inner kernels (post.c, split.c): strategy outer, and the
 * pair work's strategy, backend, device, tiles, tier, compile state and fallback (unless info
 * has its own) from inner's sr_kernel_plan. */
void sr__plan_info_composed(const sr_kernel *inner, sr_strategy outer, sr_plan_info *info);
/* The size protocol of sr_plan_info and the structs like it, whose first member is size: copies
 * what fits of r (r_bytes, its size member *r_size) into out, whose size member *out_size the
 * caller set, zeroes the rest of out's bytes, and sets the size out says to the bytes filled. */
void sr__sized_fill(void *out, size_t *out_size, void *r, size_t *r_size, size_t r_bytes);
/* The size protocol at entry point fn: arg (the parameter called name, a struct of type type
 * whose first member is size) is not NULL and its size is at least v1, the bytes of the struct's
 * first version; else SR_EINVAL with a message on ctx. */
sr_status sr__sized_check(sr_ctx *ctx, const char *fn, const char *name, const void *arg, size_t v1,
                          const char *type);
/* The strategy whose name (sr_strategy_name) a candidate bears, or (sr_strategy)-1. */
sr_strategy sr__strategy_of(const char *name);

/* ---- the simplifier's kernel hooks (simp-kernel.c, post.c) ---- */

/* Kernel hooks, called by kernel.c: simp_kernel replaces k->f and k->weight by their simplified
 * forms and fills k->simp; release frees what it allocated; explain appends its text. */
sr_status simp_kernel(sr_kernel *k);
void simp_kernel_release(sr_kernel *k);
void simp_kernel_explain(const sr_kernel *k, struct expr_buf *b);
/* Makes k run f_gemm and weight_gemm (a backend's gemm strategy chose them): k->f and
 * k->weight, the hoisted terms and the cost estimate follow. No-op when there are none. */
void sr__simp_take_gemm_form(sr_kernel *k);
/* The backend of a kernel with a reduction rewrite (k->simp.post; src/core/post.c): an inner kernel
 * on the user's device reduces k->simp.inner, then the post formula gives the output. The planner
 * realises it in place of a backend whose post_rewrite is set. */
extern const struct sr_backend_i simp_post_backend;
/* The most workspace one run of such a kernel uses: the inner and post kernels' workspaces and
 * the chunk of R (for the memory budget, src/core/budget.c; k->backend->run equals
 * simp_post_backend.run for these kernels). */
int64_t simp_post_workspace(const sr_kernel *k);
/* The most bytes of a chunk of reduction results that post.c and split.c hold at once. */
#define SR_POST_CHUNK_BYTES ((int64_t)4 << 20)
/* args[0 .. k->nargs) = r's arrays, those of the output index advanced to output row o0 (a
 * chunk of output rows run as its own reduction; r in the kernel's computing dtype). */
void sr__chunk_args(const sr_kernel *k, const sr_run_desc *r, int64_t o0, const void **args);
/* The sum split of a Sum kernel (simp-kernel.c): Sum F with F = (A + C) P, A the addends of a
 * factor that depend on the output index and C the others, as F1 = A P and F2 = C P, each a
 * product of the factors of P that depend on the output index and of those that do not (with C
 * or A among the latter or the former). false: no such factor, or the parts' dimension is not
 * F's. */
bool simp_split_sum(const sr_kernel *k, const sr_expr **f1, const sr_expr **f2);
/* Realises k as two Sum kernels of simp_split_sum's parts whose outputs add (split.c) when both
 * run the fused two-product strategy on backend be and their estimated times add up to less
 * than k's best plan's: *run becomes the split backend, ready to run (the planner assigns it).
 * Otherwise *run and k are left as they were (SR_OK either way; an error only when out of
 * memory). */
sr_status sr__split_sum(sr_kernel *k, const struct sr_backend_i *be,
                        const struct sr_backend_i **run);
/* A Sum over k's axis in k's computing dtype, on k's device with k's accumulation. */
sr_kernel_desc sr__sum_desc(const sr_kernel *k);
/* The chosen candidate plan of a Sum kernel of f under desc and budget on backend be
 * (be->offer), without preparing it: nothing is compiled. SR_ENOTSUP: no candidate, or be offers
 * none. */
sr_status sr__kernel_offer(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc,
                           int64_t budget, const struct sr_backend_i *be, struct sr_plan *best);

static inline size_t sr_dtype_size(sr_dtype t)
{
    return t == SR_F64 ? 8 : t == SR_F16 || t == SR_BF16 ? 2 : 4;
}

/* ---- element types (dtype.c) ---- */

/* The 16-bit dtypes' conversions: widening is exact, narrowing rounds to nearest even. */
float sr__f16_to_f32(uint16_t h);
uint16_t sr__f32_to_f16(float f);
float sr__bf16_to_f32(uint16_t h);
uint16_t sr__f32_to_bf16(float f);
/* Element i of an array of dtype t, as a double; and the store of v rounded to t. */
double sr__dtype_get(sr_dtype t, const void *a, int64_t i);
void sr__dtype_put(sr_dtype t, void *a, int64_t i, double v);
/* "float32", "float64", "float16", "bfloat16". */
const char *sr__dtype_name(sr_dtype t);
/* n values of the 16-bit dtype t to float32 and back (rounded to nearest even). */
void sr__widen(sr_dtype t, const void *src, float *dst, int64_t n);
void sr__narrow(sr_dtype t, const float *src, void *dst, int64_t n);

/* The float32 copies through which a kernel whose io dtype is 16-bit runs: args are the
 * widened arrays of the call (NULL where the call's is), out room for nout float32 values. */
struct sr_io_copy {
    const void **args;
    float *out;
    void *blob;
};
/* Widens the call's arrays (sizes as sr__check_arrays checked them) into c; SR_ENOMEM or
 * SR_EOVERFLOW with a message. sr__io_free frees c (also after a failure). */
sr_status sr__io_widen(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                       int64_t nout, struct sr_io_copy *c);
void sr__io_free(struct sr_io_copy *c);

/* *out = a * b * c, for a count of elements or bytes that feeds an allocation, a copy or a
 * pointer offset; false, *out untouched, when a factor is negative or the product exceeds
 * PTRDIFF_MAX (so it fits int64_t, size_t and pointer differences alike). Every such product
 * of sizes that a caller chose goes through here (pass 1 for an unused factor). */
static inline bool sr__size_mul(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    int64_t ab, abc;
    if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &ab) ||
        __builtin_mul_overflow(ab, c, &abc) || abc > (int64_t)PTRDIFF_MAX)
        return false;
    *out = abc;
    return true;
}

#endif /* SYMRED_CORE_H */
