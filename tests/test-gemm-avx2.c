/*
 * test-gemm-avx2.c — symred's AVX2 + FMA strip products (src/cpu/gemm-avx2.c) against plain
 * loops: the packings, C = A B^T and C += A V at strips of rows that are multiples of no
 * micro-kernel (0, 1, 5, 6, 7, 12, 13), panel widths around 16 (1, 15, 16, 17, 33) and K of 0, 1,
 * a prime and 64; NaN and infinities in the operands. Inputs are multiples of 1/8 in [-1, 1], so
 * every product and sum is exact in float32 and the results must match exactly. The columns of
 * C past n (C += A V) and the rows past h must stay untouched. Skipped on a CPU without AVX2 and
 * FMA, where the fused strategy does not use them.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"

/* Values k/8, k in [-8, 8], from a linear congruential generator. */
static float *grid(int64_t n, uint64_t *s)
{
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t t = 0; t < n; t++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        x[t] = (float)((int)(*s >> 59) - 8 + (int)((*s >> 40) & 1)) / 8.0f;
    }
    return x;
}

static void *aligned(int64_t bytes)
{
    void *p = NULL;
    cr_assert_eq(posix_memalign(&p, 64, (size_t)(bytes > 0 ? bytes : 64)), 0);
    return p;
}

/* Whether a and e are the same float value (NaN matches NaN). */
static bool same(float a, double e) { return (isnan(a) && isnan(e)) || (double)a == e; }

/* One strip: h rows of A (h x K, row stride K + 1), B (n x K) for A B^T, V (K x n, row stride
 * n + 2) for C += A V; special puts a NaN or an infinity into A and V. */
static void strip_case(int64_t h, int64_t n, int64_t K, int special)
{
    uint64_t s = 7 + (uint64_t)(h * 1009 + n * 31 + K);
    const int64_t lda = K + 1, ldv = n + 2, n16 = (n + 15) / 16 * 16, ldc = n16 + 3;
    float *A = grid(h * lda, &s), *B = grid(n * K, &s), *V = grid(K * ldv, &s);
    if (special && h && K) {
        A[(h - 1) * lda + K / 2] = special == 1 ? NAN : INFINITY;
        V[(K - 1) * ldv + n / 2] = special == 1 ? -INFINITY : NAN;
    }
    float *Bp = aligned(cpu_avx2_pack_bt_bytes(n, K)), *Vp = aligned(cpu_avx2_pack_bt_bytes(n, K));
    float *C = malloc(sizeof(float) * (size_t)((h + 1) * ldc)), *C0 = grid((h + 1) * ldc, &s);
    cpu_avx2_pack_bt(n, K, B, K, Bp);
    cpu_avx2_pack_v(K, n, V, ldv, Vp);
    /* C = A B^T: the first n columns of each of the h rows; the row past h untouched. */
    memcpy(C, C0, sizeof(float) * (size_t)((h + 1) * ldc));
    cpu_avx2_strip_abt(h, K, A, lda, Bp, n, C, ldc);
    for (int64_t i = 0; i <= h; i++)
        for (int64_t j = 0; j < (i < h ? n : ldc); j++) {
            double e = C0[i * ldc + j];
            if (i < h) {
                e = 0;
                for (int64_t k = 0; k < K; k++)
                    e += (double)A[i * lda + k] * B[j * K + k];
            }
            cr_assert(same(C[i * ldc + j], e),
                      "A B^T h %lld n %lld K %lld special %d: C[%lld][%lld] = %.9g, expected %.9g",
                      (long long)h, (long long)n, (long long)K, special, (long long)i, (long long)j,
                      C[i * ldc + j], e);
        }
    /* C += A V: every column past n and the row past h untouched. */
    memcpy(C, C0, sizeof(float) * (size_t)((h + 1) * ldc));
    cpu_avx2_strip_av(h, K, A, lda, Vp, n, C, ldc);
    for (int64_t i = 0; i <= h; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double e = C0[i * ldc + j];
            if (i < h && j < n) {
                double t = 0;
                for (int64_t k = 0; k < K; k++)
                    t += (double)A[i * lda + k] * V[k * ldv + j];
                e += t;
            }
            cr_assert(same(C[i * ldc + j], e),
                      "A V h %lld n %lld K %lld special %d: C[%lld][%lld] = %.9g, expected %.9g",
                      (long long)h, (long long)n, (long long)K, special, (long long)i, (long long)j,
                      C[i * ldc + j], e);
        }
    free(A);
    free(B);
    free(V);
    free(Bp);
    free(Vp);
    free(C);
    free(C0);
}

Test(gemm_avx2, strips_odd_sizes)
{
    if (!cpu_avx2_usable())
        cr_skip_test("the CPU lacks AVX2 or FMA");
    static const int64_t hs[] = {0, 1, 5, 6, 7, 12, 13};
    static const int64_t ns[] = {1, 15, 16, 17, 33};
    static const int64_t ks[] = {0, 1, 37, 64};
    for (size_t a = 0; a < sizeof hs / sizeof *hs; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t c = 0; c < sizeof ks / sizeof *ks; c++)
                strip_case(hs[a], ns[b], ks[c], 0);
}

Test(gemm_avx2, strips_nan_and_inf)
{
    if (!cpu_avx2_usable())
        cr_skip_test("the CPU lacks AVX2 or FMA");
    for (int special = 1; special <= 2; special++) {
        strip_case(7, 17, 37, special);
        strip_case(1, 16, 1, special);
        strip_case(13, 33, 64, special);
    }
}
