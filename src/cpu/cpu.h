/*
 * cpu.h — the CPU module's internal header: the reductions' rules in double precision
 * (red-rules.h) and the table of per-family operations on row state built on them
 * (cpu_red_ops), the reference and tile interpreters, and the strategies of the CPU JIT backend
 * (omp-runtime.c): gemm-epilogue, fused two-product, attention's backward.
 */
#ifndef SYMRED_CPU_H
#define SYMRED_CPU_H

#include "../core/core.h"
#include "red-rules.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- the reductions' operations on row state (red-ops.c) -------------------------------------
 * One row of cpu_red_ops per family (enum sr_red_family, reductions.h), built on the rules of
 * red-rules.h: the reference interpreter and the tile interpreter reduce by it. A row's state
 * is d (doubles), ix (int64 indices) and cnt (ints), sized by the family's extents:
 *   SUM     d[c]                      the sums
 *   EXT, ARGEXT  d[c], ix[c]          the extreme and its index (-1: none yet)
 *   KSEL    d[c K + t], ix[c K + t], cnt[c]   component c's sorted list of cnt[c] <= K entries
 *   LSE     d[2 c], d[2 c + 1]        the maximum m and the sum of exp(v - m)
 *   SSMW    d[0], d[1], d[2 + c]      the maximum m, sum exp(f - m), sums exp(f - m) g_c */

/* What a reduction's state depends on: dim(F), K, dim(weight) and the selection's order. */
struct cpu_red_dims {
    int D, K, W;
    enum sr_red_order order;
};
/* The dims of kernel k's reduction. */
struct cpu_red_dims cpu_red_dims_of(const struct sr_kernel *k);

struct cpu_red_row {
    double *d;
    int64_t *ix;
    int *cnt;
};

/* A count of a row's state: d D + dk D K + w W + one. */
struct cpu_red_extent {
    int8_t d, dk, w, one;
};
static inline int64_t cpu_red_count(struct cpu_red_extent e, const struct cpu_red_dims *n)
{
    return (int64_t)e.d * n->D + (int64_t)e.dk * n->D * n->K + (int64_t)e.w * n->W + e.one;
}

/* A tile of n values of each component of F (and of the weight) for one output row, reduced
 * indices [r0, r0 + n), in the kernel's dtype, as the tile interpreter folds it. comp gives
 * component c of F (weight 0) or of the weight (weight 1); p is room for n values of the dtype
 * (the softmax's weights) and scratch for 2 W doubles. */
struct tile_isa;
struct cpu_red_tile {
    const struct tile_isa *isa;
    int es; /* bytes per value: 4 or 8 */
    int n;
    int64_t r0;
    const void *(*comp)(const struct cpu_red_tile *t, int weight, int c);
    void *ctx; /* the caller's, for comp */
    /* Where set (a Sum of one component), F's tile is the elementwise product of the tiles
     * dot[0] and dot[1], and comp is not called for it. */
    const void *dot[2];
    void *p;
    double *scratch;
};

/* init: the empty state; push: one value of F (f[0..D), with the weight's w[0..W) for SSMW) of
 * reduced index j; tile: a tile of values, by the vector loops where the values allow (a tile
 * that cannot change the state is skipped, one holding NaN or infinities where the rules care
 * goes value by value through push); merge: b, the state of later reduced indices, into a;
 * finish: the output row, out (and out_idx) in the reduction's output layout ((K, D) row-major
 * for the K-selections). */
struct cpu_red_ops {
    struct cpu_red_extent nd, ni, nc;
    void (*init)(const struct cpu_red_dims *n, struct cpu_red_row r);
    void (*push)(const struct cpu_red_dims *n, struct cpu_red_row r, const double *f,
                 const double *w, int64_t j);
    void (*tile)(const struct cpu_red_dims *n, struct cpu_red_row r, const struct cpu_red_tile *t);
    void (*merge)(const struct cpu_red_dims *n, struct cpu_red_row a, struct cpu_red_row b);
    void (*finish)(const struct cpu_red_dims *n, struct cpu_red_row r, double *out,
                   int64_t *out_idx);
};
extern const struct cpu_red_ops cpu_red_ops[SR_RED_FAM_COUNT];

