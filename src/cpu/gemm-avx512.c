/*
 * gemm-avx512.c — symred's own AVX-512 gemm for the gemm-epilogue strategy (src/cpu/gemm.c).
 *
 * Why: on the AVX-512 machines symred runs on, Debian's BLIS 0.9 picks 256-bit AVX2 kernels
 * (zen3, haswell), or its portable generic ones on a CPU it does not know (Zen 5), and cannot be
 * told otherwise (see gemm.c): that caps the high-D path at half of what the cores can do, or far
 * less. The one product the strategy needs is small and fixed:
 * C (m x n, row stride ldc) = A B^T with A (m x K) and B (n x K) both row-major with K
 * contiguous, A the output-axis rows (packed once per row block and reused for every tile of the
 * reduced axis), B a tile of the reduced axis (packed per call). docs/avx512-gemm.md has the
 * measurements behind the shapes.
 *
 * Blocking (Goto / BLIS, chosen from the L2 size that cpuid reports, docs/avx512-gemm.md): the
 * micro-kernel keeps an MR x NR block of C in 28 zmm registers (float32 14 x 32, float64 14 x 16):
 * per k it loads two vectors of the packed B micro-panel and broadcasts MR values of the packed A
 * micro-panel, 28 FMAs, and prefetches both panels PF steps ahead. K is not cut at all when a
 * chunk of MC rows of A and NC rows of B (MC x K + NC x K values) fits in L2 (every K up to
 * about 1000 float32 with a 1 MiB L2): each block of C is then written once, never read back
 * (blocks of K cost 6-8 % of the kernel's speed in the C reloads, measured). Larger K is cut
 * into blocks of nearly one size that do fit. Per K block, B is packed NC rows at a time; that
 * chunk stays in L2 while every MC-row chunk of A passes against it.
 * Partial tiles (m, n not multiples of MR, NR) run on zero-padded panels into a scratch block,
 * then copy their valid part: any size is exact, including 1 and primes.
 *
 * Every function that uses AVX-512 carries __attribute__((target)), so the library still builds
 * for generic x86-64 (and for other architectures, where cpu_avx512_usable() is false and none
 * of it is compiled); cpu_avx512_usable() checks the CPU (and the OS's saving of zmm state) at
 * run time.
 */
#include "cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX512_KERNEL 1
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,fma")))
#else
#define HAVE_AVX512_KERNEL 0
#endif

/* MR x NR: the micro-kernel. MC, NC: the rows of A and of B per chunk (9 and 4 or 8 micro-panels:
 * flat between 56 x 512 and 252 x 128, measured). PF: the kernel's prefetch distance in k steps;
 * PFB: the B packing's, in values along a row (64 measured best of 0, 64, 128, 256). */
enum { MR = 14, NR32 = 32, NR64 = 16, MC = 9 * MR, NC = 128, PF = 32, PFB = 64 };

static int nr_of(int f64) { return f64 ? NR64 : NR32; }

/* The L2 size per core (glibc reads it from cpuid: leaf 4 on Intel, 0x8000001D on AMD), read
 * once: cpuid traps to the hypervisor in a VM. 1 MiB when unknown. */
static int64_t l2_bytes;
static pthread_once_t l2_once = PTHREAD_ONCE_INIT;

static void l2_probe(void)
{
    long v = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
    v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    l2_bytes = v >= (64 << 10) ? v : 1 << 20;
}

static int64_t l2_size(void)
{
    pthread_once(&l2_once, l2_probe);
    return l2_bytes;
}

int64_t cpu_avx512_kc_max(int f64)
{
    int64_t es = f64 ? 8 : 4, cap = l2_size() * 7 / 8 / ((int64_t)(MC + NC) * es);
    return cap < 64 ? 64 : cap;
}

/* The K block: all of K when an MC-row chunk of A and an NC-row chunk of B fit in 7/8 of L2,
 * else blocks of nearly one size that do (784 = 2 x 392, not 516 + 268: a short block pays the
 * C reload for little work), never below 64. */
