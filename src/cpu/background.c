/*
 * background.c — compiling a kernel's modules on a thread of their own (SYMRED_JIT=async), for
 * every CPU strategy that serves its calls on the tile interpreter meanwhile: the direct one
 * (omp-runtime.c) and the gemm-epilogue (gemm.c).
 *
 * A struct cpu_bg is shared by the kernel and the compiling thread and freed by whichever lets
 * go last. The thread compiles (or loads from the caches) every source in turn and publishes
 * the modules together: it writes them, then sets ready with release order; calls read ready
 * with acquire order, so a call runs either the tile interpreter or the whole set of modules,
 * never a mix. When the kernel is gone first, the thread releases the modules itself. The
 * context waits for its background compiles when it is freed (jit_ctx_free), so the thread may
 * use the context to the end.
 *
 * In a child of fork() the thread does not exist (gen, the fork generation it started in, is
 * older than the process's: orphan): the child never takes the record's lock, which the thread
 * may have held, nor waits for it; the kernel keeps the modules published before the fork, if
 * any, else the tile interpreter serves it for good, and its release frees the record alone.
 */
#include "../jit/jit.h"
#include "cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cpu_bg {
    unsigned gen; /* sr__fork_gen() when the thread started */
    pthread_mutex_t lock;
    pthread_cond_t done_cv; /* broadcast when done becomes true */
    atomic_bool ready;      /* m[0 .. n) are loaded and the kernel's */
    struct jit_module *m[CPU_BG_MAX];
    sr_ctx *ctx;
    char *src[CPU_BG_MAX];
    size_t len[CPU_BG_MAX];
    int n;
    int refs;         /* under lock */
    bool kernel_gone; /* under lock */
    bool done;        /* under lock: status, why and info are set */
    sr_status status;
    char why[512];
    struct jit_load_info info;
};

/* Whether bg's compiling thread belongs to a parent of this process (see above). */
static bool orphan(const struct cpu_bg *bg) { return bg->gen != sr__fork_gen(); }

static const char orphan_why[] = "the process forked while the module compiled: in this child "
                                 "the tile interpreter serves the kernel";

static void bg_unref(struct cpu_bg *bg)
{
    pthread_mutex_lock(&bg->lock);
    int left = --bg->refs;
    pthread_mutex_unlock(&bg->lock);
    if (left)
        return;
    pthread_cond_destroy(&bg->done_cv);
    pthread_mutex_destroy(&bg->lock);
    for (int i = 0; i < bg->n; i++)
        free(bg->src[i]);
    free(bg);
}

/* At most as many compilers at once, process-wide, as the machine has processors: a program that
 * creates many kernels at once queues their compiles instead of starting them all. */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_cv = PTHREAD_COND_INITIALIZER;
static int slots_busy;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;

/* fork(): the lock is held across it; the child's compiles start from none busy, since the
 * parent's compiling threads are not in the child. */
static void slot_prepare(void) { pthread_mutex_lock(&slot_lock); }
static void slot_parent(void) { pthread_mutex_unlock(&slot_lock); }
static void slot_child(void)
{
    slots_busy = 0;
    pthread_cond_init(&slot_cv, NULL);
    pthread_mutex_unlock(&slot_lock);
}
static void slot_init(void) { pthread_atfork(slot_prepare, slot_parent, slot_child); }

static void slot_take(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int max = n > 1 ? (int)n : 1;
    pthread_mutex_lock(&slot_lock);
    while (slots_busy >= max)
        pthread_cond_wait(&slot_cv, &slot_lock);
    slots_busy++;
    pthread_mutex_unlock(&slot_lock);
}

static void slot_give(void)
{
    pthread_mutex_lock(&slot_lock);
    slots_busy--;
    pthread_cond_signal(&slot_cv);
    pthread_mutex_unlock(&slot_lock);
}

