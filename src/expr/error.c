/* error.c — the IR's error sink: the context's last message and pending builder failure. */
#include "expr.h"

#include <stdio.h>
#include <string.h>

sr_status expr_ctx_init(struct expr_ctx *c)
{
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->err.lock, NULL) != 0)
        return SR_ENOMEM;
    expr_store_init(&c->store);
    return SR_OK;
}

void expr_ctx_free(struct expr_ctx *c)
{
    expr_store_free(&c->store);
    pthread_mutex_destroy(&c->err.lock);
}

/* The calling thread's redirection of non-builder errors (expr_error_redirect). */
static _Thread_local char *redirect_buf;
static _Thread_local size_t redirect_cap;

void expr_error_redirect(char *buf, size_t cap)
{
    redirect_buf = cap ? buf : NULL;
    redirect_cap = cap;
    if (redirect_buf)
        redirect_buf[0] = 0;
}

sr_status expr_verror(sr_ctx *ctx, sr_status status, bool builder, const char *fmt, va_list ap)
{
    if (!ctx)
        return status;
    if (redirect_buf && !builder) {
        vsnprintf(redirect_buf, redirect_cap, fmt, ap);
        return status;
    }
    struct expr_errors *e = &expr_ctx(ctx)->err;
    pthread_mutex_lock(&e->lock);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    if (builder)
        e->pending = status;
    pthread_mutex_unlock(&e->lock);
    return status;
}

sr_status expr_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    expr_verror(ctx, status, false, fmt, ap);
    va_end(ap);
    return status;
}

sr_status expr_builder_error(sr_ctx *ctx, sr_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    expr_verror(ctx, status, true, fmt, ap);
    va_end(ap);
    return status;
}

void expr_error_get(sr_ctx *ctx, char *buf, size_t cap)
{
    if (!cap)
        return;
    if (redirect_buf) {
        snprintf(buf, cap, "%s", redirect_buf);
        return;
    }
    struct expr_errors *e = &expr_ctx(ctx)->err;
    pthread_mutex_lock(&e->lock);
    size_t n = strnlen(e->msg, cap - 1);
    memcpy(buf, e->msg, n);
    buf[n] = 0;
    pthread_mutex_unlock(&e->lock);
}
