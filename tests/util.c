/* util.c — helpers shared by the Criterion tests. */
#define _GNU_SOURCE
#include "util.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tu_jit_cache(void)
{
    static char dir[4096];
    const char *t = getenv("SYMRED_TEST_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    if (t && *t)
        snprintf(dir, sizeof dir, "%s", t);
    else if (xdg && xdg[0] == '/')
        snprintf(dir, sizeof dir, "%s/symred-tests", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/symred-tests", home);
    else
        snprintf(dir, sizeof dir, "jit-test-cache");
    return dir;
}

uint64_t tu_rand(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

double tu_uniform(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * (double)(tu_rand(s) >> 11) * (1.0 / 9007199254740992.0);
}

void tu_fill(void *buf, sr_dtype dtype, int64_t n, double lo, double hi, uint64_t *s)
{
    for (int64_t i = 0; i < n; i++) {
        double v = tu_uniform(s, lo, hi);
        if (dtype == SR_F64)
            ((double *)buf)[i] = v;
        else
            ((float *)buf)[i] = (float)v;
    }
}

int tu_close(double a, double b, double rtol, double atol)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs(a - b) <= atol + rtol * fabs(b);
}

bool tu_blis_usable(void)
{
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    return h != NULL && !getenv("BLIS_ARCH_TYPE");
}

double tu_get(const void *buf, sr_dtype dtype, int64_t at)
{
    return dtype == SR_F64 ? ((const double *)buf)[at] : ((const float *)buf)[at];
}

void tu_set(void *buf, sr_dtype dtype, int64_t at, double v)
{
    if (dtype == SR_F64)
        ((double *)buf)[at] = v;
    else
        ((float *)buf)[at] = (float)v;
}

sr_plan_info tu_plan(const sr_kernel *k)
{
    sr_plan_info p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    if (sr_kernel_plan(k, &p) != SR_OK) {
        memset(&p, 0, sizeof p);
        p.strategy = p.inner = (sr_strategy)-1;
        p.name = p.backend = "(sr_kernel_plan failed)";
    }
    return p;
}

bool tu_runs_fused(const sr_kernel *k)
{
    sr_strategy s = tu_plan(k).inner;
    return s == SR_STRATEGY_FUSED || s == SR_STRATEGY_SYMMETRIC;
}

bool tu_runs_jit(const sr_kernel *k) { return strcmp(tu_plan(k).backend, "cpu-jit") == 0; }

const char *tu_formula(const sr_kernel *k, char *buf, size_t cap)
{
    const sr_expr *f = tu_plan(k).formula;
    buf[0] = 0;
    if (f && sr_expr_print(f, buf, cap) >= cap)
        snprintf(buf, cap, "(longer than %zu bytes)", cap);
    return buf;
}

const char *tu_strategy_name(const sr_kernel *k)
{
    const char *n = sr_strategy_name(tu_plan(k).strategy);
    return n ? n : "(none)";
}
