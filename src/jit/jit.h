/*
 * jit.h — the CPU JIT: C emitter, compile driver, loader and disk cache.
 *
 * A kernel is lowered to one C translation unit (emit-c.c: the entry points' skeletons;
 * emit-ops.c: the op spellings; emit-c.h between them) that exports a fixed C ABI, compiled by
 * the system compiler into a shared object (compile.c), kept in a per-user disk cache (cache.c)
 * and in a per-context in-memory cache, and run by the OpenMP runtime in src/cpu/omp-runtime.c
 * (and src/cpu/eval-block.c for sr_block).
 *
 * The generated module exports (T is float or double, the kernel's dtype; a module that reads
 * and writes float16 or bfloat16 arrays itself, k->io_native, takes and writes those in args
 * and out, computing in float):
 *   const int     sr_abi_version;      JIT_ABI_VERSION
 *   const int64_t sr_state_bytes;      bytes of the reduction state of one output row
 *   const int64_t sr_rows_per_block;   rows the kernel processes per block (state buffers)
 *   int  sr_part(o0, o1, r0, r1, args, state)
 *        initialises the states of output rows [o0, o1) (state points at row o0's) and folds
 *        the reduced indices [r0, r1) into them; returns nonzero when out of memory.
 *   int  sr_part_iv(o0, o1, iv, niv, args, state)
 *        the same over the reduced intervals [iv[2q], iv[2q + 1]), q < niv, in that order (the
 *        block-sparse ranges; sr_part is its one-interval case).
 *   int  sr_merge(dst, src, n)
 *        combines n row states: src must cover reduced indices after those of dst (ties keep
 *        dst's lower indices, as the reference does); nonzero when out of memory (the
 *        K-reductions need scratch room for K values), dst then unspecified.
 *   void sr_final(state, o0, o1, out, out_idx)
 *        writes the outputs of rows [o0, o1) from their states.
 *   int  sr_run(o0, o1, nr, args, out, out_idx)
 *        the whole reduction over [0, nr) for rows [o0, o1); nonzero when out of memory.
 *   int  sr_block(o0, o1, r0, r1, args, out, so, sr)
 *        F's values (not reduced) on output rows [o0, o1) x reduced indices [r0, r1): component
 *        c of (o, r) goes to ((T *)out)[(o - o0) * so + (r - r0) * sr + c] (on axis 1 sr must be
 *        dim(F)); nonzero when out of memory. sr_kernel_eval_block's generated path, and the
 *        fused two-product's tile of F (src/cpu/fused.c). In a gemm-epilogue module it reads the
 *        inner products from the tile args[gemm_arg] of rows [o0, o1) x [r0, r1), as sr_part_iv.
 *        Absent from a module emitted with jit_plan.no_block (a direct kernel's own module: its
 *        eval_block module, the same source with sr_block, is built on first use).
 * "o" is the output axis (i for axis 1, j for axis 0) and "r" the reduced one. The generated
 * code has no OpenMP runtime dependency (only `omp simd`, -fopenmp-simd); threads are the
 * library's business (omp-runtime.c).
 */
#ifndef SYMRED_JIT_H
#define SYMRED_JIT_H

#include "../core/core.h"

#include <stdatomic.h>
#include <stdint.h>

#define JIT_ABI_VERSION 4

enum jit_acc { JIT_ACC_BLOCK = 0, JIT_ACC_KAHAN = 1, JIT_ACC_F64 = 2 };

extern const char *const jit_acc_names[3];

/* Vector registers the register blocking of the fused Sum plans for: AVX2's 16 (AVX-512 and
 * AArch64 have 32; 16 keeps the count portable). */
#define JIT_VREGS 16

