/*
 * emu-driver.c — the CUDA driver API emulated on the CPU, for the CUDA emulator's tests.
 *
 * One device, "symred CPU emulator", with the attributes of a small sm_90 GPU (1024 threads
 * and 48 KiB of shared memory per block, EMU_SMS multiprocessors), and its primary context.
 *
 * Memory: device memory is host memory. Each cuMemAlloc maps pages of its own, the allocation
 * placed at the end of its pages (16-byte aligned) with an inaccessible page after it, so that
 * a kernel reading past the end of a buffer crashes the test instead of reading a neighbour.
 * A table of allocations answers cuPointerGetAttribute (memory type, range) for any address
 * inside one; cuMemcpy* and cuMemFree refuse addresses that are not device memory, as the
 * driver does. The device's total memory is $SYMRED_CUDA_EMU_MEM bytes (suffixes K, M, G;
 * default 4 GiB), so that out-of-memory paths can be exercised. $SYMRED_CUDA_EMU_TRACE set:
 * every launch is printed on stderr.
 *
 * Launches run synchronously on the calling CPU thread: the blocks one after another, the
 * threads of a block as fibers scheduled in turn (a stack switch of a few instructions on
 * x86-64, ucontext elsewhere). Each fiber runs until its next
 * __syncthreads or its end, so no fiber passes a barrier before every live fiber of its block
 * has reached it (the order of the turns alternates, see run_block); a barrier that only some
 * threads of a block reach fails the launch (CUDA_ERROR_LAUNCH_FAILED, sticky like the
 * driver's, with a message on stderr). The schedule is deterministic. Invalid
 * configurations get the driver's error codes: zero or too large dimensions and too much
 * dynamic shared memory CUDA_ERROR_INVALID_VALUE, more threads than the kernel's
 * __launch_bounds__ CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, a pointer parameter that is not device
 * memory CUDA_ERROR_INVALID_VALUE (the real driver would fault with an illegal address).
 *
 * Not emulated: streams and events (everything is synchronous), asynchronous errors, the
 * memory model and warp-level concurrency (fibers never interleave between barriers), timing,
 * managed or mapped memory, the static shared memory limit of a kernel, kernelParams passed
 * through `extra`, several devices or contexts.
 *
 * The driver is process-wide state by nature (like libcuda): the allocation table, the device
 * and the sticky error live in this file's statics, behind a mutex.
 */
#define _GNU_SOURCE
#include "emu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define EMU_SMS         4           /* multiprocessors */
#define EMU_MAX_THREADS 1024        /* per block */
#define EMU_SHARED      (48 << 10)  /* bytes of shared memory per block */
#define EMU_STACK       (256 << 10) /* bytes of stack per fiber */

/* The fiber's view of its launch: struct sr_emu_thread of emu-prelude.h, the same layout. */
struct emu_dim3 {
    unsigned x, y, z;
};
struct emu_thread {
    struct emu_dim3 thread_idx, block_idx, block_dim, grid_dim;
    void (*sync)(const struct emu_thread *self, int site);
};

struct emu_function {
    struct emu_function *next; /* in its module's list */
    void (*entry)(void **params, const struct emu_thread *self);
    int (*check)(void **params, int (*known)(const void *));
    int max_threads;
    char name[200];
};

struct emu_module {
    void *so;
    struct emu_function *functions; /* freed with the module, as the driver's handles are */
};

struct alloc {
    char *base;  /* what cuMemAlloc returned */
    size_t size; /* what was asked for */
    void *map;   /* the pages */
    size_t map_size;
};

static struct {
    pthread_mutex_t lock;
    bool initialised;
    CUresult sticky; /* a launch failure that the context cannot recover from */
    struct alloc *allocs;
    size_t nallocs, cap;
    size_t used, total;
} drv = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int primary_ctx; /* the one context's handle is this address */

/* ---- memory ---------------------------------------------------------------------------------- */

/* The allocation holding address p, or NULL. Called with drv.lock held. */
static struct alloc *find(uintptr_t p)
{
    for (size_t i = 0; i < drv.nallocs; i++) {
        uintptr_t b = (uintptr_t)drv.allocs[i].base;
        if (p >= b && p < b + (drv.allocs[i].size ? drv.allocs[i].size : 1))
            return &drv.allocs[i];
    }
    return NULL;
}

