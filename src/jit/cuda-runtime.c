/*
 * cuda-runtime.c — the CUDA backend: prepares a kernel (emit CUDA C++, compile it with NVRTC
 * or fetch the image from the disk cache, load it into the device's primary context) and runs
 * it (copy host arrays in, launch, copy results out).
 *
 * Device pointers: sr_run_desc.device_args marks arguments that already live on the GPU and
 * device_out marks the outputs; those are used in place. Everything else is copied per call.
 * Failures of the driver become statuses with the driver's message: SR_ENOMEM for device out
 * of memory, SR_EINTERNAL for a failed launch or copy, SR_ENODEV when there is no GPU.
 *
 * The disk cache follows the CPU cache's rules (jit_cache_dir, the same trailer, write to a
 * temporary file and rename): <dir>/<key>.cuda holds a cubin or PTX image, the key hashing the
 * emitted source, the NVRTC version, the target architecture and the symred version.
 */
#include "cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CUDA_ABI_VERSION 2 /* 2: the main kernel takes the block-sparse ranges */

struct cuda_kernel {
    const struct cuda_device *dev;
    cu_module mod;
    cu_function main, combine;
    struct cuda_plan plan;
    /* The fused two-product kernel when the plan chose it (its module has no main and combine
     * kernels, and plan.block is its rows per block); NULL otherwise. */
    cu_function fused;
    struct cuda_fused fplan;
    enum jit_acc acc;
    struct cuda_image_info info;
    /* Bytes copied between host and device by this kernel's runs (tests use them to prove that
     * device pointers are used in place). */
    _Atomic uint64_t htod_bytes, dtoh_bytes;
};

void cuda_kernel_copies(const sr_kernel *k, uint64_t *htod, uint64_t *dtoh)
{
    const struct cuda_kernel *ck = k->backend == &cuda_backend ? k->backend_data : NULL;
    *htod = ck ? atomic_load(&ck->htod_bytes) : 0;
    *dtoh = ck ? atomic_load(&ck->dtoh_bytes) : 0;
}

bool jit_cuda_available(void)
{
    const struct cuda_device *d;
    return jit_cuda_device(&d, NULL) == SR_OK;
}

/* ---- the image cache ------------------------------------------------------------------------ */

static sr_status read_entry(const char *path, const char *key, struct nvrtc_out *out)
{
    size_t n = 0;
    out->image = jit_cache_read(path, key, &n);
    if (!out->image)
        return SR_EIO;
    out->size = n;
    out->cubin = n >= 4 && memcmp(out->image, "\177ELF", 4) == 0;
    return SR_OK;
}