/* What the emitter decided, for explain. */
struct jit_plan {
    int tile_j;         /* reduced indices per tile */
    int rows_per_block; /* output rows sharing one transposed tile */
    int rows_per_pass;  /* output rows one pass of the fused Sum's pair loop serves */
    int row_regs;       /* the vector registers rows_per_pass counted per row (0: not counted) */
    int shared_regs;    /* ... and shared by the rows */
    int columns;        /* scalars per reduced index kept in the structure-of-arrays tile */
    int fbuf;           /* formula values per reduced index buffered for the reduction */
    int64_t state_bytes;
    int64_t workspace_bytes; /* per thread: the tile and a block of row states */
    int hoisted_outer, hoisted_inner, pair_nodes;
    bool loops; /* loop mode (emit-c.h): plain pair loop, wide values in loops */
    /* Inputs, zero by default. ws_limit: the per-thread workspace to shrink the tiles under
     * (0 = none). gemm: the inner-product node that the gemm-epilogue strategy (src/cpu/gemm.c)
     * computes with a tile gemm (symred's AVX-512 one or BLIS); the generated code reads it from
     * args[gemm_arg], a tile of rows [o0, o1) x reduced indices [r0, r1) with leading dimension
     * gemm_ld, and at most gemm_rows rows; args[gemm_arg + 1] points to an int: nonzero, sr_part
     * initialises the states first (as it always does outside gemm mode); zero, it folds the tile
     * into the states as they are, so one block of states runs through all the tiles of a row block
     * without a merge per tile. tile_j_max: the tile need not be wider than this (the
     * smallest power of two from 16 that holds it): the gemm path ranks a few pairs per row
     * with sr_block, where a wide tile only spreads their transposed columns over L2. no_block:
     * leave sr_block out (the direct strategy compiles it on the first sr_kernel_eval_block
     * only, which keeps the pair loop's second copy out of the cold compile). */
    int64_t ws_limit;
    int tile_j_max;
    const sr_expr *gemm;
    int gemm_arg, gemm_ld, gemm_rows;
    bool no_block;
    /* block_only: a module used only through its sr_block (the fused two-product's tiles of F
     * and of B, src/cpu/fused.c): sr_part_iv is a stub that returns 1, which halves the source
     * the compiler reads. */
    bool block_only;
};

/* Emits the C source of kernel k with accumulation mode acc into b: any formula, any width
 * (wide or large ones in loop mode, see emit-c.h). SR_ENOMEM; SR_ENOTSUP or SR_EINTERNAL only
 * for an emitter bug. */
sr_status jit_emit_c(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                     struct jit_plan *plan);

/* The direct strategy's pieces, for a target other than C (emit-cuda.c). The code uses the C
 * emitter's names: a<v> (argument v's array), o (output row), r and jj (reduced index and its
 * slot in the tile), tb and SR_TJ (the structure-of-arrays tile), sr_t, sr_sq, int64_t. */
struct jit_nodes {
    struct expr_buf uniform; /* constants and parameters: once per call */
    struct expr_buf outer;   /* the output row's nodes (o) */
    struct expr_buf inner;   /* one reduced index's nodes (r, jj), stored into tb */
    struct expr_buf pair;    /* the pair's nodes (jj), the tile's columns loaded first */
    char **f, **w;           /* NULL-terminated: F's and the weight's components in pair scope */
    /* F's (the weight's) component sr_c, an int the caller's loop defines, where F (the weight)
     * is big (more than JIT_BIG components, emit-c.h); else NULL. */
    char *floop, *wloop;
    bool loops; /* pair nodes may be arrays (loop mode of emit-c.h) */
    int ncol, nuniform, nouter, ninner, npair;
};

/* Fills out for kernel k. spell[op] (OP_COUNT entries, NULL = the C spelling) overrides the
 * elementwise templates. SR_ENOMEM. */
sr_status jit_emit_nodes(const struct sr_kernel *k, const char *const *spell,
                         struct jit_nodes *out);
/* The same with the inner product node gemm (an OP_SCALPROD of F, or NULL) read from a tile that
 * the target's skeleton computed: its pair code is sr_gt[(o - o0) * SR_GLD + (rt - r0 + jj)], the
 * names o0, r0, sr_gt and SR_GLD the skeleton's, and its operands get no columns for its sake. */
