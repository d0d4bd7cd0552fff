#!/usr/bin/env bash
# test.sh — builds symred and runs every test: what CI runs (.ci/run).
#
# Steps: install missing Debian packages; the cached virtual environment of scripts/pyenv.sh
# (PyTorch 2.x, jax, GPyTorch, pykeops from PyPI); a warnings-as-errors build in build-ci/. Then
# two lanes side by side, one per CPU of the 2-vCPU machine. The background lane: the Python tests
# when bindings/python/tests exists, in that environment (PyTorch 2.x, symred.jax,
# symred.gpytorch), the files that use torch again with Debian's python3 (torch 1.13), pykeops
# 2.3's own test suite against symred (scripts/pykeops-suite.sh), the binary wheel installed with
# pip alone into a fresh environment and run without a C compiler (scripts/test-wheel.sh); then
# 150 cases of differential fuzzing with a seed fresh for each commit (printed) and 30 s of
# libFuzzer on the parser (scripts/fuzz.sh). The foreground: ctest in build-ci/ (the NVRTC compile
# checks, the CUDA emulator's and exp's sweeps, the examples checked against brute force, the
# install test, fork and exit while compiling); a build with AddressSanitizer and
# UndefinedBehaviorSanitizer in build-asan/ and ctest there (every other entry: unit tests, the
# CUDA emulator's other entries, MPI, the examples, the install test and fork and exit again);
# clang-format on the C sources; a ThreadSanitizer build (clang) in build-tsan/ running the tests
# that share kernels between threads (docs/fuzzing.md). The background lane's output is printed
# whole when it is joined, after the foreground's. Every step runs even after a failure. The
# closing summary gives each step's start, outcome, wall time, CPU time and count of test cases
# run, and the totals, also written to $SYMRED_TEST_TIMES (default test-times.tsv beside the build
# folders); the last line says how many steps passed and failed. Exit status 0 only if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
# ctest runs two test programs at once and each runs its kernels on as many OpenMP threads as
# there are CPUs, and the two lanes below run side by side: more threads than CPUs. libgomp's
# default lets a thread that waits at a barrier spin for a while, burning the CPU that the
# thread it waits for needs. Passive waiting sleeps at once: the same results, and the C tests'
# entries take about 30 % less CPU and wall time at ctest -j2. The caller's setting wins.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The build folders are build-ci/ and build-asan/, under SYMRED_BUILD_ROOT if set.
root=${SYMRED_BUILD_ROOT:-.}
ci_dir=$root/build-ci
asan_dir=$root/build-asan
tsan_dir=$root/build-tsan
# Each finished step appends one line to $records: its start (seconds into the run), name,
# outcome, wall time, CPU time and count of test cases, tab-separated. A step that runs in the
# background lane (lane_start) writes there too, from its subshell.
step_logs=$(mktemp -d "${TMPDIR:-/tmp}/symred-test.XXXXXX")
trap 'rm -rf "$step_logs"' EXIT
records=$step_logs/records
: >"$records"
times_file=${SYMRED_TEST_TIMES:-$root/test-times.tsv}
t_start=$SECONDS
# Set in the background lane's subshell: its steps' output goes to their logs only, printed
# whole when the lane is joined (lane_wait), not interleaved with the foreground's.
in_lane=""

# cpu_now: sets cpu to the CPU time (user + system) of this shell's finished children so far,
# in seconds: a step's processes are its children, waited for when it ends. `times` runs in this
# shell (a command substitution would report its own subshell's children), into a file of this
# shell's own (the background lane's subshell has another).
cpu_now() {
    local f=$step_logs/times.$BASHPID
    times >"$f"
    cpu=$(awk 'NR == 2 { s = 0
        for (i = 1; i <= NF; i++) { split($i, ms, "m"); sub(/s$/, "", ms[2]); s += ms[1] * 60 + ms[2] }
        printf "%.0f\n", s }' "$f")
}

