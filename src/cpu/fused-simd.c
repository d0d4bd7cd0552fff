/*
 * fused-simd.c — the fused two-product's vectorised softmax steps (fused.h, cpu.h), float32:
 * exp(F - m) and its sum by the CPU JIT's Exp with AVX2 and FMA (or in portable C, vectorised by
 * the compiler; AVX-512's expsum with symred's AVX-512 gemm), the row maximum, and the online
 * softmax's step on one row.
 */
#include "fused.h"

#include <math.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* F[c] = exp(F[c] - m) (0 where F[c] is -inf), c < n; returns their sum. The algorithm of
 * cpu_avx512_expsum_f32 (gemm-avx512.c) in portable C, vectorised by the compiler: 2^n as two
 * factors built from their exponent bits, so that subnormal results come out right. */
static inline __attribute__((always_inline)) double expsum_body(float *F, int64_t n, float m)
{
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; c++) {
        const float f = F[c];
        float x = f - m;
        x = x < -104.0f ? -104.0f : x; /* NaN fails both tests and stays NaN */
        x = x > 89.0f ? 89.0f : x;
        float nn = __builtin_rintf(x * 1.44269504088896341f);
        nn = nn == nn ? nn : 0;
        const float r = (x - nn * 0.693359375f) - nn * -2.12194440e-4f;
        float p = 1.0f / 5040;
        p = p * r + 1.0f / 720;
        p = p * r + 1.0f / 120;
        p = p * r + 1.0f / 24;
        p = p * r + 1.0f / 6;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        const int32_t ni = (int32_t)nn, a = ni / 2, b = ni - a;
        union {
            int32_t i;
            float f;
        } sa = {.i = (a + 127) << 23}, sb = {.i = (b + 127) << 23};
        const float e = f == -__builtin_inff() ? 0.0f : p * sa.f * sb.f;
        F[c] = e;
        sum += e;
    }
    return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The CPU JIT's exponential (sr_exp, src/jit/emit-c.c) of eight float32 values with AVX2 and
 * FMA, its constants and steps: within 1.1 ulp, 0 where the result is below 1.7e-38 (and for
 * -inf), NaN for NaN, +inf above 88.72283 (docs/semantics.md, "The CPU JIT's Exp"); with
 * nonpos, only for values a <= 0 (and NaN), one step less. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
exp_avx2(__m256 a, bool nonpos)
{
    const __m256 sh = _mm256_set1_ps(0x1.8p23f), hi = _mm256_set1_ps(0x1.62e42ep+6f);
    __m256 x = _mm256_max_ps(_mm256_set1_ps(-87.5f), a); /* a NaN stays */
    if (!nonpos)
        x = _mm256_min_ps(hi, x);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), sh);
    const __m256 k = _mm256_sub_ps(t, sh);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.62e4p-1f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0x1.7f7d1cp-20f), r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(0x1.6d10fcp-10f), r, _mm256_set1_ps(0x1.120b62p-7f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.55551ap-5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.5554dep-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1p-1f));
    const __m256 p = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1));
    /* 2^k added to the exponent: k + 127 in the low bits of t. */
    __m256 e = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
    e = _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(1.7e-38f), _CMP_LT_OQ), e);
    /* A NaN's payload bits may have moved the exponent: all ones (a NaN) where a is NaN. */
    e = _mm256_or_ps(e, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    if (!nonpos)
        e = _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(a, hi, _CMP_GT_OQ));
    return e;
}

/* The exponential's argument: F - m, or with `scaled`, F a - m by one rounding (an FMA). */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
exp_arg(__m256 F, __m256 a, __m256 m, bool scaled)
{
    return scaled ? _mm256_fmsub_ps(F, a, m) : _mm256_sub_ps(F, m);
}

/* F[c] = exp(F[c] - m) by exp_avx2, c < n, and their sum; m is not -inf or NaN (F[c] - m would
 * be NaN for F[c] = -inf, whose weight is 0), and with nonpos at least every F[c] that is not NaN.
 * With `scaled`, exp(F[c] a - m) (m at least every F[c] a then). Two vectors at a time; the tail
 * under a mask. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) double
expsum_vec(float *F, int64_t n, float m, bool nonpos, float a, bool scaled)
{
    const __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(a);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m256 e0 = exp_avx2(exp_arg(_mm256_loadu_ps(F + c), va, vm, scaled), nonpos);
        const __m256 e1 = exp_avx2(exp_arg(_mm256_loadu_ps(F + c + 8), va, vm, scaled), nonpos);
        _mm256_storeu_ps(F + c, e0);
        _mm256_storeu_ps(F + c + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    for (; c < n; c += 8) {
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const int64_t left = n - c < 8 ? n - c : 8;
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), idx);
        __m256 e = exp_avx2(exp_arg(_mm256_maskload_ps(F + c, mk), va, vm, scaled), nonpos);
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(F + c, mk, e);
        s0 = _mm256_add_ps(s0, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(s0, s1));
    double t = 0;
    for (int l = 0; l < 8; l++)
        t += lanes[l];
    return t;
}

__attribute__((target("avx2,fma"))) static double expsum_avx2(float *F, int64_t n, float m)
{
    return expsum_vec(F, n, m, false, 1, false);
}

/* expsum_avx2 where m is at least every F[c] that is not NaN (the online softmax's row maximum). */
__attribute__((target("avx2,fma"))) static double expsum_max_avx2(float *F, int64_t n, float m)
{
    return expsum_vec(F, n, m, true, 1, false);
}

