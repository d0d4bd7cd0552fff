/*
 * test-api.c — bad arguments to every public function.
 *
 * Each test makes one kind of mistake, checks that the call returns an error status with a
 * message that names the problem (never a crash, an abort or a write), and then shows that the
 * context still works by building and running a small correct kernel in it (assert_usable).
 */
#define _POSIX_C_SOURCE 200809L

#include "util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static sr_ctx *ctx;

static void setup(void)
{
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_not_null(ctx);
}

static void teardown(void) { sr_ctx_free(ctx); }

TestSuite(api, .init = setup, .fini = teardown);

/* The status name for messages: "SR_EDIM". */
static const char *st_name(int st)
{
    switch (st) {
#define ST_CASE_(name, value, desc)                                                                \
    case value:                                                                                    \
        return "SR_" #name;
        SR_STATUS_MAP(ST_CASE_)
#undef ST_CASE_
    }
    return "(not a status)";
}

#define assert_status(got, want)                                                                   \
    do {                                                                                           \
        int got_ = (got), want_ = (want);                                                          \
        cr_assert_eq(got_, want_, "%s: got %s, want %s; message: \"%s\"", #got, st_name(got_),     \
                     st_name(want_), sr_ctx_error(ctx));                                           \
    } while (0)

/* The context's message contains needle. */
#define assert_msg_has(c, needle)                                                                  \
    do {                                                                                           \
        const char *m_ = sr_ctx_error(c);                                                          \
        cr_assert(m_ &&strstr(m_, needle), "message \"%s\" should mention \"%s\"", m_ ? m_ : "",   \
                  needle);                                                                         \
    } while (0)

/*
 * Builds and runs out_i = Sum_j SqDist(x_i, y_j) on 2 × 3 points of dimension 2 in c, on the
 * reference backend, and compares with the values worked out by hand: the proof that an earlier
 * failure left the context usable.
 */
static void assert_usable(sr_ctx *c)
{
    sr_expr *f = sr_sqdist(c, sr_vi(c, 0, 2), sr_vj(c, 1, 2));
    cr_assert_not_null(f, "building a correct formula failed: %s", sr_ctx_error(c));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(c, f, &desc, &k);
    cr_assert_eq(st, SR_OK, "sr_kernel_new on a correct formula: %s: %s", st_name(st),
                 sr_ctx_error(c));
    const double x[] = {0, 0, 1, 2};
    const double y[] = {1, 0, 0, 1, 3, 3};
    double out[2] = {-1, -1};
    const void *args[] = {x, y};
    st = sr_kernel_run(k, 2, 3, args, out);
    cr_assert_eq(st, SR_OK, "sr_kernel_run on a correct kernel: %s: %s", st_name(st),
                 sr_ctx_error(c));
    /* Row 0: 1 + 1 + 18; row 1: 4 + 2 + 5. */
    cr_assert(tu_close(out[0], 20.0, 1e-12, 0), "out[0] = %.17g, want 20", out[0]);
    cr_assert(tu_close(out[1], 11.0, 1e-12, 0), "out[1] = %.17g, want 11", out[1]);
    sr_kernel_free(k);
}

/* A kernel of the given reduction over SqDist (x_i, y_j of dimension 3), on the reference. */
static sr_kernel *make_kernel(sr_reduction red, int k)
{
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 3), sr_vj(ctx, 1, 3));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = red;
    desc.k = k;
    desc.device = SR_DEVICE_REFERENCE;
    sr_kernel *kern = NULL;
    sr_status st = sr_kernel_new(ctx, f, &desc, &kern);
    cr_assert_eq(st, SR_OK, "sr_kernel_new(%s): %s: %s", sr_reduction_name(red), st_name(st),
                 sr_ctx_error(ctx));
    return kern;
}

static sr_status new_kernel(const sr_expr *f, sr_kernel_desc desc, sr_kernel **out)
{
    *out = (sr_kernel *)&desc; /* must be overwritten with NULL on failure */
    return sr_kernel_new(ctx, f, &desc, out);
}

/* ---- context, status strings, reduction names ---- */

Test(api, ctx_new_null_out)
{
    assert_status(sr_ctx_new(NULL), SR_EINVAL);
    sr_ctx_free(NULL); /* a no-op */
    sr_kernel_free(NULL);
    assert_usable(ctx);
}

Test(api, ctx_error_null_and_fresh)
{
    const char *m = sr_ctx_error(NULL);
    cr_assert_not_null(m);
    cr_assert_gt(strlen(m), 0, "sr_ctx_error(NULL) should explain itself");
    cr_assert_str_empty(sr_ctx_error(ctx), "a fresh context has message \"%s\"", sr_ctx_error(ctx));
    cr_assert_str_eq(sr_version(), SYMRED_VERSION_STRING);
}