/* True when [p, p + n) lies inside one allocation. */
static bool device_range(uintptr_t p, size_t n)
{
    pthread_mutex_lock(&drv.lock);
    struct alloc *a = find(p);
    bool ok = a && n <= a->size - (p - (uintptr_t)a->base);
    pthread_mutex_unlock(&drv.lock);
    return ok;
}

static int known_pointer(const void *p) { return device_range((uintptr_t)p, 1); }

static size_t total_memory(void)
{
    const char *e = getenv("SYMRED_CUDA_EMU_MEM");
    if (!e || !*e)
        return (size_t)4 << 30;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    return (size_t)v << shift;
}

EMU_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
    if (!p || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&drv.lock);
    CUresult r = !drv.initialised               ? CUDA_ERROR_NOT_INITIALIZED
                 : drv.sticky                   ? drv.sticky
                 : bytes > drv.total - drv.used ? CUDA_ERROR_OUT_OF_MEMORY
                                                : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS && drv.nallocs == drv.cap) {
        size_t cap = drv.cap ? 2 * drv.cap : 64;
        struct alloc *t = realloc(drv.allocs, cap * sizeof *t);
        if (t)
            drv.allocs = t, drv.cap = cap;
        else
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t rounded = (bytes + 15) & ~(size_t)15;
        size_t len = (rounded + page - 1) / page * page + page;
        char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || mprotect(m + len - page, page, PROT_NONE) != 0) {
            if (m != MAP_FAILED)
                munmap(m, len);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            struct alloc *a = &drv.allocs[drv.nallocs++];
            a->map = m;
            a->map_size = len;
            a->size = bytes;
            a->base = m + len - page - rounded;
            /* Fresh device memory is not zero on a GPU: make reads of unwritten memory show. */
            memset(a->base, 0xff, rounded);
            drv.used += bytes;
            *p = (CUdeviceptr)(uintptr_t)a->base;
        }
    }
    pthread_mutex_unlock(&drv.lock);
    return r;
}

EMU_API CUresult cuMemFree_v2(CUdeviceptr p)
{
    pthread_mutex_lock(&drv.lock);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < drv.nallocs; i++)
        if ((uintptr_t)drv.allocs[i].base == p) {
            munmap(drv.allocs[i].map, drv.allocs[i].map_size);
            drv.used -= drv.allocs[i].size;
            drv.allocs[i] = drv.allocs[--drv.nallocs];
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&drv.lock);
    return r;
}

EMU_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&drv.lock);
    *free_bytes = drv.total - drv.used;
    *total_bytes = drv.total;
    pthread_mutex_unlock(&drv.lock);
    return CUDA_SUCCESS;
}

static CUresult copy(void *dst, const void *src, size_t bytes, bool dst_dev, bool src_dev)
{
    if (drv.sticky)
        return drv.sticky;
    if (!bytes)
        return CUDA_SUCCESS;
    if (!dst || !src || (dst_dev && !device_range((uintptr_t)dst, bytes)) ||
        (src_dev && !device_range((uintptr_t)src, bytes)))
        return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, bytes);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    return copy((void *)(uintptr_t)dst, src, bytes, true, false);
}

EMU_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy(dst, (const void *)(uintptr_t)src, bytes, false, true);
}

EMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, true, true);
}

EMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *s)
{
    (void)s;
    return cuMemcpyHtoD_v2(dst, src, bytes);
}

EMU_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *s)
{
    (void)s;
    return cuMemcpyDtoH_v2(dst, src, bytes);
}

EMU_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    if (n && !device_range((uintptr_t)dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

#define CU_POINTER_ATTRIBUTE_CONTEXT     1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_RANGE_START 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE  12

EMU_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&drv.lock);
    struct alloc *a = find((uintptr_t)p);
    CUresult r = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (a) {
        if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
            *(unsigned *)data = 2; /* CU_MEMORYTYPE_DEVICE */
        else if (attr == CU_POINTER_ATTRIBUTE_RANGE_START)
            *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)a->base;
        else if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
            *(size_t *)data = a->size;
        else if (attr == CU_POINTER_ATTRIBUTE_CONTEXT)
            *(void **)data = &primary_ctx;
        else
            r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&drv.lock);
    return r;
}

/* ---- device and context -------------------------------------------------------------------- */