static int64_t kc_of(int64_t K, int f64)
{
    int64_t cap = cpu_avx512_kc_max(f64);
    int64_t nb = (K + cap - 1) / cap;
    return nb ? (K + nb - 1) / nb : 0;
}
static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

bool cpu_avx512_usable(void)
{
#if HAVE_AVX512_KERNEL
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
#else
    return false;
#endif
}

int64_t cpu_avx512_pack_a_bytes(int64_t m, int64_t K, int f64)
{
    return round_up(m, MR) * K * (f64 ? 8 : 4) + 64;
}

int64_t cpu_avx512_pack_b_bytes(int64_t n, int64_t K, int f64)
{
    int64_t es = f64 ? 8 : 4, kc = kc_of(K, f64);
    /* One packed chunk of B (at most NC rows of one K block), plus the MR x NR scratch block of
     * the partial tiles. */
    return round_up(n < NC ? n : NC, nr_of(f64)) * kc * es + (int64_t)MR * nr_of(f64) * es + 128;
}

static void *align64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

void cpu_avx512_describe(int f64, int64_t K, char *buf, size_t size)
{
    int64_t kc = kc_of(K, f64), nb = kc ? (K + kc - 1) / kc : 0;
    snprintf(buf, size,
             "micro-kernel %dx%d, K = %lld in %lld block%s of %lld, chunks of %d x %d rows for a "
             "%lld KiB L2",
             MR, nr_of(f64), (long long)K, (long long)nb, nb == 1 ? "" : "s", (long long)kc, MC, NC,
             (long long)(l2_size() >> 10));
}

void cpu_avx512_dot_info(int f64, int64_t K, sr_plan_info *info)
{
    info->dot_mr = MR;
    info->dot_nr = nr_of(f64);
    info->dot_kc = (int)kc_of(K, f64);
}

/* Packs rows [0, m) x columns [k0, k0 + kc) of X (row stride K) into panels of w rows, each
 * kc x w with the w values of one k contiguous, zero-padding rows past m. */
static void pack_f32(const float *X, int64_t m, int64_t K, int64_t k0, int64_t kc, int w,
                     float *dst)
{
    for (int64_t q = 0; q < m; q += w, dst += kc * w) {
        int rows = m - q < w ? (int)(m - q) : w;
        for (int r = 0; r < rows; r++) {
            const float *src = X + (q + r) * K + k0;
            for (int64_t k = 0; k < kc; k++)
                dst[k * w + r] = src[k];
        }
        for (int r = rows; r < w; r++)
            for (int64_t k = 0; k < kc; k++)
                dst[k * w + r] = 0;
    }
}

static void pack_f64(const double *X, int64_t m, int64_t K, int64_t k0, int64_t kc, int w,
                     double *dst)
{
    for (int64_t q = 0; q < m; q += w, dst += kc * w) {
        int rows = m - q < w ? (int)(m - q) : w;
        for (int r = 0; r < rows; r++) {
            const double *src = X + (q + r) * K + k0;
            for (int64_t k = 0; k < kc; k++)
                dst[k * w + r] = src[k];
        }
        for (int r = rows; r < w; r++)
            for (int64_t k = 0; k < kc; k++)
                dst[k * w + r] = 0;
    }
}

/* Packed A of m rows: for each K block, the panels of its columns (the layout the kernel
 * walks). Ap must hold cpu_avx512_pack_a_bytes(m, K) bytes. */
void cpu_avx512_pack_a(int f64, int64_t m, int64_t K, const void *A, void *Ap)
{
    int64_t mp = round_up(m, MR), kb = kc_of(K, f64);
    char *dst = align64(Ap);
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
        int64_t kc = K - k0 < kb ? K - k0 : kb;
        if (f64)
            pack_f64(A, m, K, k0, kc, MR, (double *)dst);
        else
            pack_f32(A, m, K, k0, kc, MR, (float *)dst);
        dst += mp * kc * (f64 ? 8 : 4);
    }
}

#if HAVE_AVX512_KERNEL