sr_status jit_emit_nodes_gemm(const struct sr_kernel *k, const char *const *spell,
                              const sr_expr *gemm, struct jit_nodes *out);
void jit_nodes_free(struct jit_nodes *n);

/* The reduction state of one output row, shared by every target (emit-state.c), so that the
 * tie and NaN rules of docs/semantics.md are spelled once. jit_emit_state writes sr_state (with
 * a compile-time check that its size is jit_state_bytes), st_init(s), the fold helpers
 * (lse_fold, ssmw_fold, SR_KLT), st_merge(d, s, tm, ti) (s covers reduced indices after d's;
 * tm and ti are scratch of SR_K entries, used by the K-reductions only) and
 * st_final(s, o, out, out_idx) (writes row o's outputs). The target's prelude defines sr_t,
 * sr_acc, int64_t, SR_D, SR_K, SR_DG, SR_OUTD, SR_INF, SR_NAN, the function qualifier SR_FN
 * and the loop hint SR_UNROLL (empty, or an unroll pragma). SR_EINTERNAL for a reduction the
 * JIT does not know, SR_ENOMEM. */
sr_status jit_emit_state(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b);
/* Appends the family rule that folds value v (of reduced index r; the rule may ignore it) into
 * component c of state (a prefix of the state's members: "s->", "st.") for kernel k with
 * accumulation acc: one statement, no indent before or newline after its first line. Sum's
 * folds a partial sum; SumSoftMaxWeight's reads the weight's values from sr_g[SR_DG].
 * (emit-state.c) */
void jit_emit_fold(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                   const char *state, const char *c, const char *v, const char *r);
/* Appends the C kernels' vectorised fold of a tile of F (and of the weight) into row state s
 * for kernel k with accumulation acc (emit-state.c's family_rules.tile): a loop over the
 * components; F's component c holds nj values at fb + c * SR_TJ, the weight's component g at
 * fb + (dim(F) + g) * SR_TJ, for the reduced indices from rt. loops: F is computed in loop
 * mode; the fold then uses jit_tile_rows(k, true) scratch rows of the tile after the weight's. */
void jit_emit_tile_fold(const struct sr_kernel *k, enum jit_acc acc, bool loops,
                        struct expr_buf *b);
int jit_tile_rows(const struct sr_kernel *k, bool loops);
/* sizeof(sr_state) of kernel k with accumulation acc, on every target. */
int64_t jit_state_bytes(const struct sr_kernel *k, enum jit_acc acc);

typedef int (*jit_part_fn)(int64_t o0, int64_t o1, int64_t r0, int64_t r1, const void *const *args,
                           void *state);
typedef int (*jit_part_iv_fn)(int64_t o0, int64_t o1, const int64_t *iv, int64_t niv,
                              const void *const *args, void *state);
typedef int (*jit_merge_fn)(void *dst, const void *src, int64_t n);
typedef void (*jit_final_fn)(const void *state, int64_t o0, int64_t o1, void *out,
                             int64_t *out_idx);
typedef int (*jit_run_fn)(int64_t o0, int64_t o1, int64_t nr, const void *const *args, void *out,
                          int64_t *out_idx);
typedef int (*jit_block_fn)(int64_t o0, int64_t o1, int64_t r0, int64_t r1, const void *const *args,
                            void *out, int64_t so, int64_t sr);

/* A loaded module, shared by the kernels of one context that have the same source. */
/* Characters of a cache key (two 64-bit hashes in hex). */
#define JIT_KEY_BYTES 32

struct jit_module {
    struct jit_module *next;
    char key[JIT_KEY_BYTES + 1];
    void *handle;
    jit_part_fn part;
    jit_part_iv_fn part_iv;
    jit_merge_fn merge;
    jit_final_fn final;
    jit_run_fn run;
    jit_block_fn block;
    int64_t state_bytes;
    int64_t workspace_bytes; /* per thread: the tile and a block of row states */
    int64_t rows_per_block;
    int refs;            /* kernels using it; at 0 it is idle, kept while recently used */
    uint64_t idle_since; /* the context's jit clock when it last became idle */
};

