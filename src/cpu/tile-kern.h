/*
 * tile-kern.h — the tile interpreter's loops, written once and compiled once per element type
 * and vector unit by tile-isa.c, which includes this file with TILE_T (float or double),
 * TILE_SFX (the name suffix) and TILE_FMA (1 where the target has fused multiply-add) defined,
 * under a `#pragma GCC target` for the vector unit. Everything here is static: each inclusion
 * is a separate set of functions, reached through the table that tile-isa.c builds from them.
 *
 * The loops run over the n elements of a tile (one per reduced index) with `omp simd`, one op at
 * a time; an operand is either a tile (element stride 1) or a value broadcast over the tile
 * (element stride 0: a constant, a parameter or a term of the output row). The ops without a
 * loop of their own run through the reference interpreter's evaluator, element by element in
 * float64, so every op of the table is served.
 */
#define TILE_CAT2_(a, b) a##b
#define TILE_CAT_(a, b)  TILE_CAT2_(a, b)
#define TILE_NAME(n)     TILE_CAT_(n, TILE_SFX)

typedef TILE_T TILE_NAME(tile_t_);
#define T TILE_NAME(tile_t_)

#if TILE_FMA && TILE_F64
#define TFMA(a, b, c) __builtin_fma((a), (b), (c))
#elif TILE_FMA
#define TFMA(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define TFMA(a, b, c) ((a) * (b) + (c))
#endif
#if TILE_F64
#define TSQRT(a)   __builtin_sqrt(a)
#define TNEXTUP(a) __builtin_nextafter((a), __builtin_inf())
#define TILE_TMAX  __DBL_MAX__
#else
#define TSQRT(a)   __builtin_sqrtf(a)
#define TNEXTUP(a) __builtin_nextafterf((a), __builtin_inff())
#define TILE_TMAX  __FLT_MAX__
#endif

/* The exponential of the generated code (src/jit/emit-c.c), branch-free so the loops vectorise:
 * 2^k times a polynomial on the reduced argument, flushed to 0 below the smallest subnormal's
 * logarithm and to +inf (or NaN) above the largest finite value's. */
static inline T TILE_NAME(texp_)(T a)
{
#if !TILE_F64
    const float t = TFMA(a, 0x1.715476p+0f, 0x1.8p23f), k = t - 0x1.8p23f;
    const float r = TFMA(-k, 0x1.7f7d1cp-20f, TFMA(-k, 0x1.62e4p-1f, a));
    float q = 0x1.6d10fcp-10f;
    q = TFMA(q, r, 0x1.120b62p-7f);
    q = TFMA(q, r, 0x1.55551ap-5f);
    q = TFMA(q, r, 0x1.5554dep-3f);
    q = TFMA(q, r, 0x1p-1f);
    const float p = TFMA(q, r * r, r) + 1.0f;
    uint32_t u, v;
    memcpy(&u, &p, 4);
    memcpy(&v, &t, 4);
    u += v << 23;
    float e;
    memcpy(&e, &u, 4);
    e = a < -0x1.5bded2p+6f ? 0.0f : e;
    return a <= 0x1.62e42ep+6f ? e : a + __builtin_inff();
#else
    const double t = TFMA(a, 0x1.71547652b82fep+0, 0x1.8p52), k = t - 0x1.8p52;
    const double r = TFMA(-k, 0x1.a39ef35793c76p-33, TFMA(-k, 0x1.62e42feep-1, a));
    double q = 0x1.af389ecfc4b9cp-26;
    q = TFMA(q, r, 0x1.28917c89a43a7p-22);
    q = TFMA(q, r, 0x1.71de0db2f6b19p-19);
    q = TFMA(q, r, 0x1.a019b9149a41cp-16);
    q = TFMA(q, r, 0x1.a01a01a7c2efep-13);
    q = TFMA(q, r, 0x1.6c16c17889ef1p-10);
    q = TFMA(q, r, 0x1.11111111109b5p-7);
    q = TFMA(q, r, 0x1.5555555553d68p-5);
    q = TFMA(q, r, 0x1.5555555555556p-3);
    q = TFMA(q, r, 0x1.0000000000001p-1);
    const double p = TFMA(q, r * r, r) + 1.0;
    uint64_t u, v;
    memcpy(&u, &p, 8);
    memcpy(&v, &t, 8);
    u += v << 52;
    double e;
    memcpy(&e, &u, 8);
    e = a < -0x1.61fc78b1026a3p+9 ? 0.0 : e;
    return a <= 0x1.62e42fefa39efp+9 ? e : a + __builtin_inf();
#endif
}

