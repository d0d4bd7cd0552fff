/*
 * parse.c — the KeOps formula parser: formula text and alias declarations to an interned DAG.
 *
 * Grammar (Python-like precedence, lowest first):
 *
 *   expr    := sprod (('<' | '<=' | '>' | '>=') sprod)?   Less, LessEq, ...: not chained
 *   sprod   := sum ('|' sum)*                  Scalprod, left-associative
 *   sum     := term (('+' | '-') term)*
 *   term    := unary (('*' | '/') unary)*
 *   unary   := '-' unary | power               so -x**2 is -(x**2)
 *   power   := primary ('**' unary)?           right-associative
 *   primary := number | name | name '(' arguments ')' | '(' expr ')'
 *
 * An exponent that is a bare number literal picks the op: an integer n (also -n) gives
 * Pow(f,n), 0.5 gives Sqrt, -0.5 gives Rsqrt, any other literal or formula gives Powf.
 * Function calls take the op's operands first, then its integer attributes as signed integer
 * literals (Pow(x,3), Extract(x,1,2)). Var, Vi, Vj, Pm, IntCst, RatCst and Cst take literals.
 * TensorDot and Kron take lists of integers, [2,3] or [] (KeOps' index sequences). The infix
 * ops have function spellings too (Add, Subtract, Mult, Divide, Minus). Some KeOps functions are
 * built here from other ops, as keopscore defines them (SqNormIso, SqNormDiag, SymSqNorm,
 * IntInv, Zero, LessThan, LessOrEqual, Kron, GradMatrix, Divergence, Laplacian:
 * see "derived" below); the KeOps functions symred lacks (BSpline, SoftDTW_SqDist) are named in
 * the error.
 *
 * Nodes are built only through expr_make(), which checks dimensions and interns. The parser is
 * a recursive-descent parser whose nesting (parentheses, calls, unary minus, exponents) is
 * limited to PARSE_MAX_DEPTH, so no input can exhaust the C stack; every failure names the
 * 1-based byte column and what was expected.
 */
#include "expr.h"

#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PARSE_MAX_DEPTH 200

/* Functions off the recursive path are kept out of line, so that their locals do not enlarge
 * the frames that repeat once per nesting level (about 0.6 KiB per level on x86-64, so 200 levels
 * need about 130 KiB). */
#define COLD __attribute__((noinline))

/* Magnitude of INT64_MIN: the largest integer literal that fits once negated. */
#define MAG_LIMIT ((uint64_t)INT64_MAX + 1)

enum tok_kind {
    T_END,
    T_NUM,
    T_NAME,
    T_LPAREN,
    T_RPAREN,
    T_COMMA,
    T_PLUS,
    T_MINUS,
    T_STAR,
    T_SLASH,
    T_BAR,
    T_POW,
    T_EQ,
    T_LBRACK,
    T_RBRACK,
    T_LT, /* '<' or '<=' (len 2) */
    T_GT, /* '>' or '>=' */
    T_BAD
};

struct tok {
    enum tok_kind kind;
    size_t start, len; /* byte offset in the text, and length */
    bool real;         /* T_NUM: has '.' or an exponent */
    bool big;          /* T_NUM integer: magnitude above 2^63 */
    uint64_t mag;      /* T_NUM integer: its magnitude */
};

/* One alias declaration. */
struct alias {
    const char *name;
    size_t len;
    int pos;       /* 0-based position in the aliases array */
    size_t col;    /* 0-based column of its Vi/Vj/Pm/Var in the alias text */
    int64_t index; /* variable index, dim and category */
    int64_t dim;
    int64_t cat;
    sr_expr *var;
};

/* First use of each variable index in the formula, to catch Var(0,3,0) next to Var(0,2,0). */
struct var_use {
    int dim; /* 0: not used yet */
    int cat;
    size_t col;
};

struct parser {
    sr_ctx *ctx;
    const char *s;       /* the text being read: the formula or one alias */
    const char *formula; /* the formula */
    size_t pos;          /* next unread byte */
    struct tok t;        /* current token */
    int depth;
    int64_t gradin_cat; /* category of GradFromPos(F, v, I)'s new gradient input */
    bool failed;
    sr_status st;
    char prefix[96];        /* "alias 2 'y=Vj(3': " while reading an alias, else "" */
    struct alias **by_name; /* aliases sorted by name */
    int nal;
    struct var_use *uses;
    int nuses;
    /* Message buffers live here, not in the recursive functions' frames, so that each level of
     * nesting costs little C stack. */
    char desc[2][48];
    unsigned ndesc;
    char msg[EXPR_ERR_MAX];
};

static const char *const cat_names[3] = {"Vi", "Vj", "Pm"};

/* ---- errors ---- */

static sr_expr *fail(struct parser *p, sr_status st, size_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noinline));

/* Records the first error only: later ones are consequences of it. Parse errors are recorded
 * as builder errors, so that sr_kernel_new(ctx, NULL, ...) after a failed sr_parse reports it. */
static sr_expr *fail(struct parser *p, sr_status st, size_t col, const char *fmt, ...)
{
    if (p->failed)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    expr_builder_error(p->ctx, st, "%scolumn %zu: %s", p->prefix, col + 1, p->msg);
    p->failed = true;
    p->st = st;
    return NULL;
}

/* The result of a builder, with a failure re-reported with the column of the call. The
 * builder's own message names the op and the dimensions; its EINVAL (a bad literal such as
 * Pow(x,5000) or a zero denominator) is a parse error here. */
static sr_expr *built(struct parser *p, size_t col, sr_expr *e)
{
    if (e)
        return e;
    expr_error_get(p->ctx, p->msg, sizeof p->msg);
    sr_status st = expr_ctx(p->ctx)->err.pending;
    if (st != SR_EDIM && st != SR_ENOMEM)
        st = SR_EPARSE;
    expr_builder_error(p->ctx, st, "%scolumn %zu: %s", p->prefix, col + 1, p->msg);
    p->failed = true;
    p->st = st;
    return NULL;
}

/* expr_make, reported as above. */
static sr_expr *make(struct parser *p, size_t col, enum expr_op op, sr_expr *const *child,
                     const int64_t *iattr, int dim, double fattr)
{
    if (p->failed)
        return NULL;
    return built(p, col, expr_make(p->ctx, op, child, iattr, dim, fattr));
}

/* ---- lexer ---- */

static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_name_start(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_name_char(int c) { return is_name_start(c) || is_digit(c); }
static bool is_space(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void lex_number(struct parser *p, struct tok *t)
{
    const char *s = p->s;
    size_t i = p->pos;
    t->kind = T_NUM;
    while (is_digit(s[i])) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (t->mag > (MAG_LIMIT - d) / 10)
            t->big = true;
        else
            t->mag = t->mag * 10 + d;
        i++;
    }
    if (s[i] == '.') {
        t->real = true;
        i++;
        while (is_digit(s[i]))
            i++;
    }
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-')
            j++;
        if (is_digit(s[j])) { /* else the 'e' is not part of the number */
            t->real = true;
            i = j;
            while (is_digit(s[i]))
                i++;
        }
    }
    t->len = i - t->start;
}