/* C[0..MR) x [0..32) (row stride ldc) = (acc ? C : 0) + a^T b over kc: a is kc x MR, b kc x 32. */
AVX512 static void kernel_f32(int64_t kc, const float *restrict a, const float *restrict b,
                              float *restrict c, int64_t ldc, int acc)
{
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
        /* The block of C is read (acc) or written at the end: start fetching it now. */
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
    }
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR32) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        /* Both panels stream from L2 (a K block does not fit in L1): fetch them ahead. */
        _mm_prefetch((const char *)(b + PF * NR32), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + PF * NR32 + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + PF * MR), _MM_HINT_T0);
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            const __m512 ar = _mm512_set1_ps(a[r]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        if (acc) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_loadu_ps(cr));
            c1[r] = _mm512_add_ps(c1[r], _mm512_loadu_ps(cr + 16));
        }
        _mm512_storeu_ps(cr, c0[r]);
        _mm512_storeu_ps(cr + 16, c1[r]);
    }
}

AVX512 static void kernel_f64(int64_t kc, const double *restrict a, const double *restrict b,
                              double *restrict c, int64_t ldc, int acc)
{
    __m512d c0[MR], c1[MR];
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        c0[r] = _mm512_setzero_pd();
        c1[r] = _mm512_setzero_pd();
    }
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR64) {
        const __m512d b0 = _mm512_load_pd(b), b1 = _mm512_load_pd(b + 8);
        _mm_prefetch((const char *)(b + PF * NR64), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + PF * NR64 + 8), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + PF * MR), _MM_HINT_T0);
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            const __m512d ar = _mm512_set1_pd(a[r]);
            c0[r] = _mm512_fmadd_pd(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_pd(ar, b1, c1[r]);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        double *cr = c + r * ldc;
        if (acc) {
            c0[r] = _mm512_add_pd(c0[r], _mm512_loadu_pd(cr));
            c1[r] = _mm512_add_pd(c1[r], _mm512_loadu_pd(cr + 8));
        }
        _mm512_storeu_pd(cr, c0[r]);
        _mm512_storeu_pd(cr + 8, c1[r]);
    }
}

/* Transposes the 16 x 16 block r (16 rows of 16 values) in place: r[c] becomes column c.
 * Unpacks of 32-bit then 64-bit pairs inside the 128-bit lanes, then two rounds of lane
 * shuffles (0x88: lanes 0 and 2 of each operand, 0xDD: lanes 1 and 3). */
AVX512 static inline void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

/* pack_f32 for the B panels (w = 32), by 16 x 16 transposes in registers: the scalar loop
 * spent about a tenth of the kNN's time here. Rows past n and columns past kc are zeros. */
AVX512 static void pack_b_f32(const float *X, int64_t n, int64_t K, int64_t k0, int64_t kc,
                              float *dst)
{
    for (int64_t q = 0; q < n; q += NR32, dst += kc * NR32)
        for (int h = 0; h < NR32; h += 16)
            for (int64_t k = 0; k < kc; k += 16) {
                const int kn = kc - k < 16 ? (int)(kc - k) : 16;
                const __mmask16 mask = (__mmask16)((1u << kn) - 1);
                __m512 r[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) {
                    const float *src = X + (q + h + t) * K + k0 + k;
                    r[t] = q + h + t < n ? _mm512_maskz_loadu_ps(mask, src) : _mm512_setzero_ps();
                    /* The rows come from memory, 16 streams at once: fetch ahead. */
                    _mm_prefetch((const char *)(src + PFB), _MM_HINT_T0);
                }
                transpose16(r);
                for (int t = 0; t < kn; t++)
                    _mm512_store_ps(dst + (k + t) * NR32 + h, r[t]);
            }
}

/* One MR x nr block of C at (i, j) over one K block: the micro-kernel, or for a partial block
 * (rows < MR or cols < nr) the micro-kernel into the scratch block, then its valid part. */
