#!/bin/bash
# eval-block-compile.sh DIR [REPS] — what sr_block (the generated eval_block, docs/sgpr.md) adds
# to a cold JIT compile. For every kept module source DIR/*.c (SYMRED_JIT_KEEP=1) that has an
# sr_block, compiles it with the JIT's flags with and without that function, alternating, REPS
# times each (default 10), and prints the CPU time (user + sys of cc and its children, which a
# loaded machine disturbs less than the wall time): minimum and median in ms.
#
#   SYMRED_JIT_KEEP=1 SYMRED_CACHE_DIR=/tmp/keep build/bench/bench-eval-block 50 1000 1
#   bench/eval-block-compile.sh /tmp/keep
set -euo pipefail
dir=${1:?usage: eval-block-compile.sh DIR [REPS]}
reps=${2:-10}
flags="-O3 -march=native -mprefer-vector-width=512 -fno-math-errno -fopenmp-simd -fPIC -shared -std=gnu11 -pipe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TIMEFORMAT='%3U %3S'
cpu_ms() { { time cc $flags "$1" -o "$tmp/m.so" 2>/dev/null; } 2>&1 | awk '{print int(($1 + $2) * 1000)}'; }
stats() { sort -n | awk '{x[NR] = $1} END {m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2; printf "min %d ms, median %d ms", x[1], m}'; }
for src in "$dir"/*.c; do
    grep -q '^int sr_block(' "$src" || continue
    # The module without sr_block: it sits between sr_part_iv and sr_part.
    awk '/^int sr_block\(/ {skip = 1} /^int sr_part\(/ {skip = 0} !skip' "$src" >"$tmp/noblock.c"
    : >"$tmp/a"
    : >"$tmp/b"
    for _ in $(seq "$reps"); do
        cpu_ms "$tmp/noblock.c" >>"$tmp/a"
        cpu_ms "$src" >>"$tmp/b"
    done
    sed -n 's/^ \* formula: //p; s/^ \* reduction: /  /p' "$src" | head -2
    echo "  without sr_block: $(stats <"$tmp/a")"
    echo "  with sr_block:    $(stats <"$tmp/b")"
done
