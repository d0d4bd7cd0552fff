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
 * are replaced by the caller's names. The tile folds of the C kernels (family_rules.tile) also use
 *   $D  dim(F), as a number                 $e  dim(F) + dim(weight), as a number
 *   $i  the start of a tile's extreme ("SR_INF" ascending, "-SR_INF" descending)
 *   $m  the OpenMP reduction of that extreme ("min", "max")
 *   $F{p}  the family's fold (Kahan's where the accumulation asks for it) of value p into
 *          component $c of state $S
 *   $( ... $)  the text between, once per component g of the weight, in which $g is g, $h is
 *          g + 1 and $, is ", " but for g = 0.
 */
#include "jit.h"

#include <stdio.h>
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
     * kernels fold every value with it; the C kernels fold their register sums with it, and
     * the tiles of the other paths with the tile rules below ($F{...} in them). */
    const char *fold;
    const char *fold_kahan; /* Sum with the Kahan accumulation */
    /* The body of st_merge(d, s, tm, ti): s covers reduced indices after d's (ties keep d's
     * lower indices); the K-reductions merge through the scratch tm[SR_K], ti[SR_K]. */
    const char *merge;
    const char *merge_kahan;
    /* The C kernels' vectorised fold of a tile into row state s: F's component c holds its nj
     * values at fb + c * SR_TJ (the weight's component g at fb + (dim(F) + g) * SR_TJ), of
     * reduced indices rt, rt + 1, ...; sr_exp is the prelude's exp. tile_loops replaces tile
     * when the kernel computes F in loop mode, and uses tile_rows scratch rows of the tile
     * buffer after the weight's. */
    const char *tile, *tile_loops;
    int tile_rows;
    /* st_final: a loop over the outputs of the row, then each value's and each index's store
     * (ov, oi: the row's outputs). */
    const char *final_loop, *final_v, *final_i;
};

#define SUM_KAHAN_                                                                                 \
    "{ sr_acc y = $v - $Sc[$c]; sr_acc t = $Ss[$c] + y; $Sc[$c] = t - t == 0 ? (t - $Ss[$c]) - y " \
    ": 0; $Ss[$c] = t; }"

/* The head of the tile folds that start from the tile's extreme tm (comparison cmp, start value
 * init, OpenMP reduction clause) and whether it holds a NaN (tn), per component c < nc. */
