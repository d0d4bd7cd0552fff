/* ctx.c — contexts, status strings, error messages. */
#include "core.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sr_version(void) { return SYMRED_VERSION_STRING; }

const char *sr_status_str(int status)
{
    switch (status) {
#define SR_STATUS_CASE_(name, value, desc)                                                         \
    case value:                                                                                    \
        return desc;
        SR_STATUS_MAP(SR_STATUS_CASE_)
#undef SR_STATUS_CASE_
    }
    return "unknown status";
}

/* The fork generation: one more in each child of fork() than in its parent. */
static atomic_uint fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void fork_child(void) { atomic_fetch_add(&fork_gen, 1); }
static void fork_init(void) { pthread_atfork(NULL, NULL, fork_child); }

unsigned sr__fork_gen(void) { return atomic_load(&fork_gen); }

sr_status sr_ctx_new(sr_ctx **out)
{
    pthread_once(&fork_once, fork_init);
    if (!out)
        return SR_EINVAL;
    *out = NULL;
    sr_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return SR_ENOMEM;
    if (expr_ctx_init(&ctx->ir) != SR_OK) {
        free(ctx);
        return SR_ENOMEM;
    }
    sr__options_read(ctx);
    *out = ctx;
    return SR_OK;
}

int sr__threads(const sr_ctx *ctx, int64_t per_thread)
{
    /* GNU OpenMP cannot start a team in the child of a process whose forking thread ran one: its
     * pool's threads are not in the child, and the team waits for them for ever. */
    if (sr__fork_gen() != 0)
        return 1;
#ifdef _OPENMP
    int nt = omp_get_max_threads();
#else
    int nt = 1;
#endif
    if (ctx->num_threads > 0 && ctx->num_threads < nt)
        nt = ctx->num_threads;
    int64_t lim = ctx->mem_limit;
    if (lim > 0 && per_thread > 0 && (int64_t)nt * per_thread > lim)
        nt = (int)(lim / per_thread);
    return nt < 1 ? 1 : nt;
}

void sr_ctx_free(sr_ctx *ctx)
{
    if (!ctx)
        return;
    sr__backends_ctx_free(ctx);
    expr_ctx_free(&ctx->ir);
    free(ctx);
}

const char *sr_ctx_error(const sr_ctx *ctx)
{
    static _Thread_local char copy[SR_ERR_MAX];
    if (!ctx)
        return "no context (NULL sr_ctx)";
    sr__error_get((sr_ctx *)ctx, copy, sizeof copy);
    return copy;
}
