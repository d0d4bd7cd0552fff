/*
 * test-fuzz-regress.c — the differential fuzzer's own checks and the cases it found.
 *
 * The fuzzer (tests/fuzz.c, docs/fuzzing.md) must cover the op table: every op is generated,
 * a leaf, or excluded with a reason, and the generator does produce each generated op. A case
 * is reproducible from its seed. A wrong backend result is reported and shrunk. Then every
 * case the fuzzer found, shrunk, runs again through every backend: FZ_REGRESSIONS lists them
 * as fuzz-diff prints them (X(name, formula, weight, reduction, axis, k, dtype, acc, nx, ny,
 * inputs, input seed, threads)). No formula the generator draws (wide ones included) plans onto
 * the reference interpreter while a C compiler is present.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "fuzz.h"
#include "jit/cuda.h"

/* The cases fuzz-diff found, shrunk; each was a bug fixed in the commit that added it (in the
 * library, or in the fuzzer's comparison where the comment says so). */
#define FZ_REGRESSIONS(X)                                                                          \
    /* the JIT's Clamp honours a NaN bound (emit-c.c) */                                           \
    X(clamp_nan_bound, "Clamp(Var(2,3,0),Var(3,3,0),1.0)", "", SR_MIN_ARGMIN, 0, 1, SR_F32,        \
      SR_ACC_KAHAN, 14, 1, "UUGEPT", 0x74976c4001f50709ULL, 2)                                     \
    /* mul-zero must fold 0 * -2.5 to -0 as IEEE does: Inv shows the sign */                       \
    X(mul_zero_sign, "Inv(TensorProd((0.0*Cst(-2.5)),Var(0,1,1)))", "", SR_MIN, 0, 1, SR_F64,      \
      SR_ACC_DEFAULT, 1, 1, "EU", 0xc8e1a5f55465cc39ULL, 1)                                        \
    /* Kahan summation of +inf terms is +inf, not NaN (inf - inf in the compensation) */           \
    X(kahan_inf, "(Var(0,3,0)/Concat(3.0,Var(3,2,0)))", "", SR_SUM, 1, 1, SR_F32, SR_ACC_KAHAN, 1, \
      544, "UUUT", 0xa94cced1304ea028ULL, 2)                                                       \
    /* a lazy node's C expression is parenthesised: `x == 0 ? 1 : sin(x) / x` as a factor of       \
     * VecMatMult's product keeps the factor at 0 */                                               \
    X(lazy_parens, "Norm2(VecMatMult(Var(1,4,0),SinXDivX(Var(0,68,0))))", "", SR_MAX_ARGMAX, 0, 1, \
      SR_F64, SR_ACC_DEFAULT, 1, 1, "TU", 0x7b58c728712c31eULL, 1)                                 \
    /* the fuzzer's comparison: the simplifier's log-exp rule gives x where Exp(x) underflows      \
     * and the formula as given is -inf (documented); the comparison accepts the reference's       \
     * value of the simplified formula there */                                                    \
    X(log_exp_underflow, "Log(Exp(Var(0,3,1)))", "", SR_LOGSUMEXP, 0, 1, SR_F32, SR_ACC_DEFAULT,   \
      1, 1, "E", 0xbb49415ae7c6d5d2ULL, 1)                                                         \
    /* Mod of a huge a (1e150) is rounding noise that the softmax selects on, so every backend     \
     * (reference, JIT, folding) computes a - m*floor(q) with the same fma */                      \
    X(mod_fused, "Norm2(Mod(Var(0,5,1),Var(1,5,0),1000.0))", "Var(2,3,0)", SR_SUMSOFTMAXWEIGHT, 0, \
      1, SR_F64, SR_ACC_DEFAULT, 2, 32, "EUU", 0x5eaa3059d015e8fcULL, 1)                           \
    /* the fuzzer's comparison: the minmax-nonneg-factor rewrite Min_i 0 * g_i = 0 * Min_i g_i     \
     * drops the 0 * Inf = NaN term (documented); the comparison runs the reduction rewrite on     \
     * the reference too */                                                                        \
    X(minmax_zero_factor, "(0.0*(Var(0,8,0)|Var(1,8,1)))", "", SR_MIN, 0, 1, SR_F32,               \
      SR_ACC_DEFAULT, 2, 1, "EUU", 0xe0ac99b3d2e174f2ULL, 1)                                       \
    /* the fuzzer's comparison: Cos of Exp(13) is rounding noise that differs pair by pair, so     \
     * the JIT's K smallest are other pairs than the oracle's; selections are checked pair by      \
     * pair (each value within its own pair's rounding interval) */                                \
    X(kmin_pair_noise, "Cos(Exp((Var(0,24,0)|Var(1,24,1))))", "", SR_KMIN_ARGKMIN, 0, 4, SR_F32,   \
      SR_ACC_DEFAULT, 4, 78, "UG", 0x714fbf91c4f0aa1fULL, 1)                                       \
    /* the same noise as kmin_pair_noise, sharpened by 30, picked by LogSumExp and by              \
     * SumSoftMaxWeight: the comparison needs the pair-by-pair bounds there too */                 \
    X(lse_pair_noise, "(30.0*Cos(Exp((Var(0,24,0)|Var(1,24,1)))))", "", SR_LOGSUMEXP, 0, 1,        \
      SR_F32, SR_ACC_DEFAULT, 64, 625, "UG", 0x714fbf91c4f0aa1fULL, 1)                             \
    X(softmax_pair_noise, "(30.0*Cos(Exp((Var(0,24,0)|Var(1,24,1)))))", "Var(2,1,0)",              \
      SR_SUMSOFTMAXWEIGHT, 0, 1, SR_F32, SR_ACC_DEFAULT, 64, 625, "UGU", 0x714fbf91c4f0aa1fULL, 1) \
    /* a product that overflows when rounded alone (1e150 cubed) added to an infinity of the       \
     * other sign is NaN as in the reference, which an FMA would turn into that infinity: the      \
     * JIT compiles with -ffp-contract=off */                                                      \
    X(fma_overflow,                                                                                \
      "(SqDist(VecMatMult(WeightedSqDist(VecMatMult(Var(4,2,1),Var(3,4,0)),VecMatMult(Var(4,2,1)," \
      "Var(3,4,0)),Var(4,2,1)),Var(2,2,1)),Var(4,2,1))*(Var(0,24,0)|Var(1,24,1)))",                \
      "", SR_KMIN_ARGKMIN, 1, 1, SR_F64, SR_ACC_DEFAULT, 2, 17, "UUUUEUU", 0x92893e1dd46013d1ULL,  \
      1)                                                                                           \
    /* Min propagates NaN, so the gemm path must not rank Min_ArgMin's candidates again with NaN   \
     * last; only the K-min reductions are ranked (gemm.c) */                                      \
    X(min_nan_not_ranked,                                                                          \
      "(VecMatMult((-Var(2,2,0)),Square(Var(2,2,0)))*(Var(0,8,0)|Var(1,8,1)))", "", SR_MIN_ARGMIN, \
      0, 1, SR_F64, SR_ACC_BLOCK, 3, 1, "EUT", 0xf8d5a427093553c8ULL, 0)                           \
    /* the fuzzer's comparison: Cos of 3.8e-5 and of 1.1e-5 are both 1 in float32, so ArgMax       \
     * picks the first, the double oracle the second; the towards-zero run gives an ArgMax with    \
     * another component within sqrt(eps) of the extreme NaN (no defined value), and the K-min     \
     * pair-by-pair check lets a pair NaN in some runs be any value */                             \
    X(argmax_float32_tie, "ArgMax(Cos(Powf(Var(0,7,1),MatVecMult(Var(1,4,0),Var(1,4,0)))))", "",   \
      SR_KMIN_ARGKMIN, 0, 4, SR_F32, SR_ACC_DEFAULT, 7, 16, "PU", 0x53edaf8b939bc327ULL, 1)        \
    /* the fuzzer's comparison: Normalize of a scalar is +-1 up to rounding, and pow(1, NaN) = 1   \
     * where pow(1 + d, NaN) is NaN, pow(-x, -1) finite where pow(-x, -1 + d) is NaN; the          \
     * towards-zero perturbation snaps a base near 1 and an exponent near an integer, and the      \
     * K-min selections' pair-by-pair check takes NaN as +Inf and lets a pair whose class the      \
     * perturbed runs change lie anywhere between their values */                                  \
    X(powf_base_one, "Powf(Normalize((Var(0,3,0)|Var(1,3,1))),Elem(Log(Var(3,3,1)),2))", "",       \
      SR_ARGKMIN, 1, 3, SR_F32, SR_ACC_DEFAULT, 15, 3, "PTUU", 0xe6a5702a879951bfULL, 1)           \
    X(powf_integer_exponent, "Powf((Var(0,3,0)|Var(1,3,1)),Normalize((Var(0,3,0)|Var(1,3,1))))",   \
      "", SR_ARGKMIN, 1, 3, SR_F32, SR_ACC_DEFAULT, 1, 6, "UUUU", 0xe6a5702a879951bfULL, 1)        \
    /* the fuzzer's comparison: the JIT's Exp is 0 below 1.7e-38 (documented), the oracle's a      \
     * subnormal, and KMin's tolerance is relative; the towards-zero run flushes Exp as the JIT    \
     * does */                                                                                     \
    X(exp_flush, "Exp((Var(0,3,1)-Powf(Var(1,1,0),(Var(1,1,0)-2.0))))", "", SR_KMIN_ARGKMIN, 1, 2, \
      SR_F32, SR_ACC_DEFAULT, 48, 2, "UEU", 0x359caf58a3e71f5aULL, 1)                              \
    /* gcc may rewrite sin(atan(x)) and cos(atan(x)) into forms that a NaN x turns into -1 and 0;  \
     * the JIT calls libm's atan under another name so that NaN stays NaN */                       \
    X(atan_rewrite_sin, "Sin(Atan(Powf(RatCst(-1,2),0.001)))", "", SR_LOGSUMEXP, 0, 1, SR_F64,     \
      SR_ACC_DEFAULT, 1, 1, "", 0x44d65588b52b4ec1ULL, 1)                                          \
    /* the fuzzer's comparison: s v_k / Normalize(v)_k is s |v| for every k up to rounding, so     \
     * ArgMin's index is rounding noise (the same gap as argmax_float32_tie) */                    \
    X(argmin_rounding_tie, "ArgMin((-(VecMatMult(Var(3,1,1),Var(2,8,1))/Normalize(Var(2,8,1)))))", \
      "", SR_KMIN_ARGKMIN, 0, 1, SR_F32, SR_ACC_DEFAULT, 1, 1, "UUGPU", 0x58f1071be40a3ac9ULL, 1)  \
    X(atan_rewrite_cos, "Cos(Atan(Var(0,3,0)))", "", SR_MAX, 1, 1, SR_F32, SR_ACC_DEFAULT, 16, 1,  \
      "E", 0xe82d84a3283aa5f1ULL, 1)                                                               \
    /* the fuzzer's comparison: asin(sin(1)) is 1 in double, 0.99999994 in float32, and Less       \
     * tells; the float32 run rounds every node to 24 bits */                                      \
    X(f32_precision, "Less(Asin(Sin(Var(1,1,1))),Floor(Var(1,1,1)))", "", SR_KMIN, 0, 1, SR_F32,   \
      SR_ACC_DEFAULT, 1, 32, "UT", 0xb019b79f2ab9c7f6ULL, 1)                                       \
    /* the fuzzer's comparison: TensorDot's rounding bound is the sum of its terms' magnitudes,    \
     * as for the other sums of products */                                                        \
    X(tensordot_magnitude,                                                                         \
      "Square(TensorDot(IfElse(Elem(Var(1,2,1),1),Var(0,1,1),Var(2,3,0)),Var(2,3,0),[3,1],[3,1],[" \
      "0],[0]))",                                                                                  \
      "", SR_MIN, 0, 1, SR_F32, SR_ACC_DEFAULT, 257, 13, "UEGU", 0x686c12d108bbd1feULL, 1)         \
    /* WeightedSqNorm with a scalar weight is w * sum(a_k^2): w = +inf with a zero component is    \
     * +inf, where weighting each term would give NaN */                                           \
    X(weighted_scalar_order,                                                                       \
      "(Var(0,1,0)/"                                                                               \
      "WeightedSqNorm(WeightedSqDist(Var(0,1,0),Var(1,2,0),Var(2,2,0)),LessEq(Var(4,4,"            \
      "1),Var(5,4,1))))",                                                                          \
      "", SR_KMIN_ARGKMIN, 1, 1, SR_F32, SR_ACC_DEFAULT, 2, 2, "TEPPPUGEUT",                       \
      0xecdecd02df46c011ULL, 1)                                                                    \
    /* the fuzzer's comparison: an inner product of cancelling huge terms (1e150 and -1e150) has   \
     * no defined sign, so T / (x|y) may be +inf or -inf; a pair whose perturbed runs give an      \
     * infinity and a value of the other sign has a pole between them and may be either */         \
    X(pole_between_runs,                                                                           \
      "Pow(((Var(0,24,0)|Var(1,24,1))/"                                                            \
      "TensorDot(Var(2,2,1),Var(3,6,0),[1,2],[2,3],[1],[0],[1,0])),-1)",                           \
      "", SR_KMIN_ARGKMIN, 1, 3, SR_F64, SR_ACC_DEFAULT, 131, 131, "GEUU", 0x1493017dda1d529dULL,  \
      1)                                                                                           \
    /* the fuzzer's comparison: the CUDA backend declines a K-reduction whose K * dim exceeds its  \
     * register limit of 256 (a documented SR_ENOTSUP), which is not a failure of the case */      \
    X(cuda_declines_wide_kmin, "Var(0,255,0)", "", SR_ARGKMIN, 0, 2, SR_F32, SR_ACC_DEFAULT, 2, 1, \
      "U", 0x256cfc1829d49e47ULL, 1)                                                               \
    /* a wide Pow is one loop, not three statements per component (gcc ran past its two-minute     \
     * limit on them) */                                                                           \
    X(wide_pow_loop, "(Exp(Var(0,1100,0))*Pow(Var(0,1100,0),-2))", "", SR_ARGMAX, 0, 1, SR_F64,    \
      SR_ACC_BLOCK, 17, 1, "G", 0xbdaf4caabe5d0fa1ULL, 0)                                          \
    /* compact emission: big lazy nodes inlined into each of 1100 terms made 380 KB of C that gcc  \
     * did not compile within its limit; past 64 KB they are computed into arrays */               \
    X(compact_source,                                                                              \
      "TensorProd(Var(3,2,1),Less(MatVecMult((ComplexExp1j(ComplexReal(Var(1,550,0)))+"            \
      "ComplexAbs((Var(2,1100,1)*Var(2,1100,1)))),Var(0,1,0)),RatCst(1,5)))",                      \
      "", SR_ARGMAX, 1, 1, SR_F16, SR_ACC_DEFAULT, 3, 13, "GEPU", 0x7922a69128c291b3ULL, 0)        \
    /* the fuzzer's float32 oracle: ComplexAbs is sqrt(re^2 + im^2), which overflows where re^2    \
     * does (docs/semantics.md), so a finite double value may be inf in float32 */                 \
    X(complex_abs_overflow, "ComplexAbs(Pow(ComplexImag(Var(0,256,1)),-2))", "", SR_LOGSUMEXP, 0,  \
      1, SR_BF16, SR_ACC_DEFAULT, 1, 1, "E", 0xbdb650a6216e2770ULL, 1)

