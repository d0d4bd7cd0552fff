/*
 * options.c — a context's options: one table of the SYMRED_* variables that a context reads,
 * read from the environment once by sr_ctx_new and changed afterwards only by the setters
 * (sr_ctx_set_option, sr_ctx_set_mem_limit). Everything that decides how a kernel is planned,
 * compiled or run reads the context, never the environment, so a variable set after a context
 * was created does not change that context (docs/environment.md).
 */
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum opt_kind { OPT_INT, OPT_CHOICE, OPT_BYTES, OPT_STRING, OPT_CACHE_DIR };

static const char *const on_off[] = {"0", "1"};
static const char *const devices[] = {"auto", "cpu", "cuda", "reference"}; /* sr_device order */
static const char *const accs[] = {"block", "kahan", "f64"};               /* sr_acc - 1 */
_Static_assert(SR_DEVICE_AUTO == 0 && SR_DEVICE_CPU == 1 && SR_DEVICE_CUDA == 2 &&
                   SR_DEVICE_REFERENCE == 3,
               "devices[] spells sr_device in enum order");
_Static_assert(SR_ACC_BLOCK == 1 && SR_ACC_KAHAN == 2 && SR_ACC_F64 == 3,
               "accs[] spells sr_acc - 1");
static const char *const gemm_modes[] = {"auto", "on", "off"};
static const char *const gemm_kernels[] = {"auto", "avx512", "blis"};
static const char *const refine_modes[] = {"on", "off"};
static const char *const jit_modes[] = {"async", "sync", "off"}; /* enum sr_jit_mode */
_Static_assert(SR_JIT_ASYNC == 0 && SR_JIT_SYNC == 1 && SR_JIT_OFF == 2,
               "jit_modes[] spells enum sr_jit_mode in order");

/* One option: its variable, how its value is spelled, its default and where it lives in the
 * context. An alias row (SYMRED_BLIS) sets the field of the row before it, and is read from the
 * environment only where that one is unset. */
struct opt_row {
    const char *name;
    enum opt_kind kind;
    const char *const *choices; /* OPT_CHOICE: the spellings, field = the index */
    int nchoices;
    long lo, hi, dflt; /* OPT_INT range; dflt also for OPT_CHOICE */
    size_t off;        /* offset of the field in struct sr_ctx */
    size_t cap;        /* OPT_STRING, OPT_CACHE_DIR: the field's size */
    const char *str_dflt;
    bool alias;
};

#define CTX_OFF(field) offsetof(struct sr_ctx, field)
#define CHOICE(name, c, d, f)                                                                      \
    {                                                                                              \
        name, OPT_CHOICE, c, sizeof c / sizeof *c, 0, 0, d, CTX_OFF(f), 0, NULL, false             \
    }
#define INT(name, l, h, d, f)                                                                      \
    {                                                                                              \
        name, OPT_INT, NULL, 0, l, h, d, CTX_OFF(f), 0, NULL, false                                \
    }
#define STR(name, k, d, f)                                                                         \
    {                                                                                              \
        name, k, NULL, 0, 0, 0, 0, CTX_OFF(f), sizeof((sr_ctx *)0)->f, d, false                    \
    }

static const struct opt_row opt_rows[] = {
    INT("SYMRED_LOG", 0, 3, 0, log_level),
    INT("SYMRED_NUM_THREADS", 1, 100000, 0, num_threads),
    {"SYMRED_MEM_LIMIT", OPT_BYTES, NULL, 0, 0, 0, 0, CTX_OFF(mem_limit), 0, NULL, false},
    CHOICE("SYMRED_DEVICE", devices, SR_DEVICE_AUTO, opt.device),
    CHOICE("SYMRED_SIMPLIFY", on_off, 1, opt.simplify),
    STR("SYMRED_CC", OPT_STRING, "cc", opt.cc),
    CHOICE("SYMRED_ACC", accs, 0, opt.acc),
    CHOICE("SYMRED_JIT", jit_modes, SR_JIT_ASYNC, opt.jit),
    CHOICE("SYMRED_JIT_KEEP", on_off, 0, opt.jit_keep),
    /* Generous: a cold kernel compiles in well under a second, so only a hung compiler
     * reaches it. */
    INT("SYMRED_COMPILE_TIMEOUT", 1, 86400, 120, opt.compile_timeout),
    /* The in-memory module cache: enough for a program's working set of formulas, few
     * enough that a long-lived context does not keep thousands of objects mapped. */
    INT("SYMRED_JIT_IDLE_MODULES", 0, 1000000, 64, opt.jit_idle_modules),
    STR("SYMRED_CACHE_DIR", OPT_CACHE_DIR, "", opt.cache_dir),
    CHOICE("SYMRED_GEMM", gemm_modes, 0, opt.gemm),
    {"SYMRED_BLIS", OPT_CHOICE, gemm_modes, 3, 0, 0, 0, CTX_OFF(opt.gemm), 0, NULL, true},
    CHOICE("SYMRED_GEMM_KERNEL", gemm_kernels, 0, opt.gemm_kernel),
    CHOICE("SYMRED_GEMM_REFINE", refine_modes, 0, opt.gemm_refine),
};
#define NROWS ((int)(sizeof opt_rows / sizeof *opt_rows))

/* The variables read once per process, when the library they name is first needed: not
 * context options (sr_ctx_set_option says so). */