Test(api, status_str_every_code)
{
#define CHECK_STR_(name, value, desc)                                                              \
    cr_assert_str_eq(sr_status_str(SR_##name), desc, "sr_status_str(SR_%s) = \"%s\"", #name,       \
                     sr_status_str(SR_##name));
    SR_STATUS_MAP(CHECK_STR_)
#undef CHECK_STR_
    const int unknown[] = {1, -14, -1000, 42, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++)
        cr_assert_str_eq(sr_status_str(unknown[i]), "unknown status", "sr_status_str(%d) = \"%s\"",
                         unknown[i], sr_status_str(unknown[i]));
}

Test(api, reduction_names_round_trip)
{
    static const char *const names[] = {
#define NAME_(name, keops) keops,
        SR_REDUCTION_MAP(NAME_)
#undef NAME_
    };
    for (int r = 0; r < SR_REDUCTION_COUNT; r++) {
        const char *n = sr_reduction_name((sr_reduction)r);
        cr_assert_not_null(n, "sr_reduction_name(%d) is NULL", r);
        cr_assert_str_eq(n, names[r]);
        sr_reduction back = (sr_reduction)-1;
        assert_status(sr_reduction_from_name(n, &back), SR_OK);
        cr_assert_eq((int)back, r, "%s -> %d, want %d", n, (int)back, r);
    }
    cr_assert_null(sr_reduction_name(SR_REDUCTION_COUNT));
    cr_assert_null(sr_reduction_name((sr_reduction)-1));
    sr_reduction r = SR_SUM;
    assert_status(sr_reduction_from_name("sum", &r), SR_EINVAL); /* case-sensitive */
    assert_status(sr_reduction_from_name("", &r), SR_EINVAL);
    assert_status(sr_reduction_from_name(NULL, &r), SR_EINVAL);
    assert_status(sr_reduction_from_name("Sum", NULL), SR_EINVAL);
    assert_usable(ctx);
}

/* ---- parsing ---- */

Test(api, parse_null_ctx)
{
    const char *al[] = {"x=Vi(3)"};
    sr_expr *e = (sr_expr *)&e;
    assert_status(sr_parse(NULL, "SqNorm2(x)", al, 1, &e), SR_EINVAL);
    cr_assert_null(e, "*out must be NULL on failure");
    assert_usable(ctx);
}

Test(api, parse_null_formula)
{
    sr_expr *e = (sr_expr *)&e;
    sr_status st = sr_parse(ctx, NULL, NULL, 0, &e);
    cr_assert(st == SR_EINVAL || st == SR_EPARSE, "sr_parse(NULL formula) gave %s", st_name(st));
    cr_assert_null(e);
    cr_assert_gt(strlen(sr_ctx_error(ctx)), 0, "no message");
    assert_usable(ctx);
}

Test(api, parse_null_out)
{
    const char *al[] = {"x=Vi(3)"};
    sr_status st = sr_parse(ctx, "SqNorm2(x)", al, 1, NULL);
    cr_assert(st == SR_EINVAL, "sr_parse(out = NULL) gave %s", st_name(st));
    assert_usable(ctx);
}

Test(api, parse_bad_alias_arrays)
{
    sr_expr *e = (sr_expr *)&e;
    /* naliases > 0 with no array, a negative count, and a NULL entry */
    sr_status st = sr_parse(ctx, "SqNorm2(x)", NULL, 1, &e);
    cr_assert(st == SR_EINVAL || st == SR_EPARSE, "aliases NULL, naliases 1: %s", st_name(st));
    cr_assert_null(e);
    const char *al[] = {"x=Vi(3)"};
    e = (sr_expr *)&e;
    st = sr_parse(ctx, "SqNorm2(x)", al, -1, &e);
    cr_assert(st == SR_EINVAL || st == SR_EPARSE, "naliases -1: %s", st_name(st));
    cr_assert_null(e);
    const char *al2[] = {"x=Vi(3)", NULL};
    e = (sr_expr *)&e;
    st = sr_parse(ctx, "SqNorm2(x)", al2, 2, &e);
    cr_assert(st == SR_EINVAL || st == SR_EPARSE, "a NULL alias: %s", st_name(st));
    cr_assert_null(e);
    assert_usable(ctx);
}

Test(api, parse_error_then_parse_and_run)
{
    const char *al[] = {"x=Vi(2)", "y=Vj(2)"};
    sr_expr *e = (sr_expr *)&e;
    assert_status(sr_parse(ctx, "SqDist(x,y", al, 2, &e), SR_EPARSE);
    cr_assert_null(e);
    cr_assert_gt(strlen(sr_ctx_error(ctx)), 0, "a parse error needs a message");
    e = (sr_expr *)&e;
    assert_status(sr_parse(ctx, "SqDist(x,z)", al, 2, &e), SR_EPARSE);
    assert_msg_has(ctx, "z");
    /* The same context parses the correct formula, and gets the builders' node. */
    assert_status(sr_parse(ctx, "SqDist(x,y)", al, 2, &e), SR_OK);
    cr_assert_eq(e, sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2)),
                 "parsed and built formulas should be the same node");
    assert_usable(ctx);
}

Test(api, parse_dim_error)
{
    const char *al[] = {"x=Vi(3)", "y=Vj(2)"};
    sr_expr *e = (sr_expr *)&e;
    assert_status(sr_parse(ctx, "SqDist(x,y)", al, 2, &e), SR_EDIM);
    cr_assert_null(e);
    assert_msg_has(ctx, "SqDist");
    assert_usable(ctx);
}

/* ---- builders ---- */

Test(api, builders_null_ctx)
{
    cr_assert_null(sr_vi(NULL, 0, 3));
    cr_assert_null(sr_const(NULL, 1.0));
    sr_expr *x = sr_vi(ctx, 0, 3);
    cr_assert_null(sr_exp(NULL, x));
    cr_assert_null(sr_add(NULL, x, x));
    cr_assert_null(sr_clamp(NULL, x, x, x));
    assert_usable(ctx);
}

Test(api, builders_bad_leaves)
{
    cr_assert_null(sr_vi(ctx, -1, 3));
    assert_status(sr_kernel_new(ctx, NULL, &(sr_kernel_desc){0}, &(sr_kernel *){NULL}), SR_EINVAL);
    assert_msg_has(ctx, "index -1");
    cr_assert_null(sr_vj(ctx, 0, 0));
    assert_msg_has(ctx, "dimension 0");
    cr_assert_null(sr_var(ctx, 0, 3, (sr_cat)7));
    assert_msg_has(ctx, "category 7");
    cr_assert_null(sr_const(ctx, NAN));
    cr_assert_null(sr_const(ctx, INFINITY));
    cr_assert_null(sr_ratcst(ctx, 1, 0));
    assert_msg_has(ctx, "denominator");
    assert_usable(ctx);
}

Test(api, builder_chain_reports_first_failure)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 2);
    /* Add fails (3 vs 2); every builder after it gets NULL and passes it on. */
    sr_expr *f = sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, sr_sum(ctx, sr_add(ctx, x, y)), x)));
    cr_assert_null(f);
    sr_kernel *k = (sr_kernel *)&k;
    sr_kernel_desc desc = sr_kernel_desc_default();
    assert_status(sr_kernel_new(ctx, f, &desc, &k), SR_EDIM);
    cr_assert_null(k, "*out must be NULL on failure");
    assert_msg_has(ctx, "Add");
    assert_msg_has(ctx, "3");
    assert_msg_has(ctx, "2");
    /* The pending failure was consumed: a second NULL formula is a plain EINVAL. */
    assert_status(sr_kernel_new(ctx, NULL, &desc, &k), SR_EINVAL);
    assert_usable(ctx);
}

