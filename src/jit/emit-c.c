/*
 * emit-c.c — lowers a kernel (formula DAG, reduction, axis, dtype) to specialised C source: the
 * placement of the nodes and the skeletons of the generated entry points; the op spellings are in
 * emit-ops.c.
 *
 * Shape of the generated code (see jit.h for the ABI):
 *   - every node of the DAG becomes one local scalar per component (v<id>_<c>): dimensions are
 *     compile-time constants and vector ops are unrolled;
 *   - nodes are placed by what they depend on: constants and parameters once per call, nodes of
 *     the output row ("outer") once per row and tile, nodes of the reduced index only ("inner")
 *     in a pre-pass that writes them into a structure-of-arrays tile, and the pair nodes in the
 *     vectorised `omp simd` loop over the tile;
 *   - Sum accumulates inside the simd loop (per-lane partial sums: block summation); the other
 *     reductions buffer the formula values of a tile and reduce them in a second loop, with the
 *     tie and NaN rules of docs/semantics.md.
 */
#include "emit-c.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const jit_acc_names[3] = {"block", "kahan", "f64"};

/* ---- placement ------------------------------------------------------------------------------ */

static enum place place_of(const struct emitter *E, const sr_expr *e)
{
    bool o = e->deps & E->outer_dep, i = e->deps & E->inner_dep;
    return o && i ? PL_PAIR : i ? PL_INNER : o ? PL_OUTER : PL_UNIFORM;
}

/* ---- the generated file ------------------------------------------------------------------- */

/* Total scalar statements the direct strategy accepts (compile time grows with it). */
#define JIT_MAX_SCALARS 1024

/* The caller's arrays: sr_io values, read with SR_LD and written with SR_ST. A float16 or
 * bfloat16 kernel of the direct strategy (k->io_native) reads and writes them itself: bfloat16
 * widens by a shift, float16 through _Float16 (F16C instructions under -march=native) where
 * the compiler has it, else by bits; stores round to nearest even. */
static void io_prelude(struct emitter *E)
{
    const struct sr_kernel *k = E->k;
    if (!k->io_native) {
        P("typedef sr_t sr_io;\n#define SR_LD(x) (x)\n#define SR_ST(x) (x)\n\n");
        return;
    }
    P("typedef uint16_t sr_io;\n#define SR_LD(x) sr_ld(x)\n#define SR_ST(x) sr_st(x)\n");
    if (k->io == SR_BF16) {
        P("static inline float sr_ld(uint16_t h)\n{\n    uint32_t u = (uint32_t)h << 16; float f;\n"
          "    memcpy(&f, &u, 4); return f;\n}\n"
          "static inline uint16_t sr_st(float f)\n{\n    uint32_t u; memcpy(&u, &f, 4);\n"
          "    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);\n"
          "    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n}\n\n");
        return;
    }
    P("#ifdef __FLT16_MAX__\n"
      "static inline float sr_ld(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }\n"
      "static inline uint16_t sr_st(float f)\n"
      "{\n    _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h;\n}\n"
      "#else\n"
      "static inline float sr_ld(uint16_t h)\n{\n"
      "    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;\n"
      "    float f;\n"
      "    if (e == 0x1fu) u = s | 0x7f800000u | (m << 13);\n"
      "    else if (e) u = s | ((e + 112u) << 23) | (m << 13);\n"
      "    else { f = (float)m * 0x1p-24f; return s ? -f : f; }\n"
      "    memcpy(&f, &u, 4); return f;\n}\n"
      "static inline uint16_t sr_st(float f)\n{\n"
      "    uint32_t u, a; memcpy(&u, &f, 4); a = u & 0x7fffffffu;\n"
      "    uint16_t s = (uint16_t)((u >> 16) & 0x8000u);\n"
      "    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x1ffu));\n"
      "    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);\n"
      "    if (a < 0x38800000u) {\n"
      "        float v; uint32_t w, h; memcpy(&v, &a, 4); v += 0.5f; memcpy(&w, &v, 4);\n"
      "        h = 0x3f000000u; return (uint16_t)(s | (uint16_t)(w - h));\n    }\n"
      "    return (uint16_t)(s | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));\n}\n"
      "#endif\n\n");
}

/* The generated code's exponential, sr_exp: inline and branch-free, so that the pair loop
 * vectorises it with no call (libmvec's vector exp is a call, and falls back to scalar code for a
 * whole vector when one argument is below about -87.3 in float32, -708.4 in float64). Range
 * reduction a = k ln2 + r, |r| <= ln2/2 (Cody-Waite: k ln2_hi is exact), a polynomial
 * 1 + r + r^2 q(r) fitted near-minimax to exp on that interval (degree 6 in float32, 11 in
 * float64), and 2^k added to the exponent bits. The integer k is read from the low bits of
 * t = a log2(e) + 1.5 2^p, whose shift by the mantissa width adds k to the exponent.
 *
 * The special cases are decided on the argument, once each, after the arithmetic: no clamp
 * before it, so each costs a compare and a masked move in the vectorised loop. Below A0 the
 * result is 0: A0 is the smallest argument whose exact exponential is at least the underflow
 * threshold 1.7e-38 (3.4e-308) times 1 + 2^-22 (1 + 2^-42), so every result flushed is below
 * the threshold but for a relative 2^-22, and every result kept is above it by more than the
 * polynomial's error (docs/semantics.md, "Exp's underflow"; the exact value there is subnormal,
 * and the exponent arithmetic is only valid for normal results). Every argument kept gives a
 * normal 2^k. Above the largest argument with a finite result, and for a NaN, the result is
 * a + inf: +inf, or the NaN. Whatever the arithmetic gives for the arguments so replaced (it
 * overflows the exponent bits for a large |a|) is never seen. Error bound: docs/semantics.md
 * ("Exp"), checked over every float32 input by tests/test-exp.c. */
