/*
 * cache.c — where compiled kernels come from: the context's memory cache, the per-user disk
 * cache, or the compiler.
 *
 * Disk layout: <dir>/<key>.so, where key hashes the emitted source (which spells the formula,
 * reduction, axis and dtype), the compiler's identity (`cc --version`), the flags, the CPU's
 * feature flags, the symred version and the JIT ABI. Each file is the shared object followed by
 * a trailer (magic, payload length, the key, a hash of payload and key), checked before dlopen:
 * a truncated, corrupt or foreign entry (another key's, copied under this name) is rebuilt,
 * never trusted, and no constructor of it runs. Entries are built in a private directory inside
 * the cache directory and rename()d into place, so concurrent processes only ever see whole
 * files.
 *
 * Loading a shared object runs its code, so a cache directory that is a symbolic link, not a
 * directory, not owned by the user or writable by group or others, or below a directory that
 * others may write to and that is not sticky, is refused: kernel creation fails with SR_EIO and
 * a message saying how to fix it (a security problem is not papered over). The checked
 * directory is then used through its descriptor (openat), an entry is opened as a regular file
 * only (O_NOFOLLOW, and O_NONBLOCK so that a FIFO cannot block), checked from that descriptor
 * and loaded through it (/proc/self/fd/N): nothing can be swapped between check and load. Where
 * /proc/self/fd is missing, and where the cache is merely unavailable (SYMRED_CACHE_DIR=off, no
 * HOME, cannot be created), kernels compile in a private temporary directory, with a log line.
 */
#include "jit.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TRAILER_MAGIC "SYMRED02"
#define TRAILER_BYTES (24 + JIT_KEY_BYTES)

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

/* Serialises the resets of contexts' locks in a child of fork() (taken only there). */
static pthread_mutex_t reset_lock = PTHREAD_MUTEX_INITIALIZER;

/* In a child of fork(), the context's lock may be held, and bg_running count compiles, by
 * threads of the parent that the child does not have: the first use in the child starts them
 * afresh. The compiles' kernels know they are orphans by their own generation (omp-runtime.c). */
static void ctx_reset(struct jit_ctx *jc, unsigned gen)
{
    pthread_mutex_lock(&reset_lock);
    if (atomic_load_explicit(&jc->gen, memory_order_acquire) != gen) {
        pthread_mutex_init(&jc->lock, NULL);
        pthread_cond_init(&jc->bg_idle, NULL);
        jc->bg_running = 0;
        atomic_store_explicit(&jc->gen, gen, memory_order_release);
    }
    pthread_mutex_unlock(&reset_lock);
}

void jit_ctx_lock(struct jit_ctx *jc)
{
    unsigned gen = sr__fork_gen();
    if (atomic_load_explicit(&jc->gen, memory_order_acquire) != gen)
        ctx_reset(jc, gen);
    pthread_mutex_lock(&jc->lock);
}

void jit_ctx_unlock(struct jit_ctx *jc) { pthread_mutex_unlock(&jc->lock); }

sr_status jit_ctx_get(sr_ctx *ctx, struct jit_ctx **out)
{
    *out = NULL;
    struct jit_ctx *jc = jit_ctx_of(ctx);
    if (!jc) {
        jit_process_init();
        jc = calloc(1, sizeof *jc);
        if (!jc)
            return sr__error(ctx, SR_ENOMEM, "out of memory");
        if (pthread_mutex_init(&jc->lock, NULL) != 0) {
            free(jc);
            return sr__error(ctx, SR_ENOMEM, "out of memory");
        }
        if (pthread_cond_init(&jc->bg_idle, NULL) != 0) {
            pthread_mutex_destroy(&jc->lock);
            free(jc);
            return sr__error(ctx, SR_ENOMEM, "out of memory");
        }
        atomic_init(&jc->gen, sr__fork_gen());
        ctx->backend_state[SR_BACKEND_JIT] = jc;
    }
    /* The context's options as they are now (sr_ctx_set_option may have changed them since the
     * last kernel); the environment was read once, by sr_ctx_new. Under the lock: the first
     * sr_kernel_eval_block of a direct kernel builds its block module from any thread. */
    const char *cc = ctx->opt.cc[0] ? ctx->opt.cc : "cc";
    jit_ctx_lock(jc);
    if (strcmp(jc->cc, cc) != 0) {
        snprintf(jc->cc, sizeof jc->cc, "%s", cc);
        jc->no_compiler = false; /* another compiler: try it */
        jc->logged_fallback = false;
    }
    /* Written only when changed (by the owning thread, sr_ctx_set_option): the owner reads
     * them without the lock. */
    if (jc->acc != ctx->opt.acc)
        jc->acc = ctx->opt.acc;
    if (jc->keep_source != ctx->opt.jit_keep)
        jc->keep_source = ctx->opt.jit_keep;
    if (jc->compile_timeout != ctx->opt.compile_timeout)
        jc->compile_timeout = ctx->opt.compile_timeout;
    if (jc->idle_max != ctx->opt.jit_idle_modules)
        jc->idle_max = ctx->opt.jit_idle_modules;
    jit_ctx_unlock(jc);
    *out = jc;
    return SR_OK;
}