static struct fz_opts quiet_opts(void)
{
    struct fz_opts o = {NULL, 0, true, false, 30, false, false, NULL};
    return o;
}

static void init(void) { setenv("SYMRED_CACHE_DIR", "off", 1); }

TestSuite(fuzz, .init = init);

Test(fuzz, op_table_covered)
{
    char missing[1024] = "";
    for (int op = 0; op < OP_COUNT; op++) {
        const char *reason;
        enum fz_cover cv = fz_op_coverage(op, &reason);
        if (cv == FZ_MISSING) {
            strncat(missing, " ", sizeof missing - strlen(missing) - 1);
            strncat(missing, expr_ops[op].name, sizeof missing - strlen(missing) - 1);
        }
        if (cv == FZ_EXCLUDED)
            cr_expect(reason && reason[0], "op %s is excluded without a reason", expr_ops[op].name);
    }
    cr_assert_str_empty(missing,
                        "ops neither generated nor excluded (give each an op_gens entry or an "
                        "FZ_EXCLUDED_OPS line in tests/fuzz.c):%s",
                        missing);
}

static void count_ops(const sr_expr *e, long *used)
{
    size_t n = expr_toposort(e, NULL, 0);
    const sr_expr **order = malloc((n ? n : 1) * sizeof *order);
    cr_assert_not_null(order);
    expr_toposort(e, order, n);
    for (size_t t = 0; t < n; t++)
        used[order[t]->op]++;
    free(order);
}