Test(api, builder_dim_errors_name_the_op)
{
    sr_expr *a = sr_vi(ctx, 0, 3), *b = sr_vj(ctx, 1, 4);
    cr_assert_null(sr_sqdist(ctx, a, b));
    assert_msg_has(ctx, "SqDist");
    cr_assert_null(sr_scalprod(ctx, a, b));
    assert_msg_has(ctx, "Scalprod");
    cr_assert_null(sr_elem(ctx, a, 3));
    assert_msg_has(ctx, "Elem");
    cr_assert_null(sr_extract(ctx, a, 2, 2));
    assert_msg_has(ctx, "Extract");
    cr_assert_null(sr_matvecmult(ctx, sr_vi(ctx, 0, 7), sr_vj(ctx, 1, 3)));
    assert_msg_has(ctx, "MatVecMult");
    cr_assert_null(sr_onehot(ctx, a, 4));
    assert_msg_has(ctx, "OneHot");
    cr_assert_null(sr_weightedsqdist(ctx, sr_pm(ctx, 2, 2), a, sr_vj(ctx, 1, 3)));
    assert_msg_has(ctx, "WeightedSqDist");
    assert_usable(ctx);
}

Test(api, expressions_from_another_context)
{
    sr_ctx *other = NULL;
    cr_assert_eq(sr_ctx_new(&other), SR_OK);
    sr_expr *x = sr_vi(ctx, 0, 3);
    sr_expr *y = sr_vj(other, 1, 3);
    cr_assert_null(sr_sqdist(ctx, x, y));
    assert_msg_has(ctx, "another context");
    /* A formula from other given to a kernel of ctx. */
    sr_expr *fo = sr_sqnorm2(other, y);
    sr_kernel *k = NULL;
    sr_kernel_desc desc = sr_kernel_desc_default();
    assert_status(sr_kernel_new(ctx, fo, &desc, &k), SR_EINVAL);
    assert_msg_has(ctx, "another context");
    cr_assert_null(k);
    /* And as the weight of SumSoftMaxWeight. */
    desc.reduction = SR_SUMSOFTMAXWEIGHT;
    desc.weight = fo;
    assert_status(sr_kernel_new(ctx, sr_sqnorm2(ctx, x), &desc, &k), SR_EINVAL);
    assert_msg_has(ctx, "another context");
    cr_assert_null(k);
    assert_usable(ctx);
    assert_usable(other);
    sr_ctx_free(other);
}

