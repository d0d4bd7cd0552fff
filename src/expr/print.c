/*
 * print.c — the formula printer: any expression DAG back to text that sr_parse() reads again.
 *
 * The text is canonical and has no spaces: variables as Var(index,dim,cat), non-negative
 * IntCst as a plain integer, negative ones as IntCst(-n), RatCst(p,q), non-negative real
 * constants as a literal that always contains '.', 'e' or 'E' (so 2.0 stays a real), negative
 * ones as Cst(-2.5), the infix ops fully parenthesised ((a+b), (a|b), (-a)), and every other op
 * as Name(operands,integer attributes). Parsing the text with no aliases gives the same interned
 * node.
 *
 * A DAG is printed as a tree: a shared subexpression is written once per use. Its text can
 * therefore be exponentially longer than the DAG (x1 = x0+x0, x2 = x1+x1, ...), so the printer
 * first computes the exact text length over the DAG (one pass, saturating at SIZE_MAX) and then
 * writes only as many bytes as the caller has room for. Both passes use explicit stacks, so
 * expressions of any depth print without deep C recursion. The parser limits nesting (see
 * parse.c), so the text of a very deep expression prints fine but does not parse back.
 */
#include "expr.h"

#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void expr_buf_printf(struct expr_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* ---- the text of one node, in pieces ---- */

/* The longest piece: "Var(" + three 20-digit integers, or a %.17g real in "Cst(...)". */
/* TensorDot's lists are the longest piece: at most 5 lists of 32 entries of 9 bytes. */
#define PIECE_MAX 1536

/* Numbers are written in the C locale whatever LC_NUMERIC the host program has set: a decimal
 * comma would not parse back. The locale object is made once per process. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static int format_real(char *out, size_t cap, double v)
{
    pthread_once(&c_locale_once, c_locale_init);
    locale_t old = c_locale ? uselocale(c_locale) : (locale_t)0;
    int n = snprintf(out, cap, "%.17g", v);
    if (old)
        uselocale(old);
    return n;
}

static bool is_infix_binary(const sr_expr *e)
{
    return expr_ops[e->op].infix && expr_ops[e->op].arity == 2;
}

/* TensorDot's last piece: ",[dims a],[dims b],[axes a],[axes b]", then ",[permute]" unless it
 * is the identity, then ")". */
static size_t tdot_lists(const sr_expr *e, char *out)
{
    const struct expr_tdot *t = expr_tdot_of(e);
    const int32_t *lists[5] = {t->key.da, t->key.db, t->key.ca, t->key.cb, t->key.perm};
    int len[5] = {t->key.ra, t->key.rb, t->key.nc, t->key.nc, t->nout};
    bool identity = true;
    for (int k = 0; k < t->nout; k++)
        identity = identity && t->key.perm[k] == k;
    size_t n = 0;
    for (int l = 0; l < (identity ? 4 : 5); l++) {
        n += (size_t)snprintf(out + n, PIECE_MAX - n, ",[");
        for (int k = 0; k < len[l]; k++)
            n += (size_t)snprintf(out + n, PIECE_MAX - n, "%s%d", k ? "," : "", (int)lists[l][k]);
        n += (size_t)snprintf(out + n, PIECE_MAX - n, "]");
    }
    n += (size_t)snprintf(out + n, PIECE_MAX - n, ")");
    return n;
}

/*
 * Writes piece k of e's text into out (PIECE_MAX bytes) and returns its length. A node of arity
 * a has a+1 pieces, written around its children: piece 0, child 0, piece 1, child 1, ...,
 * piece a. A leaf has one piece, its whole text.
 */
static size_t piece(const sr_expr *e, int k, char *out)
{
    const struct expr_opinfo *oi = &expr_ops[e->op];
    int n = 0;
    switch (e->op) {
    case OP_VAR:
        n = snprintf(out, PIECE_MAX, "Var(%lld,%d,%lld)", (long long)e->iattr[0], e->dim,
                     (long long)e->iattr[1]);
        return (size_t)n;
    case OP_INTCST:
        n = snprintf(out, PIECE_MAX, e->iattr[0] >= 0 ? "%lld" : "IntCst(%lld)",
                     (long long)e->iattr[0]);
        return (size_t)n;
    case OP_RATCST:
        n = snprintf(out, PIECE_MAX, "RatCst(%lld,%lld)", (long long)e->iattr[0],
                     (long long)e->iattr[1]);
        return (size_t)n;
    case OP_CST: {
        char num[40];
        format_real(num, sizeof num, e->fattr);
        /* A real literal needs '.', 'e' or 'E', or it would read back as an IntCst; negative
         * values are written Cst(-2.5), since -2.5 would read back as Minus(2.5). */
        const char *dot = strpbrk(num, ".eE") ? "" : ".0";
        if (e->fattr < 0)
            n = snprintf(out, PIECE_MAX, "Cst(%s%s)", num, dot);
        else
            n = snprintf(out, PIECE_MAX, "%s%s", num, dot);
        return (size_t)n;
    }
    case OP_MINUS:
        strcpy(out, k == 0 ? "(-" : ")");
        return k == 0 ? 2 : 1;
    default:
        break;
    }
    if (is_infix_binary(e)) {
        const char *s = k == 0 ? "(" : k == 1 ? oi->infix : ")";
        size_t len = strlen(s);
        memcpy(out, s, len + 1);
        return len;
    }
    if (e->op == OP_TENSORDOT && k == oi->arity)
        return tdot_lists(e, out);
    if (k == 0)
        n = snprintf(out, PIECE_MAX, "%s(", oi->name);
    else if (k < oi->arity)
        n = snprintf(out, PIECE_MAX, ",");
    else {
        for (int i = 0; i < oi->nattr; i++)
            n += snprintf(out + n, PIECE_MAX - (size_t)n, ",%lld", (long long)e->iattr[i]);
        n += snprintf(out + n, PIECE_MAX - (size_t)n, ")");
    }
    return (size_t)n;
}

