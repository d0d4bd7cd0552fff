/*
 * attn-grad.c — the fused backward of attention on the CPU (sr_kernel_vjp).
 *
 * The kernel: out_i = sum_j P_ij w_j with P_ij = exp(F_ij - lam_i), F_ij = c (x_i|y_j) and
 * lam_i = log sum_j exp(F_ij); G_i = dL/d out_i. Its gradients (docs/gradients.md, summed):
 *   dw_j  = sum_i P_ij G_i
 *   dS_ij = P_ij ((G_i|w_j) - (G_i|out_i))
 *   dx_i  = c sum_j dS_ij y_j,   dy_j = c sum_i dS_ij x_i,
 *   dc    = sum_ij dS_ij (x_i|y_j) = sum_i (x_i | sum_j dS_ij y_j).
 *
 * Two passes over the pairs. The first, over blocks of rows i, forms tiles of F (x y^T) and the
 * log-normalizer lam_i by the online maximum and sum, as the forward does. The second goes over
 * tiles of TJ reduced indices, each owned by one thread with its rows of dy and dw, and walks
 * the rows i in strips: the strip of F, P, the strip of (G|w) (G w^T), dS, and the thread's own
 * copy of dx gets dS y; per block of TI rows, P^T and dS^T, stored transposed as they are formed,
 * give dw += P^T G and dy += dS^T x (the blocks of x and G packed once per call, without ranges
 * and where the budget lets them). Five tile products per pair in the second pass and one in
 * the first, where the LogSumExp kernel and the gradient kernels (one reduction per variable)
 * take nine, and the pairs' exponentials are formed twice instead of four times.
 *
 * float32 on a CPU with AVX2 and FMA: symred's strip products (gemm-avx2.c) and the fused
 * strategy's vectorised exponential, accumulating in float32 tile by tile like the fused
 * strategy. Otherwise (float64, or no AVX2) the same passes in portable loops that accumulate in
 * double. NaN and infinities follow IEEE arithmetic as in the gradient kernels: a NaN in a row
 * of x makes lam_i NaN, and with it that row's dx and every dy and dw.
 *
 * On axis 0 (out_j = sum_i P_ji w_i) the same passes run with the roles of i and j exchanged.
 *
 * With block-sparse ranges (a plan of ranges.c: blocks of output rows, each with its reduced
 * intervals) the passes visit only the blocks' pairs: the first goes over each block's rows
 * and, for each, over its intervals; the second, still over tiles of TJ reduced indices, over
 * the blocks that have pairs in the tile (the pattern transposed here, so that only the triple
 * of the kernel's axis is read), with P and dS zeroed outside the block's intervals when these
 * do not cover the tile. Without ranges the pattern is one block of every pair.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_PASSES 1
#include <immintrin.h>
/* The AVX2 passes' own loops (the elementwise steps), vectorised for the CPU they run on. */
#define AVX2_LOOPS __attribute__((target("avx2,fma")))
#else
#define HAVE_AVX2_PASSES 0
#define AVX2_LOOPS
#endif

/* Rows i per block of the second pass (the transposed tiles P^T and dS^T are TJ x TI), reduced
 * indices per tile of the second pass and of the first, rows per block of the first (and of the
 * forward: each block packs the tiles of y and w again, so larger blocks pack less; the forward
 * ran 0.86-1.01x the fused strategy's with 192, 1.16-1.36x with 96, N = M = 4096, D = 64,
 * alternating, load 4-5), rows per strip of the first pass and of the second: multiples of the
 * micro-kernel's CPU_AVX2_MR = 6 rows, so that no micro-strip computes rows it throws away (16
 * rows cost 18). The first pass's strip of F (STRIP x TL) stays in L1 with 12 rows (its forward
 * took 0.6-1.1x the CPU time of 16 rows, mean 0.84x, N = M = 4096, D = 64, alternating, load
 * 3-5); the second pass's strips, 24 rows (also three 8 x 8 blocks of the transposition), took
 * 0.6-0.8x the CPU time of 16 rows. With float32, TI = 96 and TJ = 128, a thread's tiles of the
 * second pass (the packed y and w tiles, P^T, dS^T, the packed x and G blocks: about 250 KiB at
 * D = 64) stay in L2. */
enum { TI = 96, TJ = 128, TL = 512, TB = 192, STRIP = 12, PSTRIP = 24 };

struct attn {
    int x, y, w, c; /* argument indices; c = -1 for a constant or no factor */
    double cval;    /* c's value */
    int D, Dw;      /* dim(x) = dim(y), dim(w) */
    int64_t n, m;
    const void *X, *Y, *W, *G, *O;
    void *gx, *gy, *gw, *gc; /* the wanted gradients, NULL for the others */
    int nth;
};

/* The pairs the passes visit: blocks of output rows, each with its reduced intervals (the
 * arrays of a block-sparse plan, struct sr_rplan; without ranges one block of every row with one
 * interval of every reduced index); for the first pass the blocks cut in chunks of TB rows
 * (chunk[3u] the block, [chunk[3u + 1], chunk[3u + 2]) the rows); for the second, per tile t of
 * TJ reduced indices, the blocks that have pairs in it: for e in [toff[t], toff[t + 1]),
 * tent[2e] the block and tent[2e + 1] its first interval that meets the tile. */
struct pattern {
    int64_t nb;
    const int64_t *blk, *ivoff, *iv;
    int64_t dense[6]; /* blk, ivoff and iv of the pattern without ranges */
    int64_t nchunk, *chunk, ntiles, *toff, *tent;
    void *mem;
};

