/*
 * symred.h — symbolic kernel reductions.
 *
 * symred computes reductions of the form
 *
 *     out_i = RED_{j = 0..ny-1}  F(x_i, y_j, p)        (axis 1: one result per row i)
 *     out_j = RED_{i = 0..nx-1}  F(x_i, y_j, p)        (axis 0: one result per column j)
 *
 * where F is a formula over per-row variables x_i ("Vi"), per-column variables y_j ("Vj") and
 * parameters p ("Pm"), and RED is a reduction (Sum, Min, ArgMin, K-min, LogSumExp, ...). The
 * nx × ny matrix F(x_i, y_j) is never built.
 *
 * The exact value of every op and reduction is specified in docs/semantics.md.
 *
 * Formulas are written as KeOps-style text and parsed with sr_parse(), or built with one
 * function per operation (sr_exp, sr_sqdist, ...). Expressions are immutable and hash-consed:
 * building the same formula twice in one context gives the same sr_expr pointer.
 *
 * Conventions
 *  - Every function that can fail returns sr_status (SR_OK = 0, errors negative). The detailed
 *    message of the last failure is sr_ctx_error(ctx). The library never aborts and never prints
 *    because of a user error, and a failing call leaves the context usable.
 *  - Expression builders return NULL on failure and when given a NULL operand, so a chain of
 *    builder calls is checked once at the end: sr_kernel_new() given a NULL expression returns
 *    the status and message of the first builder that failed.
 *  - Arrays are row-major and contiguous: a variable of dimension D over n rows is n*D values of
 *    the kernel's dtype; a parameter of dimension D is D values.
 *  - A context may be used by one thread at a time, except that a compiled sr_kernel is
 *    immutable and may be run concurrently from many threads.
 *
 * Worked example 1: Gaussian-process kernel mat-vec, out_i = sum_j exp(-g |x_i - y_j|^2) b_j.
 *
 *     sr_ctx *ctx;
 *     sr_expr *f;
 *     sr_kernel *k;
 *     const char *aliases[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)", "g=Pm(1)"};
 *     sr_ctx_new(&ctx);
 *     if (sr_parse(ctx, "Exp(-SqDist(x,y)*g)*b", aliases, 4, &f) != SR_OK)
 *         fprintf(stderr, "%s\n", sr_ctx_error(ctx));
 *     sr_kernel_desc desc = sr_kernel_desc_default();   // Sum over j, float32
 *     sr_kernel_new(ctx, f, &desc, &k);
 *     const void *args[] = {x, y, b, &g};                 // float x[nx*3], y[ny*3], b[ny], g
 *     sr_kernel_run(k, nx, ny, args, out);                // float out[nx]
 *     sr_kernel_free(k);
 *     sr_ctx_free(ctx);
 *
 * Worked example 2: the 10 nearest neighbours of each query q_i among points p_j, built with
 * the builder functions instead of text.
 *
 *     sr_expr *q = sr_vi(ctx, 0, 784), *p = sr_vj(ctx, 1, 784);
 *     sr_expr *d = sr_sqdist(ctx, q, p);                  // NULL if anything above failed
 *     sr_kernel_desc desc = sr_kernel_desc_default();
 *     desc.reduction = SR_ARGKMIN;
 *     desc.k = 10;
 *     if (sr_kernel_new(ctx, d, &desc, &k) != SR_OK)
 *         fprintf(stderr, "%s\n", sr_ctx_error(ctx));
 *     const void *args[] = {queries, points};
 *     sr_kernel_run(k, nq, np, args, idx);                // int64_t idx[nq*10], sorted
 */
#ifndef SYMRED_H
#define SYMRED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SYMRED_BUILDING) && defined(__GNUC__)
#define SR_API __attribute__((visibility("default")))
#else
#define SR_API
#endif

#define SYMRED_VERSION_MAJOR  0
#define SYMRED_VERSION_MINOR  1
#define SYMRED_VERSION_PATCH  0
#define SYMRED_VERSION_STRING "0.1.0"

/* Returns SYMRED_VERSION_STRING of the library actually loaded. */
SR_API const char *sr_version(void);

/* ---- Status codes ------------------------------------------------------------------------- */

/* X(name, value, description). One table: the enum and sr_status_str() come from it. */
#define SR_STATUS_MAP(X)                                                                           \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EPARSE, -3, "formula parse error")                                                           \
    X(EDIM, -4, "dimension mismatch")                                                              \
    X(EOVERFLOW, -5, "size overflow")                                                              \
    X(EBUDGET, -6, "memory budget exceeded")                                                       \
    X(ECOMPILE, -7, "kernel compilation failed")                                                   \
    X(ENODEV, -8, "device not available")                                                          \
    X(ENOTSUP, -9, "not supported")                                                                \
    X(EIO, -10, "input/output error")                                                              \
    X(EINTERNAL, -11, "internal error")                                                            \
    X(ENOCONV, -12, "no convergence")                                                              \
    X(ETIMEDOUT, -13, "timed out")

typedef enum sr_status {
#define SR_STATUS_ENUM_(name, value, desc) SR_##name = value,
    SR_STATUS_MAP(SR_STATUS_ENUM_)
#undef SR_STATUS_ENUM_
} sr_status;

/* A static description of a status ("dimension mismatch"); "unknown status" for other values.
 * Never NULL; thread-safe. */
SR_API const char *sr_status_str(int status);

/* ---- Opaque handles ----------------------------------------------------------------------- */

typedef struct sr_ctx sr_ctx;       /* owns expressions, kernels' compiled code, options, errors */
typedef struct sr_expr sr_expr;     /* an expression node; valid while its context lives */
typedef struct sr_kernel sr_kernel; /* a compiled reduction; immutable */

/* ---- Context ------------------------------------------------------------------------------ */

/* Creates a context. Its options are read from the environment (SYMRED_LOG, SYMRED_DEVICE,
 * SYMRED_GEMM, ...: docs/environment.md) here, once: a variable set or changed afterwards does
 * not affect this context (sr_ctx_set_option does), only contexts created later. A malformed
 * value does not fail this call: every sr_kernel_new of the context then fails with SR_EINVAL
 * naming the variable and its value. Returns SR_EINVAL if out is NULL, SR_ENOMEM on allocation
 * failure (then *out is NULL). */
SR_API sr_status sr_ctx_new(sr_ctx **out);

/* Frees the context and every expression built in it. Kernels created from it must have been
 * freed before. NULL is a no-op. */
SR_API void sr_ctx_free(sr_ctx *ctx);

/* The message of the last failure of a call on this context (or on one of its kernels), or ""
 * if none failed. The pointer stays valid until the next call on ctx from the same thread.
 * A NULL ctx gives a static message. */
SR_API const char *sr_ctx_error(const sr_ctx *ctx);

/* Sets the memory budget of the context: the most workspace, in bytes, that a kernel of this
 * context may use in one call (all its threads together: tiles, reduction states, partial
 * results of a split, BLIS packing buffers), not counting the caller's inputs and outputs.
 * 0 means unlimited. The initial value comes from SYMRED_MEM_LIMIT, a byte count with an
 * optional unit: "67108864", "64MB" (10^6), "512KiB" (2^10), "1GB", "2GiB" (2^30); a malformed
 * SYMRED_MEM_LIMIT makes every sr_kernel_new of the context fail with SR_EINVAL and a message
 * naming the variable and its value. Kernels are planned at creation under the budget in force
 * then (smaller tiles, fewer threads, no split of the reduced range), and sr_kernel_new fails
 * with SR_EBUDGET and the number of bytes it needs when even the smallest plan does not fit. A
 * kernel keeps its plan when the budget changes; its later calls run under the budget in force
 * at the call (fewer threads, or SR_EBUDGET from a call whose workspace grows with its sizes).
 * Returns SR_EINVAL for a NULL ctx or a negative value. Not thread-safe with other calls on ctx. */
SR_API sr_status sr_ctx_set_mem_limit(sr_ctx *ctx, int64_t bytes);

/* Sets one option of the context as the environment variable of that name would have at
 * sr_ctx_new: sr_ctx_set_option(ctx, "SYMRED_GEMM", "off"), ("SYMRED_DEVICE", "reference"),
 * ("SYMRED_MEM_LIMIT", "64MB"), ... with the variables and values of docs/environment.md that
 * sr_ctx_new reads. value NULL or "" gives the option its default (as an unset variable).
 * Kernels created afterwards follow it; kernels already created keep the options they were
 * planned with. Setting an option whose environment value was malformed clears that error.
 * Returns SR_EINVAL, with a message naming the option and the value, for a NULL ctx or name,
 * an unknown name, a variable read once per process (SYMRED_BLIS_LIB, SYMRED_NVRTC,
 * SYMRED_LIBCUDA, SYMRED_CUDA_DEVICE) or a malformed value (the option then has its default).
 * Not thread-safe with other calls on ctx. */
SR_API sr_status sr_ctx_set_option(sr_ctx *ctx, const char *name, const char *value);
/* The context's memory budget in bytes; 0 = unlimited (also for a NULL ctx). */
SR_API int64_t sr_ctx_mem_limit(const sr_ctx *ctx);

/* ---- Expressions -------------------------------------------------------------------------- */

/* Variable categories, numbered as KeOps' Var(index, dim, cat). */
typedef enum sr_cat { SR_CAT_I = 0, SR_CAT_J = 1, SR_CAT_PARAM = 2 } sr_cat;

