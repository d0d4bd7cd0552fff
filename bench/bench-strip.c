/*
 * bench-strip.c — symred's AVX2 + FMA strip products (src/cpu/gemm-avx2.c) in isolation, on the
 * shapes of the fused two-product strategy's attention products, against BLIS's sgemm on the
 * same operands and the single-core FMA peak, all in one process on one thread.
 *
 *   abt: C (M x N) = A (M x K) B^T, B packed once (not timed), A row-major with row stride K,
 *        done in strips of 12 rows as the fused strategy does (the inner products S = q k^T:
 *        K = D, N = the reduced tile).
 *   av:  C (M x N) += A (M x K) V, V packed once (not timed), in strips of 12 rows (P v: K = the
 *        reduced tile, N = D).
 *
 * Each figure is the best of --rounds rounds, the kernels and the FMA peak (for the last column:
 * symred over the best peak of the same rounds) alternating within a round, each
 * timed over enough calls to last about 20 ms of the thread's CPU time (so that other processes on
 * a shared machine do not count). GFLOP/s = 2 M N K / CPU time. Not part of the
 * library; needs the CPU to have AVX2 and FMA.
 *
 *   bench-strip [--rounds R] [--shapes M:N:K,...]
 *
 * bench/strip_torch.py prints torch's sgemm (MKL) on the same shapes, the same way.
 */
#define _GNU_SOURCE
#include "bench.h"
#include "fma-peak.h"

#include "cpu/cpu.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { STRIP = 2 * CPU_AVX2_MR };

struct shape {
    int64_t M, N, K;
};

struct ops {
    struct shape s;
    float *A, *B, *V, *Bp, *Vp, *C;
};

static float *aligned_floats(int64_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)(n > 0 ? n : 16) * 4)) {
        fprintf(stderr, "bench-strip: out of memory\n");
        exit(1);
    }
    return p;
}

static void fill(float *x, int64_t n, uint64_t *seed)
{
    for (int64_t t = 0; t < n; t++)
        x[t] = (float)(bench_uniform(seed) - 0.5);
}

static void run_abt(const struct ops *o)
{
    const int64_t ldc = (o->s.N + 15) / 16 * 16;
    for (int64_t u = 0; u < o->s.M; u += STRIP) {
        int64_t h = o->s.M - u < STRIP ? o->s.M - u : STRIP;
        cpu_avx2_strip_abt(h, o->s.K, o->A + u * o->s.K, o->s.K, o->Bp, o->s.N, o->C + u * ldc,
                           ldc);
    }
}

static void run_av(const struct ops *o)
{
    for (int64_t u = 0; u < o->s.M; u += STRIP) {
        int64_t h = o->s.M - u < STRIP ? o->s.M - u : STRIP;
        cpu_avx2_strip_av(h, o->s.K, o->A + u * o->s.K, o->s.K, o->Vp, o->s.N, o->C + u * o->s.N,
                          o->s.N);
    }
}

static void run_blis_abt(const struct ops *o)
{
    const int64_t K = o->s.K, ldc = (o->s.N + 15) / 16 * 16;
    cpu_blis_gemm(0, o->s.M, o->s.N, K, o->A, K, 1, o->B, 1, K, 0, o->C, ldc);
}

static void run_blis_av(const struct ops *o)
{
    cpu_blis_gemm(0, o->s.M, o->s.N, o->s.K, o->A, o->s.K, 1, o->V, o->s.N, 1, 1, o->C, o->s.N);
}

/* CPU seconds of the calling thread: on a shared machine, the time the kernel ran, not the time
 * other processes held the core. */
static double thread_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds per call of f, over calls lasting about 20 ms. */
static double per_call(void (*f)(const struct ops *), const struct ops *o)
{
    f(o);
    int64_t n = 1;
    for (;;) {
        double t0 = thread_cpu_now();
        for (int64_t c = 0; c < n; c++)
            f(o);
        double t = thread_cpu_now() - t0;
        if (t > 0.02)
            return t / (double)n;
        n *= t < 0.002 ? 16 : 2;
    }
}