/* Per-context JIT state (jit_ctx_of): the context's compiler options as the last kernel saw
 * them, and the in-memory module cache. The options, the module list, the counters and
 * no_compiler change under the lock only (jit_ctx_get, jit_module_get, jit_module_release), as
 * sr_kernel_eval_block builds a direct kernel's block module on first use from any thread. */
struct jit_ctx {
    char cc[512];         /* SYMRED_CC, default "cc" */
    int acc;              /* SYMRED_ACC */
    int keep_source;      /* SYMRED_JIT_KEEP=1: keep the generated source next to the cache */
    int compile_timeout;  /* SYMRED_COMPILE_TIMEOUT, seconds a compiler run may take */
    int idle_max;         /* SYMRED_JIT_IDLE_MODULES: idle modules kept loaded */
    bool no_compiler;     /* the compiler could not be started: use the reference (lock) */
    bool logged_fallback; /* said so once */
    struct jit_module *modules;
    uint64_t clock; /* counts modules becoming idle: the least recently used goes first */
    unsigned long mem_hits, disk_hits, compiles;
    /* Background compiles running for kernels of the context (SYMRED_JIT=async, omp-runtime.c);
     * jit_ctx_free waits on bg_idle until there are none. */
    int bg_running;
    pthread_cond_t bg_idle;
    /* Set by jit_ctx_free once its grace period has passed: the context's background compiles
     * are killed if running (jit_compile_cancel_by), not started if queued. */
    atomic_int cancel;
    pthread_mutex_t lock; /* taken through jit_ctx_lock */
    /* The fork generation (sr__fork_gen) the lock, bg_idle and bg_running belong to: in a child
     * of fork() they are reset on first use, since the threads that held the lock or counted in
     * bg_running are not there. */
    _Atomic unsigned gen;
};

/* Locks and unlocks jc (its lock, reset first in a child of fork()). */
void jit_ctx_lock(struct jit_ctx *jc);
void jit_ctx_unlock(struct jit_ctx *jc);

/* Whether jc's compiler could not be started (read under its lock). */
bool jit_no_compiler(struct jit_ctx *jc);

/* The jit state of ctx, or NULL before the first jit_ctx_get. It hangs off the context in the
 * JIT backend's state slot (the CUDA backend shares it), and cpu_jit_backend's ctx_free,
 * jit_ctx_free, frees it with the context. */
static inline struct jit_ctx *jit_ctx_of(const sr_ctx *ctx)
{
    return ctx->backend_state[SR_BACKEND_JIT];
}
void jit_ctx_free(void *state);

/* The jit state of ctx, created on first use, its compiler, accumulation, keep-source and
 * timeout taken from the context's options (struct sr_options). Fails with SR_ENOMEM. */
sr_status jit_ctx_get(sr_ctx *ctx, struct jit_ctx **out);

/* How a module was obtained, for explain. */
struct jit_load_info {
    const char *origin; /* "memory", "disk", "compiled" */
    char cache[256];    /* "hit", "miss", or why the disk cache was not used */
    char path[2400];    /* the cached shared object or kept source, "" if none */
    double compile_ms;
};

/* Finds or builds the module for src: the context's memory cache, then the disk cache, then the
 * compiler. SR_ECOMPILE with the compiler's messages on a failed compile; SR_ENODEV when the
 * compiler cannot be started (no compiler: the caller falls back to the reference). */
sr_status jit_module_get(sr_ctx *ctx, const char *src, size_t len, struct jit_module **out,
                         struct jit_load_info *info);
void jit_module_release(sr_ctx *ctx, struct jit_module *m);

/* Compiles src into the shared object at so_path (in a private directory), using the compiler
 * of jc, in a process group of its own. On failure, a message (the compiler's diagnostics) in
 * err. Returns SR_OK, SR_ENODEV (could not start the compiler), SR_ECOMPILE (failed; or ran
 * past jc->compile_timeout seconds, or a signal interrupted the wait: the compiler's process
 * group is killed), SR_EIO. */
