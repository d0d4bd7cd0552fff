/*
 * test-fork-exit.c — a process that exits, or forks, while a background compile runs
 * (SYMRED_JIT=async).
 *
 * Exit: a program (exit-child.c) that returns from main, or calls exit, while its compiler runs
 * ends at once, its compiler's process group is killed and its private build directory is gone.
 * Fork: a child forked while compiles run (some waiting for a compiler slot, some in a compiler
 * that hangs) runs the parent's kernels on the tile interpreter, waits for them and frees them
 * and the context without hanging, and creates and compiles kernels of its own, sync and async;
 * a child forked while another thread compiles a kernel's block module (sr_kernel_eval_block)
 * evaluates a block of that kernel without waiting for the parent's thread. The compiler is a
 * script that sleeps, so the compiles are surely running.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "symred.h"

extern char **environ;

static char base[] = "/tmp/symred-forkexit-XXXXXX";
static char cache[256], cc[256], pgid_file[256], go_file[256], started_file[256];

/* gcc's AddressSanitizer does not hold its allocator's locks across fork(): a child forked while
 * another thread of the parent is inside malloc or free can wait forever in the sanitizer's
 * allocator. Under ASan the forks therefore land while every other thread waits (in the hanging
 * compiler, or for a compile slot); the uninstrumented build also forks while a thread creates
 * and frees kernels and while compiles time out. */
#ifdef __SANITIZE_ADDRESS__
static const bool fork_while_allocating = false;
#else
static const bool fork_while_allocating = true;
#endif

/* A compiler that answers --version, writes its process group (its own pid: it leads the group),
 * adds a line to the started file and sleeps; its child, sleep, is in the same group. */
static void setup(void)
{
    cr_assert(mkdtemp(base) != NULL);
    snprintf(cache, sizeof cache, "%s/cache", base);
    snprintf(cc, sizeof cc, "%s/cc.sh", base);
    snprintf(pgid_file, sizeof pgid_file, "%s/pgid", base);
    snprintf(go_file, sizeof go_file, "%s/go", base);
    snprintf(started_file, sizeof started_file, "%s/started", base);
    cr_assert_eq(mkdir(cache, 0700), 0);
    FILE *f = fopen(cc, "w");
    cr_assert(f);
    fprintf(f,
            "#!/bin/sh\ncase \"$1\" in --version) echo fake-cc 1.0; exit 0;; esac\n"
            "echo $$ > '%s.tmp' && mv '%s.tmp' '%s'\necho $$ >> '%s'\nsleep 30\n",
            pgid_file, pgid_file, pgid_file, started_file);
    fclose(f);
    chmod(cc, 0700);
    unsetenv("SYMRED_NUM_THREADS");
    setenv("SYMRED_CACHE_DIR", cache, 1);
}
static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(fork_exit, .init = setup, .fini = teardown, .timeout = 120);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for pid at most limit_s seconds; its wait status, or -1 (then it is killed). */
static int wait_for(pid_t pid, double limit_s)
{
    double t0 = now_s();
    int ws;
    while (now_s() - t0 < limit_s) {
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid)
            return ws;
        cr_assert(w == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
        usleep(2000);
    }
    /* A hung child's threads, for the log (where gdb is installed and may attach). */
    char cmd[160];
    snprintf(cmd, sizeof cmd,
             "command -v gdb >/dev/null && gdb -p %d -batch -ex 'thread apply all bt' >&2 2>&1",
             (int)pid);
    if (system(cmd) != 0)
        fprintf(stderr, "no stacks of the hung child %d (gdb missing or refused)\n", (int)pid);
    kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    return -1;
}

/* The processes of group pgid that are not zombies. */
static int group_alive(pid_t pgid)
{
    DIR *d = opendir("/proc");
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], buf[1024];
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        /* pid (comm) state ppid pgrp ...: comm may hold spaces, so parse after its ')'. */
        char *p = strrchr(buf, ')'), state;
        int ppid, pgrp;
        if (p && sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid &&
            state != 'Z')
            n++;
    }
    closedir(d);
    return n;
}

