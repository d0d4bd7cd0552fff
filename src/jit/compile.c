/*
 * compile.c — runs the system C compiler on generated source and loads the result.
 *
 * The compiler is started with posix_spawnp and an argv array (never a shell), so nothing in
 * SYMRED_CC or in a path is interpreted. Its diagnostics go to a file in the private build
 * directory and become the error message of a failed compile.
 *
 * The process keeps a registry of its build directories and running compiler processes. A
 * program may return from main while a background compile runs (SYMRED_JIT=async): an atexit
 * handler then kills the compilers' process groups and removes the build directories, so that
 * nothing of the compile outlives the process. fork() is safe at any time: pthread_atfork
 * handlers hold the process-wide locks across it, and the child starts with an empty registry
 * (the compiles belong to the parent) and a new fork generation (sr__fork_gen), by which the
 * per-context and per-kernel state left behind by the parent's compiling threads is recognised
 * and reset rather than waited for.
 */
#include "jit.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* No -ffast-math: NaN and Inf must behave. -fno-math-errno lets gcc call libmvec's vector exp,
 * log, sin, cos and pow (declared `omp declare simd` in the source); -fopenmp-simd honours the
 * simd pragmas without linking an OpenMP runtime. -ffp-contract=off: gnu11 would fuse a product
 * into a sum (an FMA), and a product that overflows alone does not overflow fused, so where the
 * reference adds +Inf and -Inf (NaN) the kernel gave the infinity (docs/semantics.md, "Products
 * are not fused"); the explicit fma() of Mod stays fused. Measured: no difference in speed.
 * -fno-trapping-math: nothing reads the floating-point exception flags, and with traps assumed
 * gcc keeps a select whose arms compute or compare floats as a branch, which leaves the pair
 * loop around sr_exp (emit-c.c) unvectorised; values, NaN and Inf are unchanged.
 * -nostdlib: the kernel is linked without the C start files and libc, whose symbol tables are
 * about half of a default link's time (10 of 22 ms of CPU on the dev VM); the few C library
 * functions it calls (malloc, free) are bound when it is loaded, into a process that has libc.
 * jit_libs follow the source: libm (and libmvec, as needed, through libm's linker script) for
 * the math functions, libgcc for the compiler's helper routines (float16 conversions without
 * F16C). */
const char *const jit_cflags[] = {
    "-O3",
    "-march=native",
#if defined(__x86_64__)
    "-mprefer-vector-width=512",
#endif
    "-fno-math-errno",
    "-ffp-contract=off",
    "-fno-trapping-math",
    "-fopenmp-simd",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-pipe",
    "-nostdlib",
    NULL,
};
const char *const jit_libs[] = {"-lm", "-lgcc", NULL};

static char cflags_text[256];
static pthread_once_t cflags_once = PTHREAD_ONCE_INIT;

static void cflags_init(void)
{
    size_t n = 0;
    for (int i = 0; jit_cflags[i] && n < sizeof cflags_text; i++)
        n += (size_t)snprintf(cflags_text + n, sizeof cflags_text - n, "%s%s", i ? " " : "",
                              jit_cflags[i]);
    for (int i = 0; jit_libs[i] && n < sizeof cflags_text; i++)
        n += (size_t)snprintf(cflags_text + n, sizeof cflags_text - n, " %s", jit_libs[i]);
}

const char *jit_cflags_text(void)
{
    pthread_once(&cflags_once, cflags_init);
    return cflags_text;
}

uint64_t jit_hash(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static sr_status write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return SR_EIO;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            return SR_EIO;
        }
        off += (size_t)w;
    }
    return close(fd) == 0 ? SR_OK : SR_EIO;
}

/* ---- the registry of build directories and compiler processes ----
 * Entries are added under reg_lock: a build directory when it is made, a compiler process when
 * it is started (its source written and the process spawned under the lock, so that the exit
 * handler, which holds the lock, never races a compile that is starting). Once the handler has
 * run, no new build directory or compiler is started. */

