/*
 * gemm-avx2.c — symred's AVX2 + FMA products for the fused two-product strategy on machines
 * without AVX-512F (src/cpu/fused.c, float32).
 *
 * Why: there the fused strategy's two products ran through BLIS, one call per tile of F and one
 * per tile of B. Each call packs both operands, and the tiles that keep BLIS's per-call cost low
 * (448 x 256 float32, 448 KiB each: the inner products, F, the exponentials) do not fit the L2
 * beside the tiles of K and V, so every pass over them went to L3. Here the tile of the
 * reduced axis (K^T packed once per tile, V read as it is) stays in L2 and the output rows go
 * through it in strips of a few rows whose inner products, F and weights stay in L1: the
 * products are calls of a 6 x 16 register-blocked micro-kernel on strips, with no per-call set-up
 * and no packing of the strip's operands (a row's value is broadcast from where it lies).
 *
 * The micro-kernel keeps a 6 x 16 block of C in 12 ymm registers: per k it loads two vectors of
 * the 16-column panel and broadcasts 6 values of the strip's rows, 12 FMAs. Its k loop is unrolled
 * 4 times: attention (N = M = 4096, D = 64 and 128, one thread on the AVX2 EPYC) ran 2-8 % faster
 * so, median of the per-round ratios of 15 alternating rounds in one process. A strip of fewer than
 * 6 rows reads its first row again and stores the extra rows nowhere; a panel of fewer than 16
 * columns is zero-padded in its packed operand and its block of C read and written under a mask,
 * so any size is exact.
 *
 * Every function that uses AVX2 carries __attribute__((target)), so the library still builds for
 * generic x86-64 and other architectures; cpu_avx2_usable() checks the CPU at run time.
 */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_KERNEL 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#else
#define HAVE_AVX2_KERNEL 0
#endif

enum { MR = CPU_AVX2_MR, NR = 16 };

bool cpu_avx2_usable(void)
{
#if HAVE_AVX2_KERNEL
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

int64_t cpu_avx2_pack_bt_bytes(int64_t n, int64_t K) { return (n + NR - 1) / NR * NR * K * 4; }

void cpu_avx2_pack_bt(int64_t n, int64_t K, const float *B, int64_t ldb, float *Bp)
{
    for (int64_t p = 0; p < n; p += NR, Bp += K * NR) {
        int cols = n - p < NR ? (int)(n - p) : NR;
        for (int c = 0; c < cols; c++) {
            const float *src = B + (p + c) * ldb;
            for (int64_t k = 0; k < K; k++)
                Bp[k * NR + c] = src[k];
        }
        for (int c = cols; c < NR; c++)
            for (int64_t k = 0; k < K; k++)
                Bp[k * NR + c] = 0;
    }
}

#if HAVE_AVX2_KERNEL
/* The rows of a strip of h rows (h <= MR) at X (row stride ld): the missing ones read row 0. */
static void strip_rows(int h, const float *X, int64_t ld, const float **rows)
{
    for (int r = 0; r < MR; r++)
        rows[r] = X + (r < h ? r : 0) * ld;
}

/* The mask of the valid lanes of the ymm vector at columns [c0, c0 + 8) of n. */
AVX2 static __m256i lane_mask(int64_t n, int64_t c0)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t v = n - c0;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(v < 0 ? 0 : v > 8 ? 8 : v)), idx);
}

/* The micro-kernel's registers: the 6 x 16 block of C, two vectors per row. */
struct acc {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
};

AVX2 void cpu_avx2_pack_v(int64_t K, int64_t n, const float *V, int64_t ldv, float *Vp)
{
    for (int64_t p = 0; p < n; p += NR, Vp += K * NR) {
        const __m256i m0 = lane_mask(n, p), m1 = lane_mask(n, p + 8);
        for (int64_t k = 0; k < K; k++) {
            _mm256_store_ps(Vp + k * NR, _mm256_maskload_ps(V + k * ldv + p, m0));
            _mm256_store_ps(Vp + k * NR + 8, _mm256_maskload_ps(V + k * ldv + p + 8, m1));
        }
    }
}

/* One k step: C += (a[r][k])_r (b0 b1), 12 FMAs. Spelt out row by row so that the block stays
 * in registers (gcc keeps an array of vectors indexed in a loop on the stack). */
#define ROW(r, x0, x1)                                                                             \
    v = _mm256_broadcast_ss(a[r] + k);                                                             \
    t->x0 = _mm256_fmadd_ps(v, b0, t->x0);                                                         \
    t->x1 = _mm256_fmadd_ps(v, b1, t->x1)
AVX2 static inline __attribute__((always_inline)) void step(struct acc *t, const float *const *a,
                                                            int64_t k, __m256 b0, __m256 b1)
{
    __m256 v;
    ROW(0, c00, c01);
    ROW(1, c10, c11);
    ROW(2, c20, c21);
    ROW(3, c30, c31);
    ROW(4, c40, c41);
    ROW(5, c50, c51);
}
#undef ROW

/* Rows [0, h) of the block from and to C (row stride ldc), columns under the masks m0, m1 (the
 * loads and stores plain when not masked), each row spelt out as in step. */