/* The lines of path (0 when it does not exist). */
static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    if (f) {
        for (int ch; (ch = fgetc(f)) != EOF;)
            n += ch == '\n';
        fclose(f);
    }
    return n;
}

static int count_tmp(void)
{
    DIR *d = opendir(cache);
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, "tmp-", 4) == 0;
    closedir(d);
    return n;
}

static void exit_case(const char *how)
{
    unlink(pgid_file);
    unlink(go_file);
    char *argv[] = {(char *)SYMRED_EXIT_CHILD, cache, cc, (char *)how, NULL};
    /* The child leaves its context open on purpose: under a sanitizer build, no leak report
     * (the caller's ASAN_OPTIONS, which take precedence over the child's own defaults, with
     * detect_leaks=0 added). */
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof *envp);
    cr_assert(envp);
    char asan[1024] = "ASAN_OPTIONS=detect_leaks=0";
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "ASAN_OPTIONS=", 13) == 0)
            snprintf(asan, sizeof asan, "%.990s:detect_leaks=0", environ[i]);
        else
            envp[m++] = environ[i];
    }
    envp[m++] = asan;
    envp[m] = NULL;
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], NULL, NULL, argv, envp), 0);
    free(envp);
    /* The compiler has started once its group is written; the child leaves when told to. */
    double t0 = now_s();
    while (access(pgid_file, R_OK) != 0 && now_s() - t0 < 30)
        usleep(2000);
    FILE *f = fopen(pgid_file, "r");
    cr_assert(f, "the compiler did not start");
    int pgid = 0;
    cr_assert_eq(fscanf(f, "%d", &pgid), 1);
    fclose(f);
    cr_assert_gt(group_alive(pgid), 0, "the compiler is not running");
    FILE *go = fopen(go_file, "w");
    cr_assert(go);
    fclose(go);
    double t1 = now_s();
    int ws = wait_for(pid, 20);
    double took = now_s() - t1;
    cr_assert(ws != -1 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: wait status %d", how, ws);
    /* The compiler sleeps 30 s: an exit that waited for it would take that long. */
    cr_assert_lt(took, 10.0, "%s: the program took %.2f s to exit", how, took);
    /* The group was killed before the exit completed; a moment for the kernel to reap it. */
    for (int i = 0; i < 100 && group_alive(pgid); i++)
        usleep(10000);
    cr_assert_eq(group_alive(pgid), 0, "%s: the compiler's process group %d survived", how, pgid);
    cr_assert_eq(count_tmp(), 0, "%s: a build directory was left in %s", how, cache);
}

Test(fork_exit, return_from_main_while_compiling) { exit_case("return"); }
Test(fork_exit, exit_while_compiling) { exit_case("exit"); }

/* ---- fork ---- */

static const char *const al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(2)", "g=Pm(1)"};
static const char *const forms[] = {"Exp(-SqDist(x, y) * g) * b", "Inv(1 + SqDist(x, y) * g) * b",
                                    "Exp(-Norm2(x - y) * g) * b", "Cos(SqDist(x, y) * g) * b"};
enum { NX = 67, NY = 129 };
static float xs[NX * 3], ys[NY * 3], bs[NY * 2], gs = 0.7f;

static void fill(void)
{
    for (int i = 0; i < NX * 3; i++)
        xs[i] = (float)((i * 37) % 101) / 101.0f;
    for (int j = 0; j < NY * 3; j++)
        ys[j] = (float)((j * 53) % 97) / 97.0f;
    for (int j = 0; j < NY * 2; j++)
        bs[j] = (float)((j * 29) % 89) / 89.0f - 0.5f;
}

static sr_kernel *make(sr_ctx *ctx, int form, sr_device dev)
{
    sr_expr *f = NULL;
    if (sr_parse(ctx, forms[form], al, 4, &f) != SR_OK)
        return NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = dev;
    sr_kernel *k = NULL;
    return sr_kernel_new(ctx, f, &d, &k) == SR_OK ? k : NULL;
}

