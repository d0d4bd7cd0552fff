/* fma-peak.h — the FMA-peak yardstick of the benchmarks (fma-peak.c). Not part of the library. */
#ifndef SYMRED_BENCH_FMA_PEAK_H
#define SYMRED_BENCH_FMA_PEAK_H

/* float32 GFLOP/s of independent FMA chains on all OpenMP threads, run for about `seconds`;
 * *width gets the vector width used (512 with AVX-512F, else 256); *per_cpu_s (if not NULL) the
 * GFLOP per second of the process's CPU time (the rate of one core while it runs: what other
 * processes take from the wall-clock rate does not count). */
double bench_fma_peak(double seconds, int *width, double *per_cpu_s);

/* Seconds of CPU time used by the whole process (all its threads). */
double bench_cpu_now(void);

#endif