/* The generator makes every op it claims to make, and every reduction, axis and dtype. */
Test(fuzz, generator_uses_every_op)
{
    long used[OP_COUNT] = {0}, reds[SR_REDUCTION_COUNT] = {0}, axes[2] = {0}, dts[4] = {0};
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    for (uint64_t i = 0; i < 1500; i++) {
        struct fz_case c;
        fz_case_draw(7, i, &c);
        sr_expr *f = NULL, *w = NULL;
        cr_assert_eq(sr_parse(ctx, c.formula, NULL, 0, &f), SR_OK, "case %llu: %s: %s",
                     (unsigned long long)i, c.formula, sr_ctx_error(ctx));
        count_ops(f, used);
        if (c.weight[0]) {
            cr_assert_eq(sr_parse(ctx, c.weight, NULL, 0, &w), SR_OK, "%s", sr_ctx_error(ctx));
            count_ops(w, used);
        }
        cr_assert_eq(!!c.weight[0], c.red == SR_SUMSOFTMAXWEIGHT);
        reds[c.red]++;
        axes[c.axis]++;
        dts[c.dtype]++;
    }
    sr_ctx_free(ctx);
    for (int op = 0; op < OP_COUNT; op++) {
        enum fz_cover cv = fz_op_coverage(op, NULL);
        if (cv != FZ_EXCLUDED && cv != FZ_MISSING)
            cr_expect_gt(used[op], 0, "op %s never generated in 1500 cases", expr_ops[op].name);
    }
    for (int r = 0; r < SR_REDUCTION_COUNT; r++)
        cr_expect_gt(reds[r], 0, "reduction %s never drawn", sr_reduction_name((sr_reduction)r));
    cr_expect(axes[0] > 0 && axes[1] > 0);
    for (int t = 0; t < 4; t++)
        cr_expect_gt(dts[t], 0, "dtype %d never drawn", t);
}