Test(api, one_index_two_dims)
{
    /* Index 0 as Vi(3) and as Vi(2): each node is fine, the kernel is not. */
    sr_expr *f = sr_add(ctx, sr_sqnorm2(ctx, sr_vi(ctx, 0, 3)), sr_sqnorm2(ctx, sr_vi(ctx, 0, 2)));
    cr_assert_not_null(f);
    sr_kernel *k = NULL;
    assert_status(new_kernel(f, sr_kernel_desc_default(), &k), SR_EDIM);
    cr_assert_null(k);
    assert_msg_has(ctx, "index 0");
    /* And index 1 as Vi and as Vj. */
    f = sr_add(ctx, sr_sqnorm2(ctx, sr_vi(ctx, 1, 3)), sr_sqnorm2(ctx, sr_vj(ctx, 1, 3)));
    assert_status(new_kernel(f, sr_kernel_desc_default(), &k), SR_EDIM);
    assert_msg_has(ctx, "index 1");
    assert_usable(ctx);
}

Test(api, expr_queries_on_null)
{
    char buf[8] = "xxxxxxx";
    cr_assert_eq(sr_expr_print(NULL, buf, sizeof buf), 0);
    cr_assert_eq(sr_expr_print(NULL, NULL, 0), 0);
    cr_assert_eq(sr_expr_dim(NULL), 0);
    cr_assert_eq(sr_expr_category(NULL), SR_DEP_CONST);
    assert_usable(ctx);
}

/* ---- kernel creation ---- */

Test(api, kernel_new_null_arguments)
{
    sr_expr *f = sr_sqnorm2(ctx, sr_vi(ctx, 0, 3));
    sr_kernel_desc desc = sr_kernel_desc_default();
    sr_kernel *k = (sr_kernel *)&k;
    assert_status(sr_kernel_new(NULL, f, &desc, &k), SR_EINVAL);
    cr_assert_null(k);
    assert_status(sr_kernel_new(ctx, f, &desc, NULL), SR_EINVAL);
    k = (sr_kernel *)&k;
    assert_status(sr_kernel_new(ctx, f, NULL, &k), SR_EINVAL);
    cr_assert_null(k);
    assert_msg_has(ctx, "desc");
    assert_status(sr_kernel_new(ctx, NULL, &desc, &k), SR_EINVAL);
    assert_msg_has(ctx, "NULL");
    assert_usable(ctx);
}

Test(api, kernel_new_bad_desc_fields)
{
    sr_expr *f = sr_sqnorm2(ctx, sr_vi(ctx, 0, 3));
    sr_kernel *k = NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_REDUCTION_COUNT;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "reduction");
    d.reduction = (sr_reduction)-1;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    d = sr_kernel_desc_default();
    d.axis = 2;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "axis");
    d.axis = -1;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    d = sr_kernel_desc_default();
    d.dtype = (sr_dtype)4;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "dtype");
    d = sr_kernel_desc_default();
    d.device = (sr_device)4;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "device");
    d.device = (sr_device)-1;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    cr_assert_null(k);
    assert_usable(ctx);
}

Test(api, kernel_new_cuda_without_gpu)
{
    sr_expr *f = sr_sqnorm2(ctx, sr_vi(ctx, 0, 3));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CUDA;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    if (st == SR_OK) {
        /* A machine with a GPU and a CUDA backend: nothing to check here. */
        sr_kernel_free(k);
    } else {
        assert_status(st, SR_ENODEV);
        cr_assert_null(k);
        const char *m = sr_ctx_error(ctx);
        cr_assert(strstr(m, "cuda") || strstr(m, "CUDA"), "message \"%s\" should name CUDA", m);
    }
    assert_usable(ctx);
}

Test(api, kernel_new_bad_symred_device_env)
{
    cr_assert_eq(setenv("SYMRED_DEVICE", "tpu", 1), 0);
    sr_ctx *c;
    cr_assert_eq(sr_ctx_new(&c), SR_OK);
    unsetenv("SYMRED_DEVICE");
    sr_expr *f = sr_sqnorm2(c, sr_vi(c, 0, 3));
    sr_kernel *k = NULL;
    sr_kernel_desc d = sr_kernel_desc_default();
    assert_status(sr_kernel_new(c, f, &d, &k), SR_EINVAL);
    assert_msg_has(c, "SYMRED_DEVICE");
    assert_msg_has(c, "tpu");
    cr_assert_null(k);
    sr_ctx_free(c);
    /* The same value given to the setter is refused at once, the context staying usable. */
    assert_status(sr_ctx_set_option(ctx, "SYMRED_DEVICE", "tpu"), SR_EINVAL);
    assert_msg_has(ctx, "SYMRED_DEVICE");
    assert_usable(ctx);
}

