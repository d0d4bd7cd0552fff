/* ctx.c — contexts, status strings, error messages. */
#include "core.h"

#include <stdarg.h>
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

static int env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000)
        return dflt;
    return (int)v;
}

sr_status sr_ctx_new(sr_ctx **out)
{
    if (!out)
        return SR_EINVAL;
    *out = NULL;
    sr_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return SR_ENOMEM;
    if (pthread_mutex_init(&ctx->err_lock, NULL) != 0) {
        free(ctx);
        return SR_ENOMEM;
    }
    expr_store_init(&ctx->store);
    ctx->log_level = env_int("SYMRED_LOG", 0);
    *out = ctx;
    return SR_OK;
}

void sr_ctx_free(sr_ctx *ctx)
{
    if (!ctx)
        return;
    cpu_jit_ctx_free(ctx);
    expr_store_free(&ctx->store);
    pthread_mutex_destroy(&ctx->err_lock);
    free(ctx);
}

static sr_status set_error(sr_ctx *ctx, sr_status status, bool builder, const char *fmt, va_list ap)
{
    if (!ctx)
        return status;
    pthread_mutex_lock(&ctx->err_lock);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    if (builder)
        ctx->pending = status;
    pthread_mutex_unlock(&ctx->err_lock);
    return status;
}

sr_status sr__error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(ctx, status, false, fmt, ap);
    va_end(ap);
    return status;
}

sr_status sr__builder_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(ctx, status, true, fmt, ap);
    va_end(ap);
    return status;
}

void sr__error_get(sr_ctx *ctx, char *buf, size_t cap)
{
    if (!cap)
        return;
    pthread_mutex_lock(&ctx->err_lock);
    snprintf(buf, cap, "%s", ctx->err);
    pthread_mutex_unlock(&ctx->err_lock);
}

const char *sr_ctx_error(const sr_ctx *ctx)
{
    static _Thread_local char copy[SR_ERR_MAX];
    if (!ctx)
        return "no context (NULL sr_ctx)";
    sr__error_get((sr_ctx *)ctx, copy, sizeof copy);
    return copy;
}