/* Calls fn(t, c, q, ctx) once for each tile t and block c with pairs in t, with q the first
 * interval of c that meets t, in increasing c for each t (last: ntiles scratch values). */
static void pattern_walk(const struct pattern *pt, int64_t *last,
                         void (*fn)(int64_t t, int64_t c, int64_t q, void *ctx), void *ctx)
{
    for (int64_t t = 0; t < pt->ntiles; t++)
        last[t] = -1;
    for (int64_t c = 0; c < pt->nb; c++)
        for (int64_t q = pt->ivoff[c]; q < pt->ivoff[c + 1]; q++)
            for (int64_t t = pt->iv[2 * q] / TJ; t <= (pt->iv[2 * q + 1] - 1) / TJ; t++)
                if (last[t] != c) {
                    last[t] = c;
                    fn(t, c, q, ctx);
                }
}

static void tile_count(int64_t t, int64_t c, int64_t q, void *ctx)
{
    (void)c, (void)q;
    ((int64_t *)ctx)[t + 1]++;
}

static void tile_fill(int64_t t, int64_t c, int64_t q, void *ctx)
{
    struct pattern *pt = ctx;
    int64_t e = pt->toff[t]++;
    pt->tent[2 * e] = c;
    pt->tent[2 * e + 1] = q;
}

/* The pattern of plan p, or of every pair when p is NULL (n output rows, m reduced): SR_EBUDGET
 * when its lists take more than limit bytes (limit > 0; *bytes: how many), SR_ENOMEM when they do
 * not fit in memory. */
static sr_status pattern_new(const struct attn *a, const struct sr_rplan *p, int64_t limit,
                             int64_t *bytes, struct pattern *pt)
{
    memset(pt, 0, sizeof *pt);
    if (p) {
        pt->nb = p->nblocks, pt->blk = p->blk, pt->ivoff = p->ivoff, pt->iv = p->iv;
    } else {
        int64_t *d = pt->dense;
        d[0] = 0, d[1] = a->n, d[2] = 0, d[3] = 1, d[4] = 0, d[5] = a->m;
        pt->nb = a->n > 0 && a->m > 0, pt->blk = d, pt->ivoff = d + 2, pt->iv = d + 4;
    }
    for (int64_t c = 0; c < pt->nb; c++)
        pt->nchunk += (pt->blk[2 * c + 1] - pt->blk[2 * c] + TB - 1) / TB;
    pt->ntiles = (a->m + TJ - 1) / TJ;
    /* chunk, toff and the scratch of the walk, then tent once its size is known */
    int64_t *m0 = malloc(sizeof(int64_t) * (size_t)(3 * pt->nchunk + 2 * pt->ntiles + 1));
    if (!m0)
        return SR_ENOMEM;
    pt->chunk = m0, pt->toff = m0 + 3 * pt->nchunk;
    int64_t u = 0;
    for (int64_t c = 0; c < pt->nb; c++)
        for (int64_t r = pt->blk[2 * c]; r < pt->blk[2 * c + 1]; r += TB, u++) {
            pt->chunk[3 * u] = c, pt->chunk[3 * u + 1] = r;
            pt->chunk[3 * u + 2] = pt->blk[2 * c + 1] - r < TB ? pt->blk[2 * c + 1] : r + TB;
        }
    memset(pt->toff, 0, sizeof(int64_t) * (size_t)(pt->ntiles + 1));
    int64_t *last = pt->toff + pt->ntiles + 1;
    pattern_walk(pt, last, tile_count, pt->toff);
    for (int64_t t = 0; t < pt->ntiles; t++)
        pt->toff[t + 1] += pt->toff[t];
    *bytes =
        (int64_t)sizeof(int64_t) * (3 * pt->nchunk + 2 * pt->ntiles + 2 * pt->toff[pt->ntiles]);
    if (limit > 0 && *bytes > limit) {
        free(m0);
        return SR_EBUDGET;
    }
    pt->tent = malloc(sizeof(int64_t) * (size_t)(2 * pt->toff[pt->ntiles] + 1));
    if (!pt->tent) {
        free(m0);
        return SR_ENOMEM;
    }
    pattern_walk(pt, last, tile_fill, pt); /* toff[t] moves to tile t's end: toff[t + 1] */
    for (int64_t t = pt->ntiles; t > 0; t--)
        pt->toff[t] = pt->toff[t - 1];
    pt->toff[0] = 0;
    pt->mem = m0;
    return SR_OK;
}

static void pattern_free(struct pattern *pt)
{
    free(pt->mem);
    free(pt->tent);
}

/* Zeroes, in rows [0, h) of A (row stride lda), the columns of the tile [j0, j0 + tj) outside
 * the intervals [q, q1) of a block, when they do not cover the tile whole. */
static void mask_cols(const struct pattern *pt, int64_t q, int64_t q1, int64_t j0, int64_t tj,
                      float *A, int64_t lda, int64_t h)
{
    if (pt->iv[2 * q] <= j0 && pt->iv[2 * q + 1] >= j0 + tj)
        return;
    for (int64_t r = 0; r < h; r++) {
        float *row = A + r * lda;
        int64_t pos = 0;
        for (int64_t v = q; v < q1 && pt->iv[2 * v] < j0 + tj; v++) {
            const int64_t b = pt->iv[2 * v] - j0, e = pt->iv[2 * v + 1] - j0;
            if (b > pos)
                memset(row + pos, 0, sizeof(float) * (size_t)(b - pos));
            pos = e < tj ? e : tj;
        }
        if (tj > pos)
            memset(row + pos, 0, sizeof(float) * (size_t)(tj - pos));
    }
}

