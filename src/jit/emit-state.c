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
 */
#include "jit.h"

/* A member of sr_state: its declaration and the size of one scalar. */
struct member {
    const char *decl;
    int size, count;
};

/* The members of sr_state for kernel k, 8-byte members first (least padding). Returns how
 * many (0: not a reduction the JIT knows). */
static int members(const struct sr_kernel *k, enum jit_acc acc, struct member m[3])
{
    const int D = k->fdim, K = k->k, DG = k->weight ? k->weight->dim : 0;
    const int ts = k->dtype == SR_F32 ? 4 : 8;
    const int as = k->dtype == SR_F32 && acc != JIT_ACC_F64 ? 4 : 8;
    switch (k->red) {
    case SR_SUM:
        m[0] = (struct member){"sr_acc s[SR_D], c[SR_D]", as, 2 * D};
        return 1;
    case SR_MIN:
    case SR_MAX:
        m[0] = (struct member){"sr_t m[SR_D]", ts, D};
        return 1;
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
        m[0] = (struct member){"int64_t i[SR_D]", 8, D};
        m[1] = (struct member){"sr_t m[SR_D]", ts, D};
        return 2;
    case SR_KMIN:
    case SR_ARGKMIN:
    case SR_KMIN_ARGKMIN:
        m[0] = (struct member){"int64_t i[SR_D][SR_K]", 8, D * K};
        m[1] = (struct member){"sr_t m[SR_D][SR_K]", ts, D * K};
        return 2;
    case SR_LOGSUMEXP:
        m[0] = (struct member){"sr_acc s[SR_D]", as, D};
        m[1] = (struct member){"sr_t m[SR_D]", ts, D};
        return 2;
    case SR_SUMSOFTMAXWEIGHT:
        m[0] = (struct member){"sr_acc s", as, 1};
        m[1] = (struct member){"sr_acc w[SR_DG]", as, DG};
        m[2] = (struct member){"sr_t m", ts, 1};
        return 3;
    default:
        return 0;
    }
}

int64_t jit_state_bytes(const struct sr_kernel *k, enum jit_acc acc)
{
    struct member m[3];
    int n = members(k, acc, m);
    int64_t off = 0, align = 1;
    /* The C layout rules, which NVRTC follows too: each member at a multiple of its scalar
     * size, the whole padded to the largest. */
    for (int i = 0; i < n; i++) {
        off = (off + m[i].size - 1) / m[i].size * m[i].size + (int64_t)m[i].size * m[i].count;
        if (m[i].size > align)
            align = m[i].size;
    }
    return (off + align - 1) / align * align;
}

#define P(...) expr_buf_printf(b, __VA_ARGS__)

