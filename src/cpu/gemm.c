/*
 * gemm.c — the gemm-epilogue strategy: tiles of inner products by symred's AVX-512 gemm or by
 * BLIS, then the generated epilogue folds them into the reduction.
 *
 * When the simplified F depends on the pair (i, j) only through one inner product <x_i, y_j>
 * of an i-variable and a j-variable (a Scalprod, directly or from the simplifier's rewrite
 * SqDist -> SqNorm2 + SqNorm2 - 2 <x, y>), the pair work is a matrix product. Each thread takes
 * a block of TI output rows and walks the reduced range in tiles of TJ indices: the gemm computes
 * the TI x TJ tile of inner products into a per-thread buffer, and the JIT
 * module of the same formula, emitted with the inner product read from that tile instead of
 * computed (jit_plan.gemm, see emit-c.c), evaluates the rest of F with its hoisted row and
 * column terms and folds the tile into the reduction states with the module's own sr_part,
 * sr_merge and sr_final, so every reduction the direct strategy supports (Sum, Min/ArgMin,
 * KMin/ArgKMin, LogSumExp, SumSoftMaxWeight, ...) works here too, with the same tie rules. The
 * n x m matrix is never built. The K-min selections keep a few more candidates than asked
 * and rank them again by F as given (below, "ranking the candidates again"): the tile's SqDist
 * is an expansion whose rounding can swap near ties.
 *
 * The gemm (SYMRED_GEMM_KERNEL=auto|avx512|blis): where the CPU has AVX-512F, symred's own
 * (gemm-avx512.c: the rows packed once per row block, 14 x 32 micro-kernel; docs/avx512-gemm.md),
 * which needs no BLIS; otherwise, or with SYMRED_GEMM_KERNEL=blis, BLIS.
 *
 * BLIS is loaded with dlopen at first use (behind pthread_once): the library builds and runs
 * without it and then, without AVX-512, uses the direct strategy. SYMRED_GEMM=off forces the direct
 * strategy, SYMRED_GEMM=on uses the gemm path whenever the formula allows it (tests), auto
 * (default) when the dimension reaches the measured threshold below. BLIS runs single-threaded
 * inside our OpenMP threads (bli_thread_set_num_threads(1)), so there is no oversubscription.
 *
 * BLIS configuration. Debian's BLIS 0.9.0 picks its sub-configuration from cpuid at bli_init:
 * on Intel AVX-512 VMs `haswell` (where `skx` measured 114 vs 67 GFLOP/s on one thread), on
 * this AMD EPYC AVX-512 VM `zen3`, which measured 98 GFLOP/s on one idle core for our tile
 * shape, as fast as OpenBLAS 0.3.21's AVX-512 (Cooperlake) kernels (94-95). The only way to
 * choose another is the BLIS_ARCH_TYPE variable read at bli_init, and in this BLIS build *any*
 * value of it (skx = 0, zen3 = 6, even the auto-detected one, or a name) aborts the process in
 * bli_arch.c ("Accessed uninitialized context in gks"), measured here. So symred never sets
 * it; when the user has set it and the loaded BLIS is 0.9.0, BLIS is not used at all (a library
 * must not abort its host) and explain says why. A BLIS of another version gets the user's
 * value, respected as it is.
 */
#include "../formulas/formulas.h"
#include "../jit/jit.h"
#include "cpu.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The crossover (SR_GEMM_MIN_DIM) is measured and explained in core.h. */
#define GEMM_MIN_DIM SR_GEMM_MIN_DIM

/* ---- BLIS, loaded at run time ---------------------------------------------------------- */

typedef int64_t blis_dim; /* dim_t and inc_t of Debian's BLIS (BLIS_INT_TYPE_SIZE 64) */
typedef void (*blis_gemm_fn)(int transa, int transb, blis_dim m, blis_dim n, blis_dim k,
                             const void *alpha, const void *a, blis_dim rsa, blis_dim csa,
                             const void *b, blis_dim rsb, blis_dim csb, const void *beta, void *c,
                             blis_dim rsc, blis_dim csc);

static struct {
    void *handle;
    blis_gemm_fn sgemm, dgemm;
    char version[32], arch[32];
    char why[256]; /* why BLIS is not used, "" when it is */
} blis;
static pthread_once_t blis_once = PTHREAD_ONCE_INIT;

static void blis_load(void)
{
    static const char *const names[] = {"libblis.so.4", "libblis.so"};
    const char *user = getenv("SYMRED_BLIS_LIB");
    void *h = NULL;
    if (user && *user)
        h = dlopen(user, RTLD_NOW | RTLD_LOCAL);
    for (size_t t = 0; !h && t < sizeof names / sizeof *names; t++)
        h = dlopen(names[t], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(blis.why, sizeof blis.why, "BLIS not found (libblis.so.4: %s)", dlerror());
        return;
    }
    void (*init)(void) = (void (*)(void))dlsym(h, "bli_init");
    void (*set_threads)(blis_dim) = (void (*)(blis_dim))dlsym(h, "bli_thread_set_num_threads");
    int (*query_arch)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    char *(*arch_string)(int) = (char *(*)(int))dlsym(h, "bli_arch_string");
    char *(*version)(void) = (char *(*)(void))dlsym(h, "bli_info_get_version_str");
    blis.sgemm = (blis_gemm_fn)dlsym(h, "bli_sgemm");
    blis.dgemm = (blis_gemm_fn)dlsym(h, "bli_dgemm");
    if (!init || !set_threads || !blis.sgemm || !blis.dgemm || !version) {
        snprintf(blis.why, sizeof blis.why, "the loaded BLIS lacks the typed gemm API");
        dlclose(h);
        return;
    }
    snprintf(blis.version, sizeof blis.version, "%s", version());
    const char *arch_env = getenv("BLIS_ARCH_TYPE");
    if (arch_env && *arch_env && strncmp(blis.version, "0.9.0", 5) == 0) {
        /* See the top of the file: this BLIS aborts on any BLIS_ARCH_TYPE. */
        snprintf(blis.why, sizeof blis.why,
                 "BLIS_ARCH_TYPE=%.40s is set and BLIS %s aborts on it; unset it to use BLIS",
                 arch_env, blis.version);
        dlclose(h);
        return;
    }
    init();
    /* One BLIS thread per OpenMP thread of ours: no oversubscription. */
    set_threads(1);
    if (query_arch && arch_string)
        snprintf(blis.arch, sizeof blis.arch, "%s", arch_string(query_arch()));
    blis.handle = h;
}

/* Whether BLIS can be used; else the reason in *why. */
static bool blis_ready(const char **why)
{
    pthread_once(&blis_once, blis_load);
    *why = blis.why;
    return blis.handle != NULL;
}

bool cpu_blis_usable(const char **why)
{
    const char *w;
    return blis_ready(why ? why : &w);
}

const char *cpu_blis_arch(void) { return blis.arch; }