Test(api, kernel_new_bad_k)
{
    sr_expr *f = sr_sqnorm2(ctx, sr_vi(ctx, 0, 3));
    const sr_reduction kreds[] = {SR_KMIN, SR_ARGKMIN, SR_KMIN_ARGKMIN};
    const int bad[] = {0, -1, -1000, INT32_MIN, (1 << 20) + 1, INT32_MAX};
    for (size_t r = 0; r < 3; r++)
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            sr_kernel_desc d = sr_kernel_desc_default();
            d.reduction = kreds[r];
            d.k = bad[i];
            sr_kernel *k = NULL;
            sr_status st = new_kernel(f, d, &k);
            cr_assert_eq(st, SR_EINVAL, "%s with k = %d: %s", sr_reduction_name(kreds[r]), bad[i],
                         st_name(st));
            cr_assert_null(k);
            assert_msg_has(ctx, sr_reduction_name(kreds[r]));
        }
    /* k is ignored by the other reductions. */
    sr_kernel_desc d = sr_kernel_desc_default();
    d.k = -5;
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k = NULL;
    assert_status(new_kernel(f, d, &k), SR_OK);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, kernel_new_weight_rules)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3);
    sr_expr *f = sr_neg(ctx, sr_sqdist(ctx, x, y));
    sr_kernel *k = NULL;
    /* A weight given to a reduction that takes none. */
    sr_kernel_desc d = sr_kernel_desc_default();
    d.weight = y;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "weight");
    d.reduction = SR_LOGSUMEXP;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    /* SumSoftMaxWeight without its weight. */
    d = sr_kernel_desc_default();
    d.reduction = SR_SUMSOFTMAXWEIGHT;
    assert_status(new_kernel(f, d, &k), SR_EINVAL);
    assert_msg_has(ctx, "weight");
    /* ... and with a vector F. */
    d.weight = y;
    assert_status(new_kernel(sr_sub(ctx, x, y), d, &k), SR_EDIM);
    assert_msg_has(ctx, "dimension 1");
    cr_assert_null(k);
    /* The correct one: out_dim is the weight's dimension. */
    d.device = SR_DEVICE_REFERENCE;
    assert_status(new_kernel(f, d, &k), SR_OK);
    cr_assert_eq(sr_kernel_out_dim(k), 3);
    sr_kernel_free(k);
    assert_usable(ctx);
}

/* sr_kernel_var states each variable's category and dimension, an unused index as dim 0, and
 * refuses a NULL kernel or an index out of range; a gradient kernel's variables (which the
 * caller did not build) read the same way. */
Test(api, kernel_var)
{
    /* Sum_j Exp(-g |x_i - y_j|^2) b_j, with index 2 unused. */
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *g = sr_pm(ctx, 3, 1),
            *b = sr_vj(ctx, 4, 2);
    sr_expr *f = sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, g, sr_sqdist(ctx, x, y)))), b);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_REFERENCE;
    sr_kernel *k = NULL;
    assert_status(new_kernel(f, d, &k), SR_OK);
    cr_assert_eq(sr_kernel_nargs(k), 5);
    const sr_cat want_cat[5] = {SR_CAT_I, SR_CAT_J, SR_CAT_I, SR_CAT_PARAM, SR_CAT_J};
    const int want_dim[5] = {3, 3, 0, 1, 2};
    for (int v = 0; v < 5; v++) {
        sr_cat cat = (sr_cat)-1;
        int dim = -1;
        assert_status(sr_kernel_var(k, v, &cat, &dim), SR_OK);
        cr_assert_eq(cat, want_cat[v], "variable %d: category %d, want %d", v, cat, want_cat[v]);
        cr_assert_eq(dim, want_dim[v], "variable %d: dim %d, want %d", v, dim, want_dim[v]);
    }
    int dim = 7;
    assert_status(sr_kernel_var(k, 4, NULL, &dim), SR_OK); /* either pointer may be NULL */
    cr_assert_eq(dim, 2);
    assert_status(sr_kernel_var(k, 1, NULL, NULL), SR_OK);
    sr_cat cat = SR_CAT_PARAM;
    dim = 7;
    const int bad[] = {-1, 5, 1 << 30};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_status(sr_kernel_var(k, bad[i], &cat, &dim), SR_EINVAL);
        cr_assert(cat == SR_CAT_PARAM && dim == 7, "index %d: outputs written", bad[i]);
    }
    assert_status(sr_kernel_var(NULL, 0, &cat, &dim), SR_EINVAL);
    cr_assert(cat == SR_CAT_PARAM && dim == 7);
    /* The gradient with respect to x reads one more array: the incoming gradient, an
     * i-variable of the output's dimension (2). */
    sr_kernel *gk = NULL;
    assert_status(sr_kernel_grad(k, 0, &gk), SR_OK);
    int n = sr_kernel_nargs(gk);
    cr_assert_eq(n, 6, "gradient kernel: %d arrays", n);
    assert_status(sr_kernel_var(gk, 5, &cat, &dim), SR_OK);
    cr_assert(cat == SR_CAT_I && dim == 2, "incoming gradient: cat %d dim %d", cat, dim);
    sr_kernel_free(gk);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, kernel_queries_on_null)
{
    cr_assert_eq(sr_kernel_nargs(NULL), 0);
    cr_assert_eq(sr_kernel_out_dim(NULL), 0);
    const char *e = sr_kernel_explain(NULL);
    cr_assert_not_null(e);
    sr_kernel_desc d = sr_kernel_desc_default();
    cr_assert_eq(d.reduction, SR_SUM);
    cr_assert_eq(d.axis, 1);
    cr_assert_eq(d.dtype, SR_F32);
    cr_assert_eq(d.device, SR_DEVICE_AUTO);
    cr_assert_null(d.weight);
    assert_usable(ctx);
}