sr_status jit_emit_state(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b)
{
    const sr_reduction red = k->red;
    const char *f = k->dtype == SR_F32 ? "f" : "";
    struct member m[3];
    int n = members(k, acc, m);
    if (n == 0)
        return SR_EINTERNAL;
    const bool is_max = red == SR_MAX || red == SR_ARGMAX || red == SR_MAX_ARGMAX;
    const bool kred = red == SR_KMIN || red == SR_ARGKMIN || red == SR_KMIN_ARGKMIN;
    const char *cmp = is_max ? ">" : "<";

    /* ---- the state; the host's size (jit_state_bytes) is checked at compile time ---- */
    P("typedef struct sr_state {");
    for (int i = 0; i < n; i++)
        P(" %s;", m[i].decl);
    P(" } sr_state;\n");
    P("typedef char sr_state_bytes_ok[sizeof(sr_state) == %lld ? 1 : -1];\n\n",
      (long long)jit_state_bytes(k, acc));

    /* ---- init ---- */
    P("SR_FN void st_init(sr_state *s)\n{\n");
    switch (red) {
    case SR_SUM:
        P("SR_UNROLL\n    for (int c = 0; c < SR_D; c++) s->s[c] = s->c[c] = 0;\n");
        break;
    case SR_MIN:
    case SR_MAX:
        P("SR_UNROLL\n    for (int c = 0; c < SR_D; c++) s->m[c] = %sSR_INF;\n", is_max ? "-" : "");
        break;
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
        P("SR_UNROLL\n    for (int c = 0; c < SR_D; c++) { s->m[c] = %sSR_INF; s->i[c] = -1; }\n",
          is_max ? "-" : "");
        break;
    case SR_KMIN:
    case SR_ARGKMIN:
    case SR_KMIN_ARGKMIN:
        P("SR_UNROLL\n    for (int c = 0; c < SR_D; c++)\nSR_UNROLL\n"
          "        for (int q = 0; q < SR_K; q++) { s->m[c][q] = SR_INF; s->i[c][q] = -1; }\n");
        break;
    case SR_LOGSUMEXP:
        P("SR_UNROLL\n    for (int c = 0; c < SR_D; c++) { s->m[c] = -SR_INF; s->s[c] = 0; }\n");
        break;
    default:
        P("    s->m = -SR_INF; s->s = 0;\nSR_UNROLL\n"
          "    for (int c = 0; c < SR_DG; c++) s->w[c] = 0;\n");
        break;
    }
    P("}\n\n");

    /* ---- fold helpers for the online max-shift reductions, and the K order ---- */
    if (red == SR_LOGSUMEXP)
        P("/* Folds a partial (m2, s2) = (max, sum of exp(v - max)) into (*m, *s). NaN sticks; an\n"
          " * +inf term makes the result +inf; -inf terms contribute nothing. */\n"
          "SR_FN void lse_fold(sr_t *m, sr_acc *s, sr_t m2, sr_acc s2)\n{\n"
          "    if (*m != *m || m2 == -SR_INF) return;\n"
          "    if (m2 != m2) { *m = m2; return; }\n"
          "    if (*m == -SR_INF) { *m = m2; *s = s2; return; }\n"
          "    if (*m == SR_INF) return;\n"
          "    if (m2 == SR_INF) { *m = m2; *s = 1; return; }\n"
          "    if (m2 > *m) { *s = *s * (sr_acc)exp%s(*m - m2) + s2; *m = m2; }\n"
          "    else *s += s2 * (sr_acc)exp%s(m2 - *m);\n}\n\n",
          f, f);
    if (red == SR_SUMSOFTMAXWEIGHT)
        /* The reference's combine rule (src/cpu/cpu.h), in the kernel's types. */
        P("SR_FN void ssmw_fold(sr_state *d, sr_t m2, sr_acc s2, const sr_acc *w2)\n{\n"
          "    const sr_t mm = m2 > d->m ? m2 : d->m;\n"
          "    const sr_acc sa = d->m == mm ? (sr_acc)1 : (sr_acc)exp%s(d->m - mm);\n"
          "    const sr_acc sb = m2 == mm ? (sr_acc)1 : (sr_acc)exp%s(m2 - mm);\n"
          "    d->m = mm;\n    d->s = d->s * sa + s2 * sb;\n"
          "SR_UNROLL\n"
          "    for (int c = 0; c < SR_DG; c++) d->w[c] = d->w[c] * sa + w2[c] * sb;\n}\n\n",
          f, f);
    if (kred)
        P("/* v before slot (m, i) in the order of NumPy's sort: empty slots last, NaN after "
          "+inf,\n"
          " * equal values keep index order (so the strict comparison). */\n"
          "#define SR_KLT(v, m, i) ((i) < 0 || (v) < (m) || ((v) == (v) && (m) != (m)))\n\n");

    /* ---- merge: s covers reduced indices after d's (ties keep d's lower indices); the
     * K-reductions merge through the caller's scratch tm[SR_K], ti[SR_K] ---- */
    P("SR_FN void st_merge(sr_state *d, const sr_state *s, sr_t *tm, int64_t *ti)\n{\n");
    if (!kred)
        P("    (void)tm; (void)ti;\n");
    switch (red) {
    case SR_SUM:
        P("    for (int c = 0; c < SR_D; c++) {\n"
          "        sr_acc y = s->s[c] - (d->c[c] + s->c[c]);\n"
          "        sr_acc t = d->s[c] + y;\n"
          "        d->c[c] = %s;\n        d->s[c] = t;\n    }\n",
          /* no compensation once the sum is infinite: inf - inf would make it NaN */
          acc == JIT_ACC_KAHAN ? "t - t == 0 ? (t - d->s[c]) - y : 0" : "0");
        break;
    case SR_MIN:
    case SR_MAX:
        P("    for (int c = 0; c < SR_D; c++) {\n"
          "        sr_t v = s->m[c], m = d->m[c];\n"
          "        if (m == m && (v %s m || v != v)) d->m[c] = v;\n    }\n",
          cmp);
        break;
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
        P("    for (int c = 0; c < SR_D; c++) {\n"
          "        sr_t v = s->m[c], m = d->m[c];\n"
          "        if (s->i[c] >= 0 && (d->i[c] < 0 || (m == m && (v %s m || v != v)))) {\n"
          "            d->m[c] = v; d->i[c] = s->i[c];\n        }\n    }\n",
          cmp);
        break;
    case SR_KMIN:
    case SR_ARGKMIN:
    case SR_KMIN_ARGKMIN:
        P("    for (int c = 0; c < SR_D; c++) {\n"
          "        const sr_t *am = d->m[c], *bm = s->m[c];\n"
          "        const int64_t *ai = d->i[c], *bi = s->i[c];\n"
          "        int x = 0, y = 0;\n"
          "        for (int q = 0; q < SR_K; q++) {\n"
          "            const int takeb = bi[y] >= 0 && SR_KLT(bm[y], am[x], ai[x]);\n"
          "            if (takeb) { tm[q] = bm[y]; ti[q] = bi[y]; y++; }\n"
          "            else { tm[q] = am[x]; ti[q] = ai[x]; x++; }\n"
          "        }\n"
          "        for (int q = 0; q < SR_K; q++) { d->m[c][q] = tm[q]; d->i[c][q] = ti[q]; }\n"
          "    }\n");
        break;
    case SR_LOGSUMEXP:
        P("    for (int c = 0; c < SR_D; c++) lse_fold(&d->m[c], &d->s[c], s->m[c], s->s[c]);\n");
        break;
    default:
        P("    ssmw_fold(d, s->m, s->s, s->w);\n");
        break;
    }
    P("}\n\n");

    /* ---- final: the outputs of row o ---- */
    const bool wv = sr_reductions[red].values, wi = sr_reductions[red].indices;
    P("SR_FN void st_final(const sr_state *s, int64_t o, sr_io *out, int64_t *out_idx)\n{\n"
      "    (void)out; (void)out_idx;\n");
    if (wv)
        P("    sr_io *ov = out + o * SR_OUTD;\n");
    if (wi)
        P("    int64_t *oi = out_idx + o * SR_OUTD;\n");
    switch (red) {
    case SR_SUM:
        P("    for (int c = 0; c < SR_D; c++) ov[c] = SR_ST((sr_t)s->s[c]);\n");
        break;
    case SR_MIN:
    case SR_MAX:
        P("    for (int c = 0; c < SR_D; c++) ov[c] = SR_ST(s->m[c]);\n");
        break;
    case SR_ARGMIN:
    case SR_ARGMAX:
    case SR_MIN_ARGMIN:
    case SR_MAX_ARGMAX:
        P("    for (int c = 0; c < SR_D; c++) {%s%s }\n", wv ? " ov[c] = SR_ST(s->m[c]);" : "",
          wi ? " oi[c] = s->i[c];" : "");
        break;
    case SR_KMIN:
    case SR_ARGKMIN:
    case SR_KMIN_ARGKMIN:
        P("    for (int q = 0; q < SR_K; q++) for (int c = 0; c < SR_D; c++) {%s%s }\n",
          wv ? " ov[q * SR_D + c] = SR_ST(s->m[c][q]);" : "",
          wi ? " oi[q * SR_D + c] = s->i[c][q];" : "");
        break;
    case SR_LOGSUMEXP:
        P("    for (int c = 0; c < SR_D; c++) {\n"
          "        const sr_t m = s->m[c];\n"
          "        ov[c] = SR_ST((m != m || m == SR_INF || m == -SR_INF) ? m : m + "
          "(sr_t)log%s((sr_t)s->s[c]));\n"
          "    }\n",
          f);
        break;
    default:
        P("    for (int c = 0; c < SR_DG; c++) ov[c] = SR_ST((sr_t)(s->w[c] / s->s));\n");
        break;
    }
    P("}\n\n");
    return b->oom ? SR_ENOMEM : SR_OK;
}
