#!/usr/bin/env bash
# mpi-scaling.sh — strong scaling of symred_mpi on this machine: the same problem on 1 rank
# and on 2 ranks (one thread each), and, for comparison, 1 rank with 2 OpenMP threads (what
# one process does with the same cores). Runs the examples mpi-gp-matvec and mpi-knn of a
# build with MPI; the configurations alternate, twice, and each keeps its fastest run, so
# that load from other jobs on the machine hits all of them alike.
#
# Usage: bench/mpi-scaling.sh [BUILD_DIR]     (default build/; needs SYMRED_MPI on)
# Prints one line per run and a table: time per configuration, the speedup 1 -> 2 ranks and
# its efficiency (speedup / 2), and each rank's time waiting for the ring (communication that
# the computation did not hide). With SYMRED_BENCH_RECORD set, the table is appended to that
# file as data (bench/record.py), with the load average and date from before the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
for prog in mpi-gp-matvec mpi-knn; do
    if [ ! -x "$build/$prog" ]; then
        echo "mpi-scaling: $build/$prog not found: build with MPI (cmake -S . -B $build)" >&2
        exit 1
    fi
done
# Open MPI refuses root unless told. Its shared-memory transport copies large messages once,
# through CMA (process_vm_readv), where the container allows it; where it does not, run with
# OMPI_MCA_btl_vader_single_copy_mechanism=none (measured here: ~20x slower messages).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# run NP THREADS PROG ARGS...: prints "seconds wait_seconds" of the fastest of 2 runs.
run() {
    local np=$1 threads=$2
    shift 2
    local line
    line=$(SYMRED_NUM_THREADS=$threads mpirun --bind-to none -np "$np" \
        "$build/$1" --repeat 2 "${@:2}")
    echo "  np=$np threads=$threads: $line" >&2
    # "...: 1.2345 s, ... 0.0123 s waiting for the ring)"
    echo "$line" | sed -E 's/.*: ([0-9.]+) s, .* ([0-9.]+) s waiting.*/\1 \2/'
}

# The machine's load, before and after: a second rank needs a free core to speed anything up.
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
date_before=$(date -u +%Y-%m-%dT%H:%M:%SZ)
rows=
if [ -n "${SYMRED_BENCH_RECORD:-}" ]; then
    rows=$(mktemp)
    trap 'rm -f "$rows"' EXIT
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
printf '%-44s %9s %9s %9s %8s %6s %9s\n' case "1 rank" "2 ranks" "1r 2thr" speedup eff \
    "wait(2r)"
bench() { # bench LABEL PROG ARGS...
    local label=$1
    shift
    local t1=1e30 t2=1e30 tt=1e30 w2=0 a b
    for round in 1 2; do
        read -r a _ < <(run 1 1 "$@")
        t1=$(awk -v x="$a" -v y="$t1" 'BEGIN{print (x<y)?x:y}')
        read -r a b < <(run 2 1 "$@")
        if awk -v x="$a" -v y="$t2" 'BEGIN{exit !(x<y)}'; then t2=$a; w2=$b; fi
        read -r a _ < <(run 1 2 "$@")
        tt=$(awk -v x="$a" -v y="$tt" 'BEGIN{print (x<y)?x:y}')
    done
    awk -v l="$label" -v t1="$t1" -v t2="$t2" -v tt="$tt" -v w="$w2" 'BEGIN{
        printf "%-44s %8.3fs %8.3fs %8.3fs %7.2fx %5.0f%% %8.3fs\n", l, t1, t2, tt, t1/t2,
            50*t1/t2, w}'
    if [ -n "$rows" ]; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$t1" "$t2" "$tt" "$w2" >>"$rows"
    fi
}

bench "gp-matvec f32 D=3 N=M=60000" mpi-gp-matvec 60000 60000
bench "gp-matvec f64 D=3 N=M=40000" mpi-gp-matvec --f64 40000 40000
bench "knn f32 D=16 k=10 nq=20000 np=100000" mpi-knn 20000 100000 16
bench "knn f32 D=16 k=10 nq=64 np=2000000 (wire)" mpi-knn 64 2000000 16
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$rows" ]; then
    python3 - "$rows" "$load_before" "$date_before" "$0" "$@" <<'PY'
import sys
sys.path.insert(0, "bench")
from record import Record
rows, load, date = sys.argv[1:4]
rec = Record("mpi-scaling", argv=sys.argv[4:])
rec.data["load"] = [float(v) for v in load.split()]
rec.data["date"] = date
rec.data["threads"] = 2
for line in open(rows):
    label, t1, t2, tt, w2 = line.rstrip("\n").split("\t")
    t1, t2, tt, w2 = float(t1), float(t2), float(tt), float(w2)
    rec.row(case=label, one_rank_s=round(t1, 3), two_ranks_s=round(t2, 3),
            one_rank_two_threads_s=round(tt, 3), speedup=round(t1 / t2, 2),
            efficiency=round(t1 / t2 / 2, 2), wait_two_ranks_s=round(w2, 3))
rec.close()
PY
fi