void cpu_blis_gemm(int f64, int64_t m, int64_t n, int64_t K, const void *A, int64_t rsa,
                   int64_t csa, const void *B, int64_t rsb, int64_t csb, int beta, void *C,
                   int64_t ldc)
{
    static const float onef = 1, zerof = 0;
    static const double oned = 1, zerod = 0;
    if (f64)
        blis.dgemm(0, 0, m, n, K, &oned, A, rsa, csa, B, rsb, csb, beta ? &oned : &zerod, C, ldc,
                   1);
    else
        blis.sgemm(0, 0, m, n, K, &onef, A, rsa, csa, B, rsb, csb, beta ? &onef : &zerof, C, ldc,
                   1);
}

/* ---- planning ------------------------------------------------------------------------------ */

struct gemm_kernel {
    struct jit_module *m;
    struct jit_plan plan;
    struct jit_load_info info;
    const sr_expr *node; /* the inner product */
    int va, vb;          /* its operands' argument indices: output-axis and reduced-axis variable */
    int dim;             /* their dimension */
    int ti, tj;          /* tile: ti output rows x tj reduced indices */
    int64_t per_thread;  /* bytes: inner-product tile, a block of states, packing, module */
    int acc;
    int mode;  /* SYMRED_GEMM: 0 auto, 1 on, 2 off */
    int kern;  /* the tile's gemm: KERN_AVX512 or KERN_BLIS */
    int asked; /* SYMRED_GEMM_KERNEL: 0 auto, 1 avx512, 2 blis */
    /* Exact selection (see "ranking the candidates again" below): kc > 0 when m keeps the kc
     * smallest values of each row as KMin_ArgKMin and mr, the direct strategy's module of F as
     * given, ranks them again; rdims: the dimensions of the reduced-axis variables, summed. */
    int kc, rdims;
    struct jit_module *mr;
    struct jit_load_info rinfo;
    struct jit_plan rplan;
    const char *no_refine; /* why a selection is not ranked again, NULL otherwise */
    /* Tier 0: the tile interpreter's epilogue t, on the same gemm tiles, of kernel kt (k in the
     * gemm form, a selection widened to kc candidates), and tr, which ranks the candidates again
     * for kr (F as given). They serve the calls until bg, the background compile of m (and
     * mr), has them ready, or always where nothing compiles (m and bg NULL). */
    sr_kernel kt, kr;
    struct tile_prog *t, *tr;
    struct cpu_bg *bg;
};

enum { KERN_AVX512, KERN_BLIS };

/* *epi counts the epilogue's work (cpu.h). */
const sr_expr *cpu_gemm_find_node(const sr_kernel *k, int *va, int *vb, double *epi)
{
    unsigned outer = k->axis == 1 ? DEP_I : DEP_J, inner = k->axis == 1 ? DEP_J : DEP_I;
    const sr_expr *roots[2] = {k->f, k->weight}, *S = NULL;
    *epi = 0;
    for (int r = 0; r < 2; r++) {
        if (!roots[r])
            continue;
        size_t n = expr_toposort(roots[r], NULL, 0);
        const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
        if (!order)
            return NULL;
        expr_toposort(roots[r], order, n);
        bool ok = true;
        for (size_t t = 0; t < n && ok; t++) {
            const sr_expr *e = order[t];
            if (!((e->deps & outer) && (e->deps & inner)))
                continue;
            if (e->op == OP_SCALPROD && e->child[0]->op == OP_VAR && e->child[1]->op == OP_VAR) {
                const sr_expr *a = e->child[0], *b = e->child[1];
                if (b->deps & outer) {
                    const sr_expr *s = a;
                    a = b;
                    b = s;
                }
                if (S && S != e) {
                    ok = false; /* a second inner product: not one gemm */
                } else if (!S) {
                    S = e;
                    *va = (int)a->iattr[0];
                    *vb = (int)b->iattr[0];
                }
                continue;
            }
            *epi += simp_op_flops(e); /* nodes shared with F count twice: an upper bound */
        }
        free(order);
        if (!ok)
            return NULL;
    }
    return S;
}

/* The packed panels of one gemm call: symred's AVX-512 gemm packs the ti output rows once per
 * row block and a tj x KC block of the reduced side per call, into the thread's buffer; BLIS
 * packs into its own (it reserves more address space than it touches). */
static int64_t pack_bytes(const struct gemm_kernel *g, int ti, int tj, int64_t es)
{
    if (g->kern == KERN_AVX512)
        return cpu_avx512_pack_a_bytes(ti, g->dim, es == 8) +
               cpu_avx512_pack_b_bytes(tj, g->dim, es == 8);
    int64_t kc = g->dim < 512 ? g->dim : 512;
    return ((int64_t)ti + tj + 32) * kc * es + (64 << 10);
}

/* The scratch of ranking the candidates again (finish): ti rows of kc values and indices,
 * then per row the gathered reduced-axis rows, F at them and the sort keys; the direct
 * module's own tile. 0 without it. */
static int64_t refine_bytes(const struct gemm_kernel *g, int ti, int64_t es)
{
    if (!g->kc)
        return 0;
    int64_t ranker = g->tr ? cpu_tile_frame_bytes(g->tr, 1) + cpu_tile_state_bytes(g->tr) : 0;
    if (g->rplan.workspace_bytes > ranker)
        ranker = g->rplan.workspace_bytes;
    return (int64_t)ti * g->kc * (es + 8) + (int64_t)g->kc * (g->rdims * es + es + 16) + ranker;
}

/* One thread's bytes: the tile of inner products, a block of row states, the packed operands,
 * the epilogue's own buffers (the generated module's, or the tile interpreter's frame, the larger
 * where both may run), and the ranking's. */
static int64_t thread_bytes(const struct gemm_kernel *g, int ti, int tj, int64_t es, int64_t sb)
{
    int64_t epi = g->plan.workspace_bytes;
    if (g->t) {
        int64_t tsb = cpu_tile_state_bytes(g->t);
        if (tsb > sb)
            sb = tsb;
        if (cpu_tile_frame_bytes(g->t, ti) > epi)
            epi = cpu_tile_frame_bytes(g->t, ti);
    }
    return (int64_t)ti * tj * es + (int64_t)ti * sb + pack_bytes(g, ti, tj, es) + epi +
           refine_bytes(g, ti, es);
}

/* The tile's gemm for SYMRED_GEMM_KERNEL=asked: symred's AVX-512 one where the CPU has AVX-512
 * (auto or avx512), else BLIS; -1 when that is BLIS and it cannot be loaded. */
static int choose_kernel(int asked)
{
    const char *why;
    if (asked != 2 && cpu_avx512_usable())
        return KERN_AVX512;
    return blis_ready(&why) ? KERN_BLIS : -1;
}

/* The tile of inner products before the memory budget shrinks it (the measurements are at
 * cpu_gemm_prepare's use). */
static void gemm_tiles(sr_dtype dtype, int *ti, int *tj)
{
    *ti = dtype == SR_F64 ? 256 : 1024;
    *tj = dtype == SR_F64 ? 1024 : 512;
}

