/*
 * fuzz-diff.c — the differential fuzzer's command line (docs/fuzzing.md).
 *
 *   fuzz-diff [--seed S] [--cases N | --minutes M | --seconds T] [--case C] [--shard I/M]
 *             [--no-cuda] [--no-shrink] [--shrink-seconds T] [--max-failures F] [--verbose]
 *             [--coverage] [--variant NAME]
 *
 * Runs cases 0, 1, 2, ... of seed S (a fresh seed, printed, when none is given) until N cases
 * or the time limit; --case C runs only case C of seed S (what a failure says to reproduce).
 * --shard I/M runs only the cases whose number is I modulo M (0 <= I < M): M processes with the
 * same seed and shards 0/M ... M-1/M run the N cases of one process between them, each case
 * drawn from the seed and its number alone.
 * Each failing case is shrunk and printed as an X(...) line for tests/test-fuzz-regress.c.
 * --variant NAME runs only that variant against the oracle (e.g. tile-interpreter: many cases a
 * second, no compiler).
 * Exit status: 0 when every case agreed, 1 when some failed, 2 on a usage error or when the
 * op table has ops the generator neither makes nor excludes (--coverage checks only that).
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/cuda.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr, "usage: fuzz-diff [--seed S] [--cases N | --minutes M | --seconds T] "
                    "[--case C] [--shard I/M] [--no-cuda] [--no-shrink] [--shrink-seconds T] "
                    "[--max-failures F] [--verbose] [--coverage] [--variant NAME]\n");
}

static const char *const dtype_tags[] = {"f32", "f64", "f16", "bf16"};

int main(int argc, char **argv)
{
    uint64_t seed = 0;
    bool have_seed = false, coverage_only = false;
    long ncases = 0, one_case = -1, max_failures = 5, shard = 0, nshards = 1;
    double seconds = 0;
    struct fz_opts o = {stdout, 0, true, true, 120, false, false, NULL};
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(s, "--seed") && v) {
            seed = strtoull(v, NULL, 0);
            have_seed = true;
            a++;
        } else if (!strcmp(s, "--cases") && v) {
            ncases = atol(v);
            a++;
        } else if (!strcmp(s, "--case") && v) {
            one_case = atol(v);
            a++;
        } else if (!strcmp(s, "--shard") && v) {
            char *end;
            shard = strtol(v, &end, 10);
            nshards = *end == '/' ? strtol(end + 1, &end, 10) : 0;
            if (*end || nshards < 1 || shard < 0 || shard >= nshards) {
                usage();
                return 2;
            }
            a++;
        } else if (!strcmp(s, "--minutes") && v) {
            seconds = 60 * atof(v);
            a++;
        } else if (!strcmp(s, "--seconds") && v) {
            seconds = atof(v);
            a++;
        } else if (!strcmp(s, "--shrink-seconds") && v) {
            o.shrink_s = atof(v);
            a++;
        } else if (!strcmp(s, "--max-failures") && v) {
            max_failures = atol(v);
            a++;
        } else if (!strcmp(s, "--variant") && v) {
            bool known = false;
            for (int i = 0; i < FZ_NVARIANTS; i++)
                known |= strcmp(v, fz_variant_names[i]) == 0;
            if (!known) {
                usage();
                return 2;
            }
            o.variant = v;
            a++;
        } else if (!strcmp(s, "--no-cuda")) {
            o.cuda = false;
        } else if (!strcmp(s, "--no-shrink")) {
            o.shrink = false;
        } else if (!strcmp(s, "--verbose")) {
            o.verbose = 1;
        } else if (!strcmp(s, "--coverage")) {
            coverage_only = true;
        } else {
            usage();
            return 2;
        }
    }
    int missing = fz_print_coverage(stdout);
    if (coverage_only || missing)
        return missing ? 2 : 0;
    if (!have_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        seed &= 0xffffffffffffULL; /* short enough to paste */
    }
    if (ncases <= 0 && seconds <= 0 && one_case < 0)
        ncases = 100;
    /* Kernels of random formulas are not worth keeping: no disk cache unless asked for. */
    setenv("SYMRED_CACHE_DIR", getenv("FUZZ_CACHE_DIR") ? getenv("FUZZ_CACHE_DIR") : "off", 1);
    const struct nvrtc_api *nv;
    const char *why_nv;
    if (!o.cuda)
        printf("fuzz-diff: CUDA: off (--no-cuda)\n");
    else if (jit_nvrtc_get(&nv, &why_nv) != SR_OK)
        printf("fuzz-diff: CUDA: libnvrtc not found, the CUDA emitter is not checked: %s\n",
               why_nv);
    else if (!jit_cuda_available())
        printf("fuzz-diff: CUDA: NVRTC %d.%d (%s) compiles every case's CUDA source; no GPU, so "
               "no CUDA run\n",
               nv->major, nv->minor, nv->path);
    else
        printf("fuzz-diff: CUDA: NVRTC %d.%d compiles and a GPU runs every case\n", nv->major,
               nv->minor);
    printf("fuzz-diff: seed %llu (reproduce: fuzz-diff --seed %llu --cases N)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    if (nshards > 1)
        printf("fuzz-diff: shard %ld/%ld: cases %ld, %ld, ...\n", shard, nshards, shard,
               shard + nshards);
    fflush(stdout);

    struct fz_stats st;
    memset(&st, 0, sizeof st);
    double t0 = now_s();
    long first = one_case >= 0 ? one_case : shard, last = one_case >= 0 ? one_case + 1 : ncases;
    long step = one_case >= 0 ? 1 : nshards;
    for (long i = first; (last <= 0 || i < last) && (seconds <= 0 || now_s() - t0 < seconds);
         i += step) {
        struct fz_case c;
        fz_case_draw(seed, (uint64_t)i, &c);
        char why[2048];
        int variant = -1;
        double tc = now_s();
        bool ok = fz_case_run(&c, &o, &st, why, sizeof why, &variant);
        if (o.verbose || one_case >= 0)
            printf("case %ld: %s %s axis %d k %d %s %lldx%lld: %s (%.2f s)\n  %s%s%s\n", i,
                   sr_reduction_name(c.red), dtype_tags[c.dtype], c.axis, c.k, c.inputs,
                   (long long)c.nx, (long long)c.ny, ok ? "ok" : "FAIL", now_s() - tc, c.formula,
                   c.weight[0] ? "  weight " : "", c.weight);
        if (!ok) {
            printf("FAIL seed %llu case %ld: %s\n  reproduce: fuzz-diff --seed %llu --case %ld\n  "
                   "formula: %s\n  weight: %s\n  ",
                   (unsigned long long)seed, i, why, (unsigned long long)seed, i, c.formula,
                   c.weight[0] ? c.weight : "-");
            fz_case_print(stdout, &c);
            if (o.shrink && variant >= 0) {
                int steps = fz_case_shrink(&c, &o, variant);
                char why2[2048];
                fz_case_run(&c, &o, NULL, why2, sizeof why2, NULL);
                printf("  shrunk in %d steps (%s): %s\n  minimal: %s%s%s\n  ", steps,
                       fz_variant_names[variant], why2, c.formula, c.weight[0] ? "  weight " : "",
                       c.weight);
                fz_case_print(stdout, &c);
            }
            if (st.failed >= max_failures) {
                printf("fuzz-diff: stopping after %ld failures\n", st.failed);
                break;
            }
        }
        fflush(stdout);
    }
    double el = now_s() - t0;
    printf("fuzz-diff: seed %llu: %ld cases in %.1f s (%.1f cases/s), %ld failed, %ld skipped\n",
           (unsigned long long)seed, st.cases, el, el > 0 ? (double)st.cases / el : 0.0, st.failed,
           st.skipped);
    printf("fuzz-diff: runs per variant:");
    for (int v = 0; v < FZ_NVARIANTS; v++)
        printf(" %s %ld%s", fz_variant_names[v], st.variants[v], v + 1 < FZ_NVARIANTS ? "," : "");
    printf("\nfuzz-diff: gemm-epilogue kernels %ld; JIT kernels handed to the reference (no C "
           "compiler) %ld; CUDA emitter declined (K-reduction state or tile columns too large) "
           "%ld; outputs "
           "compared %ld, of which unstable under perturbation %ld, accepted pair by pair only "
           "%ld\n",
           st.gemm_shaped, st.jit_fallback, st.cuda_enotsup, st.outputs, st.unstable_outputs,
           st.pairwise);
    printf("fuzz-diff: cases using each op:");
    for (int op = 0; op < OP_COUNT; op++)
        printf(" %s %ld", expr_ops[op].name, st.op_used[op]);
    printf("\n");
    return st.failed ? 1 : 0;
}