Test(fuzz, cases_are_reproducible)
{
    for (uint64_t i = 0; i < 50; i++) {
        struct fz_case a, b, c;
        fz_case_draw(99, i, &a);
        fz_case_draw(99, i, &b);
        fz_case_draw(100, i, &c);
        cr_assert(memcmp(&a, &b, sizeof a) == 0, "case %llu drawn twice differs",
                  (unsigned long long)i);
        cr_expect(strcmp(a.formula, c.formula) != 0 || a.input_seed != c.input_seed);
    }
}

/* A few cases of a fixed seed agree on every backend. */
Test(fuzz, fixed_seed_agrees, .timeout = 300)
{
    struct fz_opts o = quiet_opts();
    for (uint64_t i = 0; i < 12; i++) {
        struct fz_case c;
        fz_case_draw(20261123, i, &c);
        char why[2048];
        cr_expect(fz_case_run(&c, &o, NULL, why, sizeof why, NULL), "seed 20261123 case %llu: %s",
                  (unsigned long long)i, why);
    }
}

/* A wrong result (injected into the cpu-jit+simplifier run) is reported, naming the variant,
 * and shrinking keeps it failing with a smaller formula. */
Test(fuzz, wrong_result_reported_and_shrunk, .timeout = 300)
{
    struct fz_opts o = quiet_opts();
    o.inject = true;
    struct fz_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.formula, sizeof c.formula, "%s",
             "Exp(-SqDist(Var(0,3,0),Var(1,3,1)))*Var(2,1,1)+Sin((Var(0,3,0)|Var(1,3,1)))*2");
    c.red = SR_SUM;
    c.axis = 1;
    c.k = 1;
    c.dtype = SR_F32;
    c.nx = 13;
    c.ny = 31;
    snprintf(c.inputs, sizeof c.inputs, "UUE");
    c.input_seed = 5;
    c.threads = 2;
    char why[2048];
    int variant = -1;
    cr_assert_not(fz_case_run(&c, &o, NULL, why, sizeof why, &variant));
    cr_assert_eq(variant, FZ_JIT_SIMP, "%s", why);
    cr_assert(strstr(why, "cpu-jit+simplifier: value 0"), "%s", why);
    size_t before = strlen(c.formula);
    o.shrink_s = 120;
    cr_assert_gt(fz_case_shrink(&c, &o, variant), 0);
    cr_assert_lt(strlen(c.formula), before, "not shrunk: %s", c.formula);
    cr_assert_leq(c.nx, 3, "sizes not shrunk: %lld", (long long)c.nx);
    cr_assert_not(fz_case_run(&c, &o, NULL, why, sizeof why, NULL), "shrunk case passes: %s",
                  c.formula);
}