EMU_API CUresult cuInit(unsigned flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&drv.lock);
    if (!drv.initialised)
        drv.total = total_memory();
    drv.initialised = true;
    pthread_mutex_unlock(&drv.lock);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetCount(int *n)
{
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = drv.initialised ? 1 : 0;
    return drv.initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

EMU_API CUresult cuDeviceGet(int *d, int ordinal)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetName(char *name, int len, int d)
{
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "symred CPU emulator");
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 1: /* max threads per block */
    case 2: /* max block dim x */
    case 3: /* y */
        *v = EMU_MAX_THREADS;
        return CUDA_SUCCESS;
    case 4: /* z */
        *v = 64;
        return CUDA_SUCCESS;
    case 5: /* max grid dim x */
        *v = 0x7fffffff;
        return CUDA_SUCCESS;
    case 6:
    case 7:
        *v = 65535;
        return CUDA_SUCCESS;
    case 8: /* max shared memory per block */
        *v = EMU_SHARED;
        return CUDA_SUCCESS;
    case 10: /* warp size */
        *v = 32;
        return CUDA_SUCCESS;
    case 16: /* multiprocessors */
        *v = EMU_SMS;
        return CUDA_SUCCESS;
    case 75: /* compute capability */
        *v = 9;
        return CUDA_SUCCESS;
    case 76:
        *v = 0;
        return CUDA_SUCCESS;
    case 81: /* shared memory per multiprocessor */
        *v = 228 << 10;
        return CUDA_SUCCESS;
    case 97: /* shared memory per block, opt-in */
        *v = 227 << 10;
        return CUDA_SUCCESS;
    default:
        if (attr <= 0 || attr > 140)
            return CUDA_ERROR_INVALID_VALUE;
        *v = 0;
        return CUDA_SUCCESS;
    }
}

EMU_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!drv.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = &primary_ctx;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    return d == 0 ? 0 : CUDA_ERROR_INVALID_DEVICE;
}