/* Whether k agrees with the reference on the test's inputs (nonzero: a failure). */
static int check(sr_ctx *ctx, const sr_kernel *k, int form)
{
    sr_kernel *kr = make(ctx, form, SR_DEVICE_REFERENCE);
    if (!k || !kr)
        return 1;
    float out[NX * 2], ref[NX * 2];
    const void *args[] = {xs, ys, bs, &gs};
    int bad = sr_kernel_run(k, NX, NY, args, out) != SR_OK ||
              sr_kernel_run(kr, NX, NY, args, ref) != SR_OK;
    for (int i = 0; i < NX * 2 && !bad; i++)
        bad = !(fabsf(out[i] - ref[i]) <= 1e-4f * (1 + fabsf(ref[i])));
    sr_kernel_free(kr);
    return bad;
}

/* In the child: the parent's kernels (compiles pending, their threads absent) on the tile
 * interpreter; waiting for them returns at once; new kernels of the child's own, compiled with
 * the real compiler when full is set; everything freed, the context last. The exit status says
 * which step failed. */
static int child_main(sr_ctx *ctx, sr_kernel **ks, int nk, bool full)
{
    for (int i = 0; i < nk; i++) {
        if (check(ctx, ks[i], i))
            return 10 + i;
        if (sr_kernel_wait(ks[i], 5) != SR_OK)
            return 20 + i;
        sr_plan_info pi = {.size = sizeof pi};
        if (sr_kernel_plan(ks[i], &pi) != SR_OK || pi.tier != 0 || pi.compiling ||
            !pi.compile_error)
            return 30 + i;
        /* explain rebuilds its text for the stage the child sees (its lock is not held). */
        if (!sr_kernel_explain(ks[i]))
            return 40 + i;
    }
    /* A new async kernel with the hanging compiler: tier 0 serves it, and the child's compile
     * slots are free although the parent's are all busy. */
    sr_kernel *kn = make(ctx, 0, SR_DEVICE_CPU);
    if (check(ctx, kn, 0))
        return 50;
    sr_kernel_free(kn);
    if (full) {
        /* The real compiler, sync then async. */
        if (sr_ctx_set_option(ctx, "SYMRED_CC", "cc") != SR_OK ||
            sr_ctx_set_option(ctx, "SYMRED_COMPILE_TIMEOUT", "120") != SR_OK ||
            sr_ctx_set_option(ctx, "SYMRED_JIT", "sync") != SR_OK)
            return 60;
        sr_kernel *ks1 = make(ctx, 1, SR_DEVICE_CPU);
        sr_plan_info pi = {.size = sizeof pi};
        if (check(ctx, ks1, 1) || sr_kernel_plan(ks1, &pi) != SR_OK || pi.tier != 1)
            return 61;
        sr_kernel_free(ks1);
        sr_ctx_set_option(ctx, "SYMRED_JIT", "async");
        sr_kernel *ka = make(ctx, 2, SR_DEVICE_CPU);
        if (!ka || sr_kernel_wait(ka, 120) != SR_OK || sr_kernel_plan(ka, &pi) != SR_OK ||
            pi.tier != 1 || check(ctx, ka, 2))
            return 62;
        sr_kernel_free(ka);
    }
    for (int i = 0; i < nk; i++)
        sr_kernel_free(ks[i]);
    sr_ctx_free(ctx);
    return 0;
}

/* Creates and frees async kernels on a context of its own until told to stop, so that forks
 * land while compiles start, queue for a slot and end. */
struct churn {
    atomic_bool stop;
    int made;
};

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return NULL;
    sr_ctx_set_option(ctx, "SYMRED_CC", cc);
    sr_ctx_set_option(ctx, "SYMRED_COMPILE_TIMEOUT", "1");
    sr_ctx_set_option(ctx, "SYMRED_JIT", "async");
    while (!atomic_load(&c->stop) && c->made < 40) {
        sr_kernel *k = make(ctx, c->made % 4, SR_DEVICE_CPU);
        sr_kernel_free(k);
        c->made++;
        usleep(5000);
    }
    sr_ctx_free(ctx);
    return NULL;
}

