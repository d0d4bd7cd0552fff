/* fma-peak.h — the FMA-peak yardstick of the benchmarks (fma-peak.c). Not part of the library. */
#ifndef SYMRED_BENCH_FMA_PEAK_H
#define SYMRED_BENCH_FMA_PEAK_H

/* float32 GFLOP/s of independent FMA chains on all OpenMP threads, run for about `seconds`;
 * *width gets the vector width used (512 with AVX-512F, else 256). */
double bench_fma_peak(double seconds, int *width);

#endif