/* Output rows per piece of work over nt threads: a few pieces per thread for balance, at most
 * most (a block of the kernel's row state), at least 1. */
static inline int64_t cpu_row_piece(int64_t rows, int nt, int64_t most)
{
    int64_t piece = (rows + (int64_t)nt * 4 - 1) / ((int64_t)nt * 4);
    return piece > most ? most : piece < 1 ? 1 : piece;
}

/* ---- the reference interpreter's evaluators (src/cpu/reference.c) ---- */

/* Evaluates node e in double precision from its operands' values: in[c] points at the dim of
 * child c values, out receives dim(e) values. One function per op (the reference column of the
 * op table); e must not be a Var, whose values come from the caller's arrays. Pure and
 * thread-safe. */
void cpu_ref_eval(const sr_expr *e, double *out, const double *const *in);

/* ---- symred's AVX-512 gemm (gemm-avx512.c), used by the gemm-epilogue strategy ------------
 * C (m x n, row stride ldc) = A B^T, A (m x K) and B (n x K) row-major with K contiguous, float32
 * or (f64) float64. A is packed once (cpu_avx512_pack_a into cpu_avx512_pack_a_bytes(m, K)
 * bytes) and reused for many B; Bp is scratch of cpu_avx512_pack_b_bytes(n, K) bytes. No
 * allocation; call only when cpu_avx512_usable() (the CPU has AVX-512F and the OS saves it). */
bool cpu_avx512_usable(void);
int64_t cpu_avx512_pack_a_bytes(int64_t m, int64_t K, int f64);
int64_t cpu_avx512_pack_b_bytes(int64_t n, int64_t K, int f64);
void cpu_avx512_pack_a(int f64, int64_t m, int64_t K, const void *A, void *Ap);
void cpu_avx512_gemm(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *B,
                     void *Bp, void *C, int64_t ldc);
/* C (m x n, row stride ldc) = (acc ? C : 0) + A V, A packed by cpu_avx512_pack_a (m x K) and
 * V (K x n) row-major with row stride ldv: the fused two-product's second product (a tile of F
 * times a tile of B). Bp as for cpu_avx512_gemm, cpu_avx512_pack_b_bytes(n, K) bytes. */
void cpu_avx512_gemm_kn(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *V,
                        int64_t ldv, void *Bp, void *C, int64_t ldc, int acc);
/* P[c] = exp(F[c] - m) (0 where F[c] is -inf) for c < n, P may be F; returns the sum of P. */
double cpu_avx512_expsum_f32(const float *F, float *P, int64_t n, float m);
/* The blocking the gemm uses for K (micro-kernel, K blocks, L2 size), for explain; the largest
 * K it computes in one block on this CPU (from its L2 size). */
void cpu_avx512_describe(int f64, int64_t K, char *buf, size_t size);
/* The same blocking as data: sr_plan_info's dot_mr, dot_nr and dot_kc for a tile product of
 * inner products of K values. */
void cpu_avx512_dot_info(int f64, int64_t K, sr_plan_info *info);
int64_t cpu_avx512_kc_max(int f64);

/* ---- symred's AVX2 + FMA strip products (gemm-avx2.c), used by the fused strategy -----------
 * float32 only; call only when cpu_avx2_usable() (the CPU has AVX2 and FMA). A strip is h >= 0
 * rows of a row-major A (row stride lda), done CPU_AVX2_MR rows at a time by the micro-kernel.
 * No allocation, single-threaded. */
#define CPU_AVX2_MR 6
bool cpu_avx2_usable(void);
/* Packs B (n x K, row stride ldb) as B^T in panels of 16 columns (zero-padded), into
 * cpu_avx2_pack_bt_bytes(n, K) bytes at Bp, 32-byte aligned. */
int64_t cpu_avx2_pack_bt_bytes(int64_t n, int64_t K);
void cpu_avx2_pack_bt(int64_t n, int64_t K, const float *B, int64_t ldb, float *Bp);
/* C (h x n, row stride ldc) = A (h x K) B^T, B packed by cpu_avx2_pack_bt. Writes the columns
 * up to n rounded up to 16: ldc must be at least that. */
void cpu_avx2_strip_abt(int64_t h, int64_t K, const float *A, int64_t lda, const float *Bp,
                        int64_t n, float *C, int64_t ldc);