static void emit_exp(struct emitter *E)
{
    P("#if defined(__FMA__) || defined(__aarch64__)\n#define SR_FMA(a, b, c) __builtin_fma%s(a, "
      "b, c)\n#else\n#define SR_FMA(a, b, c) ((a) * (b) + (c))\n#endif\n",
      E->fs);
    if (E->f32)
        P("static inline float sr_exp(float a)\n{\n"
          "    const float t = SR_FMA(a, 0x1.715476p+0f, 0x1.8p23f), k = t - 0x1.8p23f;\n"
          "    const float r = SR_FMA(-k, 0x1.7f7d1cp-20f, SR_FMA(-k, 0x1.62e4p-1f, a));\n"
          "    float q = 0x1.6d10fcp-10f;\n"
          "    q = SR_FMA(q, r, 0x1.120b62p-7f);\n"
          "    q = SR_FMA(q, r, 0x1.55551ap-5f);\n"
          "    q = SR_FMA(q, r, 0x1.5554dep-3f);\n"
          "    q = SR_FMA(q, r, 0x1p-1f);\n"
          "    const float p = SR_FMA(q, r * r, r) + 1.0f;\n"
          "    uint32_t u, v;\n    memcpy(&u, &p, 4);\n    memcpy(&v, &t, 4);\n"
          "    u += v << 23;\n"
          "    float e;\n    memcpy(&e, &u, 4);\n"
          "    e = a < -0x1.5bded2p+6f ? 0.0f : e;\n"
          "    return a <= 0x1.62e42ep+6f ? e : a + __builtin_inff();\n}\n\n");
    else
        P("static inline double sr_exp(double a)\n{\n"
          "    const double t = SR_FMA(a, 0x1.71547652b82fep+0, 0x1.8p52), k = t - 0x1.8p52;\n"
          "    const double r = SR_FMA(-k, 0x1.a39ef35793c76p-33, SR_FMA(-k, 0x1.62e42feep-1, "
          "a));\n"
          "    double q = 0x1.af389ecfc4b9cp-26;\n"
          "    q = SR_FMA(q, r, 0x1.28917c89a43a7p-22);\n"
          "    q = SR_FMA(q, r, 0x1.71de0db2f6b19p-19);\n"
          "    q = SR_FMA(q, r, 0x1.a019b9149a41cp-16);\n"
          "    q = SR_FMA(q, r, 0x1.a01a01a7c2efep-13);\n"
          "    q = SR_FMA(q, r, 0x1.6c16c17889ef1p-10);\n"
          "    q = SR_FMA(q, r, 0x1.11111111109b5p-7);\n"
          "    q = SR_FMA(q, r, 0x1.5555555553d68p-5);\n"
          "    q = SR_FMA(q, r, 0x1.5555555555556p-3);\n"
          "    q = SR_FMA(q, r, 0x1.0000000000001p-1);\n"
          "    const double p = SR_FMA(q, r * r, r) + 1.0;\n"
          "    uint64_t u, v;\n    memcpy(&u, &p, 8);\n    memcpy(&v, &t, 8);\n"
          "    u += v << 52;\n"
          "    double e;\n    memcpy(&e, &u, 8);\n"
          "    e = a < -0x1.61fc78b1026a3p+9 ? 0.0 : e;\n"
          "    return a <= 0x1.62e42fefa39efp+9 ? e : a + __builtin_inf();\n}\n\n");
}

static void prelude(struct emitter *E, const char *A)
{
    const char *t = T(E), *f = E->fs;
    /* What the code takes from the C library, declared here, not included: parsing stdint.h,
     * stdlib.h and string.h is a measurable part of a cold compile (about 8 ms of cc1 on the
     * dev VM). The types are the compiler's own (gcc and clang predefine them). */
    P("typedef __INT64_TYPE__ int64_t;\ntypedef __UINT64_TYPE__ uint64_t;\n"
      "typedef __UINT32_TYPE__ uint32_t;\ntypedef __UINT16_TYPE__ uint16_t;\n"
      "typedef __SIZE_TYPE__ size_t;\n#define NULL ((void *)0)\n"
      "extern void *malloc(size_t);\nextern void *calloc(size_t, size_t);\n"
      "extern void free(void *);\n#define memcpy __builtin_memcpy\n"
      "#define memset __builtin_memset\n\n");
    /* The target's spellings for the shared state code (emit-state.c). */
    P("#define SR_FN static inline\n#define SR_UNROLL\n\n");
    P("typedef %s sr_t;\ntypedef %s sr_acc;\n\n", t, A);
    io_prelude(E);
    /* Vector variants from libmvec: the declarations carry `declare simd`, and the file is
     * compiled with -fno-math-errno so gcc may call them. math.h is not included so these are
     * the first declarations. */
    static const char *const simd_fns[] = {"exp", "log", "sin", "cos"};
    for (int i = 0; i < 4; i++)
        P("#pragma omp declare simd notinbranch\nextern %s %s%s(%s);\n", t, simd_fns[i], f, t);
    P("#pragma omp declare simd notinbranch\nextern %s pow%s(%s, %s);\n", t, f, t, t);
    static const char *const fns1[] = {"sqrt", "asin", "acos", "fabs", "floor", "round"};
    for (int i = 0; i < 6; i++)
        P("extern %s %s%s(%s);\n", t, fns1[i], f, t);
    /* libm's atan under another name: gcc rewrites sin(atan(x)) to x / sqrt(x*x + 1) and
     * cos(atan(x)) to 1 / sqrt(x*x + 1), with copysign(1, x) and copysign(0, x) past a bound
     * that a NaN fails, which would make Sin(Atan(NaN)) -1 and Cos(Atan(NaN)) 0. A
     * function that is not the builtin atan takes no such rewrite. */
    P("extern %s sr_atan%s(%s) __asm__(\"atan%s\");\n", t, f, t, f);
    P("extern %s atan2%s(%s, %s);\n\n", t, f, t, t);
    /* sin and cos under other names, for the complex ops: gcc merges the builtin sin and cos of
     * one argument into a call of sincos, which has no vector variant, and the loop around it
     * stays scalar (a complex exponential per pair ran as sincos + exp calls). Not being the
     * builtins, they are declared const (true under -fno-math-errno), else gcc assumes they
     * write memory and does not vectorise the loop either. */
    P("#pragma omp declare simd notinbranch\n"
      "extern sr_t sr_sin(sr_t) __asm__(\"sin%s\") __attribute__((const));\n",
      f);
    P("#pragma omp declare simd notinbranch\n"
      "extern sr_t sr_cos(sr_t) __asm__(\"cos%s\") __attribute__((const));\n",
      f);
    P("static inline %s sr_sq(%s a) { return a * a; }\n", t, t);
    emit_exp(E);
}

/* Emits the nodes placed at pl, in topological order; returns how many. Big variables and
 * lazy nodes need no code of their own. */
static int emit_scope(struct emitter *E, enum place pl)
{
    int n = 0;
    E->scope = pl;
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        if (E->place[i] != pl)
            continue;
        if (big(e) && (e->op == OP_VAR || jit_lazy_op(E, e)))
            continue;
        if (big(e) && (pl != PL_INNER || E->col[i] < 0))
            P("        sr_t v%u[%d];\n", (unsigned)e->id, e->dim);
        jit_emit_node(E, e);
        n++;
    }
    return n;
}

/* The per-reduced-index pre-pass (r and jj in scope): the inner nodes, stored into their
 * columns of the tile tb. Returns the number of nodes. */
static int emit_inner(struct emitter *E)
{
    int nin = emit_scope(E, PL_INNER);
    char n[32];
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        if (E->col[i] < 0 || (big(e) && e->op != OP_VAR && !jit_lazy_op(E, e)))
            continue;
        if (big(e))
            P("        for (int q_ = 0; q_ < %d; q_++) tb[(%d + q_) * SR_TJ + jj] = %s;\n", e->dim,
              E->col[i], jit_ref(E, e, "q_"));
        else
            for (int c = 0; c < e->dim; c++)
                P("        tb[%d * SR_TJ + jj] = %s;\n", E->col[i] + c, jit_nm(e, c, n));
    }
    return nin;
}

