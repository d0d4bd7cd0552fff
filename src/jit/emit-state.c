/*
 * emit-state.c — the reduction state of one output row, for every target: the one place that
 * spells the tie and NaN rules of docs/semantics.md for combining and finishing row states.
 *
 * The C emitter (emit-c.c) and the CUDA emitter (emit-cuda.c) both paste this text into their
 * generated sources. It uses only what both languages share; the target's prelude defines the
 * rest (see jit.h): the types sr_t, sr_acc and int64_t, the constants SR_D, SR_K, SR_DG,
 * SR_OUTD, SR_INF and SR_NAN, the function qualifier SR_FN and the loop hint SR_UNROLL, and
 * the caller's array element sr_io with its load SR_LD and store SR_ST (the identity unless the
 * C emitter reads 16-bit arrays itself).
 * Everything is per row; the targets loop over rows (C) or give a row to each thread (CUDA).
 *
 * The state's slots and their start values come from SR_RED_SLOT_MAP (src/core/reductions.h);
 * the order and the outputs from SR_REDUCTION_RULES; the rules of each family are the rows of
 * family_rules below, text templates in which
 *   $S  the state, as a prefix of a member ("s->", "st.")   $c  the component's index
 *   $v  the value folded in                                  $r  its reduced index
 *   $<  the family's comparison ("<" ascending, ">" descending)
 *   $f  the suffix of the dtype's libm functions ("f" for float)
 * are replaced by the caller's names.
 */
#include "jit.h"

#include <string.h>

/* One slot of SR_RED_SLOT_MAP. */
struct slot {
    enum sr_red_family fam;
    const char *name;
    enum sr_red_type type;
    enum sr_red_count count;
    enum sr_red_start start;
};