sr_status cpu_gemm_kernel(sr_ctx *ctx, int *kern, bool *forced_blis)
{
    *kern = ctx->opt.gemm == 2 ? -1 : choose_kernel(ctx->opt.gemm_kernel);
    if (forced_blis)
        *forced_blis = ctx->opt.gemm_kernel == 2;
    return SR_OK;
}

/* The selections whose candidates are ranked again: the K-min family of a scalar F, which
 * orders NaN last, as the candidates list does. Min and ArgMin propagate a NaN (the first one
 * wins), which a list of the smallest values cannot hold: they are not ranked (ArgKMin with
 * K = 1 is). */
static bool refinable(const sr_kernel *k)
{
    return sr_reductions[k->red].family == SR_RED_FAM_KSEL && k->fdim == 1 && !k->weight;
}

/* Whether argument v is a variable of the reduced axis (gathered for the ranking). */
static bool reduced_var(const sr_kernel *k, int v)
{
    return k->vars[v].dim && k->vars[v].cat == (k->axis == 1 ? SR_CAT_J : SR_CAT_I);
}

/* How many candidates the gemm pass keeps for a selection of K: K/2 more, at least 4 and at
 * most 16 more. Each costs the epilogue about 0.6 % at D = 100 (ArgKMin K = 10, 10 000 x
 * 100 000 float32: 4 more 3 %, 10 more 7 %, 22 more 14 %; ranking the candidates 1 %). */
static int candidates(int K) { return K + (K < 8 ? 4 : K > 32 ? 16 : K / 2); }

/* The ranking of the candidates again: F as the user gave it, by the direct strategy's module
 * (compiled now for CPU_COMPILE_NOW, its source left in *rsrc for CPU_COMPILE_BACKGROUND) and,
 * unless synchronous, by the tile interpreter (g->tr). SR_OK with g->kc 0 and g->no_refine set when
 * it cannot be had. */
static sr_status refine_prepare(sr_kernel *k, struct gemm_kernel *g, int64_t lim,
                                enum cpu_compile tier, struct expr_buf *rsrc)
{
    sr_kernel tr = *k;
    tr.f = k->simp.f_user ? k->simp.f_user : k->f;
    sr_status st = SR_OK;
    if (tier != CPU_COMPILE_NEVER) {
        memset(&g->rplan, 0, sizeof g->rplan);
        g->rplan.ws_limit = lim > 0 ? lim / 4 : 0;
        g->rplan.tile_j_max = candidates(k->k);
        st = jit_emit_c(&tr, (enum jit_acc)g->acc, rsrc, &g->rplan);
        if (st == SR_OK && rsrc->oom)
            st = SR_ENOMEM;
    }
    if (st == SR_OK && tier == CPU_COMPILE_NOW) {
        st = jit_module_get(k->ctx, rsrc->data, rsrc->len, &g->mr, &g->rinfo);
        free(rsrc->data);
        rsrc->data = NULL;
        if (st == SR_OK && !g->mr->block) {
            jit_module_release(k->ctx, g->mr);
            g->mr = NULL;
            st = SR_ENOTSUP;
        }
    }
    if (st == SR_ENOTSUP || st == SR_ENODEV) {
        free(rsrc->data);
        rsrc->data = NULL;
        g->no_refine = "F as given is too large for the direct strategy";
        return SR_OK;
    }
    if (st != SR_OK) {
        free(rsrc->data);
        rsrc->data = NULL;
        return st == SR_ENOMEM ? sr__error(k->ctx, st, "gemm-epilogue: out of memory") : st;
    }
    g->kc = candidates(k->k);
    for (int v = 0; v < k->nargs; v++)
        if (reduced_var(k, v))
            g->rdims += k->vars[v].dim;
    if (tier != CPU_COMPILE_NOW) {
        g->kr = tr;
        st = cpu_tile_new_ext(&g->kr, NULL, g->kc, &g->tr);
        if (st != SR_OK) {
            free(rsrc->data);
            rsrc->data = NULL;
        }
    }
    return st;
}

static void gemm_free(sr_ctx *ctx, struct gemm_kernel *g)
{
    if (g->m)
        jit_module_release(ctx, g->m);
    if (g->mr)
        jit_module_release(ctx, g->mr);
    cpu_bg_release(ctx, g->bg);
    cpu_tile_free(g->t);
    cpu_tile_free(g->tr);
    free(g);
}

const sr_kernel *cpu_gemm_form(const sr_kernel *k, sr_kernel *kx)
{
    if (!k->simp.f_gemm)
        return k;
    *kx = *k;
    kx->f = k->simp.f_gemm;
    kx->weight = k->simp.weight_gemm;
    return kx;
}