Test(fork_exit, fork_while_compiling)
{
    fill();
    setenv("SYMRED_CC", cc, 1);
    setenv("SYMRED_JIT", "async", 1);
    /* Without the other thread, the compiles outlast the forks. */
    setenv("SYMRED_COMPILE_TIMEOUT", fork_while_allocating ? "2" : "120", 1);
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_COMPILE_TIMEOUT");
    /* More compiles than slots: some run the hanging compiler, the others wait for a slot. */
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int nk = nproc + 1 < 4 ? (int)nproc + 1 : 4;
    sr_kernel *ks[4];
    for (int i = 0; i < nk; i++) {
        ks[i] = make(ctx, i, SR_DEVICE_CPU);
        cr_assert(ks[i], "%s", sr_ctx_error(ctx));
        /* The parent's threads (OpenMP's among them) have run before the fork. */
        cr_assert_eq(check(ctx, ks[i], i), 0, "kernel %d before the forks", i);
    }
    /* Every compile that has a slot has started its compiler; a moment more for their threads
     * to reach the wait. */
    int running = nproc < nk ? (int)nproc : nk;
    double t0 = now_s();
    while (count_lines(started_file) < running && now_s() - t0 < 30)
        usleep(2000);
    cr_assert_geq(count_lines(started_file), running, "the compilers did not start");
    usleep(100000);
    struct churn c = {.made = 0};
    atomic_init(&c.stop, false);
    pthread_t th;
    if (fork_while_allocating)
        cr_assert_eq(pthread_create(&th, NULL, churn_main, &c), 0);
    /* Many quick children (while the other thread churns), then one that compiles. */
    for (int round = 0; round < 9; round++) {
        bool full = round == 8;
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0)
            _exit(child_main(ctx, ks, nk, full));
        int ws = wait_for(pid, full ? 100 : 20);
        cr_assert(ws != -1, "child %d hung", round);
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child %d: wait status %#x (exit %d)",
                  round, ws, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        usleep(3000);
    }
    if (fork_while_allocating) {
        atomic_store(&c.stop, true);
        pthread_join(th, NULL);
        cr_assert_gt(c.made, 0);
    }
    /* The parent's kernels are unchanged by the forks. */
    for (int i = 0; i < nk; i++) {
        cr_assert_eq(check(ctx, ks[i], i), 0, "kernel %d", i);
        sr_kernel_free(ks[i]);
    }
    sr_ctx_free(ctx);
}

/* A thread of the parent builds a kernel's block module (the first sr_kernel_eval_block holds
 * the kernel's block lock across its compile, here the hanging compiler's) when the process
 * forks: in the child, eval_block of that kernel returns (whatever its compile gives) instead of
 * waiting for a lock that no thread of the child will release. */
struct block_job {
    const sr_kernel *k;
    sr_status st;
};

static void *block_run(void *p)
{
    struct block_job *j = p;
    float out[4 * 4 * 2];
    const void *args[] = {xs, ys, bs, &gs};
    j->st = sr_kernel_eval_block(j->k, NX, NY, args, 0, 4, 0, 4, out);
    return NULL;
}

Test(fork_exit, fork_while_a_block_module_compiles)
{
    fill();
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT", "sync"), SR_OK);
    sr_kernel *k = make(ctx, 0, SR_DEVICE_CPU);
    cr_assert(k, "%s", sr_ctx_error(ctx));
    sr_plan_info pi = {.size = sizeof pi};
    cr_assert_eq(sr_kernel_plan(k, &pi), SR_OK);
    cr_assert_eq(pi.strategy, SR_STRATEGY_DIRECT);
    /* The block module compiles with the hanging compiler from now on. */
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_CC", cc), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_COMPILE_TIMEOUT", "3"), SR_OK);
    struct block_job j = {k, SR_OK};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, block_run, &j), 0);
    double t0 = now_s();
    while (access(pgid_file, R_OK) != 0 && now_s() - t0 < 30)
        usleep(2000);
    cr_assert_eq(access(pgid_file, R_OK), 0, "the block module's compile did not start");
    usleep(100000); /* for the compiling thread to reach its wait */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* The child's own compile of the block module times out too: any status, no hang. */
        struct block_job cj = {k, SR_OK};
        block_run(&cj);
        sr_kernel_free(k);
        sr_ctx_free(ctx);
        _exit(0);
    }
    int ws = wait_for(pid, 30);
    cr_assert(ws != -1, "the child hung");
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "wait status %#x", ws);
    pthread_join(th, NULL);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}