/* Packs V (K x n, row stride ldv) in panels of 16 columns (zero-padded), into
 * cpu_avx2_pack_bt_bytes(n, K) bytes at Vp, 32-byte aligned. */
void cpu_avx2_pack_v(int64_t K, int64_t n, const float *V, int64_t ldv, float *Vp);
/* C (h x n, row stride ldc) += A (h x K) V, V packed by cpu_avx2_pack_v. */
void cpu_avx2_strip_av(int64_t h, int64_t K, const float *A, int64_t lda, const float *Vp,
                       int64_t n, float *C, int64_t ldc);

/* ---- the gemm-epilogue strategy of the CPU JIT (src/cpu/gemm.c) ---- */

/* Plans kernel k for the gemm-epilogue strategy: when F depends on the pair only through one
 * inner product of an i-variable and a j-variable, the dimension is at least the measured
 * threshold, and a tile gemm is available (symred's AVX-512 one, or BLIS loaded). On SR_OK
 * k->backend_data is the gemm-epilogue's, which cpu_gemm_backend runs (the JIT's prepare hands
 * it to the planner); SR_ENOTSUP: not applicable (use the direct strategy); other
 * errors (SR_EBUDGET, SR_ECOMPILE) are final. tier: CPU_COMPILE_NOW compiles the epilogue's
 * modules now; CPU_COMPILE_BACKGROUND serves the calls with the tile interpreter's epilogue (on the
 * same gemm tiles) while they compile in the background; CPU_COMPILE_NEVER never compiles (no
 * compiler, or SYMRED_JIT=off). */
enum cpu_compile { CPU_COMPILE_NOW, CPU_COMPILE_BACKGROUND, CPU_COMPILE_NEVER };
sr_status cpu_gemm_prepare(struct sr_kernel *k, int acc, enum cpu_compile tier);
/* The gemm-epilogue's candidate plan for k (side-effect free): feasible exactly when
 * cpu_gemm_prepare's rules (SYMRED_GEMM, the crossover, the epilogue's cost, a tile gemm
 * available) let it plan k; its cost, tiles and why. */
void cpu_gemm_offer(const struct sr_kernel *k, struct sr_plan *p);
extern const struct sr_backend_i cpu_gemm_backend;
/* The inner product of an output-axis variable (argument *va) and a reduced-axis variable (*vb)
 * through which F and the weight of k depend on the pair, if there is exactly one; NULL
 * otherwise. *epi: the cost model's flops per pair of the other pair nodes. */
const sr_expr *cpu_gemm_find_node(const struct sr_kernel *k, int *va, int *vb, double *epi);
/* k with its formulas in the simplifier's gemm form (SqDist as norms and an inner product,
 * k->simp.f_gemm), copied into *kx, when there is one; else k itself. A strategy that runs that
 * form makes it k's own with sr__simp_take_gemm_form. */
const struct sr_kernel *cpu_gemm_form(const struct sr_kernel *k, struct sr_kernel *kx);

/* BLIS, loaded at first use (gemm.c): whether it can be used (else why), the sub-configuration
 * it picked, and C (m x n, row stride ldc) = A B (+ C when beta), A and B with row and column
 * strides, single-threaded. Call cpu_blis_gemm only after cpu_blis_usable said yes. */
bool cpu_blis_usable(const char **why);
const char *cpu_blis_arch(void);
void cpu_blis_gemm(int f64, int64_t m, int64_t n, int64_t K, const void *A, int64_t rsa,
                   int64_t csa, const void *B, int64_t rsb, int64_t csb, int beta, void *C,
                   int64_t ldc);

/* The tile gemm that SYMRED_GEMM_KERNEL (auto|avx512|blis, read from ctx) picks on this
 * machine: 0 symred's AVX-512 one, 1 BLIS, -1 none or SYMRED_GEMM=off (the direct strategy
 * only); *forced (may be NULL): whether the variable asked for BLIS by name. SR_EINVAL for a
 * malformed variable. */
sr_status cpu_gemm_kernel(sr_ctx *ctx, int *kern, bool *forced_blis);