sr_status cpu_gemm_prepare(sr_kernel *k, int acc, enum cpu_compile tier)
{
    sr_ctx *ctx = k->ctx;
    /* The context's SYMRED_GEMM, SYMRED_GEMM_KERNEL and SYMRED_GEMM_REFINE options. */
    int mode = ctx->opt.gemm, asked = ctx->opt.gemm_kernel, refine = ctx->opt.gemm_refine;
    sr_status st;
    int va = -1, vb = -1;
    double epi = 0;
    /* The formula with SqDist expanded into norms and an inner product, when the simplifier
     * found one: the selections rank their candidates again exactly (refine_prepare). */
    sr_kernel kx;
    const sr_expr *S = mode == 2 ? NULL : cpu_gemm_find_node(cpu_gemm_form(k, &kx), &va, &vb, &epi);
    if (!S)
        return SR_ENOTSUP;
    int dim = S->child[0]->dim;
    /* The cost model: the gemm does 2 dim flops per pair at BLIS speed; the epilogue's pair
     * work must stay small beside it, and dim must reach the measured crossover. */
    if (mode == 0 && (dim < GEMM_MIN_DIM || epi > dim))
        return SR_ENOTSUP;
    int kern = choose_kernel(asked);
    if (kern < 0)
        return SR_ENOTSUP;

    struct gemm_kernel *g = calloc(1, sizeof *g);
    if (!g)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    g->node = S;
    g->va = va;
    g->vb = vb;
    g->dim = dim;
    g->acc = acc;
    g->mode = mode;
    g->kern = kern;
    g->asked = asked;
    int64_t es = (int64_t)sr_dtype_size(k->dtype);
    int64_t lim = k->budget;
    struct expr_buf src[CPU_BG_MAX] = {{0}};
    /* A selection: the gemm pass keeps kc candidates per row (kernel kk), ranked again. */
    sr_kernel kk = *cpu_gemm_form(k, &kx);
    if (refinable(k) && refine == 0) {
        st = refine_prepare(k, g, lim, tier, &src[1]);
        if (st != SR_OK) {
            gemm_free(ctx, g);
            return st;
        }
        if (g->kc) {
            kk.red = SR_KMIN_ARGKMIN;
            kk.k = g->kc;
            kk.out_dim = g->kc;
        }
    } else if (refinable(k)) {
        g->no_refine = "SYMRED_GEMM_REFINE=off";
    }
    /* Tier 0's epilogue: the tile interpreter reads the inner product from the gemm's tile. */
    if (tier != CPU_COMPILE_NOW) {
        g->kt = kk;
        st = cpu_tile_new_ext(&g->kt, S, 0, &g->t);
        if (st != SR_OK) {
            free(src[1].data);
            gemm_free(ctx, g);
            return st;
        }
    }
    /* The tile of inner products: 2 MiB, 1024 x 512 float32 (256 x 1024 float64). Measured on
     * Fashion-MNIST kNN (ArgKMin k = 10, 10 000 x 60 000, D = 784, 2 threads, one run each
     * under load, the states kept across tiles): ti x tj = 512x1024 7.9 s, 512x512 6.2 s,
     * 768x512 5.9 s, 1024x1024 6.1 s, 1024x768 5.7 s, 1024x256 7.9 s, 1536x512 5.7 s,
     * 2048x1024 6.0 s, 2048x512 5.8 s, 1024x512 5.4-5.5 s. Many rows per call amortise BLIS's
     * packing of the reduced-side panel; the epilogue reads the tile once, so it need not stay
     * in L2. (Before the states were kept across tiles, 1152 x 60 000 favoured 512x1024 over
     * 256x512, 576x512, 288x1024 and 144x2048; float64 keeps that shape.) */
    gemm_tiles(k->dtype, &g->ti, &g->tj);
    for (;;) {
        memset(&g->plan, 0, sizeof g->plan);
        g->plan.gemm = S;
        g->plan.gemm_arg = k->nargs;
        g->plan.gemm_ld = g->tj;
        g->plan.gemm_rows = g->ti;
        g->plan.ws_limit = lim > 0 ? lim / 4 : 0;
        st = tier == CPU_COMPILE_NEVER ? SR_OK
                                       : jit_emit_c(&kk, (enum jit_acc)acc, &src[0], &g->plan);
        if (st == SR_OK && src[0].oom)
            st = SR_ENOMEM;
        if (st != SR_OK) {
            free(src[0].data);
            free(src[1].data);
            gemm_free(k->ctx, g);
            return st == SR_ENOTSUP ? SR_ENOTSUP
                                    : sr__error(ctx, st, "gemm-epilogue: cannot emit the epilogue");
        }
        int64_t sb = g->plan.state_bytes;
        /* Shrink the tiles under the budget: rows first, then the reduced tile. */
        while (lim > 0 && thread_bytes(g, g->ti, g->tj, es, sb) > lim &&
               (g->ti > 8 || g->tj > 16)) {
            if (g->ti > 8)
                g->ti /= 2;
            else
                g->tj /= 2;
        }
        if (tier != CPU_COMPILE_NEVER && (g->plan.gemm_ld != g->tj || g->plan.gemm_rows != g->ti)) {
            free(src[0].data); /* the leading dimension is compiled in: emit again */
            src[0] = (struct expr_buf){0};
            continue;
        }
        g->per_thread = thread_bytes(g, g->ti, g->tj, es, sb);
        if (lim > 0 && g->per_thread > lim) {
            /* The direct strategy may need less: let it try (and fail with SR_EBUDGET). */
            free(src[0].data);
            free(src[1].data);
            gemm_free(k->ctx, g);
            return SR_ENOTSUP;
        }
        break;
    }
    st = SR_OK;
    if (tier == CPU_COMPILE_BACKGROUND) {
        /* Tier 0 serves the calls while the modules compile; should no thread start, they
         * compile now. */
        if (cpu_bg_start(ctx, src, g->kc ? 2 : 1, &g->bg) != SR_OK)
            tier = CPU_COMPILE_NOW;
    }
    if (tier == CPU_COMPILE_NOW && g->kc && !g->mr) {
        st = jit_module_get(ctx, src[1].data, src[1].len, &g->mr, &g->rinfo);
        if (st == SR_OK && !g->mr->block)
            st = SR_ENOTSUP;
    }
    if (tier == CPU_COMPILE_NOW && st == SR_OK)
        st = jit_module_get(ctx, src[0].data, src[0].len, &g->m, &g->info);
    free(src[0].data);
    free(src[1].data);
    if (st != SR_OK) {
        gemm_free(k->ctx, g);
        return st == SR_ENODEV ? SR_ENOTSUP : st;
    }
    sr__simp_take_gemm_form(k);
    k->backend_data = g;
    return SR_OK;
}

/* A row state's bytes: the module's, or the tile interpreter's where it may run, the larger. */
static int64_t state_bytes(const struct gemm_kernel *g)
{
    int64_t sb = g->plan.state_bytes, tsb = g->t ? cpu_tile_state_bytes(g->t) : 0;
    return sb > tsb ? sb : tsb;
}

static int64_t gemm_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    const struct gemm_kernel *g = k->backend_data;
    int nt = sr__threads(k->ctx, g->per_thread);
    if (per_thread)
        *per_thread = g->per_thread;
    if (threads)
        *threads = nt;
    /* The split of the reduced range (fewer row blocks than threads) adds partial states for
     * up to nt * ti rows per thread when the budget allows it. */
    int64_t split = (int64_t)nt * g->ti * state_bytes(g);
    int64_t total = (int64_t)nt * g->per_thread;
    int64_t lim = sr__call_budget(k);
    if (nt > 1 && (lim <= 0 || total + (int64_t)nt * split <= lim))
        total += (int64_t)nt * split;
    return total;
}

/* ---- run ----------------------------------------------------------------------------------- */

/* One call: its tier (the modules, or NULL while the tile interpreter's epilogue serves), chosen
 * once so that the whole call runs one tier, and the row state's bytes on it. */
struct gemm_call {
    const sr_kernel *k;
    const struct gemm_kernel *g;
    const sr_run_desc *r;
    int64_t nred;
    const struct jit_module *m, *mr;
    int64_t sb;
};

static struct gemm_call call_new(const sr_kernel *k, const sr_run_desc *r, int64_t nred)
{
    const struct gemm_kernel *g = k->backend_data;
    struct gemm_call c = {k, g, r, nred, g->m, g->mr, 0};
    if (!c.m && g->bg) {
        c.m = cpu_bg_module(g->bg, 0);
        c.mr = c.m && g->kc ? cpu_bg_module(g->bg, 1) : NULL;
    }
    c.sb = c.m ? c.m->state_bytes : cpu_tile_state_bytes(g->t);
    return c;
}

/* Folds reduced indices [r0, r1) into the states of output rows [o0, o1) (st), initialising
 * them first. G: the thread's tile; args: nargs + 2 pointers, the last one the thread's init
 * flag. Every tile after the first folds into the same states (the module's init flag, see
 * jit.h): no scratch states, no merge, and the K-reductions keep their K-th value as a
 * rejection threshold across the tiles. */