/* The pair loop's column loads (jj in scope): the small columns read from the tile. */
static void emit_cols(struct emitter *E)
{
    char n[32];
    for (size_t i = 0; i < E->n; i++)
        if (E->col[i] >= 0 && !big(E->order[i]))
            for (int c = 0; c < E->order[i]->dim; c++)
                P("        const sr_t %s = tb[%d * SR_TJ + jj];\n", jit_nm(E->order[i], c, n),
                  E->col[i] + c);
}

/* The pair loop's body (jj in scope): the small columns loaded from the tile, then the pair
 * nodes. Returns the number of pair nodes. */
static int emit_pair(struct emitter *E)
{
    emit_cols(E);
    E->scope = PL_PAIR;
    return emit_scope(E, PL_PAIR);
}

/* The most output rows per pass over a tile. */
#define JIT_MAX_RPP 4

/*
 * Register blocking of the fused Sum: how many output rows one pass over a tile serves, so that
 * each reduced-index column loaded from the tile feeds that many rows' pair nodes. need[] marks
 * the small output-row nodes the pair nodes read (a row's copy of them stays in registers for
 * the whole loop). The count: each row keeps its D accumulators and its row values live
 * (*row_regs); shared by the rows (*shared) are the columns and, when the pair loop has an Exp, the
 * 8 constants of sr_exp. The most rows (up to JIT_MAX_RPP) whose registers fit JIT_VREGS, at least
 * 1: the Gaussian at D = 3 (4 per row, 4 columns + 8) runs 1 row per pass, SqDist(x,y)*g*b 3
 * (measured single-threaded on AVX2: the Gaussian 2-4 rows no faster or slower, the SqDist sum 1.3x
 * faster with 2 or 3 rows). 1 (no blocking) for formulas it does not apply to: a weight, the
 * gemm-epilogue's tile, a big node outside the per-call scope (read in place per row), a root that
 * is not a pair node.
 */
static int rows_per_pass(struct emitter *E, bool *need, int ncol, int *row_regs, int *shared)
{
    const struct sr_kernel *k = E->k;
    *shared = ncol;
    *row_regs = 0;
    for (size_t i = 0; i < E->n; i++)
        need[i] = false;
    if (E->gemm || k->weight || E->place[pos(E, k->f)] != PL_PAIR)
        return 1;
    bool has_exp = false;
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        if (big(e) && E->place[i] != PL_UNIFORM)
            return 1;
        if (E->place[i] != PL_PAIR)
            continue;
        has_exp |= e->op == OP_EXP;
        for (int c = 0; c < expr_arity(e); c++)
            if (E->place[pos(E, e->child[c])] == PL_OUTER)
                need[pos(E, e->child[c])] = true;
    }
    *row_regs = k->fdim;
    for (size_t i = 0; i < E->n; i++)
        if (need[i])
            *row_regs += E->order[i]->dim;
    *shared += has_exp ? 8 : 0;
    int rpp = 1;
    while (rpp < JIT_MAX_RPP && (rpp + 1) * *row_regs + *shared <= JIT_VREGS)
        rpp++;
    return rpp;
}

/* Folds the fused Sum's partial sums <pfx><c> into the row state s. */
static void sum_fold(struct emitter *E, enum jit_acc acc, const char *pfx)
{
    char c_[16], v_[48];
    for (int c = 0; c < E->k->fdim; c++) {
        snprintf(c_, sizeof c_, "%d", c);
        snprintf(v_, sizeof v_, "%s%d", pfx, c);
        P("        ");
        jit_emit_fold(E->k, acc, E->b, "s->", c_, v_, NULL);
        P("\n");
    }
}

/* The fused Sum's passes of rpp rows over a tile (the rows [ob, oe) up to a multiple of rpp;
 * the single-row loop does the rest from orb). Each row's values needed by the pair nodes are
 * computed before the loop, as the single-row path does (from the row cache when there is one,
 * cache[] and NB as row_cache gives them), into w<row>_<id>_<c>; the loop loads the columns once
 * and runs the pair nodes once per row, each copy in a block of its own with the row's values
 * under the nodes' names. */
static void emit_row_passes(struct emitter *E, int rpp, const bool *need, const bool *cache, int NB,
                            enum jit_acc acc, const char *pairtxt, const char *colstxt)
{
    char n[32];
    const int D = E->k->fdim;
    P("        int64_t orb = ob;\n");
    P("        for (; orb + %d <= oe; orb += %d) {\n", rpp, rpp);
    for (int r = 0; r < rpp; r++) {
        for (size_t i = 0; i < E->n; i++)
            for (int c = 0; need[i] && c < E->order[i]->dim; c++)
                P("        sr_t w%d_%u_%d;\n", r, (unsigned)E->order[i]->id, c);
        P("        {\n        const int64_t o = orb + %d;\n", r);
        if (NB) {
            for (size_t i = 0, u = 0; i < E->n; i++)
                for (int c = 0; cache[i] && c < E->order[i]->dim; c++, u++)
                    P("        const sr_t %s = rc[(o - ob) * %d + %zu];\n",
                      jit_nm(E->order[i], c, n), NB, u);
        } else {
            emit_scope(E, PL_OUTER);
        }
        for (size_t i = 0; i < E->n; i++)
            for (int c = 0; need[i] && c < E->order[i]->dim; c++)
                P("        w%d_%u_%d = %s;\n", r, (unsigned)E->order[i]->id, c,
                  jit_nm(E->order[i], c, n));
        P("        }\n");
    }
    P("        sr_acc ");
    for (int r = 0; r < rpp; r++)
        for (int c = 0; c < D; c++)
            P("%sq%d_%d = 0", r || c ? ", " : "", r, c);
    P(";\n#pragma omp simd reduction(+:");
    for (int r = 0; r < rpp; r++)
        for (int c = 0; c < D; c++)
            P("%sq%d_%d", r || c ? "," : "", r, c);
    P(")\n        for (int jj = 0; jj < nj; jj++) {\n%s", colstxt);
    E->scope = PL_PAIR;
    for (int r = 0; r < rpp; r++) {
        P("        {\n");
        for (size_t i = 0; i < E->n; i++)
            for (int c = 0; need[i] && c < E->order[i]->dim; c++)
                P("        const sr_t %s = w%d_%u_%d;\n", jit_nm(E->order[i], c, n), r,
                  (unsigned)E->order[i]->id, c);
        P("%s", pairtxt);
        for (int c = 0; c < D; c++)
            P("        q%d_%d += (sr_acc)%s;\n", r, c, jit_ref_c(E, E->k->f, c));
        P("        }\n");
    }
    P("        }\n");
    for (int r = 0; r < rpp; r++) {
        P("        {\n        sr_state *s = &st[orb + %d - o0];\n", r);
        sum_fold(E, acc, jit_sfmt(E, "q%d_", r));
        P("        }\n");
    }
    P("        }\n");
}