AVX512 static void block(int f64, int64_t kc, const char *a, const char *b, char *c, int64_t ldc,
                         int acc, int rows, int cols, char *scratch)
{
    const int nr = nr_of(f64);
    const int64_t es = f64 ? 8 : 4;
    if (rows == MR && cols == nr) {
        if (f64)
            kernel_f64(kc, (const double *)a, (const double *)b, (double *)c, ldc, acc);
        else
            kernel_f32(kc, (const float *)a, (const float *)b, (float *)c, ldc, acc);
        return;
    }
    for (int r = 0; acc && r < rows; r++)
        memcpy(scratch + r * nr * es, c + r * ldc * es, (size_t)(cols * es));
    if (f64)
        kernel_f64(kc, (const double *)a, (const double *)b, (double *)scratch, nr, acc);
    else
        kernel_f32(kc, (const float *)a, (const float *)b, (float *)scratch, nr, acc);
    for (int r = 0; r < rows; r++)
        memcpy(c + r * ldc * es, scratch + r * nr * es, (size_t)(cols * es));
}

/* The micro-panels of one packed chunk of B (nj rows) against the MR-row panels of the packed
 * A block, MC rows of A at a time; C points at the chunk's first column. */
AVX512 static void chunk(int f64, int64_t m, int64_t nj, int64_t kc, const char *ablock,
                         const char *bp, char *C, int64_t ldc, int acc, char *scratch)
{
    const int nr = nr_of(f64);
    const int64_t es = f64 ? 8 : 4;
    for (int64_t i0 = 0; i0 < m; i0 += MC)
        for (int64_t j = 0; j < nj; j += nr)
            for (int64_t i = i0; i < m && i < i0 + MC; i += MR) {
                const int rows = m - i < MR ? (int)(m - i) : MR;
                const int cols = nj - j < nr ? (int)(nj - j) : nr;
                block(f64, kc, ablock + i * kc * es, bp + j * kc * es, C + (i * ldc + j) * es, ldc,
                      acc, rows, cols, scratch);
            }
}

/* Loop order per K block: chunks of NC rows of B (packed, kept in L2), chunks of MC rows of A
 * (packed once by the caller, from L3 into L2), then the micro-panels: each B micro-panel against
 * the chunk's MR-row panels of A. */
void cpu_avx512_gemm(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *B,
                     void *Bp, void *C, int64_t ldc)
{
    const int nr = nr_of(f64);
    const int64_t es = f64 ? 8 : 4, mp = round_up(m, MR), kb = kc_of(K, f64);
    const char *ablock = align64((void *)Ap);
    char *bp = align64(Bp), *scratch = bp + round_up(n < NC ? n : NC, nr) * kb * es;
    for (int64_t i = 0; K == 0 && i < m; i++)
        memset((char *)C + i * ldc * es, 0, (size_t)(n * es)); /* the empty sum */
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
        const int64_t kc = K - k0 < kb ? K - k0 : kb;
        const int acc = k0 > 0;
        for (int64_t j0 = 0; j0 < n; j0 += NC) {
            const int64_t nj = n - j0 < NC ? n - j0 : NC;
            const char *Bj = (const char *)B + j0 * K * es;
            if (f64)
                pack_f64((const double *)Bj, nj, K, k0, kc, nr, (double *)bp);
            else
                pack_b_f32((const float *)Bj, nj, K, k0, kc, (float *)bp);
            chunk(f64, m, nj, kc, ablock, bp, (char *)C + j0 * es, ldc, acc, scratch);
        }
        ablock += mp * kc * es;
    }
}

/* Packs rows [k0, k0 + kc) x columns [j0, j0 + nj) of V (row stride ldv) into panels of nr
 * columns, each kc x nr with the nr values of one k contiguous: row segments of V copied as they
 * are, zero-padded past nj. */
static void pack_kn(int f64, const char *V, int64_t ldv, int64_t k0, int64_t kc, int64_t j0,
                    int64_t nj, char *dst)
{
    const int nr = nr_of(f64);
    const int64_t es = f64 ? 8 : 4;
    for (int64_t q = 0; q < nj; q += nr, dst += kc * nr * es) {
        const int64_t w = nj - q < nr ? nj - q : nr;
        for (int64_t k = 0; k < kc; k++) {
            char *d = dst + k * nr * es;
            memcpy(d, V + ((k0 + k) * ldv + j0 + q) * es, (size_t)(w * es));
            if (w < nr)
                memset(d + w * es, 0, (size_t)((nr - w) * es));
        }
    }
}