/* Reads the next token into p->t. */
static void next(struct parser *p)
{
    const char *s = p->s;
    while (is_space((unsigned char)s[p->pos]))
        p->pos++;
    struct tok t = {.kind = T_BAD, .start = p->pos, .len = 1};
    unsigned char c = (unsigned char)s[p->pos];
    if (c == '\0') {
        t.kind = T_END;
        t.len = 0;
    } else if (is_digit(c) || (c == '.' && is_digit((unsigned char)s[p->pos + 1]))) {
        lex_number(p, &t);
    } else if (is_name_start(c)) {
        size_t i = p->pos;
        while (is_name_char((unsigned char)s[i]))
            i++;
        t.kind = T_NAME;
        t.len = i - p->pos;
    } else {
        switch (c) {
        case '(':
            t.kind = T_LPAREN;
            break;
        case ')':
            t.kind = T_RPAREN;
            break;
        case ',':
            t.kind = T_COMMA;
            break;
        case '+':
            t.kind = T_PLUS;
            break;
        case '-':
            t.kind = T_MINUS;
            break;
        case '/':
            t.kind = T_SLASH;
            break;
        case '|':
            t.kind = T_BAR;
            break;
        case '=':
            t.kind = T_EQ;
            break;
        case '[':
            t.kind = T_LBRACK;
            break;
        case '<':
        case '>':
            t.kind = c == '<' ? T_LT : T_GT;
            if (s[p->pos + 1] == '=')
                t.len = 2;
            break;
        case ']':
            t.kind = T_RBRACK;
            break;
        case '*':
            t.kind = T_STAR;
            if (s[p->pos + 1] == '*') {
                t.kind = T_POW;
                t.len = 2;
            }
            break;
        default:
            break;
        }
    }
    p->t = t;
    p->pos = t.start + t.len;
}

/* A short printable description of a token for messages ("'Exp'", "the end of the formula",
 * "byte 0x01"). */
static const char *describe(struct parser *p, const struct tok *t)
{
    char *buf = p->desc[p->ndesc++ & 1];
    size_t cap = sizeof p->desc[0];
    unsigned char c = (unsigned char)p->s[t->start];
    if (t->kind == T_END)
        snprintf(buf, cap, "the end of the %s", p->prefix[0] ? "alias" : "formula");
    else if (t->kind == T_BAD && (c < 0x21 || c > 0x7e))
        snprintf(buf, cap, "byte 0x%02x", c);
    else if (t->len > 24)
        snprintf(buf, cap, "'%.24s...'", p->s + t->start);
    else
        snprintf(buf, cap, "'%.*s'", (int)t->len, p->s + t->start);
    return buf;
}

#define DESC(p) describe((p), &(p)->t)

static bool name_is(const struct parser *p, const struct tok *t, const char *name)
{
    return t->kind == T_NAME && strlen(name) == t->len &&
           memcmp(p->s + t->start, name, t->len) == 0;
}

/* ---- literals ---- */

/* A literal quoted for messages, with its sign: "'-1e999'", shortened when long. */
static const char *quote_literal(struct parser *p, const struct tok *t, bool neg)
{
    char *buf = p->desc[p->ndesc++ & 1];
    size_t cap = sizeof p->desc[0];
    int n = t->len > 24 ? 24 : (int)t->len;
    snprintf(buf, cap, "'%s%.*s%s'", neg ? "-" : "", n, p->s + t->start, t->len > 24 ? "..." : "");
    return buf;
}

/* Real literals are read in the C locale whatever LC_NUMERIC the host program has set. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

/* The value of a real literal token; false (with the error recorded) if it is not finite. */
COLD static bool real_value(struct parser *p, const struct tok *t, bool neg, double *out)
{
    char small[64];
    char *buf = t->len < sizeof small ? small : malloc(t->len + 1);
    if (!buf) {
        fail(p, SR_ENOMEM, t->start, "out of memory");
        return false;
    }
    memcpy(buf, p->s + t->start, t->len);
    buf[t->len] = '\0';
    pthread_once(&c_locale_once, c_locale_init);
    double v = c_locale ? strtod_l(buf, NULL, c_locale) : strtod(buf, NULL);
    if (buf != small)
        free(buf);
    if (!isfinite(v)) {
        fail(p, SR_EPARSE, t->start, "the real literal %s is out of range",
             quote_literal(p, t, neg));
        return false;
    }
    *out = neg ? -v : v;
    return true;
}

/* The value of an integer literal token, negated if neg; false (error recorded) on overflow. */
COLD static bool int_value(struct parser *p, const struct tok *t, bool neg, int64_t *out)
{
    if (t->big || (!neg && t->mag > (uint64_t)INT64_MAX)) {
        fail(p, SR_EPARSE, t->start, "the integer literal %s does not fit in 64 bits",
             quote_literal(p, t, neg));
        return false;
    }
    if (neg)
        *out = t->mag == MAG_LIMIT ? INT64_MIN : -(int64_t)t->mag;
    else
        *out = (int64_t)t->mag;
    return true;
}

/* A literal argument: an optionally negated number. */
struct num {
    bool real;
    int64_t i;
    double d;
};

static bool parse_signed_number(struct parser *p, bool want_int, const char *fn, const char *what,
                                struct num *out)
{
    bool neg = false;
    if (p->t.kind == T_MINUS) {
        neg = true;
        next(p);
    }
    if (p->t.kind != T_NUM || (want_int && p->t.real)) {
        fail(p, SR_EPARSE, p->t.start, "%s: expected %s literal for the %s, found %s", fn,
             want_int ? "an integer" : "a number", what, DESC(p));
        return false;
    }
    out->real = p->t.real;
    bool ok = out->real ? real_value(p, &p->t, neg, &out->d) : int_value(p, &p->t, neg, &out->i);
    if (!out->real)
        out->d = (double)out->i;
    next(p);
    return ok;
}

/* ---- nesting ---- */

static bool enter(struct parser *p, size_t col)
{
    if (++p->depth > PARSE_MAX_DEPTH) {
        fail(p, SR_EPARSE, col, "nesting deeper than %d", PARSE_MAX_DEPTH);
        return false;
    }
    return true;
}

static void leave(struct parser *p) { p->depth--; }

/* ---- variables ---- */

/* Checks that a variable index keeps one dimension and category across the formula. */
static sr_expr *use_var(struct parser *p, size_t col, sr_expr *v)
{
    if (!v)
        return NULL;
    int idx = (int)v->iattr[0], cat = (int)v->iattr[1];
    if (idx >= p->nuses) {
        int n = p->nuses ? p->nuses : 8;
        while (n <= idx)
            n *= 2;
        struct var_use *u = realloc(p->uses, (size_t)n * sizeof *u);
        if (!u)
            return fail(p, SR_ENOMEM, col, "out of memory");
        memset(u + p->nuses, 0, (size_t)(n - p->nuses) * sizeof *u);
        p->uses = u;
        p->nuses = n;
    }
    struct var_use *u = &p->uses[idx];
    if (u->dim == 0) {
        *u = (struct var_use){v->dim, cat, col};
    } else if (u->dim != v->dim || u->cat != cat) {
        return fail(p, SR_EDIM, col,
                    "variable index %d is used as %s of dimension %d here, but as %s of "
                    "dimension %d at column %zu",
                    idx, cat_names[cat], v->dim, cat_names[u->cat], u->dim, u->col + 1);
    }
    return v;
}