/* Scalars of the small pair nodes: the rows of the pair scratch of the split pair loop. */
static int pair_scalars(const struct emitter *E)
{
    int n = 0;
    for (size_t i = 0; i < E->n; i++)
        if (E->place[i] == PL_PAIR && !big(E->order[i]))
            n += E->order[i]->dim;
    return n;
}

/* The split pair loop's traffic with its scratch rows sp: store (true) every small pair node's
 * components after the pair nodes, or load (false) them, with the small tile columns, for a
 * loop over one wide component. */
static void emit_pair_scratch(struct emitter *E, bool store)
{
    char n[32];
    if (!store)
        emit_cols(E);
    for (size_t i = 0, u = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        if (E->place[i] != PL_PAIR || big(e))
            continue;
        for (int c = 0; c < e->dim; c++, u++)
            if (store)
                P("        sp[%zu * SR_TJ + jj] = %s;\n", u, jit_nm(e, c, n));
            else
                P("        const sr_t %s = sp[%zu * SR_TJ + jj];\n", jit_nm(e, c, n), u);
    }
}

/* The row cache of sr_part_iv: the output-row nodes the pair loop reads, computed once per block
 * of rows instead of once per tile and row. Without it, a row term such as the norms of
 * Normalize(x) in the cosine kNN's SqDist(Normalize(x), Normalize(y)) (four passes over x) was
 * recomputed for every tile of 512 reduced indices, and made the gemm path's epilogue cost
 * about as much as the gemm itself at D = 100. Marks in cache[] the small outer nodes whose
 * values the loop reads (those of the lazy or variable big outer nodes it inlines included)
 * and returns how many scalars they hold; 0 when the outer nodes are only variables (nothing to
 * save), or when the loop reads a big outer node held in an array (not cached). */
static int row_cache(struct emitter *E, bool *cache)
{
    bool work = false;
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        cache[i] = false;
        if (E->place[i] == PL_OUTER && e->op != OP_VAR && !(big(e) && jit_lazy_op(E, e)))
            work = true;
    }
    if (!work)
        return 0;
    const sr_expr *roots[2] = {E->k->f, E->k->weight};
    for (int r = 0; r < 2; r++)
        if (roots[r] && E->place[pos(E, roots[r])] == PL_OUTER)
            cache[pos(E, roots[r])] = true;
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        if (E->place[i] != PL_PAIR || e == E->gemm)
            continue;
        for (int c = 0; c < expr_arity(e); c++)
            if (E->place[pos(E, e->child[c])] == PL_OUTER)
                cache[pos(E, e->child[c])] = true;
    }
    int nb = 0;
    for (size_t i = E->n; i-- > 0;) { /* parents first: a big inlined node passes it on */
        const sr_expr *e = E->order[i];
        if (!cache[i] || !big(e))
            continue;
        if (e->op != OP_VAR && !jit_lazy_op(E, e))
            return 0;
        cache[i] = false;
        for (int c = 0; c < expr_arity(e); c++)
            if (E->place[pos(E, e->child[c])] == PL_OUTER)
                cache[pos(E, e->child[c])] = true;
    }
    for (size_t i = 0; i < E->n; i++)
        if (cache[i])
            nb += E->order[i]->dim;
    return nb <= 64 ? nb : 0;
}

static void emitter_free(struct emitter *E);

/* The argument arrays a<v> of a generated entry point, from its args parameter. */
static void emit_args(struct emitter *E)
{
    for (int v = 0; v < E->k->nargs; v++)
        if (E->k->vars[v].dim)
            P("    const sr_io *restrict a%d = args[%d];\n", v, v);
    P("    (void)args;\n");
}

/* The pragma of the pair loop: vectorised across the tile, except in loop mode. */
static const char *simd_pragma(const struct emitter *E)
{
    return E->loops ? "" : "#pragma omp simd\n";
}

/* Stores F's components (and the weight's, after F's) of pair jj into their rows of the tile
 * buffer fb, in a loop over the components of a big one. */
static void emit_fb_store(struct emitter *E, const sr_expr *x, int row0)
{
    if (!x)
        return;
    if (big(x)) {
        P("        for (int sr_c = 0; sr_c < %d; sr_c++) fb[(%d + sr_c) * SR_TJ + jj] = %s;\n",
          x->dim, row0, jit_ref(E, x, "sr_c"));
        return;
    }
    for (int c = 0; c < x->dim; c++)
        P("        fb[%d * SR_TJ + jj] = %s;\n", row0 + c, jit_ref_c(E, x, c));
}

/* sr_block (sr_kernel_eval_block): F's values on rows [o0, o1) x reduced indices [r0, r1),
 * component c of (o, r) at out[(o - o0) * so + (r - r0) * sr + c]. The same placement, tiles
 * and pair loop as sr_part_iv (bodytxt is its loop body), storing F where sr_part_iv reduces
 * it. On axis 1 the reduced index is j, so a row of the block is contiguous and sr is the
 * compile-time dim(F) (the simd stores need no scatter); on axis 0 it is the caller's. */
static void emit_block(struct emitter *E, const char *bodytxt, int ncol, int RB, int gemm_arg)
{
    const struct sr_kernel *k = E->k;
    P("int sr_block(int64_t o0, int64_t o1, int64_t r0, int64_t r1, const void *const *args, "
      "void *out_, int64_t so, int64_t sr)\n{\n    sr_io *restrict out = out_;\n");
    emit_args(E);
    if (E->gemm) /* the tile of inner products of rows [o0, o1) x [r0, r1), as in sr_part_iv */
        P("    const sr_t *restrict sr_gt = args[%d];\n", gemm_arg);
    if (k->axis == 1)
        P("    (void)sr;\n");
    emit_scope(E, PL_UNIFORM);
    P("    sr_t *tb = malloc(sizeof(sr_t) * SR_TJ * %d + 64);\n    if (!tb) return 1;\n", ncol);
    P("    for (int64_t ob = o0; ob < o1; ob += %d) {\n", RB);
    P("      const int64_t oe = ob + %d < o1 ? ob + %d : o1;\n", RB, RB);
    P("      for (int64_t rt = r0; rt < r1; rt += SR_TJ) {\n");
    P("        const int nj = (int)(r1 - rt < SR_TJ ? r1 - rt : SR_TJ);\n");
    if (ncol > 0) {
        P("%s        for (int jj = 0; jj < nj; jj++) {\n"
          "        const int64_t r = rt + jj;\n",
          E->gemm ? "" : "#pragma omp simd\n");
        emit_inner(E);
        P("        }\n");
    }
    P("        for (int64_t o = ob; o < oe; o++) {\n");
    emit_scope(E, PL_OUTER);
    P("        sr_io *restrict ob_ = out + (o - o0) * so + (rt - r0) * %s;\n",
      k->axis == 1 ? jit_sfmt(E, "%d", k->fdim) : "sr");
    P("%s        for (int jj = 0; jj < nj; jj++) {\n%s", simd_pragma(E), bodytxt);
    E->scope = PL_PAIR;
    const char *rs = k->axis == 1 ? jit_sfmt(E, "%d", k->fdim) : "sr";
    if (big(k->f))
        P("        for (int sr_c = 0; sr_c < %d; sr_c++) ob_[jj * %s + sr_c] = SR_ST(%s);\n",
          k->fdim, rs, jit_ref(E, k->f, "sr_c"));
    else
        for (int c = 0; c < k->fdim; c++)
            P("        ob_[jj * %s + %d] = SR_ST(%s);\n", rs, c, jit_ref_c(E, k->f, c));
    P("        }\n        }\n      }\n    }\n    free(tb);\n    return 0;\n}\n\n");
}

