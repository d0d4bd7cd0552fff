/*
 * cache.c — where compiled kernels come from: the context's memory cache, the per-user disk
 * cache, or the compiler.
 *
 * Disk layout: <dir>/<key>.so, where key hashes the emitted source (which spells the formula,
 * reduction, axis and dtype), the compiler's identity (`cc --version`), the flags, the CPU's
 * feature flags, the symred version and the JIT ABI. Each file is the shared object followed by
 * a trailer (magic, payload length, payload hash), checked before dlopen: a truncated or
 * corrupt entry is rebuilt, never trusted. Entries are built in a private directory inside the
 * cache directory and rename()d into place, so concurrent processes only ever see whole files.
 * Loading a shared object runs its code, so a cache directory that is not a directory, not owned
 * by the user or writable by group or others is refused: kernel creation fails with SR_EIO and a
 * message saying how to fix it (a security problem is not papered over). A cache that is merely
 * unavailable (SYMRED_CACHE_DIR=off, no HOME, cannot be created) means compiling in a private
 * temporary directory, with a log line.
 */
#include "jit.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TRAILER_MAGIC "SYMREDSO"
#define TRAILER_BYTES 24

static void jlog(sr_ctx *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#include <stdarg.h>
static void jlog(sr_ctx *ctx, int level, const char *fmt, ...)
{
    if (ctx->log_level < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "symred: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

sr_status jit_ctx_get(sr_ctx *ctx, struct jit_ctx **out)
{
    *out = jit_ctx_of(ctx);
    if (*out)
        return SR_OK;
    /* Options are read once per context; a malformed one fails every kernel of the context
     * until it is fixed, rather than silently meaning the default. */
    static const char *const keep_values[] = {"0", "1"};
    int acc, keep;
    long timeout;
    if (sr__env_choice(ctx, "SYMRED_ACC", jit_acc_names, 3, JIT_ACC_BLOCK, &acc) != SR_OK ||
        sr__env_choice(ctx, "SYMRED_JIT_KEEP", keep_values, 2, 0, &keep) != SR_OK ||
        sr__env_int(ctx, "SYMRED_COMPILE_TIMEOUT", 1, 86400, JIT_COMPILE_TIMEOUT, &timeout) !=
            SR_OK)
        return SR_EINVAL;
    struct jit_ctx *jc = calloc(1, sizeof *jc);
    if (!jc)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    const char *cc = getenv("SYMRED_CC");
    snprintf(jc->cc, sizeof jc->cc, "%s", cc && *cc ? cc : "cc");
    jc->acc = acc;
    jc->keep_source = keep;
    jc->compile_timeout = (int)timeout;
    ctx->backend_state[SR_BACKEND_JIT] = jc;
    *out = jc;
    return SR_OK;
}

void jit_ctx_free(void *state)
{
    struct jit_ctx *jc = state;
    if (!jc)
        return;
    for (struct jit_module *m = jc->modules, *next; m; m = next) {
        next = m->next;
        if (m->handle)
            dlclose(m->handle);
        free(m);
    }
    free(jc);
}

/* CPU feature flags (for -march=native), hashed once per process. */
static uint64_t cpu_id;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static void cpu_init(void)
{
    uint64_t h = JIT_HASH_INIT;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "flags", 5) == 0 || strncmp(line, "model name", 10) == 0 ||
                strncmp(line, "Features", 8) == 0) {
                h = jit_hash(h, line, strlen(line));
                if (line[0] == 'f' || line[0] == 'F')
                    break;
            }
        fclose(f);
    }
    cpu_id = h;
}

static void make_key(const struct jit_ctx *jc, const char *src, size_t len, uint64_t ccid,
                     char key[33])
{
    pthread_once(&cpu_once, cpu_init);
    uint64_t h[2] = {JIT_HASH_INIT, 0x84222325cbf29ce4ULL};
    for (int i = 0; i < 2; i++) {
        h[i] = jit_hash(h[i], src, len);
        h[i] = jit_hash(h[i], &ccid, sizeof ccid);
        h[i] = jit_hash(h[i], jit_cflags_text(), strlen(jit_cflags_text()));
        h[i] = jit_hash(h[i], &cpu_id, sizeof cpu_id);
        h[i] = jit_hash(h[i], SYMRED_VERSION_STRING, strlen(SYMRED_VERSION_STRING));
        int abi = JIT_ABI_VERSION + 1000 * i;
        h[i] = jit_hash(h[i], &abi, sizeof abi);
        h[i] = jit_hash(h[i], jc->cc, strlen(jc->cc));
    }
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* mkdir -p with mode 0700 for the components it creates. */
static int mkdirs(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* The cache directory, or SR_EIO with the reason in why; *refused is set when the directory
 * exists but is unsafe to load code from. */
static sr_status cache_dir(char *dir, size_t cap, char *why, size_t whycap, bool *refused)
{
    *refused = false;
    const char *env = getenv("SYMRED_CACHE_DIR");
    if (env && strcmp(env, "off") == 0) {
        snprintf(why, whycap, "disabled (SYMRED_CACHE_DIR=off)");
        return SR_EIO;
    }
    if (env && *env)
        snprintf(dir, cap, "%s", env);
    else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0] == '/')
        snprintf(dir, cap, "%s/symred", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && getenv("HOME")[0])
        snprintf(dir, cap, "%s/.cache/symred", getenv("HOME"));
    else {
        snprintf(why, whycap, "no cache directory (HOME unset)");
        return SR_EIO;
    }
    if (mkdirs(dir) != 0) {
        snprintf(why, whycap, "cannot create %.400s: %s", dir, strerror(errno));
        return SR_EIO;
    }
    struct stat sb;
    *refused = true;
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(why, whycap, "refused %.400s: not a directory", dir);
        return SR_EIO;
    }
    if (sb.st_uid != geteuid()) {
        snprintf(why, whycap, "refused %.400s: not owned by the user", dir);
        return SR_EIO;
    }
    if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, whycap, "refused %.400s: writable by group or others", dir);
        return SR_EIO;
    }
    *refused = false;
    return SR_OK;
}

