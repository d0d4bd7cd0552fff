/*
 * test-formulas.c — the named formulas (sr_formula): each, as built and as simplified, against
 * its closed form at random pairs on the reference backend (which runs the formula it is given
 * when SYMRED_SIMPLIFY=0), and the builder's errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "symred.h"
#include "util.h"
#include "formulas/formulas.h"

static sr_ctx *ctx;
static void setup(void) { cr_assert_eq(sr_ctx_new(&ctx), SR_OK); }
static void teardown(void) { sr_ctx_free(ctx); }
TestSuite(formulas, .init = setup, .fini = teardown);

enum { D = 3, NI = 4, NJ = 5 };

/* The closed forms, from the comment of sr_formula in symred.h. */
static double closed(const char *name, const double *x, const double *y, double g)
{
    double r2 = 0, ip = 0, nx = 0, ny = 0, l1 = 0;
    for (int k = 0; k < D; k++) {
        r2 += (x[k] - y[k]) * (x[k] - y[k]);
        ip += x[k] * y[k];
        nx += x[k] * x[k];
        ny += y[k] * y[k];
        l1 += fabs(x[k] - y[k]);
    }
    double r = sqrt(r2);
    if (!strcmp(name, "gaussian") || !strcmp(name, "rbf"))
        return exp(-g * r2);
    if (!strcmp(name, "laplace") || !strcmp(name, "matern12"))
        return exp(-g * r);
    if (!strcmp(name, "matern32"))
        return (1 + sqrt(3.0) * g * r) * exp(-sqrt(3.0) * g * r);
    if (!strcmp(name, "matern52"))
        return (1 + sqrt(5.0) * g * r + 5.0 / 3.0 * g * g * r2) * exp(-sqrt(5.0) * g * r);
    if (!strcmp(name, "cauchy"))
        return 1 / (1 + g * r2);
    if (!strcmp(name, "imq"))
        return 1 / sqrt(1 + g * r2);
    if (!strcmp(name, "polynomial"))
        return pow(ip + 1, 3);
    if (!strcmp(name, "linear"))
        return ip;
    if (!strcmp(name, "cosine"))
        return ip / sqrt(nx) / sqrt(ny);
    return l1;
}

static void check_named(const char *name, bool simplify)
{
    sr_ctx_set_option(ctx, "SYMRED_SIMPLIFY", "0");
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D), *g = sr_pm(ctx, 2, 1);
    bool poly = !strcmp(name, "polynomial");
    sr_expr *f = sr_formula(ctx, name, x, y, poly ? sr_intcst(ctx, 3) : g);
    cr_assert_not_null(f, "%s: %s", name, sr_ctx_error(ctx));
    if (simplify)
        simp_expr(ctx, f, NULL, &f, NULL);
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, f, &desc, &k), SR_OK, "%s: %s", name, sr_ctx_error(ctx));
    double xv[NI * D], yv[NJ * D], gv = 0.7, out[NI];
    uint64_t rng = 17;
    tu_fill(xv, SR_F64, NI * D, -1.5, 1.5, &rng);
    tu_fill(yv, SR_F64, NJ * D, -1.5, 1.5, &rng);
    for (int j = 0; j < NJ; j++) {
        const void *args[3] = {xv, yv + D * j, &gv};
        cr_assert_eq(sr_kernel_run(k, NI, 1, args, out), SR_OK, "%s", sr_ctx_error(ctx));
        for (int i = 0; i < NI; i++) {
            double want = closed(name, xv + D * i, yv + D * j, gv);
            cr_assert(tu_close(out[i], want, 1e-12, 1e-12),
                      "%s (simplifier %s) at (%d,%d): %.17g, expected %.17g", name,
                      simplify ? "on" : "off", i, j, out[i], want);
        }
    }
    sr_kernel_free(k);
}

#define NAMED_TEST(n)                                                                              \
    Test(formulas, n)                                                                              \
    {                                                                                              \
        check_named(#n, true);                                                                     \
        check_named(#n, false);                                                                    \
    }
NAMED_TEST(gaussian)
NAMED_TEST(rbf)
NAMED_TEST(laplace)
NAMED_TEST(matern12)
NAMED_TEST(matern32)
NAMED_TEST(matern52)
NAMED_TEST(cauchy)
NAMED_TEST(imq)
NAMED_TEST(polynomial)
NAMED_TEST(linear)
NAMED_TEST(cosine)
NAMED_TEST(l1)

Test(formulas, gaussian_is_the_canonical_spelling)
{
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D), *g = sr_pm(ctx, 2, 1);
    char buf[256];
    sr_expr_print(sr_formula(ctx, "gaussian", x, y, g), buf, sizeof buf);
    cr_assert(strstr(buf, "Exp(") && strstr(buf, "SqDist("), "printed %s", buf);
}

Test(formulas, errors)
{
    sr_expr *x = sr_vi(ctx, 0, D), *y = sr_vj(ctx, 1, D), *g = sr_pm(ctx, 2, 1);
    cr_assert_null(sr_formula(ctx, "gausian", x, y, g));
    cr_assert(strstr(sr_ctx_error(ctx), "unknown formula \"gausian\""), "%s", sr_ctx_error(ctx));
    sr_kernel_desc desc = sr_kernel_desc_default();
    sr_kernel *k;
    cr_assert_eq(sr_kernel_new(ctx, NULL, &desc, &k), SR_EINVAL);
    cr_assert_null(sr_formula(ctx, "gaussian", x, sr_vj(ctx, 1, 4), g));
    cr_assert(strstr(sr_ctx_error(ctx), "dimensions 3 and 4"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_new(ctx, NULL, &desc, &k), SR_EDIM);
    cr_assert_null(sr_formula(ctx, "laplace", x, y, NULL));
    cr_assert(strstr(sr_ctx_error(ctx), "parameter is NULL"), "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_new(ctx, NULL, &desc, &k), SR_EINVAL);
    cr_assert_null(sr_formula(ctx, "cauchy", x, y, sr_pm(ctx, 3, 2)));
    cr_assert(strstr(sr_ctx_error(ctx), "dimension 1, not 2"), "%s", sr_ctx_error(ctx));
    cr_assert_null(sr_formula(ctx, NULL, x, y, g));
    /* param is optional where the formula has none */
    cr_assert_not_null(sr_formula(ctx, "linear", x, y, NULL));
    /* a NULL operand from an earlier failure propagates */
    cr_assert_null(sr_formula(ctx, "gaussian", NULL, y, g));
}