#define LOAD_ROW(r, x0, x1)                                                                        \
    if (h > r && masked) {                                                                         \
        t->x0 = _mm256_maskload_ps(C + r * ldc, m0);                                               \
        t->x1 = _mm256_maskload_ps(C + r * ldc + 8, m1);                                           \
    } else if (h > r) {                                                                            \
        t->x0 = _mm256_loadu_ps(C + r * ldc);                                                      \
        t->x1 = _mm256_loadu_ps(C + r * ldc + 8);                                                  \
    }
#define STORE_ROW(r, x0, x1)                                                                       \
    if (h > r && masked) {                                                                         \
        _mm256_maskstore_ps(C + r * ldc, m0, t->x0);                                               \
        _mm256_maskstore_ps(C + r * ldc + 8, m1, t->x1);                                           \
    } else if (h > r) {                                                                            \
        _mm256_storeu_ps(C + r * ldc, t->x0);                                                      \
        _mm256_storeu_ps(C + r * ldc + 8, t->x1);                                                  \
    }
AVX2 static inline __attribute__((always_inline)) void
block_load(struct acc *t, int h, const float *C, int64_t ldc, __m256i m0, __m256i m1, bool masked)
{
    const __m256 z = _mm256_setzero_ps();
    *t = (struct acc){z, z, z, z, z, z, z, z, z, z, z, z};
    LOAD_ROW(0, c00, c01)
    LOAD_ROW(1, c10, c11)
    LOAD_ROW(2, c20, c21)
    LOAD_ROW(3, c30, c31)
    LOAD_ROW(4, c40, c41)
    LOAD_ROW(5, c50, c51)
}

AVX2 static inline __attribute__((always_inline)) void
block_store(const struct acc *t, int h, float *C, int64_t ldc, __m256i m0, __m256i m1,
            bool masked){STORE_ROW(0, c00, c01) STORE_ROW(1, c10, c11) STORE_ROW(2, c20, c21)
                             STORE_ROW(3, c30, c31) STORE_ROW(4, c40, c41) STORE_ROW(5, c50, c51)}
#undef LOAD_ROW
#undef STORE_ROW

AVX2 static void abt_panel(int h, int64_t K, const float *A, int64_t lda, const float *Bp, float *C,
                           int64_t ldc)
{
    const float *a[MR];
    strip_rows(h, A, lda, a);
    const __m256i ones = _mm256_set1_epi32(-1);
    struct acc t;
    block_load(&t, 0, C, ldc, ones, ones, false);
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++)
        step(&t, a, k, _mm256_load_ps(Bp + k * NR), _mm256_load_ps(Bp + k * NR + 8));
    block_store(&t, h, C, ldc, ones, ones, false);
}

/* Panel by panel, the strip's micro-strips one after the other, so that a panel is read from L2
 * once per strip and from L1 for its other micro-strips. */
AVX2 void cpu_avx2_strip_abt(int64_t h, int64_t K, const float *A, int64_t lda, const float *Bp,
                             int64_t n, float *C, int64_t ldc)
{
    for (int64_t p = 0; p < n; p += NR, Bp += K * NR)
        for (int64_t u = 0; u < h; u += MR)
            abt_panel(h - u < MR ? (int)(h - u) : MR, K, A + u * lda, lda, Bp, C + u * ldc + p,
                      ldc);
}

AVX2 static void av_panel(int h, int64_t K, const float *A, int64_t lda, const float *Vp, int64_t n,
                          int64_t p, float *C, int64_t ldc)
{
    const float *a[MR];
    strip_rows(h, A, lda, a);
    const __m256i m0 = lane_mask(n, p), m1 = lane_mask(n, p + 8);
    /* Only a panel past column n goes under the masks: vmaskmovps is slow on AMD's cores (on
     * the AVX2 EPYC, C += A V on 12 rows with K = 64 ran 1.2-1.4x faster with plain loads and
     * stores; 1.03-1.1x with K = 256 and 512, attention's product with its tile of V). */
    const bool masked = n - p < NR;
    struct acc t;
    block_load(&t, h, C + p, ldc, m0, m1, masked);
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++)
        step(&t, a, k, _mm256_load_ps(Vp + k * NR), _mm256_load_ps(Vp + k * NR + 8));
    block_store(&t, h, C + p, ldc, m0, m1, masked);
}

AVX2 void cpu_avx2_strip_av(int64_t h, int64_t K, const float *A, int64_t lda, const float *Vp,
                            int64_t n, float *C, int64_t ldc)
{
    for (int64_t p = 0; p < n; p += NR, Vp += K * NR)
        for (int64_t u = 0; u < h; u += MR)
            av_panel(h - u < MR ? (int)(h - u) : MR, K, A + u * lda, lda, Vp, n, p, C + u * ldc,
                     ldc);
}
#else
void cpu_avx2_pack_v(int64_t K, int64_t n, const float *V, int64_t ldv, float *Vp)
{
    (void)K, (void)n, (void)V, (void)ldv, (void)Vp;
}
void cpu_avx2_strip_abt(int64_t h, int64_t K, const float *A, int64_t lda, const float *Bp,
                        int64_t n, float *C, int64_t ldc)
{
    (void)h, (void)K, (void)A, (void)lda, (void)Bp, (void)n, (void)C, (void)ldc;
}
void cpu_avx2_strip_av(int64_t h, int64_t K, const float *A, int64_t lda, const float *Vp,
                       int64_t n, float *C, int64_t ldc)
{
    (void)h, (void)K, (void)A, (void)lda, (void)Vp, (void)n, (void)C, (void)ldc;
}
#endif