/* Orders the nodes of F and the weight, places each (per call, row, reduced index or pair),
 * and gives the inner nodes the pair loop reads their columns in the tile. SR_ENOTSUP when the
 * formula is too large for the direct strategy. */
static sr_status analyse(struct emitter *E, int *ncol_out)
{
    const struct sr_kernel *k = E->k;
    const int D = k->fdim, DG = k->weight ? k->weight->dim : 0;
    sr_status st = SR_OK;
    /* Topological order of F and the weight together. */
    size_t nf = expr_toposort(k->f, NULL, 0),
           nw = k->weight ? expr_toposort(k->weight, NULL, 0) : 0;
    const sr_expr **tmp = malloc((nf + nw + 1) * sizeof *tmp);
    E->order = malloc((nf + nw + 1) * sizeof *E->order);
    E->place = calloc(nf + nw + 1, sizeof *E->place);
    E->col = calloc(nf + nw + 1, sizeof *E->col);
    E->in_loop = calloc(nf + nw + 1, sizeof *E->in_loop);
    uint32_t max_id = 0;
    if (!tmp || !E->order || !E->place || !E->col || !E->in_loop) {
        st = SR_ENOMEM;
        goto out;
    }
    expr_toposort(k->f, tmp, nf);
    if (k->weight)
        expr_toposort(k->weight, tmp + nf, nw);
    for (size_t i = 0; i < nf + nw; i++)
        if (tmp[i]->id > max_id)
            max_id = tmp[i]->id;
    E->pos_of = calloc((size_t)max_id + 1, sizeof *E->pos_of);
    if (!E->pos_of) {
        st = SR_ENOMEM;
        goto out;
    }
    /* Merge: F's order then the weight's new nodes (children still come first). */
    int64_t scalars = 0;
    for (size_t i = 0; i < nf + nw; i++) {
        const sr_expr *e = tmp[i];
        if (E->pos_of[e->id])
            continue;
        E->pos_of[e->id] = (uint32_t)(E->n + 1);
        E->place[E->n] = place_of(E, e);
        E->col[E->n] = -1;
        E->order[E->n++] = e;
        enum place pl = E->place[E->n - 1];
        if (!big(e))
            scalars += e->dim;
        if ((e->op == OP_MATVECMULT || e->op == OP_VECMATMULT || e->op == OP_TENSORPROD) && !big(e))
            scalars += e->child[0]->dim + e->child[1]->dim;
        int64_t terms = jit_unrolled_terms(e);
        if (terms <= jit_unroll_limit(E)) /* one statement per term */
            scalars += terms;
        else if (pl == PL_PAIR) /* loops over the output and the contraction */
            E->loops = E->pair_arrays = true;
        /* Big nodes that need an array are not allowed in the vectorised pair loop. */
        if (big(e) && e->op != OP_VAR && !jit_lazy_op(E, e) && pl == PL_PAIR)
            E->loops = E->pair_arrays = true;
    }
    if (scalars > JIT_MAX_SCALARS || D + DG > JIT_MAX_OUT)
        E->loops = true;
    /* What the simd loop needs: the pair nodes, the roots, and everything they reference. */
    const sr_expr *roots[2] = {k->f, k->weight};
    for (int r = 0; r < 2; r++)
        if (roots[r])
            E->in_loop[pos(E, roots[r])] = true;
    for (size_t i = 0; i < E->n; i++)
        if (E->place[i] == PL_PAIR)
            E->in_loop[i] = true;
    /* Inner nodes referenced from the loop are the tile's columns. */
    int ncol = 0;
    for (size_t i = 0; i < E->n; i++) {
        const sr_expr *e = E->order[i];
        /* Big inner nodes that need storage are computed straight into their columns, where
         * the pre-pass is vectorised across the tile; the gemm-epilogue's pre-pass runs along
         * each vector instead, and keeps one the pair loop does not read (Normalize(y) under
         * its norm, in the cosine kNN) in a local array: in the tile, a sum over it read one
         * column entry per cache line, 60 % of that kernel's time at D = 100. */
        bool stored = big(e) && e->op != OP_VAR && !jit_lazy_op(E, e) && !E->gemm;
        if (E->place[i] == PL_INNER && (E->in_loop[i] || stored) && E->col[i] < 0) {
            E->col[i] = ncol;
            ncol += e->dim;
        }
        if (E->place[i] != PL_PAIR || e == E->gemm)
            continue; /* the gemm node reads the tile of inner products, not its operands */
        for (int c = 0; c < expr_arity(e); c++) {
            size_t p = pos(E, e->child[c]);
            if (E->place[p] == PL_INNER && E->col[p] < 0) {
                E->col[p] = ncol;
                ncol += e->child[c]->dim;
            }
        }
    }
    *ncol_out = ncol;
out:
    free(tmp);
    return st;
}

