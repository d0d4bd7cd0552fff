/* util.h — helpers shared by the Criterion tests. */
#ifndef SYMRED_TEST_UTIL_H
#define SYMRED_TEST_UTIL_H

#include "symred.h"

#include <stdbool.h>
#include <stdint.h>

/* Deterministic xorshift generator: tests are reproducible. */
uint64_t tu_rand(uint64_t *state);
/* Uniform in [lo, hi). */
double tu_uniform(uint64_t *state, double lo, double hi);
/* Fills n values (float or double by dtype) uniformly in [lo, hi). */
void tu_fill(void *buf, sr_dtype dtype, int64_t n, double lo, double hi, uint64_t *state);
/* |a - b| <= atol + rtol*|b|, with NaN == NaN and equal infinities equal. */
int tu_close(double a, double b, double rtol, double atol);
/* Whether BLIS can be loaded for the gemm strategies (and BLIS_ARCH_TYPE does not force a
 * sub-configuration); symred's AVX-512 gemm is the other (cpu_avx512_usable). */
bool tu_blis_usable(void);

#endif
