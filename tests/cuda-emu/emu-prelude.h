/*
 * emu-prelude.h — the CUDA built-ins for kernels that the CUDA emulator compiles with g++.
 *
 * The emulated nvrtcCompileProgram (emu-nvrtc.c) compiles the program's source as C++ with this
 * header forced in front of it (-include) and a wrapper per __global__ entry point appended
 * (SR_EMU_ENTRY below). The emulated driver (emu-driver.c) runs each thread of a block as a
 * fiber on the launching CPU thread; a fiber reads its indices through sr_emu_self, and
 * __syncthreads hands control back to the block's scheduler.
 *
 * What is emulated: the execution-space and launch qualifiers (as nothing), __shared__ (storage
 * common to the fibers of a block, one copy per CPU thread), the index variables, __syncthreads,
 * the bit casts, rsqrt/rsqrtf, the fast-math intrinsics by their accurate functions, min/max,
 * __ldg, and atomics (trivial: the fibers of a block never run at the same time). The math
 * functions are glibc's, float overloads included, so results differ from libdevice's in the
 * last bits. What is not: warp-level functions (__shfl_*, __ballot_sync, __syncwarp: a kernel
 * that uses them fails to compile here), dynamic shared memory (extern __shared__), __constant__
 * memory, textures, and every intrinsic not named below.
 */
#ifndef SYMRED_CUDA_EMU_PRELUDE_H
#define SYMRED_CUDA_EMU_PRELUDE_H

/* NVRTC provides no <stdint.h>, so generated code declares the fixed-width types itself (as
 * long long, not glibc's long). libm's headers must not declare them first: they are renamed
 * while those headers are read. */
#define int8_t    sr_emu_libc_int8_t
#define int16_t   sr_emu_libc_int16_t
#define int32_t   sr_emu_libc_int32_t
#define int64_t   sr_emu_libc_int64_t
#define uint8_t   sr_emu_libc_uint8_t
#define uint16_t  sr_emu_libc_uint16_t
#define uint32_t  sr_emu_libc_uint32_t
#define uint64_t  sr_emu_libc_uint64_t
#define intptr_t  sr_emu_libc_intptr_t
#define uintptr_t sr_emu_libc_uintptr_t
#include <math.h>
#undef int8_t
#undef int16_t
#undef int32_t
#undef int64_t
#undef uint8_t
#undef uint16_t
#undef uint32_t
#undef uint64_t
#undef intptr_t
#undef uintptr_t

#define __global__
#define __device__
#define __host__
#define __forceinline__        inline __attribute__((always_inline))
#define __noinline__           __attribute__((noinline))
#define __launch_bounds__(...) /* read by emu-nvrtc.c from the source */
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__   static __thread
#define CUDART_INF_F __builtin_inff()
#define CUDART_NAN_F __builtin_nanf("")

/* The fiber's view of its launch; the layout is struct emu_thread's in emu-driver.c. */
struct sr_emu_dim3 {
    unsigned x, y, z;
};
struct sr_emu_thread {
    sr_emu_dim3 thread_idx, block_idx, block_dim, grid_dim;
    void (*sync)(const sr_emu_thread *self, int site);
};
typedef sr_emu_dim3 dim3;

/* The running fiber of this CPU thread. The fibers of a block share the CPU thread, so the value
 * is set by each entry wrapper and restored after each barrier. */
static __thread const sr_emu_thread *sr_emu_self;

#define threadIdx (sr_emu_self->thread_idx)
#define blockIdx  (sr_emu_self->block_idx)
#define blockDim  (sr_emu_self->block_dim)
#define gridDim   (sr_emu_self->grid_dim)
#define warpSize  32

/* The site (source line) lets the emulator check that the whole block waits at one barrier. */
#define __syncthreads() sr_emu_syncthreads(__LINE__)
static inline void sr_emu_syncthreads(int site)
{
    const sr_emu_thread *self = sr_emu_self;
    self->sync(self, site);
    sr_emu_self = self;
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

static inline float __int_as_float(int i)
{
    float f;
    __builtin_memcpy(&f, &i, sizeof f);
    return f;
}
static inline int __float_as_int(float f)
{
    int i;
    __builtin_memcpy(&i, &f, sizeof i);
    return i;
}
static inline unsigned __float_as_uint(float f) { return (unsigned)__float_as_int(f); }
static inline float __uint_as_float(unsigned u) { return __int_as_float((int)u); }
static inline double __longlong_as_double(long long i)
{
    double d;
    __builtin_memcpy(&d, &i, sizeof d);
    return d;
}
static inline long long __double_as_longlong(double d)
{
    long long i;
    __builtin_memcpy(&i, &d, sizeof i);
    return i;
}

static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float rsqrt(float a) { return rsqrtf(a); }
/* __expf, __logf, __sinf, __cosf, __powf: glibc declares its own, the accurate functions. */
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float a) { return a < 0 ? 0.0f : a > 1 ? 1.0f : a; }