/* ---- the fused two-product strategy of the CPU JIT (src/cpu/fused.c; fused.h lists its other
 * files) ---- */

/* Realises the fused two-product strategy for kernel k (accumulation acc, enum jit_acc), as the
 * planner chose it: a Sum of F * B, or a SumSoftMaxWeight of F with weight B, F scalar and B of
 * the reduced axis. mode: CPU_COMPILE_NOW compiles the modules of F's tiles (and a formula B's)
 * now; CPU_COMPILE_BACKGROUND forms them by the tile interpreter while the modules compile in
 * the background; CPU_COMPILE_NEVER by the tile interpreter for good. On SR_OK
 * k->backend_data is the fused two-product's, which cpu_fused_backend runs; SR_ENOTSUP:
 * not applicable; other errors are final. */
sr_status cpu_fused_prepare(struct sr_kernel *k, int acc, enum cpu_compile mode);
/* The fused two-product's candidate plan for k (side-effect free): infeasible when its
 * prepare declines (F is not of its form, no tile gemm, a float32 accumulation other than
 * block, the memory budget below its smallest tiles); else its tiles, workspace lower bound and
 * estimated time. */
void cpu_fused_offer(const struct sr_kernel *k, int acc, struct sr_plan *p);

/* The symmetric variant of the fused two-product (fused-form.c, fused-plan.c, fused-run.c): a
 * Sum of F * B whose F(x, y) equals F(y, x) (simp_symmetric_pairs). Its offer is the fused
 * one's, infeasible when F is not symmetric; its prepare realises the fused two-product (mode as
 * cpu_fused_prepare's, CPU_COMPILE_NOW or CPU_COMPILE_BACKGROUND) and, when F's tile is formed per
 * pair and BLIS is there for the transposed product, lets it run symmetric once the module of F is
 * loaded, else rejects the symmetric plan (the fused one is then the chosen one). */
void cpu_fused_sym_offer(const struct sr_kernel *k, int acc, struct sr_plan *p);
sr_status cpu_fused_sym_prepare(struct sr_kernel *k, int acc, enum cpu_compile mode);
/* Whether a run of k on nx x ny rows with these arguments takes the symmetric driver: k runs on
 * the fused two-product with a symmetric F whose module is loaded (not tier 0: while it
 * compiles in the background, or if its compile failed, the tile interpreter forms the tiles of
 * the fused two-product), every exchanged pair of arguments is the same array, nx = ny is more
 * than one tile, and the per-thread accumulators fit in the memory budget (1 GiB without one).
 * Otherwise the run is the fused two-product's. */
bool cpu_fused_symmetric(const struct sr_kernel *k, int64_t nx, int64_t ny,
                         const void *const *args);

/* The CPU JIT's strategies, listed in the order that breaks ties, and its candidate plans for k
 * (omp-runtime.c): out[CPU_PLAN_...], returns how many; none compiles or allocates anything. */
enum cpu_plan_id { CPU_PLAN_SYM, CPU_PLAN_FUSED, CPU_PLAN_GEMM, CPU_PLAN_DIRECT, CPU_PLAN_COUNT };
int cpu_plans(const struct sr_kernel *k, int acc, struct sr_plan *out);
extern const struct sr_backend_i cpu_fused_backend;
/* ---- the CPU strategies' cost model (cost.c) ---- */

/* What a plan does per (i, j) pair: the terms of the cost model. */
struct cpu_cost {
    double arith, trans;  /* flop-equivalents of generated code: arithmetic, transcendental */
    double gemm_flops;    /* flops of the tile products */
    double strip_flops;   /* the same by symred's AVX2 strip products */
    double tile_passes;   /* passes of each pair through a tile in memory (0: none) */
    double pack_per_pair; /* values packed per pair (operands' panels, once per block of rows) */
    double direct_outs;   /* output values accumulated in registers per pair (direct) */
    bool fold;            /* the SumSoftMaxWeight or LogSumExp fold of generated code */
    double fold_weight;   /* its weight's width */
    int ti, tj;           /* the tiles (0: none), each with a fixed overhead */
};
/* Adds to c the generated code's flop-equivalents per pair of the pair nodes of roots[0..n)
 * (NULL roots skipped), leaving out skip (the inner product a tile gemm computes). */
