/*
 * emit-ops.c — the C emitter's op spellings: the op table (one C template or emitter function per
 * op of EXPR_OP_MAP) and the helpers that name, reference and define a node's components in the
 * scope being emitted. emit-c.c places the nodes and writes the entry points around them;
 * emit-c.h is what the two share.
 */
#include "emit-c.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the op table: one C spelling per op ---------------------------------------------------
 * An op computed component by component has its template in the op table (the c column of
 * EXPR_OP_MAP, src/expr/expr.h). The others have none there and an emitter function here, in
 * c_fns: an op with neither is an internal error when it is emitted, never a silent default. */
typedef void (*emit_fn)(struct emitter *E, const sr_expr *e);

static void e_var(struct emitter *E, const sr_expr *e);
static void e_const(struct emitter *E, const sr_expr *e);
static void e_pow(struct emitter *E, const sr_expr *e);
static void e_round(struct emitter *E, const sr_expr *e);
static const char *t_diff(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_sfmt(E, "(%s) - (%s)", jit_ref(E, e->child[0], i), jit_ref(E, e->child[1], i));
}
static const char *t_self(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_ref(E, e, i);
}
static const char *t_sqself(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_sfmt(E, "sr_sq(%s)", jit_ref(E, e, i));
}

static void e_sqnorm(struct emitter *E, const sr_expr *e);
static void e_normalize(struct emitter *E, const sr_expr *e);
static void e_pair(struct emitter *E, const sr_expr *e);
static void e_sum(struct emitter *E, const sr_expr *e);
static void e_minmax(struct emitter *E, const sr_expr *e);
static void e_slice(struct emitter *E, const sr_expr *e);
static void e_onehot(struct emitter *E, const sr_expr *e);
static void e_matvec(struct emitter *E, const sr_expr *e);
static void e_tensor(struct emitter *E, const sr_expr *e);
static void e_weighted(struct emitter *E, const sr_expr *e);
static void e_tensordot(struct emitter *E, const sr_expr *e);
static void e_complex(struct emitter *E, const sr_expr *e);
static void e_csum(struct emitter *E, const sr_expr *e);

static const emit_fn c_fns[OP_COUNT] = {
    [OP_VAR] = e_var,
    [OP_INTCST] = e_const,
    [OP_RATCST] = e_const,
    [OP_CST] = e_const,
    [OP_POW] = e_pow,
    [OP_ROUND] = e_round,
    [OP_SQNORM2] = e_sqnorm,
    [OP_NORM2] = e_sqnorm,
    [OP_NORMALIZE] = e_normalize,
    [OP_SQDIST] = e_pair,
    [OP_SCALPROD] = e_pair,
    [OP_SUM] = e_sum,
    [OP_MAX] = e_minmax,
    [OP_MIN] = e_minmax,
    [OP_ARGMAX] = e_minmax,
    [OP_ARGMIN] = e_minmax,
    [OP_ELEM] = e_slice,
    [OP_EXTRACT] = e_slice,
    [OP_CONCAT] = e_slice,
    [OP_ONEHOT] = e_onehot,
    [OP_MATVECMULT] = e_matvec,
    [OP_VECMATMULT] = e_matvec,
    [OP_TENSORPROD] = e_tensor,
    [OP_WEIGHTEDSQNORM] = e_weighted,
    [OP_WEIGHTEDSQDIST] = e_weighted,
    [OP_SUMT] = e_slice,
    [OP_ELEMT] = e_slice,
    [OP_EXTRACTT] = e_slice,
    [OP_TENSORDOT] = e_tensordot,
    [OP_CADD] = e_complex,
    [OP_CSUB] = e_complex,
    [OP_CMULT] = e_complex,
    [OP_CDIV] = e_complex,
    [OP_CSCAL] = e_complex,
    [OP_CREALSCAL] = e_complex,
    [OP_CONJ] = e_complex,
    [OP_CEXP] = e_complex,
    [OP_CEXP1J] = e_complex,
    [OP_REAL2C] = e_complex,
    [OP_IMAG2C] = e_complex,
    [OP_CSUMT] = e_complex,
    [OP_CREAL] = e_complex,
    [OP_CIMAG] = e_complex,
    [OP_CABS] = e_complex,
    [OP_CSQUAREABS] = e_complex,
    [OP_CANGLE] = e_complex,
    [OP_CSUM] = e_csum,
};

/* ---- helpers --------------------------------------------------------------------------------
 * Nodes of dimension <= JIT_BIG are "small": one named scalar per component (v<id>_<c>), and
 * vector ops are unrolled. Larger ("big") nodes are never unrolled: a variable is read in place
 * (or from its tile column), an elementwise node is "lazy" (its expression is inlined where a
 * component is used, inside a loop over the components), and the few other big ops are
 * materialised as arrays, which only the per-call and per-row scopes allow. jit_ref() gives the C
 * expression of one component, for a constant or a loop index. */

char *jit_sfmt(struct emitter *E, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (!s || E->nstr == E->capstr) {
        size_t cap = E->capstr ? 2 * E->capstr : 256;
        char **p = s ? realloc(E->strs, cap * sizeof *p) : NULL;
        if (!p) {
            free(s);
            E->fail = SR_ENOMEM;
            return (char *)"0";
        }
        E->strs = p;
        E->capstr = cap;
    }
    E->strs[E->nstr++] = s;
    return s;
}