static sr_status store_entry(const char *dir, const char *path, const char *key,
                             const struct nvrtc_out *img)
{
    char tmp[2300];
    snprintf(tmp, sizeof tmp, "%s/tmp-XXXXXX", dir);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return SR_EIO;
    size_t off = 0;
    while (off < img->size) {
        ssize_t n = write(fd, img->image + off, img->size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    bool ok = off == img->size;
    if (close(fd) != 0)
        ok = false;
    if (ok && jit_cache_seal(tmp, key) == SR_OK && rename(tmp, path) == 0)
        return SR_OK;
    unlink(tmp);
    return SR_EIO;
}

sr_status jit_cuda_image(sr_ctx *ctx, const char *src, const char *arch, struct nvrtc_out *out,
                         struct cuda_image_info *info)
{
    memset(out, 0, sizeof *out);
    memset(info, 0, sizeof *info);
    const struct nvrtc_api *nv;
    const char *why;
    if (jit_nvrtc_get(&nv, &why) != SR_OK)
        return sr__error(ctx, SR_ENODEV, "device cuda: %s", why);
    uint64_t h[2] = {JIT_HASH_INIT, 0x84222325cbf29ce4ULL};
    int abi[4] = {CUDA_ABI_VERSION, nv->major, nv->minor, 0};
    for (int i = 0; i < 2; i++) {
        abi[3] = i;
        h[i] = jit_hash(h[i], src, strlen(src));
        h[i] = jit_hash(h[i], arch, strlen(arch));
        h[i] = jit_hash(h[i], abi, sizeof abi);
        h[i] = jit_hash(h[i], SYMRED_VERSION_STRING, strlen(SYMRED_VERSION_STRING));
    }
    char dir[2048], path[2200];
    snprintf(info->key, sizeof info->key, "%016llx%016llx", (unsigned long long)h[0],
             (unsigned long long)h[1]);
    bool cached = jit_cache_dir(ctx, dir, sizeof dir, info->cache, sizeof info->cache) == SR_OK;
    if (cached) {
        snprintf(path, sizeof path, "%s/%s.cuda", dir, info->key);
        if (access(path, F_OK) == 0) {
            if (read_entry(path, info->key, out) == SR_OK) {
                info->origin = "disk";
                snprintf(info->cache, sizeof info->cache, "hit");
                snprintf(info->path, sizeof info->path, "%s", path);
                return SR_OK;
            }
            unlink(path); /* corrupt or unreadable: rebuilt, never trusted */
        }
    }
    sr_status st = jit_nvrtc_compile(src, "symred-kernel.cu", arch, false, out);
    info->compile_ms = out->compile_ms;
    if (st == SR_ECOMPILE)
        return sr__error(ctx, SR_ECOMPILE,
                         "NVRTC (%s) failed to compile the CUDA kernel for %s: %.1500s", nv->path,
                         arch, out->log ? out->log : "(no log)");
    if (st != SR_OK)
        return sr__error(ctx, st, "NVRTC (%s) failed for %s: %s", nv->path, arch,
                         sr_status_str(st));
    info->origin = "compiled";
    if (cached) {
        if (store_entry(dir, path, info->key, out) == SR_OK) {
            snprintf(info->cache, sizeof info->cache, "miss (stored)");
            snprintf(info->path, sizeof info->path, "%s", path);
        } else {
            snprintf(info->cache, sizeof info->cache, "miss (could not store in %.200s)", dir);
        }
    } else {
        char tmp[sizeof info->cache];
        snprintf(tmp, sizeof tmp, "%s", info->cache);
        snprintf(info->cache, sizeof info->cache, "off: %.200s", tmp);
    }
    return SR_OK;
}

/* ---- prepare / release ---------------------------------------------------------------------- */

static sr_status cu_fail(sr_ctx *ctx, cu_result r, const char *what)
{
    if (jit_cuda_sticky(r)) {
        jit_cuda_mark_lost(r, what);
        return sr__error(ctx, SR_EINTERNAL,
                         "CUDA: %s failed: %s (error %d); the GPU context is lost for the rest of "
                         "this process (CUDA cannot recover from this error: restart the process; "
                         "the CPU backends still work)",
                         what, jit_cuda_error(r), r);
    }
    if (r == CU_ERROR_OUT_OF_MEMORY)
        return sr__error(ctx, SR_ENOMEM, "CUDA: out of device memory (%s)", what);
    return sr__error(ctx, SR_EINTERNAL, "CUDA: %s failed: %s (error %d)", what, jit_cuda_error(r),
                     r);
}

static void cuda_release(sr_kernel *k)
{
    struct cuda_kernel *ck = k->backend_data;
    if (!ck)
        return;
    if (ck->mod) {
        ck->dev->api->ctx_set_current(ck->dev->ctx);
        ck->dev->api->module_unload(ck->mod);
    }
    free(ck);
    k->backend_data = NULL;
}

/* The accumulation of k's kernels (enum jit_acc): the kernel's own, else SYMRED_ACC. */
static enum jit_acc acc_of(const sr_kernel *k, const struct jit_ctx *jc)
{
    return k->acc != SR_ACC_DEFAULT ? (enum jit_acc)(k->acc - 1) : (enum jit_acc)jc->acc;
}

/* k's candidates for the planner (cuda_plans), none without a device (cuda_prepare says why). */
static int cuda_candidates(const sr_kernel *k, struct sr_plan *out)
{
    const struct cuda_device *dev;
    const struct nvrtc_api *nv;
    const char *why;
    struct jit_ctx *jc = NULL;
    if (jit_cuda_device(&dev, &why) != SR_OK || jit_nvrtc_get(&nv, &why) != SR_OK ||
        jit_ctx_get(k->ctx, &jc) != SR_OK)
        return 0;
    return cuda_plans(k, (int)acc_of(k, jc), out);
}

/* Realises plan p of k, chosen by the planner: the fused strategy's module, declined when its
 * emitter finds the tiles past shared memory (the planner's next choice is the direct one), or
 * the direct strategy's (p direct or NULL). */
static sr_status cuda_prepare(sr_kernel *k, const struct sr_plan *p, struct sr_realise *real)
{
    sr_ctx *ctx = k->ctx;
    const struct cuda_device *dev;
    const char *why;
    if (jit_cuda_device(&dev, &why) != SR_OK)
        return sr__error(ctx, SR_ENODEV, "device cuda: %s", why);
    const struct nvrtc_api *nv;
    if (jit_nvrtc_get(&nv, &why) != SR_OK)
        return sr__error(ctx, SR_ENODEV, "device cuda: %s", why);
    struct jit_ctx *jc = NULL;
    sr_status st = jit_ctx_get(ctx, &jc);
    if (st != SR_OK)
        return st;
    struct cuda_kernel *ck = calloc(1, sizeof *ck);
    if (!ck)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    ck->dev = dev;
    ck->acc = acc_of(k, jc);
    struct expr_buf src = {0};
    if (p && p->id == CUDA_PLAN_FUSED) {
        st = jit_emit_cuda_fused(k, ck->acc, &src, &ck->plan, &ck->fplan);
        if (st == SR_ENOTSUP) {
            free(src.data);
            free(ck);
            real->declined = "declined when realised: its tiles exceed shared memory";
            return SR_ENOTSUP;
        }
        if (st == SR_OK)
            k->plans[CUDA_PLAN_FUSED].tj = ck->fplan.tj;
    } else {
        st = jit_emit_cuda(k, ck->acc, &src, &ck->plan);
    }
    if (st == SR_ENOTSUP) {
        st =
            sr__error(ctx, SR_ENOTSUP,
                      "device cuda: the formula does not fit the direct CUDA strategy (its "
                      "reduced-index terms exceed shared memory, it is too large, or K*dim > 256)");
        goto fail;
    }
    if (st != SR_OK || src.oom) {
        st = sr__error(ctx, SR_ENOMEM, "out of memory emitting the CUDA kernel");
        goto fail;
    }
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d%d", dev->cc_major, dev->cc_minor);
    struct nvrtc_out img;
    st = jit_cuda_image(ctx, src.data, arch, &img, &ck->info);
    free(img.log);
    if (st != SR_OK) {
        free(img.image);
        goto fail;
    }
    ck->info.cubin = img.cubin;
    ck->info.bytes = img.size;
    snprintf(ck->info.arch, sizeof ck->info.arch, "%s", arch);
    const struct cuda_api *cu = dev->api;
    cu_result r = cu->ctx_set_current(dev->ctx);
    if (r == CU_SUCCESS)
        r = cu->module_load_data(&ck->mod, img.image);
    free(img.image);
    if (r != CU_SUCCESS) {
        ck->mod = NULL;
        st = cu_fail(ctx, r, "cuModuleLoadData");
        goto fail;
    }
    if (ck->fplan.R > 0) {
        if ((r = cu->module_get_function(&ck->fused, ck->mod, CUDA_KERNEL_FUSED)) != CU_SUCCESS ||
            (r = cu->module_get_function(&ck->combine, ck->mod, CUDA_KERNEL_FUSED_COMBINE)) !=
                CU_SUCCESS) {
            st = cu_fail(ctx, r, "cuModuleGetFunction (" CUDA_KERNEL_FUSED ")");
            goto fail;
        }
    } else if ((r = cu->module_get_function(&ck->main, ck->mod, CUDA_KERNEL_MAIN)) != CU_SUCCESS ||
               (r = cu->module_get_function(&ck->combine, ck->mod, CUDA_KERNEL_COMBINE)) !=
                   CU_SUCCESS) {
        st = cu_fail(ctx, r, "cuModuleGetFunction");
        goto fail;
    }
    free(src.data);
    k->backend_data = ck;
    return SR_OK;
fail:
    free(src.data);
    k->backend_data = ck;
    cuda_release(k);
    return st;
}

/* ---- run ------------------------------------------------------------------------------------ */

/* Device buffers of one call, freed together. */
struct allocs {
    cu_deviceptr p[72];
    int n;
};

static sr_status dalloc(sr_ctx *ctx, const struct cuda_api *cu, struct allocs *a, size_t bytes,
                        cu_deviceptr *out, const char *what)
{
    if (a->n >= (int)(sizeof a->p / sizeof *a->p))
        return sr__error(ctx, SR_ENOTSUP, "device cuda: too many device buffers in one call");
    cu_result r = cu->mem_alloc(out, bytes ? bytes : 1);
    if (r != CU_SUCCESS) {
        char w[200];
        size_t free_b = 0, total_b = 0;
        if (r == CU_ERROR_OUT_OF_MEMORY && cu->mem_get_info(&free_b, &total_b) == CU_SUCCESS)
            snprintf(w, sizeof w, "cuMemAlloc of %zu bytes for %s; %zu of %zu bytes free", bytes,
                     what, free_b, total_b);
        else
            snprintf(w, sizeof w, "cuMemAlloc of %zu bytes for %s", bytes, what);
        return cu_fail(ctx, r, w);
    }
    a->p[a->n++] = *out;
    return SR_OK;
}

static sr_status htod(sr_ctx *ctx, struct cuda_kernel *ck, cu_deviceptr dst, const void *src,
                      size_t bytes)
{
    if (!bytes)
        return SR_OK;
    cu_result r = ck->dev->api->memcpy_htod(dst, src, bytes);
    if (r != CU_SUCCESS)
        return cu_fail(ctx, r, "cuMemcpyHtoD");
    atomic_fetch_add(&ck->htod_bytes, bytes);
    return SR_OK;
}

static sr_status dtoh(sr_ctx *ctx, struct cuda_kernel *ck, void *dst, cu_deviceptr src,
                      size_t bytes)
{
    if (!bytes)
        return SR_OK;
    cu_result r = ck->dev->api->memcpy_dtoh(dst, src, bytes);
    if (r != CU_SUCCESS)
        return cu_fail(ctx, r, "cuMemcpyDtoH");
    atomic_fetch_add(&ck->dtoh_bytes, bytes);
    return SR_OK;
}

/* Split-j: how many chunks of the reduced range, so that the grid has a few blocks per SM, with
 * their partial states within room bytes (room < 0: no bound). */
static int split_count(const struct cuda_kernel *ck, int64_t nout, int64_t nred, int64_t room)
{
    int64_t blocks = (nout + ck->plan.block - 1) / ck->plan.block;
    int64_t want = 4 * (int64_t)(ck->dev->sm_count > 0 ? ck->dev->sm_count : 1);
    if (blocks >= want / 2 || nout <= 0)
        return 1;
    int64_t ns = (want + blocks - 1) / blocks;
    int64_t most = nred / (4 * (int64_t)ck->plan.tile); /* at least 4 tiles per chunk */
    if (ns > most)
        ns = most;
    if (ns > 1024)
        ns = 1024;
    while (ns > 1 && room >= 0 && ns * nout * ck->plan.state_bytes > room)
        ns /= 2;
    return ns > 1 ? (int)ns : 1;
}

/* A device pointer from the caller: memory the driver knows (cuMemAlloc, cudaMalloc, a block of
 * a caching allocator such as PyTorch's, managed or mapped host memory) with at least bytes from
 * p to the end of its allocation. Checked before the launch, because a kernel that faults on a
 * bad pointer loses the context for the whole process. */
static sr_status check_devptr(sr_ctx *ctx, const struct cuda_api *cu, cu_deviceptr p, size_t bytes,
                              const char *what)
{
    if (!cu->pointer_attr || !bytes)
        return SR_OK;
    cu_deviceptr start = 0;
    size_t size = 0;
    cu_result r = cu->pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START, p);
    if (r == CU_SUCCESS)
        r = cu->pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    if (r != CU_SUCCESS)
        return sr__error(ctx, SR_EINVAL,
                         "device cuda: %s (0x%llx) is marked as a device pointer but is not memory "
                         "the CUDA driver knows: %s (error %d)",
                         what, (unsigned long long)p, jit_cuda_error(r), r);
    if (p < start || p - start > size || size - (p - start) < bytes)
        return sr__error(ctx, SR_EINVAL,
                         "device cuda: %s (0x%llx) needs %zu bytes, but its allocation (0x%llx, "
                         "%zu bytes) ends %llu bytes after it",
                         what, (unsigned long long)p, bytes, (unsigned long long)start, size,
                         (unsigned long long)(start + size - p));
    return SR_OK;
}

/* How one call uses device memory: the arrays copied whole (parameters and the variables of
 * the reduced index), and per output row (the output side's variables and the outputs). */
struct run_plan {
    int64_t nout, nred;
    int64_t whole;   /* bytes of host arrays copied whole */
    int64_t per_row; /* bytes per output row: host row variables + host outputs */
    int64_t rows;    /* output rows per pass */
};

static sr_status plan_run(const sr_kernel *k, const struct cuda_kernel *ck, const sr_run_desc *run,
                          uint64_t device_args, int device_out, struct run_plan *p)
{
    const size_t esz = sr_dtype_size(k->dtype);
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    const sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    p->nout = k->axis == 1 ? run->nx : run->ny;
    p->nred = k->axis == 1 ? run->ny : run->nx;
    p->whole = p->per_row = 0;
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim || (v < 64 && (device_args >> v & 1)))
            continue;
        if (var->cat == out_cat)
            p->per_row += (int64_t)var->dim * (int64_t)esz;
        else
            p->whole += (var->cat == SR_CAT_PARAM ? 1 : p->nred) * var->dim * (int64_t)esz;
    }
    if (!device_out)
        p->per_row +=
            (int64_t)k->out_dim * ((ri->values ? (int64_t)esz : 0) + (ri->indices ? 8 : 0));
    p->rows = p->nout > 0 ? p->nout : 1;
    int64_t lim = sr__call_budget(k);
    if (lim <= 0)
        return SR_OK;
    /* Within the budget: the whole arrays, then as many output rows per pass as fit. */
    int64_t room = lim - p->whole;
    if (room < (p->per_row > 0 ? p->per_row : 0))
        return sr__error(k->ctx, SR_EBUDGET,
                         "memory budget exceeded: the cuda backend copies the parameters and the "
                         "variables of the reduced index whole (%lld bytes) and needs %lld bytes "
                         "per output row, the budget is %lld bytes (SYMRED_MEM_LIMIT or "
                         "sr_ctx_set_mem_limit; pass device pointers to use arrays in place)",
                         (long long)p->whole, (long long)p->per_row, (long long)lim);
    if (p->per_row > 0 && room / p->per_row < p->rows)
        p->rows = room / p->per_row;
    return SR_OK;
}