void cpu_avx512_gemm_kn(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *V,
                        int64_t ldv, void *Bp, void *C, int64_t ldc, int acc)
{
    const int nr = nr_of(f64);
    const int64_t es = f64 ? 8 : 4, mp = round_up(m, MR), kb = kc_of(K, f64);
    const char *ablock = align64((void *)Ap);
    char *bp = align64(Bp), *scratch = bp + round_up(n < NC ? n : NC, nr) * kb * es;
    for (int64_t i = 0; K == 0 && !acc && i < m; i++)
        memset((char *)C + i * ldc * es, 0, (size_t)(n * es)); /* the empty sum */
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
        const int64_t kc = K - k0 < kb ? K - k0 : kb;
        for (int64_t j0 = 0; j0 < n; j0 += NC) {
            const int64_t nj = n - j0 < NC ? n - j0 : NC;
            pack_kn(f64, V, ldv, k0, kc, j0, nj, bp);
            chunk(f64, m, nj, kc, ablock, bp, (char *)C + j0 * es, ldc, acc || k0 > 0, scratch);
        }
        ablock += mp * kc * es;
    }
}

/* P[c] = F[c] == -inf ? 0 : exp(F[c] - m), c < n (P may be F); returns the sum of P. exp by
 * 2^n e^r, n = round(x / ln 2), r = x - n ln 2 in two parts (Cody and Waite), e^r by its Taylor
 * polynomial of degree 7 (relative error below 1e-8 on |r| <= ln 2 / 2), scaled by vscalefps,
 * which gives 0 below the smallest subnormal and +inf above the largest float. x is clamped to
 * [-104, 89] first (NaN passes the clamp: vmaxps returns its second operand when one is NaN). */
AVX512 double cpu_avx512_expsum_f32(const float *F, float *P, int64_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m), lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(89.0f);
    const __m512 l2e = _mm512_set1_ps(1.44269504088896341f), c1 = _mm512_set1_ps(0.693359375f),
                 c2 = _mm512_set1_ps(-2.12194440e-4f), ninf = _mm512_set1_ps(-__builtin_inff());
    static const float tc[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                1.0f / 6,    0.5f,       1.0f,       1.0f};
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 k = n - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c)) - 1);
        const __m512 f = _mm512_maskz_loadu_ps(k, F + c);
        __m512 x = _mm512_sub_ps(f, vm);
        x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
        const __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(x, l2e), _MM_FROUND_TO_NEAREST_INT);
        __m512 r = _mm512_fnmadd_ps(nn, c1, x);
        r = _mm512_fnmadd_ps(nn, c2, r);
        __m512 p = _mm512_set1_ps(tc[0]);
#pragma GCC unroll 7
        for (int t = 1; t < 8; t++)
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(tc[t]));
        p = _mm512_scalef_ps(p, nn);
        p = _mm512_maskz_mov_ps(k & ~_mm512_cmp_ps_mask(f, ninf, _CMP_EQ_OQ), p);
        _mm512_mask_storeu_ps(P + c, k, p);
        sum = _mm512_add_ps(sum, p);
    }
    return (double)_mm512_reduce_add_ps(sum);
}

#else

void cpu_avx512_gemm(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *B,
                     void *Bp, void *C, int64_t ldc)
{
    (void)f64, (void)m, (void)n, (void)K, (void)Ap, (void)B, (void)Bp, (void)C, (void)ldc;
}

void cpu_avx512_gemm_kn(int f64, int64_t m, int64_t n, int64_t K, const void *Ap, const void *V,
                        int64_t ldv, void *Bp, void *C, int64_t ldc, int acc)
{
    (void)f64, (void)m, (void)n, (void)K, (void)Ap, (void)V, (void)ldv, (void)Bp, (void)C,
        (void)ldc, (void)acc;
}

double cpu_avx512_expsum_f32(const float *F, float *P, int64_t n, float m)
{
    (void)F, (void)P, (void)n, (void)m;
    return 0;
}

#endif
