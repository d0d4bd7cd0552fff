#!/usr/bin/env bash
# test.sh — builds symred and runs every test: what CI runs (.ci/run).
#
# Steps: install missing Debian packages; the cached virtual environment of scripts/pyenv.sh
# (PyTorch 2.x, jax, GPyTorch, pykeops from PyPI); a warnings-as-errors build in build-ci/ and ctest
# there (the NVRTC compile checks, the CUDA emulator's sweeps, the examples checked against brute
# force, the install test); a build with AddressSanitizer and UndefinedBehaviorSanitizer in
# build-asan/ and ctest there (every other entry: unit tests, the CUDA emulator's other entries,
# MPI, the examples and the install test again); clang-format on the C sources; the Python tests
# when bindings/python/tests exists, in that environment (PyTorch 2.x, symred.jax,
# symred.gpytorch) and the files that use torch again with Debian's python3 (torch 1.13), and
# pykeops 2.3's own test suite against symred (scripts/pykeops-suite.sh); the binary wheel
# installed with pip alone into a fresh environment and run without a C compiler
# (scripts/test-wheel.sh); 150 cases of differential
# fuzzing with a seed fresh for each commit (printed) and 30 s of libFuzzer on the parser (scripts/fuzz.sh); a
# ThreadSanitizer build (clang) in build-tsan/ running the tests that share kernels between
# threads (docs/fuzzing.md). Every step runs even after a failure. The closing summary gives each
# step's outcome, wall time and count of test cases run, and the total, also written to
# $SYMRED_TEST_TIMES (default test-times.tsv beside the build folders); the last line says how
# many steps passed and failed. Exit status 0 only if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
# The build folders are build-ci/ and build-asan/, under SYMRED_BUILD_ROOT if set.
root=${SYMRED_BUILD_ROOT:-.}
ci_dir=$root/build-ci
asan_dir=$root/build-asan
tsan_dir=$root/build-tsan
passed=()
failed=()
# Each step's name, outcome, wall time and count of test cases, for the closing summary and for
# the times file (tab-separated: step, outcome, seconds, cases).
times_file=${SYMRED_TEST_TIMES:-$root/test-times.tsv}
step_names=()
step_results=()
step_secs=()
step_cases=()
step_logs=$(mktemp -d "${TMPDIR:-/tmp}/symred-test.XXXXXX")
trap 'rm -rf "$step_logs"' EXIT
t_start=$SECONDS

# step NAME COMMAND...: runs the command and records the outcome, the wall time and the number of
# test cases it ran under NAME. A command reports its cases by printing `test.sh: cases: N`.
step() {
    local name=$1 n=${#step_names[@]} t0=$SECONDS result=passed
    shift
    local log=$step_logs/$n.log
    echo
    echo "==== test.sh: $name"
    # The output goes to the terminal and to the log through tee, opened by exec so that its
    # process id is known ($! is not set by a process substitution on an external command's
    # redirection) and the log is whole before it is read; the command runs in this shell, so
    # what it sets (python_env's variables) stays set.
    local out tee_pid
    exec {out}> >(tee "$log")
    tee_pid=$!
    if "$@" >&"$out" 2>&1; then
        passed+=("$name")
    else
        result=FAILED
        failed+=("$name")
    fi
    exec {out}>&-
    wait "$tee_pid"
    local secs=$((SECONDS - t0))
    echo "==== test.sh: $name $result in $secs s"
    step_names+=("$name")
    step_results+=("$result")
    step_secs+=("$secs")
    step_cases+=("$(count_cases "$log")")
}

# count_cases LOG: the test cases a step's output shows it ran (skipped ones not counted): ctest's
# (run_ctest prints them), pytest's closing line (the pykeops suite's too), fuzz-diff's cases,
# and the ThreadSanitizer test's.
count_cases() {
    awk '/^test\.sh: cases: [0-9]+/ { n += $3 }
         /^(=+ )?[0-9]+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)(,| in )/ {
             line = $0; sub(/ in [0-9.]+s.*/, "", line); sub(/^=+ /, "", line)
             k = split(line, parts, /, /)
             for (i = 1; i <= k; i++) {
                 split(parts[i], w, " ")
                 if (w[2] ~ /^(passed|failed|errors?|xfailed|xpassed)$/) n += w[1]
             }
         }
         /^fuzz-diff: seed [0-9]+: [0-9]+ cases in / { n += $4 }
         /^[0-9]+ tests, [0-9]+ failures$/ { n += $1 }
         END { print n + 0 }' "$1"
}

