/* hashcons.c — the context's node store: a bump arena and the find-or-insert table. */
#include "expr.h"

#include <stdlib.h>
#include <string.h>

struct arena_block {
    struct arena_block *prev;
    size_t size;
    _Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK 65536

void expr_store_init(struct expr_store *s) { memset(s, 0, sizeof *s); }

void expr_store_free(struct expr_store *s)
{
    struct arena_block *b = s->arena;
    while (b) {
        struct arena_block *prev = b->prev;
        free(b);
        b = prev;
    }
    free(s->buckets);
    free(s->tdots); /* the lists themselves live in the arena */
    memset(s, 0, sizeof *s);
}

void *expr_arena_alloc(struct expr_store *s, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (!s->arena || s->arena_used + size > s->arena->size) {
        size_t cap = size > ARENA_BLOCK ? size : ARENA_BLOCK;
        struct arena_block *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->prev = s->arena;
        b->size = cap;
        s->arena = b;
        s->arena_used = 0;
    }
    void *p = s->arena->data + s->arena_used;
    s->arena_used += size;
    memset(p, 0, size);
    return p;
}

uint64_t expr_hash_mix(uint64_t h, uint64_t v)
{
    /* splitmix64-style mixing of each word into the running hash */
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    return h;
}

/* The hash is structural (children enter by their own hash, never by address), so the same
 * formula hashes alike in every process: it is the root of the kernel cache key. */
static uint64_t node_hash(const sr_expr *n)
{
    uint64_t fbits;
    memcpy(&fbits, &n->fattr, sizeof fbits);
    uint64_t h = expr_hash_mix(0x5352ULL, n->op);
    h = expr_hash_mix(h, (uint64_t)(uint32_t)n->dim);
    /* TensorDot's first attribute is an index into this context's lists, which depends on the
     * order of construction: its second attribute, the lists' hash, stands for both. */
    for (int i = n->op == OP_TENSORDOT ? 1 : 0; i < EXPR_MAX_ATTR; i++)
        h = expr_hash_mix(h, (uint64_t)n->iattr[i]);
    h = expr_hash_mix(h, fbits);
    for (int i = 0; i < expr_arity(n); i++)
        h = expr_hash_mix(h, n->child[i]->hash);
    return h;
}

static bool node_equal(const sr_expr *a, const sr_expr *b)
{
    if (a->op != b->op || a->dim != b->dim)
        return false;
    if (memcmp(a->iattr, b->iattr, sizeof a->iattr) != 0)
        return false;
    if (memcmp(&a->fattr, &b->fattr, sizeof a->fattr) != 0)
        return false;
    for (int i = 0; i < expr_arity(a); i++)
        if (a->child[i] != b->child[i])
            return false;
    return true;
}

static bool grow(struct expr_store *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : 256;
    sr_expr **nb = calloc(n, sizeof *nb);
    if (!nb)
        return false;
    for (size_t i = 0; i < s->nbuckets; i++) {
        sr_expr *e = s->buckets[i];
        while (e) {
            sr_expr *next = e->next;
            size_t k = e->hash & (n - 1);
            e->next = nb[k];
            nb[k] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = nb;
    s->nbuckets = n;
    return true;
}

/* Finds the node equal to *proto (op, dim, attrs, children filled in), or copies proto into the
 * arena and inserts it. NULL on out-of-memory. */
sr_expr *expr_intern(sr_ctx *ctx, const sr_expr *proto);
sr_expr *expr_intern(sr_ctx *ctx, const sr_expr *proto)
{
    struct expr_store *s = &expr_ctx(ctx)->store;
    uint64_t h = node_hash(proto);
    if (s->nbuckets) {
        for (sr_expr *e = s->buckets[h & (s->nbuckets - 1)]; e; e = e->next)
            if (e->hash == h && node_equal(e, proto))
                return e;
    }
    if (s->count + 1 > s->nbuckets * 3 / 4 && !grow(s))
        return NULL;
    sr_expr *n = expr_arena_alloc(s, sizeof *n);
    if (!n)
        return NULL;
    *n = *proto;
    n->ctx = ctx;
    n->hash = h;
    n->id = s->next_id++;
    size_t k = h & (s->nbuckets - 1);
    n->next = s->buckets[k];
    s->buckets[k] = n;
    s->count++;
    return n;
}

/* ---- graph walks ---- */

struct ptrset {
    const void **slot;
    size_t cap, count;
};

static bool ptrset_add(struct ptrset *ps, const void *p) /* true if newly added */
{
    if (ps->count + 1 > ps->cap / 2) {
        size_t ncap = ps->cap ? ps->cap * 2 : 64;
        const void **ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return false; /* treated as "seen": the walk stays finite; callers check OOM */
        for (size_t i = 0; i < ps->cap; i++)
            if (ps->slot[i]) {
                size_t k = ((uintptr_t)ps->slot[i] >> 4) & (ncap - 1);
                while (ns[k])
                    k = (k + 1) & (ncap - 1);
                ns[k] = ps->slot[i];
            }
        free(ps->slot);
        ps->slot = ns;
        ps->cap = ncap;
    }
    size_t k = ((uintptr_t)p >> 4) & (ps->cap - 1);
    while (ps->slot[k]) {
        if (ps->slot[k] == p)
            return false;
        k = (k + 1) & (ps->cap - 1);
    }
    ps->slot[k] = p;
    ps->count++;
    return true;
}

size_t expr_toposort(const sr_expr *root, const sr_expr **order, size_t cap)
{
    if (!root)
        return 0;
    struct ptrset seen = {0};
    /* explicit stack of (node, next child to visit) so deep formulas cannot overflow the C
     * stack */
    size_t scap = 64, sp = 0, n = 0;
    struct frame {
        const sr_expr *e;
        int next;
    } *stack = malloc(scap * sizeof *stack);
    if (!stack)
        return 0;
    ptrset_add(&seen, root);
    stack[sp++] = (struct frame){root, 0};
    while (sp) {
        struct frame *f = &stack[sp - 1];
        if (f->next < expr_arity(f->e)) {
            const sr_expr *c = f->e->child[f->next++];
            if (ptrset_add(&seen, c)) {
                if (sp == scap) {
                    struct frame *ns = realloc(stack, 2 * scap * sizeof *stack);
                    if (!ns)
                        break;
                    stack = ns;
                    scap *= 2;
                }
                stack[sp++] = (struct frame){c, 0};
            }
        } else {
            if (n < cap)
                order[n] = f->e;
            n++;
            sp--;
        }
    }
    free(stack);
    free(seen.slot);
    return n;
}

sr_status expr_collect_vars(sr_ctx *ctx, const sr_expr *const *roots, int nroots,
                            struct expr_var **vars, int *nvars)
{
    *vars = NULL;
    *nvars = 0;
    struct expr_var *v = NULL;
    int nv = 0;
    sr_status st = SR_OK;
    for (int r = 0; r < nroots && st == SR_OK; r++) {
        if (!roots[r])
            continue;
        size_t cnt = expr_toposort(roots[r], NULL, 0);
        const sr_expr **order = malloc((cnt ? cnt : 1) * sizeof *order);
        if (!order) {
            st = expr_error(ctx, SR_ENOMEM, "out of memory while walking the formula");
            break;
        }
        expr_toposort(roots[r], order, cnt);
        for (size_t i = 0; i < cnt && st == SR_OK; i++) {
            const sr_expr *e = order[i];
            if (e->op != OP_VAR)
                continue;
            int idx = (int)e->iattr[0];
            sr_cat cat = (sr_cat)e->iattr[1];
            if (idx >= nv) {
                struct expr_var *nvp = realloc(v, (size_t)(idx + 1) * sizeof *v);
                if (!nvp) {
                    st = expr_error(ctx, SR_ENOMEM, "out of memory while collecting variables");
                    break;
                }
                v = nvp;
                memset(v + nv, 0, (size_t)(idx + 1 - nv) * sizeof *v);
                nv = idx + 1;
            }
            static const char *catname[] = {"Vi", "Vj", "Pm"};
            if (v[idx].dim == 0) {
                v[idx].dim = e->dim;
                v[idx].cat = cat;
            } else if (v[idx].dim != e->dim || v[idx].cat != cat) {
                st = expr_error(ctx, SR_EDIM,
                                "variable index %d is used both as %s of dimension %d and as %s "
                                "of dimension %d",
                                idx, catname[v[idx].cat], v[idx].dim, catname[cat], e->dim);
            }
        }
        free(order);
    }
    if (st != SR_OK) {
        free(v);
        return st;
    }
    *vars = v;
    *nvars = nv;
    return SR_OK;
}