/* Reads all of the open file fd (at most 256 MiB) into a malloc'd buffer with extra bytes of
 * room after it; NULL on any failure. */
static char *read_all(int fd, size_t extra, size_t *size)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0 || sb.st_size > (256 << 20))
        return NULL;
    char *data = malloc((size_t)sb.st_size + extra);
    if (!data)
        return NULL;
    size_t off = 0;
    while (off < (size_t)sb.st_size) {
        ssize_t n = read(fd, data + off, (size_t)sb.st_size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(data);
            return NULL;
        }
        off += (size_t)n;
    }
    *size = off;
    return data;
}

/* Reads path and checks its trailer. */
static bool entry_ok(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = false;
    size_t off = 0;
    char *data = read_all(fd, 0, &off);
    if (!data || off <= TRAILER_BYTES)
        goto out;
    size_t plen = off - TRAILER_BYTES;
    uint64_t len, hash;
    memcpy(&len, data + plen + 8, 8);
    memcpy(&hash, data + plen + 16, 8);
    ok = memcmp(data + plen, TRAILER_MAGIC, 8) == 0 && len == plen &&
         hash == jit_hash(JIT_HASH_INIT, data, plen);
out:
    free(data);
    close(fd);
    return ok;
}

/* Appends the trailer to the freshly built shared object at path. */
static sr_status add_trailer(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return SR_EIO;
    sr_status st = SR_EIO;
    size_t off = 0;
    char *data = read_all(fd, 0, &off);
    if (!data)
        goto out;
    uint64_t len = off, hash = jit_hash(JIT_HASH_INIT, data, off);
    char tr[TRAILER_BYTES];
    memcpy(tr, TRAILER_MAGIC, 8);
    memcpy(tr + 8, &len, 8);
    memcpy(tr + 16, &hash, 8);
    if (pwrite(fd, tr, TRAILER_BYTES, (off_t)off) == TRAILER_BYTES)
        st = SR_OK;
out:
    free(data);
    if (close(fd) != 0)
        st = SR_EIO;
    return st;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void rm_tree_flat(const char *dir)
{
    /* Our build directories hold only the files named here. */
    static const char *const names[] = {"kernel.c", "cc.log", "kernel.so"};
    char p[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Compiles into a fresh private directory under parent; on success so is its kernel.so. */
static sr_status build(sr_ctx *ctx, struct jit_ctx *jc, const char *src, size_t len,
                       const char *parent, char *tdir, size_t tcap, char *so, size_t socap)
{
    snprintf(tdir, tcap, "%s/tmp-XXXXXX", parent);
    if (!mkdtemp(tdir))
        return sr__error(ctx, SR_EIO, "cannot create a build directory in %s: %s", parent,
                         strerror(errno));
    snprintf(so, socap, "%s/kernel.so", tdir);
    char err[1800];
    sr_status st = jit_compile(jc, src, len, tdir, so, err, sizeof err);
    jc->compiles++;
    if (st != SR_OK) {
        rm_tree_flat(tdir);
        if (st == SR_ENODEV)
            jc->no_compiler = true;
        return sr__error(ctx, st, "%s", err);
    }
    return SR_OK;
}

static struct jit_module *new_module(const char *key)
{
    struct jit_module *m = calloc(1, sizeof *m);
    if (m)
        snprintf(m->key, sizeof m->key, "%s", key);
    return m;
}

sr_status jit_module_get(sr_ctx *ctx, const char *src, size_t len, struct jit_module **out,
                         struct jit_load_info *info)
{
    struct jit_ctx *jc;
    memset(info, 0, sizeof *info);
    sr_status st0 = jit_ctx_get(ctx, &jc);
    if (st0 != SR_OK)
        return st0;
    uint64_t ccid;
    char iderr[1024];
    sr_status idst = jit_compiler_id(jc->cc, jc->compile_timeout, &ccid, iderr, sizeof iderr);
    if (idst != SR_OK) {
        if (idst == SR_ENODEV)
            jc->no_compiler = true;
        return sr__error(ctx, idst, "%s", iderr);
    }
    char key[33];
    make_key(jc, src, len, ccid, key);
    for (struct jit_module *m = jc->modules; m; m = m->next)
        if (strcmp(m->key, key) == 0) {
            m->refs++;
            jc->mem_hits++;
            info->origin = "memory";
            snprintf(info->cache, sizeof info->cache, "hit (context)");
            *out = m;
            return SR_OK;
        }
    struct jit_module *m = new_module(key);
    if (!m)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    char dir[2048], why[512], path[2200], err[1024], tdir[2200], so[2300];
    double t0 = now_ms();
    sr_status st;
    bool refused;
    if (cache_dir(dir, sizeof dir, why, sizeof why, &refused) == SR_OK) {
        snprintf(path, sizeof path, "%s/%s.so", dir, key);
        if (access(path, F_OK) == 0) {
            if (entry_ok(path) && jit_load(ctx, path, m, err, sizeof err) == SR_OK) {
                jc->disk_hits++;
                info->origin = "disk";
                snprintf(info->cache, sizeof info->cache, "hit");
                snprintf(info->path, sizeof info->path, "%s", path);
                goto found;
            }
            jlog(ctx, 1, "cache entry %s is corrupt or unloadable: rebuilding it", path);
            unlink(path);
        }
        st = build(ctx, jc, src, len, dir, tdir, sizeof tdir, so, sizeof so);
        if (st != SR_OK)
            goto fail;
        if (add_trailer(so) != SR_OK || rename(so, path) != 0) {
            st = sr__error(ctx, SR_EIO, "cannot store the kernel in %s: %s", path, strerror(errno));
            rm_tree_flat(tdir);
            goto fail;
        }
        rm_tree_flat(tdir);
        if (jc->keep_source) {
            char cpath[2200], tmpc[2300];
            snprintf(cpath, sizeof cpath, "%s/%s.c", dir, key);
            snprintf(tmpc, sizeof tmpc, "%s.%ld.tmp", cpath, (long)getpid());
            FILE *f = fopen(tmpc, "w");
            if (f) {
                fwrite(src, 1, len, f);
                if (fclose(f) == 0 && rename(tmpc, cpath) == 0)
                    snprintf(info->path, sizeof info->path, "%s", cpath);
                else
                    unlink(tmpc);
            }
        }
        st = jit_load(ctx, path, m, err, sizeof err);
        if (st != SR_OK) {
            st = sr__error(ctx, SR_ECOMPILE, "%s", err);
            goto fail;
        }
        info->origin = "compiled";
        snprintf(info->cache, sizeof info->cache, "miss (stored)");
        if (!info->path[0])
            snprintf(info->path, sizeof info->path, "%s", path);
    } else if (refused) {
        st = sr__error(ctx, SR_EIO,
                       "kernel cache %s: loading compiled code from it would be unsafe; make it "
                       "private (chmod 700), point SYMRED_CACHE_DIR at a directory of your own, "
                       "or set SYMRED_CACHE_DIR=off to compile without a disk cache",
                       why);
        goto fail;
    } else {
        jlog(ctx, 1, "kernel cache %s; compiling in a private temporary directory", why);
        const char *tmp = getenv("TMPDIR");
        st = build(ctx, jc, src, len, tmp && *tmp ? tmp : "/tmp", tdir, sizeof tdir, so, sizeof so);
        if (st != SR_OK)
            goto fail;
        st = jit_load(ctx, so, m, err, sizeof err);
        rm_tree_flat(tdir); /* the mapping outlives the file */
        if (st != SR_OK) {
            st = sr__error(ctx, SR_ECOMPILE, "%s", err);
            goto fail;
        }
        info->origin = "compiled";
        snprintf(info->cache, sizeof info->cache, "off: %.200s", why);
    }
found:
    info->compile_ms = now_ms() - t0;
    m->refs = 1;
    m->next = jc->modules;
    jc->modules = m;
    *out = m;
    return SR_OK;
fail:
    free(m);
    return st;
}

void jit_module_release(sr_ctx *ctx, struct jit_module *m)
{
    (void)ctx;
    /* Modules stay loaded until the context goes: that is the in-memory cache. */
    if (m && m->refs > 0)
        m->refs--;
}

/* The same directory, checks and trailer, for the CUDA backend's images (cuda-runtime.c). */
sr_status jit_cache_dir(char *dir, size_t cap, char *why, size_t whycap)
{
    bool refused;
    return cache_dir(dir, cap, why, whycap, &refused);
}
bool jit_cache_entry_ok(const char *path) { return entry_ok(path); }
sr_status jit_cache_seal(const char *path) { return add_trailer(path); }