static int fold(const struct gemm_call *c, int64_t o0, int64_t o1, const int64_t *iv, int64_t niv,
                void *G, void *st, const void **args, char *pack, struct tile_frame *tf)
{
    const struct gemm_kernel *g = c->g;
    const sr_kernel *k = c->k;
    int64_t es = (int64_t)sr_dtype_size(k->dtype), D = g->dim;
    const char *A = (const char *)c->r->args[g->va] + o0 * D * es;
    int *init = (int *)args[k->nargs + 1];
    *init = 1;
    args[k->nargs] = G;
    int64_t total = 0;
    for (int64_t q = 0; q < niv; q++)
        total += iv[2 * q + 1] - iv[2 * q];
    if (!c->m)
        cpu_tile_begin(tf, st, o0, o1 - o0, true);
    if (total == 0)
        return c->m ? c->m->part(o0, o1, 0, 0, args, st) : 0; /* initialise only */
    /* symred's AVX-512 gemm: the rows are packed once for all the tiles. */
    char *bpack = NULL;
    if (g->kern == KERN_AVX512) {
        bpack = pack + cpu_avx512_pack_a_bytes(g->ti, D, es == 8);
        cpu_avx512_pack_a(es == 8, o1 - o0, D, A, pack);
    }
    static const float onef = 1, zerof = 0;
    static const double oned = 1, zerod = 0;
    int first = 1;
    for (int64_t q = 0; q < niv; q++)
        for (int64_t rt = iv[2 * q], r1 = iv[2 * q + 1]; rt < r1; rt += g->tj) {
            int64_t nj = r1 - rt < g->tj ? r1 - rt : g->tj;
            const char *B = (const char *)c->r->args[g->vb] + rt * D * es;
            /* G (o1-o0 x nj, row stride tj) = A (o1-o0 x D) B^T, B stored nj x D row-major. */
            if (g->kern == KERN_AVX512)
                cpu_avx512_gemm(es == 8, o1 - o0, nj, D, pack, B, bpack, G, g->tj);
            else if (k->dtype == SR_F64)
                blis.dgemm(0, 0, o1 - o0, nj, D, &oned, A, D, 1, B, 1, D, &zerod, G, g->tj, 1);
            else
                blis.sgemm(0, 0, o1 - o0, nj, D, &onef, A, D, 1, B, 1, D, &zerof, G, g->tj, 1);
            if (!c->m) {
                cpu_tile_fold(tf, st, rt, nj, G, g->tj);
                continue;
            }
            *init = first;
            first = 0;
            if (c->m->part(o0, o1, rt, rt + nj, args, st))
                return 1;
        }
    return 0;
}

/* ---- ranking the candidates again ------------------------------------------------------------
 *
 * The gemm pass computes F from the tile's inner products, and for SqDist that is the expansion
 * |x|^2 + |y|^2 - 2 <x, y>: its rounding error is relative to the norms, not to the distance, so
 * in float32 two neighbours whose distances differ by 1e-5 relative may come out in the wrong
 * order (Fashion-MNIST cosine kNN, docs/exla.md). For KMin and ArgKMin the pass therefore keeps
 * kc > K candidates per row (KMin_ArgKMin), and finish computes F as the user gave it at those
 * pairs with the direct strategy's module (sr_block on the candidates' reduced-axis rows,
 * gathered) and keeps the K smallest, in the direct strategy's order: increasing value, NaN
 * last, equal values by index. Exact unless more than kc - K pairs lie within the expansion's
 * rounding error of the K-th value. */

struct cand {
    double v;
    int64_t i;
};

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    bool na = a->v != a->v, nb = b->v != b->v;
    if (na != nb)
        return na ? 1 : -1;
    if (!na && a->v != b->v)
        return a->v < b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Points the reduced-axis variables of args at panels, which this fills with the rows ci[0 .. nc)
 * of each. */
static void gather(const struct gemm_call *c, const int64_t *ci, int nc, const void **args,
                   char *panels)
{
    const sr_kernel *k = c->k;
    int64_t es = (int64_t)sr_dtype_size(k->dtype);
    char *p = panels;
    for (int v = 0; v < k->nargs; v++) {
        if (!reduced_var(k, v))
            continue;
        size_t row = (size_t)(k->vars[v].dim * es);
        for (int q = 0; q < nc; q++)
            memcpy(p + q * row, (const char *)c->r->args[v] + (size_t)ci[q] * row, row);
        args[v] = p;
        p += nc * row;
    }
}