static sr_status emit_c(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                        struct jit_plan *plan, bool compact)
{
    struct emitter E_ = {0}, *E = &E_;
    E->compact = compact;
    E->k = k;
    E->b = b;
    E->f32 = k->dtype == SR_F32;
    E->fs = E->f32 ? "f" : "";
    E->outer_dep = k->axis == 1 ? DEP_I : DEP_J;
    E->inner_dep = k->axis == 1 ? DEP_J : DEP_I;
    E->gemm = plan ? plan->gemm : NULL;
    if (!E->f32 && acc == JIT_ACC_F64)
        acc = JIT_ACC_BLOCK; /* float64 kernels accumulate in float64 anyway */
    const char *A = (E->f32 && acc != JIT_ACC_F64) ? "float" : "double";
    const sr_reduction red = k->red;
    const int D = k->fdim, K = k->k, DG = k->weight ? k->weight->dim : 0;
    const int OUTD = k->out_dim;
    sr_status st = SR_OK;
    bool *cache = NULL; /* row_cache's marks */
    bool *need = NULL;  /* rows_per_pass's marks */

    int ncol = 0;
    st = analyse(E, &ncol);
    if (st != SR_OK)
        goto done;
    if (!(cache = calloc(E->n + 1, sizeof *cache))) {
        st = SR_ENOMEM;
        goto done;
    }
    const int NB = row_cache(E, cache);
    /* Sum accumulates in registers inside the pair loop, except in loop mode, where F goes
     * through the tile buffer as for the other reductions; SumSoftMaxWeight in loop mode keeps
     * a tile of sr_acc weights exp(F - max) after F and the weight (two rows of sr_t, so that
     * it is aligned and holds doubles when sr_t is float). */
    const enum sr_red_family fam = sr_reductions[red].family;
    bool fused_sum = fam == SR_RED_FAM_SUM && !E->loops;
    int rpp = 1, row_regs = 0, shared_regs = 0;
    if (!(need = calloc(E->n + 1, sizeof *need))) {
        st = SR_ENOMEM;
        goto done;
    }
    if (fused_sum)
        rpp = rows_per_pass(E, need, ncol, &row_regs, &shared_regs);
    int nfb = fused_sum ? 0 : D + DG + jit_tile_rows(k, E->loops);
    /* The split pair loop (loop mode without pair arrays, a wide F or weight): one vectorised
     * loop computes the pair nodes and keeps the small ones in scratch rows after the buffered
     * values; then per wide component a vectorised loop reloads them and stores the component.
     * One plain loop with an inner loop over the components does not vectorise: the wide
     * components' libm calls (a Cos(u - v) of 65 components) then ran scalar, 3-4x faster than
     * the reference only. */
    const bool split =
        E->loops && !E->pair_arrays && !fused_sum && (big(k->f) || (k->weight && big(k->weight)));
    const int sp_row = nfb, npsc = split ? pair_scalars(E) : 0;
    nfb += npsc;
    /* Tile width: the tile (columns + buffered values) should stay in L2. */
    int TJ = 512;
    while (TJ > 16 && (int64_t)TJ * (ncol + nfb) * (E->f32 ? 4 : 8) > (256 << 10))
        TJ /= 2;
    while (plan && plan->tile_j_max > 0 && TJ > 16 && TJ / 2 >= plan->tile_j_max)
        TJ /= 2;

    /* ---- header and prelude ---- */
    P("/* symred generated kernel (JIT ABI %d)\n * formula: ", JIT_ABI_VERSION);
    expr_print_to(b, k->f);
    if (k->weight) {
        P("\n * weight: ");
        expr_print_to(b, k->weight);
    }
    P("\n * reduction: %s, axis %d, k %d, dtype %s, accumulation %s\n */\n",
      sr_reductions[red].name, k->axis, K, T(E), jit_acc_names[acc]);
    prelude(E, A);
    const char *t = T(E), *f = E->fs;
    P("#define SR_D %d\n#define SR_K %d\n#define SR_DG %d\n#define SR_OUTD %d\n", D, K, DG, OUTD);
    if (E->gemm)
        P("#define SR_GLD %d\n", plan->gemm_ld);
    P("#define SR_INF __builtin_inf%s()\n#define SR_NAN __builtin_nan%s(\"\")\n\n", f, f);

    /* ---- state, init, fold helpers, per-row merge and final: shared with CUDA ---- */
    st = jit_emit_state(k, acc, b);
    if (st != SR_OK)
        goto done;
    const int64_t state_bytes = jit_state_bytes(k, acc);
    /* gemm-epilogue: one block for all the rows of a call, so the reduced-index terms are
     * computed once per tile of inner products. */
    int RB = E->gemm && plan->gemm_rows > 64 ? plan->gemm_rows : 64;
    while (RB > 1 && state_bytes * RB > (4 << 20))
        RB /= 2;
    /* The memory budget (src/core/budget.c): halve whichever of the tile and the block of row
     * states is larger until the per-thread workspace fits, down to 16 x 1. */
    const int64_t es_ = E->f32 ? 4 : 8;
    const int64_t kextra_ = sr_reductions[red].uses_k ? (int64_t)K * (es_ + 8) : 0;
#define JIT_WS_(tj, rb)                                                                            \
    ((int64_t)(tj) * (ncol + nfb) * es_ + 64 + (int64_t)(rb) * (state_bytes + NB * es_) + kextra_)
    while (plan && plan->ws_limit > 0 && JIT_WS_(TJ, RB) > plan->ws_limit && (TJ > 16 || RB > 1)) {
        if (TJ > 16 && (RB == 1 || (int64_t)TJ * (ncol + nfb) * es_ >= (int64_t)RB * state_bytes))
            TJ /= 2;
        else
            RB /= 2;
    }
    P("#define SR_TJ %d\n", TJ);
    P("const int sr_abi_version = %d;\n", JIT_ABI_VERSION);
    P("const int64_t sr_state_bytes = (int64_t)sizeof(sr_state);\n");
    P("const int64_t sr_rows_per_block = %d;\n\n", RB);

    /* ---- merge and final over ranges of rows ---- */
    if (sr_reductions[red].uses_k)
        P("int sr_merge(void *dst_, const void *src_, int64_t n)\n{\n"
          "    sr_state *d = dst_; const sr_state *s = src_;\n"
          "    sr_t *tm = malloc(sizeof(sr_t) * SR_K); int64_t *ti = malloc(sizeof(int64_t) * "
          "SR_K);\n"
          "    if (!tm || !ti) { free(tm); free(ti); return 1; }\n"
          "    for (int64_t q = 0; q < n; q++) st_merge(&d[q], &s[q], tm, ti);\n"
          "    free(tm); free(ti);\n    return 0;\n}\n\n");
    else
        P("int sr_merge(void *dst_, const void *src_, int64_t n)\n{\n"
          "    sr_state *d = dst_; const sr_state *s = src_;\n"
          "    for (int64_t q = 0; q < n; q++) st_merge(&d[q], &s[q], 0, 0);\n"
          "    return 0;\n}\n\n");
    P("void sr_final(const void *state_, int64_t o0, int64_t o1, void *out, int64_t *out_idx)\n"
      "{\n    const sr_state *st = state_;\n"
      "    for (int64_t o = o0; o < o1; o++) st_final(&st[o - o0], o, out, out_idx);\n}\n\n");

    /* ---- part: the tiled loops ---- */
    /* sr_part_iv folds a list of reduced intervals (block-sparse ranges); sr_part is its
     * one-interval case. */
    const size_t part_at = E->b->len;
    P("int sr_part_iv(int64_t o0, int64_t o1, const int64_t *iv, int64_t niv, const void *const "
      "*args, void *state_)\n{\n    sr_state *st = state_;\n");
    emit_args(E);
    if (E->gemm)
        P("    const sr_t *restrict sr_gt = args[%d];\n"
          "    const int sr_ginit = *(const int *)args[%d];\n",
          plan->gemm_arg, plan->gemm_arg + 1);
    /* Uniform nodes: constants and parameters, once per call. */
    int nout = 0, nin = 0, npair = 0;
    emit_scope(E, PL_UNIFORM);
    P("    sr_t *tb = malloc(sizeof(sr_t) * (SR_TJ * %d + %d) + 64);\n    if (!tb) return 1;\n",
      ncol + nfb, RB * NB);
    P("    sr_t *fb = tb + SR_TJ * %d;\n    (void)fb;\n", ncol);
    if (NB)
        P("    sr_t *rc = tb + SR_TJ * %d;\n", ncol + nfb);
    /* gemm-epilogue: the caller folds tile after tile into the same states (see jit.h). */
    P("    %sfor (int64_t o = o0; o < o1; o++) st_init(&st[o - o0]);\n",
      E->gemm ? "if (sr_ginit) " : "");
    P("    for (int64_t ob = o0; ob < o1; ob += %d) {\n", RB);
    P("      const int64_t oe = ob + %d < o1 ? ob + %d : o1;\n", RB, RB);
    if (NB) { /* the row cache: the output-row nodes once per block of rows */
        char n[32];
        P("      for (int64_t o = ob; o < oe; o++) {\n");
        nout = emit_scope(E, PL_OUTER);
        for (size_t i = 0, u = 0; i < E->n; i++)
            for (int c = 0; cache[i] && c < E->order[i]->dim; c++, u++)
                P("        rc[(o - ob) * %d + %zu] = %s;\n", NB, u, jit_nm(E->order[i], c, n));
        P("      }\n");
    }
    P("      for (int64_t q = 0; q < niv; q++) {\n"
      "      const int64_t r0 = iv[2 * q], r1 = iv[2 * q + 1];\n");
    P("      for (int64_t rt = r0; rt < r1; rt += SR_TJ) {\n");
    P("        const int nj = (int)(r1 - rt < SR_TJ ? r1 - rt : SR_TJ);\n");
    /* Pre-pass: inner nodes into the tile (structure of arrays). */
    if (ncol > 0) {
        /* gemm-epilogue: the inner nodes are the few reduced-index terms (norms of long
         * vectors): vectorising along each vector beats gathers across the tile. */
        if (!E->gemm)
            P("#pragma omp simd\n");
        P("        for (int jj = 0; jj < nj; jj++) {\n        const int64_t r = rt + jj;\n");
        nin = emit_inner(E);
        P("        }\n");
    }
    if (rpp > 1) {
        struct expr_buf cols = {0}, pairs = {0};
        struct expr_buf *save = E->b;
        E->b = &cols;
        emit_cols(E);
        E->b = &pairs;
        E->scope = PL_PAIR;
        emit_scope(E, PL_PAIR);
        E->b = save;
        if (!cols.oom && !pairs.oom)
            emit_row_passes(E, rpp, need, cache, NB, acc, pairs.data ? pairs.data : "",
                            cols.data ? cols.data : "");
        else
            st = SR_ENOMEM;
        free(cols.data);
        free(pairs.data);
        if (st != SR_OK)
            goto done;
    }
    P("        for (int64_t o = %s; o < oe; o++) {\n        sr_state *s = &st[o - o0];\n",
      rpp > 1 ? "orb" : "ob");
    if (NB) {
        char n[32];
        for (size_t i = 0, u = 0; i < E->n; i++)
            for (int c = 0; cache[i] && c < E->order[i]->dim; c++, u++)
                P("        const sr_t %s = rc[(o - ob) * %d + %zu];\n", jit_nm(E->order[i], c, n),
                  NB, u);
    } else {
        nout = emit_scope(E, PL_OUTER);
    }

    /* The simd loop body: load the columns, compute the pair nodes. */
    struct expr_buf body = {0};
    {
        struct expr_buf *save = E->b;
        E->b = &body;
        npair = emit_pair(E);
        E->b = save;
        if (body.oom) {
            free(body.data);
            st = SR_ENOMEM;
            goto done;
        }
    }
    const char *bodytxt = body.data ? body.data : "";
    if (fused_sum) {
        P("        sr_acc ");
        for (int c = 0; c < D; c++)
            P("%sp%d = 0", c ? ", " : "", c);
        P(";\n#pragma omp simd reduction(+:");
        for (int c = 0; c < D; c++)
            P("%sp%d", c ? "," : "", c);
        P(")\n        for (int jj = 0; jj < nj; jj++) {\n%s", bodytxt);
        for (int c = 0; c < D; c++)
            P("        p%d += (sr_acc)%s;\n", c, jit_ref_c(E, k->f, c));
        P("        }\n");
        sum_fold(E, acc, "p");
    } else {
        if (split) {
            P("        sr_t *sp = fb + %d * SR_TJ;\n", sp_row);
            P("#pragma omp simd\n        for (int jj = 0; jj < nj; jj++) {\n%s", bodytxt);
            emit_pair_scratch(E, true);
            const sr_expr *xs[2] = {k->f, k->weight};
            for (int q = 0; q < 2; q++)
                if (xs[q] && !big(xs[q]))
                    emit_fb_store(E, xs[q], q ? D : 0);
            P("        }\n");
            for (int q = 0; q < 2; q++) {
                if (!xs[q] || !big(xs[q]))
                    continue;
                P("        for (int sr_c = 0; sr_c < %d; sr_c++) {\n"
                  "#pragma omp simd\n        for (int jj = 0; jj < nj; jj++) {\n",
                  xs[q]->dim);
                emit_pair_scratch(E, false);
                P("        fb[(%d + sr_c) * SR_TJ + jj] = %s;\n        }\n        }\n", q ? D : 0,
                  jit_ref(E, xs[q], "sr_c"));
            }
        } else {
            P("%s        for (int jj = 0; jj < nj; jj++) {\n%s", simd_pragma(E), bodytxt);
            emit_fb_store(E, k->f, 0);
            emit_fb_store(E, k->weight, D);
            P("        }\n");
        }
        /* The family's vectorised fold of the tile (emit-state.c). */
        jit_emit_tile_fold(k, acc, E->loops, b);
    }
    P("        }\n      }\n      }\n    }\n    free(tb);\n    return 0;\n}\n\n");
    if (plan && plan->block_only && !E->b->oom) { /* sr_part_iv, written above, is cut */
        E->b->len = part_at;
        E->b->data[part_at] = '\0';
        P("int sr_part_iv(int64_t o0, int64_t o1, const int64_t *iv, int64_t niv, const void "
          "*const *args, void *state_)\n{\n"
          "    (void)o0; (void)o1; (void)iv; (void)niv; (void)args; (void)state_;\n"
          "    return 1;\n}\n\n");
    }
    if (!plan || !plan->no_block)
        emit_block(E, bodytxt, ncol, RB, E->gemm ? plan->gemm_arg : 0);
    free(body.data);
    P("int sr_part(int64_t o0, int64_t o1, int64_t r0, int64_t r1, const void *const *args, void "
      "*state_)\n{\n    const int64_t iv[2] = {r0, r1};\n"
      "    return sr_part_iv(o0, o1, iv, 1, args, state_);\n}\n\n");

    /* ---- run: whole reduction for a range of rows ---- */
    P("int sr_run(int64_t o0, int64_t o1, int64_t nr, const void *const *args, void *out, int64_t "
      "*out_idx)\n{\n"
      "    sr_state *st = malloc(sizeof(sr_state) * %d);\n    if (!st) return 1;\n"
      "    for (int64_t ob = o0; ob < o1; ob += %d) {\n"
      "        const int64_t oe = ob + %d < o1 ? ob + %d : o1;\n"
      "        if (sr_part(ob, oe, 0, nr, args, st)) { free(st); return 1; }\n"
      "        sr_final(st, ob, oe, out, out_idx);\n    }\n    free(st);\n    return 0;\n}\n",
      RB, RB, RB, RB);
    (void)t;
    if (plan) {
        plan->tile_j = TJ;
        plan->rows_per_block = RB;
        plan->rows_per_pass = rpp;
        plan->row_regs = row_regs;
        plan->shared_regs = shared_regs;
        plan->columns = ncol;
        plan->fbuf = nfb;
        plan->state_bytes = state_bytes;
        plan->workspace_bytes = JIT_WS_(TJ, RB);
        plan->hoisted_outer = nout;
        plan->hoisted_inner = nin;
        plan->pair_nodes = npair;
        plan->loops = E->loops;
    }
    if (b->oom)
        st = SR_ENOMEM;
    if (E->fail)
        st = E->fail;
done:
    free(cache);
    free(need);
    emitter_free(E);
    return st;
}