static int cmp_name(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static struct alias *find_alias(const struct parser *p, const char *name, size_t len)
{
    int lo = 0, hi = p->nal;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = cmp_name(name, len, p->by_name[mid]->name, p->by_name[mid]->len);
        if (c == 0)
            return p->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- the grammar ---- */

static sr_expr *parse_expr(struct parser *p);
static sr_expr *parse_unary(struct parser *p);

/* What a call takes: nexpr operands, then nlit literals (integers, or numbers if real). */
struct signature {
    int nexpr, nlit;
    bool real;
    const char *const *lit_names; /* [nlit], for messages */
};

/* Writes "1 operand and 2 integers (start, length)" for a call's expected arguments. */
static void describe_signature(char *buf, size_t cap, const struct signature *sig)
{
    int n = 0;
    buf[0] = '\0';
    if (sig->nexpr)
        n = snprintf(buf, cap, "%d operand%s", sig->nexpr, sig->nexpr > 1 ? "s" : "");
    if (sig->nlit && (size_t)n < cap) {
        n += snprintf(buf + n, cap - (size_t)n, "%s%d %s%s (", sig->nexpr ? " and " : "", sig->nlit,
                      sig->real ? "number" : "integer", sig->nlit > 1 ? "s" : "");
        for (int i = 0; i < sig->nlit && (size_t)n < cap; i++)
            n += snprintf(buf + n, cap - (size_t)n, "%s%s", i ? ", " : "", sig->lit_names[i]);
        if ((size_t)n < cap)
            snprintf(buf + n, cap - (size_t)n, ")");
    }
}

/* Counts the remaining arguments of a call, from a ',' at its top level to its ')'. */
static int count_rest(struct parser *p)
{
    int count = 0, depth = 0;
    while (p->t.kind != T_END) {
        if (p->t.kind == T_COMMA && depth == 0)
            count++;
        else if (p->t.kind == T_LPAREN)
            depth++;
        else if (p->t.kind == T_RPAREN && depth-- == 0)
            break;
        next(p);
    }
    return count;
}

/* Reports a call with got arguments, saying what sig takes. */
COLD static void arity_fail(struct parser *p, const char *fn, size_t fn_col, int got,
                            const struct signature *sig)
{
    char want[128];
    describe_signature(want, sizeof want, sig);
    fail(p, SR_EPARSE, fn_col, "%s takes %s, got %d", fn, want, got);
}

/* Reports a call with the wrong number of arguments: k read so far, the current token being
 * the ')' or the ',' where the count went wrong. */
COLD static void arity_error(struct parser *p, const char *fn, size_t fn_col, int k,
                             const struct signature *sig)
{
    arity_fail(p, fn, fn_col, p->t.kind == T_COMMA ? k + count_rest(p) : k, sig);
}

/*
 * Parses the arguments of a call, the current token being its '(': sig->nexpr expressions
 * into exprs, then sig->nlit signed literals into nums, optionally followed by one comma. The
 * count is checked, with a message saying what the function takes.
 */
static bool parse_args(struct parser *p, const char *fn, size_t fn_col, const struct signature *sig,
                       sr_expr **exprs, struct num *nums)
{
    size_t lp = p->t.start;
    int nslot = sig->nexpr + sig->nlit;
    next(p);
    for (int k = 0;; k++) {
        bool more = k < nslot;
        if (more && (k == 0 ? p->t.kind != T_RPAREN : p->t.kind == T_COMMA)) {
            if (k > 0)
                next(p);
            if (k < sig->nexpr) {
                exprs[k] = parse_expr(p);
                if (!exprs[k])
                    return false;
            } else if (!parse_signed_number(p, !sig->real, fn, sig->lit_names[k - sig->nexpr],
                                            &nums[k - sig->nexpr])) {
                return false;
            }
            continue;
        }
        if (p->t.kind == T_RPAREN && !more) {
            next(p);
            return true;
        }
        if (p->t.kind == T_COMMA && !more && nslot > 0) {
            /* One trailing comma, as keopscore writes them: Abs(v0,) */
            next(p);
            if (p->t.kind == T_RPAREN) {
                next(p);
                return true;
            }
            arity_fail(p, fn, fn_col, k + 1 + count_rest(p), sig);
            return false;
        }
        if (p->t.kind == T_RPAREN || (p->t.kind == T_COMMA && !more)) {
            arity_error(p, fn, fn_col, k, sig);
            return false;
        }
        if (more && k > 0)
            fail(p, SR_EPARSE, p->t.start, "expected ',' after argument %d of %s, found %s", k, fn,
                 DESC(p));
        else
            fail(p, SR_EPARSE, p->t.start, "expected ')' to close '(' at column %zu, found %s",
                 lp + 1, DESC(p));
        return false;
    }
}

/* Names of the integer attributes of op, for messages. */
static const char *const *attr_names(enum expr_op op)
{
    static const char *const
        pow[] = {"exponent"},
        *const round[] = {"decimals"}, *const clamp[] = {"lower bound", "upper bound"},
        *const elem[] = {"index"}, *const extract[] = {"start", "length"},
        *const onehot[] = {"dimension"}, *const elemt[] = {"dimension", "index"},
        *const extractt[] = {"start", "dimension"}, *const other[] = {"attribute", "attribute"};
    switch (op) {
    case OP_POW:
        return pow;
    case OP_ROUND:
        return round;
    case OP_CLAMPINT:
        return clamp;
    case OP_ELEM:
        return elem;
    case OP_EXTRACT:
        return extract;
    case OP_ONEHOT:
        return onehot;
    case OP_SUMT:
    case OP_CSUMT:
        return onehot;
    case OP_ELEMT:
        return elemt;
    case OP_EXTRACTT:
        return extractt;
    default:
        return other;
    }
}

/* Var, Vi, Vj, Pm, IntCst, RatCst and Cst: calls with literal arguments. */
COLD static sr_expr *parse_literal_call(struct parser *p, const struct tok *name)
{
    static const char *const var_names[] = {"index", "dimension", "category"};
    static const char *const rat_names[] = {"numerator", "denominator"};
    static const char *const val_names[] = {"value"};
    char fn[8];
    snprintf(fn, sizeof fn, "%.*s", (int)name->len, p->s + name->start);
    size_t col = name->start;
    struct num v[3] = {{0}};
    if (name_is(p, name, "Var") || name_is(p, name, "Vi") || name_is(p, name, "Vj") ||
        name_is(p, name, "Pm")) {
        bool var = name_is(p, name, "Var");
        struct signature sig = {0, var ? 3 : 2, false, var_names};
        if (!parse_args(p, fn, col, &sig, NULL, v))
            return NULL;
        int64_t cat = var ? v[2].i : name_is(p, name, "Vi") ? 0 : name_is(p, name, "Vj") ? 1 : 2;
        if (v[1].i < 1 || v[1].i > INT_MAX)
            return fail(p, SR_EDIM, col, "%s: dimension %lld is %s", fn, (long long)v[1].i,
                        v[1].i < 1 ? "not positive" : "too large");
        int64_t at[2] = {v[0].i, cat};
        return use_var(p, col, make(p, col, OP_VAR, NULL, at, (int)v[1].i, 0.0));
    }
    if (name_is(p, name, "IntCst")) {
        struct signature sig = {0, 1, false, val_names};
        if (!parse_args(p, fn, col, &sig, NULL, v))
            return NULL;
        return make(p, col, OP_INTCST, NULL, &v[0].i, 1, 0.0);
    }
    if (name_is(p, name, "RatCst")) {
        struct signature sig = {0, 2, false, rat_names};
        if (!parse_args(p, fn, col, &sig, NULL, v))
            return NULL;
        int64_t at[2] = {v[0].i, v[1].i};
        return make(p, col, OP_RATCST, NULL, at, 1, 0.0);
    }
    /* Cst */
    struct signature sig = {0, 1, true, val_names};
    if (!parse_args(p, fn, col, &sig, NULL, v))
        return NULL;
    return make(p, col, OP_CST, NULL, NULL, 1, v[0].d);
}

static bool is_literal_fn(const struct parser *p, const struct tok *t)
{
    static const char *const names[] = {"Var", "Vi", "Vj", "Pm", "IntCst", "RatCst", "Cst"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name_is(p, t, names[i]))
            return true;
    return false;
}

/* A call of an op from the table: operands, then integer attributes. */
static sr_expr *parse_op_call(struct parser *p, const struct tok *name, enum expr_op op)
{
    const struct expr_opinfo *oi = &expr_ops[op];
    struct signature sig = {oi->arity, oi->nattr, false, attr_names(op)};
    sr_expr *c[EXPR_MAX_ARITY] = {0};
    struct num v[EXPR_MAX_ATTR] = {{0}};
    if (!parse_args(p, oi->name, name->start, &sig, c, v))
        return NULL;
    int64_t at[EXPR_MAX_ATTR] = {v[0].i, v[1].i};
    return make(p, name->start, op, c, at, 0, 0.0);
}

/* ---- index sequences: TensorDot and Kron ---- */

/* A list of integers "[a,b,...]" or "[]" into v (at most max entries); *n its length. */
static bool parse_int_list(struct parser *p, const char *fn, const char *what, int *v, int *n,
                           int max)
{
    *n = 0;
    if (p->t.kind != T_LBRACK) {
        fail(p, SR_EPARSE, p->t.start,
             "%s: expected a list of integers like [2,3] for the %s, "
             "found %s",
             fn, what, DESC(p));
        return false;
    }
    next(p);
    while (p->t.kind != T_RBRACK) {
        if (*n > 0) {
            if (p->t.kind != T_COMMA) {
                fail(p, SR_EPARSE, p->t.start, "%s: expected ',' or ']' in the %s, found %s", fn,
                     what, DESC(p));
                return false;
            }
            next(p);
        }
        struct num x;
        size_t col = p->t.start;
        if (!parse_signed_number(p, true, fn, what, &x))
            return false;
        if (*n == max) {
            fail(p, SR_EPARSE, col, "%s: the %s has more than %d entries", fn, what, max);
            return false;
        }
        if (x.i < INT_MIN || x.i > INT_MAX) {
            fail(p, SR_EPARSE, col, "%s: %lld in the %s is out of range", fn, (long long)x.i, what);
            return false;
        }
        v[(*n)++] = (int)x.i;
    }
    next(p);
    return true;
}

/* Expects ',' (more arguments follow) or ')' (the end), else reports what fn takes. */
static bool list_sep(struct parser *p, const char *fn, const char *takes, bool last)
{
    if (p->t.kind == (last ? T_RPAREN : T_COMMA)) {
        next(p);
        return true;
    }
    fail(p, SR_EPARSE, p->t.start, "%s takes %s; expected '%c', found %s", fn, takes,
         last ? ')' : ',', DESC(p));
    return false;
}

/* TensorDot(a, b, [dims a], [dims b], [axes a], [axes b] (, [permute])) and
 * Kron(a, b, [dims a], [dims b]), the current token being the '('. */
static sr_expr *parse_tensordot_call(struct parser *p, const struct tok *name, bool kron)
{
    const char *fn = kron ? "Kron" : "TensorDot";
    const char *takes = kron ? "2 operands and 2 lists (dims of a, dims of b)"
                             : "2 operands and 4 or 5 lists (dims of a, dims of b, contracted "
                               "axes of a, of b, and optionally permute)";
    enum { M = EXPR_TDOT_MAXRANK };
    int l[5][2 * M], n[5] = {0, 0, 0, 0, 0};
    static const char *const what[5] = {"dimensions of a", "dimensions of b", "axes of a",
                                        "axes of b", "permutation"};
    size_t col = name->start;
    next(p);
    sr_expr *a = parse_expr(p);
    if (!a || !list_sep(p, fn, takes, false))
        return NULL;
    sr_expr *b = parse_expr(p);
    if (!b || !list_sep(p, fn, takes, false))
        return NULL;
    /* Kron takes 2 lists, TensorDot 4 and an optional fifth (permute). */
    int nl = kron ? 2 : 4;
    for (int k = 0; k < nl; k++) {
        if (!parse_int_list(p, fn, what[k], l[k], &n[k], k == 4 ? 2 * M : M))
            return NULL;
        bool last = k == nl - 1 && (kron || k == 4 || p->t.kind != T_COMMA);
        if (!list_sep(p, fn, takes, last))
            return NULL;
        if (k == nl - 1 && !last)
            nl = 5;
    }
    if (kron) {
        /* KeOps: np.kron of tensors of equal rank, as TensorDot with the axes interleaved. */
        if (n[0] != n[1])
            return fail(p, SR_EDIM, col,
                        "Kron: the tensors have ranks %d and %d; they must be "
                        "equal",
                        n[0], n[1]);
        for (int k = 0; k < n[0]; k++) {
            l[4][k] = 2 * k;
            l[4][n[0] + k] = 2 * k + 1;
        }
        return built(p, col,
                     sr_tensordot(p->ctx, a, b, n[0], l[0], n[1], l[1], 0, NULL, NULL, l[4]));
    }
    if (n[2] != n[3])
        return fail(p, SR_EDIM, col, "TensorDot: %d contracted axes of a but %d of b", n[2], n[3]);
    if (n[4] && n[4] != n[0] + n[1] - 2 * n[2])
        return fail(p, SR_EDIM, col, "TensorDot: permute has %d entries for %d kept axes", n[4],
                    n[0] + n[1] - 2 * n[2]);
    return built(
        p, col,
        sr_tensordot(p->ctx, a, b, n[0], l[0], n[1], l[1], n[2], l[2], l[3], n[4] ? l[4] : NULL));
}

/* ---- KeOps functions that are other ops, and those symred lacks ---- */

enum derived {
    DV_NONE,
    DV_SQNORMISO,  /* SqNormIso(s, x) = s SqNorm2(x), s scalar */
    DV_SQNORMDIAG, /* SqNormDiag(s, x) = Sum(s x^2), s of dim(x) */
    DV_SYMSQNORM,  /* SymSqNorm(A, x) = x^T A x, A of dim(x)^2 */
    DV_INTINV,     /* IntInv(n) = RatCst(1, n) */
    DV_ZERO,       /* Zero(d) = the zero vector, OneHot(-1, d) (0 for d = 1) */
    DV_LESSTHAN,   /* keopscore's names of Less and LessEq */
    DV_LESSOREQUAL
};

static const struct {
    const char *name;
    int nexpr, nlit;
} derived_fns[] = {
    [DV_SQNORMISO] = {"SqNormIso", 2, 0},
    [DV_SQNORMDIAG] = {"SqNormDiag", 2, 0},
    [DV_SYMSQNORM] = {"SymSqNorm", 2, 0},
    [DV_INTINV] = {"IntInv", 0, 1},
    [DV_ZERO] = {"Zero", 0, 1},
    [DV_LESSTHAN] = {"LessThan", 2, 0},
    [DV_LESSOREQUAL] = {"LessOrEqual", 2, 0},
};

static enum derived derived_kind(const struct parser *p, const struct tok *t)
{
    for (int k = DV_NONE + 1; k < (int)(sizeof derived_fns / sizeof *derived_fns); k++)
        if (name_is(p, t, derived_fns[k].name))
            return (enum derived)k;
    return DV_NONE;
}

static sr_expr *parse_derived_call(struct parser *p, const struct tok *name, enum derived kind)
{
    static const char *const n1[] = {"n"};
    const char *fn = derived_fns[kind].name;
    static const char *const dim1[] = {"dimension"};
    struct signature sig = {derived_fns[kind].nexpr, derived_fns[kind].nlit, false,
                            kind == DV_INTINV ? n1 : dim1};
    sr_expr *c[2] = {NULL, NULL};
    struct num v[2] = {{0}};
    size_t col = name->start;
    if (!parse_args(p, fn, col, &sig, c, v))
        return NULL;
    sr_ctx *ctx = p->ctx;
    int ds = sig.nexpr ? c[0]->dim : 0, dx = sig.nexpr > 1 ? c[1]->dim : 0;
    switch (kind) {
    case DV_SQNORMISO:
    case DV_SQNORMDIAG:
    case DV_SYMSQNORM: {
        int want = kind == DV_SQNORMISO ? 1 : kind == DV_SQNORMDIAG ? dx : dx * dx;
        if (ds != want && ds != 1)
            return fail(p, SR_EDIM, col,
                        "%s: the weight has dimension %d, but a point of "
                        "dimension %d needs %d",
                        fn, ds, dx, want);
        return built(p, col, sr_weightedsqnorm(ctx, c[0], c[1]));
    }
    case DV_INTINV:
        return built(p, col, sr_ratcst(ctx, 1, v[0].i));
    case DV_LESSTHAN:
        return built(p, col, sr_less(ctx, c[0], c[1]));
    case DV_LESSOREQUAL:
        return built(p, col, sr_lesseq(ctx, c[0], c[1]));
    case DV_ZERO:
        if (v[0].i < 1 || v[0].i > INT_MAX)
            return fail(p, SR_EDIM, col, "Zero: dimension %lld is not positive", (long long)v[0].i);
        return built(p, col, expr_zeros(ctx, (int)v[0].i));
    default:
        return fail(p, SR_EINTERNAL, col, "%s: no expansion", fn);
    }
}

/* KeOps 2.3 functions that symred does not implement, and why (docs/semantics.md). */
static const char *unsupported_keops(const struct parser *p, const struct tok *t)
{
    if (name_is(p, t, "BSpline"))
        return "B-splines are not implemented";
    if (name_is(p, t, "SoftDTW_SqDist"))
        return "soft dynamic time warping is not implemented";
    if (name_is(p, t, "TraceOperator") || name_is(p, t, "AdjointOperator") ||
        name_is(p, t, "SumLinOperator") || name_is(p, t, "Factorize") ||
        name_is(p, t, "AutoFactorize") || name_is(p, t, "VarSymb") ||
        name_is(p, t, "Grad_WithSavedForward") || name_is(p, t, "Diff_WithSavedForward"))
        return "it is internal to KeOps' differentiation and factorisation";
    return NULL;
}

/* ---- derivatives ----
 * Grad(F, v, e), Diff(F, v, u) and GradFromPos are not ops: they are expanded here, by sr_grad
 * and sr_diff, into ordinary nodes, so the printer shows the expanded formula. GradFromPos has
 * KeOps' form GradFromPos(F, v, I), the gradient with respect to v with a new gradient input
 * Var(I, dim(F), Vi), and the form GradFromPos(F, pos, e), with respect to the variable of
 * index pos (of F, else of an alias) with the gradient input e. */
enum autodiff {
    AD_NONE,
    AD_GRAD,
    AD_DIFF,
    AD_GRADFROMPOS,
    AD_GRADMATRIX,
    AD_DIVERGENCE,
    AD_LAPLACIAN
};

static enum autodiff autodiff_kind(const struct parser *p, const struct tok *t)
{
    return name_is(p, t, "Grad")          ? AD_GRAD
           : name_is(p, t, "Diff")        ? AD_DIFF
           : name_is(p, t, "GradFromPos") ? AD_GRADFROMPOS
           : name_is(p, t, "GradMatrix")  ? AD_GRADMATRIX
           : name_is(p, t, "Divergence")  ? AD_DIVERGENCE
           : name_is(p, t, "Laplacian")   ? AD_LAPLACIAN
                                          : AD_NONE;
}

/* Whether the current token starts a signed integer literal ("3", "- 3"). */
static bool at_literal(const struct parser *p)
{
    if (p->t.kind == T_NUM)
        return true;
    size_t i = p->pos;
    while (p->t.kind == T_MINUS && is_space((unsigned char)p->s[i]))
        i++;
    return p->t.kind == T_MINUS && is_digit((unsigned char)p->s[i]);
}

/* The variable of index idx: F's, else an alias's. */
COLD static sr_expr *var_at_index(struct parser *p, const sr_expr *f, int64_t idx, size_t col)
{
    size_t n = expr_toposort(f, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return fail(p, SR_ENOMEM, col, "out of memory");
    expr_toposort(f, order, n);
    sr_expr *v = NULL;
    for (size_t i = 0; i < n && !v; i++)
        if (order[i]->op == OP_VAR && order[i]->iattr[0] == idx)
            v = (sr_expr *)order[i];
    free(order);
    for (int i = 0; i < p->nal && !v; i++)
        if (p->by_name[i]->index == idx)
            v = p->by_name[i]->var;
    if (!v)
        return fail(p, SR_EPARSE, col,
                    "GradFromPos: no variable has index %lld (neither in the formula nor among "
                    "the aliases)",
                    (long long)idx);
    return v;
}

static bool expect_comma(struct parser *p, const char *fn, int k)
{
    if (p->t.kind == T_COMMA) {
        next(p);
        return true;
    }
    fail(p, SR_EPARSE, p->t.start, "%s takes 3 arguments; expected ',' after argument %d, found %s",
         fn, k, DESC(p));
    return false;
}

static sr_expr *parse_autodiff_call(struct parser *p, const struct tok *name, enum autodiff kind)
{
    static const char *const fns[] = {"",           "Grad",       "Diff",     "GradFromPos",
                                      "GradMatrix", "Divergence", "Laplacian"};
    const char *fn = fns[kind];
    size_t col = name->start, lp = p->t.start;
    next(p);
    sr_expr *f = parse_expr(p);
    if (!f || !expect_comma(p, fn, 1))
        return NULL;
    if (kind >= AD_GRADMATRIX) { /* F(f, v): two arguments */
        size_t vcol = p->t.start;
        sr_expr *v = parse_expr(p);
        if (!v)
            return NULL;
        if (v->op != OP_VAR)
            return fail(p, SR_EPARSE, vcol,
                        "%s: argument 2 must be a variable (an alias, Var, Vi, Vj or Pm), not %s",
                        fn, expr_ops[v->op].name);
        if (p->t.kind != T_RPAREN)
            return fail(p, SR_EPARSE, p->t.start,
                        "%s takes 2 arguments; expected ')' to close '(' at column %zu, found %s",
                        fn, lp + 1, DESC(p));
        next(p);
        sr_expr *r = kind == AD_GRADMATRIX   ? sr_gradmatrix(p->ctx, f, v)
                     : kind == AD_DIVERGENCE ? sr_divergence(p->ctx, f, v)
                                             : sr_laplacian(p->ctx, f, v);
        return built(p, col, r);
    }
    size_t vcol = p->t.start;
    sr_expr *v;
    struct num lit;
    if (kind == AD_GRADFROMPOS && at_literal(p)) {
        if (!parse_signed_number(p, true, fn, "variable index", &lit))
            return NULL;
        v = var_at_index(p, f, lit.i, vcol);
    } else {
        v = parse_expr(p);
        if (v && v->op != OP_VAR)
            return fail(p, SR_EPARSE, vcol,
                        "%s: argument 2 must be a variable (an alias, Var, Vi, Vj or Pm), not %s",
                        fn, expr_ops[v->op].name);
    }
    if (!v || !expect_comma(p, fn, 2))
        return NULL;
    size_t ecol = p->t.start;
    sr_expr *e;
    if (kind == AD_GRADFROMPOS && at_literal(p)) {
        if (!parse_signed_number(p, true, fn, "index of the gradient input", &lit))
            return NULL;
        int64_t at[2] = {lit.i, p->gradin_cat};
        e = use_var(p, ecol, make(p, ecol, OP_VAR, NULL, at, f->dim, 0.0));
    } else {
        e = parse_expr(p);
    }
    if (!e)
        return NULL;
    if (p->t.kind != T_RPAREN)
        return fail(p, SR_EPARSE, p->t.start,
                    "%s takes 3 arguments; expected ')' to close '(' "
                    "at column %zu, found %s",
                    fn, lp + 1, DESC(p));
    next(p);
    return built(p, col, kind == AD_DIFF ? sr_diff(p->ctx, f, v, e) : sr_grad(p->ctx, f, v, e));
}

/* A name that is not a function: suggest the function with the same spelling up to case. */
COLD static sr_expr *unknown_name(struct parser *p, const struct tok *t)
{
    const char *s = p->s + t->start;
    const char *hint = NULL;
    for (int op = 0; op < OP_COUNT && !hint; op++) {
        const char *nm = expr_ops[op].name;
        if (strlen(nm) == t->len && strncasecmp(nm, s, t->len) == 0)
            hint = nm;
    }
    for (int i = 0; i < 3 && !hint; i++)
        if (t->len == 2 && strncasecmp(cat_names[i], s, 2) == 0)
            hint = cat_names[i];
    return fail(p, SR_EPARSE, t->start, "unknown name %s%s%s%s", describe(p, t),
                hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
}

static sr_expr *parse_name(struct parser *p)
{
    struct tok name = p->t;
    next(p);
    const char *s = p->s + name.start;
    int op = expr_op_by_name(s, name.len);
    bool literal_fn = is_literal_fn(p, &name);
    struct alias *a = find_alias(p, s, name.len);
    if (p->t.kind != T_LPAREN) {
        if (a)
            return use_var(p, name.start, a->var);
        if (op >= 0 || literal_fn || autodiff_kind(p, &name) != AD_NONE ||
            derived_kind(p, &name) != DV_NONE || name_is(p, &name, "Kron"))
            return fail(p, SR_EPARSE, p->t.start, "expected '(' after %s, found %s",
                        describe(p, &name), DESC(p));
        return unknown_name(p, &name);
    }
    enum autodiff ad = autodiff_kind(p, &name);
    enum derived dv = derived_kind(p, &name);
    bool kron = name_is(p, &name, "Kron");
    if (!literal_fn && op < 0 && ad == AD_NONE && dv == DV_NONE && !kron) {
        if (a)
            return fail(p, SR_EPARSE, name.start, "%s is a variable, not a function",
                        describe(p, &name));
        const char *why = unsupported_keops(p, &name);
        if (why)
            return fail(p, SR_EPARSE, name.start,
                        "%s is a KeOps function that symred does not "
                        "support: %s (docs/semantics.md)",
                        describe(p, &name), why);
        return unknown_name(p, &name);
    }
    if (!enter(p, name.start))
        return NULL;
    sr_expr *e = ad != AD_NONE                ? parse_autodiff_call(p, &name, ad)
                 : dv != DV_NONE              ? parse_derived_call(p, &name, dv)
                 : kron || op == OP_TENSORDOT ? parse_tensordot_call(p, &name, kron)
                 : literal_fn                 ? parse_literal_call(p, &name)
                                              : parse_op_call(p, &name, op);
    leave(p);
    return e;
}

static sr_expr *parse_primary(struct parser *p)
{
    struct tok t = p->t;
    switch (t.kind) {
    case T_NUM: {
        next(p);
        if (t.real) {
            double v;
            return real_value(p, &t, false, &v) ? make(p, t.start, OP_CST, NULL, NULL, 1, v) : NULL;
        }
        int64_t v;
        return int_value(p, &t, false, &v) ? make(p, t.start, OP_INTCST, NULL, &v, 1, 0.0) : NULL;
    }
    case T_NAME:
        return parse_name(p);
    case T_LPAREN: {
        if (!enter(p, t.start))
            return NULL;
        next(p);
        sr_expr *e = parse_expr(p);
        leave(p);
        if (!e)
            return NULL;
        if (p->t.kind != T_RPAREN)
            return fail(p, SR_EPARSE, p->t.start,
                        "expected ')' to close '(' at column %zu, found %s", t.start + 1, DESC(p));
        next(p);
        return e;
    }
    default:
        return fail(p, SR_EPARSE, t.start, "expected a number, a name or '(', found %s", DESC(p));
    }
}

/* The exponent after '**'. A bare literal (optionally negated, and not itself raised to a
 * power) picks Pow, Sqrt or Rsqrt; anything else is a formula and gives Powf. */
static sr_expr *parse_exponent(struct parser *p, sr_expr *base, size_t op_col)
{
    size_t save_pos = p->pos;
    struct tok save = p->t;
    bool neg = p->t.kind == T_MINUS;
    if (neg)
        next(p);
    if (p->t.kind == T_NUM) {
        struct tok num = p->t;
        next(p);
        if (p->t.kind != T_POW) {
            if (!num.real) {
                int64_t n;
                if (!int_value(p, &num, neg, &n))
                    return NULL;
                return make(p, op_col, OP_POW, &base, &n, 0, 0.0);
            }
            double v;
            if (!real_value(p, &num, neg, &v))
                return NULL;
            if (v == 0.5)
                return make(p, op_col, OP_SQRT, &base, NULL, 0, 0.0);
            if (v == -0.5)
                return make(p, op_col, OP_RSQRT, &base, NULL, 0, 0.0);
            sr_expr *c[2] = {base, make(p, num.start, OP_CST, NULL, NULL, 1, v)};
            return make(p, op_col, OP_POWF, c, NULL, 0, 0.0);
        }
    }
    p->pos = save_pos;
    p->t = save;
    if (!enter(p, op_col))
        return NULL;
    sr_expr *c[2] = {base, parse_unary(p)};
    leave(p);
    return make(p, op_col, OP_POWF, c, NULL, 0, 0.0);
}

static sr_expr *parse_power(struct parser *p)
{
    sr_expr *base = parse_primary(p);
    if (!base || p->t.kind != T_POW)
        return base;
    size_t col = p->t.start;
    next(p);
    return parse_exponent(p, base, col);
}

static sr_expr *parse_unary(struct parser *p)
{
    if (p->t.kind != T_MINUS)
        return parse_power(p);
    size_t col = p->t.start;
    if (!enter(p, col))
        return NULL;
    next(p);
    sr_expr *a = parse_unary(p);
    leave(p);
    return make(p, col, OP_MINUS, &a, NULL, 0, 0.0);
}

static sr_expr *parse_term(struct parser *p)
{
    sr_expr *a = parse_unary(p);
    while (a && (p->t.kind == T_STAR || p->t.kind == T_SLASH)) {
        enum expr_op op = p->t.kind == T_STAR ? OP_MUL : OP_DIV;
        size_t col = p->t.start;
        next(p);
        sr_expr *c[2] = {a, parse_unary(p)};
        a = make(p, col, op, c, NULL, 0, 0.0);
    }
    return a;
}

static sr_expr *parse_sum(struct parser *p)
{
    sr_expr *a = parse_term(p);
    while (a && (p->t.kind == T_PLUS || p->t.kind == T_MINUS)) {
        enum expr_op op = p->t.kind == T_PLUS ? OP_ADD : OP_SUB;
        size_t col = p->t.start;
        next(p);
        sr_expr *c[2] = {a, parse_term(p)};
        a = make(p, col, op, c, NULL, 0, 0.0);
    }
    return a;
}

static sr_expr *parse_scalprod(struct parser *p)
{
    sr_expr *a = parse_sum(p);
    while (a && p->t.kind == T_BAR) {
        size_t col = p->t.start;
        next(p);
        sr_expr *c[2] = {a, parse_sum(p)};
        a = make(p, col, OP_SCALPROD, c, NULL, 0, 0.0);
    }
    return a;
}

/* a < b, a <= b, a > b, a >= b (KeOps formulas are Python expressions, where these give
 * LessThan and LessOrEqual): below '|' as in Python, and not chained. */
static sr_expr *parse_expr(struct parser *p)
{
    sr_expr *a = parse_scalprod(p);
    if (!a || (p->t.kind != T_LT && p->t.kind != T_GT))
        return a;
    struct tok op = p->t;
    next(p);
    sr_expr *c[2] = {a, parse_scalprod(p)};
    if (!c[1])
        return NULL;
    if (p->t.kind == T_LT || p->t.kind == T_GT)
        return fail(p, SR_EPARSE, p->t.start,
                    "comparisons do not chain: write Less(a,b)*Less(b,c) for a < b < c");
    bool lt = op.kind == T_LT, eq = op.len == 2;
    enum expr_op o = lt ? (eq ? OP_LESSEQ : OP_LESS) : (eq ? OP_GREATEREQ : OP_GREATER);
    return make(p, op.start, o, c, NULL, 0, 0.0);
}

/* ---- aliases ---- */

static void set_alias_prefix(struct parser *p, int pos, const char *text)
{
    char q[44];
    size_t n = 0;
    for (; text[n] && n < 40; n++) {
        unsigned char c = (unsigned char)text[n];
        q[n] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    q[n] = '\0';
    snprintf(p->prefix, sizeof p->prefix, "alias %d '%s%s': ", pos + 1, q, text[n] ? "..." : "");
}

/* Parses "name = Vi(dim)", "name = Vi(index, dim)" (Vj, Pm alike) or "name = Var(i, d, c)". */
static bool parse_alias(struct parser *p, int pos, const char *text, struct alias *a)
{
    set_alias_prefix(p, pos, text);
    p->s = text;
    p->pos = 0;
    p->depth = 0;
    next(p);
    if (p->t.kind != T_NAME) {
        fail(p, SR_EPARSE, p->t.start, "expected a name, found %s", DESC(p));
        return false;
    }
    struct tok name = p->t;
    a->name = text + name.start;
    a->len = name.len;
    a->pos = pos;
    if (expr_op_by_name(a->name, a->len) >= 0 || is_literal_fn(p, &name) ||
        autodiff_kind(p, &name) != AD_NONE || derived_kind(p, &name) != DV_NONE ||
        name_is(p, &name, "Kron")) {
        fail(p, SR_EPARSE, name.start, "%s is a function name and cannot be an alias",
             describe(p, &name));
        return false;
    }
    next(p);
    if (p->t.kind != T_EQ) {
        fail(p, SR_EPARSE, p->t.start, "expected '=' after the name, found %s", DESC(p));
        return false;
    }
    next(p);
    struct tok kind = p->t;
    a->col = kind.start;
    bool var = name_is(p, &kind, "Var");
    int cat = name_is(p, &kind, "Vi") ? 0 : name_is(p, &kind, "Vj") ? 1 : 2;
    if (!var && !name_is(p, &kind, "Vi") && !name_is(p, &kind, "Vj") && !name_is(p, &kind, "Pm")) {
        fail(p, SR_EPARSE, kind.start, "expected Vi, Vj, Pm or Var, found %s", DESC(p));
        return false;
    }
    next(p);
    if (p->t.kind != T_LPAREN) {
        fail(p, SR_EPARSE, p->t.start, "expected '(' after %s, found %s", describe(p, &kind),
             DESC(p));
        return false;
    }
    size_t lp = p->t.start;
    next(p);
    /* Up to three integers: Vi(dim), Vi(index, dim), Var(index, dim, cat). */
    struct num v[3];
    int n = 0;
    for (;;) {
        if (!parse_signed_number(p, true, var ? "Var" : cat_names[cat], "argument", &v[n]))
            return false;
        n++;
        if (p->t.kind == T_COMMA && n < 3) {
            next(p);
            continue;
        }
        if (p->t.kind != T_RPAREN) {
            fail(p, SR_EPARSE, p->t.start, "expected ')' to close '(' at column %zu, found %s",
                 lp + 1, DESC(p));
            return false;
        }
        next(p);
        break;
    }
    if (var ? n != 3 : n > 2) {
        const char *fn = var ? "Var" : cat_names[cat];
        fail(p, SR_EPARSE, kind.start, "%s takes %s, got %d", fn,
             var ? "3 integers (index, dimension, category)"
                 : "1 or 2 integers (dimension, or index and dimension)",
             n);
        return false;
    }
    if (p->t.kind != T_END) {
        fail(p, SR_EPARSE, p->t.start, "expected the end of the alias, found %s", DESC(p));
        return false;
    }
    a->index = n == 1 ? pos : v[0].i;
    a->dim = n == 1 ? v[0].i : v[1].i;
    a->cat = var ? v[2].i : cat;
    if (a->dim < 1 || a->dim > INT_MAX) {
        fail(p, SR_EDIM, kind.start, "%s: dimension %lld is %s", var ? "Var" : cat_names[cat],
             (long long)a->dim, a->dim < 1 ? "not positive" : "too large");
        return false;
    }
    int64_t at[2] = {a->index, a->cat};
    a->var = make(p, kind.start, OP_VAR, NULL, at, (int)a->dim, 0.0);
    return a->var != NULL;
}

static int cmp_alias(const void *x, const void *y)
{
    const struct alias *a = *(const struct alias *const *)x, *b = *(const struct alias *const *)y;
    int c = cmp_name(a->name, a->len, b->name, b->len);
    return c ? c : (a->pos > b->pos) - (a->pos < b->pos);
}

/* Parses every alias, then checks names (unique) and indices (one dim and category each,
 * forming 0..max without gaps). */
static bool parse_aliases(struct parser *p, const char *const *texts, struct alias *al, int n)
{
    for (int i = 0; i < n; i++)
        if (!parse_alias(p, i, texts[i], &al[i]))
            return false;
    for (int i = 0; i < n; i++)
        p->by_name[i] = &al[i];
    if (n > 1)
        qsort(p->by_name, (size_t)n, sizeof *p->by_name, cmp_alias);
    for (int i = 1; i < n; i++) {
        struct alias *a = p->by_name[i - 1], *b = p->by_name[i];
        if (cmp_name(a->name, a->len, b->name, b->len) == 0) {
            set_alias_prefix(p, b->pos, texts[b->pos]);
            p->s = texts[b->pos];
            struct tok t = {.kind = T_NAME, .start = (size_t)(b->name - p->s), .len = b->len};
            fail(p, SR_EPARSE, t.start, "the name %s is already declared by alias %d",
                 describe(p, &t), a->pos + 1);
            return false;
        }
    }
    /* Indices are at most EXPR_MAX_VAR (the Var builder checked), so a table is small. */
    int64_t max = -1;
    for (int i = 0; i < n; i++)
        max = al[i].index > max ? al[i].index : max;
    int *owner = malloc((size_t)(max + 1) * sizeof *owner);
    if (!owner && max >= 0) {
        fail(p, SR_ENOMEM, 0, "out of memory");
        return false;
    }
    for (int64_t i = 0; i <= max; i++)
        owner[i] = -1;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        struct alias *a = &al[i];
        int o = owner[a->index];
        if (o < 0) {
            owner[a->index] = i;
        } else if (al[o].dim != a->dim || al[o].cat != a->cat) {
            set_alias_prefix(p, i, texts[i]);
            fail(p, SR_EPARSE, a->col,
                 "index %lld is declared as %s of dimension %lld, but alias %d declared it as "
                 "%s of dimension %lld",
                 (long long)a->index, cat_names[a->cat], (long long)a->dim, o + 1,
                 cat_names[al[o].cat], (long long)al[o].dim);
            ok = false;
        }
    }
    for (int64_t i = 0; i <= max && ok; i++) {
        if (owner[i] < 0) {
            expr_builder_error(p->ctx, SR_EPARSE,
                               "aliases: no alias declares index %lld (declared indices must "
                               "be 0..%lld without gaps)",
                               (long long)i, (long long)max);
            p->failed = true;
            p->st = SR_EPARSE;
            ok = false;
        }
    }
    free(owner);
    return ok;
}

/* ---- entry point ---- */

/* The variable table of sr_parse_ex, from the aliases and the uses the parser recorded. An
 * index both declared and used must be declared and used alike. */
static bool list_vars(struct parser *p, const struct alias *al, int nal, sr_parse_desc *desc)
{
    int n = p->nuses;
    for (int i = 0; i < nal; i++)
        n = al[i].index + 1 > n ? (int)al[i].index + 1 : n;
    int count = 0;
    for (int idx = 0; idx < n; idx++) {
        const struct alias *a = NULL;
        for (int i = 0; i < nal && !a; i++)
            if (al[i].index == idx)
                a = &al[i];
        const struct var_use *u = idx < p->nuses && p->uses[idx].dim ? &p->uses[idx] : NULL;
        if (a && u && (u->dim != a->dim || u->cat != a->cat)) {
            p->s = p->formula;
            fail(p, SR_EDIM, u->col,
                 "variable index %d is used as %s of dimension %d here, but alias %d declares "
                 "it as %s of dimension %lld",
                 idx, cat_names[u->cat], u->dim, a->pos + 1, cat_names[a->cat], (long long)a->dim);
            return false;
        }
        if (!a && !u)
            continue;
        if (desc && count < desc->vars_cap)
            desc->vars[count] = (sr_parse_var){
                .index = idx,
                .dim = a ? (int)a->dim : u->dim,
                .cat = (sr_cat)(a ? a->cat : u->cat),
                .alias = a ? a->pos : -1,
            };
        count++;
    }
    if (desc)
        desc->nvars = count;
    return true;
}

static sr_status parse_text(sr_ctx *ctx, const char *formula, const char *const *aliases,
                            int naliases, sr_parse_desc *desc, sr_expr **out)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return SR_EINVAL;
    if (!out)
        return expr_error(ctx, SR_EINVAL, "sr_parse: out is NULL");
    if (!formula)
        return expr_error(ctx, SR_EINVAL, "sr_parse: formula is NULL");
    if (naliases < 0)
        return expr_error(ctx, SR_EINVAL, "sr_parse: naliases is %d, not >= 0", naliases);
    if (naliases > 0 && !aliases)
        return expr_error(ctx, SR_EINVAL, "sr_parse: aliases is NULL but naliases is %d", naliases);
    for (int i = 0; i < naliases; i++)
        if (!aliases[i])
            return expr_error(ctx, SR_EINVAL, "sr_parse: alias %d is NULL", i + 1);
    if (desc) {
        desc->nvars = 0;
        if (desc->gradin_cat != SR_CAT_I && desc->gradin_cat != SR_CAT_J)
            return expr_error(ctx, SR_EINVAL,
                              "sr_parse_ex: gradin_cat is %d, not SR_CAT_I (0) or SR_CAT_J (1)",
                              (int)desc->gradin_cat);
        if (desc->vars_cap < 0 || (desc->vars_cap > 0 && !desc->vars))
            return expr_error(ctx, SR_EINVAL, "sr_parse_ex: vars_cap is %d but vars is %s",
                              desc->vars_cap, desc->vars ? "not NULL" : "NULL");
    }

    struct parser p = {.ctx = ctx,
                       .s = formula,
                       .formula = formula,
                       .gradin_cat = desc ? desc->gradin_cat : SR_CAT_I};
    struct alias *al = NULL;
    if (naliases > 0) {
        al = calloc((size_t)naliases, sizeof *al);
        p.by_name = calloc((size_t)naliases, sizeof *p.by_name);
        if (!al || !p.by_name) {
            free(al);
            free(p.by_name);
            return expr_error(ctx, SR_ENOMEM, "sr_parse: out of memory");
        }
    }
    sr_expr *e = NULL;
    if (parse_aliases(&p, aliases, al, naliases)) {
        p.nal = naliases;
        p.prefix[0] = '\0';
        p.s = formula;
        p.pos = 0;
        p.depth = 0;
        next(&p);
        if (p.t.kind == T_END) {
            fail(&p, SR_EPARSE, p.t.start, "the formula is empty");
        } else {
            e = parse_expr(&p);
            if (e && p.t.kind == T_RPAREN)
                e = fail(&p, SR_EPARSE, p.t.start, "unmatched ')'");
            else if (e && p.t.kind != T_END)
                e = fail(&p, SR_EPARSE, p.t.start,
                         "expected an operator or the end of the formula, found %s", DESC(&p));
            if (e && !list_vars(&p, al, naliases, desc))
                e = NULL;
        }
    }
    free(al);
    free(p.by_name);
    free(p.uses);
    if (!e) {
        if (desc)
            desc->nvars = 0;
        return p.failed ? p.st : expr_error(ctx, SR_EINTERNAL, "sr_parse: failed without a reason");
    }

    /* The per-use check above gives the better message; this is the library-wide rule. */
    struct expr_var *vars;
    int nvars;
    sr_status st = expr_collect_vars(ctx, (const sr_expr *const *)&e, 1, &vars, &nvars);
    if (st != SR_OK) {
        if (desc)
            desc->nvars = 0;
        return st;
    }
    free(vars);
    *out = e;
    return SR_OK;
}

sr_status sr_parse(sr_ctx *ctx, const char *formula, const char *const *aliases, int naliases,
                   sr_expr **out)
{
    return parse_text(ctx, formula, aliases, naliases, NULL, out);
}

sr_status sr_parse_ex(sr_ctx *ctx, const char *formula, const char *const *aliases, int naliases,
                      sr_parse_desc *desc, sr_expr **out)
{
    if (out)
        *out = NULL;
    if (ctx && !desc)
        return expr_error(ctx, SR_EINVAL, "sr_parse_ex: desc is NULL");
    return parse_text(ctx, formula, aliases, naliases, desc, out);
}