static int index_cmp(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

/* rank_row on tier 0: the tile interpreter's program of F as given (frame rf over args, state
 * rst) selects among the candidates, taken in index order so that its ties by position are ties
 * by index. */
static void rank_row0(const struct gemm_call *c, int64_t o, int64_t *ci, int nc, const void **args,
                      char *panels, struct tile_frame *rf, void *rst)
{
    const sr_kernel *k = c->k;
    qsort(ci, (size_t)nc, sizeof *ci, index_cmp);
    gather(c, ci, nc, args, panels);
    cpu_tile_begin(rf, rst, o, 1, true);
    cpu_tile_fold(rf, rst, 0, nc, NULL, 0);
    int64_t *oi = sr_reductions[k->red].indices ? c->r->out_idx : NULL;
    cpu_tile_final(rf, rst, 1, c->r->out, oi, o);
    for (int q = 0; oi && q < k->k; q++)
        if (oi[o * k->k + q] >= 0)
            oi[o * k->k + q] = ci[oi[o * k->k + q]];
}

/* Row o's outputs from its nc candidates (indices ci, all >= 0): F at them through the direct
 * module, the K smallest written. args: the kernel's arguments with the reduced-axis variables
 * pointing at panels, which this fills. */
static int rank_row(const struct gemm_call *c, int64_t o, const int64_t *ci, int nc,
                    const void **args, char *panels, void *fv, struct cand *cd)
{
    const sr_kernel *k = c->k;
    gather(c, ci, nc, args, panels);
    if (nc && c->mr->block(o, o + 1, 0, nc, args, fv, nc, 1))
        return 1;
    for (int q = 0; q < nc; q++) {
        cd[q].v = k->dtype == SR_F64 ? ((const double *)fv)[q] : ((const float *)fv)[q];
        cd[q].i = ci[q];
    }
    qsort(cd, (size_t)nc, sizeof *cd, cand_cmp);
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    for (int q = 0; q < k->k; q++) {
        double v = q < nc ? cd[q].v : HUGE_VAL;
        if (ri->values) {
            if (k->dtype == SR_F64)
                ((double *)c->r->out)[o * k->k + q] = v;
            else
                ((float *)c->r->out)[o * k->k + q] = (float)v;
        }
        if (ri->indices)
            c->r->out_idx[o * k->k + q] = q < nc ? cd[q].i : -1;
    }
    return 0;
}

/* Writes the outputs of rows [o0, o1) from their states st (one per row): the module's final,
 * or, for a selection with candidates, each row ranked again (rows in chunks of ti). */
static int finish(const struct gemm_call *c, const void *st, int64_t o0, int64_t o1,
                  struct tile_frame *tf)
{
    const struct gemm_kernel *g = c->g;
    const sr_kernel *k = c->k;
    if (!g->kc) {
        if (c->m)
            c->m->final(st, o0, o1, c->r->out, c->r->out_idx);
        else
            cpu_tile_final(tf, st, o1 - o0, c->r->out, c->r->out_idx, o0);
        return 0;
    }
    int64_t es = (int64_t)sr_dtype_size(k->dtype), kc = g->kc;
    int64_t rows = o1 - o0 < g->ti ? o1 - o0 : g->ti;
    char *buf = malloc((size_t)(rows * kc * (es + 8) + kc * (g->rdims * es + es) + 64));
    struct cand *cd = malloc((size_t)kc * sizeof *cd);
    const void **args = malloc((size_t)(k->nargs ? k->nargs : 1) * sizeof *args);
    int failed = !buf || !cd || !args;
    for (int v = 0; !failed && v < k->nargs; v++)
        args[v] = c->r->args[v];
    /* Tier 0 ranks with the tile interpreter: its frame reads args, its state is rst. */
    struct tile_frame *rf = NULL;
    void *rst = NULL;
    if (!failed && !c->m) {
        rf = cpu_tile_frame_new(&g->kr, g->tr, args, 1);
        rst = malloc((size_t)cpu_tile_state_bytes(g->tr));
        failed = !rf || !rst;
    }
    if (!failed) {
        int64_t *ci = (int64_t *)buf;
        char *cv = buf + rows * kc * 8, *fv = cv + rows * kc * es, *panels = fv + kc * es;
        for (int64_t a = o0; a < o1 && !failed; a += rows) {
            int64_t b = a + rows < o1 ? a + rows : o1;
            const char *sa = (const char *)st + (a - o0) * c->sb;
            if (c->m)
                c->m->final(sa, 0, b - a, cv, ci);
            else
                cpu_tile_final(tf, sa, b - a, cv, ci, 0);
            for (int64_t o = a; o < b && !failed; o++) {
                int64_t *row = ci + (o - a) * kc;
                int nc = 0;
                for (int q = 0; q < kc; q++)
                    if (row[q] >= 0)
                        row[nc++] = row[q];
                if (c->m)
                    failed = rank_row(c, o, row, nc, args, panels, fv, cd);
                else
                    rank_row0(c, o, row, nc, args, panels, rf, rst);
            }
        }
    }
    cpu_tile_frame_free(rf);
    free(rst);
    free(buf);
    free(cd);
    free(args);
    return failed;
}

/* One thread's buffers: the gemm tile, a block of row states, the packing room (one
 * allocation, returned), and the argument array with the tile and init-flag slots. */
static char *thread_buffers(const struct gemm_call *c, const void ***args_out,
                            struct tile_frame **tf)
{
    const sr_kernel *k = c->k;
    const struct gemm_kernel *g = c->g;
    const sr_run_desc *r = c->r;
    int64_t es = (int64_t)sr_dtype_size(k->dtype), sb = c->sb;
    size_t gbytes = (size_t)(g->ti * g->tj * es), sbytes = (size_t)(g->ti * sb);
    size_t pbytes = g->kern == KERN_AVX512 ? (size_t)pack_bytes(g, g->ti, g->tj, es) : 0;
    char *buf = malloc(gbytes + sbytes + pbytes + 64);
    const void **args = malloc(((size_t)k->nargs + 2) * sizeof *args);
    *tf = c->m ? NULL : cpu_tile_frame_new(&g->kt, g->t, r->args, g->ti);
    if (!buf || !args || (!c->m && !*tf)) {
        free(buf);
        free(args);
        cpu_tile_frame_free(*tf);
        *tf = NULL;
        return NULL;
    }
    for (int v = 0; v < k->nargs; v++)
        args[v] = r->args[v];
    *args_out = args;
    return buf;
}

static sr_status gemm_run(const sr_kernel *k, const sr_run_desc *r)
{
    const struct gemm_kernel *g = k->backend_data;
    int64_t nout = k->axis == 1 ? r->nx : r->ny;
    int64_t nred = k->axis == 1 ? r->ny : r->nx;
    int nt = sr__threads(k->ctx, g->per_thread);
    struct gemm_call c = call_new(k, r, nred);
    int64_t es = (int64_t)sr_dtype_size(k->dtype), sb = c.sb;
    /* Row blocks of at most ti rows, as many as a multiple of the threads and all of one
     * size, so that no thread idles while the other finishes a last block (10 000 queries in
     * blocks of 512 would make 20 blocks, the last one of 272 rows). */
    int64_t nblocks = (nout + g->ti - 1) / g->ti;
    if (nblocks > nt)
        nblocks = (nblocks + nt - 1) / nt * nt;
    int64_t ti = (nout + nblocks - 1) / nblocks;
    nblocks = (nout + ti - 1) / ti;
    int64_t lim = sr__call_budget(k);
    /* Few row blocks: split the reduced range over the threads too, when the partial states of
     * every row fit in the budget. */
    int nsplit = 1;
    if (nblocks < nt && nred >= 4 * (int64_t)g->tj * nt &&
        (lim <= 0 || (int64_t)nt * (g->per_thread + nout * sb) <= lim))
        nsplit = nt;
    char *partial = NULL;
    if (nsplit > 1) {
        partial = malloc((size_t)(nout * sb) * (size_t)nsplit);
        if (!partial)
            return sr__error(k->ctx, SR_ENOMEM, "gemm-epilogue: out of memory for partial states");
    }
    int failed = 0;
    int64_t nitems = nblocks * nsplit, slice = (nred + nsplit - 1) / nsplit;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && nitems > 1)
#endif
    {
        size_t gbytes = (size_t)(g->ti * g->tj * es), sbytes = (size_t)(g->ti * sb);
        const void **args = NULL;
        struct tile_frame *tf = NULL;
        char *buf = thread_buffers(&c, &args, &tf);
        if (!buf) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        } else {
            void *G = buf, *st = buf + gbytes;
            char *pack = buf + gbytes + sbytes;
            int init = 1;
            args[k->nargs + 1] = &init;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t it = 0; it < nitems; it++) {
                int64_t b = it / nsplit, p = it % nsplit;
                int64_t o0 = b * ti, o1 = o0 + ti < nout ? o0 + ti : nout;
                int64_t r0 = p * slice < nred ? p * slice : nred;
                int64_t r1 = r0 + slice < nred ? r0 + slice : nred;
                void *dst = nsplit > 1 ? partial + (size_t)((p * nout + o0) * sb) : st;
                const int64_t iv[2] = {r0, r1};
                if (fold(&c, o0, o1, iv, 1, G, dst, args, pack, tf)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                } else if (nsplit == 1 && finish(&c, st, o0, o1, tf)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                }
            }
        }
        free(buf);
        free(args);
        cpu_tile_frame_free(tf);
    }
    if (!failed && nsplit > 1) {
        for (int p = 1; p < nsplit && !failed; p++) {
            char *b = partial + (size_t)(p * nout * sb);
            if (c.m)
                failed = c.m->merge(partial, b, nout) != 0;
            else
                cpu_tile_merge(&g->kt, g->t, partial, b, nout);
        }
        struct tile_frame *tf = c.m ? NULL : cpu_tile_frame_new(&g->kt, g->t, r->args, 1);
        if (!failed && !c.m && !tf)
            failed = 1;
        if (!failed)
            failed = finish(&c, partial, 0, nout, tf);
        cpu_tile_frame_free(tf);
    }
    free(partial);
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "gemm-epilogue: out of memory for the workspace");
    return SR_OK;
}

