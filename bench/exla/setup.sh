#!/usr/bin/env bash
# setup.sh — makes bench/exla/.venv with the peers of the eXLA experiments (requirements.txt).
#
# The venv is created with --system-site-packages from /usr/bin/python3, so Debian's numpy,
# torch, faiss, scipy and matplotlib are visible in it. Each requirement is pip-installed on its
# own; a failure is logged to .venv/setup-failed.txt (one "LINE<TAB>reason" per line) and does
# not stop the others: run.py then records that peer's runs as "skipped" with the reason.
# numpy is pinned to the system's version (a constraints file), so no wheel can replace it.
# Needs network access to the package index. Re-running it updates the venv in place.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$here/.venv
py=$venv/bin/python

if [ ! -x "$py" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$venv" || exit 1
fi
# The SGPR runs (float64 GEMMs and LAPACK) and the kNN peers (NumPy, FAISS) call BLAS: Debian's
# OpenBLAS, unpacked here and loaded by those runs only (common.blas_env, LD_LIBRARY_PATH), so
# the machine's default BLAS (BLIS, generic kernels on these CPUs) stays what it is elsewhere.
openblas=$here/.openblas
if [ ! -e "$openblas/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3" ]; then
    tmp=$(mktemp -d)
    if (cd "$tmp" && apt-get download libopenblas0-openmp >/dev/null 2>&1) \
        && dpkg -x "$tmp"/libopenblas0-openmp_*.deb "$openblas"; then
        echo "setup.sh: OpenBLAS for the SGPR and kNN runs unpacked into $openblas"
    else
        echo "setup.sh: could not fetch libopenblas0-openmp; the SGPR and kNN runs use the system BLAS"
    fi
    rm -rf "$tmp"
fi

constraints=$venv/constraints.txt
/usr/bin/python3 -c 'import numpy; print("numpy==" + numpy.__version__)' > "$constraints"
failed=$venv/setup-failed.txt
: > "$failed"
log=$venv/setup.log
: > "$log"

while IFS= read -r raw; do
    line=${raw%%#*}
    line=$(echo "$line" | xargs)
    [ -z "$line" ] && continue
    if [[ $raw == *"# if-missing:"* ]]; then
        mod=$(echo "${raw##*# if-missing:}" | xargs)
        if "$py" -c "import $mod" 2>/dev/null; then
            echo "setup.sh: $line: not needed, $mod already imports"
            continue
        fi
    fi
    echo "setup.sh: pip install $line"
    if "$py" -m pip install -q -c "$constraints" "$line" >> "$log" 2>&1; then
        echo "setup.sh: $line: installed"
    else
        reason=$(grep -E 'ERROR|error:' "$log" | tail -1 | cut -c1-300)
        printf '%s\t%s\n' "$line" "${reason:-pip failed, see $log}" >> "$failed"
        echo "setup.sh: $line: FAILED (${reason:-see $log})"
    fi
done < "$here/requirements.txt"

if [ -s "$failed" ]; then
    echo "setup.sh: $(wc -l < "$failed") requirement(s) failed; their runs will be skipped"
else
    echo "setup.sh: all requirements installed in $venv"
fi