sr_status jit_emit_c(const struct sr_kernel *k, enum jit_acc acc, struct expr_buf *b,
                     struct jit_plan *plan)
{
    size_t start = b->len;
    sr_status st = emit_c(k, acc, b, plan, false);
    if (st != SR_OK || b->len - start <= JIT_COMPACT_SOURCE)
        return st;
    b->len = start;
    if (b->data)
        b->data[start] = '\0';
    return emit_c(k, acc, b, plan, true);
}

static void emitter_free(struct emitter *E)
{
    for (size_t i = 0; i < E->nstr; i++)
        free(E->strs[i]);
    free(E->strs);
    free(E->order);
    free(E->place);
    free(E->col);
    free(E->in_loop);
    free(E->pos_of);
}

/* Emits the pieces of the direct strategy for another target's skeleton (emit-cuda.c), with
 * the same placement and spellings as the C kernels, except where spell overrides a template. */
static sr_status emit_nodes(const struct sr_kernel *k, const char *const *spell,
                            const sr_expr *gemm, struct jit_nodes *out, bool compact)
{
    struct emitter E_ = {0}, *E = &E_;
    memset(out, 0, sizeof *out);
    E->compact = compact;
    E->gemm = gemm;
    E->k = k;
    E->f32 = k->dtype == SR_F32;
    E->fs = E->f32 ? "f" : "";
    E->outer_dep = k->axis == 1 ? DEP_I : DEP_J;
    E->inner_dep = k->axis == 1 ? DEP_J : DEP_I;
    E->spell = spell;
    const int D = k->fdim, DG = k->weight ? k->weight->dim : 0;
    sr_status st = analyse(E, &out->ncol);
    if (st != SR_OK)
        goto done;
    out->f = calloc((size_t)D + 1, sizeof *out->f);
    out->w = calloc((size_t)DG + 1, sizeof *out->w);
    if (!out->f || !out->w) {
        st = SR_ENOMEM;
        goto done;
    }
    E->b = &out->uniform;
    out->nuniform = emit_scope(E, PL_UNIFORM);
    E->b = &out->outer;
    out->nouter = emit_scope(E, PL_OUTER);
    E->b = &out->inner;
    out->ninner = emit_inner(E);
    E->b = &out->pair;
    out->npair = emit_pair(E);
    for (int c = 0; c < D && !E->fail; c++)
        if (!(out->f[c] = strdup(jit_ref_c(E, k->f, c))))
            st = SR_ENOMEM;
    for (int c = 0; c < DG && !E->fail; c++)
        if (!(out->w[c] = strdup(jit_ref_c(E, k->weight, c))))
            st = SR_ENOMEM;
    if (big(k->f) && !(out->floop = strdup(jit_ref(E, k->f, "sr_c"))))
        st = SR_ENOMEM;
    if (k->weight && big(k->weight) && !(out->wloop = strdup(jit_ref(E, k->weight, "sr_c"))))
        st = SR_ENOMEM;
    out->loops = E->loops;
    if (out->uniform.oom || out->outer.oom || out->inner.oom || out->pair.oom)
        st = SR_ENOMEM;
    if (E->fail)
        st = E->fail;
done:
    emitter_free(E);
    if (st != SR_OK)
        jit_nodes_free(out);
    return st;
}