static void *bg_main(void *arg)
{
    struct cpu_bg *bg = arg;
    sr_ctx *ctx = bg->ctx;
    struct jit_ctx *jc = jit_ctx_of(ctx);
    char err[SR_ERR_MAX] = "";
    struct jit_module *m[CPU_BG_MAX] = {NULL};
    struct jit_load_info info = {0}, one;
    sr_status st = SR_OK;
    /* The compile's failures are the kernel's to show in explain, not the context's message. */
    slot_take();
    expr_error_redirect(err, sizeof err);
    /* A context being freed cancels the compiles it queued (jit_ctx_free); a kernel freed while
     * its compile waited for a slot is not compiled at all. */
    pthread_mutex_lock(&bg->lock);
    bool skip = bg->kernel_gone;
    pthread_mutex_unlock(&bg->lock);
    if (atomic_load(&jc->cancel)) {
        st = SR_ECOMPILE;
        snprintf(err, sizeof err, "not started: the context was freed");
    } else if (skip) {
        st = SR_ECOMPILE;
        snprintf(err, sizeof err, "the kernel was freed before its compile started");
    }
    jit_compile_cancel_by(&jc->cancel);
    for (int i = 0; i < bg->n && st == SR_OK; i++) {
        st = jit_module_get(ctx, bg->src[i], bg->len[i], &m[i], &one);
        double ms = info.compile_ms + one.compile_ms;
        if (i == 0)
            info = one;
        info.compile_ms = ms;
    }
    jit_compile_cancel_by(NULL);
    expr_error_redirect(NULL, 0);
    slot_give();
    pthread_mutex_lock(&bg->lock);
    bool gone = bg->kernel_gone;
    bg->done = true;
    bg->status = st;
    bg->info = info;
    snprintf(bg->why, sizeof bg->why, "%.500s", st == SR_OK ? "" : err);
    if (st == SR_OK && !gone) {
        for (int i = 0; i < bg->n; i++)
            bg->m[i] = m[i];
        atomic_store_explicit(&bg->ready, true, memory_order_release);
    }
    pthread_cond_broadcast(&bg->done_cv);
    pthread_mutex_unlock(&bg->lock);
    if (st != SR_OK || gone)
        for (int i = 0; i < bg->n; i++)
            jit_module_release(ctx, m[i]);
    if (ctx->log_level >= 1 && !skip) {
        if (st == SR_OK)
            fprintf(stderr,
                    "symred: background compile done (module from %s, %.1f ms): the kernel's "
                    "calls run compiled code from now on\n",
                    info.origin, info.compile_ms);
        else
            fprintf(stderr,
                    "symred: background compile failed (%s): the tile interpreter keeps serving "
                    "the kernel\n",
                    err);
    }
    bg_unref(bg);
    /* The last use of the context: jit_ctx_free may free it as soon as the lock is let go. */
    jit_ctx_lock(jc);
    if (--jc->bg_running == 0)
        pthread_cond_broadcast(&jc->bg_idle);
    jit_ctx_unlock(jc);
    return NULL;
}

sr_status cpu_bg_start(sr_ctx *ctx, struct expr_buf *src, int n, struct cpu_bg **out)
{
    *out = NULL;
    struct jit_ctx *jc = jit_ctx_of(ctx);
    if (!jc || n < 1 || n > CPU_BG_MAX)
        return SR_EINTERNAL;
    struct cpu_bg *bg = calloc(1, sizeof *bg);
    if (!bg || pthread_mutex_init(&bg->lock, NULL) != 0) {
        free(bg);
        return SR_ENOMEM;
    }
    if (pthread_cond_init(&bg->done_cv, NULL) != 0) {
        pthread_mutex_destroy(&bg->lock);
        free(bg);
        return SR_ENOMEM;
    }
    atomic_init(&bg->ready, false);
    pthread_once(&slot_once, slot_init);
    bg->gen = sr__fork_gen();
    bg->ctx = ctx;
    bg->n = n;
    for (int i = 0; i < n; i++) {
        bg->src[i] = src[i].data;
        bg->len[i] = src[i].len;
    }
    bg->refs = 2;
    jit_ctx_lock(jc);
    jc->bg_running++;
    jit_ctx_unlock(jc);
    pthread_attr_t attr;
    pthread_t th;
    bool started = pthread_attr_init(&attr) == 0;
    if (started) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&th, &attr, bg_main, bg) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!started) {
        jit_ctx_lock(jc);
        jc->bg_running--;
        jit_ctx_unlock(jc);
        pthread_cond_destroy(&bg->done_cv);
        pthread_mutex_destroy(&bg->lock);
        free(bg);
        return SR_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        src[i].data = NULL;
    *out = bg;
    return SR_OK;
}

struct jit_module *cpu_bg_module(const struct cpu_bg *bg, int i)
{
    if (!bg || !atomic_load_explicit(&((struct cpu_bg *)bg)->ready, memory_order_acquire))
        return NULL;
    return bg->m[i];
}