/* The launch blocks of plan p (its rows renumbered from 0 for the pass): 4 values each, rows
 * [o0, o1) of one range block, at most bs of them, and its intervals [q0, q1) in p->iv. Writes
 * at most cap blocks into lb (NULL: count only); returns the count. */
static int64_t launch_blocks(const struct sr_rplan *p, int64_t bs, long long *lb, int64_t cap)
{
    int64_t n = 0;
    for (int64_t c = 0; c < p->nblocks; c++)
        for (int64_t o = p->blk[2 * c]; o < p->blk[2 * c + 1]; o += bs, n++)
            if (lb && n < cap) {
                lb[4 * n] = o;
                lb[4 * n + 1] = o + bs < p->blk[2 * c + 1] ? o + bs : p->blk[2 * c + 1];
                lb[4 * n + 2] = p->ivoff[c];
                lb[4 * n + 3] = p->ivoff[c + 1];
            }
    return n;
}

/* rp: block-sparse ranges (NULL: dense). Each pass of output rows runs the plan restricted to
 * its rows (sr__rplan_window); rows outside the blocks are written by sr__run_ranges after. */
static sr_status cuda_reduce(const sr_kernel *k, const sr_run_desc *run, uint64_t device_args,
                             int device_out, const struct sr_rplan *rp)
{
    struct cuda_kernel *ck = k->backend_data;
    const struct cuda_api *cu = ck->dev->api;
    sr_ctx *ctx = k->ctx;
    const size_t esz = sr_dtype_size(k->dtype);
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    const sr_cat out_cat = k->axis == 1 ? SR_CAT_I : SR_CAT_J;
    char lost[512];
    if (jit_cuda_lost(lost, sizeof lost))
        return sr__error(ctx, SR_EINTERNAL,
                         "CUDA: the GPU context was lost earlier in this process (%s); restart the "
                         "process to use the GPU again",
                         lost);
    struct run_plan p;
    sr_status st = plan_run(k, ck, run, device_args, device_out, &p);
    if (st != SR_OK || p.nout == 0)
        return st;
    cu_deviceptr *argp = calloc((size_t)k->nargs + 1, sizeof *argp);
    cu_deviceptr *base = calloc((size_t)k->nargs + 1, sizeof *base);
    if (!argp || !base) {
        free(argp);
        free(base);
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    }
    struct allocs a = {.n = 0};
    cu_result r = CU_SUCCESS;
    cu_deviceptr dlb = 0, div = 0; /* ranges: launch blocks and intervals on the device */
    long long *lb = NULL;
    int64_t lbcap = 0;
    if ((r = cu->ctx_set_current(ck->dev->ctx)) != CU_SUCCESS) {
        st = cu_fail(ctx, r, "cuCtxSetCurrent");
        goto out;
    }
    /* Parameters and reduced-side variables: copied once. Output-side variables: a buffer of
     * p.rows rows, filled per pass (or the caller's device array, offset per pass). */
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim)
            continue;
        if (v < 64 && (device_args >> v & 1)) {
            base[v] = (cu_deviceptr)(uintptr_t)run->args[v];
            int64_t n = var->cat == SR_CAT_I ? run->nx : var->cat == SR_CAT_J ? run->ny : 1;
            char what[64];
            snprintf(what, sizeof what, "argument %d", v);
            if ((st = check_devptr(ctx, cu, base[v], (size_t)n * (size_t)var->dim * esz, what)))
                goto out;
            continue;
        }
        bool row = var->cat == out_cat;
        int64_t rows = row ? p.rows : var->cat == SR_CAT_PARAM ? 1 : p.nred;
        size_t bytes = (size_t)rows * (size_t)var->dim * esz;
        char what[64];
        snprintf(what, sizeof what, "argument %d", v);
        if ((st = dalloc(ctx, cu, &a, bytes, &base[v], what)) != SR_OK)
            goto out;
        if (!row && (st = htod(ctx, ck, base[v], run->args[v], bytes)) != SR_OK)
            goto out;
    }
    const size_t vrow = (size_t)k->out_dim * esz, irow = (size_t)k->out_dim * 8;
    cu_deviceptr dout = 0, didx = 0, dpart = 0;
    if (device_out) {
        dout = ri->values ? (cu_deviceptr)(uintptr_t)run->out : 0;
        didx = ri->indices ? (cu_deviceptr)(uintptr_t)run->out_idx : 0;
        if ((dout && (st = check_devptr(ctx, cu, dout, (size_t)p.nout * vrow, "the values"))) ||
            (didx && (st = check_devptr(ctx, cu, didx, (size_t)p.nout * irow, "the indices"))))
            goto out;
    } else {
        if (ri->values &&
            (st = dalloc(ctx, cu, &a, (size_t)p.rows * vrow, &dout, "the values")) != SR_OK)
            goto out;
        if (ri->indices &&
            (st = dalloc(ctx, cu, &a, (size_t)p.rows * irow, &didx, "the indices")) != SR_OK)
            goto out;
    }
    int64_t lim = sr__call_budget(k);
    int64_t room = lim > 0 ? lim - p.whole - p.rows * p.per_row : -1;
    const bool fused = ck->fused != NULL;
    int nsplit = p.nred > 0 && !rp ? split_count(ck, p.rows, p.nred, room) : 1;
    long long nr = p.nred, chunk = p.nred;
    if (nsplit > 1) {
        int64_t tj = ck->plan.tile;
        chunk = ((p.nred + nsplit - 1) / nsplit + tj - 1) / tj * tj;
        nsplit = (int)((p.nred + chunk - 1) / chunk);
    }
    if (nsplit > 1 &&
        (st = dalloc(ctx, cu, &a, (size_t)nsplit * (size_t)p.rows * (size_t)ck->plan.state_bytes,
                     &dpart, "the split-j partial results")) != SR_OK)
        goto out;
    /* Ranges: the intervals once, and room for the launch blocks of any pass (a pass cuts at
     * most one block in two at each of its ends). */
    if (rp) {
        lbcap = launch_blocks(rp, ck->plan.block, NULL, 0) + 2;
        size_t ivb = (size_t)rp->ivoff[rp->nblocks] * 2 * sizeof(int64_t);
        lb = malloc((size_t)lbcap * 4 * sizeof *lb);
        if (!lb) {
            st = sr__error(ctx, SR_ENOMEM, "out of memory for the launch blocks of the ranges");
            goto out;
        }
        if ((st = dalloc(ctx, cu, &a, ivb, &div, "the ranges' intervals")) != SR_OK ||
            (st = htod(ctx, ck, div, rp->iv, ivb)) != SR_OK ||
            (st = dalloc(ctx, cu, &a, (size_t)lbcap * 4 * sizeof *lb, &dlb,
                         "the ranges' launch blocks")) != SR_OK)
            goto out;
    }
    for (int64_t r0 = 0; r0 < p.nout; r0 += p.rows) {
        long long no = p.nout - r0 < p.rows ? p.nout - r0 : p.rows;
        unsigned gx = (unsigned)((no + ck->plan.block - 1) / ck->plan.block);
        cu_deviceptr plb = 0;
        if (rp) {
            struct sr_rplan win;
            if (sr__rplan_window(rp, r0, r0 + no, &win) != SR_OK) {
                st = sr__error(ctx, SR_ENOMEM, "out of memory for the ranges of a pass");
                goto out;
            }
            int64_t nlb = launch_blocks(&win, ck->plan.block, lb, lbcap);
            sr__rplan_free(&win);
            if (nlb > lbcap || nlb > 0x7fffffff) {
                st = sr__error(ctx, SR_EINTERNAL, "cuda: %lld launch blocks for the ranges",
                               (long long)nlb);
                goto out;
            }
            if (nlb == 0)
                continue; /* no block in this pass: every row gets the identity */
            if ((st = htod(ctx, ck, dlb, lb, (size_t)nlb * 4 * sizeof *lb)) != SR_OK)
                goto out;
            gx = (unsigned)nlb;
            plb = dlb;
        }
        for (int v = 0; v < k->nargs; v++) {
            const struct expr_var *var = &k->vars[v];
            argp[v] = base[v];
            if (!var->dim || var->cat != out_cat)
                continue;
            size_t rb = (size_t)var->dim * esz;
            if (v < 64 && (device_args >> v & 1)) {
                argp[v] = base[v] + (cu_deviceptr)r0 * rb;
                continue;
            }
            if ((st = htod(ctx, ck, base[v], (const char *)run->args[v] + (size_t)r0 * rb,
                           (size_t)no * rb)) != SR_OK)
                goto out;
        }
        cu_deviceptr o = dout, oi = didx;
        if (device_out) {
            o = dout ? dout + (cu_deviceptr)r0 * vrow : 0;
            oi = didx ? didx + (cu_deviceptr)r0 * irow : 0;
        }
        void *params[] = {argp, &no, &nr, &chunk, &o, &oi, &dpart, &plb, &div};
        void *fparams[] = {argp, &no, &nr, &chunk, &o, &dpart, &plb, &div};
        const struct cuda_fused *fp = &ck->fplan;
        if (fused)
            r = cu->launch(ck->fused, gx, (unsigned)((fp->R + fp->rc - 1) / fp->rc),
                           (unsigned)nsplit, (unsigned)fp->block, 1, 1, 0, NULL, fparams, NULL);
        else
            r = cu->launch(ck->main, gx, (unsigned)nsplit, 1, (unsigned)ck->plan.block, 1, 1, 0,
                           NULL, params, NULL);
        if (r != CU_SUCCESS) {
            st = cu_fail(ctx, r, "cuLaunchKernel (" CUDA_KERNEL_MAIN ")");
            goto out;
        }
        if (nsplit > 1) {
            void *cparams[] = {&dpart, &no, &nsplit, &o, &oi};
            r = cu->launch(ck->combine, (unsigned)((no + 255) / 256), 1, 1, 256, 1, 1, 0, NULL,
                           cparams, NULL);
            if (r != CU_SUCCESS) {
                st = cu_fail(ctx, r, "cuLaunchKernel (" CUDA_KERNEL_COMBINE ")");
                goto out;
            }
        }
        if ((r = cu->ctx_synchronize()) != CU_SUCCESS) {
            st = cu_fail(ctx, r, "the kernel (cuCtxSynchronize)");
            goto out;
        }
        if (!device_out && no > 0) {
            if (ri->values && (st = dtoh(ctx, ck, (char *)run->out + (size_t)r0 * vrow, dout,
                                         (size_t)no * vrow)) != SR_OK)
                goto out;
            if (ri->indices && (st = dtoh(ctx, ck, (char *)run->out_idx + (size_t)r0 * irow, didx,
                                          (size_t)no * irow)) != SR_OK)
                goto out;
        }
    }