#define TILE_EXTREME_(nc, cmp, init, clause)                                                       \
    "        for (int c = 0; c < " nc "; c++) {\n"                                                 \
    "          const sr_t *fv = fb + c * SR_TJ;\n"                                                 \
    "          sr_t tm = " init "; int tn = 0;\n"                                                  \
    "#pragma omp simd reduction(" clause ":tm) reduction(|:tn)\n"                                  \
    "          for (int jj = 0; jj < nj; jj++) { const sr_t v = fv[jj]; tm = v " cmp " tm ? v : "  \
    "tm; tn |= v != v; }\n"

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
            /* F goes through the tile in loop mode only: each component's tile sum, folded in
             * as the fused sums of the direct loop are. */
            .tile = "        for (int c = 0; c < SR_D; c++) {\n"
                    "          const sr_t *fv = fb + c * SR_TJ;\n"
                    "          sr_acc p = 0;\n"
                    "#pragma omp simd reduction(+:p)\n"
                    "          for (int jj = 0; jj < nj; jj++) p += (sr_acc)fv[jj];\n"
                    "          $F{p}\n        }\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " ov[c] = SR_ST((sr_t)s->s[c]);",
        },
    [SR_RED_FAM_EXT] =
        {
            .fold = "if ($Sm[$c] == $Sm[$c] && ($v $< $Sm[$c] || $v != $v)) $Sm[$c] = $v;",
            .merge = "    for (int c = 0; c < SR_D; c++) {\n"
                     "        sr_t v = s->m[c], m = d->m[c];\n"
                     "        if (m == m && (v $< m || v != v)) d->m[c] = v;\n    }\n",
            .tile = TILE_EXTREME_("$D", "$<", "$i", "$m") "          if (tn) tm = SR_NAN;\n"
                                                          "          $F{tm}\n        }\n",
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
            /* Scans only a tile that can improve the state: the first extreme (or NaN). */
            .tile = TILE_EXTREME_("$D", "$<", "$i",
                                  "$m") "          sr_t m = s->m[c]; int64_t bi = s->i[c];\n"
                                        "          if (bi < 0 || (m == m && (tn || tm $< m))) {\n"
                                        "            for (int jj = 0; jj < nj; jj++) {\n"
                                        "              const sr_t v = fv[jj];\n"
                                        "              if (bi < 0 || (m == m && (v $< m || v != "
                                        "v))) { m = v; bi = rt + "
                                        "jj; }\n"
                                        "            }\n"
                                        "            s->m[c] = m; s->i[c] = bi;\n"
                                        "          }\n        }\n",
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
            /* Most values lose to the current K-th one once the state is full (it persists
             * across the tiles of a row): blocks of 64 are rejected with one vectorised
             * comparison against it and only a block holding a candidate is scanned. A NaN v
             * never enters a full state with a number as K-th value, so v < thr is exact. */
            .tile = "        for (int c = 0; c < SR_D; c++) {\n"
                    "          const sr_t *fv = fb + c * SR_TJ;\n"
                    "          sr_t *M = s->m[c]; int64_t *I = s->i[c];\n"
                    "          for (int jb = 0; jb < nj; jb += 64) {\n"
                    "          const int je = jb + 64 < nj ? jb + 64 : nj;\n"
                    "          if (I[SR_K - 1] >= 0 && M[SR_K - 1] == M[SR_K - 1]) {\n"
                    "            const sr_t thr = M[SR_K - 1]; int any = 0;\n"
                    "#pragma omp simd reduction(|:any)\n"
                    "            for (int jj = jb; jj < je; jj++) any |= fv[jj] < thr;\n"
                    "            if (!any) continue;\n"
                    "          }\n"
                    "          for (int jj = jb; jj < je; jj++) {\n"
                    "            const sr_t v = fv[jj];\n"
                    "            if (!SR_KLT(v, M[SR_K - 1], I[SR_K - 1])) continue;\n"
                    "            int p = SR_K - 1;\n"
                    "            while (p > 0 && SR_KLT(v, M[p - 1], I[p - 1])) { M[p] = M[p - 1]; "
                    "I[p] = I[p - 1]; p--; }\n"
                    "            M[p] = v; I[p] = rt + jj;\n"
                    "          }\n"
                    "          }\n"
                    "        }\n",
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
            .tile =
                TILE_EXTREME_("$D", ">", "-SR_INF",
                              "max") "          if (tn) { s->m[c] = SR_NAN; continue; }\n"
                                     "          if (tm == -SR_INF) continue;\n"
                                     "          if (tm == SR_INF) { lse_fold(&s->m[c], &s->s[c], "
                                     "tm, 1); continue; }\n"
                                     "          sr_acc ts = 0;\n"
                                     "#pragma omp simd reduction(+:ts)\n"
                                     "          for (int jj = 0; jj < nj; jj++) ts += "
                                     "(sr_acc)sr_exp(fv[jj] - tm);\n"
                                     "          lse_fold(&s->m[c], &s->s[c], tm, ts);\n        }\n",
            .final_loop = "    for (int c = 0; c < SR_D; c++)",
            .final_v = " const sr_t m = s->m[c]; ov[c] = SR_ST((m != m || m == SR_INF || m == "
                       "-SR_INF) ? m : m + (sr_t)log$f((sr_t)s->s[c]));",
        },
    [SR_RED_FAM_SSMW] =
        {
            /* The CPU's merge rule (cpu_ssmw_combine, src/cpu/red-rules.h), in the kernel's types.
             */
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
            /* F is scalar; the tile's weights exp(F - max), with exp(-inf) = 0. The direct
             * loop sums them and their products with each weight component in registers. */
            .tile =
                TILE_EXTREME_("1", ">", "-SR_INF",
                              "max") "          (void)tn;\n          sr_acc ts = 0$(, w$g = 0$);\n"
                                     "#pragma omp simd reduction(+:ts$(,w$g$))\n"
                                     "          for (int jj = 0; jj < nj; jj++) {\n"
                                     "            const sr_acc e = fv[jj] == -SR_INF ? (sr_acc)0 : "
                                     "(sr_acc)sr_exp(fv[jj] "
                                     "- tm);\n"
                                     "            ts += e;\n"
                                     "$(            w$g += e * (sr_acc)fb[$h * SR_TJ + jj];\n$)"
                                     "          }\n          sr_acc wt[SR_DG] = {$($,w$g$)};\n"
                                     "          ssmw_fold(s, tm, ts, wt);\n        }\n",
            /* Loop mode: the tile's weights once, into the scratch rows, then one pass per
             * weight component. */
            .tile_loops = TILE_EXTREME_(
                "1", ">", "-SR_INF",
                "max") "          (void)tn;\n"
                       "          sr_acc *eb = (sr_acc *)(fb + $e * SR_TJ), ts = 0, wt[SR_DG];\n"
                       "#pragma omp simd reduction(+:ts)\n"
                       "          for (int jj = 0; jj < nj; jj++) {\n"
                       "            eb[jj] = fv[jj] == -SR_INF ? (sr_acc)0 : (sr_acc)sr_exp(fv[jj] "
                       "- tm);\n"
                       "            ts += eb[jj];\n"
                       "          }\n"
                       "          for (int g = 0; g < SR_DG; g++) {\n"
                       "            const sr_t *gv = fb + (1 + g) * SR_TJ;\n"
                       "            sr_acc w = 0;\n"
                       "#pragma omp simd reduction(+:w)\n"
                       "            for (int jj = 0; jj < nj; jj++) w += eb[jj] * (sr_acc)gv[jj];\n"
                       "            wt[g] = w;\n"
                       "          }\n"
                       "          ssmw_fold(s, tm, ts, wt);\n        }\n",
            .tile_rows = 2,
            .final_loop = "    for (int c = 0; c < SR_DG; c++)",
            .final_v = " ov[c] = SR_ST((sr_t)(s->w[c] / s->s));",
        },
};