/* Block-sparse ranges: chunks of at most ti flat rows (a few per thread), each folding its
 * rows' intervals tile by tile into one block of states (fold), never split over the reduced
 * range. */
static sr_status gemm_run_ranges(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p)
{
    const struct gemm_kernel *g = k->backend_data;
    int nt = sr__threads(k->ctx, g->per_thread);
    int64_t es = (int64_t)sr_dtype_size(k->dtype);
    int64_t chunk = cpu_row_piece(p->nrows, nt, g->ti);
    int64_t nchunks = (p->nrows + chunk - 1) / chunk;
    struct gemm_call c = call_new(k, r, k->axis == 1 ? r->ny : r->nx);
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && nchunks > 1)
#endif
    {
        size_t gbytes = (size_t)(g->ti * g->tj * es), sbytes = (size_t)(g->ti * c.sb);
        const void **args = NULL;
        struct tile_frame *tf = NULL;
        char *buf = thread_buffers(&c, &args, &tf);
        int init = 1;
        if (!buf) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        } else {
            args[k->nargs + 1] = &init;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < nchunks; it++) {
            int64_t f0 = it * chunk, f1 = f0 + chunk < p->nrows ? f0 + chunk : p->nrows;
            for (int64_t b = sr__rplan_block(p, f0); buf && b < p->nblocks && p->rows[b] < f1;
                 b++) {
                int64_t o0, o1;
                sr__rplan_seg(p, b, f0, f1, &o0, &o1);
                if (o0 == o1)
                    continue;
                if (fold(&c, o0, o1, p->iv + 2 * p->ivoff[b], p->ivoff[b + 1] - p->ivoff[b], buf,
                         buf + gbytes, args, buf + gbytes + sbytes, tf)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                } else if (finish(&c, buf + gbytes, o0, o1, tf)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    failed = 1;
                }
            }
        }
        free(buf);
        free(args);
        cpu_tile_frame_free(tf);
    }
    if (failed)
        return sr__error(k->ctx, SR_ENOMEM, "gemm-epilogue: out of memory for the workspace");
    return SR_OK;
}

static void gemm_release(sr_kernel *k)
{
    struct gemm_kernel *g = k->backend_data;
    if (!g)
        return;
    gemm_free(k->ctx, g);
    k->backend_data = NULL;
}

static void gemm_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct gemm_kernel *g = k->backend_data;
    char why[128];
    if (g->mode == 1)
        snprintf(why, sizeof why, "%s=on", k->ctx->opt.gemm_var);
    else
        snprintf(why, sizeof why,
                 "at least %d, the measured crossover above which it beats the direct strategy",
                 GEMM_MIN_DIM);
    expr_buf_printf(b, "strategy: gemm-epilogue: F depends on the pair only through the inner "
                       "product ");
    expr_print_to(b, g->node);
    char kern[256], blocking[160];
    const char *gemm = k->dtype == SR_F64 ? "dgemm" : "sgemm";
    if (g->kern == KERN_AVX512) {
        cpu_avx512_describe(k->dtype == SR_F64, g->dim, blocking, sizeof blocking);
        snprintf(kern, sizeof kern, "symred's AVX-512 %s (%s)", gemm, blocking);
    } else {
        snprintf(kern, sizeof kern, "BLIS %s (%s) %s%s", blis.version,
                 blis.arch[0] ? blis.arch : "?", gemm,
                 g->asked == 2   ? " (SYMRED_GEMM_KERNEL=blis)"
                 : g->asked == 1 ? " (SYMRED_GEMM_KERNEL=avx512, but the CPU lacks AVX-512F)"
                                 : " (the CPU lacks AVX-512F)");
    }
    expr_buf_printf(b,
                    " of dimension %d (%s); %s computes tiles of %d output rows x %d reduced "
                    "indices, single-threaded inside each OpenMP thread, and the epilogue "
                    "(generated code on tier 1, the tile interpreter on tier 0) folds each tile "
                    "into the reduction\n",
                    g->dim, why, kern, g->ti, g->tj);
    struct jit_load_info info = g->info;
    int stage = SR_STAGE_FINAL;
    if (g->bg) {
        stage = cpu_bg_explain(g->bg, b, &info);
    } else if (!g->m) {
        expr_buf_printf(b, "tier: 0, the tile interpreter evaluates the epilogue on the gemm's "
                           "tiles (no compiled code)\n");
        stage = SR_STAGE_FAILED;
    } else {
        expr_buf_printf(b, "tier: 1, compiled code\n");
    }
    if (stage == SR_STAGE_PENDING || stage == SR_STAGE_FAILED) {
        expr_buf_printf(b, "epilogue on tier 0: ");
        cpu_tile_explain(&g->kt, g->t, b);
    }
    if (!g->m && !g->bg) {
        if (g->kc)
            expr_buf_printf(b,
                            "selection: the tiles keep the %d smallest values of each row, then F "
                            "as given is computed at those pairs by the tile interpreter and the "
                            "%d smallest kept (SYMRED_GEMM_REFINE=off skips it)\n",
                            g->kc, k->k);
        return;
    }
    expr_buf_printf(b,
                    "epilogue: %d output-row nodes, %d reduced-index nodes, %d pair nodes; state "
                    "%lld bytes per output row; epilogue tile %d reduced indices\n"
                    "threads: %d (OpenMP over row blocks; the reduced range is split too when "
                    "there are fewer row blocks than threads)\n"
                    "module: %s, cache %s, %.1f ms\n",
                    g->plan.hoisted_outer, g->plan.hoisted_inner, g->plan.pair_nodes,
                    (long long)g->plan.state_bytes, g->plan.tile_j,
                    sr__threads(k->ctx, g->per_thread), info.origin, info.cache, info.compile_ms);
    if (g->kc)
        expr_buf_printf(b,
                        "selection: the tiles keep the %d smallest values of each row (rounded "
                        "as the epilogue computes them), then F as given is computed at those "
                        "pairs by the direct strategy and the %d smallest kept (exact unless more "
                        "than %d pairs lie within the epilogue's rounding of the %d-th; "
                        "SYMRED_GEMM_REFINE=off skips it); module: %s, cache %s, %.1f ms\n",
                        g->kc, k->k, g->kc - k->k, k->k, g->bg ? info.origin : g->rinfo.origin,
                        g->bg ? info.cache : g->rinfo.cache,
                        g->bg ? info.compile_ms : g->rinfo.compile_ms);
    else if (g->no_refine)
        expr_buf_printf(b, "selection: from the tiles' values as computed, not ranked again (%s)\n",
                        g->no_refine);
    else if (sr_reductions[k->red].order == SR_RED_ASC &&
             sr_reductions[k->red].family != SR_RED_FAM_KSEL)
        expr_buf_printf(b, "selection: from the tiles' values as computed, not ranked again (Min "
                           "and ArgMin propagate NaN, which a list of candidates cannot hold; "
                           "ArgKMin with K = 1 is ranked)\n");
}

