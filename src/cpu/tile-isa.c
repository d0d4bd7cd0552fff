/*
 * tile-isa.c — the tile interpreter's loops (tile-kern.h) compiled for each element type and each
 * vector unit: AVX-512 and AVX2 + FMA on x86-64 (each under `#pragma GCC target`, so the library
 * itself still builds for any x86-64), and the compiler's baseline everywhere. cpu_tile_isa()
 * picks, once per process, the widest unit that the CPU and the operating system support.
 */
#include "cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#ifdef __clang__
/* clang reports each `omp simd` loop it leaves scalar (some of the reductions below); they are
 * correct either way, and the gcc build is the one the figures come from. */
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#ifdef _OPENMP
#define TILE_PRAGMA_(x)       _Pragma(#x)
#define TILE_SIMD             TILE_PRAGMA_(omp simd)
#define TILE_SIMD_SUM(s)      TILE_PRAGMA_(omp simd reduction(+ : s))
#define TILE_SIMD_MAX(m, bad) TILE_PRAGMA_(omp simd reduction(max : m) reduction(| : bad))
#define TILE_SIMD_MIN(m, bad) TILE_PRAGMA_(omp simd reduction(min : m) reduction(| : bad))
#define TILE_SIMD_OR(a)       TILE_PRAGMA_(omp simd reduction(| : a))
#else
#define TILE_SIMD
#define TILE_SIMD_SUM(s)
#define TILE_SIMD_MAX(m, bad)
#define TILE_SIMD_MIN(m, bad)
#define TILE_SIMD_OR(a)
#endif

/* The baseline: whatever the library is compiled for. */
#define TILE_FMA 0
#define TILE_T   float
#define TILE_F64 0
#define TILE_SFX _base_f32
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#define TILE_T   double
#define TILE_F64 1
#define TILE_SFX _base_f64
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#undef TILE_FMA

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TILE_X86 1
#define TILE_FMA 1

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define TILE_T   float
#define TILE_F64 0
#define TILE_SFX _avx2_f32
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#define TILE_T   double
#define TILE_F64 1
#define TILE_SFX _avx2_f64
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,fma,prefer-vector-width=512")
#define TILE_T   float
#define TILE_F64 0
#define TILE_SFX _avx512_f32
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#define TILE_T   double
#define TILE_F64 1
#define TILE_SFX _avx512_f64
#include "tile-kern.h"
#undef TILE_T
#undef TILE_F64
#undef TILE_SFX
#pragma GCC pop_options
#undef TILE_FMA
#endif

static const struct tile_isa *isa_f32, *isa_f64;
static const char *isa_name;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* SYMRED_TILE_ISA=avx2|baseline (read once per process) caps the vector unit, so that the tests
 * run every variant on a CPU that has them all; anything else, or a unit the CPU lacks, is the
 * automatic choice. */
static void isa_pick(void)
{
    isa_f32 = &tile_isa__base_f32;
    isa_f64 = &tile_isa__base_f64;
    isa_name = "baseline";
    const char *cap = getenv("SYMRED_TILE_ISA");
    if (cap && strcmp(cap, "baseline") == 0)
        return;
#ifdef TILE_X86
    bool avx2_only = cap && strcmp(cap, "avx2") == 0;
    if (cpu_avx512_usable() && !avx2_only) {
        isa_f32 = &tile_isa__avx512_f32;
        isa_f64 = &tile_isa__avx512_f64;
        isa_name = "AVX-512";
    } else if (cpu_avx2_usable()) {
        isa_f32 = &tile_isa__avx2_f32;
        isa_f64 = &tile_isa__avx2_f64;
        isa_name = "AVX2";
    }
#endif
}

const struct tile_isa *cpu_tile_isa(sr_dtype dtype, const char **name)
{
    pthread_once(&isa_once, isa_pick);
    if (name)
        *name = isa_name;
    return dtype == SR_F64 ? isa_f64 : isa_f32;
}