static bool var_of(const sr_expr *e, sr_cat cat, int *idx)
{
    if (e->op != OP_VAR || e->iattr[1] != (int64_t)cat)
        return false;
    *idx = (int)e->iattr[0];
    return true;
}

static bool const_value(const sr_expr *e, double *v)
{
    if (e->dim != 1)
        return false;
    switch (e->op) {
    case OP_CST:
        *v = e->fattr;
        return true;
    case OP_INTCST:
        *v = (double)e->iattr[0];
        return true;
    case OP_RATCST:
        *v = (double)e->iattr[0] / (double)e->iattr[1];
        return true;
    default:
        return false;
    }
}

/* Whether k is attention of the form the fused backward takes (filling a), else why not. The
 * user's formulas are matched: the simplifier may have reordered them. */
static const char *attn_match(const sr_kernel *k, struct attn *a)
{
    if (k->red != SR_SUMSOFTMAXWEIGHT)
        return "it is not a SumSoftMaxWeight reduction";
    if (k->io != k->dtype || (k->dtype != SR_F32 && k->dtype != SR_F64))
        return "its arrays are not float32 or float64";
    const sr_expr *f = k->simp.f_user ? k->simp.f_user : k->f;
    const sr_expr *w = k->simp.f_user ? k->simp.weight_user : k->weight;
    a->c = -1;
    a->cval = 1;
    if (f->op == OP_MUL) {
        bool first = f->child[0]->op == OP_SCALPROD;
        const sr_expr *s = f->child[first ? 1 : 0];
        f = f->child[first ? 0 : 1];
        if (s->dim != 1 || !(var_of(s, SR_CAT_PARAM, &a->c) || const_value(s, &a->cval)))
            return "F is not (x|y) times a scalar parameter or constant";
    }
    /* x: the output side's variable, y and the weight: the reduced side's (Vi and Vj on axis 1,
     * exchanged on axis 0; the inner product is symmetric). */
    const sr_cat oc = k->axis == 1 ? SR_CAT_I : SR_CAT_J, rc = k->axis == 1 ? SR_CAT_J : SR_CAT_I;
    if (f->op != OP_SCALPROD)
        return "F is not an inner product (x|y) of a Vi and a Vj variable";
    if (!(var_of(f->child[0], oc, &a->x) && var_of(f->child[1], rc, &a->y)) &&
        !(var_of(f->child[1], oc, &a->x) && var_of(f->child[0], rc, &a->y)))
        return "F is not an inner product (x|y) of a Vi and a Vj variable";
    if (!w || !var_of(w, rc, &a->w))
        return k->axis == 1 ? "the weight is not a Vj variable" : "the weight is not a Vi variable";
    if (a->w == a->y)
        return "the weight is the variable y of the inner product";
    a->D = f->child[0]->dim;
    a->Dw = w->dim;
    return NULL;
}