void cpu_cost_gen(const sr_expr *const *roots, int nroots, const sr_expr *skip, struct cpu_cost *c);
/* Sets c's fold terms for k's reduction in generated code. */
void cpu_cost_fold(const struct sr_kernel *k, struct cpu_cost *c);
/* The estimated time per (i, j) pair on one thread, in nanoseconds. */
double cpu_cost_ns(const struct cpu_cost *c);
/* The flops per pair of a tile of F times R columns of B, as the micro-kernels do them (at
 * least their panel's width). */
double cpu_cost_product_flops(int R);

/* The fused strategy's vectorised softmax steps (fused-simd.c), float32: F[c] = exp(F[c] - m) (0
 * where F[c] is -inf) for c < n, returning their sum, with AVX2 by the CPU JIT's Exp (0 where the
 * result is below 1.7e-38: docs/semantics.md); the largest F[c] and -inf (a NaN never wins). */
double cpu_expsum_f32(float *F, int64_t n, float m);
/* F[c] = exp(F[c] a - m), c < n (by one FMA where AVX2 is usable and a and m are finite, else
 * F[c] a rounded first as cpu_expsum_f32 would take it), and their sum. */
double cpu_expsum_scaled_f32(float *F, int64_t n, float a, float m);
float cpu_rowmax_f32(const float *F, int64_t n);

/* ---- the fused backward of attention (src/cpu/attn-grad.c) ---- */

/* The vjp member of the CPU JIT's backends (sr_kernel_vjp, _ranges with plan p): the gradients
 * of a SumSoftMaxWeight of (x|y) or (x|y) c with a reduced-axis weight, in one pass over the
 * pairs (after one forming lam when lse is NULL). SR_ENOTSUP with the reason for any other
 * kernel. */
sr_status cpu_attn_vjp(const struct sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                       const void *gout, const void *out, const void *lse, void *const *grads);
/* The run_lse member (sr_kernel_run_lse, _ranges): the forward of the same kernels with lam. */
sr_status cpu_attn_run_lse(const struct sr_kernel *k, const sr_run_desc *r,
                           const struct sr_rplan *p, void *lse);
/* Whether k is a kernel that cpu_attn_vjp and cpu_attn_run_lse take. */
bool cpu_attn_covers(const struct sr_kernel *k);
/* The output rows of [0, n) that no block of p covers: the values of sr_kernel_run_ranges (the
 * empty reduction's) and lse -inf. */
void cpu_attn_fill_gaps(const struct sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                        int64_t n, void *lse);

/* ---- sr_kernel_eval_block's generated path (eval-block.c) ---- */

/* In *out, when k is a direct-strategy kernel of the CPU JIT, the module with its sr_block (the
 * block entry point, jit_module.block, src/jit/jit.h): the kernel's own module lacks it, so the
 * first call emits and compiles (or finds in the caches) the module with it, under a lock of the
 * kernel's; the per-thread workspace of its tiles goes to *per_thread. *out is NULL while the
 * tile interpreter serves k's calls (cpu_jit_tier0: no call waits for a compiler), for every
 * other kernel (SR_OK), and on failure (the status, the message in the context). May run from
 * many threads at once. (omp-runtime.c) */
struct jit_module;
/* The loaded module of k when k is a direct-strategy kernel of the CPU JIT, else NULL: the one
 * its reductions run, without sr_block. (omp-runtime.c) */
const struct jit_module *cpu_jit_module(const struct sr_kernel *k);
sr_status cpu_jit_block_module(const struct sr_kernel *k, const struct jit_module **out,
                               int64_t *per_thread);
/* Whether k is a direct-strategy kernel of the CPU JIT whose calls the tile interpreter serves
 * now: its module compiling in the background (SYMRED_JIT=async), or its compile failed.
 * (omp-runtime.c) */
bool cpu_jit_tier0(const struct sr_kernel *k);

/* ---- the tile interpreter (tile.c, tile-isa.c, tile-kern.h) ----
 * Tier 0 of the CPU: the simplified formula interpreted one op at a time over tiles of reduced
 * indices with vector loops compiled into the library, so it needs no compiler. */

