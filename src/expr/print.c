/* print.c — STUB, replaced by the printer work. */
#include "../core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void expr_buf_printf(struct expr_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void expr_print_to(struct expr_buf *b, const sr_expr *e)
{
    expr_buf_printf(b, "%s", expr_ops[e->op].name);
}

size_t sr_expr_print(const sr_expr *e, char *buf, size_t cap)
{
    (void)e;
    if (cap)
        buf[0] = 0;
    return 0;
}