/* F[c] = exp(F[c] a - m), c < n, and their sum; m is finite and at least every F[c] a that is not
 * NaN, but for the rounding of one product (the row maximum of the scaled tile). */
__attribute__((target("avx2,fma"))) double fused_expsum_scaled_avx2(float *F, int64_t n, float a,
                                                                    float m)
{
    return expsum_vec(F, n, m, true, a, true);
}

/* F[c] = exp(F[c] a - m), c < n, and their sum, for any finite m (the clamp above and the
 * infinities of exp_avx2 kept). */
__attribute__((target("avx2,fma"))) static double expsum_vec_scaled_avx2(float *F, int64_t n,
                                                                         float a, float m)
{
    return expsum_vec(F, n, m, false, a, true);
}

/* The largest and the smallest value of F[c], c < n, in *hi and *lo (-inf and +inf when n is 0 or
 * every F[c] is NaN: a NaN never wins). */
__attribute__((target("avx2,fma"))) void fused_minmax_avx2(const float *F, int64_t n, float *hi,
                                                           float *lo)
{
    __m256 h0 = _mm256_set1_ps(-INFINITY), h1 = h0, l0 = _mm256_set1_ps(INFINITY), l1 = l0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m256 f0 = _mm256_loadu_ps(F + c), f1 = _mm256_loadu_ps(F + c + 8);
        h0 = _mm256_max_ps(f0, h0);
        h1 = _mm256_max_ps(f1, h1);
        l0 = _mm256_min_ps(f0, l0);
        l1 = _mm256_min_ps(f1, l1);
    }
    float lh[8], ll[8], th = -INFINITY, tl = INFINITY;
    _mm256_storeu_ps(lh, _mm256_max_ps(h0, h1));
    _mm256_storeu_ps(ll, _mm256_min_ps(l0, l1));
    for (int l = 0; l < 8; l++) {
        th = lh[l] > th ? lh[l] : th;
        tl = ll[l] < tl ? ll[l] : tl;
    }
    for (; c < n; c++) {
        th = F[c] > th ? F[c] : th;
        tl = F[c] < tl ? F[c] : tl;
    }
    *hi = th;
    *lo = tl;
}

/* The largest value of F[c], c < n, at least lo; a NaN never wins (as tm = F > tm ? F : tm): the
 * maximum instruction returns its second operand when either is NaN. */
__attribute__((target("avx2,fma"))) static float rowmax_avx2(const float *F, int64_t n, float lo)
{
    __m256 m0 = _mm256_set1_ps(lo), m1 = m0, m2 = m0, m3 = m0;
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(F + c), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(F + c + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(F + c + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(F + c + 24), m3);
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float lanes[8], tm = lo;
    _mm256_storeu_ps(lanes, m0);
    for (int l = 0; l < 8; l++)
        tm = lanes[l] > tm ? lanes[l] : tm;
    for (; c < n; c++)
        tm = F[c] > tm ? F[c] : tm;
    return tm;
}
#endif

/* The largest value of F[c], c < n, and -inf; a NaN never wins. */
static float rowmax_f32(const float *F, int64_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2"))
        return rowmax_avx2(F, n, -INFINITY);
#endif
    float tm = -INFINITY;
    SIMD_MAX(tm)
    for (int64_t c = 0; c < n; c++)
        tm = F[c] > tm ? F[c] : tm;
    return tm;
}

/* F[c] = exp(F[c] - m) and their sum; with is_max, m is at least every F[c] that is not NaN. */
static double expsum_f32(float *F, int64_t n, float m, bool is_max)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (m > -INFINITY && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return is_max ? expsum_max_avx2(F, n, m) : expsum_avx2(F, n, m);
#else
    (void)is_max;
#endif
    return expsum_body(F, n, m);
}

double cpu_expsum_f32(float *F, int64_t n, float m) { return expsum_f32(F, n, m, false); }

double cpu_expsum_scaled_f32(float *F, int64_t n, float a, float m)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (isfinite(a) && isfinite(m) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return expsum_vec_scaled_avx2(F, n, a, m);
#endif
    for (int64_t c = 0; c < n; c++)
        F[c] *= a;
    return expsum_f32(F, n, m, false);
}

float cpu_rowmax_f32(const float *F, int64_t n) { return rowmax_f32(F, n); }

/* The online softmax's running maximum *wm of a float32 row grown to tm, the row's maximum in
 * this tile: the row's output (cols values) and sum *wsum rescaled as cpu_softmax_grow says.
 * Returns the new maximum. */
float fused_grow_max_f32(double *wm, double *wsum, float *orow, int cols, float tm)
{
    const float sa = (float)cpu_softmax_grow(wm, tm);
    if (sa != 1.0f) {
        for (int c = 0; c < cols; c++)
            orow[c] *= sa;
        *wsum *= sa;
    }
    return (float)*wm;
}

/* The online softmax of one float32 row F of the tile (n values): the maximum grown
 * (fused_grow_max_f32) and F replaced by exp(F - m), its sum added to *wsum. */
void fused_softmax_row_f32(int kern, float *F, int64_t n, double *wm, double *wsum, float *orow,
                           int cols)
{
    const float mn = fused_grow_max_f32(wm, wsum, orow, cols, rowmax_f32(F, n));
    *wsum += kern == KERN_AVX512 ? cpu_avx512_expsum_f32(F, F, n, mn) : expsum_f32(F, n, mn, true);
}