/* A selection that picks the pairs one rank too far (the smallest skipped), with F's values at
 * them, is reported for each selection reduction: on a formula whose values are well apart, and
 * on one whose values are rounding noise for some pairs (the pair-by-pair check must not excuse
 * the other pairs). */
Test(fuzz, wrong_selection_reported, .timeout = 300)
{
    static const sr_reduction reds[] = {SR_MIN,    SR_MAX,        SR_ARGMIN,
                                        SR_ARGMAX, SR_MIN_ARGMIN, SR_MAX_ARGMAX,
                                        SR_KMIN,   SR_ARGKMIN,    SR_KMIN_ARGKMIN};
    static const char *const formulas[] = {"SqDist(Var(0,3,0),Var(1,3,1))",
                                           "Cos(Exp((Var(0,24,0)|Var(1,24,1))))"};
    struct fz_opts o = quiet_opts();
    o.cuda = false;
    for (int f = 0; f < 2; f++)
        for (size_t r = 0; r < sizeof reds / sizeof *reds; r++) {
            struct fz_case c;
            memset(&c, 0, sizeof c);
            snprintf(c.formula, sizeof c.formula, "%s", formulas[f]);
            c.red = reds[r];
            c.k = sr_reductions[c.red].uses_k ? 3 : 1;
            c.dtype = SR_F32;
            c.nx = 13;
            c.ny = 78;
            snprintf(c.inputs, sizeof c.inputs, "UG");
            c.input_seed = 0x714fbf91c4f0aa1fULL;
            c.threads = 1;
            char why[2048];
            cr_expect(fz_case_run(&c, &o, NULL, why, sizeof why, NULL), "%s %s: %s", formulas[f],
                      sr_reduction_name(c.red), why);
            o.inject_selection = true;
            int variant = -1;
            cr_expect_not(fz_case_run(&c, &o, NULL, why, sizeof why, &variant),
                          "%s %s: a wrong selection passed", formulas[f], sr_reduction_name(c.red));
            cr_expect_eq(variant, FZ_JIT_SIMP, "%s", why);
            o.inject_selection = false;
        }
}