/* The operands of one op over a tile: operand c's component k is at p[c] + k * cs[c] (in
 * elements of the kernel's dtype), its element t at + t * es[c] (es 0: one value broadcast over
 * the tile). */
struct tile_opnds {
    const void *p[EXPR_MAX_ARITY];
    int64_t cs[EXPR_MAX_ARITY];
    int64_t es[EXPR_MAX_ARITY];
};

/* The loops of one element type and vector unit (tile-kern.h). op evaluates node e over n
 * elements into out (component stride ocs; scratch holds the float64 values of e and its
 * operands for the ops that run element by element through cpu_ref_eval). The tile reductions
 * take n >= 1 elements; sums accumulate in float64: sum; max
 * (special: a NaN or +inf, or all -inf); expsum: sum exp(x - m), the exponentials stored in p
 * unless NULL; dot; ext: min, or max when desc, NaN when any is NaN. */
/* Chains of elementwise ops that the interpreter runs as one loop (the first operand a, the
 * second b): -(a b), exp(a b), exp(-(a b)), exp(-a). */
enum tile_fuse {
    TILE_FUSE_NONE,
    TILE_FUSE_NEG_MUL,
    TILE_FUSE_EXP_MUL,
    TILE_FUSE_EXP_NEG_MUL,
    TILE_FUSE_EXP_NEG
};

struct tile_isa {
    void (*op)(const sr_expr *e, void *out, int64_t ocs, const struct tile_opnds *opd, int n,
               double *scratch);
    /* A fused chain (enum tile_fuse) of dim components over n elements. */
    void (*fused)(int kind, int dim, void *out, int64_t ocs, const struct tile_opnds *opd, int n);
    double (*sum)(const void *x, int n);
    double (*max)(const void *x, int n, int *special);
    double (*expsum)(const void *x, void *p, int n, double m);
    double (*dot)(const void *p, const void *g, int n);
    double (*ext)(const void *x, int n, int desc);
    /* Bit b set when some x[u], 16 b <= u < 16 b + 16, is not >= thr (NaN included); n <= 1024. */
    uint64_t (*below)(const void *x, int n, double thr);
};
/* The loops for dtype (SR_F32 or SR_F64) on the widest vector unit this CPU has ("AVX-512",
 * "AVX2", "baseline" in *name, which may be NULL). */
const struct tile_isa *cpu_tile_isa(sr_dtype dtype, const char **name);

/* The tile interpreter as a backend: serves any kernel on the CPU (every op, reduction, axis,
 * range and the memory budget) without a compiler. */
extern const struct sr_backend_i cpu_tile_backend;
/* Its program for kernel k, built without touching k (cpu_tile_free frees it), and the calls
 * the CPU JIT makes while its compiled module is not ready: run, run_ranges and workspace as the
 * backend members, on program t. Such a program only folds: a Sum of a product of two tiles
 * never forms F's tile, so cpu_tile_block needs a program from cpu_tile_new_ext. */
struct tile_prog;
sr_status cpu_tile_new(const struct sr_kernel *k, struct tile_prog **out);
void cpu_tile_free(struct tile_prog *t);
sr_status cpu_tile_run(const struct sr_kernel *k, const struct tile_prog *t, const sr_run_desc *r,
                       const struct sr_rplan *p);
int64_t cpu_tile_workspace(const struct sr_kernel *k, const struct tile_prog *t,
                           int64_t *per_thread, int *threads);
void cpu_tile_explain(const struct sr_kernel *k, const struct tile_prog *t, struct expr_buf *b);
/* The plan of program t: the direct strategy on the CPU at tier 0, its tiles. */
void cpu_tile_plan_info(const struct sr_kernel *k, const struct tile_prog *t, sr_plan_info *info);

/* A program whose node ext (a pair node of dimension 1, the inner product of the gemm-epilogue,
 * or NULL) is not computed but read from a tile the caller provides (cpu_tile_fold), and whose
 * tiles of reduced indices are at most tj_max wide (0: 256); F's tile is always formed, so
 * cpu_tile_block may read it. */
sr_status cpu_tile_new_ext(const struct sr_kernel *k, const sr_expr *ext, int tj_max,
                           struct tile_prog **out);
