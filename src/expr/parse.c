/* parse.c — STUB, replaced by the parser work. */
#include "../core/core.h"

sr_status sr_parse(sr_ctx *ctx, const char *formula, const char *const *aliases, int naliases,
                   sr_expr **out)
{
    (void)formula;
    (void)aliases;
    (void)naliases;
    if (out)
        *out = NULL;
    return sr__error(ctx, SR_ENOTSUP, "parser not written yet");
}
