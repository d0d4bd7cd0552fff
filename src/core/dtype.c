/*
 * dtype.c — the element types: conversions between float32 and the 16-bit dtypes (float16,
 * bfloat16), reading and writing a value of any dtype as a double, and the float32 copies
 * through which a float16 or bfloat16 kernel runs as the float32 kernel it is (sr_kernel.dtype
 * is SR_F32, sr_kernel.io the caller's dtype).
 *
 * The conversions are bit manipulations, exact in the widening direction and rounded to
 * nearest with ties to even in the narrowing one, with NaN kept a (quiet) NaN and overflow
 * going to infinity; they do not depend on the compiler having _Float16 or the CPU F16C.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float sr__f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0x1f) /* infinity or NaN: the payload moves up, a NaN stays a NaN */
        return u2f(sign | 0x7f800000u | (m << 13));
    if (e != 0) /* normal: rebias the exponent from 15 to 127 */
        return u2f(sign | ((e + 112) << 23) | (m << 13));
    /* zero or subnormal: m * 2^-24, exact in float32 */
    const float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
}

uint16_t sr__f32_to_f16(float f)
{
    const uint32_t u = f2u(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, with the top of the payload */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
    if (a >= 0x477ff000u) /* rounds to 65520 or beyond: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* below 2^-14: a subnormal or zero of float16, m * 2^-24. Adding 0.5 in float32 puts
         * the value's multiple of 2^-24 in the low mantissa bits, rounded to nearest even by the
         * addition itself. */
        const float v = u2f(a) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(f2u(v) - f2u(0.5f)));
    }
    /* normal: drop 13 mantissa bits, rounding to nearest even; a carry into the exponent is
     * the right result (up to infinity, excluded above) */
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float sr__bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t sr__f32_to_bf16(float f)
{
    const uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet */
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

double sr__dtype_get(sr_dtype t, const void *a, int64_t i)
{
    switch (t) {
    case SR_F64:
        return ((const double *)a)[i];
    case SR_F16:
        return sr__f16_to_f32(((const uint16_t *)a)[i]);
    case SR_BF16:
        return sr__bf16_to_f32(((const uint16_t *)a)[i]);
    default:
        return ((const float *)a)[i];
    }
}

void sr__dtype_put(sr_dtype t, void *a, int64_t i, double v)
{
    switch (t) {
    case SR_F64:
        ((double *)a)[i] = v;
        break;
    case SR_F16:
        ((uint16_t *)a)[i] = sr__f32_to_f16((float)v);
        break;
    case SR_BF16:
        ((uint16_t *)a)[i] = sr__f32_to_bf16((float)v);
        break;
    default:
        ((float *)a)[i] = (float)v;
        break;
    }
}

const char *sr__dtype_name(sr_dtype t)
{
    static const char *const names[] = {"float32", "float64", "float16", "bfloat16"};
    return (int)t >= 0 && t <= SR_BF16 ? names[t] : "unknown";
}

void sr__widen(sr_dtype t, const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    if (t == SR_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = sr__bf16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = sr__f16_to_f32(h[i]);
}

void sr__narrow(sr_dtype t, const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    if (t == SR_BF16)
        for (int64_t i = 0; i < n; i++)
            h[i] = sr__f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            h[i] = sr__f32_to_f16(src[i]);
}

sr_status sr__io_widen(const sr_kernel *k, int64_t nx, int64_t ny, const void *const *args,
                       int64_t nout, struct sr_io_copy *c)
{
    memset(c, 0, sizeof *c);
    int64_t total = nout, n;
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim || !args[v])
            continue;
        const int64_t rows = var->cat == SR_CAT_I ? nx : var->cat == SR_CAT_J ? ny : 1;
        if (!sr__size_mul(rows, var->dim, 1, &n) || __builtin_add_overflow(total, n, &total))
            return sr__error(k->ctx, SR_EOVERFLOW, "the float32 copies of the %s arrays overflow",
                             sr__dtype_name(k->io));
    }
    int64_t bytes;
    if (!sr__size_mul(total, sizeof(float), 1, &bytes))
        return sr__error(k->ctx, SR_EOVERFLOW, "the float32 copies of the %s arrays overflow",
                         sr__dtype_name(k->io));
    c->args = calloc((size_t)k->nargs + 1, sizeof *c->args);
    c->blob = malloc((size_t)bytes + 1);
    if (!c->args || !c->blob) {
        sr__io_free(c);
        return sr__error(k->ctx, SR_ENOMEM,
                         "out of memory for the float32 copies of the %s arrays (%lld bytes)",
                         sr__dtype_name(k->io), (long long)bytes);
    }
    float *p = c->blob;
    for (int v = 0; v < k->nargs; v++) {
        const struct expr_var *var = &k->vars[v];
        if (!var->dim || !args[v])
            continue;
        const int64_t rows = var->cat == SR_CAT_I ? nx : var->cat == SR_CAT_J ? ny : 1;
        sr__widen(k->io, args[v], p, rows * var->dim);
        c->args[v] = p;
        p += rows * var->dim;
    }
    c->out = p;
    return SR_OK;
}

void sr__io_free(struct sr_io_copy *c)
{
    free(c->args);
    free(c->blob);
    memset(c, 0, sizeof *c);
}