/* Driving a program by hand, as the gemm-epilogue's tier 0 does: a frame is one thread's buffers
 * for blocks of at most rows output rows, reading the arrays args (which the caller may point
 * elsewhere between calls, the parameters excepted: the frame evaluates the constants when it
 * is made); the row states are the caller's, cpu_tile_state_bytes(t) each. begin starts the
 * output rows [o0, o0 + n) (their row terms; their states st initialised when init); fold folds
 * the reduced indices [r0, r0 + n) into the begun rows' states, the ext node's value for row s
 * and reduced index r0 + u read at G[s * ldg + u] (G NULL without an ext node); final writes
 * the results of n rows from their states st into rows orow, orow + 1, ... of out and out_idx
 * (either may be NULL when the reduction has no such output); merge merges rows states b (later
 * reduced indices) into a. Frames are single-threaded; NULL: out of memory. */
struct tile_frame;
int64_t cpu_tile_state_bytes(const struct tile_prog *t);
int64_t cpu_tile_frame_bytes(const struct tile_prog *t, int64_t rows);
struct tile_frame *cpu_tile_frame_new(const struct sr_kernel *k, const struct tile_prog *t,
                                      const void *const *args, int64_t rows);
void cpu_tile_frame_free(struct tile_frame *f);
void cpu_tile_begin(struct tile_frame *f, void *st, int64_t o0, int64_t n, bool init);
void cpu_tile_fold(struct tile_frame *f, void *st, int64_t r0, int64_t n, const void *G,
                   int64_t ldg);
void cpu_tile_final(struct tile_frame *f, const void *st, int64_t n, void *out, int64_t *out_idx,
                    int64_t orow);
void cpu_tile_merge(const struct sr_kernel *k, const struct tile_prog *t, void *a, const void *b,
                    int64_t rows);
/* The values of the program's F for output rows [o0, o0 + nrows) (at most the frame's rows) and
 * reduced indices [r0, r0 + n), without a reduction (the fused two-product's tiles of F on
 * tier 0): component c of row s at index r0 + u to element s ldr + u ldu + c of out; the ext
 * node read from G as by cpu_tile_fold. */
void cpu_tile_block(struct tile_frame *f, int64_t o0, int64_t nrows, int64_t r0, int64_t n,
                    const void *G, int64_t ldg, void *out, int64_t ldr, int64_t ldu);

/* ---- background compiles (background.c) ----
 * A kernel served by the tile interpreter while its modules compile on a thread of their own
 * (SYMRED_JIT=async): the direct strategy (one module) and the gemm-epilogue (its epilogue and
 * the module that ranks a selection's candidates again). */
#define CPU_BG_MAX 3
struct cpu_bg;
/* Compiles src[0 .. n) (n <= CPU_BG_MAX) in order on a detached thread, whose data pass to it
 * on SR_OK (src[i].data is then NULL); otherwise nothing started and they are the caller's. */
sr_status cpu_bg_start(sr_ctx *ctx, struct expr_buf *src, int n, struct cpu_bg **out);
/* Module i once every module is loaded (acquire order: a call that sees one sees them all),
 * else NULL; NULL for a NULL bg. */
struct jit_module *cpu_bg_module(const struct cpu_bg *bg, int i);
/* The kernel lets go (its release): the modules, loaded or to come, are released. */
void cpu_bg_release(sr_ctx *ctx, struct cpu_bg *bg);
/* sr_kernel_wait's and the stage member's answers (SR_STAGE_FINAL for a NULL bg). */
sr_status cpu_bg_wait(struct cpu_bg *bg, double timeout_s);
int cpu_bg_stage(struct cpu_bg *bg);
/* Explain's tier line; the first module's load info in *info; returns the stage. */
struct jit_load_info;
int cpu_bg_explain(struct cpu_bg *bg, struct expr_buf *b, struct jit_load_info *info);
/* sr_plan_info's module members from a module's load info li, whose strings the kernel owns. */
void cpu_module_plan_info(const struct jit_load_info *li, sr_plan_info *info);
/* sr_plan_info's module members of a kernel whose modules bg compiles: the first module's load
 * info once they are loaded, the reason once the compile failed, nothing while it runs. */
void cpu_bg_plan_info(struct cpu_bg *bg, sr_plan_info *info);

#endif /* SYMRED_CPU_H */