out:
    for (int i = 0; i < a.n; i++)
        cu->mem_free(a.p[i]);
    free(argp);
    free(base);
    free(lb);
    return st;
}

static sr_status cuda_run_device(const sr_kernel *k, const sr_run_desc *run, uint64_t device_args,
                                 int device_out)
{
    return cuda_reduce(k, run, device_args, device_out, NULL);
}

static sr_status cuda_run(const sr_kernel *k, const sr_run_desc *run)
{
    return cuda_reduce(k, run, 0, 0, NULL);
}

static sr_status cuda_run_ranges(const sr_kernel *k, const sr_run_desc *run,
                                 const struct sr_rplan *p)
{
    return cuda_reduce(k, run, 0, 0, p);
}

static void cuda_explain(const sr_kernel *k, struct expr_buf *b)
{
    const struct cuda_kernel *ck = k->backend_data;
    const struct cuda_plan *p = &ck->plan;
    const struct cuda_fused *f = &ck->fplan;
    char bterm[48] = "a formula of the reduced side", aterm[96] = "";
    if (f->bvar >= 0)
        snprintf(bterm, sizeof bterm, "argument %d", f->bvar);
    if (ck->fused && f->avar >= 0)
        snprintf(aterm, sizeof aterm, " and the rows' sums of F times A (argument %d)", f->avar);
    if (ck->fused && f->cfactor)
        snprintf(aterm, sizeof aterm,
                 ", the sums times C (a formula of the output side) componentwise");
    char dterm[160] = "";
    if (ck->fused && f->dot)
        snprintf(dterm, sizeof dterm,
                 "; F's inner product of %d values (arguments %d and %d) as a tile product "
                 "before F: chunks of 16 components in shared memory, 4 x %d per thread",
                 f->dot, f->uvar, f->wvar, (f->tj + 15) / 16);
    if (ck->fused)
        expr_buf_printf(b,
                        "cuda: %s (%s, %d SMs); strategy fused two-product: blocks "
                        "of %d threads own %d output rows x %d of the %d columns of B (%s)%s, "
                        "tiles of %d reduced indices; per tile F's inner nodes (%d "
                        "columns), "
                        "the %d x %d tile of F and the %d x %d tile of B in shared memory (%d "
                        "bytes), 4 x 4 outputs per thread%s; %d nodes per pair; block-sparse "
                        "ranges: a block takes at most %d rows of one range block; accumulation "
                        "%s\n",
                        ck->dev->name, ck->info.arch, ck->dev->sm_count, f->block, f->ti, f->rc,
                        f->R, bterm, aterm, f->tj, f->columns, f->ti, f->tj, f->tj, f->rc,
                        f->shared_bytes, dterm, f->pair_nodes, f->ti,
                        k->dtype == SR_F64 ? "float64" : jit_acc_names[ck->acc]);
    else
        expr_buf_printf(
            b,
            "cuda: %s (%s, %d SMs); strategy direct, %d threads per block (one output row "
            "each), tile %d reduced indices in shared memory (%d columns, %d bytes), "
            "row state %d bytes, split-j over the reduced indices when there are fewer "
            "than %d blocks; nodes: %d per pair, %d per output row, %d per reduced "
            "index; accumulation %s\n",
            ck->dev->name, ck->info.arch, ck->dev->sm_count, p->block, p->tile, p->columns,
            p->shared_bytes, p->state_bytes, 2 * ck->dev->sm_count, p->pair_nodes, p->hoisted_outer,
            p->hoisted_inner, k->dtype == SR_F64 ? "float64" : jit_acc_names[ck->acc]);
    expr_buf_printf(b,
                    "cuda memory: host arrays of parameters and of the reduced index are copied "
                    "whole, output-side rows %s; device pointers (sr_kernel_run_device) are used "
                    "in place\n",
                    k->budget > 0 ? "and outputs go through the device in passes that "
                                    "fit the memory budget with the split-j states"
                                  : "and outputs in one pass (no memory budget)");
    expr_buf_printf(b, "cuda image: %s, %zu bytes, %s (cache %s, %.1f ms)%s%s\n",
                    ck->info.cubin ? "cubin" : "PTX", ck->info.bytes, ck->info.origin,
                    ck->info.cache, ck->info.compile_ms, ck->info.path[0] ? "\npath: " : "",
                    ck->info.path);
}