sr_status jit_compile(const struct jit_ctx *jc, const char *src, size_t len, const char *dir,
                      const char *so_path, char *err, size_t errcap);
/* The process's build directories (compile.c): jit_build_dir_new makes a fresh private one,
 * parent/tmp-XXXXXX, into dir (0 or an errno; ECANCELED once the process is exiting), and
 * registers it; jit_build_dir_free removes its files (jit_build_files, all a build directory
 * holds) and itself. At exit the registered directories are removed and the compilers running
 * in them killed; a forked child inherits none of them. Thread-safe. */
int jit_build_dir_new(const char *parent, char *dir, size_t cap);
void jit_build_dir_free(const char *dir);
#define JIT_BUILD_FILES 3
extern const char *const jit_build_files[JIT_BUILD_FILES];
/* Registers, once per process, the exit handler and the fork handlers (compile.c). */
void jit_process_init(void);

/* Seconds jit_ctx_free lets the context's background compiles finish before it cancels them. */
#define JIT_FREE_GRACE_S 3

/* Makes the calling thread's compiles (jit_compile) end, killing the compiler, as soon as *flag
 * becomes nonzero (checked every 50 ms); NULL: no such flag, the wait sleeps until the compiler
 * ends or times out. A background compile's thread sets its context's jc->cancel. */
void jit_compile_cancel_by(const atomic_int *flag);
/* Whether the compiler cc is an executable file (a path), or one in a directory of PATH (a
 * name), as the compile would find it: a cheap check, without running it. */
bool jit_compiler_found(const char *cc);
/* The compiler flags, and the libraries that follow the source; jit_cflags_text has both, for
 * keys and explain. */
extern const char *const jit_cflags[];
extern const char *const jit_libs[];
const char *jit_cflags_text(void);

/* Identity of compiler cc (its --version output, hashed) in *id, computed once per process
 * and compiler. SR_ENODEV when it could not be started; SR_ECOMPILE when `cc --version` ran
 * past timeout_s seconds or a signal interrupted the wait (it is killed); the message in err. */
sr_status jit_compiler_id(const char *cc, int timeout_s, uint64_t *id, char *err, size_t errcap);

/* 64-bit FNV-1a. */
uint64_t jit_hash(uint64_t h, const void *data, size_t len);
#define JIT_HASH_INIT 0xcbf29ce484222325ULL

/* The disk cache's rules for other binaries (the CUDA backend's cubin/PTX): the checked cache
 * directory (SR_EIO and the reason in why when there is none or it is refused), the payload of
 * the entry at path when it is a whole regular file stored under key (malloc'd, with a NUL
 * after its *size bytes; NULL when missing, corrupt or foreign), and appending the trailer
 * naming key to a new file. */
sr_status jit_cache_dir(const sr_ctx *ctx, char *dir, size_t cap, char *why, size_t whycap);
char *jit_cache_read(const char *path, const char *key, size_t *size);
sr_status jit_cache_seal(const char *path, const char *key);

/* Loads the module from the shared object at path and resolves its symbols (through a
 * descriptor, as jit_load_fd, where /proc/self/fd works). */
sr_status jit_load(sr_ctx *ctx, const char *path, struct jit_module *m, char *err, size_t errcap);
/* Loads the shared object open as fd, checked by the caller through that descriptor, through
 * /proc/self/fd/N under a name no other load of the process used, so that the file loaded is
 * the file checked and never an object an earlier load left under that number. Takes fd and
 * closes it (the mapping keeps the file). */
sr_status jit_load_fd(sr_ctx *ctx, int fd, struct jit_module *m, char *err, size_t errcap);
/* Whether /proc/self/fd/N names the file open as fd. */
bool jit_proc_fd_works(int fd);

#endif /* SYMRED_JIT_H */