static const struct slot slots[] = {
#define SLOT_(fam, nm, ty, n, st)                                                                  \
    {SR_RED_FAM_##fam, #nm, SR_RED_T_##ty, SR_RED_N_##n, SR_RED_START_##st},
    SR_RED_SLOT_MAP(SLOT_)
#undef SLOT_
};
#define NSLOTS ((int)(sizeof slots / sizeof *slots))

/* How each family folds a value in, merges two states and writes its outputs, as templates
 * (see the top of this file). */
struct family_rules {
    /* Functions the rules below call, emitted once after st_init. */
    const char *helpers;
    /* Folds $v (reduced index $r) into component $c of state $S: one statement. The CUDA
     * kernels fold every value with it; the C kernels fold a tile's partial sum or extreme
     * with it, and the other families' tiles by vectorised rules of their own (emit-c.c). */
    const char *fold;
    const char *fold_kahan; /* Sum with the Kahan accumulation */
    /* The body of st_merge(d, s, tm, ti): s covers reduced indices after d's (ties keep d's
     * lower indices); the K-reductions merge through the scratch tm[SR_K], ti[SR_K]. */
    const char *merge;
    const char *merge_kahan;
    /* st_final: a loop over the outputs of the row, then each value's and each index's store
     * (ov, oi: the row's outputs). */
    const char *final_loop, *final_v, *final_i;
};

#define SUM_KAHAN_                                                                                 \
    "{ sr_acc y = $v - $Sc[$c]; sr_acc t = $Ss[$c] + y; $Sc[$c] = t - t == 0 ? (t - $Ss[$c]) - y " \
    ": 0; $Ss[$c] = t; }"

static const struct family_rules family_rules[SR_RED_FAM_COUNT] = {
    [SR_RED_FAM_SUM] =
        {
            .fold = "$Ss[$c] += $v;",
            /* no compensation once the sum is infinite: inf - inf would make it NaN */
            .fold_kahan = SUM_KAHAN_,
            .merge = "    for (int c = 0; c < SR_D; c++) {\n"
                     "        sr_acc y = s->s[c] - (d->c[c] + s->c[c]);\n"
                     "        sr_acc t = d->s[c] + y;\n"
                     "        d->c[c] = 0;\n        d->s[c] = t;\n    }\n",
            .merge_kahan = "    for (int c = 0; c < SR_D; c++) {\n"
                           "        sr_acc y = s->s[c] - (d->c[c] + s->c[c]);\n"
                           "        sr_acc t = d->s[c] + y;\n"
                           "        d->c[c] = t - t == 0 ? (t - d->s[c]) - y : 0;\n"
                           "        d->s[c] = t;\n    }\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " ov[c] = SR_ST((sr_t)s->s[c]);",
        },
    [SR_RED_FAM_EXT] =
        {
            .fold = "if ($Sm[$c] == $Sm[$c] && ($v $< $Sm[$c] || $v != $v)) $Sm[$c] = $v;",
            .merge = "    for (int c = 0; c < SR_D; c++) {\n"
                     "        sr_t v = s->m[c], m = d->m[c];\n"
                     "        if (m == m && (v $< m || v != v)) d->m[c] = v;\n    }\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " ov[c] = SR_ST(s->m[c]);",
        },
    [SR_RED_FAM_ARGEXT] =
        {
            .fold = "if ($Si[$c] < 0 || ($Sm[$c] == $Sm[$c] && ($v $< $Sm[$c] || $v != $v))) { "
                    "$Sm[$c] = $v; $Si[$c] = $r; }",
            .merge = "    for (int c = 0; c < SR_D; c++) {\n"
                     "        sr_t v = s->m[c], m = d->m[c];\n"
                     "        if (s->i[c] >= 0 && (d->i[c] < 0 || (m == m && (v $< m || v != v)))) "
                     "{\n"
                     "            d->m[c] = v; d->i[c] = s->i[c];\n        }\n    }\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " ov[c] = SR_ST(s->m[c]);",
            .final_i = " oi[c] = s->i[c];",
        },
    [SR_RED_FAM_KSEL] =
        {
            .helpers =
                "/* v before slot (m, i) in the order of NumPy's sort: empty slots last, NaN after "
                "+inf,\n"
                " * equal values keep index order (so the strict comparison). */\n"
                "#define SR_KLT(v, m, i) ((i) < 0 || (v) < (m) || ((v) == (v) && (m) != (m)))\n\n",
            /* The new index is the largest so far: put it last and bubble it up while it sorts
             * before its neighbour; sorted neighbours never swap. */
            .fold = "sr_t *M = $Sm[$c]; int64_t *I = $Si[$c];\n"
                    "        if (SR_KLT($v, M[SR_K - 1], I[SR_K - 1])) {\n"
                    "          M[SR_K - 1] = $v; I[SR_K - 1] = $r;\n"
                    "#pragma unroll\n"
                    "          for (int p = SR_K - 1; p > 0; p--)\n"
                    "            if (SR_KLT(M[p], M[p - 1], I[p - 1])) {\n"
                    "              const sr_t tm = M[p]; M[p] = M[p - 1]; M[p - 1] = tm;\n"
                    "              const int64_t ti = I[p]; I[p] = I[p - 1]; I[p - 1] = ti;\n"
                    "            }\n"
                    "        }",
            .merge = "    for (int c = 0; c < SR_D; c++) {\n"
                     "        const sr_t *am = d->m[c], *bm = s->m[c];\n"
                     "        const int64_t *ai = d->i[c], *bi = s->i[c];\n"
                     "        int x = 0, y = 0;\n"
                     "        for (int q = 0; q < SR_K; q++) {\n"
                     "            const int takeb = bi[y] >= 0 && SR_KLT(bm[y], am[x], ai[x]);\n"
                     "            if (takeb) { tm[q] = bm[y]; ti[q] = bi[y]; y++; }\n"
                     "            else { tm[q] = am[x]; ti[q] = ai[x]; x++; }\n"
                     "        }\n"
                     "        for (int q = 0; q < SR_K; q++) { d->m[c][q] = tm[q]; d->i[c][q] = "
                     "ti[q]; }\n"
                     "    }\n",
            .final_loop = "    for (int q = 0; q < SR_K; q++) for (int c = 0; c < SR_D; c++)",
            .final_v = " ov[q * SR_D + c] = SR_ST(s->m[c][q]);",
            .final_i = " oi[q * SR_D + c] = s->i[c][q];",
        },
    [SR_RED_FAM_LSE] =
        {
            .helpers =
                "/* Folds a partial (m2, s2) = (max, sum of exp(v - max)) into (*m, *s). NaN "
                "sticks; an\n"
                " * +inf term makes the result +inf; -inf terms contribute nothing. */\n"
                "SR_FN void lse_fold(sr_t *m, sr_acc *s, sr_t m2, sr_acc s2)\n{\n"
                "    if (*m != *m || m2 == -SR_INF) return;\n"
                "    if (m2 != m2) { *m = m2; return; }\n"
                "    if (*m == -SR_INF) { *m = m2; *s = s2; return; }\n"
                "    if (*m == SR_INF) return;\n"
                "    if (m2 == SR_INF) { *m = m2; *s = 1; return; }\n"
                "    if (m2 > *m) { *s = *s * (sr_acc)exp$f(*m - m2) + s2; *m = m2; }\n"
                "    else *s += s2 * (sr_acc)exp$f(m2 - *m);\n}\n\n",
            /* The common case (a value at most the finite running maximum) costs one exp;
             * everything else takes the general rule. */
            .fold = "const sr_t m = $Sm[$c];\n"
                    "        if ($v <= m && m > -SR_INF && m < SR_INF) $Ss[$c] += "
                    "(sr_acc)exp$f($v - m);\n"
                    "        else lse_fold(&$Sm[$c], &$Ss[$c], $v, (sr_acc)1);",
            .merge = "    for (int c = 0; c < SR_D; c++) lse_fold(&d->m[c], &d->s[c], s->m[c], "
                     "s->s[c]);\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " const sr_t m = s->m[c]; ov[c] = SR_ST((m != m || m == SR_INF || m == "
                       "-SR_INF) ? m : m + (sr_t)log$f((sr_t)s->s[c]));",
        },
    [SR_RED_FAM_SSMW] =
        {
            /* The reference's combine rule (src/cpu/cpu.h), in the kernel's types. */
            .helpers =
                "SR_FN void ssmw_fold(sr_state *d, sr_t m2, sr_acc s2, const sr_acc *w2)\n{\n"
                "    const sr_t mm = m2 > d->m ? m2 : d->m;\n"
                "    const sr_acc sa = d->m == mm ? (sr_acc)1 : (sr_acc)exp$f(d->m - mm);\n"
                "    const sr_acc sb = m2 == mm ? (sr_acc)1 : (sr_acc)exp$f(m2 - mm);\n"
                "    d->m = mm;\n    d->s = d->s * sa + s2 * sb;\n"
                "SR_UNROLL\n"
                "    for (int c = 0; c < SR_DG; c++) d->w[c] = d->w[c] * sa + w2[c] * sb;\n"
                "}\n\n",
            /* F is scalar and the weight's values are in sr_g[SR_DG]. NaN or +inf anywhere makes
             * the result NaN (semantics.md); -inf has weight 0, and 0 times an infinite weight
             * is NaN, as in the formula. */
            .fold = "if ($v != $v || $v == SR_INF) $Ss = (sr_acc)SR_NAN;\n"
                    "        else if ($v == -SR_INF) {\n"
                    "#pragma unroll\n"
                    "          for (int g = 0; g < SR_DG; g++) $Sw[g] += (sr_acc)0 * sr_g[g];\n"
                    "        } else if ($v > $Sm) {\n"
                    "          const sr_acc sc = $Sm == -SR_INF ? (sr_acc)0 : (sr_acc)exp$f($Sm - "
                    "$v);\n"
                    "          $Ss = $Ss * sc + (sr_acc)1;\n"
                    "#pragma unroll\n"
                    "          for (int g = 0; g < SR_DG; g++) $Sw[g] = $Sw[g] * sc + sr_g[g];\n"
                    "          $Sm = $v;\n"
                    "        } else {\n"
                    "          const sr_acc e = (sr_acc)exp$f($v - $Sm);\n"
                    "          $Ss += e;\n"
                    "#pragma unroll\n"
                    "          for (int g = 0; g < SR_DG; g++) $Sw[g] += e * sr_g[g];\n"
                    "        }",
            .merge = "    ssmw_fold(d, s->m, s->s, s->w);\n",
            .final_loop = "    for (int c = 0; c < SR_DG; c++)",
            .final_v = " ov[c] = SR_ST((sr_t)(s->w[c] / s->s));",
        },
};

/* The names a template's placeholders stand for. */
struct names {
    const char *S, *c, *v, *r, *cmp, *f;
};

/* Appends template t with its placeholders replaced. */
static void put(struct expr_buf *b, const char *t, const struct names *n)
{
    while (*t) {
        const char *d = strchr(t, '$');
        if (!d) {
            expr_buf_printf(b, "%s", t);
            return;
        }
        expr_buf_printf(b, "%.*s", (int)(d - t), t);
        const char *by = d[1] == 'S'   ? n->S
                         : d[1] == 'c' ? n->c
                         : d[1] == 'v' ? n->v
                         : d[1] == 'r' ? n->r
                         : d[1] == '<' ? n->cmp
                         : d[1] == 'f' ? n->f
                                       : NULL;
        if (by)
            expr_buf_printf(b, "%s", by);
        else
            expr_buf_printf(b, "%.2s", d);
        t = d + (d[1] ? 2 : 1);
    }
}

static const char *cmp_of(const struct sr_kernel *k)
{
    return sr_reductions[k->red].order == SR_RED_DESC ? ">" : "<";
}

static const char *fsuffix(const struct sr_kernel *k) { return k->dtype == SR_F32 ? "f" : ""; }

void jit_emit_fold(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                   const char *state, const char *c, const char *v, const char *r)
{
    const struct family_rules *fr = &family_rules[sr_reductions[k->red].family];
    const struct names n = {state, c, v, r, cmp_of(k), fsuffix(k)};
    put(b, acc == JIT_ACC_KAHAN && fr->fold_kahan ? fr->fold_kahan : fr->fold, &n);
}

/* The scalar count of a slot's extent. */
static int count_of(const struct sr_kernel *k, enum sr_red_count n)
{
    const int D = k->fdim, K = k->k, DG = k->weight ? k->weight->dim : 0;
    return n == SR_RED_N_D ? D : n == SR_RED_N_DK ? D * K : n == SR_RED_N_DG ? DG : 1;
}

static int size_of(const struct sr_kernel *k, enum jit_acc acc, enum sr_red_type t)
{
    const int ts = k->dtype == SR_F32 ? 4 : 8;
    const int as = k->dtype == SR_F32 && acc != JIT_ACC_F64 ? 4 : 8;
    return t == SR_RED_T_IDX ? 8 : t == SR_RED_T_VAL ? ts : as;
}

int64_t jit_state_bytes(const struct sr_kernel *k, enum jit_acc acc)
{
    const enum sr_red_family fam = sr_reductions[k->red].family;
    int64_t off = 0, align = 1;
    /* The C layout rules, which NVRTC follows too: each member at a multiple of its scalar
     * size, the whole padded to the largest. */
    for (int i = 0; i < NSLOTS; i++) {
        if (slots[i].fam != fam)
            continue;
        const int64_t sz = size_of(k, acc, slots[i].type);
        off = (off + sz - 1) / sz * sz + sz * count_of(k, slots[i].count);
        if (sz > align)
            align = sz;
    }
    return (off + align - 1) / align * align;
}

#define P(...) expr_buf_printf(b, __VA_ARGS__)

/* st_init: the start values, one loop per extent. */
static void emit_init(const struct sr_kernel *k, struct expr_buf *b)
{
    const enum sr_red_family fam = sr_reductions[k->red].family;
    const char *inf = sr_reductions[k->red].order == SR_RED_DESC ? "-SR_INF" : "SR_INF";
    P("SR_FN void st_init(sr_state *s)\n{\n");
    static const char *const loop[] = {
        [SR_RED_N_D] = "SR_UNROLL\n    for (int c = 0; c < SR_D; c++) {",
        [SR_RED_N_DK] = ("SR_UNROLL\n    for (int c = 0; c < SR_D; c++)\nSR_UNROLL\n"
                         "        for (int q = 0; q < SR_K; q++) {"),
        [SR_RED_N_DG] = "SR_UNROLL\n    for (int c = 0; c < SR_DG; c++) {",
        [SR_RED_N_ONE] = "    {",
    };
    static const char *const index[] = {
        [SR_RED_N_D] = "[c]", [SR_RED_N_DK] = "[c][q]", [SR_RED_N_DG] = "[c]", [SR_RED_N_ONE] = ""};
    for (int n = 0; n < (int)(sizeof loop / sizeof *loop); n++) {
        bool open = false;
        for (int i = 0; i < NSLOTS; i++) {
            if (slots[i].fam != fam || (int)slots[i].count != n)
                continue;
            if (!open)
                P("%s", loop[n]);
            open = true;
            const enum sr_red_start st = slots[i].start;
            P(" s->%s%s = %s;", slots[i].name, index[n],
              st == SR_RED_START_ZERO    ? "0"
              : st == SR_RED_START_NONE  ? "-1"
              : st == SR_RED_START_ORDER ? inf
                                         : "-SR_INF");
        }
        if (open)
            P(" }\n");
    }
    P("}\n\n");
}

sr_status jit_emit_state(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b)
{
    if ((int)k->red < 0 || k->red >= SR_REDUCTION_COUNT)
        return SR_EINTERNAL;
    const struct sr_reduction_info *ri = &sr_reductions[k->red];
    const struct family_rules *fr = &family_rules[ri->family];
    const struct names n = {"s->", "c", "v", "r", cmp_of(k), fsuffix(k)};
    static const char *const type_name[] = {"sr_acc", "sr_t", "int64_t"};
    static const char *const dims[] = {[SR_RED_N_D] = "[SR_D]",
                                       [SR_RED_N_DK] = "[SR_D][SR_K]",
                                       [SR_RED_N_DG] = "[SR_DG]",
                                       [SR_RED_N_ONE] = ""};

    /* ---- the state; the host's size (jit_state_bytes) is checked at compile time ---- */
    P("typedef struct sr_state {");
    for (int i = 0; i < NSLOTS; i++)
        if (slots[i].fam == ri->family)
            P(" %s %s%s;", type_name[slots[i].type], slots[i].name, dims[slots[i].count]);
    P(" } sr_state;\n");
    P("typedef char sr_state_bytes_ok[sizeof(sr_state) == %lld ? 1 : -1];\n\n",
      (long long)jit_state_bytes(k, acc));

    emit_init(k, b);
    if (fr->helpers)
        put(b, fr->helpers, &n);

    P("SR_FN void st_merge(sr_state *d, const sr_state *s, sr_t *tm, int64_t *ti)\n{\n");
    if (!ri->uses_k)
        P("    (void)tm; (void)ti;\n");
    put(b, acc == JIT_ACC_KAHAN && fr->merge_kahan ? fr->merge_kahan : fr->merge, &n);
    P("}\n\n");

    /* ---- final: the outputs of row o ---- */
    P("SR_FN void st_final(const sr_state *s, int64_t o, sr_io *out, int64_t *out_idx)\n{\n"
      "    (void)out; (void)out_idx;\n");
    if (ri->values)
        P("    sr_io *ov = out + o * SR_OUTD;\n");
    if (ri->indices)
        P("    int64_t *oi = out_idx + o * SR_OUTD;\n");
    put(b, fr->final_loop, &n);
    P(" {");
    if (ri->values)
        put(b, fr->final_v, &n);
    if (ri->indices && fr->final_i)
        put(b, fr->final_i, &n);
    P(" }\n}\n\n");
    return b->oom ? SR_ENOMEM : SR_OK;
}