/* Tiles: a block's output rows x the reduced indices of a shared-memory tile. */
static void cuda_plan_info(const sr_kernel *k, sr_plan_info *info)
{
    const struct cuda_kernel *ck = k->backend_data;
    info->strategy = ck->fused ? SR_STRATEGY_FUSED : SR_STRATEGY_DIRECT;
    info->device = SR_DEVICE_CUDA;
    info->tile_rows = ck->fused ? ck->fplan.ti : ck->plan.block;
    info->tile_cols = ck->fused ? ck->fplan.tj : ck->plan.tile;
    info->tier = 1;
    info->module = ck->info.origin;
    info->module_cache = ck->info.cache;
    info->module_path = ck->info.path[0] ? ck->info.path : NULL;
    info->compile_ms = ck->info.compile_ms;
    info->acc = k->dtype == SR_F64 ? SR_ACC_F64 : (sr_acc)(ck->acc + 1);
    info->dot_dim = ck->fused ? ck->fplan.dot : 0;
}

const struct sr_backend_i cuda_backend = {
    /* .name = */ "cuda",
    /* .prepare = */ cuda_prepare,
    /* .run = */ cuda_run,
    /* .release = */ cuda_release,
    /* .explain = */ cuda_explain,
    /* .run_ranges = */ cuda_run_ranges,
    /* .workspace = */ NULL, /* the host side's: core's reference estimate */
    /* .run_device = */ cuda_run_device,
    /* .ctx_free = */ NULL, /* its options live in the JIT's state (jit_ctx_get) */
    /* .post_rewrite = */ false,
    /* .vjp = */ NULL,
    /* .run_lse = */ NULL,
    /* .offer = */ NULL,
    /* .stage = */ NULL,
    /* .wait = */ NULL,
    /* .plan_info = */ cuda_plan_info,
    /* .plans = */ cuda_candidates,
};
