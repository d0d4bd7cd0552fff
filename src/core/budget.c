/*
 * budget.c — the memory budget: SYMRED_MEM_LIMIT, sr_ctx_set_mem_limit, and the byte-count
 * parser they share.
 *
 * The budget bounds the workspace of every kernel of a context (the eXLA idea made a library
 * guarantee): the backends shrink their tiles, threads and splits to stay under
 * it and fail with SR_EBUDGET, saying how many bytes they need, when even their smallest plan
 * does not fit. Inputs and outputs are the caller's and are not counted. A kernel is planned
 * under the budget of its creation (k->budget, read once by sr_kernel_new); a call runs under
 * the budget in force at the call (sr__call_budget).
 */
#include "core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    int64_t mult;
} units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1000},
    {"kb", 1000},
    {"m", 1000000},
    {"mb", 1000000},
    {"g", 1000000000},
    {"gb", 1000000000},
    {"t", 1000000000000},
    {"tb", 1000000000000},
    {"kib", (int64_t)1 << 10},
    {"mib", (int64_t)1 << 20},
    {"gib", (int64_t)1 << 30},
    {"tib", (int64_t)1 << 40},
};

sr_status sr__parse_bytes(const char *s, int64_t *out)
{
    if (!s || !out)
        return SR_EINVAL;
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return SR_EINVAL; /* no sign, no empty number */
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return SR_EOVERFLOW;
    while (isspace((unsigned char)*end))
        end++;
    size_t len = strlen(end);
    while (len > 0 && isspace((unsigned char)end[len - 1]))
        len--;
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        if (strlen(units[u].name) != len || strncasecmp(end, units[u].name, len) != 0)
            continue;
        if (v > (unsigned long long)(INT64_MAX / units[u].mult))
            return SR_EOVERFLOW;
        *out = (int64_t)v * units[u].mult;
        return SR_OK;
    }
    return SR_EINVAL;
}

sr_status sr_ctx_set_mem_limit(sr_ctx *ctx, int64_t bytes)
{
    if (!ctx)
        return SR_EINVAL;
    if (bytes < 0)
        return sr__error(ctx, SR_EINVAL, "sr_ctx_set_mem_limit: the budget must be >= 0, not %lld",
                         (long long)bytes);
    ctx->mem_limit = bytes;
    return SR_OK;
}

int64_t sr_ctx_mem_limit(const sr_ctx *ctx) { return ctx ? ctx->mem_limit : 0; }

/* The reference interpreter's working set: a float64 slot per component of every node of the
 * formulas as given, and a row of reduction state and output. One thread. */
int64_t sr__reference_workspace(const sr_kernel *k)
{
    const sr_expr *roots[2] = {k->simp.f_user ? k->simp.f_user : k->f,
                               k->simp.f_user ? k->simp.weight_user : k->weight};
    int64_t slots = 0;
    for (int r = 0; r < 2; r++) {
        if (!roots[r])
            continue;
        size_t n = expr_toposort(roots[r], NULL, 0);
        const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
        if (!order)
            return 0;
        expr_toposort(roots[r], order, n);
        for (size_t t = 0; t < n; t++)
            slots += order[t]->dim;
        free(order);
    }
    int64_t kd = (int64_t)k->k * k->fdim, w = k->weight ? k->weight->dim : 0;
    return 8 * (slots + kd + w + k->fdim + 2 + k->out_dim) + 8 * (kd + k->out_dim) + 4 * k->fdim;
}

int64_t sr__kernel_workspace(const sr_kernel *k, int64_t *per_thread, int *threads)
{
    if (k->backend->workspace && k->backend_data)
        return k->backend->workspace(k, per_thread, threads);
    int64_t ws = sr__reference_workspace(k);
    if (per_thread)
        *per_thread = ws;
    if (threads)
        *threads = 1;
    return ws;
}

int64_t sr_kernel_workspace_bytes(const sr_kernel *k)
{
    return k ? sr__kernel_workspace(k, NULL, NULL) : 0;
}

int64_t sr__call_budget(const sr_kernel *k) { return k->ctx->mem_limit; }

sr_status sr__budget_check(sr_kernel *k)
{
    int64_t lim = k->budget;
    if (lim <= 0)
        return SR_OK;
    int64_t ws = sr__kernel_workspace(k, NULL, NULL);
    if (ws <= lim)
        return SR_OK;
    return sr__error(k->ctx, SR_EBUDGET,
                     "memory budget exceeded: the %s backend needs %lld bytes of workspace, the "
                     "budget is %lld bytes (SYMRED_MEM_LIMIT or sr_ctx_set_mem_limit)",
                     k->backend->name, (long long)ws, (long long)lim);
}

void sr__budget_explain(const sr_kernel *k, struct expr_buf *b)
{
    int64_t pt = 0;
    int nt = 1;
    int64_t ws = sr__kernel_workspace(k, &pt, &nt), lim = sr__call_budget(k);
    if (lim > 0)
        expr_buf_printf(b, "memory budget: %lld bytes\n", (long long)lim);
    else
        expr_buf_printf(b, "memory budget: unlimited\n");
    expr_buf_printf(b, "workspace: %lld bytes at most (%lld per thread x %d thread%s%s)\n",
                    (long long)ws, (long long)pt, nt, nt == 1 ? "" : "s",
                    ws > pt * nt ? ", plus the partial states of a split reduction" : "");
}