EMU_API CUresult cuCtxSetCurrent(void *ctx)
{
    return ctx == NULL || ctx == &primary_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EMU_API CUresult cuCtxGetCurrent(void **ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = &primary_ctx;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxSynchronize(void) { return drv.sticky; }

EMU_API CUresult cuStreamCreate(void **s, unsigned flags)
{
    (void)flags;
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = &primary_ctx; /* one stream: everything is synchronous */
    return CUDA_SUCCESS;
}
EMU_API CUresult cuStreamDestroy_v2(void *s)
{
    (void)s;
    return CUDA_SUCCESS;
}
EMU_API CUresult cuStreamSynchronize(void *s)
{
    (void)s;
    return drv.sticky;
}

EMU_API CUresult cuGetErrorString(CUresult r, const char **s)
{
    static const struct {
        CUresult r;
        const char *s;
    } names[] = {
        {CUDA_SUCCESS, "no error"},
        {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
        {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
        {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
        {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
        {CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"},
        {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
        {CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"},
        {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
        {CUDA_ERROR_NOT_FOUND, "named symbol not found"},
        {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"},
        {CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"},
        {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    };
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].r == r) {
            *s = names[i].s;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- modules --------------------------------------------------------------------------------- */

EMU_API CUresult cuModuleLoadData(struct emu_module **m, const void *image)
{
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    const char *s = image;
    size_t l = strlen(EMU_PTX_MAGIC);
    if (strncmp(s, EMU_PTX_MAGIC, l) != 0 || s[l] != '\n')
        return CUDA_ERROR_INVALID_PTX;
    char path[1400];
    snprintf(path, sizeof path, "%s", s + l + 1);
    const char *src = strchr(s + l + 1, '\n');
    path[strcspn(path, "\n")] = 0;
    if (access(path, R_OK) != 0 && src) {
        char *log = NULL;
        int rc = emu_rebuild(src + 1, &log);
        if (rc != 0)
            fprintf(stderr, "cuda emulator: rebuilding %s failed: %s\n", path, log ? log : "");
        free(log);
    }
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        return CUDA_ERROR_INVALID_IMAGE;
    if (!(*m = calloc(1, sizeof **m))) {
        dlclose(so);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*m)->so = so;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleUnload(struct emu_module *m)
{
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    while (m->functions) {
        struct emu_function *f = m->functions;
        m->functions = f->next;
        free(f);
    }
    dlclose(m->so);
    free(m);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleGetFunction(struct emu_function **f, struct emu_module *m,
                                     const char *name)
{
    if (!f || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    char sym[256];
    struct emu_function fn = {.max_threads = EMU_MAX_THREADS};
    snprintf(sym, sizeof sym, "sr_emu_entry_%s", name);
    *(void **)&fn.entry = dlsym(m->so, sym);
    snprintf(sym, sizeof sym, "sr_emu_check_%s", name);
    *(void **)&fn.check = dlsym(m->so, sym);
    snprintf(sym, sizeof sym, "sr_emu_maxthreads_%s", name);
    const int *mt = dlsym(m->so, sym);
    if (!fn.entry || !fn.check || !mt)
        return CUDA_ERROR_NOT_FOUND;
    fn.max_threads = *mt;
    snprintf(fn.name, sizeof fn.name, "%s", name);
    if (!(*f = malloc(sizeof **f)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    fn.next = m->functions;
    **f = fn;
    m->functions = *f;
    return CUDA_SUCCESS;
}

/* ---- fibers --------------------------------------------------------------------------------- */

/* A fiber switch is the launches' inner loop: every thread of every block switches at each of its
 * barriers and at its end. glibc's swapcontext saves and restores the signal mask, a system call
 * each time, which made most of a launch's time; the fibers never touch the signal mask, so on
 * x86-64 a switch saves what the System V ABI has the callee preserve (rbx, rbp, r12-r15, the
 * MXCSR and the x87 control word) on the stack it leaves and takes the same from the stack it
 * enters: no system call, and no glibc internals (setjmp/longjmp between stacks would do as
 * little, but glibc's fortified longjmp refuses to jump to another stack and its jmp_buf mangles
 * the pointers, so a fresh stack cannot be set up without makecontext). The switch does not keep a
 * CET shadow stack: in a process with shadow stacks on (a glibc tunable, off by default) the
 * fibers would fault. Other architectures and
 * ThreadSanitizer builds (which would need its own fiber annotations) keep ucontext. Under
 * AddressSanitizer every switch is announced to it (__sanitizer_start_switch_fiber, then
 * __sanitizer_finish_switch_fiber on the other side), so that it knows which stack is running. */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#if defined(__x86_64__) && !defined(EMU_TSAN)
#define EMU_SWITCH_ASM 1
#endif
#ifndef EMU_SWITCH_ASM
#include <ucontext.h>
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

struct context {
#ifdef EMU_SWITCH_ASM
    void *sp; /* where the registers are saved: the top of the suspended stack */
#else
    ucontext_t uc;
#endif
#ifdef EMU_ASAN
    const void *bottom; /* the stack's lowest address and size, for AddressSanitizer */
    size_t size;
    void *fake_stack; /* AddressSanitizer's frames of the suspended context */
#endif
};

#ifdef EMU_SWITCH_ASM
/* Saves the callee-saved registers on the running stack and its stack pointer in *save, then
 * loads the stack pointer load and returns to where the context saved there was suspended. */
void emu_switch_stack(void **save, void *load);
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl emu_switch_stack\n"
        ".hidden emu_switch_stack\n"
        ".type emu_switch_stack, @function\n"
        "emu_switch_stack:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size emu_switch_stack, .-emu_switch_stack\n"
        ".popsection\n");
#endif

/* Makes c start fn, which must never return, on the stack [stack, stack + size). The fiber
 * inherits the floating-point control state of the caller, as getcontext would give it. */
static void context_make(struct context *c, char *stack, size_t size, void (*fn)(void))
{
#ifdef EMU_ASAN
    c->bottom = stack;
    c->size = size;
    c->fake_stack = NULL;
    /* Frames that never returned (a fiber's first, a fiber left at a failed barrier) leave their
     * poison behind on a stack that is used again. */
    __asan_unpoison_memory_region(stack, size);
#endif
#ifdef EMU_SWITCH_ASM
    uint64_t *top = (uint64_t *)((uintptr_t)(stack + size) & ~(uintptr_t)15);
    unsigned mxcsr;
    unsigned short fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    /* What emu_switch_stack pops, from the lowest address: the control words, r15, r14, r13,
     * r12, rbx, rbp, the address it returns to (fn, entered with the stack aligned as after a
     * call), and fn's own return address, zero, where backtraces stop. */
    uint64_t frame[9] = {mxcsr | (uint64_t)fpucw << 32, 0, 0, 0, 0, 0, 0, (uintptr_t)fn, 0};
    memcpy(top - 9, frame, sizeof frame);
    c->sp = top - 9;
#else
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, fn, 0);
#endif
}

/* Suspends the running context into from and resumes to; returns when something switches back
 * to from. A context that ends (leaves for good) passes ends, so that AddressSanitizer drops
 * its frames. */
static void context_switch(struct context *from, struct context *to, bool ends)
{
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(ends ? NULL : &from->fake_stack, to->bottom, to->size);
#else
    (void)ends;
#endif
#ifdef EMU_SWITCH_ASM
    emu_switch_stack(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(from->fake_stack, NULL, NULL);
#endif
}

/* ---- launches -------------------------------------------------------------------------------- */

enum fiber_state { FIBER_RUN, FIBER_BARRIER, FIBER_DONE };

struct fiber {
    struct emu_thread self; /* first: the kernel's sync callback gets its address */
    struct context ctx;
    enum fiber_state state;
    int site; /* where it waits: the source line of its __syncthreads */
    struct block *blk;
};

/* The block being run on this CPU thread. */
struct block {
    struct context sched;
    struct fiber *fibers;
    int n;
    const struct emu_function *fn;
    void **params;
    unsigned pass; /* its parity gives the direction of the turns */
};

static __thread struct fiber *running;

static void fiber_sync(const struct emu_thread *self, int site)
{
    struct fiber *f = (struct fiber *)self;
    f->state = FIBER_BARRIER;
    f->site = site;
    context_switch(&f->ctx, &f->blk->sched, false);
}

static void fiber_main(void)
{
    struct fiber *f = running;
    struct block *b = f->blk;
#ifdef EMU_ASAN
    /* The first switch into a fiber tells where the scheduler's stack is. */
    __sanitizer_finish_switch_fiber(NULL, &b->sched.bottom, &b->sched.size);
#endif
    b->fn->entry(b->params, &f->self);
    f->state = FIBER_DONE;
    context_switch(&f->ctx, &b->sched, true);
    abort(); /* a fiber that has ended is never resumed */
}

/* Runs one block: every fiber from its start to its next barrier in turn, until all are done.
 * The turns go up the thread indices in one pass and down in the next, the first direction
 * alternating between blocks: a thread that reads shared memory written by another thread
 * without a barrier between them sees the new value in one pass and the old one in the next,
 * which the differential tests notice. Returns 0, or the source line of a barrier that only
 * some of the block's threads reached (the others ended or waited elsewhere): CUDA allows
 * __syncthreads in conditional code only when the condition is the same for the whole block. */
static int run_block(struct block *b, char *stacks, size_t stack_size, size_t guard)
{
    for (int t = 0; t < b->n; t++) {
        b->fibers[t].state = FIBER_RUN;
        context_make(&b->fibers[t].ctx, stacks + (size_t)t * stack_size + guard, stack_size - guard,
                     fiber_main);
    }
    for (bool live = true; live; b->pass++) {
        int site = 0, ended = 0, waiting = 0;
        for (int i = 0; i < b->n; i++) {
            struct fiber *f = &b->fibers[b->pass & 1 ? b->n - 1 - i : i];
            if (f->state == FIBER_DONE)
                continue;
            f->state = FIBER_RUN;
            running = f;
            context_switch(&b->sched, &f->ctx, false);
            if (f->state == FIBER_DONE) {
                ended++;
                continue;
            }
            if (waiting++ && f->site != site)
                return site;
            site = f->site;
        }
        if (waiting && ended)
            return site;
        live = waiting > 0;
    }
    return 0;
}

/* The fibers' stacks, EMU_STACK bytes each above an inaccessible guard page (stacks grow down),
 * are kept from launch to launch: mapping them, protecting the guard pages and faulting the
 * fresh pages in again for every launch cost more than running a small grid. Launches on
 * several CPU threads at once each take a set of their own from the list. */
struct stack_set {
    struct stack_set *next;
    char *base;
    int n; /* stacks */
};

static struct {
    pthread_mutex_t lock;
    struct stack_set *free;
} stack_sets = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t stack_stride(void) { return EMU_STACK + (size_t)sysconf(_SC_PAGESIZE); }

static void stack_set_unmap(struct stack_set *s)
{
    if (s->base)
        munmap(s->base, (size_t)s->n * stack_stride());
    s->base = NULL;
    s->n = 0;
}

/* A set of at least n stacks, or NULL when out of memory; give it back with stack_set_put. */
static struct stack_set *stack_set_get(int n)
{
    pthread_mutex_lock(&stack_sets.lock);
    struct stack_set *s = stack_sets.free;
    if (s)
        stack_sets.free = s->next;
    pthread_mutex_unlock(&stack_sets.lock);
    if (!s && !(s = calloc(1, sizeof *s)))
        return NULL;
    if (s->n >= n)
        return s;
    stack_set_unmap(s);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), stride = stack_stride();
    char *m = mmap(NULL, (size_t)n * stride, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        free(s);
        return NULL;
    }
    for (int t = 0; t < n; t++)
        mprotect(m + (size_t)t * stride, page, PROT_NONE);
    s->base = m;
    s->n = n;
    return s;
}

static void stack_set_put(struct stack_set *s)
{
    pthread_mutex_lock(&stack_sets.lock);
    s->next = stack_sets.free;
    stack_sets.free = s;
    pthread_mutex_unlock(&stack_sets.lock);
}

/* Unloading the emulator gives the stacks back. */
__attribute__((destructor)) static void stack_sets_free(void)
{
    while (stack_sets.free) {
        struct stack_set *s = stack_sets.free;
        stack_sets.free = s->next;
        stack_set_unmap(s);
        free(s);
    }
}

EMU_API CUresult cuLaunchKernel(struct emu_function *fn, unsigned gx, unsigned gy, unsigned gz,
                                unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                void *stream, void **params, void **extra)
{
    (void)stream;
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    if (drv.sticky)
        return drv.sticky;
    if (!params && extra)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
        bx > EMU_MAX_THREADS || by > EMU_MAX_THREADS || bz > 64 ||
        (unsigned long long)bx * by * bz > EMU_MAX_THREADS || shared > EMU_SHARED)
        return CUDA_ERROR_INVALID_VALUE;
    if (getenv("SYMRED_CUDA_EMU_TRACE"))
        fprintf(stderr, "cuda emulator: launch %s grid (%u, %u, %u) block (%u, %u, %u)\n", fn->name,
                gx, gy, gz, bx, by, bz);
    const int n = (int)(bx * by * bz);
    if (n > fn->max_threads)
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    if (fn->check(params, known_pointer) != -1)
        return CUDA_ERROR_INVALID_VALUE;

    struct stack_set *stacks = stack_set_get(n);
    struct fiber *fibers = calloc((size_t)n, sizeof *fibers);
    if (!stacks || !fibers) {
        if (stacks)
            stack_set_put(stacks);
        free(fibers);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct block b = {.fibers = fibers, .n = n, .fn = fn, .params = params};
    CUresult r = CUDA_SUCCESS;
    for (unsigned z = 0; z < gz && r == CUDA_SUCCESS; z++)
        for (unsigned y = 0; y < gy && r == CUDA_SUCCESS; y++)
            for (unsigned x = 0; x < gx && r == CUDA_SUCCESS; x++) {
                for (int t = 0; t < n; t++) {
                    struct emu_thread *s = &fibers[t].self;
                    fibers[t].blk = &b;
                    s->thread_idx = (struct emu_dim3){(unsigned)t % bx, (unsigned)t / bx % by,
                                                      (unsigned)t / bx / by};
                    s->block_idx = (struct emu_dim3){x, y, z};
                    s->block_dim = (struct emu_dim3){bx, by, bz};
                    s->grid_dim = (struct emu_dim3){gx, gy, gz};
                    s->sync = fiber_sync;
                }
                b.pass = x + y + z;
                int site =
                    run_block(&b, stacks->base, stack_stride(), (size_t)sysconf(_SC_PAGESIZE));
                if (site) {
                    fprintf(stderr,
                            "cuda emulator: %s, block (%u, %u, %u): the __syncthreads at line %d "
                            "of the source is not reached by every thread of the block\n",
                            fn->name, x, y, z, site);
                    r = CUDA_ERROR_LAUNCH_FAILED;
                }
            }
    stack_set_put(stacks);
    free(fibers);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&drv.lock);
        drv.sticky = r;
        pthread_mutex_unlock(&drv.lock);
    }
    return r;
}

/* The kernel's attributes that callers ask for: its thread limit (__launch_bounds__). */
EMU_API CUresult cuFuncGetAttribute(int *v, int attr, struct emu_function *fn)
{
    if (!v || !fn)
        return CUDA_ERROR_INVALID_VALUE;
    *v = attr == 0 ? fn->max_threads : 0;
    return CUDA_SUCCESS;
}