/* The softmax average's upper bound over a box of weights (the SumSoftMaxWeight check) equals
 * the largest average over the box's corners, found by trying them all, on random boxes. */
Test(fuzz, softmax_bound_is_the_best_corner)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int trial = 0; trial < 200; trial++) {
        enum { N = 7 };
        double g[N], wlo[N], whi[N];
        int64_t ord[N];
        for (int j = 0; j < N; j++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            g[j] = (double)(s >> 40) / (1 << 24) * 4 - 2;
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            wlo[j] = (double)(s >> 40) / (1 << 24);
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            whi[j] = wlo[j] + (double)(s >> 40) / (1 << 24) * 10;
            ord[j] = j;
        }
        for (int a = 1; a < N; a++) /* increasing g */
            for (int b = a; b > 0 && g[ord[b]] < g[ord[b - 1]]; b--) {
                int64_t t = ord[b];
                ord[b] = ord[b - 1];
                ord[b - 1] = t;
            }
        double best = -INFINITY;
        for (int m = 0; m < 1 << N; m++) {
            double num = 0, den = 0;
            for (int j = 0; j < N; j++) {
                double w = m >> j & 1 ? whi[j] : wlo[j];
                num += w * g[j];
                den += w;
            }
            best = fmax(best, num / den);
        }
        double top = fz_softmax_top(g, wlo, whi, ord, N);
        cr_expect(fabs(top - best) <= 1e-12 * (1 + fabs(best)), "trial %d: %.17g, corners %.17g",
                  trial, top, best);
    }
}

