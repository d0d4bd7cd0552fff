/*
 * cuda-driver.c — loads the CUDA driver (libcuda.so.1) with dlopen and opens the device.
 *
 * The driver is only ever installed system-wide, so the search is the dynamic loader's:
 * libcuda.so.1, then libcuda.so. The toolkit's stubs/libcuda.so is deliberately not searched:
 * it exists only for linking and its cuInit always fails. $SYMRED_LIBCUDA names a file to use
 * instead (tests point it at the stub to check the failure path). Everything happens once per
 * process; the primary context of the device is retained and never released, so kernels of any
 * context and thread share it.
 */
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct cuda_api cu;
static struct cuda_device cudev;
static sr_status cu_status = SR_ENODEV;
static char cu_why[1024];
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
/* Set once a sticky driver error has made the context unusable (jit_cuda_mark_lost). */
static pthread_mutex_t cu_lost_lock = PTHREAD_MUTEX_INITIALIZER;
static char cu_lost[512];

const char *jit_cuda_error(cu_result r)
{
    const char *s = NULL;
    if (cu.error_string && cu.error_string(r, &s) == CU_SUCCESS && s)
        return s;
    return "unknown CUDA error";
}

static bool resolve(void *h, const char *path)
{
    const struct jit_sym syms[] = {
        {(void **)&cu.init, "cuInit", false},
        {(void **)&cu.driver_version, "cuDriverGetVersion", false},
        {(void **)&cu.device_count, "cuDeviceGetCount", false},
        {(void **)&cu.device_get, "cuDeviceGet", false},
        {(void **)&cu.device_attr, "cuDeviceGetAttribute", false},
        {(void **)&cu.device_name, "cuDeviceGetName", false},
        {(void **)&cu.primary_retain, "cuDevicePrimaryCtxRetain", false},
        {(void **)&cu.ctx_set_current, "cuCtxSetCurrent", false},
        {(void **)&cu.module_load_data, "cuModuleLoadData", false},
        {(void **)&cu.module_unload, "cuModuleUnload", false},
        {(void **)&cu.module_get_function, "cuModuleGetFunction", false},
        {(void **)&cu.mem_alloc, "cuMemAlloc_v2", false},
        {(void **)&cu.mem_free, "cuMemFree_v2", false},
        {(void **)&cu.memcpy_htod, "cuMemcpyHtoD_v2", false},
        {(void **)&cu.memcpy_dtoh, "cuMemcpyDtoH_v2", false},
        {(void **)&cu.launch, "cuLaunchKernel", false},
        {(void **)&cu.ctx_synchronize, "cuCtxSynchronize", false},
        {(void **)&cu.error_string, "cuGetErrorString", false},
        {(void **)&cu.pointer_attr, "cuPointerGetAttribute", true},
        {(void **)&cu.mem_get_info, "cuMemGetInfo_v2", false},
    };
    const char *missing = jit_resolve(h, syms, sizeof syms / sizeof *syms);
    if (missing) {
        snprintf(cu_why, sizeof cu_why, "%s has no symbol %s (driver too old?)", path, missing);
        memset(&cu, 0, sizeof cu);
        return false;
    }
    return true;
}

const char *jit_resolve(void *h, const struct jit_sym *syms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        /* POSIX allows converting dlsym's object pointer to a function pointer this way. */
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional)
            return syms[i].name;
    }
    return NULL;
}

/* A failed driver call during set-up: the reason, with the driver's own words. */
static void fail(const char *what, cu_result r)
{
    snprintf(cu_why, sizeof cu_why, "CUDA driver %s: %s failed: %s (error %d)", cudev.lib, what,
             jit_cuda_error(r), r);
}

