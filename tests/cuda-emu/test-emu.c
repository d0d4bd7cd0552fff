/*
 * test-emu.c — the CUDA emulator's own checks, through symred's loaders of the driver and
 * NVRTC (ctest cuda-emu-self, with $SYMRED_LIBCUDA and $SYMRED_NVRTC naming the emulator):
 * barriers order a block's threads and a missing one shows in the results; a barrier that
 * only part of a block reaches fails the launch; invalid launch configurations and pointers
 * get the driver's error codes; device memory is accounted and checked; a compile error
 * returns g++'s log; entry points are found in the source, comments aside. Each Criterion test
 * runs in a process of its own, so a sticky launch failure does not reach the others.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "jit/cuda.h"

static const char kernels[] =
    "/* a comment naming __global__ void not_a_kernel(int) */\n"
    "extern \"C\" __global__ void __launch_bounds__(64)\n"
    "block_sum(const float *x, float *out, int sync)\n"
    "{\n"
    "    __shared__ float s[64];\n"
    "    s[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];\n"
    "    if (sync) __syncthreads();\n"
    "    for (int h = 32; h > 0; h /= 2) {\n"
    "        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];\n"
    "        if (sync) __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0) out[blockIdx.x] = s[0];\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(256, 2) divergent(int *out)\n"
    "{\n"
    "    if (threadIdx.x < 5) __syncthreads();\n"
    "    out[threadIdx.x] = 1;\n"
    "}\n"
    "extern \"C\" __global__ void plain(int *out) { out[blockIdx.x] = (int)gridDim.x; }\n";

struct emu {
    const struct cuda_device *dev;
    const struct cuda_api *cu;
    cu_module mod;
};

static struct emu open_emu(void)
{
    struct emu e = {0};
    const char *why;
    cr_assert_eq(jit_cuda_device(&e.dev, &why), SR_OK, "the emulated device: %s", why);
    e.cu = e.dev->api;
    cr_assert_str_eq(e.dev->name, "symred CPU emulator");
    struct nvrtc_out out;
    sr_status st = jit_nvrtc_compile(kernels, "emu.cu", "sm_90", false, &out);
    cr_assert_eq(st, SR_OK, "compile: %s", out.log ? out.log : "");
    cr_assert_eq(e.cu->ctx_set_current(e.dev->ctx), CU_SUCCESS);
    cr_assert_eq(e.cu->module_load_data(&e.mod, out.image), CU_SUCCESS);
    free(out.image);
    free(out.log);
    return e;
}

static cu_function function(const struct emu *e, const char *name)
{
    cu_function f = NULL;
    cr_assert_eq(e->cu->module_get_function(&f, e->mod, name), CU_SUCCESS, "%s", name);
    return f;
}

/* block_sum over 4 blocks of 64 integers; returns the launch's result. */
static cu_result block_sums(const struct emu *e, int sync, float sums[4])
{
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i;
    cu_deviceptr dx, dout;
    cr_assert_eq(e->cu->mem_alloc(&dx, sizeof x), CU_SUCCESS);
    cr_assert_eq(e->cu->mem_alloc(&dout, 4 * sizeof(float)), CU_SUCCESS);
    cr_assert_eq(e->cu->memcpy_htod(dx, x, sizeof x), CU_SUCCESS);
    void *params[] = {&dx, &dout, &sync};
    cu_result r = e->cu->launch(function(e, "block_sum"), 4, 1, 1, 64, 1, 1, 0, NULL, params, NULL);
    if (r == CU_SUCCESS)
        cr_assert_eq(e->cu->memcpy_dtoh(sums, dout, 4 * sizeof(float)), CU_SUCCESS);
    e->cu->mem_free(dx);
    e->cu->mem_free(dout);
    return r;
}

Test(cuda_emu, barriers_order_the_threads_of_a_block)
{
    struct emu e = open_emu();
    float sums[4];
    cr_assert_eq(block_sums(&e, 1, sums), CU_SUCCESS);
    for (int b = 0; b < 4; b++)
        cr_assert_eq(sums[b], (float)(64 * 64 * b + 63 * 32), "block %d: %g", b, sums[b]);
}