/* ---- the cases the fuzzer found ---------------------------------------------------------- */

#define FZ_REGRESS_TEST_(name, f, w, red_, axis_, k_, dt, acc_, nx_, ny_, in, seed, th)            \
    Test(fuzz_regress, name, .timeout = 120)                                                       \
    {                                                                                              \
        struct fz_case c;                                                                          \
        memset(&c, 0, sizeof c);                                                                   \
        snprintf(c.formula, sizeof c.formula, "%s", f);                                            \
        snprintf(c.weight, sizeof c.weight, "%s", w);                                              \
        c.red = red_;                                                                              \
        c.axis = axis_;                                                                            \
        c.k = k_;                                                                                  \
        c.dtype = dt;                                                                              \
        c.acc = acc_;                                                                              \
        c.nx = nx_;                                                                                \
        c.ny = ny_;                                                                                \
        snprintf(c.inputs, sizeof c.inputs, "%s", in);                                             \
        c.input_seed = seed;                                                                       \
        c.threads = th;                                                                            \
        struct fz_opts o = quiet_opts();                                                           \
        char why[2048];                                                                            \
        cr_assert(fz_case_run(&c, &o, NULL, why, sizeof why, NULL), "%s\n%s", f, why);             \
    }
FZ_REGRESSIONS(FZ_REGRESS_TEST_)

/* Kernel of case c on device dev (the simplifier on); NULL when it cannot be built (the test
 * fails there, naming the case). */