sr_status jit_emit_nodes(const struct sr_kernel *k, const char *const *spell, struct jit_nodes *out)
{
    return jit_emit_nodes_gemm(k, spell, NULL, out);
}

sr_status jit_emit_nodes_gemm(const struct sr_kernel *k, const char *const *spell,
                              const sr_expr *gemm, struct jit_nodes *out)
{
    sr_status st = emit_nodes(k, spell, gemm, out, false);
    if (st != SR_OK)
        return st;
    size_t len = out->uniform.len + out->outer.len + out->inner.len + out->pair.len;
    for (int c = 0; out->f[c]; c++)
        len += strlen(out->f[c]);
    for (int c = 0; out->w[c]; c++)
        len += strlen(out->w[c]);
    if (len <= JIT_COMPACT_SOURCE)
        return st;
    jit_nodes_free(out);
    return emit_nodes(k, spell, gemm, out, true);
}

void jit_nodes_free(struct jit_nodes *n)
{
    struct expr_buf *bufs[4] = {&n->uniform, &n->outer, &n->inner, &n->pair};
    for (int i = 0; i < 4; i++) {
        free(bufs[i]->data);
        memset(bufs[i], 0, sizeof *bufs[i]);
    }
    for (int c = 0; n->f && n->f[c]; c++)
        free(n->f[c]);
    for (int c = 0; n->w && n->w[c]; c++)
        free(n->w[c]);
    free(n->f);
    free(n->w);
    free(n->floop);
    free(n->wloop);
    n->f = n->w = NULL;
    n->floop = n->wloop = NULL;
}