# step NAME COMMAND...: runs the command and records the outcome, the wall time and the number of
# test cases it ran under NAME. A command reports its cases by printing `test.sh: cases: N`.
step() {
    local name=$1 t0=$SECONDS result=passed cpu c0
    cpu_now
    c0=$cpu
    shift
    local log
    log=$(mktemp "$step_logs/step.XXXXXX")
    if [ -n "$in_lane" ]; then
        echo "==== test.sh: $name (background lane) started"
        "$@" >"$log" 2>&1 || result=FAILED
    else
        echo
        echo "==== test.sh: $name"
        # The output goes to the terminal and to the log through tee, opened by exec so that its
        # process id is known ($! is not set by a process substitution on an external command's
        # redirection) and the log is whole before it is read; the command runs in this shell,
        # so what it sets (python_env's variables) stays set.
        local out tee_pid
        exec {out}> >(tee "$log")
        tee_pid=$!
        "$@" >&"$out" 2>&1 || result=FAILED
        exec {out}>&-
        wait "$tee_pid"
    fi
    local secs=$((SECONDS - t0))
    cpu_now
    cpu=$((cpu - c0))
    if [ -n "$in_lane" ]; then
        printf '==== test.sh: %s\n' "$name" >>"$in_lane"
        cat "$log" >>"$in_lane"
        printf '==== test.sh: %s %s in %s s\n\n' "$name" "$result" "$secs" >>"$in_lane"
        echo "==== test.sh: $name (background lane) $result in $secs s"
    else
        echo "==== test.sh: $name $result in $secs s"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$((t0 - t_start))" "$name" "$result" "$secs" "$cpu" \
        "$(count_cases "$log")" >>"$records"
}

