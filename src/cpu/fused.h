/*
 * fused.h — the fused two-product strategy's internal header (src/cpu/fused*.c, docs/wide.md):
 * its constants, the realised kernel (struct fused_kernel) and the form of F it found, and the
 * functions its files share. fused.c says what the strategy does and is the backend; the other
 * files are:
 *   fused-form.c  F's form (fused_match: F * B, the factors of F, the symmetric pairs) and the
 *                 candidate plans (cpu_fused_offer, cpu_fused_sym_offer) with their cost terms;
 *   fused-plan.c  the tiles and their workspace under the memory budget, the modules of F's
 *                 factors and of a formula B (compiled now or in the background) or tier 0's
 *                 programs, and cpu_fused_prepare, cpu_fused_sym_prepare;
 *   fused-run.c   the drivers: a thread's workspace, the tiles of F, the online softmax, the
 *                 products, the chunks over the threads, and the symmetric driver;
 *   fused-simd.c  the vectorised softmax steps (AVX2 and FMA, AVX-512's expsum, portable C).
 */
#ifndef SYMRED_CPU_FUSED_H
#define SYMRED_CPU_FUSED_H

#include "../jit/jit.h"
#include "cpu.h"

/* Columns of B per pass: a wider B is done in passes of this many columns, each forming the
 * tiles of F again, so that the block of the output (448 rows x 256 float32, 448 KiB) stays in
 * L2 and B's tile (256 x 256) beside it. In one pass, R = 1024 (a 1.8 MiB block) ran at 2.5x
 * the dense K @ B, against 1.1x for R = 256. */
#define FUSED_COLS 256

/* The products' gemm: symred's AVX-512 one on whole tiles, BLIS on whole tiles, or symred's AVX2
 * strip products (gemm-avx2.c) on strips of FUSED_STRIP rows of the tile. */
enum { KERN_AVX512, KERN_BLIS, KERN_AVX2 };

/* Output rows per strip with the AVX2 products: two micro-kernel strips, so that each panel of the
 * tile of K or B is read from L2 once per two micro-kernel strips, and a strip's inner products
 * and F (2 x 12 x 512 float32, 48 KiB) stay close, in L1 and L2. Strips of 6, 18 and 24 rows ran
 * within the noise of 12 (attention, N = M = 4096, alternating in one process, load 9-10). */
#define FUSED_STRIP (2 * CPU_AVX2_MR)

/* F as a product of at most this many factors, each of which depends on the pair through at
 * most one inner product of two variables that a gemm computes (attention's gradient:
 * exp((q|k) s - L) times (G|v) - (G|o)). */
#define FUSED_MAX_FACTORS 2

/* Pairs of variables exchanged by the symmetry of F that the symmetric driver looks for, and the
 * side of its square tiles of F: one K block of BLIS's sgemm, as the fused tiles' tj. Measured
 * for K(x, x) @ V (n = 20 000, d = 3, 11 columns, float32, BLIS, 2-vCPU AMD EPYC, alternating
 * in separate processes, load 7): tiles of 128 took 1.09-1.23x the CPU time of 256. */
#define FUSED_SYM_MAX 4
#define FUSED_SYM_T   256

/* Without a memory budget, the symmetric driver's accumulators (one output-sized array per
 * thread) stay under this many bytes; larger runs take the fused two-product. */
#define FUSED_SYM_MAX_BYTES ((int64_t)1 << 30)

/* Without a memory budget, the operands packed once per run (struct fused_pre) stay under this
 * many bytes; larger runs pack each tile for each row block. */
#define FUSED_PRE_MAX_BYTES ((int64_t)1 << 30)

/* One factor of F: the JIT module that forms its tile. */
struct fused_factor {
    const sr_expr *f;
    int gemm;        /* its tile from a tile of inner products */
    int va, vb, dim; /* the inner product's operands (gemm) */
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
    /* Tier 0: the tile interpreter's program of the factor (kernel kt), instead of m. */
    sr_kernel kt;
    struct tile_prog *t;
};

/* A B that is a formula of the reduced side only (no variable of the output axis: k(x_j, U)
 * for all inducing points U, a parameter): its tile, TJ x R, is evaluated into the workspace
 * by generated code (the module of B alone, its sr_block on one output row) once per tile of
 * reduced indices, before the products read it as they read a variable's. */
struct fused_hoist {
    const sr_expr *b; /* the formula, or NULL when B is a variable */
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
    sr_kernel kt; /* tier 0: the tile interpreter's program of B, instead of m */
    struct tile_prog *t;
};

struct fused_kernel {
    int kern; /* the products' gemm */
    int bvar; /* the argument index of B; -1 when B is a formula (hoist) */
    struct fused_hoist hoist;
    int avar;         /* A (struct fused_form), or -1 */
    int bsign, asign; /* the signs of B's and A's terms */
    int R;            /* its width */
    int rc;           /* columns of B per pass over the reduced range */
    const sr_expr *f; /* the scalar F */
    int nfac;         /* factors of F, each with its module */
    struct fused_factor fac[FUSED_MAX_FACTORS];
    int ti, tj; /* output rows per block, reduced indices per tile */
    /* A SumSoftMaxWeight of F = c (x|y) on the AVX2 strip products (attention): the exponentials
     * read the tile of inner products, exp(c G - m) with c the parameter sdp_var (of dimension 1)
     * or, when sdp_var < 0, the constant sdp_c, and F's module is not called (sdp). */
    bool sdp;
    int sdp_var;
    float sdp_c;
    int64_t per_thread; /* workspace bytes per thread */
    const char *why;    /* why this strategy was chosen */
    /* The tiles of F and B formed by the tile interpreter (programs fac[q].t, hoist.t): for good
     * (tier0, no modules), or until bg, the background compile of the factors' modules and
     * then B's, has them ready. */
    bool tier0;
    struct cpu_bg *bg;
    /* The symmetric driver (fused_run_sym): F(o, r) = F(r, o) with argument sym_i[p] paired with
     * sym_j[p], p < nsym; it runs when each pair is the same array and tiles of sym_t rows. */
    bool sym;
    int nsym, sym_t;
    int sym_i[FUSED_SYM_MAX], sym_j[FUSED_SYM_MAX];
};