/* ---- running ---- */

Test(api, run_null_kernel)
{
    float out[1];
    assert_status(sr_kernel_run(NULL, 1, 1, NULL, out), SR_EINVAL);
    sr_run_desc r = {.nx = 1, .ny = 1};
    assert_status(sr_kernel_run_ex(NULL, &r), SR_EINVAL);
    sr_kernel *k = make_kernel(SR_SUM, 1);
    assert_status(sr_kernel_run_ex(k, NULL), SR_EINVAL);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_negative_sizes)
{
    sr_kernel *k = make_kernel(SR_SUM, 1);
    float x[6] = {0}, y[6] = {0}, out[2] = {7, 7};
    const void *args[] = {x, y};
    assert_status(sr_kernel_run(k, -1, 2, args, out), SR_EINVAL);
    assert_msg_has(ctx, "-1");
    assert_status(sr_kernel_run(k, 2, -5, args, out), SR_EINVAL);
    assert_msg_has(ctx, "-5");
    assert_status(sr_kernel_run(k, INT64_MIN, INT64_MIN, args, out), SR_EINVAL);
    cr_assert(out[0] == 7 && out[1] == 7, "a failed run wrote to out: %g %g", out[0], out[1]);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_null_arrays)
{
    sr_kernel *k = make_kernel(SR_SUM, 1);
    float x[6] = {0}, y[6] = {0}, out[2];
    assert_status(sr_kernel_run(k, 2, 2, NULL, out), SR_EINVAL);
    assert_msg_has(ctx, "args");
    const void *args0[] = {NULL, y};
    assert_status(sr_kernel_run(k, 2, 2, args0, out), SR_EINVAL);
    assert_msg_has(ctx, "argument 0");
    const void *args1[] = {x, NULL};
    assert_status(sr_kernel_run(k, 2, 2, args1, out), SR_EINVAL);
    assert_msg_has(ctx, "argument 1");
    const void *args[] = {x, y};
    assert_status(sr_kernel_run(k, 2, 2, args, NULL), SR_EINVAL);
    assert_msg_has(ctx, "output");
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_null_outputs_of_two_output_reductions)
{
    sr_kernel *k = make_kernel(SR_KMIN_ARGKMIN, 2);
    float x[6] = {0}, y[9] = {0}, vals[4];
    int64_t idx[4];
    const void *args[] = {x, y};
    sr_run_desc r = {.nx = 2, .ny = 3, .nargs = 2, .args = args, .out = NULL, .out_idx = idx};
    assert_status(sr_kernel_run_ex(k, &r), SR_EINVAL);
    assert_msg_has(ctx, "value output");
    r.out = vals;
    r.out_idx = NULL;
    assert_status(sr_kernel_run_ex(k, &r), SR_EINVAL);
    assert_msg_has(ctx, "index output");
    sr_kernel_free(k);
    k = make_kernel(SR_ARGKMIN, 2);
    r.out = vals; /* the value output of a pure index reduction is ignored */
    r.out_idx = NULL;
    assert_status(sr_kernel_run_ex(k, &r), SR_EINVAL);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_ex_wrong_nargs)
{
    sr_kernel *k = make_kernel(SR_SUM, 1);
    cr_assert_eq(sr_kernel_nargs(k), 2);
    float x[6] = {0}, y[6] = {0}, z[6] = {0}, out[2];
    const void *args[] = {x, y, z};
    const int bad[] = {0, 1, 3, -1};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sr_run_desc r = {.nx = 2, .ny = 2, .nargs = bad[i], .args = args, .out = out};
        sr_status st = sr_kernel_run_ex(k, &r);
        cr_assert_eq(st, SR_EINVAL, "nargs = %d: %s", bad[i], st_name(st));
        assert_msg_has(ctx, "2 arrays");
    }
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_k_larger_than_ny)
{
    sr_kernel *k = make_kernel(SR_ARGKMIN, 5);
    float x[6] = {0}, y[12] = {0};
    int64_t idx[10] = {0};
    const void *args[] = {x, y};
    assert_status(sr_kernel_run(k, 2, 4, args, idx), SR_EINVAL);
    assert_msg_has(ctx, "k = 5");
    for (int i = 0; i < 10; i++)
        cr_assert_eq(idx[i], 0, "a failed run wrote idx[%d] = %lld", i, (long long)idx[i]);
    sr_kernel_free(k);
    assert_usable(ctx);
}