bool cpu_attn_covers(const sr_kernel *k)
{
    struct attn a;
    return !attn_match(k, &a);
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static inline double ld(const void *p, int f64, int64_t i)
{
    return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline void st(void *p, int f64, int64_t i, double v)
{
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static double dot(const void *a, int64_t ia, const void *b, int64_t ib, int f64, int d)
{
    double s = 0;
    for (int t = 0; t < d; t++)
        s += ld(a, f64, ia + t) * ld(b, f64, ib + t);
    return s;
}

/* delta_i = (G_i|out_i), in double. */
static void deltas(const struct attn *a, int f64, double *dlt)
{
#pragma omp parallel for num_threads(a->nth) schedule(static)
    for (int64_t i = 0; i < a->n; i++)
        dlt[i] = dot(a->G, i * a->Dw, a->O, i * a->Dw, f64, a->Dw);
}

/* dx_i = c sum_u acc_u[i] over the threads' copies (nth of them, each n x D, float or double as
 * af64, stride bytes apart from acc) and dc = sum_i (x_i | sum_u acc_u[i]), written into the
 * wanted outputs. */
static double acc_sum(const struct attn *a, const char *acc, int64_t stride, int af64, int64_t e)
{
    double s = 0;
    for (int u = 0; u < a->nth; u++)
        s += ld(acc + u * stride, af64, e);
    return s;
}

static void finish_dx(const struct attn *a, int f64, const char *acc, int64_t stride, int af64)
{
    if (a->gx) {
#pragma omp parallel for num_threads(a->nth) schedule(static)
        for (int64_t e = 0; e < a->n * a->D; e++)
            st(a->gx, f64, e, a->cval * acc_sum(a, acc, stride, af64, e));
    }
    if (a->gc) { /* in one thread: the same order of additions in every call */
        double dc = 0;
        for (int64_t e = 0; e < a->n * a->D; e++)
            dc += ld(a->X, f64, e) * acc_sum(a, acc, stride, af64, e);
        st(a->gc, f64, 0, dc);
    }
}

/* ---- portable passes (float64, or float32 without AVX2), accumulating in double ----------------
 */

/* lam_i and, when out is not NULL, the forward's values (ws: per thread, stride bytes apart,
 * dim(w) doubles). */
static void generic_lam(const struct attn *a, const struct pattern *pt, int f64, double *lam,
                        void *out, char *ws, int64_t stride)
{
    const int Dw = a->Dw;
#pragma omp parallel num_threads(a->nth)
    {
        double *acc = (double *)(ws + (int64_t)thread_id() * stride);
#pragma omp for schedule(static)
        for (int64_t u = 0; u < pt->nchunk; u++)
            for (int64_t i = pt->chunk[3 * u + 1]; i < pt->chunk[3 * u + 2]; i++) {
                const int64_t c = pt->chunk[3 * u];
                double mx = -INFINITY, s = 0;
                for (int t = 0; out && t < Dw; t++)
                    acc[t] = 0;
                for (int64_t q = pt->ivoff[c]; q < pt->ivoff[c + 1]; q++)
                    for (int64_t j = pt->iv[2 * q]; j < pt->iv[2 * q + 1]; j++) {
                        const double f = a->cval * dot(a->X, i * a->D, a->Y, j * a->D, f64, a->D);
                        const double scale = cpu_softmax_grow(&mx, f);
                        if (scale != 1) {
                            s *= scale;
                            for (int t = 0; out && t < Dw; t++)
                                acc[t] *= scale;
                        }
                        const double p = cpu_ssmw_weight(f, mx); /* a NaN makes the sum NaN */
                        s += p;
                        for (int t = 0; out && t < Dw; t++)
                            acc[t] += p * ld(a->W, f64, j * Dw + t);
                    }
                lam[i] = mx + log(s);
                for (int t = 0; out && t < Dw; t++)
                    st(out, f64, i * Dw + t, acc[t] / s);
            }
    }
}

/* The pairs of rows [i0, i1) with reduced index j: the thread's dx (ax), and dy_j and dw_j into
 * ay and aw (D and Dw doubles). */
static void generic_pairs(const struct attn *a, int f64, const double *lam, const double *dlt,
                          int64_t i0, int64_t i1, int64_t j, double *ax, double *ay, double *aw)
{
    const int D = a->D, Dw = a->Dw;
    const bool wdx = a->gx || a->gc, wds = wdx || a->gy;
    for (int64_t i = i0; i < i1; i++) {
        const double s = dot(a->X, i * D, a->Y, j * D, f64, D), f = a->cval * s;
        const double p = f == -INFINITY ? 0 : exp(f - lam[i]);
        if (a->gw)
            for (int t = 0; t < Dw; t++)
                aw[t] += p * ld(a->G, f64, i * Dw + t);
        if (!wds)
            continue;
        const double ds = p * (dot(a->G, i * Dw, a->W, j * Dw, f64, Dw) - dlt[i]);
        for (int t = 0; t < D && a->gy; t++)
            ay[t] += ds * ld(a->X, f64, i * D + t);
        for (int t = 0; t < D && wdx; t++)
            ax[i * D + t] += ds * ld(a->Y, f64, j * D + t);
    }
}

/* ws: per thread (stride bytes apart) n * D + TJ * (D + Dw) doubles, the first n * D (the
 * thread's dx) zero. */
static void generic_pass(const struct attn *a, const struct pattern *pt, int f64, const double *lam,
                         const double *dlt, char *ws, int64_t stride)
{
    const int D = a->D, Dw = a->Dw;
#pragma omp parallel num_threads(a->nth)
    {
        double *ax = (double *)(ws + (int64_t)thread_id() * stride), *ay = ax + a->n * D,
               *aw = ay + TJ * D;
        /* static: each thread's copy of dx sums the same reduced indices in every call, so the
         * gradients do not vary from one call to the next */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < pt->ntiles; t++) {
            const int64_t j0 = t * TJ, j1 = a->m - j0 < TJ ? a->m : j0 + TJ;
            memset(ay, 0, sizeof(double) * (size_t)(TJ * (D + Dw)));
            for (int64_t e = pt->toff[t]; e < pt->toff[t + 1]; e++) {
                const int64_t c = pt->tent[2 * e];
                for (int64_t q = pt->tent[2 * e + 1]; q < pt->ivoff[c + 1] && pt->iv[2 * q] < j1;
                     q++)
                    for (int64_t j = pt->iv[2 * q] > j0 ? pt->iv[2 * q] : j0;
                         j < pt->iv[2 * q + 1] && j < j1; j++)
                        generic_pairs(a, f64, lam, dlt, pt->blk[2 * c], pt->blk[2 * c + 1], j, ax,
                                      ay + (j - j0) * D, aw + (j - j0) * Dw);
            }
            for (int64_t j = j0; j < j1; j++) {
                for (int t2 = 0; t2 < D && a->gy; t2++)
                    st(a->gy, f64, j * D + t2, a->cval * ay[(j - j0) * D + t2]);
                for (int t2 = 0; t2 < Dw && a->gw; t2++)
                    st(a->gw, f64, j * Dw + t2, aw[(j - j0) * Dw + t2]);
            }
        }
    }
}

/* ---- float32 with AVX2: the strip products --------------------------------------------------- */

static int64_t al64(int64_t v) { return (v + 63) / 64 * 64; }

/* The first pass: lam_i, in blocks of TB rows over tiles of TL reduced indices. ws: per thread
 * the packed tile of y, the strip of F (STRIP x TL), TB row states and, for the forward
 * (with_w), the packed tile of w. */
static int64_t lam_bytes(const struct attn *a, bool with_w)
{
    return al64(cpu_avx2_pack_bt_bytes(TL, a->D)) + al64(4 * STRIP * TL) + al64(16 * TB) +
           (with_w ? al64(cpu_avx2_pack_bt_bytes(a->Dw, TL)) : 0);
}

/* lam_i and, when out is not NULL, the forward's values out_i = sum_j P_ij w_j (the online
 * softmax: each row rescaled when its maximum grows, divided by its sum at the end). */
static void avx2_lam(const struct attn *a, const struct pattern *pt, float *lam, float *out,
                     char *ws, int64_t stride)
{
    const float *X = a->X, *Y = a->Y, *W = a->W;
    const float c = (float)a->cval;
    const int D = a->D, Dw = a->Dw;
#pragma omp parallel num_threads(a->nth)
    {
        char *t = ws + (int64_t)thread_id() * stride;
        float *Kt = (float *)t, *S = (float *)(t + al64(cpu_avx2_pack_bt_bytes(TL, D)));
        double *M = (double *)((char *)S + al64(4 * STRIP * TL)), *L = M + TB;
        float *Wp = (float *)((char *)M + al64(16 * TB));
#pragma omp for schedule(dynamic)
        for (int64_t b = 0; b < pt->nchunk; b++) {
            const int64_t blk = pt->chunk[3 * b], b0 = pt->chunk[3 * b + 1],
                          bh = pt->chunk[3 * b + 2] - b0;
            for (int64_t r = 0; r < bh; r++)
                M[r] = -INFINITY, L[r] = 0;
            if (out)
                memset(out + b0 * Dw, 0, sizeof(float) * (size_t)(bh * Dw));
            for (int64_t v = pt->ivoff[blk]; v < pt->ivoff[blk + 1]; v++)
                for (int64_t j0 = pt->iv[2 * v]; j0 < pt->iv[2 * v + 1]; j0 += TL) {
                    const int64_t tj = pt->iv[2 * v + 1] - j0 < TL ? pt->iv[2 * v + 1] - j0 : TL;
                    cpu_avx2_pack_bt(tj, D, Y + j0 * D, D, Kt);
                    if (out)
                        cpu_avx2_pack_v(tj, Dw, W + j0 * Dw, Dw, Wp);
                    for (int64_t u = 0; u < bh; u += STRIP) {
                        const int64_t h = bh - u < STRIP ? bh - u : STRIP;
                        cpu_avx2_strip_abt(h, D, X + (b0 + u) * D, D, Kt, tj, S, TL);
                        for (int64_t r = 0; r < h; r++) {
                            float *F = S + r * TL;
                            for (int64_t q = 0; q < tj; q++)
                                F[q] *= c;
                            const double scale = cpu_softmax_grow(&M[u + r], cpu_rowmax_f32(F, tj));
                            const double mn = M[u + r];
                            if (mn == -INFINITY) { /* every value so far is -inf: weights 0 */
                                memset(F, 0, sizeof(float) * (size_t)tj);
                                continue;
                            }
                            for (int64_t q = 0; out && scale != 1 && q < Dw; q++)
                                out[(b0 + u + r) * Dw + q] *= (float)scale;
                            L[u + r] = L[u + r] * scale + cpu_expsum_f32(F, tj, (float)mn);
                        }
                        if (out)
                            cpu_avx2_strip_av(h, tj, S, TL, Wp, Dw, out + (b0 + u) * Dw, Dw);
                    }
                }
            for (int64_t r = 0; r < bh; r++) {
                lam[b0 + r] = (float)(M[r] + log(L[r]));
                for (int64_t q = 0; out && q < Dw; q++)
                    out[(b0 + r) * Dw + q] = (float)(out[(b0 + r) * Dw + q] / L[r]);
            }
        }
    }
}

/* dst[q * ldd + r] = src[r * lds + q] for r < h, q < w: 8 x 8 blocks by AVX2 shuffles, the
 * rest one value at a time. Called only where cpu_avx2_usable() (elsewhere the AVX2 passes are
 * not run, and it is the plain loop). */
#if HAVE_AVX2_PASSES
__attribute__((target("avx2,fma"))) static void transpose(const float *src, int64_t lds, int64_t h,
                                                          int64_t w, float *dst, int64_t ldd)
{
    int64_t r = 0;
    for (; r + 8 <= h; r += 8) {
        int64_t q = 0;
        for (; q + 8 <= w; q += 8) {
            __m256 a[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_loadu_ps(src + (r + i) * lds + q);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (q + i) * ldd + r,
                                 _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
                _mm256_storeu_ps(dst + (q + i + 4) * ldd + r,
                                 _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
            }
        }
        for (; q < w; q++)
            for (int i = 0; i < 8; i++)
                dst[q * ldd + r + i] = src[(r + i) * lds + q];
    }
    for (; r < h; r++)
        for (int64_t q = 0; q < w; q++)
            dst[q * ldd + r] = src[r * lds + q];
}
#else
static void transpose(const float *src, int64_t lds, int64_t h, int64_t w, float *dst, int64_t ldd)
{
    for (int64_t r = 0; r < h; r++)
        for (int64_t q = 0; q < w; q++)
            dst[q * ldd + r] = src[r * lds + q];
}
#endif

struct pass_ws {
    float *Kt, *Vt, *Kv, *S, *dP, *PT, *dST, *Xp, *Gp, *ax;
};

/* One thread's workspace of the second pass, carved from t (NULL: only the size). */
static int64_t pass_bytes(const struct attn *a, char *t, struct pass_ws *p)
{
    const int64_t sizes[] = {cpu_avx2_pack_bt_bytes(TJ, a->D),
                             cpu_avx2_pack_bt_bytes(TJ, a->Dw),
                             cpu_avx2_pack_bt_bytes(a->D, TJ),
                             4 * PSTRIP * TJ,
                             4 * PSTRIP * TJ,
                             4 * TJ * TI,
                             4 * TJ * TI,
                             cpu_avx2_pack_bt_bytes(a->D, TI),
                             cpu_avx2_pack_bt_bytes(a->Dw, TI),
                             4 * a->n * a->D};
    float **dst[] = {&p->Kt, &p->Vt,  &p->Kv, &p->S,  &p->dP,
                     &p->PT, &p->dST, &p->Xp, &p->Gp, &p->ax};
    int64_t off = 0;
    for (size_t q = 0; q < sizeof sizes / sizeof *sizes; q++) {
        if (t)
            *dst[q] = (float *)(t + off);
        off += al64(sizes[q]);
    }
    return off;
}

/* The tile [j0, j0 + tj) and the intervals [q, q1) of the rows' block that meet it. */
struct tile {
    int64_t j0, tj, q, q1;
};

/* Rows [i0, i0 + h) against the tile: P into S, dS into dP (row stride TJ), 0 outside the
 * intervals, their transposes into columns [u, u + h) of PT and dST, and dS y into the thread's
 * dx. */
AVX2_LOOPS static void avx2_strip(const struct attn *a, const struct pattern *pt,
                                  const struct pass_ws *p, const float *lam, const float *dlt,
                                  int64_t i0, int64_t h, int64_t u, const struct tile *tl)
{
    const int64_t tj = tl->tj;
    const float *X = a->X, *G = a->G;
    const float c = (float)a->cval;
    const bool wdx = a->gx || a->gc, wds = wdx || a->gy;
    cpu_avx2_strip_abt(h, a->D, X + i0 * a->D, a->D, p->Kt, tj, p->S, TJ);
    for (int64_t r = 0; r < h; r++)
        cpu_expsum_scaled_f32(p->S + r * TJ, tj, c, lam[i0 + r]);
    mask_cols(pt, tl->q, tl->q1, tl->j0, tj, p->S, TJ, h);
    if (wds) {
        cpu_avx2_strip_abt(h, a->Dw, G + i0 * a->Dw, a->Dw, p->Vt, tj, p->dP, TJ);
        for (int64_t r = 0; r < h; r++) {
            const float d = dlt[i0 + r], *P = p->S + r * TJ;
            float *dS = p->dP + r * TJ;
#pragma omp simd
            for (int64_t q = 0; q < tj; q++)
                dS[q] = P[q] * (dS[q] - d);
        }
        mask_cols(pt, tl->q, tl->q1, tl->j0, tj, p->dP, TJ, h);
    }
    if (a->gw)
        transpose(p->S, TJ, h, tj, p->PT + u, TI);
    if (a->gy)
        transpose(p->dP, TJ, h, tj, p->dST + u, TI);
    if (wdx)
        cpu_avx2_strip_av(h, tj, p->dP, TJ, p->Kv, a->D, p->ax + i0 * a->D, a->D);
}

/* The blocks of TI rows of x and G packed once per call for the products dy += dS^T x and
 * dw += P^T G (struct packed; without ranges only, where block b has rows [b TI, b TI + TI)),
 * shared by the threads: each tile of the second pass read them packed again otherwise. */
struct packed {
    float *X, *G;   /* NULL: pack per block */
    int64_t xb, gb; /* floats per block */
};

static int64_t packed_bytes(const struct attn *a, struct packed *pk)
{
    const int64_t nb = (a->n + TI - 1) / TI;
    pk->xb = a->gy ? al64(cpu_avx2_pack_bt_bytes(a->D, TI)) / 4 : 0;
    pk->gb = a->gw ? al64(cpu_avx2_pack_bt_bytes(a->Dw, TI)) / 4 : 0;
    return 4 * nb * (pk->xb + pk->gb);
}

static void pack_blocks(const struct attn *a, const struct packed *pk)
{
    const int64_t nb = (a->n + TI - 1) / TI;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t bh = a->n - b * TI < TI ? a->n - b * TI : TI;
        if (pk->X)
            cpu_avx2_pack_v(bh, a->D, (const float *)a->X + b * TI * a->D, a->D,
                            pk->X + b * pk->xb);
        if (pk->G)
            cpu_avx2_pack_v(bh, a->Dw, (const float *)a->G + b * TI * a->Dw, a->Dw,
                            pk->G + b * pk->gb);
    }
}

static void avx2_pass(const struct attn *a, const struct pattern *pt, const float *lam,
                      const float *dlt, char *ws, int64_t stride, const struct packed *pk)
{
    const float *X = a->X, *Y = a->Y, *W = a->W, *G = a->G;
    const int D = a->D, Dw = a->Dw;
    const bool wdx = a->gx || a->gc, wds = wdx || a->gy;
    const int64_t nt = pt->ntiles;
#pragma omp parallel num_threads(a->nth)
    {
        struct pass_ws p;
        pass_bytes(a, ws + (int64_t)thread_id() * stride, &p); /* p.ax: zero */
        if (pk->X || pk->G) {
            pack_blocks(a, pk); /* its barrier ends the packing */
        }
        /* static, as generic_pass: the same tiles in each thread's copy of dx in every call */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < nt; t++) {
            const int64_t j0 = t * TJ, tj = a->m - j0 < TJ ? a->m - j0 : TJ;
            float *gy = a->gy ? (float *)a->gy + j0 * D : NULL;
            float *gw = a->gw ? (float *)a->gw + j0 * Dw : NULL;
            cpu_avx2_pack_bt(tj, D, Y + j0 * D, D, p.Kt);
            if (wds)
                cpu_avx2_pack_bt(tj, Dw, W + j0 * Dw, Dw, p.Vt);
            if (wdx)
                cpu_avx2_pack_v(tj, D, Y + j0 * D, D, p.Kv);
            if (gy)
                memset(gy, 0, sizeof(float) * (size_t)(tj * D));
            if (gw)
                memset(gw, 0, sizeof(float) * (size_t)(tj * Dw));
            for (int64_t e = pt->toff[t]; e < pt->toff[t + 1]; e++) {
                const int64_t c = pt->tent[2 * e], i1 = pt->blk[2 * c + 1];
                const struct tile tl = {j0, tj, pt->tent[2 * e + 1], pt->ivoff[c + 1]};
                for (int64_t b0 = pt->blk[2 * c]; b0 < i1; b0 += TI) {
                    const int64_t bh = i1 - b0 < TI ? i1 - b0 : TI;
                    for (int64_t u = 0; u < bh; u += PSTRIP)
                        avx2_strip(a, pt, &p, lam, dlt, b0 + u, bh - u < PSTRIP ? bh - u : PSTRIP,
                                   u, &tl);
                    if (gw) {
                        const float *Gp = pk->G ? pk->G + b0 / TI * pk->gb : p.Gp;
                        if (!pk->G)
                            cpu_avx2_pack_v(bh, Dw, G + b0 * Dw, Dw, p.Gp);
                        cpu_avx2_strip_av(tj, bh, p.PT, TI, Gp, Dw, gw, Dw);
                    }
                    if (gy) {
                        const float *Xp = pk->X ? pk->X + b0 / TI * pk->xb : p.Xp;
                        if (!pk->X)
                            cpu_avx2_pack_v(bh, D, X + b0 * D, D, p.Xp);
                        cpu_avx2_strip_av(tj, bh, p.dST, TI, Xp, D, gy, D);
                    }
                }
            }
            for (int64_t q = 0; gy && q < tj * D; q++)
                gy[q] *= (float)a->cval;
        }
    }
}

/* ---- the entry points ------------------------------------------------------------------------ */

/* Zeroes each thread's copy of dx (elements of es bytes, stride bytes apart from acc), when
 * dx or dc is wanted. */
static void zero_dx(const struct attn *a, char *acc, int64_t stride, size_t es)
{
    for (int u = 0; u < a->nth && (a->gx || a->gc); u++)
        memset(acc + u * stride, 0, es * (size_t)(a->n * a->D));
}

/* What both entry points share: the form (else SR_ENOTSUP), the sizes and the arrays. */
static sr_status attn_setup(const sr_kernel *k, const sr_run_desc *r, const char *name,
                            struct attn *a)
{
    const char *why = attn_match(k, a);
    if (why)
        return sr__error(k->ctx, SR_ENOTSUP,
                         "%s: this kernel has no fused backward (%s); use sr_kernel_grad", name,
                         why);
    a->n = k->axis == 1 ? r->nx : r->ny, a->m = k->axis == 1 ? r->ny : r->nx;
    a->X = r->args[a->x], a->Y = r->args[a->y], a->W = r->args[a->w];
    if (a->c >= 0)
        a->cval = ld(r->args[a->c], k->dtype == SR_F64, 0);
    return SR_OK;
}

/* The workspace, per_thread bytes for each thread (as many as the budget lets run) after
 * al64(shared) bytes: SR_EBUDGET when even that exceeds the memory budget. */
static sr_status attn_alloc(const sr_kernel *k, struct attn *a, const char *name,
                            int64_t per_thread, int64_t shared, char **ws)
{
    sr_ctx *ctx = k->ctx;
    const int64_t lim = sr__call_budget(k);
    a->nth = sr__threads(ctx, per_thread);
    const int64_t bytes = per_thread * a->nth + al64(shared);
    if (lim > 0 && bytes > lim)
        return sr__error(ctx, SR_EBUDGET,
                         "%s: the fused backward needs %lld bytes of workspace (per thread a copy "
                         "of dx, %lld x %d, and tiles), over the memory budget of %lld bytes",
                         name, (long long)bytes, (long long)a->n, a->D, (long long)lim);
    *ws = aligned_alloc(64, (size_t)bytes);
    if (!*ws)
        return sr__error(ctx, SR_ENOMEM, "%s: cannot allocate %lld bytes of workspace", name,
                         (long long)bytes);
    return SR_OK;
}

/* The pattern of the call (pt), or SR_EBUDGET or SR_ENOMEM with name's message. */
static sr_status attn_pattern(const sr_kernel *k, const struct attn *a, const struct sr_rplan *p,
                              const char *name, struct pattern *pt)
{
    int64_t bytes = 0;
    const int64_t limit = sr__call_budget(k);
    sr_status st = pattern_new(a, p, limit, &bytes, pt);
    if (st == SR_EBUDGET)
        return sr__error(k->ctx, SR_EBUDGET,
                         "%s: the block lists of the fused backward (%lld blocks) take %lld bytes, "
                         "over the memory budget of %lld bytes",
                         name, (long long)(p ? p->nblocks : 1), (long long)bytes, (long long)limit);
    if (st != SR_OK)
        return sr__error(k->ctx, SR_ENOMEM, "%s: out of memory for the lists of %lld blocks", name,
                         (long long)(p ? p->nblocks : 1));
    return SR_OK;
}

void cpu_attn_fill_gaps(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                        int64_t n, void *lse)
{
    int64_t o = 0;
    for (int64_t c = 0; c <= p->nblocks; c++) {
        const int64_t next = c < p->nblocks ? p->blk[2 * c] : n;
        if (next > o)
            sr__fill_identity(k, r, o, next);
        for (int64_t i = o; i < next; i++)
            st(lse, k->dtype == SR_F64, i, -INFINITY);
        if (c < p->nblocks)
            o = p->blk[2 * c + 1];
    }
}

sr_status cpu_attn_run_lse(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                           void *lse)
{
    const char *name = p ? "sr_kernel_run_lse_ranges" : "sr_kernel_run_lse";
    struct attn a;
    sr_status status = attn_setup(k, r, name, &a);
    if (status != SR_OK || a.n == 0)
        return status;
    const int f64 = k->dtype == SR_F64;
    if (a.m == 0 && !p) { /* no pairs: the values 0 and lam = -inf, as the reductions give */
        memset(r->out, 0, (f64 ? 8 : 4) * (size_t)(a.n * a.Dw));
        for (int64_t i = 0; i < a.n; i++)
            st(lse, f64, i, -INFINITY);
        return SR_OK;
    }
    struct pattern pt;
    if ((status = attn_pattern(k, &a, p, name, &pt)) != SR_OK)
        return status;
    const bool avx2 = !f64 && cpu_avx2_usable();
    char *ws;
    const int64_t per_thread = avx2 ? lam_bytes(&a, true) : al64(8 * a.Dw);
    if ((status = attn_alloc(k, &a, name, per_thread, 8 * a.n, &ws)) != SR_OK) {
        pattern_free(&pt);
        return status;
    }
    if (avx2)
        avx2_lam(&a, &pt, lse, r->out, ws + al64(8 * a.n), per_thread);
    else {
        generic_lam(&a, &pt, f64, (double *)ws, r->out, ws + al64(8 * a.n), per_thread);
        for (int64_t c = 0; c < pt.nb; c++)
            for (int64_t i = pt.blk[2 * c]; i < pt.blk[2 * c + 1]; i++)
                st(lse, f64, i, ((double *)ws)[i]);
    }
    if (p)
        cpu_attn_fill_gaps(k, r, p, a.n, lse);
    free(ws);
    pattern_free(&pt);
    return SR_OK;
}

sr_status cpu_attn_vjp(const sr_kernel *k, const sr_run_desc *r, const struct sr_rplan *p,
                       const void *gout, const void *out, const void *lse, void *const *grads)
{
    const char *name = p ? "sr_kernel_vjp_ranges" : "sr_kernel_vjp";
    struct attn a;
    sr_status status = attn_setup(k, r, name, &a);
    if (status != SR_OK)
        return status;
    const int f64 = k->dtype == SR_F64;
    a.G = gout, a.O = out;
    a.gx = grads[a.x], a.gy = grads[a.y], a.gw = grads[a.w], a.gc = a.c >= 0 ? grads[a.c] : NULL;
    const size_t es = f64 ? 8 : 4;
    void *zero[] = {a.gx, a.gy, a.gw, a.gc};
    const int64_t rows[] = {a.n * a.D, a.m * a.D, a.m * a.Dw, 1};
    for (int q = 0; q < 4; q++)
        if (zero[q])
            memset(zero[q], 0, es * (size_t)rows[q]);
    if (a.n == 0 || a.m == 0 || !(a.gx || a.gy || a.gw || a.gc) || (p && p->nblocks == 0))
        return SR_OK;
    struct pattern pt;
    if ((status = attn_pattern(k, &a, p, name, &pt)) != SR_OK)
        return status;
    const bool avx2 = !f64 && cpu_avx2_usable();
    int64_t per_thread;
    if (avx2) {
        int64_t pb = pass_bytes(&a, NULL, &(struct pass_ws){0}), lb = lam_bytes(&a, false);
        per_thread = pb > lb ? pb : lb;
    } else
        per_thread = al64(8 * (a.n * a.D + TJ * (a.D + a.Dw)));
    /* The packed blocks of x and G after dlt and lam, without ranges, when they fit the budget
     * beside the rest. */
    struct packed pk = {0};
    int64_t shared = al64(16 * a.n);
    const int64_t pkb = avx2 && !p ? packed_bytes(&a, &pk) : 0, lim = sr__call_budget(k);
    if (pkb > 0 && (lim <= 0 || per_thread * sr__threads(k->ctx, per_thread) + shared + pkb <= lim))
        shared += pkb;
    char *ws;
    if ((status = attn_alloc(k, &a, name, per_thread, shared, &ws)) != SR_OK) {
        pattern_free(&pt);
        return status;
    }
    double *dlt = (double *)ws, *lam = dlt + a.n;
    if (shared > al64(16 * a.n)) {
        float *pm = (float *)(ws + al64(16 * a.n));
        pk.X = pk.xb ? pm : NULL;
        pk.G = pk.gb ? pm + (a.n + TI - 1) / TI * pk.xb : NULL;
    }
    char *tws = ws + al64(shared);
    /* Each thread's copy of dx: the end of its second pass's workspace, which the first pass
     * may overwrite; zeroed after it, for the threads that OpenMP runs or not. */
    const int64_t nD = a.n * a.D;
    const int64_t ax_off = avx2 ? pass_bytes(&a, NULL, &(struct pass_ws){0}) - al64(4 * nD) : 0;
    deltas(&a, f64, dlt);
    if (avx2) {
        float *lam32 = (float *)lam, *dlt32 = lam32 + a.n; /* both in lam's doubles */
        for (int64_t i = 0; i < a.n; i++)
            dlt32[i] = (float)dlt[i];
        if (lse)
            memcpy(lam32, lse, sizeof(float) * (size_t)a.n);
        else
            avx2_lam(&a, &pt, lam32, NULL, tws, per_thread);
        zero_dx(&a, tws + ax_off, per_thread, es);
        avx2_pass(&a, &pt, lam32, dlt32, tws, per_thread, &pk);
    } else {
        if (lse)
            for (int64_t i = 0; i < a.n; i++)
                lam[i] = ld(lse, f64, i);
        else
            generic_lam(&a, &pt, f64, lam, NULL, tws, per_thread);
        zero_dx(&a, tws + ax_off, per_thread, es);
        generic_pass(&a, &pt, f64, lam, dlt, tws, per_thread);
    }
    if (a.gx || a.gc)
        finish_dx(&a, f64, tws + ax_off, per_thread, !avx2);
    free(ws);
    pattern_free(&pt);
    return SR_OK;
}