struct reg_entry {
    struct reg_entry *next;
    pid_t pid;      /* a compiler process (the leader of its group), or 0 */
    int pidfd;      /* a descriptor of pid, or -1 */
    char dir[4096]; /* a build directory, or "" */
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct reg_entry *reg_head;
static bool reg_exiting;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

/* The files a build directory can hold (cache.c sweeps stale ones). */
const char *const jit_build_files[JIT_BUILD_FILES] = {"kernel.c", "cc.log", "kernel.so"};

static void rm_build_dir(const char *dir)
{
    char p[4200];
    for (int i = 0; i < JIT_BUILD_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, jit_build_files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* At exit: kill the running compilers' process groups, wait for each leader to end (so that it
 * writes nothing more into its directory), and remove the build directories. A compiling
 * thread, which the exit does not stop, starts no directory or compiler after this
 * (reg_exiting); one that holds the lock to start one is waited for. Not a signal handler: a
 * program killed by a signal leaves its build directories to the next process's sweep of stale
 * ones (cache.c). */
static void reg_at_exit(void)
{
    pthread_mutex_lock(&reg_lock);
    reg_exiting = true;
    for (struct reg_entry *e = reg_head; e; e = e->next)
        if (e->pid > 0)
            kill(-e->pid, SIGKILL);
    for (struct reg_entry *e = reg_head; e; e = e->next) {
        if (e->pid <= 0)
            continue;
        if (e->pidfd >= 0) {
            struct pollfd p = {.fd = e->pidfd, .events = POLLIN};
            while (poll(&p, 1, 2000) < 0 && errno == EINTR)
                ;
        } else {
            siginfo_t si;
            while (waitid(P_PID, (id_t)e->pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
                ;
        }
    }
    for (struct reg_entry *e = reg_head; e; e = e->next)
        if (e->dir[0])
            rm_build_dir(e->dir);
    pthread_mutex_unlock(&reg_lock);
}

static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;

static void fork_prepare(void)
{
    pthread_mutex_lock(&reg_lock);
    pthread_mutex_lock(&id_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&id_lock);
    pthread_mutex_unlock(&reg_lock);
}

/* The parent's compiles are not the child's: the child neither kills nor removes them. */
static void fork_child(void)
{
    for (struct reg_entry *e = reg_head, *next; e; e = next) {
        next = e->next;
        if (e->pidfd >= 0)
            close(e->pidfd);
        free(e);
    }
    reg_head = NULL;
    pthread_mutex_unlock(&id_lock);
    pthread_mutex_unlock(&reg_lock);
}

static void reg_init(void)
{
    atexit(reg_at_exit);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void jit_process_init(void) { pthread_once(&reg_once, reg_init); }

/* Adds e to the registry; reg_lock held. */
static void reg_add(struct reg_entry *e)
{
    e->next = reg_head;
    reg_head = e;
}

/* Removes e from the registry and frees it; reg_lock held. */
static void reg_remove(struct reg_entry *e)
{
    for (struct reg_entry **p = &reg_head; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    if (e->pidfd >= 0)
        close(e->pidfd);
    free(e);
}

int jit_build_dir_new(const char *parent, char *dir, size_t cap)
{
    jit_process_init();
    struct reg_entry *e = calloc(1, sizeof *e);
    if (!e)
        return ENOMEM;
    e->pidfd = -1;
    int n = snprintf(e->dir, sizeof e->dir, "%s/tmp-XXXXXX", parent);
    if (n < 0 || (size_t)n >= sizeof e->dir || (size_t)n >= cap) {
        free(e);
        return ENAMETOOLONG;
    }
    pthread_mutex_lock(&reg_lock);
    int rc = reg_exiting ? ECANCELED : mkdtemp(e->dir) ? 0 : errno;
    if (rc == 0)
        reg_add(e);
    pthread_mutex_unlock(&reg_lock);
    if (rc != 0) {
        free(e);
        return rc;
    }
    memcpy(dir, e->dir, (size_t)n + 1);
    return 0;
}

void jit_build_dir_free(const char *dir)
{
    /* Removed before it leaves the registry: an exit in between removes it again, harmlessly. */
    rm_build_dir(dir);
    pthread_mutex_lock(&reg_lock);
    for (struct reg_entry *e = reg_head; e; e = e->next)
        if (e->pid == 0 && strcmp(e->dir, dir) == 0) {
            reg_remove(e);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
}

static int64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits for pid, reading pipe_fd (when >= 0) into out until its end, for at most timeout_s
 * seconds. A signal that interrupts the wait (Ctrl-C in Python, whose handlers do not restart
 * system calls) ends it too: the caller's process must be able to react to it. On timeout or
 * interruption the child's whole process group (the compiler and what it started) is killed
 * and reaped, and ETIMEDOUT or EINTR returned; else 0 and the wait status. */
static int wait_child(pid_t pid, int pipe_fd, char *out, size_t outcap, int timeout_s, int *wstatus,
                      const atomic_int *cancel)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0); /* -1 before Linux 5.3: poll in steps */
    const int64_t deadline = mono_ms() + (int64_t)timeout_s * 1000;
    /* SIGCHLD is blocked during the wait (the compiler's own exit would otherwise interrupt
     * it in a program that handles SIGCHLD); it stays pending for the program's handler. */
    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    sigaddset(&mask, SIGCHLD);
    size_t len = 0;
    int rc = 0;
    for (;;) {
        if (pipe_fd < 0) {
            pid_t w = waitpid(pid, wstatus, WNOHANG);
            if (w == pid)
                break;
            if (w < 0 && errno != EINTR) {
                rc = errno;
                break;
            }
        }
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            rc = ETIMEDOUT;
            break;
        }
        if (cancel && atomic_load(cancel)) {
            rc = ECANCELED;
            break;
        }
        struct pollfd p = {.fd = pipe_fd >= 0 ? pipe_fd : pidfd, .events = POLLIN};
        /* A cancellable wait looks at its flag every 50 ms. */
        int64_t most = cancel ? 50 : 60000;
        int step = p.fd >= 0 ? (int)(left < most ? left : most) : (left < 10 ? (int)left : 10);
        struct timespec ts = {step / 1000, (long)(step % 1000) * 1000000};
        int pr = ppoll(&p, p.fd >= 0 ? 1 : 0, &ts, &mask);
        if (pr < 0 && errno == EINTR) {
            rc = EINTR;
            break;
        }
        if (pipe_fd >= 0 && pr > 0) {
            char tmp[512];
            ssize_t n = read(pipe_fd, tmp, sizeof tmp);
            if (n < 0 && errno == EINTR) {
                rc = EINTR;
                break;
            }
            if (n <= 0) {
                close(pipe_fd);
                pipe_fd = -1;
                continue;
            }
            size_t take = (size_t)n;
            if (len + take >= outcap)
                take = outcap - 1 - len;
            memcpy(out + len, tmp, take);
            len += take;
        }
    }
    if (out)
        out[len] = 0;
    if (pipe_fd >= 0)
        close(pipe_fd);
    if (pidfd >= 0)
        close(pidfd);
    if (rc == ETIMEDOUT || rc == EINTR || rc == ECANCELED) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, wstatus, 0) < 0 && errno == EINTR)
            ;
    }
    return rc;
}

/* Runs argv in a process group of its own with stdout and stderr into log_path (or a pipe read
 * into out when out != NULL), for at most timeout_s seconds. When src_path is not NULL, src
 * (len bytes) is written there first (*wrote set on success), with the start of the process:
 * under the registry's lock, so that the exit handler finds either neither or both. Returns 0
 * and the wait status, ETIMEDOUT or EINTR (see wait_child), ECANCELED when the process is
 * exiting, or an errno when the file could not be written or the program could not be
 * started. */
static int spawn_wait(char *const *argv, const char *log_path, char *out, size_t outcap,
                      int timeout_s, int *wstatus, const char *src_path, const char *src,
                      size_t len, bool *wrote, const atomic_int *cancel)
{
    jit_process_init();
    struct reg_entry *reg = calloc(1, sizeof *reg);
    if (!reg)
        return ENOMEM;
    reg->pidfd = -1;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int pfd[2] = {-1, -1};
    if (posix_spawn_file_actions_init(&fa) != 0) {
        free(reg);
        return ENOMEM;
    }
    if (posix_spawnattr_init(&at) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        free(reg);
        return ENOMEM;
    }
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    int rc = 0;
    if (out) {
        if (pipe2(pfd, O_CLOEXEC) != 0)
            rc = errno;
        else {
            posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
            posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        }
    } else {
        posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    pid_t pid = 0;
    if (rc == 0) {
        pthread_mutex_lock(&reg_lock);
        if (reg_exiting)
            rc = ECANCELED;
        else if (src_path && write_file(src_path, src, len) != SR_OK)
            rc = errno ? errno : EIO;
        else {
            if (wrote)
                *wrote = src_path != NULL;
            rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
        }
        if (rc == 0) {
            reg->pid = pid;
            reg->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
            reg_add(reg);
            reg = NULL;
        }
        pthread_mutex_unlock(&reg_lock);
    }
    free(reg);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (pfd[1] >= 0)
        close(pfd[1]);
    if (rc != 0) {
        if (pfd[0] >= 0)
            close(pfd[0]);
        if (out)
            out[0] = 0;
        return rc;
    }
    rc = wait_child(pid, pfd[0], out, outcap, timeout_s, wstatus, cancel);
    pthread_mutex_lock(&reg_lock);
    for (struct reg_entry *e = reg_head; e; e = e->next)
        if (e->pid == pid) {
            reg_remove(e);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

/* The calling thread's cancellation flag (jit_compile_cancel_by). */
static _Thread_local const atomic_int *cancel_by;

void jit_compile_cancel_by(const atomic_int *flag) { cancel_by = flag; }

bool jit_compiler_found(const char *cc)
{
    if (!cc[0])
        return false;
    if (strchr(cc, '/'))
        return access(cc, X_OK) == 0;
    /* posix_spawnp's search: the directories of PATH, or its default when PATH is unset. */
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";
    char buf[4096];
    for (const char *p = path;;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int n = snprintf(buf, sizeof buf, "%.*s%s%s", (int)len, p, len ? "/" : "", cc);
        if (n > 0 && (size_t)n < sizeof buf && access(buf, X_OK) == 0)
            return true;
        if (!end)
            return false;
        p = end + 1;
    }
}

/* The message of a compiler run that did not finish: timed out or interrupted. */
static void unfinished(char *err, size_t errcap, const char *cc, const char *what, int rc,
                       int timeout_s)
{
    if (rc == ETIMEDOUT)
        snprintf(err, errcap,
                 "the C compiler '%s' timed out (%s ran longer than %d s, "
                 "SYMRED_COMPILE_TIMEOUT) and was killed",
                 cc, what, timeout_s);
    else
        snprintf(err, errcap, "the C compiler '%s' was interrupted by a signal (%s) and killed", cc,
                 what);
}

/* Process-wide (under id_lock): the identity of each compiler used, so `cc --version` runs
 * once per process and compiler, not once per kernel. */
static struct {
    char cc[512];
    uint64_t id;
} id_cache[8];
static int id_count;

sr_status jit_compiler_id(const char *cc, int timeout_s, uint64_t *out_id, char *err, size_t errcap)
{
    pthread_mutex_lock(&id_lock);
    for (int i = 0; i < id_count; i++)
        if (strcmp(id_cache[i].cc, cc) == 0) {
            *out_id = id_cache[i].id;
            pthread_mutex_unlock(&id_lock);
            return SR_OK;
        }
    pthread_mutex_unlock(&id_lock);
    char out[4096];
    char *argv[] = {(char *)cc, (char *)"--version", NULL};
    int ws = 0;
    uint64_t id = 0;
    /* Only a compiler that cannot be started counts as missing: one that runs but fails is
     * reported when it fails to compile. */
    int rc = spawn_wait(argv, NULL, out, sizeof out, timeout_s, &ws, NULL, NULL, 0, NULL, NULL);
    if (rc == ETIMEDOUT || rc == EINTR) {
        unfinished(err, errcap, cc, "--version", rc, timeout_s);
        return SR_ECOMPILE;
    }
    if (rc == 0) {
        id = jit_hash(JIT_HASH_INIT, cc, strlen(cc));
        id = jit_hash(id, out, strlen(out));
        id = jit_hash(id, &ws, sizeof ws);
        if (!id)
            id = 1;
    }
    if (id) {
        pthread_mutex_lock(&id_lock);
        if (id_count < 8) {
            snprintf(id_cache[id_count].cc, sizeof id_cache[id_count].cc, "%s", cc);
            id_cache[id_count++].id = id;
        }
        pthread_mutex_unlock(&id_lock);
    }
    *out_id = id;
    if (!id) {
        snprintf(err, errcap, "cannot run the C compiler '%s'", cc);
        return SR_ENODEV;
    }
    return SR_OK;
}

static void read_log(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

sr_status jit_compile(const struct jit_ctx *jc, const char *src, size_t len, const char *dir,
                      const char *so_path, char *err, size_t errcap)
{
    char cpath[4096], logpath[4096];
    snprintf(cpath, sizeof cpath, "%s/kernel.c", dir);
    snprintf(logpath, sizeof logpath, "%s/cc.log", dir);
    const char *argv[32];
    int n = 0;
    argv[n++] = jc->cc;
    for (int i = 0; jit_cflags[i]; i++)
        argv[n++] = jit_cflags[i];
    argv[n++] = "-o";
    argv[n++] = so_path;
    argv[n++] = cpath;
    for (int i = 0; jit_libs[i]; i++)
        argv[n++] = jit_libs[i];
    argv[n] = NULL;
    int ws = 0;
    bool wrote = false;
    int rc = spawn_wait((char *const *)argv, logpath, NULL, 0, jc->compile_timeout, &ws, cpath, src,
                        len, &wrote, cancel_by);
    sr_status st = SR_OK;
    if (!wrote && rc != ECANCELED) {
        snprintf(err, errcap, "cannot write %s: %s", cpath, strerror(rc));
        return SR_EIO;
    }
    if (rc == ECANCELED && wrote) {
        snprintf(err, errcap, "the compile was cancelled (its context was freed) and '%s' killed",
                 jc->cc);
        st = SR_ECOMPILE;
    } else if (rc == ECANCELED) {
        snprintf(err, errcap, "the process is exiting: no compiler is started");
        st = SR_ECOMPILE;
    } else if (rc == ETIMEDOUT || rc == EINTR) {
        unfinished(err, errcap, jc->cc, "compiling a kernel", rc, jc->compile_timeout);
        st = SR_ECOMPILE;
    } else if (rc != 0) {
        snprintf(err, errcap, "cannot run the C compiler '%s': %s", jc->cc, strerror(rc));
        st = SR_ENODEV;
    } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        char log[1536];
        read_log(logpath, log, sizeof log);
        if (WIFEXITED(ws))
            snprintf(err, errcap, "the C compiler '%s' failed (exit status %d): %s", jc->cc,
                     WEXITSTATUS(ws), log[0] ? log : "(no diagnostics)");
        else
            snprintf(err, errcap, "the C compiler '%s' was killed by signal %d: %s", jc->cc,
                     WTERMSIG(ws), log);
        st = SR_ECOMPILE;
    }
    unlink(cpath);
    unlink(logpath);
    return st;
}

/* Takes the handle h of a loaded kernel into m, checking its ABI; closes it on failure. */
static sr_status adopt(void *h, const char *what, struct jit_module *m, char *err, size_t errcap)
{
    const int *abi = dlsym(h, "sr_abi_version");
    const int64_t *sb = dlsym(h, "sr_state_bytes");
    const int64_t *rb = dlsym(h, "sr_rows_per_block");
    m->part = (jit_part_fn)dlsym(h, "sr_part");
    m->part_iv = (jit_part_iv_fn)dlsym(h, "sr_part_iv");
    m->merge = (jit_merge_fn)dlsym(h, "sr_merge");
    m->final = (jit_final_fn)dlsym(h, "sr_final");
    m->run = (jit_run_fn)dlsym(h, "sr_run");
    m->block = (jit_block_fn)dlsym(h, "sr_block"); /* optional: see jit.h */
    if (!abi || *abi != JIT_ABI_VERSION || !sb || !rb || !m->part || !m->part_iv || !m->merge ||
        !m->final || !m->run) {
        dlclose(h);
        snprintf(err, errcap, "%s: not a symred kernel of ABI %d", what, JIT_ABI_VERSION);
        return SR_EIO;
    }
    m->handle = h;
    m->state_bytes = *sb;
    m->rows_per_block = *rb;
    return SR_OK;
}

/* Whether /proc/self/fd/N names the file open as fd (/proc may be missing in a container). */
bool jit_proc_fd_works(int fd)
{
    char name[64];
    struct stat a, b;
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    return fstat(fd, &a) == 0 && stat(name, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* A name for one load of the file open as fd that no load before it used in this process.
 *
 * The dynamic loader looks an object up by every name it was ever opened under before it looks
 * at the file, and keeps those names while the object stays loaded (another context may hold
 * it, or it may have found the file by its identity under a second name). A name reused for
 * another file, as /proc/self/fd/N is once N is closed and reopened, would find the wrong
 * object. So each load spells /proc/self/fd/N with its serial number in the path's redundant
 * separators, "./" for a 1 bit and "/" for a 0 bit after the leading "/": the kernel resolves
 * every spelling to descriptor N, and no two loads share one. The serial is process-wide
 * because the loader's names are. The loader still finds an object already loaded from the
 * same file by its identity (device and inode, which cannot be reused while it is mapped), and
 * that is the right object. */
static void load_name(char *name, size_t cap, int fd)
{
    static _Atomic uint64_t serial;
    uint64_t s = atomic_fetch_add(&serial, 1) + 1;
    size_t n = 0;
    name[n++] = '/';
    for (int b = 63 - __builtin_clzll(s); b >= 0; b--) {
        if (s >> b & 1)
            name[n++] = '.';
        name[n++] = '/';
    }
    snprintf(name + n, cap - n, "proc/self/fd/%d", fd);
}

sr_status jit_load_fd(sr_ctx *ctx, int fd, struct jit_module *m, char *err, size_t errcap)
{
    (void)ctx;
    char name[64 + 2 * 64];
    load_name(name, sizeof name, fd);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    close(fd); /* the mapping holds the file */
    char what[64];
    snprintf(what, sizeof what, "/proc/self/fd/%d", fd);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errcap, "dlopen %s: %s", what, e ? e : "failed");
        return SR_EIO;
    }
    return adopt(h, what, m, err, errcap);
}

sr_status jit_load(sr_ctx *ctx, const char *path, struct jit_module *m, char *err, size_t errcap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && jit_proc_fd_works(fd))
        return jit_load_fd(ctx, fd, m, err, errcap);
    if (fd >= 0)
        close(fd);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errcap, "dlopen %s: %s", path, e ? e : "failed");
        return SR_EIO;
    }
    return adopt(h, path, m, err, errcap);
}