/* The names a template's placeholders stand for. */
struct names {
    const char *S, *c, *v, *r, *cmp, *f;
    /* The tile folds' ($D, $e, $i, $m as text; $F's template; $( ... $)'s count and, inside,
     * the current component, -1 outside). */
    const char *D, *e, *init, *clause, *fold;
    int ng, g;
};

/* Appends the text of template t up to end with its placeholders replaced. */
static void put_n(struct expr_buf *b, const char *t, const char *end, const struct names *n)
{
    while (t < end) {
        const char *d = memchr(t, '$', (size_t)(end - t));
        if (!d || d + 1 == end) {
            expr_buf_printf(b, "%.*s", (int)(end - t), t);
            return;
        }
        expr_buf_printf(b, "%.*s", (int)(d - t), t);
        const char x = d[1];
        t = d + 2;
        if (x == '(') { /* $( ... $): once per weight component */
            const char *close = strstr(t, "$)");
            const char *stop = close && close < end ? close : end;
            for (int g = 0; g < n->ng; g++) {
                struct names in = *n;
                in.g = g;
                put_n(b, t, stop, &in);
            }
            t = stop < end ? stop + 2 : end;
            continue;
        }
        if (x == 'F' && t < end && *t == '{' && n->fold) { /* $F{value} */
            const char *close = memchr(t, '}', (size_t)(end - t));
            if (close) {
                char v[32];
                snprintf(v, sizeof v, "%.*s", (int)(close - t - 1), t + 1);
                struct names in = *n;
                in.v = v;
                put_n(b, n->fold, n->fold + strlen(n->fold), &in);
                t = close + 1;
                continue;
            }
        }
        if (n->g >= 0 && (x == 'g' || x == 'h' || x == ',')) {
            if (x == ',')
                expr_buf_printf(b, "%s", n->g ? ", " : "");
            else
                expr_buf_printf(b, "%d", x == 'g' ? n->g : n->g + 1);
            continue;
        }
        const char *by = x == 'S'   ? n->S
                         : x == 'c' ? n->c
                         : x == 'v' ? n->v
                         : x == 'r' ? n->r
                         : x == '<' ? n->cmp
                         : x == 'f' ? n->f
                         : x == 'D' ? n->D
                         : x == 'e' ? n->e
                         : x == 'i' ? n->init
                         : x == 'm' ? n->clause
                                    : NULL;
        if (by)
            expr_buf_printf(b, "%s", by);
        else
            expr_buf_printf(b, "%.2s", d);
    }
}

/* Appends template t with its placeholders replaced. */
static void put(struct expr_buf *b, const char *t, const struct names *n)
{
    put_n(b, t, t + strlen(t), n);
}

static const char *cmp_of(const struct sr_kernel *k)
{
    return sr_reductions[k->red].order == SR_RED_DESC ? ">" : "<";
}

static const char *fsuffix(const struct sr_kernel *k) { return k->dtype == SR_F32 ? "f" : ""; }

/* The family's fold for accumulation acc. */
static const char *fold_of(const struct family_rules *fr, enum jit_acc acc)
{
    return acc == JIT_ACC_KAHAN && fr->fold_kahan ? fr->fold_kahan : fr->fold;
}

void jit_emit_fold(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                   const char *state, const char *c, const char *v, const char *r)
{
    const struct family_rules *fr = &family_rules[sr_reductions[k->red].family];
    const struct names n = {
        .S = state, .c = c, .v = v, .r = r, .cmp = cmp_of(k), .f = fsuffix(k), .g = -1};
    put(b, fold_of(fr, acc), &n);
}

void jit_emit_tile_fold(const struct sr_kernel *k, enum jit_acc acc, bool loops, struct expr_buf *b)
{
    const struct family_rules *fr = &family_rules[sr_reductions[k->red].family];
    const bool desc = sr_reductions[k->red].order == SR_RED_DESC;
    const int DG = k->weight ? k->weight->dim : 0;
    char D[16], e[16];
    snprintf(D, sizeof D, "%d", k->fdim);
    snprintf(e, sizeof e, "%d", k->fdim + DG);
    const struct names n = {.S = "s->",
                            .c = "c",
                            .cmp = cmp_of(k),
                            .f = fsuffix(k),
                            .D = D,
                            .e = e,
                            .init = desc ? "-SR_INF" : "SR_INF",
                            .clause = desc ? "max" : "min",
                            .fold = fold_of(fr, acc),
                            .ng = DG,
                            .g = -1};
    put(b, loops && fr->tile_loops ? fr->tile_loops : fr->tile, &n);
}

int jit_tile_rows(const struct sr_kernel *k, bool loops)
{
    const struct family_rules *fr = &family_rules[sr_reductions[k->red].family];
    return loops && fr->tile_loops ? fr->tile_rows : 0;
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
    const struct names n = {
        .S = "s->", .c = "c", .v = "v", .r = "r", .cmp = cmp_of(k), .f = fsuffix(k), .g = -1};
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