/* Without the barriers the tree sum reads partial sums before they are written: some block
 * must get a wrong total (the emulator alternates the order of the threads' turns). */
Test(cuda_emu, a_missing_barrier_shows)
{
    struct emu e = open_emu();
    float sums[4];
    cr_assert_eq(block_sums(&e, 0, sums), CU_SUCCESS);
    int wrong = 0;
    for (int b = 0; b < 4; b++)
        wrong += sums[b] != (float)(64 * 64 * b + 63 * 32);
    cr_assert_gt(wrong, 0, "every block summed right without barriers");
}

Test(cuda_emu, a_barrier_that_part_of_the_block_skips_fails_the_launch)
{
    struct emu e = open_emu();
    cu_deviceptr d;
    cr_assert_eq(e.cu->mem_alloc(&d, 256 * sizeof(int)), CU_SUCCESS);
    void *params[] = {&d};
    cu_result r = e.cu->launch(function(&e, "divergent"), 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    cr_assert_eq(r, 719, "launch: %d", r);
    cr_assert(jit_cuda_sticky(r));
    cr_assert_eq(e.cu->ctx_synchronize(), 719, "the error is sticky");
}

Test(cuda_emu, invalid_launches_get_the_driver_errors)
{
    struct emu e = open_emu();
    cu_deviceptr d;
    cr_assert_eq(e.cu->mem_alloc(&d, 1024 * sizeof(int)), CU_SUCCESS);
    void *params[] = {&d};
    cu_function plain = function(&e, "plain"), sum = function(&e, "block_sum");
    const struct {
        cu_function f;
        unsigned g[3], b[3], shared;
        cu_result want;
    } cases[] = {
        {plain, {1, 1, 1}, {1025, 1, 1}, 0, 1}, /* more threads than a block has */
        {plain, {1, 1, 1}, {32, 32, 2}, 0, 1},
        {plain, {0, 1, 1}, {32, 1, 1}, 0, 1}, /* zero dimensions */
        {plain, {1, 1, 1}, {32, 0, 1}, 0, 1},
        {plain, {1, 65536, 1}, {32, 1, 1}, 0, 1}, /* grid y too large */
        {plain, {1, 1, 1}, {32, 1, 1}, 49153, 1}, /* more shared memory than a block has */
        {sum, {1, 1, 1}, {65, 1, 1}, 0, 701},     /* past __launch_bounds__(64) */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cu_result r =
            e.cu->launch(cases[c].f, cases[c].g[0], cases[c].g[1], cases[c].g[2], cases[c].b[0],
                         cases[c].b[1], cases[c].b[2], cases[c].shared, NULL, params, NULL);
        cr_assert_eq(r, cases[c].want, "case %zu: %d", c, r);
    }
    /* A host pointer where the kernel expects device memory. */
    int host[4];
    int *hp = host;
    void *bad[] = {&hp};
    cr_assert_eq(e.cu->launch(plain, 4, 1, 1, 1, 1, 1, 0, NULL, bad, NULL), 1);
    /* None of these is sticky: a valid launch runs. */
    cr_assert_eq(e.cu->launch(plain, 3, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CU_SUCCESS);
    int out[3];
    cr_assert_eq(e.cu->memcpy_dtoh(out, d, sizeof out), CU_SUCCESS);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(out[i], 3, "out[%d] = %d", i, out[i]);
    cu_function none;
    cr_assert_eq(e.cu->module_get_function(&none, e.mod, "not_a_kernel"), 500);
}

Test(cuda_emu, device_memory_is_accounted_and_checked)
{
    struct emu e = open_emu();
    size_t free0, total;
    cr_assert_eq(e.cu->mem_get_info(&free0, &total), CU_SUCCESS);
    cr_assert_eq(total, (size_t)1 << 30, "SYMRED_CUDA_EMU_MEM=1G: total %zu", total);
    cu_deviceptr d;
    cr_assert_eq(e.cu->mem_alloc(&d, 1000), CU_SUCCESS);
    size_t free1;
    cr_assert_eq(e.cu->mem_get_info(&free1, &total), CU_SUCCESS);
    cr_assert_eq(free0 - free1, 1000);
    cu_deviceptr start = 0;
    size_t size = 0;
    cr_assert_eq(e.cu->pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START, d + 999), CU_SUCCESS);
    cr_assert_eq(e.cu->pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 999), CU_SUCCESS);
    cr_assert(start == d && size == 1000, "range %llx + %zu", (unsigned long long)start, size);
    unsigned type = 0;
    cr_assert_eq(e.cu->pointer_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CU_SUCCESS);
    cr_assert_eq(type, CU_MEMORYTYPE_DEVICE);
    cr_assert_eq(e.cu->pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START, d + 1000), 1);
    char buf[1001];
    cr_assert_eq(e.cu->memcpy_dtoh(buf, d, 1001), 1, "a copy past the allocation");
    cr_assert_eq(e.cu->memcpy_htod((cu_deviceptr)(uintptr_t)buf, buf, 10), 1, "host as device");
    cr_assert_eq(e.cu->mem_free(d + 8), 1, "not the start of an allocation");
    cr_assert_eq(e.cu->mem_free(d), CU_SUCCESS);
    cr_assert_eq(e.cu->mem_free(d), 1, "freed twice");
    cr_assert_eq(e.cu->mem_alloc(&d, total + 1), CU_ERROR_OUT_OF_MEMORY);
}

