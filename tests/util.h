/* util.h — helpers shared by the Criterion tests. */
#ifndef SYMRED_TEST_UTIL_H
#define SYMRED_TEST_UTIL_H

#include "symred.h"

#include <stdbool.h>
#include <stdint.h>

/* The kernel cache of the tests that set SYMRED_CACHE_DIR to it: $SYMRED_TEST_CACHE_DIR, else
 * symred-tests beside symred's default cache ($XDG_CACHE_HOME/symred-tests or
 * $HOME/.cache/symred-tests), else jit-test-cache in the working directory. Outside the build
 * folder, so that every build folder and checkout of the user finds the kernels compiled before
 * (a kernel's object is keyed by its source and the compiler's options alone). */
const char *tu_jit_cache(void);
/* Deterministic xorshift generator: tests are reproducible. */
uint64_t tu_rand(uint64_t *state);
/* Uniform in [lo, hi). */
double tu_uniform(uint64_t *state, double lo, double hi);
/* Fills n values (float or double by dtype) uniformly in [lo, hi). */
void tu_fill(void *buf, sr_dtype dtype, int64_t n, double lo, double hi, uint64_t *state);
/* Element at of an array of dtype (float or double): read as a double, or set to v. */
double tu_get(const void *buf, sr_dtype dtype, int64_t at);
void tu_set(void *buf, sr_dtype dtype, int64_t at, double v);
/* |a - b| <= atol + rtol*|b|, with NaN == NaN and equal infinities equal. */
int tu_close(double a, double b, double rtol, double atol);
/* Whether BLIS can be loaded for the gemm strategies (and BLIS_ARCH_TYPE does not force a
 * sub-configuration); symred's AVX-512 gemm is the other (cpu_avx512_usable). */
bool tu_blis_usable(void);
/* The plan of kernel k (sr_kernel_plan). When the call fails, strategy and inner are -1 and the
 * strings say so, so that every check on the plan fails with a readable message. */
sr_plan_info tu_plan(const sr_kernel *k);
/* Whether the CPU JIT's generated code does k's pair work (the plan's backend is "cpu-jit"):
 * false where no C compiler can be run and the tile interpreter serves a CPU kernel. */
bool tu_runs_jit(const sr_kernel *k);
/* Whether k's pair work runs a fused two-product (sr_plan_info.inner: the kernel's own strategy,
 * or its inner kernel's for a reduction rewrite or a sum split): SR_STRATEGY_FUSED or its
 * symmetric driver. */
bool tu_runs_fused(const sr_kernel *k);
/* The formula k runs (sr_plan_info.formula: the simplified one), printed into buf; "" when the
 * plan names none. */
const char *tu_formula(const sr_kernel *k, char *buf, size_t cap);
/* The name of k's strategy, for messages. */
const char *tu_strategy_name(const sr_kernel *k);

#endif
