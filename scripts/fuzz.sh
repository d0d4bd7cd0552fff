#!/usr/bin/env bash
# fuzz.sh — the fuzzers: random formulas through every backend (fuzz-diff), then the libFuzzer
# harness of the parser (fuzz/fuzz-parse.c). docs/fuzzing.md says how they work.
#
#   scripts/fuzz.sh [--minutes N | --seconds N | --cases N] [--seed S] [--parse-seconds T]
#                   [--diff-build DIR] [--diff-jobs J] [--no-diff] [--no-parse]
#
# Nightly: scripts/fuzz.sh --minutes 60. CI (scripts/test.sh) runs it for about two minutes.
# Without --seed, a fresh seed is drawn and printed; a failure prints how to reproduce it
# (fuzz-diff --seed S --case C) and the shrunk case as a line for tests/test-fuzz-regress.c.
# fuzz-diff runs as J processes side by side (default: one per CPU), shards of the same seed's
# cases (fuzz-diff --shard), so --cases N runs cases 0 to N - 1 whatever J is; their output is
# printed one process after the other when all have finished.
# fuzz-diff comes from --diff-build (a configured build folder; default build-fuzz/, made here),
# the parser harness from build-libfuzzer/ (clang, -DSYMRED_FUZZ=ON), both under
# SYMRED_BUILD_ROOT if set. The libFuzzer run starts from fuzz/corpus and writes what it learns
# to a temporary folder, never into the checkout; a crash leaves its input in the current
# folder (crash-*), as libFuzzer does. Exit status 0 only if both fuzzers found nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

limit=(--seconds 600)
seed=()
parse_seconds=60
root=${SYMRED_BUILD_ROOT:-.}
diff_build=$root/build-fuzz
parse_build=$root/build-libfuzzer
run_diff=1
run_parse=1
jobs=$(nproc 2>/dev/null || echo 2)
diff_jobs=$jobs

while [ $# -gt 0 ]; do
    case $1 in
    --minutes) limit=(--seconds $(($2 * 60))); shift 2 ;;
    --seconds) limit=(--seconds "$2"); shift 2 ;;
    --cases) limit=(--cases "$2"); shift 2 ;;
    --seed) seed=(--seed "$2"); shift 2 ;;
    --parse-seconds) parse_seconds=$2; shift 2 ;;
    --diff-build) diff_build=$2; shift 2 ;;
    --diff-jobs) diff_jobs=$2; shift 2 ;;
    --no-diff) run_diff=0; shift ;;
    --no-parse) run_parse=0; shift ;;
    *) echo "usage: $0 [--minutes N | --seconds N | --cases N] [--seed S] [--parse-seconds T] [--diff-build DIR] [--diff-jobs J] [--no-diff] [--no-parse]" >&2; exit 2 ;;
    esac
done

status=0

if [ "$run_diff" = 1 ]; then
    if [ ! -f "$diff_build/CMakeCache.txt" ]; then
        cmake -S . -B "$diff_build" -DSYMRED_WERROR=ON -DSYMRED_BUILD_EXAMPLES=OFF || exit 1
    fi
    cmake --build "$diff_build" -j "$jobs" --target fuzz-diff || exit 1
    # The shrinker of a failing case may run past the time limit by its own limit (30 s).
    if [ "${#seed[@]}" -eq 0 ]; then
        seed=(--seed $(((RANDOM << 30 | RANDOM << 15 | RANDOM) ^ $$)))
    fi
    echo "fuzz.sh: differential fuzzing (${limit[*]}, ${seed[*]}, $diff_jobs processes)"
    diff_out=$(mktemp -d)
    pids=()
    for ((s = 0; s < diff_jobs; s++)); do
        "$diff_build/tests/fuzz-diff" "${limit[@]}" "${seed[@]}" --shard "$s/$diff_jobs" \
            --shrink-seconds 30 --max-failures 3 >"$diff_out/$s.log" 2>&1 &
        pids+=($!)
    done
    for ((s = 0; s < diff_jobs; s++)); do
        wait "${pids[s]}" || status=1
        cat "$diff_out/$s.log"
    done
    rm -rf "$diff_out"
fi

if [ "$run_parse" = 1 ]; then
    if ! command -v clang >/dev/null 2>&1; then
        echo "fuzz.sh: clang not found (Debian: clang): the libFuzzer parser harness needs it" >&2
        exit 1
    fi
    if [ ! -f "$parse_build/CMakeCache.txt" ]; then
        CC=clang cmake -S . -B "$parse_build" -DSYMRED_FUZZ=ON -DSYMRED_WERROR=ON \
            -DSYMRED_BUILD_TESTS=OFF -DSYMRED_BUILD_EXAMPLES=OFF -DSYMRED_MPI=OFF || exit 1
    fi
    cmake --build "$parse_build" -j "$jobs" --target fuzz-parse || exit 1
    corpus=$(mktemp -d)
    trap 'rm -rf "$corpus"' EXIT
    echo "fuzz.sh: libFuzzer on the parser for $parse_seconds s (fuzz/corpus, $(ls fuzz/corpus | wc -l) seeds)"
    "$parse_build/fuzz/fuzz-parse" -max_total_time="$parse_seconds" -print_final_stats=1 \
        -timeout=10 -rss_limit_mb=2048 "$corpus" fuzz/corpus >"$corpus.log" 2>&1
    rc=$?
    # libFuzzer's progress lines and its dictionary are left out; the rest is the report.
    grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD)|# Uses: [0-9]+$|^###### ' "$corpus.log"
    rm -f "$corpus.log"
    if [ $rc -ne 0 ]; then
        echo "fuzz.sh: fuzz-parse failed (exit status $rc)"
        status=1
    fi
fi

echo "fuzz.sh: $([ $status = 0 ] && echo 'nothing found' || echo 'FAILED: see above')"
exit $status