/* In the loops below, operand c's component k is at P[c] + k * CS[c] and its element t at
 * + t * ES[c] (ES 0: broadcast over the tile); the output's component k is at out + k * ocs. */
#define OPD_P(c)  (P[c])
#define OPD_CS(c) (CS[c])
#define OPD_ES(c) (ES[c])

/*
 * An elementwise loop over n elements: the tile operands (element stride 1) are indexed, the
 * broadcast ones read once. EXPR uses a, b, c (the operands' values at the element). Every
 * combination of strides has its own loop, so each is a plain vectorisable loop.
 */
#define EW1(EXPR)                                                                                  \
    do {                                                                                           \
        for (int k = 0; k < dim; k++) {                                                            \
            T *o = out + k * ocs;                                                                  \
            const T *A = OPD_P(0) + k * OPD_CS(0);                                                 \
            if (OPD_ES(0)) {                                                                       \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T a = A[t];                                                                    \
                    o[t] = (EXPR);                                                                 \
                }                                                                                  \
            } else {                                                                               \
                T a = A[0];                                                                        \
                o[0] = (EXPR);                                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define EW2(EXPR)                                                                                  \
    do {                                                                                           \
        for (int k = 0; k < dim; k++) {                                                            \
            T *o = out + k * ocs;                                                                  \
            const T *A = OPD_P(0) + k * OPD_CS(0), *B = OPD_P(1) + k * OPD_CS(1);                  \
            if (OPD_ES(0) && OPD_ES(1)) {                                                          \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T a = A[t], b = B[t];                                                          \
                    o[t] = (EXPR);                                                                 \
                }                                                                                  \
            } else if (OPD_ES(0)) {                                                                \
                const T b = B[0];                                                                  \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T a = A[t];                                                                    \
                    o[t] = (EXPR);                                                                 \
                }                                                                                  \
            } else if (OPD_ES(1)) {                                                                \
                const T a = A[0];                                                                  \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T b = B[t];                                                                    \
                    o[t] = (EXPR);                                                                 \
                }                                                                                  \
            } else {                                                                               \
                T a = A[0], b = B[0];                                                              \
                o[0] = (EXPR);                                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Three operands are rare enough (IfElse, Clamp) for one loop with strides. */
#define EW3(EXPR)                                                                                  \
    do {                                                                                           \
        const int64_t s0 = OPD_ES(0), s1 = OPD_ES(1), s2 = OPD_ES(2);                              \
        for (int k = 0; k < dim; k++) {                                                            \
            T *o = out + k * ocs;                                                                  \
            const T *A = OPD_P(0) + k * OPD_CS(0), *B = OPD_P(1) + k * OPD_CS(1),                  \
                    *C = OPD_P(2) + k * OPD_CS(2);                                                 \
            for (int t = 0; t < n; t++) {                                                          \
                T a = A[t * s0], b = B[t * s1], c = C[t * s2];                                     \
                o[t] = (EXPR);                                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* SqNorm2, Norm2 and SqDist of at most this many components fuse each square into the sum (one
 * rounding, TFMA), as the generated C does for the vectors it unrolls (JIT_BIG in the emitter):
 * on a CPU with FMA both tiers then compute these sums bitwise alike. */
#define TILE_SQ_FUSED_MAX 16

/* Sum over the components k < kd of TERM: out[t] = sum_k TERM, where TERM reads a (operand 0 at
 * component k) and, for two operands, b (operand 1 at k). Accumulated in T in increasing order
 * of k, one pass over the tile per component (the vector loop is the one over the tile): each
 * step is TADD(s, TERM), s + TERM but for the sums of squares below. */
#define TADD(s, t) ((s) + (t))
#define SUMK1(TERM)                                                                                \
    do {                                                                                           \
        if (!OPD_ES(0)) {                                                                          \
            T s = 0;                                                                               \
            for (int k = 0; k < kd; k++) {                                                         \
                T a = OPD_P(0)[k * OPD_CS(0)];                                                     \
                s = TADD(s, (TERM));                                                               \
            }                                                                                      \
            out[0] = s;                                                                            \
            break;                                                                                 \
        }                                                                                          \
        for (int k = 0; k < kd; k++) {                                                             \
            const T *A = OPD_P(0) + k * OPD_CS(0);                                                 \
            if (k == 0) {                                                                          \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T a = A[t];                                                                    \
                    out[t] = (TERM);                                                               \
                }                                                                                  \
            } else {                                                                               \
                TILE_SIMD for (int t = 0; t < n; t++)                                              \
                {                                                                                  \
                    T a = A[t];                                                                    \
                    out[t] = TADD(out[t], (TERM));                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Two operands; the first component's pass stores, the others add. */
#define SUMK2_PASS(LOADS)                                                                          \
    do {                                                                                           \
        if (k == 0) {                                                                              \
            TILE_SIMD for (int t = 0; t < n; t++)                                                  \
            {                                                                                      \
                LOADS;                                                                             \
                out[t] = (TERM);                                                                   \
            }                                                                                      \
        } else {                                                                                   \
            TILE_SIMD for (int t = 0; t < n; t++)                                                  \
            {                                                                                      \
                LOADS;                                                                             \
                out[t] = TADD(out[t], (TERM));                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Many components: blocks of TILE_SUMK_BLOCK elements with their sums in registers across the
 * components (one pass over the tile), then the element-per-pass form for the rest. */
#define TILE_SUMK_BLOCK 32
#define SUMK2_BLOCKS(LOADS)                                                                        \
    do {                                                                                           \
        for (; t0 + TILE_SUMK_BLOCK <= n; t0 += TILE_SUMK_BLOCK) {                                 \
            T acc[TILE_SUMK_BLOCK];                                                                \
            TILE_SIMD for (int u = 0; u < TILE_SUMK_BLOCK; u++) acc[u] = 0;                        \
            for (int k = 0; k < kd; k++) {                                                         \
                const T *A = OPD_P(0) + k * OPD_CS(0) + t0 * OPD_ES(0);                            \
                const T *B = OPD_P(1) + k * OPD_CS(1) + t0 * OPD_ES(1);                            \
                TILE_SIMD for (int u = 0; u < TILE_SUMK_BLOCK; u++)                                \
                {                                                                                  \
                    LOADS;                                                                         \
                    acc[u] = TADD(acc[u], (TERM));                                                 \
                }                                                                                  \
            }                                                                                      \
            TILE_SIMD for (int u = 0; u < TILE_SUMK_BLOCK; u++) out[t0 + u] = acc[u];              \
        }                                                                                          \
    } while (0)

/* Few components (KD, a constant): one pass, the sum in a register across the components, in
 * the same order as the passes below. */
#define SUMK2_FEW_(KD, LOADS)                                                                      \
    TILE_SIMD for (int t = 0; t < n; t++)                                                          \
    {                                                                                              \
        T s_ = 0;                                                                                  \
        for (int k = 0; k < KD; k++) {                                                             \
            LOADS;                                                                                 \
            s_ = k ? TADD(s_, (TERM)) : (TERM);                                                    \
        }                                                                                          \
        out[t] = s_;                                                                               \
    }
#define SUMK2_FEW(LOADS)                                                                           \
    do {                                                                                           \
        const T *A = OPD_P(0), *B = OPD_P(1);                                                      \
        const int64_t ca = OPD_CS(0), cb = OPD_CS(1);                                              \
        (void)A, (void)B, (void)ca, (void)cb;                                                      \
        switch (kd) {                                                                              \
        case 1:                                                                                    \
            SUMK2_FEW_(1, LOADS);                                                                  \
            break;                                                                                 \
        case 2:                                                                                    \
            SUMK2_FEW_(2, LOADS);                                                                  \
            break;                                                                                 \
        case 3:                                                                                    \
            SUMK2_FEW_(3, LOADS);                                                                  \
            break;                                                                                 \
        default:                                                                                   \
            SUMK2_FEW_(4, LOADS);                                                                  \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define SUMK2(TERM_)                                                                               \
    do {                                                                                           \
        if (kd <= 4 && OPD_ES(0) && OPD_ES(1)) {                                                   \
            SUMK2_FEW(T a = A[k * ca + t]; T b = B[k * cb + t]);                                   \
            break;                                                                                 \
        }                                                                                          \
        if (kd <= 4 && OPD_ES(0)) {                                                                \
            SUMK2_FEW(T a = A[k * ca + t]; T b = B[k * cb]);                                       \
            break;                                                                                 \
        }                                                                                          \
        if (kd <= 4 && OPD_ES(1)) {                                                                \
            SUMK2_FEW(T a = A[k * ca]; T b = B[k * cb + t]);                                       \
            break;                                                                                 \
        }                                                                                          \
        int t0 = 0;                                                                                \
        if (kd >= 4 && OPD_ES(0) && OPD_ES(1))                                                     \
            SUMK2_BLOCKS(T a = A[u]; T b = B[u]);                                                  \
        else if (kd >= 4 && OPD_ES(0))                                                             \
            SUMK2_BLOCKS(T a = A[u]; T b = B[0]);                                                  \
        else if (kd >= 4 && OPD_ES(1))                                                             \
            SUMK2_BLOCKS(T a = A[0]; T b = B[u]);                                                  \
        if (t0 == n)                                                                               \
            break;                                                                                 \
        out += t0;                                                                                 \
        n -= t0;                                                                                   \
        for (int k = 0; k < kd; k++) {                                                             \
            const T *A = OPD_P(0) + k * OPD_CS(0) + t0 * OPD_ES(0);                                \
            const T *B = OPD_P(1) + k * OPD_CS(1) + t0 * OPD_ES(1);                                \
            if (OPD_ES(0) && OPD_ES(1)) {                                                          \
                SUMK2_PASS(T a = A[t]; T b = B[t]);                                                \
            } else if (OPD_ES(0)) {                                                                \
                const T bb = B[0];                                                                 \
                SUMK2_PASS(T a = A[t]; T b = bb);                                                  \
            } else if (OPD_ES(1)) {                                                                \
                const T aa = A[0];                                                                 \
                SUMK2_PASS(T a = aa; T b = B[t]);                                                  \
            } else {                                                                               \
                T a = A[0], b = B[0];                                                              \
                out[0] = k ? TADD(out[0], (TERM)) : (TERM);                                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Copies component k0 .. k0 + cnt of operand c into components d0 .. of the output. */
static inline void TILE_NAME(copy_)(T *out, int64_t ocs, int d0, const struct tile_opnds *fr, int c,
                                    int k0, int cnt, int n)
{
    for (int k = 0; k < cnt; k++) {
        T *o = out + (d0 + k) * ocs;
        const T *A = (const T *)fr->p[c] + (k0 + k) * fr->cs[c];
        if (fr->es[c])
            memcpy(o, A, (size_t)n * sizeof(T));
        else
            for (int t = 0; t < n; t++)
                o[t] = A[0];
    }
}

/* Any op, element by element, through the reference evaluator in float64 (scratch: room for the
 * operands' and the result's components). */
static void TILE_NAME(generic_)(const sr_expr *e, T *out, int64_t ocs, const struct tile_opnds *fr,
                                int n, double *scratch)
{
    int ar = expr_arity(e);
    double *in[EXPR_MAX_ARITY] = {NULL, NULL, NULL}, *res = scratch;
    double *p = scratch + e->dim;
    for (int c = 0; c < ar; c++) {
        in[c] = p;
        p += e->child[c]->dim;
    }
    for (int t = 0; t < n; t++) {
        for (int c = 0; c < ar; c++) {
            const T *A = (const T *)fr->p[c] + t * fr->es[c];
            for (int k = 0; k < e->child[c]->dim; k++)
                in[c][k] = (double)A[k * fr->cs[c]];
        }
        cpu_ref_eval(e, res, (const double *const *)in);
        for (int k = 0; k < e->dim; k++)
            out[k * ocs + t] = (T)res[k];
    }
}

/* Node e over n elements into out (component stride ocs), the operands as opd describes them.
 * An operand of dimension 1 under an elementwise op of larger dimension has component stride 0
 * (broadcast over the components). */
static void TILE_NAME(op_)(const sr_expr *e, void *vout, int64_t ocs, const struct tile_opnds *opd,
                           int n, double *scratch)
{
    T *out = vout;
    const T *P[EXPR_MAX_ARITY] = {opd->p[0], opd->p[1], opd->p[2]};
    const int64_t *CS = opd->cs, *ES = opd->es;
    const int dim = e->dim;
    switch (e->op) {
    case OP_ADD:
        EW2(a + b);
        return;
    case OP_SUB:
        EW2(a - b);
        return;
    case OP_MUL:
        EW2(a * b);
        return;
    case OP_DIV:
        EW2(a / b);
        return;
    case OP_MINUS:
        EW1(-a);
        return;
    case OP_INV:
        EW1((T)1 / a);
        return;
    case OP_SQUARE:
        EW1(a * a);
        return;
    case OP_SQRT:
        EW1(TSQRT(a));
        return;
    case OP_RSQRT:
        EW1(a == 0 ? (T)0 : (T)1 / TSQRT(a));
        return;
    case OP_EXP:
        EW1(TILE_NAME(texp_)(a));
        return;
    case OP_ABS:
        EW1(a < 0 ? -a : a == 0 ? (T)0 : a);
        return;
    case OP_RELU:
        EW1(a > 0 ? a : a != a ? a : (T)0);
        return;
    case OP_STEP:
        EW1(a >= 0 ? (T)1 : a != a ? a : (T)0);
        return;
    case OP_SIGN:
        EW1(a > 0 ? (T)1 : a < 0 ? (T)-1 : a == 0 ? (T)0 : a);
        return;
    case OP_LESS:
        EW2(a < b ? (T)1 : (T)0);
        return;
    case OP_LESSEQ:
        EW2(a <= b ? (T)1 : (T)0);
        return;
    case OP_GREATER:
        EW2(a > b ? (T)1 : (T)0);
        return;
    case OP_GREATEREQ:
        EW2(a >= b ? (T)1 : (T)0);
        return;
    case OP_EQUAL:
        EW2(a == b ? (T)1 : (T)0);
        return;
    case OP_NOTEQUAL:
        EW2(a != b ? (T)1 : (T)0);
        return;
    case OP_IFELSE:
        EW3(a >= 0 ? b : c);
        return; /* a NaN condition selects c */
    case OP_POW:
        /* Repeated multiplication, as the reference does; other exponents go generic. */
        if (e->iattr[0] == 2) {
            EW1(a * a);
            return;
        }
        if (e->iattr[0] == 3) {
            EW1(a * a * a);
            return;
        }
        if (e->iattr[0] == -1) {
            EW1((T)1 / a);
            return;
        }
        break;
    case OP_SUM: {
        const int kd = e->child[0]->dim;
        SUMK1(a);
        return;
    }
    case OP_SQNORM2:
    case OP_NORM2: {
        const int kd = e->child[0]->dim;
        if (kd <= TILE_SQ_FUSED_MAX) {
#undef TADD
#define TADD(s, t) TFMA((a), (a), (s))
            SUMK1(a * a);
#undef TADD
#define TADD(s, t) ((s) + (t))
        } else
            SUMK1(a * a);
        if (e->op == OP_NORM2) {
            int m = ES[0] ? n : 1;
            TILE_SIMD for (int t = 0; t < m; t++) out[t] = TSQRT(out[t]);
        }
        return;
    }
    case OP_SQDIST: {
        const int kd = e->child[0]->dim;
#define TERM ((a - b) * (a - b))
        if (kd <= TILE_SQ_FUSED_MAX) {
#undef TADD
#define TADD(s, t) TFMA((a - b), (a - b), (s))
            SUMK2();
#undef TADD
#define TADD(s, t) ((s) + (t))
        } else
            SUMK2();
#undef TERM
        return;
    }
    case OP_SCALPROD: {
        const int kd = e->child[0]->dim;
#define TERM (a * b)
        SUMK2();
#undef TERM
        return;
    }
    case OP_ELEM:
        TILE_NAME(copy_)(out, ocs, 0, opd, 0, (int)e->iattr[0], 1, n);
        return;
    case OP_EXTRACT:
        TILE_NAME(copy_)(out, ocs, 0, opd, 0, (int)e->iattr[0], dim, n);
        return;
    case OP_CONCAT: {
        int da = e->child[0]->dim;
        TILE_NAME(copy_)(out, ocs, 0, opd, 0, 0, da, n);
        TILE_NAME(copy_)(out, ocs, da, opd, 1, 0, e->child[1]->dim, n);
        return;
    }
    default:
        break;
    }
    TILE_NAME(generic_)(e, out, ocs, opd, n, scratch);
}

/* A fused chain (enum tile_fuse, cpu.h) over n elements: one loop, the intermediate values in
 * registers (rounded to T as the separate ops round them). */
static void TILE_NAME(fused_)(int kind, int dim, void *vout, int64_t ocs,
                              const struct tile_opnds *opd, int n)
{
    T *out = vout;
    const T *P[EXPR_MAX_ARITY] = {opd->p[0], opd->p[1], opd->p[2]};
    const int64_t *CS = opd->cs, *ES = opd->es;
    switch (kind) {
    case TILE_FUSE_NEG_MUL:
        EW2(-(a * b));
        return;
    case TILE_FUSE_EXP_MUL:
        EW2(TILE_NAME(texp_)(a * b));
        return;
    case TILE_FUSE_EXP_NEG_MUL:
        EW2(TILE_NAME(texp_)(-(a * b)));
        return;
    case TILE_FUSE_EXP_NEG:
        EW1(TILE_NAME(texp_)(-a));
        return;
    default:
        return;
    }
}

/* ---- reductions over a tile ------------------------------------------------------------------
 * Each takes n >= 1 elements; sums accumulate in float64. */

/* sum_t of TERM(t) in float64: TILE_ACC running sums (independent, so the additions overlap
 * instead of waiting on one another), added pairwise at the end, then the tail's terms. */
#define TILE_ACC 32
#define SUM_BLOCKED(s, TERM)                                                                       \
    do {                                                                                           \
        double acc_[TILE_ACC];                                                                     \
        TILE_SIMD for (int u = 0; u < TILE_ACC; u++) acc_[u] = 0;                                  \
        int t0_ = 0;                                                                               \
        for (; t0_ + TILE_ACC <= n; t0_ += TILE_ACC)                                               \
            TILE_SIMD for (int u = 0; u < TILE_ACC; u++)                                           \
            {                                                                                      \
                const int t = t0_ + u;                                                             \
                acc_[u] += (double)(TERM);                                                         \
            }                                                                                      \
        TILE_SIMD for (int u = 0; u < 16; u++) acc_[u] += acc_[u + 16];                            \
        TILE_SIMD for (int u = 0; u < 8; u++) acc_[u] += acc_[u + 8];                              \
        TILE_SIMD for (int u = 0; u < 4; u++) acc_[u] += acc_[u + 4];                              \
        s = (acc_[0] + acc_[2]) + (acc_[1] + acc_[3]);                                             \
        for (int t = t0_; t < n; t++)                                                              \
            s += (double)(TERM);                                                                   \
    } while (0)

static double TILE_NAME(sum_)(const void *vx, int n)
{
    const T *x = vx;
    double s;
    SUM_BLOCKED(s, x[t]);
    return s;
}

/* The largest of x[0 .. n); *special set when any is NaN or +inf, or all are -inf: the caller
 * then folds element by element, with the reference's rules for those values. */
static double TILE_NAME(max_)(const void *vx, int n, int *special)
{
    const T *x = vx;
    T m = x[0];
    int bad = 0, t0 = 0;
    if (n >= TILE_ACC) {
        /* TILE_ACC running maxima and flags, so the comparisons overlap. */
        T mv[TILE_ACC];
        int bv[TILE_ACC];
        TILE_SIMD for (int u = 0; u < TILE_ACC; u++)
        {
            mv[u] = x[0];
            bv[u] = 0;
        }
        for (; t0 + TILE_ACC <= n; t0 += TILE_ACC)
            TILE_SIMD for (int u = 0; u < TILE_ACC; u++)
            {
                T v = x[t0 + u];
                mv[u] = v > mv[u] ? v : mv[u];
                bv[u] |= (v != v) | (v > TILE_TMAX);
            }
        TILE_SIMD_MAX(m, bad) for (int u = 0; u < TILE_ACC; u++)
        {
            m = mv[u] > m ? mv[u] : m;
            bad |= bv[u];
        }
    }
    TILE_SIMD_MAX(m, bad) for (int t = t0; t < n; t++)
    {
        T v = x[t];
        m = v > m ? v : m;
        bad |= (v != v) | (v > TILE_TMAX);
    }
    *special = bad || !(m >= -TILE_TMAX);
    return (double)m;
}

/* sum_t exp(x[t] - m) (the exponentials in T); p, when not NULL, gets the exponentials. */
static double TILE_NAME(expsum_)(const void *vx, void *vp, int n, double dm)
{
    const T *x = vx;
    T *p = vp, m = (T)dm;
    double s;
    if (p) {
        TILE_SIMD for (int t = 0; t < n; t++) p[t] = TILE_NAME(texp_)(x[t] - m);
        SUM_BLOCKED(s, p[t]);
    } else {
        SUM_BLOCKED(s, TILE_NAME(texp_)(x[t] - m));
    }
    return s;
}

/* sum_t p[t] g[t]. */
static double TILE_NAME(dot_)(const void *vp, const void *vg, int n)
{
    const T *p = vp, *g = vg;
    double s;
    SUM_BLOCKED(s, p[t] * g[t]);
    return s;
}

/* The smallest (desc: the largest) of x[0 .. n); NaN when any is NaN. */
static double TILE_NAME(ext_)(const void *vx, int n, int desc)
{
    const T *x = vx;
    T m = x[0];
    int bad = 0;
    if (desc) {
        TILE_SIMD_MAX(m, bad) for (int t = 0; t < n; t++)
        {
            T v = x[t];
            m = v > m ? v : m;
            bad |= v != v;
        }
    } else {
        TILE_SIMD_MIN(m, bad) for (int t = 0; t < n; t++)
        {
            T v = x[t];
            m = v < m ? v : m;
            bad |= v != v;
        }
    }
    return bad ? (double)NAN : (double)m;
}

static uint64_t TILE_NAME(below_)(const void *vx, int n, double dthr)
{
    const T *x = vx;
    /* thr rounded up to T: a value of T is below it exactly when it is below dthr. */
    T thr = (T)dthr;
    if ((double)thr < dthr)
        thr = TNEXTUP(thr);
    uint64_t mask = 0;
    for (int b = 0; b * 16 < n; b++) {
        const int u0 = b * 16, u1 = u0 + 16 < n ? u0 + 16 : n;
        int any = 0;
        TILE_SIMD_OR(any) for (int u = u0; u < u1; u++) any |= !(x[u] >= thr);
        mask |= (uint64_t)(any != 0) << b;
    }
    return mask;
}

static const struct tile_isa TILE_NAME(tile_isa_) = {
    .op = TILE_NAME(op_),
    .fused = TILE_NAME(fused_),
    .sum = TILE_NAME(sum_),
    .max = TILE_NAME(max_),
    .expsum = TILE_NAME(expsum_),
    .dot = TILE_NAME(dot_),
    .ext = TILE_NAME(ext_),
    .below = TILE_NAME(below_),
};

#undef T
#undef TFMA
#undef TSQRT
#undef TNEXTUP
#undef TILE_TMAX
#undef EW1
#undef EW2
#undef EW3
#undef SUMK1
#undef SUMK2
#undef SUMK2_PASS
#undef SUMK2_BLOCKS
#undef SUMK2_FEW
#undef SUMK2_FEW_
#undef SUM_BLOCKED
#undef TILE_ACC
#undef TILE_SUMK_BLOCK
#undef OPD_P
#undef OPD_CS
#undef OPD_ES