Test(api, run_sizes_that_overflow)
{
    /* Nothing is allocated or read: the byte counts are checked before any memory is touched,
     * so small arrays stand in for the impossible ones. */
    sr_kernel *k = make_kernel(SR_SUM, 1);
    float x[3] = {0}, y[3] = {0}, out[1];
    const void *args[] = {x, y};
    assert_status(sr_kernel_run(k, INT64_MAX / 2, 1, args, out), SR_EOVERFLOW);
    assert_msg_has(ctx, "argument 0");
    assert_status(sr_kernel_run(k, 1, INT64_MAX / 2, args, out), SR_EOVERFLOW);
    assert_msg_has(ctx, "argument 1");
    assert_status(sr_kernel_run(k, INT64_MAX, INT64_MAX, args, out), SR_EOVERFLOW);
    sr_kernel_free(k);
    /* The output alone can overflow: 8-byte indices, K of them per row, while the arrays of
     * dimension 1 still fit. */
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 1), sr_vj(ctx, 1, 1));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = SR_ARGKMIN;
    d.k = 4;
    d.device = SR_DEVICE_REFERENCE;
    assert_status(new_kernel(f, d, &k), SR_OK);
    int64_t idx[4];
    const void *pargs[] = {x, y};
    assert_status(sr_kernel_run(k, INT64_MAX / 16, 8, pargs, idx), SR_EOVERFLOW);
    assert_msg_has(ctx, "output");
    sr_kernel_free(k);
    assert_usable(ctx);
}

/* The other entry points that take sizes: a size error, never an allocation that wraps. */
Test(api, entry_points_sizes_that_overflow)
{
    const int64_t huge = ((int64_t)1 << 61) + 1;
    sr_kernel *k = make_kernel(SR_SUM, 1);
    float x[3] = {0}, y[3] = {0}, out[3];
    const void *args[] = {x, y};
    assert_status(sr_kernel_eval_block(k, huge, 1, args, 0, 1, 0, 1, out), SR_EOVERFLOW);
    assert_msg_has(ctx, "argument 0");
    assert_status(sr_kernel_eval_block(k, huge, huge, args, 0, huge, 0, huge, out), SR_EOVERFLOW);
    /* A block outside the matrix whose end does not fit int64_t: the message gives the
     * offsets and counts as passed. */
    assert_status(sr_kernel_eval_block(k, 4, 4, args, INT64_MAX, INT64_MAX, 0, 1, out), SR_EINVAL);
    assert_msg_has(ctx, "9223372036854775807 rows from row 9223372036854775807");
    /* Ranges: block and interval counts whose plan would wrap. */
    int64_t r2[2] = {0, 1}, s1[1] = {1};
    sr_ranges R;
    memset(&R, 0, sizeof R);
    R.nranges_i = huge;
    R.ranges_i = r2;
    R.slices_i = s1;
    R.nredranges_j = 1;
    R.redranges_j = r2;
    sr_run_desc run = {.nx = 1, .ny = 1, .nargs = 2, .args = args, .out = out};
    assert_status(sr_kernel_run_ranges(k, &run, &R), SR_EOVERFLOW);
    R.nranges_i = 1;
    R.nredranges_j = huge;
    assert_status(sr_kernel_run_ranges(k, &run, &R), SR_EOVERFLOW);
    sr_kernel_free(k);
    /* A dense chain factor of rows x cols values of 8 bytes. */
    sr_chain *c = NULL;
    assert_status(sr_chain_new(ctx, SR_F64, &c), SR_OK);
    double m[1] = {0};
    assert_status(sr_chain_dense(c, huge, 1, m), SR_EOVERFLOW);
    assert_status(sr_chain_dense(c, (int64_t)1 << 31, (int64_t)1 << 31, m), SR_EOVERFLOW);
    sr_chain_free(c);
    assert_usable(ctx);
}