static void gemm_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct gemm_kernel *g = k->backend_data;
    info->strategy = SR_STRATEGY_GEMM_EPILOGUE;
    info->device = SR_DEVICE_CPU;
    info->tile_rows = g->ti;
    info->tile_cols = g->tj;
    int stage = g->bg ? cpu_bg_stage(g->bg) : g->m ? SR_STAGE_FINAL : SR_STAGE_FAILED;
    info->tier = stage == SR_STAGE_FINAL || stage == SR_STAGE_COMPILED;
    info->compiling = stage == SR_STAGE_PENDING;
    info->acc = k->dtype == SR_F64 ? SR_ACC_F64 : (sr_acc)(g->acc + 1);
    info->product = g->kern == KERN_AVX512 ? "avx512" : "blis";
    info->rerank = g->kc > 0;
    info->dot_dim = g->dim;
    if (g->kern == KERN_AVX512)
        cpu_avx512_dot_info(k->dtype == SR_F64, g->dim, info);
    if (g->bg)
        cpu_bg_plan_info(g->bg, info);
    else if (g->m)
        cpu_module_plan_info(&g->info, info);
}

static int gemm_stage(const sr_kernel *k)
{
    const struct gemm_kernel *g = k->backend_data;
    return g ? cpu_bg_stage(g->bg) : SR_STAGE_FINAL;
}

static sr_status gemm_wait(const sr_kernel *k, double timeout_s)
{
    const struct gemm_kernel *g = k->backend_data;
    return g ? cpu_bg_wait(g->bg, timeout_s) : SR_OK;
}

const struct sr_backend_i cpu_gemm_backend = {
    /* .name = */ "cpu-jit", /* the JIT backend with its gemm-epilogue strategy */
    /* .prepare = */ NULL,
    /* .run = */ gemm_run,
    /* .release = */ gemm_release,
    /* .explain = */ gemm_explain,
    /* .run_ranges = */ gemm_run_ranges,
    /* .workspace = */ gemm_workspace,
    /* .run_device = */ NULL,
    /* .ctx_free = */ NULL,
    /* .post_rewrite = */ false,
    /* .vjp = */ cpu_attn_vjp,
    /* .run_lse = */ cpu_attn_run_lse,
    /* .offer = */ NULL,
    /* .stage = */ gemm_stage,
    /* .wait = */ gemm_wait,
    /* .plan_info = */ gemm_plan_info,
    /* .plans = */ NULL,
};

void cpu_gemm_offer(const sr_kernel *k, struct sr_plan *p)
{
    memset(p, 0, sizeof *p);
    p->strategy = "gemm-epilogue";
    sr_kernel kx;
    int va, vb;
    double epi = 0;
    const sr_expr *S = cpu_gemm_find_node(cpu_gemm_form(k, &kx), &va, &vb, &epi);
    if (!S) {
        snprintf(p->why, sizeof p->why,
                 "F does not depend on the pair through one inner product of an output-axis and "
                 "a reduced-axis variable");
        return;
    }
    /* The same rules, in the same order, as cpu_gemm_prepare's. */
    int dim = S->child[0]->dim, mode = k->ctx->opt.gemm;
    const char *why = NULL;
    p->gemm_flops = 2.0 * dim;
    p->flops = epi;
    /* The workspace's lower bound: the tile of inner products and a row state per row of it
     * (the packed operands and the epilogue's own buffers come on top), shrunk under the
     * budget as cpu_gemm_prepare shrinks it, rows first. */
    int64_t es = (int64_t)sr_dtype_size(k->dtype), sb = jit_state_bytes(k, JIT_ACC_BLOCK);
    int64_t lim = k->budget, least = 8 * 16 * es + 8 * sb;
    gemm_tiles(k->dtype, &p->ti, &p->tj);
    while (lim > 0 && (int64_t)p->ti * (p->tj * es + sb) > lim && (p->ti > 8 || p->tj > 16)) {
        if (p->ti > 8)
            p->ti /= 2;
        else
            p->tj /= 2;
    }
    p->workspace = (int64_t)p->ti * (p->tj * es + sb);
    const sr_kernel *km = cpu_gemm_form(k, &kx);
    const sr_expr *roots[2] = {km->f, km->weight};
    struct cpu_cost c = {0};
    cpu_cost_gen(roots, 2, S, &c);
    cpu_cost_fold(k, &c);
    c.gemm_flops = p->gemm_flops;
    c.tile_passes = p->ti * p->tj * es > (1 << 20) ? 2 : 1; /* past L2: read back from L3 */
    c.pack_per_pair = (double)dim / p->ti;
    c.direct_outs = k->out_dim;
    c.ti = p->ti;
    c.tj = p->tj;
    p->est_ns = cpu_cost_ns(&c);
    if (mode == 2)
        snprintf(p->why, sizeof p->why, "%s=off", k->ctx->opt.gemm_var);
    else if (mode == 0 && dim < GEMM_MIN_DIM)
        snprintf(p->why, sizeof p->why,
                 "the inner product has dimension %d, below the measured crossover %d", dim,
                 GEMM_MIN_DIM);
    else if (mode == 0 && epi > dim)
        snprintf(p->why, sizeof p->why,
                 "the rest of F costs %.0f flops per pair, more than the inner product's "
                 "dimension %d",
                 epi, dim);
    else if (choose_kernel(k->ctx->opt.gemm_kernel) < 0 && !blis_ready(&why))
        snprintf(p->why, sizeof p->why, "%s%.160s",
                 cpu_avx512_usable() ? "SYMRED_GEMM_KERNEL=blis and " : "no AVX-512F and ", why);
    else if (lim > 0 && least > lim)
        snprintf(p->why, sizeof p->why,
                 "needs at least %lld bytes per thread (tiles 8 x 16), the budget allows %lld",
                 (long long)least, (long long)lim);
    else if (mode == 1) {
        p->feasible = p->forced = true;
        snprintf(p->why, sizeof p->why, "%s=on", k->ctx->opt.gemm_var);
    } else {
        p->feasible = true;
        snprintf(p->why, sizeof p->why,
                 "an inner product of dimension %d, at least the measured crossover %d", dim,
                 GEMM_MIN_DIM);
    }
}