static const char *const process_vars[] = {"SYMRED_BLIS_LIB", "SYMRED_NVRTC", "SYMRED_LIBCUDA",
                                           "SYMRED_CUDA_DEVICE", "SYMRED_TILE_ISA"};

/* The kernel cache's default directory: $XDG_CACHE_HOME/symred (an absolute XDG_CACHE_HOME),
 * else $HOME/.cache/symred, else "" (no cache directory). */
static void default_cache_dir(char *dir, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(dir, cap, "%s/symred", xdg);
    else if (home && home[0])
        snprintf(dir, cap, "%s/.cache/symred", home);
    else
        dir[0] = '\0';
}

/* Sets row r's field from s (NULL or "" = the default); SR_EINVAL with a message naming the
 * variable, the value and what was expected, the field then holding the default. */
static sr_status opt_apply(sr_ctx *ctx, const struct opt_row *r, const char *s)
{
    char *field = (char *)ctx + r->off;
    bool unset = !s || !*s;
    switch (r->kind) {
    case OPT_INT: {
        *(int *)field = (int)r->dflt;
        if (unset)
            return SR_OK;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || *end || v < r->lo || v > r->hi)
            return sr__error(ctx, SR_EINVAL, "%s=%.100s: expected an integer in [%ld, %ld]",
                             r->name, s, r->lo, r->hi);
        *(int *)field = (int)v;
        return SR_OK;
    }
    case OPT_CHOICE: {
        *(int *)field = (int)r->dflt;
        if (r->off == CTX_OFF(opt.gemm))
            ctx->opt.gemm_var = r->name;
        if (unset)
            return SR_OK;
        for (int i = 0; i < r->nchoices; i++)
            if (strcmp(s, r->choices[i]) == 0) {
                *(int *)field = i;
                return SR_OK;
            }
        char list[200] = "";
        for (int i = 0; i < r->nchoices; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     r->choices[i]);
        return sr__error(ctx, SR_EINVAL, "%s=%.100s: expected one of %s", r->name, s, list);
    }
    case OPT_BYTES: {
        *(int64_t *)field = 0;
        if (unset)
            return SR_OK;
        int64_t v;
        sr_status st = sr__parse_bytes(s, &v);
        if (st == SR_OK) {
            *(int64_t *)field = v;
            return SR_OK;
        }
        return sr__error(ctx, SR_EINVAL,
                         "%s=%.100s: %s; expected a byte count such as 67108864, 64MB, 512KiB, "
                         "1GB or 2GiB (0 = unlimited)",
                         r->name, s, st == SR_EOVERFLOW ? "too large" : "not a byte count");
    }
    case OPT_STRING:
    case OPT_CACHE_DIR:
        if (!unset && strlen(s) >= r->cap) {
            snprintf(field, r->cap, "%s", r->str_dflt);
            return sr__error(ctx, SR_EINVAL, "%s=%.100s...: longer than %zu bytes", r->name, s,
                             r->cap - 1);
        }
        if (!unset)
            snprintf(field, r->cap, "%s", s);
        else if (r->kind == OPT_CACHE_DIR)
            default_cache_dir(field, r->cap);
        else
            snprintf(field, r->cap, "%s", r->str_dflt);
        return SR_OK;
    }
    return SR_OK;
}

/* Records a failure of reading the environment: the first one is what every sr_kernel_new of
 * the context reports (a malformed variable never silently means its default). */
static void env_failed(sr_ctx *ctx, const struct opt_row *r)
{
    if (ctx->env_status != SR_OK)
        return;
    ctx->env_status = SR_EINVAL;
    ctx->env_var = r->name;
    sr__error_get(ctx, ctx->env_msg, sizeof ctx->env_msg);
}

void sr__options_read(sr_ctx *ctx)
{
    for (int i = 0; i < NROWS; i++) {
        const struct opt_row *r = &opt_rows[i];
        const char *s = getenv(r->name);
        if (r->alias) {
            const char *main = getenv(opt_rows[i - 1].name);
            if ((main && *main) || !(s && *s))
                continue;
        }
        if (opt_apply(ctx, r, s) != SR_OK)
            env_failed(ctx, r);
    }
}

sr_status sr_ctx_set_option(sr_ctx *ctx, const char *name, const char *value)
{
    if (!ctx)
        return SR_EINVAL;
    if (!name)
        return sr__error(ctx, SR_EINVAL, "sr_ctx_set_option: name is NULL");
    for (int i = 0; i < NROWS; i++) {
        const struct opt_row *r = &opt_rows[i];
        if (strcmp(r->name, name) != 0)
            continue;
        const struct opt_row *field_row = r->alias ? r - 1 : r;
        sr_status st = opt_apply(ctx, r, value);
        /* A value set here replaces a malformed one read from the environment. */
        if (ctx->env_status != SR_OK &&
            (ctx->env_var == r->name || ctx->env_var == field_row->name)) {
            ctx->env_status = SR_OK;
            ctx->env_var = NULL;
        }
        return st;
    }
    for (size_t i = 0; i < sizeof process_vars / sizeof *process_vars; i++)
        if (strcmp(process_vars[i], name) == 0)
            return sr__error(ctx, SR_EINVAL,
                             "sr_ctx_set_option: %s is read once per process, from the "
                             "environment, when its library is first needed; it is not an option "
                             "of a context",
                             name);
    return sr__error(ctx, SR_EINVAL, "sr_ctx_set_option: no option named %.100s", name);
}