# summary: each step's outcome, time and cases, the total, on stdout and in $times_file.
summary() {
    local total=$((SECONDS - t_start)) cases=0 i
    {
        printf 'step\tresult\tseconds\tcases\n'
        for i in "${!step_names[@]}"; do
            printf '%s\t%s\t%s\t%s\n' "${step_names[i]}" "${step_results[i]}" "${step_secs[i]}" \
                "${step_cases[i]}"
            cases=$((cases + step_cases[i]))
        done
        printf 'total\t%s\t%s\t%s\n' "$([ "${#failed[@]}" -eq 0 ] && echo passed || echo FAILED)" \
            "$total" "$cases"
    } >"$times_file.tmp" && mv "$times_file.tmp" "$times_file"
    echo
    echo "test.sh: time per step (also in $times_file)"
    awk -F '\t' 'NR > 1 { printf "  %-52s %-7s %6s s %7s cases\n", $1, $2, $3, $4 }' "$times_file"
}

build() { # build DIR CMAKE-OPTIONS...
    local dir=$1
    shift
    cmake -S . -B "$dir" -DSYMRED_WERROR=ON "$@" && cmake --build "$dir" -j "$jobs"
}

run_ctest() { # run_ctest DIR [CTEST-OPTIONS...]: needs the build of DIR to have succeeded
    if [ ! -f "$1/.build-ok" ]; then
        echo "test.sh: $1 did not build, so its tests cannot run"
        return 1
    fi
    local rc=0
    (cd "$1" && ctest --output-on-failure -j "$jobs" "${@:2}") || rc=$?
    ctest_cases "$1/Testing/Temporary/LastTest.log"
    return "$rc"
}

# ctest_cases LOG: prints the test cases that ctest's log shows: the cases of each Criterion
# executable (its "Synthesis: Tested: N" line), one for every other entry.
ctest_cases() {
    [ -f "$1" ] || return 0
    awk '/^[0-9]+\/[0-9]+ Testing: / { if (entry) n += tested ? tested : 1; entry = 1; tested = 0 }
         /Synthesis: Tested: [0-9]+/ { sub(/.*Synthesis: Tested: /, ""); tested += $1 + 0 }
         END { if (entry) n += tested ? tested : 1; print "test.sh: cases: " n + 0 }' "$1"
}

build_and_mark() { # build, then leave a mark that run_ctest looks for
    local dir=$1
    rm -f "$dir/.build-ok"
    build "$@" && touch "$dir/.build-ok"
}

format_check() {
    local files
    mapfile -t files < <(find include src mpi tests examples -name '*.[ch]' | sort)
    echo "clang-format --dry-run -Werror on ${#files[@]} files"
    clang-format --dry-run -Werror "${files[@]}"
}

# python_tests PYTHON [FILE...]: the Python tests (all of them, or the files named) under PYTHON.
python_tests() {
    local dir=bindings/python/tests python=$1
    shift
    local ntests
    ntests=$(find "$dir" -name 'test_*.py' -o -name '*_test.py' | wc -l)
    # The bindings find the library built above.
    SYMRED_LIB="$(cd "$ci_dir" && pwd)/libsymred.so" "$python" -m pytest -q "${@:-$dir}"
    local rc=$?
    if [ "$rc" -eq 5 ] && [ "$ntests" -eq 0 ]; then
        echo "test.sh: $dir has no test files yet"
        return 0
    fi
    return "$rc"
}

# Under Debian's python3 with its PyTorch 1.13, the test files that mention torch (PyTorch): the
# virtual environment runs every file with the same Python and NumPy (it sees Debian's packages)
# and PyTorch 2.x, so only what touches torch can behave differently under 1.13.
python_tests_debian() {
    local files
    mapfile -t files < <(grep -li torch bindings/python/tests/test_*.py)
    echo "test.sh: the ${#files[@]} test files that mention torch, with PyTorch 1.13"
    python_tests /usr/bin/python3 "${files[@]}"
}

# The cached virtual environment (PyTorch 2.x, jax, GPyTorch, pykeops from PyPI), created by
# scripts/pyenv.sh when missing, before the builds: CMake builds symred.jax's FFI library
# (libsymred_xla) when $SYMRED_PYTHON imports jax.
pyenv_dir=""
python_env() { pyenv_dir=$(./scripts/pyenv.sh) && export SYMRED_PYTHON="$pyenv_dir/bin/python"; }

# The same Python tests under the environment's python.
python_tests_venv() {
    if [ -z "$pyenv_dir" ]; then
        echo "test.sh: the virtual environment could not be made (step 'python environment')"
        return 1
    fi
    python_tests "$pyenv_dir/bin/python"
}

# pykeops 2.3's own test suite against symred (scripts/pykeops-suite.sh: which tests may fail).
pykeops_suite() { ./scripts/pykeops-suite.sh "$(cd "$ci_dir" && pwd)/libsymred.so"; }

# Random formulas through every backend, using the fuzz-diff of build-ci/. The seed is fresh for
# every commit and the same for every run of one commit: it is the commit's hash (printed by
# fuzz-diff), so CI runs exactly the cases that ran here before the commit was submitted, and a
# failure reproduces with the seed from the log. A fixed number of cases (SYMRED_FUZZ_CASES,
# default 150), not a time, so a faster machine runs the same cases; fuzz.sh spreads them over
# one fuzz-diff process per CPU (fuzz-diff --shard). SYMRED_FUZZ_SEED overrides the seed, and
# outside a git checkout fuzz.sh draws one.
fuzz_diff() {
    if [ ! -f "$ci_dir/.build-ok" ]; then
        echo "test.sh: $ci_dir did not build, so fuzz-diff cannot run"
        return 1
    fi
    local seed=${SYMRED_FUZZ_SEED:-} head
    if [ -z "$seed" ] && head=$(git rev-parse --short=12 HEAD 2>/dev/null); then
        seed=$((16#$head))
    fi
    ./scripts/fuzz.sh --no-parse --cases "${SYMRED_FUZZ_CASES:-150}" ${seed:+--seed "$seed"} \
        --diff-build "$ci_dir"
}

fuzz_parse() { ./scripts/fuzz.sh --no-diff --parse-seconds "${SYMRED_FUZZ_PARSE_SECONDS:-30}"; }

# ThreadSanitizer with clang and LLVM's OpenMP runtime (libomp): libgomp is not instrumented and
# its barriers are invisible to TSan, which then reports races between OpenMP threads that cannot
# happen. Archer (libarcher.so, shipped with libomp) tells TSan about OpenMP's synchronisation,
# and ignore_noninstrumented_modules drops the reports from inside libomp itself. The generated
# kernels are compiled by cc at run time without instrumentation: TSan checks the library around
# them. Only tsan-threads is built: test-threads.c without Criterion (tests/mini-criterion.h).
tsan_build() {
    rm -f "$tsan_dir/.build-ok"
    CC=clang cmake -S . -B "$tsan_dir" -DSYMRED_WERROR=ON -DSYMRED_TSAN=ON \
        -DSYMRED_BUILD_EXAMPLES=OFF -DSYMRED_MPI=OFF &&
        cmake --build "$tsan_dir" -j "$jobs" --target tsan-threads && touch "$tsan_dir/.build-ok"
}

tsan_run() {
    if [ ! -f "$tsan_dir/.build-ok" ]; then
        echo "test.sh: $tsan_dir did not build, so its tests cannot run"
        return 1
    fi
    local omp archer=""
    omp=$(ldd "$tsan_dir/tests/tsan-threads" | awk '/libomp/ {print $3; exit}')
    if [ -n "$omp" ] && [ -f "$(dirname "$(readlink -f "$omp")")/libarcher.so" ]; then
        archer="$(dirname "$(readlink -f "$omp")")/libarcher.so"
    fi
    echo "tsan: OpenMP runtime ${omp:-none}, archer ${archer:-not found}"
    OMP_TOOL_LIBRARIES=$archer SYMRED_CACHE_DIR=off \
        TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 second_deadlock_stack=1" \
        "$tsan_dir/tests/tsan-threads"
}

step "deps" ./scripts/deps.sh
step "python environment (scripts/pyenv.sh)" python_env
step "build (warnings as errors)" build_and_mark "$ci_dir"
# Every ctest entry runs once, in one of the two builds. Here: the NVRTC compile checks (libnvrtc
# is not instrumented, and is slower under ASan's allocator) and the CUDA emulator's sweeps over
# every reduction, dtype and fused width (label cuda-emu-sweep: the same launch path with other
# kernels); the examples and the install test run in both, here as the library is shipped. Every
# other entry runs under the sanitizers below: the C unit tests, the CUDA runtime's device
# pointers, split-j, ranges, budget and out-of-memory cases, the threads, MPI and the layering.
step "ctest (NVRTC, CUDA emulator sweeps, examples, install)" run_ctest "$ci_dir" \
    -L '^(nvrtc|cuda-emu-sweep|examples|install)$'
# Leak checking needs ptrace, which some containers forbid; ASAN_OPTIONS from the caller wins.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
step "build (ASan + UBSan)" build_and_mark "$asan_dir" -DSYMRED_ASAN=ON -DSYMRED_UBSAN=ON
step "ctest (ASan + UBSan: the other entries)" run_ctest "$asan_dir" -LE '^(nvrtc|cuda-emu-sweep)$'
step "clang-format" format_check
if [ -d bindings/python/tests ]; then
    step "python tests (PyTorch 2.x, jax, GPyTorch)" python_tests_venv
    step "python tests that use torch (Debian: PyTorch 1.13)" python_tests_debian
    step "pykeops 2.3 test suite" pykeops_suite
    step "python wheel without a C compiler (test-wheel.sh)" ./scripts/test-wheel.sh
fi
step "fuzz: differential (${SYMRED_FUZZ_CASES:-150} cases)" fuzz_diff
step "fuzz: libFuzzer parser (${SYMRED_FUZZ_PARSE_SECONDS:-30} s)" fuzz_parse
step "build (ThreadSanitizer)" tsan_build
step "ThreadSanitizer: threads sharing kernels" tsan_run

summary
echo
if [ "${#failed[@]}" -eq 0 ]; then
    echo "test.sh: ALL PASSED (${passed[*]})"
else
    (IFS=,; echo "test.sh: FAILED:${failed[*]/#/ }")
fi
echo "steps: ${#passed[@]} passed, ${#failed[@]} failed"
[ "${#failed[@]}" -eq 0 ]