void cpu_bg_release(sr_ctx *ctx, struct cpu_bg *bg)
{
    if (!bg)
        return;
    struct jit_module *m[CPU_BG_MAX] = {NULL};
    if (orphan(bg)) {
        /* The compiling thread is the parent's: the record is the kernel's alone here. */
        if (atomic_load(&bg->ready))
            for (int i = 0; i < bg->n; i++)
                jit_module_release(ctx, bg->m[i]);
        for (int i = 0; i < bg->n; i++)
            free(bg->src[i]);
        free(bg);
        return;
    }
    pthread_mutex_lock(&bg->lock);
    bg->kernel_gone = true;
    if (atomic_exchange(&bg->ready, false))
        for (int i = 0; i < bg->n; i++) {
            m[i] = bg->m[i];
            bg->m[i] = NULL;
        }
    pthread_mutex_unlock(&bg->lock);
    for (int i = 0; i < CPU_BG_MAX; i++)
        jit_module_release(ctx, m[i]);
    bg_unref(bg);
}

sr_status cpu_bg_wait(struct cpu_bg *bg, double timeout_s)
{
    if (!bg || orphan(bg))
        return SR_OK;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s >= 0) {
        double s = timeout_s > 1e9 ? 1e9 : timeout_s;
        until.tv_sec += (time_t)s;
        until.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    sr_status st = SR_OK;
    pthread_mutex_lock(&bg->lock);
    while (!bg->done && st == SR_OK) {
        if (timeout_s < 0)
            pthread_cond_wait(&bg->done_cv, &bg->lock);
        else if (pthread_cond_timedwait(&bg->done_cv, &bg->lock, &until) != 0 && !bg->done)
            st = SR_ETIMEDOUT;
    }
    pthread_mutex_unlock(&bg->lock);
    return st;
}

int cpu_bg_stage(struct cpu_bg *bg)
{
    if (!bg)
        return SR_STAGE_FINAL;
    if (cpu_bg_module(bg, 0))
        return SR_STAGE_COMPILED;
    if (orphan(bg))
        return SR_STAGE_FAILED;
    pthread_mutex_lock(&bg->lock);
    bool failed = bg->done && bg->status != SR_OK;
    pthread_mutex_unlock(&bg->lock);
    return failed ? SR_STAGE_FAILED : SR_STAGE_PENDING;
}

int cpu_bg_explain(struct cpu_bg *bg, struct expr_buf *b, struct jit_load_info *info)
{
    bool done = true;
    sr_status st = SR_ECOMPILE;
    char why[512];
    if (orphan(bg)) {
        if (cpu_bg_module(bg, 0)) {
            st = SR_OK;
            *info = bg->info; /* written before the modules were published */
        }
        snprintf(why, sizeof why, "%s", orphan_why);
    } else {
        pthread_mutex_lock(&bg->lock);
        done = bg->done;
        st = bg->status;
        *info = bg->info;
        snprintf(why, sizeof why, "%s", bg->why);
        pthread_mutex_unlock(&bg->lock);
    }
    if (!done) {
        expr_buf_printf(b, "tier: 0, the tile interpreter, until the module compiling in the "
                           "background (SYMRED_JIT=async) is ready; then 1, compiled code\n");
        *info = (struct jit_load_info){.origin = "compiling", .cache = "pending"};
        return SR_STAGE_PENDING;
    }
    if (st != SR_OK) {
        expr_buf_printf(b, "tier: 0, the tile interpreter: the background compile failed (%s)\n",
                        why);
        *info = (struct jit_load_info){.origin = "none", .cache = "failed"};
        return SR_STAGE_FAILED;
    }
    expr_buf_printf(b, "tier: 1, compiled code (built in the background; the tile interpreter "
                       "served the calls before)\n");
    return SR_STAGE_COMPILED;
}

void cpu_module_plan_info(const struct jit_load_info *li, sr_plan_info *info)
{
    info->module = li->origin;
    info->module_cache = li->cache;
    info->module_path = li->path[0] ? li->path : NULL;
    info->compile_ms = li->compile_ms;
}

void cpu_bg_plan_info(struct cpu_bg *bg, sr_plan_info *info)
{
    /* bg->info is written before the modules are published, bg->why before done is set: both
     * stay as they are from then on, for as long as the kernel holds bg. */
    if (cpu_bg_module(bg, 0)) {
        cpu_module_plan_info(&bg->info, info);
    } else if (orphan(bg)) {
        info->compile_error = orphan_why;
    } else {
        pthread_mutex_lock(&bg->lock);
        if (bg->done && bg->status != SR_OK)
            info->compile_error = bg->why;
        pthread_mutex_unlock(&bg->lock);
    }
}