/* What an expression depends on, reported by sr_expr_category(). */
typedef enum sr_category {
    SR_DEP_CONST = 0, /* constants only */
    SR_DEP_PARAM = 1, /* parameters (and constants) */
    SR_DEP_I = 2,     /* the row i (and maybe parameters) */
    SR_DEP_J = 3,     /* the column j (and maybe parameters) */
    SR_DEP_IJ = 4     /* the pair (i, j) */
} sr_category;

/* Parses a KeOps-style formula. aliases[0..naliases) are declarations such as "x=Vi(3)",
 * "y=Vj(3)", "b=Vj(2,1)" (explicit index 2, dimension 1), "g=Pm(1)" or "v=Var(1,3,1)". Aliases
 * without an explicit index are numbered in order of declaration; declared indices must form
 * 0..n-1 without gaps. The formula may also use Var(index, dim, cat) directly, with the
 * dimension and category of any alias that declares the same index (else SR_EDIM). The derivative
 * forms Grad(F, v, e), Diff(F, v, u), GradFromPos(F, v, I) and GradFromPos(F, pos, e) are
 * expanded while parsing (sr_grad, sr_diff, docs/gradients.md): *out is the expanded formula.
 * Nesting (parentheses, calls, unary minus, exponents) is limited to 200 levels.
 * On success *out is the expression; on failure *out is NULL and the status is SR_EPARSE (syntax,
 * unknown name, arity, bad alias) or SR_EDIM (dimensions), with a message giving the column. */
SR_API sr_status sr_parse(sr_ctx *ctx, const char *formula, const char *const *aliases,
                          int naliases, sr_expr **out);

/* One variable of a parsed text, as sr_parse_ex lists them. */
typedef struct sr_parse_var {
    int index;  /* the argument index: args[index] of sr_kernel_run */
    int dim;    /* its dimension */
    sr_cat cat; /* SR_CAT_I, SR_CAT_J or SR_CAT_PARAM */
    int alias;  /* 0-based position in aliases of the declaration of this index; -1 when only
                 * the formula names it (Var(...), Vi(index, dim), GradFromPos(F, v, I)) */
} sr_parse_var;

/* The options and the variable table of sr_parse_ex. Zero-initialise it, then set the inputs;
 * all zero parses as sr_parse does. */
typedef struct sr_parse_desc {
    /* In: the category of the gradient input that KeOps' GradFromPos(F, v, I) (and
     * GradFromPos(F, pos, I)) declares. KeOps gives it the category of the reduction's output:
     * SR_CAT_I for a reduction over j (axis 1), SR_CAT_J for one over i (axis 0); sr_parse,
     * which knows no reduction, uses SR_CAT_I. SR_CAT_PARAM is refused (SR_EINVAL). */
    sr_cat gradin_cat;
    /* Out (vars may be NULL when vars_cap is 0): the variables that the aliases declare and
     * the formula names, one per index in increasing index order, written to
     * vars[0..min(nvars, vars_cap)). They include variables that a derivative removes from the
     * result (the gradient input of an identically zero Grad) and aliases the formula does not
     * use, so that a caller sizes its argument list as KeOps does; the kernel's own list
     * (sr_kernel_var) has only the variables the expanded formula reads. When nvars > vars_cap
     * the table is cut short: call again with a larger one. */
    sr_parse_var *vars;
    int vars_cap;
    int nvars; /* out: the number of variables (distinct indices) */
} sr_parse_desc;

/* sr_parse with options and the variable table: what a binding needs to check its arguments
 * before any kernel exists (docs/api.md). desc must not be NULL (SR_EINVAL). On failure *out is
 * NULL, desc->nvars is 0 and the status and message are sr_parse's. Not thread-safe with other
 * calls on ctx. */
SR_API sr_status sr_parse_ex(sr_ctx *ctx, const char *formula, const char *const *aliases,
                             int naliases, sr_parse_desc *desc, sr_expr **out);

/* Writes the formula text of e into buf (at most cap bytes, always NUL-terminated when cap > 0)
 * and returns the length of the full text, excluding the NUL, like snprintf. The text parses
 * back (with no aliases) to the same expression, unless it nests deeper than sr_parse allows.
 * Shared subexpressions are written once per use; the length saturates at SIZE_MAX. Returns 0
 * for a NULL e (and on out-of-memory). Thread-safe. */
SR_API size_t sr_expr_print(const sr_expr *e, char *buf, size_t cap);

/* Output dimension of e (0 for NULL). */
SR_API int sr_expr_dim(const sr_expr *e);
/* What e depends on (SR_DEP_CONST for NULL). */
SR_API sr_category sr_expr_category(const sr_expr *e);
/* If e is a variable node (sr_var, sr_vi, sr_vj, sr_pm, an alias or Var(...) once parsed),
 * writes its index, category and dimension (each pointer may be NULL) and returns SR_OK; for
 * any other node, or NULL, returns SR_EINVAL and writes nothing. Thread-safe. */
SR_API sr_status sr_expr_var(const sr_expr *e, int *index, sr_cat *cat, int *dim);

/* Builders. Each returns the (interned) node, or NULL if an operand is NULL, belongs to another
 * context, or the dimensions do not fit (then the context records SR_EDIM/SR_EINVAL and a
 * message naming the op and both dimensions). Scalars (dimension 1) broadcast against vectors
 * in elementwise operations, as in KeOps. */
SR_API sr_expr *sr_var(sr_ctx *ctx, int index, int dim, sr_cat cat);
SR_API sr_expr *sr_vi(sr_ctx *ctx, int index, int dim);
SR_API sr_expr *sr_vj(sr_ctx *ctx, int index, int dim);
SR_API sr_expr *sr_pm(sr_ctx *ctx, int index, int dim);
SR_API sr_expr *sr_const(sr_ctx *ctx, double value);              /* finite real constant */
SR_API sr_expr *sr_intcst(sr_ctx *ctx, int64_t value);            /* IntCst(n) */
SR_API sr_expr *sr_ratcst(sr_ctx *ctx, int64_t num, int64_t den); /* RatCst(p,q), q != 0 */