static void cu_init(void)
{
    const char *over = getenv("SYMRED_LIBCUDA");
    static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
    void *h = NULL;
    if (over && *over) {
        h = dlopen(over, RTLD_NOW | RTLD_LOCAL);
        snprintf(cudev.lib, sizeof cudev.lib, "%s", over);
        if (!h) {
            snprintf(cu_why, sizeof cu_why, "no CUDA driver: cannot load %.400s (SYMRED_LIBCUDA)",
                     over);
            return;
        }
    } else {
        for (size_t i = 0; i < 2 && !h; i++) {
            h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
            snprintf(cudev.lib, sizeof cudev.lib, "%s", names[i]);
        }
        if (!h) {
            snprintf(cu_why, sizeof cu_why,
                     "no CUDA driver: libcuda.so.1 and libcuda.so not found by the dynamic loader "
                     "(is the NVIDIA driver installed?)");
            return;
        }
    }
    if (!resolve(h, cudev.lib)) {
        dlclose(h);
        return;
    }
    cu_result r = cu.init(0);
    if (r != CU_SUCCESS) {
        fail("cuInit", r);
        if (r == CU_ERROR_STUB_LIBRARY || r == CU_ERROR_NO_DEVICE) {
            size_t l = strlen(cu_why);
            snprintf(cu_why + l, sizeof cu_why - l, "%s",
                     r == CU_ERROR_NO_DEVICE ? " — no NVIDIA GPU is visible"
                                             : " — this is the toolkit's stub, not a driver");
        }
        return; /* the handle stays open: unloading a half-initialised driver is not safe */
    }
    int n = 0;
    if ((r = cu.device_count(&n)) != CU_SUCCESS) {
        fail("cuDeviceGetCount", r);
        return;
    }
    long ord = 0;
    const char *env = getenv("SYMRED_CUDA_DEVICE");
    if (env && *env) {
        char *end;
        ord = strtol(env, &end, 10);
        if (*end || ord < 0 || ord > 1024) {
            snprintf(cu_why, sizeof cu_why, "SYMRED_CUDA_DEVICE=%.100s: expected a device number",
                     env);
            return;
        }
    }
    if (n <= ord) {
        snprintf(cu_why, sizeof cu_why, "CUDA driver %s: %d device(s), device %ld requested",
                 cudev.lib, n, ord);
        return;
    }
    if ((r = cu.device_get(&cudev.dev, (int)ord)) != CU_SUCCESS) {
        fail("cuDeviceGet", r);
        return;
    }
    if ((r = cu.device_attr(&cudev.cc_major, CU_ATTR_CC_MAJOR, cudev.dev)) != CU_SUCCESS ||
        (r = cu.device_attr(&cudev.cc_minor, CU_ATTR_CC_MINOR, cudev.dev)) != CU_SUCCESS ||
        (r = cu.device_attr(&cudev.sm_count, CU_ATTR_MULTIPROCESSOR_COUNT, cudev.dev)) !=
            CU_SUCCESS ||
        (r = cu.device_attr(&cudev.max_shared, CU_ATTR_MAX_SHARED_PER_BLOCK, cudev.dev)) !=
            CU_SUCCESS) {
        fail("cuDeviceGetAttribute", r);
        return;
    }
    if (cu.device_name(cudev.name, (int)sizeof cudev.name, cudev.dev) != CU_SUCCESS)
        snprintf(cudev.name, sizeof cudev.name, "CUDA device %ld", ord);
    if ((r = cu.primary_retain(&cudev.ctx, cudev.dev)) != CU_SUCCESS) {
        fail("cuDevicePrimaryCtxRetain", r);
        return;
    }
    cudev.api = &cu;
    cu_status = SR_OK;
}

sr_status jit_cuda_device(const struct cuda_device **out, const char **why)
{
    pthread_once(&cu_once, cu_init);
    *out = cu_status == SR_OK ? &cudev : NULL;
    if (why)
        *why = cu_status == SR_OK ? "" : cu_why;
    return cu_status;
}

bool jit_cuda_sticky(cu_result r)
{
    /* CUDA_ERROR_ILLEGAL_ADDRESS (700), LAUNCH_TIMEOUT (702), HARDWARE_STACK_ERROR (714),
     * ILLEGAL_INSTRUCTION (715), MISALIGNED_ADDRESS (716), INVALID_ADDRESS_SPACE (717),
     * INVALID_PC (718), LAUNCH_FAILED (719). */
    return r == 700 || r == 702 || (r >= 714 && r <= 719);
}

void jit_cuda_mark_lost(cu_result r, const char *what)
{
    pthread_mutex_lock(&cu_lost_lock);
    if (!cu_lost[0])
        snprintf(cu_lost, sizeof cu_lost, "%s failed: %s (error %d)", what, jit_cuda_error(r), r);
    pthread_mutex_unlock(&cu_lost_lock);
}

bool jit_cuda_lost(char *why, size_t cap)
{
    pthread_mutex_lock(&cu_lost_lock);
    bool lost = cu_lost[0] != 0;
    if (lost)
        snprintf(why, cap, "%s", cu_lost);
    pthread_mutex_unlock(&cu_lost_lock);
    return lost;
}