#define SR_EMU_MINMAX_(T)                                                                          \
    static inline T min(T a, T b) { return a < b ? a : b; }                                        \
    static inline T max(T a, T b) { return a > b ? a : b; }
SR_EMU_MINMAX_(int)
SR_EMU_MINMAX_(unsigned)
SR_EMU_MINMAX_(long long)
SR_EMU_MINMAX_(unsigned long long)
SR_EMU_MINMAX_(float)
SR_EMU_MINMAX_(double)
#undef SR_EMU_MINMAX_

template <class T> static inline T __ldg(const T *p) { return *p; }
/* Atomics: old value of *p, then *p = the new value. */
#define SR_EMU_ATOMIC_(name, value)                                                                \
    template <class T> static inline T name(T *p, T v)                                             \
    {                                                                                              \
        T old = *p;                                                                                \
        *p = (value);                                                                              \
        return old;                                                                                \
    }
SR_EMU_ATOMIC_(atomicAdd, old + v)
SR_EMU_ATOMIC_(atomicMax, old > v ? old : v)
SR_EMU_ATOMIC_(atomicMin, old < v ? old : v)
SR_EMU_ATOMIC_(atomicExch, v)
#undef SR_EMU_ATOMIC_
template <class T> static inline T atomicCAS(T *p, T cmp, T v)
{
    T old = *p;
    if (old == cmp)
        *p = v;
    return old;
}

/* ---- entry wrappers: kernel(void **params), with the parameter types deduced ------------- */

template <int... I> struct sr_emu_seq {
};
template <int N, int... I> struct sr_emu_make : sr_emu_make<N - 1, N - 1, I...> {
};
template <int... I> struct sr_emu_make<0, I...> {
    typedef sr_emu_seq<I...> type;
};

template <class... A, int... I> static void sr_emu_call(void (*f)(A...), void **p, sr_emu_seq<I...>)
{
    f(*(A *)p[I]...);
}

/* Device pointers among the parameters: each must be NULL or inside a device allocation
 * (known), else the launch is refused. Pointers inside structs passed by value are not seen. */
template <class T> struct sr_emu_ptr {
    static bool bad(void *, int (*)(const void *)) { return false; }
};
template <class T> struct sr_emu_ptr<T *> {
    static bool bad(void *slot, int (*known)(const void *))
    {
        const void *v = *(T **)slot;
        return v && !known(v);
    }
};
template <class... A, int... I>
static int sr_emu_check(void (*)(A...), void **p, int (*known)(const void *), sr_emu_seq<I...>)
{
    if (sizeof...(A) && !p)
        return -2;
    int bad = -1;
    int each[] = {0, (bad < 0 && sr_emu_ptr<A>::bad(p[I], known) ? bad = I : 0)...};
    (void)each;
    return bad;
}

/* What emu-nvrtc.c appends for entry point name with launch bound (max threads) mt. */
#define SR_EMU_ENTRY(name, mt)                                                                     \
    extern "C" void sr_emu_entry_##name(void **p, const sr_emu_thread *self)                       \
    {                                                                                              \
        sr_emu_self = self;                                                                        \
        sr_emu_call(name, p, sr_emu_make<sr_emu_nargs(name)>::type());                             \
    }                                                                                              \
    extern "C" int sr_emu_check_##name(void **p, int (*known)(const void *))                       \
    {                                                                                              \
        return sr_emu_check(name, p, known, sr_emu_make<sr_emu_nargs(name)>::type());              \
    }                                                                                              \
    extern "C" const int sr_emu_maxthreads_##name = (mt);

template <class... A> constexpr int sr_emu_nargs(void (*)(A...)) { return (int)sizeof...(A); }

#endif /* SYMRED_CUDA_EMU_PRELUDE_H */