static sr_kernel *case_kernel(sr_ctx *ctx, const struct fz_case *c, sr_device dev)
{
    sr_expr *f = NULL, *w = NULL;
    cr_assert_eq(sr_parse(ctx, c->formula, NULL, 0, &f), SR_OK, "%s: %s", c->formula,
                 sr_ctx_error(ctx));
    if (c->weight[0])
        cr_assert_eq(sr_parse(ctx, c->weight, NULL, 0, &w), SR_OK, "%s: %s", c->weight,
                     sr_ctx_error(ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    d.reduction = c->red;
    d.axis = c->axis;
    d.k = c->k;
    d.dtype = c->dtype;
    d.acc = c->acc;
    d.weight = w;
    d.device = dev;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &d, &k);
    cr_assert_eq(st, SR_OK, "%s (weight %s, %s, axis %d): %s", c->formula, c->weight,
                 sr_reduction_name(c->red), c->axis, sr_ctx_error(ctx));
    return k;
}

/* A generated source is short enough to compile in seconds: wide nodes are loops, not
 * thousands of statements the C compiler would take minutes over. Frees b's text. */
static void source_bounded(struct expr_buf *b, const char *lang, uint64_t seed, uint64_t i,
                           const char *formula, size_t *longest)
{
    cr_assert_lt(b->len, (size_t)96 << 10, "seed %llu case %llu: %zu bytes of %s for %s",
                 (unsigned long long)seed, (unsigned long long)i, b->len, lang, formula);
    if (b->len > *longest)
        *longest = b->len;
    free(b->data);
}

/* Every formula the generator draws (wide F and weights among them) has generated code: the C
 * emitter and the CUDA emitter take the formula as given, and the CPU device plans it onto
 * generated code (direct, gemm-epilogue or fused), never the reference, when a compiler is
 * there. Emission is cheap and runs for every case; the full planning (which compiles) runs
 * for the cases in the emitter's loop mode, the ones that would have reached the reference. */
Test(fuzz, generator_never_plans_on_reference, .timeout = 600)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    struct fz_case c0 = {.formula = "Var(0,1,0)*Var(1,1,1)", .red = SR_SUM, .axis = 1, .k = 1};
    sr_kernel *k0 = case_kernel(ctx, &c0, SR_DEVICE_CPU);
    if (k0->backend == &cpu_reference_backend) {
        sr_kernel_free(k0);
        sr_ctx_free(ctx);
        cr_skip_test("no C compiler here: the reference backend is the CPU's by design");
    }
    sr_kernel_free(k0);
    static const uint64_t seeds[] = {7, 5150, 20261123, 32333674410788ULL, 229361605088541ULL};
    size_t longest = 0;
    int wide = 0, planned = 0;
    for (size_t si = 0; si < sizeof seeds / sizeof *seeds; si++)
        for (uint64_t i = 0; i < 400; i++) {
            struct fz_case c;
            fz_case_draw(seeds[si], i, &c);
            sr_kernel *k = case_kernel(ctx, &c, SR_DEVICE_REFERENCE);
            wide += k->out_dim > 16;
            struct expr_buf b = {0};
            struct jit_plan plan = {0};
            sr_status st = jit_emit_c(k, JIT_ACC_BLOCK, &b, &plan);
            cr_assert_eq(st, SR_OK, "seed %llu case %llu: C emitter status %d for %s",
                         (unsigned long long)seeds[si], (unsigned long long)i, st, c.formula);
            source_bounded(&b, "C", seeds[si], i, c.formula, &longest);
            b = (struct expr_buf){0};
            struct cuda_plan cp;
            st = jit_emit_cuda(k, JIT_ACC_BLOCK, &b, &cp);
            bool kred = sr_reductions[c.red].uses_k && (int64_t)k->k * k->fdim > 256;
            cr_assert(st == SR_OK || (kred && st == SR_ENOTSUP),
                      "seed %llu case %llu: CUDA emitter status %d for %s",
                      (unsigned long long)seeds[si], (unsigned long long)i, st, c.formula);
            source_bounded(&b, "CUDA", seeds[si], i, c.formula, &longest);
            sr_kernel_free(k);
            if (!plan.loops || planned >= 40)
                continue;
            planned++;
            k = case_kernel(ctx, &c, SR_DEVICE_CPU);
            cr_assert(k->backend != &cpu_reference_backend && !k->fallback_why,
                      "seed %llu case %llu planned on %s (%s): %s", (unsigned long long)seeds[si],
                      (unsigned long long)i, k->backend->name,
                      k->fallback_why ? k->fallback_why : "", c.formula);
            sr_kernel_free(k);
        }
    /* The generator does draw what this is about. */
    cr_expect_gt(wide, 40, "only %d wide cases drawn", wide);
    cr_expect_gt(planned, 10, "only %d cases in loop mode", planned);
    cr_log_info("longest generated source: %zu bytes", longest);
    sr_ctx_free(ctx);
}