static bool is_num(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

static const char *lazy_expr(struct emitter *E, const sr_expr *e, const char *idx);

/* The C expression of component idx of e in the current scope. */
const char *jit_ref(struct emitter *E, const sr_expr *e, const char *idx)
{
    if (e->dim == 1)
        idx = "0";
    if (!big(e)) {
        if (is_num(idx))
            return jit_sfmt(E, "v%u_%s", (unsigned)e->id, idx);
        /* A small node's components have names, not indices: inside a loop over a big node
         * made of small ones (a Concat of small parts, a wide F), a selection among them. */
        const char *x = jit_sfmt(E, "v%u_%d", (unsigned)e->id, e->dim - 1);
        for (int c = e->dim - 1; c-- > 0;)
            x = jit_sfmt(E, "((%s) == %d ? v%u_%d : %s)", idx, c, (unsigned)e->id, c, x);
        return x;
    }
    size_t p = pos(E, e);
    if (E->col[p] >= 0 && (E->scope == PL_PAIR || (e->op != OP_VAR && !jit_lazy_op(E, e))))
        return jit_sfmt(E, "tb[(%d + %s) * SR_TJ + jj]", E->col[p], idx);
    if (e->op == OP_VAR) {
        int v = (int)e->iattr[0];
        if (e->iattr[1] == SR_CAT_PARAM)
            return jit_sfmt(E, "SR_LD(a%d[%s])", v, idx);
        if (e->deps & E->outer_dep)
            return jit_sfmt(E, "SR_LD(a%d[o * %d + %s])", v, e->dim, idx);
        if (E->scope == PL_INNER)
            return jit_sfmt(E, "SR_LD(a%d[r * %d + %s])", v, e->dim, idx);
        E->fail = SR_EINTERNAL; /* an inner variable in the pair loop has a column */
        return "0";
    }
    /* Parenthesised: a lazy node's expression (a conditional, a quotient) is an operand of
     * whatever the caller writes around it (`a * b`). */
    if (jit_lazy_op(E, e))
        return jit_sfmt(E, "(%s)", lazy_expr(E, e, idx));
    return jit_sfmt(E, "v%u[%s]", (unsigned)e->id, idx);
}

const char *jit_ref_c(struct emitter *E, const sr_expr *e, int c)
{
    char idx[16];
    snprintf(idx, sizeof idx, "%d", c);
    return jit_ref(E, e, idx);
}

/* The name of component c of node e, which is being defined (a small node's scalar). */
const char *jit_nm(const sr_expr *e, int c, char *buf)
{
    if (e->dim == 1)
        c = 0;
    snprintf(buf, 32, "v%u_%d", (unsigned)e->id, c);
    return buf;
}

/* A double constant as an exact C literal of the dtype. */
static const char *lit(struct emitter *E, double v)
{
    if (isnan(v))
        return jit_sfmt(E, "(%s)__builtin_nan(\"\")", T(E));
    if (isinf(v))
        return jit_sfmt(E, "(%s)(%s__builtin_inf())", T(E), v < 0 ? "-" : "");
    return jit_sfmt(E, "(%s)%a", T(E), v);
}

/* Where component idx of the big node e is stored: its array, or in the per-index pre-pass its
 * tile column. */
static const char *dst(struct emitter *E, const sr_expr *e, const char *idx)
{
    size_t p = pos(E, e);
    if (E->scope == PL_INNER && E->col[p] >= 0)
        return jit_sfmt(E, "tb[(%d + %s) * SR_TJ + jj]", E->col[p], idx);
    return jit_sfmt(E, "v%u[%s]", (unsigned)e->id, idx);
}

/* A big node computed into its array (compact emission, or an op with no inlined form): one loop
 * over its components. */
static void big_loop(struct emitter *E, const sr_expr *e, const char *x)
{
    P("        for (int q_ = 0; q_ < %d; q_++) %s = %s;\n", e->dim, dst(E, e, "q_"), x);
}

/* Starts the definition of component c of e: a const scalar, or an element of e's array. */
static void def(struct emitter *E, const sr_expr *e, int c)
{
    char n[32];
    if (big(e))
        P("        %s = ", dst(E, e, jit_sfmt(E, "%d", c)));
    else
        P("        const %s %s = ", T(E), jit_nm(e, c, n));
}

static void e_var(struct emitter *E, const sr_expr *e)
{
    int v = (int)e->iattr[0], cat = (int)e->iattr[1];
    const char *idx = cat == SR_CAT_PARAM ? "0" : (e->deps & E->outer_dep) ? "o" : "r";
    for (int c = 0; c < e->dim; c++) {
        def(E, e, c);
        P("SR_LD(a%d[%s * %d + %d]);\n", v, idx, e->dim, c);
    }
}

static void e_const(struct emitter *E, const sr_expr *e)
{
    double v = e->op == OP_INTCST   ? (double)e->iattr[0]
               : e->op == OP_RATCST ? (double)e->iattr[0] / (double)e->iattr[1]
                                    : e->fattr;
    def(E, e, 0);
    P("%s;\n", lit(E, v));
}

/* Expands an elementwise template for component idx. */
static const char *ew_expr(struct emitter *E, const sr_expr *e, const char *tmpl, const char *idx)
{
    struct expr_buf b = {0};
    for (const char *p = tmpl; *p; p++) {
        if (*p != '$') {
            expr_buf_printf(&b, "%c", *p);
            continue;
        }
        p++;
        if (*p >= 'a' && *p <= 'c')
            expr_buf_printf(&b, "(%s)", jit_ref(E, e->child[*p - 'a'], idx));
        else if (*p == 'F')
            expr_buf_printf(&b, "%s", E->fs);
        else if (*p == 'T')
            expr_buf_printf(&b, "%s", T(E));
        else if (*p == '0' || *p == '1')
            expr_buf_printf(&b, "%lld", (long long)e->iattr[*p - '0']);
    }
    if (b.oom || !b.data) {
        free(b.data);
        E->fail = SR_ENOMEM;
        return "0";
    }
    char *s = jit_sfmt(E, "%s", b.data);
    free(b.data);
    return s;
}

static void ew(struct emitter *E, const sr_expr *e, const char *tmpl)
{
    if (big(e)) {
        big_loop(E, e, ew_expr(E, e, tmpl, "q_"));
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        const char *x = ew_expr(E, e, tmpl, jit_sfmt(E, "%d", c));
        def(E, e, c);
        P("%s;\n", x);
    }
}

static const char *round_expr(struct emitter *E, const sr_expr *e, const char *idx)
{
    const char *s = lit(E, pow(10.0, (double)e->iattr[0]));
    return jit_sfmt(E, "round%s((%s) * %s) / %s", E->fs, jit_ref(E, e->child[0], idx), s, s);
}

static void e_round(struct emitter *E, const sr_expr *e)
{
    if (big(e)) {
        big_loop(E, e, round_expr(E, e, "q_"));
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        const char *x = round_expr(E, e, jit_sfmt(E, "%d", c));
        def(E, e, c);
        P("%s;\n", x);
    }
}

static void e_pow(struct emitter *E, const sr_expr *e)
{
    char n[32];
    long long p = e->iattr[0], q = p < 0 ? -p : p;
    if (big(e)) {
        /* One loop over the components: unrolled, a wide Pow is thousands of statements in
         * one basic block, which a C compiler takes minutes to optimise. */
        const char *a = jit_ref(E, e->child[0], "q_");
        P("        for (int q_ = 0; q_ < %d; q_++) {\n            %s p_ = %s;\n", e->dim, T(E),
          q == 0 ? "1" : a);
        if (q > 1)
            P("            for (int m_ = 1; m_ < %lld; m_++) p_ = p_ * %s;\n", q, a);
        P("            %s = %sp_;\n        }\n", dst(E, e, "q_"),
          p < 0 ? jit_sfmt(E, "(%s)1 / ", T(E)) : "");
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        const char *a = jit_ref_c(E, e->child[0], c);
        jit_nm(e, c, n);
        if (q == 0) {
            def(E, e, c);
            P("(%s)1;\n", T(E));
            continue;
        }
        /* Repeated multiplication, as the reference does. */
        P("        %s %s_p = %s;\n", T(E), n, a);
        if (q <= 16)
            for (long long i = 1; i < q; i++)
                P("        %s_p = %s_p * %s;\n", n, n, a);
        else
            P("        for (int q_ = 1; q_ < %lld; q_++) %s_p = %s_p * %s;\n", q, n, n, a);
        def(E, e, c);
        if (p < 0)
            P("(%s)1 / %s_p;\n", T(E), n);
        else
            P("%s_p;\n", n);
    }
}

/* Emits "acc += term(k)" for k < n, unrolled or as a loop over q_, with the component terms
 * given by fn. */
typedef const char *(*term_fn)(struct emitter *E, const sr_expr *e, const char *idx);

static void sum_terms(struct emitter *E, const sr_expr *e, const char *acc, int n, bool loop,
                      term_fn fn)
{
    /* In the pair loop a sum over a big node's components is unrolled up to JIT_PAIR_UNROLL
     * terms: gcc does not vectorise the `omp simd` loop over the reduced index around an inner
     * loop, and the kernel ran 10x slower at D = 17 than at D = 16 (bench-gemm --dims). */
    if (loop && E->scope == PL_PAIR && n <= JIT_PAIR_UNROLL)
        loop = false;
    if (loop) {
        const char *t = fn(E, e, "q_");
        /* gemm-epilogue: the long row and column norms run outside any simd loop; let them
         * vectorise along the vector (reassociated, as the gemm's own sums are). */
        if (E->gemm && E->scope != PL_PAIR)
            P("#pragma omp simd reduction(+:%s)\n", acc);
        P("        for (int q_ = 0; q_ < %d; q_++) { %s += %s; }\n", n, acc, t);
    } else {
        for (int c = 0; c < n; c++)
            P("        %s += %s;\n", acc, fn(E, e, jit_sfmt(E, "%d", c)));
    }
}

/* Emits "acc += base(k)^2" for k < n like sum_terms(sq), where sq spells base(k)^2; unrolled,
 * each product is fused into the sum (SR_FMA, one rounding): every term is >= 0, so fusing
 * changes the rounding only, never an infinity or a NaN (docs/semantics.md). A loop (a long
 * norm outside the pair loop) adds the rounded squares, as the gemm-epilogue's vectorised
 * reduction wants. */
static void sum_squares(struct emitter *E, const sr_expr *e, const char *acc, int n, bool loop,
                        term_fn sq, term_fn base)
{
    if (loop && !(E->scope == PL_PAIR && n <= JIT_PAIR_UNROLL)) {
        sum_terms(E, e, acc, n, loop, sq);
        return;
    }
    for (int c = 0; c < n; c++)
        P("        { const %s b_ = %s; %s = SR_FMA(b_, b_, %s); }\n", T(E),
          base(E, e, jit_sfmt(E, "%d", c)), acc, acc);
}

static const char *t_square(struct emitter *E, const sr_expr *e, const char *i)
{
    const char *a = jit_ref(E, e->child[0], i);
    return jit_sfmt(E, "(%s) * (%s)", a, a);
}
static const char *t_plain(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_ref(E, e->child[0], i);
}
static const char *t_prod(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_sfmt(E, "(%s) * (%s)", jit_ref(E, e->child[0], i), jit_ref(E, e->child[1], i));
}
static const char *t_sqdiff(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_sfmt(E, "sr_sq((%s) - (%s))", jit_ref(E, e->child[0], i),
                    jit_ref(E, e->child[1], i));
}

static void e_sqnorm(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const sr_expr *x = e->child[0];
    jit_nm(e, 0, n);
    P("        %s %s_s = 0;\n", T(E), n);
    sum_squares(E, e, jit_sfmt(E, "%s_s", n), x->dim, big(x), t_square, t_plain);
    def(E, e, 0);
    if (e->op == OP_NORM2)
        P("sqrt%s(%s_s);\n", E->fs, n);
    else
        P("%s_s;\n", n);
}

static void e_normalize(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const sr_expr *x = e->child[0];
    jit_nm(e, 0, n);
    P("        %s %s_s = 0;\n", T(E), n);
    sum_squares(E, e, jit_sfmt(E, "%s_s", n), x->dim, big(x), t_square, t_plain);
    P("        const %s %s_r = %s_s == 0 ? (%s)0 : (%s)1 / sqrt%s(%s_s);\n", T(E), n, n, T(E), T(E),
      E->fs, n);
    if (big(e)) {
        P("        for (int q_ = 0; q_ < %d; q_++) %s = (%s) * %s_r;\n", e->dim, dst(E, e, "q_"),
          jit_ref(E, x, "q_"), n);
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        const char *a = jit_ref_c(E, x, c);
        def(E, e, c);
        P("%s * %s_r;\n", a, n);
    }
}

/* A small difference a - b or b - a of SqDist(a, b)'s operands that is computed in the same scope
 * before it, or NULL: SqDist then squares its components, bitwise the same terms ((b - a)^2 is
 * (a - b)^2 in IEEE arithmetic), without computing the differences again. A gradient has both:
 * d/dx Exp(-SqDist(x,y)*g) is a multiple of (x - y) times the same exponential. */
static const sr_expr *defined_diff(const struct emitter *E, const sr_expr *e)
{
    const sr_expr *a = e->child[0], *b = e->child[1];
    if (big(a) || a->dim != b->dim)
        return NULL;
    for (size_t i = 0; i < E->n && E->order[i] != e; i++) {
        const sr_expr *d = E->order[i];
        if (d->op == OP_SUB && E->place[i] == E->place[pos(E, e)] && d->dim == a->dim &&
            ((d->child[0] == a && d->child[1] == b) || (d->child[0] == b && d->child[1] == a)))
            return d;
    }
    return NULL;
}

static void e_pair(struct emitter *E, const sr_expr *e)
{
    char n[32];
    if (e == E->gemm) {
        /* The gemm-epilogue strategy computed this inner product with a tile gemm: the runtime
         * passes the tile of rows [o0, o1) x reduced indices [r0, r1), leading dimension SR_GLD. */
        def(E, e, 0);
        P("sr_gt[(o - o0) * SR_GLD + (rt - r0 + jj)];\n");
        return;
    }
    jit_nm(e, 0, n);
    P("        %s %s_s = 0;\n", T(E), n);
    const sr_expr *d = e->op == OP_SQDIST ? defined_diff(E, e) : NULL;
    if (d)
        sum_squares(E, d, jit_sfmt(E, "%s_s", n), d->dim, false, t_sqself, t_self);
    else if (e->op == OP_SQDIST)
        sum_squares(E, e, jit_sfmt(E, "%s_s", n), e->child[0]->dim, big(e->child[0]), t_sqdiff,
                    t_diff);
    else
        sum_terms(E, e, jit_sfmt(E, "%s_s", n), e->child[0]->dim, big(e->child[0]), t_prod);
    def(E, e, 0);
    P("%s_s;\n", n);
}

static void e_sum(struct emitter *E, const sr_expr *e)
{
    char n[32];
    jit_nm(e, 0, n);
    P("        %s %s_s = 0;\n", T(E), n);
    sum_terms(E, e, jit_sfmt(E, "%s_s", n), e->child[0]->dim, big(e->child[0]), t_plain);
    def(E, e, 0);
    P("%s_s;\n", n);
}

/* Max/Min/ArgMax/ArgMin of the components: the first extreme, or the first NaN. */
static void e_minmax(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const sr_expr *x = e->child[0];
    const char *cmp = (e->op == OP_MAX || e->op == OP_ARGMAX) ? ">" : "<";
    bool arg = e->op == OP_ARGMAX || e->op == OP_ARGMIN;
    jit_nm(e, 0, n);
    P("        %s %s_m = %s; int %s_i = 0;\n", T(E), n, jit_ref_c(E, x, 0), n);
    const char *step = "        { const %s a_ = %s; const int t_ = %s_m == %s_m && (a_ %s %s_m || "
                       "a_ != a_); %s_m = t_ ? a_ : %s_m; %s_i = t_ ? %s : %s_i; }\n";
    if (big(x)) {
        P("        for (int q_ = 1; q_ < %d; q_++)\n", x->dim);
        P(step, T(E), jit_ref(E, x, "q_"), n, n, cmp, n, n, n, n, "q_", n);
    } else {
        for (int c = 1; c < x->dim; c++)
            P(step, T(E), jit_ref_c(E, x, c), n, n, cmp, n, n, n, n, jit_sfmt(E, "%d", c), n);
    }
    def(E, e, 0);
    if (arg)
        P("(%s)%s_i;\n", T(E), n);
    else
        P("%s_m;\n", n);
}

/* Component idx of ExtractT: the operand's component idx - start inside the window, else 0. */
static const char *extractt_expr(struct emitter *E, const sr_expr *e, const char *idx)
{
    const sr_expr *a = e->child[0];
    long long s = e->iattr[0];
    const char *zero = jit_sfmt(E, "(%s)0", T(E));
    if (is_num(idx)) {
        long long c = atoll(idx) - s;
        return c >= 0 && c < a->dim ? jit_ref_c(E, a, (int)c) : zero;
    }
    return jit_sfmt(E, "((%s) >= %lld && (%s) < %lld ? %s : %s)", idx, s, idx, s + a->dim,
                    jit_ref(E, a, jit_sfmt(E, "((%s) - %lld)", idx, s)), zero);
}

static const char *slice_expr(struct emitter *E, const sr_expr *e, const char *idx)
{
    if (e->op == OP_SUMT)
        return jit_ref_c(E, e->child[0], 0);
    if (e->op == OP_ELEMT) {
        long long m = e->iattr[1];
        const char *a = jit_ref_c(E, e->child[0], 0), *zero = jit_sfmt(E, "(%s)0", T(E));
        if (is_num(idx))
            return atoll(idx) == m ? a : zero;
        return jit_sfmt(E, "((%s) == %lld ? %s : %s)", idx, m, a, zero);
    }
    if (e->op == OP_EXTRACTT)
        return extractt_expr(E, e, idx);
    if (e->op == OP_ELEM)
        return jit_ref_c(E, e->child[0], (int)e->iattr[0]);
    if (e->op == OP_EXTRACT) {
        if (is_num(idx))
            return jit_ref_c(E, e->child[0], (int)e->iattr[0] + atoi(idx));
        return jit_ref(E, e->child[0], jit_sfmt(E, "(%lld + %s)", (long long)e->iattr[0], idx));
    }
    const sr_expr *a = e->child[0], *b = e->child[1];
    if (is_num(idx)) {
        int c = atoi(idx);
        return c < a->dim ? jit_ref_c(E, a, c) : jit_ref_c(E, b, c - a->dim);
    }
    return jit_sfmt(E, "(%s < %d ? %s : %s)", idx, a->dim, jit_ref(E, a, idx),
                    jit_ref(E, b, jit_sfmt(E, "(%s - %d)", idx, a->dim)));
}

static void e_slice(struct emitter *E, const sr_expr *e)
{
    for (int c = 0; c < e->dim; c++) {
        const char *x = slice_expr(E, e, jit_sfmt(E, "%d", c));
        def(E, e, c);
        P("%s;\n", x);
    }
}

static void e_onehot(struct emitter *E, const sr_expr *e)
{
    char n[32];
    jit_nm(e, 0, n);
    P("        const %s %s_r = round%s(%s);\n", T(E), n, E->fs, jit_ref_c(E, e->child[0], 0));
    if (big(e)) {
        big_loop(E, e, jit_sfmt(E, "%s_r == (%s)q_ ? (%s)1 : (%s)0", n, T(E), T(E), T(E)));
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        def(E, e, c);
        P("%s_r == (%s)%d ? (%s)1 : (%s)0;\n", n, T(E), c, T(E), T(E));
    }
}

int64_t jit_unrolled_terms(const sr_expr *e)
{
    if (e->op == OP_TENSORDOT)
        return (int64_t)e->dim * expr_tdot_of(e)->ncont;
    if (e->op == OP_MATVECMULT)
        return (int64_t)e->dim * e->child[1]->dim;
    if (e->op == OP_VECMATMULT)
        return (int64_t)e->dim * e->child[0]->dim;
    return 0;
}

/* A contraction out[o] = sum over c of a[ia(o, c)] * b[ib(o, c)], both indices linear in the
 * row-major multi-indices of o (axes osize) and c (axes csize): ia = o's axis indices times oa
 * plus c's times ca (ib likewise with ob and cb). */
struct contraction {
    int no, nc;
    const int64_t *osize, *oa, *ob, *csize, *ca, *cb;
};

/* The C expression of the offset that the index var (over the axes size[0..n), row-major)
 * moves an operand by: its axis indices times stride. */
static const char *lin_index(struct emitter *E, const char *var, int n, const int64_t *size,
                             const int64_t *stride)
{
    const char *x = "0";
    int64_t div = 1;
    for (int p = n; p-- > 0;) {
        if (stride[p] != 0) {
            const char *q = div == 1 ? var : jit_sfmt(E, "(%s / %lld)", var, (long long)div);
            if (p > 0)
                q = jit_sfmt(E, "(%s %% %lld)", q, (long long)size[p]);
            x = jit_sfmt(E, "%s + %s * %lld", x, q, (long long)stride[p]);
        }
        div *= size[p];
    }
    return x;
}

/* Component idx (an expression) of the contraction operand x; a small operand of more than one
 * component was copied into the local array name, its components being named scalars. */
static const char *operand(struct emitter *E, const sr_expr *x, const char *name, const char *idx)
{
    if (big(x) || x->dim == 1)
        return jit_ref(E, x, jit_sfmt(E, "(%s)", idx));
    return jit_sfmt(E, "%s[%s]", name, idx);
}

/* Emits e (a TensorDot, MatVecMult or VecMatMult of more than JIT_UNROLL_TERMS terms) as loops
 * over the output components and the contracted ones, the terms summed in increasing order of
 * the contracted index as the reference sums them. */
static void contract_loops(struct emitter *E, const sr_expr *e, const struct contraction *t,
                           int64_t ncont)
{
    char n[32];
    jit_nm(e, 0, n);
    const char *nm[2];
    for (int s = 0; s < 2; s++) {
        const sr_expr *x = e->child[s];
        nm[s] = jit_sfmt(E, "%s_x%d", n, s);
        if (big(x) || x->dim == 1)
            continue;
        P("        const %s %s[%d] = {", T(E), nm[s], x->dim);
        for (int c = 0; c < x->dim; c++)
            P("%s%s", c ? ", " : "", jit_ref_c(E, x, c));
        P("};\n");
    }
    if (!big(e))
        P("        %s %s_t[%d];\n", T(E), n, e->dim);
    const char *ia = lin_index(E, "td_c", t->nc, t->csize, t->ca),
               *ib = lin_index(E, "td_c", t->nc, t->csize, t->cb);
    P("        for (int td_o = 0; td_o < %d; td_o++) {\n", e->dim);
    P("          const int td_a = %s, td_b = %s;\n", lin_index(E, "td_o", t->no, t->osize, t->oa),
      lin_index(E, "td_o", t->no, t->osize, t->ob));
    P("          %s td_s = 0;\n", T(E));
    P("          for (int td_c = 0; td_c < %lld; td_c++) td_s += %s * %s;\n", (long long)ncont,
      operand(E, e->child[0], nm[0], jit_sfmt(E, "td_a + %s", ia)),
      operand(E, e->child[1], nm[1], jit_sfmt(E, "td_b + %s", ib)));
    P("          %s = td_s;\n        }\n",
      big(e) ? dst(E, e, "td_o") : jit_sfmt(E, "%s_t[td_o]", n));
    if (big(e))
        return;
    for (int c = 0; c < e->dim; c++) {
        def(E, e, c);
        P("%s_t[%d];\n", n, c);
    }
}

static void e_matvec(struct emitter *E, const sr_expr *e)
{
    char n[32];
    bool mv = e->op == OP_MATVECMULT;
    const sr_expr *A = mv ? e->child[0] : e->child[1], *v = mv ? e->child[1] : e->child[0];
    int rows = mv ? e->dim : v->dim, cols = mv ? v->dim : e->dim;
    if (jit_unrolled_terms(e) > jit_unroll_limit(E)) {
        /* MatVecMult: out[o] = sum_q A[o cols + q] v[q]; VecMatMult: sum_q v[q] A[q cols + o]. */
        const int64_t os = e->dim, cs = mv ? cols : rows, one = 1, zero = 0, w = cols;
        struct contraction t = {1,   1,    &os,           mv ? &w : &zero, mv ? &zero : &one,
                                &cs, &one, mv ? &one : &w};
        contract_loops(E, e, &t, cs);
        return;
    }
    for (int o = 0; o < e->dim; o++) {
        jit_nm(e, o, n);
        P("        %s %s_s = 0;\n", T(E), n);
        int len = mv ? cols : rows;
        for (int q = 0; q < len; q++) {
            int r = mv ? o : q, c = mv ? q : o;
            const char *a = jit_ref_c(E, A, r * cols + c), *b = jit_ref_c(E, v, q);
            P("        %s_s += %s * %s;\n", n, a, b);
        }
        def(E, e, o);
        P("%s_s;\n", n);
    }
}

static void e_tensor(struct emitter *E, const sr_expr *e)
{
    const sr_expr *x = e->child[0], *y = e->child[1];
    if (big(e)) {
        const char *a = jit_ref(E, x, jit_sfmt(E, "q_ / %d", y->dim)),
                   *b = jit_ref(E, y, jit_sfmt(E, "q_ %% %d", y->dim));
        big_loop(E, e, jit_sfmt(E, "%s * %s", a, b));
        return;
    }
    for (int i = 0; i < x->dim; i++)
        for (int j = 0; j < y->dim; j++) {
            const char *a = jit_ref_c(E, x, i), *b = jit_ref_c(E, y, j);
            def(E, e, i * y->dim + j);
            P("%s * %s;\n", a, b);
        }
}

/* Up to JIT_UNROLL_TERMS terms, every output component unrolled: its terms in increasing order
 * of the contracted index, as the reference sums them; loops beyond. */
static void e_tensordot(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const struct expr_tdot *t = expr_tdot_of(e);
    if (jit_unrolled_terms(e) > jit_unroll_limit(E)) {
        struct contraction c = {t->nout,      t->key.nc, t->osize,     t->ostride_a,
                                t->ostride_b, t->csize,  t->cstride_a, t->cstride_b};
        contract_loops(E, e, &c, t->ncont);
        return;
    }
    for (int o = 0; o < e->dim; o++) {
        jit_nm(e, o, n);
        P("        %s %s_s = 0;\n", T(E), n);
        for (int64_t c = 0; c < t->ncont; c++) {
            int64_t ia, ib;
            expr_tdot_index(t, o, c, &ia, &ib);
            const char *a = jit_ref_c(E, e->child[0], (int)ia),
                       *b = jit_ref_c(E, e->child[1], (int)ib);
            P("        %s_s += %s * %s;\n", n, a, b);
        }
        def(E, e, o);
        P("%s_s;\n", n);
    }
}

/* Component idx of the point (or the difference) that a weighted norm measures. */
static const char *wdiff(struct emitter *E, const sr_expr *e, const char *idx)
{
    if (e->op == OP_WEIGHTEDSQDIST)
        return jit_sfmt(E, "((%s) - (%s))", jit_ref(E, e->child[1], idx),
                        jit_ref(E, e->child[2], idx));
    return jit_sfmt(E, "(%s)", jit_ref(E, e->child[1], idx));
}

static const char *t_wsquare(struct emitter *E, const sr_expr *e, const char *i)
{
    return jit_sfmt(E, "sr_sq%s", wdiff(E, e, i));
}

/* A scalar weight multiplies the finished sum, w·Σa_k² (semantics.md): weighting each term
 * instead would make w = ±inf with a zero component NaN where the documented value is infinite. */
static void e_weighted(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const sr_expr *W = e->child[0], *x = e->child[1];
    int d = x->dim;
    bool full = W->dim == d * d && d > 1;
    jit_nm(e, 0, n);
    P("        %s %s_s = 0;\n", T(E), n);
    if (W->dim == 1) {
        sum_squares(E, e, jit_sfmt(E, "%s_s", n), d, big(x), t_wsquare, wdiff);
        def(E, e, 0);
        P("(%s) * %s_s;\n", jit_ref_c(E, W, 0), n);
        return;
    }
    if (big(x) || big(W)) {
        if (full)
            P("        for (int r_ = 0; r_ < %d; r_++) { %s t_ = 0; for (int q_ = 0; q_ < %d; "
              "q_++) "
              "t_ += (%s) * %s; %s_s += %s * t_; }\n",
              d, T(E), d, jit_ref(E, W, jit_sfmt(E, "(r_ * %d + q_)", d)), wdiff(E, e, "q_"), n,
              wdiff(E, e, "r_"));
        else
            P("        for (int q_ = 0; q_ < %d; q_++) %s_s += (%s) * sr_sq(%s);\n", d, n,
              jit_ref(E, W, "q_"), wdiff(E, e, "q_"));
    } else {
        for (int c = 0; c < d; c++)
            P("        const %s %s_d%d = %s;\n", T(E), n, c, wdiff(E, e, jit_sfmt(E, "%d", c)));
        if (full) {
            for (int r = 0; r < d; r++) {
                P("        { %s t_ = 0;", T(E));
                for (int c = 0; c < d; c++)
                    P(" t_ += %s * %s_d%d;", jit_ref_c(E, W, r * d + c), n, c);
                P(" %s_s += %s_d%d * t_; }\n", n, n, r);
            }
        } else {
            for (int c = 0; c < d; c++)
                P("        %s_s += %s * %s_d%d * %s_d%d;\n", n, jit_ref_c(E, W, c), n, c, n, c);
        }
    }
    def(E, e, 0);
    P("%s_s;\n", n);
}

/* ---- complex ops: a complex vector is (re, im) pairs of interleaved components. Component idx
 * of a complex op is one C expression of its operands' components (the reference's formulas),
 * for a constant idx (small nodes: each component defined in turn) or a loop index (big nodes
 * are lazy, inlined where used, like elementwise ones). */

/* Component idx of x, where idx is a C expression: a small x's named components are selected by
 * a chain of conditionals (a big output may take its components from a small operand). */
static const char *comp(struct emitter *E, const sr_expr *x, const char *idx)
{
    if (is_num(idx) || big(x) || x->dim == 1)
        return jit_ref(E, x, idx);
    const char *r = jit_sfmt(E, "(%s)0", T(E));
    for (int c = x->dim; c-- > 0;)
        r = jit_sfmt(E, "((%s) == %d ? %s : %s)", idx, c, jit_ref_c(E, x, c), r);
    return r;
}

/* The real (part 0) or imaginary (part 1) part of the pair of operand c of e that output
 * component idx belongs to; a complex scalar operand (dimension 2) is broadcast. */
static const char *cpart(struct emitter *E, const sr_expr *e, int c, const char *idx, int part)
{
    const sr_expr *x = e->child[c];
    if (x->dim == 2)
        return jit_ref_c(E, x, part);
    if (is_num(idx))
        return jit_ref_c(E, x, (atoi(idx) & ~1) + part);
    return comp(E, x, jit_sfmt(E, "((%s) - ((%s) & 1) + %d)", idx, idx, part));
}

/* re where idx is even, im where it is odd. */
static const char *pick(struct emitter *E, const char *idx, const char *re, const char *im)
{
    if (is_num(idx))
        return atoi(idx) % 2 ? im : re;
    return jit_sfmt(E, "(((%s) & 1) ? (%s) : (%s))", idx, im, re);
}

static const char *complex_expr(struct emitter *E, const sr_expr *e, const char *idx)
{
    const char *t = T(E), *f = E->fs;
    switch ((enum expr_op)e->op) {
    case OP_CADD:
    case OP_CSUB: {
        const char *s = e->op == OP_CADD ? "+" : "-";
        return pick(E, idx,
                    jit_sfmt(E, "%s %s %s", cpart(E, e, 0, idx, 0), s, cpart(E, e, 1, idx, 0)),
                    jit_sfmt(E, "%s %s %s", cpart(E, e, 0, idx, 1), s, cpart(E, e, 1, idx, 1)));
    }
    case OP_CMULT:
    case OP_CSCAL:
    case OP_CDIV: {
        const char *a0 = cpart(E, e, 0, idx, 0), *a1 = cpart(E, e, 0, idx, 1);
        const char *b0 = cpart(E, e, 1, idx, 0), *b1 = cpart(E, e, 1, idx, 1);
        if (e->op != OP_CDIV)
            return pick(E, idx, jit_sfmt(E, "%s * %s - %s * %s", a0, b0, a1, b1),
                        jit_sfmt(E, "%s * %s + %s * %s", a0, b1, a1, b0));
        /* a conj(b) / |b|^2 */
        const char *q = jit_sfmt(E, "((%s)1 / (%s * %s + %s * %s))", t, b0, b0, b1, b1);
        return pick(E, idx, jit_sfmt(E, "(%s * %s + %s * %s) * %s", a0, b0, a1, b1, q),
                    jit_sfmt(E, "(%s * %s - %s * %s) * %s", a1, b0, a0, b1, q));
    }
    case OP_CREALSCAL:
        return jit_sfmt(E, "%s * %s", jit_ref_c(E, e->child[0], 0), comp(E, e->child[1], idx));
    case OP_CONJ:
        return pick(E, idx, cpart(E, e, 0, idx, 0), jit_sfmt(E, "-%s", cpart(E, e, 0, idx, 1)));
    case OP_CEXP: {
        const char *r = jit_sfmt(E, "sr_exp(%s)", cpart(E, e, 0, idx, 0)),
                   *im = cpart(E, e, 0, idx, 1);
        return pick(E, idx, jit_sfmt(E, "%s * sr_cos(%s)", r, im),
                    jit_sfmt(E, "%s * sr_sin(%s)", r, im));
    }
    case OP_CEXP1J:
    case OP_REAL2C:
    case OP_IMAG2C: {
        const char *h =
            is_num(idx) ? jit_sfmt(E, "%d", atoi(idx) / 2) : jit_sfmt(E, "((%s) >> 1)", idx);
        const char *x = comp(E, e->child[0], h), *zero = jit_sfmt(E, "(%s)0", t);
        if (e->op == OP_CEXP1J)
            return pick(E, idx, jit_sfmt(E, "sr_cos(%s)", x), jit_sfmt(E, "sr_sin(%s)", x));
        return e->op == OP_REAL2C ? pick(E, idx, x, zero) : pick(E, idx, zero, x);
    }
    case OP_CSUMT:
        return pick(E, idx, jit_ref_c(E, e->child[0], 0), jit_ref_c(E, e->child[0], 1));
    default: /* real outputs: component idx from pair idx of the operand */
        break;
    }
    const sr_expr *x = e->child[0];
    const char *re, *im;
    if (is_num(idx)) {
        re = jit_ref_c(E, x, 2 * atoi(idx));
        im = jit_ref_c(E, x, 2 * atoi(idx) + 1);
    } else {
        re = comp(E, x, jit_sfmt(E, "(2 * (%s))", idx));
        im = comp(E, x, jit_sfmt(E, "(2 * (%s) + 1)", idx));
    }
    switch ((enum expr_op)e->op) {
    case OP_CREAL:
        return re;
    case OP_CIMAG:
        return im;
    case OP_CABS:
        return jit_sfmt(E, "sqrt%s(%s * %s + %s * %s)", f, re, re, im, im);
    case OP_CSQUAREABS:
        return jit_sfmt(E, "%s * %s + %s * %s", re, re, im, im);
    case OP_CANGLE:
        return jit_sfmt(E, "atan2%s(%s, %s)", f, im, re);
    default:
        E->fail = SR_EINTERNAL;
        return "0";
    }
}

static void e_complex(struct emitter *E, const sr_expr *e)
{
    if (big(e)) {
        big_loop(E, e, complex_expr(E, e, "q_"));
        return;
    }
    for (int c = 0; c < e->dim; c++) {
        const char *x = complex_expr(E, e, jit_sfmt(E, "%d", c));
        def(E, e, c);
        P("%s;\n", x);
    }
}

/* ComplexSum: the real and the imaginary parts summed in increasing order, as the reference;
 * over a big operand, one loop over its pairs. */
static void e_csum(struct emitter *E, const sr_expr *e)
{
    char n[32];
    const sr_expr *x = e->child[0];
    jit_nm(e, 0, n);
    P("        %s %s_re = 0, %s_im = 0;\n", T(E), n, n);
    if (big(x))
        P("        for (int q_ = 0; q_ < %d; q_++) { %s_re += %s; %s_im += %s; }\n", x->dim / 2, n,
          jit_ref(E, x, "(2 * q_)"), n, jit_ref(E, x, "(2 * q_ + 1)"));
    else
        for (int k = 0; k < x->dim / 2; k++)
            P("        %s_re += %s; %s_im += %s;\n", n, jit_ref_c(E, x, 2 * k), n,
              jit_ref_c(E, x, 2 * k + 1));
    def(E, e, 0);
    P("%s_re;\n", n);
    def(E, e, 1);
    P("%s_im;\n", n);
}

/* Big nodes of these ops are inlined where used instead of computed into an array. */
bool jit_lazy_op(const struct emitter *E, const sr_expr *e)
{
    bool computed = expr_ops[e->op].c || e->op == OP_ROUND || c_fns[e->op] == e_complex;
    if (computed)
        return !(E->compact && big(e));
    return e->op == OP_EXTRACT || e->op == OP_CONCAT || e->op == OP_SUMT || e->op == OP_ELEMT ||
           e->op == OP_EXTRACTT;
}

int64_t jit_unroll_limit(const struct emitter *E)
{
    return E->compact ? JIT_COMPACT_TERMS : JIT_UNROLL_TERMS;
}

/* The elementwise template of op for the target: its override, else the C spelling. */
static const char *ew_tmpl(const struct emitter *E, int op)
{
    return E->spell && E->spell[op] ? E->spell[op] : expr_ops[op].c;
}

static const char *lazy_expr(struct emitter *E, const sr_expr *e, const char *idx)
{
    if (expr_ops[e->op].c)
        return ew_expr(E, e, ew_tmpl(E, e->op), idx);
    if (e->op == OP_ROUND)
        return round_expr(E, e, idx);
    if (c_fns[e->op] == e_complex)
        return complex_expr(E, e, idx);
    return slice_expr(E, e, idx);
}

void jit_emit_node(struct emitter *E, const sr_expr *e)
{
    if (expr_ops[e->op].c)
        ew(E, e, ew_tmpl(E, e->op));
    else if (c_fns[e->op])
        c_fns[e->op](E, e);
    else if (!E->fail)
        E->fail = sr__error(E->k->ctx, SR_EINTERNAL,
                            "%s: the op has neither a C template in the op table nor an emitter "
                            "function",
                            expr_ops[e->op].name);
}