/* What fused_match found: out_o = bsign sum_r F(o, r) B_r + asign A_o sum_r F(o, r), with A an
 * output-index variable of B's width or none (avar < 0). */
struct fused_form {
    const sr_expr *f; /* the scalar F */
    int bvar, avar;   /* argument indices of B and A; bvar -1 when B is the formula bf */
    int bsign, asign;
    const sr_expr *bf;
};

static inline int64_t al64(int64_t v) { return (v + 63) / 64 * 64; }

/* The row maximum as an OpenMP simd max-reduction. gcc vectorises it; clang cannot (the
 * comparison's NaN order forbids its reordering) and, asked to, fails the build under -Werror
 * (-Wpass-failed), so clang gets the plain loop. */
#define SIMD_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define SIMD_MAX(v)
#else
#define SIMD_MAX(v) SIMD_PRAGMA(omp simd reduction(max : v))
#endif

/* ---- fused-form.c ---- */

/* Plans k on the fused strategy with the formulas of km (k's own, or with SqDist expanded for a
 * gemm; with gemm_form, only when a factor of F then comes from a gemm), without compiling or
 * allocating anything: fills fk's form, factors, products' gemm and its tiles before the memory
 * budget shrinks them (S[q]: factor q's inner product). Returns why it cannot, or NULL. */
const char *fused_plan_form(const sr_kernel *k, const sr_kernel *km, int acc, bool gemm_form,
                            struct fused_kernel *fk, const sr_expr **S);
/* Why the fused strategy runs k (explain's first line). */
const char *fused_why(const sr_kernel *k, const struct fused_kernel *fk);
/* Why the fused form fm of k cannot run on the symmetric driver, or NULL; sets the pairs of
 * exchanged arguments in vi, vj and their number in *np. */
const char *fused_sym_form(const sr_kernel *k, const struct fused_form *fm, int *vi, int *vj,
                           int *np);

/* ---- fused-plan.c ---- */

/* The reduced indices per tile of the AVX2 strip products. */
int fused_strip_tj(const struct fused_kernel *fk);
/* The rows of the tiles of F and of inner products for blocks of ti rows. */
int64_t fused_tile_rows(const struct fused_kernel *fk, int64_t ti);
/* The columns of B that BLIS's product takes in a pass of cols. */
int fused_pad_cols(const struct fused_kernel *fk, int cols);
/* Whether each pass's output block and tile of B go through buffers (Cb, Vb). */
bool fused_buffered(const struct fused_kernel *fk);
/* The row stride of a pass's output block and tile of B in their buffers. */
int64_t fused_ld_pass(const struct fused_kernel *fk);
/* One thread's workspace for tiles ti x tj. */
int64_t fused_thread_bytes(const sr_kernel *k, const struct fused_kernel *fk, int ti, int tj);
/* The tiles under the memory budget lim (0: none), from fk's, at least 14 x 16. */
void fused_fit_tiles(const sr_kernel *k, const struct fused_kernel *fk, int64_t lim, int *ti_,
                     int *tj_);
/* Frees fk, its modules, programs and background compile. */
void fused_free(sr_ctx *ctx, struct fused_kernel *fk);

/* ---- fused-run.c: the backend's run members ---- */

sr_status fused_run(const sr_kernel *k, const sr_run_desc *r);
sr_status fused_run_lse(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                        void *lse);
sr_status fused_run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p);
/* The row stride of the symmetric driver's accumulators and padded B. */
int64_t fused_sym_ld(const struct fused_kernel *fk);

/* ---- fused-simd.c ---- */

/* The online softmax's running maximum *wm of a float32 row grown to tm (its output's cols values
 * and sum *wsum rescaled), returning the new maximum; one float32 row F of the tile (n values)
 * through the online softmax, F replaced by exp(F - m) and its sum added to *wsum. */
float fused_grow_max_f32(double *wm, double *wsum, float *orow, int cols, float tm);
void fused_softmax_row_f32(int kern, float *F, int64_t n, double *wm, double *wsum, float *orow,
                           int cols);
#if defined(__x86_64__) && defined(__GNUC__)
/* With AVX2 and FMA (the strip products' kernels only): the largest and smallest of F[c], c < n
 * (a NaN never wins); F[c] = exp(F[c] a - m) and their sum, m finite and at least every F[c] a
 * that is not NaN but for the rounding of one product. */
__attribute__((target("avx2,fma"))) void fused_minmax_avx2(const float *F, int64_t n, float *hi,
                                                           float *lo);
__attribute__((target("avx2,fma"))) double fused_expsum_scaled_avx2(float *F, int64_t n, float a,
                                                                    float m);
#endif

#endif /* SYMRED_CPU_FUSED_H */