/* Elementwise binary (broadcasting) */
SR_API sr_expr *sr_add(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_sub(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_mul(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_div(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_powf(sr_ctx *ctx, sr_expr *a, sr_expr *b); /* a^b, real exponent */
SR_API sr_expr *sr_atan2(sr_ctx *ctx, sr_expr *y, sr_expr *x);
SR_API sr_expr *sr_less(sr_ctx *ctx, sr_expr *a, sr_expr *b);   /* 1 if a < b else 0 */
SR_API sr_expr *sr_lesseq(sr_ctx *ctx, sr_expr *a, sr_expr *b); /* 1 if a <= b else 0 */
SR_API sr_expr *sr_greater(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_greatereq(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_equal(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_notequal(sr_ctx *ctx, sr_expr *a, sr_expr *b);

/* Elementwise unary */
SR_API sr_expr *sr_neg(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_inv(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_square(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_sqrt(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_rsqrt(sr_ctx *ctx, sr_expr *a); /* 1/sqrt(a), 0 at a = 0 (KeOps) */
SR_API sr_expr *sr_exp(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_log(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_xlogx(sr_ctx *ctx, sr_expr *a); /* x*log(x), 0 at x = 0 */
SR_API sr_expr *sr_sin(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_cos(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_asin(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_acos(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_atan(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_abs(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_sign(sr_ctx *ctx, sr_expr *a); /* -1, 0 or 1 */
SR_API sr_expr *sr_step(sr_ctx *ctx, sr_expr *a); /* 1 if a >= 0 else 0 */
SR_API sr_expr *sr_relu(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_floor(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_sinxdivx(sr_ctx *ctx, sr_expr *a);                 /* sin(x)/x, 1 at x = 0 */
SR_API sr_expr *sr_pow(sr_ctx *ctx, sr_expr *a, int exponent);        /* integer power */
SR_API sr_expr *sr_round(sr_ctx *ctx, sr_expr *a, int decimals);      /* round to d decimals */
SR_API sr_expr *sr_clampint(sr_ctx *ctx, sr_expr *a, int lo, int hi); /* clamp to [lo, hi] */

/* Elementwise ternary (broadcasting) */
SR_API sr_expr *sr_clamp(sr_ctx *ctx, sr_expr *a, sr_expr *lo, sr_expr *hi);
SR_API sr_expr *sr_ifelse(sr_ctx *ctx, sr_expr *c, sr_expr *a, sr_expr *b); /* c >= 0 ? a : b */
/* a - modulus * floor((a - offset) / modulus) */
SR_API sr_expr *sr_mod(sr_ctx *ctx, sr_expr *a, sr_expr *modulus, sr_expr *offset);

/* Vector operations */
SR_API sr_expr *sr_sqnorm2(sr_ctx *ctx, sr_expr *a);              /* sum a_k^2 -> 1 */
SR_API sr_expr *sr_norm2(sr_ctx *ctx, sr_expr *a);                /* sqrt(sum a_k^2) -> 1 */
SR_API sr_expr *sr_normalize(sr_ctx *ctx, sr_expr *a);            /* a*Rsqrt(SqNorm2(a)) -> D */
SR_API sr_expr *sr_sqdist(sr_ctx *ctx, sr_expr *a, sr_expr *b);   /* |a-b|^2 -> 1 */
SR_API sr_expr *sr_scalprod(sr_ctx *ctx, sr_expr *a, sr_expr *b); /* (a|b) -> 1 */
SR_API sr_expr *sr_sum(sr_ctx *ctx, sr_expr *a);                  /* sum of components -> 1 */
SR_API sr_expr *sr_max(sr_ctx *ctx, sr_expr *a);                  /* largest component -> 1 */
SR_API sr_expr *sr_min(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_argmax(sr_ctx *ctx, sr_expr *a); /* its index, as a real -> 1 */
SR_API sr_expr *sr_argmin(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_elem(sr_ctx *ctx, sr_expr *a, int m);                 /* a_m -> 1 */
SR_API sr_expr *sr_extract(sr_ctx *ctx, sr_expr *a, int start, int len); /* -> len */
SR_API sr_expr *sr_concat(sr_ctx *ctx, sr_expr *a, sr_expr *b);          /* -> Da + Db */
SR_API sr_expr *sr_onehot(sr_ctx *ctx, sr_expr *a, int dim);             /* scalar a -> dim */
/* A is an m×n matrix stored row-major as a vector of dimension m*n. */
SR_API sr_expr *sr_matvecmult(sr_ctx *ctx, sr_expr *A, sr_expr *v); /* A (m*n), v (n) -> m */
SR_API sr_expr *sr_vecmatmult(sr_ctx *ctx, sr_expr *v, sr_expr *A); /* v (m), A (m*n) -> n */
SR_API sr_expr *sr_tensorprod(sr_ctx *ctx, sr_expr *a, sr_expr *b); /* -> Da*Db, row-major */
/* w of dimension 1 (isotropic), D (diagonal) or D*D (full, row-major) */
SR_API sr_expr *sr_weightedsqnorm(sr_ctx *ctx, sr_expr *w, sr_expr *a);
SR_API sr_expr *sr_weightedsqdist(sr_ctx *ctx, sr_expr *w, sr_expr *a, sr_expr *b);
/* The adjoints of Sum, Elem and Extract (KeOps' SumT, ElemT, ExtractT): a scalar a repeated
 * dim times; the dim-vector with a at index m and 0 elsewhere; the dim-vector with a at
 * [start, start + Da) and 0 elsewhere. */
SR_API sr_expr *sr_sumt(sr_ctx *ctx, sr_expr *a, int dim);
SR_API sr_expr *sr_elemt(sr_ctx *ctx, sr_expr *a, int dim, int m);
SR_API sr_expr *sr_extractt(sr_ctx *ctx, sr_expr *a, int start, int dim);
/* KeOps' TensorDot(a, b, dims_a, dims_b, cont_a, cont_b, permute): a and b are row-major
 * tensors of shapes dims_a[0..rank_a) and dims_b[0..rank_b) (their products must be Da and Db);
 * axis cont_a[k] of a is contracted with axis cont_b[k] of b for k < ncont (equal sizes), as
 * numpy.tensordot(a, b, (cont_a, cont_b)); the kept axes, a's then b's in increasing order, are
 * laid out with kept axis k at output position permute[k] (permute NULL: in that order). The
 * result is the flattened row-major output. Ranks are at most 16. The lists are copied. Errors:
 * SR_EDIM for shapes that do not match the operands or each other, SR_EINVAL for axes out of
 * range or repeated, or a permute that is not a permutation. */
SR_API sr_expr *sr_tensordot(sr_ctx *ctx, sr_expr *a, sr_expr *b, int rank_a, const int *dims_a,
                             int rank_b, const int *dims_b, int ncont, const int *cont_a,
                             const int *cont_b, const int *permute);

/*
 * Complex numbers (KeOps' complex ops). A complex vector of dimension d is a real vector of
 * dimension 2d holding (re, im) pairs: (re_0, im_0, re_1, im_1, ...). Complex operands must have
 * even dimensions. Add, Sub, Mult and Div (a / b = a conj(b) / |b|^2) work pairwise on equal
 * dimensions, or broadcast a complex scalar (dimension 2) over the other operand. scal multiplies
 * a complex vector by a complex scalar, realscal by a real scalar (dimension 1); either may come
 * first. Real, Imag, Abs (sqrt(re^2 + im^2)), SquareAbs and Angle (atan2(im, re)) map 2d -> d;
 * real2complex (x + 0i), imag2complex (0 + xi) and exp1j (cos x + i sin x) map d -> 2d; Sum adds
 * the complex components (2d -> 2); SumT repeats a complex scalar up to dimension dim (even, in
 * reals). Gradients are those of the real maps on the interleaved parts, as KeOps defines them.
 */
SR_API sr_expr *sr_complex_add(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_complex_sub(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_complex_mult(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_complex_div(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_complex_scal(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_complex_realscal(sr_ctx *ctx, sr_expr *a, sr_expr *b);
SR_API sr_expr *sr_conj(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_exp(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_exp1j(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_real(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_imag(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_abs(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_squareabs(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_angle(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_real2complex(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_imag2complex(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_sum(sr_ctx *ctx, sr_expr *a);
SR_API sr_expr *sr_complex_sumt(sr_ctx *ctx, sr_expr *a, int dim);

/* Symbolic differentiation (docs/gradients.md). Both build ordinary expressions from the
 * derivative rule of each op, so the result prints, parses back, simplifies and runs on every
 * backend like any formula; they are builders (NULL operand in, NULL out; errors recorded in
 * ctx). Not thread-safe with other calls on ctx.
 *
 * sr_grad: KeOps' Grad(F, V, E), the gradient with respect to the variable var of the scalar
 * <f, gradin> = sum_k f_k gradin_k; dimension dim(var). gradin must have dimension dim(f)
 * (else SR_EDIM); var must be a variable node (sr_vi/sr_vj/sr_pm/sr_var, else SR_EINVAL) whose
 * index f does not use with another dimension or category (else SR_EDIM). A variable that f
 * does not use gives the zero vector of dimension dim(var), as in KeOps.
 * Piecewise-constant ops (comparisons, Sign, Step, Floor, Round, ArgMin/ArgMax, OneHot, the
 * floor of Mod) have derivative 0; Abs, ReLU, Clamp, ClampInt, Min and Max use a sub-gradient;
 * Sqrt, Rsqrt, Norm2, Normalize, Asin and Acos use Rsqrt, so their derivative is 0 where
 * Rsqrt's argument is 0 (docs/gradients.md lists every value at a kink). Gradients nest:
 * sr_grad of a gradient is a second derivative.
 *
 * sr_diff: KeOps' Diff(F, V, U), the directional derivative d/dt f(var + t dir) at t = 0,
 * dimension dim(f); dir must have dimension dim(var) (else SR_EDIM). It is computed as
 * Grad(Grad(f, var, E), E, dir) for a temporary variable E that does not remain in the
 * result. */
SR_API sr_expr *sr_grad(sr_ctx *ctx, sr_expr *f, sr_expr *var, sr_expr *gradin);
SR_API sr_expr *sr_diff(sr_ctx *ctx, sr_expr *f, sr_expr *var, sr_expr *dir);
/* KeOps' GradMatrix(F, V): the dim(f) x dim(var) Jacobian, row-major (row k is the gradient of
 * f_k); Divergence(F, V): sum_k d f_k / d var_k, f and var of equal dimensions (else SR_EDIM);
 * Laplacian(F, V): the divergence of the gradient of a scalar f (else SR_EDIM). Built from
 * sr_grad, so the same rules and conventions apply. */
SR_API sr_expr *sr_gradmatrix(sr_ctx *ctx, sr_expr *f, sr_expr *var);
SR_API sr_expr *sr_divergence(sr_ctx *ctx, sr_expr *f, sr_expr *var);
SR_API sr_expr *sr_laplacian(sr_ctx *ctx, sr_expr *f, sr_expr *var);

/* Named kernel formulas, built from the ops above (so they print, simplify and run like any
 * formula). x and y must have equal dimensions; r = |x - y|, g = param (dimension 1):
 *   "gaussian", "rbf"     Exp(-g r^2)
 *   "laplace", "matern12" Exp(-g r)
 *   "matern32"            (1 + sqrt(3) g r) Exp(-sqrt(3) g r)
 *   "matern52"            (1 + sqrt(5) g r + 5/3 g^2 r^2) Exp(-sqrt(5) g r)
 *   "cauchy"              1 / (1 + g r^2)
 *   "imq"                 1 / sqrt(1 + g r^2)        (inverse multiquadric)
 *   "polynomial"          Powf((x|y) + 1, param)     (param: the degree, e.g. sr_intcst(ctx, 3))
 *   "linear"              (x|y)                      (param ignored, may be NULL)
 *   "cosine"              (Normalize(x)|Normalize(y)) (param ignored, may be NULL)
 *   "l1"                  Sum(Abs(x - y))            (param ignored, may be NULL)
 * Returns NULL on an unknown name (SR_EINVAL), a missing parameter, or mismatched dimensions
 * (SR_EDIM), with the message recorded like any builder. */
SR_API sr_expr *sr_formula(sr_ctx *ctx, const char *name, sr_expr *x, sr_expr *y, sr_expr *param);

/* ---- Kernels ------------------------------------------------------------------------------ */

/* X(name, keops spelling). Order is ABI. */
#define SR_REDUCTION_MAP(X)                                                                        \
    X(SUM, "Sum")                                                                                  \
    X(MIN, "Min")                                                                                  \
    X(MAX, "Max")                                                                                  \
    X(ARGMIN, "ArgMin")                                                                            \
    X(ARGMAX, "ArgMax")                                                                            \
    X(MIN_ARGMIN, "Min_ArgMin")                                                                    \
    X(MAX_ARGMAX, "Max_ArgMax")                                                                    \
    X(KMIN, "KMin")                                                                                \
    X(ARGKMIN, "ArgKMin")                                                                          \
    X(KMIN_ARGKMIN, "KMin_ArgKMin")                                                                \
    X(LOGSUMEXP, "LogSumExp")                                                                      \
    X(SUMSOFTMAXWEIGHT, "SumSoftMaxWeight")

typedef enum sr_reduction {
#define SR_REDUCTION_ENUM_(name, keops) SR_##name,
    SR_REDUCTION_MAP(SR_REDUCTION_ENUM_)
#undef SR_REDUCTION_ENUM_
        SR_REDUCTION_COUNT
} sr_reduction;

/* The KeOps spelling of a reduction ("ArgKMin"), or NULL if out of range. */
SR_API const char *sr_reduction_name(sr_reduction r);
/* Looks a reduction up by its KeOps spelling (case-sensitive). SR_EINVAL if unknown. */
SR_API sr_status sr_reduction_from_name(const char *name, sr_reduction *out);

/* How the partial results of a reduction over parts of the reduced range combine into the
 * reduction over all of it (what the MPI layer and the sharded front ends do):
 *   SUM   the partial sums add
 *   MIN   the least value wins, ties to the lower global index; MAX likewise, the largest
 *   KMIN  the K smallest of the parts' candidate lists, ties to the lower global index
 *   LSE   LogSumExp of the partial LogSumExps
 *   SSW   the softmax-weighted averages weighted by exp of their LogSumExps
 * A part must then compute the reduction's partial state: *partial is the reduction whose
 * outputs carry it (Min_ArgMin for Min and ArgMin: values and indices both; the reduction itself
 * where its outputs suffice). SR_EINVAL if r is not a reduction or an out pointer is NULL. */
typedef enum sr_combine {
    SR_COMBINE_SUM,
    SR_COMBINE_MIN,
    SR_COMBINE_MAX,
    SR_COMBINE_KMIN,
    SR_COMBINE_LSE,
    SR_COMBINE_SSW
} sr_combine;
SR_API sr_status sr_reduction_combine(sr_reduction r, sr_combine *how, sr_reduction *partial);

/* The element type of a kernel's arrays. SR_F16 (IEEE binary16) and SR_BF16 (bfloat16: the upper
 * half of a float32) are stored as 16-bit values (uint16_t in C) and computed in float32: every
 * value is widened to float32 as it is read, the kernel runs as a float32 kernel (the sr_acc
 * modes apply to its sums), and each output value is rounded to the dtype, to nearest with ties
 * to even, as it is written. Tolerances per dtype: docs/semantics.md. */
typedef enum sr_dtype { SR_F32 = 0, SR_F64 = 1, SR_F16 = 2, SR_BF16 = 3 } sr_dtype;

typedef enum sr_device {
    SR_DEVICE_AUTO = 0,     /* the planner's choice: SYMRED_DEVICE, else the CPU */
    SR_DEVICE_CPU = 1,      /* the fastest CPU backend available */
    SR_DEVICE_CUDA = 2,     /* an NVIDIA GPU; SR_ENODEV where there is none */
    SR_DEVICE_REFERENCE = 3 /* the portable interpreter (the test oracle) */
} sr_device;

/* How float32 Sum-type reductions accumulate, float16 and bfloat16 kernels' included (float64
 * kernels always accumulate in double). */
typedef enum sr_acc {
    SR_ACC_DEFAULT = 0, /* $SYMRED_ACC (block, kahan or f64), else block */
    SR_ACC_BLOCK = 1,   /* float32 partial sums per tile, added together: fast, error ~ sqrt(n) */
    SR_ACC_KAHAN = 2,   /* float32 with compensated summation of the tile sums */
    SR_ACC_F64 = 3      /* a double accumulator */
} sr_acc;

typedef struct sr_kernel_desc {
    sr_reduction reduction;
    int axis; /* 1: reduce over j, one result per row i; 0: reduce over i */
    int k;    /* K of the K-reductions (KMin, ArgKMin, KMin_ArgKMin); else ignored */
    sr_dtype dtype;
    sr_device device;
    sr_expr *weight; /* SumSoftMaxWeight: the formula whose values are averaged (KeOps'
                        formula2); NULL for the other reductions */
    sr_acc acc;      /* accumulation of float32 (and float16, bfloat16) sums; SR_ACC_DEFAULT */
} sr_kernel_desc;

/* Sum over j (axis 1), float32, device AUTO, k = 1, no weight, SR_ACC_DEFAULT. */
SR_API sr_kernel_desc sr_kernel_desc_default(void);

/* Creates a kernel computing desc->reduction of f. Checks the formula (each variable index used
 * with one dimension and category), the reduction (SumSoftMaxWeight needs a scalar F and a
 * weight; the K-reductions 1 <= k), the axis, dtype and device. Min, Max, LogSumExp and the
 * arg/K reductions of a vector F act on each component separately. If f is NULL, returns the
 * status of the builder call that failed (its message is kept). The kernel keeps pointers into
 * ctx: free it before the context. *out is NULL on failure. A kernel the CPU JIT compiles fails
 * with SR_ECOMPILE when the compiler fails, runs past SYMRED_COMPILE_TIMEOUT seconds (default
 * 120), or a signal interrupts the wait for it (Ctrl-C in Python): the compiler's process group
 * is killed first (docs/cache.md). */
SR_API sr_status sr_kernel_new(sr_ctx *ctx, const sr_expr *f, const sr_kernel_desc *desc,
                               sr_kernel **out);
/* Frees the kernel; NULL is a no-op. Not thread-safe with any other call on the same kernel:
 * every sr_kernel_run (and _ex, _ranges, eval_block, solve, explain, grad) of it, in any
 * thread, must have returned before, and none may start after; freeing a kernel that another
 * thread is running is a use after free (a crash), which the library does not detect. Keep a
 * reference count of your own when threads share a kernel. Like kernel creation, it is a call
 * on the kernel's context: not concurrent with other calls on that context. */
SR_API void sr_kernel_free(sr_kernel *kernel);

/* Number of arrays sr_kernel_run expects: 1 + the largest variable index of F (and of the
 * weight). An index the formula does not use may be given as NULL. */
SR_API int sr_kernel_nargs(const sr_kernel *kernel);
/* Values per output row: dim(F) for Sum/Min/Max/Arg*, K*dim(F) for the K-reductions (row-major
 * K×dim), dim(weight) for SumSoftMaxWeight. */
SR_API int sr_kernel_out_dim(const sr_kernel *kernel);
/* The variable of index `index` (0 <= index < sr_kernel_nargs(kernel)) that the kernel reads:
 * its category in *cat (SR_CAT_I, SR_CAT_J or SR_CAT_PARAM) and its dimension in *dim, so that
 * a caller can size and check args[index] of sr_kernel_run. An index the formula does not use
 * gives *dim = 0 (its array may be NULL) and *cat = SR_CAT_I. Either pointer may be NULL when
 * that value is not wanted. Gradient kernels (sr_kernel_grad) have variables of their own,
 * read the same way. Returns SR_EINVAL (writing nothing) for a NULL kernel or an index out of
 * range. Thread-safe: it only reads the immutable kernel. */
SR_API sr_status sr_kernel_var(const sr_kernel *kernel, int index, sr_cat *cat, int *dim);

/* Runs the kernel. args[v] is the array of variable index v: nx*dim values for an i-variable,
 * ny*dim for a j-variable, dim for a parameter, in the kernel's dtype. out receives
 * n*sr_kernel_out_dim() values, n = nx for axis 1 and ny for axis 0: of the kernel's dtype for
 * the value reductions, int64_t indices for ArgMin/ArgMax/ArgKMin. For Min_ArgMin, Max_ArgMax
 * and KMin_ArgKMin, which have two outputs, use sr_kernel_run_ex (this returns SR_EINVAL).
 * Sizes: nx, ny >= 0; an empty reduction gives the identity (0 for Sum, +inf for Min, -inf for
 * Max and LogSumExp, -1 for the arg reductions, NaN for SumSoftMaxWeight); the K-reductions
 * need k <= the reduced count. Thread-safe: a kernel may run concurrently in many threads, but
 * not while sr_kernel_free frees it (every run must have returned first). */
SR_API sr_status sr_kernel_run(const sr_kernel *kernel, int64_t nx, int64_t ny,
                               const void *const *args, void *out);

typedef struct sr_run_desc {
    int64_t nx, ny;
    int nargs; /* entries in args; must equal sr_kernel_nargs() */
    const void *const *args;
    void *out;        /* values (dtype); NULL for the pure arg reductions */
    int64_t *out_idx; /* indices; NULL for the pure value reductions */
} sr_run_desc;

/* Runs the kernel with both outputs given separately and the argument count checked. */
SR_API sr_status sr_kernel_run_ex(const sr_kernel *kernel, const sr_run_desc *run);

/*
 * Block-sparse ranges: pykeops' 6-tuple (ranges_i, slices_i, redranges_j, ranges_j, slices_j,
 * redranges_i), with int64_t entries (docs/ranges.md). For axis 1 the output rows i are cut into
 * Nc row blocks ranges_i[c] = [start, end) (Nc x 2 values), and block c reduces only over the
 * column intervals redranges_j[q] = [start, end) (Nr x 2 values) for q in
 * [slices_i[c - 1], slices_i[c]) (slices_i[-1] = 0: slices_i holds cumulative end positions into
 * redranges_j). Axis 0 (reduce over i) reads the transposed triple (ranges_j, slices_j,
 * redranges_i) the same way with i and j swapped. Only the triple of the kernel's axis is read
 * (and checked); the other may be left zero. Passing the whole 6-tuple to a kernel and to its
 * gradient kernels (sr_kernel_grad, whose axis may be the other one) runs them all on the same
 * block pattern.
 *
 * Semantics: out_o = RED over the reduced indices of o's block only. An output row in no block,
 * or whose block's intervals are all empty, gets the empty-reduction identity (as for a
 * reduction over 0 indices, see sr_kernel_run). A K-reduction whose row sees fewer than k
 * indices is padded with the identity (+inf values, -1 indices) after the ones it has. Indices
 * written by the arg reductions are global (positions in 0..ny-1 / 0..nx-1). Blocks and
 * intervals may come in any order; intervals of one block are folded in increasing index order
 * (so ties resolve to the lowest index, as without ranges).
 *
 * Errors (SR_EINVAL, with a message naming the array and the entry): a negative count; a NULL
 * array with a nonzero count; a block or interval not inside [0, n] (n = rows of its side) or
 * with start > end; slices decreasing or beyond Nr; two row blocks sharing a row; two intervals
 * of one block sharing an index (it would be counted twice). Empty blocks and intervals are
 * allowed. Every backend runs them (CUDA: with host arrays; sr_kernel_run_device has no ranges).
 */
typedef struct sr_ranges {
    int64_t nranges_i;          /* Nc: row blocks of axis 1 */
    const int64_t *ranges_i;    /* Nc x 2 */
    const int64_t *slices_i;    /* Nc */
    int64_t nredranges_j;       /* Nr: column intervals */
    const int64_t *redranges_j; /* Nr x 2 */
    int64_t nranges_j;          /* the transpose, for axis 0: column blocks */
    const int64_t *ranges_j;
    const int64_t *slices_j;
    int64_t nredranges_i; /* row intervals */
    const int64_t *redranges_i;
} sr_ranges;

/* Runs the kernel like sr_kernel_run_ex, reducing only over the blocks of ranges (above);
 * ranges NULL is sr_kernel_run_ex. The ranges are read during the call only. Errors: those of
 * sr_kernel_run_ex, SR_EINVAL for bad ranges and SR_EOVERFLOW for block or interval counts
 * whose plan overflows the address space. Thread-safe like sr_kernel_run. */
SR_API sr_status sr_kernel_run_ranges(const sr_kernel *kernel, const sr_run_desc *run,
                                      const sr_ranges *ranges);

/* Like sr_kernel_run_ex, for callers that keep data on the GPU: bit v of device_args set means
 * args[v] is a device pointer (a CUdeviceptr cast to a pointer) on the kernel's GPU, used in
 * place with no copy (indices >= 64 are always host arrays); device_out nonzero means out and
 * out_idx are device pointers. Only for kernels created with SR_DEVICE_CUDA: SR_EINVAL for any
 * other kernel when a flag is set. Each device pointer is checked before the launch: one the
 * driver does not know, or whose allocation is smaller than the rows the call reads or writes,
 * is SR_EINVAL with a message naming the argument (a kernel faulting on it would lose the GPU
 * context for the whole process). Device arrays do not count against the memory budget; the
 * copies of host arrays do (SR_EBUDGET when the parameters and reduced-side arrays alone do not
 * fit). SR_ENOMEM when the device is out of memory; SR_EINTERNAL with the driver's message for
 * other driver failures. Thread-safe like sr_kernel_run. With both zero this is
 * sr_kernel_run_ex. */
SR_API sr_status sr_kernel_run_device(const sr_kernel *kernel, const sr_run_desc *run,
                                      uint64_t device_args, int device_out);

/*
 * The kernel of the gradient of a reduction with respect to its variable of index var_index
 * (docs/gradients.md has the formulas). Let n = sr_kernel_nargs(kernel), R the forward
 * reduction, "out rows" its output rows (nx for axis 1, ny for axis 0) and "reduced rows" the
 * other side, out_dim = sr_kernel_out_dim(kernel), and L a scalar loss with incoming gradient
 * G = dL/d(out) (out rows x out_dim values; for the two-output reductions, the gradient with
 * respect to the values). The gradient kernel is a Sum reduction, with the forward kernel's
 * dtype, device and accumulation, run with the same nx and ny as the forward call and this
 * argument layout:
 *
 *   args[0 .. n)  the forward arrays, unchanged;
 *   args[n]       G: out rows x out_dim;
 *   args[n + 1]   the forward output: the values for LogSumExp and SumSoftMaxWeight; for Min,
 *                 Max, Min_ArgMin, Max_ArgMax, KMin and KMin_ArgKMin the forward's indices
 *                 (ArgMin/ArgKMin output, int64) converted to the dtype (exact below 2^24 rows
 *                 in float32): out rows x out_dim;
 *   args[n + 2]   SumSoftMaxWeight: the log-normalizer log sum_reduced exp(F), one value per out
 *                 row (a LogSumExp kernel of F with the same axis gives it); Min, Max, KMin (and
 *                 the _Arg variants): the reduced index itself, 0, 1, ..., reduced rows - 1, one
 *                 value per reduced row.
 *
 * The kernel reads only the first sr_kernel_nargs(grad) of these (n + 1 for Sum, n + 2 for
 * LogSumExp, n + 3 for the others; 0 for the Arg reductions, whose gradient is zero); an unused
 * entry may be NULL. Its output, d L / d v for v the variable of index var_index:
 *   - v of the output index (Vi for axis 1): out rows x dim(v) (the kernel keeps the axis);
 *   - v of the reduced index (Vj for axis 1): reduced rows x dim(v) (the transposed sum: the
 *     gradient kernel reduces over the forward output index, sr_kernel_out_dim = dim(v));
 *   - v a parameter: out rows x dim(v), one partial gradient per out row: **the caller sums the
 *     rows** to get the gradient (dim(v) values).
 * Min/Max/KMin pass G to the selected pairs only (the indices of args[n + 1]); LogSumExp and
 * SumSoftMaxWeight weight each pair by its softmax weight. The gradient kernel is an ordinary
 * kernel: sr_kernel_grad of it gives second derivatives.
 * Errors: SR_EINVAL (NULL kernel or out, var_index outside [0, n) or an index the formula does
 * not use), and those of sr_kernel_new. The gradient kernel keeps pointers into the context,
 * like the forward one, and is freed with sr_kernel_free. Builds expressions in the kernel's
 * context: not thread-safe with other calls on that context.
 */
SR_API sr_status sr_kernel_grad(const sr_kernel *kernel, int var_index, sr_kernel **grad_kernel);

/*
 * Reverse mode in one call, for the reductions that have a fused backward: the gradients of a
 * loss L with respect to the kernel's variables, given G = dL/d out, without gradient kernels.
 * run: the forward call (the same nx, ny and arrays); gout: G (out rows x out_dim); out: the
 * forward values; lse: NULL, or the log-normalizer that sr_kernel_run_lse wrote with those
 * values (out rows values; the call then does not form it again); grads:
 * sr_kernel_nargs(kernel) entries, grads[v] NULL when the gradient of variable v is not wanted,
 * else an array of v's shape (rows x dim; a parameter's gradient is its total, dim values) that
 * the call overwrites.
 *
 * The fused backward covers attention on the CPU backends: SumSoftMaxWeight, F = (x|y) or
 * F = (x|y) * c or c * (x|y) with x a variable of the output side (Vi on axis 1, Vj on axis 0),
 * y one of the reduced side and c a parameter of dimension 1 or a constant, the weight a
 * variable of the reduced side other than y; float32 or float64 (docs/gradients.md).
 * It writes every wanted gradient from one pass over the pairs (five tile products per tile of
 * pairs), after a pass that forms the log-normalizer when lse is NULL; with block-sparse ranges
 * through sr_kernel_vjp_ranges.
 * Errors: SR_EINVAL (NULL kernel, run, or gout/out with rows; the checks of sr_kernel_run_ex),
 * SR_ENOTSUP with the reason for any other kernel (use sr_kernel_grad), SR_EBUDGET when its
 * workspace (per thread: a copy of dx, nx x dim(x), and tiles) exceeds the memory budget.
 * Thread-safe like sr_kernel_run.
 */
SR_API sr_status sr_kernel_vjp(const sr_kernel *kernel, const sr_run_desc *run, const void *gout,
                               const void *out, const void *lse, void *const *grads);

/*
 * The forward of a kernel that sr_kernel_vjp covers, keeping its log-normalizer: the values
 * into run->out as sr_kernel_run_ex writes them, and lse[i] = log sum_j exp(F_ij) (out rows
 * values, the dtype's), which sr_kernel_vjp then reads instead of forming it again. On the
 * fused two-product strategy it runs the kernel's own plan, lse from the online softmax's maximum
 * and sum (the values are sr_kernel_run_ex's, bit for bit); otherwise (other plans, the
 * symmetric driver, ranges under a memory budget) symred's own attention forward on the tiles of
 * sr_kernel_vjp's passes.
 * Errors: those of sr_kernel_vjp (SR_ENOTSUP for the other kernels; SR_EINVAL for a NULL lse
 * with rows).
 */
SR_API sr_status sr_kernel_run_lse(const sr_kernel *kernel, const sr_run_desc *run, void *lse);

/*
 * sr_kernel_vjp and sr_kernel_run_lse on block-sparse ranges (sr_kernel_run_ranges; ranges NULL
 * is the call without them): the pairs of the ranges' blocks only, from the triple of the
 * kernel's axis (the other triple is not read: the passes over the reduced side transpose the
 * pattern themselves). sr_kernel_run_lse_ranges writes the values that sr_kernel_run_ranges
 * writes, and lse[o] = -inf for an output row that no block covers (or whose block's intervals
 * are all empty); sr_kernel_vjp_ranges gives the gradients of the loss of those values, the
 * gradient kernels' run on the same ranges summed (an uncovered row's values do not enter
 * them, and its gradient dx is 0). lse, when given, must come from sr_kernel_run_lse_ranges
 * with the same ranges. Errors: those of sr_kernel_vjp and sr_kernel_run_ranges (SR_EINVAL for
 * bad ranges); SR_EBUDGET also when the lists of the blocks per tile of 128 reduced indices (16
 * bytes per block and tile it meets) exceed the memory budget.
 */
SR_API sr_status sr_kernel_vjp_ranges(const sr_kernel *kernel, const sr_run_desc *run,
                                      const sr_ranges *ranges, const void *gout, const void *out,
                                      const void *lse, void *const *grads);
SR_API sr_status sr_kernel_run_lse_ranges(const sr_kernel *kernel, const sr_run_desc *run,
                                          const sr_ranges *ranges, void *lse);

/*
 * The kernel of a reduction's directional derivative (forward mode, a Jacobian-vector
 * product): the derivative of the forward values along tangents dv of the variables whose
 * indices are set in var_mask (bit v for index v; indices below 64). With n =
 * sr_kernel_nargs(kernel), it is a Sum reduction with the forward kernel's axis, dtype, device
 * and accumulation, run with the same nx and ny as the forward call and this argument layout:
 *
 *   args[0 .. n)  the forward arrays, unchanged;
 *   args[n + v]   the tangent dv of variable v, an array of v's shape, for each v in var_mask
 *                 (the entries of the other indices are unused and may be NULL);
 *   args[2 n]     LogSumExp, SumSoftMaxWeight: the forward output values; Min, Max,
 *                 Min_ArgMin, Max_ArgMax, KMin, KMin_ArgKMin: the forward indices converted to
 *                 the dtype (as for sr_kernel_grad): out rows x out_dim;
 *   args[2 n + 1] SumSoftMaxWeight: the log-normalizer (out rows x 1); Min, Max, KMin (and
 *                 the _Arg variants): the reduced index itself, 0, 1, ..., reduced rows - 1.
 *
 * Its output is the tangent of the forward values, out rows x out_dim: for Sum
 * sum_j sum_v Diff(F, v, dv) (sr_diff), for LogSumExp the same weighted by the softmax weight
 * exp(F_ij - out_i), for SumSoftMaxWeight sum_j s_ij (dW_ij + (W_ij - out_i) dF_ij), for Min,
 * Max and KMin dF at the selected pairs. The kernel reads the first sr_kernel_nargs(jvp) of
 * these entries. It is an ordinary kernel: sr_kernel_grad and sr_kernel_jvp of it give second
 * derivatives. Errors: SR_EINVAL (NULL kernel or out, var_mask empty or naming an index the
 * formula does not use, an Arg reduction, whose indices have no derivative), and those of
 * sr_kernel_new. Builds expressions in the kernel's context: not thread-safe with other calls
 * on that context; the result is freed with sr_kernel_free.
 */
SR_API sr_status sr_kernel_jvp(const sr_kernel *kernel, uint64_t var_mask, sr_kernel **jvp_kernel);

/*
 * Solves (alpha I + K) a = b by conjugate gradients (pykeops' KernelSolve), where K is the
 * symmetric n x n kernel matrix of a Sum kernel whose formula is F(x_i, x_j) * b_j: kernel
 * computes out_i = sum_j F(x_i, x_j) b_j (axis 1; with axis 0 the roles of i and j swap) and
 * desc->b_index is the variable b (a variable of the reduced index with dim(b) = the kernel's
 * output dimension). Each CG mat-vec is one sr_kernel_run with nx = ny = n and b replaced by the
 * direction. args are as for sr_kernel_run with nx = ny = n (args[b_index] is ignored, may be
 * NULL): **the caller passes the same data for the i and j variables** (x_i and x_j) and a
 * formula with F(x_i, x_j) = F(x_j, x_i); with desc->check_symmetry (the default) one random
 * test u.(Kv) = v.(Ku) (two extra mat-vecs) rejects an operator that is not symmetric. rhs holds
 * the n x dim(b) right-hand sides (row-major, kernel dtype), out receives a (same shape); the
 * dim(b) columns are solved together as one vector, as pykeops does. Stopping rule (pykeops'):
 * |r|^2 < n dim(b) eps^2, r = b - (alpha I + K) a, i.e. a residual whose RMS is below eps
 * (absolute: scale b accordingly). CG's vectors and scalars are double whatever the dtype.
 * Errors: SR_EINVAL (NULL arguments; not a Sum kernel or one with a weight; b_index not a
 * variable of the reduced index or of the wrong dimension; alpha < 0 or not finite; eps <= 0;
 * max_iter < 0; an operator found not symmetric or not positive definite), SR_ENOCONV (max_iter
 * iterations ran without meeting the rule: the message gives the iterations and the residual;
 * out is left unspecified), SR_EOVERFLOW (n * dim(b) values, or the solver's five float64
 * vectors of that length, overflow the address space), SR_ENOMEM, and those of sr_kernel_run.
 * n = 0 is a no-op. Thread-safe
 * like sr_kernel_run (docs/solve.md).
 */
typedef struct sr_solve_desc {
    int b_index;        /* the variable multiplied by F: the CG direction goes there */
    double alpha;       /* ridge, >= 0 */
    double eps;         /* tolerance, > 0; default 1e-6 (pykeops) */
    int max_iter;       /* iteration cap; 0 = 10 * n * dim(b) + 10 (pykeops has no cap) */
    int check_symmetry; /* nonzero: one random symmetry test before CG (default 1) */
} sr_solve_desc;

/* b_index 0, alpha 0, eps 1e-6, max_iter 0 (automatic), check_symmetry 1. */
SR_API sr_solve_desc sr_solve_desc_default(void);
SR_API sr_status sr_kernel_solve(const sr_kernel *kernel, const sr_solve_desc *desc, int64_t n,
                                 const void *const *args, const void *rhs, void *out);

/* Text describing the kernel, for people: the formula, the reduction, the backend and its plan.
 * The pointer is owned by the kernel and valid until sr_kernel_free. Programs that need to know
 * which plan runs read sr_kernel_plan instead: the text's wording is not an interface. */
SR_API const char *sr_kernel_explain(const sr_kernel *kernel);

/*
 * Waits until the kernel's tier is final. With SYMRED_JIT=async (the default) a CPU kernel is
 * served by the tile interpreter from its creation while its module compiles in the background,
 * and by the compiled code from the first call after it is ready (docs/tiers.md); this waits for
 * that compile to end (ready, or failed: the tile interpreter then keeps serving, and explain
 * says why). Kernels without a background compile return at once. timeout_s < 0: no limit.
 * Returns SR_OK when the tier is final, SR_ETIMEDOUT when timeout_s passed first, SR_EINVAL for a
 * NULL kernel. Thread-safe; never needed for correct results (every tier computes the same
 * values), only to time compiled code or to know it serves the next call.
 */
SR_API sr_status sr_kernel_wait(const sr_kernel *kernel, double timeout_s);

/* The most workspace in bytes one call of the kernel uses (all threads together), as planned at
 * creation under the context's memory budget; sr_kernel_explain says how it is made up. 0 for a
 * NULL kernel. */
SR_API int64_t sr_kernel_workspace_bytes(const sr_kernel *kernel);

/*
 * The plan a kernel runs, as data: what sr_kernel_explain says in words, for programs (tests,
 * benchmarks, bindings) that need to know which strategy, backend and tiles serve a kernel.
 *
 * Strategies, X(name, value, text); the values are ABI. The CUDA backend runs the direct and
 * the fused two-product strategies too (sr_plan_info.device tells the two apart).
 *   REFERENCE      the reference interpreter (SR_DEVICE_REFERENCE, or the CPU's fallback when
 *                  no C compiler can be run: sr_plan_info.fallback says why)
 *   DIRECT         generated code evaluates F per pair in registers (CPU JIT, CUDA)
 *   GEMM_EPILOGUE  a tile of inner products by a gemm, then F and the reduction on the tile
 *   FUSED          the fused two-product: a tile of F times the tile of B or of the softmax
 *                  weight (wide outputs, attention; CPU JIT, CUDA)
 *   SYMMETRIC      the fused two-product's symmetric driver (F(x, y) = F(y, x); it uses each
 *                  off-diagonal tile for both triangles when x and y are one array at run time,
 *                  and runs as FUSED otherwise)
 *   SUM_SPLIT      a Sum of F = F1 + F2 run as two kernels whose outputs add
 *   POST_REWRITE   the simplifier's reduction rewrite: an inner kernel reduces part of F, a post
 *                  formula gives the output once per output row
 */
#define SR_STRATEGY_MAP(X)                                                                         \
    X(REFERENCE, 0, "reference")                                                                   \
    X(DIRECT, 1, "direct")                                                                         \
    X(GEMM_EPILOGUE, 2, "gemm-epilogue")                                                           \
    X(FUSED, 3, "fused two-product")                                                               \
    X(SYMMETRIC, 4, "symmetric fused two-product")                                                 \
    X(SUM_SPLIT, 5, "sum split")                                                                   \
    X(POST_REWRITE, 6, "reduction rewrite")

typedef enum sr_strategy {
#define SR_STRATEGY_ENUM_(name, value, text) SR_STRATEGY_##name = value,
    SR_STRATEGY_MAP(SR_STRATEGY_ENUM_)
#undef SR_STRATEGY_ENUM_
} sr_strategy;

/* The static name of a strategy ("gemm-epilogue"; the text column above, which is also how
 * sr_kernel_explain names it), or NULL if s is not one. Thread-safe. */
SR_API const char *sr_strategy_name(sr_strategy s);

/*
 * What sr_kernel_plan reports. Growth: members are only ever appended. The caller sets size to
 * sizeof(sr_plan_info) as it was compiled:
 *
 *     sr_plan_info info = {0};
 *     info.size = sizeof info;
 *     if (sr_kernel_plan(k, &info) == SR_OK && info.strategy == SR_STRATEGY_GEMM_EPILOGUE) ...
 *
 * and the library fills the members it knows that fit in size bytes, zeroes the rest of those
 * bytes, and sets size to the bytes it filled, so that a program built against a newer header can
 * tell which members an older library wrote, and an older program never has bytes written past
 * its struct.
 *
 * A kernel composed of inner kernels (SUM_SPLIT, POST_REWRITE) reports its own strategy in
 * strategy and the strategy of the kernel that does its pair work in inner (for SUM_SPLIT the
 * first part's; both parts run a fused two-product); backend, device, tiles, tier and fallback
 * are that inner kernel's too, while the workspace and threads are the composed kernel's. Any
 * other kernel has inner == strategy. Every string is static (valid for the life of the
 * process) unless its member says that the kernel owns it (valid until sr_kernel_free).
 *
 * The members after fallback (the second version) say how the plan was reached and what the
 * code that runs is made of: where its compiled module came from, the planner's estimate and
 * candidates (sr_kernel_plan_candidate lists them), what the simplifier did, and the details of
 * the strategy's generated code. A member that does not apply to the kernel is 0 or NULL. The
 * members after rerank (the third version) detail the tile products and the sum split.
 */
typedef struct sr_plan_info {
    size_t size;          /* in: sizeof(sr_plan_info); out: the bytes the library filled */
    sr_strategy strategy; /* what runs the kernel */
    sr_strategy inner;    /* composed kernels: the strategy of their pair work; else strategy */
    const char *name;     /* sr_strategy_name(strategy) */
    const char *backend;  /* the backend that does the pair work: "cpu-jit", "reference", "cuda" */
    sr_device device;     /* where the pair work runs: SR_DEVICE_CPU, SR_DEVICE_CUDA, or
                             SR_DEVICE_REFERENCE for the reference interpreter */
    int tile_rows;        /* output rows per tile (per CUDA block); 0 where not tiled */
    int tile_cols;        /* reduced indices per tile; 0 where not tiled */
    int threads;          /* CPU threads a call uses (the budget and SYMRED_NUM_THREADS cap it) */
    int64_t workspace_bytes;      /* sr_kernel_workspace_bytes: all threads together */
    int64_t workspace_per_thread; /* the part each thread needs */
    /* 0: an interpreter (the reference or the tile interpreter) serves the calls; 1: compiled
     * code does. */
    int tier;
    /* 1 while a compile of the kernel's code is pending in the background, the calls meanwhile
     * served at tier 0; 0 once it has landed, and for every kernel whose code sr_kernel_new
     * compiled itself. */
    int compiling;
    /* Why the kernel runs on a fallback rather than the backend its device asked for (the
     * tile interpreter of a CPU kernel when no C compiler can be run, or SYMRED_JIT=off), or
     * NULL. */
    const char *fallback;
    /* How the kernel's device was decided: "the kernel's desc names it", or for SR_DEVICE_AUTO
     * the planner's choice and why (the device SYMRED_DEVICE names, else the CPU). */
    const char *device_why;
    /* Where the compiled module that serves the calls came from: "compiled" (the compiler ran
     * for it), "memory" (a module the context had loaded), "disk" (the disk cache); NULL while
     * no compiled code serves the calls (an interpreter; a compile pending or failed). A plan
     * of several modules names its first (the fused two-product's tile of F). */
    const char *module;
    /* The disk cache's part in it: "hit", "miss (stored)", "off: <why>", ...; NULL with module.
     * Owned by the kernel. */
    const char *module_cache;
    /* The cached shared object or the kept source of the module, or NULL. Owned by the kernel. */
    const char *module_path;
    double compile_ms; /* what obtaining the module took (compile or load), in ms */
    /* Why the background compile failed (the interpreter then serves the calls for good), or
     * NULL. Owned by the kernel. */
    const char *compile_error;
    /* The candidate plans the planner chose among (sr_kernel_plan_candidate); a reduction
     * rewrite's are its inner kernel's. 0 where there was no choice (the reference, the tile
     * interpreter, a sum split). */
    int plans;
    /* The chosen candidate's estimated time per (i, j) pair on one thread, in ns; 0: none. */
    double est_ns;
    int simplified; /* 1: the simplifier ran on the formula (SYMRED_SIMPLIFY is not 0) */
    /* The formula the kernel runs: the simplified one, with the expansion that a gemm strategy
     * took. Owned by the kernel's context; sr_expr_print prints it. */
    const sr_expr *formula;
    /* The simplifier's reduction rewrite ("sum-factor", ...; the strategy is POST_REWRITE on
     * the backends that run it), or NULL. */
    const char *rewrite;
    /* Subexpressions that do not depend on the pair, computed once per row, column or call. */
    int hoisted;
    /* The simplifier's cost estimate of the formula as run and as given, per (i, j) pair. */
    double flops_per_pair;
    double flops_per_pair_given;
    double bytes_per_pair; /* bytes of reduced-index operands read per pair */
    /* How the compiled code accumulates float32 sums (SR_ACC_BLOCK, SR_ACC_KAHAN, SR_ACC_F64;
     * SR_ACC_F64 for float64 kernels); SR_ACC_DEFAULT where no compiled code sums. */
    sr_acc acc;
    int io_native; /* 1: the generated code reads and writes the 16-bit arrays itself */
    /* What sr_kernel_eval_block runs now: 1 generated code, 2 the tile interpreter (tier 0),
     * 0 the reference interpreter. */
    int eval_block;
    /* The direct strategy's generated loop: 1 for the plain loop over the reduced index (wide
     * values, large contractions), 0 for the vectorised one; and the output rows per pass over
     * a tile (register blocking). */
    int loop_mode;
    int rows_per_pass;
    /* The tile interpreter's vector loops ("AVX-512", "AVX2", "baseline") where it serves the
     * calls, else NULL. */
    const char *tile_isa;
    /* The tile product of the gemm-epilogue and fused strategies: "avx512" (symred's AVX-512
     * gemm), "avx2" (symred's AVX2 strip products), "blis"; NULL for other strategies. */
    const char *product;
    /* The fused two-product: B is a formula of the reduced side, evaluated once per tile of
     * reduced indices (1), or an argument (0). */
    int b_hoisted;
    /* The gemm-epilogue's K-selections: the candidates its tiles keep are ranked again with F
     * as given (1), or not (0: SYMRED_GEMM_REFINE=off, or not a K-selection). */
    int rerank;
    /* The inner product F is computed from by a tile product rather than per pair: the values
     * in it (the gemm-epilogue's; the fused two-product's when F's tile, or a factor's, comes
     * from a tile of inner products), or 0. */
    int dot_dim;
    /* That tile product's register blocking on symred's AVX-512 gemm: the micro-kernel's rows
     * and columns, and the K block that dot_dim is split into; 0 on the other products. */
    int dot_mr;
    int dot_nr;
    int dot_kc;
    /* The fused two-product of SumSoftMaxWeight with F = c (x|y) on the AVX2 strip products: 1
     * when the tile of inner products is used as F's, its scale c applied inside the softmax's
     * exponentials (no tile of F is formed); else 0. */
    int scale_in_exp;
    /* The fused two-product on BLIS: the width that each pass's columns of B are padded to with
     * zero columns (a multiple of 4), or 0 where they are not padded. */
    int b_padded;
    /* The sum split of a Sum of F = F1 + F2 (SUM_SPLIT): whether it was weighed, and if so its
     * parts' and F whole's plans. Why a split that the formula admits is not applied, or NULL
     * (applied, or none admitted). Owned by the kernel. */
    const char *split_why;
    /* The parts whose plans were found (0, 1 or 2; the weighing stops at a part that rules the
     * split out), and part i's strategy and estimated time per pair (ns): on a SUM_SPLIT kernel
     * the strategies the parts run, else the plans they were offered. */
    int split_parts;
    sr_strategy split_strategy[2];
    double split_est_ns[2];
    /* F whole's best plan that the parts were weighed against, and its estimate (ns per pair;
     * 0: not found, then split_whole is meaningless). */
    sr_strategy split_whole;
    double split_whole_est_ns;
} sr_plan_info;

/* Fills *info with the plan of the kernel (above). info->size must be set first; sizes from
 * offsetof(sr_plan_info, fallback) + sizeof(const char *) up are accepted (the first version
 * of the struct). Errors: SR_EINVAL for a NULL kernel or info, or a smaller size (recorded in
 * the kernel's context when there is a kernel); *info is not written then. Thread-safe: it only
 * reads the immutable kernel, and may run while the kernel runs (not while it is freed). */
SR_API sr_status sr_kernel_plan(const sr_kernel *kernel, sr_plan_info *info);

/*
 * One of the candidate plans the planner chose among (sr_plan_info.plans of them): what the
 * backend offered before anything was compiled, with its estimate, and whether it was chosen
 * or rejected, and why. The chosen plan is the feasible one of least estimated time, unless an
 * option forces one. Same size protocol as sr_plan_info.
 */
typedef struct sr_plan_candidate {
    size_t size;          /* in: sizeof(sr_plan_candidate); out: the bytes the library filled */
    sr_strategy strategy; /* what the candidate would run */
    int chosen;           /* 1: the plan that runs */
    int feasible;         /* 0: rejected, why says why */
    int forced;           /* 1: an option asks for it (SYMRED_GEMM=on) */
    double est_ns;        /* estimated time per (i, j) pair on one thread, in ns; 0: none */
    double flops;         /* estimated flops per pair in generated code */
    double gemm_flops;    /* estimated flops per pair in the tile product */
    int tile_rows;        /* 0 where set only when realised */
    int tile_cols;
    int64_t workspace_per_thread; /* known before realising (a lower bound); 0: not known */
    const char *why; /* why rejected, or a note on the plan; "" if none. Owned by the kernel */
} sr_plan_candidate;

/* Fills *c with candidate i (0 <= i < sr_plan_info.plans) of the kernel's plan, the chosen one
 * first. c->size must be set first. Errors: SR_EINVAL for a NULL kernel or c, a size below
 * sizeof(sr_plan_candidate) as this header first defined it, or i out of range (recorded in the
 * kernel's context when there is a kernel); *c is not written then. Thread-safe like
 * sr_kernel_plan. */
SR_API sr_status sr_kernel_plan_candidate(const sr_kernel *kernel, int i, sr_plan_candidate *c);

/* Writes the values of the kernel's formula F (not the reduction) for the block of rows
 * [i0, i0 + ni) and columns [j0, j0 + nj) into out, row-major ni x nj x dim(F) values of the
 * kernel's dtype: out[((i - i0) * nj + (j - j0)) * dim(F) + c] = F(x_i, y_j)_c. args, nx and ny
 * are as for sr_kernel_run (all nx rows of the i-variables and ny rows of the j-variables; only
 * the block's rows are read); the block must lie inside [0, nx) x [0, ny). Whatever the kernel's
 * reduction and axis, the values are F's (a reduction rewrite of the simplifier does not
 * change them) and agree with the reference interpreter's within the tolerances of
 * docs/semantics.md ("Comparing backends", one term per output): a kernel on the CPU JIT's
 * direct strategy computes them with generated code (the same tiles and vectorised loop as its
 * reduction, in the kernel's dtype), in a module of its own that the kernel's first
 * sr_kernel_eval_block compiles (or finds in the caches): the kernel's cold creation does not pay
 * for it, its first block does, later blocks need no compile or cache lookup; while the tile
 * interpreter serves such a kernel's calls (tier 0: its module compiling in the background, or
 * its compile failed), and for a kernel the tile interpreter serves for good (no C compiler,
 * SYMRED_JIT=off), it computes the block too, in the kernel's dtype, with no wait; other kernels
 * (SR_DEVICE_REFERENCE, gemm-epilogue, CUDA, reduction rewrites) use the reference interpreter
 * (float64, rounded to the dtype); sr_plan_info.eval_block says which (1, 2, 0). This is the
 * building block of split-and-accumulate algorithms (e.g. the K_uf K_fu product of sparse GPs,
 * examples/sgpr.c) whose blocks the caller sizes from its memory budget; the call's own workspace
 * is one thread's kernel workspace (the JIT's tile) or a few values per formula node, per thread.
 * Errors: SR_EINVAL (NULL or missing arrays, a block outside the matrix, negative sizes),
 * SR_EOVERFLOW (ni * nj * dim(F) too large), SR_EBUDGET, SR_ENOMEM, and on the first call those of
 * a compile (SR_ECOMPILE, SR_EIO). Thread-safe like sr_kernel_run. */
SR_API sr_status sr_kernel_eval_block(const sr_kernel *kernel, int64_t nx, int64_t ny,
                                      const void *const *args, int64_t i0, int64_t ni, int64_t j0,
                                      int64_t nj, void *out);

/*
 * Chains of kernel matrices and dense matrices (src/core/chain.c).
 *
 * A chain is a product M1 · M2 · ... · Mn whose factors are kernel matrices (K_ij = f(x_i, y_j),
 * nx x ny, f a scalar formula with its arrays) and dense row-major matrices, e.g. K1·K2·V·W.
 * sr_chain_eval computes the product in the cheapest order, found by matrix-chain dynamic
 * programming over the sizes and the cost model (a kernel applied to a dense operand with c
 * columns costs nx·ny·(flops per pair of f + 2c); a dense product 2·a·b·c). A kernel matrix is
 * never materialised: it is only ever multiplied by a dense operand, through a Sum reduction
 * (K·B over j, D·K over i), so a chain needs at least one dense factor. Intermediate products
 * are dense. The kernels run on the default device with the chain's dtype; the dense products
 * accumulate in float64.
 *
 *   sr_chain *c;
 *   sr_chain_new(ctx, SR_F64, &c);
 *   sr_chain_kernel(c, f1, n, m, 2, (const void *[]){x, y});   // K1: n x m
 *   sr_chain_kernel(c, f2, m, m, 2, (const void *[]){y, y});   // K2: m x m
 *   sr_chain_dense(c, m, 3, V);                                // V:  m x 3
 *   sr_chain_eval(c, out);                                     // out: n x 3
 *   puts(sr_chain_explain(c));                                 // order: (K1*(K2*M3))
 *   sr_chain_free(c);
 *
 * sr_chain_kernel: f must have dimension 1 and take exactly nargs arrays (as sr_kernel_nargs
 * would count them: 1 + the largest variable index); its Vi variables have nx rows, its Vj
 * variables ny rows. The chain keeps the pointers (not copies) of args and of dense data until
 * sr_chain_free. Each factor's rows must equal the previous factor's columns (SR_EDIM).
 * sr_chain_plan chooses the order without evaluating (sr_chain_eval plans when needed);
 * sr_chain_explain then names the factors K<position> (kernel) and M<position> (dense) and shows
 * the order and its estimated cost, and sr_chain_order reports them as data (below).
 * sr_chain_eval writes rows(M1) x cols(Mn) values of the dtype.
 * Errors: SR_EINVAL (no dense factor, empty chain, NULL arguments, bad sizes), SR_EDIM, SR_ENOMEM,
 * SR_EOVERFLOW, and those of sr_kernel_new / sr_kernel_run.
 */
typedef struct sr_chain sr_chain;
SR_API sr_status sr_chain_new(sr_ctx *ctx, sr_dtype dtype, sr_chain **out);
SR_API sr_status sr_chain_kernel(sr_chain *chain, const sr_expr *f, int64_t nx, int64_t ny,
                                 int nargs, const void *const *args);
SR_API sr_status sr_chain_dense(sr_chain *chain, int64_t rows, int64_t cols, const void *data);
SR_API sr_status sr_chain_plan(sr_chain *chain);
SR_API sr_status sr_chain_eval(sr_chain *chain, void *out);
SR_API const char *sr_chain_explain(const sr_chain *chain);
SR_API void sr_chain_free(sr_chain *chain);

/*
 * The order a planned chain is evaluated in, as data. Same size protocol as sr_plan_info: the
 * caller sets size to sizeof(sr_chain_order_info), the library fills what fits, zeroes the rest
 * and sets size to the bytes it filled; members are only ever appended.
 */
typedef struct sr_chain_order_info {
    size_t size; /* in: sizeof(sr_chain_order_info); out: the bytes the library filled */
    int factors; /* the chain's factors */
    int kernels; /* of which kernel matrices */
    /* The product fully parenthesised, the factors named as sr_chain_explain names them, e.g.
     * "(K1*(K2*M3))". Owned by the chain: valid until sr_chain_free. */
    const char *order;
    /* The factor after which the last multiplication splits the chain: the product is
     * (factors 1..split)(factors split+1..n), 1-based; 0 for a chain of one factor. */
    int split;
    double cost; /* the order's estimated cost in flop-equivalents */
} sr_chain_order_info;

/* Fills *info with the order of the chain, which must have been planned (sr_chain_plan or
 * sr_chain_eval). info->size must be set first. Errors: SR_EINVAL for a NULL chain or info, a
 * size below sizeof(sr_chain_order_info) as this header first defined it, or a chain not yet
 * planned (recorded in the chain's context when there is a chain); *info is not written then.
 * Thread-safe while nothing changes the chain. */
SR_API sr_status sr_chain_order(const sr_chain *chain, sr_chain_order_info *info);

#ifdef __cplusplus
}
#endif
#endif /* SYMRED_H */