Test(cuda_emu, a_compile_error_returns_the_compiler_log)
{
    const struct nvrtc_api *nv;
    const char *why;
    cr_assert_eq(jit_nvrtc_get(&nv, &why), SR_OK, "%s", why);
    cr_assert_eq(nv->major, 0, "the emulator's NVRTC version: %d", nv->major);
    struct nvrtc_out out;
    sr_status st = jit_nvrtc_compile("extern \"C\" __global__ void f(float *x) { x[0] = nope; }",
                                     "bad.cu", "sm_90", false, &out);
    cr_assert_eq(st, SR_ECOMPILE);
    cr_assert(out.log && strstr(out.log, "nope"), "log: %s", out.log ? out.log : "(none)");
    free(out.image);
    free(out.log);
}

Test(cuda_emu, a_missing_compiler_is_named)
{
    setenv("SYMRED_CUDA_EMU_CXX", "/nonexistent/g++", 1);
    struct nvrtc_out out;
    /* A source of its own, so that no cached object answers. */
    sr_status st = jit_nvrtc_compile("extern \"C\" __global__ void g(int *x) { x[0] = 12345; }",
                                     "g.cu", "sm_90", false, &out);
    cr_assert_eq(st, SR_ECOMPILE);
    cr_assert(out.log && strstr(out.log, "cannot run /nonexistent/g++"), "log: %s",
              out.log ? out.log : "(none)");
    free(out.image);
    free(out.log);
}

/* The "PTX" carries its source: a module whose compiled object has gone from the emulator's
 * cache (symred's image cache keeps the PTX longer) is built again when loaded. */
Test(cuda_emu, a_module_whose_object_has_gone_is_rebuilt)
{
    struct emu e = open_emu();
    struct nvrtc_out out;
    cr_assert_eq(jit_nvrtc_compile(kernels, "emu.cu", "sm_90", false, &out), SR_OK);
    char path[1400];
    const char *nl = strchr(out.image, '\n');
    cr_assert(nl, "PTX: %s", out.image);
    snprintf(path, sizeof path, "%s", nl + 1);
    path[strcspn(path, "\n")] = 0;
    cr_assert_eq(unlink(path), 0, "%s", path);
    cu_module m;
    cr_assert_eq(e.cu->module_load_data(&m, out.image), CU_SUCCESS);
    cr_assert_eq(access(path, R_OK), 0, "%s was not rebuilt", path);
    cu_function f;
    cr_assert_eq(e.cu->module_get_function(&f, m, "plain"), CU_SUCCESS);
    cr_assert_eq(e.cu->module_unload(m), CU_SUCCESS);
    free(out.image);
    free(out.log);
}