# lane_start FUNCTION: runs FUNCTION's steps in a background subshell, beside the steps that
# follow in the foreground. The machine has two CPUs and the lanes are picked so that together
# they keep both busy: the Python tests use about one (pytest runs one test at a time), the
# ctest steps two. The subshell is started from a subshell that exits at once, so it is not a
# child of this shell: its CPU time is not counted again in the foreground step during which it
# ends. lane_wait waits for it (its pid, and the file it writes last) and prints its steps'
# output.
lane_log=$step_logs/lane.log
lane_done=$step_logs/lane.done
lane_pid_file=$step_logs/lane.pid
lane_started=""
lane_start() {
    : >"$lane_log"
    ( (
        echo "$BASHPID" >"$lane_pid_file"
        in_lane=$lane_log
        "$1"
        echo finished >"$lane_done.tmp" && mv "$lane_done.tmp" "$lane_done"
    ) & )
    lane_started=1
}
lane_wait() {
    [ -n "$lane_started" ] || return 0
    lane_started=""
    local pid
    while [ ! -f "$lane_done" ]; do
        pid=$(cat "$lane_pid_file" 2>/dev/null)
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && [ ! -f "$lane_done" ]; then
            echo "test.sh: the background lane (pid $pid) ended before its last step"
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$((SECONDS - t_start))" "background lane" \
                FAILED 0 0 0 >>"$records"
            break
        fi
        sleep 1
    done
    echo
    echo "==== test.sh: the background lane's output"
    cat "$lane_log"
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

# summary: each step's start (seconds into the run), outcome, wall time, CPU time (user and
# system, of all its processes) and cases, in the order the steps started, and the totals, on
# stdout and in $times_file. Sets failed_steps and npassed.
failed_steps=()
npassed=0
summary() {
    local total=$((SECONDS - t_start)) cases=0 cpus=0 start name result secs cpu n
    {
        printf 'step\tstart\tresult\tseconds\tcpu_seconds\tcases\n'
        while IFS=$'\t' read -r start name result secs cpu n; do
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$start" "$result" "$secs" "$cpu" "$n"
            cases=$((cases + n))
            cpus=$((cpus + cpu))
            if [ "$result" = passed ]; then
                npassed=$((npassed + 1))
            else
                failed_steps+=("$name")
            fi
        done < <(sort -s -n -k1,1 "$records")
        printf 'total\t0\t%s\t%s\t%s\t%s\n' \
            "$([ "${#failed_steps[@]}" -eq 0 ] && echo passed || echo FAILED)" "$total" "$cpus" \
            "$cases"
    } >"$times_file.tmp" && mv "$times_file.tmp" "$times_file"
    echo
    echo "test.sh: each step's start, wall time and CPU time (also in $times_file)"
    awk -F '\t' 'NR > 1 { printf "  %-52s %5s s +%5s s %6s s CPU %-7s %5s cases\n", $1, $2, $4, $5, $3, $6 }' \
        "$times_file"
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

fuzz_steps() {
    step "fuzz: differential (${SYMRED_FUZZ_CASES:-150} cases)" fuzz_diff
    step "fuzz: libFuzzer parser (${SYMRED_FUZZ_PARSE_SECONDS:-30} s)" fuzz_parse
}

# The background lane: the Python steps, which need only build-ci/ and the environment (pytest
# runs one test at a time), then the fuzzers (build-ci/'s fuzz-diff, and build-libfuzzer/).
python_lane() {
    step "python tests (PyTorch 2.x, jax, GPyTorch)" python_tests_venv
    step "python tests that use torch (Debian: PyTorch 1.13)" python_tests_debian
    step "pykeops 2.3 test suite" pykeops_suite
    step "python wheel without a C compiler (test-wheel.sh)" ./scripts/test-wheel.sh
    fuzz_steps
}

step "deps" ./scripts/deps.sh
step "python environment (scripts/pyenv.sh)" python_env
step "build (warnings as errors)" build_and_mark "$ci_dir"
# The background lane runs beside the ctest and sanitizer steps below.
if [ -d bindings/python/tests ]; then
    lane_start python_lane
else
    lane_start fuzz_steps
fi
# Every ctest entry runs in one of the two builds at least. Here: the NVRTC compile checks
# (libnvrtc is not instrumented, and is slower under ASan's allocator), the CUDA emulator's sweeps
# over every reduction, dtype and fused width (label cuda-emu-sweep: the same launch path with
# other kernels) and test-exp's sweep of every float32 input through the generated exp (label
# exp-sweep: one eval_block call per chunk, 7 s here and 20 s under ASan). The examples, the
# install test and test-fork-exit run in both: here as the library is shipped, and test-fork-exit
# here also forks while another thread allocates (glibc's malloc holds its locks across fork();
# gcc's ASan allocator does not). Every other entry runs under the sanitizers below: the C unit
# tests, the CUDA runtime's device pointers, split-j, ranges, budget and out-of-memory cases, the
# threads, MPI and the layering.
step "ctest (NVRTC, sweeps, examples, install, fork)" run_ctest "$ci_dir" \
    -L '^(nvrtc|cuda-emu-sweep|exp-sweep|examples|install|fork)$'
# Leak checking needs ptrace, which some containers forbid; ASAN_OPTIONS from the caller wins.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
step "build (ASan + UBSan)" build_and_mark "$asan_dir" -DSYMRED_ASAN=ON -DSYMRED_UBSAN=ON
step "ctest (ASan + UBSan: the other entries)" run_ctest "$asan_dir" \
    -LE '^(nvrtc|cuda-emu-sweep|exp-sweep)$'
step "clang-format" format_check
step "build (ThreadSanitizer)" tsan_build
step "ThreadSanitizer: threads sharing kernels" tsan_run
lane_wait

summary
echo
if [ "${#failed_steps[@]}" -eq 0 ]; then
    echo "test.sh: ALL PASSED"
else
    (IFS=,; echo "test.sh: FAILED:${failed_steps[*]/#/ }")
fi
echo "steps: $npassed passed, ${#failed_steps[@]} failed"
[ "${#failed_steps[@]}" -eq 0 ] && [ "$npassed" -gt 0 ]