static void module_free(struct jit_module *m)
{
    if (m->handle)
        dlclose(m->handle);
    free(m);
}

void jit_ctx_free(void *state)
{
    struct jit_ctx *jc = state;
    if (!jc)
        return;
    /* Background compiles use the context until they end; their kernels are gone, so they only
     * drop what they made. They are given JIT_FREE_GRACE_S seconds to finish, so that a short
     * program's kernels still reach the disk cache for its next run; then the running ones are
     * killed and the queued ones end without starting, so that a hanging compiler never holds
     * the program up for long. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += JIT_FREE_GRACE_S;
    jit_ctx_lock(jc);
    while (jc->bg_running > 0) {
        if (atomic_load(&jc->cancel))
            pthread_cond_wait(&jc->bg_idle, &jc->lock);
        else if (pthread_cond_timedwait(&jc->bg_idle, &jc->lock, &until) == ETIMEDOUT)
            atomic_store(&jc->cancel, 1);
    }
    jit_ctx_unlock(jc);
    pthread_cond_destroy(&jc->bg_idle);
    for (struct jit_module *m = jc->modules, *next; m; m = next) {
        next = m->next;
        module_free(m);
    }
    pthread_mutex_destroy(&jc->lock);
    free(jc);
}

bool jit_no_compiler(struct jit_ctx *jc)
{
    jit_ctx_lock(jc);
    bool no = jc->no_compiler;
    jit_ctx_unlock(jc);
    return no;
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
                     char key[JIT_KEY_BYTES + 1])
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
    snprintf(key, JIT_KEY_BYTES + 1, "%016llx%016llx", (unsigned long long)h[0],
             (unsigned long long)h[1]);
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

/* Refuses a path one of whose parent directories another user may write to: group- or
 * other-writable and not sticky (a sticky directory such as /tmp lets each user rename only
 * their own entries). Such a directory lets that user replace what lies below it between any
 * check and any use, as ssh reasons for its files. The directory itself is checked by
 * cache_open. */
static bool parents_safe(const char *dir, char *why, size_t whycap)
{
    char real[PATH_MAX];
    if (!realpath(dir, real)) {
        snprintf(why, whycap, "cannot resolve %.400s: %s", dir, strerror(errno));
        return false;
    }
    /* Each proper prefix: "/", "/a", "/a/b" of "/a/b/c". */
    for (size_t end = 1, n = strlen(real); end < n; end++) {
        if (end > 1 && real[end] != '/')
            continue;
        char c = real[end];
        real[end] = 0;
        struct stat sb;
        bool ok = stat(real, &sb) == 0,
             open_to_others = ok && (sb.st_mode & (S_IWGRP | S_IWOTH)) && !(sb.st_mode & S_ISVTX);
        if (!ok || open_to_others) {
            if (ok)
                snprintf(why, whycap,
                         "refused %.400s: its parent directory %.400s is writable by group or "
                         "others and not sticky, so another user could replace the cache",
                         dir, real);
            else
                snprintf(why, whycap, "cannot check %.400s: %s", real, strerror(errno));
            return false;
        }
        real[end] = c;
    }
    return true;
}

/* The cache directory opened (O_DIRECTORY | O_NOFOLLOW) and checked through that descriptor:
 * a directory owned by the user, not writable by group or others, under parents no other user
 * may write to. Returns the descriptor, or -1 with the reason in why; *refused is set when the
 * directory exists but is unsafe to load code from. Everything after this goes through the
 * descriptor, so nothing can be swapped between the check and the use. */
static int cache_open(const sr_ctx *ctx, char *dir, size_t cap, char *why, size_t whycap,
                      bool *refused)
{
    *refused = false;
    const char *conf = ctx->opt.cache_dir; /* SYMRED_CACHE_DIR or the default, resolved */
    if (strcmp(conf, "off") == 0) {
        snprintf(why, whycap, "disabled (SYMRED_CACHE_DIR=off)");
        return -1;
    }
    if (!*conf) {
        snprintf(why, whycap, "no cache directory (HOME unset)");
        return -1;
    }
    snprintf(dir, cap, "%s", conf);
    if (mkdirs(dir) != 0) {
        snprintf(why, whycap, "cannot create %.400s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat sb;
    *refused = true;
    if (lstat(dir, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        snprintf(why, whycap,
                 "refused %.400s: it is a symbolic link (point SYMRED_CACHE_DIR at the directory "
                 "itself)",
                 dir);
        return -1;
    }
    if (!parents_safe(dir, why, whycap))
        return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 && (errno == EMFILE || errno == ENFILE)) {
        *refused = false; /* not the directory's fault */
        snprintf(why, whycap, "cannot open %.400s: %s", dir, strerror(errno));
        return -1;
    }
    if (dfd < 0) {
        snprintf(why, whycap, "refused %.400s: %s", dir,
                 errno == ENOTDIR || errno == ELOOP ? "not a directory" : strerror(errno));
        return -1;
    }
    const char *bad = NULL;
    if (fstat(dfd, &sb) != 0 || !S_ISDIR(sb.st_mode))
        bad = "not a directory";
    else if (sb.st_uid != geteuid())
        bad = "not owned by the user";
    else if (sb.st_mode & (S_IWGRP | S_IWOTH))
        bad = "writable by group or others";
    if (bad) {
        snprintf(why, whycap, "refused %.400s: %s", dir, bad);
        close(dfd);
        return -1;
    }
    *refused = false;
    return dfd;
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
        ssize_t n = pread(fd, data + off, (size_t)sb.st_size - off, (off_t)off);
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

/* The trailer after an entry's payload: magic, payload length, the key the entry was stored
 * under, and a hash of the payload and that key. */
static void make_trailer(const char *data, uint64_t len, const char *key, char *tr)
{
    char k[JIT_KEY_BYTES] = {0};
    memcpy(k, key, strnlen(key, JIT_KEY_BYTES));
    uint64_t hash = jit_hash(jit_hash(JIT_HASH_INIT, data, len), k, JIT_KEY_BYTES);
    memcpy(tr, TRAILER_MAGIC, 8);
    memcpy(tr + 8, &len, 8);
    memcpy(tr + 16, k, JIT_KEY_BYTES);
    memcpy(tr + 16 + JIT_KEY_BYTES, &hash, 8);
}

/* Checks, through the open file fd, that it is a regular file whose trailer matches its payload
 * and names key: a truncated, corrupt or foreign entry (one copied from another key's name)
 * fails (NULL). Returns the file's bytes (malloc'd), the payload's length in *payload and a NUL
 * after it. */
static char *fd_entry_read(int fd, const char *key, size_t *payload)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return NULL;
    size_t off = 0;
    char *data = read_all(fd, 1, &off);
    if (data && off > TRAILER_BYTES) {
        char tr[TRAILER_BYTES];
        make_trailer(data, off - TRAILER_BYTES, key, tr);
        if (memcmp(tr, data + off - TRAILER_BYTES, TRAILER_BYTES) == 0) {
            *payload = off - TRAILER_BYTES;
            data[*payload] = 0;
            return data;
        }
    }
    free(data);
    return NULL;
}
static bool fd_entry_ok(int fd, const char *key)
{
    size_t n;
    char *data = fd_entry_read(fd, key, &n);
    free(data);
    return data != NULL;
}

/* Opens an entry as a regular file only: no symbolic link is followed, and O_NONBLOCK keeps a
 * FIFO (or a device) in its place from blocking the open. -1 when it cannot be opened. */
static int entry_open(int dfd, const char *name)
{
    return openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
}

/* Appends the trailer naming key to the freshly built file at path. */
static sr_status add_trailer(const char *path, const char *key)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return SR_EIO;
    sr_status st = SR_EIO;
    size_t off = 0;
    char *data = read_all(fd, 0, &off);
    if (!data)
        goto out;
    char tr[TRAILER_BYTES];
    make_trailer(data, off, key, tr);
    if (pwrite(fd, tr, TRAILER_BYTES, (off_t)off) == TRAILER_BYTES)
        st = SR_OK;
out:
    free(data);
    if (close(fd) != 0)
        st = SR_EIO;
    return st;
}

/* Whether /proc/self/fd/N names the file open as fd N: where it does not (no /proc), a checked
 * descriptor cannot be loaded, and the disk cache is not used. */
/* Loads the cache entry name of the directory dfd, checked and loaded through one descriptor:
 * SR_OK, SR_EIO with the reason in err (missing, not a regular file, corrupt, foreign, not
 * loadable: the entry is to be rebuilt), or SR_ENOMEM when the process is out of descriptors
 * (the entry may be fine). */
static sr_status load_entry(sr_ctx *ctx, int dfd, const char *name, const char *key,
                            struct jit_module *m, char *err, size_t errcap)
{
    int fd = entry_open(dfd, name);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        snprintf(err, errcap,
                 "%s: the process is out of file descriptors; close some or raise the limit "
                 "(ulimit -n)",
                 strerror(errno));
        return SR_ENOMEM;
    }
    if (fd < 0) {
        snprintf(err, errcap, "%s", strerror(errno));
        return SR_EIO;
    }
    if (!fd_entry_ok(fd, key)) {
        close(fd);
        snprintf(err, errcap, "not a regular file, corrupt, or stored under another key");
        return SR_EIO;
    }
    return jit_load_fd(ctx, fd, m, err, errcap); /* it closes fd on failure */
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Removes the build directories (and the CUDA images' temporary files) named tmp-* that are
 * older than any compile can run (twice the timeout, at least an hour): those of processes
 * killed mid-compile, which nothing else would remove. Only the files a build directory can
 * hold are removed, through the checked directory's descriptor. */
static void sweep_stale(int dfd, int timeout_s)
{
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    const time_t limit = time(NULL) - (2 * (time_t)timeout_s > 3600 ? 2 * (time_t)timeout_s : 3600);
    for (struct dirent *e; (e = readdir(d));) {
        struct stat sb;
        if (strncmp(e->d_name, "tmp-", 4) != 0 ||
            fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || sb.st_mtime > limit)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                for (int i = 0; i < JIT_BUILD_FILES; i++)
                    unlinkat(sub, jit_build_files[i], 0);
                close(sub);
            }
            unlinkat(dfd, e->d_name, AT_REMOVEDIR);
        } else if (S_ISREG(sb.st_mode)) {
            unlinkat(dfd, e->d_name, 0);
        }
    }
    closedir(d);
}

/* Compiles into a fresh private directory under parent with the compiler options of opt (a
 * snapshot of jc's); on success so is its kernel.so. Takes jc's lock for its counters. */
static sr_status build(sr_ctx *ctx, struct jit_ctx *jc, const struct jit_ctx *opt, const char *src,
                       size_t len, const char *parent, char *tdir, size_t tcap, char *so,
                       size_t socap)
{
    int rc = jit_build_dir_new(parent, tdir, tcap);
    if (rc != 0)
        return sr__error(ctx, SR_EIO, "cannot create a build directory in %s: %s", parent,
                         strerror(rc));
    snprintf(so, socap, "%s/kernel.so", tdir);
    char err[1800];
    sr_status st = jit_compile(opt, src, len, tdir, so, err, sizeof err);
    jit_ctx_lock(jc);
    jc->compiles++;
    if (st == SR_ENODEV)
        jc->no_compiler = true;
    jit_ctx_unlock(jc);
    if (st != SR_OK) {
        jit_build_dir_free(tdir);
        return sr__error(ctx, st, "%s", err);
    }
    return SR_OK;
}

static struct jit_module *new_module(const char *key)
{
    struct jit_module *m = calloc(1, sizeof *m);
    if (m) {
        snprintf(m->key, sizeof m->key, "%s", key);
    }
    return m;
}

/* The module of key in jc's memory cache, with one more reference, or NULL. Under jc's lock. */
static struct jit_module *memory_hit(struct jit_ctx *jc, const char *key)
{
    for (struct jit_module *m = jc->modules; m; m = m->next)
        if (strcmp(m->key, key) == 0) {
            m->refs++;
            return m;
        }
    return NULL;
}

/*
 * Finds or builds the module for src. jc's lock is held only around the context's shared state
 * (the module list, the counters, no_compiler), never across the compiler, the disk or the
 * loader: a background compile (omp-runtime.c) must not stall the context's other kernels. The
 * options (compiler, timeout, keep-source) are a snapshot taken under the lock at the start. Two
 * threads that build the same module at once both compile it; the second to finish uses the first's
 * and drops its own.
 */
static sr_status module_get(sr_ctx *ctx, struct jit_ctx *jc, const char *src, size_t len,
                            struct jit_module **out, struct jit_load_info *info)
{
    /* Only the options a compile reads (never the lock, the list or the atomics). */
    struct jit_ctx snap;
    memset(&snap, 0, sizeof snap);
    jit_ctx_lock(jc);
    memcpy(snap.cc, jc->cc, sizeof snap.cc);
    snap.acc = jc->acc;
    snap.keep_source = jc->keep_source;
    snap.compile_timeout = jc->compile_timeout;
    jit_ctx_unlock(jc);
    const struct jit_ctx *opt = &snap;
    uint64_t ccid;
    char iderr[1024];
    sr_status idst = jit_compiler_id(opt->cc, opt->compile_timeout, &ccid, iderr, sizeof iderr);
    if (idst != SR_OK) {
        if (idst == SR_ENODEV) {
            jit_ctx_lock(jc);
            jc->no_compiler = true;
            jit_ctx_unlock(jc);
        }
        return sr__error(ctx, idst, "%s", iderr);
    }
    char key[JIT_KEY_BYTES + 1];
    make_key(opt, src, len, ccid, key);
    jit_ctx_lock(jc);
    struct jit_module *hit = memory_hit(jc, key);
    if (hit)
        jc->mem_hits++;
    jit_ctx_unlock(jc);
    if (hit) {
        info->origin = "memory";
        snprintf(info->cache, sizeof info->cache, "hit (context)");
        *out = hit;
        return SR_OK;
    }
    struct jit_module *m = new_module(key);
    if (!m)
        return sr__error(ctx, SR_ENOMEM, "out of memory");
    char dir[2048], why[512], path[2200], name[64], err[1024], tdir[2200], so[2300];
    double t0 = now_ms();
    sr_status st;
    bool refused;
    int dfd = cache_open(ctx, dir, sizeof dir, why, sizeof why, &refused);
    if (dfd >= 0 && !jit_proc_fd_works(dfd)) {
        close(dfd);
        dfd = -1;
        snprintf(why, sizeof why,
                 "unused: /proc/self/fd is not available to load a checked "
                 "entry through its descriptor");
    }
    if (dfd >= 0) {
        snprintf(name, sizeof name, "%s.so", key);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat sb;
        if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
            st = load_entry(ctx, dfd, name, key, m, err, sizeof err);
            if (st == SR_ENOMEM) {
                close(dfd);
                st = sr__error(ctx, SR_ENOMEM, "cannot load %s: %s", path, err);
                goto fail;
            }
            if (st == SR_OK) {
                close(dfd);
                jit_ctx_lock(jc);
                jc->disk_hits++;
                jit_ctx_unlock(jc);
                info->origin = "disk";
                snprintf(info->cache, sizeof info->cache, "hit");
                snprintf(info->path, sizeof info->path, "%s", path);
                goto found;
            }
            jlog(ctx, 1, "cache entry %s is unusable (%s): rebuilding it", path, err);
            unlinkat(dfd, name, 0);
        }
        sweep_stale(dfd, opt->compile_timeout);
        st = build(ctx, jc, opt, src, len, dir, tdir, sizeof tdir, so, sizeof so);
        if (st == SR_EIO || (st == SR_ECOMPILE && strstr(sr_ctx_error(ctx), "No space left"))) {
            /* A read-only or full cache: compile where the cache is off. */
            close(dfd);
            snprintf(why, sizeof why, "%.300s is not writable (%.150s)", dir, sr_ctx_error(ctx));
            goto private;
        }
        if (st != SR_OK) {
            close(dfd);
            goto fail;
        }
        if (add_trailer(so, key) != SR_OK || rename(so, path) != 0) {
            /* The kernel is whole in the private build directory: use it from there. */
            close(dfd);
            snprintf(why, sizeof why, "%.300s: cannot store %s.so (%.100s)", dir, key,
                     strerror(errno));
            jlog(ctx, 1, "kernel cache %s; using the kernel unstored", why);
            goto load_private;
        }
        jit_build_dir_free(tdir);
        if (opt->keep_source) {
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
        st = load_entry(ctx, dfd, name, key, m, err, sizeof err);
        close(dfd);
        if (st != SR_OK) {
            st =
                sr__error(ctx, st == SR_ENOMEM ? st : SR_ECOMPILE, "cannot load %s: %s", path, err);
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
      private:
        jlog(ctx, 1, "kernel cache %s; compiling in a private temporary directory", why);
        const char *tmp = getenv("TMPDIR");
        st = build(ctx, jc, opt, src, len, tmp && *tmp ? tmp : "/tmp", tdir, sizeof tdir, so,
                   sizeof so);
        if (st != SR_OK)
            goto fail;
    load_private:
        st = jit_load(ctx, so, m, err, sizeof err);
        jit_build_dir_free(tdir); /* the mapping outlives the file */
        if (st != SR_OK) {
            st = sr__error(ctx, SR_ECOMPILE, "%s", err);
            goto fail;
        }
        info->origin = "compiled";
        snprintf(info->cache, sizeof info->cache, "off: %.200s", why);
    }
found:
    info->compile_ms = now_ms() - t0;
    jit_ctx_lock(jc);
    hit = memory_hit(jc, key);
    if (!hit) {
        m->refs = 1;
        m->next = jc->modules;
        jc->modules = m;
    }
    jit_ctx_unlock(jc);
    if (hit) {
        module_free(m);
        m = hit;
    }
    *out = m;
    return SR_OK;
fail:
    free(m);
    return st;
}

sr_status jit_module_get(sr_ctx *ctx, const char *src, size_t len, struct jit_module **out,
                         struct jit_load_info *info)
{
    struct jit_ctx *jc = NULL;
    memset(info, 0, sizeof *info);
    sr_status st = jit_ctx_get(ctx, &jc);
    if (st != SR_OK)
        return st;
    return module_get(ctx, jc, src, len, out, info);
}

/* Unloads the idle modules (no kernel uses them) beyond the idle_max most recently released:
 * the in-memory cache stays bounded however many kernels a long-lived context creates; a kernel
 * created again loads its module from the disk cache. */
static void trim_idle(struct jit_ctx *jc)
{
    for (;;) {
        int idle = 0;
        struct jit_module **oldest = NULL;
        for (struct jit_module **p = &jc->modules; *p; p = &(*p)->next)
            if ((*p)->refs == 0) {
                idle++;
                if (!oldest || (*p)->idle_since < (*oldest)->idle_since)
                    oldest = p;
            }
        if (idle <= jc->idle_max)
            return;
        struct jit_module *m = *oldest;
        *oldest = m->next;
        module_free(m);
    }
}

void jit_module_release(sr_ctx *ctx, struct jit_module *m)
{
    struct jit_ctx *jc = jit_ctx_of(ctx);
    if (!m || !jc)
        return;
    jit_ctx_lock(jc);
    if (m->refs > 0 && --m->refs == 0) {
        m->idle_since = ++jc->clock;
        trim_idle(jc);
    }
    jit_ctx_unlock(jc);
}

/* The same directory, checks and trailer, for the CUDA backend's images (cuda-runtime.c). */
sr_status jit_cache_dir(const sr_ctx *ctx, char *dir, size_t cap, char *why, size_t whycap)
{
    bool refused;
    int dfd = cache_open(ctx, dir, cap, why, whycap, &refused);
    if (dfd < 0)
        return SR_EIO;
    close(dfd);
    return SR_OK;
}
/* The CUDA images are read, not loaded as code: checked and read through one descriptor. */
char *jit_cache_read(const char *path, const char *key, size_t *size)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *data = fd_entry_read(fd, key, size);
    close(fd);
    return data;
}
sr_status jit_cache_seal(const char *path, const char *key) { return add_trailer(path, key); }