static size_t own_length(const sr_expr *e)
{
    char tmp[PIECE_MAX];
    size_t len = 0;
    for (int k = 0; k <= expr_arity(e); k++)
        len += piece(e, k, tmp);
    return len;
}

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* ---- pass 1: the exact length of the text, by dynamic programming over the DAG ---- */

/* An open-addressing map from node to the length of its text. */
struct lenmap {
    const sr_expr **key;
    size_t *val;
    size_t mask;
};

static size_t lenmap_slot(const struct lenmap *m, const sr_expr *e)
{
    size_t k = (size_t)(e->hash ^ (e->hash >> 29)) & m->mask;
    while (m->key[k] && m->key[k] != e)
        k = (k + 1) & m->mask;
    return k;
}

/* The length of e's text (saturating at SIZE_MAX); *ok is false on out-of-memory. */
static size_t text_length(const sr_expr *e, bool *ok)
{
    *ok = true;
    if (expr_arity(e) == 0)
        return own_length(e);
    size_t cnt = expr_toposort(e, NULL, 0);
    const sr_expr **order = malloc(cnt * sizeof *order);
    size_t cap = 16;
    while (cap < 2 * cnt)
        cap *= 2;
    struct lenmap m = {calloc(cap, sizeof *m.key), malloc(cap * sizeof *m.val), cap - 1};
    size_t len = 0;
    if (!order || !m.key || !m.val || expr_toposort(e, order, cnt) != cnt) {
        *ok = false;
    } else {
        /* children come before their parents in the topological order */
        for (size_t i = 0; i < cnt; i++) {
            const sr_expr *n = order[i];
            size_t l = own_length(n);
            for (int c = 0; c < expr_arity(n); c++)
                l = sat_add(l, m.val[lenmap_slot(&m, n->child[c])]);
            size_t k = lenmap_slot(&m, n);
            m.key[k] = n;
            m.val[k] = l;
        }
        len = m.val[lenmap_slot(&m, e)];
    }
    free(order);
    free(m.key);
    free(m.val);
    return len;
}

/* ---- pass 2: the first n bytes of the text ---- */

/* Writes the first n bytes of e's text to dst (no NUL). False on out-of-memory. */
static bool write_text(const sr_expr *e, char *dst, size_t n)
{
    struct frame {
        const sr_expr *e;
        int k; /* next piece to write */
    };
    struct frame small[64];
    struct frame *stack = small;
    size_t sp = 0, scap = sizeof small / sizeof small[0], pos = 0;
    bool ok = true;
    char tmp[PIECE_MAX];
    stack[sp++] = (struct frame){e, 0};
    while (sp && pos < n) {
        struct frame *f = &stack[sp - 1];
        size_t len = piece(f->e, f->k, tmp);
        if (len > n - pos)
            len = n - pos;
        memcpy(dst + pos, tmp, len);
        pos += len;
        if (f->k == expr_arity(f->e)) {
            sp--;
            continue;
        }
        const sr_expr *child = f->e->child[f->k++];
        if (sp == scap) {
            struct frame *ns = malloc(2 * scap * sizeof *ns);
            if (!ns) {
                ok = false;
                break;
            }
            memcpy(ns, stack, sp * sizeof *ns);
            if (stack != small)
                free(stack);
            stack = ns;
            scap *= 2;
        }
        stack[sp++] = (struct frame){child, 0};
    }
    if (stack != small)
        free(stack);
    return ok;
}

/* ---- entry points ---- */

/* Text longer than this is cut (with "...") when printed into a growable buffer: such text
 * only comes from huge DAGs with much sharing, and is for human eyes (kernel explain). */
#define PRINT_TO_MAX ((size_t)1 << 24)

void expr_print_to(struct expr_buf *b, const sr_expr *e)
{
    if (b->oom)
        return;
    if (!e) {
        expr_buf_printf(b, "<null>");
        return;
    }
    bool ok;
    size_t len = text_length(e, &ok);
    if (!ok) {
        b->oom = true;
        return;
    }
    bool cut = len > PRINT_TO_MAX;
    size_t n = cut ? PRINT_TO_MAX : len;
    size_t need = b->len + n + 4; /* "..." and the NUL */
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < need)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (!write_text(e, b->data + b->len, n)) {
        b->oom = true;
        return;
    }
    b->len += n;
    if (cut) {
        memcpy(b->data + b->len, "...", 3);
        b->len += 3;
    }
    b->data[b->len] = '\0';
}

size_t sr_expr_print(const sr_expr *e, char *buf, size_t cap)
{
    if (!buf)
        cap = 0;
    if (cap)
        buf[0] = '\0';
    if (!e)
        return 0;
    bool ok;
    size_t len = text_length(e, &ok);
    if (!ok)
        return 0;
    if (cap) {
        size_t n = len < cap - 1 ? len : cap - 1;
        if (!write_text(e, buf, n))
            n = 0;
        buf[n] = '\0';
    }
    return len;
}
