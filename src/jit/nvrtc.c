/*
 * nvrtc.c — loads libnvrtc with dlopen and compiles generated CUDA C++ to PTX or cubin.
 *
 * symred has no link-time dependency on CUDA: the library is looked up by soname (the toolkit
 * we were built against first, then older majors, then the unversioned name), and in the
 * toolkit's lib64 directory named by $CUDA_PATH, $CUDA_HOME or /usr/local/cuda. The first
 * library that loads and has every required entry point wins. $SYMRED_NVRTC names a file to
 * use instead of the search.
 */
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct nvrtc_api nv;
static sr_status nv_status = SR_ENODEV;
static char nv_why[1536];
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

/* Resolves every entry point of h into nv; false (and why) if one is missing. */
static bool resolve(void *h, const char *path)
{
    const struct jit_sym syms[] = {
        {(void **)&nv.version, "nvrtcVersion", false},
        {(void **)&nv.create, "nvrtcCreateProgram", false},
        {(void **)&nv.destroy, "nvrtcDestroyProgram", false},
        {(void **)&nv.compile, "nvrtcCompileProgram", false},
        {(void **)&nv.ptx_size, "nvrtcGetPTXSize", false},
        {(void **)&nv.ptx, "nvrtcGetPTX", false},
        {(void **)&nv.cubin_size, "nvrtcGetCUBINSize", true},
        {(void **)&nv.cubin, "nvrtcGetCUBIN", true},
        {(void **)&nv.log_size, "nvrtcGetProgramLogSize", false},
        {(void **)&nv.log, "nvrtcGetProgramLog", false},
        {(void **)&nv.error_string, "nvrtcGetErrorString", false},
    };
    const char *missing = jit_resolve(h, syms, sizeof syms / sizeof *syms);
    if (missing) {
        size_t l = strlen(nv_why);
        snprintf(nv_why + l, sizeof nv_why - l, "%s%s: no symbol %s", l ? "; " : "", path, missing);
        memset(&nv, 0, sizeof nv);
        return false;
    }
    if (!nv.cubin_size || !nv.cubin)
        nv.cubin_size = NULL, nv.cubin = NULL;
    return true;
}

static void try_load(const char *path)
{
    if (nv_status == SR_OK)
        return;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t l = strlen(nv_why);
        const char *e = dlerror();
        /* dlerror repeats the name: keep the message short by naming the file once. */
        snprintf(nv_why + l, sizeof nv_why - l, "%s%s", l ? ", " : "", path);
        (void)e;
        return;
    }
    if (!resolve(h, path)) {
        dlclose(h);
        return;
    }
    if (nv.version(&nv.major, &nv.minor) != 0) {
        size_t l = strlen(nv_why);
        snprintf(nv_why + l, sizeof nv_why - l, "%s%s: nvrtcVersion failed", l ? "; " : "", path);
        memset(&nv, 0, sizeof nv);
        dlclose(h);
        return;
    }
    snprintf(nv.path, sizeof nv.path, "%s", path);
    nv_status = SR_OK; /* the handle stays open for the life of the process */
}

static void nv_init(void)
{
    const char *over = getenv("SYMRED_NVRTC");
    if (over && *over) {
        try_load(over);
    } else {
        static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                            "libnvrtc.so"};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            try_load(names[i]);
        const char *roots[] = {getenv("CUDA_PATH"), getenv("CUDA_HOME"), "/usr/local/cuda"};
        for (size_t r = 0; r < 3; r++) {
            if (!roots[r] || !*roots[r])
                continue;
            char p[600];
            for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
                snprintf(p, sizeof p, "%.500s/lib64/%s", roots[r], names[i]);
                try_load(p);
            }
        }
    }
    if (nv_status != SR_OK) {
        char tmp[sizeof nv_why];
        snprintf(tmp, sizeof tmp, "%s", nv_why);
        snprintf(nv_why, sizeof nv_why, "libnvrtc not found (tried %.1400s)", tmp);
    }
}

sr_status jit_nvrtc_get(const struct nvrtc_api **out, const char **why)
{
    pthread_once(&nv_once, nv_init);
    *out = nv_status == SR_OK ? &nv : NULL;
    if (why)
        *why = nv_status == SR_OK ? "" : nv_why;
    return nv_status;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static char *get_log(nvrtc_prog p)
{
    size_t n = 0;
    if (nv.log_size(p, &n) != 0 || n == 0)
        return NULL;
    char *s = malloc(n + 1);
    if (!s)
        return NULL;
    if (nv.log(p, s) != 0) {
        free(s);
        return NULL;
    }
    s[n] = 0;
    return s;
}

/* One NVRTC run: compile for arch and fetch PTX or cubin. NVRTC_ERROR_INVALID_OPTION (5)
 * is returned as SR_ENOTSUP so the caller can retry with PTX. */
static sr_status compile_once(const char *src, const char *name, const char *arch, bool cubin,
                              bool fast_math, struct nvrtc_out *out)
{
    nvrtc_prog p = NULL;
    int r = nv.create(&p, src, name, 0, NULL, NULL);
    if (r != 0)
        return r == 1 ? SR_ENOMEM : SR_EINTERNAL;
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[6] = {archopt, "--std=c++17", "-default-device"};
    int nopts = 3;
    if (fast_math)
        opts[nopts++] = "--use_fast_math";
    r = nv.compile(p, nopts, opts);
    free(out->log);
    out->log = get_log(p);
    sr_status st = SR_OK;
    if (r == 5) {
        st = SR_ENOTSUP;
    } else if (r != 0) {
        st = SR_ECOMPILE;
    } else {
        size_t n = 0;
        int (*size_fn)(nvrtc_prog, size_t *) = cubin ? nv.cubin_size : nv.ptx_size;
        int (*get_fn)(nvrtc_prog, char *) = cubin ? nv.cubin : nv.ptx;
        if (size_fn(p, &n) != 0 || n == 0) {
            st = cubin ? SR_ENOTSUP : SR_EINTERNAL;
        } else if (!(out->image = malloc(n))) {
            st = SR_ENOMEM;
        } else if (get_fn(p, out->image) != 0) {
            free(out->image);
            out->image = NULL;
            st = SR_EINTERNAL;
        } else {
            out->size = n;
            out->cubin = cubin;
        }
    }
    nv.destroy(&p);
    return st;
}

sr_status jit_nvrtc_compile(const char *src, const char *name, const char *arch, bool fast_math,
                            struct nvrtc_out *out)
{
    memset(out, 0, sizeof *out);
    const struct nvrtc_api *api;
    if (jit_nvrtc_get(&api, NULL) != SR_OK)
        return SR_ENODEV;
    double t0 = now_ms();
    sr_status st;
    if (strncmp(arch, "sm_", 3) == 0 && nv.cubin) {
        st = compile_once(src, name, arch, true, fast_math, out);
        if (st != SR_ENOTSUP)
            goto done;
    }
    char virt[32];
    if (strncmp(arch, "sm_", 3) == 0)
        snprintf(virt, sizeof virt, "compute_%.20s", arch + 3);
    else
        snprintf(virt, sizeof virt, "%.31s", arch);
    st = compile_once(src, name, virt, false, fast_math, out);
    if (st == SR_ENOTSUP)
        st = SR_ECOMPILE; /* NVRTC does not know this architecture: its log says so */
done:
    out->compile_ms = now_ms() - t0;
    return st;
}