static int parse_shapes(const char *s, struct shape *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        long long M, N, K;
        int used = 0;
        if (sscanf(s, "%lld:%lld:%lld%n", &M, &N, &K, &used) != 3 || M < 1 || N < 1 || K < 1) {
            fprintf(stderr, "bench-strip: bad shape list at '%s' (M:N:K,...)\n", s);
            exit(2);
        }
        out[n++] = (struct shape){M, N, K};
        s += used;
        if (*s == ',')
            s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    int rounds = 3;
    const char *list = "12:512:64,12:256:128,48:512:64,256:256:64,256:256:128,12:64:512,"
                       "12:128:256,48:64:512,256:64:256,256:128:256,12:16:64,256:16:256";
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--rounds") && a + 1 < argc)
            rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--shapes") && a + 1 < argc)
            list = argv[++a];
        else {
            fprintf(stderr, "usage: bench-strip [--rounds R] [--shapes M:N:K,...]\n");
            return 2;
        }
    }
    if (!cpu_avx2_usable()) {
        printf("bench-strip: skipped (the CPU lacks AVX2 or FMA)\n");
        return 0;
    }
    const char *why = "";
    bool blis = cpu_blis_usable(&why);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    int width = 0;
    double peak = 0;
    bench_fma_peak(0.3, &width, &peak);
    printf(
        "one thread; FMA peak (12 independent %d-bit chains): %.1f GFLOP/s of CPU time; BLIS: %s\n",
        width, peak, blis ? cpu_blis_arch() : why);
    printf("%-5s %5s %5s %5s  %9s %9s  %s\n", "prod", "M", "N", "K", "symred", "BLIS",
           "symred/peak");
    struct shape sh[64];
    int ns = parse_shapes(list, sh, 64);
    uint64_t seed = 42;
    for (int i = 0; i < ns; i++) {
        struct ops o = {.s = sh[i]};
        const int64_t M = sh[i].M, N = sh[i].N, K = sh[i].K, Np = (N + 15) / 16 * 16;
        o.A = aligned_floats(M * K);
        o.B = aligned_floats(N * K);
        o.V = aligned_floats(K * N);
        o.Bp = aligned_floats(cpu_avx2_pack_bt_bytes(N, K) / 4);
        o.Vp = aligned_floats(cpu_avx2_pack_bt_bytes(N, K) / 4);
        o.C = aligned_floats(M * Np);
        fill(o.A, M * K, &seed);
        fill(o.B, N * K, &seed);
        fill(o.V, K * N, &seed);
        memset(o.C, 0, (size_t)(M * Np) * 4);
        cpu_avx2_pack_bt(N, K, o.B, K, o.Bp);
        cpu_avx2_pack_v(K, N, o.V, N, o.Vp);
        for (int prod = 0; prod < 2; prod++) {
            double best = 1e30, bestb = 1e30, pk = 0;
            for (int r = 0; r < rounds; r++) {
                double p = 0;
                bench_fma_peak(0.02, NULL, &p);
                pk = p > pk ? p : pk;
                double t = per_call(prod ? run_av : run_abt, &o);
                best = t < best ? t : best;
                if (blis) {
                    t = per_call(prod ? run_blis_av : run_blis_abt, &o);
                    bestb = t < bestb ? t : bestb;
                }
            }
            double gf = 2.0 * (double)(M * N * K) / 1e9;
            printf("%-5s %5lld %5lld %5lld  %9.1f %9.1f  %.2f\n", prod ? "av" : "abt", (long long)M,
                   (long long)N, (long long)K, gf / best, blis ? gf / bestb : 0.0, gf / best / pk);
            fflush(stdout);
        }
        free(o.A), free(o.B), free(o.V), free(o.Bp), free(o.Vp), free(o.C);
    }
    return 0;
}