Test(api, run_two_output_reduction_needs_run_ex)
{
    const sr_reduction two[] = {SR_MIN_ARGMIN, SR_MAX_ARGMAX, SR_KMIN_ARGKMIN};
    for (size_t i = 0; i < 3; i++) {
        sr_kernel *k = make_kernel(two[i], 1);
        float x[3] = {0}, y[3] = {0}, out[1];
        const void *args[] = {x, y};
        assert_status(sr_kernel_run(k, 1, 1, args, out), SR_EINVAL);
        assert_msg_has(ctx, "sr_kernel_run_ex");
        assert_msg_has(ctx, sr_reduction_name(two[i]));
        sr_kernel_free(k);
    }
    assert_usable(ctx);
}

Test(api, run_empty_reductions_give_identities)
{
    /* Checked by the core before any backend runs, so every backend agrees. */
    sr_kernel *k = make_kernel(SR_SUM, 1);
    float x[6] = {0}, out[2] = {7, 7};
    const void *args[] = {x, NULL}; /* no j rows: the j array may be NULL */
    assert_status(sr_kernel_run(k, 2, 0, args, out), SR_OK);
    cr_assert(out[0] == 0 && out[1] == 0, "Sum over nothing: %g %g", out[0], out[1]);
    sr_kernel_free(k);
    k = make_kernel(SR_MIN_ARGMIN, 1);
    int64_t idx[2] = {7, 7};
    sr_run_desc r = {.nx = 2, .ny = 0, .nargs = 2, .args = args, .out = out, .out_idx = idx};
    assert_status(sr_kernel_run_ex(k, &r), SR_OK);
    cr_assert(isinf(out[0]) && out[0] > 0, "Min over nothing: %g", out[0]);
    cr_assert_eq(idx[1], -1, "ArgMin over nothing: %lld", (long long)idx[1]);
    /* No output rows: nothing to do, and the outputs and the i array may be NULL. */
    float y[15] = {0};
    const void *args2[] = {NULL, y};
    r = (sr_run_desc){.nx = 0, .ny = 5, .nargs = 2, .args = args2};
    assert_status(sr_kernel_run_ex(k, &r), SR_OK);
    sr_kernel_free(k);
    assert_usable(ctx);
}

/* How partial results combine, per reduction: the kind, and a partial reduction of the same kind
 * that writes what combining needs (values and indices for the selections). */
Test(api, reduction_combine)
{
    static const struct {
        sr_reduction r;
        sr_combine how;
        sr_reduction partial;
    } want[] = {
        {SR_SUM, SR_COMBINE_SUM, SR_SUM},
        {SR_MIN, SR_COMBINE_MIN, SR_MIN_ARGMIN},
        {SR_ARGMIN, SR_COMBINE_MIN, SR_MIN_ARGMIN},
        {SR_MIN_ARGMIN, SR_COMBINE_MIN, SR_MIN_ARGMIN},
        {SR_MAX, SR_COMBINE_MAX, SR_MAX_ARGMAX},
        {SR_ARGMAX, SR_COMBINE_MAX, SR_MAX_ARGMAX},
        {SR_MAX_ARGMAX, SR_COMBINE_MAX, SR_MAX_ARGMAX},
        {SR_KMIN, SR_COMBINE_KMIN, SR_KMIN_ARGKMIN},
        {SR_ARGKMIN, SR_COMBINE_KMIN, SR_KMIN_ARGKMIN},
        {SR_KMIN_ARGKMIN, SR_COMBINE_KMIN, SR_KMIN_ARGKMIN},
        {SR_LOGSUMEXP, SR_COMBINE_LSE, SR_LOGSUMEXP},
        {SR_SUMSOFTMAXWEIGHT, SR_COMBINE_SSW, SR_SUMSOFTMAXWEIGHT},
    };
    cr_assert_eq(sizeof want / sizeof *want, SR_REDUCTION_COUNT);
    for (size_t q = 0; q < sizeof want / sizeof *want; q++) {
        sr_combine how = (sr_combine)-1;
        sr_reduction partial = SR_REDUCTION_COUNT;
        cr_assert_eq(sr_reduction_combine(want[q].r, &how, &partial), SR_OK);
        cr_assert_eq(how, want[q].how, "%s", sr_reduction_name(want[q].r));
        cr_assert_eq(partial, want[q].partial, "%s", sr_reduction_name(want[q].r));
    }
    sr_combine how;
    sr_reduction partial;
    cr_assert_eq(sr_reduction_combine(SR_REDUCTION_COUNT, &how, &partial), SR_EINVAL);
    cr_assert_eq(sr_reduction_combine((sr_reduction)-1, &how, &partial), SR_EINVAL);
    cr_assert_eq(sr_reduction_combine(SR_SUM, NULL, &partial), SR_EINVAL);
    cr_assert_eq(sr_reduction_combine(SR_SUM, &how, NULL), SR_EINVAL);
}
