/* ctx.c — contexts, status strings, error messages. */
#include "core.h"

#include <errno.h>
#ifdef _OPENMP
#include <omp.h>
#endif
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

sr_status sr__env_int(sr_ctx *ctx, const char *name, long lo, long hi, long dflt, long *out)
{
    *out = dflt;
    const char *s = getenv(name);
    if (!s || !*s)
        return SR_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return sr__error(ctx, SR_EINVAL, "%s=%.100s: expected an integer in [%ld, %ld]", name, s,
                         lo, hi);
    *out = v;
    return SR_OK;
}

sr_status sr__env_choice(sr_ctx *ctx, const char *name, const char *const *choices, int n, int dflt,
                         int *out)
{
    *out = dflt;
    const char *s = getenv(name);
    if (!s || !*s)
        return SR_OK;
    for (int i = 0; i < n; i++)
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return SR_OK;
        }
    char list[200] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 choices[i]);
    return sr__error(ctx, SR_EINVAL, "%s=%.100s: expected one of %s", name, s, list);
}

sr_status sr_ctx_new(sr_ctx **out)
{
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
    long level;
    if (sr__env_int(ctx, "SYMRED_LOG", 0, 3, 0, &level) != SR_OK) {
        ctx->env_status = SR_EINVAL;
        sr__error_get(ctx, ctx->env_msg, sizeof ctx->env_msg);
    }
    ctx->log_level = (int)level;
    long nt;
    if (sr__env_int(ctx, "SYMRED_NUM_THREADS", 1, 100000, 0, &nt) != SR_OK &&
        ctx->env_status == SR_OK) {
        ctx->env_status = SR_EINVAL;
        sr__error_get(ctx, ctx->env_msg, sizeof ctx->env_msg);
    }
    ctx->num_threads = (int)nt;
    sr__mem_limit_init(ctx);
    *out = ctx;
    return SR_OK;
}

int sr__threads(const sr_ctx *ctx, int64_t per_thread)
{
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
