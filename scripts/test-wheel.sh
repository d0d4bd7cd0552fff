#!/usr/bin/env bash
# test-wheel.sh — builds the wheel (scripts/build-wheel.sh), installs it with pip alone into a
# fresh virtual environment, and runs it where no C compiler can be found.
#
# The environment is made with /usr/bin/python3 -m venv without the system's site packages, so
# everything in it comes from PyPI (numpy and pytest, pip's downloads cached in
# ~/.cache/symred/pip) or from the wheel. Then, from an empty directory outside the checkout,
# with an environment holding only PATH (the virtual environment's bin/, which has no compiler),
# HOME, SYMRED_CC=/nonexistent/cc and a fresh SYMRED_CACHE_DIR (no SYMRED_LIB, no PYTHONPATH),
# bindings/python/tests/wheel_check.py checks that symred and its library load from the wheel's
# install, that kernels say they run without a compiler and that nothing was compiled, runs
# README.md's Python example, and runs the NumPy test files below (small sizes; without a
# compiler the kernels run on a backend that needs none).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tests=(
    bindings/python/tests/test_genred.py
    bindings/python/tests/test_lazytensor.py
    bindings/python/tests/test_grad_numpy.py
    bindings/python/tests/test_solve.py
    bindings/python/tests/test_tensordot.py
)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/symred-test-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
wheel=$(./scripts/build-wheel.sh "$tmp/wheelhouse" | tail -n 1)
echo "test-wheel.sh: built $wheel ($(($(stat -c %s "$wheel") / 1000)) kB) in $((SECONDS - t0)) s"

t0=$SECONDS
venv=$tmp/venv
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --cache-dir "$HOME/.cache/symred/pip" numpy pytest
# --no-index: the wheel's one dependency, numpy, is already there.
"$venv/bin/python" -m pip install --quiet --no-index "$wheel"
echo "test-wheel.sh: fresh environment with numpy, pytest and the wheel in $((SECONDS - t0)) s"

mkdir "$tmp/run" "$tmp/home" "$tmp/cache"
t0=$SECONDS
(cd "$tmp/run" && env -i PATH="$venv/bin" HOME="$tmp/home" LANG=C.UTF-8 \
    SYMRED_CC=/nonexistent/cc SYMRED_CACHE_DIR="$tmp/cache" PYTHONDONTWRITEBYTECODE=1 \
    "$venv/bin/python" "$root/bindings/python/tests/wheel_check.py" "$root" \
    "${tests[@]/#/$root/}")
echo "test-wheel.sh: checks and tests without a compiler in $((SECONDS - t0)) s"
