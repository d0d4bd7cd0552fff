#!/usr/bin/env bash
# run.sh — the install test: installs a build of symred into a temporary prefix, then builds
# and runs a small consumer project against it twice, through find_package(symred) (shared and
# static library) and through pkg-config.
#
# Usage: run.sh CMAKE BUILD_DIR SOURCE_DIR [EXTRA_FLAGS]
#   EXTRA_FLAGS: compiler/linker flags the consumer needs too (the sanitizer flags of a
#   sanitizer build, whose library cannot be loaded by a program built without them).
set -euo pipefail

cmake_exe=$1
build_dir=$2
src_dir=$3
extra_flags=${4:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/symred-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
# A JIT that caches compiled kernels keeps them in the temporary folder too.
export SYMRED_CACHE_DIR=$work/cache

echo "== cmake --install $build_dir --prefix $prefix"
"$cmake_exe" --install "$build_dir" --prefix "$prefix" >"$work/install.log" || {
    cat "$work/install.log"
    exit 1
}
for f in include/symred.h; do
    [ -f "$prefix/$f" ] || { echo "install test: $prefix/$f was not installed"; exit 1; }
done
so=$(find "$prefix" -name libsymred.so | head -n 1)
if [ -z "$so" ] || [ ! -f "$(dirname "$so")/libsymred.a" ]; then
    echo "install test: libsymred.so and libsymred.a were not installed together"
    find "$prefix"
    exit 1
fi
libdir=$(dirname "$so")

echo "== find_package(symred): configure, build and run the consumer"
"$cmake_exe" -S "$src_dir/tests/install/consumer" -B "$work/consumer" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$extra_flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" >"$work/configure.log" || {
    cat "$work/configure.log"
    exit 1
}
"$cmake_exe" --build "$work/consumer"
# The shared consumer finds the library through the RPATH that CMake gives build trees.
"$work/consumer/consumer_shared"
"$work/consumer/consumer_static"

echo "== pkg-config --cflags --libs symred: compile and run the consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs symred)
echo "pkg-config: $flags"
# shellcheck disable=SC2086 # the flags are words
cc -std=c11 $extra_flags "$src_dir/tests/install/consumer/main.c" -o "$work/consumer_pc" \
    $flags -lm
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer_pc"

# The MPI companion library, when this build has it: find_package(symred_mpi) and pkg-config.
if [ -f "$prefix/include/symred_mpi.h" ]; then
    echo "== find_package(symred_mpi): configure, build and run the MPI consumer"
    # CI runs as root, which Open MPI refuses unless told; containers often forbid ptrace (CMA).
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    # Open MPI's own allocations kept until exit are not symred's (tests/mpi/lsan-openmpi.supp).
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0
    export LSAN_OPTIONS=suppressions=$src_dir/tests/mpi/lsan-openmpi.supp
    "$cmake_exe" -S "$src_dir/tests/install/consumer-mpi" -B "$work/consumer-mpi" \
        -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$extra_flags" \
        -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" >"$work/configure-mpi.log" || {
        cat "$work/configure-mpi.log"
        exit 1
    }
    "$cmake_exe" --build "$work/consumer-mpi"
    mpirun --oversubscribe -np 2 "$work/consumer-mpi/consumer_mpi"

    echo "== pkg-config --cflags --libs symred_mpi: compile and run the MPI consumer"
    flags=$(pkg-config --cflags --libs symred_mpi)
    echo "pkg-config: $flags"
    # shellcheck disable=SC2086 # the flags are words
    cc -std=c11 $extra_flags "$src_dir/tests/install/consumer-mpi/main.c" \
        -o "$work/consumer_mpi_pc" $flags -lm
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        mpirun --oversubscribe -np 3 "$work/consumer_mpi_pc"
fi

echo "install test: passed"
